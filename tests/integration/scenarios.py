"""The operator's scenarios against the in-memory API server (tests/integration/emulator.py): the real
operator (dgx_operator.runtime.handlers, kopf) runs in the test's event loop, and the test plays everyone else:
the user (jobs created, edited, deleted), the scheduler and the kubelet (pod status patches), the node
that dies. Shared by the integration tests (test_operator.py, test_resilience.py, test_datamounts.py,
test_metrics.py...), the chart's RBAC test and the Argo CD health checks.

Time never passes for real: the operator's controller reads a :class:`Clock` the test moves, and a
reconcile that a timer would have started is asked for explicitly (:meth:`Operator.trigger`). Waits are
conditions re-checked on every change the emulator sees (``emulator.wait_for``), never sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf

from dgx_operator.controllers.job import Controller
from dgx_operator.reconcile.planner import Plan
from dgx_operator.reconcile.pods import PodView
from dgx_operator.runtime.settings import OperatorConfig
from tests.conftest import BASE_JOB, with_changes
from tests.integration.conftest import OperatorRun, RunOperator
from tests.integration.emulator import Emulator

Body = dict[str, Any]
NS = "ml"
JOB = "job"
JOBS = "dgxtrainingjobs"
MOUNTS = "dgxdatamounts"
# The documented names (docs/operator.md), spelled out rather than imported: renaming one is a visible change.
JOB_LABEL = "kubedgx.io/job-name"
ATTEMPT = "kubedgx.io/attempt"
FINALIZER = "kubedgx.io/finalizer"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PROGRESS = "kubedgx.io/progress"
IMAGE_ID = "registry.example/kubedgx/trainer@sha256:" + "0" * 64


def worker(index: int, job: str = JOB) -> str:
    return f"{job}-worker-{index}"


# --------------------------------------------------------------------------------------------
# The operator under test, with a clock the test moves
# --------------------------------------------------------------------------------------------


@dataclass
class Clock:
    """The controller's ``now``: moves only when the test says so."""

    now: datetime = field(default_factory=lambda: datetime.now(UTC).replace(microsecond=0))

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> datetime:
        self.now += delta
        return self.now


def stamp(moment: datetime) -> str:
    """A timestamp as the operator writes it into the status."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Operator:
    """A running operator: its kopf run, its memo (``memo.controller``), the test's clock."""

    emulator: Emulator
    run: OperatorRun
    memo: kopf.Memo
    clock: Clock
    #: The context of the latest finished reconcile: kopf's context variables (its event queue and settings),
    #: without which the controller's ``kopf.event`` calls fail.
    context: contextvars.Context | None = None
    reconciles: int = 0

    @property
    def controller(self) -> Controller:
        controller: Controller = self.memo.controller
        return controller

    async def _reconciled(self, key: tuple[str, str], plan: Plan | None) -> None:
        self.context = contextvars.copy_context()
        self.reconciles += 1
        self.emulator.notify()  # a finished reconcile may be what a wait_for is waiting for

    async def trigger(self, name: str = JOB) -> None:
        """Ask for a reconcile of the job, as the operator's own deadline timer does.

        It runs in kopf's context (that of a finished reconcile): ``Controller.trigger`` called from the test's
        own task would start a reconcile whose events (kopf.event) fail for want of kopf's context variables.
        """
        context = await self.emulator.wait_for(lambda: self.context, message="a first reconcile is over")
        context.run(self.controller.trigger, NS, name)
        task = self.controller.workers.get((NS, name))
        if task is not None:
            task.add_done_callback(lambda _: self.emulator.notify())

    def cache_is_current(self, name: str = JOB) -> bool:
        """The operator's view of the job's pods (kopf's index, as the planner reads it) is what the API
        server holds."""
        cached = set(self.controller.pods_of(NS, name))
        stored = {PodView.of(p) for p in self.emulator.select("pods", NS, labels={JOB_LABEL: name})}
        return cached == stored

    async def settle(self, name: str = JOB, *, timeout: float = 5.0) -> None:
        """Once the operator has seen the pods as they are, reconcile and wait until that pass (and every pass
        coalesced with it) is over, with no failed pass waiting for its retry.

        kopf updates its index before it runs the pod-event handler, whose trigger wakes the wait up (see
        :func:`start_operator`): so the first wait needs no polling."""
        key = (NS, name)
        controller = self.controller
        await self.emulator.wait_for(
            lambda: self.cache_is_current(name), timeout=timeout, message=f"the operator sees the pods of {name}"
        )
        await self.trigger(name)

        def idle() -> bool:
            task = controller.workers.get(key)
            if task is not None and not task.done():
                # Its end is itself a change to wait for: without this, a pass that ends between two
                # of the emulator's notifications (a mount retrying in the background keeps making
                # them) is only seen as over if a later change happens to land in a quiet moment.
                task.add_done_callback(lambda _: self.emulator.notify())
            return key not in controller.dirty and (task is None or task.done()) and key not in controller.failures

        await self.emulator.wait_for(idle, timeout=timeout, message=f"the reconciles of {key} are over")

    @contextlib.asynccontextmanager
    async def paused(self, name: str = JOB) -> AsyncIterator[None]:
        """Hold the job's reconcile lock: what happens meanwhile is seen by one pass, once it is released (so
        that, e.g., three workers lost at once are one loss, as when the operator was busy)."""
        lock = self.controller.locks.setdefault((NS, name), asyncio.Lock())
        async with lock:
            yield

    async def stop(self) -> None:
        await self.run.stop()


