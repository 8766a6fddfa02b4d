"""Per-object reconcile tasks: triggers coalesce into one pass at a time per object, failures back
off exponentially, and a pass may ask to be run again after a delay. Shared by the job and the
data-mount controllers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

import aiohttp

from dgx_operator.kube import TransientError

if TYPE_CHECKING:
    from dgx_operator.controllers.metrics import Metrics

log = logging.getLogger("kubedgx")

Key = tuple[str, str]
#: (object body, type, reason, message): posts a Kubernetes Event about an object (kopf.event in the
#: operator, a list in tests). Both controllers report through one.
EventSink = Callable[[Mapping[str, Any], str, str, str], None]
#: Backoff after failed reconciles of one object: 1, 2, 4 ... 60 s.
MAX_BACKOFF = 60.0
#: An object that is not finished is looked at again at least this often, whatever events say: the
#: periodic safety net of a level-triggered controller (kopf's timers would add a finalizer).
RESYNC = 60.0
#: At most this many objects of one kind are reconciled at once; the others wait for a slot, their
#: triggers coalescing meanwhile (controller-runtime's MaxConcurrentReconciles). Unbounded, a burst of
#: a thousand new jobs planned all of them at once, and every plan's rendered workers waited in
#: memory for the API client's few connections: most of the operator's peak memory, and no faster
#: (docs/benchmarks.md, "Operator scale").
MAX_CONCURRENT_RECONCILES = 32


def utcnow() -> datetime:
    """The controllers' clock: UTC to the second, as Kubernetes timestamps are (a status written
    with microseconds would differ from its own read-back and be written again)."""
    return datetime.now(UTC).replace(microsecond=0)


class ReconcileLoop:
    """Subclasses (dataclasses) declare these attributes and implement :meth:`step`."""

    #: The kind reconciled, as the metrics name it.
    kind: ClassVar[str]
    metrics: Metrics | None
    dirty: set[Key]
    workers: dict[Key, asyncio.Task[None]]
    timers: dict[Key, asyncio.TimerHandle]
    failures: dict[Key, int]
    retry_base: float
    #: Made on first use, in the event loop that runs the reconciles.
    _slots: asyncio.Semaphore | None = None
    #: Whether this replica reconciles. With leader election (leader.py) only the leader does; the
    #: others keep their watches and caches warm and note which objects exist, so that a new leader
    #: reconciles all of them at once.
    leading: bool = True
    #: Every object triggered and not forgotten since: what a new leader looks at first.
    _known: set[Key] | None = None

    async def step(self, key: Key) -> float | None:
        """One pass over ``key``; returns when to look again (None: only on the next trigger)."""
        raise NotImplementedError

    def trigger(self, namespace: str, name: str) -> None:
        """Ask for a pass over one object; bursts of triggers coalesce into one pass."""
        key = (namespace, name)
        self.dirty.add(key)
        if self._known is None:
            self._known = set()
        self._known.add(key)
        if not self.leading:
            return
        task = self.workers.get(key)
        if task is None or task.done():
            self.workers[key] = asyncio.get_running_loop().create_task(self._drain(key), name=f"reconcile-{key}")

    async def _drain(self, key: Key) -> None:
        if self._slots is None:
            self._slots = asyncio.Semaphore(MAX_CONCURRENT_RECONCILES)
        while key in self.dirty and self.leading:
            delay: float | None
            async with self._slots:
                self.dirty.discard(key)  # only now: triggers while waiting for a slot are this pass
                started, outcome = time.perf_counter(), "ok"
                try:
                    delay = await self.step(key)
                    self.failures.pop(key, None)
                except TransientError as exc:
                    delay, outcome = self._backoff(key, exc.retry_after), "retry"
                    log.info("reconcile %s/%s: %s; retrying in %.1fs", *key, exc, delay)
                except (aiohttp.ClientError, TimeoutError) as exc:  # the connection, not the answer
                    delay, outcome = self._backoff(key, None), "retry"
                    log.warning("reconcile %s/%s: %r; retrying in %.1fs", *key, exc, delay)
                except Exception:  # a bug or an unexpected answer: log it, back off, never stop the loop
                    delay, outcome = self._backoff(key, None), "error"
                    log.exception("reconcile %s/%s failed; retrying in %.1fs", *key, delay)
                if self.metrics is not None:
                    self.metrics.reconciled(self.kind, outcome, time.perf_counter() - started)
            self._schedule(key, delay)

    def _backoff(self, key: Key, hint: float | None) -> float:
        count = self.failures.get(key, 0) + 1
        self.failures[key] = count
        return hint if hint is not None else min(MAX_BACKOFF, self.retry_base * 2.0 ** (count - 1))

    def _schedule(self, key: Key, delay: float | None) -> None:
        self.cancel_timer(key)
        if delay is not None:
            loop = asyncio.get_running_loop()
            self.timers[key] = loop.call_later(max(delay, 0.0), self.trigger, *key)

    def forget_key(self, key: Key) -> None:
        """The object is gone: a future leader need not look at it."""
        self.dirty.discard(key)
        if self._known is not None:
            self._known.discard(key)

    def lead(self) -> None:
        """This replica became the leader: reconcile every object it knows of (another leader may
        have changed any of them, or none reconciled them for a while)."""
        self.leading = True
        for key in sorted(self._known or ()):
            self.trigger(*key)

    async def follow(self) -> None:
        """This replica stops leading (lost or released Lease, shutdown): no pass may start or go on,
        since the next leader may already be acting. Passes in flight are cancelled; what they were
        doing is redone by whichever replica leads next (level-triggered: nothing is lost)."""
        self.leading = False
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()
        tasks = [t for t in self.workers.values() if not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.workers.clear()

    def cancel_timer(self, key: Key) -> None:
        timer = self.timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    async def stop(self) -> None:
        for timer in self.timers.values():
            timer.cancel()
        tasks = [t for t in self.workers.values() if not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
