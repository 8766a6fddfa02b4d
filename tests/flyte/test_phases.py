"""Every DGXTrainingJob phase -> the Flyte phase and message the console shows (the job's own
reason and message, not a bare "failed"), log links from the template, and a vanished job; which
failures Flyte may retry; a job that waits again after it was reported RUNNING; rank 0's log."""

from __future__ import annotations

from typing import Any

import pytest
from flyteidl.core.errors_pb2 import ContainerError
from flyteidl.core.execution_pb2 import TaskExecution

from dgx_operator.api.vocabulary import JOB, JobPhase, JobReason, reasons_of
from flytekitplugins.dgx.phases import (
    RAN_ANNOTATION,
    RETRYABLE,
    failure_phase,
    has_run,
    log_links,
    log_tail,
    no_log,
    status_of,
)


def job(phase: str | None, *conditions: tuple[str, str, str, str], **status: Any) -> dict[str, Any]:
    st: dict[str, Any] = dict(status)
    if phase:
        st["phase"] = phase
    st["conditions"] = [{"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions]
    return {"metadata": {"namespace": "ml", "name": "flyte-x"}, "status": st}


@pytest.mark.parametrize(
    ("obj", "phase", "words"),
    [
        (job(None), TaskExecution.QUEUED, "pending: the operator has not placed the workers yet"),
        (
            job("Pending", ("Running", "False", "WorkersPending", "0/1 workers running, need 1 (1 not scheduled yet)")),
            TaskExecution.QUEUED,
            "pending: WorkersPending: 0/1 workers running",
        ),
        (
            job(
                "Pending",
                (
                    "Running",
                    "False",
                    "Unschedulable",
                    "0/1 workers running, need 1: w-0: Unschedulable: 0/9 nodes are available",
                ),
            ),
            TaskExecution.WAITING_FOR_RESOURCES,
            "waiting for nodes: Unschedulable: ",
        ),
        (
            job("Pending", ("WorkersPending", "True", "QuotaExceeded", "exceeded quota: gpu")),
            TaskExecution.WAITING_FOR_RESOURCES,
            "waiting for quota: QuotaExceeded: exceeded quota: gpu",
        ),
        (
            job("Suspended", ("Suspended", "True", "Suspended", "spec.suspend is true")),
            TaskExecution.WAITING_FOR_RESOURCES,
            "suspended (spec.suspend): Suspended: spec.suspend",
        ),
        (
            job("Suspended", ("Suspended", "True", "Pending", "insufficient unused quota for nvidia.com/gpu")),
            TaskExecution.WAITING_FOR_RESOURCES,
            "queued by Kueue: Pending: insufficient unused quota for nvidia.com/gpu",
        ),
        (
            job("WaitingForData", ("DataReady", "False", "DataNotReady", "corpus: Syncing")),
            TaskExecution.INITIALIZING,
            "syncing data to the nodes: DataNotReady: corpus: Syncing",
        ),
        (
            job("Running", nodes="2/4", restarts=1, progress={"step": 40, "totalSteps": 100, "loss": 1.23456}),
            TaskExecution.RUNNING,
            "running: nodes 2/4, restarts 1, step 40/100, loss 1.235",
        ),
        (
            job("Restarting", ("Restarting", "True", "WorkerFailed", "w-1 exited with code 1"), restarts=2),
            TaskExecution.RUNNING,
            "restarting: WorkerFailed: w-1 exited with code 1 (restarts 2)",
        ),
        (
            job(
                "Succeeded",
                ("Succeeded", "True", "Completed", "worker 0 completed"),
                ("Archived", "True", "Archived", "2 artifacts"),
            ),
            TaskExecution.SUCCEEDED,
            "succeeded: Completed: worker 0 completed; Archived: 2 artifacts",
        ),
        (
            job("Failed", ("Failed", "True", "InvalidTrainerInput", "train.jsonl:3: 'output' is null")),
            TaskExecution.FAILED,
            "InvalidTrainerInput: train.jsonl:3: 'output' is null",
        ),
        (
            job("Failed", ("Failed", "True", "WorkerFailed", "flyte-x-worker-0 exited with code 137")),
            TaskExecution.RETRYABLE_FAILED,
            "WorkerFailed: flyte-x-worker-0 exited with code 137",
        ),
        (job("Failed"), TaskExecution.RETRYABLE_FAILED, "the job failed without a recorded reason"),
        (None, TaskExecution.FAILED, "the DGXTrainingJob is gone"),
    ],
)
def test_each_job_phase_maps_to_a_flyte_phase_with_the_job_s_words(obj: Any, phase: int, words: str) -> None:
    st = status_of(obj)
    assert (TaskExecution.Phase.Name(st.phase), words in st.message) == (TaskExecution.Phase.Name(phase), True), (
        st.message
    )


def test_a_failed_job_s_message_is_its_reason_and_message_with_no_prefix_of_the_connector_s() -> None:
    """Propeller puts "failed to run the job: " before it, flytekit locally "Failed to run the task ... with
    error: ": a "failed: " of the connector's own would say it twice."""
    st = status_of(job("Failed", ("Failed", "True", "NCCLTimeout", "rank 3: watchdog timed out")))
    assert (st.message, st.reason) == ("NCCLTimeout: rank 3: watchdog timed out", "NCCLTimeout")
    assert status_of(job("Failed")).message == "the job failed without a recorded reason"


def test_every_reason_a_job_fails_with_is_classified_retryable_or_not() -> None:
    """A reason added to the vocabulary fails this until someone decides whether a Flyte retry could help."""
    failed = set(reasons_of(JOB, JobPhase.FAILED))
    assert len(failed) > 10
    assert failed - set(RETRYABLE) == set(), "classify these in phases.RETRYABLE"
    assert set(RETRYABLE) - failed == set(), "not reasons of the Failed phase"


@pytest.mark.parametrize(
    ("reason", "phase"),
    [
        (JobReason.WORKER_FAILED, TaskExecution.RETRYABLE_FAILED),
        (JobReason.BACKOFF_LIMIT_EXCEEDED, TaskExecution.RETRYABLE_FAILED),
        (JobReason.NCCL_TIMEOUT, TaskExecution.RETRYABLE_FAILED),
        (JobReason.RENDEZVOUS_TIMEOUT, TaskExecution.RETRYABLE_FAILED),
        (JobReason.STALLED, TaskExecution.RETRYABLE_FAILED),
        (JobReason.DEADLINE_EXCEEDED, TaskExecution.RETRYABLE_FAILED),
        (JobReason.PENDING_TIMEOUT, TaskExecution.RETRYABLE_FAILED),
        (JobReason.OUT_OF_MEMORY, TaskExecution.FAILED),
        (JobReason.LOSS_DIVERGED, TaskExecution.FAILED),
        (JobReason.INVALID_TRAINER_INPUT, TaskExecution.FAILED),
        (JobReason.INVALID_SPEC, TaskExecution.FAILED),
        (JobReason.CREATE_REFUSED, TaskExecution.FAILED),
        (JobReason.FOREIGN_OBJECT, TaskExecution.FAILED),
        (JobReason.DATA_MOUNT_FAILED, TaskExecution.FAILED),
        (JobReason.INVALID_IMAGE_NAME, TaskExecution.FAILED),
        (JobReason.ERR_IMAGE_NEVER_PULL, TaskExecution.FAILED),
        ("SomeReasonOfANewerOperator", TaskExecution.RETRYABLE_FAILED),
        ("", TaskExecution.RETRYABLE_FAILED),
    ],
)
def test_a_failed_job_is_retryable_by_its_reason_when_the_function_left_no_error_pb(reason: str, phase: int) -> None:
    failed = job("Failed", ("Failed", "True", reason, "why")) if reason else job("Failed")
    names = (TaskExecution.Phase.Name(failure_phase(reason)), TaskExecution.Phase.Name(status_of(failed).phase))
    assert names == (TaskExecution.Phase.Name(phase),) * 2


@pytest.mark.parametrize("reason", sorted(RETRYABLE))
def test_the_error_pb_s_kind_decides_whatever_the_reason(reason: str) -> None:
    """As propeller decides for a container task: RECOVERABLE (FlyteRecoverableException, flytekit's system
    errors) is retried, NON_RECOVERABLE (any other exception) is not."""
    assert failure_phase(reason, ContainerError.RECOVERABLE) == TaskExecution.RETRYABLE_FAILED
    assert failure_phase(reason, ContainerError.NON_RECOVERABLE) == TaskExecution.FAILED


def ran(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as the connector leaves a job it has reported RUNNING."""
    obj["metadata"]["annotations"] = {RAN_ANNOTATION: "2026-05-01T10:00:00Z"}
    return obj


SUSPENDED_BY_USER = ("Suspended", "True", "Suspended", "spec.suspend is true: workers deleted, the job is kept")
PREEMPTED = ("Suspended", "True", "Preempted", "Preempted to accommodate a workload (UID: 1) due to prioritization")
UNSCHEDULABLE = ("Running", "False", "Unschedulable", "0/1 workers running, need 1: w-0: Unschedulable: 0/9 nodes")


@pytest.mark.parametrize(
    ("obj", "words"),
    [
        (job("Suspended", SUSPENDED_BY_USER), "suspended (spec.suspend): Suspended: spec.suspend is true"),
        (job("Suspended", PREEMPTED), "queued by Kueue: Preempted: Preempted to accommodate"),
        (job("Pending", UNSCHEDULABLE), "waiting for nodes: Unschedulable: "),
        (job("Pending", ("Running", "False", "WorkersPending", "0/1 workers running")), "pending: WorkersPending"),
        (job("Pending", ("WorkersPending", "True", "QuotaExceeded", "exceeded quota")), "waiting for quota: "),
        (job(None), "pending: the operator has not placed the workers yet"),
        (job("WaitingForData", ("DataReady", "False", "DataNotReady", "corpus: Syncing")), "syncing data"),
    ],
)
def test_a_job_reported_running_stays_running_when_it_waits_again_saying_why(obj: dict[str, Any], words: str) -> None:
    """Propeller sends a phase once per attempt: back to waiting, then to RUNNING again (not sent), Flyte would
    show the task waiting until it ends. The message (what pyflyte run shows) still says what the job does."""
    before = status_of(obj)
    assert before.phase != TaskExecution.RUNNING, "not reported RUNNING yet: waiting, as the job is"
    after = status_of(ran(obj))
    assert (TaskExecution.Phase.Name(after.phase), after.message) == ("RUNNING", before.message)
    assert words in after.message


def test_the_mark_changes_nothing_else() -> None:
    running = job("Running", nodes="1/1")
    assert status_of(ran(job("Running", nodes="1/1"))) == status_of(running)
    failed = job("Failed", ("Failed", "True", "WorkerFailed", "w-0 exited with code 1"))
    assert status_of(ran(job("Failed", ("Failed", "True", "WorkerFailed", "w-0 exited with code 1")))) == (
        status_of(failed)
    )
    succeeded = status_of(ran(job("Succeeded", ("Succeeded", "True", "Completed", "worker 0 completed"))))
    assert succeeded.phase == TaskExecution.SUCCEEDED
    assert (has_run(ran(job("Running"))), has_run(job("Running")), has_run(None)) == (True, False, False)


def test_log_tail_keeps_the_last_lines() -> None:
    text = "".join(f"step {i}\n" for i in range(250))
    assert log_tail(text) == [f"step {i}" for i in range(150, 250)]
    assert log_tail(text, 3) == ["step 247", "step 248", "step 249"]
    assert log_tail("", 10) == []
    assert log_tail("one\r\ntwo", 10) == ["one", "two"]


def test_no_log_says_why_in_one_line() -> None:
    gone = no_log("ml", "flyte-x-worker-0", "trainer", "pods", '404 pods "flyte-x-worker-0" not found')
    assert gone == (
        "no log: pod ml/flyte-x-worker-0 does not exist (its job has not created it yet, or the job ended or was "
        "deleted and its workers with it)"
    )
    # What a kube-apiserver answers for a pod on a kwok node (no kubelet serves its log).
    words = "404 the server could not find the requested resource ( pods/log flyte-x-worker-0)"
    assert no_log("ml", "flyte-x-worker-0", "trainer", "pods/log", words) == (
        f"no log of pod ml/flyte-x-worker-0, container trainer: {words}"
    )


def test_custom_info_carries_the_job_s_progress_and_where_it_is() -> None:
    st = status_of(job("Running", nodes="1/1", progress={"step": 3}))
    assert st.custom_info["job"] == "ml/flyte-x"
    assert st.custom_info["progress"] == {"step": 3}
    assert st.custom_info["phase"] == "Running"
    assert "usage" not in st.custom_info  # nothing placed yet


def test_custom_info_carries_the_job_s_gpu_hours_and_cost_not_the_accounting_state() -> None:
    usage = {
        "gpuSeconds": 57600,
        "gpuHours": "16.00",
        "cost": "28.80",
        "currency": "USD",
        "spotSavings": "0.00",
        "accountedUntil": "2026-12-05T10:00:00Z",
        "buckets": [{"capacity": "norm", "pricePerGpuHour": "1.80", "gpuSeconds": 57600}],
        "running": [],
    }
    st = status_of(job("Succeeded", usage=usage))
    assert st.custom_info["usage"] == {
        "gpuSeconds": 57600,
        "gpuHours": "16.00",
        "cost": "28.80",
        "currency": "USD",
        "spotSavings": "0.00",
    }


def test_log_links_one_per_worker_or_one_for_the_job_or_none() -> None:
    obj = job("Running", workers={"desired": 3})
    links = log_links(obj, "https://logs.example/{namespace}/{pod}")
    assert links == tuple((f"worker {i}", f"https://logs.example/ml/flyte-x-worker-{i}") for i in range(3))
    assert log_links(obj, "https://grafana.example/d/jobs?ns={namespace}&job={job}") == (
        ("kubedgx job", "https://grafana.example/d/jobs?ns=ml&job=flyte-x"),
    )
    assert log_links(obj, None) == ()
    assert status_of(obj, "https://logs.example/{pod}").log_links[0] == (
        "worker 0",
        "https://logs.example/flyte-x-worker-0",
    )