def operator_config(status_interval: float = 0.0) -> OperatorConfig:
    return OperatorConfig(error_backoffs=(0.1, 0.2, 0.5, 1.0), retry_base=0.1, status_interval=status_interval)


async def start_operator(
    emulator: Emulator, run_operator: RunOperator, clock: Clock | None = None, *, status_interval: float = 0.0
) -> Operator:
    """Run dgx_operator.runtime.handlers until the test ends, with short backoffs and the test's clock.

    ``status_interval`` 0 by default: these tests follow a job one worker at a time and look at every
    count as it changes; the coalescing of those writes is test_status_writes.py's (and the planner's)."""
    memo = kopf.Memo(config=operator_config(status_interval))
    run = await run_operator("dgx_operator.runtime.handlers", wait_for=(JOBS, "pods"), memo=memo)
    # A restarted operator: the stopped one's watches may still count as open for a moment, so the
    # wait above can end before this one's startup handler has made its controller. Its own list
    # and watch requests come after that handler, and each request re-checks this.
    await emulator.wait_for(lambda: memo.get("controller"), timeout=10, message="the operator's startup handler ran")
    op = Operator(emulator, run, memo, clock or Clock())
    controller = op.controller
    controller.now = op.clock
    controller.on_reconciled = op._reconciled
    trigger = controller.trigger

    def triggered(namespace: str, name: str) -> None:
        """kopf has indexed an event and handed it over: conditions on the operator's caches are re-checked."""
        trigger(namespace, name)
        emulator.notify()

    controller.trigger = triggered  # type: ignore[method-assign]
    return op


# --------------------------------------------------------------------------------------------
# The test as scheduler and kubelet
# --------------------------------------------------------------------------------------------


def _container(emulator: Emulator, pod: str, state: Body, *, ready: bool) -> list[Body]:
    """containerStatuses as a kubelet reports them (the client library refuses pods without image, imageID...)."""
    stored = emulator.get("pods", NS, pod)
    assert stored is not None, f"pod {pod} does not exist"
    image = stored["spec"]["containers"][0]["image"]
    status = {"name": "trainer", "image": image, "imageID": IMAGE_ID, "ready": ready, "restartCount": 0}
    return [{**status, "started": ready, "state": state}]


def _scheduled(ready: bool) -> Body:
    conditions = [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Initialized", "status": "True"},
        {"type": "ContainersReady", "status": "True" if ready else "False"},
        {"type": "Ready", "status": "True" if ready else "False"},
    ]
    return {"hostIP": "10.0.0.1", "podIP": "10.1.0.1", "conditions": conditions}


def run_pod(emulator: Emulator, pod: str) -> None:
    """Scheduled, pulled, the trainer container running."""
    state = {"running": {"startedAt": "2025-01-01T00:00:00Z"}}
    emulator.patch_status(
        "pods",
        NS,
        pod,
        {"phase": "Running", **_scheduled(True), "containerStatuses": _container(emulator, pod, state, ready=True)},
    )


def run_pods(emulator: Emulator, *pods: str) -> None:
    for pod in pods:
        run_pod(emulator, pod)


def _terminated(code: int, reason: str | None, message: str) -> Body:
    return {
        "exitCode": code,
        "reason": reason or ("Completed" if code == 0 else "Error"),
        "startedAt": "2025-01-01T00:00:00Z",
        "finishedAt": "2025-01-01T01:00:00Z",
        **({"message": message} if message else {}),
    }


