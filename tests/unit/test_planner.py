"""The pure reconcile planner: (job, observed children, now) -> creates, deletes, status, events.

Every scenario is simulated with explicit, timezone-aware ``now`` values; pods are the builders' real
worker pods with a hand-written ``status`` (what kubelet and scheduler would report).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import pytest

from dgx_operator.api.trainingjob import DGXTrainingJobStatus, WorkerCounts
from dgx_operator.catalog import Catalog
from dgx_operator.reconcile.planner import MountState, Observed, plan
from dgx_operator.reconcile.pods import PodView, read_progress
from dgx_operator.render import BuildContext
from dgx_operator.render.pod import IDLE_COMMAND
from tests.conftest import BASE_JOB, DELETE, with_changes
from tests.unit.planner_sim import (
    ATTEMPT,
    DATA_REF,
    OLD_UID,
    PHASE_CONDITION,
    READY,
    SYNCING,
    T0,
    UID,
    assert_stable,
    at,
    attempt_of,
    cond,
    created,
    created_pods,
    deleted,
    event_reasons,
    make_ctx,
    make_job,
    make_pod,
    observe,
    phase_reason,
    pods_of,
    respec,
    sim_of,
    start_running,
)
from tests.unit.planner_table import EVENTS, TABLE, TABLE_PARAMS, Expect, State

# --- the pod factory and PodView -------------------------------------------------------------------

# state -> (phase, running, scheduled, failed, succeeded, disrupted, exit_code, deadline_exceeded)
POD_FACTS: dict[str, tuple[str, bool, bool, bool, bool, bool, int | None, bool]] = {
    "unscheduled": ("Pending", False, False, False, False, False, None, False),
    "scheduled": ("Pending", False, True, False, False, False, None, False),
    "running": ("Running", True, True, False, False, False, None, False),
    "succeeded": ("Succeeded", False, True, False, True, False, 0, False),
    "failed": ("Failed", False, True, True, False, False, 1, False),
    "evicted": ("Failed", False, True, True, False, True, 137, False),
    "disruption": ("Failed", False, True, True, False, True, 143, False),
    "nostate": ("Failed", False, True, True, False, True, None, False),
    "outofgpu": ("Failed", False, False, True, False, True, None, False),
    "unknown": ("Unknown", False, False, True, False, True, None, False),
    "sidecar": ("Running", False, True, False, False, False, 0, False),
    "exited": ("Running", False, True, False, False, False, 0, False),
    "deadline": ("Failed", False, True, True, False, False, 137, True),
}


@pytest.mark.parametrize("state", sorted(POD_FACTS))
def test_pod_view_reads_each_pod_state(ctx: BuildContext, state: str) -> None:
    job = make_job()
    view = PodView.of(make_pod(job, ctx, 2, state, attempt=5))
    phase, running, scheduled, failed, succeeded, disrupted, code, deadline = POD_FACTS[state]
    assert (view.name, view.index, view.attempt, view.owner_uid) == ("job-worker-2", 2, 5, UID)
    assert (view.owner_kind, view.owner_name) == ("DGXTrainingJob", "job")
    assert view.phase == phase
    assert view.running is running
    assert view.scheduled is scheduled
    assert view.failed is failed
    assert view.succeeded is succeeded
    assert view.finished is (failed or succeeded)
    assert view.active is not (failed or succeeded)
    assert view.disrupted is disrupted
    assert view.exit_code == code
    assert view.deadline_exceeded is deadline
    assert view.terminating is False
    assert view.ending is (state in ("sidecar", "exited"))


def test_pod_view_terminating_pod_is_not_active(ctx: BuildContext) -> None:
    view = PodView.of(make_pod(make_job(), ctx, 0, "running", terminating=True))
    assert view.terminating is True
    assert view.running is True
    assert view.active is False


def test_pod_view_bare_dict_defaults() -> None:
    view = PodView.of({"metadata": {"name": "x"}})
    assert (view.name, view.index, view.attempt, view.phase) == ("x", None, 0, "Pending")
    assert (view.owner_uid, view.running, view.failed, view.disrupted) == (None, False, False, False)


def test_pod_view_describes_failures(ctx: BuildContext) -> None:
    job = make_job()
    crash = PodView.of(make_pod(job, ctx, 1, "failed", exit_code=3, message="line one\nValueError: bad batch\n"))
    assert crash.describe_failure() == "job-worker-1 exited with code 3: ValueError: bad batch"
    lost = PodView.of(make_pod(job, ctx, 0, "unknown"))
    assert lost.describe_failure() == "job-worker-0 failed (Unknown): node kubelet stopped posting status"


# --- read_progress -----------------------------------------------------------------------------------

PROGRESS = {"step": 120, "totalSteps": 400, "loss": 1.25, "tokensPerSecond": 5300.5, "samplesPerSecond": 12.5}


def _progress_view(ctx: BuildContext, *, message: str | None = None, annotation: str | None = None) -> PodView:
    notes = {"kubedgx.io/progress": annotation} if annotation is not None else None
    state = "succeeded" if message is not None else "running"
    return PodView.of(make_pod(make_job(), ctx, 0, state, message=message, annotations=notes))


@pytest.mark.parametrize(
    ("message", "annotation", "expected"),
    [
        (json.dumps(PROGRESS), None, PROGRESS),
        (json.dumps({"progress": PROGRESS, "summary": "done"}), None, PROGRESS),
        (None, json.dumps({"step": 7}), {"step": 7}),
        (json.dumps({"step": 400}), json.dumps({"step": 399}), {"step": 400}),
        (json.dumps({"step": 400}), "{not json", {"step": 400}),
        ("Traceback (most recent call last): boom", None, None),
        (json.dumps([1, 2, 3]), None, None),
        (json.dumps({"progress": 5}), None, None),
        ("", None, None),
    ],
    ids=[
        "message",
        "wrapped",
        "annotation",
        "final-message-first",
        "bad-annotation",
        "text",
        "list",
        "scalar",
        "empty",
    ],
)
def test_read_progress(
    ctx: BuildContext, message: str | None, annotation: str | None, expected: dict[str, Any] | None
) -> None:
    assert read_progress(_progress_view(ctx, message=message, annotation=annotation)) == expected


def test_non_finite_progress_values_are_read_as_null(ctx: BuildContext) -> None:
    """A diverged loss is NaN and Python's json writes it: a status carrying it is not JSON, and the
    apiserver refused the status patch on every pass (issue 13, item 6)."""
    annotation = '{"step": 5, "loss": NaN, "learningRate": Infinity, "samplesPerSecond": -Infinity, "epoch": 1e999}'
    report = read_progress(_progress_view(ctx, annotation=annotation))
    assert report == {"step": 5, "loss": None, "learningRate": None, "samplesPerSecond": None, "epoch": None}
    sim = sim_of(ctx, {})
    start_running(sim, 1)
    running = sim.pod(0, "running")
    running["metadata"].setdefault("annotations", {})["kubedgx.io/progress"] = annotation
    sim.reconcile([running], at_s=200)
    assert sim.status.progress is not None
    assert sim.status.progress.step == 5
    json.dumps(sim.status.model_dump(mode="json", by_alias=True), allow_nan=False)  # raises on NaN


# --- the decision table ------------------------------------------------------------------------------


def test_table_covers_every_phase_and_event() -> None:
    assert {row[0] for row in TABLE} == set(PHASE_CONDITION)
    assert {row[1] for row in TABLE} == set(EVENTS)
    assert len({(row[0], row[1]) for row in TABLE}) == len(TABLE)


@pytest.mark.parametrize(("phase", "event", "expect"), TABLE_PARAMS)
def test_decision_table(states: dict[str, State], phase: str, event: str, expect: Expect) -> None:
    state = states[phase]
    before = state.sim.status
    given = EVENTS[event](state)
    result = plan(given.job, state.sim.ctx, given.observed(), given.now)
    status = result.status

    assert status.phase == expect.phase
    assert phase_reason(status) == expect.reason
    # A pod deleted in this pass still holds its name: it is never replaced in the same plan.
    assert set(created(result)) == expect.created
    assert {attempt_of(p) for p in created_pods(result)} <= {status.attempt}  # new workers join the new attempt
    assert set(deleted(result)) == expect.deleted
    assert status.restarts - before.restarts == expect.restarts
    assert status.attempt - before.attempt == expect.attempt
    assert event_reasons(result) == list(expect.events)
    if expect.release is not None:
        assert result.release_finalizer is expect.release
    assert result.delete_job is expect.delete_job
    if expect.phase in ("Succeeded", "Failed"):
        assert status.completion_time is not None
    if expect.phase in ("Suspended", "WaitingForData"):
        assert status.start_time is None


@pytest.mark.parametrize(("phase", "event", "expect"), TABLE_PARAMS)
def test_decision_table_rows_are_stable(states: dict[str, State], phase: str, event: str, expect: Expect) -> None:
    """Property: re-planning a row's observations from the status it produced changes nothing."""
    state = states[phase]
    given = EVENTS[event](state)
    assert_stable(given.job, state.sim.ctx, given.observed(), given.now)


# --- scenarios -------------------------------------------------------------------------------------


