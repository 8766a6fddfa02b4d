"""The status vocabulary (dgx_operator.api.vocabulary) is the one place phases, condition types and
reasons are spelled: the phase constants match the CRD's enums, every decision of the job planner
ends or sets a phase only with a reason declared for that phase, no module spells an owned reason
as a string of its own, the mount failures are the data plane's, and docs/operator.md's tables are
the generated ones."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

from dgx_api.schema import KubeModel
from dgx_datasync.errors import REASONS as SYNC_REASONS
from dgx_operator.api.datamount import DGXDataMountStatus
from dgx_operator.api.trainingjob import DGXTrainingJobStatus
from dgx_operator.api.vocabulary import (
    BUDGET,
    JOB,
    JOB_PHASES,
    MOUNT,
    MOUNT_PHASES,
    REASONS,
    BudgetReason,
    JobCondition,
    JobPhase,
    JobReason,
    MountPhase,
    MountReason,
    reasons_of,
    regenerate,
)
from dgx_operator.reconcile.planner import REASON

ROOT = Path(__file__).resolve().parents[2]
#: The planner package: its decisions are spread over the ladder and the policy modules.
PLANNER = ROOT / "operator/dgx_operator/reconcile/planner"
#: Where the vocabulary's words may appear as strings: the same word in another component's
#: vocabulary, which these modules read (a Pod's status, Kueue's Workload conditions).
FOREIGN_WORDS = {
    "operator/dgx_operator/reconcile/pods.py": {"DeadlineExceeded", "Completed"},  # the kubelet's reasons
    "operator/dgx_operator/reconcile/queueing.py": {"QuotaReserved"},  # Kueue's condition type
}


def constants(namespace: type) -> dict[str, str]:
    return {k: v for k, v in vars(namespace).items() if k.isupper() and isinstance(v, str)}


def test_the_phase_constants_are_the_crds_enums() -> None:
    assert sorted(constants(JobPhase).values()) == sorted(JOB_PHASES)
    assert sorted(constants(MountPhase).values()) == sorted(MOUNT_PHASES)
    assert get_args(DGXTrainingJobStatus.model_fields["phase"].annotation) != ()
    assert set(JobPhase.MEANING) == set(JOB_PHASES)
    assert set(MountPhase.MEANING) == set(MOUNT_PHASES)


@pytest.mark.parametrize("model", [DGXTrainingJobStatus, DGXDataMountStatus])
def test_the_status_models_take_exactly_these_phases(model: type[KubeModel]) -> None:
    phases = JOB_PHASES if model is DGXTrainingJobStatus else MOUNT_PHASES
    for phase in phases:
        assert model.model_validate({"phase": phase}).model_dump()["phase"] == phase
    with pytest.raises(ValueError, match="phase"):
        model.model_validate({"phase": "Finishing"})


def test_every_reason_fits_the_condition_schema_and_names_a_phase_of_its_kind() -> None:
    for (kind, name), r in REASONS.items():
        assert REASON.fullmatch(name), name
        assert r.kind == kind
        phases = {JOB: JOB_PHASES, MOUNT: MOUNT_PHASES, BUDGET: ()}[kind]  # a budget has no phase
        assert r.phase is None or r.phase in phases, name
        assert r.meaning, name
        assert r.shows, name
    assert {k for k, _ in REASONS} == {JOB, MOUNT, BUDGET}


def test_the_namespaces_hold_every_declared_reason_once() -> None:
    """JobReason and MountReason are the only way in: a declaration without a constant would be a
    reason nobody can use; REASONS refuses a second declaration of a name."""
    assert sorted(constants(JobReason).values()) == sorted(reasons_of(JOB))
    assert sorted(constants(MountReason).values()) == sorted(reasons_of(MOUNT))
    assert sorted(constants(BudgetReason).values()) == sorted(reasons_of(BUDGET))
    assert len(set(reasons_of(JOB))) == len(reasons_of(JOB))


def test_a_mounts_failures_are_the_data_planes_reasons() -> None:
    relayed = {r.name for r in REASONS.values() if r.kind == MOUNT and r.relayed}
    assert relayed == set(SYNC_REASONS)


def test_the_job_condition_types_are_distinct() -> None:
    values = list(constants(JobCondition).values())
    assert len(values) == len(set(values))


def _decisions(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, phase constant, reason constant) of every ``d.finish`` / ``d.set_phase`` call
    whose first two arguments are ``JobPhase.X`` and ``JobReason.Y``."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in ("finish", "set_phase") or len(node.args) < 2:
            continue
        phase, reason = node.args[0], node.args[1]
        if (
            isinstance(phase, ast.Attribute)
            and isinstance(reason, ast.Attribute)
            and isinstance(reason.value, ast.Name)
            and reason.value.id == "JobReason"
        ):
            # A diagnosis's reason (``found.reason``) is checked by tests/unit/test_diagnosis.py.
            found.append((node.lineno, phase.attr, reason.attr))
    return found


def test_every_decision_of_the_planner_uses_a_reason_of_its_phase() -> None:
    """A reason belongs to one phase: ``finish(JobPhase.FAILED, JobReason.COMPLETED, ...)`` would
    tell a dashboard a failed job completed."""
    decisions = [
        (path.name, *d) for path in sorted(PLANNER.glob("*.py")) for d in _decisions(ast.parse(path.read_text()))
    ]
    assert len(decisions) >= 15
    assert {name for name, *_ in decisions} >= {"ladder.py", "restarts.py", "gating.py", "archives.py", "timers.py"}
    wrong = []
    for name, line, phase, reason in decisions:
        declared = REASONS[JOB, getattr(JobReason, reason)].phase
        if declared != getattr(JobPhase, phase):
            wrong.append(f"planner/{name}:{line}: {phase} with {reason} (declared for {declared})")
    assert wrong == []


def test_the_decision_check_catches_a_reason_of_another_phase() -> None:
    source = "self.finish(JobPhase.FAILED, JobReason.COMPLETED, 'x')"
    ((_, phase, reason),) = _decisions(ast.parse(source))
    assert REASONS[JOB, getattr(JobReason, reason)].phase != getattr(JobPhase, phase)


def _spelled(path: Path, words: set[str], root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        f"{path.relative_to(root)}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in words and id(node) not in docstrings
    ]


def test_no_module_spells_an_owned_reason_itself() -> None:
    """The reasons kubedgx chooses (not the ones it relays from the kubelet, Kueue or the data
    plane) are spelled only in the vocabulary: anywhere else they would drift from the metrics, the
    Flyte plugin and the docs."""
    owned = {r.name for r in REASONS.values() if not r.relayed}
    sources = [*sorted((ROOT / "operator/dgx_operator").rglob("*.py")), *sorted((ROOT / "flyte").rglob("*.py"))]
    assert len(sources) > 30
    spelled = []
    for path in sources:
        if path.name == "vocabulary.py":
            continue
        allowed = FOREIGN_WORDS.get(str(path.relative_to(ROOT)), set())
        spelled += _spelled(path, owned - allowed)
    assert spelled == []


def test_the_spelling_check_catches_a_literal(tmp_path: Path) -> None:
    copy = tmp_path / "probe.py"
    copy.write_text(
        'def f(plan):\n    """Finishing is a word here."""\n    return plan.finish("Failed", "Finishing")\n'
    )
    assert _spelled(copy, {"Finishing"}, root=tmp_path) == ["probe.py:3: 'Finishing'"]


def test_docs_operator_tables_are_generated_from_the_vocabulary() -> None:
    """Regenerate with ``python -m dgx_operator.api.vocabulary``."""
    page = (ROOT / "docs/operator.md").read_text()
    assert regenerate(page) == page
    for name in ("WorkerFailed", "DataNotReady", "CredentialsMissing", "WorkerLost"):
        assert f"| `{name}` |" in page


def test_regenerate_refuses_a_page_without_its_blocks() -> None:
    with pytest.raises(ValueError, match="job phases"):
        regenerate("# no tables here\n")
