"""What a job has used of the cluster's GPUs, and what that cost: pure accounting (issue 31).

Every worker pod of every attempt holds its GPUs from the moment the scheduler binds it to a node
(image pulls and the data-sync init containers run on that node too) until it ends: its last
container's ``finishedAt``, else its ``deletionTimestamp`` (a reclaimed spot node, a lost node), else,
for a pod that vanished between two passes, the pass that noticed it (charged until noticed: bounded
by the pass interval, and never less than it really used, which is what a spend limit needs).

The state is a watermark and integer GPU-seconds in buckets keyed by capacity and the price they ran
at, stored in the job's status: a pass adds the part of each worker's span after the watermark and
moves it to now. So an operator that restarts, or a new leader, goes on from what the status says
(nothing in memory), and a pass applied twice adds nothing the second time. A price is taken when a
worker is first accounted and kept while it runs, moving to the catalog's current price from the
next pass: an edit of the prices applies from then on and never reprices the past. Money is derived
from the buckets when shown (GPU-seconds x price / 3600), exact in Decimal, never summed from
rounded parts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

from dgx_operator.api import trainingjob as api
from dgx_operator.catalog import Pricing
from dgx_operator.reconcile.pods import PodView


@dataclass(frozen=True)
class Span:
    """One worker pod's hold on a node's GPUs, as its pod says."""

    #: The pod's uid: a worker re-created under the same name is another span.
    pod: str
    gpus: int
    capacity: str
    #: When the scheduler bound it to a node (PodScheduled True); None: not placed, nothing used.
    start: datetime | None
    #: When it let go of the node (finished, or deleted); None: it still holds it.
    end: datetime | None = None
    #: What one of its devices is of a GPU: 1, or a MIG slice's g/7.
    share: Fraction = Fraction(1)


@dataclass(frozen=True, order=True)
class Bucket:
    """GPU-seconds used on one capacity at one price (and the reference capacity's price then, which
    spot savings are measured against). ``None`` prices: the catalog had none."""

    capacity: str
    price: Decimal | None
    reference_price: Decimal | None
    gpu_seconds: int = 0

    @property
    def key(self) -> tuple[str, Decimal | None, Decimal | None]:
        return (self.capacity, self.price, self.reference_price)


@dataclass(frozen=True)
class Holding:
    """A worker on a node at the watermark, and the price its next seconds are charged at."""

    pod: str
    gpus: int
    capacity: str
    price: Decimal | None
    reference_price: Decimal | None
    #: The latest it can let go (a deleted pod's grace period end): a pod that vanishes before the
    #: next pass is charged until then, not until that pass noticed.
    ends: datetime | None = None
    share: Fraction = Fraction(1)


@dataclass(frozen=True)
class Usage:
    """Everything accounted up to ``until`` (None: nothing yet)."""

    until: datetime | None = None
    buckets: tuple[Bucket, ...] = ()
    holding: tuple[Holding, ...] = ()

    @property
    def gpu_seconds(self) -> int:
        return sum(b.gpu_seconds for b in self.buckets)

    def gpu_seconds_on(self, capacity: str) -> int:
        return sum(b.gpu_seconds for b in self.buckets if b.capacity == capacity)

    @property
    def priced(self) -> bool:
        """Every GPU-second has a price: the cost is the whole cost (else it leaves some out)."""
        return all(b.price is not None for b in self.buckets if b.gpu_seconds)

    @property
    def cost(self) -> Decimal:
        """The money, at the prices each second ran at, of the seconds that had one."""
        return sum((b.gpu_seconds * b.price / 3600 for b in self.buckets if b.price is not None), Decimal(0))

    @property
    def savings(self) -> Decimal:
        """What the seconds below the reference price saved against it (spot against on-demand)."""
        return sum(
            (
                b.gpu_seconds * (b.reference_price - b.price) / 3600
                for b in self.buckets
                if b.price is not None and b.reference_price is not None and b.reference_price > b.price
            ),
            Decimal(0),
        )


#: A GPU's MIG compute slices (catalog.MIG_SLICES; not imported: the arithmetic stays free of the catalog).
SLICES = 7


def share_of(slices: int | None) -> Fraction:
    """What one device is of a GPU: a whole GPU 1, a MIG slice of ``slices`` compute slices g/7."""
    return Fraction(1) if slices is None else Fraction(slices, SLICES)


def span_of(pod: PodView, gpus: int, capacity: str, slices: int | None = None) -> Span:
    """A worker pod's hold on its node: from its binding; until its last container ended once it
    has finished, else until its grace period ends once it is being deleted (a reclaimed or lost
    node, a worker the operator deleted), else still holding. ``slices``: a MIG worker's slice (the
    pod's own, else the instance's)."""
    end = pod.ended_at if pod.finished else None
    if end is None and pod.terminating:
        end = pod.deletion_time
    mig = pod.mig_slices if pod.mig_slices is not None else slices
    return Span(pod.uid or pod.name, gpus, capacity, pod.bound_at, end, share_of(mig))


#: The prices a job's instances pay now: capacity -> price per GPU-hour (None: unpriced).
Prices = Mapping[str, Decimal | None]


def accrue(usage: Usage, spans: Iterable[Span], prices: Prices, reference: str, now: datetime) -> Usage:
    """``usage`` carried to ``now`` (whole seconds): each span's seconds after the watermark, at the
    price its worker holds (the catalog's ``prices`` for one first seen), and the workers still on a
    node at ``now`` as the new holdings, at the catalog's current price. When no worker held a node
    and none did since, ``usage`` itself: a queued, suspended or finished job's status stays as it is.

    A worker the previous pass saw holding a node and whose pod is no longer among ``spans`` is
    charged until ``now``, or the end of its grace period if it was being deleted. A ``now`` at or
    before the watermark adds nothing (clocks, a stale pass); one in the watermark's own second adds
    nothing either, but lets go of the workers that ended in it (else a job whose last worker ended
    in the second of the previous pass would show a worker on a node until something woke it)."""
    now = now.replace(microsecond=0)
    since = usage.until
    if since is not None and now < since:
        return usage  # a clock behind the watermark: nothing to add, nothing known better
    held = {h.pod: h for h in usage.holding}
    added: dict[tuple[str, Decimal | None, Decimal | None], int] = {}
    holding: list[Holding] = []
    seen: set[str] = set()
    reference_price = prices.get(reference)

    def charge(
        gpus: int,
        capacity: str,
        price: Decimal | None,
        ref: Decimal | None,
        start: datetime,
        end: datetime,
        share: Fraction = Fraction(1),
    ) -> None:
        """GPU-seconds of ``[max(start, since), min(end, now))``. A MIG slice's fraction of a GPU is
        floored on its whole span from ``start``, not per pass, so the passes add up to exactly the
        floor of the span's total however it is split (whole GPUs: integers, nothing floored)."""
        begin = start if since is None else max(start, since)
        stop = min(end, now)
        if stop <= begin:
            return
        weight = gpus * share

        def upto(t: datetime) -> int:
            return math.floor(weight * int((t - start) / timedelta(seconds=1)))

        seconds = upto(stop) - upto(begin)
        if seconds > 0:
            key = (capacity, price, ref)
            added[key] = added.get(key, 0) + seconds

    for span in spans:
        if span.pod in seen or span.start is None:
            continue
        seen.add(span.pod)
        start = span.start.replace(microsecond=0)
        end = now if span.end is None else span.end.replace(microsecond=0)
        before = held.get(span.pod)
        price = before.price if before is not None else prices.get(span.capacity)
        ref = before.reference_price if before is not None else reference_price
        charge(span.gpus, span.capacity, price, ref, start, end, span.share)
        if span.end is None or span.end > now:
            holding.append(
                Holding(
                    span.pod,
                    span.gpus,
                    span.capacity,
                    prices.get(span.capacity),
                    reference_price,
                    span.end,
                    span.share,
                )
            )
    for pod, gone in held.items():
        if pod not in seen and since is not None:  # vanished between two passes: charged until noticed
            charge(gone.gpus, gone.capacity, gone.price, gone.reference_price, since, gone.ends or now, gone.share)
    if not added and not holding and not usage.holding:
        return usage  # nothing on a node, before or now: the watermark waits for the next worker
    buckets = {b.key: b for b in usage.buckets}
    for key, seconds in added.items():
        old = buckets.get(key)
        buckets[key] = replace(old, gpu_seconds=old.gpu_seconds + seconds) if old else Bucket(*key, gpu_seconds=seconds)
    return Usage(
        until=now,
        buckets=tuple(sorted(buckets.values(), key=_order)),
        holding=tuple(sorted(holding, key=lambda h: h.pod)),
    )


def _order(b: Bucket) -> tuple[str, Decimal, Decimal]:
    return (b.capacity, b.price if b.price is not None else Decimal(-1), b.reference_price or Decimal(-1))


# --- status.usage: the state above as the API stores it, and what people read of it -----------------

CENT = Decimal("0.01")


def _money(value: Decimal) -> str:
    """Two decimals, half up, as invoices round."""
    return str(value.quantize(CENT, rounding=ROUND_HALF_UP))


def _price(value: Decimal | None) -> str | None:
    return None if value is None else str(value)


def _decimal(value: str | None) -> Decimal | None:
    return None if value is None else Decimal(value)


def from_status(stored: api.Usage | None) -> Usage:
    """The accounting state a job's ``status.usage`` carries (an empty one without it)."""
    if stored is None:
        return Usage()
    return Usage(
        until=stored.accounted_until,
        buckets=tuple(
            Bucket(b.capacity, _decimal(b.price_per_gpu_hour), _decimal(b.reference_price_per_gpu_hour), b.gpu_seconds)
            for b in stored.buckets
        ),
        holding=tuple(
            Holding(
                h.pod,
                h.gpus,
                h.capacity,
                _decimal(h.price_per_gpu_hour),
                _decimal(h.reference_price_per_gpu_hour),
                h.ends,
                share_of(h.slices),
            )
            for h in stored.running
        ),
    )


def to_status(usage: Usage, pricing: Pricing | None) -> api.Usage:
    """``status.usage`` for ``usage``: the state, and the totals derived from it for people (two
    decimals; money only where the catalog has prices)."""
    unpriced = sum(b.gpu_seconds for b in usage.buckets if b.price is None)
    return api.Usage(
        gpu_seconds=usage.gpu_seconds,
        gpu_hours=_money(Decimal(usage.gpu_seconds) / 3600),
        cost=_money(usage.cost) if pricing is not None else None,
        currency=pricing.currency if pricing is not None else None,
        spot_savings=_money(usage.savings) if pricing is not None else None,
        example_prices=True if pricing is not None and pricing.examples else None,
        unpriced_gpu_seconds=unpriced if pricing is not None and unpriced else None,
        accounted_until=usage.until,
        buckets=[
            api.UsageBucket(
                capacity=b.capacity,
                price_per_gpu_hour=_price(b.price),
                reference_price_per_gpu_hour=_price(b.reference_price),
                gpu_seconds=b.gpu_seconds,
            )
            for b in usage.buckets
        ],
        running=[
            api.UsageHolding(
                pod=h.pod,
                gpus=h.gpus,
                capacity=h.capacity,
                price_per_gpu_hour=_price(h.price),
                reference_price_per_gpu_hour=_price(h.reference_price),
                ends=h.ends,
                slices=None if h.share == 1 else int(h.share * SLICES),
            )
            for h in usage.holding
        ],
    )


def summary(usage: Usage, pricing: Pricing | None) -> str:
    """One sentence for the job's final Event: "used 12.50 GPU-hours (spot 8.00, norm 4.50), 31.20
    USD at example prices, 14.40 USD saved on cheaper capacity"."""
    hours = _money(Decimal(usage.gpu_seconds) / 3600)
    capacities = sorted({b.capacity for b in usage.buckets if b.gpu_seconds})
    text = f"used {hours} GPU-hours"
    if len(capacities) > 1:
        parts = ", ".join(f"{c} {_money(Decimal(usage.gpu_seconds_on(c)) / 3600)}" for c in capacities)
        text += f" ({parts})"
    elif capacities:
        text += f" on {capacities[0]}"
    if pricing is None:
        return text + " (the catalog has no prices)"
    text += f", {_money(usage.cost)} {pricing.currency}"
    if pricing.examples:
        text += " at the catalog's example prices"
    if not usage.priced:
        unpriced = sum(b.gpu_seconds for b in usage.buckets if b.price is None)
        text += f" (leaving out {_money(Decimal(unpriced) / 3600)} GPU-hours on unpriced instances)"
    if usage.savings > 0:
        text += f", {_money(usage.savings)} {pricing.currency} saved against {pricing.reference}"
    return text
