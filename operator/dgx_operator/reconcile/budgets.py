"""DGXBudget arithmetic (issue 31): periods, settling jobs' usage into a ledger, reservations, and
whether a run fits. Pure: no client, no kopf; the controller reads the budget's status into a
:class:`Ledger` (:func:`from_status`), applies these functions, and writes :func:`render_status` back
with the budget's ``resourceVersion`` (a 409 re-plans from the fresh budget).

Why a ledger and not a sum over jobs: a job deleted by its TTL takes its ``status.usage`` with it,
so the budget keeps its own copy of what each job used, and what it had *seen* of the job's usage
(cumulative GPU-seconds and money, and the usage watermark). Settling adds only the growth since
then, so settling twice, after an operator restart, by a new leader, or from a stale read, adds
nothing. The delta is spread evenly over the time it covers, ``(seen_until, until]``: the part
before the period started is dropped (that period is closed), the part after the stored period's
end is left for the next period (its seen values stay at the boundary), and a rolling window
splits it into hourly buckets.

Numbers are exact: GPU-seconds are integers and money is :class:`~decimal.Decimal` rounded once per
value to :data:`MONEY_QUANTUM`. A job's cumulative cost is rounded (not its deltas), so the deltas
telescope: however often a job is settled within a period, the period counts exactly its cost.
A split at a boundary rounds down the earlier part, so the parts always add up to the whole.

All datetimes are timezone-aware; internally UTC (differences of two datetimes in one ``ZoneInfo``
are wall-clock differences in Python, wrong across a DST change). Time zones only place calendar
boundaries and appear in messages.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_FLOOR, ROUND_HALF_UP, Context, Decimal

from dgx_operator.api.budget import (
    MAX_HISTORY,
    Capacity,
    ClosedPeriod,
    DGXBudgetSpec,
    DGXBudgetStatus,
    HourBucket,
    LabelSelector,
    LedgerRow,
    Period,
    Totals,
)
from dgx_operator.api.budget import Reservation as ReservationModel
from dgx_operator.api.budget import Window as WindowModel
from dgx_operator.api.common import Condition, parse_duration
from dgx_operator.reconcile.usage import Usage

#: Money is kept to a billionth of the currency: fine enough that rounding never shows in two decimals
#: after a million settles, coarse enough to be an exact decimal string in the status.
MONEY_QUANTUM = Decimal("1e-9")
#: Enough digits that no intermediate product (GPU-seconds x price) is ever rounded.
_EXACT = Context(prec=60)
_CENT = Decimal("0.01")
_HOUR = timedelta(hours=1)
_SECOND = timedelta(seconds=1)
_TICK = timedelta(microseconds=1)
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
ZERO = Decimal(0)


# -- periods -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """The period a ledger counts, in UTC: ``[start, end)`` for a calendar period; for a rolling window
    ``(start, end]`` with ``end`` the time it was computed at and ``rolling`` its length."""

    start: datetime
    end: datetime
    rolling: timedelta | None = None


def current_period(period: Period, now: datetime) -> Window:
    """The period ``now`` falls in. Calendar: from local midnight of the 1st of the month (Month) or of
    the last ``weekStart`` (Week) in ``period.timeZone``, to the same local midnight a month or a week
    later, so a period containing a DST change is an hour shorter or longer. Rolling: ``(now - length,
    now]``."""
    now = _utc(now)
    if period.rolling is not None:
        length = _whole_seconds(parse_duration(period.rolling))
        return Window(now - length, now, length)
    zone = period.zone
    today = now.astimezone(zone).date()
    if period.calendar == "Week":
        first = today - timedelta(days=(today.weekday() - _WEEKDAYS.index(period.week_start or "Monday")) % 7)
        after = first + timedelta(days=7)
    else:
        first = today.replace(day=1)
        after = date(first.year + first.month // 12, first.month % 12 + 1, 1)
    return Window(_midnight(first, period), _midnight(after, period), None)


def _midnight(day: date, period: Period) -> datetime:
    """Local midnight of ``day`` in UTC. Where clocks jump over midnight, zoneinfo's fold=0 maps the
    missing 00:00 to the instant of the jump, the day's first instant."""
    return datetime.combine(day, time(0), tzinfo=period.zone).astimezone(UTC)


