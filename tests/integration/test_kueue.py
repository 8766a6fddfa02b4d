"""Kueue's side of a DGXTrainingJob in the fast layer.

With the operator's Kueue integration off (``KUBEDGX_KUEUE=0``, chart value ``kueue.enabled: false``), something
else plays Kueue through ``spec.suspend`` (the test here): a job created with ``spec.suspend: true`` and a
``kueue.x-k8s.io/queue-name`` label waits, Suspended, without pods, until it is admitted by setting
``spec.suspend: false``; its workers then carry the job's ``kueue.x-k8s.io/`` labels (and no other label of the
job); preemption (``suspend: true`` again) deletes the workers and keeps the job; a queue change while suspended
reaches the next workers; the job's conditions say where it stands at every step.

With the integration on and no Kueue API served, a queued job says so (``KueueNotInstalled``). The integration
itself, against a real Kueue, is tests/cluster/test_kueue.py (docs/kueue.md).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.conftest import RunOperator
from tests.integration.emulator import Emulator
from tests.integration.scenarios import (
    JOBS,
    NS,
    Body,
    conditions,
    counts,
    exit_pod,
    expect_events,
    expect_pods,
    final_pods,
    get_job,
    nodes,
    pod_set,
    run_pods,
    start_operator,
    two_workers,
    wait_phase,
    worker,
)

pytestmark = pytest.mark.asyncio

QUEUE = "kueue.x-k8s.io/queue-name"
PRIORITY = "kueue.x-k8s.io/priority-class"


def labels_of(emulator: Emulator, pod: str) -> dict[str, str]:
    stored = emulator.get("pods", NS, pod)
    assert stored is not None, f"pod {pod} does not exist"
    labels: dict[str, str] = stored["metadata"]["labels"]
    return labels


def kueue_labels(emulator: Emulator, pod: str) -> dict[str, str]:
    return {k: v for k, v in labels_of(emulator, pod).items() if k.startswith("kueue.x-k8s.io/")}


def state(status: Body) -> dict[str, tuple[str, str]]:
    """The conditions Kueue and `kubectl wait` look at: type -> (status, reason)."""
    found = conditions(status)
    return {t: found[t] for t in ("Running", "Restarting", "Suspended", "Succeeded") if t in found}


async def kueue_sets_suspend(emulator: Emulator, suspend: bool) -> None:
    emulator.patch(JOBS, NS, "job", {"spec": {"suspend": suspend}})


async def test_kueue_admits_preempts_and_readmits_a_suspended_job(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator)
    labels: dict[str, Any] = {QUEUE: "q", PRIORITY: "research", "team": "vision"}
    emulator.create(JOBS, two_workers(**{"spec.suspend": True, "metadata.labels": labels}))

    # Queued: Suspended, no workers, nothing started.
    status = await wait_phase(emulator, "Suspended")
    assert state(status) == {
        "Running": ("False", "Suspended"),
        "Restarting": ("False", "NotRestarting"),
        "Suspended": ("True", "Suspended"),
    }
    assert "startTime" not in status
    await op.settle()
    assert pod_set(emulator) == {}

    # Admitted: the workers start and carry the job's Kueue labels, and only those.
    await kueue_sets_suspend(emulator, False)
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    for i in (0, 1):
        assert kueue_labels(emulator, worker(i)) == {QUEUE: "q", PRIORITY: "research"}
        assert "team" not in labels_of(emulator, worker(i))
    status = await wait_phase(emulator, "Pending")
    assert state(status)["Suspended"] == ("False", "NotSuspended")
    assert status["startTime"]
    run_pods(emulator, worker(0), worker(1))
    status = await wait_phase(emulator, "Running", nodes("2/2"))
    assert state(status)["Running"] == ("True", "AllWorkersRunning")

    # Preempted: the workers go, the job stays, suspended, with its count of restarts untouched.
    await kueue_sets_suspend(emulator, True)
    status = await wait_phase(emulator, "Suspended")
    assert counts(status) == ("Suspended", 0, 0, "0/0", (0, 0, 0, 0))
    assert state(status)["Suspended"] == ("True", "Suspended")
    assert state(status)["Running"] == ("False", "Suspended")
    assert "startTime" not in status
    await expect_pods(emulator, {})

    # Moved to another queue while suspended (Kueue allows it), then admitted there.
    emulator.patch(JOBS, NS, "job", {"metadata": {"labels": {QUEUE: "q-large"}}})
    await kueue_sets_suspend(emulator, False)
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    for i in (0, 1):
        assert kueue_labels(emulator, worker(i)) == {QUEUE: "q-large", PRIORITY: "research"}
    run_pods(emulator, worker(0), worker(1))
    await wait_phase(emulator, "Running", nodes("2/2"))

    # Finished: Kueue releases the quota on the Succeeded condition.
    exit_pod(emulator, worker(0), 0)
    status = await wait_phase(emulator, "Succeeded")
    assert state(status)["Succeeded"] == ("True", "Completed")
    assert state(status)["Suspended"] == ("False", "NotSuspended")
    await final_pods(op, {worker(0): "0"})
    assert get_job(emulator)["metadata"]["labels"] == {**labels, QUEUE: "q-large"}
    await expect_events(
        emulator,
        [
            ("Normal", "Suspended"),
            ("Normal", "WorkersPending"),
            ("Normal", "AllWorkersRunning"),
            ("Normal", "Suspended"),
            ("Normal", "WorkersPending"),
            ("Normal", "AllWorkersRunning"),
            ("Normal", "Completed"),
        ],
    )


# -- the operator's own integration (reconcile.queueing) where no Kueue is installed ------------------


async def test_a_queued_job_on_a_cluster_without_kueue_says_so_and_never_starts(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    """The integration on (KUBEDGX_KUEUE), the queue label set, and no kueue.x-k8s.io API served: the
    job waits Suspended with a condition that names the label and the fix, instead of silently."""
    from dgx_operator.controllers.job import KueueSettings

    op = await start_operator(emulator, run_operator)
    op.controller.kueue = KueueSettings()
    emulator.create(JOBS, two_workers(**{"metadata.labels": {QUEUE: "team-a"}}))
    status = await wait_phase(emulator, "Suspended")
    reason, message = next((c["reason"], c["message"]) for c in status["conditions"] if c["type"] == "Suspended")
    assert reason == "KueueNotInstalled"
    assert "kueue.x-k8s.io/queue-name" in message
    assert "'team-a'" in message
    assert "install Kueue, or remove the label" in message
    await op.settle()
    assert pod_set(emulator) == {}

    # Without the label the same operator runs the job at once: only queued jobs wait for Kueue.
    emulator.patch(JOBS, NS, "job", {"metadata": {"labels": {QUEUE: None}}})
    await wait_phase(emulator, "Pending")
    await op.settle()
    assert len(pod_set(emulator)) == 2
