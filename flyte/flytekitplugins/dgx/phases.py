"""A DGXTrainingJob's status -> what Flyte shows: phase, message, log links, custom info.

Pure, so the mapping of every phase is unit-tested without a cluster. The job's own status is the
truth: its conditions carry the operator's reason and message (Unschedulable with the scheduler's
words, WorkerFailed with the worker's exit, InvalidTrainerInput with the trainer's line), and they
reach the Flyte console as they are instead of a bare "failed".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from flyteidl.core.execution_pb2 import TaskExecution

from dgx_operator.api.vocabulary import JobCondition, JobPhase, JobReason

QUEUED: Final = TaskExecution.QUEUED
WAITING: Final = TaskExecution.WAITING_FOR_RESOURCES
INITIALIZING: Final = TaskExecution.INITIALIZING
RUNNING: Final = TaskExecution.RUNNING
SUCCEEDED: Final = TaskExecution.SUCCEEDED
FAILED: Final = TaskExecution.FAILED

#: Running-condition reasons of a Pending job that mean "no room now" rather than "not looked at yet".
NO_CAPACITY_REASONS: Final = frozenset({JobReason.UNSCHEDULABLE, JobReason.QUOTA_EXCEEDED})


@dataclass(frozen=True)
class Status:
    phase: int
    message: str
    log_links: tuple[tuple[str, str], ...] = ()  # (name, uri)
    custom_info: dict[str, Any] = field(default_factory=dict)


def _condition(job: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


def _why(cond: Mapping[str, Any]) -> str:
    reason, message = cond.get("reason") or "", cond.get("message") or ""
    return f"{reason}: {message}" if reason and message else reason or message


def _progress(status: Mapping[str, Any]) -> str:
    parts = []
    if status.get("nodes"):
        parts.append(f"nodes {status['nodes']}")
    if status.get("restarts"):
        parts.append(f"restarts {status['restarts']}")
    progress = status.get("progress") or {}
    if progress.get("step") is not None:
        total = progress.get("totalSteps")
        parts.append(f"step {progress['step']}" + (f"/{total}" if total else ""))
    if progress.get("loss") is not None:
        parts.append(f"loss {float(progress['loss']):.4g}")
    if progress.get("evalLoss") is not None:
        parts.append(f"eval loss {float(progress['evalLoss']):.4g}")
    return ", ".join(parts)


def log_links(job: Mapping[str, Any], template: str | None) -> tuple[tuple[str, str], ...]:
    """One link per worker from ``template`` ({namespace}, {job}, {pod}), or one for the job when the
    template has no {pod}; none without a template."""
    if not template:
        return ()
    meta = job.get("metadata") or {}
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    if "{pod}" not in template:
        return (("kubedgx job", template.format(namespace=ns, job=name, pod="")),)
    workers = ((job.get("status") or {}).get("workers") or {}).get("desired") or 1
    return tuple(
        (f"worker {i}", template.format(namespace=ns, job=name, pod=f"{name}-worker-{i}")) for i in range(int(workers))
    )


#: What of status.usage the task's custom_info carries.
USAGE_SHOWN = ("gpuSeconds", "gpuHours", "cost", "currency", "spotSavings", "examplePrices", "unpricedGpuSeconds")


def status_of(job: Mapping[str, Any] | None, log_template: str | None = None) -> Status:
    """Flyte's view of the job. ``None`` is a job that is gone: deleted outside Flyte (an abort
    deletes it too, but then Flyte no longer asks)."""
    if job is None:
        return Status(FAILED, "the DGXTrainingJob is gone: it was deleted outside Flyte (kubectl delete, or its TTL)")
    status = job.get("status") or {}
    phase = status.get("phase")
    links = log_links(job, log_template)
    info = {k: status[k] for k in ("phase", "nodes", "restarts", "attempt", "progress", "artifacts") if k in status}
    meta = job.get("metadata") or {}
    info["job"] = f"{meta.get('namespace')}/{meta.get('name')}"
    usage = status.get("usage") or {}
    if usage:  # the totals people read (GPU-hours, cost), not the accounting state behind them
        info["usage"] = {k: usage[k] for k in USAGE_SHOWN if k in usage}
    running = _condition(job, JobCondition.RUNNING)

    def done(p: int, msg: str) -> Status:
        return Status(p, msg, links, info)

    if phase in (None, JobPhase.PENDING):
        why = _why(running)
        quota = _condition(job, JobCondition.WORKERS_PENDING)
        if quota.get("status") == "True" and quota.get("reason") in NO_CAPACITY_REASONS:
            return done(WAITING, f"waiting for quota: {_why(quota)}")
        if running.get("reason") in NO_CAPACITY_REASONS:
            return done(WAITING, f"waiting for nodes: {why}")
        return done(QUEUED, f"pending: {why}" if why else "pending: the operator has not placed the workers yet")
    if phase == JobPhase.SUSPENDED:
        held = _condition(job, JobCondition.SUSPENDED)
        if held.get("reason") == JobReason.SUSPENDED:  # the user's spec.suspend, not Kueue
            return done(WAITING, f"suspended (spec.suspend): {_why(held)}")
        return done(WAITING, f"queued by Kueue: {_why(held)}")
    if phase == JobPhase.WAITING_FOR_DATA:
        return done(INITIALIZING, f"syncing data to the nodes: {_why(_condition(job, JobCondition.DATA_READY))}")
    progress = _progress(status)
    if phase == JobPhase.RUNNING:
        return done(RUNNING, f"running: {progress}" if progress else "running")
    if phase == JobPhase.RESTARTING:
        restarting = f"restarting: {_why(_condition(job, JobCondition.RESTARTING))}"
        return done(RUNNING, f"{restarting} ({progress})" if progress else restarting)
    if phase == JobPhase.SUCCEEDED:
        archived = _condition(job, JobCondition.ARCHIVED)
        extra = f"; {_why(archived)}" if archived else ""
        return done(SUCCEEDED, f"succeeded: {progress or _why(_condition(job, JobCondition.SUCCEEDED))}{extra}")
    if phase == JobPhase.FAILED:
        return done(FAILED, f"failed: {_why(_condition(job, JobCondition.FAILED)) or 'no reason recorded'}")
    return done(QUEUED, f"unknown phase {phase!r}")
