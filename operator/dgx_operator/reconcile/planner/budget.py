"""DGXBudgets (issue 31): a run starts only when its worst case fits every Hold budget that covers
it; otherwise the job waits, as a Kueue-held job does: phase Suspended, reason ``BudgetExceeded``,
no workers, ``maxPending`` not counting, a Kueue Workload kept inactive so it reserves no quota. The
message names the budget and its numbers (:func:`dgx_operator.reconcile.budgets.fits`).

Only a run that has not started is judged (``status.startTime`` unset: a new job, a resume, a
re-admission); a running job is never stopped by a budget edit, as a ResourceQuota never evicts.
When the run starts (the pass that creates its first workers), the plan carries its reservation in
every covering budget; the controller writes it, guarded by the budget's resourceVersion, before it
creates a worker: two runs cannot both take the last room, whichever replica plans them. The
controller reads the namespace's budgets only for such passes (``Observed.budgets``; None: not read,
nothing to judge)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import cast

from dgx_operator.api.budget import Capacity
from dgx_operator.api.vocabulary import JobPhase, JobReason
from dgx_operator.reconcile import spending
from dgx_operator.reconcile.planner.draft import Draft
from dgx_operator.reconcile.planner.model import Plan
from dgx_operator.render.resolved import Resolved

#: How often a held job looks at its budgets again (a raised limit, a run that ended, a new period);
#: a change of a budget also wakes the namespace's held jobs at once.
BUDGET_RETRY_SECONDS = 30.0


def judge(d: Draft, r: Resolved) -> str | None:
    """Why the run may not start (the first failing budget's message, the others named), or None: it
    may (and its reservations wait in the Draft for the pass that creates its workers)."""
    views = d.observed.budgets
    if not views or d.status.start_time is not None:
        return None
    pricing = d.ctx.catalog.spec.pricing
    capacity = r.instance.capacity
    nodes = 1 if r.interactive else r.max_nodes
    candidate = spending.run(
        d.job,
        capacity=capacity,
        nodes=nodes,
        gpus_per_node=r.gpus,
        share=r.instance.gpu_share,
        price=d.ctx.catalog.prices_for(r.instance.family.key).get(capacity),
        start=d.now,
        max_duration_s=r.max_duration_s,
    )
    judged = spending.judge(
        views, d.observed.neighbours, d.job, candidate, d.now, pricing.currency if pricing is not None else None
    )
    refused = [j for j in judged if j.budget.holds and not j.verdict.ok]
    if refused:
        return "; ".join(j.verdict.message for j in refused)[:4000]
    d.reservations = [(j.budget, candidate) for j in judged]
    return None


def held(d: Draft, message: str) -> Plan:
    """Waiting for a budget: no workers, Suspended with BudgetExceeded (one Warning event when it
    starts waiting: set_phase posts one on the phase change); looked at again every
    BUDGET_RETRY_SECONDS."""
    d.delete([p for p in d.pods if not p.finished])
    d.status.start_time = None
    d.set_phase(JobPhase.SUSPENDED, JobReason.BUDGET_EXCEEDED, message)
    d.wakeups.append(d.now + timedelta(seconds=BUDGET_RETRY_SECONDS))
    return d.done(desired=0)


def reserve(d: Draft, desired: int) -> None:
    """The run starts in this pass: its reservations go into the plan, with the nodes it really asks
    for (Kueue's admitted count) and the capacity it is placed in (Kueue's flavor)."""
    if not d.reservations:
        return
    placement = d.ctx.placement
    capacity = None
    if placement is not None:
        capacity = d.ctx.catalog.capacity_of(placement.node_selector, d.reservations[0][1].capacity)
    for view, candidate in d.reservations:
        nodes = min(candidate.nodes, desired) if desired else candidate.nodes
        run = dataclasses.replace(candidate, nodes=nodes, capacity=cast(Capacity, capacity or candidate.capacity))
        d.plan.reserve.append((view, run))