def test_happy_path(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 3}})
    first = sim.reconcile(at_s=0, shared=False)
    assert [(c["kind"], c["metadata"]["name"]) for c in first.create] == [
        ("ConfigMap", first.create[0]["metadata"]["name"]),
        ("Service", "job"),
        ("Pod", "job-worker-0"),
        ("Pod", "job-worker-1"),
        ("Pod", "job-worker-2"),
    ]
    assert [c["metadata"]["labels"][ATTEMPT] for c in created_pods(first)] == ["0", "0", "0"]
    assert all(c["metadata"]["ownerReferences"][0]["uid"] == UID for c in first.create)
    assert first.delete == []
    assert (sim.phase(), phase_reason(sim.status)) == ("Pending", "WorkersPending")
    assert sim.status.start_time == T0
    assert (sim.workers().desired, sim.workers().active, sim.workers().ready) == (3, 3, 0)
    assert sim.status.nodes == "0/3"
    assert [(e.type, e.reason) for e in first.events] == [("Normal", "WorkersPending")]
    assert first.requeue_after is None  # no maxDuration, no maxPending: nothing to wake up for

    # The shared children exist now; pods wait for nodes, then get scheduled.
    second = sim.reconcile(pods_of(sim, {0: "scheduled", 1: "unscheduled", 2: "unscheduled"}), at_s=30)
    assert (second.create, second.delete, second.events) == ([], [], [])
    assert (sim.phase(), phase_reason(sim.status)) == ("Pending", "Unschedulable")  # the scheduler said why

    running = sim.reconcile(pods_of(sim, dict.fromkeys(range(3), "running")), at_s=90)
    assert (sim.phase(), phase_reason(sim.status)) == ("Running", "AllWorkersRunning")
    assert [(e.type, e.reason) for e in running.events] == [("Normal", "AllWorkersRunning")]
    assert sim.status.nodes == "3/3"
    assert cond(sim.status, "Running") == ("True", "AllWorkersRunning")
    assert next(c for c in sim.status.conditions if c.type == "Running").last_transition_time == at(90)

    summary = json.dumps({"step": 400, "totalSteps": 400, "loss": 0.42, "tokensPerSecond": 8100.0})
    pods = [sim.pod(0, "succeeded", message=summary), sim.pod(1, "running"), sim.pod(2, "succeeded")]
    done = sim.reconcile(pods, at_s=3600)
    assert (sim.phase(), phase_reason(sim.status)) == ("Succeeded", "Completed")
    assert done.delete == ["job-worker-1"]  # the running one; finished pods stay for their logs
    assert done.create == []
    assert [(e.type, e.reason) for e in done.events] == [("Normal", "Completed")]
    assert sim.status.completion_time == at(3600)
    assert cond(sim.status, "Running") == ("False", "Completed")
    assert cond(sim.status, "Failed") == ("False", "NotFailed")
    assert sim.status.progress is not None
    assert (sim.status.progress.step, sim.status.progress.total_steps) == (400, 400)
    assert (sim.status.progress.loss, sim.status.progress.tokens_per_second) == (0.42, 8100.0)
    assert (sim.workers().desired, sim.status.nodes) == (0, "0/0")

    later = sim.reconcile([sim.pod(0, "succeeded", message=summary)], at_s=3700)
    assert (later.create, later.delete, later.events) == ([], [], [])
    assert sim.status.completion_time == at(3600)


def test_never_fails_the_job_on_any_worker_failure(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 1, "maxNodes": 2}, "spec.restartPolicy": "Never"})
    start_running(sim, 2)
    result = sim.reconcile([sim.pod(0, "running"), sim.pod(1, "failed", exit_code=137)], at_s=500)
    assert (sim.phase(), phase_reason(sim.status)) == ("Failed", "WorkerFailed")
    assert result.delete == ["job-worker-0"]
    assert result.create == []
    assert (sim.status.restarts, sim.status.attempt) == (0, 0)
    assert [(e.type, e.reason) for e in result.events] == [("Warning", "WorkerFailed")]
    message = next(c for c in sim.status.conditions if c.type == "Failed").message
    assert "job-worker-1 exited with code 137" in message
    assert (sim.workers().failed, sim.status.completion_time) == (1, at(500))


def test_on_failure_counts_restarts_up_to_the_backoff_limit(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.backoffLimit": 2})
    start_running(sim, 1)
    clock = 100.0
    for restart in (1, 2):
        failed = sim.pod(0, "failed", exit_code=1, attempt=restart - 1)
        result = sim.reconcile([failed], at_s=clock)
        assert (sim.status.restarts, sim.status.attempt) == (restart, restart)
        assert result.delete == ["job-worker-0"]
        assert (result.events[0].type, result.events[0].reason) == ("Warning", "WorkerRestarted")
        assert (sim.phase(), phase_reason(sim.status)) == ("Restarting", "NodesBelowMinimum")
        # The failed pod is gone: its replacement belongs to the new attempt.
        replaced = sim.reconcile([], at_s=clock + 5)
        assert [p["metadata"]["name"] for p in created_pods(replaced)] == ["job-worker-0"]
        pod = created_pods(replaced)[0]
        assert pod["metadata"]["labels"][ATTEMPT] == str(restart)
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["KUBEDGX_ATTEMPT"] == str(restart)
        assert (sim.status.restarts, sim.status.attempt) == (restart, restart)
        sim.reconcile([sim.pod(0, "running", attempt=restart)], at_s=clock + 10)
        assert (sim.phase(), phase_reason(sim.status)) == ("Running", "AllWorkersRunning")
        clock += 100
    third = sim.reconcile([sim.pod(0, "failed", exit_code=1, attempt=2)], at_s=clock)
    assert (sim.phase(), phase_reason(sim.status)) == ("Failed", "BackoffLimitExceeded")
    assert (sim.status.restarts, sim.status.attempt) == (2, 2)
    assert third.create == []
    assert [(e.type, e.reason) for e in third.events] == [("Warning", "BackoffLimitExceeded")]


def test_backoff_limit_zero_fails_on_the_first_failure(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.backoffLimit": 0})
    start_running(sim, 1)
    sim.reconcile([sim.pod(0, "failed", exit_code=1)], at_s=100)
    assert (sim.phase(), phase_reason(sim.status), sim.status.restarts) == ("Failed", "BackoffLimitExceeded", 0)


def test_the_trainers_exit_2_ends_an_on_failure_job_at_once(ctx: BuildContext) -> None:
    """Exit 2 is the built-in trainer refusing its config, data or model: retrying cannot help."""
    sim = sim_of(ctx, {"spec.backoffLimit": 3})
    start_running(sim, 1)
    result = sim.reconcile([sim.pod(0, "failed", exit_code=2)], at_s=100)
    assert (sim.phase(), phase_reason(sim.status), sim.status.restarts) == ("Failed", "InvalidTrainerInput", 0)
    assert result.delete == []
    message = result.status.conditions[-1].message
    assert "job-worker-0 exited with code 2" in message
    assert "no restart can change" in message


DIVERGED = (
    "LossDiverged: the training loss was nan at 3 reports in a row (steps 10, 20, 30): the run diverged and a "
    "restart would diverge again; lower training.learningRate, use precision bf16 rather than fp16, or check the data"
)


@pytest.mark.parametrize("policy", ["OnFailure", "ExitCode", "Never"])
def test_a_diverged_loss_ends_the_job_at_once_whatever_the_policy(ctx: BuildContext, policy: str) -> None:
    """The trainer's termination message names LossDiverged (torchrun turns its exit 4 into 1): the
    same config diverges again, so no policy retries it, and the message carries the trainer's fix."""
    sim = sim_of(ctx, {"spec.backoffLimit": 3, "spec.restartPolicy": policy})
    start_running(sim, 1)
    result = sim.reconcile([sim.pod(0, "failed", exit_code=1, message=DIVERGED)], at_s=100)
    assert (sim.phase(), phase_reason(sim.status), sim.status.restarts) == ("Failed", "LossDiverged", 0)
    assert result.create == []
    message = result.status.conditions[-1].message
    assert "job-worker-0 exited with code 1: LossDiverged: the training loss was nan" in message
    assert "lower training.learningRate" in message
    assert [(e.type, e.reason) for e in result.events] == [("Warning", "LossDiverged")]


def test_a_crash_that_only_mentions_divergence_is_retried(ctx: BuildContext) -> None:
    """Only the trainer's own first word counts: a traceback that quotes it later is a crash."""
    sim = sim_of(ctx, {"spec.backoffLimit": 3})
    start_running(sim, 1)
    sim.reconcile([sim.pod(0, "failed", exit_code=1, message="RuntimeError: LossDiverged: no")], at_s=100)
    assert (sim.phase(), sim.status.restarts) == ("Restarting", 1)


def test_exit_2_of_a_users_own_program_is_retried_as_any_failure(ctx: BuildContext) -> None:
    """spec.command runs the user's program, whose exit codes kubedgx does not define."""
    sim = sim_of(ctx, {"spec.backoffLimit": 3, "spec.trainer": DELETE, "spec.command": ["python", "train.py"]})
    start_running(sim, 1)
    sim.reconcile([sim.pod(0, "failed", exit_code=2)], at_s=100)
    assert (sim.phase(), sim.status.restarts) == ("Restarting", 1)


@pytest.mark.parametrize(
    ("codes", "exit_code", "restarts"),
    [
        (None, 137, True),
        (None, 143, True),
        (None, 128, False),  # StartError: the container could not start (a spec problem), not a signal
        (None, 129, True),
        (None, 255, True),
        (None, 1, False),
        (None, 127, False),
        ([1, 75], 75, True),
        ([1, 75], 1, True),
        ([1, 75], 137, False),
        ([1, 75], 2, False),
    ],
)
def test_exit_code_policy(ctx: BuildContext, codes: list[int] | None, exit_code: int, restarts: bool) -> None:
    changes: dict[str, Any] = {"spec.restartPolicy": "ExitCode"}
    if codes is not None:
        changes["spec.retryableExitCodes"] = codes
    sim = sim_of(ctx, changes)
    start_running(sim, 1)
    result = sim.reconcile([sim.pod(0, "failed", exit_code=exit_code)], at_s=100)
    if restarts:
        assert (sim.phase(), phase_reason(sim.status)) == ("Restarting", "NodesBelowMinimum")
        assert (sim.status.restarts, sim.status.attempt) == (1, 1)
    else:
        assert (sim.phase(), phase_reason(sim.status)) == ("Failed", "WorkerFailed")
        assert (sim.status.restarts, sim.status.attempt) == (0, 0)
        assert f"exit code {exit_code} is not in retryableExitCodes" in result.status.conditions[-1].message


@pytest.mark.parametrize("kind", ["evicted", "disruption", "nostate", "outofgpu", "unknown"])
@pytest.mark.parametrize("policy", ["Never", "OnFailure", "ExitCode"])
def test_disruptions_never_count(ctx: BuildContext, kind: str, policy: str) -> None:
    sim = sim_of(ctx, {"spec.restartPolicy": policy, "spec.backoffLimit": 0})
    start_running(sim, 1)
    result = sim.reconcile([sim.pod(0, kind)], at_s=100)
    assert (sim.phase(), phase_reason(sim.status)) == ("Restarting", "NodesBelowMinimum")
    assert (sim.status.restarts, sim.status.attempt) == (0, 1)
    assert result.delete == ["job-worker-0"]
    assert (result.events[0].type, result.events[0].reason) == ("Normal", "WorkerDisrupted")
    sim.reconcile([], at_s=110)
    sim.reconcile([sim.pod(0, "running", attempt=1)], at_s=120)
    assert (sim.phase(), sim.status.restarts) == ("Running", 0)


def test_eviction_then_real_failure_still_hits_the_limit(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.backoffLimit": 1})
    start_running(sim, 1)
    sim.reconcile([sim.pod(0, "evicted")], at_s=100)
    sim.reconcile([], at_s=110)
    sim.reconcile([sim.pod(0, "failed", attempt=1)], at_s=120)
    assert (sim.phase(), sim.status.restarts, sim.status.attempt) == ("Restarting", 1, 2)
    sim.reconcile([], at_s=130)
    sim.reconcile([sim.pod(0, "failed", attempt=2)], at_s=140)
    assert (sim.phase(), phase_reason(sim.status), sim.status.restarts) == ("Failed", "BackoffLimitExceeded", 1)


def test_worker_deadline_exceeded_ends_the_job_without_counting(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2}, "spec.maxDuration": "1h"})
    start_running(sim, 2)
    result = sim.reconcile([sim.pod(0, "deadline"), sim.pod(1, "running")], at_s=3000)
    assert (sim.phase(), phase_reason(sim.status)) == ("Failed", "DeadlineExceeded")
    assert result.delete == ["job-worker-1"]
    assert sim.status.restarts == 0


def test_cascading_failures_count_once(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 3}, "spec.backoffLimit": 5})
    start_running(sim, 3)
    # Worker 1 crashes, the other two die of NCCL errors in the same observation.
    result = sim.reconcile(
        [sim.pod(0, "running"), sim.pod(1, "failed", exit_code=1), sim.pod(2, "failed", exit_code=134)],
        at_s=100,
    )
    assert (sim.status.restarts, sim.status.attempt) == (1, 1)
    assert sorted(result.delete) == ["job-worker-1", "job-worker-2"]
    assert event_reasons(result).count("WorkerRestarted") == 1
    # Worker 0 fails a moment later, still of attempt 0: part of the same incident. Workers 1 and 2
    # are gone by now (the operator deleted them): they are recreated in attempt 1.
    follow = sim.reconcile([sim.pod(0, "failed", exit_code=1, attempt=0)], at_s=105)
    assert (sim.status.restarts, sim.status.attempt) == (1, 1)
    assert follow.delete == ["job-worker-0"]
    assert event_reasons(follow) == []  # neither counted nor lost; the phase is Restarting already
    assert sim.phase() == "Restarting"
    assert created(follow) == [1, 2]
    assert {attempt_of(p) for p in created_pods(follow)} == {1}
    # Worker 0 is gone too; 1 and 2 wait for nodes.
    recreated = sim.reconcile(sim.made(), at_s=110)
    assert created(recreated) == [0]
    assert attempt_of(created_pods(recreated)[0]) == 1
    assert event_reasons(recreated) == []
    assert (sim.status.restarts, sim.status.attempt) == (1, 1)


