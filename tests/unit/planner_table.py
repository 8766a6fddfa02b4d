"""The planner's decision table: for the table job (elastic 2..3 workers, a data mount, maxDuration
2h, maxPending 30m, TTL 10m: every rule can fire) in each phase, what each event leads to. Walked by
test_planner.py (the decision itself, and its stability) and test_planner_finished.py (the Finished
condition of every terminal row); the ``states`` fixture (the table job brought into each phase by
the planner itself) is in conftest.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest

from dgx_operator.api import DGXTrainingJob
from dgx_operator.reconcile.planner import MountState, Observed
from dgx_operator.render import BuildContext
from tests.unit.planner_sim import (
    DATA_REF,
    READY,
    SYNCING,
    Sim,
    created,
    event_reasons,
    observe,
    phase_reason,
    respec,
    sim_of,
)

#: Elastic 2..3 workers, data mount, deadline 2h, maxPending 30m, TTL 10m: every rule can fire.
TABLE_JOB: dict[str, Any] = {
    "spec.elastic": {"minNodes": 2, "maxNodes": 3},
    "spec.maxDuration": "2h",
    "spec.maxPending": "30m",
    "spec.ttlSecondsAfterFinished": 600,
    "spec.dataMounts": DATA_REF,
}


@dataclass
class State:
    sim: Sim
    pods: dict[int, str]  # index -> pod state
    #: index -> attempt of the pods that are not of the current attempt (survivors of a lost worker)
    attempts: dict[int, int] = field(default_factory=dict)

    def pod(self, index: int, state: str, **kw: Any) -> dict[str, Any]:
        """Worker ``index`` in ``state``, of the attempt the pod at that index was created with."""
        if index in self.attempts:
            kw.setdefault("attempt", self.attempts[index])
        return self.sim.pod(index, state, **kw)


def reach(ctx: BuildContext, phase: str) -> State:
    """Drive the table job into ``phase`` through the planner itself, with a settled status."""
    sim = sim_of(ctx, TABLE_JOB)
    sim.mounts = dict(SYNCING)
    sim.reconcile(at_s=0)
    assert sim.phase() == "WaitingForData"
    if phase == "WaitingForData":
        return State(sim, {})
    sim.mounts = dict(READY)
    assert created(sim.reconcile(at_s=60)) == [0, 1, 2]
    pending = dict.fromkeys(range(3), "unscheduled")
    sim.reconcile([sim.pod(i, s) for i, s in pending.items()], at_s=70)
    assert sim.phase() == "Pending"
    if phase == "Pending":
        return State(sim, pending)
    running = dict.fromkeys(range(3), "running")
    sim.reconcile([sim.pod(i, s) for i, s in running.items()], at_s=120)
    assert sim.phase() == "Running"
    if phase == "Running":
        return State(sim, running)
    if phase == "Restarting":
        lost = sim.reconcile([sim.pod(0, "running")], at_s=180)  # workers 1 and 2 lost with their nodes
        assert event_reasons(lost) == ["WorkerLost", "NodesBelowMinimum"]
        assert (sim.status.attempt, sim.status.restarts) == (1, 0)
        # Worker 0 survives from attempt 0; its new peers belong to attempt 1.
        sim.reconcile([sim.pod(0, "running", attempt=0), *sim.made()], at_s=190)
        assert (sim.phase(), phase_reason(sim.status)) == ("Restarting", "NodesBelowMinimum")
        return State(sim, {0: "running", 1: "unscheduled", 2: "unscheduled"}, attempts={0: 0})
    if phase == "Suspended":
        sim.respec({"spec.suspend": True})
        sim.reconcile([sim.pod(i, s) for i, s in running.items()], at_s=180)
        sim.reconcile([], at_s=190)
        assert sim.phase() == "Suspended"
        return State(sim, {})
    if phase == "Succeeded":
        sim.reconcile([sim.pod(0, "succeeded"), sim.pod(1, "running"), sim.pod(2, "running")], at_s=180)
        sim.reconcile([sim.pod(0, "succeeded")], at_s=190)
        assert sim.phase() == "Succeeded"
        return State(sim, {0: "succeeded"})
    if phase == "Failed":  # maxDuration: started at +60, deadline at +7260
        sim.reconcile([sim.pod(i, s) for i, s in running.items()], at_s=7260)
        sim.reconcile([], at_s=7270)
        assert (sim.phase(), phase_reason(sim.status)) == ("Failed", "DeadlineExceeded")
        return State(sim, {})
    raise AssertionError(phase)


@dataclass
class Input:
    job: DGXTrainingJob
    pods: list[dict[str, Any]]
    mounts: dict[str, MountState]
    now: datetime
    foreign: tuple[str, ...] = ()

    def observed(self) -> Observed:
        return observe(self.pods, mounts=self.mounts, foreign=self.foreign)


def _with_pods(
    state: State, changes: Mapping[int, str | None], *, exit_code: int | None = None
) -> list[dict[str, Any]]:
    pods = {**state.pods, **changes}
    return [
        state.pod(i, s, exit_code=exit_code if s == "failed" else None)
        for i, s in sorted(pods.items())
        if s is not None
    ]


def _later(state: State, seconds: float = 10) -> datetime:
    return state.sim.now + timedelta(seconds=seconds)


def _event_pods(changes: Mapping[int, str | None], exit_code: int | None = None) -> Callable[[State], Input]:
    def make(state: State) -> Input:
        return Input(state.sim.job, _with_pods(state, changes, exit_code=exit_code), state.sim.mounts, _later(state))

    return make


def _event_all(states: Mapping[int, str]) -> Callable[[State], Input]:
    def make(state: State) -> Input:
        pods = [state.pod(i, s) for i, s in states.items()]
        return Input(state.sim.job, pods, state.sim.mounts, _later(state))

    return make


def _event_failure(policy: str, code: int) -> Callable[[State], Input]:
    """Worker 1 exits with ``code`` under ``policy``."""

    def make(state: State) -> Input:
        job = respec(state.sim.job, {"spec.restartPolicy": policy})
        sim = Sim(job, state.sim.ctx, state.sim.now, state.sim.mounts)
        pods = _with_pods(State(sim, state.pods, state.attempts), {1: "failed"}, exit_code=code)
        return Input(job, pods, state.sim.mounts, _later(state))

    return make


def _event_spec(changes: Mapping[str, Any], mounts: Mapping[str, MountState] | None = None) -> Callable[[State], Input]:
    def make(state: State) -> Input:
        job = respec(state.sim.job, changes)
        return Input(job, _with_pods(state, {}), dict(mounts or state.sim.mounts), _later(state))

    return make


def _event_mount(phase: str | None) -> Callable[[State], Input]:
    def make(state: State) -> Input:
        mounts = {} if phase is None else {"data": MountState(phase, f"data is {phase}")}
        return Input(state.sim.job, _with_pods(state, {}), mounts, _later(state))

    return make


def _event_deadline(state: State) -> Input:
    """The clock reaches the end of maxDuration (2h after the start), or 2h pass where nothing started."""
    start = state.sim.status.start_time
    deadline = start + timedelta(hours=2) if start is not None else None
    now = deadline if deadline is not None and deadline > state.sim.now else _later(state, 7200)
    return Input(state.sim.job, _with_pods(state, {}), state.sim.mounts, now)


def _event_time(seconds: float) -> Callable[[State], Input]:
    def make(state: State) -> Input:
        return Input(state.sim.job, _with_pods(state, {}), state.sim.mounts, _later(state, seconds))

    return make


def _event_deleting(state: State) -> Input:
    job = respec(state.sim.job, {"metadata.deletionTimestamp": "2025-03-01T15:00:00Z"}, bump=False)
    return Input(job, _with_pods(state, {}), state.sim.mounts, _later(state))


def _event_foreign(state: State) -> Input:
    who = ("Pod ml/job-worker-1 (owner ReplicaSet ml/other uid 0000)",)
    return Input(state.sim.job, _with_pods(state, {}), state.sim.mounts, _later(state), foreign=who)


EVENTS: dict[str, Callable[[State], Input]] = {
    "all_running": _event_all({0: "running", 1: "running", 2: "running"}),
    "min_running": _event_all({0: "running", 1: "running", 2: "scheduled"}),
    "below_min": _event_all({0: "running", 1: "unscheduled", 2: "unscheduled"}),
    "lost_one": _event_pods({2: None}),
    "lost_two": _event_pods({1: None, 2: None}),
    "fail_never": _event_failure("Never", 1),
    "fail_on_failure": _event_failure("OnFailure", 1),
    "fail_exit_retryable": _event_failure("ExitCode", 137),
    "fail_exit_permanent": _event_failure("ExitCode", 1),
    "evicted": _event_pods({1: "evicted"}),
    "disrupted": _event_pods({1: "disruption"}),
    "worker0_succeeded": _event_pods({0: "succeeded"}),
    "deadline": _event_deadline,
    "pending_timeout": _event_time(31 * 60),
    "suspend_set": _event_spec({"spec.suspend": True}),
    "suspend_cleared": _event_spec({"spec.suspend": False}),
    "resume_without_data": _event_spec({"spec.suspend": False}, SYNCING),
    "mount_missing": _event_mount(None),
    "mount_not_ready": _event_mount("Syncing"),
    "mount_failed": _event_mount("Failed"),
    "mount_ready": _event_mount("Ready"),
    "deleting": _event_deleting,
    "ttl": _event_time(601),
    "foreign": _event_foreign,
}


@dataclass(frozen=True)
class Expect:
    phase: str
    reason: str
    created: frozenset[int] = frozenset()
    deleted: frozenset[int] = frozenset()
    restarts: int = 0
    attempt: int = 0
    events: tuple[str, ...] = ()
    release: bool | None = None  # release_finalizer, only for a job being deleted
    delete_job: bool = False


def E(  # noqa: N802 - a table row reads better short
    phase: str,
    reason: str,
    *,
    created: Iterable[int] = (),
    deleted: Iterable[int] = (),
    restarts: int = 0,
    attempt: int = 0,
    events: Sequence[str] = (),
    release: bool | None = None,
    delete_job: bool = False,
) -> Expect:
    return Expect(
        phase, reason, frozenset(created), frozenset(deleted), restarts, attempt, tuple(events), release, delete_job
    )


def _terminal_rows(phase: str, reason: str) -> list[tuple[str, str, Expect]]:
    """Succeeded and Failed stay what they are whatever happens; only unfinished pods get deleted."""
    rows = {event: E(phase, reason) for event in EVENTS}
    rows.update(
        {
            "all_running": E(phase, reason, deleted=(0, 1, 2)),
            "min_running": E(phase, reason, deleted=(0, 1, 2)),
            "below_min": E(phase, reason, deleted=(0, 1, 2)),
            "deadline": E(phase, reason, delete_job=True),  # 2h later: the 10m TTL has run out as well
            "pending_timeout": E(phase, reason, delete_job=True),
            "ttl": E(phase, reason, delete_job=True),
            "deleting": E(phase, reason, release=True),
        }
    )
    return [(phase, event, expect) for event, expect in rows.items()]


ALL = (0, 1, 2)
RESTARTED = ("WorkerRestarted",)
DISRUPTED = ("WorkerDisrupted",)
LOST = ("WorkerLost",)
TABLE: list[tuple[str, str, Expect]] = [
    # WaitingForData: nothing runs until every mount is Ready; time spent here counts for nothing.
    ("WaitingForData", "mount_missing", E("WaitingForData", "DataNotReady")),
    ("WaitingForData", "mount_not_ready", E("WaitingForData", "DataNotReady")),
    # A Failed mount fails the job (docs/operator.md): waiting would never end.
    ("WaitingForData", "mount_failed", E("Failed", "DataMountFailed", events=["DataMountFailed"])),
    ("WaitingForData", "mount_ready", E("Pending", "WorkersPending", created=ALL, events=["WorkersPending"])),
    ("WaitingForData", "suspend_set", E("Suspended", "Suspended", events=["Suspended"])),
    ("WaitingForData", "deadline", E("WaitingForData", "DataNotReady")),
    ("WaitingForData", "pending_timeout", E("WaitingForData", "DataNotReady")),
    ("WaitingForData", "deleting", E("WaitingForData", "DataNotReady", release=True)),
    ("WaitingForData", "ttl", E("WaitingForData", "DataNotReady")),
    # Pending
    ("Pending", "all_running", E("Running", "AllWorkersRunning", events=["AllWorkersRunning"])),
    ("Pending", "min_running", E("Running", "ElasticMinimumRunning", events=["ElasticMinimumRunning"])),
    ("Pending", "below_min", E("Pending", "Unschedulable")),
    # Workers that vanish (node loss, someone's kubectl delete) are replaced in a new attempt, uncounted.
    ("Pending", "lost_two", E("Pending", "Unschedulable", created=[1, 2], attempt=1, events=LOST)),
    ("Pending", "fail_never", E("Failed", "WorkerFailed", deleted=[0, 2], events=["WorkerFailed"])),
    (
        "Pending",
        "fail_on_failure",
        E(
            "Restarting",
            "NodesBelowMinimum",
            deleted=[1],
            restarts=1,
            attempt=1,
            events=[*RESTARTED, "NodesBelowMinimum"],
        ),
    ),
    (
        "Pending",
        "fail_exit_retryable",
        E(
            "Restarting",
            "NodesBelowMinimum",
            deleted=[1],
            restarts=1,
            attempt=1,
            events=[*RESTARTED, "NodesBelowMinimum"],
        ),
    ),
    ("Pending", "fail_exit_permanent", E("Failed", "WorkerFailed", deleted=[0, 2], events=["WorkerFailed"])),
    (
        "Pending",
        "evicted",
        E("Restarting", "NodesBelowMinimum", deleted=[1], attempt=1, events=[*DISRUPTED, "NodesBelowMinimum"]),
    ),
    (
        "Pending",
        "disrupted",
        E("Restarting", "NodesBelowMinimum", deleted=[1], attempt=1, events=[*DISRUPTED, "NodesBelowMinimum"]),
    ),
    ("Pending", "worker0_succeeded", E("Succeeded", "Completed", deleted=[1, 2], events=["Completed"])),
    ("Pending", "deadline", E("Failed", "DeadlineExceeded", deleted=ALL, events=["DeadlineExceeded"])),
    ("Pending", "pending_timeout", E("Failed", "PendingTimeout", deleted=ALL, events=["PendingTimeout"])),
    ("Pending", "suspend_set", E("Suspended", "Suspended", deleted=ALL, events=["Suspended"])),
    ("Pending", "deleting", E("Pending", "Unschedulable", deleted=ALL, release=False)),
    ("Pending", "ttl", E("Pending", "Unschedulable")),
    ("Pending", "foreign", E("Failed", "ForeignObject", deleted=ALL, events=["ForeignObject"])),
    # Running
    ("Running", "all_running", E("Running", "AllWorkersRunning")),
    ("Running", "min_running", E("Running", "ElasticMinimumRunning")),
    ("Running", "below_min", E("Restarting", "NodesBelowMinimum", events=["NodesBelowMinimum"])),
    ("Running", "lost_one", E("Running", "ElasticMinimumRunning", created=[2], attempt=1, events=LOST)),
    (
        "Running",
        "lost_two",
        E("Restarting", "NodesBelowMinimum", created=[1, 2], attempt=1, events=[*LOST, "NodesBelowMinimum"]),
    ),
    ("Running", "fail_never", E("Failed", "WorkerFailed", deleted=[0, 2], events=["WorkerFailed"])),
    (
        "Running",
        "fail_on_failure",
        E("Running", "ElasticMinimumRunning", deleted=[1], restarts=1, attempt=1, events=RESTARTED),
    ),
    (
        "Running",
        "fail_exit_retryable",
        E("Running", "ElasticMinimumRunning", deleted=[1], restarts=1, attempt=1, events=RESTARTED),
    ),
    ("Running", "fail_exit_permanent", E("Failed", "WorkerFailed", deleted=[0, 2], events=["WorkerFailed"])),
    ("Running", "evicted", E("Running", "ElasticMinimumRunning", deleted=[1], attempt=1, events=DISRUPTED)),
    ("Running", "disrupted", E("Running", "ElasticMinimumRunning", deleted=[1], attempt=1, events=DISRUPTED)),
    ("Running", "worker0_succeeded", E("Succeeded", "Completed", deleted=[1, 2], events=["Completed"])),
    ("Running", "deadline", E("Failed", "DeadlineExceeded", deleted=ALL, events=["DeadlineExceeded"])),
    ("Running", "pending_timeout", E("Running", "AllWorkersRunning")),
    ("Running", "suspend_set", E("Suspended", "Suspended", deleted=ALL, events=["Suspended"])),
    ("Running", "mount_not_ready", E("Running", "AllWorkersRunning")),
    ("Running", "mount_missing", E("Running", "AllWorkersRunning")),
    ("Running", "deleting", E("Running", "AllWorkersRunning", deleted=ALL, release=False)),
    ("Running", "ttl", E("Running", "AllWorkersRunning")),
    ("Running", "foreign", E("Failed", "ForeignObject", deleted=ALL, events=["ForeignObject"])),
    # Restarting: worker 0 runs, 1 and 2 were recreated and wait for nodes.
    ("Restarting", "all_running", E("Running", "AllWorkersRunning", events=["AllWorkersRunning"])),
    ("Restarting", "min_running", E("Running", "ElasticMinimumRunning", events=["ElasticMinimumRunning"])),
    ("Restarting", "below_min", E("Restarting", "NodesBelowMinimum")),
    ("Restarting", "lost_two", E("Restarting", "NodesBelowMinimum", created=[1, 2], attempt=1, events=LOST)),
    ("Restarting", "fail_never", E("Failed", "WorkerFailed", deleted=[0, 2], events=["WorkerFailed"])),
    (
        "Restarting",
        "fail_on_failure",
        E("Restarting", "NodesBelowMinimum", deleted=[1], restarts=1, attempt=1, events=RESTARTED),
    ),
    (
        "Restarting",
        "fail_exit_retryable",
        E("Restarting", "NodesBelowMinimum", deleted=[1], restarts=1, attempt=1, events=RESTARTED),
    ),
    ("Restarting", "fail_exit_permanent", E("Failed", "WorkerFailed", deleted=[0, 2], events=["WorkerFailed"])),
    ("Restarting", "evicted", E("Restarting", "NodesBelowMinimum", deleted=[1], attempt=1, events=DISRUPTED)),
    ("Restarting", "disrupted", E("Restarting", "NodesBelowMinimum", deleted=[1], attempt=1, events=DISRUPTED)),
    ("Restarting", "worker0_succeeded", E("Succeeded", "Completed", deleted=[1, 2], events=["Completed"])),
    ("Restarting", "deadline", E("Failed", "DeadlineExceeded", deleted=ALL, events=["DeadlineExceeded"])),
    ("Restarting", "pending_timeout", E("Failed", "PendingTimeout", deleted=ALL, events=["PendingTimeout"])),
    ("Restarting", "suspend_set", E("Suspended", "Suspended", deleted=ALL, events=["Suspended"])),
    ("Restarting", "deleting", E("Restarting", "NodesBelowMinimum", deleted=ALL, release=False)),
    ("Restarting", "ttl", E("Restarting", "NodesBelowMinimum")),
    ("Restarting", "foreign", E("Failed", "ForeignObject", deleted=ALL, events=["ForeignObject"])),
    # Suspended: no workers; strays are deleted, failures of strays count for nothing.
    ("Suspended", "suspend_cleared", E("Pending", "WorkersPending", created=ALL, events=["WorkersPending"])),
    ("Suspended", "resume_without_data", E("WaitingForData", "DataNotReady", events=["DataNotReady"])),
    ("Suspended", "suspend_set", E("Suspended", "Suspended")),
    ("Suspended", "all_running", E("Suspended", "Suspended", deleted=ALL)),
    ("Suspended", "fail_on_failure", E("Suspended", "Suspended")),
    ("Suspended", "fail_never", E("Suspended", "Suspended")),
    ("Suspended", "evicted", E("Suspended", "Suspended")),
    ("Suspended", "worker0_succeeded", E("Suspended", "Suspended")),
    ("Suspended", "deadline", E("Suspended", "Suspended")),
    ("Suspended", "pending_timeout", E("Suspended", "Suspended")),
    ("Suspended", "mount_not_ready", E("Suspended", "Suspended")),
    ("Suspended", "deleting", E("Suspended", "Suspended", release=True)),
    ("Suspended", "ttl", E("Suspended", "Suspended")),
    # Terminal phases stay terminal.
    *_terminal_rows("Succeeded", "Completed"),
    *_terminal_rows("Failed", "DeadlineExceeded"),
]
TABLE_PARAMS = [pytest.param(phase, event, expect, id=f"{phase}-{event}") for phase, event, expect in TABLE]
