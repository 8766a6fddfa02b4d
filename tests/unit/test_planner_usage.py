"""GPU-hours and cost through the planner (issue 31, reconcile/planner/accounting.py): every pass
carries status.usage to now from the job's pods; restarts, reclaims, elastic changes, suspend and
resume, spot against norm and a price edit; and how often usage alone is written (never at the pace
of the counts in flight).

Pods are the builders' own with the scheduler's binding time set; the default catalog's example
prices: a100.80g norm 1.80, spot 0.70 per GPU-hour.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from dgx_operator.catalog import Catalog
from dgx_operator.render import BuildContext
from tests.unit.planner_sim import T0, Sim, at, created, event_reasons, make_ctx, sim_of

NORM = Decimal("1.80")
SPOT = Decimal("0.70")
GPUS = 8  # dgxa100.80g.8.*


def stamp(seconds: float) -> str:
    return at(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


def bound(pod: dict[str, Any], at_s: float, *, uid: str | None = None) -> dict[str, Any]:
    """``pod`` as the scheduler bound it at ``T0 + at_s`` (PodScheduled True's transition time)."""
    conditions = [dict(c) for c in pod["status"].get("conditions") or []]
    for c in conditions:
        if c["type"] == "PodScheduled" and c["status"] == "True":
            c["lastTransitionTime"] = stamp(at_s)
    pod["status"]["conditions"] = conditions
    if uid is not None:
        pod["metadata"]["uid"] = uid
    return pod


def ended(pod: dict[str, Any], at_s: float) -> dict[str, Any]:
    for c in pod["status"].get("containerStatuses") or []:
        if "terminated" in c["state"]:
            c["state"]["terminated"]["finishedAt"] = stamp(at_s)
    return pod


def running(sim: Sim, workers: int, since: float, **kw: Any) -> list[dict[str, Any]]:
    """Workers 0.. of the first attempt (their uids pod-<i>-0), running since ``since``."""
    kw.setdefault("attempt", 0)
    return [bound(sim.pod(i, "running", **kw), since) for i in range(workers)]


def hours(gpu_seconds: int) -> Decimal:
    return Decimal(gpu_seconds) / 3600


def usage(sim: Sim) -> Any:
    assert sim.status.usage is not None
    return sim.status.usage


def started(ctx: BuildContext, workers: int = 2, **changes: Any) -> Sim:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 1, "maxNodes": workers}, **changes})
    assert created(sim.reconcile(at_s=0)) == list(range(workers))
    assert sim.status.usage is None  # nothing placed yet: nothing used
    return sim


def test_running_workers_are_counted_from_their_binding(ctx: BuildContext) -> None:
    sim = started(ctx)
    sim.reconcile(running(sim, 2, since=10), at_s=70)
    u = usage(sim)
    assert u.gpu_seconds == 2 * GPUS * 60
    assert u.accounted_until == at(70)
    assert u.cost == str((hours(2 * GPUS * 60) * NORM).quantize(Decimal("0.01")))
    assert u.currency == "USD"
    assert u.example_prices is True
    assert u.spot_savings == "0.00"
    assert {h.pod for h in u.running} == {"pod-0-0", "pod-1-0"}
    assert [(b.capacity, b.price_per_gpu_hour, b.gpu_seconds) for b in u.buckets] == [("norm", "1.80", 960)]


def test_a_restart_counts_the_failed_worker_and_its_replacement(ctx: BuildContext) -> None:
    sim = started(ctx, **{"spec.restartPolicy": "OnFailure", "spec.backoffLimit": 3})
    sim.reconcile(running(sim, 2, since=10), at_s=60)
    failed = ended(bound(sim.pod(1, "failed"), 10), 100)
    sim.reconcile([bound(sim.pod(0, "running", attempt=0), 10), failed], at_s=110)
    assert sim.status.restarts == 1
    # worker 0: 10..110; the failed worker 1: 10..100 (its container's end)
    assert usage(sim).gpu_seconds == GPUS * (100 + 90)
    replacement = bound(sim.pod(1, "running", attempt=1), 120, uid="pod-1-1")
    sim.reconcile([bound(sim.pod(0, "running", attempt=0), 10), replacement], at_s=180)
    assert usage(sim).gpu_seconds == GPUS * (170 + 90 + 60)


def test_a_reclaimed_spot_worker_counts_until_its_grace_period_ends(ctx: BuildContext) -> None:
    sim = started(ctx, **{"spec.instance": "dgxa100.80g.8.spot"})
    sim.reconcile(running(sim, 2, since=0), at_s=30)
    grace_end = at(150)
    reclaimed = bound(sim.pod(1, "running", terminating=grace_end, attempt=0), 0)
    sim.reconcile([bound(sim.pod(0, "running", attempt=0), 0), reclaimed], at_s=60)
    assert usage(sim).gpu_seconds == 2 * GPUS * 60
    assert any(h.pod == "pod-1-0" for h in usage(sim).running)  # still on its node
    # It vanished after its grace period: the next pass charges it until its deletionTimestamp said.
    sim.reconcile([bound(sim.pod(0, "running", attempt=0), 0)], at_s=200)
    # Gone before the next pass: charged until its grace period ended (the status kept that end).
    assert usage(sim).gpu_seconds == GPUS * 200 + GPUS * 150
    u = usage(sim)
    assert [b.capacity for b in u.buckets] == ["spot"]
    saved = hours(u.gpu_seconds) * (NORM - SPOT)
    assert Decimal(u.spot_savings) == saved.quantize(Decimal("0.01"))


