"""Leader election on a coordination.k8s.io/v1 Lease, so that several replicas can run while only one
reconciles.

Why our own: kopf has no leader election (its peering pauses operators of lower priority, but two
replicas of one Deployment have the same priority, and peering keeps no lease a restarted replica
could wait on). The algorithm is client-go's ``leaderelection`` package, which controller-runtime,
Kueue, JobSet and cert-manager all use, so a Lease written by kubedgx reads as theirs do:

* a candidate reads the Lease every ``retry_period``; it takes it when it is absent, released
  (no holder) or expired, judged by *this process's clock*: the time it last saw the record change
  plus ``lease_duration`` (never the holder's ``renewTime``, so clock skew between nodes does not
  matter);
* the leader renews every ``retry_period``; when no renewal has succeeded for ``renew_deadline`` it
  stops leading at once (before ``lease_duration`` ends and another replica may take over), so two
  replicas never reconcile at the same time while the clocks' rates agree;
* every write is a replace with the read ``resourceVersion``: two candidates racing for an expired
  Lease cannot both win (the loser gets 409);
* on a graceful stop the leader releases the Lease (no holder, a 1 s duration), so the next leader
  takes over within one ``retry_period`` instead of waiting for the Lease to expire.

:func:`decide` is the pure part (tested without a cluster); :class:`LeaderElector` runs it against
the API server.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from dgx_operator.kube import ApiError, Kube, TransientError

log = logging.getLogger("kubedgx")

#: client-go's JitterFactor: a candidate waits retry_period * (1 + up to 1.2) between attempts, so
#: replicas started together do not all write at once.
JITTER = 1.2
#: MicroTime as the API server writes it (RFC 3339 with microseconds).
MICROTIME = "%Y-%m-%dT%H:%M:%S.%fZ"


@dataclass(frozen=True)
class ElectionConfig:
    """Where the Lease lives and how long it lasts (client-go's and controller-runtime's defaults)."""

    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def problems(self) -> list[str]:
        """What client-go would refuse: a leader must stop before its Lease can expire."""
        found = []
        if not self.lease_duration > self.renew_deadline:
            found.append(f"the lease duration ({self.lease_duration:g}s) must exceed the renew deadline")
        if not self.renew_deadline > JITTER * self.retry_period:
            found.append(
                f"the renew deadline ({self.renew_deadline:g}s) must exceed {JITTER:g} x the retry period "
                f"({self.retry_period:g}s)"
            )
        if self.retry_period <= 0:
            found.append("the retry period must be positive")
        return found


def default_identity(environ: Mapping[str, str] = os.environ) -> str:
    """``<pod>_<random>``: the pod name says which replica leads (``kubectl get lease``), the random
    part makes a restarted container a new candidate, which must wait for its predecessor's Lease to
    expire rather than resume a leadership whose in-memory state died with it."""
    host = environ.get("POD_NAME") or environ.get("HOSTNAME") or socket.gethostname()
    return f"{host}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Record:
    """The fields of a Lease that election reads (``spec``), and its resourceVersion."""

    holder: str
    lease_duration: float
    acquire_time: str | None
    renew_time: str | None
    transitions: int
    resource_version: str

    @classmethod
    def of(cls, lease: Mapping[str, Any]) -> Record:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration=float(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
        )

    def key(self) -> tuple[str, str | None, float, int]:
        """What identifies one renewal: a change of any of these is a sign of life of the holder."""
        return self.holder, self.renew_time, self.lease_duration, self.transitions


Decision = Literal["create", "take", "renew", "wait"]


def decide(record: Record | None, identity: str, observed_at: float | None, now: float) -> Decision:
    """What a candidate or leader does with the Lease it just read.

    ``observed_at`` is when (monotonic clock) this process first saw the record as it is now; the
    record's holder is alive while ``observed_at + its lease duration`` has not passed."""
    if record is None:
        return "create"
    if record.holder == identity:
        return "renew"
    if not record.holder:
        return "take"  # released by a leader that stopped gracefully
    if observed_at is not None and observed_at + record.lease_duration <= now:
        return "take"
    return "wait"


def lease_spec(
    config: ElectionConfig, previous: Record | None, now: datetime, *, release: bool = False
) -> dict[str, Any]:
    """The Lease's spec after this process wrote it: taking it counts a transition, renewing keeps
    the acquire time, releasing leaves no holder and a 1 s duration (client-go's ReleaseOnCancel)."""
    stamp = now.strftime(MICROTIME)
    mine = previous is not None and previous.holder == config.identity
    transitions = previous.transitions if previous is not None else 0
    if previous is not None and not mine:
        transitions += 1
    return {
        "holderIdentity": "" if release else config.identity,
        "leaseDurationSeconds": 1 if release else max(1, round(config.lease_duration)),
        "acquireTime": previous.acquire_time if mine and previous is not None else stamp,
        "renewTime": stamp,
        "leaseTransitions": transitions,
    }


Callback = Callable[[], Awaitable[None] | None]


