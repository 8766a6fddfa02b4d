"""The Finished condition (issue 17.5, "`kubectl wait` ends"): True once the job has ended either
way, with the reason it ended, so `kubectl wait --for=condition=Finished` returns for a failed job
as for a succeeded one; False before, its reason the phase. And the REASON column of `kubectl get`
(the Running condition's reason) shows that same terminal reason.

Every terminal path of the planner is walked here: the decision table's rows (test_planner) and the
paths it has no row for. The real apiserver and kubectl's own wait are in
tests/cluster/test_operator.py::test_kubectl_wait_for_finished_returns_when_a_job_fails.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from dgx_operator.api.common import Condition
from dgx_operator.api.crdgen import kind_by_name
from dgx_operator.api.trainingjob import DGXTrainingJobStatus
from dgx_operator.catalog import Catalog
from dgx_operator.reconcile.planner import MountState, Refused, plan
from dgx_operator.render import BuildContext
from tests.unit.planner_sim import (
    DATA_REF,
    READY,
    SYNCING,
    T0,
    Sim,
    assert_stable,
    at,
    created,
    created_job,
    make_ctx,
    make_job,
    make_pod,
    observe,
    reporting,
    sim_of,
    sim_with,
    start_running,
    step,
    uploaded,
    waiting,
)
from tests.unit.planner_table import EVENTS, TABLE_PARAMS, Expect, State
from tests.unit.render_helpers import mount_specs

TERMINAL = ("Succeeded", "Failed")


def finished(status: DGXTrainingJobStatus) -> Condition:
    found = next((c for c in status.conditions if c.type == "Finished"), None)
    assert found is not None, f"no Finished condition in phase {status.phase}: {status.conditions}"
    return found


def column(status: DGXTrainingJobStatus, name: str) -> Any:
    """What `kubectl get dgxjob` prints in column ``name``: the CRD's JSONPath evaluated on ``status``
    (the two shapes the columns use: a plain path, and a condition picked by type)."""
    (col,) = [c for c in kind_by_name("DGXTrainingJob").columns if c["name"] == name]
    path: str = col["jsonPath"]
    picked = re.fullmatch(r'\.status\.conditions\[\?\(@\.type=="(\w+)"\)\]\.(\w+)', path)
    data = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    if picked is not None:
        type_, field = picked.groups()
        return next((c.get(field) for c in data.get("conditions", []) if c["type"] == type_), None)
    value: Any = {"status": data}
    for part in path.strip(".").split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def assert_finished_mirrors_the_phase(status: DGXTrainingJobStatus) -> None:
    """The contract of docs/operator.md, "Phases and conditions"."""
    done = finished(status)
    assert status.phase is not None
    running = next(c for c in status.conditions if c.type == "Running")
    assert done.observed_generation == running.observed_generation  # written together, by set_phase
    if status.phase not in TERMINAL:
        assert (done.status, done.reason, done.message) == ("False", status.phase, "")
        return
    ended = next(c for c in status.conditions if c.type == status.phase)
    assert (done.status, done.reason, done.message) == ("True", ended.reason, ended.message)
    assert done.last_transition_time == status.completion_time
    # The REASON column reads the Running condition: on a finished job it says why it ended.
    assert column(status, "Reason") == done.reason
    assert column(status, "Phase") == status.phase


# --- the decision table: every phase, every event -------------------------------------------------


@pytest.mark.parametrize(("phase", "event", "expect"), TABLE_PARAMS)
def test_finished_mirrors_the_phase_in_every_row(
    states: dict[str, State], phase: str, event: str, expect: Expect
) -> None:
    state = states[phase]
    given = EVENTS[event](state)
    status = plan(given.job, state.sim.ctx, given.observed(), given.now).status
    assert_finished_mirrors_the_phase(status)
    if expect.phase in TERMINAL:
        assert finished(status).reason == expect.reason


# --- the terminal paths the table has no row for ---------------------------------------------------


def _backoff_limit(ctx: BuildContext) -> Sim:
    sim = sim_of(ctx, {"spec.backoffLimit": 0})
    start_running(sim, 1)
    sim.reconcile([sim.pod(0, "failed", exit_code=1)], at_s=100)
    return sim


def _trainer_exit_2(ctx: BuildContext) -> Sim:
    sim = sim_of(ctx, {"spec.backoffLimit": 3})
    start_running(sim, 1)
    sim.reconcile([sim.pod(0, "failed", exit_code=2)], at_s=100)
    return sim


def _exit_code_not_retryable(ctx: BuildContext) -> Sim:
    sim = sim_of(ctx, {"spec.restartPolicy": "ExitCode", "spec.retryableExitCodes": [3]})
    start_running(sim, 1)
    sim.reconcile([sim.pod(0, "failed", exit_code=4)], at_s=100)
    return sim


def _unbuildable(ctx: BuildContext) -> Sim:
    sim = sim_of(ctx, {"spec.dataMounts": DATA_REF, "spec.trainer.output": {"dir": "/data/out"}})
    sim.mounts = dict(READY)
    sim.reconcile(at_s=0)
    return sim


def _squatter(ctx: BuildContext) -> Sim:
    sim = sim_of(ctx)
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "other", "uid": "0000", "controller": True}
    sim.reconcile([sim.pod(0, "running", owner=owner)], at_s=0)
    return sim


def _refused(ctx: BuildContext) -> Sim:
    """What the controller does with a permanent 403: plan the pass again knowing it."""
    sim = sim_of(ctx)
    refused = Refused("Pod", "job-worker-0", permanent=True, message="forbidden by policy")
    result = plan(sim.job, sim.ctx, dataclasses.replace(observe(), refused=(refused,)), at(0))
    sim.job = step(sim.job, result)
    return sim


def _image(reason: str) -> Callable[[BuildContext], Sim]:
    def run(ctx: BuildContext) -> Sim:
        sim = created_job(ctx)
        sim.reconcile([waiting(sim, 0, "trainer", reason, "bad image"), sim.pod(1, "scheduled")], at_s=30)
        return sim

    return run


def _data_mount_failed(ctx: BuildContext) -> Sim:
    sim = sim_of(ctx, {"spec.dataMounts": DATA_REF})
    sim.mounts = dict(SYNCING)
    sim.reconcile(at_s=0)
    sim.mounts = {"data": MountState("Failed", "BucketNotFound: no bucket named data")}
    sim.reconcile(at_s=10)
    return sim


PATHS: dict[str, tuple[Callable[[BuildContext], Sim], str]] = {
    "backoff_limit": (_backoff_limit, "BackoffLimitExceeded"),
    "trainer_exit_2": (_trainer_exit_2, "InvalidTrainerInput"),
    "exit_code_not_retryable": (_exit_code_not_retryable, "WorkerFailed"),
    "unbuildable": (_unbuildable, "InvalidSpec"),
    "squatter": (_squatter, "ForeignObject"),
    "refused": (_refused, "CreateRefused"),
    "invalid_image_name": (_image("InvalidImageName"), "InvalidImageName"),
    "image_never_pulled": (_image("ErrImageNeverPull"), "ErrImageNeverPull"),
    "data_mount_failed": (_data_mount_failed, "DataMountFailed"),
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_way_a_job_fails_finishes_it_with_the_reason(ctx: BuildContext, path: str) -> None:
    run, reason = PATHS[path]
    sim = run(ctx)
    assert sim.phase() == "Failed"
    assert_finished_mirrors_the_phase(sim.status)
    assert (finished(sim.status).status, finished(sim.status).reason) == ("True", reason)


def test_an_unknown_instance_finishes_the_job_with_invalid_spec(catalog: Catalog) -> None:
    kept = tuple(g for g in catalog.spec.gpus if g.key != "a100.80g")
    small = BuildContext(Catalog(catalog.spec.model_copy(update={"gpus": kept})))
    job = make_job()
    status = plan(job, small, observe([make_pod(job, make_ctx(catalog), 0, "running")]), T0).status
    assert_finished_mirrors_the_phase(status)
    assert (finished(status).status, finished(status).reason) == ("True", "InvalidSpec")


def test_a_job_that_archives_finishes_only_when_its_uploads_are_done(catalog: Catalog) -> None:
    """Finishing (worker 0 done, rank 0's sidecar still uploading) is not the end: Finished stays False."""
    ctx = BuildContext(catalog, data_mounts=mount_specs({"out": {"direction": "Out", "source": "s3://bucket/out"}}))
    sim = sim_with(ctx, ("out", "/workspace/output"), spec__elastic={"minNodes": 2})
    start_running(sim, 2)
    sim.reconcile([sim.pod(0, "succeeded"), sim.pod(1, "sidecar")], at_s=3600)
    assert (sim.phase(), finished(sim.status).status) == ("Running", "False")
    report = uploaded("s3://bucket/out/final/job-8a1f3c52", "adapter", "summary")
    sim.reconcile(
        [sim.pod(0, "succeeded"), reporting(sim.pod(1, "succeeded"), ("checkpoints-0", 0, report))], at_s=3700
    )
    assert sim.phase() == "Succeeded"
    assert_finished_mirrors_the_phase(sim.status)
    assert (finished(sim.status).reason, finished(sim.status).last_transition_time) == ("Completed", at(3700))


# --- present from the start, and no flapping --------------------------------------------------------


def transition(sim: Sim) -> tuple[str, str, datetime]:
    done = finished(sim.status)
    return done.status, done.reason, done.last_transition_time


def test_finished_is_false_from_the_first_status_and_moves_only_when_the_job_ends(ctx: BuildContext) -> None:
    """Its reason follows the phase, its lastTransitionTime does not: `kubectl wait` sees one flip."""
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 1, "maxNodes": 2}, "spec.dataMounts": DATA_REF})
    sim.mounts = dict(SYNCING)
    sim.reconcile(at_s=0)
    assert transition(sim) == ("False", "WaitingForData", T0)
    sim.mounts = dict(READY)
    assert created(sim.reconcile(at_s=10)) == [0, 1]
    assert transition(sim) == ("False", "Pending", T0)
    sim.reconcile([sim.pod(0, "running"), sim.pod(1, "running")], at_s=20)
    assert transition(sim) == ("False", "Running", T0)
    sim.respec({"spec.suspend": True})
    sim.reconcile([sim.pod(0, "running"), sim.pod(1, "running")], at_s=30)
    sim.reconcile([], at_s=40)
    assert transition(sim) == ("False", "Suspended", T0)
    sim.respec({"spec.suspend": False})
    sim.reconcile([], at_s=50)
    running = [sim.pod(0, "running"), sim.pod(1, "running")]
    sim.reconcile(running, at_s=60)
    assert transition(sim) == ("False", "Running", T0)
    sim.reconcile([sim.pod(0, "running"), sim.pod(1, "failed", exit_code=1)], at_s=70)  # OnFailure: a restart
    assert transition(sim) == ("False", "Running", T0)
    sim.reconcile([sim.pod(0, "succeeded")], at_s=80)
    assert transition(sim) == ("True", "Completed", at(80))
    # Later passes (a pod still going, then none, then the ttl-free idle timer) leave it alone.
    for pods, when in (([sim.pod(0, "succeeded"), sim.pod(1, "running")], 90), ([], 100), ([], 5000)):
        result = sim.reconcile(pods, at_s=when)
        assert transition(sim) == ("True", "Completed", at(80))
        assert result.events == []


