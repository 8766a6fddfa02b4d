"""`pip install kubedgx` without the `operator` extra: the user CLI works, the daemon verbs say
what to install.

Someone else's CI runs `kubedgx validate` on its manifests; it must not pull in kopf, the async
cluster client or the object-storage clients (fsspec, s3fs, gcsfs: the data plane's). Each case runs
the CLI in a fresh interpreter where those modules cannot be imported (``sys.modules[name] = None``
makes any import of them, or of their submodules, fail, and ``find_spec`` report them missing), so
an import that slips into the CLI's path fails here, not in a user's pipeline.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dgx_operator.cli.main import DAEMON_MODULES
from tests.conftest import ROOT

#: The daemon's distributions and what they pull in, plus torch (never the CLI's).
BLOCKED = (*DAEMON_MODULES, "fsspec", "s3fs", "gcsfs", "boto3", "botocore", "torch")

_RUN = """
import sys
blocked = {blocked!r}
for name in blocked:
    sys.modules[name] = None
from dgx_operator.cli.main import main
code = main({argv!r})
leaked = sorted(m for m in sys.modules if m.split(".")[0] in blocked and sys.modules[m] is not None)
assert not leaked, leaked
sys.exit(code)
"""


def cli_without_daemon(
    *argv: str, blocked: tuple[str, ...] = BLOCKED, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    """`kubedgx ARGV` in a fresh interpreter where the blocked modules cannot be imported."""
    return subprocess.run(
        [sys.executable, "-c", _RUN.format(blocked=blocked, argv=list(argv))],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_validate_runs_without_the_daemon() -> None:
    result = cli_without_daemon("validate", "examples/quickstart.yaml", "examples/data-mounts.yaml")
    assert result.returncode == 0, result.stderr
    assert "ModuleNotFoundError" not in result.stderr


def test_validate_still_finds_problems_without_the_daemon() -> None:
    """The light path is the real validator, not a stub that passes everything."""
    bad = "apiVersion: kubedgx.io/v1alpha1\nkind: DGXTrainingJob\nmetadata: {name: x}\nspec: {nodes: 0}\n"
    result = cli_without_daemon("validate", "-", stdin=bad)
    assert result.returncode == 1, result.stderr
    assert "spec" in result.stdout + result.stderr


def test_render_crds_manifests_and_instances_run_without_the_daemon() -> None:
    for argv in (
        ("render", "examples/quickstart.yaml"),
        ("crds",),
        ("manifests",),
        ("instances",),
    ):
        result = cli_without_daemon(*argv)
        assert result.returncode == 0, (argv, result.stderr)
        assert result.stdout.strip(), argv


def test_usage_reads_a_cluster_without_the_daemon(tmp_path: Path) -> None:
    """`kubedgx usage` talks to the API server with the standard library: it gets as far as the
    connection (refused here: nothing listens on the port) without importing a daemon module."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "config"
    config.write_text(
        json.dumps(
            {
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        ),
        encoding="utf-8",
    )
    result = cli_without_daemon("usage", "--kubeconfig", str(config))
    assert result.returncode == 2, result.stderr
    assert "cannot reach the API server" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("verb", ["operator", "check-install"])
def test_a_daemon_verb_names_the_extra_instead_of_a_traceback(verb: str) -> None:
    result = cli_without_daemon(verb)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "pip install 'kubedgx[operator]'" in result.stderr
    assert "kopf" in result.stderr


def test_the_daemon_check_names_only_what_is_missing() -> None:
    """With only cryptography missing, the message names cryptography and not kopf."""
    result = cli_without_daemon("check-install", blocked=("cryptography",))
    assert result.returncode == 2, result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert "cryptography" in message
    assert "kopf" not in message


def test_the_blocking_can_fail() -> None:
    """A module the CLI does import, blocked, breaks it: the cases above would see a leak."""
    result = cli_without_daemon("crds", blocked=("yaml",))
    assert result.returncode != 0
    assert "ModuleNotFoundError" in result.stderr


def test_the_operator_extra_is_what_the_daemon_check_looks_for() -> None:
    """DAEMON_MODULES and pyproject's `operator` extra name the same distributions."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads(Path(ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extra = {canonicalize_name(Requirement(r).name) for r in project["optional-dependencies"]["operator"]}
    as_distributions = {canonicalize_name({"dgx_datasync": "kubedgx-datasync"}.get(m, m)) for m in DAEMON_MODULES}
    assert as_distributions == extra, json.dumps(sorted(extra ^ as_distributions))
