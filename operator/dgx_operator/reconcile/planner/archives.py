"""Success and what it leaves: worker 0's exit 0 ends the job (after the archiving sidecars had their
time), ``status.artifacts`` and the Archived condition come from what the uploaders reported, and a
job that ended before Finished existed gets it backfilled."""

from __future__ import annotations

from dgx_operator.api.common import Condition
from dgx_operator.api.trainingjob import Artifact
from dgx_operator.api.vocabulary import JobPhase, JobReason
from dgx_operator.reconcile.planner.draft import Draft
from dgx_operator.reconcile.planner.model import ARCHIVED, FINISHED, Plan, condition
from dgx_operator.reconcile.pods import artifacts_of
from dgx_operator.render.datasync import archives
from dgx_operator.render.resolved import Resolved


def succeeded(d: Draft, r: Resolved) -> Plan | None:
    if r.interactive:
        return None  # the idle worker never completes training
    worker0 = next((p for p in d.pods if p.index == 0 and p.succeeded), None)
    if worker0 is None:
        return None
    if archiving_mounts(d):
        # Rank 0 (whose node holds the final model) may be any worker of an elastic job, and its
        # sidecar archives after the trainer exits: wait for the workers that run to end rather
        # than delete one mid-upload. torchrun ends them all together. That includes survivors
        # of an earlier attempt (a restart replaces only the failed workers; the others keep
        # their attempt label and stay in the group), and excludes workers that never started
        # (phase Pending: an elastic job's spares may be unschedulable for ever and hold nothing).
        busy = [p for p in d.pods if p.active and p.phase == "Running"]  # the Pod's phase
        if busy:
            names = ", ".join(p.name for p in busy)
            # Phase and condition agree (Running, reason Finishing) even if the last pass saw
            # the job Pending or Restarting: the training is over, uploads are running.
            d.set_phase(JobPhase.RUNNING, JobReason.FINISHING, f"{worker0.name} completed; waiting for {names} to end")
            d.plan.requeue_after = 30.0
            return d.done(desired=len(busy))
    d.finish(JobPhase.SUCCEEDED, JobReason.COMPLETED, f"{worker0.name} exited 0: training completed")
    collect_artifacts(d)
    return d.plan


def archiving_mounts(d: Draft) -> dict[int, str]:
    """Index -> name of the referenced mounts that archive the final model."""
    out: dict[int, str] = {}
    for i, ref in enumerate(d.spec.data_mounts):
        mount = d.ctx.data_mounts.get(ref.name)
        if mount is not None and archives(mount):
            out[i] = ref.name
    return out


def collect_artifacts(d: Draft) -> None:
    """status.artifacts from what the sidecars reported, and the Archived condition saying
    whether the archive the job asked for happened. Only reports, never guesses: a URI is listed
    because an uploader wrote it there."""
    mounts = archiving_mounts(d)
    if not mounts:
        return
    found: dict[str, Artifact] = {a.uri: a for a in d.status.artifacts}
    errors: list[str] = []
    for pod in d.pods:
        items, problems = artifacts_of(pod)
        errors += problems
        for index, name, uri in items:
            found.setdefault(uri, Artifact(name=name, uri=uri, mount=mounts.get(index)))
    artifacts = sorted(found.values(), key=lambda a: a.uri)[:32]
    before = condition(d.status, ARCHIVED)
    d.status.artifacts = artifacts
    targets = ", ".join(sorted(set(mounts.values())))
    if artifacts:
        message = f"{len(artifacts)} artifact(s) archived to {targets}"
        if before is None or before.status != "True":
            d.event("Normal", JobReason.ARCHIVED, message)
        d.cond(ARCHIVED, True, JobReason.ARCHIVED, message)
    elif before is None or before.status != "True":
        detail = "; ".join(errors) if errors else "no uploader reported an archive (see the checkpoints-* logs)"
        message = f"the final model was not archived to {targets}: {detail}"[:1000]
        if before is None:
            d.event("Warning", JobReason.ARCHIVE_FAILED, message)
        d.cond(ARCHIVED, False, JobReason.ARCHIVE_FAILED, message)


def backfill_finished(d: Draft) -> None:
    """A job that ended under an operator that did not write Finished gets it from the condition
    its phase names, dated when the job ended: a `kubectl wait --for=condition=Finished` on it
    returns, and its lastTransitionTime does not pretend the job ended at the upgrade."""
    if condition(d.status, FINISHED) is not None:
        return
    phase = d.status.phase or ""
    ended = condition(d.status, phase)
    finished = Condition(
        type=FINISHED,
        status="True",
        reason=ended.reason if ended is not None else phase,
        message=ended.message if ended is not None else "",
        last_transition_time=d.status.completion_time or d.now,
        observed_generation=d.generation if ended is None else ended.observed_generation,
    )
    d.status.conditions = [*d.status.conditions, finished]
