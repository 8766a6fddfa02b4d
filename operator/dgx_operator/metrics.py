"""The operator's Prometheus metrics, in a registry of its own (never prometheus_client's global
one, so two operators in one process, as in tests, do not share counters), and the /metrics
endpoint that serves them: an aiohttp server on the operator's event loop, started by the kopf
startup handler and stopped by the cleanup handler.

Names (docs/operator.md, "Metrics"):

* ``kubedgx_reconcile_total{kind,outcome}``: reconcile passes; outcome ``ok``, ``retry`` (a
  transient API answer, 409/429/5xx, or a lost connection: retried with backoff) or ``error``
  (anything else: logged, retried with backoff);
* ``kubedgx_reconcile_duration_seconds{kind}``: their durations;
* ``kubedgx_jobs{phase}`` and ``kubedgx_data_mounts{phase}``: the objects this operator has
  reconciled, by the phase its last successful pass gave them; an object leaves when it is deleted;
* ``kubedgx_worker_restarts_total{reason}``: workers the planner replaced, counted when the plan
  that decided it was carried out (its status write succeeded), from the plan's events:
  ``WorkerRestarted`` (a failure counted against backoffLimit: these add up to the jobs'
  ``status.restarts``), ``WorkerDisrupted`` (eviction, preemption, node loss: not counted) and
  ``WorkerReplaced`` (an interactive worker that exited);
* ``kubedgx_api_errors_total{verb,code}``: Kubernetes API calls of :mod:`dgx_operator.kube` that
  failed with an HTTP error: 409 conflicts, 429, 5xx, 403, 422...; not the answers a call expects
  (404 on a read or delete: "absent"; 409 on creating a child: "exists"). kopf's own calls
  (watches, Events) are not included.
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from dgx_operator.api.datamount import MountPhase
from dgx_operator.api.trainingjob import Phase

log = logging.getLogger("kubedgx")

JOB_KIND = "DGXTrainingJob"
MOUNT_KIND = "DGXDataMount"
OUTCOMES = ("ok", "retry", "error")
RESTART_REASONS = ("WorkerRestarted", "WorkerDisrupted", "WorkerReplaced")
#: Reconciles take milliseconds; a data mount's listing of a large store can take minutes.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

if TYPE_CHECKING:
    import aiohttp.web

Key = tuple[str, str]
#: The classic text format, which every Prometheus reads (prometheus_client 0.26's CONTENT_TYPE_LATEST
#: announces version 1.0.0, the UTF-8 names format; our names need nothing newer).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Metrics:
    """The operator's metrics and the bookkeeping behind the phase gauges."""

    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))
    phases: dict[str, dict[Key, str]] = field(default_factory=lambda: {JOB_KIND: {}, MOUNT_KIND: {}})
    counts: dict[str, Tally[str]] = field(default_factory=lambda: {JOB_KIND: Tally(), MOUNT_KIND: Tally()})

    def __post_init__(self) -> None:
        r = self.registry
        self.reconciles = Counter(
            "kubedgx_reconcile",
            "Reconcile passes by kind and outcome (ok, retry, error).",
            ["kind", "outcome"],
            registry=r,
        )
        self.durations = Histogram(
            "kubedgx_reconcile_duration_seconds", "Duration of reconcile passes.", ["kind"], buckets=BUCKETS, registry=r
        )
        self.gauges = {
            JOB_KIND: Gauge("kubedgx_jobs", "DGXTrainingJobs this operator knows, by phase.", ["phase"], registry=r),
            MOUNT_KIND: Gauge(
                "kubedgx_data_mounts", "DGXDataMounts this operator knows, by phase.", ["phase"], registry=r
            ),
        }
        self.restarts = Counter(
            "kubedgx_worker_restarts",
            "Workers the operator replaced, by the reason of the plan.",
            ["reason"],
            registry=r,
        )
        self.api_errors = Counter(
            "kubedgx_api_errors",
            "Kubernetes API calls that failed, by verb and HTTP code.",
            ["verb", "code"],
            registry=r,
        )
        # Every series that can appear starts at zero, so rate() and absent() work from the first scrape.
        for kind in (JOB_KIND, MOUNT_KIND):
            self.durations.labels(kind)
            for outcome in OUTCOMES:
                self.reconciles.labels(kind, outcome)
        for phase in get_args(Phase):
            self.gauges[JOB_KIND].labels(phase).set(0)
        for phase in get_args(MountPhase):
            self.gauges[MOUNT_KIND].labels(phase).set(0)
        for reason in RESTART_REASONS:
            self.restarts.labels(reason)

    def reconciled(self, kind: str, outcome: str, seconds: float) -> None:
        self.reconciles.labels(kind, outcome).inc()
        self.durations.labels(kind).observe(seconds)

    def phase(self, kind: str, key: Key, phase: str | None) -> None:
        """The object's phase after a successful pass (None: it has none yet)."""
        known, counts = self.phases[kind], self.counts[kind]
        old = known.get(key)
        if old == phase:
            return
        if phase is None:
            known.pop(key, None)
        else:
            known[key] = phase
            counts[phase] += 1
            self.gauges[kind].labels(phase).set(counts[phase])
        if old is not None:
            counts[old] -= 1
            self.gauges[kind].labels(old).set(counts[old])

    def forget(self, kind: str, key: Key) -> None:
        """The object is gone."""
        self.phase(kind, key, None)

    def restarted(self, reason: str) -> None:
        self.restarts.labels(reason).inc()

    def api_error(self, verb: str, code: int | str) -> None:
        self.api_errors.labels(verb, str(code)).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


async def serve(metrics: Metrics, port: int, host: str = "0.0.0.0") -> aiohttp.web.AppRunner:
    """Serve GET /metrics until ``await runner.cleanup()``. Raises OSError when the port is taken."""
    import aiohttp.web  # here: the module stays importable without the server's dependencies

    async def scrape(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(body=metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    app = aiohttp.web.Application()
    app.router.add_get("/metrics", scrape)
    runner = aiohttp.web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        await aiohttp.web.TCPSite(runner, host, port).start()
    except OSError:
        await runner.cleanup()
        raise
    log.info("serving metrics at http://%s:%d/metrics", host, port)
    return runner
