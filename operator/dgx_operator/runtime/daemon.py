"""How `kubedgx operator` runs: kopf's tasks in an event loop of ours, our own health endpoints, and a
graceful stop that a rolling update does not notice.

Why not ``kopf.run``: on SIGTERM kopf stops everything at once, its webhook server included. While
the apiserver still routes admission reviews to this replica (its endpoint is removed only once the
EndpointSlice controller has seen the pod terminating, and the apiserver's informer has seen that),
every review would then fail, and with ``failurePolicy: Fail`` every write of a DGXTrainingJob or
DGXDataMount with it. So on SIGTERM (:meth:`Lifecycle.terminate`):

1. ``/readyz`` answers 503 at once (the pod leaves the Service's ready endpoints);
2. the replica stops reconciling and releases its Lease, so another replica leads within one retry
   period instead of waiting for the Lease to expire;
3. it goes on answering admission reviews for ``shutdown_delay`` seconds;
4. then kopf stops (its cleanup handlers close the servers). A second signal stops at once.

``/healthz`` (liveness) answers while the event loop runs, with what kopf's probe reported before:
the jobs with a reconcile in flight, and whether this replica leads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import kopf

from dgx_operator.runtime.settings import OperatorConfig

log = logging.getLogger("kubedgx")


@dataclass
class Lifecycle:
    """What the health endpoints report, and the flags that end the operator."""

    shutdown_delay: float = 0.0
    #: Set by kopf once its startup handlers have run.
    started: asyncio.Event = field(default_factory=asyncio.Event)
    #: kopf's stop flag.
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    draining: bool = False
    _drain: asyncio.Task[None] | None = None

    def ready(self, memo: Any) -> tuple[bool, str]:
        """(ready, why not): started, the webhook listening (when served), not draining."""
        if self.draining:
            return False, "terminating"
        if not self.started.is_set():
            return False, "starting"
        webhook = memo.get("webhook")
        if webhook is not None and not webhook.listening.is_set():
            return False, "the webhook server is not listening yet"
        return True, "ok"

    def terminate(self, memo: Any, sig: signal.Signals) -> None:
        """The first signal drains (see the module docstring); another one stops at once."""
        if self._drain is not None:
            log.warning("%s again: stopping now", sig.name)
            self.stop.set()
            return
        self._drain = asyncio.get_running_loop().create_task(self.drain(memo, sig), name="graceful stop")

    async def drain(self, memo: Any, sig: signal.Signals) -> None:
        self.draining = True
        log.info(
            "%s: not ready any more; stopping reconciles; answering admission reviews for %gs more",
            sig.name,
            self.shutdown_delay,
        )
        try:
            elector = memo.get("elector")
            if elector is not None:
                await elector.release()
            for loop_name in ("controller", "mounts"):
                loop = memo.get(loop_name)
                if loop is not None:
                    await loop.follow()
            if self.shutdown_delay > 0:
                await asyncio.sleep(self.shutdown_delay)  # a deliberate grace period, see the module docstring
        finally:
            self.stop.set()


async def serve_health(memo: Any, lifecycle: Lifecycle, host: str, port: int) -> aiohttp.web.AppRunner:
    """GET /healthz (liveness) and /readyz (readiness) until ``await runner.cleanup()``."""

    async def healthz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        controller = memo.get("controller")
        elector = memo.get("elector")
        report = {
            "jobs": len(controller.dirty) if controller is not None and controller.leading else 0,
            "leader": elector.leading if elector is not None else None,
        }
        return aiohttp.web.json_response(report)

    async def readyz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        ok, why = lifecycle.ready(memo)
        return aiohttp.web.Response(status=200 if ok else 503, text=why)

    app = aiohttp.web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = aiohttp.web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        await aiohttp.web.TCPSite(runner, host, port).start()
    except OSError:
        await runner.cleanup()
        raise
    return runner


async def operate(
    config: OperatorConfig,
    *,
    standalone: bool,
    peering_name: str | None,
    liveness: str | None,
) -> None:
    """kopf's tasks, our signal handling and health server, until the stop flag is set."""
    lifecycle = Lifecycle(shutdown_delay=config.shutdown_delay)
    memo = kopf.Memo(config=config, lifecycle=lifecycle)
    health: aiohttp.web.AppRunner | None = None
    if config.health_port and not liveness:
        try:
            health = await serve_health(memo, lifecycle, config.bind_address, config.health_port)
        except OSError as exc:
            raise SystemExit(f"kubedgx operator: cannot serve /healthz on port {config.health_port}: {exc}") from exc
    before: Collection[asyncio.Task[Any]] = asyncio.all_tasks()
    try:
        tasks = await kopf.spawn_tasks(
            standalone=standalone,
            clusterwide=not config.namespaces,
            namespaces=config.namespaces,
            liveness_endpoint=liveness,
            peering_name=peering_name,
            memo=memo,
            stop_flag=lifecycle.stop,
            ready_flag=lifecycle.started,
        )
        # kopf took SIGINT and SIGTERM for an immediate stop; ours drains first.
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lifecycle.terminate, memo, sig)
        await kopf.run_tasks(tasks, ignored=before)
    finally:
        if health is not None:
            await health.cleanup()


def run(config: OperatorConfig, *, standalone: bool, peering_name: str | None, liveness: str | None) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(operate(config, standalone=standalone, peering_name=peering_name, liveness=liveness))
