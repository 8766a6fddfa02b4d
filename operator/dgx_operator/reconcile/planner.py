"""The planner: (job, observed children, now) -> what to create, delete and report.

One pure function serves every trigger (create, resume, spec update, timer, pod or mount event),
so the operator is level-triggered: it compares what exists with what should exist and never
relies on having seen an edge. Everything here is deterministic and unit-tested; `kube.py` only
carries the plan out.

Restart accounting is idempotent under crashes: a failure is counted by bumping
``status.attempt`` together with ``status.restarts`` in one status write, and only failures of
pods from the *current* attempt count. A worker that failed in attempt 3 and is seen again after
the operator restarted (status already at attempt 4) is replaced without being counted twice.
Failures that cascade from one incident (a crash, then NCCL errors on the other workers) are
therefore one restart, as with torchrun's own group restarts. A restart replaces only the failed
workers, so survivors keep their older attempt: when one of them fails later (its container ended
more than CASCADE_WINDOW after ``status.lastRestartTime``), that is a new incident, judged by the
restart policy like any other.

A worker stuck Terminating on a lost node (see PodView.gone) is gone for every purpose but its name:
it is let go of (relabelled), replaced under a free name with the same hostname, never counted.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from dgx_operator.api.common import Condition
from dgx_operator.api.trainingjob import (
    KIND,
    Artifact,
    DGXTrainingJob,
    DGXTrainingJobStatus,
    Progress,
    WorkerCounts,
)
from dgx_operator.api.vocabulary import JobCondition, JobPhase, JobReason, MountPhase, PhaseName
from dgx_operator.catalog import UnknownInstanceError
from dgx_operator.reconcile.pods import PERMANENT_WAITING, STUCK_AFTER, PodView, artifacts_of, read_progress
from dgx_operator.reconcile.queueing import (
    Gate,
    Queueing,
    WorkloadView,
    WorkloadWrites,
    decide,
    pod_set,
    pods_ready_status,
)
from dgx_operator.reconcile.status import find_condition, set_condition
from dgx_operator.render import BuildContext, BuildError, JobIdentity, headless_service, trainer_config_map, worker_pod
from dgx_operator.render.datasync import archives
from dgx_operator.render.names import replacement_name
from dgx_operator.render.resolved import Resolved, resolve

EventType = Literal["Normal", "Warning"]
#: A condition reason the CRD's schema takes (api.common.Condition).
REASON = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")

# The condition types (api.vocabulary.JobCondition), by the short names the ladder reads best with.
RUNNING = JobCondition.RUNNING
RESTARTING = JobCondition.RESTARTING
SUSPENDED = JobCondition.SUSPENDED
SUCCEEDED = JobCondition.SUCCEEDED
FAILED = JobCondition.FAILED
DATA_READY = JobCondition.DATA_READY
FINISHED = JobCondition.FINISHED
ARCHIVED = JobCondition.ARCHIVED
WORKERS_PENDING = JobCondition.WORKERS_PENDING
TERMINAL = JobPhase.TERMINAL


#: How long after a restart a failure of a worker from an older attempt still belongs to it: the
#: survivors of a crash notice the lost peer (NCCL errors, torchrun's rendezvous keep-alive) within
#: seconds, and the kubelet's clock may be a few seconds off the operator's. Later, it is a new incident.
CASCADE_WINDOW = timedelta(seconds=60)
#: The built-in trainer's exit code for "invalid config, data or model" (dgx_trainer.__main__).
TRAINER_INVALID_EXIT = 2

#: The phase a job sees for a mount whose stored spec the model refuses (see parse_mount): it waits
#: for the fix, as for a mount not created yet.
UNREADABLE = "Unreadable"


@dataclass(frozen=True)
class MountState:
    """A referenced DGXDataMount as observed: its phase (None when it does not exist)."""

    phase: str | None
    message: str = ""


@dataclass(frozen=True)
class Refused:
    """A child the apiserver refused to create in this pass (see kube.refusal): for good
    (``permanent``: invalid, or denied by an admission plugin), or until quota frees up."""

    kind: str
    name: str
    permanent: bool
    #: The apiserver's own sentence (Status.message).
    message: str

    def describe(self) -> str:
        return f"the apiserver refused to create {self.kind} {self.name}: {self.message}"


#: How often a job whose workers a ResourceQuota refused tries again (nothing else tells it that
#: the quota has room: the other jobs ending are not its events).
QUOTA_RETRY_SECONDS = 30.0


@dataclass(frozen=True)
class Observed:
    """What exists now, as the operator's caches and the API server report it."""

    pods: Sequence[PodView] = ()
    service: bool = False
    #: The ConfigMap of the job's current trainer config exists.
    config_map: bool = False
    #: Other ConfigMaps of this job: trainer configs an edit superseded.
    stale_config_maps: Sequence[str] = ()
    mounts: Mapping[str, MountState] = field(default_factory=dict)
    #: "kind namespace/name (owner ...)" of children at our names that another owner controls,
    #: learnt from a create that answered 409.
    foreign: Sequence[str] = ()
    #: Creates the apiserver refused in this pass (the controller plans again knowing them).
    refused: Sequence[Refused] = ()
    #: The job's queueing in Kueue; None when Kueue does not manage the job.
    queueing: Queueing | None = None


