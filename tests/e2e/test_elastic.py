"""Scenario 2: an elastic job on every fake GPU node (2-4) loses a worker to someone's
``kubectl delete pod``; the operator replaces it without counting a restart and the job stays Running.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.jobs import RUNNING_TIMEOUT, command_job, running_with, running_workers, wait_job
from tests.e2e.kubectl import Kubectl, dig, reasons, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3 * RUNNING_TIMEOUT + 300)]

#: Events the operator posts when a worker vanished or was disrupted (docs/operator.md).
NOT_COUNTED = {"WorkerLost", "WorkerDisrupted"}


def test_elastic_job_replaces_a_deleted_worker_without_counting_it(ns: Kubectl, cluster: Cluster) -> None:
    nodes = min(4, len(cluster.gpu_nodes))
    if nodes < 2:
        pytest.skip(f"an elastic job needs 2 fake GPU nodes; the cluster has {list(cluster.gpu_nodes)}")
    low = min(2, nodes - 1)  # one worker may go without dropping below minNodes
    ns.apply(command_job("elastic", min_nodes=low, max_nodes=nodes))
    job = wait_job(ns, "elastic", f"Running with {nodes}/{nodes} nodes", running_with(nodes))
    restarts, attempt = dig(job, "status", "restarts", default=0), dig(job, "status", "attempt", default=0)
    workers = running_workers(ns, "elastic")
    placement = {dig(p, "metadata", "name"): dig(p, "spec", "nodeName") for p in workers}
    assert len(set(placement.values())) == nodes, f"one worker per node expected: {placement}"
    env = {e["name"]: e.get("value") for e in dig(workers[0], "spec", "containers", 0, "env", default=[])}
    assert env.get("PET_NNODES") == f"{low}:{nodes}", env

    victim = f"elastic-worker-{nodes - 1}"
    before = ns.get("pod", victim)
    assert before is not None
    old_uid = dig(before, "metadata", "uid")
    ns.delete("pod", victim)

    phases: list[str] = []

    def replaced(j: dict[str, Any]) -> bool:
        pod = ns.get("pod", victim)
        # The replacement pod is created before the pass that created it writes the job's status,
        # so the job read first may still show the old attempt: wait for both.
        return (
            running_with(nodes)(j)
            and dig(j, "status", "attempt", default=0) > attempt
            and pod is not None
            and dig(pod, "metadata", "uid") != old_uid
            and not dig(pod, "metadata", "deletionTimestamp")
            and dig(pod, "status", "phase") == "Running"
        )

    job = wait_job(ns, "elastic", f"{victim} replaced and {nodes}/{nodes} Running again", replaced, seen=phases)
    assert set(phases) == {"Running"}, f"the job left Running while {nodes - 1} >= minNodes {low} workers ran: {phases}"
    status = job["status"]
    assert status.get("restarts", 0) == restarts, f"a deleted worker must not count against backoffLimit: {status}"
    assert status.get("attempt", 0) == attempt + 1, f"one lost worker, one new attempt: {status}"
    replacement = ns.get("pod", victim)
    assert replacement is not None
    assert int(dig(replacement, "metadata", "labels", "kubedgx.io/attempt")) > attempt

    def not_counted_event() -> list[str] | None:
        seen = reasons(ns.events_for("DGXTrainingJob", "elastic"))
        return seen if NOT_COUNTED & set(seen) else None

    seen = wait_for(f"a {' or '.join(sorted(NOT_COUNTED))} event on the job", not_counted_event, timeout=60)
    assert "WorkerRestarted" not in seen, seen  # the counted kind of restart
    assert "NodesBelowMinimum" not in seen, seen  # the Restarting phase's event
