"""The operator's Prometheus metrics, in a registry of its own (never prometheus_client's global
one, so two operators in one process, as in tests, do not share counters), and the /metrics
endpoint that serves them: prometheus_client's own aiohttp handler (content negotiation, OpenMetrics
when the scraper asks for it, gzip) on an aiohttp server on the operator's event loop, started by
the kopf startup handler and stopped by the cleanup handler.

Every metric, its labels and its meaning are in docs/operator.md, "Metrics"; alert examples too.
What drives them:

* reconcile passes and their durations (:mod:`dgx_operator.controllers.loop`), API errors (:mod:`dgx_operator.kube`);
* the phase gauges, from the phase each successful pass leaves an object in;
* job outcomes and the two job histograms, from the status transition the controller *writes*
  (:meth:`Metrics.job_status_written`, called once the status write succeeded): a job is counted
  when this operator moves it into Succeeded or Failed, never when it merely re-reads a finished
  job (after a restart, or on every pass of one); the durations come from the timestamps the
  status carries, so they are right whichever replica, before or after a restart, writes the end;
* worker replacements, one per worker (:meth:`Metrics.worker_deleted` for workers the operator
  deletes to replace them, :meth:`Metrics.event` for workers lost without its doing);
* admission reviews (:mod:`dgx_operator.runtime.webhooks`);
* leadership (:meth:`Metrics.leading`, called by leader election), build information, and
  prometheus_client's process, platform and garbage-collector collectors.

No ``*_created`` series: prometheus_client adds one to every counter and histogram unless told not
to, a timestamp per series that doubles the series count and that no alert uses (Prometheus itself
ignores them in the classic text format, and OpenMetrics scrapers turn them into more series).
"""

from __future__ import annotations

import logging
import platform
import re
from collections import Counter as Tally
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from importlib import metadata
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

from dgx_operator.api.crdgen import DATA_MOUNTS, TRAINING_JOBS
from dgx_operator.api.vocabulary import (
    JOB,
    JOB_PHASES,
    MOUNT_PHASES,
    JobCondition,
    JobPhase,
    JobReason,
    reasons_of,
)
from dgx_operator.reconcile import usage
from dgx_operator.reconcile.status import find_condition

if TYPE_CHECKING:
    import aiohttp.web

    from dgx_operator.api.common import Condition
    from dgx_operator.api.trainingjob import DGXTrainingJobStatus, Usage
    from dgx_operator.catalog import Catalog
    from dgx_operator.reconcile.pods import PodView

log = logging.getLogger("kubedgx")

JOB_KIND = TRAINING_JOBS.kind
MOUNT_KIND = DATA_MOUNTS.kind
OUTCOMES = ("ok", "retry", "error")
TERMINAL = JobPhase.TERMINAL
#: The phases a job's first start comes from. Not Restarting: that follows a run (or, rarely, a
#: restart before the first run, which then is not observed), and the stored conditions cannot tell
#: the two apart when they flipped within the same second (timestamps have seconds).
STARTING = (None, JobPhase.PENDING, JobPhase.WAITING_FOR_DATA)
#: Why a worker was replaced (kubedgx_worker_restarts_total's reason): its program failed (the
#: restart policy let it be replaced; the incident counts once against backoffLimit however many
#: workers it took), the cluster disrupted it (eviction, preemption, a node that failed or shut
#: down: its pod ended Failed with a disruption reason), an interactive worker exited, or it
#: vanished without this operator deleting it (node loss: the pod garbage-collected or stuck
#: Terminating on an unreachable node; a spot reclaim; someone's kubectl delete).
RESTART_REASONS = JobReason.RESTARTS
#: The reasons a job ends with (its Succeeded/Failed condition's reason), as api.vocabulary declares
#: them: their series start at zero. A reason not declared still counts; its series appears with its
#: first job.
FINISH_REASONS: dict[str, tuple[str, ...]] = {phase: reasons_of(JOB, phase) for phase in JobPhase.TERMINAL}
#: Admission reviews: let through, refused as invalid (422), or not decided (the webhook could not
#: check, 503, or failed: the apiserver applies the failurePolicy).
WEBHOOK_RESULTS = ("allowed", "denied", "error")
#: What the webhook configuration sends (DELETE never reaches it: see admission.WEBHOOKS' rules).
WEBHOOK_OPERATIONS = ("CREATE", "UPDATE")