def test_elastic_node_counts_changing(ctx: BuildContext) -> None:
    sim = started(ctx, workers=5)
    waiting = [sim.pod(i, "unscheduled", attempt=0) for i in (3, 4)]
    sim.reconcile(running(sim, 3, since=0) + waiting, at_s=60)  # 3 of 5 run
    assert usage(sim).gpu_seconds == 3 * GPUS * 60
    sim.reconcile(running(sim, 5, since=0)[:3] + running(sim, 5, since=60)[3:], at_s=120)  # 5
    assert usage(sim).gpu_seconds == 3 * GPUS * 120 + 2 * GPUS * 60
    two = [ended(bound(sim.pod(i, "succeeded", attempt=0), 0 if i == 2 else 60), 150) for i in (2, 3, 4)]
    sim.reconcile(running(sim, 2, since=0) + two, at_s=180)  # 3 finished their share at 150
    assert usage(sim).gpu_seconds == 2 * GPUS * 180 + GPUS * 150 + 2 * GPUS * 90
    assert sim.status.attempt == 0  # nothing was lost on the way


def test_suspend_and_resume_count_nothing_while_held(ctx: BuildContext) -> None:
    sim = started(ctx)
    pods = running(sim, 2, since=0)
    sim.reconcile(pods, at_s=60)
    sim.respec({"spec.suspend": True})
    sim.reconcile([bound(sim.pod(i, "running", terminating=at(70)), 0) for i in range(2)], at_s=65)
    gone = [ended(bound(sim.pod(i, "failed", terminating=at(70)), 0), 68) for i in range(2)]
    sim.reconcile(gone, at_s=69)
    held = usage(sim)
    assert held.gpu_seconds == 2 * GPUS * 68
    assert held.running == []
    sim.reconcile([], at_s=3600)  # an hour suspended
    assert usage(sim) == held  # nothing on a node: not even the watermark moves
    sim.respec({"spec.suspend": False})
    sim.reconcile([], at_s=3700)
    sim.reconcile([bound(sim.pod(i, "running", attempt=sim.status.attempt), 3710, uid=f"r{i}") for i in range(2)],
                  at_s=3770)  # fmt: skip
    assert usage(sim).gpu_seconds == 2 * GPUS * 68 + 2 * GPUS * 60


def test_kueue_admitting_a_norm_instance_on_spot_is_paid_as_spot(ctx: BuildContext) -> None:
    """The pod's capacity annotation (the pool its node selector names) decides the price."""
    sim = started(ctx)
    pods = running(sim, 2, since=0)
    for p in pods:
        p["metadata"]["annotations"]["kubedgx.io/capacity"] = "spot"
    sim.reconcile(pods, at_s=3600)
    u = usage(sim)
    assert [(b.capacity, b.price_per_gpu_hour, b.reference_price_per_gpu_hour) for b in u.buckets] == [
        ("spot", "0.70", "1.80")
    ]
    assert Decimal(u.cost) == 2 * GPUS * SPOT
    assert Decimal(u.spot_savings) == 2 * GPUS * (NORM - SPOT)


def test_a_price_edit_applies_from_the_next_pass_and_never_reprices_the_past(catalog: Catalog) -> None:
    sim = started(make_ctx(catalog))
    sim.reconcile(running(sim, 1, since=0) + running(sim, 2, since=0)[1:], at_s=3600)
    raw = catalog.spec.model_dump(by_alias=True, mode="json")
    raw["pricing"]["perGpuHour"]["a100.80g"]["norm"] = "2.40"
    sim.ctx = make_ctx(Catalog.from_mapping(raw))  # the operator restarted with the edited catalog
    sim.reconcile(running(sim, 2, since=0), at_s=7200)  # this hour was run at the old price still
    sim.reconcile(running(sim, 2, since=0), at_s=10800)  # this one at the new one
    u = usage(sim)
    assert [(b.price_per_gpu_hour, b.gpu_seconds) for b in u.buckets] == [
        ("1.80", 2 * GPUS * 7200),
        ("2.40", 2 * GPUS * 3600),
    ]
    assert Decimal(u.cost) == 2 * GPUS * (2 * NORM + Decimal("2.40"))


def test_no_prices_counts_gpu_hours_only(catalog: Catalog) -> None:
    raw = catalog.spec.model_dump(by_alias=True, mode="json")
    raw.pop("pricing")
    sim = started(make_ctx(Catalog.from_mapping(raw)))
    sim.reconcile(running(sim, 2, since=0), at_s=1800)
    u = usage(sim)
    assert u.gpu_hours == "8.00"
    assert u.cost is None
    assert u.currency is None
    assert u.spot_savings is None


