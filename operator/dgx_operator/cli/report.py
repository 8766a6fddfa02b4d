"""`kubedgx usage`: GPU-hours, cost and spot savings per namespace and per job over a period, from the
DGXBudgets' ledgers and the DGXTrainingJobs' ``status.usage`` (issue 31, docs/cost.md "The report").

Two sources, because neither is enough alone:

- A job's ``status.usage`` is exact and cumulative, every attempt included, but it goes when the job
  is deleted (``ttlSecondsAfterFinished``, ``kubectl delete``), and it has no breakdown by day: a live
  job is attributed to a period when its span (creation to its usage watermark, or now while it
  runs) overlaps the period, with its whole usage. An approximation, said in the output.
- A DGXBudget's ledger keeps what each job counted in the period, deleted jobs included, exactly,
  and its history keeps the totals of closed periods. A budget counts the namespace's whole spend
  only when it selects every job (no ``jobSelector``, or exactly the report's queue) on every
  capacity (no ``capacities``); such a budget's period that matches the report's gives the
  namespace's total. Its ledger is brought to now with the live jobs' usage first
  (:func:`~dgx_operator.reconcile.budgets.advance` on a copy, what the budget controller's next
  pass would write), so the report never lags behind the jobs.

Pure: :func:`build` takes the objects as the API server returns them and ``now``; the cluster
reading is :func:`read`, a thin function over :mod:`dgx_operator.client.kubeclient`. Money is exact
(Decimal from the buckets and the ledger) and shown with two decimals, rounded half up.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Literal

from pydantic import ValidationError

from dgx_operator.api import GROUP, VERSION
from dgx_operator.api import trainingjob as api
from dgx_operator.api.crdgen import BUDGETS, TRAINING_JOBS
from dgx_operator.reconcile import budgets, spending, usage
from dgx_operator.reconcile.queueing import QUEUE_LABEL

_CENT = Decimal("0.01")
DELETED = "deleted (budget ledger)"

# -- the period ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PeriodSpec:
    """A period as the user wrote it, resolved against a clock by :func:`resolve` (so a test, or a
    report started a second before midnight, sees one consistent ``now``)."""

    text: str
    kind: Literal["this-month", "last-month", "month", "days", "dates"]
    month: tuple[int, int] | None = None
    days: int | None = None
    dates: tuple[date, date] | None = None


PERIOD_HELP = (
    "this-month, last-month, YYYY-MM (2026-11), Nd for the last N days (7d, 30d) or FROM..TO (2026-11-01..2026-11-15)"
)


def parse_period(text: str) -> PeriodSpec:
    """``--period``'s value; ValueError with the accepted forms when it is none of them."""
    value = text.strip()
    if value == "this-month":
        return PeriodSpec(value, "this-month")
    if value == "last-month":
        return PeriodSpec(value, "last-month")
    if match := re.fullmatch(r"(\d{4})-(\d{2})", value):
        year, month = int(match[1]), int(match[2])
        if not 1 <= month <= 12:
            raise ValueError(f"{text!r}: there is no month {month}: give YYYY-MM with a month 01 to 12")
        _check_year(text, year)
        return PeriodSpec(value, "month", month=(year, month))
    if match := re.fullmatch(r"(\d{1,4})d", value):
        days = int(match[1])
        if not 1 <= days <= 3660:
            raise ValueError(f"{text!r}: give 1d to 3660d")
        return PeriodSpec(value, "days", days=days)
    if match := re.fullmatch(r"(\S+)\.\.(\S+)", value):
        try:
            first, last = date.fromisoformat(match[1]), date.fromisoformat(match[2])
        except ValueError:
            raise ValueError(f"{text!r}: FROM and TO must be dates, YYYY-MM-DD..YYYY-MM-DD") from None
        if last < first:
            raise ValueError(f"{text!r}: TO is before FROM: give FROM..TO with FROM first")
        _check_year(text, first.year)
        _check_year(text, last.year)
        return PeriodSpec(value, "dates", dates=(first, last))
    raise ValueError(f"{text!r} is not a period: give {PERIOD_HELP}")