def exit_container(emulator: Emulator, pod: str, code: int, *, message: str = "") -> None:
    """The first of a real kubelet's two writes when a container exits: the container terminated and
    the pod not Ready, the phase left as it was (the second write, :func:`exit_pod`, comes about a
    second later, or once native sidecars have finished)."""
    state = {"terminated": _terminated(code, None, message)}
    emulator.patch_status(
        "pods", NS, pod, {**_scheduled(False), "containerStatuses": _container(emulator, pod, state, ready=False)}
    )


def exit_pod(emulator: Emulator, pod: str, code: int, *, reason: str | None = None, message: str = "") -> None:
    """The trainer container exited with ``code``; the pod (restartPolicy Never) ends with it."""
    state = {"terminated": _terminated(code, reason, message)}
    emulator.patch_status(
        "pods",
        NS,
        pod,
        {
            "phase": "Succeeded" if code == 0 else "Failed",
            **_scheduled(False),
            "containerStatuses": _container(emulator, pod, state, ready=False),
        },
    )


# --------------------------------------------------------------------------------------------
# Reading the outcome
# --------------------------------------------------------------------------------------------


def get_job(emulator: Emulator, name: str = JOB) -> Body:
    job = emulator.get(JOBS, NS, name)
    assert job is not None, f"job {name} does not exist"
    return job


def pod_set(emulator: Emulator) -> dict[str, str | None]:
    """Every pod in the namespace: name -> its kubedgx.io/attempt label."""
    return {
        p["metadata"]["name"]: (p["metadata"].get("labels") or {}).get(ATTEMPT) for p in emulator.select("pods", NS)
    }


def live_pods(emulator: Emulator) -> dict[str, str | None]:
    """The pods not being deleted."""
    return {
        p["metadata"]["name"]: (p["metadata"].get("labels") or {}).get(ATTEMPT)
        for p in emulator.select("pods", NS)
        if not p["metadata"].get("deletionTimestamp")
    }


