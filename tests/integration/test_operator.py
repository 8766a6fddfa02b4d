"""The operator's behaviour (docs/operator.md), end to end: the real kopf operator (``dgx_operator.runtime.handlers``)
runs in this event loop against the in-memory API server, and the test plays everyone else: the user (jobs
created, edited, deleted), the scheduler and the kubelet (pod status patches), the node that dies (a pod
deleted). Every scenario checks the job's status, the Kubernetes Events posted for it, and the exact set of
pods left at the end.

Time never passes for real: the operator's controller reads a :class:`Clock` the test moves, and a reconcile
that a timer would have started is asked for explicitly (:meth:`Operator.trigger`). Waits are conditions
re-checked on every change the emulator sees (``emulator.wait_for``), never sleeps.

The scenario helpers (the operator under test, the test as scheduler and kubelet, reading the outcome) are
in scenarios.py.
"""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from typing import Any

import pytest

from tests.conftest import BASE_JOB, BASE_MOUNT, with_changes
from tests.integration.conftest import RunOperator
from tests.integration.emulator import ApiError, Emulator
from tests.integration.scenarios import (
    ATTEMPT,
    FINALIZER,
    JOB,
    JOB_LABEL,
    JOBS,
    MOUNTS,
    NS,
    PROGRESS,
    QUEUE_LABEL,
    Body,
    Operator,
    _container,
    condition,
    conditions,
    counts,
    event_reasons,
    exit_container,
    exit_pod,
    expect_events,
    expect_pods,
    final_pods,
    get_job,
    job_events,
    job_with,
    live_pods,
    lose_a_worker_then_edit_the_trainer,
    nodes,
    pod_set,
    run_pod,
    run_pods,
    stamp,
    start_operator,
    two_workers,
    wait_phase,
    worker,
)
from tests.s3 import S3, secret

pytestmark = pytest.mark.asyncio


# --------------------------------------------------------------------------------------------
# Success
# --------------------------------------------------------------------------------------------


async def test_two_workers_run_and_succeed_when_worker_0_exits_0(emulator: Emulator, run_operator: RunOperator) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, two_workers())
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    status = await wait_phase(emulator, "Pending")
    assert counts(status) == ("Pending", 0, 0, "0/2", (2, 2, 0, 0))
    assert condition(status, "Running")["reason"] == "WorkersPending"
    assert status["startTime"] == stamp(op.clock.now)
    job = get_job(emulator)
    assert job["metadata"]["finalizers"] == [FINALIZER]
    assert emulator.get("services", NS, JOB) is not None
    (config,) = [v["configMap"]["name"] for v in emulator.get("pods", NS, f"{JOB}-worker-0")["spec"]["volumes"]
                 if v["name"] == "trainer-config"]  # fmt: skip
    assert config.startswith(f"{JOB}-trainer-")
    assert emulator.get("configmaps", NS, config) is not None

    run_pods(emulator, worker(0), worker(1))
    status = await wait_phase(emulator, "Running", nodes("2/2"))
    assert counts(status) == ("Running", 0, 0, "2/2", (2, 2, 2, 0))
    assert conditions(status) == {
        "Running": ("True", "AllWorkersRunning"),
        "Restarting": ("False", "NotRestarting"),
        "Suspended": ("False", "NotSuspended"),
        "Finished": ("False", "Running"),
    }

    # Worker 0's progress report (a pod annotation while it runs) is mirrored; garbage in it is ignored.
    report = {"step": 10, "totalSteps": 100, "loss": 1.25, "bogus": "x"}
    emulator.patch("pods", NS, worker(0), {"metadata": {"annotations": {PROGRESS: json.dumps(report)}}})
    status = await wait_phase(emulator, "Running", lambda s: "progress" in s)
    assert status["progress"] == {"step": 10, "totalSteps": 100, "loss": 1.25}
    # (Unparseable from now on: so when worker 0 ends, its termination message's summary is what counts.)
    emulator.patch("pods", NS, worker(0), {"metadata": {"annotations": {PROGRESS: "{not json"}}})
    await op.settle()
    assert get_job(emulator)["status"]["progress"]["step"] == 10
    assert get_job(emulator)["status"]["phase"] == "Running"

    op.clock.advance(timedelta(hours=2))
    exit_pod(emulator, worker(0), 0, message=json.dumps({"step": 100, "totalSteps": 100, "loss": 0.5}))
    status = await wait_phase(emulator, "Succeeded")
    assert conditions(status) == {
        "Running": ("False", "Completed"),
        "Restarting": ("False", "NotRestarting"),
        "Suspended": ("False", "NotSuspended"),
        "Succeeded": ("True", "Completed"),
        "Failed": ("False", "NotFailed"),
        "Finished": ("True", "Completed"),
    }
    assert condition(status, "Succeeded")["message"] == f"{worker(0)} exited 0: training completed"
    assert status["completionTime"] == stamp(op.clock.now)
    assert status["progress"] == {"step": 100, "totalSteps": 100, "loss": 0.5}
    assert counts(status) == ("Succeeded", 0, 0, "0/0", (0, 0, 0, 0))
    # Worker 1 is deleted; worker 0 stays, finished, with its logs.
    await final_pods(op, {worker(0): "0"})
    await expect_events(
        emulator, [("Normal", "WorkersPending"), ("Normal", "AllWorkersRunning"), ("Normal", "Completed")]
    )


async def test_a_real_kubelets_order_of_writes_shows_no_restart_on_success(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    """A real kubelet writes the container terminated a second before the pod's phase: the job stays
    Running through that window (no Restarting, no NodesBelowMinimum Warning) and then succeeds."""
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, two_workers())
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    run_pods(emulator, worker(0), worker(1))
    await wait_phase(emulator, "Running", nodes("2/2"))
    exit_container(emulator, worker(1), 0)
    exit_container(emulator, worker(0), 0, message=json.dumps({"step": 100, "totalSteps": 100}))
    await op.settle()
    status = get_job(emulator)["status"]
    assert (status["phase"], condition(status, "Running")["reason"]) == ("Running", "AllWorkersRunning")
    assert "2 exited (pod ending)" in condition(status, "Running")["message"]
    exit_pod(emulator, worker(1), 0)
    exit_pod(emulator, worker(0), 0, message=json.dumps({"step": 100, "totalSteps": 100}))
    await wait_phase(emulator, "Succeeded")
    await expect_events(
        emulator, [("Normal", "WorkersPending"), ("Normal", "AllWorkersRunning"), ("Normal", "Completed")]
    )


