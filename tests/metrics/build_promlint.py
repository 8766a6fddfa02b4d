"""Build (or reuse) promlint, client_golang's metric linter (what `promtool check metrics` runs), from
the Go module in tests/metrics/promlint/.

The binary is built once into a cache outside the work tree (``$KUBEDGX_PROMLINT_CACHE``, by default
``~/.cache/kubedgx/promlint/<key>/promlint``), keyed by the module's go.mod, go.sum and main.go and the
Go version, so a change to any of them builds afresh. The first build compiles client_golang and its
dependencies: about two minutes on two cores, more while other builds run. One build at a time per
cache (a file lock): .ci/run builds it in the background (``python -m tests.metrics.build_promlint``)
while tests run, and a test that needs it meanwhile waits for that build instead of starting another.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MODULE = Path(__file__).resolve().parent / "promlint"
#: A generous bound for a cold build on a loaded 2-core machine.
BUILD_TIMEOUT = 1200


class BuildError(RuntimeError):
    """``go build`` failed; the message has its output."""


def cache_root() -> Path:
    configured = os.environ.get("KUBEDGX_PROMLINT_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "kubedgx" / "promlint"


def go() -> str | None:
    return shutil.which("go")


def go_env() -> dict[str, str]:
    """Reproducible: the committed go.sum pins every module, nothing is edited, no other toolchain."""
    return {
        **os.environ,
        "GOTOOLCHAIN": "local",
        "GOWORK": "off",
        "CGO_ENABLED": "0",
        "GOFLAGS": "-buildvcs=false -mod=readonly",
    }


def binary_path(go_binary: str) -> Path:
    version = subprocess.run([go_binary, "env", "GOVERSION"], capture_output=True, text=True, check=True,
                             env=go_env())  # fmt: skip
    digest = hashlib.sha256(version.stdout.encode())
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((MODULE / name).read_bytes())
    return cache_root() / digest.hexdigest()[:16] / "promlint"


def build(go_binary: str) -> Path:
    """The cached binary, built first if missing (under the cache's lock)."""
    binary = binary_path(go_binary)
    if binary.exists():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    with open(binary.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.exists():  # built by whoever held the lock before us
            return binary
        # Built beside its final name and renamed: nobody ever executes half a binary.
        with tempfile.TemporaryDirectory(dir=binary.parent) as scratch:
            built = Path(scratch) / "promlint"
            result = subprocess.run([go_binary, "build", "-o", str(built), "."], cwd=MODULE, env=go_env(),
                                    capture_output=True, text=True, timeout=BUILD_TIMEOUT)  # fmt: skip
            if result.returncode != 0:
                raise BuildError(f"go build of {MODULE} failed:\n{result.stdout}{result.stderr}")
            built.replace(binary)
    return binary


def main() -> int:
    go_binary = go()
    if go_binary is None:
        print("promlint: no go on PATH: tests/metrics/test_promlint.py will skip, saying so", file=sys.stderr)
        return 0
    print(f"promlint: {build(go_binary)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