#: Reconciles take milliseconds; a data mount's listing of a large store can take minutes.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: Admission: validation alone is sub-millisecond, reading mounts and the dry-run creates are API
#: calls; the apiserver gives up after the configuration's timeoutSeconds (at most 30).
WEBHOOK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_MINUTE, _HOUR, _DAY = 60.0, 3600.0, 86400.0
#: Creation to Running: seconds when nodes are free and the image cached, minutes for a pull or a
#: data sync, hours to days waiting in a queue (Kueue) or for capacity.
TIME_TO_RUNNING_BUCKETS = (
    10.0, 30.0, _MINUTE, 2 * _MINUTE, 5 * _MINUTE, 10 * _MINUTE, 30 * _MINUTE,
    _HOUR, 2 * _HOUR, 6 * _HOUR, 12 * _HOUR, _DAY, 2 * _DAY, 4 * _DAY, 7 * _DAY,
)  # fmt: skip
#: Run time: a crash in the first minute, fine-tunes of hours, pre-training runs of weeks.
RUN_DURATION_BUCKETS = (
    _MINUTE, 5 * _MINUTE, 15 * _MINUTE, 30 * _MINUTE, _HOUR, 2 * _HOUR, 4 * _HOUR, 8 * _HOUR,
    12 * _HOUR, _DAY, 2 * _DAY, 4 * _DAY, 7 * _DAY, 14 * _DAY, 28 * _DAY,
)  # fmt: skip

#: The planner's WorkerLost event opens with how many workers it is about.
_LOST = re.compile(r"(\d+) worker")

Key = tuple[str, str]


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


