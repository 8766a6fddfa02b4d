"""The apply-time budget warning (issue 31; docs/research/cost-control.md, 3.4 "Apply-time warning").

A job whose run cannot fit a ``Hold`` DGXBudget of its namespace waits with reason BudgetExceeded once
it is admitted; saying so at `kubectl apply` spares the user finding out from the job's status later.
It is a warning, never a refusal: the budget may be raised, a running job may end, the period may
roll, and an admin may want the job queued meanwhile.

The judgement is the one the planner makes before a run starts (:mod:`dgx_operator.reconcile.spending`:
which budgets cover the run, its worst case, whether it fits), from the objects the webhook listed; so
the warning's numbers are the ones the job's BudgetExceeded condition will show. Pure: the listing,
its time bound and what a failed one says live in :mod:`dgx_operator.webhook.admission`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from dgx_operator.api.budget import KIND as BUDGET_KIND
from dgx_operator.api.common import parse_duration
from dgx_operator.api.trainingjob import DGXTrainingJob
from dgx_operator.catalog import Catalog
from dgx_operator.reconcile import spending
from dgx_operator.reconcile.stored import parse_stored
from dgx_operator.render import resolve

#: What every warning about a budget the run does not fit ends with.
WAITS = "this job will wait (BudgetExceeded) until then"


def may_hold(body: Mapping[str, Any]) -> bool:
    """Whether a stored budget could hold a job: any but one that says ``enforcement: Report`` (an
    unreadable one counts: it is warned about). Read from the raw object, so that a namespace with
    only Report budgets (a ledger, no limit) costs the webhook no listing of its jobs."""
    spec = body.get("spec")
    return not (isinstance(spec, Mapping) and spec.get("enforcement") == "Report")


def max_duration_seconds(job: DGXTrainingJob, default: str | None) -> int | None:
    """The maxDuration the run's worst case lasts: the spec's; else the one the operator pinned into
    ``status.limits`` at the job's first pass (an update of a job that took a default); else ``default``,
    the guard rails' default the webhook just warned about (a create); None: unbounded. Rounded up to
    whole seconds, as the planner's deadline is (render.resolved)."""
    pinned = job.status.limits.max_duration if job.status is not None and job.status.limits is not None else None
    text = job.spec.max_duration or pinned or default
    return None if text is None else max(1, math.ceil(parse_duration(text).total_seconds()))


def warnings(
    budgets: Sequence[Mapping[str, Any]],
    jobs: Sequence[Mapping[str, Any]],
    body: Mapping[str, Any],
    catalog: Catalog,
    default_max_duration: str | None,
    now: datetime,
) -> list[str]:
    """One warning per Hold budget of ``budgets`` (the namespace's, as listed) that covers the job
    ``body`` (as reviewed, its stored status included on an update) and that its run, started ``now``,
    does not fit, given the namespace's ``jobs`` (as listed; unreadable ones are left out); and one per
    budget this kubedgx cannot read. Report budgets never warn. ``body`` must be a valid job (the
    validator passed it), so its instance resolves."""
    out: list[str] = []
    views: list[spending.BudgetView] = []
    for stored in budgets:
        view = spending.parse_budget(stored)
        if view is not None:
            views.append(view)
        elif may_hold(stored):
            meta = stored.get("metadata") or {}
            out.append(
                f"{BUDGET_KIND} {meta.get('namespace')}/{meta.get('name')} cannot be read by this kubedgx, so this "
                "job was not checked against it; re-apply the budget with a valid spec"
            )
    holding = [v for v in views if v.holds]
    job, _ = parse_stored(DGXTrainingJob, body)
    if not holding or job is None:
        return out
    r = resolve(job.spec, catalog)
    pricing = catalog.spec.pricing
    candidate = spending.run(
        job,
        capacity=r.instance.capacity,
        nodes=1 if r.interactive else r.max_nodes,
        gpus_per_node=r.gpus,
        share=r.instance.gpu_share,
        price=catalog.prices_for(r.instance.family.key).get(r.instance.capacity),
        start=now,
        max_duration_s=max_duration_seconds(job, default_max_duration),
    )
    others = [found for stored in jobs if (found := parse_stored(DGXTrainingJob, stored)[0]) is not None]
    judged = spending.judge(holding, others, job, candidate, now, pricing.currency if pricing is not None else None)
    out += [f"{j.verdict.message}: {WAITS}" for j in judged if not j.verdict.ok]
    return out
