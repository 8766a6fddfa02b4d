"""What holds a job before its workers run: Kueue's admission (and its Workload writes), the user's
``spec.suspend``, DGXDataMounts not Ready yet, and a ResourceQuota that refused workers. A job
held here has no workers and counts no restarts."""

from __future__ import annotations

import dataclasses

from dgx_operator.api.vocabulary import JobPhase, JobReason, MountPhase
from dgx_operator.reconcile.planner.draft import Draft
from dgx_operator.reconcile.planner.model import (
    DATA_READY,
    QUOTA_RETRY_SECONDS,
    REASON,
    RUNNING,
    UNREADABLE,
    WORKERS_PENDING,
    MountState,
    Plan,
    condition,
)
from dgx_operator.reconcile.queueing import Gate, WorkloadWrites, decide, pod_set
from dgx_operator.render import BuildError, worker_pod
from dgx_operator.render.resolved import Resolved


def kueue(d: Draft, r: Resolved, *, held: bool = False) -> Gate | None:
    """Kueue's word on a job it manages (None when it does not): hold it, or run it with the
    admitted count on the admitted flavors' nodes. The Workload writes go into the plan. ``held``:
    something else holds the job (a DGXBudget): its Workload is kept inactive, as for spec.suspend,
    so it reserves no quota while it waits."""
    q = d.observed.queueing
    if q is None:
        return None
    if q.queue is None:
        # The queue label went: the job is Kueue's no more, and its Workload goes with its quota.
        d.plan.workloads = WorkloadWrites(
            delete=[(w.name, w.uid) for w in q.workloads if w.owner_uid == d.ident.uid and not w.deleting]
        )
        return None
    try:
        worker = worker_pod(d.ident, d.spec, 0, r, d.ctx)
    except BuildError:
        return None  # keep_running fails the job, naming the field
    gate, writes = decide(
        q,
        job=d.ident.name,
        namespace=d.ident.namespace,
        uid=d.ident.uid,
        podset=pod_set(worker, 1 if r.interactive else r.min_nodes, 1 if r.interactive else r.max_nodes),
        user_suspended=d.spec.suspend or held,
        finished=None,
        workers_active=sum(1 for p in d.pods if not p.finished),
        now=d.stamp,
    )
    d.plan.workloads = writes
    if gate.placement is not None:
        d.admitted_workload = gate.workload
        d.admitted = gate.placement.count
        d.ctx = dataclasses.replace(d.ctx, placement=gate.placement)
    return gate


def queued(d: Draft, gate: Gate) -> Plan:
    """Held by Kueue: no workers (an evicted job's are deleted, never counted as restarts),
    Suspended with Kueue's reason and message; maxDuration counts afresh on admission."""
    d.delete([p for p in d.pods if not p.finished])
    d.status.start_time = None
    # Kueue's reasons are CamelCase; anything else would fail the condition's schema.
    reason = gate.reason if REASON.fullmatch(gate.reason) else JobReason.QUEUED
    d.set_phase(JobPhase.SUSPENDED, reason, gate.message[:32768])
    return d.done(desired=0)


def suspended(d: Draft) -> Plan:
    d.delete([p for p in d.pods if not p.finished])
    d.status.start_time = None
    d.set_phase(JobPhase.SUSPENDED, JobReason.SUSPENDED, "spec.suspend is true: workers deleted, the job is kept")
    return d.done(desired=0)


def waiting_for_data(d: Draft) -> Plan | None:
    if not d.spec.data_mounts:
        return None
    waiting: list[str] = []
    for ref in d.spec.data_mounts:
        state = d.observed.mounts.get(ref.name, MountState(None))
        if state.phase == MountPhase.FAILED:
            d.cond(DATA_READY, False, JobReason.DATA_MOUNT_FAILED, f"{ref.name}: {state.message}")
            return d.finish(
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
        d.cond(DATA_READY, False, JobReason.DATA_NOT_READY, message)
        d.set_phase(JobPhase.WAITING_FOR_DATA, JobReason.DATA_NOT_READY, message)
        return d.done(desired=0)
    d.cond(DATA_READY, True, JobReason.DATA_READY, "every referenced DGXDataMount is Ready")
    return None


def quota(d: Draft) -> None:
    """Workers a ResourceQuota refused: not created again in this pass, WorkersPending says so
    (one Warning event when it starts), and the job tries again every QUOTA_RETRY_SECONDS."""
    refused = [r for r in d.observed.refused if not r.permanent]
    before = condition(d.status, WORKERS_PENDING)
    if not refused:
        if before is not None:  # set on every pass once it exists: the conditions keep their order
            d.cond(WORKERS_PENDING, False, JobReason.WORKERS_CREATED, "every worker the job needs exists")
        return
    message = "; ".join(r.describe() for r in refused)[:1000]
    if before is None or before.status != "True":
        d.event("Warning", JobReason.QUOTA_EXCEEDED, message)
    d.cond(WORKERS_PENDING, True, JobReason.QUOTA_EXCEEDED, message)
    if d.status.phase == JobPhase.PENDING:
        running = condition(d.status, RUNNING)
        counts = f"{running.message}; " if running is not None else ""
        d.cond(RUNNING, False, JobReason.QUOTA_EXCEEDED, f"{counts}{message}"[:1000])
    d.plan.requeue_after = min(d.plan.requeue_after or QUOTA_RETRY_SECONDS, QUOTA_RETRY_SECONDS)
