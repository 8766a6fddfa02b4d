"""Generated hostile manifests: the shipped examples, mutated as an attacker or a careless user would.

Shared by the property test (tests/unit/test_generated_input.py, a fixed, derandomised set on every
run) and the benchmark (benchmarks/hostile_inputs.py, fresh random inputs, counted). Two kinds of
mutation:

* on the objects: a value somewhere replaced by a hostile one (huge or out-of-range numbers, NaN,
  control characters, bidi overrides, lone surrogates, YAML 1.1 traps such as ``on``/``y``/``1:30``,
  negative quantities, deep or wide containers), a key deleted, added, re-cased or turned into a
  number or a boolean; then written back as YAML;
* on the text: bytes inserted, deleted or replaced (invalid UTF-8 included), lines duplicated, tabs
  for indentation, anchors and aliases planted, brackets nested thousands deep.

:func:`check` runs ``kubedgx validate`` and ``kubedgx render`` on one input and returns what a user
would see, and :func:`problems_with` says what about it breaks the contract: an exit code other than
0, 1 or 2, an exception or a traceback, an output line that is not one printable line about the file.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from dgx_api.manifests import load_documents
from dgx_api.text import is_printable
from dgx_operator.cli.main import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))
EXAMPLE_TEXTS = {p.name: p.read_text(encoding="utf-8") for p in EXAMPLE_FILES}
EXAMPLE_DOCS = {name: load_documents(text) for name, text in EXAMPLE_TEXTS.items()}

TRAPS = [
    "", "0", "-1", "-0", "1e999", "0x7fffffffffffffff", "on", "y", "~", "null", "2001-12-14", "1:30",
    "-1Gi", "9999999999999999999999Ti", "a" * 300, "s3://", "gs://b/../../etc", "/..", "../x", "..",
    "\x1b[31m", "\u202eevil", "a\nb", "\x00", "\u200b", "\x85", "😀", "kubedgx.io/v1alpha1", "DGXTrainingJob",
    "PET_NNODES", "MASTER_ADDR", "all-linear", "1h30m", "0s", "99999h",
]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=2**63, max_value=2**80),
    st.integers(max_value=-(2**63) - 1, min_value=-(2**80)),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.text(alphabet=st.sampled_from("\x00\x07\x1b\n\r\t\x7f\x85\x9b\u202e\u2066\u200b\ufeff\ud800 a/:."), max_size=12),
    st.sampled_from(TRAPS),
)
keys = st.one_of(st.text(max_size=12), st.sampled_from(["on", "yes", "n", "~", "<<"]), st.integers(), st.booleans())
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(keys, inner, max_size=5),
    max_leaves=12,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, (*prefix, i))
    return out


def _parent(root: Any, path: tuple[Any, ...]) -> Any:
    node = root
    for part in path[:-1]:
        node = node[part]
    return node


@st.composite
def object_mutation(draw: st.DrawFn) -> str:
    """One example file with one to three object-level mutations, as YAML."""
    name = draw(st.sampled_from(sorted(EXAMPLE_DOCS)))
    docs = yaml.safe_load(yaml.safe_dump(EXAMPLE_DOCS[name]))  # a deep copy
    for _ in range(draw(st.integers(1, 3))):
        index = draw(st.integers(0, len(docs) - 1))
        paths = [p for p in _paths(docs[index]) if p]
        if not paths:
            docs[index] = draw(values)
            continue
        path = draw(st.sampled_from(paths))
        parent, last = _parent(docs[index], path), path[-1]
        op = draw(st.sampled_from(["replace", "replace", "delete", "add", "rekey", "wrap"]))
        if op == "replace":
            parent[last] = draw(values)
        elif op == "delete":
            del parent[last]
        elif op == "add" and isinstance(parent, dict):
            parent[draw(keys)] = draw(values)
        elif op == "rekey" and isinstance(parent, dict):
            parent[draw(st.sampled_from([str(last).upper(), str(last).lower() + " ", 1, True]))] = parent.pop(last)
        elif op == "wrap":
            parent[last] = draw(st.sampled_from([[parent[last]], {"x": parent[last]}]))
        else:
            parent[last] = draw(values)
    return yaml.safe_dump_all(docs, allow_unicode=True, sort_keys=False)


@st.composite
def text_mutation(draw: st.DrawFn) -> bytes:
    """One example file's bytes with one to three textual mutations."""
    name = draw(st.sampled_from(sorted(EXAMPLE_TEXTS)))
    data = EXAMPLE_TEXTS[name].encode("utf-8")
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["insert", "delete", "replace", "line", "tabs", "anchor", "nest", "bytes"]))
        if op == "insert":
            data = data[:at] + draw(st.text(max_size=8)).encode("utf-8", "surrogatepass") + data[at:]
        elif op == "delete":
            data = data[:at] + data[at + draw(st.integers(1, 40)) :]
        elif op == "replace":
            data = (
                data[:at]
                + draw(st.sampled_from([b":", b"-", b"[", b"{", b"&a ", b"*a", b'"', b"'", b"#", b"\n"]))
                + data[at + 1 :]
            )
        elif op == "line":
            lines = data.split(b"\n")
            i = draw(st.integers(0, len(lines) - 1))
            lines.insert(i, lines[i])
            data = b"\n".join(lines)
        elif op == "tabs":
            data = data.replace(b"  ", b"\t", draw(st.integers(1, 5)))
        elif op == "anchor":
            data = (
                data[:at]
                + draw(st.sampled_from([b"&x ", b"*x", b"<<: *x\n", b"!!set ", b"!!binary ", b"!foo "]))
                + data[at:]
            )
        elif op == "nest":
            depth = draw(st.integers(50, 5000))
            data = data[:at] + b"[" * depth + b"]" * depth + data[at:]
        else:
            data = data[:at] + draw(st.binary(min_size=1, max_size=4)) + data[at:]
    return data


