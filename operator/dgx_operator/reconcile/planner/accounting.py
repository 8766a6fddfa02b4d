"""GPU-hours and cost (issue 31): every pass carries ``status.usage`` to now from the job's pods
(:mod:`dgx_operator.reconcile.usage` does the arithmetic), and says once, in an Event, what the
whole job used when its last worker let go of its node.

Usage moves every second a worker holds a node, so it must not make writes of its own at the pace
of the counts in flight: :mod:`coalesce` lets it ride on the writes that happen anyway (progress,
transitions) and writes it alone at most once per usage interval, and at once when the job's
workers have all let go (the end of a run, a suspend, a reclaim of every node, the deletion that
releases the finalizer)."""

from __future__ import annotations

from dgx_operator.api.vocabulary import JobReason
from dgx_operator.catalog import UnknownInstanceError
from dgx_operator.reconcile import usage
from dgx_operator.reconcile.planner.draft import Draft
from dgx_operator.reconcile.planner.model import TERMINAL


def account(d: Draft) -> None:
    """``d.status.usage`` up to ``d.now``; the summary Event when the job has ended and let go."""
    catalog = d.ctx.catalog
    pricing = catalog.spec.pricing
    try:
        instance = catalog.get(d.spec.instance)
    except UnknownInstanceError:
        instance = None  # an unknown instance never had workers; only pods made before an edit count
    default_gpus = instance.gpus if instance is not None else 0
    default_capacity = instance.capacity if instance is not None else ""
    prices = catalog.prices_for(instance.family.key) if instance is not None else {}
    spans = [
        usage.span_of(
            p,
            p.gpus if p.gpus is not None else default_gpus,
            p.capacity if p.capacity is not None else default_capacity,
            instance.slices if instance is not None else None,
        )
        for p in d.observed.pods
        if p.owner_uid == d.ident.uid and p.uid is not None
    ]
    stored = d.job.status.usage if d.job.status is not None else None
    before = usage.from_status(stored)
    after = usage.accrue(before, spans, prices, pricing.reference if pricing else "", d.now)
    if after != before:
        d.status.usage = usage.to_status(after, pricing)
    if after.holding:
        # Nothing else may wake a job whose program prints no progress: its usage is still shown.
        interval = d.observed.usage_interval
        if interval > 0:
            d.plan.requeue_after = interval if d.plan.requeue_after is None else min(d.plan.requeue_after, interval)
    elif d.status.phase in TERMINAL and after.gpu_seconds and (before.holding or d.old_phase not in TERMINAL):
        d.event("Normal", JobReason.USAGE, usage.summary(after, pricing))
