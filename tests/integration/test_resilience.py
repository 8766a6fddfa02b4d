"""The operator under adversity: killed and restarted mid-work, the spec or the pods changed while it was down,
the API server answering 409, 429 or 500, watch streams dropped; and, on a plain run, every side effect made
exactly once. The helpers (the operator with a test clock, the test as kubelet) are test_operator.py's."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from tests.integration.conftest import RunOperator
from tests.integration.emulator import ApiError, Body, Emulator, Kind
from tests.integration.scenarios import (
    JOBS,
    NS,
    condition,
    counts,
    exit_pod,
    expect_events,
    expect_pods,
    final_pods,
    get_job,
    job_with,
    nodes,
    pod_set,
    run_pod,
    run_pods,
    start_operator,
    two_workers,
    wait_phase,
    worker,
)

pytestmark = pytest.mark.asyncio

JOB_KEY = ("kubedgx.io/v1alpha1/dgxtrainingjobs", NS, "job")


def successful(emulator: Emulator, verb: str, resource: str, subresource: str | None = None) -> int:
    return len(emulator.calls(verb, resource, subresource=subresource, succeeded=True))


class Refuse:
    """A validating admission hook that answers ``code`` to the creation of the named pods while ``active``."""

    def __init__(self, pods: set[str], code: int = 500) -> None:
        self.pods = pods
        self.code = code
        self.active = True
        self.refused: list[str] = []

    def __call__(self, operation: str, kind: Kind, new: Body, old: Body | None) -> None:
        name = new.get("metadata", {}).get("name")
        if self.active and operation == "CREATE" and kind.plural == "pods" and name in self.pods:
            self.refused.append(name)
            raise ApiError(self.code, "InternalError", "etcdserver: request timed out")


def unexpected_failed_creates(emulator: Emulator) -> list[str]:
    """Creates that failed, bar the test's own injected 500s: e.g. a 409 for a child created twice."""
    return [str(c) for c in emulator.calls("create", succeeded=False) if c.status != 500]


# --------------------------------------------------------------------------------------------
# The operator stopped and started again
# --------------------------------------------------------------------------------------------


async def test_operator_killed_while_creating_workers_finishes_the_job_without_duplicates(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator)
    refuse = Refuse({worker(2)})
    emulator.admission.append(refuse)
    emulator.create(JOBS, job_with({"spec.elastic.minNodes": 4}))
    # The workers are created together: all but worker 2 exist.
    created = {worker(0): "0", worker(1): "0", worker(3): "0"}
    await emulator.wait_for(lambda: refuse.refused and pod_set(emulator) == created)
    await op.stop()  # killed while it retries worker 2
    refuse.active = False
    assert pod_set(emulator) == created

    op = await start_operator(emulator, run_operator, op.clock)
    await expect_pods(emulator, {worker(i): "0" for i in range(4)})
    run_pods(emulator, *(worker(i) for i in range(4)))
    status = await wait_phase(emulator, "Running", nodes("4/4"))
    assert counts(status) == ("Running", 0, 0, "4/4", (4, 4, 4, 0))
    await final_pods(op, {worker(i): "0" for i in range(4)})
    # One of each child: every create succeeded once, or failed only with the injected 500.
    assert successful(emulator, "create", "pods") == 4
    assert successful(emulator, "create", "configmaps") == 1
    assert successful(emulator, "create", "services") == 1
    assert len(emulator.select("configmaps", NS)) == 1
    assert len(emulator.select("services", NS)) == 1
    assert unexpected_failed_creates(emulator) == []
    await expect_events(emulator, [("Normal", "WorkersPending"), ("Normal", "AllWorkersRunning")])


