"""The import contract: build/ and reconcile/ stay pure and the operator never imports torch.

import-linter checks the static import graph (pyproject.toml [tool.importlinter]); a subprocess
checks what actually gets imported at run time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

LINT_IMPORTS = shutil.which("lint-imports") or "lint-imports"


def run_lint_imports(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = None
    if pythonpath is not None:
        env = {**os.environ, "PYTHONPATH": f"{pythonpath / 'operator'}:{pythonpath / 'trainer'}"}
    return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=cwd, capture_output=True, text=True, check=False, env=env)


def test_contracts_are_kept() -> None:
    result = run_lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


def test_contracts_catch_a_violation(tmp_path: Path) -> None:
    """A copy of the tree where build/ imports the kubernetes client must break the contract."""
    for folder in ("operator", "trainer"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    names = tmp_path / "operator" / "dgx_operator" / "build" / "names.py"
    names.write_text(names.read_text(encoding="utf-8") + "\nimport kubernetes  # noqa\n", encoding="utf-8")
    result = run_lint_imports(tmp_path, pythonpath=tmp_path)
    assert result.returncode != 0
    assert "build/ and reconcile/ are pure: no kopf, kubernetes clients or torch BROKEN" in result.stdout


def test_operator_modules_do_not_import_torch_or_clients_at_run_time() -> None:
    code = (
        "import sys, pkgutil, importlib, dgx_operator\n"
        "for m in pkgutil.walk_packages(dgx_operator.__path__, 'dgx_operator.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = [m for m in ('torch', 'transformers', 'peft', 'kopf', 'kubernetes', 'kubernetes_asyncio')"
        " if m in sys.modules]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
