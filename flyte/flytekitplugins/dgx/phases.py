"""A DGXTrainingJob's status -> what Flyte shows: phase, message, log links, custom info.

Pure, so the mapping of every phase is unit-tested without a cluster. The job's own status is the
truth: its conditions carry the operator's reason and message (Unschedulable with the scheduler's
words, WorkerFailed with the worker's exit, InvalidTrainerInput with the trainer's line), and they
reach the Flyte console as they are instead of a bare "failed".

Two rules come from how Flyte's propeller (v1.16.8) treats a connector's answers:

- FAILED is a permanent failure, never retried; RETRYABLE_FAILED counts against the node's
  ``retries``. A failed job is one or the other by the function's error.pb when it wrote one (its
  kind, as propeller decides for its own container tasks), else by the job's reason
  (:data:`RETRYABLE`).
- A phase propeller has already sent for an attempt is never sent again, so a job that went back
  from RUNNING to waiting (suspended, preempted by Kueue, pending again) would be shown as waiting
  until it ends. Once the connector has reported a job RUNNING (:data:`RAN_ANNOTATION`), it stays
  RUNNING to Flyte until it ends; the message still says what the job is doing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from flyteidl.core.errors_pb2 import ContainerError
from flyteidl.core.execution_pb2 import TaskExecution

from dgx_operator.api.vocabulary import JobCondition, JobPhase, JobReason

QUEUED: Final = TaskExecution.QUEUED
WAITING: Final = TaskExecution.WAITING_FOR_RESOURCES
INITIALIZING: Final = TaskExecution.INITIALIZING
RUNNING: Final = TaskExecution.RUNNING
SUCCEEDED: Final = TaskExecution.SUCCEEDED
FAILED: Final = TaskExecution.FAILED
RETRYABLE_FAILED: Final = TaskExecution.RETRYABLE_FAILED

#: Running-condition reasons of a Pending job that mean "no room now" rather than "not looked at yet".
NO_CAPACITY_REASONS: Final = frozenset({JobReason.UNSCHEDULABLE, JobReason.QUOTA_EXCEEDED})

#: Whether another attempt of the task (a Flyte retry: a new job, the same spec) could end otherwise,
#: for each reason a job fails with, when the function left no error.pb to say so. Every Failed reason
#: of the vocabulary is here (a test keeps it so); a reason a newer operator adds is retryable until
#: it is added. Retryable: the worker's death or the cluster's conditions, as a pod's non-zero exit
#: is retryable to Flyte. Permanent: the spec, the config, the data or the image, which a retry runs
#: again unchanged.
RETRYABLE: Final[dict[str, bool]] = {
    # Died without an error.pb (a signal, a segfault, a lost node under restartPolicy Never).
    JobReason.WORKER_FAILED: True,
    # The job's own restarts ran out on such deaths; a new job starts with a fresh backoffLimit.
    JobReason.BACKOFF_LIMIT_EXCEEDED: True,
    # The built-in trainer's loss went NaN or infinite: the same config diverges again.
    JobReason.LOSS_DIVERGED: False,
    # GPU or host memory ran out: the same config on the same instance runs out again (the operator
    # does not restart it by default for that reason; the message names the fields to change).
    JobReason.OUT_OF_MEMORY: False,
    # A slow or lost peer, the network: another attempt may not meet it.
    JobReason.NCCL_TIMEOUT: True,
    JobReason.RENDEZVOUS_TIMEOUT: True,
    # No progress for maxIdle: a hang (a peer, the store), which the operator itself restarts.
    JobReason.STALLED: True,
    # The built-in trainer refused its config, data or model (exit 2).
    JobReason.INVALID_TRAINER_INPUT: False,
    # Ran past maxDuration: a slow node or a long queue for data; Flyte retries its own timeouts.
    JobReason.DEADLINE_EXCEEDED: True,
    # Fewer than minNodes ran within maxPending: capacity may be free by the next attempt.
    JobReason.PENDING_TIMEOUT: True,
    # A DGXDataMount failed for good (credentials, bucket, URI): a retry reuses the same mount (its
    # name is a hash of what it reads), still Failed, and fails at once.
    JobReason.DATA_MOUNT_FAILED: False,
    # Another owner's object at one of the job's names.
    JobReason.FOREIGN_OBJECT: False,
    # A spec only the cluster can check (an unknown instance, outputs into an input mount).
    JobReason.INVALID_SPEC: False,
    # The apiserver refused a child for good (invalid, or an admission plugin's policy).
    JobReason.CREATE_REFUSED: False,
    # The image reference is malformed, or imagePullPolicy Never and the image is not there.
    JobReason.INVALID_IMAGE_NAME: False,
    JobReason.ERR_IMAGE_NEVER_PULL: False,
}

#: On a DGXTrainingJob the connector has reported RUNNING to Flyte: the time it first did.
RAN_ANNOTATION: Final = "flyte.kubedgx.io/reported-running"
#: The name of the one log link of the job (a template without {pod}); shown while the task is pending.
JOB_LINK: Final = "kubedgx job"


@dataclass(frozen=True)
class Status:
    phase: int
    message: str
    log_links: tuple[tuple[str, str], ...] = ()  # (name, uri)
    custom_info: dict[str, Any] = field(default_factory=dict)
    #: The Failed condition's reason of a failed job ("" otherwise): with error.pb, what decides a retry.
    reason: str = ""


def failure_phase(reason: str, error_kind: int | None = None) -> int:
    """FAILED (permanent) or RETRYABLE_FAILED for a job that failed with ``reason``. ``error_kind``:
    the ContainerError.Kind of the error.pb the function wrote (None: none, or unreadable), which
    decides when there is one: RECOVERABLE (FlyteRecoverableException, flytekit's system errors) is
    retryable, NON_RECOVERABLE (any other exception) is not, as propeller decides for a container."""
    if error_kind is not None:
        return int(RETRYABLE_FAILED if error_kind == ContainerError.RECOVERABLE else FAILED)
    return int(RETRYABLE_FAILED if RETRYABLE.get(reason, True) else FAILED)


def has_run(job: Mapping[str, Any] | None) -> bool:
    """Whether the connector has reported this job RUNNING (:data:`RAN_ANNOTATION`)."""
    annotations = ((job or {}).get("metadata") or {}).get("annotations") or {}
    return bool(annotations.get(RAN_ANNOTATION))


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
        return ((JOB_LINK, template.format(namespace=ns, job=name, pod="")),)
    workers = ((job.get("status") or {}).get("workers") or {}).get("desired") or 1
    return tuple(
        (f"worker {i}", template.format(namespace=ns, job=name, pod=f"{name}-worker-{i}")) for i in range(int(workers))
    )


#: What of status.usage the task's custom_info carries.
USAGE_SHOWN = ("gpuSeconds", "gpuHours", "cost", "currency", "spotSavings", "examplePrices", "unpricedGpuSeconds")


def status_of(job: Mapping[str, Any] | None, log_template: str | None = None) -> Status:
    """Flyte's view of the job. ``None`` is a job that is gone: deleted outside Flyte (an abort
    deletes it too, but then Flyte no longer asks). A job the connector has reported RUNNING
    (:func:`has_run`) and that waits again (suspended, queued by Kueue, pending, syncing data) is
    RUNNING, its message saying why it waits."""
    st = _status_of(job, log_template)
    if has_run(job) and st.phase in (QUEUED, WAITING, INITIALIZING):
        return Status(RUNNING, st.message, st.log_links, st.custom_info)
    return st


def _status_of(job: Mapping[str, Any] | None, log_template: str | None) -> Status:
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
        failed = _condition(job, JobCondition.FAILED)
        reason = str(failed.get("reason") or "")
        # No "failed: " of its own: propeller says "failed to run the job: ", flytekit locally
        # "Failed to run the task ... with error: ".
        message = _why(failed) or "the job failed without a recorded reason"
        return Status(failure_phase(reason), message, links, info, reason)
    return done(QUEUED, f"unknown phase {phase!r}")


#: How many of rank 0's last lines ``get_logs`` returns when the caller names no number.
LOG_LINES: Final = 100


def log_tail(text: str, lines: int = LOG_LINES) -> list[str]:
    """The last ``lines`` lines of a container's log, without line ends."""
    return text.splitlines()[-lines:] if lines > 0 else []


def no_log(namespace: str, pod: str, container: str, kind: str, words: str) -> str:
    """One line saying why there is no log: ``kind`` and ``words`` are the apiserver's refusal (its
    details.kind, ``pods`` when the pod does not exist, and its message)."""
    if kind == "pods":
        return (
            f"no log: pod {namespace}/{pod} does not exist (its job has not created it yet, or the job ended or "
            "was deleted and its workers with it)"
        )
    return f"no log of pod {namespace}/{pod}, container {container}: {words}"