@dataclass
class Seen:
    """What `kubedgx validate` and `kubedgx render` did with one input."""

    codes: dict[str, int | None] = field(default_factory=dict)
    out: dict[str, list[str]] = field(default_factory=dict)
    err: dict[str, list[str]] = field(default_factory=dict)
    exceptions: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    #: CPU time of this thread: what a bound in a test may use (wall time counts a loaded machine too).
    cpu_seconds: float = 0.0


def check(content: str | bytes, path: Path) -> Seen:
    """Both commands on ``content`` written to ``path``; exceptions are caught and recorded."""
    if isinstance(content, str):
        content = content.encode("utf-8", "surrogatepass")
    path.write_bytes(content)
    seen = Seen()
    started, cpu_started = time.perf_counter(), time.thread_time()
    for command in ("validate", "render"):
        out, err = io.StringIO(), io.StringIO()
        try:
            seen.codes[command] = main([command, str(path)], out=out, err=err, stdin=io.StringIO())
        except BaseException as exc:  # the contract is that nothing escapes
            seen.codes[command] = None
            seen.exceptions[command] = f"{type(exc).__name__}: {exc}"[:500]
        seen.out[command] = out.getvalue().splitlines()
        seen.err[command] = err.getvalue().splitlines()
    seen.seconds = time.perf_counter() - started
    seen.cpu_seconds = time.thread_time() - cpu_started
    return seen


def problems_with(seen: Seen, path: Path) -> list[str]:
    """Every way ``seen`` breaks the contract (empty: it keeps it)."""
    found = [f"{cmd}: raised {exc}" for cmd, exc in seen.exceptions.items()]
    for cmd, code in seen.codes.items():
        if code is not None and code not in (0, 1, 2):
            found.append(f"{cmd}: exit {code}")
    prefix = f"{path}: "
    for cmd in seen.codes:
        lines = seen.err[cmd] + (seen.out[cmd] if cmd == "validate" else [])
        for line in lines:
            if "Traceback" in line:
                found.append(f"{cmd}: a traceback: {line!r}")
            if not is_printable(line):
                found.append(f"{cmd}: an unescaped control character: {line!r}")
        # validate: every problem line names the file; the summary line is the only other kind
        for line in seen.out.get("validate", []):
            if not line.startswith(prefix):
                found.append(f"validate: a line that is not about the file: {line!r}")
    return found


def run_one(content: str | bytes, path: Path, on_seen: Callable[[Seen], None] | None = None) -> list[str]:
    seen = check(content, path)
    if on_seen is not None:
        on_seen(seen)
    return problems_with(seen, path)