async def test_operator_killed_while_recreating_workers_after_a_restart_counts_it_once(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, job_with({"spec.elastic.minNodes": 3, "spec.backoffLimit": 3}))
    await expect_pods(emulator, {worker(i): "0" for i in range(3)})
    run_pods(emulator, worker(0), worker(1), worker(2))
    await wait_phase(emulator, "Running", nodes("3/3"))

    refuse = Refuse({worker(2)})
    emulator.admission.append(refuse)
    for i in range(3):  # one incident: worker 0 crashes, the others fail on NCCL errors
        exit_pod(emulator, worker(i), 1, message="NCCL error")
    await emulator.wait_for(
        lambda: refuse.refused and pod_set(emulator) == {worker(0): "1", worker(1): "1"},
        message=lambda: f"workers 0 and 1 recreated, 2 refused; now {pod_set(emulator)}",
    )
    await op.stop()
    refuse.active = False
    status = get_job(emulator)["status"]
    assert (status["restarts"], status["attempt"]) == (1, 1)

    op = await start_operator(emulator, run_operator, op.clock)
    await expect_pods(emulator, {worker(i): "1" for i in range(3)})
    run_pods(emulator, worker(0), worker(1), worker(2))
    status = await wait_phase(emulator, "Running", nodes("3/3"))
    assert counts(status) == ("Running", 1, 1, "3/3", (3, 3, 3, 0))
    await final_pods(op, {worker(i): "1" for i in range(3)})
    assert len(emulator.select("configmaps", NS)) == 1
    assert len(emulator.select("services", NS)) == 1
    assert unexpected_failed_creates(emulator) == []
    await expect_events(
        emulator,
        [
            ("Normal", "WorkersPending"),
            ("Normal", "AllWorkersRunning"),
            ("Warning", "WorkerRestarted"),
            ("Warning", "NodesBelowMinimum"),
            ("Normal", "AllWorkersRunning"),
        ],
    )