def _check_year(text: str, year: int) -> None:
    """Years a job can have run in; the edges of the calendar would overflow a month's end."""
    if not 1970 <= year <= 9998:
        raise ValueError(f"{text!r}: the year {year} is outside 1970 to 9998")


@dataclass(frozen=True)
class Period:
    """The report's period, in UTC: ``[start, end)``. Calendar periods also as dates (``first`` to
    ``after``, exclusive) for matching a budget's period in its own time zone; a rolling one has
    ``rolling``."""

    label: str
    start: datetime
    end: datetime
    first: date | None = None
    after: date | None = None
    rolling: timedelta | None = None


def _month(year: int, month: int) -> tuple[date, date]:
    first = date(year, month, 1)
    return first, date(year + month // 12, month % 12 + 1, 1)


def now() -> datetime:
    """The report's clock (tests set it, as they set the emulator's)."""
    return datetime.now(UTC)


def _midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def resolve(spec: PeriodSpec, now: datetime) -> Period:
    """The dates and instants of ``spec`` at ``now``. Calendar boundaries are UTC midnights; a
    budget's period matches by its dates in its own time zone."""
    today = now.astimezone(UTC).date()
    if spec.kind == "days":
        assert spec.days is not None
        length = timedelta(days=spec.days)
        return Period(f"the last {spec.days} days", now - length, now, rolling=length)
    if spec.kind == "dates":
        assert spec.dates is not None
        first, after = spec.dates[0], spec.dates[1] + timedelta(days=1)
        return Period(f"{first}..{spec.dates[1]}", _midnight(first), _midnight(after), first, after)
    if spec.kind == "this-month":
        year, month = today.year, today.month
    elif spec.kind == "last-month":
        year, month = (today.year, today.month - 1) if today.month > 1 else (today.year - 1, 12)
    else:
        assert spec.month is not None
        year, month = spec.month
    first, after = _month(year, month)
    return Period(f"{first:%Y-%m}", _midnight(first), _midnight(after), first, after)


# -- the options that select ---------------------------------------------------------------------------

_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_LABEL_NAME}")
_LABEL_VALUE = re.compile(rf"({_LABEL_NAME})?")


def parse_label(text: str) -> tuple[str, str]:
    """``--team-label``'s KEY=VALUE; ValueError naming what is wrong."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"{text!r}: give KEY=VALUE, a label of the team's namespaces (team=vision)")
    if not _LABEL_KEY.fullmatch(key) or len(key) > 317:
        raise ValueError(f"{text!r}: {key!r} is not a label key (such as team or example.com/team)")
    if not _LABEL_VALUE.fullmatch(value) or len(value) > 63:
        raise ValueError(
            f"{text!r}: {value!r} is not a label value (at most 63 letters, digits, '-', '_', '.', "
            "starting and ending with a letter or digit)"
        )
    return key, value


def parse_queue(text: str) -> str:
    """``--queue``: a LocalQueue's name, the value of the jobs' ``kueue.x-k8s.io/queue-name`` label."""
    if not text or not _LABEL_VALUE.fullmatch(text) or len(text) > 63:
        raise ValueError(f"{text!r} is not a queue name (the value of the {QUEUE_LABEL} label of the jobs)")
    return text


# -- the report ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRow:
    """One job's line: its usage in the period as the report counts it."""

    namespace: str
    job: str
    capacities: tuple[str, ...]
    gpu_seconds: int
    cost: Decimal | None
    savings: Decimal | None
    state: str
    currency: str | None = None


@dataclass(frozen=True)
class NamespaceRow:
    """A namespace's total and where it comes from."""

    namespace: str
    source: str
    gpu_seconds: int
    cost: Decimal | None
    savings: Decimal | None
    jobs: int
    currency: str | None = None
    #: The DGXBudget whose ledger gave the total; None: the sum of the live jobs.
    budget: str | None = None


