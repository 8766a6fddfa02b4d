"""The namespace's guard rails (DGXLimits and the chart's ``limits``, validation.limits) at a job's
first pass, and only then:

- a job that breaks one is failed ``InvalidSpec``: the webhook refuses such a job at `kubectl apply`,
  but one can slip past it (the webhook down under failurePolicy Ignore, an operator run without the
  webhook, a label added while the match conditions did not send it). Never later: limits are
  checked when a job is made, as LimitRange's are, so a limit tightened under a running job ends
  nothing;
- the defaults the job takes (maxDuration, maxPending, the end of an interactive session) are
  pinned into ``status.limits``, so that a later edit of the limits does not move its deadline.
  The stored spec is never changed (no drift under Argo CD); :mod:`timers` reads the spec first,
  then ``status.limits``.
"""

from __future__ import annotations

from dgx_operator.api.trainingjob import PinnedLimits
from dgx_operator.api.vocabulary import JobPhase, JobReason
from dgx_operator.reconcile.planner.draft import Draft
from dgx_operator.reconcile.planner.model import Plan
from dgx_operator.validation.limits import check, pinned

#: The longest condition message the planner writes (the status' own bound is far above it).
MESSAGE_LIMIT = 1000


def first_pass(d: Draft) -> Plan | None:
    """At the job's first pass (no phase yet) with the namespace's limits observed: fail the job if it
    breaks one, else pin the defaults it takes. Otherwise nothing."""
    limits = d.observed.limits
    if d.old_phase is not None or limits is None:
        return None
    problems, _ = check(d.job, limits, d.ctx.catalog)
    if problems:
        message = (
            "the job breaks the namespace's guard rails (the webhook, which refuses this at kubectl apply, did "
            f"not check it): {'; '.join(map(str, problems))}"
        )
        return d.finish(JobPhase.FAILED, JobReason.INVALID_SPEC, message[:MESSAGE_LIMIT])
    if d.status.limits is None:
        taken = pinned(d.job, limits)
        if not taken.empty:
            d.status.limits = PinnedLimits(
                max_duration=taken.max_duration, max_pending=taken.max_pending, source=taken.source
            )
    return None
