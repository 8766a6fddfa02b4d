"""Observe -> plan -> act, once per job at a time.

kopf delivers many triggers (the job's own watch events, every event of its pods, mount events,
timers); they all land in :meth:`Controller.trigger`, which coalesces them into one reconcile per
job at a time. A reconcile reads the job fresh, observes its children from kopf's indexes plus
this process's *expectations* (children it has created or deleted but whose watch events have not
arrived yet; without them an index that lags would make the operator create a worker twice), asks
the pure planner, and carries the plan out through :mod:`dgx_operator.kube`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from dgx_operator.api import DGXTrainingJob
from dgx_operator.api.limits import KIND as LIMITS_KIND
from dgx_operator.api.limits import LIMITS_NAME, DGXLimits, LimitsSpec
from dgx_operator.api.trainingjob import DGXTrainingJobStatus
from dgx_operator.api.vocabulary import JobCondition, JobPhase, JobReason
from dgx_operator.catalog import Catalog
from dgx_operator.controllers import ledger
from dgx_operator.controllers.loop import RESYNC, EventSink, Key, ReconcileLoop, utcnow
from dgx_operator.controllers.metrics import JOB_KIND, Metrics
from dgx_operator.kube import ApiError, ForeignObjectError, Kube, TransientError, refusal, status_of
from dgx_operator.reconcile.diagnosis import diagnose
from dgx_operator.reconcile.mounts import mount_state, parse_mount
from dgx_operator.reconcile.planner import UNREADABLE, Event, MountState, Observed, Plan, Refused, plan
from dgx_operator.reconcile.pods import PodView, progress_in_log, slim
from dgx_operator.reconcile.queueing import (
    GROUP as KUEUE_GROUP,
)
from dgx_operator.reconcile.queueing import (
    PRIORITY_LABEL,
    QUEUE_LABEL,
    VERSIONS,
    Flavor,
    PriorityClass,
    Queueing,
    WorkloadView,
    WorkloadWrites,
    queue_of,
)
from dgx_operator.reconcile.spending import BudgetView
from dgx_operator.reconcile.status import merge_patch
from dgx_operator.reconcile.stored import parse_stored
from dgx_operator.render import BuildContext, JobIdentity, trainer_config
from dgx_operator.render.names import (
    CONTAINER_NAME,
    FINALIZER,
    INDEX_LABEL,
    JOB_LABEL,
    detached_value,
    service_name,
)
from dgx_operator.render.resolved import Defaults
from dgx_operator.validation.limits import Effective, effective, parse_limits

log = logging.getLogger("kubedgx")


def namespace_terminating(exc: ApiError) -> bool:
    """A create refused because its namespace is being deleted (403, cause NamespaceTerminating):
    permanent for that namespace, and no RBAC problem."""
    return exc.status == 403 and "NamespaceTerminating" in str(exc.body or "")


#: How long a create/delete is assumed in flight before its watch event must have arrived.
EXPECTATION_TTL = 60.0
#: Seconds between reads of a running worker 0's progress (the setting KUBEDGX_PROGRESS_INTERVAL).
DEFAULT_PROGRESS_INTERVAL = 30.0
#: How long a job's status may lag behind its counts in flight (the setting KUBEDGX_STATUS_INTERVAL;
#: see reconcile.planner.coalesce).
DEFAULT_STATUS_INTERVAL = 10.0
#: How much of worker 0's log one read takes: the trainer prints a progress line per logging step,
#: and other lines (warnings, a library's output) between them; the newest report is near the end.
PROGRESS_LOG_LINES = 200
PROGRESS_LOG_BYTES = 256 * 1024
#: How much of a failed worker's log is read for its cause (see Controller.failure_logs), and for
#: how long at most: a real kubelet answers in milliseconds; an unreachable node never does.
FAILURE_LOG_LINES = 400
FAILURE_LOG_TIMEOUT = 3.0


def status_patch(old: DGXTrainingJobStatus | None, new: DGXTrainingJobStatus) -> dict[str, Any] | None:
    """The merge patch taking the stored status to the planned one, or None when nothing changed:
    a reconcile that learns nothing writes nothing."""
    patch = merge_patch(old.to_manifest() if old is not None else {}, new.to_manifest())
    return patch or None


@dataclass
class Expectations:
    """Children this process created or deleted, until the watch caches reflect it. Keys are
    "Kind/name"; values carry the monotonic time of the call (and the manifest for creates)."""

    created: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    deleted: dict[str, float] = field(default_factory=dict)
    #: Pods relabelled "<job>.detached" whose new label the cache may not show yet.
    detached: dict[str, float] = field(default_factory=dict)

    def settle(self, present: set[str], now: float) -> None:
        """Drop what the caches now show (or what is older than the TTL: then a lost event must
        not pin a phantom child forever; the next create simply answers 409)."""
        self.created = {k: v for k, v in self.created.items() if k not in present and now - v[0] < EXPECTATION_TTL}
        self.deleted = {k: t for k, t in self.deleted.items() if k in present and now - t < EXPECTATION_TTL}
        self.detached = {k: t for k, t in self.detached.items() if now - t < EXPECTATION_TTL}


#: (namespace, job) -> the job's pods as the planner reads them (kopf's pod index keeps PodViews,
#: not pods: at 1,000 jobs x 8 workers even slimmed bodies were some 30 MB of the operator's memory).
PodSource = Callable[[str, str], Sequence[PodView]]
NamesSource = Callable[[str, str], bool]
#: (namespace, job) -> [(name, controller owner uid)] of the job's ConfigMaps.
ConfigMapSource = Callable[[str, str], list[tuple[str, str | None]]]
#: (namespace, job) -> the Workloads that job controls (slim bodies, see queueing.slim_workload).
WorkloadSource = Callable[[str, str], list[Mapping[str, Any]]]
FlavorSource = Callable[[], Mapping[str, Flavor]]
#: namespace -> its DGXLimits "default" as stored (None: it has none), read with the operator's client.
LimitsSource = Callable[[str], Awaitable[Mapping[str, Any] | None]]
#: namespace -> its readable DGXBudgets and (when it has any) its jobs (controllers.ledger.read).
BudgetSource = Callable[[str], Awaitable[tuple[list[BudgetView], list[DGXTrainingJob]]]]

#: How long a discovery of Kueue's API is trusted: not installed (look again soon: an admin may be
#: installing it), installed (its version changes only with an upgrade).
KUEUE_ABSENT_TTL = 15.0
KUEUE_PRESENT_TTL = 300.0


@dataclass(frozen=True)
class KueueSettings:
    """The Kueue integration is on (see reconcile.queueing)."""

    manage_without_queue_name: bool = False


def _held_by_budget(result: Plan) -> bool:
    return any(
        c.type == JobCondition.SUSPENDED and c.reason == JobReason.BUDGET_EXCEEDED for c in result.status.conditions
    )


def starting(job: DGXTrainingJob) -> bool:
    """A pass that may start a run (planner.budget judges it): the job has none going, has not
    ended and is not being deleted."""
    status = job.status
    return job.metadata.deletion_timestamp is None and (
        status is None or (status.start_time is None and status.phase not in JobPhase.TERMINAL)
    )


def _no_workloads(namespace: str, name: str) -> list[Mapping[str, Any]]:
    return []


def _no_flavors() -> Mapping[str, Flavor]:
    return {}


@dataclass
class Controller(ReconcileLoop):
    """The reconcile loop of DGXTrainingJobs; see the module docstring."""

    kind: ClassVar[str] = JOB_KIND
    kube: Kube
    catalog: Catalog
    defaults: Defaults
    pods_of: PodSource
    has_service: NamesSource
    config_maps_of: ConfigMapSource
    post_event: EventSink
    now: Callable[[], datetime] = utcnow
    locks: dict[Key, asyncio.Lock] = field(default_factory=dict)
    dirty: set[Key] = field(default_factory=set)
    workers: dict[Key, asyncio.Task[None]] = field(default_factory=dict)
    timers: dict[Key, asyncio.TimerHandle] = field(default_factory=dict)
    expectations: dict[Key, Expectations] = field(default_factory=dict)
    failures: dict[Key, int] = field(default_factory=dict)
    on_reconciled: Callable[[Key, Plan | None], Awaitable[None]] | None = None
    retry_base: float = 1.0
    metrics: Metrics | None = None
    #: Jobs whose "stored spec no longer parses" warning was posted (until they parse again).
    unreadable_jobs: set[Key] = field(default_factory=set)
    #: Kueue's job integration; None: off (the queue label is only copied onto the workers).
    kueue: KueueSettings | None = None
    workloads_of: WorkloadSource = _no_workloads
    flavors_of: FlavorSource = _no_flavors
    #: The guard rails of every namespace (the chart's limits); combined with each namespace's
    #: DGXLimits, read through ``limits_of`` (None: not read), at a job's first pass only.
    cluster_limits: LimitsSpec | None = None
    limits_of: LimitsSource | None = None
    #: The namespace's DGXBudgets (None: budgets are not enforced), read for passes that may start a
    #: run; a run's reservations and its settling are written through ``kube``.
    budgets_of: BudgetSource | None = None
    #: (the served Workload version or None, when it was discovered).
    kueue_api: tuple[str | None, float] | None = None
    #: Seconds between two reads of a running worker 0's log for its progress (0: never read). It
    #: bounds both costs: one log read, and at most one status write for progress, per job per interval.
    progress_interval: float = DEFAULT_PROGRESS_INTERVAL
    #: When each job's worker 0 log was last read (``now``: the tests' clock moves it).
    progress_reads: dict[Key, datetime] = field(default_factory=dict)
    #: Per job, the last report read that carried no updatedAt (a ``spec.command`` program's) and
    #: when it was first seen: such a report is stamped with the time it first appeared, so that
    #: spec.maxIdle sees when progress last moved (within one interval).
    progress_seen: dict[Key, tuple[str, datetime]] = field(default_factory=dict)
    #: Per job, (failed pod, when its container ended) -> the log tail that diagnosed it, or None
    #: when it named nothing (or could not be read): read once (see failure_logs).
    failure_reads: dict[Key, dict[tuple[str, datetime | None], str | None]] = field(default_factory=dict)
    #: Seconds a job's status may lag behind its counts in flight (0: every change written at once).
    status_interval: float = DEFAULT_STATUS_INTERVAL
    #: How long a running job's status.usage may lag behind (KUBEDGX_USAGE_INTERVAL).
    usage_interval: float = 300.0
    #: When this process last wrote each job's status (``now``): the planner holds a change of the
    #: counts in flight alone until that write is status_interval old.
    status_writes: dict[Key, datetime] = field(default_factory=dict)
    #: Since when each job's passes have held back a change of its counts in flight.
    status_held: dict[Key, datetime] = field(default_factory=dict)
    #: Jobs waiting for a DGXBudget (BudgetExceeded): woken when a budget of their namespace changes.
    budget_held: set[Key] = field(default_factory=set)

    async def step(self, key: Key) -> float | None:
        result = await self.reconcile(*key)
        delay = result.requeue_after if result is not None else None
        if result is not None and result.status.phase not in JobPhase.TERMINAL:
            delay = min(delay if delay is not None else RESYNC, RESYNC)
        if result is not None and result.status.phase == JobPhase.RUNNING and self.progress_interval > 0:
            # A running job's progress changes without any event: come back for it.
            delay = min(delay if delay is not None else self.progress_interval, self.progress_interval)
        return delay

    def wake_budget_held(self, namespace: str) -> None:
        """A budget of ``namespace`` changed (raised, a run ended, a new period): its held jobs look again."""
        for key in sorted(k for k in self.budget_held if k[0] == namespace):
            self.trigger(*key)

    def forget(self, namespace: str, name: str) -> None:
        """The job is gone: drop its bookkeeping."""
        key = (namespace, name)
        self.cancel_timer(key)
        self.forget_key(key)
        self.expectations.pop(key, None)
        self.failures.pop(key, None)
        self.progress_reads.pop(key, None)
        self.progress_seen.pop(key, None)
        self.failure_reads.pop(key, None)
        self.status_writes.pop(key, None)
        self.status_held.pop(key, None)
        self.budget_held.discard(key)
        self.locks.pop(key, None)
        self.unreadable_jobs.discard(key)
        if self.metrics is not None:
            self.metrics.forget(self.kind, key)

    async def unreadable(self, key: Key, body: Mapping[str, Any], why: str) -> None:
        """A job the model refuses (see :mod:`dgx_operator.reconcile.stored`): nothing can be planned
        for it, so it is left as it is, with one warning; deleting it must still finish, so its
        finalizer goes (its pods go with it through their owner references)."""
        namespace, name = key
        if key not in self.unreadable_jobs:
            self.unreadable_jobs.add(key)
            self.post_event(body, "Warning", JobReason.INVALID_SPEC, why)
        log.warning("DGXTrainingJob %s/%s: %s", namespace, name, why)
        finalizers = list(body["metadata"].get("finalizers") or [])
        if body["metadata"].get("deletionTimestamp") and FINALIZER in finalizers:
            remaining = [f for f in finalizers if f != FINALIZER]
            await self.kube.set_finalizers(namespace, name, body["metadata"].get("resourceVersion"), remaining)

    # -- one pass ------------------------------------------------------------------------------

    async def reconcile(self, namespace: str, name: str) -> Plan | None:
        key = (namespace, name)
        lock = self.locks.setdefault(key, asyncio.Lock())
        async with lock:
            body = await self.kube.get_job(namespace, name)
            if body is None:
                self.forget(namespace, name)
                return None
            finalizers = list(body["metadata"].get("finalizers") or [])
            if FINALIZER not in finalizers and not body["metadata"].get("deletionTimestamp"):
                # Before any child exists, so deleting the job always waits for its workers.
                body = await self.kube.set_finalizers(
                    namespace, name, body["metadata"].get("resourceVersion"), [*finalizers, FINALIZER]
                )
                if not body:
                    return None
            job, why = parse_stored(DGXTrainingJob, body)
            if job is None:
                await self.unreadable(key, body, why)
                if self.on_reconciled is not None:
                    await self.on_reconciled(key, None)
                return None
            self.unreadable_jobs.discard(key)
            observed = await self.observe(key, job)
            ctx = BuildContext(
                catalog=self.catalog, defaults=self.defaults, data_mounts=observed[1], data_digests=observed[2]
            )
            now = self.now()
            result = plan(job, ctx, observed[0], now)
            foreign, refused = await self.act(key, body, job, result, observed[0].pods)
            if foreign or refused:
                # A child's name is taken by someone else, or the apiserver refused a child for a
                # reason a retry would meet again: plan again knowing it, so the job fails (or waits
                # for quota) with a condition saying so instead of retrying forever.
                # Observed afresh: the creates that did succeed are expectations now, not made twice.
                again = (await self.observe(key, job))[0]
                retry = dataclasses.replace(again, foreign=tuple(foreign), refused=tuple(refused))
                result = plan(job, ctx, retry, self.now())
                await self.act(key, body, job, result, retry.pods)
            if result.status.phase == JobPhase.SUSPENDED and _held_by_budget(result):
                self.budget_held.add(key)
            else:
                self.budget_held.discard(key)
            if result.status_held:
                self.status_held.setdefault(key, now)
            else:
                self.status_held.pop(key, None)
            if result.release_finalizer and FINALIZER in (body["metadata"].get("finalizers") or []):
                remaining = [f for f in body["metadata"]["finalizers"] if f != FINALIZER]
                await self.kube.set_finalizers(namespace, name, body["metadata"].get("resourceVersion"), remaining)
            if self.metrics is not None and self.locks.get(key) is lock:  # not forgotten meanwhile
                released = result.release_finalizer and body["metadata"].get("deletionTimestamp")
                self.metrics.phase(self.kind, key, None if released else result.status.phase)
            if self.on_reconciled is not None:
                await self.on_reconciled(key, result)
            return result

    async def observe(self, key: Key, job: DGXTrainingJob) -> tuple[Observed, dict[str, Any], dict[str, str]]:
        """Children from the caches, corrected by this process's expectations; mounts read fresh."""
        namespace, name = key
        # Pods let go of (see Plan.detach) still hold their names: the planner must see them.
        raw = [*self.pods_of(namespace, name), *self.pods_of(namespace, detached_value(name))]
        present = {f"Pod/{p.name}" for p in raw}
        if self.has_service(namespace, service_name(name)):
            present.add(f"Service/{service_name(name)}")
        # The job's ConfigMaps (ours: a leftover of a deleted job of the same name is not).
        config_maps = {cm for cm, owner in self.config_maps_of(namespace, name) if owner == str(job.metadata.uid)}
        present |= {f"ConfigMap/{cm}" for cm in config_maps}
        exp = self.expectations.setdefault(key, Expectations())
        exp.settle(present, time.monotonic())
        views: list[PodView] = []
        for view in raw:
            if f"Pod/{view.name}" in exp.deleted and not view.terminating:
                view = dataclasses.replace(view, terminating=True)  # deleted by this process, not seen yet
            views.append(view)
        views += [PodView.of(manifest) for k, (_, manifest) in exp.created.items() if k.startswith("Pod/")]
        views = await self.failure_logs(key, job, views)
        expected = present | set(exp.created)
        mounts: dict[str, MountState] = {}
        specs: dict[str, Any] = {}
        digests: dict[str, str] = {}
        for ref in job.spec.data_mounts:
            body = await self.kube.get_mount(namespace, ref.name)
            if body is None:
                mounts[ref.name] = MountState(None)
                continue
            mount, why = parse_mount(body)
            if mount is None:
                mounts[ref.name] = MountState(UNREADABLE, why)
                continue
            specs[ref.name] = mount.spec
            phase, message, digest = mount_state(mount)
            mounts[ref.name] = MountState(phase, message)
            if digest:
                digests[ref.name] = digest
        current = trainer_config(JobIdentity.of(job), job.spec)
        wanted = current[0] if current is not None else None
        queueing = await self.queueing(job) if self.kueue is not None else None
        progress = await self.live_progress(key, job, views)
        first = job.status is None or job.status.phase is None
        limits = await self.limits(job) if first else None
        spend: tuple[list[BudgetView], list[DGXTrainingJob]] | None = None
        if self.budgets_of is not None and starting(job):
            spend = await self.budgets_of(job.metadata.namespace or "default")
        observed = Observed(
            budgets=tuple(spend[0]) if spend is not None else None,
            neighbours=tuple(spend[1]) if spend is not None else (),
            limits=limits,
            progress=progress,
            progress_live=self.progress_interval > 0,
            status_written_at=self.status_writes.get(key),
            status_interval=self.status_interval,
            usage_interval=self.usage_interval,
            status_held_since=self.status_held.get(key),
            queueing=queueing,
            pods=tuple(views),
            service=f"Service/{service_name(name)}" in expected,
            config_map=wanted is not None and f"ConfigMap/{wanted}" in expected,
            stale_config_maps=tuple(
                sorted(cm for cm in config_maps - {wanted} if f"ConfigMap/{cm}" not in exp.deleted)
            ),
            mounts=mounts,
        )
        return observed, specs, digests

    async def failure_logs(self, key: Key, job: DGXTrainingJob, views: list[PodView]) -> list[PodView]:
        """Failed workers whose termination message names no cause get their log's tail read once
        (pods/log, FAILURE_LOG_LINES): the kubelet keeps only the last 2 KiB of a program's log as
        its message, and PyTorch's watchdog line or a CUDA out-of-memory error is often printed
        further up, above torchrun's failure summary. When the tail names a cause, it stands in
        for the message (reconcile/diagnosis.py). One read per failed pod, all at once, each
        bounded in time; the answer is kept while the pod exists, so later passes read nothing."""
        uid = str(job.metadata.uid)
        seen = self.failure_reads.setdefault(key, {})
        wanted = [
            v
            for v in views
            if v.owner_uid == uid
            and v.failed
            and v.exited
            and v.failed_init is None
            and not v.terminating
            and v.diagnose() is None
            and (v.name, v.finished_at) not in seen
        ]
        namespace, _ = key
        tails = await asyncio.gather(
            *(
                self.kube.pod_log_tail(
                    namespace,
                    v.name,
                    CONTAINER_NAME,
                    lines=FAILURE_LOG_LINES,
                    limit_bytes=PROGRESS_LOG_BYTES,
                    timeout=FAILURE_LOG_TIMEOUT,
                )
                for v in wanted
            )
        )
        for v, tail in zip(wanted, tails, strict=True):
            seen[(v.name, v.finished_at)] = tail if tail and diagnose(tail) is not None else None
        present = {(v.name, v.finished_at) for v in views}
        for gone in [k for k in seen if k not in present]:
            del seen[gone]
        out = []
        for v in views:
            tail = seen.get((v.name, v.finished_at))
            out.append(dataclasses.replace(v, termination_message=tail) if tail is not None and v.failed else v)
        return out

    async def live_progress(self, key: Key, job: DGXTrainingJob, views: Sequence[PodView]) -> dict[str, Any] | None:
        """Worker 0's latest progress report from the tail of its log, while it runs, at most once
        per ``progress_interval``. The log is read through the apiserver (``pods/log``, the
        operator's RBAC), so training pods need no write access to report; a program that prints
        the progress contract's lines is read the same way as the built-in trainer."""
        if self.progress_interval <= 0:
            return None
        worker0 = next((v for v in views if v.index == 0 and v.owner_uid == str(job.metadata.uid) and v.running), None)
        if worker0 is None or worker0.terminating:
            return None
        now = self.now()
        last = self.progress_reads.get(key)
        if last is not None and (now - last).total_seconds() < self.progress_interval:
            return None
        self.progress_reads[key] = now
        namespace, _ = key
        text = await self.kube.pod_log_tail(
            namespace, worker0.name, CONTAINER_NAME, lines=PROGRESS_LOG_LINES, limit_bytes=PROGRESS_LOG_BYTES
        )
        report = progress_in_log(text) if text else None
        if report is not None and not report.get("updatedAt"):
            shape = json.dumps(report, sort_keys=True, default=str)
            seen = self.progress_seen.get(key)
            first = seen[1] if seen is not None and seen[0] == shape else now
            self.progress_seen[key] = (shape, first)
            report = {**report, "updatedAt": first.strftime("%Y-%m-%dT%H:%M:%SZ")}
        return report

    async def limits(self, job: DGXTrainingJob) -> Effective | None:
        """The guard rails of the job's namespace (planner.guardrails), or None when there are none.
        A DGXLimits this kubedgx cannot read is left out, with a warning in the log: the webhook has
        refused the job's create while it is unreadable, so this job came past it, and failing it for
        the admin's object would be the wrong party's fault. A failed read is raised (retried)."""
        namespace = job.metadata.namespace or "default"
        found: DGXLimits | None = None
        if self.limits_of is not None:
            body = await self.limits_of(namespace)
            if body is not None:
                found, why = parse_limits({k: v for k, v in body.items() if k != "status"})
                if why is not None:
                    log.warning("%s %s/%s: %s; its limits are not applied", LIMITS_KIND, namespace, LIMITS_NAME, why)
        if found is None and self.cluster_limits is None:
            return None
        limits = effective(self.cluster_limits, found, namespace)
        return None if limits.empty else limits

    # -- Kueue ------------------------------------------------------------------------------------

    async def kueue_version(self) -> str | None:
        """The Workload API version the cluster serves (None: no Kueue), rediscovered now and then."""
        now = time.monotonic()
        if self.kueue_api is not None:
            version, at = self.kueue_api
            if now - at < (KUEUE_PRESENT_TTL if version else KUEUE_ABSENT_TTL):
                return version
        version = await self.kube.served_version(KUEUE_GROUP, VERSIONS)
        self.kueue_api = (version, now)
        return version

    async def queueing(self, job: DGXTrainingJob) -> Queueing | None:
        """The job's standing in Kueue, if Kueue manages it: its Workloads (from the index), the
        ResourceFlavors, and its priority class (its value read only when a Workload is to be made)."""
        assert self.kueue is not None
        labels = dict(job.metadata.labels)
        queue = queue_of(labels, self.kueue.manage_without_queue_name)
        namespace, name, uid = job.metadata.namespace or "", job.metadata.name, str(job.metadata.uid)
        workloads = tuple(WorkloadView.of(b) for b in self.workloads_of(namespace, name))
        if queue is None:
            # No longer queued (the label went): only its leftover Workloads matter, to delete them.
            version = self.kueue_api[0] if self.kueue_api is not None else None
            if not workloads or version is None:
                return None
            return Queueing(None, api_version=f"{KUEUE_GROUP}/{version}", workloads=workloads)
        version = await self.kueue_version()
        if version is None:
            return Queueing(queue)
        exists = any(w.owner_uid == uid and not w.deleting for w in workloads)
        priority: PriorityClass | None = None
        error: str | None = None
        wpc = labels.get(PRIORITY_LABEL)
        pod_class = self.defaults.priority_classes.get(job.spec.priority)
        if wpc:
            value = (
                0 if exists else await self.kube.priority_value(KUEUE_GROUP, version, "workloadpriorityclasses", wpc)
            )
            if value is None:
                error = (
                    f"WorkloadPriorityClass {wpc!r} (label {PRIORITY_LABEL}) does not exist: create it, "
                    "or remove the label"
                )
            else:
                priority = PriorityClass("WorkloadPriorityClass", wpc, value)
        elif pod_class:
            value = (
                0 if exists else await self.kube.priority_value("scheduling.k8s.io", "v1", "priorityclasses", pod_class)
            )
            # A missing PriorityClass refuses the workers themselves, with the apiserver's message.
            priority = PriorityClass("PriorityClass", pod_class, value or 0)
        return Queueing(
            queue,
            api_version=f"{KUEUE_GROUP}/{version}",
            workloads=workloads,
            flavors=self.flavors_of(),
            priority=priority,
            priority_error=error,
        )

    async def write_workloads(self, body: Mapping[str, Any], namespace: str, writes: WorkloadWrites) -> None:
        """Carry out the plan's Workload writes. A refusal (Kueue's webhook, RBAC) is told in an
        Event, in the apiserver's words, and retried with the job's backoff."""
        version = self.kueue_api[0] if self.kueue_api is not None else None
        if version is None:
            return
        api = f"{KUEUE_GROUP}/{version}"
        try:
            if writes.create is not None:
                await self.kube.create_workload(writes.create)
            for name, uid in writes.delete:
                await self.kube.delete_workload(api, namespace, name, uid)
            for name, rv, patch in writes.patch:
                await self.kube.patch_workload(api, namespace, name, rv, patch)
            for name, rv, patch in writes.status:
                await self.kube.patch_workload(api, namespace, name, rv, {"status": patch}, status=True)
        except ApiError as exc:
            what = f"Workload: HTTP {exc.status}: {status_of(exc)[1]}"
            self.post_event(body, "Warning", JobReason.WORKLOAD_WRITE_FAILED, what[:1000])
            raise TransientError(f"write Workload failed: HTTP {exc.status}") from exc

    async def act(
        self, key: Key, body: Mapping[str, Any], job: DGXTrainingJob, result: Plan, views: Sequence[PodView] = ()
    ) -> tuple[list[str], list[Refused]]:
        """Carry out a plan: creates, the status write, deletes, events, TTL deletion. Returns the
        children found foreign and the creates refused for good or for quota; if there are any,
        nothing after the creates was done (the caller plans again knowing them). ``views``: the
        workers as the plan saw them (the metrics tell a replaced worker from a deleted one)."""
        namespace, name = key
        exp = self.expectations.setdefault(key, Expectations())
        uid = str(job.metadata.uid)
        foreign: list[str] = []
        refused: list[Refused] = []
        terminating: list[str] = []

        async def create(obj: dict[str, Any]) -> None:
            try:
                outcome = await self.kube.create(obj, uid)
            except ForeignObjectError as exc:
                foreign.append(exc.description)
                return
            except ApiError as exc:
                if namespace_terminating(exc):
                    # Nothing can be created there any more, and the namespace controller is about to
                    # delete the job: a retry would meet the same refusal after each backoff, and its
                    # CreateFailed Event is refused too. Seen on the real apiserver (tests/cluster).
                    log.debug("%s/%s: namespace is terminating; not creating %s", namespace, name, obj["kind"])
                    terminating.append(obj["kind"])
                    return
                no = refusal(exc)
                if no is not None and no.kind != "passing":
                    log.info("%s/%s: %s %s refused (%s): %s", namespace, name, obj["kind"], obj["metadata"]["name"],
                             no.kind, no.message)  # fmt: skip
                    refused.append(Refused(obj["kind"], obj["metadata"]["name"], no.kind == "permanent", no.message))
                    return
                # Worth a retry (RBAC being fixed, a webhook down): say so once per backoff, in the
                # apiserver's words rather than the HTTP dump with its headers.
                what = f"{obj['kind']} {obj['metadata']['name']}: HTTP {exc.status}: {status_of(exc)[1]}"
                self.post_event(body, "Warning", JobReason.CREATE_FAILED, what[:1000])
                raise TransientError(f"create {obj['kind']} failed: HTTP {exc.status}") from exc
            if outcome != "blocked":
                # Only what PodView reads: a whole manifest per in-flight worker would be most of
                # the operator's memory at a thousand jobs.
                kept = slim(obj) if obj["kind"] == "Pod" else {}
                exp.created[f"{obj['kind']}/{obj['metadata']['name']}"] = (time.monotonic(), kept)

        # A stuck pod leaves the job's Service (DNS) before its replacement starts.
        for pod in result.detach:
            if f"Pod/{pod}" not in exp.detached:
                await self.kube.patch_pod_labels(namespace, pod, {JOB_LABEL: detached_value(name)})
                exp.detached[f"Pod/{pod}"] = time.monotonic()
        # The ConfigMap and Service first (workers mount and resolve them), then worker 0 (it hosts
        # the rendezvous: when a ResourceQuota has room for only some workers, those must include
        # it), then the others all at once, as the Job controller does; every success is remembered
        # even if another fails.
        # A starting run's reservations first: a budget that changed since it was judged answers 409
        # (TransientError) and nothing is created; the job is judged again.
        if result.reserve and any(o["kind"] == "Pod" for o in result.create):
            await ledger.reserve(self.kube, result.reserve, self.catalog, self.now())
        shared = [o for o in result.create if o["kind"] != "Pod"]
        for obj in shared:
            await create(obj)
        pods = [o for o in result.create if o["kind"] == "Pod"]
        first = [o for o in pods if o["metadata"]["labels"].get(INDEX_LABEL) == "0"]
        outcomes: list[Any] = []
        for obj in first:
            outcomes += await asyncio.gather(create(obj), return_exceptions=True)
        outcomes += await asyncio.gather(*(create(o) for o in pods if o not in first), return_exceptions=True)
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        if errors:
            raise errors[0]
        if foreign or refused:
            return foreign, refused
        if terminating:
            # Write nothing either: the planned status counts the workers that were not created, so
            # the next pass would find them "lost", bump the attempt, post an Event and write again,
            # each write triggering the next pass — a hot loop until the namespace controller deletes
            # the job (seen in the cluster suite, where it starved the other jobs' reconciles).
            return [], []
        # The status before the deletes: it records the restart a failed worker's deletion answers,
        # so if the write fails (409, 5xx) the failed pod is still there to be counted on the retry,
        # and once it succeeded a retry sees the pod's attempt as already handled.
        if result.settle and self.budgets_of is not None:
            # Before the status write: if settling fails, the retry still sees the run end and settles.
            done = job.model_copy(update={"status": result.status})
            await ledger.settle_job(self.kube, done, self.catalog, self.now(), release=True)
        patch = status_patch(job.status, result.status)
        if patch is not None:
            await self.kube.patch_job_status(namespace, name, job.metadata.resource_version, patch)
            self.status_writes[key] = self.now()
            if self.metrics is not None:  # counted once written: a refused write is planned again
                self.metrics.job_status_written(job.metadata.creation_timestamp, job.status, result.status)
                self.metrics.usage_written(
                    namespace,
                    job.spec.instance,
                    (job.metadata.labels or {}).get(QUEUE_LABEL, ""),
                    job.status.usage if job.status is not None else None,
                    result.status.usage,
                )
        seen = {v.name: v for v in views}
        deleting = bool(body["metadata"].get("deletionTimestamp"))
        for pod in result.delete:
            await self.kube.delete_pod(namespace, pod)
            exp.deleted[f"Pod/{pod}"] = time.monotonic()
            if self.metrics is not None:
                self.metrics.worker_deleted(seen.get(pod), result.status.phase, deleting)
        for config_map in result.delete_config_maps:
            await self.kube.delete_config_map(namespace, config_map)
            exp.deleted[f"ConfigMap/{config_map}"] = time.monotonic()
        if result.workloads:
            await self.write_workloads(body, namespace, result.workloads)
        for event in result.events:
            self.emit(body, event)
        if result.delete_job:
            await self.kube.delete_job(namespace, name)
        return [], []

    def emit(self, body: Mapping[str, Any], event: Event) -> None:
        self.post_event(body, event.type, event.reason, event.message)
        if self.metrics is not None:
            self.metrics.event(event.reason, event.message)