@dataclass(frozen=True)
class Report:
    period: Period
    namespaces: tuple[NamespaceRow, ...]
    jobs: tuple[JobRow, ...]
    notes: tuple[str, ...] = ()
    examples: bool = False

    @property
    def currencies(self) -> tuple[str, ...]:
        found = {n.currency for n in self.namespaces if n.currency} | {j.currency for j in self.jobs if j.currency}
        return tuple(sorted(found))


@dataclass(frozen=True)
class _Job:
    """A live job, read leniently: a report shows what it can of a job it cannot fully parse."""

    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str]
    created: datetime | None
    phase: str
    stored: api.Usage | None
    usage: usage.Usage

    @property
    def running(self) -> bool:
        return bool(self.usage.holding)

    def span(self, now: datetime) -> tuple[datetime, datetime] | None:
        """From its creation to its usage watermark (now while a worker holds a node)."""
        start = self.created or self.usage.until
        if start is None:
            return None
        end = now if self.running else (self.usage.until or start)
        return start, max(start, end)

    def row(self) -> JobRow:
        """Its whole usage (cumulative: every attempt)."""
        priced = self.stored is not None and self.stored.currency is not None
        return JobRow(
            namespace=self.namespace,
            job=self.name,
            capacities=self.capacities,
            gpu_seconds=self.usage.gpu_seconds,
            cost=self.usage.cost if priced else None,
            savings=self.usage.savings if priced else None,
            state=self.phase,
            currency=self.stored.currency if self.stored is not None else None,
        )

    @property
    def capacities(self) -> tuple[str, ...]:
        return tuple(sorted({b.capacity for b in self.usage.buckets if b.gpu_seconds}))


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _job(body: Mapping[str, Any], notes: list[str]) -> _Job | None:
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    stored = None
    if status.get("usage") is not None:
        try:
            stored = api.Usage.model_validate(status["usage"])
        except ValidationError as exc:
            notes.append(f"{namespace}/{name}: status.usage cannot be read ({exc.errors()[0]['msg']}): left out")
            return None
    return _Job(
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid") or ""),
        labels=meta.get("labels") or {},
        created=_parse_time(meta.get("creationTimestamp")),
        phase=str(status.get("phase") or "-"),
        stored=stored,
        usage=usage.from_status(stored),
    )


def _overlaps(job: _Job, period: Period, now: datetime) -> bool:
    span = job.span(now)
    return span is not None and span[0] < period.end and span[1] >= period.start


def _whole_scope(view: spending.BudgetView, queue: str | None) -> bool:
    """Whether the budget counts every job of the report's scope on every capacity: then its ledger
    is the namespace's (or the queue's) total."""
    if view.spec.capacities:
        return False
    selector = view.spec.job_selector
    if selector is not None and selector.match_expressions:
        return False
    labels = dict(selector.match_labels) if selector is not None else {}
    return labels == ({QUEUE_LABEL: queue} if queue else {})


def _dates(window: budgets.Window, view: spending.BudgetView) -> tuple[date, date]:
    zone = view.spec.period.zone
    return window.start.astimezone(zone).date(), window.end.astimezone(zone).date()


@dataclass(frozen=True)
class _Ledgered:
    """A namespace total a budget gives, and its per-job rows where the ledger has them."""

    budget: str
    total: budgets.Amount
    rows: tuple[budgets.Row, ...] | None
    source: str
    #: Jobs counted, where the ledger says (a closed period's history): else the rows listed.
    jobs: int | None = None


