"""The Argo CD customizations' own test cases (health_test.yaml, actions/action_test.yaml, in Argo CD's format) run in
lupa's Lua 5.1 and 5.4 with Argo CD's sandbox imitated (tests/argocd/health.py), so they are checked where there is no
Go; test_lua_vm.py runs the same cases in Argo CD's own VM. Also: the layout is Argo CD's, every test object is a
DGXTrainingJob or DGXDataMount the operator's models accept (so the cases describe statuses it can write), and every
file in testdata/ is used."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from dgx_operator.api.common import JOB_KIND, MOUNT_KIND
from dgx_operator.api.datamount import DGXDataMount
from dgx_operator.api.trainingjob import DGXTrainingJob
from dgx_operator.api.vocabulary import JOB_PHASES, MOUNT_PHASES, JobCondition, JobReason
from tests.argocd.health import (
    ACTIONS,
    CUSTOMIZATIONS,
    GROUP,
    KINDS,
    SCRIPTS,
    ActionCase,
    DiscoveryCase,
    HealthCase,
    act,
    action_cases,
    discover,
    discovery_cases,
    health,
    health_cases,
    load,
)

HEALTH = health_cases()
DISCOVERY_CASES = discovery_cases()
ACTION_CASES = action_cases()
MODELS: dict[str, type[BaseModel]] = {JOB_KIND: DGXTrainingJob, MOUNT_KIND: DGXDataMount}
#: Jobs in a phase a newer operator might add: the checks must not break on them.
FUTURE_PHASE = {"unknown-phase.yaml", "finished-unknown-phase.yaml"}


def test_the_layout_is_argo_cds() -> None:
    """resource_customizations/<group>/<Kind>/ with health.lua and health_test.yaml for each kind, and actions/ with
    discovery.lua, <action>/action.lua and action_test.yaml: what Argo CD's TestLuaHealthScript and
    TestLuaResourceActionsScript walk, so the directory can be copied into Argo CD's tree as it is."""
    kinds = sorted(p.parent.name for p in CUSTOMIZATIONS.glob(f"{GROUP}/*/health.lua"))
    assert kinds == sorted(KINDS)
    assert sorted(p.name for p in CUSTOMIZATIONS.iterdir()) == [GROUP]
    for kind in KINDS:
        assert (CUSTOMIZATIONS / GROUP / kind / "health_test.yaml").is_file(), kind
    actions = ACTIONS["DGXTrainingJob"]
    assert sorted(p.parent.name for p in actions.glob("*/action.lua")) == ["resume", "suspend"]
    assert (actions / "discovery.lua").is_file()
    assert (actions / "action_test.yaml").is_file()
    assert sorted(p.parent.parent.name for p in CUSTOMIZATIONS.glob(f"{GROUP}/*/actions/discovery.lua")) == [
        "DGXTrainingJob"
    ]


def test_there_are_cases_for_every_kind_and_action() -> None:
    """The parametrized tests below cannot pass by running nothing."""
    assert {c.input.parents[1].name for c in HEALTH} == set(KINDS)
    assert len(HEALTH) >= 30
    assert {a for c in DISCOVERY_CASES for a in c.expected} == {"suspend", "resume"}
    assert any(not c.expected for c in DISCOVERY_CASES), "a case where nothing is offered"
    assert {c.action for c in ACTION_CASES} == {"suspend", "resume"}


@pytest.mark.parametrize("case", HEALTH, ids=lambda c: c.id)
def test_health_case(case: HealthCase) -> None:
    assert health(load(case.input)) == case.expected


@pytest.mark.parametrize("case", DISCOVERY_CASES, ids=lambda c: c.id)
def test_discovery_case(case: DiscoveryCase) -> None:
    assert discover(load(case.input)) == case.expected


@pytest.mark.parametrize("case", ACTION_CASES, ids=lambda c: c.id)
def test_action_case(case: ActionCase) -> None:
    """The action returns the expected object, and differs from its input in spec.suspend alone: the status is the
    operator's, and a merge patch of anything else would be drift from Git."""
    before = load(case.input)
    after = act(before, case.action)
    assert after == load(case.output)
    assert {k: v for k, v in after["spec"].items() if k != "suspend"} == {
        k: v for k, v in before["spec"].items() if k != "suspend"
    }
    assert {k: v for k, v in after.items() if k != "spec"} == {k: v for k, v in before.items() if k != "spec"}
    assert after["spec"]["suspend"] is (case.action == "suspend")


@pytest.mark.parametrize(("kind", "phases"), [(JOB_KIND, JOB_PHASES), (MOUNT_KIND, MOUNT_PHASES)])
def test_every_phase_the_operator_writes_has_a_health_case(kind: str, phases: tuple[str, ...]) -> None:
    """A phase added to api.vocabulary needs its Argo CD health decided: a case in health_test.yaml."""
    covered = {(load(c.input).get("status") or {}).get("phase") for c in HEALTH if c.input.parents[1].name == kind}
    assert sorted(set(phases) - covered) == []


def test_resume_is_never_offered_for_a_job_only_kueue_holds() -> None:
    """Suspended with one of Kueue's reasons and spec.suspend unset: resume would have nothing to lift (and would not
    admit the job). The cases that say so exist and pass."""
    held = [c for c in DISCOVERY_CASES if _suspended_reason(load(c.input)) not in (None, JobReason.SUSPENDED)]
    assert {c.input.name for c in held} >= {"queued-by-kueue.yaml", "resumed-waiting-for-kueue.yaml"}
    for case in held:
        assert not load(case.input)["spec"].get("suspend")
        assert "resume" not in discover(load(case.input)), case.id


def _suspended_reason(obj: dict[str, Any]) -> str | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == JobCondition.SUSPENDED and c["status"] == "True":
            return str(c["reason"])
    return None


def all_testdata() -> list[Path]:
    return sorted(CUSTOMIZATIONS.glob("**/testdata/*.yaml"))


@pytest.mark.parametrize("path", all_testdata(), ids=lambda p: str(p.relative_to(CUSTOMIZATIONS)))
def test_every_test_object_is_one_the_operator_accepts(path: Path) -> None:
    """Extra fields are forbidden, so a typo in a status field fails here. The objects with a phase from a future
    operator are checked with a phase of today's, and their phase must really be unknown."""
    obj = load(path)
    assert obj["apiVersion"] == "kubedgx.io/v1alpha1"
    model = MODELS[obj["kind"]]
    if path.name in FUTURE_PHASE:
        assert obj["status"]["phase"] not in JOB_PHASES
        obj["status"]["phase"] = JOB_PHASES[0]
    model.model_validate(obj)


def test_every_testdata_file_is_used() -> None:
    used = {c.input for c in HEALTH} | {c.input for c in DISCOVERY_CASES}
    used |= {c.input for c in ACTION_CASES} | {c.output for c in ACTION_CASES}
    assert sorted(set(all_testdata()) - used) == []
    assert sorted(p for p in used if not p.is_file()) == []


def test_the_kinds_health_scripts_are_the_ones_in_the_layout() -> None:
    assert {kind: path.relative_to(CUSTOMIZATIONS) for kind, path in SCRIPTS.items()} == {
        kind: Path(GROUP, kind, "health.lua") for kind in KINDS
    }