def test_stale_failure_is_replaced_without_counting(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 1, "maxNodes": 2}})
    start_running(sim, 2)
    failed = sim.pod(1, "failed", exit_code=1, attempt=0)
    first = sim.reconcile([sim.pod(0, "running"), failed], at_s=100)
    assert (sim.status.restarts, sim.status.attempt) == (1, 1)
    assert first.delete == ["job-worker-1"]
    # The operator crashed after writing the status but before deleting the pod: same observations again.
    again = sim.reconcile([sim.pod(0, "running", attempt=0), failed], at_s=101)
    assert (sim.status.restarts, sim.status.attempt) == (1, 1)
    assert again.delete == ["job-worker-1"]
    assert again.events == []
    assert (sim.phase(), phase_reason(sim.status)) == ("Running", "ElasticMinimumRunning")


def test_failure_of_an_older_attempt_after_a_status_from_elsewhere(ctx: BuildContext) -> None:
    status = DGXTrainingJobStatus(phase="Running", attempt=3, restarts=2, start_time=T0)
    job = make_job({"spec.elastic": {"minNodes": 1, "maxNodes": 2}}, status=status)
    pods = [make_pod(job, ctx, 0, "running", attempt=3), make_pod(job, ctx, 1, "failed", exit_code=1, attempt=2)]
    result = plan(job, ctx, observe(pods), at(100))
    assert (result.status.restarts, result.status.attempt) == (2, 3)
    assert result.delete == ["job-worker-1"]
    assert "WorkerRestarted" not in event_reasons(result)
    assert result.status.workers is not None
    assert result.status.workers.failed == 0  # failures of older attempts are not the current attempt's


def test_elastic_keeps_running_above_min_nodes_and_recovers_below(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2, "maxNodes": 4}})
    first = sim.reconcile(at_s=0)
    assert created(first) == [0, 1, 2, 3]
    # Pending workers beyond minNodes do not block the start.
    start = sim.reconcile(pods_of(sim, {0: "running", 1: "running", 2: "unscheduled", 3: "unscheduled"}), at_s=30)
    assert (sim.phase(), phase_reason(sim.status)) == ("Running", "ElasticMinimumRunning")
    assert event_reasons(start) == ["ElasticMinimumRunning"]
    sim.reconcile(pods_of(sim, dict.fromkeys(range(4), "running")), at_s=60)
    assert (sim.phase(), phase_reason(sim.status)) == ("Running", "AllWorkersRunning")

    # One node lost (its pod gone): still >= minNodes, the worker is recreated in a new attempt, uncounted.
    lost_one = sim.reconcile(pods_of(sim, {0: "running", 1: "running", 2: "running"}, attempt=0), at_s=100)
    assert (sim.phase(), phase_reason(sim.status)) == ("Running", "ElasticMinimumRunning")
    assert created(lost_one) == [3]
    assert attempt_of(created_pods(lost_one)[0]) == 1
    assert (sim.status.restarts, sim.status.attempt, sim.status.nodes) == (0, 1, "3/4")
    assert [(e.type, e.reason) for e in lost_one.events] == [("Normal", "WorkerLost")]
    survivors = pods_of(sim, {0: "running", 1: "running", 2: "running"}, attempt=0)
    sim.reconcile([*survivors, sim.pod(3, "running", attempt=1)], at_s=150)
    assert (sim.phase(), phase_reason(sim.status), sim.status.attempt) == ("Running", "AllWorkersRunning", 1)

    # Three lost: below minNodes, Restarting, all three recreated (in one more attempt, still uncounted).
    below = sim.reconcile([sim.pod(0, "running", attempt=0)], at_s=200)
    assert (sim.phase(), phase_reason(sim.status)) == ("Restarting", "NodesBelowMinimum")
    assert created(below) == [1, 2, 3]
    assert {attempt_of(p) for p in created_pods(below)} == {2}
    assert [(e.type, e.reason) for e in below.events] == [("Normal", "WorkerLost"), ("Warning", "NodesBelowMinimum")]
    assert (sim.status.restarts, sim.status.attempt) == (0, 2)
    first = sim.pod(0, "running", attempt=0)
    waiting = sim.reconcile([first, *pods_of(sim, {1: "scheduled", 2: "unscheduled", 3: "unscheduled"})], at_s=210)
    assert (waiting.create, waiting.events, sim.phase()) == ([], [], "Restarting")
    back = sim.reconcile([first, *pods_of(sim, {1: "running", 2: "scheduled", 3: "unscheduled"})], at_s=260)
    assert (sim.phase(), phase_reason(sim.status)) == ("Running", "ElasticMinimumRunning")
    assert [(e.type, e.reason) for e in back.events] == [("Normal", "ElasticMinimumRunning")]
    sim.reconcile([first, *pods_of(sim, {1: "running", 2: "running", 3: "running"})], at_s=300)
    assert (sim.phase(), phase_reason(sim.status), sim.status.nodes) == ("Running", "AllWorkersRunning", "4/4")
    assert (sim.status.restarts, sim.status.attempt) == (0, 2)