class LeaderElector:
    """Runs for the operator's lifetime: campaigns, leads while renewals succeed, steps down when
    they stop, campaigns again. ``on_lead`` and ``on_follow`` are told every transition."""

    def __init__(
        self,
        kube: Kube,
        config: ElectionConfig,
        on_lead: Callback,
        on_follow: Callback,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = kube
        self.config = config
        self.on_lead = on_lead
        self.on_follow = on_follow
        self.clock = clock
        self.wall = wall
        self.leading = False
        self._observed: tuple[tuple[str, str | None, float, int], float] | None = None
        self._record: Record | None = None
        self._task: asyncio.Task[None] | None = None
        self._released = asyncio.Event()

    # -- one attempt ---------------------------------------------------------------------------

    async def try_acquire_or_renew(self) -> bool:
        """One read and at most one write; True when this process holds the Lease afterwards."""
        c = self.config
        lease = await self.kube.get_lease(c.namespace, c.name)
        record = Record.of(lease) if lease is not None else None
        now = self.clock()
        if record is not None and (self._observed is None or self._observed[0] != record.key()):
            self._observed = (record.key(), now)
        observed_at = self._observed[1] if self._observed is not None else None
        action = decide(record, c.identity, observed_at, now)
        if action == "wait":
            self._record = record
            return False
        spec = lease_spec(c, record, self.wall())
        if action == "create":
            written = await self.kube.create_lease(c.namespace, c.name, spec)
        else:
            assert record is not None
            written = await self.kube.replace_lease(c.namespace, c.name, spec, record.resource_version)
        if written is None:  # another candidate wrote first (409)
            return False
        self._record = Record.of(written)
        self._observed = (self._record.key(), self.clock())
        return True

    # -- the loop -----------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="leader election")

    async def run(self) -> None:
        while not self._released.is_set():
            await self._campaign()
            if self._released.is_set():
                return
            await self._lead()

    async def _campaign(self) -> None:
        while not self._released.is_set():
            if await self._attempt():
                self.leading = True
                holder = self.config.identity
                log.info("leader election: %s leads (Lease %s/%s)", holder, self.config.namespace, self.config.name)
                await _call(self.on_lead)
                return
            await self._pause(self.config.retry_period * (1 + random.random() * JITTER))

    async def _lead(self) -> None:
        last = self.clock()
        while not self._released.is_set():
            await self._pause(self.config.retry_period)
            if self._released.is_set():
                return
            if await self._attempt():
                last = self.clock()
            elif self._record is not None and self._record.holder not in ("", self.config.identity):
                await self._step_down(f"the Lease is held by {self._record.holder}")
                return
            elif self.clock() - last >= self.config.renew_deadline:
                await self._step_down(f"no renewal succeeded for {self.config.renew_deadline:g}s")
                return

    async def _attempt(self) -> bool:
        """One bounded attempt: a hung request must not outlive the renew deadline."""
        try:
            async with asyncio.timeout(self.config.retry_period * 2):
                return await self.try_acquire_or_renew()
        except asyncio.CancelledError:
            raise
        except (TransientError, ApiError, TimeoutError, OSError) as exc:
            log.warning("leader election: Lease %s/%s: %s", self.config.namespace, self.config.name, exc)
        except Exception:  # an unexpected answer must not end the election loop
            log.exception("leader election: Lease %s/%s", self.config.namespace, self.config.name)
        return False

    async def _step_down(self, why: str) -> None:
        self.leading = False
        log.error("leader election: %s stops leading: %s", self.config.identity, why)
        await _call(self.on_follow)

    async def _pause(self, seconds: float) -> None:
        """Wait, but wake at once on release (a deliberate delay between attempts, as client-go's)."""
        try:
            async with asyncio.timeout(seconds):
                await self._released.wait()
        except TimeoutError:
            pass

    async def release(self) -> None:
        """Stop campaigning; if leading, stop reconciling first, then give the Lease up, so the next
        leader starts at once and never overlaps with this one."""
        self._released.set()
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if not self.leading:
            return
        self.leading = False
        await _call(self.on_follow)
        c = self.config
        try:
            async with asyncio.timeout(max(c.retry_period, 2.0)):
                lease = await self.kube.get_lease(c.namespace, c.name)
                record = Record.of(lease) if lease is not None else None
                if record is not None and record.holder == c.identity:
                    spec = lease_spec(c, record, self.wall(), release=True)
                    await self.kube.replace_lease(c.namespace, c.name, spec, record.resource_version)
                    log.info("leader election: %s released Lease %s/%s", c.identity, c.namespace, c.name)
        except ApiError as exc:
            # 403/404 at shutdown: the release is being uninstalled (its Role or the Lease went first).
            log.warning(
                "leader election: could not release Lease %s/%s (HTTP %s); it expires", c.namespace, c.name, exc.status
            )
        except (TransientError, TimeoutError, OSError) as exc:
            log.warning("leader election: could not release Lease %s/%s (%s); it expires", c.namespace, c.name, exc)


async def _call(callback: Callback) -> None:
    result = callback()
    if result is not None:
        await result