async def test_status_progress_is_the_final_summary_once_worker_0_ended(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, job_with({}))
    await expect_pods(emulator, {worker(0): "0"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")
    running = {"step": 10, "totalSteps": 100, "loss": 1.25}
    emulator.patch("pods", NS, worker(0), {"metadata": {"annotations": {PROGRESS: json.dumps(running)}}})
    await wait_phase(emulator, "Running", lambda s: "progress" in s)

    final = {"step": 100, "totalSteps": 100, "loss": 0.5}
    exit_pod(emulator, worker(0), 0, message=json.dumps({"progress": final}))
    await wait_phase(emulator, "Succeeded")
    await op.settle()
    assert get_job(emulator)["status"]["progress"] == final


async def test_status_progress_drops_fields_the_latest_report_lacks(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, job_with({}))
    await expect_pods(emulator, {worker(0): "0"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")
    first = {"step": 10, "totalSteps": 100, "precision": "bf16"}
    emulator.patch("pods", NS, worker(0), {"metadata": {"annotations": {PROGRESS: json.dumps(first)}}})
    await wait_phase(emulator, "Running", lambda s: s.get("progress", {}).get("step") == 10)

    latest = {"step": 20, "totalSteps": 100}
    emulator.patch("pods", NS, worker(0), {"metadata": {"annotations": {PROGRESS: json.dumps(latest)}}})
    await wait_phase(emulator, "Running", lambda s: s.get("progress", {}).get("step") == 20)
    await op.settle()
    writes = len(emulator.calls("patch", "dgxtrainingjobs", subresource="status"))
    await op.settle()  # a reconcile that learns nothing writes nothing
    assert len(emulator.calls("patch", "dgxtrainingjobs", subresource="status")) == writes
    assert get_job(emulator)["status"]["progress"] == latest


async def test_a_worker_other_than_0_that_exits_0_is_left_alone(emulator: Emulator, run_operator: RunOperator) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, two_workers())
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    run_pods(emulator, worker(0), worker(1))
    await wait_phase(emulator, "Running", nodes("2/2"))

    exit_pod(emulator, worker(1), 0)  # its share is done; worker 0 still writes the checkpoint
    status = await wait_phase(emulator, "Running", nodes("1/2"))
    assert condition(status, "Running")["message"] == "1/2 workers running, 1 finished"
    await op.settle()
    assert pod_set(emulator) == {worker(0): "0", worker(1): "0"}  # not recreated, not deleted
    assert get_job(emulator)["status"]["phase"] == "Running"

    exit_pod(emulator, worker(0), 0)
    status = await wait_phase(emulator, "Succeeded")
    assert counts(status) == ("Succeeded", 0, 0, "0/0", (0, 0, 0, 0))
    await final_pods(op, {worker(0): "0", worker(1): "0"})
    assert emulator.calls("delete", "pods") == []
    await expect_events(
        emulator, [("Normal", "WorkersPending"), ("Normal", "AllWorkersRunning"), ("Normal", "Completed")]
    )


async def test_an_unknown_instance_type_fails_the_job(emulator: Emulator, run_operator: RunOperator) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, job_with({"spec.instance": "dgxz999.80g.8.norm"}))  # well-formed, not in the catalog
    status = await wait_phase(emulator, "Failed")
    failed = condition(status, "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert failed["message"].startswith("spec.instance: ")
    assert "dgxz999.80g.8.norm" in failed["message"]
    await final_pods(op, {})
    assert emulator.select("services", NS) == []
    await expect_events(emulator, [("Warning", "InvalidSpec")])


async def test_a_finished_job_is_deleted_after_its_ttl(emulator: Emulator, run_operator: RunOperator) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, job_with({"spec.ttlSecondsAfterFinished": 600}))
    await expect_pods(emulator, {worker(0): "0"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")
    exit_pod(emulator, worker(0), 0)
    await wait_phase(emulator, "Succeeded")
    op.clock.advance(timedelta(seconds=599))
    await op.settle()
    assert emulator.get(JOBS, NS, JOB) is not None
    op.clock.advance(timedelta(seconds=1))
    await op.trigger()
    await emulator.wait_for_absence(JOBS, NS, JOB)
    # Its children go with it (ownerReferences).
    await expect_pods(emulator, {})
    assert emulator.select("services", NS) == []
    assert emulator.select("configmaps", NS) == []


# --------------------------------------------------------------------------------------------
# Failures, restarts and the backoff limit
# --------------------------------------------------------------------------------------------


async def test_restart_policy_never_fails_the_job_at_the_first_worker_failure(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, two_workers(**{"spec.restartPolicy": "Never"}))
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    run_pods(emulator, worker(0), worker(1))
    await wait_phase(emulator, "Running", nodes("2/2"))

    log = (
        "Traceback (most recent call last):\n  ...\nRuntimeError: CUDA error: an illegal memory access was encountered"
    )
    exit_pod(emulator, worker(1), 1, message=log)
    status = await wait_phase(emulator, "Failed")
    failed = condition(status, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "WorkerFailed")
    assert failed["message"] == (
        f"{worker(1)} exited with code 1: RuntimeError: CUDA error: an illegal memory access was encountered; "
        "restartPolicy is Never"
    )
    assert conditions(status)["Succeeded"] == ("False", "NotSucceeded")
    assert conditions(status)["Running"] == ("False", "WorkerFailed")
    # `kubectl wait --for=condition=Finished` ends on a failure too, with the message of the Failed one.
    assert condition(status, "Finished") == {**failed, "type": "Finished"}
    assert counts(status) == ("Failed", 0, 0, "0/0", (0, 0, 0, 1))
    assert status["completionTime"] == stamp(op.clock.now)
    # Every worker still running is deleted; the failed one is kept (its logs explain the failure).
    await final_pods(op, {worker(1): "0"})
    await expect_events(
        emulator, [("Normal", "WorkersPending"), ("Normal", "AllWorkersRunning"), ("Warning", "WorkerFailed")]
    )
    assert job_events(emulator)[-1][2] == failed["message"]


async def test_on_failure_restarts_up_to_the_backoff_limit(emulator: Emulator, run_operator: RunOperator) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.hold_pod_deletion = True  # deleted pods stay Terminating until the test ends them
    emulator.create(JOBS, job_with({"spec.restartPolicy": "OnFailure", "spec.backoffLimit": 1}))
    await expect_pods(emulator, {worker(0): "0"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")

    exit_pod(emulator, worker(0), 1, message="NCCL error: unhandled system error")
    status = await wait_phase(emulator, "Restarting")
    assert counts(status) == ("Restarting", 1, 1, "0/1", (1, 0, 0, 0))
    assert conditions(status)["Restarting"] == ("True", "NodesBelowMinimum")
    # The failed worker is being deleted; its replacement waits until the name is free.
    await op.settle()
    assert pod_set(emulator) == {worker(0): "0"}
    assert get_job(emulator)["status"]["restarts"] == 1  # the same failure, seen again, is not counted again
    emulator.finish_pod_deletion(NS, worker(0))
    await expect_pods(emulator, {worker(0): "1"})
    run_pod(emulator, worker(0))
    status = await wait_phase(emulator, "Running")
    assert counts(status) == ("Running", 1, 1, "1/1", (1, 1, 1, 0))

    exit_pod(emulator, worker(0), 1, message="NCCL error: unhandled system error")
    status = await wait_phase(emulator, "Failed")
    failed = condition(status, "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert failed["message"] == (
        f"{worker(0)} exited with code 1: NCCL error: unhandled system error; backoffLimit 1 reached after 1 restart(s)"
    )
    assert counts(status) == ("Failed", 1, 1, "0/0", (0, 0, 0, 1))
    await final_pods(op, {worker(0): "1"})
    await expect_events(
        emulator,
        [
            ("Normal", "WorkersPending"),
            ("Normal", "AllWorkersRunning"),
            ("Warning", "WorkerRestarted"),
            ("Warning", "NodesBelowMinimum"),
            ("Normal", "AllWorkersRunning"),
            ("Warning", "BackoffLimitExceeded"),
        ],
    )
    restarted = job_events(emulator)[2][2]
    assert restarted == (
        f"{worker(0)} exited with code 1: NCCL error: unhandled system error; restart 1 of 1 (attempt 1)"
    )


async def test_exit_code_policy_retries_signals_and_fails_on_other_codes(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, job_with({"spec.restartPolicy": "ExitCode", "spec.backoffLimit": 5}))
    await expect_pods(emulator, {worker(0): "0"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")

    # SIGKILL (137) is in the default retryableExitCodes (129-255); the same code with the kubelet's
    # reason OOMKilled is not retried (OutOfMemory: tests/unit/test_diagnosis.py).
    exit_pod(emulator, worker(0), 137)
    await expect_pods(emulator, {worker(0): "1"})
    status = get_job(emulator)["status"]
    assert (status["restarts"], status["attempt"]) == (1, 1)
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")

    exit_pod(emulator, worker(0), 2, message="error: unrecognized arguments: --lr")  # a bug: retrying won't help
    status = await wait_phase(emulator, "Failed")
    failed = condition(status, "Failed")
    assert failed["reason"] == "WorkerFailed"
    assert failed["message"] == (
        f"{worker(0)} exited with code 2: error: unrecognized arguments: --lr; exit code 2 is not in retryableExitCodes"
    )
    assert counts(status) == ("Failed", 1, 1, "0/0", (0, 0, 0, 1))
    await final_pods(op, {worker(0): "1"})
    await expect_events(
        emulator,
        [
            ("Normal", "WorkersPending"),
            ("Normal", "AllWorkersRunning"),
            ("Warning", "WorkerRestarted"),
            ("Warning", "NodesBelowMinimum"),
            ("Normal", "AllWorkersRunning"),
            ("Warning", "WorkerFailed"),
        ],
    )
    assert job_events(emulator)[2][2] == f"{worker(0)} exited with code 137; restart 1 of 5 (attempt 1)"


DISRUPTIONS: dict[str, Body] = {
    "evicted": {
        "phase": "Failed",
        "reason": "Evicted",
        "message": "The node was low on resource: memory.",
    },
    "preempted-with-DisruptionTarget": {
        "phase": "Failed",
        "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
    },
    "rejected-by-the-kubelet": {
        "phase": "Failed",
        "reason": "OutOfnvidia.com/gpu",
        "message": "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu",
    },
}


@pytest.mark.parametrize("disruption", sorted(DISRUPTIONS))
async def test_disruptions_replace_the_worker_without_counting(
    emulator: Emulator, run_operator: RunOperator, disruption: str
) -> None:
    op = await start_operator(emulator, run_operator)
    # backoffLimit 0: a single counted failure would fail the job.
    emulator.create(JOBS, job_with({"spec.backoffLimit": 0}))
    await expect_pods(emulator, {worker(0): "0"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")

    update = DISRUPTIONS[disruption]
    if disruption != "rejected-by-the-kubelet":  # the program ran, and was killed
        terminated = {"exitCode": 143, "reason": "Error", "startedAt": "2025-01-01T00:00:00Z"}
        update = {
            **update,
            "containerStatuses": _container(emulator, worker(0), {"terminated": terminated}, ready=False),
        }
    emulator.patch_status("pods", NS, worker(0), update)
    await expect_pods(emulator, {worker(0): "1"})
    status = get_job(emulator)["status"]
    assert (status["restarts"], status["attempt"]) == (0, 1)
    run_pod(emulator, worker(0))
    status = await wait_phase(emulator, "Running")
    assert counts(status) == ("Running", 0, 1, "1/1", (1, 1, 1, 0))
    await final_pods(op, {worker(0): "1"})
    await expect_events(
        emulator,
        [
            ("Normal", "WorkersPending"),
            ("Normal", "AllWorkersRunning"),
            ("Normal", "WorkerDisrupted"),
            ("Warning", "NodesBelowMinimum"),
            ("Normal", "AllWorkersRunning"),
        ],
    )
    assert job_events(emulator)[2][2].endswith("replaced without counting against backoffLimit")


# --------------------------------------------------------------------------------------------
# Elastic jobs and scaling
# --------------------------------------------------------------------------------------------


def elastic(min_nodes: int, max_nodes: int, **changes: Any) -> Body:
    return job_with({"spec.elastic.minNodes": min_nodes, "spec.elastic.maxNodes": max_nodes, **changes})


async def running_elastic_job(op: Operator, min_nodes: int, max_nodes: int) -> None:
    op.emulator.create(JOBS, elastic(min_nodes, max_nodes))
    await expect_pods(op.emulator, {worker(i): "0" for i in range(max_nodes)})
    # One at a time, so that the phase's reason is deterministic: Running (ElasticMinimumRunning) as soon as
    # minNodes run, then AllWorkersRunning.
    for running in range(1, max_nodes + 1):
        run_pod(op.emulator, worker(running - 1))
        await wait_phase(op.emulator, "Running" if running >= min_nodes else "Pending", nodes(f"{running}/{max_nodes}"))


def env_of(emulator: Emulator, pod: str) -> dict[str, str]:
    stored = emulator.get("pods", NS, pod)
    assert stored is not None
    return {e["name"]: e.get("value", "") for e in stored["spec"]["containers"][0].get("env", [])}


async def test_elastic_job_losing_a_worker_above_min_nodes_keeps_running(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator)
    await running_elastic_job(op, 2, 4)
    running_since = condition(get_job(emulator)["status"], "Running")["lastTransitionTime"]
    op.clock.advance(timedelta(minutes=10))

    emulator.delete("pods", NS, worker(3))  # its node is gone
    await emulator.wait_for(lambda: worker(3) in pod_set(emulator))
    await op.settle()
    status = get_job(emulator)["status"]
    assert counts(status) == ("Running", 0, 1, "3/4", (4, 4, 3, 0))
    assert condition(status, "Running")["reason"] == "ElasticMinimumRunning"
    run_pod(emulator, worker(3))
    status = await wait_phase(emulator, "Running", nodes("4/4"))
    assert counts(status) == ("Running", 0, 1, "4/4", (4, 4, 4, 0))
    assert conditions(status)["Running"] == ("True", "AllWorkersRunning")
    # The condition never flipped: `kubectl wait --for=condition=Running` sees one transition.
    assert condition(status, "Running")["lastTransitionTime"] == running_since
    # The replacement runs in a new attempt; the survivors keep theirs.
    await final_pods(op, {worker(0): "0", worker(1): "0", worker(2): "0", worker(3): "1"})
    # Running all along: no phase change; the loss is reported, uncounted.
    await expect_events(
        emulator, [("Normal", "WorkersPending"), ("Normal", "ElasticMinimumRunning"), ("Normal", "WorkerLost")]
    )
    assert job_events(emulator)[-1][2] == (
        "1 worker(s) disappeared or were deleted by someone else; replacing them in attempt 1, not counted "
        "against backoffLimit"
    )


async def test_elastic_job_below_min_nodes_restarts_and_runs_again(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator)
    await running_elastic_job(op, 2, 4)

    async with op.paused():  # three nodes lost at once: the operator sees one incident
        for i in (1, 2, 3):
            emulator.delete("pods", NS, worker(i))
        await emulator.wait_for(op.cache_is_current)
    status = await wait_phase(emulator, "Restarting")
    assert conditions(status)["Restarting"] == ("True", "NodesBelowMinimum")
    assert conditions(status)["Running"] == ("False", "NodesBelowMinimum")
    await expect_pods(emulator, {worker(0): "0", **{worker(i): "1" for i in (1, 2, 3)}})
    await op.settle()
    status = get_job(emulator)["status"]
    assert counts(status) == ("Restarting", 0, 1, "1/4", (4, 4, 1, 0))

    run_pod(emulator, worker(1))  # 2 of 4 run: minNodes again
    status = await wait_phase(emulator, "Running")
    assert condition(status, "Running")["reason"] == "ElasticMinimumRunning"
    assert status["nodes"] == "2/4"
    run_pods(emulator, worker(2), worker(3))
    status = await wait_phase(emulator, "Running", nodes("4/4"))
    assert counts(status) == ("Running", 0, 1, "4/4", (4, 4, 4, 0))
    assert conditions(status)["Running"] == ("True", "AllWorkersRunning")
    assert conditions(status)["Restarting"] == ("False", "NotRestarting")
    await final_pods(op, {worker(0): "0", **{worker(i): "1" for i in (1, 2, 3)}})
    await expect_events(
        emulator,
        [
            ("Normal", "WorkersPending"),
            ("Normal", "ElasticMinimumRunning"),
            ("Normal", "WorkerLost"),
            ("Warning", "NodesBelowMinimum"),
            ("Normal", "ElasticMinimumRunning"),
        ],
    )
    assert job_events(emulator)[2][2].startswith("3 worker(s) disappeared")


async def test_a_lost_worker_is_replaced_in_a_new_attempt(emulator: Emulator, run_operator: RunOperator) -> None:
    """docs/operator.md: never counted are "... node loss ... a pod deleted by someone ... Those workers are
    replaced, the attempt is bumped, restarts is not"; and only failures of the current attempt count."""
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, two_workers(**{"spec.backoffLimit": 0}))
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    run_pods(emulator, worker(0), worker(1))
    await wait_phase(emulator, "Running", nodes("2/2"))

    emulator.delete("pods", NS, worker(1))  # its node is gone
    await emulator.wait_for(lambda: worker(1) in pod_set(emulator))
    await op.settle()
    status = get_job(emulator)["status"]
    assert (status["restarts"], status["attempt"]) == (0, 1)
    assert pod_set(emulator) == {worker(0): "0", worker(1): "1"}
    # Worker 0 loses its peer: NCCL fails. The incident is the node loss, which never counts.
    exit_pod(emulator, worker(0), 1, message="torch.distributed.DistBackendError: NCCL error: remote process exited")
    await op.settle()
    status = get_job(emulator)["status"]
    assert (status["phase"], status["restarts"], status["attempt"]) == ("Restarting", 0, 1)
    await expect_pods(emulator, {worker(0): "1", worker(1): "1"})
    run_pods(emulator, worker(0), worker(1))
    status = await wait_phase(emulator, "Running", nodes("2/2"))
    assert counts(status) == ("Running", 0, 1, "2/2", (2, 2, 2, 0))
    await final_pods(op, {worker(0): "1", worker(1): "1"})
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


async def test_editing_max_nodes_scales_the_job(emulator: Emulator, run_operator: RunOperator) -> None:
    op = await start_operator(emulator, run_operator)
    await running_elastic_job(op, 2, 4)
    assert env_of(emulator, worker(0))["PET_NNODES"] == "2:4"

    emulator.patch(JOBS, NS, JOB, {"spec": {"elastic": {"maxNodes": 6}}})
    await expect_pods(emulator, {worker(i): "0" for i in range(6)})
    status = await wait_phase(emulator, "Running", lambda s: s.get("observedGeneration") == 2)
    assert counts(status) == ("Running", 0, 0, "4/6", (6, 6, 4, 0))
    assert condition(status, "Running")["reason"] == "ElasticMinimumRunning"
    # Newcomers get the new bounds; running workers keep theirs (a pod's environment cannot change).
    assert env_of(emulator, worker(5))["PET_NNODES"] == "2:6"
    assert env_of(emulator, worker(0))["PET_NNODES"] == "2:4"
    run_pods(emulator, worker(4), worker(5))
    await wait_phase(emulator, "Running", nodes("6/6"))

    emulator.hold_pod_deletion = True
    emulator.patch(JOBS, NS, JOB, {"spec": {"elastic": {"maxNodes": 2}}})
    # The highest-numbered go: they get SIGTERM and exit 143 while terminating, which is no failure.
    await emulator.wait_for(lambda: live_pods(emulator) == {worker(0): "0", worker(1): "0"})
    for i in (2, 3, 4, 5):
        exit_pod(emulator, worker(i), 143)
    await op.settle()
    for i in (2, 3, 4, 5):
        emulator.finish_pod_deletion(NS, worker(i))
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    status = await wait_phase(emulator, "Running", lambda s: s.get("observedGeneration") == 3)
    await op.settle()
    status = get_job(emulator)["status"]
    assert counts(status) == ("Running", 0, 0, "2/2", (2, 2, 2, 0))
    assert conditions(status)["Running"] == ("True", "AllWorkersRunning")
    deleted = [str(c.name) for c in emulator.calls("delete", "pods", succeeded=True)]
    assert sorted(deleted) == [worker(i) for i in (2, 3, 4, 5)]
    await final_pods(op, {worker(0): "0", worker(1): "0"})
    await expect_events(emulator, [("Normal", "WorkersPending"), ("Normal", "ElasticMinimumRunning")])


# --------------------------------------------------------------------------------------------
# Deadlines
# --------------------------------------------------------------------------------------------


async def test_max_duration_fails_the_job_with_deadline_exceeded(emulator: Emulator, run_operator: RunOperator) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, two_workers(**{"spec.maxDuration": "1h"}))
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    started = op.clock.now
    pod = emulator.get("pods", NS, worker(0))
    assert pod is not None
    assert pod["spec"]["activeDeadlineSeconds"] == 3600  # even a stopped operator cannot overrun
    run_pods(emulator, worker(0), worker(1))
    await wait_phase(emulator, "Running", nodes("2/2"))
    # The operator looks again by itself (the precise timer or the periodic resync, both real time).
    assert (NS, JOB) in op.controller.timers

    op.clock.advance(timedelta(minutes=30))
    emulator.delete("pods", NS, worker(1))  # node lost; its replacement gets what is left of maxDuration
    await emulator.wait_for(lambda: worker(1) in pod_set(emulator))
    pod = emulator.get("pods", NS, worker(1))
    assert pod is not None
    assert pod["spec"]["activeDeadlineSeconds"] == 1800
    assert pod["metadata"]["labels"][ATTEMPT] == "1"
    run_pod(emulator, worker(1))
    await wait_phase(emulator, "Running", nodes("2/2"))

    op.clock.advance(timedelta(minutes=29, seconds=59))
    await op.settle()
    assert get_job(emulator)["status"]["phase"] == "Running"

    op.clock.advance(timedelta(seconds=1))
    await op.trigger()
    status = await wait_phase(emulator, "Failed")
    failed = condition(status, "Failed")
    assert failed["reason"] == "DeadlineExceeded"
    assert failed["message"] == "the job ran longer than spec.maxDuration (1h)"
    assert status["startTime"] == stamp(started)
    assert status["completionTime"] == stamp(started + timedelta(hours=1))
    assert counts(status) == ("Failed", 0, 1, "0/0", (0, 0, 0, 0))  # attempt 1: the lost worker
    await final_pods(op, {})
    await expect_events(
        emulator,
        [
            ("Normal", "WorkersPending"),
            ("Normal", "AllWorkersRunning"),
            ("Normal", "WorkerLost"),
            ("Warning", "NodesBelowMinimum"),
            ("Normal", "AllWorkersRunning"),
            ("Warning", "DeadlineExceeded"),
        ],
    )


async def test_max_pending_fails_a_job_whose_workers_never_run(emulator: Emulator, run_operator: RunOperator) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, two_workers(**{"spec.maxPending": "10m"}))
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    run_pod(emulator, worker(0))  # one of the two needed: still Pending
    await wait_phase(emulator, "Pending", nodes("1/2"))

    op.clock.advance(timedelta(minutes=9, seconds=59))
    await op.settle()
    assert get_job(emulator)["status"]["phase"] == "Pending"

    op.clock.advance(timedelta(seconds=1))
    await op.trigger()
    status = await wait_phase(emulator, "Failed")
    failed = condition(status, "Failed")
    assert failed["reason"] == "PendingTimeout"
    assert failed["message"] == (
        "fewer than minNodes workers ran for spec.maxPending (10m): 1/2 workers running, need 2 (1 not scheduled yet)"
    )
    assert counts(status) == ("Failed", 0, 0, "0/0", (0, 0, 0, 0))
    await final_pods(op, {})
    await expect_events(emulator, [("Normal", "WorkersPending"), ("Warning", "PendingTimeout")])


# --------------------------------------------------------------------------------------------
# Suspend, Kueue, interactive debugging
# --------------------------------------------------------------------------------------------


async def test_suspend_deletes_the_workers_and_resume_starts_afresh(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator)
    # As Kueue's job integration wants them: created suspended, with a queue label.
    emulator.create(
        JOBS,
        two_workers(**{"spec.suspend": True, "spec.maxDuration": "1h", "metadata.labels": {QUEUE_LABEL: "team-a"}}),
    )
    status = await wait_phase(emulator, "Suspended")
    assert conditions(status)["Suspended"] == ("True", "Suspended")
    assert "startTime" not in status
    await op.settle()
    assert pod_set(emulator) == {}

    first_start = op.clock.advance(timedelta(minutes=5))
    emulator.patch(JOBS, NS, JOB, {"spec": {"suspend": False}})  # Kueue admits it
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    for i in (0, 1):
        pod = emulator.get("pods", NS, worker(i))
        assert pod is not None
        assert pod["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    run_pods(emulator, worker(0), worker(1))
    status = await wait_phase(emulator, "Running", nodes("2/2"))
    assert status["startTime"] == stamp(first_start)
    assert conditions(status)["Suspended"] == ("False", "NotSuspended")

    op.clock.advance(timedelta(minutes=30))
    emulator.patch(JOBS, NS, JOB, {"spec": {"suspend": True}})  # preempted by Kueue
    status = await wait_phase(emulator, "Suspended")
    assert "startTime" not in status
    assert counts(status) == ("Suspended", 0, 0, "0/0", (0, 0, 0, 0))
    await expect_pods(emulator, {})

    resumed = op.clock.advance(timedelta(minutes=30))
    emulator.patch(JOBS, NS, JOB, {"spec": {"suspend": False}})
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    run_pods(emulator, worker(0), worker(1))
    status = await wait_phase(emulator, "Running", nodes("2/2"))
    assert status["startTime"] == stamp(resumed)  # maxDuration counts from the resume
    pod = emulator.get("pods", NS, worker(0))
    assert pod is not None
    assert pod["spec"]["activeDeadlineSeconds"] == 3600
    op.clock.advance(timedelta(minutes=45))  # 1h45 after the first start, 45 min after the resume
    await op.settle()
    status = get_job(emulator)["status"]
    assert counts(status) == ("Running", 0, 0, "2/2", (2, 2, 2, 0))
    await final_pods(op, {worker(0): "0", worker(1): "0"})
    await expect_events(
        emulator,
        [
            ("Normal", "Suspended"),
            ("Normal", "WorkersPending"),
            ("Normal", "AllWorkersRunning"),
            ("Normal", "Suspended"),
            ("Normal", "WorkersPending"),
            ("Normal", "AllWorkersRunning"),
        ],
    )


async def test_interactive_debug_worker_is_replaced_when_it_exits(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, job_with({"spec.debug": {"interactive": True}}))
    await expect_pods(emulator, {worker(0): "0"})
    pod = emulator.get("pods", NS, worker(0))
    assert pod is not None
    command = pod["spec"]["containers"][0]["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    assert "sleep infinity" in command[2]
    assert "torchrun" not in json.dumps(pod["spec"]["containers"][0].get("args", []))
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")

    exit_pod(emulator, worker(0), 0)  # someone ran `kill 1` in it: not a finished training
    await expect_pods(emulator, {worker(0): "1"})
    status = get_job(emulator)["status"]
    assert status["phase"] != "Succeeded"
    assert (status["restarts"], status["attempt"]) == (0, 1)
    run_pod(emulator, worker(0))
    status = await wait_phase(emulator, "Running")
    assert counts(status) == ("Running", 0, 1, "1/1", (1, 1, 1, 0))
    assert "Succeeded" not in conditions(status)
    await final_pods(op, {worker(0): "1"})
    await expect_events(
        emulator,
        [
            ("Normal", "WorkersPending"),
            ("Normal", "AllWorkersRunning"),
            ("Normal", "WorkerReplaced"),
            ("Warning", "NodesBelowMinimum"),
            ("Normal", "AllWorkersRunning"),
        ],
    )


# --------------------------------------------------------------------------------------------
# Deletion and children that belong to someone else
# --------------------------------------------------------------------------------------------


async def test_deleting_a_running_job_waits_for_its_workers(emulator: Emulator, run_operator: RunOperator) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, two_workers())
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    run_pods(emulator, worker(0), worker(1))
    await wait_phase(emulator, "Running", nodes("2/2"))
    await expect_events(emulator, [("Normal", "WorkersPending"), ("Normal", "AllWorkersRunning")])

    emulator.hold_pod_deletion = True  # the workers take their time to stop
    assert emulator.delete(JOBS, NS, JOB) is not None  # held by the finalizer
    await emulator.wait_for(
        lambda: live_pods(emulator) == {} and len(pod_set(emulator)) == 2,
        message=lambda: f"both workers terminating; now {pod_set(emulator)}",
    )
    await op.settle()
    job = get_job(emulator)
    assert job["metadata"]["deletionTimestamp"]
    assert job["metadata"]["finalizers"] == [FINALIZER]
    assert sorted(str(c.name) for c in emulator.calls("delete", "pods", succeeded=True)) == [worker(0), worker(1)]

    emulator.finish_pod_deletion(NS, worker(0))
    await op.settle()
    assert get_job(emulator)["metadata"]["finalizers"] == [FINALIZER]  # worker 1 still stops

    emulator.finish_pod_deletion(NS, worker(1))
    await emulator.wait_for_absence(JOBS, NS, JOB)
    assert pod_set(emulator) == {}
    assert emulator.select("services", NS) == []
    assert emulator.select("configmaps", NS) == []
    # Deleting is no phase of the job: no event.
    assert event_reasons(emulator) == [("Normal", "WorkersPending"), ("Normal", "AllWorkersRunning")]


def foreign_pod(*, labelled: bool) -> Body:
    labels = {"app": "someone-else", **({JOB_LABEL: JOB} if labelled else {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": worker(0), "namespace": NS, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
    }


@pytest.mark.parametrize("labelled", [False, True], ids=["unlabelled", "with-the-job-label"])
async def test_a_foreign_pod_at_a_worker_name_fails_the_job(
    emulator: Emulator, run_operator: RunOperator, labelled: bool
) -> None:
    op = await start_operator(emulator, run_operator)
    squatter = emulator.create("pods", foreign_pod(labelled=labelled))
    emulator.create(JOBS, two_workers())
    status = await wait_phase(emulator, "Failed")
    failed = condition(status, "Failed")
    assert failed["reason"] == "ForeignObject"
    if labelled:
        assert failed["message"] == (
            f"pod {NS}/{worker(0)} carries this job's label but another owner; delete it or rename the job"
        )
    else:
        assert failed["message"] == (
            f"Pod {NS}/{worker(0)} already exists and is controlled by no controller, not this job; "
            "delete it or rename the job"
        )
    assert conditions(status)["Running"] == ("False", "ForeignObject")
    # The squatter is left exactly as it was; nothing of ours runs.
    await final_pods(op, {worker(0): None})
    assert emulator.get("pods", NS, worker(0)) == squatter
    assert not [c for c in emulator.calls(resource="pods") if c.write and c.name == worker(0)]
    await expect_events(emulator, [("Warning", "ForeignObject")])


# --------------------------------------------------------------------------------------------
# Data mounts
# --------------------------------------------------------------------------------------------


async def test_a_worker_killed_by_its_active_deadline_fails_the_job(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    """The kubelet enforces activeDeadlineSeconds even when the operator's clock has not got there."""
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, job_with({"spec.maxDuration": "2h"}))
    await expect_pods(emulator, {worker(0): "0"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")
    emulator.patch_status(
        "pods",
        NS,
        worker(0),
        {
            "phase": "Failed",
            "reason": "DeadlineExceeded",
            "message": "Pod was active on the node longer than the specified deadline",
        },
    )
    status = await wait_phase(emulator, "Failed")
    assert condition(status, "Failed")["reason"] == "DeadlineExceeded"
    assert counts(status)[:3] == ("Failed", 0, 0)
    await final_pods(op, {worker(0): "0"})
    await expect_events(
        emulator, [("Normal", "WorkersPending"), ("Normal", "AllWorkersRunning"), ("Warning", "DeadlineExceeded")]
    )


PENDING_AFTER = ["data became ready", "resumed", "lost workers"]


@pytest.mark.parametrize("after", PENDING_AFTER)
async def test_max_pending_counts_only_the_time_spent_waiting_for_nodes(
    emulator: Emulator, run_operator: RunOperator, after: str, s3: S3
) -> None:
    """maxPending counts from the latest of: stopped running, data became ready, resumed."""
    op = await start_operator(emulator, run_operator)
    changes: dict[str, Any] = {"spec.maxPending": "10m"}
    if after == "data became ready":
        # Listed only once its Secret exists (see test_datamounts.py): until then the job waits for data.
        changes["spec.dataMounts"] = [{"name": "data", "mountPath": "/data"}]
        source = {"spec.source": f"s3://{s3.bucket()}/prefix", "spec.endpoint": s3.endpoint}
        emulator.create(MOUNTS, with_changes(BASE_MOUNT, {**source, "spec.credentialsSecretRef": {"name": "s3"}}))
    elif after == "resumed":
        changes["spec.suspend"] = True
    emulator.create(JOBS, job_with(changes))
    if after == "lost workers":
        await expect_pods(emulator, {worker(0): "0"})
        run_pod(emulator, worker(0))
        await wait_phase(emulator, "Running")
    else:
        await wait_phase(emulator, "WaitingForData" if after == "data became ready" else "Suspended")

    op.clock.advance(timedelta(hours=1))  # an hour not waiting for nodes
    if after == "data became ready":
        emulator.create("secrets", secret("s3"))
    elif after == "resumed":
        emulator.patch(JOBS, NS, JOB, {"spec": {"suspend": False}})
    else:
        emulator.delete("pods", NS, worker(0))
    await emulator.wait_for(lambda: worker(0) in live_pods(emulator) and not _running(emulator, worker(0)))
    await wait_phase(emulator, "Restarting" if after == "lost workers" else "Pending")

    op.clock.advance(timedelta(minutes=9, seconds=59))
    await op.settle()
    assert get_job(emulator)["status"]["phase"] in ("Pending", "Restarting")
    op.clock.advance(timedelta(seconds=1))
    await op.trigger()
    status = await wait_phase(emulator, "Failed")
    assert condition(status, "Failed")["reason"] == "PendingTimeout"
    await final_pods(op, {})


def _running(emulator: Emulator, pod: str) -> bool:
    stored = emulator.get("pods", NS, pod)
    return stored is not None and stored.get("status", {}).get("phase") == "Running"


async def test_a_new_job_waits_for_the_pods_of_a_deleted_job_of_the_same_name(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, job_with({"spec.restartPolicy": "Never"}))
    await expect_pods(emulator, {worker(0): "0"})
    run_pod(emulator, worker(0))
    exit_pod(emulator, worker(0), 1)
    await wait_phase(emulator, "Failed")
    old_uid = get_job(emulator)["metadata"]["uid"]

    emulator.hold_pod_deletion = True  # the old worker takes its time to go
    emulator.delete(JOBS, NS, JOB)
    await emulator.wait_for_absence(JOBS, NS, JOB)  # no worker ran: the finalizer is released at once
    old = emulator.get("pods", NS, worker(0))
    assert old is not None
    assert old["metadata"]["deletionTimestamp"]  # collected with its owner, still terminating

    emulator.create(JOBS, job_with({"spec.restartPolicy": "Never"}))
    status = await wait_phase(emulator, "Pending")
    assert get_job(emulator)["metadata"]["uid"] != old_uid
    await op.settle()
    assert pod_set(emulator) == {worker(0): "0"}  # still the old one: the new job waits for the name
    assert get_job(emulator)["status"]["phase"] == "Pending"

    emulator.finish_pod_deletion(NS, worker(0))
    await emulator.wait_for(lambda: worker(0) in pod_set(emulator))
    pod = emulator.get("pods", NS, worker(0))
    assert pod is not None
    assert pod["metadata"]["ownerReferences"][0]["uid"] == get_job(emulator)["metadata"]["uid"]
    run_pod(emulator, worker(0))
    status = await wait_phase(emulator, "Running")
    assert counts(status) == ("Running", 0, 0, "1/1", (1, 1, 1, 0))
    await final_pods(op, {worker(0): "0"})
    await expect_events(emulator, [("Normal", "WorkersPending"), ("Normal", "AllWorkersRunning")])


async def test_a_stored_job_the_model_refuses_is_one_warning_and_can_be_deleted(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    """A job stored under an older, looser CRD (negative memory, accepted before issue 12) no longer
    parses: before, every reconcile raised, for ever, and its deletion hung on the finalizer. Now it
    gets one InvalidSpec warning naming the field, is left alone, and deleting it finishes."""
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, job_with({"spec.resources.memory": "1Ti"}))
    await expect_pods(emulator, {worker(0): "0"})
    old = get_job(emulator)
    stale = copy.deepcopy(old)
    stale["spec"]["resources"]["memory"] = "-1Gi"
    stale["metadata"]["generation"] = old["metadata"]["generation"] + 1
    emulator._commit(emulator.kind(JOBS), "MODIFIED", stale, old)  # what the older apiserver stored

    def invalid() -> list[str]:
        return [m for _, r, m in job_events(emulator) if r == "InvalidSpec"]

    await emulator.wait_for(lambda: bool(invalid()), message=lambda: f"an InvalidSpec event; {job_events(emulator)}")
    assert invalid()[0].startswith("its stored spec no longer parses (spec.resources.memory")
    assert invalid()[0].endswith("re-apply the DGXTrainingJob with a valid spec")
    await op.settle()
    assert len(invalid()) == 1
    assert live_pods(emulator) == {worker(0): "0"}  # left as it is

    emulator.delete(JOBS, NS, JOB)
    await emulator.wait_for_absence(JOBS, NS, JOB)


async def test_a_progress_report_with_nan_does_not_wedge_the_status(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    """A diverged loss (NaN) and an overflowing rate (Infinity) in worker 0's report: the status write
    used to carry them, which is not JSON, and the apiserver (and now the emulator, whose decoder is as
    strict) refused it on every pass. They are read as null; the rest of the report is mirrored."""
    await start_operator(emulator, run_operator)
    emulator.create(JOBS, job_with({}))
    await expect_pods(emulator, {worker(0): "0"})
    run_pods(emulator, worker(0))
    await wait_phase(emulator, "Running")
    report = '{"step": 12, "totalSteps": 100, "loss": NaN, "tokensPerSecond": Infinity}'
    emulator.patch("pods", NS, worker(0), {"metadata": {"annotations": {PROGRESS: report}}})
    status = await wait_phase(emulator, "Running", lambda s: (s.get("progress") or {}).get("step") == 12)
    assert status["progress"] == {"step": 12, "totalSteps": 100}


# --------------------------------------------------------------------------------------------
# Issue 13: a worker on a lost node; a trainer edit while suspended
# --------------------------------------------------------------------------------------------


async def test_a_lost_worker_is_replaced_and_a_trainer_edit_reaches_the_resumed_worker(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator)
    await lose_a_worker_then_edit_the_trainer(op)


async def test_a_namespace_being_deleted_does_not_loop_a_job_that_lost_a_worker(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    """The namespace controller deletes a running job's worker before the job: the replacement's
    create is refused (403 NamespaceTerminating). The operator must then write nothing: a status
    counting the worker it could not create made the next pass find it "lost", write again, and each
    write triggered the next pass (a hot loop seen in the cluster suite, starving other jobs)."""
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, with_changes(BASE_JOB, {"metadata.name": "going"}))
    await emulator.wait_for_object("pods", NS, worker(0, "going"))
    run_pod(emulator, worker(0, "going"))
    await wait_phase(emulator, "Running", name="going")
    await op.settle("going")

    def terminating(operation: str, kind: Any, new: Body, old: Body | None) -> None:
        if operation == "CREATE" and kind.plural in ("pods", "events"):
            name = new["metadata"].get("name", "")
            raise ApiError(
                403,
                "Forbidden",
                f'{kind.plural} "{name}" is forbidden: unable to create new content in namespace {NS} because it '
                "is being terminated",
                {"name": name, "kind": kind.plural, "causes": [{"reason": "NamespaceTerminating"}]},
            )

    writes = len(emulator.calls("patch", JOBS, subresource="status"))
    emulator.admission.append(terminating)
    try:
        emulator.delete("pods", NS, worker(0, "going"), grace_period=0)
        await emulator.wait_for(lambda: emulator.calls("create", "pods", succeeded=False), message="a refused create")
        await op.settle("going")
        await op.trigger("going")  # a resync: still nothing to write
        await op.settle("going")
        assert len(emulator.calls("patch", JOBS, subresource="status")) == writes
        # One create per pass this test asked for (two settles, one trigger): no pass of its own.
        assert len(emulator.calls("create", "pods", succeeded=False)) <= 3
    finally:
        emulator.admission.remove(terminating)