@dataclass(frozen=True)
class Event:
    type: EventType
    reason: str
    message: str


@dataclass
class Plan:
    """What to do. Creates come first (config, Service, workers), then deletes, then the status."""

    status: DGXTrainingJobStatus
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    #: Superseded trainer ConfigMaps that no worker mounts any more.
    delete_config_maps: list[str] = field(default_factory=list)
    #: Pods to let go of (stuck Terminating on a lost node): relabelled "<job>.detached".
    detach: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    delete_job: bool = False
    release_finalizer: bool = False
    #: Writes to the job's Kueue Workload (see reconcile.queueing).
    workloads: WorkloadWrites = field(default_factory=WorkloadWrites)


def condition(status: DGXTrainingJobStatus, type_: str) -> Condition | None:
    return find_condition(status.conditions, type_)


class _Planner:
    """One planning pass; a class only to keep the many small steps readable."""

    def __init__(self, job: DGXTrainingJob, ctx: BuildContext, observed: Observed, now: datetime) -> None:
        self.job = job
        self.spec = job.spec
        self.ctx = ctx
        self.observed = observed
        self.now = now
        self.generation = job.metadata.generation or 0
        self.ident = JobIdentity.of(job)
        old = job.status or DGXTrainingJobStatus()
        self.old_phase = old.phase
        self.status = old.model_copy(deep=True)
        self.plan = Plan(status=self.status)
        # A pod stuck Terminating (its node is lost) or already let go of is gone for every purpose
        # but its name: it neither fills its index nor holds up the job's deletion.
        lost = {p.name for p in observed.pods if p.gone(now)}
        self.taken = {p.name for p in observed.pods}
        self.plan.detach = sorted(p.name for p in observed.pods if p.name in lost and not p.detached)
        ours = [p for p in observed.pods if p.owner_uid == self.ident.uid and p.name not in lost]
        self.pods = sorted(ours, key=lambda p: (p.index if p.index is not None else 1 << 30, p.name))
        self.strangers = [p for p in observed.pods if p.owner_uid != self.ident.uid and p.name not in lost]
        self.wakeups: list[datetime] = []
        self.restarted = False  # a restart was decided in this pass
        #: Workers Kueue admitted (None when Kueue does not manage the job): at most this many run.
        self.admitted: int | None = None
        self.admitted_workload: WorkloadView | None = None
        #: ``now`` as Kueue's conditions spell their transition times.
        self.stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")

    # -- small helpers -----------------------------------------------------------------------

    def cond(self, type_: str, value: bool, reason: str, message: str) -> None:
        self.status.conditions = set_condition(
            self.status.conditions, type_, value, reason, message, self.now, self.generation
        )

    def event(self, type_: EventType, reason: str, message: str) -> None:
        self.plan.events.append(Event(type_, reason, message))

    def delete(self, pods: Sequence[PodView]) -> None:
        for pod in pods:
            if not pod.terminating and pod.name not in self.plan.delete:
                self.plan.delete.append(pod.name)

    def set_phase(self, phase: PhaseName, reason: str, message: str) -> None:
        """Phase plus the conditions that mirror it; an event whenever the phase changes."""
        self.status.phase = phase
        running = phase == JobPhase.RUNNING
        self.cond(RUNNING, running, reason, message)
        self.cond(
            RESTARTING,
            phase == JobPhase.RESTARTING,
            reason if phase == JobPhase.RESTARTING else JobReason.NOT_RESTARTING,
            message if phase == JobPhase.RESTARTING else "",
        )
        self.cond(
            SUSPENDED,
            phase == JobPhase.SUSPENDED,
            reason if phase == JobPhase.SUSPENDED else JobReason.NOT_SUSPENDED,
            message if phase == JobPhase.SUSPENDED else "",
        )
        if phase in TERMINAL:
            self.cond(
                SUCCEEDED,
                phase == JobPhase.SUCCEEDED,
                reason if phase == JobPhase.SUCCEEDED else JobReason.NOT_SUCCEEDED,
                message if phase == JobPhase.SUCCEEDED else "",
            )
            self.cond(
                FAILED,
                phase == JobPhase.FAILED,
                reason if phase == JobPhase.FAILED else JobReason.NOT_FAILED,
                message if phase == JobPhase.FAILED else "",
            )
        ended = phase in TERMINAL
        self.cond(FINISHED, ended, reason if ended else phase, message if ended else "")
        if phase != self.old_phase:
            warning = phase in (JobPhase.FAILED, JobPhase.RESTARTING)
            self.event("Warning" if warning else "Normal", reason, message or phase)

    def finish(self, phase: PhaseName, reason: str, message: str) -> Plan:
        """End the job: Succeeded or Failed, every remaining worker deleted."""
        self.set_phase(phase, reason, message)
        self.status.completion_time = self.status.completion_time or self.now
        self.delete([p for p in self.pods if not p.finished])
        return self.done(desired=0)

    def done(self, desired: int) -> Plan:
        """Fill in the observed counts and progress, compute the next wake-up."""
        gone = set(self.plan.delete)
        created = [c for c in self.plan.create if c["kind"] == "Pod"]
        active = [p for p in self.pods if p.active and p.name not in gone]
        ready = [p for p in active if p.running]
        failed = [p for p in self.pods if p.failed and p.attempt >= self.status.attempt]
        succeeded = [p for p in self.pods if p.succeeded and not p.terminating and p.name not in gone]
        self.status.workers = WorkerCounts(
            desired=desired,
            active=len(active) + len(created),
            ready=len(ready),
            failed=len(failed),
            succeeded=len(succeeded),
        )
        self.status.nodes = f"{len(ready)}/{desired}"
        self.status.observed_generation = self.generation
        if self.status.phase in TERMINAL and self.observed.queueing is not None:
            self.finish_workload()
        elif self.admitted_workload is not None and desired > 0:
            wl = self.admitted_workload
            patch = pods_ready_status(wl, len(ready) >= desired, self.stamp)
            if patch is not None:
                self.plan.workloads.status.append((wl.name, wl.resource_version, patch))
        self.read_progress()
        self.wake_when_stuck()
        if self.status.phase in TERMINAL and self.spec.ttl_seconds_after_finished is not None:
            end = self.status.completion_time or self.now
            expiry = end + timedelta(seconds=self.spec.ttl_seconds_after_finished)
            if self.now >= expiry:
                self.plan.delete_job = True
            else:
                self.wakeups.append(expiry)
        if self.wakeups:
            self.plan.requeue_after = max(0.0, (min(self.wakeups) - self.now).total_seconds())
        return self.plan

    def read_progress(self) -> None:
        worker0 = next((p for p in self.pods if p.index == 0), None)
        report = read_progress(worker0) if worker0 is not None else None
        if report is None:
            return
        fields = set(Progress.model_fields) | {f.alias for f in Progress.model_fields.values() if f.alias}
        try:
            self.status.progress = Progress.model_validate({k: v for k, v in report.items() if k in fields})
        except ValueError:
            return  # a malformed report from the trainer never breaks the job's status

    # -- the decision --------------------------------------------------------------------------

    def run(self) -> Plan:
        if self.job.metadata.deletion_timestamp is not None:
            return self.deleting()
        if self.status.phase in TERMINAL:
            self.delete([p for p in self.pods if not p.finished])
            self.backfill_finished()
            if self.status.phase == JobPhase.SUCCEEDED:
                self.collect_artifacts()  # a report that arrived after the job ended
            return self.done(desired=0)
        if self.observed.foreign:
            return self.finish(JobPhase.FAILED, JobReason.FOREIGN_OBJECT, "; ".join(self.observed.foreign))
        permanent = [r for r in self.observed.refused if r.permanent]
        if permanent:
            # Retrying would meet the same answer: the spec (or the namespace's policy) must change.
            return self.finish(
                JobPhase.FAILED, JobReason.CREATE_REFUSED, "; ".join(r.describe() for r in permanent)[:1000]
            )
        squatters = [p for p in self.strangers if not self._previous_incarnation(p)]
        if squatters:
            names = ", ".join(f"pod {self.ident.namespace}/{p.name}" for p in squatters)
            return self.finish(
                JobPhase.FAILED,
                JobReason.FOREIGN_OBJECT,
                f"{names} carries this job's label but another owner; delete it or rename the job",
            )
        try:
            r = resolve(self.spec, self.ctx.catalog)
        except UnknownInstanceError as exc:
            return self.finish(JobPhase.FAILED, JobReason.INVALID_SPEC, f"spec.instance: {exc.message}")
        gate = self.kueue(r)
        if self.spec.suspend:
            return self.suspended()
        if gate is not None and gate.placement is None:
            return self.queued(gate)
        if self.old_phase == JobPhase.SUSPENDED:
            self.status.start_time = None  # resuming: maxDuration counts afresh
        if self.status.start_time is None:
            waiting = self.waiting_for_data()
            if waiting is not None:
                return waiting
        succeeded = self.succeeded(r)
        if succeeded is not None:
            return succeeded  # before the deadline: a success first seen late is still a success
        if self.deadline_passed(r):
            return self.finish(
                JobPhase.FAILED,
                JobReason.DEADLINE_EXCEEDED,
                f"the job ran longer than spec.maxDuration ({self.spec.max_duration})",
            )
        # Losses first: a survivor's failure seen in the same pass belongs to the lost worker's
        # incident and must find the attempt already moved on.
        self.notice_lost_workers()
        failed = self.failures(r)
        if failed is not None:
            return failed
        broken = self.unstartable()
        if broken is not None:
            return broken
        try:
            result = self.keep_running(r)
        except BuildError as exc:  # a spec only the cluster can check, e.g. outputs into an input mount
            self.plan.create.clear()
            return self.finish(JobPhase.FAILED, JobReason.INVALID_SPEC, f"{exc.path}: {exc.message}")
        self.quota()
        return result

    def backfill_finished(self) -> None:
        """A job that ended under an operator that did not write Finished gets it from the condition
        its phase names, dated when the job ended: a `kubectl wait --for=condition=Finished` on it
        returns, and its lastTransitionTime does not pretend the job ended at the upgrade."""
        if condition(self.status, FINISHED) is not None:
            return
        phase = self.status.phase or ""
        ended = condition(self.status, phase)
        finished = Condition(
            type=FINISHED,
            status="True",
            reason=ended.reason if ended is not None else phase,
            message=ended.message if ended is not None else "",
            last_transition_time=self.status.completion_time or self.now,
            observed_generation=self.generation if ended is None else ended.observed_generation,
        )
        self.status.conditions = [*self.status.conditions, finished]

    def quota(self) -> None:
        """Workers a ResourceQuota refused: not created again in this pass, WorkersPending says so
        (one Warning event when it starts), and the job tries again every QUOTA_RETRY_SECONDS."""
        refused = [r for r in self.observed.refused if not r.permanent]
        before = condition(self.status, WORKERS_PENDING)
        if not refused:
            if before is not None:  # set on every pass once it exists: the conditions keep their order
                self.cond(WORKERS_PENDING, False, JobReason.WORKERS_CREATED, "every worker the job needs exists")
            return
        message = "; ".join(r.describe() for r in refused)[:1000]
        if before is None or before.status != "True":
            self.event("Warning", JobReason.QUOTA_EXCEEDED, message)
        self.cond(WORKERS_PENDING, True, JobReason.QUOTA_EXCEEDED, message)
        if self.status.phase == JobPhase.PENDING:
            running = condition(self.status, RUNNING)
            counts = f"{running.message}; " if running is not None else ""
            self.cond(RUNNING, False, JobReason.QUOTA_EXCEEDED, f"{counts}{message}"[:1000])
        self.plan.requeue_after = min(self.plan.requeue_after or QUOTA_RETRY_SECONDS, QUOTA_RETRY_SECONDS)

    def _previous_incarnation(self, pod: PodView) -> bool:
        """A pod of a deleted job with the same name: it goes away with its owner; wait for it."""
        return pod.owner_kind == KIND and pod.owner_name == self.ident.name

    def deleting(self) -> Plan:
        self.delete([p for p in self.pods if not p.finished])
        self.plan.release_finalizer = all(p.finished for p in self.pods)
        self.wake_when_stuck()
        if self.wakeups:
            self.plan.requeue_after = max(0.0, (min(self.wakeups) - self.now).total_seconds())
        return self.plan

    def wake_when_stuck(self) -> None:
        """A pod stuck Terminating sends no more events: plan again when it counts as gone."""
        for p in self.pods:
            if p.terminating and p.deletion_time is not None and not p.finished:
                self.wakeups.append(max(self.now, p.deletion_time + STUCK_AFTER))

    # -- Kueue ----------------------------------------------------------------------------------

    def kueue(self, r: Resolved) -> Gate | None:
        """Kueue's word on a job it manages (None when it does not): hold it, or run it with the
        admitted count on the admitted flavors' nodes. The Workload writes go into the plan."""
        q = self.observed.queueing
        if q is None:
            return None
        if q.queue is None:
            # The queue label went: the job is Kueue's no more, and its Workload goes with its quota.
            self.plan.workloads = WorkloadWrites(
                delete=[(w.name, w.uid) for w in q.workloads if w.owner_uid == self.ident.uid and not w.deleting]
            )
            return None
        try:
            worker = worker_pod(self.ident, self.spec, 0, r, self.ctx)
        except BuildError:
            return None  # keep_running fails the job, naming the field
        gate, writes = decide(
            q,
            job=self.ident.name,
            namespace=self.ident.namespace,
            uid=self.ident.uid,
            podset=pod_set(worker, 1 if r.interactive else r.min_nodes, 1 if r.interactive else r.max_nodes),
            user_suspended=self.spec.suspend,
            finished=None,
            workers_active=sum(1 for p in self.pods if not p.finished),
            now=self.stamp,
        )
        self.plan.workloads = writes
        if gate.placement is not None:
            self.admitted_workload = gate.workload
            self.admitted = gate.placement.count
            self.ctx = dataclasses.replace(self.ctx, placement=gate.placement)
        return gate

    def finish_workload(self) -> None:
        """The job ended: its Workload is marked Finished, so Kueue returns the quota at once."""
        q = self.observed.queueing
        assert q is not None
        message = next((c.message for c in self.status.conditions if c.type == self.status.phase), "")
        _, writes = decide(
            q,
            job=self.ident.name,
            namespace=self.ident.namespace,
            uid=self.ident.uid,
            podset=None,
            user_suspended=self.spec.suspend,
            finished=(self.status.phase == JobPhase.SUCCEEDED, message),
            workers_active=0,
            now=self.stamp,
        )
        self.plan.workloads = writes

    def queued(self, gate: Gate) -> Plan:
        """Held by Kueue: no workers (an evicted job's are deleted, never counted as restarts),
        Suspended with Kueue's reason and message; maxDuration counts afresh on admission."""
        self.delete([p for p in self.pods if not p.finished])
        self.status.start_time = None
        # Kueue's reasons are CamelCase; anything else would fail the condition's schema.
        reason = gate.reason if REASON.fullmatch(gate.reason) else JobReason.QUEUED
        self.set_phase(JobPhase.SUSPENDED, reason, gate.message[:32768])
        return self.done(desired=0)

    def suspended(self) -> Plan:
        self.delete([p for p in self.pods if not p.finished])
        self.status.start_time = None
        self.set_phase(
            JobPhase.SUSPENDED, JobReason.SUSPENDED, "spec.suspend is true: workers deleted, the job is kept"
        )
        return self.done(desired=0)

    def waiting_for_data(self) -> Plan | None:
        if not self.spec.data_mounts:
            return None
        waiting: list[str] = []
        for ref in self.spec.data_mounts:
            state = self.observed.mounts.get(ref.name, MountState(None))
            if state.phase == MountPhase.FAILED:
                self.cond(DATA_READY, False, JobReason.DATA_MOUNT_FAILED, f"{ref.name}: {state.message}")
                return self.finish(
                    JobPhase.FAILED, JobReason.DATA_MOUNT_FAILED, f"DGXDataMount {ref.name} failed: {state.message}"
                )
            if state.phase is None:
                waiting.append(f"{ref.name} (not found)")
            elif state.phase == UNREADABLE:
                waiting.append(f"{ref.name} ({state.message})")
            elif state.phase != MountPhase.READY:
                waiting.append(f"{ref.name} ({state.phase})")
        if waiting:
            message = "waiting for DGXDataMount " + ", ".join(waiting)
            self.cond(DATA_READY, False, JobReason.DATA_NOT_READY, message)
            self.set_phase(JobPhase.WAITING_FOR_DATA, JobReason.DATA_NOT_READY, message)
            return self.done(desired=0)
        self.cond(DATA_READY, True, JobReason.DATA_READY, "every referenced DGXDataMount is Ready")
        return None

    def deadline_passed(self, r: Resolved) -> bool:
        if any(p.failed and p.deadline_exceeded for p in self.pods):
            return True  # a worker's activeDeadlineSeconds (the remainder of maxDuration) fired
        if r.max_duration_s is None or self.status.start_time is None:
            return False
        deadline = self.status.start_time + timedelta(seconds=r.max_duration_s)
        if self.now >= deadline:
            return True
        self.wakeups.append(deadline)
        return False

    def succeeded(self, r: Resolved) -> Plan | None:
        if r.interactive:
            return None  # the idle worker never completes training
        worker0 = next((p for p in self.pods if p.index == 0 and p.succeeded), None)
        if worker0 is None:
            return None
        if self.archiving_mounts():
            # Rank 0 (whose node holds the final model) may be any worker of an elastic job, and its
            # sidecar archives after the trainer exits: wait for the workers that run to end rather
            # than delete one mid-upload. torchrun ends them all together. That includes survivors
            # of an earlier attempt (a restart replaces only the failed workers; the others keep
            # their attempt label and stay in the group), and excludes workers that never started
            # (phase Pending: an elastic job's spares may be unschedulable for ever and hold nothing).
            busy = [p for p in self.pods if p.active and p.phase == "Running"]  # the Pod's phase
            if busy:
                names = ", ".join(p.name for p in busy)
                # Phase and condition agree (Running, reason Finishing) even if the last pass saw
                # the job Pending or Restarting: the training is over, uploads are running.
                self.set_phase(
                    JobPhase.RUNNING, JobReason.FINISHING, f"{worker0.name} completed; waiting for {names} to end"
                )
                self.plan.requeue_after = 30.0
                return self.done(desired=len(busy))
        self.finish(JobPhase.SUCCEEDED, JobReason.COMPLETED, f"{worker0.name} exited 0: training completed")
        self.collect_artifacts()
        return self.plan

    def archiving_mounts(self) -> dict[int, str]:
        """Index -> name of the referenced mounts that archive the final model."""
        out: dict[int, str] = {}
        for i, ref in enumerate(self.spec.data_mounts):
            mount = self.ctx.data_mounts.get(ref.name)
            if mount is not None and archives(mount):
                out[i] = ref.name
        return out

    def collect_artifacts(self) -> None:
        """status.artifacts from what the sidecars reported, and the Archived condition saying
        whether the archive the job asked for happened. Only reports, never guesses: a URI is listed
        because an uploader wrote it there."""
        mounts = self.archiving_mounts()
        if not mounts:
            return
        found: dict[str, Artifact] = {a.uri: a for a in self.status.artifacts}
        errors: list[str] = []
        for pod in self.pods:
            items, problems = artifacts_of(pod)
            errors += problems
            for index, name, uri in items:
                found.setdefault(uri, Artifact(name=name, uri=uri, mount=mounts.get(index)))
        artifacts = sorted(found.values(), key=lambda a: a.uri)[:32]
        before = condition(self.status, ARCHIVED)
        self.status.artifacts = artifacts
        targets = ", ".join(sorted(set(mounts.values())))
        if artifacts:
            message = f"{len(artifacts)} artifact(s) archived to {targets}"
            if before is None or before.status != "True":
                self.event("Normal", JobReason.ARCHIVED, message)
            self.cond(ARCHIVED, True, JobReason.ARCHIVED, message)
        elif before is None or before.status != "True":
            detail = "; ".join(errors) if errors else "no uploader reported an archive (see the checkpoints-* logs)"
            message = f"the final model was not archived to {targets}: {detail}"[:1000]
            if before is None:
                self.event("Warning", JobReason.ARCHIVE_FAILED, message)
            self.cond(ARCHIVED, False, JobReason.ARCHIVE_FAILED, message)

    def failures(self, r: Resolved) -> Plan | None:
        """A failure the restart policy does not absorb ends the job; others restart workers.

        Only pods of the current attempt that nobody is deleting count: a worker that dies while
        being deleted (scale-down, suspend, someone's kubectl delete) was stopped, not broken."""
        current = [p for p in self.pods if p.failed and not p.terminating and self.new_incident(p)]
        failures = [p for p in current if not p.disrupted]
        ended = [p for p in self.pods if r.interactive and p.succeeded and not p.terminating]
        if ended and any(p.attempt >= self.status.attempt for p in ended):
            self.restart(ended, counted=False, reason=JobReason.WORKER_REPLACED)
        if not failures:
            disrupted = [p for p in current if p.disrupted]
            if disrupted:
                self.restart(disrupted, counted=False, reason=JobReason.WORKER_DISRUPTED)
            return None
        first = failures[0].describe_failure()
        policy = self.spec.restart_policy
        if policy == "Never":
            return self.finish(JobPhase.FAILED, JobReason.WORKER_FAILED, f"{first}; restartPolicy is Never")
        if policy == "OnFailure" and self.spec.trainer is not None:
            # The built-in trainer's exit 2 is its pre-launch check refusing the config, the data
            # or the model (docs/trainer.md, Exit codes): the same files fail the same way on every
            # retry, so backoffLimit retries would only delay the message by minutes each.
            invalid = [p for p in failures if p.failed_init is None and p.exit_code == TRAINER_INVALID_EXIT]
            if invalid:
                return self.finish(
                    JobPhase.FAILED,
                    JobReason.INVALID_TRAINER_INPUT,
                    f"{invalid[0].describe_failure()}; exit code {TRAINER_INVALID_EXIT}: the trainer refused its "
                    "config, data or model, which no restart can change (fix the field it names and apply again)",
                )
        if policy == "ExitCode":
            permanent = [p for p in failures if p.exit_code is None or p.exit_code not in r.retryable_exit_codes]
            if permanent:
                code = permanent[0].exit_code
                return self.finish(
                    JobPhase.FAILED,
                    JobReason.WORKER_FAILED,
                    f"{permanent[0].describe_failure()}; exit code {code} is not in retryableExitCodes",
                )
        if self.status.restarts + 1 > self.spec.backoff_limit:
            return self.finish(
                JobPhase.FAILED,
                JobReason.BACKOFF_LIMIT_EXCEEDED,
                f"{first}; backoffLimit {self.spec.backoff_limit} reached after {self.status.restarts} restart(s)",
            )
        self.restart(current, counted=True, reason=JobReason.WORKER_FAILED)
        return None

    def new_incident(self, pod: PodView) -> bool:
        """Whether a failed pod is news. A pod of the current attempt is. One of an older attempt (a
        survivor of an earlier restart: a restart replaces only the failed workers) is news when its
        container ended more than CASCADE_WINDOW after the last restart: earlier, it is that
        incident's cascade (NCCL errors after a peer died), already answered."""
        if pod.attempt >= self.status.attempt:
            return True
        since = self.status.last_restart_time
        return since is not None and pod.finished_at is not None and pod.finished_at > since + CASCADE_WINDOW

    def restart(self, pods: Sequence[PodView], *, counted: bool, reason: str) -> None:
        """Replace ``pods`` in a new attempt; only program failures count against backoffLimit."""
        self.delete(pods)
        self.status.attempt += 1
        self.status.last_restart_time = self.now
        what = "; ".join(p.describe_failure() for p in pods)
        if counted:
            self.status.restarts += 1
            self.event(
                "Warning",
                JobReason.WORKER_RESTARTED,
                f"{what}; restart {self.status.restarts} of {self.spec.backoff_limit} (attempt {self.status.attempt})",
            )
        else:
            self.event("Normal", reason, f"{what}; replaced without counting against backoffLimit")
        self.restarted = True

    def keep_running(self, r: Resolved) -> Plan:
        desired = 1 if r.interactive else r.max_nodes
        if self.admitted is not None:
            desired = min(desired, self.admitted)  # Kueue's partial admission of an elastic job
        self.ensure_shared_children(r)
        # Workers of older attempts that ended belong to a restart already made: replace them.
        stale = [
            p for p in self.pods if p.attempt < self.status.attempt and (p.failed or (r.interactive and p.succeeded))
        ]
        self.delete(stale)
        # Scale down: workers beyond maxNodes go, highest index first.
        extra = [p for p in self.pods if (p.index is None or p.index >= desired) and not p.finished]
        self.delete(sorted(extra, key=lambda p: -(p.index or 0)))
        # A pod being deleted still holds its name: its replacement waits until it is gone.
        by_index = {p.index: p for p in self.pods if p.index is not None}
        blocked = {p.index for p in self.strangers if p.index is not None}
        remaining = self.remaining_seconds(r)
        for i in range(desired):
            pod = by_index.get(i)
            if pod is not None or i in blocked:
                continue  # exists, or is still going away: recreated once its deletion is observed
            self.plan.create.append(
                worker_pod(
                    self.ident,
                    self.spec,
                    i,
                    r,
                    self.ctx,
                    attempt=self.status.attempt,
                    active_deadline_seconds=remaining,
                    pod_name=replacement_name(self.ident.name, i, self.taken, self.status.attempt),
                )
            )
        # Refused for quota in this pass (see quota()): not created again until the timer.
        refused = {(r.kind, r.name) for r in self.observed.refused}
        self.plan.create = [c for c in self.plan.create if (c["kind"], c["metadata"]["name"]) not in refused]
        if self.status.start_time is None and (self.plan.create or self.pods):
            self.status.start_time = self.now
            if r.max_duration_s is not None:
                self.wakeups.append(self.now + timedelta(seconds=r.max_duration_s))
        return self.decide_phase(r, desired)

    def notice_lost_workers(self) -> None:
        """Workers that vanished without this operator deleting them (node loss, a spot reclaim,
        someone's kubectl delete) are replaced in a new attempt, never counted: the last status
        says how many workers were active after the operator's own deletions, so fewer pods
        (not being deleted) now means the difference went away by other hands."""
        old = self.job.status
        if old is None or old.workers is None or self.status.start_time is None or self.old_phase == JobPhase.SUSPENDED:
            return
        # Failed pods the last pass kept do not exist: it deleted every one of them (they show as
        # terminating until gone), so what it kept is exactly its active and succeeded workers.
        untouched = sum(1 for p in self.pods if not p.terminating)
        lost = old.workers.active + old.workers.succeeded - untouched
        if lost > 0:
            self.status.attempt += 1
            self.status.last_restart_time = self.now
            self.event(
                "Normal",
                JobReason.WORKER_LOST,
                f"{lost} worker(s) disappeared or were deleted by someone else; replacing them in attempt "
                f"{self.status.attempt}, not counted against backoffLimit",
            )

    def ensure_shared_children(self, r: Resolved) -> None:
        if not self.observed.config_map:
            config = trainer_config_map(self.ident, self.spec)
            if config is not None:
                self.plan.create.append(config)
        self.collect_stale_config_maps()
        if not self.observed.service:
            self.plan.create.append(headless_service(self.ident, r, self.ctx.defaults.master_port))

    def collect_stale_config_maps(self) -> None:
        """A trainer config an edit superseded goes once no pod of the job mounts it. A worker made
        before configs were keyed by content carries no label: then nothing is deleted, since which
        one it mounts is not known."""
        mounted = {p.config for p in self.pods}
        if None in mounted and self.pods:
            return
        self.plan.delete_config_maps = [
            name for name in self.observed.stale_config_maps if name.rsplit("-", 1)[-1] not in mounted
        ]

    def remaining_seconds(self, r: Resolved) -> int | None:
        if r.max_duration_s is None:
            return None
        if self.status.start_time is None:
            return r.max_duration_s
        left = r.max_duration_s - (self.now - self.status.start_time).total_seconds()
        return max(1, int(left))

    def decide_phase(self, r: Resolved, desired: int) -> Plan:
        gone = set(self.plan.delete)
        live = [p for p in self.pods if not p.terminating and p.name not in gone]
        running = [p for p in live if p.running]
        # A worker that exited 0 finished its share: the group is completing, not shrinking.
        done = [p for p in live if p.succeeded]
        # Exited, the phase not written yet: still the group's until the phase says how it ended
        # (seen as a restart, the job would flash Restarting on every real success).
        ending = [p for p in live if p.ending]
        need = 1 if r.interactive else r.min_nodes
        held = len(running) + len(done) + len(ending)
        if held >= need:
            count = f"{len(running)}/{desired} workers running" + (f", {len(done)} finished" if done else "")
            if ending:
                count += f", {len(ending)} exited (pod ending)"
            if held >= desired:
                self.set_phase(JobPhase.RUNNING, JobReason.ALL_WORKERS_RUNNING, count)
            else:
                self.set_phase(
                    JobPhase.RUNNING,
                    JobReason.ELASTIC_MINIMUM_RUNNING,
                    f"{count} (minNodes {need}); the rest are pending",
                )
            return self.done(desired)
        was_running = self.old_phase in (JobPhase.RUNNING, JobPhase.RESTARTING) or self.restarted
        pending = [p for p in self.pods if p.active and not p.running and not p.ending and p.name not in gone]
        why, blocker = self.why_pending(pending)
        if was_running:
            # One reason whatever the cause (the restart itself is an event): re-planning the same
            # observations must give the same status.
            self.set_phase(
                JobPhase.RESTARTING,
                JobReason.NODES_BELOW_MINIMUM,
                f"{len(running)}/{desired} workers running, below minNodes {need}; recreating{why}",
            )
        else:
            # Workers created in this very pass are not scheduled either: the message must not
            # change when the next pass observes them, or the status would be written twice.
            created = sum(1 for c in self.plan.create if c["kind"] == "Pod")
            unscheduled = sum(1 for p in pending if not p.scheduled and p.unschedulable is None) + created
            detail = f" ({unscheduled} not scheduled yet)" if unscheduled else ""
            self.set_phase(
                JobPhase.PENDING,
                blocker or JobReason.WORKERS_PENDING,
                f"{len(running)}/{desired} workers running, need {need}{detail}{why}",
            )
        timeout = self.pending_timeout(r)
        if timeout is not None:
            return timeout
        return self.done(desired)

    def why_pending(self, pending: Sequence[PodView]) -> tuple[str, str | None]:
        """(": worker-1: ImagePullBackOff (trainer: ...); ...", the first reason) of the workers
        that wait for something other than their turn: the kubelet's waiting reason (image pulls,
        CreateContainerConfigError), else the scheduler's Unschedulable message."""
        parts: list[str] = []
        first: str | None = None
        for p in pending:
            waiting = p.waiting_reason()
            if waiting is not None:
                reason, detail = waiting
                parts.append(f"{p.name}: {reason} ({detail})")
            elif p.unschedulable is not None:
                reason = JobReason.UNSCHEDULABLE
                parts.append(f"{p.name}: Unschedulable: {p.unschedulable}")
            else:
                continue
            first = first or reason
        if not parts:
            return "", None
        shown = "; ".join(parts[:3]) + (f"; and {len(parts) - 3} more" if len(parts) > 3 else "")
        return f": {shown}"[:900], first

    def unstartable(self) -> Plan | None:
        """A worker whose container waits for something waiting cannot bring (an image name the
        runtime refuses, an image that must not be pulled and is absent): the spec is wrong."""
        for p in self.pods:
            if not p.active:
                continue
            for container, reason, message in p.waiting:
                if reason in PERMANENT_WAITING:
                    detail = f": {message}" if message else ""
                    return self.finish(JobPhase.FAILED, reason, f"{p.name}: container {container}: {reason}{detail}")
        return None

    def pending_timeout(self, r: Resolved) -> Plan | None:
        """maxPending: how long the job may go without minNodes workers running."""
        if r.max_pending_s is None:
            return None
        not_running = condition(self.status, RUNNING)
        if not_running is None or not_running.status == "True":
            return None
        # Waiting for data or sitting suspended is not waiting for nodes: count from the latest of
        # "stopped running", "data became ready" and "resumed".
        since = not_running.last_transition_time
        for type_, value in ((DATA_READY, "True"), (SUSPENDED, "False")):
            other = condition(self.status, type_)
            if other is not None and other.status == value:
                since = max(since, other.last_transition_time)
        expiry = since + timedelta(seconds=r.max_pending_s)
        if self.now >= expiry:
            return self.finish(
                JobPhase.FAILED,
                JobReason.PENDING_TIMEOUT,
                f"fewer than minNodes workers ran for spec.maxPending ({self.spec.max_pending}): {not_running.message}",
            )
        self.wakeups.append(expiry)
        return None


def plan(job: DGXTrainingJob, ctx: BuildContext, observed: Observed, now: datetime) -> Plan:
    """Decide what to do for ``job`` given what exists; see the module docstring."""
    return _Planner(job, ctx, observed, now).run()
