"""The clocks: ``spec.maxDuration`` (the deadline and what is left of it for a new worker's
activeDeadlineSeconds) and ``spec.maxPending`` (how long a job may go without minNodes workers
running). Each arms a wake-up rather than polling. A field the spec leaves unset takes the default
of the namespace's guard rails pinned in ``status.limits`` at the job's first pass (guardrails.py):
the spec first, then ``status.limits``, else no clock."""

from __future__ import annotations

import dataclasses
import math
from datetime import timedelta

from dgx_operator.api.common import parse_duration
from dgx_operator.api.vocabulary import JobPhase, JobReason
from dgx_operator.reconcile.planner.draft import Draft
from dgx_operator.reconcile.planner.model import DATA_READY, RUNNING, SUSPENDED, Plan, condition
from dgx_operator.render.resolved import Resolved


def with_pinned(d: Draft, r: Resolved) -> Resolved:
    """``r`` with the pinned defaults of ``status.limits`` for the durations the spec leaves unset:
    every reader of the clocks (the deadline, a new worker's activeDeadlineSeconds, maxPending) then
    sees the one value."""
    pinned = d.status.limits
    if pinned is None:
        return r
    duration, pending = r.max_duration_s, r.max_pending_s
    if d.spec.max_duration is None and pinned.max_duration is not None:
        duration = _seconds(pinned.max_duration)
    if d.spec.max_pending is None and pinned.max_pending is not None:
        pending = _seconds(pinned.max_pending)
    return dataclasses.replace(r, max_duration_s=duration, max_pending_s=pending)


def _seconds(text: str) -> int:
    return max(1, math.ceil(parse_duration(text).total_seconds()))


def described(d: Draft, field: str) -> str:
    """How a message names the duration in force: ``spec.maxDuration (96h)``, or ``maxDuration (24h, the
    default of DGXLimits team-a/default, pinned in status.limits)``."""
    own = d.spec.max_duration if field == "maxDuration" else d.spec.max_pending
    if own is not None:
        return f"spec.{field} ({own})"
    pinned = d.status.limits
    value = None if pinned is None else (pinned.max_duration if field == "maxDuration" else pinned.max_pending)
    source = pinned.source if pinned is not None else ""
    return f"{field} ({value}, the default of {source}, pinned in status.limits)"


def deadline_passed(d: Draft, r: Resolved) -> bool:
    if any(p.failed and p.deadline_exceeded for p in d.pods):
        return True  # a worker's activeDeadlineSeconds (the remainder of maxDuration) fired
    if r.max_duration_s is None or d.status.start_time is None:
        return False
    deadline = d.status.start_time + timedelta(seconds=r.max_duration_s)
    if d.now >= deadline:
        return True
    d.wakeups.append(deadline)
    return False


def remaining_seconds(d: Draft, r: Resolved) -> int | None:
    if r.max_duration_s is None:
        return None
    if d.status.start_time is None:
        return r.max_duration_s
    left = r.max_duration_s - (d.now - d.status.start_time).total_seconds()
    return max(1, int(left))


def pending_timeout(d: Draft, r: Resolved) -> Plan | None:
    """maxPending: how long the job may go without minNodes workers running."""
    if r.max_pending_s is None:
        return None
    not_running = condition(d.status, RUNNING)
    if not_running is None or not_running.status == "True":
        return None
    # Waiting for data or sitting suspended is not waiting for nodes: count from the latest of
    # "stopped running", "data became ready" and "resumed".
    since = not_running.last_transition_time
    for type_, value in ((DATA_READY, "True"), (SUSPENDED, "False")):
        other = condition(d.status, type_)
        if other is not None and other.status == value:
            since = max(since, other.last_transition_time)
    expiry = since + timedelta(seconds=r.max_pending_s)
    if d.now >= expiry:
        return d.finish(
            JobPhase.FAILED,
            JobReason.PENDING_TIMEOUT,
            f"fewer than minNodes workers ran for {described(d, 'maxPending')}: {not_running.message}",
        )
    d.wakeups.append(expiry)
    return None