def test_elastic_evicted_worker_is_replaced_once_gone(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2, "maxNodes": 4}})
    start_running(sim, 4)
    evicted = sim.reconcile(pods_of(sim, {0: "running", 1: "running", 2: "running", 3: "evicted"}), at_s=100)
    assert (sim.phase(), sim.status.restarts, sim.status.attempt) == ("Running", 0, 1)
    assert evicted.delete == ["job-worker-3"]
    gone = sim.reconcile(pods_of(sim, {0: "running", 1: "running", 2: "running"}, attempt=0), at_s=110)
    assert created(gone) == [3]
    assert created_pods(gone)[0]["metadata"]["labels"][ATTEMPT] == "1"


def test_scaling_max_nodes_on_a_running_job(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2, "maxNodes": 4}})
    start_running(sim, 4)
    sim.respec({"spec.elastic.maxNodes": 6})
    up = sim.reconcile(pods_of(sim, dict.fromkeys(range(4), "running")), at_s=100)
    assert created(up) == [4, 5]
    assert {p["metadata"]["labels"][ATTEMPT] for p in created_pods(up)} == {"0"}
    assert up.delete == []
    assert (sim.phase(), phase_reason(sim.status)) == ("Running", "ElasticMinimumRunning")
    assert (sim.workers().desired, sim.workers().active, sim.status.nodes) == (6, 6, "4/6")
    assert sim.status.observed_generation == 2
    six = pods_of(sim, dict.fromkeys(range(6), "running"))
    sim.reconcile(six, at_s=150)
    assert (sim.phase(), phase_reason(sim.status), sim.status.nodes) == ("Running", "AllWorkersRunning", "6/6")

    sim.respec({"spec.elastic.maxNodes": 2})
    down = sim.reconcile(six, at_s=200)
    assert down.delete == ["job-worker-5", "job-worker-4", "job-worker-3", "job-worker-2"]
    assert down.create == []
    assert (sim.phase(), phase_reason(sim.status), sim.status.nodes) == ("Running", "AllWorkersRunning", "2/2")
    assert (sim.status.restarts, sim.status.attempt, sim.status.observed_generation) == (0, 0, 3)


@pytest.mark.parametrize("policy", ["OnFailure", "Never"])
def test_scale_down_victims_exiting_on_sigterm_are_not_failures(ctx: BuildContext, policy: str) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2, "maxNodes": 4}, "spec.restartPolicy": policy})
    start_running(sim, 4)
    sim.respec({"spec.elastic.maxNodes": 2})
    sim.reconcile(pods_of(sim, dict.fromkeys(range(4), "running")), at_s=100)
    # kubelet reports the deleted workers' terminal phase (143 = SIGTERM) before they disappear.
    victims = [sim.pod(i, "failed", exit_code=143, terminating=True) for i in (2, 3)]
    result = sim.reconcile([sim.pod(0, "running"), sim.pod(1, "running"), *victims], at_s=105)
    assert (sim.phase(), sim.status.restarts, sim.status.attempt) == ("Running", 0, 0)
    assert phase_reason(sim.status) == "AllWorkersRunning"
    assert (result.create, result.delete) == ([], [])
    assert event_reasons(result) == []


def test_max_duration_deadline(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2, "maxNodes": 3}, "spec.maxDuration": "1h"})
    first = sim.reconcile(at_s=0)
    assert [p["spec"]["activeDeadlineSeconds"] for p in created_pods(first)] == [3600, 3600, 3600]
    assert first.requeue_after == 3600
    running = sim.reconcile(pods_of(sim, dict.fromkeys(range(3), "running")), at_s=600)
    assert running.requeue_after == 3000
    # A worker created late (worker 2 was lost with its node) gets only what is left of maxDuration.
    late = sim.reconcile(pods_of(sim, {0: "running", 1: "running"}, attempt=0), at_s=1000)
    assert created(late) == [2]
    assert created_pods(late)[0]["spec"]["activeDeadlineSeconds"] == 2600
    assert late.requeue_after == 2600
    assert (event_reasons(late), sim.status.attempt) == (["WorkerLost"], 1)
    survivors = pods_of(sim, {0: "running", 1: "running"}, attempt=0)
    almost = sim.reconcile([*survivors, sim.pod(2, "scheduled", attempt=1)], at_s=3599)
    assert (sim.phase(), almost.requeue_after) == ("Running", 1)
    pods = [
        sim.pod(0, "running", attempt=0),
        sim.pod(1, "running", attempt=0, terminating=True),
        sim.pod(2, "scheduled", attempt=1),
    ]
    end = sim.reconcile(pods, at_s=3600)
    assert (sim.phase(), phase_reason(sim.status)) == ("Failed", "DeadlineExceeded")
    assert end.delete == ["job-worker-0", "job-worker-2"]  # worker 1 is already going away
    assert [(e.type, e.reason) for e in end.events] == [("Warning", "DeadlineExceeded")]
    assert sim.status.completion_time == at(3600)


@pytest.mark.parametrize(
    ("other", "deleted_names"),
    [("running", ["job-worker-1"]), ("deadline", []), ("succeeded", [])],
)
def test_success_first_seen_after_the_deadline_is_a_success(
    ctx: BuildContext, other: str, deleted_names: list[str]
) -> None:
    """Worker 0 exited 0 before the operator looked again, which it did only after maxDuration."""
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2}, "spec.maxDuration": "1h"})
    start_running(sim, 2)
    assert sim.status.start_time == T0
    result = sim.reconcile([sim.pod(0, "succeeded"), sim.pod(1, other)], at_s=3600 + 400)
    assert (sim.phase(), phase_reason(sim.status)) == ("Succeeded", "Completed")
    assert cond(sim.status, "Failed") == ("False", "NotFailed")
    assert result.delete == deleted_names
    assert result.create == []
    assert [(e.type, e.reason) for e in result.events] == [("Normal", "Completed")]
    assert sim.status.completion_time == at(4000)
    assert (sim.status.restarts, sim.status.attempt) == (0, 0)


