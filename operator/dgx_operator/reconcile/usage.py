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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal

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


def span_of(pod: PodView, gpus: int, capacity: str) -> Span:
    """A worker pod's hold on its node: from its binding; until its last container ended once it
    has finished, else until its grace period ends once it is being deleted (a reclaimed or lost
    node, a worker the operator deleted), else still holding."""
    end = pod.ended_at if pod.finished else None
    if end is None and pod.terminating:
        end = pod.deletion_time
    return Span(pod.uid or pod.name, gpus, capacity, pod.bound_at, end)


#: The prices a job's instances pay now: capacity -> price per GPU-hour (None: unpriced).
Prices = Mapping[str, Decimal | None]


def accrue(usage: Usage, spans: Iterable[Span], prices: Prices, reference: str, now: datetime) -> Usage:
    """``usage`` carried to ``now`` (whole seconds): each span's seconds after the watermark, at the
    price its worker holds (the catalog's ``prices`` for one first seen), and the workers still on a
    node at ``now`` as the new holdings, at the catalog's current price.

    A worker the previous pass saw holding a node and whose pod is no longer among ``spans`` is
    charged until ``now``. A ``now`` at or before the watermark adds nothing (clocks, a stale pass)."""
    now = now.replace(microsecond=0)
    since = usage.until
    if since is not None and now <= since:
        return usage
    held = {h.pod: h for h in usage.holding}
    added: dict[tuple[str, Decimal | None, Decimal | None], int] = {}
    holding: list[Holding] = []
    seen: set[str] = set()
    reference_price = prices.get(reference)

    def charge(
        gpus: int, capacity: str, price: Decimal | None, ref: Decimal | None, start: datetime, end: datetime
    ) -> None:
        begin = start if since is None else max(start, since)
        seconds = int((min(end, now) - begin) / timedelta(seconds=1)) if end > begin else 0
        if seconds > 0:
            key = (capacity, price, ref)
            added[key] = added.get(key, 0) + gpus * seconds

    for span in spans:
        if span.pod in seen or span.start is None:
            continue
        seen.add(span.pod)
        start = span.start.replace(microsecond=0)
        end = now if span.end is None else span.end.replace(microsecond=0)
        before = held.get(span.pod)
        price = before.price if before is not None else prices.get(span.capacity)
        ref = before.reference_price if before is not None else reference_price
        charge(span.gpus, span.capacity, price, ref, start, end)
        if span.end is None or span.end > now:
            holding.append(Holding(span.pod, span.gpus, span.capacity, prices.get(span.capacity), reference_price))
    for pod, gone in held.items():
        if pod not in seen and since is not None:  # vanished between two passes: charged until noticed
            charge(gone.gpus, gone.capacity, gone.price, gone.reference_price, since, now)
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
