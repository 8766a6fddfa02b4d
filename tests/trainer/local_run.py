"""`kubedgx run FILE --local` through the real console script, offline, for the trainer tests that run
the quickstart's way (test_local.py, test_yaml_numbers.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.trainer.conftest import OFFLINE, RUN_TIMEOUT


def console_script() -> str:
    beside = Path(sys.executable).with_name("kubedgx")
    found = str(beside) if beside.is_file() else shutil.which("kubedgx")
    assert found, "the kubedgx console script is not installed (pip install -e .)"
    return found


def run_local(manifest: Path, cwd: Path, cache: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """`kubedgx run MANIFEST --local --output OUT` through the console script, offline, on the
    session's built-in model cache; fails the test (with both streams' tails) unless it exits 0."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("KUBEDGX_FAULT")},
        **OFFLINE,
        "KUBEDGX_CACHE": str(cache),
    }
    result = subprocess.run(
        [console_script(), "run", str(manifest), "--local", "--output", str(out)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-6000:]}"
    return result