def test_max_pending_does_not_count_waiting_for_data(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.maxPending": "10m", "spec.dataMounts": DATA_REF})
    sim.mounts = dict(SYNCING)
    assert sim.reconcile(at_s=0).requeue_after is None
    sim.reconcile(at_s=3600)
    assert sim.phase() == "WaitingForData"
    sim.mounts = dict(READY)
    ready = sim.reconcile(at_s=3600)
    assert (created(ready), sim.phase(), ready.requeue_after) == ([0], "Pending", 600)
    assert cond(sim.status, "DataReady") == ("True", "DataReady")
    pending = [sim.pod(0, "unscheduled")]
    assert sim.reconcile(pending, at_s=4199).requeue_after == 1
    assert sim.phase() == "Pending"
    result = sim.reconcile(pending, at_s=4200)
    assert (sim.phase(), phase_reason(sim.status)) == ("Failed", "PendingTimeout")
    assert result.delete == ["job-worker-0"]


def test_max_pending_does_not_count_suspension(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.maxPending": "10m"})
    sim.reconcile(at_s=0)
    sim.reconcile([sim.pod(0, "unscheduled")], at_s=300)
    sim.respec({"spec.suspend": True})
    sim.reconcile([sim.pod(0, "unscheduled")], at_s=310)
    sim.reconcile([], at_s=320)
    assert sim.phase() == "Suspended"
    sim.respec({"spec.suspend": False})
    resumed = sim.reconcile([], at_s=7200)
    assert (sim.phase(), resumed.requeue_after) == ("Pending", 600)
    sim.reconcile([sim.pod(0, "unscheduled")], at_s=7799)
    assert sim.phase() == "Pending"
    sim.reconcile([sim.pod(0, "unscheduled")], at_s=7800)
    assert (sim.phase(), phase_reason(sim.status)) == ("Failed", "PendingTimeout")


def test_max_pending_counts_from_when_the_job_stopped_running(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.maxPending": "10m"})
    start_running(sim, 1, at_s=60)
    sim.reconcile([sim.pod(0, "running")], at_s=5000)
    assert sim.phase() == "Running"
    lost = sim.reconcile([], at_s=5000)  # the node went away with the worker
    assert (sim.phase(), lost.requeue_after) == ("Restarting", 600)
    assert (event_reasons(lost), sim.status.restarts, sim.status.attempt) == (["WorkerLost", "NodesBelowMinimum"], 0, 1)
    sim.reconcile([sim.pod(0, "unscheduled")], at_s=5599)
    assert sim.phase() == "Restarting"
    sim.reconcile([sim.pod(0, "unscheduled")], at_s=5600)
    assert (sim.phase(), phase_reason(sim.status)) == ("Failed", "PendingTimeout")


def test_suspend_and_resume(ctx: BuildContext) -> None:
    queue = {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority-class": "batch"}
    sim = sim_of(ctx, {"metadata.labels": queue, "spec.elastic": {"minNodes": 2}, "spec.maxDuration": "2h"})
    first = sim.reconcile(at_s=0)
    assert all(p["metadata"]["labels"].items() >= queue.items() for p in created_pods(first))
    sim.reconcile(pods_of(sim, dict.fromkeys(range(2), "running")), at_s=60)
    assert sim.status.start_time == T0

    sim.respec({"spec.suspend": True})
    suspended = sim.reconcile(pods_of(sim, dict.fromkeys(range(2), "running")), at_s=600)
    assert (sim.phase(), phase_reason(sim.status)) == ("Suspended", "Suspended")
    assert suspended.delete == ["job-worker-0", "job-worker-1"]
    assert (suspended.create, suspended.delete_job) == ([], False)
    assert [(e.type, e.reason) for e in suspended.events] == [("Normal", "Suspended")]
    assert sim.status.start_time is None
    assert cond(sim.status, "Running") == ("False", "Suspended")
    assert suspended.requeue_after is None  # a suspended job's deadline does not run
    going = sim.reconcile(pods_of(sim, dict.fromkeys(range(2), "running"), terminating=True), at_s=610)
    assert (going.delete, going.events) == ([], [])
    sim.reconcile([], at_s=3600)
    assert sim.phase() == "Suspended"

    sim.respec({"spec.suspend": False})
    resumed = sim.reconcile([], at_s=9000)
    assert (sim.phase(), phase_reason(sim.status)) == ("Pending", "WorkersPending")
    assert sim.status.start_time == at(9000)
    assert created(resumed) == [0, 1]
    assert all(p["metadata"]["labels"].items() >= queue.items() for p in created_pods(resumed))
    assert [p["spec"]["activeDeadlineSeconds"] for p in created_pods(resumed)] == [7200, 7200]
    assert resumed.requeue_after == 7200
    assert cond(sim.status, "Suspended") == ("False", "NotSuspended")
    assert (sim.status.restarts, sim.status.attempt) == (0, 0)


def test_resume_while_the_suspended_workers_still_terminate(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.restartPolicy": "Never"})
    start_running(sim, 1)
    sim.respec({"spec.suspend": True})
    sim.reconcile([sim.pod(0, "running")], at_s=600)
    sim.respec({"spec.suspend": False})
    # Kueue admits the job again while the old worker reports its SIGTERM exit on the way out.
    going = sim.reconcile([sim.pod(0, "failed", exit_code=143, terminating=True)], at_s=620)
    assert (sim.phase(), phase_reason(sim.status)) == ("Pending", "WorkersPending")
    assert (sim.status.restarts, sim.status.attempt) == (0, 0)
    assert (going.create, going.delete) == ([], [])  # the old worker still holds its name
    gone = sim.reconcile([], at_s=630)
    assert created(gone) == [0]
    assert sim.phase() == "Pending"


def test_interactive_debug_worker(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.debug": {"interactive": True}, "spec.maxDuration": "1h"})
    first = sim.reconcile(at_s=0)
    assert created(first) == [0]
    container = created_pods(first)[0]["spec"]["containers"][0]
    assert container["command"] == IDLE_COMMAND
    assert "args" not in container
    assert created_pods(first)[0]["spec"]["activeDeadlineSeconds"] == 3600
    sim.reconcile([sim.pod(0, "running")], at_s=30)
    assert (sim.phase(), phase_reason(sim.status), sim.status.nodes) == ("Running", "AllWorkersRunning", "1/1")
    # Someone ended the shell with exit 0: the job does not succeed by itself.
    ended = sim.reconcile([sim.pod(0, "succeeded")], at_s=600)
    assert sim.phase() not in ("Succeeded", "Failed")
    assert (sim.status.restarts, sim.status.attempt) == (0, 1)
    assert ended.delete == ["job-worker-0"]
    assert ended.create == []  # the ended worker still holds its name
    assert "Completed" not in event_reasons(ended)
    assert "WorkerReplaced" in event_reasons(ended)
    gone = sim.reconcile([], at_s=610)
    assert created(gone) == [0]
    assert created_pods(gone)[0]["metadata"]["labels"][ATTEMPT] == "1"
    assert gone.events == []  # the operator deleted it: not lost
    # maxDuration still holds.
    sim.reconcile([sim.pod(0, "running", attempt=sim.status.attempt)], at_s=3600)
    assert (sim.phase(), phase_reason(sim.status)) == ("Failed", "DeadlineExceeded")


def test_interactive_replacement_is_stable(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.debug": {"interactive": True}})
    start_running(sim, 1)
    ended = [sim.pod(0, "succeeded", attempt=0)]
    first = sim.reconcile(ended, at_s=600)
    assert (sim.status.restarts, sim.status.attempt) == (0, 1)
    assert first.delete == ["job-worker-0"]
    assert event_reasons(first) == ["WorkerReplaced", "NodesBelowMinimum"]
    # The stale pod is seen again (its delete not yet observed): deleted again, never replaced twice.
    again = sim.reconcile(ended, at_s=600)
    assert (sim.status.restarts, sim.status.attempt) == (0, 1)
    assert again.delete == ["job-worker-0"]
    assert again.create == []
    assert again.events == []
    later = sim.reconcile(ended, at_s=700)
    assert (sim.status.attempt, later.delete, later.create, later.events) == (1, ["job-worker-0"], [], [])


def test_waiting_for_data_mounts(ctx: BuildContext) -> None:
    refs = [{"name": "data", "mountPath": "/data"}, {"name": "out", "mountPath": "/workspace/output"}]
    sim = sim_of(ctx, {"spec.dataMounts": refs})
    sim.mounts = {"data": MountState("Syncing")}
    first = sim.reconcile(at_s=0, shared=False)
    assert (first.create, first.delete) == ([], [])
    assert (sim.phase(), phase_reason(sim.status)) == ("WaitingForData", "DataNotReady")
    assert [(e.type, e.reason) for e in first.events] == [("Normal", "DataNotReady")]
    message = next(c for c in sim.status.conditions if c.type == "DataReady").message
    assert "data (Syncing)" in message
    assert "out (not found)" in message
    assert sim.status.start_time is None
    sim.mounts = {"data": MountState("Ready"), "out": MountState("Pending")}
    assert sim.reconcile(at_s=100).events == []
    assert sim.phase() == "WaitingForData"
    sim.mounts = {"data": MountState("Ready"), "out": MountState("Ready")}
    ready = sim.reconcile(at_s=200, shared=False)
    assert [c["kind"] for c in ready.create] == ["ConfigMap", "Service", "Pod"]
    assert cond(sim.status, "DataReady") == ("True", "DataReady")
    assert sim.phase() == "Pending"
    assert sim.job.status is not None
    assert sim.job.status.start_time == at(200)
    mounts = created_pods(ready)[0]["spec"]["containers"][0]["volumeMounts"]
    assert {m["mountPath"]: m.get("readOnly") for m in mounts if m["name"].startswith("data-")} == {
        "/data": True,
        "/workspace/output": False,
    }


def test_deletion_releases_the_finalizer_only_without_running_workers(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2}})
    running = start_running(sim, 2)
    sim.job = respec(sim.job, {"metadata.deletionTimestamp": "2025-03-01T13:00:00Z"}, bump=False)
    before = sim.status.model_dump()
    first = sim.reconcile(running, at_s=200)
    assert first.delete == ["job-worker-0", "job-worker-1"]
    assert (first.release_finalizer, first.create) == (False, [])
    assert sim.status.model_dump() == before  # nothing to report on a job that is going away
    terminating = sim.reconcile(pods_of(sim, {0: "running", 1: "running"}, terminating=True), at_s=210)
    assert (terminating.delete, terminating.release_finalizer) == ([], False)
    one_left = sim.reconcile([sim.pod(0, "failed", exit_code=143), sim.pod(1, "running", terminating=True)], at_s=220)
    assert one_left.release_finalizer is False
    finished = sim.reconcile([sim.pod(0, "failed", exit_code=143), sim.pod(1, "succeeded")], at_s=230)
    assert (finished.delete, finished.release_finalizer) == ([], True)
    assert sim.reconcile([], at_s=240).release_finalizer is True


@pytest.mark.parametrize(
    ("ttl", "checks"),
    [
        (300, [(0, False, 300.0), (299, False, 1.0), (300, True, None)]),
        (0, [(0, True, None)]),
        (None, [(0, False, None), (86400 * 30, False, None)]),
    ],
)
def test_ttl_after_finished(ctx: BuildContext, ttl: int | None, checks: list[tuple[int, bool, float | None]]) -> None:
    sim = sim_of(ctx, {} if ttl is None else {"spec.ttlSecondsAfterFinished": ttl})
    start_running(sim, 1)
    done_at = 1000
    for offset, delete_job, requeue in checks:
        result = sim.reconcile([sim.pod(0, "succeeded")], at_s=done_at + offset)
        assert sim.phase() == "Succeeded"
        assert sim.status.completion_time == at(done_at)
        assert (result.delete_job, result.requeue_after) == (delete_job, requeue)


def test_ttl_applies_to_failed_jobs_too(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.ttlSecondsAfterFinished": 60, "spec.restartPolicy": "Never"})
    start_running(sim, 1)
    sim.reconcile([sim.pod(0, "failed")], at_s=100)
    assert sim.reconcile([], at_s=159).delete_job is False
    assert sim.reconcile([], at_s=160).delete_job is True


def test_foreign_object_from_a_conflicting_create(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2}})
    running = start_running(sim, 2)
    who = "Service ml/job (owner Deployment ml/web)"
    result = sim.reconcile(running, at_s=100, foreign=[who])
    assert (sim.phase(), phase_reason(sim.status)) == ("Failed", "ForeignObject")
    assert who in next(c for c in sim.status.conditions if c.type == "Failed").message
    assert result.delete == ["job-worker-0", "job-worker-1"]
    assert [(e.type, e.reason) for e in result.events] == [("Warning", "ForeignObject")]


@pytest.mark.parametrize(
    "owner",
    [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "rs-uid", "controller": True},
        {
            "apiVersion": "kubedgx.io/v1alpha1",
            "kind": "DGXTrainingJob",
            "name": "other",
            "uid": OLD_UID,
            "controller": True,
        },
    ],
    ids=["replicaset", "other-job"],
)
def test_labelled_pod_owned_by_someone_else_fails_the_job(ctx: BuildContext, owner: dict[str, Any]) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2}})
    sim.reconcile(at_s=0)
    squatter = sim.pod(1, "running", owner=owner)
    result = sim.reconcile([sim.pod(0, "running"), squatter], at_s=10)
    assert (sim.phase(), phase_reason(sim.status)) == ("Failed", "ForeignObject")
    assert "pod ml/job-worker-1" in next(c for c in sim.status.conditions if c.type == "Failed").message
    assert result.delete == ["job-worker-0"]  # never someone else's pod
    assert result.create == []


