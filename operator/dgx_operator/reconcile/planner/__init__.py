"""The planner: (job, observed children, now) -> what to create, delete and report.

One pure function serves every trigger (create, resume, spec update, timer, pod or mount event),
so the operator is level-triggered: it compares what exists with what should exist and never
relies on having seen an edge. Everything here is deterministic and unit-tested; `kube.py` only
carries the plan out.

Restart accounting is idempotent under crashes: a failure is counted by bumping
``status.attempt`` together with ``status.restarts`` in one status write, and only failures of
pods from the *current* attempt count. A worker that failed in attempt 3 and is seen again after
the operator restarted (status already at attempt 4) is replaced without being counted twice.
Failures that cascade from one incident (a crash, then NCCL errors on the other workers) are
therefore one restart, as with torchrun's own group restarts. A restart replaces only the failed
workers, so survivors keep their older attempt: when one of them fails later (its container ended
more than CASCADE_WINDOW after ``status.lastRestartTime``), that is a new incident, judged by the
restart policy like any other.

A worker stuck Terminating on a lost node (see PodView.gone) is gone for every purpose but its name:
it is let go of (relabelled), replaced under a free name with the same hostname, never counted.

The package, by policy around its decision ladder (each module's docstring says more):

- ``model``: what goes in (:class:`Observed`) and comes out (:class:`Plan`), and shared constants;
- ``draft``: the plan being written, and the pen every policy writes it with;
- ``ladder``: :func:`plan` and the order of the decisions, and the steady state (workers, phase);
- ``gating``: Kueue, suspend, data mounts not Ready, ResourceQuota refusals;
- ``restarts``: the restart policy and incident accounting;
- ``archives``: success, artifacts and the Archived condition;
- ``guardrails``: the namespace's limits at the first pass (refused, or their defaults pinned);
- ``timers``: maxDuration and maxPending (the spec's, else the pinned defaults).

A new decision goes into the policy module it belongs to and is called from its rung of the ladder;
its reason is one line in :mod:`dgx_operator.api.vocabulary` (docs/where-things-go.md).
"""

from __future__ import annotations

from dgx_operator.reconcile.planner.ladder import plan
from dgx_operator.reconcile.planner.model import (
    ARCHIVED,
    CASCADE_WINDOW,
    DATA_READY,
    FAILED,
    FINISHED,
    QUOTA_RETRY_SECONDS,
    REASON,
    RESTARTING,
    RUNNING,
    SUCCEEDED,
    SUSPENDED,
    TERMINAL,
    UNREADABLE,
    WORKERS_PENDING,
    Event,
    EventType,
    MountState,
    Observed,
    Plan,
    Refused,
    condition,
)

__all__ = [
    "ARCHIVED",
    "CASCADE_WINDOW",
    "DATA_READY",
    "FAILED",
    "FINISHED",
    "QUOTA_RETRY_SECONDS",
    "REASON",
    "RESTARTING",
    "RUNNING",
    "SUCCEEDED",
    "SUSPENDED",
    "TERMINAL",
    "UNREADABLE",
    "WORKERS_PENDING",
    "Event",
    "EventType",
    "MountState",
    "Observed",
    "Plan",
    "Refused",
    "condition",
    "plan",
]