async def test_a_restart_counted_before_a_crash_is_not_counted_again(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.hold_pod_deletion = True
    emulator.create(JOBS, job_with({"spec.backoffLimit": 1}))
    await expect_pods(emulator, {worker(0): "0"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")
    exit_pod(emulator, worker(0), 1)
    await wait_phase(emulator, "Restarting", lambda s: s.get("restarts") == 1)
    await op.stop()  # the failed worker is still terminating
    emulator.finish_pod_deletion(NS, worker(0))

    op = await start_operator(emulator, run_operator, op.clock)
    await expect_pods(emulator, {worker(0): "1"})
    run_pod(emulator, worker(0))
    status = await wait_phase(emulator, "Running")
    # Seen again by a new operator, the failure is still one restart: backoffLimit 1 is not exceeded.
    assert counts(status) == ("Running", 1, 1, "1/1", (1, 1, 1, 0))
    await final_pods(op, {worker(0): "1"})


async def test_spec_changed_while_the_operator_was_down(emulator: Emulator, run_operator: RunOperator) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, job_with({"spec.elastic.minNodes": 1, "spec.elastic.maxNodes": 2}))
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    run_pods(emulator, worker(0), worker(1))
    await wait_phase(emulator, "Running", nodes("2/2"))
    await op.stop()

    emulator.patch(JOBS, NS, "job", {"spec": {"elastic": {"maxNodes": 4}}})
    op = await start_operator(emulator, run_operator, op.clock)
    await expect_pods(emulator, {worker(i): "0" for i in range(4)})
    status = await wait_phase(emulator, "Running", lambda s: s.get("observedGeneration") == 2)
    assert counts(status) == ("Running", 0, 0, "2/4", (4, 4, 2, 0))
    run_pods(emulator, worker(2), worker(3))
    status = await wait_phase(emulator, "Running", nodes("4/4"))
    await final_pods(op, {worker(i): "0" for i in range(4)})
    assert unexpected_failed_creates(emulator) == []


async def test_a_worker_deleted_while_the_operator_was_down_is_recreated_uncounted(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, two_workers())
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    run_pods(emulator, worker(0), worker(1))
    await wait_phase(emulator, "Running", nodes("2/2"))
    await op.stop()

    emulator.delete("pods", NS, worker(1))
    op = await start_operator(emulator, run_operator, op.clock)
    await emulator.wait_for(lambda: worker(1) in pod_set(emulator))
    status = await wait_phase(emulator, "Restarting")
    assert condition(status, "Restarting")["reason"] == "NodesBelowMinimum"
    run_pod(emulator, worker(1))
    status = await wait_phase(emulator, "Running", nodes("2/2"))
    assert counts(status) == ("Running", 0, 1, "2/2", (2, 2, 2, 0))  # a new attempt, no restart counted
    await final_pods(op, {worker(0): "0", worker(1): "1"})
    await expect_events(
        emulator,
        [
            ("Normal", "WorkersPending"),
            ("Normal", "AllWorkersRunning"),
            ("Normal", "WorkerLost"),
            ("Warning", "NodesBelowMinimum"),
            ("Normal", "AllWorkersRunning"),
        ],
    )


# --------------------------------------------------------------------------------------------
# The API server answering errors
# --------------------------------------------------------------------------------------------


async def test_a_conflict_on_the_status_write_is_planned_again(emulator: Emulator, run_operator: RunOperator) -> None:
    op = await start_operator(emulator, run_operator)
    conflict = emulator.fail("patch", "dgxtrainingjobs", "status", code=409)
    emulator.create(JOBS, two_workers())
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    status = await wait_phase(emulator, "Pending")
    assert conflict.hits == 1
    assert counts(status) == ("Pending", 0, 0, "0/2", (2, 2, 0, 0))
    run_pods(emulator, worker(0), worker(1))
    status = await wait_phase(emulator, "Running", nodes("2/2"))
    assert counts(status) == ("Running", 0, 0, "2/2", (2, 2, 2, 0))
    await final_pods(op, {worker(0): "0", worker(1): "0"})
    # The creates of the failed pass were remembered: nothing was created twice.
    assert successful(emulator, "create", "pods") == 2
    assert unexpected_failed_creates(emulator) == []
    await expect_events(emulator, [("Normal", "WorkersPending"), ("Normal", "AllWorkersRunning")])


@pytest.mark.parametrize("code", [429, 500])
@pytest.mark.parametrize(
    "target", [("create", "pods", None), ("patch", "dgxtrainingjobs", "status")], ids=["pod-create", "status-patch"]
)
async def test_throttling_and_server_errors_are_retried(
    emulator: Emulator, run_operator: RunOperator, code: int, target: tuple[str, str, str | None]
) -> None:
    op = await start_operator(emulator, run_operator)
    verb, resource, subresource = target
    fault = emulator.fail(verb, resource, subresource, code=code, times=1 if code == 429 else 2)  # 429: 1 s each
    emulator.create(JOBS, two_workers())
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    await wait_phase(emulator, "Pending")
    run_pods(emulator, worker(0), worker(1))
    status = await wait_phase(emulator, "Running", nodes("2/2"))
    assert fault.remaining == 0
    assert counts(status) == ("Running", 0, 0, "2/2", (2, 2, 2, 0))
    await final_pods(op, {worker(0): "0", worker(1): "0"})
    assert successful(emulator, "create", "pods") == 2
    assert [c.status for c in emulator.calls("create", succeeded=False)] == (
        [code] * fault.times if verb == "create" else []
    )
    await expect_events(emulator, [("Normal", "WorkersPending"), ("Normal", "AllWorkersRunning")])


@pytest.mark.parametrize("code", [409, 500])
async def test_a_failed_status_write_does_not_lose_a_restart(
    emulator: Emulator, run_operator: RunOperator, code: int
) -> None:
    """The status that counts a restart is written before the failed worker is deleted: if the write fails
    (409 from a concurrent edit, 500), the retry still sees the failure and counts it, once."""
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, job_with({"spec.backoffLimit": 3}))
    await expect_pods(emulator, {worker(0): "0"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")
    await op.settle()

    fault = emulator.fail("patch", "dgxtrainingjobs", "status", code=code)  # the status write of the restart
    exit_pod(emulator, worker(0), 1, message="CUDA error: an illegal memory access was encountered")
    await emulator.wait_for(lambda: fault.remaining == 0)
    await op.settle()
    status = get_job(emulator)["status"]
    assert (status["restarts"], status["attempt"]) == (1, 1)
    await expect_pods(emulator, {worker(0): "1"})
    run_pod(emulator, worker(0))
    status = await wait_phase(emulator, "Running")
    assert counts(status) == ("Running", 1, 1, "1/1", (1, 1, 1, 0))
    await final_pods(op, {worker(0): "1"})
    await expect_events(
        emulator,
        [
            ("Normal", "WorkersPending"),
            ("Normal", "AllWorkersRunning"),
            ("Warning", "WorkerRestarted"),
            ("Warning", "NodesBelowMinimum"),
            ("Normal", "AllWorkersRunning"),
        ],
    )


# --------------------------------------------------------------------------------------------
# Watches dropped
# --------------------------------------------------------------------------------------------


async def test_pod_events_after_a_dropped_watch_are_handled(emulator: Emulator, run_operator: RunOperator) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, two_workers())
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Pending", nodes("1/2"))
    watches = len(emulator.calls("watch", "pods"))

    assert emulator.drop_watches() > 0  # an API server restart, a load balancer's idle timeout
    run_pod(emulator, worker(1))
    await wait_phase(emulator, "Running", nodes("2/2"))
    exit_pod(emulator, worker(0), 0)
    status = await wait_phase(emulator, "Succeeded")
    assert counts(status) == ("Succeeded", 0, 0, "0/0", (0, 0, 0, 0))
    await final_pods(op, {worker(0): "0"})
    assert len(emulator.calls("watch", "pods")) > watches  # the stream was opened again
    await expect_events(
        emulator, [("Normal", "WorkersPending"), ("Normal", "AllWorkersRunning"), ("Normal", "Completed")]
    )


# --------------------------------------------------------------------------------------------
# Every side effect exactly once
# --------------------------------------------------------------------------------------------


def status_changes(emulator: Emulator) -> list[Mapping[str, Any]]:
    """Every distinct status the job went through, in order (from the emulator's record of stored versions)."""
    history = emulator.objects[JOB_KEY].history
    changes: list[Mapping[str, Any]] = []
    previous: Any = None
    for version in history:
        # Plain dicts, not kmock's pattern-matching views (whose == is a partial match).
        status = json.loads(json.dumps(version, default=dict)).get("status")
        if status != previous:
            changes.append(status)
            previous = status
    return [s for s in changes if s is not None]


async def test_every_side_effect_happens_exactly_once(emulator: Emulator, run_operator: RunOperator) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, two_workers())
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    await wait_phase(emulator, "Pending")
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Pending", nodes("1/2"))
    run_pod(emulator, worker(1))
    await wait_phase(emulator, "Running", nodes("2/2"))
    exit_pod(emulator, worker(0), 0)
    await wait_phase(emulator, "Succeeded")
    await final_pods(op, {worker(0): "0"})
    await expect_events(
        emulator, [("Normal", "WorkersPending"), ("Normal", "AllWorkersRunning"), ("Normal", "Completed")]
    )
    await op.settle()  # and once more: a reconcile that learns nothing writes nothing

    # No 409, no 404, no 422: nothing done twice or too early. (The startup check of the PriorityClasses reads
    # them once: a 404 there is its answer "absent", dgx_operator/runtime/priorities.py; so is the first pass's
    # read of the namespace's DGXLimits "default", which this namespace has none of.)
    absent = [c for c in emulator.calls(succeeded=False) if c.resource == "dgxlimits" and c.status == 404]
    assert len(absent) == 1
    failed = [c for c in emulator.calls(succeeded=False) if c.resource != "priorityclasses" and c not in absent]
    assert failed == []
    assert successful(emulator, "create", "pods") == 2
    assert successful(emulator, "create", "services") == 1
    assert successful(emulator, "create", "configmaps") == 1
    assert [c.name for c in emulator.calls("delete", "pods")] == [worker(1)]
    assert successful(emulator, "create", "events") == 3
    assert len(emulator.calls("patch", "dgxtrainingjobs", subresource=None)) == 1  # the finalizer, added once
    changes = status_changes(emulator)
    phases = [s.get("phase") for s in changes]
    assert [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p] == ["Pending", "Running", "Succeeded"]
    # One write per distinct status: none repeated, none that changed nothing.
    assert successful(emulator, "patch", "dgxtrainingjobs", "status") == len(changes)
    job_writes = [(c.verb, c.subresource) for c in emulator.calls(resource="dgxtrainingjobs") if c.write]
    assert job_writes == [("patch", None)] + [("patch", "status")] * len(changes)


async def test_children_created_while_the_pod_watch_lags_are_not_created_again(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    """Until the watch shows the pods it created, the operator's expectations stand in for them: a reconcile in
    between must not create them again (a 409 would mean it tried)."""
    op = await start_operator(emulator, run_operator)
    down = emulator.fail("watch", "pods", code=503, times=4)  # kopf backs off 0.1 + 0.2 + 0.5 + 1.0 s
    assert emulator.drop_watches() > 0
    emulator.create(JOBS, two_workers())
    await wait_phase(emulator, "Pending")
    await op.trigger()
    await emulator.wait_for(lambda: op.reconciles >= 2 and not op.controller.dirty)
    assert op.controller.pods_of(NS, "job") == [], "the pod watch came back too early to test anything"

    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    await emulator.wait_for(lambda: down.remaining == 0)
    run_pods(emulator, worker(0), worker(1))
    await wait_phase(emulator, "Running", nodes("2/2"))
    await final_pods(op, {worker(0): "0", worker(1): "0"})
    assert emulator.calls("create", succeeded=False) == []
    assert successful(emulator, "create", "pods") == 2