#: An ownerReference to this very job, as the builders write it but without ``controller: true``.
OUR_REF = {"apiVersion": "kubedgx.io/v1alpha1", "kind": "DGXTrainingJob", "name": "job", "uid": UID}


@pytest.mark.parametrize(
    "owners",
    [[], [OUR_REF], [{**OUR_REF, "controller": False}]],
    ids=["no-owner", "owner-not-controller", "controller-false"],
)
def test_labelled_pod_without_our_controller_reference_fails_the_job(
    ctx: BuildContext, owners: list[dict[str, Any]]
) -> None:
    """Only a controller ownerReference to this very job makes a labelled pod ours; anything else is a stranger."""
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2}})
    sim.reconcile(at_s=0)
    orphan = sim.pod(1, "running")
    orphan["metadata"]["ownerReferences"] = owners
    result = sim.reconcile([sim.pod(0, "running"), orphan], at_s=10)
    assert (sim.phase(), phase_reason(sim.status)) == ("Failed", "ForeignObject")
    assert next(c for c in sim.status.conditions if c.type == "Failed").message == (
        "pod ml/job-worker-1 carries this job's label but another owner; delete it or rename the job"
    )
    assert result.delete == ["job-worker-0"]  # never a pod that is not ours
    assert result.create == []
    assert [(e.type, e.reason) for e in result.events] == [("Warning", "ForeignObject")]
    assert sim.status.completion_time == at(10)


def test_previous_incarnation_blocks_its_index_until_gone(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 3}})
    owner = {"apiVersion": "kubedgx.io/v1alpha1", "kind": "DGXTrainingJob", "name": "job", "uid": OLD_UID}
    leftover = sim.pod(1, "running", owner={**owner, "controller": True}, terminating=True)
    first = sim.reconcile([leftover], at_s=0)
    assert (sim.phase(), phase_reason(sim.status)) == ("Pending", "WorkersPending")
    assert created(first) == [0, 2]
    assert first.delete == []
    again = sim.reconcile([leftover, sim.pod(0, "running"), sim.pod(2, "running")], at_s=10)
    assert (again.create, again.delete, sim.phase()) == ([], [], "Pending")
    gone = sim.reconcile([sim.pod(0, "running"), sim.pod(2, "running")], at_s=20)
    assert created(gone) == [1]


def test_progress_is_copied_from_worker_zero(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2}})
    start_running(sim, 2)
    live = {"kubedgx.io/progress": json.dumps({"step": 10, "totalSteps": 100, "loss": 2.5})}
    other = {"kubedgx.io/progress": json.dumps({"step": 99})}
    sim.reconcile([sim.pod(0, "running", annotations=live), sim.pod(1, "running", annotations=other)], at_s=100)
    assert sim.status.progress is not None
    assert sim.status.progress.model_dump(exclude_none=True) == {"step": 10, "total_steps": 100, "loss": 2.5}

    # Malformed reports never break the status: the last good progress stays.
    for bad in ("{oops", json.dumps({"step": -3}), json.dumps({"loss": "high"}), json.dumps(["step", 1])):
        sim.reconcile([sim.pod(0, "running", annotations={"kubedgx.io/progress": bad}), sim.pod(1, "running")])
        assert sim.status.progress.model_dump(exclude_none=True) == {"step": 10, "total_steps": 100, "loss": 2.5}

    wrapped = json.dumps(
        {"progress": {"step": 100, "total_steps": 100, "loss": 0.9, "samplesPerSecond": 3.5}, "adapter": "/out"}
    )
    sim.reconcile([sim.pod(0, "succeeded", message=wrapped), sim.pod(1, "succeeded")], at_s=200)
    assert sim.phase() == "Succeeded"
    assert sim.status.progress.model_dump(exclude_none=True) == {
        "step": 100,
        "total_steps": 100,
        "loss": 0.9,
        "samples_per_second": 3.5,
    }


def test_the_live_report_from_worker_0s_log_fills_progress_until_worker_0_ends(ctx: BuildContext) -> None:
    """Observed.progress is what the controller read from worker 0's log in this pass: it fills
    status.progress while worker 0 runs; once worker 0 ended, its termination message is the final
    word, whatever a late log read says; a pass without a read keeps the last report."""
    from tests.unit.planner_sim import observe

    sim = sim_of(ctx)
    start_running(sim, 1)
    live = {"step": 10, "totalSteps": 100, "loss": 2.5, "tokensPerSecond": 900.0}
    running = dataclasses.replace(observe([sim.pod(0, "running")]), progress=live)
    result = plan(sim.job, ctx, running, sim.now)
    assert result.status.progress is not None
    assert result.status.progress.model_dump(exclude_none=True) == {
        "step": 10,
        "total_steps": 100,
        "loss": 2.5,
        "tokens_per_second": 900.0,
    }
    sim.job = sim.job.model_copy(update={"status": result.status})
    kept = plan(sim.job, ctx, observe([sim.pod(0, "running")]), sim.now)
    assert kept.status.progress == result.status.progress
    final = json.dumps({"progress": {"step": 100, "totalSteps": 100, "loss": 0.9}})
    ended = dataclasses.replace(observe([sim.pod(0, "succeeded", message=final)]), progress={"step": 90})
    done = plan(sim.job, ctx, ended, sim.now)
    assert done.status.progress is not None
    assert done.status.progress.model_dump(exclude_none=True) == {"step": 100, "total_steps": 100, "loss": 0.9}


def test_eval_loss_of_the_trainers_report_reaches_the_status(ctx: BuildContext) -> None:
    # The trainer's progress lines carry the last evaluation as evalLoss/evalStep (dgx_api.progress).
    sim = sim_of(ctx)
    start_running(sim, 1)
    report = {"step": 30, "totalSteps": 100, "loss": 1.5, "evalLoss": 1.75, "evalStep": 20}
    sim.reconcile([sim.pod(0, "running", annotations={"kubedgx.io/progress": json.dumps(report)})], at_s=100)
    assert sim.status.progress is not None
    assert (sim.status.progress.eval_loss, sim.status.progress.eval_step) == (1.75, 20)


def test_unknown_instance_fails_with_invalid_spec(catalog: Catalog) -> None:
    kept = tuple(g for g in catalog.spec.gpus if g.key != "a100.80g")
    small = BuildContext(Catalog(catalog.spec.model_copy(update={"gpus": kept})))
    full = make_ctx(catalog)
    job = make_job()
    pods = [make_pod(job, full, 0, "running")]
    result = plan(job, small, observe(pods), T0)
    assert (result.status.phase, phase_reason(result.status)) == ("Failed", "InvalidSpec")
    message = next(c for c in result.status.conditions if c.type == "Failed").message
    assert message.startswith("spec.instance: ")
    assert "dgxa100.80g.8.norm" in message
    assert result.delete == ["job-worker-0"]
    assert result.create == []
    assert [(e.type, e.reason) for e in result.events] == [("Warning", "InvalidSpec")]


def test_unbuildable_workers_fail_the_job_instead_of_crashing(ctx: BuildContext) -> None:
    job = make_job({"spec.dataMounts": DATA_REF, "spec.trainer.output": {"dir": "/data/out"}})
    result = plan(job, ctx, observe(mounts=READY, shared=False), T0)
    assert (result.status.phase, phase_reason(result.status)) == ("Failed", "InvalidSpec")
    message = next(c for c in result.status.conditions if c.type == "Failed").message
    assert message.startswith("spec.trainer.output.dir: /data/out is inside /data, which workers see read-only")
    assert (result.create, result.delete) == ([], [])  # nothing at all is created for a job that cannot run
    assert [(e.type, e.reason) for e in result.events] == [("Warning", "InvalidSpec")]
    assert result.status.completion_time == T0


def test_observed_generation_follows_metadata_generation(ctx: BuildContext) -> None:
    sim = sim_of(ctx, generation=7)
    sim.reconcile(at_s=0)
    assert sim.status.observed_generation == 7
    assert {c.observed_generation for c in sim.status.conditions} == {7}
    sim.respec({"spec.priority": "high"})
    sim.reconcile([sim.pod(0, "running")], at_s=10)
    assert sim.status.observed_generation == 8
    assert {c.observed_generation for c in sim.status.conditions} == {8}


def test_worker_counts_and_nodes(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2, "maxNodes": 3}})
    sim.reconcile(at_s=0)
    sim.respec({"spec.elastic.maxNodes": 4})
    result = sim.reconcile(pods_of(sim, {0: "running", 1: "running", 2: "unscheduled"}), at_s=10)
    assert created(result) == [3]
    assert (event_reasons(result), sim.status.attempt) == (["ElasticMinimumRunning"], 0)
    counts = sim.workers()
    assert (counts.desired, counts.active, counts.ready, counts.failed) == (4, 4, 2, 0)
    assert sim.status.nodes == "2/4"
    never = sim_of(ctx, {"spec.elastic": {"minNodes": 2}, "spec.restartPolicy": "Never"})
    start_running(never, 2)
    never.reconcile([never.pod(0, "running"), never.pod(1, "failed")], at_s=100)
    counts = never.workers()
    assert (counts.desired, counts.active, counts.ready, counts.failed) == (0, 0, 0, 1)
    assert never.status.nodes == "0/0"