def _utc(moment: datetime) -> datetime:
    """``moment`` in UTC; a naive one (never written by the operator) is taken as UTC."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _whole_seconds(delta: timedelta) -> timedelta:
    return timedelta(seconds=round(delta / _SECOND))


# -- a job's usage, scoped ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Scoped:
    """A job's cumulative usage on the capacities a budget counts."""

    gpu_seconds: int = 0
    #: The money of the priced part, rounded to :data:`MONEY_QUANTUM`.
    cost: Decimal = ZERO
    #: The job's usage watermark (``Usage.until``): everything up to here is in the numbers.
    until: datetime | None = None
    #: Of ``gpu_seconds``, those on an instance the catalog had no price for (in no ``cost``).
    unpriced_gpu_seconds: int = 0
    #: When the job's usage may have begun (its creation): a job settled for the first time spreads its
    #: usage from here, so a budget created mid-period counts only the part since the period started.
    #: None: all of it is taken as used at ``until``.
    since: datetime | None = None


@dataclass(frozen=True)
class JobUsage:
    """A live job as a budget sees it."""

    uid: str
    name: str
    scoped: Scoped


def scope(usage: Usage, capacities: Collection[str], since: datetime | None = None) -> Scoped:
    """``usage`` restricted to ``capacities`` (empty: all): the GPU-seconds of the buckets on them,
    the money of those with a price (GPU-seconds x price / 3600, summed exactly, rounded once), the
    GPU-seconds without a price, and the watermark. ``since`` is passed through (see :class:`Scoped`)."""
    buckets = [b for b in usage.buckets if not capacities or b.capacity in capacities]
    price_seconds = sum((b.gpu_seconds * b.price for b in buckets if b.price is not None), ZERO)
    return Scoped(
        gpu_seconds=sum(b.gpu_seconds for b in buckets),
        cost=_money(_EXACT.divide(price_seconds, Decimal(3600))),
        until=usage.until,
        unpriced_gpu_seconds=sum(b.gpu_seconds for b in buckets if b.price is None),
        since=since,
    )


def _money(value: Decimal, rounding: str = ROUND_FLOOR) -> Decimal:
    return value.quantize(MONEY_QUANTUM, rounding=rounding, context=_EXACT)


# -- the ledger ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """A job in the ledger: what was seen of its usage, and what counted in the current period (for a
    rolling window: everything settled since the row began; the window's spend is in the buckets)."""

    job: str
    uid: str
    seen_gpu_seconds: int = 0
    seen_cost: Decimal = ZERO
    seen_until: datetime | None = None
    gpu_seconds: int = 0
    cost: Decimal = ZERO
    unpriced: bool = False

    @property
    def used(self) -> bool:
        return self.gpu_seconds > 0 or self.cost > 0


@dataclass(frozen=True)
class Hour:
    """One hour of a rolling window: ``[start, start + 1h)`` in UTC."""

    start: datetime
    gpu_seconds: int = 0
    cost: Decimal = ZERO


