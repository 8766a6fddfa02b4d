"""The planner driven by hand, for the unit tests of reconcile/planner/ (test_planner*.py,
test_queueing.py, test_pods_datasync.py, test_metrics.py): jobs and their worker pods as the builders
make them with a hand-written status (what kubelet and scheduler would report), and :class:`Sim`, a
job taken through the planner one observation at a time on an explicit, timezone-aware clock, every
step checked for stability (planning again over the same observations changes nothing).

The ``ctx`` fixture (a BuildContext with the mounts ``data`` and ``out``) is in conftest.py.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from dgx_operator.api import DGXDataMountSpec, DGXTrainingJob
from dgx_operator.api.trainingjob import DGXTrainingJobStatus, WorkerCounts
from dgx_operator.catalog import Catalog
from dgx_operator.reconcile.planner import MountState, Observed, Plan, plan
from dgx_operator.reconcile.pods import PodView
from dgx_operator.render import BuildContext, JobIdentity, resolve, worker_pod
from dgx_operator.validation.limits import Effective
from tests.conftest import BASE_JOB, BASE_MOUNT, with_changes

UID = "8a1f3c52-6b0e-4d7a-9c21-5e4f3a2b1c0d"
OLD_UID = "11111111-2222-4333-8444-555555555555"
T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
ATTEMPT = "kubedgx.io/attempt"
INDEX = "kubedgx.io/replica-index"
DATA_REF = [{"name": "data", "mountPath": "/data"}]
READY = {"data": MountState("Ready")}
SYNCING = {"data": MountState("Syncing")}

#: The condition whose reason explains each phase (and the status it must have).
PHASE_CONDITION: dict[str, tuple[str, str]] = {
    "Pending": ("Running", "False"),
    "WaitingForData": ("Running", "False"),
    "Running": ("Running", "True"),
    "Restarting": ("Restarting", "True"),
    "Suspended": ("Suspended", "True"),
    "Succeeded": ("Succeeded", "True"),
    "Failed": ("Failed", "True"),
}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def make_job(
    changes: Mapping[str, Any] | None = None,
    *,
    generation: int = 1,
    status: DGXTrainingJobStatus | None = None,
) -> DGXTrainingJob:
    raw = with_changes(BASE_JOB, {"metadata.uid": UID, "metadata.generation": generation, **(changes or {})})
    job = DGXTrainingJob.model_validate(raw)
    return job if status is None else job.model_copy(update={"status": status})


def respec(job: DGXTrainingJob, changes: Mapping[str, Any], *, bump: bool = True) -> DGXTrainingJob:
    """``job`` with dotted-path changes to its manifest, the status kept and (by default) generation bumped."""
    raw = job.model_dump(by_alias=True, exclude_none=True, mode="json", exclude={"status"})
    generation = (job.metadata.generation or 0) + (1 if bump else 0)
    new = DGXTrainingJob.model_validate(with_changes(raw, {"metadata.generation": generation, **changes}))
    return new.model_copy(update={"status": job.status})


def step(job: DGXTrainingJob, result: Plan) -> DGXTrainingJob:
    """What the operator's status patch leaves behind."""
    return job.model_copy(update={"status": result.status})


def make_ctx(catalog: Catalog) -> BuildContext:
    mounts = {
        "data": DGXDataMountSpec.model_validate(BASE_MOUNT["spec"]),
        "out": DGXDataMountSpec.model_validate({**BASE_MOUNT["spec"], "direction": "Out"}),
    }
    return BuildContext(catalog, data_mounts=mounts)


def _terminated(code: int, reason: str, message: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "exitCode": code,
        "reason": reason,
        "startedAt": "2025-03-01T12:00:00Z",
        "finishedAt": "2025-03-01T12:00:00Z",  # T0: before any restart a test decides
    }
    if message is not None:
        out["message"] = message
    return out