def test_command_mode_creates_no_config_map(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.trainer": DELETE, "spec.command": ["torchrun", "/app/train.py"]})
    first = sim.reconcile(at_s=0, shared=False)
    assert [c["kind"] for c in first.create] == ["Service", "Pod"]
    only_service = plan(sim.job, ctx, Observed(service=False, config_map=False), at(1))
    assert [c["kind"] for c in only_service.create] == ["Service", "Pod"]


def test_events_once_per_transition(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2}, "spec.dataMounts": DATA_REF})
    sim.mounts = dict(SYNCING)
    timeline: list[tuple[float, dict[str, MountState], list[tuple[int, str]], bool]] = [
        (0, SYNCING, [], False),
        (60, READY, [], False),
        (70, READY, [(0, "unscheduled"), (1, "unscheduled")], False),
        (120, READY, [(0, "running"), (1, "running")], False),
        (180, READY, [(0, "running"), (1, "running")], True),
        (190, READY, [], True),
    ]
    seen: list[str] = []
    for at_s, mounts, pods, suspend in timeline:
        sim.mounts = dict(mounts)
        if suspend != sim.job.spec.suspend:
            sim.respec({"spec.suspend": suspend})
        observed = [sim.pod(i, s) for i, s in pods]
        seen += event_reasons(sim.reconcile(observed, at_s=at_s))
        # The same observations again, with the workers just created (not lost: merely unscheduled).
        assert sim.reconcile([*observed, *sim.made()], at_s=at_s).events == []
    assert seen == ["DataNotReady", "WorkersPending", "AllWorkersRunning", "Suspended"]
    assert (sim.status.restarts, sim.status.attempt) == (0, 0)


def test_replacement_waits_until_the_old_pod_is_gone_after_pure_creation(ctx: BuildContext) -> None:
    """A terminating pod is never replaced while it is still there."""
    sim = sim_of(ctx)
    start_running(sim, 1)
    result = sim.reconcile([sim.pod(0, "running", terminating=True)], at_s=100)
    assert result.create == []
    assert (event_reasons(result), sim.status.attempt) == (["WorkerLost", "NodesBelowMinimum"], 1)  # not our delete


@pytest.mark.parametrize("trigger", ["counted-failure", "eviction", "older-attempt"])
def test_replacement_waits_until_the_old_pod_is_gone(ctx: BuildContext, trigger: str) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 1, "maxNodes": 2}})
    start_running(sim, 2)
    if trigger == "counted-failure":
        bad = sim.pod(1, "failed", exit_code=1)
    elif trigger == "eviction":
        bad = sim.pod(1, "evicted")
    else:
        sim.job = sim.job.model_copy(update={"status": sim.status.model_copy(update={"attempt": 1, "restarts": 1})})
        bad = sim.pod(1, "failed", exit_code=1, attempt=0)
    result = sim.reconcile([sim.pod(0, "running", attempt=0), bad], at_s=100)
    assert result.delete == ["job-worker-1"]
    assert created(result) == []
    assert sim.status.attempt == 1
    gone = sim.reconcile([sim.pod(0, "running", attempt=0)], at_s=110)
    assert created(gone) == [1]
    assert created_pods(gone)[0]["metadata"]["labels"][ATTEMPT] == "1"


def test_restart_below_min_nodes_is_stable(ctx: BuildContext) -> None:
    sim = sim_of(ctx)
    start_running(sim, 1)
    failed = [sim.pod(0, "failed", exit_code=1)]
    first = sim.reconcile(failed, at_s=100)
    assert cond(sim.status, "Restarting") == ("True", "NodesBelowMinimum")
    restarting = next(c for c in sim.status.conditions if c.type == "Restarting")
    assert restarting.message == "0/1 workers running, below minNodes 1; recreating"
    # The restart itself is the event; the phase change reports the condition's reason.
    assert [(e.type, e.reason) for e in first.events] == [
        ("Warning", "WorkerRestarted"),
        ("Warning", "NodesBelowMinimum"),
    ]
    again = plan(sim.job, ctx, observe(failed), sim.now)
    assert cond(again.status, "Restarting") == cond(first.status, "Restarting")
    assert again.status.model_dump() == first.status.model_dump()
    assert (again.delete, again.create, again.events) == (["job-worker-0"], [], [])


def test_non_zero_worker_exiting_0_is_left_alone(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 3}})
    start_running(sim, 3)
    result = sim.reconcile([sim.pod(0, "running"), sim.pod(1, "running"), sim.pod(2, "succeeded")], at_s=1000)
    assert (result.create, result.delete, result.events) == ([], [], [])
    assert sim.phase() == "Running"
    assert (sim.status.restarts, sim.status.attempt) == (0, 0)


def test_min_nodes_changes_take_effect_on_the_phase(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2, "maxNodes": 4}})
    sim.reconcile(at_s=0)
    pods = pods_of(sim, {0: "running", 1: "running", 2: "running", 3: "unscheduled"})
    sim.reconcile(pods, at_s=30)
    assert (sim.phase(), phase_reason(sim.status)) == ("Running", "ElasticMinimumRunning")
    sim.respec({"spec.elastic.minNodes": 4})
    raised = sim.reconcile(pods, at_s=60)
    assert (sim.phase(), phase_reason(sim.status)) == ("Restarting", "NodesBelowMinimum")
    assert (raised.create, raised.delete) == ([], [])
    sim.respec({"spec.elastic.minNodes": 3})
    lowered = sim.reconcile(pods, at_s=90)
    assert (sim.phase(), phase_reason(sim.status)) == ("Running", "ElasticMinimumRunning")
    assert event_reasons(lowered) == ["ElasticMinimumRunning"]


def test_observing_the_workers_just_created_changes_nothing() -> None:
    """The first pass creates the workers and writes the status; when the next pass sees them as
    pending, unscheduled pods, the status must be identical, or every job costs two status writes."""
    from datetime import UTC, datetime

    from dgx_operator.api import DGXTrainingJob
    from dgx_operator.catalog import Catalog
    from dgx_operator.reconcile.planner import Observed, plan
    from dgx_operator.reconcile.pods import PodView
    from dgx_operator.render import BuildContext

    job = DGXTrainingJob.model_validate(
        with_changes(
            BASE_JOB, {"metadata.uid": "0c0ffee0-0000-4000-8000-000000000000", "spec.elastic": {"minNodes": 3}}
        )
    )
    ctx = BuildContext(Catalog.load())
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    first = plan(job, ctx, Observed(), now)
    pods = tuple(PodView.of(c) for c in first.create if c["kind"] == "Pod")
    assert len(pods) == 3
    second = plan(
        job.model_copy(update={"status": first.status}),
        ctx,
        Observed(pods=pods, service=True, config_map=True),
        now,
    )
    assert second.create == []
    assert second.status.model_dump() == first.status.model_dump()
    assert "(3 not scheduled yet)" in next(c.message for c in first.status.conditions if c.type == "Running")


# --- workers lost by other hands ------------------------------------------------------------------


def lost_message(count: int, attempt: int) -> str:
    return (
        f"{count} worker(s) disappeared or were deleted by someone else; replacing them in attempt {attempt}, "
        "not counted against backoffLimit"
    )


def env_of(pod: Mapping[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize(
    ("elastic", "kept", "phase", "events"),
    [
        ({"minNodes": 2, "maxNodes": 3}, (0, 1), ("Running", "ElasticMinimumRunning"), ["WorkerLost"]),
        ({"minNodes": 3}, (0,), ("Restarting", "NodesBelowMinimum"), ["WorkerLost", "NodesBelowMinimum"]),
    ],
    ids=["elastic-above-min", "below-min"],
)
def test_worker_deleted_by_someone_is_replaced_in_a_new_attempt(
    ctx: BuildContext, elastic: dict[str, int], kept: tuple[int, ...], phase: tuple[str, str], events: list[str]
) -> None:
    """Node loss, a spot reclaim, someone's kubectl delete: the pod is simply gone, never counted."""
    sim = sim_of(ctx, {"spec.elastic": elastic, "spec.backoffLimit": 0})  # a counted restart would fail the job
    start_running(sim, 3)
    survivors = pods_of(sim, dict.fromkeys(kept, "running"), attempt=0)
    lost = sim.reconcile(survivors, at_s=100)
    missing = [i for i in range(3) if i not in kept]
    assert (sim.phase(), phase_reason(sim.status)) == phase
    assert event_reasons(lost) == events
    assert (lost.events[0].type, lost.events[0].message) == ("Normal", lost_message(len(missing), 1))
    assert (sim.status.restarts, sim.status.attempt) == (0, 1)
    assert lost.delete == []  # the survivors stay
    assert created(lost) == missing
    assert {attempt_of(p) for p in created_pods(lost)} == {1}
    assert {env_of(p)["KUBEDGX_ATTEMPT"] for p in created_pods(lost)} == {"1"}
    assert (sim.workers().active, sim.workers().failed) == (3, 0)
    # The replacements are seen, then run: nothing more is lost, the survivors keep their attempt.
    seen = sim.reconcile([*survivors, *sim.made()], at_s=105)
    assert (seen.create, seen.delete, seen.events) == ([], [], [])
    back = sim.reconcile([*survivors, *(sim.pod(i, "running", attempt=1) for i in missing)], at_s=110)
    assert (sim.phase(), phase_reason(sim.status)) == ("Running", "AllWorkersRunning")
    assert event_reasons(back) == ([] if phase[0] == "Running" else ["AllWorkersRunning"])
    assert (sim.status.restarts, sim.status.attempt) == (0, 1)


@pytest.mark.parametrize("state", ["running", "failed"], ids=["running", "exits-143-on-the-way-out"])
def test_worker_being_deleted_by_someone_else_counts_as_lost(ctx: BuildContext, state: str) -> None:
    """A deletion the operator did not make (kubectl delete, a drain, a spot reclaim) is a loss as
    soon as it starts; its replacement waits until the old pod has released the name."""
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2, "maxNodes": 3}, "spec.backoffLimit": 0})
    start_running(sim, 3)
    survivors = pods_of(sim, {0: "running", 1: "running"}, attempt=0)
    going = sim.pod(2, state, exit_code=143 if state == "failed" else None, attempt=0, terminating=True)
    first = sim.reconcile([*survivors, going], at_s=100)
    assert [(e.type, e.reason, e.message) for e in first.events] == [("Normal", "WorkerLost", lost_message(1, 1))]
    assert (sim.status.restarts, sim.status.attempt) == (0, 1)
    assert (first.create, first.delete) == ([], [])  # someone else is deleting it; the name is still held
    assert (sim.phase(), phase_reason(sim.status)) == ("Running", "ElasticMinimumRunning")
    assert sim.workers().active == 2
    # Still going away: counted once, not at every pass.
    again = sim.reconcile([*survivors, going], at_s=105)
    assert (again.create, again.delete, again.events) == ([], [], [])
    assert (sim.status.restarts, sim.status.attempt) == (0, 1)
    gone = sim.reconcile(survivors, at_s=110)
    assert created(gone) == [2]
    assert attempt_of(created_pods(gone)[0]) == 1
    assert gone.events == []
    assert (sim.status.restarts, sim.status.attempt) == (0, 1)