def _from_budget(view: spending.BudgetView, jobs: Sequence[_Job], period: Period, now: datetime) -> _Ledgered | None:
    """What ``view``'s ledger, brought to ``now`` with the live jobs, says of ``period``: the current
    calendar period (rows per job), a closed one (its total) or a rolling window of the same length."""
    spec = view.spec
    live = [
        budgets.JobUsage(j.uid, j.name, budgets.scope(j.usage, spec.capacities, since=j.created))
        for j in jobs
        if spec.job_selector is None or budgets.selects(spec.job_selector, j.labels)
    ]
    ledger = budgets.advance(view.ledger, view.spec.period, live, now, existing={j.uid for j in jobs})
    window = ledger.window
    if window is None:
        return None
    if period.rolling is not None:
        if window.rolling == period.rolling:
            return _Ledgered(view.name, budgets.spent(ledger), None, f"DGXBudget {view.name} rolling window")
        return None
    wanted = (period.first, period.after)
    if window.rolling is None and _dates(window, view) == wanted:
        return _Ledgered(view.name, budgets.spent(ledger), ledger.rows, f"DGXBudget {view.name} ledger")
    for closed in ledger.history:
        zone = view.spec.period.zone
        if (closed.start.astimezone(zone).date(), closed.end.astimezone(zone).date()) == wanted:
            amount = budgets.Amount(closed.gpu_seconds, closed.cost)
            return _Ledgered(view.name, amount, None, f"DGXBudget {view.name} history", closed.jobs)
    return None


