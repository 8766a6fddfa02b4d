"""Build and run tests/argocd/luavm, the Go test that runs the Argo CD customizations in Argo CD's own Lua VM.

Building Argo CD's util/lua pulls in much of Argo CD and Kubernetes' client libraries: minutes of CPU on a 2-core
machine the first time. So the test binary (``go test -c``) is built once per Go version and module graph into
``$KUBEDGX_ARGOCD_LUAVM_CACHE`` (default ``~/.cache/kubedgx/argocd-luavm``), outside the work tree, and reused; the
Go build cache keeps the packages. Running it takes a second.

Two module graphs, because Argo CD's VM is util/lua on gopher-lua, and Argo CD changed gopher-lua under an unchanged
util/lua: ``go.mod`` is Argo CD v3.2.12's own graph (gopher-lua v1.1.1, as Argo CD 3.2 to 3.4 ship it),
``lua-v1.1.2.mod`` the same with gopher-lua v1.1.2 (Argo CD 3.5 and 3.6). The second build reuses all but a few
packages of the first.

``python -m tests.argocd.lua_vm`` builds what is missing and prints the binaries: a warm-up step for CI.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

LUAVM = Path(__file__).parent / "luavm"
#: Variant name -> the go.mod it builds with (its go.sum is the file of the same stem with .sum).
MODFILES = {"gopher-lua-v1.1.1": "go.mod", "gopher-lua-v1.1.2": "lua-v1.1.2.mod"}
#: The build never edits go.mod or go.sum, and never fetches another Go toolchain.
GO_ENV = {"GOFLAGS": "-mod=readonly", "GOTOOLCHAIN": "local", "GOWORK": "off", "CGO_ENABLED": "0"}
#: The Go tests in luavm_test.go and what each runs per case.
TESTS = ("TestLuaHealthScript", "TestLuaResourceActionsScript", "TestArgoCDConfigMap")
RESULT = re.compile(r"^\s*--- (PASS|FAIL|SKIP): (\S+) \(")


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "kubedgx" / "argocd-luavm"
    return Path(os.environ.get("KUBEDGX_ARGOCD_LUAVM_CACHE") or default)


def go_env() -> dict[str, str]:
    return {**os.environ, **GO_ENV}


def go() -> str | None:
    return shutil.which("go")


def go_version() -> str:
    out = subprocess.run(
        ["go", "env", "GOVERSION"], env=go_env(), capture_output=True, text=True, check=True, timeout=60
    )
    return out.stdout.strip()


def sum_file(modfile: str) -> Path:
    return LUAVM / (Path(modfile).stem + ".sum")


def build_key(variant: str) -> str:
    """Changes with anything that changes the binary: Go, the module graph, the test's source."""
    modfile = MODFILES[variant]
    digest = hashlib.sha256(f"{go_version()} {variant} {sorted(GO_ENV.items())}\n".encode())
    for path in [LUAVM / modfile, sum_file(modfile), *sorted(LUAVM.glob("*.go"))]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@contextmanager
def locked(directory: Path) -> Iterator[None]:
    """One build at a time (two pytest processes, or pytest and the warm-up step)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@dataclass(frozen=True)
class Built:
    binary: Path
    seconds: float  # 0 when it was already built


def build(variant: str, timeout_s: float = 3600) -> Built:
    """The test binary of ``variant``, built unless the cache has it."""
    cache = cache_dir()
    binary = cache / f"{variant}-{build_key(variant)}" / "luavm.test"
    with locked(cache):
        if binary.is_file():
            return Built(binary, 0.0)
        binary.parent.mkdir(parents=True, exist_ok=True)
        partial = binary.with_suffix(".partial")
        started = time.monotonic()
        out = subprocess.run(
            ["go", "test", "-c", f"-modfile={MODFILES[variant]}", "-o", str(partial), "."],
            cwd=LUAVM,
            env=go_env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if out.returncode != 0:
            raise RuntimeError(f"go test -c ({variant}) failed:\n{out.stdout}{out.stderr}")
        partial.rename(binary)  # only a complete binary is ever found in the cache
        return Built(binary, time.monotonic() - started)


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str
    #: Subtests by outcome, as "<Test>/<subtest>" names.
    passed: tuple[str, ...]
    failed: tuple[str, ...]
    skipped: tuple[str, ...]

    def count(self, test: str) -> int:
        """How many of ``test``'s subtests passed."""
        return sum(1 for name in self.passed if name.startswith(test + "/"))

    def counts(self) -> Counter[str]:
        return Counter(name.split("/", 1)[0] for name in self.passed if "/" in name)


def run(binary: Path, customizations: Path, configmap: Path | None, timeout_s: float = 300) -> Run:
    """Every test in the binary, verbose, on the customizations directory and (if given) the argocd-cm data."""
    env: Mapping[str, str] = {
        **go_env(),
        "KUBEDGX_ARGOCD_CUSTOMIZATIONS": str(customizations),
        "KUBEDGX_ARGOCD_CM": str(configmap or ""),
    }
    out = subprocess.run(
        [str(binary), "-test.v", "-test.count=1", "-test.timeout=240s"],
        cwd=LUAVM,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    output = out.stdout + out.stderr
    outcomes: dict[str, list[str]] = {"PASS": [], "FAIL": [], "SKIP": []}
    for line in output.splitlines():
        match = RESULT.match(line)
        if match:
            outcomes[match.group(1)].append(match.group(2))
    return Run(out.returncode, output, *(tuple(outcomes[k]) for k in ("PASS", "FAIL", "SKIP")))


def main() -> int:
    if go() is None:
        print("lua_vm: no go on PATH: tests/argocd/test_lua_vm.py will skip", file=sys.stderr)
        return 0
    for variant in MODFILES:
        built = build(variant)
        how = f"built in {built.seconds:.0f}s" if built.seconds else "cached"
        print(f"{variant}: {built.binary} ({how})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