def test_a_spec_edit_after_the_end_does_not_move_finished(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.restartPolicy": "Never"})
    start_running(sim, 1)
    sim.reconcile([sim.pod(0, "failed", exit_code=1)], at_s=100)
    before = finished(sim.status)
    sim.respec({"spec.priority": "high"})
    sim.reconcile([sim.pod(0, "failed", exit_code=1)], at_s=200)
    assert finished(sim.status) == before


# --- jobs that ended under an operator without Finished ---------------------------------------------


def without_finished(sim: Sim) -> None:
    assert sim.job.status is not None
    kept = [c for c in sim.job.status.conditions if c.type != "Finished"]
    sim.job = sim.job.model_copy(update={"status": sim.job.status.model_copy(update={"conditions": kept})})


@pytest.mark.parametrize("path", ["backoff_limit", "data_mount_failed", "squatter"])
def test_a_job_that_ended_before_the_upgrade_gets_finished_dated_when_it_ended(ctx: BuildContext, path: str) -> None:
    run, reason = PATHS[path]
    sim = run(ctx)
    ended = sim.status.completion_time
    without_finished(sim)
    later = at(86400)
    observed = observe(mounts=sim.mounts)
    assert_stable(sim.job, ctx, observed, later)  # written once, then left alone
    result = plan(sim.job, ctx, observed, later)
    done = finished(result.status)
    assert (done.status, done.reason, done.last_transition_time) == ("True", reason, ended)
    assert result.events == []


def test_a_succeeded_job_that_archived_gets_finished_without_reordering_for_ever(catalog: Catalog) -> None:
    """The Archived condition is written on every pass of a succeeded job: the backfill must not make
    the two swap places on each pass (every swap would be a status write)."""
    ctx = BuildContext(catalog, data_mounts=mount_specs({"out": {"direction": "Out", "source": "s3://bucket/out"}}))
    sim = sim_with(ctx, ("out", "/workspace/output"))
    start_running(sim, 1)
    report = uploaded("s3://bucket/out/final/job-8a1f3c52", "adapter", "summary")
    pods = [reporting(sim.pod(0, "succeeded"), ("checkpoints-0", 0, report))]
    sim.reconcile(pods, at_s=3600)
    assert sim.phase() == "Succeeded"
    without_finished(sim)
    assert_stable(sim.job, ctx, observe(pods, mounts=sim.mounts), at(7200))
    sim.reconcile(pods, at_s=7200)
    assert_finished_mirrors_the_phase(sim.status)
