"""The restart policy: which failures are news (the current attempt's, or a survivor's after the
cascade window), which end the job (Never, the trainer's refusal of its input, ExitCode's
permanent codes, backoffLimit) and which replace workers in a new attempt; workers lost by other
hands are replaced, never counted. See the package docstring for why accounting is idempotent."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from dgx_operator.api.vocabulary import JobPhase, JobReason
from dgx_operator.reconcile.diagnosis import Diagnosis, Fields
from dgx_operator.reconcile.planner.draft import Draft
from dgx_operator.reconcile.planner.model import CASCADE_WINDOW, RUNNING, TRAINER_INVALID_EXIT, Plan, condition
from dgx_operator.reconcile.pods import PodView
from dgx_operator.render.resolved import Resolved


def fields(d: Draft, r: Resolved) -> Fields:
    """The settings a diagnosis's fix names, with the job's values."""
    t = d.spec.trainer.training if d.spec.trainer is not None else None
    return Fields(
        memory=r.memory,
        per_device_batch_size=t.per_device_batch_size if t else None,
        max_seq_length=t.max_seq_length if t else None,
        gradient_checkpointing=t.gradient_checkpointing if t else None,
        collective_timeout_seconds=t.collective_timeout_seconds if t else None,
        builtin_trainer=d.spec.trainer is not None,
    )


def described(p: PodView, found: Diagnosis | None) -> str:
    """How a worker ended: the diagnosis's words when there is one, else what it left."""
    if found is None:
        return p.describe_failure()
    code = f" exited with code {p.exit_code}" if p.exit_code is not None else f" failed ({p.reason or p.phase})"
    if p.reason == "OOMKilled":
        code += " (OOMKilled)"
    return f"{p.name}{code}: {found.reason}: {found.message}"


def failures(d: Draft, r: Resolved) -> Plan | None:
    """A failure the restart policy does not absorb ends the job; others restart workers.

    Only pods of the current attempt that nobody is deleting count: a worker that dies while
    being deleted (scale-down, suspend, someone's kubectl delete) was stopped, not broken. The
    diagnosis (:mod:`dgx_operator.reconcile.diagnosis`) decides before the policy does: a cause
    that recurs with the same config (OutOfMemory, LossDiverged) ends the job under any policy
    (unless ExitCode's explicit retryableExitCodes lists the exit code: the user asked for it);
    a transient one (NCCLTimeout, RendezvousTimeout) is restarted under OnFailure and ExitCode
    whatever its exit code; a worker that saved a checkpoint on SIGTERM (Interrupted) was taken
    away, not broken, and is replaced without counting."""
    current = [p for p in d.pods if p.failed and not p.terminating and new_incident(d, p)]
    known = fields(d, r)
    found = {p.name: p.diagnose(known) for p in current}
    interrupted = [
        p for p in current if not p.disrupted and (f := found[p.name]) is not None and f.reason == JobReason.INTERRUPTED
    ]
    failures = [p for p in current if not p.disrupted and p not in interrupted]
    ended = [p for p in d.pods if r.interactive and p.succeeded and not p.terminating]
    if ended and any(p.attempt >= d.status.attempt for p in ended):
        restart(d, ended, counted=False, reason=JobReason.WORKER_REPLACED)
    if not failures:
        disrupted = [p for p in current if p.disrupted]
        if disrupted:
            restart(d, [*disrupted, *interrupted], counted=False, reason=JobReason.WORKER_DISRUPTED)
        elif interrupted:
            what = "; ".join(described(p, found[p.name]) for p in interrupted)
            restart(d, interrupted, counted=False, reason=JobReason.INTERRUPTED, what=what)
        return None
    policy = d.spec.restart_policy
    explicit = set(d.spec.retryable_exit_codes or ()) if policy == "ExitCode" else set()
    for p in failures:
        diagnosis = found[p.name]
        if diagnosis is None or diagnosis.transient:
            continue
        if diagnosis.reason != JobReason.LOSS_DIVERGED and p.exit_code in explicit:
            continue  # retryableExitCodes names this code: the user chose to retry it
        return d.finish(
            JobPhase.FAILED,
            diagnosis.reason,
            f"{described(p, diagnosis)}; not restarted: the same config would fail the same way",
        )
    first = failures[0]
    first_found = found[first.name]
    first_text = described(first, first_found)
    cause = first_found.reason if first_found is not None else None
    if policy == "Never":
        return d.finish(JobPhase.FAILED, cause or JobReason.WORKER_FAILED, f"{first_text}; restartPolicy is Never")
    if policy == "OnFailure" and d.spec.trainer is not None:
        # The built-in trainer's exit 2 is its pre-launch check refusing the config, the data
        # or the model (docs/trainer.md, Exit codes): the same files fail the same way on every
        # retry, so backoffLimit retries would only delay the message by minutes each.
        invalid = [p for p in failures if p.failed_init is None and p.exit_code == TRAINER_INVALID_EXIT]
        if invalid:
            return d.finish(
                JobPhase.FAILED,
                JobReason.INVALID_TRAINER_INPUT,
                f"{invalid[0].describe_failure()}; exit code {TRAINER_INVALID_EXIT}: the trainer refused its "
                "config, data or model, which no restart can change (fix the field it names and apply again)",
            )
    if policy == "ExitCode":
        permanent = [
            p
            for p in failures
            if (p.exit_code is None or p.exit_code not in r.retryable_exit_codes) and found[p.name] is None
        ]
        if permanent:
            code = permanent[0].exit_code
            return d.finish(
                JobPhase.FAILED,
                JobReason.WORKER_FAILED,
                f"{permanent[0].describe_failure()}; exit code {code} is not in retryableExitCodes",
            )
    if d.status.restarts + 1 > d.spec.backoff_limit:
        return d.finish(
            JobPhase.FAILED,
            cause or JobReason.BACKOFF_LIMIT_EXCEEDED,
            f"{first_text}; backoffLimit {d.spec.backoff_limit} reached after {d.status.restarts} restart(s)",
        )
    what = "; ".join(described(p, found[p.name]) for p in current if p not in interrupted)
    restart(d, current, counted=True, reason=JobReason.WORKER_FAILED, what=what)
    return None


def stalled(d: Draft, r: Resolved) -> Plan | None:
    """spec.maxIdle: worker 0 running with no new progress report for that long. Counts from the
    latest of: the job running (again), the last restart, the newest report's time (the trainer's
    updatedAt, or when the operator first read an unstamped one). Only when the operator reads
    progress (its progressInterval is not 0): without reports a job would look stalled when it is
    not. A hang is usually a collective or a data loader stuck: restarting the group (counted
    against backoffLimit) is the cure, as for NCCLTimeout; under Never the job ends."""
    if r.max_idle_s is None or r.interactive or not d.observed.progress_live:
        return None
    running = condition(d.status, RUNNING)
    if d.old_phase != JobPhase.RUNNING or running is None or running.status != "True":
        return None
    worker0 = next((p for p in d.pods if p.index == 0 and p.running and not p.terminating), None)
    if worker0 is None:
        return None
    d.read_progress()
    since = running.last_transition_time
    if d.status.last_restart_time is not None:
        since = max(since, d.status.last_restart_time)
    progress = d.status.progress
    if progress is not None and progress.updated_at is not None:
        since = max(since, progress.updated_at)
    expiry = since + timedelta(seconds=r.max_idle_s)
    if d.now < expiry:
        d.wakeups.append(expiry)
        return None
    last = (
        f"; its last report: step {progress.step} at {progress.updated_at:%Y-%m-%dT%H:%M:%SZ}"
        if progress is not None and progress.step is not None and progress.updated_at is not None
        else "; it has reported no progress since it started"
    )
    message = (
        f"worker 0 ({worker0.name}) reported no progress for spec.maxIdle "
        f"({d.spec.max_idle}){last}. A collective or data loader may hang: see its log (and the other "
        "workers'), run with spec.debug.enabled for NCCL_DEBUG=INFO, or raise maxIdle if a stretch without "
        "reports (loading, evaluation, saving) takes that long"
    )
    if d.spec.restart_policy == "Never":
        return d.finish(JobPhase.FAILED, JobReason.STALLED, f"{message}; restartPolicy is Never")
    if d.status.restarts + 1 > d.spec.backoff_limit:
        return d.finish(
            JobPhase.FAILED,
            JobReason.STALLED,
            f"{message}; backoffLimit {d.spec.backoff_limit} reached after {d.status.restarts} restart(s)",
        )
    what = f"{JobReason.STALLED}: {message}"
    restart(d, [p for p in d.pods if p.active], counted=True, reason=JobReason.WORKER_FAILED, what=what)
    return None


def new_incident(d: Draft, pod: PodView) -> bool:
    """Whether a failed pod is news. A pod of the current attempt is. One of an older attempt (a
    survivor of an earlier restart: a restart replaces only the failed workers) is news when its
    container ended more than CASCADE_WINDOW after the last restart: earlier, it is that
    incident's cascade (NCCL errors after a peer died), already answered."""
    if pod.attempt >= d.status.attempt:
        return True
    since = d.status.last_restart_time
    return since is not None and pod.finished_at is not None and pod.finished_at > since + CASCADE_WINDOW


def restart(d: Draft, pods: Sequence[PodView], *, counted: bool, reason: str, what: str | None = None) -> None:
    """Replace ``pods`` in a new attempt; only program failures count against backoffLimit.
    ``what`` says why (default: how each pod ended)."""
    d.delete(pods)
    d.status.attempt += 1
    d.status.last_restart_time = d.now
    what = what if what is not None else "; ".join(p.describe_failure() for p in pods)
    if counted:
        d.status.restarts += 1
        d.event(
            "Warning",
            JobReason.WORKER_RESTARTED,
            f"{what}; restart {d.status.restarts} of {d.spec.backoff_limit} (attempt {d.status.attempt})",
        )
    else:
        d.event("Normal", reason, f"{what}; replaced without counting against backoffLimit")
    d.restarted = True


def notice_lost_workers(d: Draft) -> None:
    """Workers that vanished without this operator deleting them (node loss, a spot reclaim,
    someone's kubectl delete) are replaced in a new attempt, never counted: the last status
    says how many workers were active after the operator's own deletions, so fewer pods
    (not being deleted) now means the difference went away by other hands."""
    old = d.job.status
    if old is None or old.workers is None or d.status.start_time is None or d.old_phase == JobPhase.SUSPENDED:
        return
    # Failed pods the last pass kept do not exist: it deleted every one of them (they show as
    # terminating until gone), so what it kept is exactly its active and succeeded workers.
    untouched = sum(1 for p in d.pods if not p.terminating)
    lost = old.workers.active + old.workers.succeeded - untouched
    if lost > 0:
        d.status.attempt += 1
        d.status.last_restart_time = d.now
        d.event(
            "Normal",
            JobReason.WORKER_LOST,
            f"{lost} worker(s) disappeared or were deleted by someone else; replacing them in attempt "
            f"{d.status.attempt}, not counted against backoffLimit",
        )
