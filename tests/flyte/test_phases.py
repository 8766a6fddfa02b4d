"""Every DGXTrainingJob phase -> the Flyte phase and message the console shows (the job's own
reason and message, not a bare "failed"), log links from the template, and a vanished job."""

from __future__ import annotations

from typing import Any

import pytest
from flyteidl.core.execution_pb2 import TaskExecution

from flytekitplugins.dgx.phases import log_links, status_of


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
            "failed: InvalidTrainerInput: train.jsonl:3: 'output' is null",
        ),
        (job("Failed"), TaskExecution.FAILED, "failed: no reason recorded"),
        (None, TaskExecution.FAILED, "the DGXTrainingJob is gone"),
    ],
)
def test_each_job_phase_maps_to_a_flyte_phase_with_the_job_s_words(obj: Any, phase: int, words: str) -> None:
    st = status_of(obj)
    assert (TaskExecution.Phase.Name(st.phase), words in st.message) == (TaskExecution.Phase.Name(phase), True), (
        st.message
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
