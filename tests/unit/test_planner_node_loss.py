"""Node loss (issue 13.2): a worker stuck Terminating on a node whose kubelet is gone is treated as
gone. It is replaced under a name the stuck pod does not hold (its hostname, the rendezvous
address, stays), let go of ("<job>.detached") so it leaves the job's Service, never counted against
backoffLimit, and it does not hold up the job's deletion.

The same scenarios run on the real node lifecycle controller and taint manager in
tests/cluster/test_operator.py (test_a_worker_on_a_lost_node_is_replaced...).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from dgx_operator.reconcile.pods import STUCK_AFTER, PodView
from dgx_operator.render import BuildContext
from dgx_operator.render.names import JOB_LABEL
from tests.unit.planner_sim import (
    ATTEMPT,
    INDEX,
    T0,
    Sim,
    at,
    created_pods,
    event_reasons,
    respec,
    sim_of,
    start_running,
)

TAINT_MANAGER = "DeletionByTaintManager"


def lost(sim: Sim, index: int, **kw: Any) -> dict[str, Any]:
    """Worker ``index`` as the taint manager leaves it after its node stopped reporting: still
    Running (no kubelet writes its status), marked DisruptionTarget, deletionTimestamp set."""
    return sim.pod(index, "running", terminating=T0 + timedelta(seconds=100), disruption_target=TAINT_MANAGER, **kw)


def detached(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod after the operator relabelled it (what its watch then reports)."""
    labels = {**pod["metadata"]["labels"], JOB_LABEL: "job.detached"}
    return {**pod, "metadata": {**pod["metadata"], "labels": labels}}


def test_a_worker_the_taint_manager_is_deleting_is_replaced_at_once_under_a_free_name(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2}})
    running = start_running(sim, 2)
    stuck = lost(sim, 1)
    result = sim.reconcile([running[0], stuck], at_s=120)
    assert result.detach == ["job-worker-1"]
    (replacement,) = created_pods(result)
    assert replacement["metadata"]["name"] == "job-worker-1-1"
    assert replacement["metadata"]["labels"][INDEX] == "1"
    assert replacement["metadata"]["labels"][ATTEMPT] == "1"
    # The rendezvous address of worker 1 does not move.
    assert (replacement["spec"]["hostname"], replacement["spec"]["subdomain"]) == ("job-worker-1", "job")
    assert "WorkerLost" in event_reasons(result)
    assert (sim.status.restarts, sim.status.attempt) == (0, 1)
    assert result.delete == []  # it is being deleted already; nothing more to ask


def test_once_let_go_of_the_stuck_pod_is_neither_counted_nor_replaced_again(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2}, "spec.backoffLimit": 0})
    running = start_running(sim, 2)
    stuck = lost(sim, 1)
    sim.reconcile([running[0], stuck], at_s=120)
    (made,) = sim.made("running")
    made["metadata"]["name"] = "job-worker-1-1"
    after = sim.reconcile([running[0], detached(stuck), made], at_s=130)
    assert (after.create, after.delete, after.detach) == ([], [], [])
    assert event_reasons(after) == ["AllWorkersRunning"]  # back from Restarting, nothing counted
    assert sim.phase() == "Running"
    assert sim.workers().active == 2
    assert (sim.status.restarts, sim.status.attempt) == (0, 1)
    # The replacement fails later: its own replacement takes neither stuck name, and the failure
    # counts (backoffLimit 0 ends the job).
    failed = sim.pod(1, "failed", attempt=1, name="job-worker-1-1")
    end = sim.reconcile([running[0], detached(stuck), failed], at_s=200)
    assert sim.phase() == "Failed", event_reasons(end)


def test_a_replacement_never_takes_a_name_a_detached_pod_holds(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 1, "maxNodes": 1}})
    start_running(sim, 1)
    first = detached(lost(sim, 0))  # job-worker-0, attempt 0
    second = detached(lost(sim, 0, attempt=1, name="job-worker-0-1"))
    sim.job = sim.job.model_copy(update={"status": sim.status.model_copy(update={"attempt": 1})})
    result = sim.reconcile([first, second], at_s=300)
    (replacement,) = created_pods(result)
    assert replacement["metadata"]["name"] == "job-worker-0-2"
    assert replacement["spec"]["hostname"] == "job-worker-0"


def test_a_pod_past_its_grace_period_counts_as_gone_only_after_the_margin(ctx: BuildContext) -> None:
    """Without a DisruptionTarget (someone deleted it, or the operator itself did, on a node that
    then died) only time tells: a live kubelet removes a pod within seconds of its grace period."""
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 1, "maxNodes": 1}})
    start_running(sim, 1)
    end_of_grace = at(100)
    deleting = sim.pod(0, "running", terminating=end_of_grace)
    waiting = sim.reconcile([deleting], at_s=110)
    assert (created_pods(waiting), waiting.detach) == ([], [])
    assert waiting.requeue_after is not None
    assert waiting.requeue_after <= (end_of_grace + STUCK_AFTER - at(110)).total_seconds()
    gone = sim.reconcile([deleting], at_s=(end_of_grace + STUCK_AFTER - T0).total_seconds())
    assert gone.detach == ["job-worker-0"]
    assert [p["metadata"]["name"] for p in created_pods(gone)] == ["job-worker-0-1"]
    assert sim.status.restarts == 0


def test_deleting_a_job_does_not_wait_for_a_worker_on_a_lost_node(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2}})
    running = start_running(sim, 2)
    sim.job = respec(sim.job, {"metadata.deletionTimestamp": "2025-03-01T13:00:00Z"}, bump=False)
    first = sim.reconcile([running[0], lost(sim, 1)], at_s=200)
    assert first.delete == ["job-worker-0"]
    assert first.release_finalizer is False  # worker 0's kubelet is alive: it stops it
    done = sim.reconcile([lost(sim, 1)], at_s=210)
    assert done.release_finalizer is True
    assert done.detach == ["job-worker-1"]


def test_a_finished_pod_being_deleted_is_never_stuck(ctx: BuildContext) -> None:
    """The apiserver removes a Failed or Succeeded pod without a grace period: it cannot hang."""
    sim = sim_of(ctx)
    view = PodView.of(sim.pod(0, "failed", terminating=at(0), disruption_target=TAINT_MANAGER))
    assert view.gone(at(3600)) is False
    running = PodView.of(sim.pod(0, "running", terminating=at(0)))
    assert running.gone(at(59)) is False
    assert running.gone(at(60)) is True
