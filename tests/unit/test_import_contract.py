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
    assert "4 kept, 0 broken" in result.stdout


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


RUNTIME = (
    "dgx_operator.handlers",
    "dgx_operator.webhooks",
    "dgx_operator.kube",
    "dgx_operator.controller",
    "dgx_operator.loop",
    "dgx_operator.mounts",
    "dgx_operator.settings",
    "dgx_operator.admission",
)


def imported_after(modules: str, watched: tuple[str, ...]) -> list[str]:
    """Which of ``watched`` a fresh interpreter has loaded after importing ``modules``."""
    code = (
        "import sys, pkgutil, importlib, dgx_operator\n"
        f"for name in {modules}:\n"
        "    importlib.import_module(name)\n"
        f"print(','.join(m for m in {watched!r} if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return [m for m in result.stdout.strip().split(",") if m]


ALL = "[m.name for m in pkgutil.walk_packages(dgx_operator.__path__, 'dgx_operator.')]"


def test_no_operator_module_imports_torch_at_run_time() -> None:
    assert imported_after(ALL, ("torch", "transformers", "peft", "trl", "bitsandbytes")) == []


def test_the_cli_path_imports_no_kopf_or_cluster_client_at_run_time() -> None:
    """`kubedgx validate` and `render` run in CI pipelines: no kopf, no kubernetes client."""
    light = f"[m for m in {ALL} if m not in {RUNTIME!r}]"
    assert imported_after(light, ("kopf", "kubernetes", "kubernetes_asyncio", "aiohttp")) == []


def test_the_runtime_check_can_fail() -> None:
    assert "kopf" in imported_after("['dgx_operator.handlers']", ("kopf",))