def test_survivor_failing_after_a_loss_is_not_counted(ctx: BuildContext) -> None:
    """The survivors' NCCL group breaks with the lost peer: their failures belong to the loss."""
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2, "maxNodes": 3}, "spec.backoffLimit": 1})
    start_running(sim, 3)
    lost = sim.reconcile(pods_of(sim, {0: "running", 1: "running"}), at_s=100)
    assert (event_reasons(lost), sim.status.restarts, sim.status.attempt) == (["WorkerLost"], 0, 1)
    replacement = sim.made()
    first = sim.pod(0, "running", attempt=0)
    crash = sim.reconcile([first, sim.pod(1, "failed", exit_code=1, attempt=0), *replacement], at_s=105)
    assert (sim.status.restarts, sim.status.attempt) == (0, 1)
    assert crash.delete == ["job-worker-1"]
    assert crash.create == []  # the failed worker still holds its name
    assert event_reasons(crash) == ["NodesBelowMinimum"]  # neither WorkerRestarted nor another WorkerLost
    assert (sim.phase(), phase_reason(sim.status)) == ("Restarting", "NodesBelowMinimum")
    assert sim.workers().failed == 0
    gone = sim.reconcile([first, *replacement], at_s=110)
    assert created(gone) == [1]
    assert attempt_of(created_pods(gone)[0]) == 1
    assert gone.events == []
    assert (sim.status.restarts, sim.status.attempt) == (0, 1)
    # A failure of the current attempt still counts.
    current = [first, sim.pod(1, "running", attempt=1), sim.pod(2, "failed", exit_code=1, attempt=1)]
    counted = sim.reconcile(current, at_s=200)
    assert event_reasons(counted) == ["WorkerRestarted", "ElasticMinimumRunning"]  # workers 0 and 1 run
    assert (sim.status.restarts, sim.status.attempt) == (1, 2)


def test_loss_and_a_survivors_failure_seen_together_are_not_counted(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2, "maxNodes": 3}, "spec.backoffLimit": 0})
    start_running(sim, 3)
    result = sim.reconcile([sim.pod(0, "running"), sim.pod(1, "failed", exit_code=1)], at_s=100)
    assert sim.phase() != "Failed"
    assert sim.status.restarts == 0
    assert "WorkerLost" in event_reasons(result)
    assert "WorkerRestarted" not in event_reasons(result)


def test_loss_beside_a_finished_worker_is_noticed(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2, "maxNodes": 3}})
    start_running(sim, 3)
    done = sim.pod(2, "succeeded")
    sim.reconcile([sim.pod(0, "running"), sim.pod(1, "running"), done], at_s=100)
    assert (sim.phase(), sim.workers().active) == ("Running", 2)
    lost = sim.reconcile([sim.pod(0, "running"), done], at_s=200)  # worker 1 lost with its node
    assert created(lost) == [1]
    assert event_reasons(lost) == ["WorkerLost"]
    assert attempt_of(created_pods(lost)[0]) == 1


@pytest.mark.parametrize(
    ("state", "restarts", "reason"), [("failed", 1, "WorkerRestarted"), ("evicted", 0, "WorkerDisrupted")]
)
def test_no_worker_lost_after_a_restart_deleted_the_worker(
    ctx: BuildContext, state: str, restarts: int, reason: str
) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 1, "maxNodes": 2}})
    start_running(sim, 2)
    bad = sim.pod(1, state, attempt=0)
    first = sim.reconcile([sim.pod(0, "running"), bad], at_s=100)
    assert (event_reasons(first), first.delete) == ([reason], ["job-worker-1"])
    assert (sim.status.restarts, sim.status.attempt) == (restarts, 1)
    survivor = sim.pod(0, "running", attempt=0)
    going = sim.reconcile([survivor, sim.pod(1, state, attempt=0, terminating=True)], at_s=105)
    gone = sim.reconcile([survivor], at_s=110)
    assert created(gone) == [1]
    assert attempt_of(created_pods(gone)[0]) == 1
    seen = sim.reconcile([survivor, *sim.made()], at_s=115)
    assert (going.events, gone.events, seen.events) == ([], [], [])
    assert (sim.status.restarts, sim.status.attempt) == (restarts, 1)


def test_no_worker_lost_after_a_scale_down(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2, "maxNodes": 4}})
    start_running(sim, 4)
    sim.respec({"spec.elastic.maxNodes": 2})
    down = sim.reconcile(pods_of(sim, dict.fromkeys(range(4), "running")), at_s=100)
    assert (deleted(down), down.events) == ([3, 2], [])
    kept = pods_of(sim, {0: "running", 1: "running"})
    going = sim.reconcile([*kept, *(sim.pod(i, "running", terminating=True) for i in (2, 3))], at_s=105)
    gone = sim.reconcile(kept, at_s=110)
    for result in (going, gone):
        assert (result.create, result.delete, result.events) == ([], [], [])
    assert (sim.phase(), phase_reason(sim.status), sim.status.nodes) == ("Running", "AllWorkersRunning", "2/2")
    assert (sim.status.restarts, sim.status.attempt) == (0, 0)


def test_no_worker_lost_across_suspend_and_resume(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2}})
    running = start_running(sim, 2)
    sim.respec({"spec.suspend": True})
    suspended = sim.reconcile(running, at_s=100)
    assert (event_reasons(suspended), deleted(suspended)) == (["Suspended"], [0, 1])
    going = sim.reconcile(pods_of(sim, dict.fromkeys(range(2), "running"), terminating=True), at_s=105)
    gone = sim.reconcile([], at_s=110)
    sim.respec({"spec.suspend": False})
    resumed = sim.reconcile([], at_s=200)
    assert (created(resumed), event_reasons(resumed)) == ([0, 1], ["WorkersPending"])
    seen = sim.reconcile(sim.made(), at_s=205)
    assert (going.events, gone.events, seen.events, seen.create) == ([], [], [], [])
    assert (sim.phase(), sim.status.restarts, sim.status.attempt) == ("Pending", 0, 0)


def test_no_worker_lost_at_the_first_start(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2}, "spec.dataMounts": DATA_REF})
    sim.mounts = dict(SYNCING)
    sim.reconcile(at_s=0)
    assert (sim.phase(), sim.workers().active) == ("WaitingForData", 0)
    sim.mounts = dict(READY)
    started = sim.reconcile(at_s=60)
    assert (created(started), event_reasons(started)) == ([0, 1], ["WorkersPending"])
    assert (sim.status.start_time, sim.workers().active) == (at(60), 2)
    seen = sim.reconcile(sim.made(), at_s=70)
    assert (seen.create, seen.events) == ([], [])
    assert sim.status.attempt == 0


@pytest.mark.parametrize(
    ("phase", "suspend", "start"),
    [("Pending", False, None), ("Suspended", True, T0), ("Suspended", False, T0)],
    ids=["not-started", "still-suspended", "resuming"],
)
def test_no_worker_lost_before_a_start_whatever_the_status_counts(
    ctx: BuildContext, phase: str, suspend: bool, start: datetime | None
) -> None:
    """A status written elsewhere (an older operator, a restore) that still counts active workers:
    a job that has not started, or starts again, has lost nothing."""
    counts = WorkerCounts(desired=2, active=2, ready=2, failed=0)
    status = DGXTrainingJobStatus(phase=phase, attempt=3, restarts=1, start_time=start, workers=counts)
    job = make_job({"spec.elastic": {"minNodes": 2}, "spec.suspend": suspend}, status=status)
    result = plan(job, ctx, observe(), at(100))
    assert "WorkerLost" not in event_reasons(result)
    assert (result.status.attempt, result.status.restarts) == (3, 1)
    assert created(result) == ([] if suspend else [0, 1])