def build(
    period: Period,
    jobs: Iterable[Mapping[str, Any]],
    budget_objects: Iterable[Mapping[str, Any]],
    namespaces: Iterable[str],
    now: datetime,
    *,
    queue: str | None = None,
) -> Report:
    """The report of ``namespaces`` over ``period``: ``jobs`` and ``budget_objects`` as the API
    server lists them (DGXTrainingJobs and DGXBudgets, any namespaces), ``queue`` the
    ``kueue.x-k8s.io/queue-name`` the jobs must carry."""
    notes: list[str] = []
    parsed = [j for j in (_job(b, notes) for b in jobs) if j is not None]
    if queue is not None:
        parsed = [j for j in parsed if j.labels.get(QUEUE_LABEL) == queue]
    views: list[spending.BudgetView] = []
    for body in budget_objects:
        view = spending.parse_budget(body)
        meta = body.get("metadata") or {}
        if view is None:
            notes.append(f"DGXBudget {meta.get('namespace')}/{meta.get('name')} cannot be read: its ledger is not used")
        else:
            views.append(view)
    ns_rows: list[NamespaceRow] = []
    job_rows: list[JobRow] = []
    without_ledger: list[str] = []
    for ns in sorted(set(namespaces)):
        mine = sorted((j for j in parsed if j.namespace == ns), key=lambda j: j.name)
        by_uid = {j.uid: j for j in mine}
        currency = next((j.stored.currency for j in mine if j.stored is not None and j.stored.currency), None)
        ledgered = None
        for view in sorted((v for v in views if v.namespace == ns), key=lambda v: v.name):
            if _whole_scope(view, queue) and view.ledger.window is None:
                # Never counted (no operator counts budgets yet, or not this one): a ledger made up here
                # from the live jobs would pass their sum off as one that includes the deleted jobs.
                notes.append(f"DGXBudget {ns}/{view.name} has not counted anything yet (no status.period): not used")
            elif _whole_scope(view, queue):
                ledgered = _from_budget(view, mine, period, now)
                if ledgered is not None:
                    currency = currency or _currency(budget_objects, ns, view.name)
                    break
        rows: list[JobRow] = []
        if ledgered is not None and ledgered.rows is not None:
            for r in ledgered.rows:
                live = by_uid.get(r.uid)
                if live is None:
                    if r.used:
                        rows.append(JobRow(ns, r.job, (), r.gpu_seconds, r.cost, None, DELETED, currency))
                    continue
                whole = live.row()
                if not r.used and not _overlaps(live, period, now):
                    continue
                # The job's savings are its whole usage's: they are the period's when the period
                # counted all of it (the job ran in this period only), else unknown.
                saved = whole.savings if r.gpu_seconds == whole.gpu_seconds else None
                rows.append(JobRow(ns, r.job, whole.capacities, r.gpu_seconds, r.cost, saved, live.phase, currency))
            listed = {r.uid for r in ledgered.rows}
            rows += [j.row() for j in mine if j.uid not in listed and _overlaps(j, period, now)]
        else:
            rows = [j.row() for j in mine if _overlaps(j, period, now)]
        rows.sort(key=lambda r: r.job)
        job_rows += rows
        savings = _sum_or_none(r.savings for r in rows)
        if ledgered is not None:
            if ledgered.rows is None:  # the total has jobs the rows lack, and their savings are not kept
                savings = None
            ns_rows.append(
                NamespaceRow(
                    ns,
                    ledgered.source,
                    ledgered.total.gpu_seconds,
                    ledgered.total.cost if currency else None,
                    savings,
                    len(rows) if ledgered.jobs is None else ledgered.jobs,
                    currency,
                    budget=ledgered.budget,
                )
            )
            if ledgered.rows is None:
                notes.append(
                    f"{ns}: the total is from {ledgered.source}, which keeps totals only: the jobs listed are the live "
                    f"ones whose run overlaps {period.label} (with their whole usage); jobs deleted since are in the "
                    "total, not listed, and its spot savings are not known"
                )
        else:
            without_ledger.append(ns)
            ns_rows.append(
                NamespaceRow(
                    ns,
                    "live jobs",
                    sum(r.gpu_seconds for r in rows),
                    _sum_or_none(r.cost for r in rows),
                    savings,
                    len(rows),
                    currency,
                )
            )
    if without_ledger:
        scope = f"queue {queue}" if queue else "the whole namespace"
        notes.append(
            f"{', '.join(without_ledger)}: no DGXBudget counts {scope} in {period.label}: the total is the sum of the "
            "live jobs, and jobs deleted before now are not in it; a live job whose run overlaps the period counts "
            "with its whole usage (a job's usage has no per-day breakdown). For an exact ledger per period, create "
            "a DGXBudget with enforcement: Report, a calendar Month period and no jobSelector or capacities "
            "(docs/cost.md, The report)"
        )
    if any(r.savings is None and r.cost is not None for r in job_rows):
        notes.append(
            "SPOT SAVED '-': the budget ledger keeps no savings (a deleted job's are unknown), and a live job's are "
            "known for its whole usage only; a total with such a job shows '-'"
        )
    unpriced = [
        j for j in parsed if j.stored is not None and j.stored.unpriced_gpu_seconds and j.namespace in namespaces
    ]
    if unpriced:
        names = ", ".join(f"{j.namespace}/{j.name}" for j in unpriced)
        notes.append(f"{names}: some GPU-hours ran on instances without a price: they are in GPU-HOURS, not in COST")
    examples = any(j.stored is not None and j.stored.example_prices for j in parsed if j.namespace in namespaces)
    if examples:
        notes.append("example prices: the catalog's shipped prices, not this cluster's (an admin sets catalog.pricing)")
    return Report(period, tuple(ns_rows), tuple(job_rows), tuple(notes), examples)


def _currency(budget_objects: Iterable[Mapping[str, Any]], namespace: str, name: str) -> str | None:
    for body in budget_objects:
        meta = body.get("metadata") or {}
        if meta.get("namespace") == namespace and meta.get("name") == name:
            found = (body.get("status") or {}).get("currency")
            return str(found) if found else None
    return None


def _sum_or_none(values: Iterable[Decimal | None]) -> Decimal | None:
    """The sum, or None when any part is unknown (never a total that silently leaves some out)."""
    total = Decimal(0)
    for value in values:
        if value is None:
            return None
        total += value
    return total


# -- formatting --------------------------------------------------------------------------------------------


def money(value: Decimal | None) -> str:
    """Two decimals, half up, as invoices round; ``-`` where unknown or unpriced."""
    return "-" if value is None else format(value.quantize(_CENT, rounding=ROUND_HALF_UP), "f")


