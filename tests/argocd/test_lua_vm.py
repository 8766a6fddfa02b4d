"""The Argo CD customizations in Argo CD's own Lua VM: tests/argocd/luavm (Go) imports Argo CD's util/lua and runs
every health_test.yaml and action_test.yaml case as Argo CD's own TestLuaHealthScript and
TestLuaResourceActionsScript do, then again through the chart's ConfigMap as Argo CD's controller and API server
would read it from argocd-cm. Built once per module graph and cached (tests/argocd/lua_vm.py); skipped only where
there is no Go.

The counts are checked against the YAML files, so a run that found no case (a moved directory, a renamed file) fails
rather than passes; and the binary is shown to fail on a broken copy of the customizations.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.argocd import lua_vm
from tests.argocd.health import CUSTOMIZATIONS, action_cases, discovery_cases, health_cases
from tests.chart.conftest import one, render
from tests.conftest import ROOT
from tests.support.timeouts import timeout_paused

pytestmark = [
    pytest.mark.skipif(lua_vm.go() is None, reason="no go on PATH: Argo CD's Lua VM is built from Go modules"),
    # A cold build compiles much of Argo CD and client-go (tens of minutes of CPU on 2 cores, then
    # cached); it runs outside the tests' timeout (timeout_paused), this is the VM's own runs'.
    pytest.mark.timeout(300),
]

HEALTH = len(health_cases())
DISCOVERY = len(discovery_cases())
ACTIONS = len(action_cases())
EXPECTED = {
    "TestLuaHealthScript": HEALTH,
    "TestLuaResourceActionsScript": DISCOVERY + ACTIONS,
    "TestArgoCDConfigMap": 1 + HEALTH + DISCOVERY + ACTIONS,  # "keys", then every case
}


def docs_jq_command() -> str:
    """docs/argocd.md's jq command that writes the argocd-cm patch from a checkout, without its kubectl."""
    text = (ROOT / "docs" / "argocd.md").read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0] for b in text.split("```bash\n")[1:]]
    [block] = [b for b in blocks if "jq -n" in b and "--rawfile" in b]
    lines = block.rstrip("\n").splitlines()
    assert lines[-1].lstrip().startswith("| kubectl -n argocd patch configmap argocd-cm"), lines[-1]
    return "\n".join(lines[:-1]).rstrip(" \\")


@pytest.fixture(scope="module", params=["chart", "docs-jq"])
def configmap(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The argocd-cm data for the Go test to parse as Argo CD does: the chart's ConfigMap
    (argocd.healthChecks.enabled), or the patch docs/argocd.md's jq command writes."""
    path = tmp_path_factory.mktemp("argocd-cm") / "configmap.yaml"
    if request.param == "chart":
        config = one(render({"argocd": {"healthChecks": {"enabled": True}}}), "ConfigMap", "kubedgx-argocd-health")
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
    else:
        if shutil.which("jq") is None:
            pytest.skip("no jq on PATH: docs/argocd.md's jq command is not run")
        out = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", docs_jq_command()],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        path.write_text(out.stdout, encoding="utf-8")
    return path


@pytest.fixture(scope="module", params=sorted(lua_vm.MODFILES))
def binary(request: pytest.FixtureRequest) -> Path:
    with timeout_paused():  # a cold build (or waiting for .ci/run's) belongs to no test
        return lua_vm.build(request.param).binary


def test_the_cases_run_in_argo_cds_vm_and_pass(binary: Path, configmap: Path) -> None:
    result = lua_vm.run(binary, CUSTOMIZATIONS, configmap)
    assert result.returncode == 0, result.output[-8000:]
    assert result.failed == (), result.output[-8000:]
    assert result.skipped == (), result.output[-8000:]
    assert dict(result.counts()) == EXPECTED, result.output[-8000:]
    assert set(lua_vm.TESTS) <= set(result.passed)
    assert result.output.rstrip().endswith("PASS"), result.output[-2000:]


def test_the_vm_fails_on_a_wrong_expectation_and_a_wrong_discovery(binary: Path, tmp_path: Path) -> None:
    """On a copy where one health case expects another message and discovery offers resume to a job only Kueue
    holds, exactly those cases fail, in each mode that runs them."""
    copy = tmp_path / "resource_customizations"
    shutil.copytree(CUSTOMIZATIONS, copy)
    job = copy / "kubedgx.io" / "DGXTrainingJob"
    tests = job / "health_test.yaml"
    tests.write_text(
        tests.read_text(encoding="utf-8").replace("message: 'Running: 2/2 workers running'\n", "message: Running\n"),
        encoding="utf-8",
    )
    discovery = job / "actions" / "discovery.lua"
    text = discovery.read_text(encoding="utf-8")
    assert "if obj.spec ~= nil and obj.spec.suspend == true then" in text
    broken = text.replace("obj.spec.suspend == true", "obj.status ~= nil and obj.status.phase == 'Suspended'")
    discovery.write_text(broken, encoding="utf-8")

    result = lua_vm.run(binary, copy, None)  # argocd-cm data written from the copy, as docs/argocd.md's jq does
    assert result.returncode != 0
    failed = {name for name in result.failed if name.count("/") > 0}
    assert "TestLuaHealthScript/kubedgx.io/DGXTrainingJob/testdata/running.yaml" in failed, result.output[-6000:]
    assert "TestArgoCDConfigMap/health/kubedgx.io/DGXTrainingJob/testdata/running.yaml" in failed
    for test in ("TestLuaResourceActionsScript", "TestArgoCDConfigMap"):
        assert f"{test}/discovery/testdata/queued-by-kueue.yaml" in failed, result.output[-6000:]
    # Nothing else: the rest of the copy is the real thing.
    others = {n for n in failed if "running.yaml" not in n and "discovery/" not in n}
    assert others == set(), others
