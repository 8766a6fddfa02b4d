"""Scenario 3: ``spec.suspend: true`` deletes the workers and keeps the job (Suspended); ``false``
brings new workers and the job back to Running, with a fresh start time (what Kueue relies on)."""

from __future__ import annotations

import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.jobs import (
    RUNNING_TIMEOUT,
    command_job,
    condition_true,
    running_with,
    running_workers,
    wait_job,
    worker_pods,
)
from tests.e2e.kubectl import JOBS, Kubectl, dig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3 * RUNNING_TIMEOUT + 300)]


def test_suspend_deletes_the_workers_and_resume_recreates_them(ns: Kubectl, cluster: Cluster) -> None:
    nodes = min(2, len(cluster.gpu_nodes))
    ns.apply(command_job("pausable", min_nodes=nodes, max_nodes=nodes))
    job = wait_job(ns, "pausable", f"Running with {nodes}/{nodes} nodes", running_with(nodes))
    first_start = dig(job, "status", "startTime")
    first_pods = {dig(p, "metadata", "uid") for p in running_workers(ns, "pausable")}
    assert first_start
    assert len(first_pods) == nodes

    ns.patch(JOBS, "pausable", {"spec": {"suspend": True}})
    job = wait_job(
        ns,
        "pausable",
        "phase Suspended and every worker pod gone",
        lambda j: dig(j, "status", "phase") == "Suspended" and not worker_pods(ns, "pausable"),
    )
    assert condition_true(job, "Suspended"), dig(job, "status", "conditions")
    assert not condition_true(job, "Running"), dig(job, "status", "conditions")
    assert not dig(job, "status", "startTime"), "a suspended job has no start time (maxDuration restarts on resume)"
    assert dig(job, "status", "workers", "desired", default=0) == 0, dig(job, "status")
    assert dig(job, "metadata", "deletionTimestamp") is None  # the job itself is kept

    ns.patch(JOBS, "pausable", {"spec": {"suspend": False}})
    job = wait_job(ns, "pausable", f"Running again with {nodes}/{nodes} nodes", running_with(nodes))
    assert not condition_true(job, "Suspended"), dig(job, "status", "conditions")
    second_pods = {dig(p, "metadata", "uid") for p in running_workers(ns, "pausable")}
    assert len(second_pods) == nodes
    assert not first_pods & second_pods, "resume must create new workers"
    second_start = dig(job, "status", "startTime")
    assert second_start
    assert second_start >= first_start, (first_start, second_start)  # RFC 3339 UTC strings sort by time
    assert dig(job, "status", "restarts", default=0) == 0, "suspend and resume are not failures"