def _utc(moment: datetime) -> datetime:
    """A timestamp without an offset is UTC, as the API writes them."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    """``end - start`` in seconds (never negative: clocks of two writers may disagree a little)."""
    if start is None or end is None:
        return None
    return max(0.0, (_utc(end) - _utc(start)).total_seconds())


def _condition(status: DGXTrainingJobStatus, type_: str) -> Condition | None:
    return find_condition(status.conditions, type_)


def never_ran(status: DGXTrainingJobStatus | None) -> bool:
    """Whether a stored status shows a job that has not been Running yet.

    Conditions keep no history, but lastTransitionTime moves only when a condition flips, and the
    planner writes Running together with Restarting, Suspended and Finished from the job's first
    pass on. So a Running condition that is False and has not flipped since that first pass (its
    lastTransitionTime no later than the earliest of the others') never was True; one that ran
    flipped to True and back, after them."""
    if status is None:
        return True
    running = _condition(status, JobCondition.RUNNING)
    if running is None:
        return True
    if running.status == "True":
        return False
    others = [
        _utc(c.last_transition_time)
        for c in status.conditions
        if c.type in (JobCondition.RESTARTING, JobCondition.SUSPENDED, JobCondition.FINISHED)
    ]
    return not others or _utc(running.last_transition_time) <= min(others)


@dataclass
class Metrics:
    """The operator's metrics and the bookkeeping behind the phase gauges.

    ``leader``: whether this replica reconciles from the start; a replica that must first win an
    election is made with ``leader=False`` and told with :meth:`leading`."""

    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))
    phases: dict[str, dict[Key, str]] = field(default_factory=lambda: {JOB_KIND: {}, MOUNT_KIND: {}})
    counts: dict[str, Tally[str]] = field(default_factory=lambda: {JOB_KIND: Tally(), MOUNT_KIND: Tally()})
    leader: bool = True

    def __post_init__(self) -> None:
        # prometheus_client's documented switch (as PROMETHEUS_DISABLE_CREATED_SERIES=true would be);
        # process-wide, read when a registry is collected: the operator owns its process.
        disable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated in prometheus_client 0.26
        r = self.registry
        self.reconciles = Counter(
            "kubedgx_reconcile",
            "Reconcile passes by kind and outcome (ok; retry: a 409, 429 or 5xx answer or a lost connection; "
            "error: anything else).",
            ["kind", "outcome"],
            registry=r,
        )
        self.durations = Histogram(
            "kubedgx_reconcile_duration_seconds",
            "Duration of reconcile passes in seconds, by kind.",
            ["kind"],
            buckets=BUCKETS,
            registry=r,
        )
        self.gauges = {
            JOB_KIND: Gauge(
                "kubedgx_jobs",
                "DGXTrainingJobs by the phase the leader's last successful reconcile gave them (0 on other replicas).",
                ["phase"],
                registry=r,
            ),
            MOUNT_KIND: Gauge(
                "kubedgx_data_mounts",
                "DGXDataMounts by the phase the leader's last successful reconcile gave them (0 on other replicas).",
                ["phase"],
                registry=r,
            ),
        }
        self.restarts = Counter(
            "kubedgx_worker_restarts",
            "Worker pods replaced, one per worker, by why: WorkerRestarted (its program failed), WorkerDisrupted "
            "(eviction, preemption, node failure), WorkerReplaced (an interactive worker exited), WorkerLost "
            "(vanished: node loss, spot reclaim, deleted by someone else).",
            ["reason"],
            registry=r,
        )
        self.api_errors = Counter(
            "kubedgx_api_errors",
            "Kubernetes API calls of the operator that failed, by verb and HTTP code.",
            ["verb", "code"],
            registry=r,
        )
        self.finished = Counter(
            "kubedgx_jobs_finished",
            "DGXTrainingJobs this operator moved into Succeeded or Failed, by outcome and the condition's reason.",
            ["outcome", "reason"],
            registry=r,
        )
        self.time_to_running = Histogram(
            "kubedgx_job_time_to_running_seconds",
            "Seconds from a DGXTrainingJob's creation to its first Running (queueing, scheduling, image pulls, "
            "data sync).",
            buckets=TIME_TO_RUNNING_BUCKETS,
            registry=r,
        )
        self.run_durations = Histogram(
            "kubedgx_job_run_duration_seconds",
            "Seconds from a DGXTrainingJob's status.startTime to its status.completionTime, by outcome.",
            ["outcome"],
            buckets=RUN_DURATION_BUCKETS,
            registry=r,
        )
        self.webhook_requests = Counter(
            "kubedgx_webhook_requests",
            "Admission reviews by kind, operation and result (allowed; denied: invalid, 422; error: "
            "could not check, the apiserver applies the failurePolicy).",
            ["kind", "operation", "result"],
            registry=r,
        )
        self.webhook_durations = Histogram(
            "kubedgx_webhook_request_duration_seconds",
            "Seconds the operator took to review an admission request, by kind.",
            ["kind"],
            buckets=WEBHOOK_BUCKETS,
            registry=r,
        )
        # Usage (issue 31): counted by the replica whose status write carried it, with the amount that
        # write added, so sum(increase(...)) over replicas is right across restarts and leader changes.
        usage_labels = ["namespace", "instance", "capacity", "queue"]
        self.gpu_seconds = Counter(
            "kubedgx_gpu_seconds",
            "GPU-seconds DGXTrainingJobs' workers held nodes for (status.usage), by namespace, instance type, the "
            "capacity they ran in and Kueue LocalQueue (empty without).",
            usage_labels,
            registry=r,
        )
        self.cost = Counter(
            "kubedgx_cost",
            "What those GPU-seconds cost at the catalog's prices, in its currency (only priced instances).",
            [*usage_labels, "currency"],
            registry=r,
        )
        self.spot_savings = Counter(
            "kubedgx_spot_savings",
            "What GPU-seconds on capacity cheaper than the catalog's reference (spot against norm) saved.",
            ["namespace", "instance", "queue", "currency"],
            registry=r,
        )
        self.price = Gauge(
            "kubedgx_price_per_gpu_hour",
            "The catalog's price of a GPU-hour by GPU family and capacity (absent: unpriced), for joins.",
            ["family", "capacity", "currency"],
            registry=r,
        )
        self.leader_gauge = Gauge(
            "kubedgx_leader",
            "1 while this replica is the leader and reconciles; 0 while it stands by and reconciles nothing.",
            registry=r,
        )
        Info("kubedgx_build", "The operator's version and those of Python and kopf (value 1).", registry=r).info(
            {
                "version": _version("kubedgx"),
                "python_version": platform.python_version(),
                "kopf_version": _version("kopf"),
            }
        )
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        # Every series that can appear starts at zero, so rate() and absent() work from the first scrape.
        for kind in (JOB_KIND, MOUNT_KIND):
            self.durations.labels(kind)
            self.webhook_durations.labels(kind)
            for outcome in OUTCOMES:
                self.reconciles.labels(kind, outcome)
            for operation in WEBHOOK_OPERATIONS:
                for result in WEBHOOK_RESULTS:
                    self.webhook_requests.labels(kind, operation, result)
        for phase in JOB_PHASES:
            self.gauges[JOB_KIND].labels(phase).set(0)
        for mount_phase in MOUNT_PHASES:
            self.gauges[MOUNT_KIND].labels(mount_phase).set(0)
        for reason in RESTART_REASONS:
            self.restarts.labels(reason)
        for outcome, reasons in FINISH_REASONS.items():
            self.run_durations.labels(outcome)
            for reason in reasons:
                self.finished.labels(outcome, reason)
        self.leader_gauge.set(1 if self.leader else 0)

    # -- reconciles -----------------------------------------------------------------------------

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

    def api_error(self, verb: str, code: int | str) -> None:
        self.api_errors.labels(verb, str(code)).inc()

    # -- jobs -----------------------------------------------------------------------------------

    def job_status_written(
        self, created: datetime | None, old: DGXTrainingJobStatus | None, new: DGXTrainingJobStatus
    ) -> None:
        """A job's status write from ``old`` to ``new`` succeeded: count the transitions it made.

        Called only for writes, so a finished job that is merely read again (every later pass, a
        restarted operator's first pass) counts nothing: its stored phase is already terminal. A
        write the apiserver refused (409, 5xx) is planned and written again, and counted then."""
        before = old.phase if old is not None else None
        if new.phase in TERMINAL and before not in TERMINAL:
            ended = _condition(new, new.phase) or _condition(new, JobCondition.FINISHED)
            self.finished.labels(new.phase, ended.reason if ended is not None else new.phase).inc()
            ran = _seconds(new.start_time, new.completion_time)
            if ran is not None:
                self.run_durations.labels(new.phase).observe(ran)
        if new.phase == JobPhase.RUNNING and before in STARTING and never_ran(old):
            running = _condition(new, JobCondition.RUNNING)
            waited = _seconds(created, running.last_transition_time if running is not None else None)
            if waited is not None:
                self.time_to_running.observe(waited)

    def prices(self, catalog: Catalog) -> None:
        """The catalog's prices as gauges (the operator reads its catalog once, at start)."""
        pricing = catalog.spec.pricing
        if pricing is None:
            return
        for family in catalog.spec.gpus:
            for capacity, price in catalog.prices_for(family.key).items():
                if price is not None:
                    self.price.labels(family.key, capacity, pricing.currency).set(float(price))

    def usage_written(self, namespace: str, instance: str, queue: str, old: Usage | None, new: Usage | None) -> None:
        """A job's status write moved its usage from ``old`` to ``new``: count what it added."""
        if new is None or new == old:
            return
        currency = new.currency
        before = {b.key: b.gpu_seconds for b in usage.from_status(old).buckets}
        saved = Decimal(0)
        for b in usage.from_status(new).buckets:
            added = b.gpu_seconds - before.get(b.key, 0)
            if added <= 0:
                continue
            self.gpu_seconds.labels(namespace, instance, b.capacity, queue).inc(added)
            if b.price is not None and currency is not None:
                self.cost.labels(namespace, instance, b.capacity, queue, currency).inc(float(added * b.price / 3600))
                if b.reference_price is not None and b.reference_price > b.price:
                    saved += added * (b.reference_price - b.price) / 3600
        if saved and currency is not None:
            self.spot_savings.labels(namespace, instance, queue, currency).inc(float(saved))

    def restarted(self, reason: str, workers: int = 1) -> None:
        self.restarts.labels(reason).inc(workers)

    def worker_deleted(self, pod: PodView | None, phase: str | None, job_deleting: bool) -> None:
        """The operator deleted a worker pod (as observed before the plan) while planning ``phase``.
        It is a replacement when the pod had ended (failed, or an interactive worker that exited)
        and the job goes on; deleting running workers (scale-down) or workers of a job that ends,
        is suspended or is deleted replaces nothing. A pod counts once: once deleted, it shows as
        terminating and is never deleted again."""
        if pod is None or pod.terminating or job_deleting or phase in (*TERMINAL, JobPhase.SUSPENDED):
            return
        if pod.succeeded:
            self.restarted(JobReason.WORKER_REPLACED)
        elif pod.failed:
            self.restarted(JobReason.WORKER_DISRUPTED if pod.disrupted else JobReason.WORKER_RESTARTED)

    def event(self, reason: str, message: str) -> None:
        """An event of a plan that was carried out. Workers lost without this operator's doing are
        known only by the planner's count in its WorkerLost event."""
        if reason == JobReason.WORKER_LOST:
            found = _LOST.match(message)
            self.restarted(JobReason.WORKER_LOST, int(found.group(1)) if found else 1)

    # -- the webhook ----------------------------------------------------------------------------

    def admission(self, kind: str, operation: str | None, result: str, seconds: float) -> None:
        self.webhook_requests.labels(kind, operation or "UNKNOWN", result).inc()
        self.webhook_durations.labels(kind).observe(seconds)

    # -- leadership -----------------------------------------------------------------------------

    def leading(self, is_leader: bool) -> None:
        """This replica became the leader (it reconciles from now on) or stopped being it. A replica
        that stops reconciling forgets the phases it counted: they would go stale, and a dashboard
        summing the phase gauges over replicas would count every job twice. The new leader's
        reconciles fill its gauges."""
        self.leader = is_leader
        self.leader_gauge.set(1 if is_leader else 0)
        if not is_leader:
            for kind, known in self.phases.items():
                for key in list(known):
                    self.forget(kind, key)

    def exposition(self) -> bytes:
        """The classic text format, as a scrape without an Accept header gets it."""
        return generate_latest(self.registry)


async def serve(metrics: Metrics, port: int, host: str = "0.0.0.0") -> aiohttp.web.AppRunner:
    """Serve GET /metrics until ``await runner.cleanup()``. Raises OSError when the port is taken.

    prometheus_client's handler, not one of ours: it negotiates the format (the classic text format
    by default, OpenMetrics when the Accept header asks for it), compresses when asked and honours
    ``name[]`` filters, as every other exporter does."""
    import aiohttp.web  # here: the module stays importable without the server's dependencies
    from prometheus_client.aiohttp import make_aiohttp_handler

    app = aiohttp.web.Application()
    app.router.add_get("/metrics", make_aiohttp_handler(metrics.registry))
    runner = aiohttp.web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        await aiohttp.web.TCPSite(runner, host, port).start()
    except OSError:
        await runner.cleanup()
        raise
    log.info("serving metrics at http://%s:%d/metrics", host, port)
    return runner
