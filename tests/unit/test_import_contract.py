"""The import contracts: the operator and the trainer stand side by side on the data plane and the
shared contract and never import each other; inside the operator, each room (cli/, runtime/,
controllers/ and webhook/, reconcile/ with validation/ and kube.py, render/, api/ with catalog.py)
imports only the rooms below it, and the two controllers never import each other; render/ and
reconcile/ stay pure; the operator never
imports torch, and the trainer, the data plane and the contract never import what only the operator
image has.

import-linter checks the static import graph (pyproject.toml [tool.importlinter]); a subprocess
checks what actually gets imported at run time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

LINT_IMPORTS = shutil.which("lint-imports") or "lint-imports"


#: The source folders, one per distribution (their packages: dgx_api, dgx_datasync, ..., flytekitplugins.dgx).
FOLDERS = ("api", "datasync", "operator", "trainer", "flyte")


def run_lint_imports(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = None
    if pythonpath is not None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(pythonpath / f) for f in FOLDERS)}
    return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=cwd, capture_output=True, text=True, check=False, env=env)


def test_contracts_are_kept() -> None:
    result = run_lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "12 kept, 0 broken" in result.stdout


def broken_copy(tmp_path: Path, module: str, line: str) -> subprocess.CompletedProcess[str]:
    """lint-imports on a copy of the tree where ``module`` (a path under a source folder; a new module
    if it does not exist) gains ``line``."""
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / module
    before = path.read_text(encoding="utf-8") if path.exists() else ""
    path.write_text(before + f"\n{line}  # noqa\n", encoding="utf-8")
    result = run_lint_imports(tmp_path, pythonpath=tmp_path)
    assert result.returncode != 0, result.stdout
    return result


def test_contracts_catch_a_violation(tmp_path: Path) -> None:
    """A copy of the tree where render/ imports the kubernetes client must break the contract."""
    result = broken_copy(tmp_path, "operator/dgx_operator/render/names.py", "import kubernetes")
    assert "render/ and reconcile/ are pure: no kopf, kubernetes clients or torch BROKEN" in result.stdout


LAYERS = "layers: the operator and the trainer side by side on the data plane and the"


@pytest.mark.parametrize(
    ("module", "line"),
    [
        # The operator standing on the trainer, and the reverse: neither may import the other.
        ("operator/dgx_operator/cli/local.py", "import dgx_trainer.model"),
        ("trainer/dgx_trainer/data.py", "from dgx_operator.render import names"),
        # The layers below never reach up.
        ("datasync/dgx_datasync/store.py", "import dgx_operator.kube"),
        ("api/dgx_api/progress.py", "import dgx_datasync"),
    ],
)
def test_the_layers_contract_catches_an_import_across_or_upwards(tmp_path: Path, module: str, line: str) -> None:
    result = broken_copy(tmp_path, module, line)
    assert LAYERS in result.stdout
    assert "BROKEN" in result.stdout.split(LAYERS, 1)[1].split("\n", 2)[1], result.stdout


FLYTE_DAEMON = "never its daemon (kopf, controllers, webhook, client) BROKEN"
ROOMS = "the operator's rooms: cli over runtime | client over controllers | webhook over reconcile : validation : kube"


@pytest.mark.parametrize(
    ("module", "line"),
    [
        # A lower room reaching up: the planner into a controller, render into the client, the API
        # into render, the webhook into the daemon's settings, a controller into the CLI.
        ("operator/dgx_operator/reconcile/status.py", "from dgx_operator.controllers import loop"),
        ("operator/dgx_operator/render/names.py", "import dgx_operator.kube"),
        ("operator/dgx_operator/api/common.py", "from dgx_operator.render import names"),
        ("operator/dgx_operator/webhook/config.py", "from dgx_operator.runtime import settings"),
        ("operator/dgx_operator/controllers/loop.py", "from dgx_operator.cli import main"),
        # Independent siblings: the webhook and the controllers never import each other.
        ("operator/dgx_operator/webhook/admission.py", "from dgx_operator.controllers import metrics"),
        # Exhaustive: a new top-level module must be given a room.
        ("operator/dgx_operator/stray.py", "import dgx_operator.api"),
    ],
)
def test_the_rooms_contract_catches_an_import_upwards_or_across(tmp_path: Path, module: str, line: str) -> None:
    result = broken_copy(tmp_path, module, line)
    flat = " ".join(result.stdout.split())
    assert f"{ROOMS} over render over api : catalog BROKEN" in flat, result.stdout


def test_the_independence_contract_keeps_the_two_controllers_apart(tmp_path: Path) -> None:
    result = broken_copy(
        tmp_path, "operator/dgx_operator/controllers/mount.py", "from dgx_operator.controllers import job"
    )
    flat = " ".join(result.stdout.split())
    assert "the job and the mount controllers are independent BROKEN" in flat, result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("trainer/dgx_trainer/train.py", "import kopf", "never use what only the operator image has BROKEN"),
        ("datasync/dgx_datasync/sync.py", "import torch", "the data plane and the contract stay free of torch BROKEN"),
        ("api/dgx_api/schema.py", "import s3fs", "the shared contract needs no object-storage client BROKEN"),
        # The user's client runs where only `pip install kubedgx` ran: none of the daemon.
        ("operator/dgx_operator/client/jobs.py", "import kopf", "the user's client needs nothing of the daemon BROKEN"),
        (
            "operator/dgx_operator/client/lines.py",
            "from dgx_operator.runtime import settings",
            "the user's client needs nothing of the daemon BROKEN",
        ),
        # flytekit stays in the Flyte plugin; the plugin stays off the operator's runtime.
        ("operator/dgx_operator/render/pod.py", "import flytekit", "never import it BROKEN"),
        ("trainer/dgx_trainer/train.py", "import flytekitplugins.dgx", "never import it BROKEN"),
        (
            "flyte/flytekitplugins/dgx/connector.py",
            "import kopf",
            FLYTE_DAEMON,
        ),
        (
            "flyte/flytekitplugins/dgx/manifest.py",
            "from dgx_operator.runtime import handlers",
            FLYTE_DAEMON,
        ),
    ],
)
def test_each_image_layer_contract_catches_a_foreign_import(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    result = broken_copy(tmp_path, module, line)
    assert contract in " ".join(result.stdout.split()), result.stdout


RUNTIME = (
    "dgx_operator.runtime.handlers",
    "dgx_operator.runtime.webhooks",
    "dgx_operator.kube",
    "dgx_operator.controllers.job",
    "dgx_operator.controllers.loop",
    "dgx_operator.controllers.mount",
    "dgx_operator.controllers.ledger",
    "dgx_operator.controllers.budget",
    "dgx_operator.runtime.settings",
    "dgx_operator.webhook.admission",
    "dgx_operator.runtime.leader",
    "dgx_operator.webhook.certificates",
    "dgx_operator.runtime.daemon",
)


def imported_after(modules: str, watched: tuple[str, ...]) -> list[str]:
    """Which of ``watched`` a fresh interpreter has loaded after importing ``modules``."""
    code = (
        "import sys, pkgutil, importlib\n"
        f"for name in {modules}:\n"
        "    importlib.import_module(name)\n"
        f"print(','.join(m for m in {watched!r} if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return [m for m in result.stdout.strip().split(",") if m]


def walk(package: str) -> str:
    """Code for the names of every module of ``package`` (``__main__`` left out: importing it runs it)."""
    return (
        f"[m.name for m in pkgutil.walk_packages(importlib.import_module({package!r}).__path__, '{package}.')"
        " if not m.name.endswith('.__main__')]"
    )


ALL = walk("dgx_operator")


def test_no_operator_module_imports_torch_at_run_time() -> None:
    assert imported_after(ALL, ("torch", "transformers", "peft", "trl", "bitsandbytes")) == []


def test_no_operator_module_imports_the_trainer_at_run_time() -> None:
    assert imported_after(ALL, ("dgx_trainer",)) == []


@pytest.mark.parametrize("package", ["dgx_api", "dgx_datasync", "dgx_trainer"])
def test_the_trainer_image_layers_import_nothing_of_the_operator_image_at_run_time(package: str) -> None:
    watched = ("dgx_operator", "kopf", "kubernetes", "kubernetes_asyncio", "prometheus_client", "cryptography")
    assert imported_after(walk(package), watched) == []


def test_the_cli_path_imports_no_kopf_or_cluster_client_at_run_time() -> None:
    """`kubedgx validate` and `render` run in CI pipelines: no kopf, no kubernetes client."""
    light = f"[m for m in {ALL} if m not in {RUNTIME!r}]"
    assert imported_after(light, ("kopf", "kubernetes", "kubernetes_asyncio", "aiohttp")) == []


def test_the_runtime_check_can_fail() -> None:
    assert "kopf" in imported_after("['dgx_operator.runtime.handlers']", ("kopf",))


def test_the_operator_imports_no_generated_kubernetes_client_at_run_time() -> None:
    """The daemon's modules reach the API server through kube.py alone: importing all of them loads
    no kubernetes_asyncio (kopf would, were it not kept out as `kubedgx operator` does: the next test)."""
    kept_out = f"(__import__('dgx_operator.cli.main').cli.main.keep_out_generated_client(), {list(RUNTIME)!r})[1]"
    # (the blocker itself is a None in sys.modules under the top-level name)
    assert imported_after(kept_out, ("kubernetes_asyncio.client", "kubernetes_asyncio.config", "kubernetes")) == []


def test_kopf_alone_would_import_the_generated_client_where_it_is_installed() -> None:
    """Why the daemon keeps it out: kopf imports it, models and all, whenever it can."""
    assert "kubernetes_asyncio.client" in imported_after("['kopf']", ("kubernetes_asyncio.client",))


def test_no_operator_trainer_or_data_plane_module_imports_flytekit_at_run_time() -> None:
    modules = f"{ALL} + {walk('dgx_trainer')} + {walk('dgx_datasync')} + {walk('dgx_api')}"
    assert imported_after(modules, ("flytekit", "flyteidl", "flytekitplugins.dgx")) == []


def test_the_flyte_plugin_imports_neither_kopf_nor_torch_when_it_submits() -> None:
    """The connector service and a user's laptop have no torch (it is imported in the pods only)."""
    assert (
        imported_after(walk("flytekitplugins.dgx"), ("kopf", "torch", "dgx_operator.runtime.handlers", "dgx_trainer"))
        == []
    )
