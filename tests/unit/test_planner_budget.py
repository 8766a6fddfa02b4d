"""DGXBudgets in the planner (issue 31, reconcile/planner/budget.py): a run starts only when its
worst case fits every Hold budget covering it; otherwise the job waits Suspended with
BudgetExceeded and a message naming the budget and its numbers; the run's reservation goes into
the plan of the pass that creates its workers; a running job is never stopped by a budget; the
plan asks for settling when a run ends.

The default catalog's example price of dgxa100.80g.8.norm is 1.80 per GPU-hour: a worker of 8 GPUs
for 1h costs 14.40.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any

from dgx_operator.api.budget import DGXBudgetSpec
from dgx_operator.api.trainingjob import DGXTrainingJob, DGXTrainingJobStatus
from dgx_operator.reconcile import budgets
from dgx_operator.reconcile.planner import Observed, Plan, plan
from dgx_operator.reconcile.spending import BudgetView
from dgx_operator.render import BuildContext
from tests.unit.planner_sim import T0, at, created, make_job, observe, phase_reason, step

HOUR = {"spec.maxDuration": "1h", "spec.elastic": {"minNodes": 2, "maxNodes": 2}}


def budget(limit: str = "100", *, name: str = "burst", **spec: Any) -> BudgetView:
    raw = {"limits": {"cost": limit}, "period": {"calendar": "Month"}, **spec}
    return BudgetView("ml", name, "7", DGXBudgetSpec.model_validate(raw), budgets.Ledger())


def neighbour(cost_gpu_seconds: int, uid: str = "other-uid") -> DGXTrainingJob:
    """Another job of the namespace that already used ``cost_gpu_seconds`` at 1.80 (not settled yet)."""
    usage = {
        "gpuSeconds": cost_gpu_seconds,
        "accountedUntil": "2025-03-01T11:00:00Z",
        "buckets": [{"capacity": "norm", "pricePerGpuHour": "1.80", "gpuSeconds": cost_gpu_seconds}],
    }
    job = make_job(
        {"metadata.name": "other", "metadata.uid": uid, "metadata.creationTimestamp": "2025-03-01T10:00:00Z"}
    )
    return job.model_copy(update={"status": DGXTrainingJobStatus.model_validate({"usage": usage})})


def judged(
    job: DGXTrainingJob, ctx: BuildContext, *views: BudgetView, jobs: tuple[DGXTrainingJob, ...] = (), at_s: float = 0
) -> Plan:
    observed = dataclasses.replace(observe(), budgets=views, neighbours=jobs)
    return plan(job, ctx, observed, at(at_s))


def message(result: Plan) -> str:
    return next(c.message for c in result.status.conditions if c.type == "Suspended")


def test_a_run_that_fits_starts_and_reserves_its_worst_case(ctx: BuildContext) -> None:
    job = make_job(HOUR)
    result = judged(job, ctx, budget("100"))
    assert created(result) == [0, 1]
    [(view, run)] = result.reserve
    assert view.name == "burst"
    assert (run.nodes, run.gpus_per_node, run.price, run.capacity) == (2, 8, Decimal("1.80"), "norm")
    assert run.start == T0
    assert run.until == at(3600)
    assert budgets.worst_case(run) == budgets.Amount(2 * 8 * 3600, Decimal("28.80"))


def test_a_run_that_does_not_fit_waits_with_budget_exceeded_and_the_numbers(ctx: BuildContext) -> None:
    job = make_job(HOUR)
    # 28.80 of worst case + 80.00 the other job used (unsettled) > 100
    result = judged(job, ctx, budget("100"), jobs=(neighbour(8 * 20000),))
    assert created(result) == []
    assert result.reserve == []
    assert result.status.phase == "Suspended"
    assert phase_reason(result.status) == "BudgetExceeded"
    text = message(result)
    assert text.startswith(
        "DGXBudget ml/burst: this run's worst case 2 nodes x 8 GPUs x 1.80 USD/GPU-h x 1h = 28.80 USD"
    )
    assert "spent 80.00 + committed 0.00 of 100.00 USD" in text
    assert "it starts when" in text
    assert [e.reason for e in result.events] == ["BudgetExceeded"]
    assert result.requeue_after is not None
    assert result.requeue_after <= 30


def test_raising_the_budget_lets_the_held_run_start(ctx: BuildContext) -> None:
    job = make_job(HOUR)
    held = judged(job, ctx, budget("100"), jobs=(neighbour(8 * 20000),))
    later = step(job, held)
    started = judged(later, ctx, budget("200"), jobs=(neighbour(8 * 20000),), at_s=60)
    assert created(started) == [0, 1]
    assert len(started.reserve) == 1


def test_every_hold_budget_must_fit_and_report_budgets_never_hold(ctx: BuildContext) -> None:
    job = make_job(HOUR)
    report = budget("1", name="ledger", enforcement="Report")
    assert created(judged(job, ctx, report)) == [0, 1]
    held = judged(job, ctx, report, budget("10", name="tight"))
    assert phase_reason(held.status) == "BudgetExceeded"
    assert "DGXBudget ml/tight" in message(held)
    assert "ml/ledger" not in message(held)


def test_a_budget_for_other_capacities_or_other_jobs_does_not_hold(ctx: BuildContext) -> None:
    job = make_job(HOUR)
    assert created(judged(job, ctx, budget("1", capacities=["spot"]))) == [0, 1]
    assert created(judged(job, ctx, budget("1", jobSelector={"matchLabels": {"team": "b"}}))) == [0, 1]
    mine = make_job({**HOUR, "metadata.labels": {"team": "b"}})
    assert phase_reason(judged(mine, ctx, budget("1", jobSelector={"matchLabels": {"team": "b"}})).status) == (
        "BudgetExceeded"
    )


def test_a_run_without_max_duration_cannot_fit_a_hold_budget(ctx: BuildContext) -> None:
    job = make_job({"spec.elastic": {"minNodes": 1, "maxNodes": 1}})
    result = judged(job, ctx, budget("1000000"))
    assert phase_reason(result.status) == "BudgetExceeded"
    assert "spec.maxDuration" in message(result)


def test_a_running_job_is_never_stopped_by_a_budget(ctx: BuildContext) -> None:
    job = make_job(HOUR)
    first = judged(job, ctx, budget("100"))
    running = step(job, first)
    assert running.status is not None
    assert running.status.start_time is not None
    again = judged(running, ctx, budget("1"), at_s=30)
    assert again.status.phase != "Suspended"
    assert again.reserve == []


def test_no_budgets_read_means_nothing_judged(ctx: BuildContext) -> None:
    job = make_job(HOUR)
    result = plan(job, ctx, observe(), at(0))
    assert created(result) == [0, 1]
    assert result.reserve == []


def test_the_plan_asks_to_settle_when_a_run_ends_or_the_job_goes(ctx: BuildContext) -> None:
    job = make_job(HOUR)
    started = judged(job, ctx, budget("100"))
    assert started.settle is False
    running = step(job, started)
    suspended = plan(
        DGXTrainingJob.model_validate(
            {
                **running.model_dump(by_alias=True, mode="json"),
                "spec": {**running.model_dump(by_alias=True, mode="json")["spec"], "suspend": True},
            }
        ),
        ctx,
        observe(),
        at(60),
    )
    assert suspended.status.phase == "Suspended"
    assert suspended.settle is True
    gone = running.model_copy(update={"metadata": running.metadata.model_copy(update={"deletion_timestamp": at(90)})})
    deleted = plan(gone, ctx, Observed(), at(100))
    assert deleted.release_finalizer
    assert deleted.settle is True


def test_with_kueue_a_job_over_budget_keeps_its_workload_inactive_until_it_fits(ctx: BuildContext) -> None:
    """Held by a budget, the job's Workload is created inactive (it reserves no ClusterQueue quota);
    once the budget has room it is activated and Kueue decides."""
    from tests.unit.test_queueing import as_stored, q_of

    job = make_job({**HOUR, "metadata.labels": {"kueue.x-k8s.io/queue-name": "team"}})
    observed = dataclasses.replace(observe(), queueing=q_of(), budgets=(budget("10"),))
    first = plan(job, ctx, observed, at(0))
    assert phase_reason(first.status) == "BudgetExceeded"
    assert first.workloads.create is not None
    assert first.workloads.create["spec"]["active"] is False
    wl = as_stored(first.workloads.create, None)
    raised = dataclasses.replace(observe(), queueing=q_of(wl), budgets=(budget("100"),))
    second = plan(step(job, first), ctx, raised, at(30))
    assert second.status.phase == "Suspended"  # now Kueue's to admit
    assert phase_reason(second.status) != "BudgetExceeded"
    [(_, _, patch)] = second.workloads.patch
    assert patch["spec"]["active"] is True
