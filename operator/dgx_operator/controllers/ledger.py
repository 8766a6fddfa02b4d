"""Writing DGXBudgets' ledgers (issue 31), for the job controller (a run's reservation before its
first worker, its usage settled when the run ends or before its finalizer goes) and the budget
controller (settling every live job, rolling periods, releasing the reservations of runs that
ended). The arithmetic is :mod:`dgx_operator.reconcile.budgets`; here are the reads and the
resourceVersion-guarded writes.

Every write is the whole status computed from the budget as read, guarded by that read's
resourceVersion: a concurrent writer (another job reserving, the budget's own pass) makes it 409,
and the writer reads again and recomputes. Settling is idempotent (the ledger keeps what it has
seen of each job), so a retry, an operator restart or a new leader counts nothing twice."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from dgx_operator.api.trainingjob import DGXTrainingJob
from dgx_operator.api.vocabulary import JobPhase
from dgx_operator.catalog import Catalog
from dgx_operator.kube import ApiError, Kube, TransientError
from dgx_operator.reconcile import budgets, spending
from dgx_operator.reconcile.status import merge_patch
from dgx_operator.reconcile.stored import parse_stored
from dgx_operator.reconcile.usage import from_status

log = logging.getLogger(__name__)

#: A reservation whose job has not started its run this long after it was taken is an orphan (the
#: operator stopped between writing it and creating the workers): released.
ORPHAN_SECONDS = 300.0
TERMINAL = JobPhase.TERMINAL
#: Writes retried after a 409 before giving up for this pass (the caller's backoff takes over).
ATTEMPTS = 4


def jobs_of(items: Iterable[Mapping[str, Any]]) -> list[DGXTrainingJob]:
    out = []
    for body in items:
        job, _ = parse_stored(DGXTrainingJob, body)
        if job is not None:
            out.append(job)
    return out


async def read(kube: Kube, namespace: str) -> tuple[list[spending.BudgetView], list[DGXTrainingJob]]:
    """The namespace's readable budgets and, when it has any, its jobs (their usage counts)."""
    views = [v for v in (spending.parse_budget(b) for b in await kube.list_budgets(namespace)) if v is not None]
    if not views:
        return [], []
    return views, jobs_of(await kube.list_jobs(namespace))


def currency(catalog: Catalog) -> str | None:
    return catalog.spec.pricing.currency if catalog.spec.pricing is not None else None


def watermarks(jobs: Sequence[DGXTrainingJob]) -> dict[str, datetime | None]:
    return {str(j.metadata.uid): from_status(j.status.usage if j.status else None).until for j in jobs}


async def write(
    kube: Kube,
    view: spending.BudgetView,
    ledger: budgets.Ledger,
    jobs: Sequence[DGXTrainingJob],
    catalog: Catalog,
    now: datetime,
) -> None:
    """``ledger`` as the budget's status, guarded by the resourceVersion ``view`` was read at; nothing
    when the stored status says the same already."""
    status = budgets.render_status(
        view.spec,
        ledger,
        watermarks(jobs),
        currency=currency(catalog),
        generation=view.generation,
        conditions=spending.ready(view, now),
    )
    patch = merge_patch(view.stored, _dump(status))
    if patch:
        await kube.patch_budget_status(view.namespace, view.name, view.resource_version, patch)


async def reserve(
    kube: Kube,
    reservations: Sequence[tuple[spending.BudgetView, budgets.Reservation]],
    catalog: Catalog,
    now: datetime,
) -> None:
    """Each reservation into its budget, as read when the run was judged: a budget written since
    (another run took room) answers 409, raised as TransientError, and the job is judged again with
    the fresh budget before any worker exists."""
    if not reservations:
        return
    namespace = reservations[0][0].namespace
    jobs = jobs_of(await kube.list_jobs(namespace))
    for view, run in reservations:
        try:
            await write(kube, view, budgets.reserve(view.ledger, run), jobs, catalog, now)
        except ApiError as exc:
            if exc.status == 409:
                raise TransientError(f"DGXBudget {view.key} changed while the run was judged; judging again") from exc
            raise