# --- how often usage alone is written -----------------------------------------------------------------


def test_usage_alone_is_written_once_per_usage_interval(ctx: BuildContext) -> None:
    sim = started(ctx)
    sim.status_interval = 10.0
    sim.usage_interval = 300.0
    pods = running(sim, 2, since=5)
    sim.reconcile(pods, at_s=10)  # Running: a transition, written with its usage
    writes = sim.writes
    first = usage(sim).gpu_seconds
    plan = sim.reconcile(pods, at_s=40)
    assert sim.writes == writes
    assert usage(sim).gpu_seconds == first
    assert plan.requeue_after is not None
    assert plan.requeue_after <= 270
    for t in range(70, 310, 30):  # passes every 30 s (progress reads) that change nothing else
        sim.reconcile(pods, at_s=t)
    assert sim.writes == writes
    sim.reconcile(pods, at_s=310)  # the last write is 300 s old
    assert sim.writes == writes + 1
    assert usage(sim).gpu_seconds == 2 * GPUS * 305


def test_usage_rides_along_with_a_write_made_anyway(ctx: BuildContext) -> None:
    sim = started(ctx)
    sim.status_interval = 10.0
    pods = running(sim, 2, since=0)
    sim.reconcile(pods, at_s=10)
    writes = sim.writes
    sim.reconcile(pods, at_s=40, progress={"event": "progress", "step": 5, "total_steps": 100})
    assert sim.writes == writes + 1
    assert usage(sim).gpu_seconds == 2 * GPUS * 40


def test_a_running_job_is_woken_to_write_its_usage(ctx: BuildContext) -> None:
    """A program that prints no progress sends no events: the plan still asks to be woken."""
    sim = started(ctx)
    plan = sim.reconcile(running(sim, 2, since=0), at_s=10)
    assert plan.requeue_after is not None
    assert plan.requeue_after <= sim.usage_interval


def test_the_end_of_a_run_is_written_at_once_with_one_summary_event(ctx: BuildContext) -> None:
    sim = started(ctx)
    sim.status_interval = 10.0
    sim.reconcile(running(sim, 2, since=0), at_s=10)
    done = [ended(bound(sim.pod(i, "succeeded"), 0), 3600) for i in range(2)]
    result = sim.reconcile(done, at_s=3605)
    assert sim.phase() == "Succeeded"
    u = usage(sim)
    assert u.gpu_seconds == 2 * GPUS * 3600
    assert u.running == []
    assert u.cost == "28.80"  # 16 GPU-hours x 1.80
    summary = [e.message for e in result.events if e.reason == "Usage"]
    assert summary == ["used 16.00 GPU-hours on norm, 28.80 USD at the catalog's example prices"]
    writes = sim.writes
    again = sim.reconcile(done, at_s=4000)
    assert "Usage" not in event_reasons(again)
    assert sim.writes == writes


def test_a_job_ending_while_workers_still_hold_nodes_summarizes_when_they_let_go(ctx: BuildContext) -> None:
    sim = started(ctx, **{"spec.maxDuration": "1h"})
    pods = running(sim, 2, since=0)
    sim.reconcile(pods, at_s=10)
    result = sim.reconcile(pods, at_s=3601)  # the deadline: both deleted, still on their nodes
    assert sim.phase() == "Failed"
    assert "Usage" not in event_reasons(result)
    going = [bound(sim.pod(i, "running", terminating=at(3700)), 0) for i in range(2)]
    sim.reconcile(going, at_s=3650)
    last = [ended(bound(sim.pod(i, "failed", terminating=at(3700)), 0), 3620) for i in range(2)]
    result = sim.reconcile(last, at_s=3660)
    assert usage(sim).gpu_seconds == 2 * GPUS * 3620
    assert event_reasons(result) == ["Usage"]


def test_an_operator_restart_does_not_count_twice(ctx: BuildContext) -> None:
    """The state is the stored status: a new process (no memory of its writes) goes on from the
    watermark, and a pass repeated at the same time adds nothing."""
    sim = started(ctx)
    pods = running(sim, 2, since=0)
    sim.reconcile(pods, at_s=600)
    sim.written_at, sim.held_since = None, None  # a new operator process
    sim.reconcile(pods, at_s=900)
    sim.reconcile(pods, at_s=900)
    assert usage(sim).gpu_seconds == 2 * GPUS * 900


def test_a_deleted_job_accounts_its_workers_until_they_end(ctx: BuildContext) -> None:
    sim = started(ctx)
    sim.reconcile(running(sim, 2, since=0), at_s=60)
    sim.job = sim.job.model_copy(
        update={"metadata": sim.job.metadata.model_copy(update={"deletion_timestamp": T0 + timedelta(seconds=90)})}
    )
    finished = [ended(bound(sim.pod(i, "failed", terminating=at(200)), 0), 95) for i in range(2)]
    plan = sim.reconcile(finished, at_s=100)
    assert plan.release_finalizer
    assert usage(sim).gpu_seconds == 2 * GPUS * 95
    assert usage(sim).running == []
