"""How fast `datasync pull` mirrors a prefix, against the obvious alternative: a sequential fsspec
``fs.get`` loop, one file at a time. Both run against moto's S3 server in its own process on
loopback, optionally with a delay per request (``--latency-ms``) standing in for a real store's
first-byte latency; without it the figures measure client and server CPU per request, not a network.

    python benchmarks/datasync.py                          # 2,000 objects of 4-64 KiB, 3 rounds
    python benchmarks/datasync.py --objects 500 --workers 16 --rounds 1
    python benchmarks/datasync.py --large 2 --large-mb 200 # plus two 200 MB objects
    python benchmarks/datasync.py --objects 500 --latency-ms 20   # a store 20 ms away

Each round pulls into a fresh directory with both methods (alternating which goes first), then
times a second `pull` into the datasync copy when nothing changed (a listing and no object read).
Both methods include their listing. The table shows medians over the rounds. Target: datasync at
least 3x the sequential loop's objects/s on small objects.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "datasync"), str(ROOT / "api")]

from dgx_datasync import StoreOptions, parse_uri  # noqa: E402
from dgx_datasync.sync import pull  # noqa: E402

KEY, SECRET, REGION = "AKIABENCHMARK0000000", "benchmark-secret", "us-east-1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(port: int, latency_ms: float) -> None:
    """moto's S3 server (what ``python -m moto.server`` runs), each request delayed by ``latency_ms``:
    a loopback server answers in microseconds, a real object store's first byte takes tens of
    milliseconds, and that latency is what parallel transfers hide."""
    import logging

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = DomainDispatcherApplication(create_backend_app)

    def delayed(environ: dict[str, Any], start_response: Any) -> Any:
        if latency_ms > 0 and not environ.get("PATH_INFO", "").startswith("/moto-api"):
            time.sleep(latency_ms / 1000)
        return app(environ, start_response)

    make_server("127.0.0.1", port, delayed, threaded=True).serve_forever()


def start_moto(latency_ms: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--latency-ms", str(latency_ms)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}"
        if proc.poll() is not None:
            raise SystemExit("moto's server did not start")
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("moto's server did not open its port within 60 s")


def populate(endpoint: str, args: argparse.Namespace) -> tuple[str, int, int]:
    import boto3

    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name=REGION
    )
    bucket = "bench"
    client.create_bucket(Bucket=bucket)
    rng = random.Random(args.seed)
    sizes = [rng.randint(args.min_kib * 1024, args.max_kib * 1024) for _ in range(args.objects)]
    blob = os.urandom(max(sizes, default=0))

    def put(i: int) -> None:
        client.put_object(Bucket=bucket, Key=f"data/d{i % 20:02d}/obj-{i:06d}.bin", Body=blob[: sizes[i]])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(args.objects)))
    large = os.urandom(args.large_mb * 10**6) if args.large else b""
    for i in range(args.large):
        client.put_object(Bucket=bucket, Key=f"data/large/shard-{i}.bin", Body=large)
    return bucket, args.objects + args.large, sum(sizes) + args.large * len(large)


def naive(endpoint: str, bucket: str, dest: Path) -> None:
    """The baseline: list, then fs.get one file after the other."""
    import s3fs

    fs = s3fs.S3FileSystem(
        key=KEY, secret=SECRET, endpoint_url=endpoint, client_kwargs={"region_name": REGION}, skip_instance_cache=True
    )
    root = f"{bucket}/data"
    for path in fs.find(root):
        target = dest / path[len(root) + 1 :]
        target.parent.mkdir(parents=True, exist_ok=True)
        fs.get(path, str(target))


def timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=2000, help="small objects (default 2000)")
    parser.add_argument("--min-kib", type=int, default=4)
    parser.add_argument("--max-kib", type=int, default=64)
    parser.add_argument("--large", type=int, default=0, help="additional large objects (default 0)")
    parser.add_argument("--large-mb", type=int, default=100, help="size of each large object in MB (default 100)")
    parser.add_argument("--workers", type=int, default=8, help="datasync workers (default 8)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="server-side delay per request (default 0)")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.latency_ms)
        return

    proc, endpoint = start_moto(args.latency_ms)
    scratch = Path(tempfile.mkdtemp(prefix="datasync-bench-"))
    try:
        bucket, count, total = populate(endpoint, args)
        source = parse_uri(f"s3://{bucket}/data")
        options = StoreOptions(
            endpoint_url=endpoint, region=REGION, env={"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}
        )
        times: dict[str, list[float]] = {"datasync": [], "naive": [], "rerun": []}
        for r in range(args.rounds):
            ours, theirs = scratch / f"ours-{r}", scratch / f"naive-{r}"

            def run_ours(dest: Path = ours) -> None:
                result = pull(source, dest, options, workers=args.workers)
                assert result["objects"] == count, result

            def run_naive(dest: Path = theirs) -> None:
                naive(endpoint, bucket, dest)

            order = [("datasync", run_ours), ("naive", run_naive)]
            for name, fn in order if r % 2 == 0 else order[::-1]:
                times[name].append(timed(fn))
            times["rerun"].append(timed(run_ours))
            shutil.rmtree(ours)
            shutil.rmtree(theirs)
            print(
                f"round {r + 1}: datasync {times['datasync'][-1]:.2f}s, naive {times['naive'][-1]:.2f}s, "
                f"re-run {times['rerun'][-1]:.2f}s",
                file=sys.stderr,
            )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(scratch, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    mb = total / 1e6
    print(
        f"\n{count} objects, {mb:.1f} MB ({args.min_kib}-{args.max_kib} KiB"
        + (f", plus {args.large} x {args.large_mb} MB" if args.large else "")
        + f"), moto server in its own process, {args.latency_ms:g} ms added per request, "
        + f"{os.cpu_count()} CPUs, median of {args.rounds} rounds\n"
    )
    print("| method | seconds | MB/s | objects/s |")
    print("|---|---:|---:|---:|")
    print(
        f"| datasync pull ({args.workers} workers) | {med['datasync']:.2f} | {mb / med['datasync']:.1f} "
        f"| {count / med['datasync']:.0f} |"
    )
    print(f"| sequential fs.get loop | {med['naive']:.2f} | {mb / med['naive']:.1f} | {count / med['naive']:.0f} |")
    print(f"| datasync pull, nothing changed | {med['rerun']:.2f} | - | - |")
    print(f"\nspeed-up: {med['naive'] / med['datasync']:.2f}x")


if __name__ == "__main__":
    main()