@dataclass(frozen=True)
class Reservation:
    """A run's worst case: ``nodes x gpus_per_node`` GPUs from ``start`` until ``until`` (the run's
    start plus ``maxDuration``; None: no bound) at ``price`` per GPU-hour (None: unpriced)."""

    job: str
    uid: str
    capacity: Capacity
    nodes: int
    gpus_per_node: int
    price: Decimal | None
    start: datetime
    until: datetime | None

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def gpu_seconds_from(self, begin: datetime) -> int:
        """GPU-seconds it may still use from ``begin`` on (0 past ``until``); unbounded: 0."""
        if self.until is None:
            return 0
        return self.gpus * max(0, int((_utc(self.until) - _utc(begin)) // _SECOND))


@dataclass(frozen=True)
class Closed:
    """A calendar period that ended."""

    start: datetime
    end: datetime
    gpu_seconds: int
    cost: Decimal
    jobs: int


@dataclass(frozen=True)
class Ledger:
    """A budget's state, as its status stores it (:func:`from_status`, :func:`render_status`)."""

    window: Window | None = None
    rows: tuple[Row, ...] = ()
    hours: tuple[Hour, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    history: tuple[Closed, ...] = ()

    def row(self, uid: str) -> Row | None:
        return next((r for r in self.rows if r.uid == uid), None)


@dataclass(frozen=True)
class _Spread:
    """A usage delta spread evenly over ``(start, end]``, or all at ``end`` when ``start`` is None or
    not before it. :meth:`by` is the part used by a moment, rounded down, so that the parts between
    any cuts are integers and exact decimals that add up to the whole."""

    gpu_seconds: int
    cost: Decimal
    start: datetime | None
    end: datetime

    def by(self, moment: datetime) -> tuple[int, Decimal]:
        if self.start is None or self.start >= self.end:
            return (self.gpu_seconds, self.cost) if moment >= self.end else (0, ZERO)
        if moment <= self.start:
            return 0, ZERO
        if moment >= self.end:
            return self.gpu_seconds, self.cost
        done, whole = (moment - self.start) // _TICK, (self.end - self.start) // _TICK
        return self.gpu_seconds * done // whole, _money(_EXACT.divide(self.cost * done, Decimal(whole)))

    def between(self, first: datetime, last: datetime) -> tuple[int, Decimal]:
        (g0, c0), (g1, c1) = self.by(first), self.by(last)
        return g1 - g0, c1 - c0


def settle(ledger: Ledger, job: JobUsage, window: Window) -> Ledger:
    """``ledger`` with what ``job``'s scoped usage grew by since its row last saw it, in ``window``.

    The growth (never negative: a usage below what was seen adds nothing) is spread evenly over
    ``(seen_until, until]`` (a first settle: from ``scoped.since``). Calendar window: the part
    inside ``[start, end)`` counts; the part before ``start`` is dropped; the part after ``end`` is
    not seen yet (``seen_until`` stops at ``end``), so settling again after :func:`roll` counts it in
    the new period. Rolling window: the part after ``start`` goes into hourly buckets. The row's seen
    values move in the same result, so settling the same usage again adds nothing. A job without a
    watermark, or without usage and without a row, leaves the ledger as it is."""
    scoped = job.scoped
    if scoped.until is None:
        return ledger
    old = ledger.row(job.uid)
    row = old or Row(job=job.name, uid=job.uid, seen_until=scoped.since)
    until = _utc(scoped.until)
    gpu = max(0, scoped.gpu_seconds - row.seen_gpu_seconds)
    cost = max(ZERO, scoped.cost - row.seen_cost)
    if old is None and gpu == 0 and cost == 0:
        return ledger
    begin = None if row.seen_until is None else _utc(row.seen_until)
    spread = _Spread(gpu, cost, begin, max(until, begin) if begin is not None else until)
    unpriced = row.unpriced or scoped.unpriced_gpu_seconds > 0
    if window.rolling is not None:
        hours, counted = _into_hours(ledger.hours, spread, window.start)
        row = _advance(row, spread.by(spread.end), counted, spread.end, unpriced, job.name)
        return replace(ledger, rows=_put(ledger.rows, row), hours=hours)
    counted = spread.between(window.start, window.end)
    if spread.end > window.end:
        row = _advance(row, spread.by(window.end), counted, window.end, unpriced, job.name)
    else:
        row = _advance(row, spread.by(spread.end), counted, spread.end, unpriced, job.name)
    return replace(ledger, rows=_put(ledger.rows, row))


def _advance(
    row: Row, seen: tuple[int, Decimal], counted: tuple[int, Decimal], until: datetime, unpriced: bool, name: str
) -> Row:
    previous = None if row.seen_until is None else _utc(row.seen_until)
    return replace(
        row,
        job=name,
        seen_gpu_seconds=row.seen_gpu_seconds + seen[0],
        seen_cost=row.seen_cost + seen[1],
        seen_until=until if previous is None else max(previous, until),
        gpu_seconds=row.gpu_seconds + counted[0],
        cost=row.cost + counted[1],
        unpriced=unpriced,
    )


def _into_hours(
    hours: tuple[Hour, ...], spread: _Spread, after: datetime
) -> tuple[tuple[Hour, ...], tuple[int, Decimal]]:
    """``hours`` with the part of ``spread`` after ``after`` added hour by hour, and that part's total.
    All at one moment (no start): into the hour that moment ends or falls in."""
    if spread.end <= after:
        return hours, (0, ZERO)
    start = spread.start if spread.start is not None and spread.start < spread.end else spread.end - _TICK
    table = {h.start: h for h in hours}
    total_gpu, total_cost = 0, ZERO
    hour = _hour_of(max(start, after))
    while hour < spread.end:
        gpu, cost = spread.between(max(hour, after), min(hour + _HOUR, spread.end))
        if gpu or cost:
            old = table.get(hour, Hour(hour))
            table[hour] = Hour(hour, old.gpu_seconds + gpu, old.cost + cost)
            total_gpu, total_cost = total_gpu + gpu, total_cost + cost
        hour += _HOUR
    return tuple(sorted(table.values(), key=lambda h: h.start)), (total_gpu, total_cost)


def _hour_of(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def _put(rows: tuple[Row, ...], row: Row) -> tuple[Row, ...]:
    return tuple(sorted([*(r for r in rows if r.uid != row.uid), row], key=lambda r: (r.job, r.uid)))


def roll(ledger: Ledger, period: Period, now: datetime, live: Collection[str]) -> Ledger:
    """``ledger`` moved to the period ``now`` is in. ``live``: the uids of the budget's jobs that still
    exist.

    Calendar: while ``now`` is inside the stored period nothing changes. Once past its end (or when the
    spec's period changed), the stored period closes into ``history`` (newest first, the last
    :data:`~dgx_operator.api.budget.MAX_HISTORY`; a period changed mid-way closes at ``now``), and the
    new one starts with the live jobs' rows only, their counted amounts zero and their seen values
    kept, so their next settle adds only what is new; a deleted job's row leaves. Settle the live jobs
    into the stored period before rolling (:func:`advance` does both), or their last stretch before
    the boundary is lost.

    Rolling: the window moves to ``(now - length, now]``; hours that ended before it leave, and so do
    rows of deleted jobs last settled before it. A ledger without a period starts the current one.
    Reservations are kept, whatever ``live`` says: they are runs in progress until :func:`release`."""
    window = current_period(period, now)
    stored = ledger.window
    if stored is None:
        return replace(ledger, window=window)
    if window.rolling is not None:
        kept = ledger
        if stored.rolling is None:
            kept = _close(ledger, stored, _utc(now), live)
        hours = tuple(h for h in kept.hours if h.start + _HOUR > window.start)
        rows = tuple(
            r for r in kept.rows if r.uid in live or (r.seen_until is not None and _utc(r.seen_until) > window.start)
        )
        return replace(kept, window=window, hours=hours, rows=rows)
    if stored.rolling is not None:  # a rolling window became a calendar period: its hours have no place
        rows = tuple(_fresh(r) for r in ledger.rows if r.uid in live)
        return replace(ledger, window=window, rows=rows, hours=())
    unchanged = current_period(period, stored.start) == stored
    if unchanged and _utc(now) < stored.end:  # still in it (or a clock that went back): nothing to roll
        return ledger
    return replace(_close(ledger, stored, _utc(now), live), window=window)


def _close(ledger: Ledger, stored: Window, now: datetime, live: Collection[str]) -> Ledger:
    end = min(stored.end, max(stored.start, now))
    closed = Closed(
        start=stored.start,
        end=end,
        gpu_seconds=sum(r.gpu_seconds for r in ledger.rows),
        cost=sum((r.cost for r in ledger.rows), ZERO),
        jobs=sum(1 for r in ledger.rows if r.used),
    )
    rows = tuple(_fresh(r) for r in ledger.rows if r.uid in live)
    return replace(ledger, rows=rows, history=(closed, *ledger.history)[:MAX_HISTORY], hours=())


def _fresh(row: Row) -> Row:
    return replace(row, gpu_seconds=0, cost=ZERO, unpriced=False)


def advance(
    ledger: Ledger,
    period: Period,
    jobs: Iterable[JobUsage],
    now: datetime,
    existing: Collection[str] | None = None,
) -> Ledger:
    """What a pass does to a ledger: settle ``jobs`` (every live job the budget covers, with its usage
    scoped to the budget's capacities) into the stored period, roll to ``now``, and settle them again
    (the part after a boundary, counted in the new period). ``existing``: the uids of every job of the
    namespace that still exists (default: those of ``jobs``); a row of one not in it leaves at a roll,
    and a job that exists but lost its row would be counted again from ``scoped.since``. Idempotent:
    the same jobs at the same ``now`` change nothing the second time."""
    jobs = list(jobs)
    if ledger.window is not None:
        for job in jobs:
            ledger = settle(ledger, job, ledger.window)
    live = {j.uid for j in jobs} if existing is None else {*existing, *(j.uid for j in jobs)}
    ledger = roll(ledger, period, now, live)
    assert ledger.window is not None
    for job in jobs:
        ledger = settle(ledger, job, ledger.window)
    return ledger


# -- reservations and what is committed ----------------------------------------------------------------


def reserve(ledger: Ledger, reservation: Reservation) -> Ledger:
    """``ledger`` with ``reservation``, replacing the job's previous one (a new run reserves again)."""
    kept = tuple(r for r in ledger.reservations if r.uid != reservation.uid)
    return replace(ledger, reservations=tuple(sorted([*kept, reservation], key=lambda r: (r.job, r.uid))))


def release(ledger: Ledger, uid: str) -> Ledger:
    """``ledger`` without the reservation of job ``uid`` (its run ended); unchanged if it has none."""
    return replace(ledger, reservations=tuple(r for r in ledger.reservations if r.uid != uid))


@dataclass(frozen=True)
class Amount:
    """GPU-seconds and money."""

    gpu_seconds: int = 0
    cost: Decimal = ZERO

    def __add__(self, other: Amount) -> Amount:
        return Amount(self.gpu_seconds + other.gpu_seconds, self.cost + other.cost)


@dataclass(frozen=True)
class Committed(Amount):
    """What reservations may still use. Runs without a price or without ``maxDuration`` cannot be put in
    numbers: they are named, and counted as nothing (only :attr:`~DGXBudgetSpec.enforcement` Report, or
    a budget created after they started, lets such a run in)."""

    unpriced: tuple[str, ...] = ()
    unbounded: tuple[str, ...] = ()


def committed(ledger: Ledger, watermarks: Mapping[str, datetime | None], *, excluding: str | None = None) -> Committed:
    """The worst case still ahead of each reservation (but job ``excluding``'s): ``nodes x gpusPerNode``
    GPUs from the job's usage watermark (``watermarks[uid]``; the reservation's start when the job has
    none or an older one) until ``until``, at its price. Counted from the watermark, not from now,
    because the job's usage is exact up to the watermark and nothing covers the time after it: settled
    spend + unsettled usage + committed then covers the whole run with no gap."""
    gpu, cost, unpriced, unbounded = 0, ZERO, [], []
    for r in ledger.reservations:
        if r.uid == excluding:
            continue
        if r.until is None:
            unbounded.append(r.job)
            continue
        mark = watermarks.get(r.uid)
        begin = _utc(r.start) if mark is None else max(_utc(r.start), _utc(mark))
        seconds = r.gpu_seconds_from(begin)
        gpu += seconds
        if r.price is None:
            unpriced.append(r.job)
        else:
            cost += _money(_EXACT.divide(seconds * r.price, Decimal(3600)), ROUND_HALF_UP)
    return Committed(gpu, cost, tuple(unpriced), tuple(unbounded))


def spent(ledger: Ledger, window: Window | None = None) -> Amount:
    """Settled spend in ``window`` (default: the stored one). Calendar: the ledger's counted amounts.
    Rolling: the hours that end after the window's start (an hour straddling it counts whole: at most
    an hour's spend too much, never too little)."""
    window = window or ledger.window
    if window is not None and window.rolling is not None:
        hours = [h for h in ledger.hours if h.start + _HOUR > window.start]
        return Amount(sum(h.gpu_seconds for h in hours), sum((h.cost for h in hours), ZERO))
    return Amount(sum(r.gpu_seconds for r in ledger.rows), sum((r.cost for r in ledger.rows), ZERO))


# -- which jobs a budget covers, and whether a run fits -------------------------------------------------


def covers(spec: DGXBudgetSpec, labels: Mapping[str, str], capacity: str) -> bool:
    """Whether a job with ``labels`` running on ``capacity`` (after Kueue's flavor) counts in a budget
    with ``spec``: its capacity is listed (or none are) and its labels match ``jobSelector``."""
    if spec.capacities and capacity not in spec.capacities:
        return False
    return spec.job_selector is None or selects(spec.job_selector, labels)


def selects(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics: every matchLabels pair and every requirement (NotIn and
    DoesNotExist match a job without the key)."""
    if any(labels.get(k) != v for k, v in selector.match_labels.items()):
        return False
    for req in selector.match_expressions:
        present = req.key in labels
        ok = {
            "In": present and labels.get(req.key) in req.values,
            "NotIn": not present or labels.get(req.key) not in req.values,
            "Exists": present,
            "DoesNotExist": not present,
        }[req.operator]
        if not ok:
            return False
    return True


@dataclass(frozen=True)
class Verdict:
    """Whether a run may start; ``message`` says why not, for the job's condition (reason BudgetExceeded)."""

    ok: bool
    message: str = ""


def worst_case(candidate: Reservation) -> Amount | None:
    """A run's whole worst case, from its start to ``until``; None when unbounded. Unpriced: cost 0."""
    if candidate.until is None:
        return None
    seconds = candidate.gpu_seconds_from(candidate.start)
    price = candidate.price if candidate.price is not None else ZERO
    return Amount(seconds, _money(_EXACT.divide(seconds * price, Decimal(3600)), ROUND_HALF_UP))


def fits(
    budget: str,
    spec: DGXBudgetSpec,
    ledger: Ledger,
    live: Iterable[JobUsage],
    candidate: Reservation,
    now: datetime,
    currency: str | None,
) -> Verdict:
    """Whether ``candidate``'s run (``start`` = now, ``until`` = now + maxDuration) may start under the
    budget named ``budget`` (``namespace/name``, for the message).

    Always yes for ``enforcement: Report`` and for a candidate on a capacity the budget does not list
    (the caller checks the job selector with :func:`covers`). Otherwise, for each limit set: the spend
    of the period (settled, plus what ``live``, every live job the budget covers with its scoped usage,
    the candidate included, used since it was last settled) + what the other reservations may still use
    (:func:`committed`) + the candidate's whole worst case must not exceed it. A candidate without
    ``until`` never fits; nor does an unpriced one under a cost limit. The ledger is brought to ``now``
    first (:func:`advance`, on a copy: nothing is written). The message names the budget, the numbers,
    the period and what would let the run start."""
    if spec.enforcement == "Report" or (spec.capacities and candidate.capacity not in spec.capacities):
        return Verdict(True)
    jobs = list(live)
    current = advance(ledger, spec.period, jobs, now)
    assert current.window is not None
    head = f"DGXBudget {budget}"
    case = worst_case(candidate)
    if case is None:
        return Verdict(
            False,
            f"{head}: this run has no worst case to reserve: set spec.maxDuration (the budget holds a run until "
            "its nodes x GPUs x price x maxDuration fits)",
        )
    limits = spec.limits
    if limits.cost is not None and candidate.price is None:
        return Verdict(
            False,
            f"{head} limits cost, and this run's instance has no price in the catalog (catalog.pricing): it "
            "cannot be counted; it starts when a price is set or the budget's cost limit is removed",
        )
    used = spent(current)
    others = committed(current, {j.uid: j.scoped.until for j in jobs}, excluding=candidate.uid)
    when = _when(spec.period, current.window)
    problems = []
    if limits.gpu_hours is not None:
        limit = Decimal(limits.gpu_hours) * 3600
        if used.gpu_seconds + others.gpu_seconds + case.gpu_seconds > limit:
            problems.append(
                f"this run's worst case {_shape(candidate)} = {_hours(case.gpu_seconds)} GPU-hours does not fit: "
                f"spent {_hours(used.gpu_seconds)} + committed {_hours(others.gpu_seconds)} of "
                f"{_two(Decimal(limits.gpu_hours))} GPU-hours ({when})"
                + (", and alone exceeds the limit" if case.gpu_seconds > limit else "")
            )
    if limits.cost is not None and candidate.price is not None:
        limit = Decimal(limits.cost)
        unit = f" {currency}" if currency else ""
        if used.cost + others.cost + case.cost > limit:
            problems.append(
                f"this run's worst case {_shape(candidate, candidate.price, unit)} = {_two(case.cost)}{unit} does "
                f"not fit: spent {_two(used.cost)} + committed {_two(others.cost)} of {_two(limit)}{unit} ({when})"
                + (", and alone exceeds the limit" if case.cost > limit else "")
            )
    if not problems:
        return Verdict(True)
    if any(p.endswith("alone exceeds the limit") for p in problems):
        unblock = "the budget is raised or the run asks for less (fewer nodes, a shorter spec.maxDuration)"
    else:
        unblock = _unblock(spec.period, current.window)
    return Verdict(False, f"{head}: " + "; ".join(problems) + f"; it starts when {unblock}")


def _shape(r: Reservation, price: Decimal | None = None, unit: str = "") -> str:
    nodes = f"{r.nodes} node{'s' if r.nodes != 1 else ''}"
    gpus = f"{r.gpus_per_node} GPU{'s' if r.gpus_per_node != 1 else ''}"
    rate = f" x {_price(price)}{unit}/GPU-h" if price is not None else ""
    assert r.until is not None
    return f"{nodes} x {gpus}{rate} x {_duration(_utc(r.until) - _utc(r.start))}"


def _when(period: Period, window: Window) -> str:
    if window.rolling is not None:
        return f"the last {_duration(window.rolling)}"
    zone = period.zone
    first, last = window.start.astimezone(zone).date(), window.end.astimezone(zone).date()
    return f"{first.isoformat()} to {last.isoformat()}, {period.time_zone or 'UTC'}"


def _unblock(period: Period, window: Window) -> str:
    if window.rolling is not None:
        return (
            "the budget is raised, a running job ends, or earlier spending leaves the "
            f"{_duration(window.rolling)} window"
        )
    rolls = window.end.astimezone(period.zone).date().isoformat()
    return f"the budget is raised, a running job ends, or the period rolls on {rolls}"


def _duration(delta: timedelta) -> str:
    """``24h``, ``1h30m``, ``45s``: the Go duration a user wrote for maxDuration."""
    seconds = max(0, int(delta // _SECOND))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    text = (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{s}s" if s else "")
    return text or "0s"


def _price(price: Decimal) -> str:
    return _two(price) if price == price.quantize(_CENT) else format(price.normalize(), "f")


def _two(value: Decimal) -> str:
    return format(value.quantize(_CENT, rounding=ROUND_HALF_UP, context=_EXACT), "f")


def _hours(gpu_seconds: int | Decimal) -> str:
    return _two(_EXACT.divide(Decimal(gpu_seconds), Decimal(3600)))


def _exact(value: Decimal) -> str:
    """A ledger amount as the status stores it: plain digits, no exponent, no trailing zeros."""
    text = format(_money(value, ROUND_HALF_UP), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


# -- status ---------------------------------------------------------------------------------------------


def from_status(status: DGXBudgetStatus | None) -> Ledger:
    """The ledger a budget's status stores (an empty one for a new budget)."""
    if status is None:
        return Ledger()
    window = None
    if status.period is not None:
        length = None if status.period.rolling is None else _whole_seconds(parse_duration(status.period.rolling))
        window = Window(_utc(status.period.start), _utc(status.period.end), length)
    return Ledger(
        window=window,
        rows=tuple(
            Row(
                job=r.job,
                uid=r.uid,
                seen_gpu_seconds=r.seen_gpu_seconds,
                seen_cost=Decimal(r.seen_cost),
                seen_until=None if r.seen_until is None else _utc(r.seen_until),
                gpu_seconds=r.gpu_seconds,
                cost=Decimal(r.cost),
                unpriced=bool(r.unpriced),
            )
            for r in status.ledger
        ),
        hours=tuple(Hour(_utc(h.start), h.gpu_seconds, Decimal(h.cost)) for h in status.buckets),
        reservations=tuple(
            Reservation(
                job=r.job,
                uid=r.uid,
                capacity=r.capacity,
                nodes=r.nodes,
                gpus_per_node=r.gpus_per_node,
                price=None if r.price_per_gpu_hour is None else Decimal(r.price_per_gpu_hour),
                start=_utc(r.start),
                until=None if r.until is None else _utc(r.until),
            )
            for r in status.reservations
        ),
        history=tuple(
            Closed(_utc(h.start), _utc(h.end), h.gpu_seconds, Decimal(h.cost), h.jobs) for h in status.history
        ),
    )


@dataclass(frozen=True)
class Summary:
    """A budget's numbers: spent, committed and remaining (None where no limit is set)."""

    spent: Amount
    committed: Committed
    remaining_gpu_seconds: Decimal | None
    remaining_cost: Decimal | None


def summarize(spec: DGXBudgetSpec, ledger: Ledger, watermarks: Mapping[str, datetime | None]) -> Summary:
    """Spent (settled: settle first, see :func:`advance`), committed and, per limit set, limit - spent -
    committed (negative when a limit was lowered below what is used)."""
    used = spent(ledger)
    ahead = committed(ledger, watermarks)
    gpu_left = None
    if spec.limits.gpu_hours is not None:
        gpu_left = Decimal(spec.limits.gpu_hours) * 3600 - used.gpu_seconds - ahead.gpu_seconds
    cost_left = None if spec.limits.cost is None else Decimal(spec.limits.cost) - used.cost - ahead.cost
    return Summary(used, ahead, gpu_left, cost_left)


def render_status(
    spec: DGXBudgetSpec,
    ledger: Ledger,
    watermarks: Mapping[str, datetime | None],
    *,
    currency: str | None,
    generation: int | None,
    conditions: Iterable[Condition] = (),
) -> DGXBudgetStatus:
    """The status to write for ``ledger``: its exact values, and spent, committed and remaining for people
    (two decimals; cost only when the catalog has prices, ``currency``). Calendar periods are shown in the
    spec's time zone. ``conditions`` are the controller's (Ready)."""
    numbers = summarize(spec, ledger, watermarks)

    def totals(gpu_seconds: int, cost: Decimal) -> Totals:
        return Totals(gpu_hours=_hours(gpu_seconds), cost=None if currency is None else _two(cost))

    window = ledger.window
    period = None
    if window is not None:
        zone = spec.period.zone if window.rolling is None else UTC
        period = WindowModel(
            start=window.start.astimezone(zone),
            end=window.end.astimezone(zone),
            rolling=None if window.rolling is None else _duration(window.rolling),
        )
    remaining = Totals(
        gpu_hours=None if numbers.remaining_gpu_seconds is None else _hours(numbers.remaining_gpu_seconds),
        cost=None if numbers.remaining_cost is None or currency is None else _two(numbers.remaining_cost),
    )
    return DGXBudgetStatus(
        currency=currency,
        period=period,
        spent=totals(numbers.spent.gpu_seconds, numbers.spent.cost),
        committed=totals(numbers.committed.gpu_seconds, numbers.committed.cost),
        remaining=remaining,
        ledger=[
            LedgerRow(
                job=r.job,
                uid=r.uid,
                seen_gpu_seconds=r.seen_gpu_seconds,
                seen_cost=_exact(r.seen_cost),
                seen_until=r.seen_until,
                gpu_seconds=r.gpu_seconds,
                cost=_exact(r.cost),
                unpriced=True if r.unpriced else None,
            )
            for r in ledger.rows
        ],
        buckets=[HourBucket(start=h.start, gpu_seconds=h.gpu_seconds, cost=_exact(h.cost)) for h in ledger.hours],
        reservations=[
            ReservationModel(
                job=r.job,
                uid=r.uid,
                capacity=r.capacity,
                nodes=r.nodes,
                gpus_per_node=r.gpus_per_node,
                price_per_gpu_hour=None if r.price is None else _exact(r.price),
                start=r.start,
                until=r.until,
            )
            for r in ledger.reservations
        ],
        history=[
            ClosedPeriod(
                start=h.start.astimezone(spec.period.zone),
                end=h.end.astimezone(spec.period.zone),
                gpu_seconds=h.gpu_seconds,
                gpu_hours=_hours(h.gpu_seconds),
                cost=_exact(h.cost),
                jobs=h.jobs,
            )
            for h in ledger.history
        ],
        conditions=list(conditions),
        observed_generation=generation,
    )


def summary(spec: DGXBudgetSpec, status: DGXBudgetStatus) -> str:
    """One line for people (an Event, ``kubedgx usage``): ``spent 9400.00 + committed 400.00 of 10000.00
    USD; spent 3760.00 + committed 160.00 of 4000.00 GPU-hours``."""
    parts = []
    unit = f" {status.currency}" if status.currency else ""
    if spec.limits.cost is not None and status.spent is not None and status.spent.cost is not None:
        money = status.committed.cost if status.committed is not None and status.committed.cost else "0.00"
        parts.append(f"spent {status.spent.cost} + committed {money} of {_two(Decimal(spec.limits.cost))}{unit}")
    if spec.limits.gpu_hours is not None and status.spent is not None:
        hours = status.committed.gpu_hours if status.committed is not None and status.committed.gpu_hours else "0.00"
        parts.append(
            f"spent {status.spent.gpu_hours or '0.00'} + committed {hours} of "
            f"{_two(Decimal(spec.limits.gpu_hours))} GPU-hours"
        )
    return "; ".join(parts) or "nothing counted yet"