def hours(gpu_seconds: int) -> str:
    return format((Decimal(gpu_seconds) / 3600).quantize(_CENT, rounding=ROUND_HALF_UP), "f")


def _table(rows: Sequence[Sequence[str]], right: Iterable[int]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    aligned = set(right)
    lines = []
    for r in rows:
        cells = [c.rjust(w) if i in aligned else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def _cost_header(report: Report) -> tuple[str, str]:
    single = report.currencies[0] if len(report.currencies) == 1 else None
    unit = f" ({single})" if single else ""
    return f"COST{unit}", f"SPOT SAVED{unit}"


def _money_cell(value: Decimal | None, currency: str | None, report: Report) -> str:
    text = money(value)
    return f"{text} {currency}" if value is not None and currency and len(report.currencies) > 1 else text


def render_table(report: Report) -> str:
    """The namespaces' totals, then the jobs; the currency in the headers (in each cell when the
    jobs' usage names more than one)."""
    cost, saved = _cost_header(report)
    head = (
        f"PERIOD {report.period.label}: {report.period.start:%Y-%m-%d %H:%M} to {report.period.end:%Y-%m-%d %H:%M} UTC"
    )
    if report.examples:
        head += " (example prices)"
    totals: list[tuple[str, ...]] = [("NAMESPACE", "GPU-HOURS", cost, saved, "JOBS", "SOURCE")]
    for n in report.namespaces:
        totals.append(
            (
                n.namespace,
                hours(n.gpu_seconds),
                _money_cell(n.cost, n.currency, report),
                _money_cell(n.savings, n.currency, report),
                str(n.jobs),
                n.source,
            )
        )
    if len(report.namespaces) > 1:
        single = len(report.currencies) <= 1
        totals.append(
            (
                "TOTAL",
                hours(sum(n.gpu_seconds for n in report.namespaces)),
                money(_sum_or_none(n.cost for n in report.namespaces)) if single else "-",
                money(_sum_or_none(n.savings for n in report.namespaces)) if single else "-",
                str(sum(n.jobs for n in report.namespaces)),
                "",
            )
        )
    text = head + "\n\n" + _table(totals, right=(1, 2, 3, 4))
    if report.jobs:
        rows: list[tuple[str, ...]] = [("NAMESPACE", "JOB", "CAPACITY", "GPU-HOURS", cost, saved, "STATE")]
        for j in report.jobs:
            rows.append(
                (
                    j.namespace,
                    j.job,
                    ",".join(j.capacities) or "-",
                    hours(j.gpu_seconds),
                    _money_cell(j.cost, j.currency, report),
                    _money_cell(j.savings, j.currency, report),
                    j.state,
                )
            )
        text += "\n" + _table(rows, right=(3, 4, 5))
    return text


def _amount(value: Decimal | None) -> str | None:
    return None if value is None else money(value)


def to_json(report: Report) -> dict[str, Any]:
    """The report as data (amounts as two-decimal strings, as the API's status writes them)."""
    p = report.period
    return {
        "period": {
            "label": p.label,
            "start": p.start.isoformat(),
            "end": p.end.isoformat(),
            "rolling": None if p.rolling is None else f"{int(p.rolling.total_seconds() // 3600)}h",
        },
        "examplePrices": report.examples,
        "namespaces": [
            {
                "namespace": n.namespace,
                "source": n.source,
                "budget": n.budget,
                "gpuSeconds": n.gpu_seconds,
                "gpuHours": hours(n.gpu_seconds),
                "cost": _amount(n.cost),
                "spotSavings": _amount(n.savings),
                "currency": n.currency,
                "jobs": n.jobs,
            }
            for n in report.namespaces
        ],
        "jobs": [
            {
                "namespace": j.namespace,
                "job": j.job,
                "capacities": list(j.capacities),
                "gpuSeconds": j.gpu_seconds,
                "gpuHours": hours(j.gpu_seconds),
                "cost": _amount(j.cost),
                "spotSavings": _amount(j.savings),
                "currency": j.currency,
                "state": j.state,
            }
            for j in report.jobs
        ],
        "notes": list(report.notes),
    }


def render_json(report: Report) -> str:
    return json.dumps(to_json(report), indent=2) + "\n"


def render_csv(report: Report) -> str:
    """One row per namespace total (``kind`` namespace) and per job (``kind`` job), for a spreadsheet."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(
        ["kind", "namespace", "job", "capacities", "gpu_hours", "cost", "spot_savings", "currency", "state_or_source"]
    )
    for n in report.namespaces:
        writer.writerow(
            ["namespace", n.namespace, "", "", hours(n.gpu_seconds), _amount(n.cost) or "", _amount(n.savings) or "",
             n.currency or "", n.source]
        )  # fmt: skip
    for j in report.jobs:
        writer.writerow(
            ["job", j.namespace, j.job, " ".join(j.capacities), hours(j.gpu_seconds), _amount(j.cost) or "",
             _amount(j.savings) or "", j.currency or "", j.state]
        )  # fmt: skip
    return buffer.getvalue()


RENDERERS = {"table": render_table, "json": render_json, "csv": render_csv}


# -- reading the cluster -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """What :func:`build` needs, as the API server listed it."""

    namespaces: tuple[str, ...]
    jobs: tuple[dict[str, Any], ...]
    budgets: tuple[dict[str, Any], ...]


def read(
    client: Any,
    *,
    namespace: str | None,
    all_namespaces: bool,
    team: tuple[str, str] | None,
    queue: str | None,
) -> Inputs:
    """List the jobs and budgets in scope with the user's credentials (RBAC decides what a user
    sees): one namespace, every namespace (``-A``), or the namespaces labelled ``team``.
    ``client``: a :class:`~dgx_operator.client.kubeclient.Client`."""
    from dgx_operator.client.kubeclient import ClusterError, NotFoundError

    selector = f"{QUEUE_LABEL}={queue}" if queue else None

    def path(plural: str, ns: str | None) -> str:
        return f"/apis/{GROUP}/{VERSION}" + (f"/namespaces/{ns}" if ns else "") + f"/{plural}"

    def jobs_in(ns: str | None) -> list[dict[str, Any]]:
        try:
            found: list[dict[str, Any]] = client.list(path(TRAINING_JOBS.plural, ns), selector)
            return found
        except NotFoundError:
            raise ClusterError(
                f"the API server does not serve {TRAINING_JOBS.plural}.{GROUP}: are kubedgx's CRDs installed "
                "(kubedgx crds | kubectl apply -f -)?"
            ) from None

    def budgets_in(ns: str | None) -> list[dict[str, Any]]:
        try:
            found: list[dict[str, Any]] = client.list(path(BUDGETS.plural, ns))
            return found
        except NotFoundError:  # a cluster without the DGXBudget CRD: no ledgers
            return []

    if team is not None:
        key, value = team
        listed = client.list("/api/v1/namespaces", f"{key}={value}")
        names = tuple(sorted(str((n.get("metadata") or {}).get("name")) for n in listed))
        jobs: list[dict[str, Any]] = []
        kept: list[dict[str, Any]] = []
        for ns in names:
            jobs += jobs_in(ns)
            kept += budgets_in(ns)
        return Inputs(names, tuple(jobs), tuple(kept))
    if all_namespaces:
        jobs, kept = jobs_in(None), budgets_in(None)
        seen = {str((o.get("metadata") or {}).get("namespace")) for o in (*jobs, *kept)}
        return Inputs(tuple(sorted(seen)), tuple(jobs), tuple(kept))
    ns = namespace or client.namespace
    return Inputs((ns,), tuple(jobs_in(ns)), tuple(budgets_in(ns)))