def _container(state: dict[str, Any], ready: bool = False) -> list[dict[str, Any]]:
    return [{"name": "trainer", "ready": ready, "restartCount": 0, "image": "trainer", "state": state}]


SCHEDULED = {"type": "PodScheduled", "status": "True"}


def pod_status(state: str, index: int, exit_code: int | None, message: str | None) -> dict[str, Any]:
    """status of a worker pod in ``state``, as kubelet and scheduler write it."""
    host = f"10.0.0.{10 + index}"
    if state == "unscheduled":
        return {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
                }
            ],
        }
    if state == "scheduled":
        return {
            "phase": "Pending",
            "hostIP": host,
            "conditions": [SCHEDULED],
            "containerStatuses": _container({"waiting": {"reason": "ContainerCreating"}}),
        }
    if state == "running":
        return {
            "phase": "Running",
            "hostIP": host,
            "podIP": f"10.1.0.{10 + index}",
            "conditions": [SCHEDULED, {"type": "Ready", "status": "True"}],
            "containerStatuses": _container({"running": {"startedAt": "2025-03-01T12:00:00Z"}}, ready=True),
        }
    if state == "succeeded":
        return {
            "phase": "Succeeded",
            "hostIP": host,
            "conditions": [SCHEDULED],
            "containerStatuses": _container({"terminated": _terminated(0, "Completed", message)}),
        }
    if state == "failed":
        code = 1 if exit_code is None else exit_code
        text = "RuntimeError: CUDA error: an illegal memory access" if message is None else message
        return {
            "phase": "Failed",
            "hostIP": host,
            "conditions": [SCHEDULED],
            "containerStatuses": _container({"terminated": _terminated(code, "Error", text)}),
        }
    if state == "evicted":
        return {
            "phase": "Failed",
            "reason": "Evicted",
            "message": "The node was low on resource: memory.",
            "hostIP": host,
            "conditions": [SCHEDULED],
            "containerStatuses": _container({"terminated": _terminated(137, "Error", None)}),
        }
    if state == "disruption":  # preempted / spot reclaim: only the DisruptionTarget condition says so
        return {
            "phase": "Failed",
            "hostIP": host,
            "conditions": [
                SCHEDULED,
                {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"},
            ],
            "containerStatuses": _container({"terminated": _terminated(143, "Error", None)}),
        }
    if state == "nostate":  # rejected before the container ever ran, without a reason
        return {"phase": "Failed", "message": "Pod was rejected", "conditions": [SCHEDULED]}
    if state == "outofgpu":
        return {
            "phase": "Failed",
            "reason": "OutOfnvidia.com/gpu",
            "message": "Node didn't have enough resource: nvidia.com/gpu",
        }
    if state == "unknown":  # the node stopped reporting; only the phase says so
        return {"phase": "Unknown", "message": "node kubelet stopped posting status"}
    if state == "sidecar":  # the pod runs (a sidecar does), the trainer container has exited
        return {
            "phase": "Running",
            "hostIP": host,
            "conditions": [SCHEDULED],
            "containerStatuses": [
                *_container({"terminated": _terminated(0, "Completed", None)}),
                {"name": "sync", "ready": True, "state": {"running": {"startedAt": "2025-03-01T12:00:00Z"}}},
            ],
        }
    if state == "exited":  # the trainer has exited, the kubelet has not written the pod's phase yet
        return {
            "phase": "Running",
            "hostIP": host,
            "conditions": [SCHEDULED, {"type": "Ready", "status": "False", "reason": "PodCompleted"}],
            "containerStatuses": _container(
                {"terminated": _terminated(exit_code or 0, "Completed" if not exit_code else "Error", message)}
            ),
        }
    if state == "deadline":
        return {
            "phase": "Failed",
            "reason": "DeadlineExceeded",
            "message": "Pod was active on the node longer than the specified deadline",
            "hostIP": host,
            "conditions": [SCHEDULED],
            "containerStatuses": _container({"terminated": _terminated(137, "Error", None)}),
        }
    raise AssertionError(f"no pod state {state!r}")


def make_pod(
    job: DGXTrainingJob,
    ctx: BuildContext,
    index: int,
    state: str,
    *,
    attempt: int | None = None,
    exit_code: int | None = None,
    message: str | None = None,
    terminating: bool | datetime = False,
    annotations: Mapping[str, str] | None = None,
    owner: Mapping[str, Any] | None = None,
    disruption_target: str | None = None,
    name: str | None = None,
    finished: datetime | None = None,
) -> dict[str, Any]:
    """A realistic worker pod of ``job``: the builders' output plus a status for ``state``.

    ``terminating``: True for a pod being deleted whose grace period ends long after every step of
    these tests (its kubelet is fine), or the deletionTimestamp (the end of the grace period)."""
    if attempt is None:
        attempt = job.status.attempt if job.status is not None else 0
    pod = worker_pod(JobIdentity.of(job), job.spec, index, resolve(job.spec, ctx.catalog), ctx, attempt=attempt)
    pod["metadata"]["uid"] = f"pod-{index}-{attempt}"
    pod["metadata"]["creationTimestamp"] = "2025-03-01T12:00:00Z"
    pod["metadata"]["annotations"].update(annotations or {})
    if owner is not None:
        pod["metadata"]["ownerReferences"] = [dict(owner)]
    if name is not None:
        pod["metadata"]["name"] = name
    if terminating:
        end = terminating if isinstance(terminating, datetime) else T0 + timedelta(days=1)
        pod["metadata"]["deletionTimestamp"] = end.strftime("%Y-%m-%dT%H:%M:%SZ")
        pod["metadata"]["deletionGracePeriodSeconds"] = 120
    pod["status"] = pod_status(state, index, exit_code, message)
    if finished is not None:
        for c in pod["status"].get("containerStatuses") or []:
            if "terminated" in c["state"]:
                c["state"]["terminated"]["finishedAt"] = finished.strftime("%Y-%m-%dT%H:%M:%SZ")
    if disruption_target is not None:
        pod["status"].setdefault("conditions", []).append(
            {"type": "DisruptionTarget", "status": "True", "reason": disruption_target}
        )
    return pod


def observe(
    pods: Iterable[Mapping[str, Any]] = (),
    *,
    mounts: Mapping[str, MountState] | None = None,
    foreign: Sequence[str] = (),
    shared: bool = True,
    progress: Mapping[str, Any] | None = None,
    progress_live: bool = False,
) -> Observed:
    return Observed(
        pods=[PodView.of(p) for p in pods],
        service=shared,
        config_map=shared,
        mounts=dict(mounts or {}),
        foreign=tuple(foreign),
        progress=progress,
        progress_live=progress_live,
    )


def created_pods(result: Plan) -> list[dict[str, Any]]:
    return [c for c in result.create if c["kind"] == "Pod"]


def created(result: Plan) -> list[int]:
    return [int(c["metadata"]["labels"][INDEX]) for c in created_pods(result)]


def attempt_of(pod: Mapping[str, Any]) -> int:
    return int(pod["metadata"]["labels"][ATTEMPT])


def deleted(result: Plan) -> list[int]:
    return [int(name.rsplit("-", 1)[1]) for name in result.delete]


def cond(status: DGXTrainingJobStatus, type_: str) -> tuple[str, str] | None:
    found = next((c for c in status.conditions if c.type == type_), None)
    return None if found is None else (found.status, found.reason)


def phase_reason(status: DGXTrainingJobStatus) -> str:
    """The reason on the condition that mirrors the phase; checks that condition's status too."""
    assert status.phase is not None
    type_, value = PHASE_CONDITION[status.phase]
    found = cond(status, type_)
    assert found is not None, f"no {type_} condition for phase {status.phase}"
    assert found[0] == value, f"{type_} is {found[0]} in phase {status.phase}"
    return found[1]


def event_reasons(result: Plan) -> list[str]:
    return [e.reason for e in result.events]


@dataclass
class Sim:
    """A job driven through the planner one observation at a time, with an explicit clock."""

    job: DGXTrainingJob
    ctx: BuildContext
    now: datetime = T0
    mounts: dict[str, MountState] = field(default_factory=dict)
    #: The plan of the latest step (None before the first).
    last: Plan | None = None
    #: The operator's status interval (0: every change written at once; see planner.coalesce).
    status_interval: float = 0.0
    #: When the status was last written, and how many times (a step whose plan changes it writes).
    written_at: datetime | None = None
    writes: int = 0
    #: Since when the steps have held back a change of the counts in flight (the controller's memory).
    held_since: datetime | None = None
    #: How often status.usage alone is written (the operator's KUBEDGX_USAGE_INTERVAL).
    usage_interval: float = 300.0

    def pod(self, index: int, state: str, **kw: Any) -> dict[str, Any]:
        return make_pod(self.job, self.ctx, index, state, **kw)

    def made(self, state: str = "unscheduled") -> list[dict[str, Any]]:
        """The workers the latest step created, as a later observation sees them: in ``state`` (by
        default pending, not scheduled yet) and of the attempt they were created with.

        Never added to observations implicitly: a step that leaves out a worker created earlier
        says that the worker was lost (the planner counts what it created as active)."""
        made = created_pods(self.last) if self.last is not None else []
        return [self.pod(int(p["metadata"]["labels"][INDEX]), state, attempt=attempt_of(p)) for p in made]

    def reconcile(
        self,
        pods: Iterable[Mapping[str, Any]] = (),
        *,
        at_s: float | None = None,
        foreign: Sequence[str] = (),
        shared: bool = True,
        progress: Mapping[str, Any] | None = None,
        progress_live: bool = False,
        limits: Effective | None = None,
    ) -> Plan:
        """Plan at ``T0 + at_s`` (time never goes backwards) and apply the status, as the operator would.
        ``limits``: the namespace's guard rails as observed (the planner reads them at the first pass only).

        Every step also checks the stability property (see :func:`assert_stable`).
        """
        if at_s is not None:
            when = at(at_s)
            assert when >= self.now, "the simulated clock only moves forwards"
            self.now = when
        observed = observe(
            pods, mounts=self.mounts, foreign=foreign, shared=shared, progress=progress, progress_live=progress_live
        )
        observed = dataclasses.replace(
            observed,
            status_written_at=self.written_at,
            status_interval=self.status_interval,
            status_held_since=self.held_since,
            usage_interval=self.usage_interval,
            limits=limits,
        )
        assert_stable(self.job, self.ctx, observed, self.now)
        result = plan(self.job, self.ctx, observed, self.now)
        if self.job.status is None or result.status != self.job.status:
            self.written_at, self.writes = self.now, self.writes + 1
        self.held_since = (self.held_since or self.now) if result.status_held else None
        self.job = step(self.job, result)
        self.last = result
        return result

    def respec(self, changes: Mapping[str, Any]) -> None:
        self.job = respec(self.job, changes)

    @property
    def status(self) -> DGXTrainingJobStatus:
        assert self.job.status is not None
        return self.job.status

    def phase(self) -> str | None:
        """A call, not an attribute, so that type checkers do not narrow it across steps."""
        return self.status.phase

    def workers(self) -> WorkerCounts:
        assert self.status.workers is not None
        return self.status.workers


def sim_of(ctx: BuildContext, changes: Mapping[str, Any] | None = None, **kw: Any) -> Sim:
    return Sim(make_job(changes, **kw), ctx)


def assert_stable(job: DGXTrainingJob, ctx: BuildContext, observed: Observed, now: datetime) -> None:
    """Planning again over the same observations, from the status just written, changes nothing.

    "The same observations" include what the first plan created and deleted, as the controller's expectations
    provide them before the watch caches do (the planner counts created workers as active, and a
    worker that was active and is not observed any more has been lost)."""
    first = plan(job, ctx, observed, now)
    made = [PodView.of(c) for c in first.create if c["kind"] == "Pod"]
    # Pods the first plan deleted show as being deleted, as the controller's expectations mark them.
    kept = [dataclasses.replace(p, terminating=True) if p.name in first.delete else p for p in observed.pods]
    seen = dataclasses.replace(
        observed,
        pods=(*kept, *made),
        service=observed.service or any(c["kind"] == "Service" for c in first.create),
        config_map=observed.config_map or any(c["kind"] == "ConfigMap" for c in first.create),
    )
    again = plan(step(job, first), ctx, seen, now)
    assert again.status.model_dump() == first.status.model_dump()
    assert again.create == []
    assert event_reasons(again) == []
    assert again.status.restarts == first.status.restarts
    assert again.status.attempt == first.status.attempt


def pods_of(sim: Sim, states: Mapping[int, str], **kw: Any) -> list[dict[str, Any]]:
    return [sim.pod(i, s, **kw) for i, s in states.items()]


def start_running(sim: Sim, workers: int, *, at_s: float = 60) -> list[dict[str, Any]]:
    """Create the job's workers and see them all run; returns the running pods."""
    first = sim.reconcile(at_s=max(0.0, (sim.now - T0).total_seconds()))
    assert created(first) == list(range(workers))
    running = pods_of(sim, dict.fromkeys(range(workers), "running"))
    sim.reconcile(running, at_s=at_s)
    assert sim.phase() == "Running"
    return running


def sim_with(ctx: BuildContext, *mounts: tuple[str, str], **changes: Any) -> Sim:
    """A job using ``mounts`` ((name, mountPath), in spec order), every one of them Ready."""
    refs = [{"name": name, "mountPath": path} for name, path in mounts]
    sim = Sim(make_job({"spec.dataMounts": refs, **{k.replace("__", "."): v for k, v in changes.items()}}), ctx)
    sim.mounts = {name: MountState("Ready") for name, _ in mounts}
    return sim


def uploaded(base: str, *names: str) -> dict[str, Any]:
    """A sidecar's report of an archive: its artifacts under ``base``."""
    uris = {"adapter": f"{base}/adapter/", "merged": f"{base}/merged/", "summary": f"{base}/summary.json"}
    uris["model.tar.gz"] = f"{base}/model.tar.gz"
    return {"checkpoints": [100, 200], "artifacts": [{"name": n, "uri": uris[n]} for n in names]}


def reporting(pod: dict[str, Any], *sidecars: tuple[str, int, Any]) -> dict[str, Any]:
    """``pod`` whose sidecars ended with (container, exit code, termination message)."""
    pod["status"]["initContainerStatuses"] = [
        {
            "name": name,
            "ready": False,
            "restartCount": 0,
            "state": {
                "terminated": {
                    "exitCode": code,
                    "reason": "Completed" if code == 0 else "Error",
                    "message": report if isinstance(report, str) else json.dumps(report),
                }
            },
        }
        for name, code, report in sidecars
    ]
    return pod


def waiting(sim: Sim, index: int, container: str, reason: str, message: str) -> dict[str, Any]:
    """Worker ``index`` scheduled, with ``container`` waiting for ``reason``."""
    pod = sim.pod(index, "scheduled")
    entry = {"name": container, "ready": False, "state": {"waiting": {"reason": reason, "message": message}}}
    if container == "trainer":
        pod["status"]["containerStatuses"] = [entry]
    else:
        pod["status"]["initContainerStatuses"] = [entry]
    return pod


def created_job(ctx: BuildContext, **changes: Any) -> Sim:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2, "maxNodes": 2}, **changes})
    assert created(sim.reconcile(at_s=0)) == [0, 1]
    return sim
