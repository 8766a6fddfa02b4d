"""Status writes coalesced: a job's status is written at once when something a reader acts on
changes (the phase, a condition's status or reason, the attempt, the worker counts that say a
worker was created, deleted, failed or finished, progress, artifacts, times), and at most once per
status interval when only the *counts in flight* move: how many workers are running
(``workers.ready``, ``nodes``) and the numbers in the messages of conditions whose status and
reason stay the same ("3/8 workers running, need 8 (2 not scheduled yet)").

Why: each worker of a job turning Running (or being scheduled) changes those counts, so a job of
N workers wrote its status N times on its way to Running, and every write wakes every watcher of
the job (kubectl, Argo CD, Flyte, the operator itself). Held back, they ride along with the next
real transition, or go out once the job's last write is an interval old and the change has waited
SETTLE (a job's workers come up in bursts: a change that a transition follows within seconds then
rides along with it). So the status is never more than an interval plus SETTLE behind, and N
workers turning Running one by one within an interval make two writes (the job's start and its
Running transition). See docs/operator.md, "How often the status is written".

Usage (``status.usage``, planner.accounting) moves every second a worker holds a node. It rides on
every write made anyway; alone it is written once the job's last write is a usage interval old
(``KUBEDGX_USAGE_INTERVAL``, 300 s by default: one write per five minutes of a job that reports no
progress), and at once when the job's last worker let go of its node, so a run's usage is final in
the status as soon as it is.

Pure: it compares the stored status with the planned one and, when only those counts differ and
the write is not due yet, keeps the stored counts in the plan, says so (Plan.status_held: the
controller remembers since when) and asks for a pass when it is due.
"""

from __future__ import annotations

from datetime import timedelta

from dgx_operator.api.trainingjob import DGXTrainingJobStatus
from dgx_operator.reconcile.planner.draft import Draft

#: How long a change of the counts in flight waits before it is written, at least.
SETTLE = timedelta(seconds=2)


def held_counts(old: DGXTrainingJobStatus, new: DGXTrainingJobStatus) -> DGXTrainingJobStatus:
    """``new`` with the counts in flight taken from ``old``: equal to ``old`` exactly when those
    counts are all that differ."""
    held = new.model_copy(deep=True)
    if old.workers is not None and held.workers is not None:
        held.workers.ready = old.workers.ready
    held.nodes = old.nodes
    before = {c.type: c for c in old.conditions}
    conditions = []
    for c in held.conditions:
        prior = before.get(c.type)
        same = prior is not None and (prior.status, prior.reason, prior.observed_generation) == (
            c.status,
            c.reason,
            c.observed_generation,
        )
        conditions.append(prior.model_copy(deep=True) if same and prior is not None else c)
    held.conditions = conditions
    return held


def coalesce(d: Draft) -> None:
    """Hold back a write that only moves the counts in flight or the usage (see the module
    docstring)."""
    old = d.job.status
    interval = d.observed.status_interval
    written = d.observed.status_written_at
    if old is None or written is None or d.status == old:
        return
    counted = held_counts(old, d.status) if interval > 0 else d.status
    held = counted.model_copy(update={"usage": old.usage})
    if held != old:
        return  # something a reader acts on changed: written now, counts and usage included
    dues = []
    if counted != held:  # the usage moved
        if old.usage is not None and old.usage.running and d.status.usage is not None and not d.status.usage.running:
            return  # the last worker let go of its node: the run's usage is final, written now
        every = d.observed.usage_interval if d.observed.usage_interval > 0 else interval
        dues.append(written + timedelta(seconds=every))
    counts_moved = counted != d.status
    if counts_moved:
        since = d.observed.status_held_since or d.now
        dues.append(max(written + timedelta(seconds=interval), since + SETTLE))
    due = min(dues)
    if d.now >= due:
        return
    # In place: the plan holds this very status object.
    for name in DGXTrainingJobStatus.model_fields:
        setattr(d.status, name, getattr(held, name))
    d.plan.status_held = counts_moved
    wait = (due - d.now).total_seconds()
    d.plan.requeue_after = wait if d.plan.requeue_after is None else min(d.plan.requeue_after, wait)
