"""The DGXBudgets of a namespace as a job sees them (issue 31): which budgets cover a run, what the
run's worst case is, and whether it fits each of them. Pure glue between the job's world (its spec,
its resolved instance, the namespace's other jobs and their ``status.usage``) and the budget
arithmetic of :mod:`dgx_operator.reconcile.budgets`; the planner, the webhook's warning and the
budget controller share it, so all three judge a run the same way."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_CEILING, Decimal
from typing import Any, cast

from pydantic import ValidationError

from dgx_operator.api.budget import Capacity, DGXBudget, DGXBudgetSpec
from dgx_operator.api.common import Condition
from dgx_operator.api.trainingjob import DGXTrainingJob
from dgx_operator.api.vocabulary import BudgetCondition, BudgetReason
from dgx_operator.reconcile import budgets, usage
from dgx_operator.reconcile.status import set_condition
from dgx_operator.reconcile.stored import parse_stored

READY = BudgetCondition.READY


@dataclass(frozen=True)
class BudgetView:
    """A stored DGXBudget, reduced to what is decided on: its spec, its ledger and the
    resourceVersion a write of that ledger must be guarded by."""

    namespace: str
    name: str
    resource_version: str | None
    spec: DGXBudgetSpec
    ledger: budgets.Ledger
    generation: int | None = None
    #: The status as stored (what a merge patch of a new one is computed against).
    stored: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def holds(self) -> bool:
        return self.spec.enforcement == "Hold"


def parse_budget(body: Mapping[str, Any]) -> BudgetView | None:
    """The budget, or None when its stored form is one this operator cannot read (a newer version's
    field, a zone the time zone database lacks): such a budget holds nothing (its controller says so
    in its Ready condition, :func:`unreadable`)."""
    budget, _ = parse_stored(DGXBudget, body)
    if budget is None or (body.get("status") and budget.status is None):
        return None  # a ledger it cannot read is never written over with an empty one
    try:
        ledger = budgets.from_status(budget.status)
    except (ValueError, ValidationError):
        return None
    return BudgetView(
        namespace=budget.metadata.namespace or "",
        name=budget.metadata.name,
        resource_version=budget.metadata.resource_version,
        spec=budget.spec,
        ledger=ledger,
        generation=budget.metadata.generation,
        stored=dict(body.get("status") or {}),
    )


def job_usage(job: DGXTrainingJob, spec: DGXBudgetSpec) -> budgets.JobUsage:
    """``job``'s usage on the capacities ``spec`` counts, spread from the job's creation on."""
    stored = job.status.usage if job.status is not None else None
    scoped = budgets.scope(usage.from_status(stored), spec.capacities, since=job.metadata.creation_timestamp)
    return budgets.JobUsage(uid=str(job.metadata.uid or ""), name=job.metadata.name, scoped=scoped)


def live_usages(spec: DGXBudgetSpec, jobs: Sequence[DGXTrainingJob]) -> list[budgets.JobUsage]:
    """Every job of ``jobs`` the budget's selector takes, with its scoped usage (the capacities filter
    the usage itself: a job that ran on spot and on norm counts its norm part in a norm budget)."""
    return [
        job_usage(j, spec)
        for j in jobs
        if spec.job_selector is None or budgets.selects(spec.job_selector, j.metadata.labels or {})
    ]


def run(
    job: DGXTrainingJob,
    *,
    capacity: str,
    nodes: int,
    gpus_per_node: int,
    price: Decimal | None,
    start: datetime,
    max_duration_s: int | None,
    share: Decimal = Decimal(1),
) -> budgets.Reservation:
    """The worst case of a run starting at ``start``: ``nodes`` workers of ``gpus_per_node`` GPUs for
    ``maxDuration`` (None: unbounded) at ``price`` per GPU-hour. ``share``: what one device is of a
    GPU (a MIG slice's g/7), folded into the price per device, rounded up to the catalog's four
    decimals so the worst case stays a bound."""
    if price is not None and share != 1:
        price = (price * share).quantize(Decimal("0.0001"), rounding=ROUND_CEILING)
    return budgets.Reservation(
        job=job.metadata.name,
        uid=str(job.metadata.uid or ""),
        capacity=cast(Capacity, capacity),
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        price=price,
        start=start.replace(microsecond=0),
        until=None if max_duration_s is None else start.replace(microsecond=0) + timedelta(seconds=max_duration_s),
    )


@dataclass(frozen=True)
class Judged:
    """One covering budget's answer for a run."""

    budget: BudgetView
    verdict: budgets.Verdict


def judge(
    views: Sequence[BudgetView],
    jobs: Sequence[DGXTrainingJob],
    job: DGXTrainingJob,
    candidate: budgets.Reservation,
    now: datetime,
    currency: str | None,
) -> list[Judged]:
    """The answer of every budget of ``views`` that covers ``job``'s run on ``candidate.capacity``
    (its selector takes the job's labels, its capacities the run's). ``jobs``: the namespace's jobs,
    ``job`` among them or not (its own usage counts as live either way)."""
    out = []
    labels = job.metadata.labels or {}
    others = [j for j in jobs if j.metadata.uid != job.metadata.uid]
    for view in views:
        if not budgets.covers(view.spec, labels, candidate.capacity):
            continue
        live = [*live_usages(view.spec, others), job_usage(job, view.spec)]
        verdict = budgets.fits(view.key, view.spec, view.ledger, live, candidate, now, currency)
        out.append(Judged(view, verdict))
    return out


def stored_conditions(stored: Mapping[str, Any]) -> list[Condition]:
    """The conditions a stored budget status carries (those this operator can read)."""
    out = []
    for item in stored.get("conditions") or []:
        try:
            out.append(Condition.model_validate(item))
        except ValidationError:
            continue
    return out


def ready(view: BudgetView, now: datetime) -> list[Condition]:
    """The conditions of a budget this operator counts: Ready, saying what it does with a run that
    does not fit (its transition time kept while it stays Ready)."""
    does = (
        "runs whose worst case does not fit wait (BudgetExceeded)"
        if view.holds
        else "enforcement Report: it counts and holds nothing"
    )
    message = f"counting the usage of the jobs it covers; {does}"
    conditions = stored_conditions(view.stored)
    return set_condition(conditions, READY, True, BudgetReason.COUNTING, message, now, view.generation or 0)


def unreadable(body: Mapping[str, Any], now: datetime) -> tuple[list[Condition], str]:
    """Ready False for a budget :func:`parse_budget` refuses, and why (one line naming the field and
    the fix): nothing of its spent or ledger is written over, only this condition."""
    budget, why = parse_stored(DGXBudget, body)
    stored = dict(body.get("status") or {})
    generation = int((body.get("metadata") or {}).get("generation") or 0)
    if budget is None:
        reason, message = BudgetReason.INVALID_SPEC, f"this kubedgx counts and holds nothing for it: {why}"
    else:
        reason = BudgetReason.UNREADABLE_STATUS
        message = (
            "this kubedgx counts and holds nothing for it: its status (the ledger) is not one this version can "
            "read, probably written by a newer kubedgx; upgrade the operator (the ledger is left as it is)"
        )
    return set_condition(stored_conditions(stored), READY, False, reason, message, now, generation), message
