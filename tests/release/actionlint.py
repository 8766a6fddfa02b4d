"""actionlint, built from its Go module into a cache outside the work tree, keyed by its version, the way
tests/cluster/build.sh builds the control plane: the binary is moved into place only once it built and
says its version, so an interrupted build is never reused.

``KUBEDGX_TOOLS_CACHE`` moves the cache (default ``~/.cache/kubedgx/tools``). Without a Go toolchain the
tests that need it skip, saying so; with one, a failed build is a failure with Go's own words.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

MODULE = "github.com/rhysd/actionlint/cmd/actionlint"
VERSION = "v1.7.12"


def cache_dir() -> Path:
    return Path(os.environ.get("KUBEDGX_TOOLS_CACHE") or Path.home() / ".cache" / "kubedgx" / "tools")


def _version_of(binary: Path) -> str | None:
    try:
        proc = subprocess.run([str(binary), "-version"], capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return None
    lines = proc.stdout.split()
    return lines[0] if proc.returncode == 0 and lines else None


def actionlint() -> Path:
    """The path of actionlint VERSION, building it first if the cache lacks it."""
    target = cache_dir() / f"actionlint-{VERSION}" / "actionlint"
    if _version_of(target) == VERSION:
        return target
    go = shutil.which("go")
    if go is None:
        pytest.skip(f"no Go toolchain on PATH: actionlint {VERSION} is built from its Go module ({MODULE})")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
        env = {**os.environ, "GOBIN": tmp, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
        proc = subprocess.run(
            [go, "install", f"{MODULE}@{VERSION}"], capture_output=True, text=True, env=env, timeout=900, check=False
        )
        built = Path(tmp) / "actionlint"
        if proc.returncode != 0 or _version_of(built) != VERSION:
            pytest.fail(f"go install {MODULE}@{VERSION} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
        os.replace(built, target)  # atomic: a concurrent build's binary is as good as this one
    return target
