"""The decision ladder: one pass reads top to bottom in :func:`run`, each rung either ends the pass
with a plan or lets the next decide (deleting, ended, foreign objects, refused creates, an unknown
instance, Kueue, suspend, data, success, the deadline, lost workers, failures, unstartable
workers, then keep running). The policies it climbs through are the sibling modules; what stays
here is the ladder itself and the steady state: the workers, Service and config that should exist,
and the phase their states add up to."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from dgx_operator.api.trainingjob import KIND, DGXTrainingJob
from dgx_operator.api.vocabulary import JobPhase, JobReason
from dgx_operator.catalog import UnknownInstanceError
from dgx_operator.reconcile.planner import accounting, archives, budget, gating, guardrails, restarts, timers
from dgx_operator.reconcile.planner.coalesce import coalesce
from dgx_operator.reconcile.planner.draft import Draft
from dgx_operator.reconcile.planner.model import TERMINAL, Observed, Plan
from dgx_operator.reconcile.pods import PERMANENT_WAITING, PodView
from dgx_operator.render import BuildContext, BuildError, headless_service, trainer_config_map, worker_pod
from dgx_operator.render.names import replacement_name
from dgx_operator.render.resolved import Resolved, resolve


def run(d: Draft) -> Plan:
    if d.job.metadata.deletion_timestamp is not None:
        return deleting(d)
    if d.status.phase in TERMINAL:
        d.delete([p for p in d.pods if not p.finished])
        archives.backfill_finished(d)
        if d.status.phase == JobPhase.SUCCEEDED:
            archives.collect_artifacts(d)  # a report that arrived after the job ended
        return d.done(desired=0)
    if d.observed.foreign:
        return d.finish(JobPhase.FAILED, JobReason.FOREIGN_OBJECT, "; ".join(d.observed.foreign))
    permanent = [r for r in d.observed.refused if r.permanent]
    if permanent:
        # Retrying would meet the same answer: the spec (or the namespace's policy) must change.
        return d.finish(JobPhase.FAILED, JobReason.CREATE_REFUSED, "; ".join(r.describe() for r in permanent)[:1000])
    squatters = [p for p in d.strangers if not _previous_incarnation(d, p)]
    if squatters:
        names = ", ".join(f"pod {d.ident.namespace}/{p.name}" for p in squatters)
        return d.finish(
            JobPhase.FAILED,
            JobReason.FOREIGN_OBJECT,
            f"{names} carries this job's label but another owner; delete it or rename the job",
        )
    try:
        r = resolve(d.spec, d.ctx.catalog)
    except UnknownInstanceError as exc:
        return d.finish(JobPhase.FAILED, JobReason.INVALID_SPEC, f"spec.instance: {exc.message}")
    refused = guardrails.first_pass(d)
    if refused is not None:
        return refused
    r = timers.with_pinned(d, r)
    over_budget = None if d.spec.suspend else budget.judge(d, r)
    gate = gating.kueue(d, r, held=over_budget is not None)
    if d.spec.suspend:
        return gating.suspended(d)
    if over_budget is not None:
        return budget.held(d, over_budget)
    if gate is not None and gate.placement is None:
        return gating.queued(d, gate)
    if d.old_phase == JobPhase.SUSPENDED:
        d.status.start_time = None  # resuming: maxDuration counts afresh
    if d.status.start_time is None:
        waiting = gating.waiting_for_data(d)
        if waiting is not None:
            return waiting
    succeeded = archives.succeeded(d, r)
    if succeeded is not None:
        return succeeded  # before the deadline: a success first seen late is still a success
    if timers.deadline_passed(d, r):
        return d.finish(
            JobPhase.FAILED,
            JobReason.DEADLINE_EXCEEDED,
            f"the job ran longer than {timers.described(d, 'maxDuration')}",
        )
    # Losses first: a survivor's failure seen in the same pass belongs to the lost worker's
    # incident and must find the attempt already moved on.
    restarts.notice_lost_workers(d)
    failed = restarts.failures(d, r)
    if failed is not None:
        return failed
    broken = unstartable(d)
    if broken is not None:
        return broken
    idle = restarts.stalled(d, r)
    if idle is not None:
        return idle
    try:
        result = keep_running(d, r)
    except BuildError as exc:  # a spec only the cluster can check, e.g. outputs into an input mount
        d.plan.create.clear()
        return d.finish(JobPhase.FAILED, JobReason.INVALID_SPEC, f"{exc.path}: {exc.message}")
    gating.quota(d)
    return result


def deleting(d: Draft) -> Plan:
    d.delete([p for p in d.pods if not p.finished])
    d.plan.release_finalizer = all(p.finished for p in d.pods)
    d.wake_when_stuck()
    if d.wakeups:
        d.plan.requeue_after = max(0.0, (min(d.wakeups) - d.now).total_seconds())
    return d.plan


def _previous_incarnation(d: Draft, pod: PodView) -> bool:
    """A pod of a deleted job with the same name: it goes away with its owner; wait for it."""
    return pod.owner_kind == KIND and pod.owner_name == d.ident.name


def keep_running(d: Draft, r: Resolved) -> Plan:
    desired = 1 if r.interactive else r.max_nodes
    if d.admitted is not None:
        desired = min(desired, d.admitted)  # Kueue's partial admission of an elastic job
    ensure_shared_children(d, r)
    # Workers of older attempts that ended belong to a restart already made: replace them.
    stale = [p for p in d.pods if p.attempt < d.status.attempt and (p.failed or (r.interactive and p.succeeded))]
    d.delete(stale)
    # Scale down: workers beyond maxNodes go, highest index first.
    extra = [p for p in d.pods if (p.index is None or p.index >= desired) and not p.finished]
    d.delete(sorted(extra, key=lambda p: -(p.index or 0)))
    # A pod being deleted still holds its name: its replacement waits until it is gone.
    by_index = {p.index: p for p in d.pods if p.index is not None}
    blocked = {p.index for p in d.strangers if p.index is not None}
    remaining = timers.remaining_seconds(d, r)
    for i in range(desired):
        pod = by_index.get(i)
        if pod is not None or i in blocked:
            continue  # exists, or is still going away: recreated once its deletion is observed
        d.plan.create.append(
            worker_pod(
                d.ident,
                d.spec,
                i,
                r,
                d.ctx,
                attempt=d.status.attempt,
                active_deadline_seconds=remaining,
                pod_name=replacement_name(d.ident.name, i, d.taken, d.status.attempt),
            )
        )
    # Refused for quota in this pass (see quota()): not created again until the timer.
    refused = {(r.kind, r.name) for r in d.observed.refused}
    d.plan.create = [c for c in d.plan.create if (c["kind"], c["metadata"]["name"]) not in refused]
    if d.status.start_time is None and (d.plan.create or d.pods):
        d.status.start_time = d.now
        budget.reserve(d, desired)
        if r.max_duration_s is not None:
            d.wakeups.append(d.now + timedelta(seconds=r.max_duration_s))
    return decide_phase(d, r, desired)


def ensure_shared_children(d: Draft, r: Resolved) -> None:
    if not d.observed.config_map:
        config = trainer_config_map(d.ident, d.spec)
        if config is not None:
            d.plan.create.append(config)
    collect_stale_config_maps(d)
    if not d.observed.service:
        d.plan.create.append(headless_service(d.ident, r, d.ctx.defaults.master_port))


def collect_stale_config_maps(d: Draft) -> None:
    """A trainer config an edit superseded goes once no pod of the job mounts it. A worker made
    before configs were keyed by content carries no label: then nothing is deleted, since which
    one it mounts is not known."""
    mounted = {p.config for p in d.pods}
    if None in mounted and d.pods:
        return
    d.plan.delete_config_maps = [
        name for name in d.observed.stale_config_maps if name.rsplit("-", 1)[-1] not in mounted
    ]


def decide_phase(d: Draft, r: Resolved, desired: int) -> Plan:
    gone = set(d.plan.delete)
    live = [p for p in d.pods if not p.terminating and p.name not in gone]
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
            d.set_phase(JobPhase.RUNNING, JobReason.ALL_WORKERS_RUNNING, count)
        else:
            d.set_phase(
                JobPhase.RUNNING,
                JobReason.ELASTIC_MINIMUM_RUNNING,
                f"{count} (minNodes {need}); the rest are pending",
            )
        return d.done(desired)
    was_running = d.old_phase in (JobPhase.RUNNING, JobPhase.RESTARTING) or d.restarted
    pending = [p for p in d.pods if p.active and not p.running and not p.ending and p.name not in gone]
    why, blocker = why_pending(d, pending)
    if was_running:
        # One reason whatever the cause (the restart itself is an event): re-planning the same
        # observations must give the same status.
        d.set_phase(
            JobPhase.RESTARTING,
            JobReason.NODES_BELOW_MINIMUM,
            f"{len(running)}/{desired} workers running, below minNodes {need}; recreating{why}",
        )
    else:
        # Workers created in this very pass are not scheduled either: the message must not
        # change when the next pass observes them, or the status would be written twice.
        created = sum(1 for c in d.plan.create if c["kind"] == "Pod")
        unscheduled = sum(1 for p in pending if not p.scheduled and p.unschedulable is None) + created
        detail = f" ({unscheduled} not scheduled yet)" if unscheduled else ""
        d.set_phase(
            JobPhase.PENDING,
            blocker or JobReason.WORKERS_PENDING,
            f"{len(running)}/{desired} workers running, need {need}{detail}{why}",
        )
    timeout = timers.pending_timeout(d, r)
    if timeout is not None:
        return timeout
    return d.done(desired)


def why_pending(d: Draft, pending: Sequence[PodView]) -> tuple[str, str | None]:
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


def unstartable(d: Draft) -> Plan | None:
    """A worker whose container waits for something waiting cannot bring (an image name the
    runtime refuses, an image that must not be pulled and is absent): the spec is wrong."""
    for p in d.pods:
        if not p.active:
            continue
        for container, reason, message in p.waiting:
            if reason in PERMANENT_WAITING:
                detail = f": {message}" if message else ""
                return d.finish(JobPhase.FAILED, reason, f"{p.name}: container {container}: {reason}{detail}")
    return None


def plan(job: DGXTrainingJob, ctx: BuildContext, observed: Observed, now: datetime) -> Plan:
    """Decide what to do for ``job`` given what exists; see the package docstring."""
    d = Draft(job, ctx, observed, now)
    result = run(d)
    accounting.account(d)
    coalesce(d)
    started = job.status is not None and job.status.start_time is not None
    ended = d.status.phase in TERMINAL and d.old_phase not in TERMINAL
    result.settle = result.release_finalizer or ended or (started and d.status.start_time is None)
    return result
