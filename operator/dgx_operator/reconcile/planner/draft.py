"""The plan being written in one pass (:class:`Draft`): the job's status as it will be, and the pen
every policy writes with: conditions, events, deletions, the phase (with the conditions that
mirror it), ending the job, and closing the pass (worker counts, progress, Kueue's quota back when
the job ended, the next wake-up)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from dgx_operator.api.trainingjob import DGXTrainingJob, DGXTrainingJobStatus, Progress, WorkerCounts
from dgx_operator.api.vocabulary import JobPhase, JobReason, PhaseName
from dgx_operator.reconcile.budgets import Reservation
from dgx_operator.reconcile.planner.model import (
    FAILED,
    FINISHED,
    RESTARTING,
    RUNNING,
    SUCCEEDED,
    SUSPENDED,
    TERMINAL,
    Event,
    EventType,
    Observed,
    Plan,
)
from dgx_operator.reconcile.pods import STUCK_AFTER, PodView, read_progress
from dgx_operator.reconcile.queueing import WorkloadView, decide, pods_ready_status
from dgx_operator.reconcile.spending import BudgetView
from dgx_operator.reconcile.status import set_condition
from dgx_operator.render import BuildContext, JobIdentity


class Draft:
    """One planning pass's state and pen; the policies are functions of it."""

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
        #: The reservations a run starting in this pass takes (planner.budget.judge found it fits).
        self.reservations: list[tuple[BudgetView, Reservation]] = []
        #: ``now`` as Kueue's conditions spell their transition times.
        self.stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")

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
        """status.progress from worker 0: its termination message once it ended (the final word),
        else its live report (a pod annotation, or its log as the controller read it). A pass with
        no new report keeps the last one."""
        worker0 = next((p for p in self.pods if p.index == 0), None)
        report = read_progress(worker0) if worker0 is not None else None
        if report is None and self.observed.progress is not None and worker0 is not None and not worker0.finished:
            report = dict(self.observed.progress)
        if report is None:
            return
        fields = set(Progress.model_fields) | {f.alias for f in Progress.model_fields.values() if f.alias}
        try:
            self.status.progress = Progress.model_validate({k: v for k, v in report.items() if k in fields})
        except ValueError:
            return  # a malformed report from the trainer never breaks the job's status

    def wake_when_stuck(self) -> None:
        """A pod stuck Terminating sends no more events: plan again when it counts as gone."""
        for p in self.pods:
            if p.terminating and p.deletion_time is not None and not p.finished:
                self.wakeups.append(max(self.now, p.deletion_time + STUCK_AFTER))

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
