"""What goes into a planning pass and what comes out: the observations (:class:`Observed`, the
mounts' and the refused creates' states), the :class:`Plan` and its events, and the constants the
policies share (the condition types by their short names, the cascade window, the quota retry)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from dgx_operator.api.common import Condition
from dgx_operator.api.trainingjob import DGXTrainingJob, DGXTrainingJobStatus
from dgx_operator.api.vocabulary import JobCondition, JobPhase
from dgx_operator.reconcile.budgets import Reservation
from dgx_operator.reconcile.pods import PodView
from dgx_operator.reconcile.queueing import Queueing, WorkloadWrites
from dgx_operator.reconcile.spending import BudgetView
from dgx_operator.reconcile.status import find_condition
from dgx_operator.validation.limits import Effective

EventType = Literal["Normal", "Warning"]
#: A condition reason the CRD's schema takes (api.common.Condition).
REASON = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")

# The condition types (api.vocabulary.JobCondition), by the short names the ladder reads best with.
RUNNING = JobCondition.RUNNING
RESTARTING = JobCondition.RESTARTING
SUSPENDED = JobCondition.SUSPENDED
SUCCEEDED = JobCondition.SUCCEEDED
FAILED = JobCondition.FAILED
DATA_READY = JobCondition.DATA_READY
FINISHED = JobCondition.FINISHED
ARCHIVED = JobCondition.ARCHIVED
WORKERS_PENDING = JobCondition.WORKERS_PENDING
TERMINAL = JobPhase.TERMINAL


#: How long after a restart a failure of a worker from an older attempt still belongs to it: the
#: survivors of a crash notice the lost peer (NCCL errors, torchrun's rendezvous keep-alive) within
#: seconds, and the kubelet's clock may be a few seconds off the operator's. Later, it is a new incident.
CASCADE_WINDOW = timedelta(seconds=60)
#: The built-in trainer's exit code for "invalid config, data or model" (dgx_trainer.__main__).
TRAINER_INVALID_EXIT = 2

#: The phase a job sees for a mount whose stored spec the model refuses (see parse_mount): it waits
#: for the fix, as for a mount not created yet.
UNREADABLE = "Unreadable"


@dataclass(frozen=True)
class MountState:
    """A referenced DGXDataMount as observed: its phase (None when it does not exist)."""

    phase: str | None
    message: str = ""


@dataclass(frozen=True)
class Refused:
    """A child the apiserver refused to create in this pass (see kube.refusal): for good
    (``permanent``: invalid, or denied by an admission plugin), or until quota frees up."""

    kind: str
    name: str
    permanent: bool
    #: The apiserver's own sentence (Status.message).
    message: str

    def describe(self) -> str:
        return f"the apiserver refused to create {self.kind} {self.name}: {self.message}"


#: How often a job whose workers a ResourceQuota refused tries again (nothing else tells it that
#: the quota has room: the other jobs ending are not its events).
QUOTA_RETRY_SECONDS = 30.0


@dataclass(frozen=True)
class Observed:
    """What exists now, as the operator's caches and the API server report it."""

    pods: Sequence[PodView] = ()
    service: bool = False
    #: The ConfigMap of the job's current trainer config exists.
    config_map: bool = False
    #: Other ConfigMaps of this job: trainer configs an edit superseded.
    stale_config_maps: Sequence[str] = ()
    mounts: Mapping[str, MountState] = field(default_factory=dict)
    #: "kind namespace/name (owner ...)" of children at our names that another owner controls,
    #: learnt from a create that answered 409.
    foreign: Sequence[str] = ()
    #: Creates the apiserver refused in this pass (the controller plans again knowing them).
    refused: Sequence[Refused] = ()
    #: The job's queueing in Kueue; None when Kueue does not manage the job.
    queueing: Queueing | None = None
    #: Worker 0's latest progress report read from its log while it runs (the controller reads it
    #: at most once per progress interval); None when not read in this pass.
    progress: Mapping[str, Any] | None = None
    #: The controller reads live progress (its progressInterval is not 0): spec.maxIdle can tell a
    #: silent worker from one nobody listens to.
    progress_live: bool = False
    #: When this operator process last wrote the job's status (None: not since it started), and
    #: the status interval (0: every change written at once): a change of the counts in flight
    #: alone waits until that write is an interval old (see planner.coalesce).
    status_written_at: datetime | None = None
    status_interval: float = 0.0
    #: Since when the passes have held back a change of the counts in flight (None: the last pass
    #: held nothing): it is written once it has waited planner.coalesce.SETTLE.
    status_held_since: datetime | None = None
    #: How often a change of status.usage alone is written, at most (0: like the counts in flight).
    usage_interval: float = 300.0
    #: The namespace's DGXBudgets, read for a pass that may start a run (planner.budget); None: not read.
    budgets: Sequence[BudgetView] | None = None
    #: The namespace's jobs with it (their usage counts against the budgets), read with the budgets.
    neighbours: Sequence[DGXTrainingJob] = ()
    #: The guard rails of the job's namespace (the chart's limits and its DGXLimits, combined), read
    #: only for the job's first pass (no phase yet): they are checked and their defaults pinned then
    #: (planner.guardrails); None: not read, or no limits at all.
    limits: Effective | None = None


@dataclass(frozen=True)
class Event:
    type: EventType
    reason: str
    message: str


@dataclass
class Plan:
    """What to do. Creates come first (config, Service, workers), then deletes, then the status."""

    status: DGXTrainingJobStatus
    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    #: Superseded trainer ConfigMaps that no worker mounts any more.
    delete_config_maps: list[str] = field(default_factory=list)
    #: Pods to let go of (stuck Terminating on a lost node): relabelled "<job>.detached".
    detach: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    delete_job: bool = False
    release_finalizer: bool = False
    #: Writes to the job's Kueue Workload (see reconcile.queueing).
    workloads: WorkloadWrites = field(default_factory=WorkloadWrites)
    #: The status keeps stored counts in flight newer ones would change (planner.coalesce).
    status_held: bool = False
    #: A run starts in this pass: its reservation in each covering DGXBudget, written (guarded by the
    #: budget's resourceVersion) before any worker is created (planner.budget).
    reserve: list[tuple[BudgetView, Reservation]] = field(default_factory=list)
    #: The job's run ended (it finished, was suspended or evicted) or its finalizer goes: its usage is
    #: settled into the budgets that cover it and its reservations are released.
    settle: bool = False


def condition(status: DGXTrainingJobStatus, type_: str) -> Condition | None:
    return find_condition(status.conditions, type_)
