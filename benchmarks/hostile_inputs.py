"""A generated run of hostile manifests through `kubedgx validate` and `kubedgx render`, counted.

    python benchmarks/hostile_inputs.py                 # 2,000 inputs: half object-, half text-mutated
    python benchmarks/hostile_inputs.py --inputs 10000 --seed 7 --json out.json

Inputs come from tests/hostile_inputs.py (the strategies the property test uses, drawn fresh here, not
derandomised). For each input both commands run in this process; the counts say how many answers
kept the contract (exit 0, 1 or 2; one printable line per problem; nothing raised) and how many
did not, with the first few broken ones printed. The slowest inputs are run again under tracemalloc
for their peak memory. Targets (docs/benchmarks.md): no broken answer, the worst input well under a
second and a few MB.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from tests.hostile_inputs import check, object_mutation, problems_with, text_mutation


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random)")
    parser.add_argument("--json", type=Path, help="write the counts here")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="kubedgx-hostile-"))
    path = folder / "input.yaml"
    codes: Counter[str] = Counter()
    broken: list[tuple[list[str], bytes]] = []
    timings: list[tuple[float, bytes]] = []
    kinds: Counter[str] = Counter()

    @settings(
        max_examples=args.inputs,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.one_of(object_mutation(), text_mutation()))
    def one(content: str | bytes) -> None:
        data = content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content
        kinds["object" if isinstance(content, str) else "text"] += 1
        seen = check(data, path)
        for command, code in seen.codes.items():
            codes[f"{command} exit {code}"] += 1
        found = problems_with(seen, path)
        if found:
            broken.append((found, data))
        timings.append((seen.seconds, data))

    run = one if args.seed is None else seed(args.seed)(one)
    started = time.perf_counter()
    run()
    elapsed = time.perf_counter() - started

    timings.sort(key=lambda t: t[0], reverse=True)
    peaks = []
    for _, data in timings[:10]:
        tracemalloc.start()
        check(data, path)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    result: dict[str, Any] = {
        "inputs": len(timings),
        "objectMutated": kinds["object"],
        "textMutated": kinds["text"],
        "codes": dict(sorted(codes.items())),
        "broken": len(broken),
        "tracebacks": sum(any("raised" in p or "traceback" in p for p in found) for found, _ in broken),
        "worstSeconds": round(timings[0][0], 3) if timings else None,
        "medianSeconds": round(timings[len(timings) // 2][0], 4) if timings else None,
        "worstPeakMiB": round(max(peaks) / 2**20, 2) if peaks else None,
        "totalSeconds": round(elapsed, 1),
    }
    print(json.dumps(result, indent=2))
    for found, data in broken[:5]:
        print("BROKEN:", found[:3], data[:300], file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