def conditions(status: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """type -> (status, reason)."""
    return {c["type"]: (c["status"], c["reason"]) for c in status.get("conditions", [])}


def condition(status: Mapping[str, Any], type_: str) -> Body:
    found = next((c for c in status.get("conditions", []) if c["type"] == type_), None)
    assert found is not None, f"no {type_} condition in {status}"
    return dict(found)


def counts(status: Mapping[str, Any]) -> tuple[Any, ...]:
    """(phase, restarts, attempt, nodes, workers) in one comparable tuple."""
    workers = status.get("workers") or {}
    return (
        status.get("phase"),
        status.get("restarts"),
        status.get("attempt"),
        status.get("nodes"),
        tuple(workers.get(k) for k in ("desired", "active", "ready", "failed")),
    )


def job_events(emulator: Emulator, name: str = JOB) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events posted for the job, oldest first."""
    job = emulator.get(JOBS, NS, name)
    events = [
        e
        for e in emulator.select("events", NS)
        if e.get("involvedObject", {}).get("kind") == "DGXTrainingJob"
        and e["involvedObject"].get("name") == name
        and (job is None or e["involvedObject"].get("uid") == job["metadata"]["uid"])
    ]
    events.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [(e["type"], e["reason"], e.get("message", "")) for e in events]


def event_reasons(emulator: Emulator, name: str = JOB) -> list[tuple[str, str]]:
    return [(t, r) for t, r, _ in job_events(emulator, name)]


async def wait_phase(
    emulator: Emulator,
    phase: str,
    check: Callable[[Body], bool] = lambda _: True,
    *,
    name: str = JOB,
    timeout: float = 5.0,
) -> Body:
    """The job's status once it has this phase (and passes ``check``)."""

    def reached(job: Body) -> bool:
        status = job.get("status") or {}
        return bool(status.get("phase") == phase and check(status))

    job = await emulator.wait_for_object(JOBS, NS, name, reached, timeout=timeout)
    status: Body = job["status"]
    return status


def nodes(ready_of_desired: str) -> Callable[[Body], bool]:
    """A status check: status.nodes (ready/desired workers) is this."""
    return lambda status: status.get("nodes") == ready_of_desired


async def expect_events(emulator: Emulator, expected: list[tuple[str, str]], *, name: str = JOB) -> None:
    """The job's events, (type, reason) oldest first, are exactly these (posting is asynchronous: wait for as
    many, then compare)."""
    await emulator.wait_for(
        lambda: len(job_events(emulator, name)) >= len(expected),
        message=lambda: f"{len(expected)} events for {name}; now {event_reasons(emulator, name)}",
    )
    assert event_reasons(emulator, name) == expected


async def expect_pods(emulator: Emulator, expected: Mapping[str, str | None], *, timeout: float = 5.0) -> None:
    """The pods in the namespace come to be exactly these (name -> attempt label)."""
    await emulator.wait_for(
        lambda: pod_set(emulator) == expected,
        timeout=timeout,
        message=lambda: f"pods {dict(expected)}; now {pod_set(emulator)}",
    )


async def final_pods(op: Operator, expected: Mapping[str, str | None]) -> None:
    """The pods converge to ``expected`` and stay so after one more reconcile."""
    await expect_pods(op.emulator, expected)
    await op.settle()
    assert pod_set(op.emulator) == expected


def job_with(changes: Mapping[str, Any]) -> Body:
    return with_changes(BASE_JOB, dict(changes))


def two_workers(**changes: Any) -> Body:
    return job_with({"spec.elastic.minNodes": 2, **changes})


# --------------------------------------------------------------------------------------------
# Issue 13: a worker on a lost node; a trainer edit while suspended
# --------------------------------------------------------------------------------------------


async def lose_a_worker_then_edit_the_trainer(op: Operator, name: str = "lost") -> None:
    """The taint manager marks a running worker DisruptionTarget and deletes it; its kubelet (lost
    with the node) never confirms, so the pod stays Terminating. The operator lets it go (relabels
    it) and replaces it under a free name. Then the job is suspended, its trainer config edited and
    resumed: the new worker mounts a new ConfigMap, and the superseded one is deleted.

    Also the RBAC test's scenario for the pods patch and configmaps delete verbs (tests/chart)."""
    emulator = op.emulator
    emulator.create(JOBS, with_changes(BASE_JOB, {"metadata.name": name}))
    await emulator.wait_for_object("pods", NS, worker(0, name))
    run_pod(emulator, worker(0, name))
    await wait_phase(emulator, "Running", name=name)
    before = config_of(emulator, worker(0, name))
    held = emulator.hold_pod_deletion
    emulator.hold_pod_deletion = True
    try:
        pod = emulator.get("pods", NS, worker(0, name))
        assert pod is not None
        marked = [*pod["status"].get("conditions", []), {"type": "DisruptionTarget", "status": "True",
                  "reason": "DeletionByTaintManager"}]  # fmt: skip
        emulator.patch_status("pods", NS, worker(0, name), {"conditions": marked})
        emulator.delete("pods", NS, worker(0, name))
        await emulator.wait_for(
            lambda: (
                ((emulator.get("pods", NS, worker(0, name)) or {}).get("metadata", {}).get("labels", {})).get(JOB_LABEL)
                == f"{name}.detached"
            ),
            message="the stuck worker let go of",
        )
        await emulator.wait_for_object("pods", NS, f"{worker(0, name)}-1")
    finally:
        emulator.hold_pod_deletion = held
    replacement = emulator.get("pods", NS, f"{worker(0, name)}-1")
    assert replacement is not None
    assert replacement["spec"]["hostname"] == worker(0, name)
    job = emulator.get(JOBS, NS, name)
    assert job is not None
    assert job["status"].get("restarts", 0) == 0

    emulator.patch(JOBS, NS, name, {"spec": {"suspend": True}})
    await wait_phase(emulator, "Suspended", name=name)
    await emulator.wait_for(lambda: not emulator.select("pods", NS, labels={JOB_LABEL: name}), message="no workers")
    emulator.patch(JOBS, NS, name, {"spec": {"suspend": False, "trainer": {"training": {"learningRate": 0.5}}}})
    resumed = await emulator.wait_for(
        lambda: next(iter(emulator.select("pods", NS, labels={JOB_LABEL: name})), None),
        message="a resumed worker",
    )
    after = config_of(emulator, resumed["metadata"]["name"])
    assert after != before
    config = emulator.get("configmaps", NS, after)
    assert config is not None
    assert "learningRate: 0.5" in config["data"]["trainer.yaml"]
    await emulator.wait_for_absence("configmaps", NS, before)


def config_of(emulator: Emulator, pod: str) -> str:
    body = emulator.get("pods", NS, pod)
    assert body is not None
    (name,) = [v["configMap"]["name"] for v in body["spec"]["volumes"] if v["name"] == "trainer-config"]
    return str(name)