async def settle_job(kube: Kube, job: DGXTrainingJob, catalog: Catalog, now: datetime, *, release: bool) -> None:
    """``job``'s usage (as just planned) settled into every budget of its namespace whose selector
    takes it, and, with ``release``, its reservations released: the run ended, or the job goes (its
    TTL, kubectl delete) and its spend must be in the ledgers before it does."""
    namespace = job.metadata.namespace or ""
    uid = str(job.metadata.uid)
    for attempt in range(ATTEMPTS):
        views, jobs = await read(kube, namespace)
        jobs = [j for j in jobs if str(j.metadata.uid) != uid] + [job]
        existing = {str(j.metadata.uid) for j in jobs}
        conflict = False
        for view in views:
            if view.spec.job_selector is not None and not budgets.selects(
                view.spec.job_selector, job.metadata.labels or {}
            ):
                continue
            ledger = budgets.advance(
                view.ledger, view.spec.period, spending.live_usages(view.spec, jobs), now, existing
            )
            if release:
                ledger = budgets.release(ledger, uid)
            if ledger == view.ledger:
                continue
            try:
                log.debug("%s/%s: settling into DGXBudget %s", namespace, job.metadata.name, view.name)
                await write(kube, view, ledger, jobs, catalog, now)
            except ApiError as exc:
                if exc.status != 409:
                    raise
                conflict = True
        if not conflict:
            return
        log.debug("%s/%s: a budget changed while settling (attempt %d); again", namespace, job.metadata.name, attempt)
    raise TransientError(f"DGXBudgets of {namespace} kept changing while settling {job.metadata.name}")


def ended(job: DGXTrainingJob | None, run: budgets.Reservation, now: datetime) -> bool:
    """Whether the run ``run`` reserved for is over: its job is gone or finished, or it has no run
    going (suspended, evicted) and the reservation is older than ORPHAN_SECONDS (younger, its workers
    may be being created now: the pass that reserved writes startTime after them)."""
    if job is None or str(job.metadata.uid) != run.uid:
        return True
    status = job.status
    if status is not None and status.phase in TERMINAL:
        return True
    if job.metadata.deletion_timestamp is not None or (status is not None and status.start_time is not None):
        return False  # running (or its finalizer settles and releases)
    return (now - run.start).total_seconds() > ORPHAN_SECONDS


async def reconcile_budget(kube: Kube, namespace: str, name: str, catalog: Catalog, now: datetime) -> bool:
    """A budget's own pass: every live job it covers settled, the period rolled, the reservations
    of runs that ended released, the numbers written when they changed. False: the budget is gone
    or unreadable (this operator counts and holds nothing for it)."""
    body = await kube.get_budget(namespace, name)
    if body is None:
        return False
    view = spending.parse_budget(body)
    if view is None:
        conditions, why = spending.unreadable(body, now)
        log.warning("DGXBudget %s/%s: %s", namespace, name, why)
        stored = dict(body.get("status") or {})
        wanted = {
            "conditions": [c.model_dump(by_alias=True, mode="json", exclude_none=True) for c in conditions],
            "observedGeneration": body["metadata"].get("generation"),
        }
        patch = merge_patch({k: stored.get(k) for k in wanted if k in stored}, wanted)
        if patch:
            await kube.patch_budget_status(namespace, name, body["metadata"].get("resourceVersion"), patch)
        return False
    jobs = jobs_of(await kube.list_jobs(namespace))
    by_uid = {str(j.metadata.uid): j for j in jobs}
    ledger = budgets.advance(view.ledger, view.spec.period, spending.live_usages(view.spec, jobs), now, set(by_uid))
    for run in ledger.reservations:
        if ended(by_uid.get(run.uid), run, now):
            ledger = budgets.release(ledger, run.uid)
    await write(kube, view, ledger, jobs, catalog, now)
    return True


def _dump(status: Any) -> dict[str, Any]:
    """A status as stored: no nulls (the schema has no nullable fields; a merge patch removes what
    the new status leaves out)."""
    dumped: dict[str, Any] = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped
