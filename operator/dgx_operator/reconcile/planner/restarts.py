"""The restart policy: which failures are news (the current attempt's, or a survivor's after the
cascade window), which end the job (Never, the trainer's refusal of its input, ExitCode's
permanent codes, backoffLimit) and which replace workers in a new attempt; workers lost by other
hands are replaced, never counted. See the package docstring for why accounting is idempotent."""

from __future__ import annotations

from collections.abc import Sequence

from dgx_operator.api.vocabulary import JobPhase, JobReason
from dgx_operator.reconcile.planner.draft import Draft
from dgx_operator.reconcile.planner.model import CASCADE_WINDOW, TRAINER_INVALID_EXIT, Plan
from dgx_operator.reconcile.pods import PodView
from dgx_operator.render.resolved import Resolved


def failures(d: Draft, r: Resolved) -> Plan | None:
    """A failure the restart policy does not absorb ends the job; others restart workers.

    Only pods of the current attempt that nobody is deleting count: a worker that dies while
    being deleted (scale-down, suspend, someone's kubectl delete) was stopped, not broken."""
    current = [p for p in d.pods if p.failed and not p.terminating and new_incident(d, p)]
    failures = [p for p in current if not p.disrupted]
    ended = [p for p in d.pods if r.interactive and p.succeeded and not p.terminating]
    if ended and any(p.attempt >= d.status.attempt for p in ended):
        restart(d, ended, counted=False, reason=JobReason.WORKER_REPLACED)
    if not failures:
        disrupted = [p for p in current if p.disrupted]
        if disrupted:
            restart(d, disrupted, counted=False, reason=JobReason.WORKER_DISRUPTED)
        return None
    first = failures[0].describe_failure()
    diverged = [p for p in failures if p.diagnosis == JobReason.LOSS_DIVERGED]
    if diverged:
        # The same config diverges the same way: whatever the policy, a restart only burns GPU hours.
        return d.finish(
            JobPhase.FAILED,
            JobReason.LOSS_DIVERGED,
            f"{diverged[0].describe_failure()}; not restarted: the same config would diverge again",
        )
    policy = d.spec.restart_policy
    if policy == "Never":
        return d.finish(JobPhase.FAILED, JobReason.WORKER_FAILED, f"{first}; restartPolicy is Never")
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
        permanent = [p for p in failures if p.exit_code is None or p.exit_code not in r.retryable_exit_codes]
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
            JobReason.BACKOFF_LIMIT_EXCEEDED,
            f"{first}; backoffLimit {d.spec.backoff_limit} reached after {d.status.restarts} restart(s)",
        )
    restart(d, current, counted=True, reason=JobReason.WORKER_FAILED)
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


def restart(d: Draft, pods: Sequence[PodView], *, counted: bool, reason: str) -> None:
    """Replace ``pods`` in a new attempt; only program failures count against backoffLimit."""
    d.delete(pods)
    d.status.attempt += 1
    d.status.last_restart_time = d.now
    what = "; ".join(p.describe_failure() for p in pods)
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
