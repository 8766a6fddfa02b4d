"""The operator's Prometheus metrics (docs/operator.md, "Metrics"), at the level of the Metrics object
and of the controller that feeds it: the real planner and Controller over an in-memory cluster, so
"counted once per job" is checked against the status writes the controller really makes, including
a second operator that reads the finished job again. The HTTP endpoint and its two formats, the
webhook's counts and our naming rules are here too; promlint's verdict is tests/metrics/test_promlint.py.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import gzip
import importlib
import platform
import re
import sys
import types
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from importlib import metadata
from typing import Any

import aiohttp
import kopf
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry, Counter, enable_created_metrics, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

import dgx_operator.runtime.handlers  # into kopf's default registry, as the operator's other tests expect
from dgx_operator.api.trainingjob import DGXTrainingJobStatus
from dgx_operator.api.vocabulary import JOB, JobPhase, reasons_of
from dgx_operator.catalog import Catalog
from dgx_operator.controllers.job import Controller
from dgx_operator.controllers.metrics import (
    JOB_KIND,
    MOUNT_KIND,
    RESTART_REASONS,
    Metrics,
    never_ran,
    serve,
)
from dgx_operator.kube import TransientError
from dgx_operator.reconcile.pods import PERMANENT_WAITING, PodView
from dgx_operator.reconcile.status import merge_patch
from dgx_operator.render.names import INDEX_LABEL, JOB_LABEL
from dgx_operator.render.resolved import Defaults
from dgx_operator.webhook import admission
from tests.conftest import BASE_JOB, with_changes
from tests.unit.metrics_helpers import CREATED, populated, stamp, status_with
from tests.unit.planner_sim import T0, UID, pod_status

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples_of(metrics: Metrics) -> Samples:
    text = metrics.exposition().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(metrics: Metrics, name: str, **labels: str) -> float:
    """One sample's value; a missing series fails (every series of ours exists from the start)."""
    found = samples_of(metrics)
    key = (name, frozenset(labels.items()))
    assert key in found, f"no series {name}{labels}"
    return found[key]


def restarts(metrics: Metrics) -> dict[str, float]:
    return {reason: value(metrics, "kubedgx_worker_restarts_total", reason=reason) for reason in RESTART_REASONS}


def finished(metrics: Metrics) -> dict[tuple[str, str], float]:
    """The non-zero job outcome counts."""
    return {
        (dict(labels)["outcome"], dict(labels)["reason"]): v
        for (name, labels), v in samples_of(metrics).items()
        if name == "kubedgx_jobs_finished_total" and v
    }


def histogram(metrics: Metrics, name: str, **labels: str) -> tuple[float, float]:
    """(count, sum) of one histogram series."""
    return value(metrics, f"{name}_count", **labels), value(metrics, f"{name}_sum", **labels)


# -- an in-memory cluster for the real Controller -------------------------------------------------


@dataclass
class Cluster:
    """One job and its children as the apiserver and kopf's indexes would show them; the test plays
    the kubelet (``set_state``) and the clock."""

    job: dict[str, Any]
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    services: set[str] = field(default_factory=set)
    config_maps: dict[str, str | None] = field(default_factory=dict)
    now: datetime = T0
    #: Status writes to refuse (as a 503 would be), in order.
    refuse_status: int = 0
    events: list[tuple[str, str]] = field(default_factory=list)
    version: int = 1

    # The Kube methods the Controller calls.

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.job)

    async def set_finalizers(
        self, namespace: str, name: str, resource_version: str | None, finalizers: list[str]
    ) -> dict[str, Any]:
        self.job["metadata"]["finalizers"] = finalizers
        return self._bump()

    async def get_mount(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    async def pod_log_tail(
        self, namespace: str, name: str, container: str, *, lines: int, limit_bytes: int, timeout: float = 5.0
    ) -> str | None:
        return ""  # a trainer that has printed nothing yet

    async def create(self, obj: Mapping[str, Any], owner_uid: str) -> str:
        name = obj["metadata"]["name"]
        if obj["kind"] == "Pod":
            self.pods[name] = {**copy.deepcopy(dict(obj)), "status": {"phase": "Pending"}}
        elif obj["kind"] == "Service":
            self.services.add(name)
        elif obj["kind"] == "ConfigMap":
            self.config_maps[name] = owner_uid
        return "created"

    async def patch_pod_labels(self, namespace: str, name: str, labels: Mapping[str, str | None]) -> bool:
        return name in self.pods

    async def patch_job_status(
        self, namespace: str, name: str, resource_version: str | None, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        if self.refuse_status:
            self.refuse_status -= 1
            raise TransientError("patch status: HTTP 503")
        self.job["status"] = apply_patch(self.job.get("status") or {}, dict(status))
        return self._bump()

    async def delete_pod(self, namespace: str, name: str) -> bool:
        return self.pods.pop(name, None) is not None  # its kubelet is quick

    async def delete_config_map(self, namespace: str, name: str) -> bool:
        return self.config_maps.pop(name, None) is not None

    async def delete_job(self, namespace: str, name: str) -> None:
        raise AssertionError("no job here has a TTL")

    def _bump(self) -> dict[str, Any]:
        self.version += 1
        self.job["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.job)

    # The test's side: kubelet, clock, users.

    def worker(self, index: int) -> dict[str, Any]:
        (pod,) = [p for p in self.pods.values() if p["metadata"]["labels"][INDEX_LABEL] == str(index)]
        return pod

    def set_state(self, index: int, state: str, exit_code: int | None = None) -> None:
        self.worker(index)["status"] = pod_status(state, index, exit_code, None)

    def at(self, seconds: float) -> None:
        self.now = T0 + timedelta(seconds=seconds)

    def controller(self, catalog: Catalog, metrics: Metrics) -> Controller:
        def pods_of(namespace: str, job: str) -> list[PodView]:
            return [PodView.of(p) for p in self.pods.values() if p["metadata"]["labels"].get(JOB_LABEL) == job]

        def post_event(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
            self.events.append((reason, message))

        return Controller(
            kube=self,  # type: ignore[arg-type]
            catalog=catalog,
            defaults=Defaults(),
            pods_of=pods_of,
            has_service=lambda namespace, name: name in self.services,
            config_maps_of=lambda namespace, job: list(self.config_maps.items()),
            post_event=post_event,
            now=lambda: self.now,
            metrics=metrics,
        )

    @property
    def status(self) -> DGXTrainingJobStatus:
        return DGXTrainingJobStatus.model_validate(self.job["status"])


def apply_patch(doc: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386, as the apiserver applies the controller's status patches."""
    out = dict(doc)
    for key, new in patch.items():
        if new is None:
            out.pop(key, None)
        elif isinstance(new, dict) and isinstance(out.get(key), dict):
            out[key] = apply_patch(out[key], new)
        else:
            out[key] = new
    return out


def cluster_of(changes: Mapping[str, Any] | None = None) -> Cluster:
    job = with_changes(
        BASE_JOB,
        {
            "metadata.uid": UID,
            "metadata.generation": 1,
            "metadata.resourceVersion": "1",
            "metadata.creationTimestamp": stamp(CREATED),
            **(changes or {}),
        },
    )
    return Cluster(job)


@dataclass
class Run:
    """A cluster, the operator's Controller and its Metrics."""

    cluster: Cluster
    controller: Controller
    metrics: Metrics

    async def reconcile(self, at_s: float) -> str | None:
        self.cluster.at(at_s)
        result = await self.controller.reconcile("ml", "job")
        assert result is not None
        return result.status.phase


@pytest.fixture
def run(catalog: Catalog) -> Run:
    return run_of(catalog, {"spec.restartPolicy": "OnFailure", "spec.backoffLimit": 3})


def run_of(catalog: Catalog, changes: Mapping[str, Any]) -> Run:
    cluster = cluster_of(changes)
    metrics = Metrics()
    return Run(cluster, cluster.controller(catalog, metrics), metrics)


# -- job outcomes, time to Running and run time ----------------------------------------------------


@pytest.mark.asyncio
async def test_a_job_is_counted_once_as_it_runs_restarts_and_succeeds(run: Run, catalog: Catalog) -> None:
    c, m = run.cluster, run.metrics
    assert await run.reconcile(0) == "Pending"
    c.set_state(0, "running")
    assert await run.reconcile(30) == "Running"
    assert histogram(m, "kubedgx_job_time_to_running_seconds") == (1, 30.0)
    assert await run.reconcile(40) == "Running"  # a pass that changes nothing counts nothing

    c.set_state(0, "failed", exit_code=1)
    assert await run.reconcile(100) == "Restarting"
    assert restarts(m) == {
        "WorkerRestarted": 1,
        "WorkerDisrupted": 0,
        "WorkerReplaced": 0,
        "WorkerLost": 0,
        "Interrupted": 0,
    }
    assert c.status.restarts == 1
    await run.reconcile(101)  # the replacement is created
    c.set_state(0, "running")
    assert await run.reconcile(200) == "Running"
    # Running again after a restart is not a first start.
    assert histogram(m, "kubedgx_job_time_to_running_seconds") == (1, 30.0)

    c.set_state(0, "succeeded")
    assert await run.reconcile(1000) == "Succeeded"
    assert finished(m) == {("Succeeded", "Completed"): 1}
    # startTime (the first pass created the worker) to completionTime.
    assert histogram(m, "kubedgx_job_run_duration_seconds", outcome="Succeeded") == (1, 1000.0)
    assert histogram(m, "kubedgx_job_run_duration_seconds", outcome="Failed") == (0, 0.0)
    await run.reconcile(1010)
    await run.reconcile(5000)
    assert finished(m) == {("Succeeded", "Completed"): 1}
    assert restarts(m)["WorkerRestarted"] == 1

    # A restarted operator (or a new leader) reads the finished job: it counts nothing.
    again = Metrics()
    assert await Run(c, c.controller(catalog, again), again).reconcile(6000) == "Succeeded"
    assert finished(again) == {}
    assert histogram(again, "kubedgx_job_time_to_running_seconds") == (0, 0.0)
    assert histogram(again, "kubedgx_job_run_duration_seconds", outcome="Succeeded") == (0, 0.0)
    assert value(again, "kubedgx_jobs", phase="Succeeded") == 1


@pytest.mark.asyncio
async def test_running_again_within_the_same_second_is_no_first_start(run: Run) -> None:
    """Timestamps have seconds: when every transition shares one, the phase tells a restart from a start."""
    c, m = run.cluster, run.metrics
    await run.reconcile(5)
    c.set_state(0, "running")
    await run.reconcile(5)
    c.set_state(0, "failed")
    assert await run.reconcile(5) == "Restarting"
    await run.reconcile(5)
    c.set_state(0, "running")
    assert await run.reconcile(5) == "Running"
    assert histogram(m, "kubedgx_job_time_to_running_seconds") == (1, 5.0)


@pytest.mark.asyncio
async def test_a_failed_job_is_counted_by_its_reason(catalog: Catalog) -> None:
    run = run_of(catalog, {"spec.restartPolicy": "Never"})
    await run.reconcile(0)
    run.cluster.set_state(0, "running")
    await run.reconcile(60)
    run.cluster.set_state(0, "failed", exit_code=3)
    assert await run.reconcile(120) == "Failed"
    assert finished(run.metrics) == {("Failed", "WorkerFailed"): 1}
    assert histogram(run.metrics, "kubedgx_job_run_duration_seconds", outcome="Failed") == (1, 120.0)
    # The failed worker is kept for its logs, not replaced.
    assert sum(restarts(run.metrics).values()) == 0
    await run.reconcile(130)
    assert finished(run.metrics) == {("Failed", "WorkerFailed"): 1}


@pytest.mark.asyncio
async def test_a_refused_status_write_is_counted_when_it_is_written(run: Run) -> None:
    c, m = run.cluster, run.metrics
    await run.reconcile(0)
    c.set_state(0, "running")
    await run.reconcile(30)
    c.set_state(0, "succeeded")
    c.refuse_status = 1
    with pytest.raises(TransientError):
        await run.reconcile(50)
    assert finished(m) == {}
    assert await run.reconcile(55) == "Succeeded"
    assert finished(m) == {("Succeeded", "Completed"): 1}
    assert histogram(m, "kubedgx_job_run_duration_seconds", outcome="Succeeded") == (1, 55.0)


@pytest.mark.asyncio
async def test_time_to_running_counts_the_wait_of_a_suspended_job_once(catalog: Catalog) -> None:
    """A job created suspended (as Kueue's queued jobs are) first runs after it is resumed: its time to
    Running is from creation. Suspended and resumed again later, it is not a first start."""
    run = run_of(catalog, {"spec.suspend": True})
    c, m = run.cluster, run.metrics
    assert await run.reconcile(0) == "Suspended"
    c.job["spec"]["suspend"] = False
    assert await run.reconcile(600) == "Pending"
    c.set_state(0, "running")
    assert await run.reconcile(660) == "Running"
    assert histogram(m, "kubedgx_job_time_to_running_seconds") == (1, 660.0)
    c.job["spec"]["suspend"] = True
    assert await run.reconcile(700) == "Suspended"
    assert sum(restarts(m).values()) == 0  # suspending deletes running workers: no replacement
    c.job["spec"]["suspend"] = False
    assert await run.reconcile(800) == "Pending"
    c.set_state(0, "running")
    assert await run.reconcile(900) == "Running"
    assert histogram(m, "kubedgx_job_time_to_running_seconds") == (1, 660.0)


# -- worker restarts, one per worker ---------------------------------------------------------------


@pytest.mark.asyncio
async def test_each_failed_worker_of_one_incident_counts_once(catalog: Catalog) -> None:
    run = run_of(catalog, {"spec.elastic": {"minNodes": 2}, "spec.restartPolicy": "OnFailure"})
    c, m = run.cluster, run.metrics
    await run.reconcile(0)
    c.set_state(0, "running")
    c.set_state(1, "running")
    assert await run.reconcile(30) == "Running"
    c.set_state(0, "failed", exit_code=1)
    c.set_state(1, "failed", exit_code=1)
    assert await run.reconcile(60) == "Restarting"
    assert c.status.restarts == 1  # one incident against backoffLimit
    assert restarts(m)["WorkerRestarted"] == 2  # two workers replaced
    await run.reconcile(61)
    await run.reconcile(62)
    assert restarts(m)["WorkerRestarted"] == 2


@pytest.mark.asyncio
async def test_evicted_and_lost_workers_count_by_their_reason(catalog: Catalog) -> None:
    run = run_of(catalog, {"spec.elastic": {"minNodes": 2}})
    c, m = run.cluster, run.metrics
    await run.reconcile(0)
    c.set_state(0, "running")
    c.set_state(1, "running")
    await run.reconcile(30)
    c.set_state(1, "evicted")
    assert await run.reconcile(60) == "Restarting"
    assert restarts(m) == {
        "WorkerRestarted": 0,
        "WorkerDisrupted": 1,
        "WorkerReplaced": 0,
        "WorkerLost": 0,
        "Interrupted": 0,
    }
    await run.reconcile(61)
    c.set_state(1, "running")
    assert await run.reconcile(90) == "Running"
    # Worker 0's node is lost and its pod garbage-collected: gone without the operator deleting it.
    del c.pods[c.worker(0)["metadata"]["name"]]
    await run.reconcile(120)
    assert ("WorkerLost", "1 worker(s)") in [(r, msg[:11]) for r, msg in c.events]
    assert restarts(m) == {
        "WorkerRestarted": 0,
        "WorkerDisrupted": 1,
        "WorkerReplaced": 0,
        "WorkerLost": 1,
        "Interrupted": 0,
    }
    assert c.status.restarts == 0


def view(state: str, *, terminating: bool = False, interactive_exit: bool = False) -> PodView:
    pod: dict[str, Any] = {
        "metadata": {"name": "job-worker-0", "labels": {INDEX_LABEL: "0"}},
        "status": pod_status(state, 0, None, None),
    }
    if terminating:
        pod["metadata"]["deletionTimestamp"] = stamp(T0)
    return PodView.of(pod)


@pytest.mark.parametrize(
    ("pod", "phase", "deleting", "counted"),
    [
        (view("failed"), "Restarting", False, "WorkerRestarted"),
        (view("evicted"), "Restarting", False, "WorkerDisrupted"),
        (view("disruption"), "Running", False, "WorkerDisrupted"),
        (view("succeeded"), "Running", False, "WorkerReplaced"),  # an interactive worker
        (view("running"), "Running", False, None),  # scale-down
        (view("failed", terminating=True), "Restarting", False, None),  # deleted before
        (view("failed"), "Failed", False, None),  # the job ends
        (view("failed"), "Suspended", False, None),
        (view("failed"), "Restarting", True, None),  # the job is being deleted
        (None, "Running", False, None),  # not a pod the plan saw
    ],
)
def test_a_deleted_worker_is_a_replacement_only_when_it_had_ended_and_the_job_goes_on(
    pod: PodView | None, phase: str, deleting: bool, counted: str | None
) -> None:
    m = Metrics()
    m.worker_deleted(pod, phase, deleting)
    assert {r: v for r, v in restarts(m).items() if v} == ({counted: 1} if counted else {})


def test_lost_workers_are_counted_by_the_planners_number() -> None:
    m = Metrics()
    m.event("WorkerLost", "3 worker(s) disappeared or were deleted by someone else; replacing them")
    m.event("WorkerRestarted", "job-worker-0 exited with code 1")  # counted where the worker is deleted
    m.event("Running", "AllWorkersRunning")
    assert restarts(m) == {
        "WorkerRestarted": 0,
        "WorkerDisrupted": 0,
        "WorkerReplaced": 0,
        "WorkerLost": 3,
        "Interrupted": 0,
    }


# -- never_ran: what the stored status says about earlier runs ------------------------------------


@pytest.mark.parametrize(
    ("status", "first"),
    [
        (None, True),
        (status_with(), True),
        (status_with(("Running", "False", 0), ("Restarting", "False", 0), ("Finished", "False", 0)), True),
        # Queued (Suspended), then admitted: Suspended flipped, Running never did.
        (status_with(("Running", "False", 0), ("Suspended", "False", 500), ("Finished", "False", 0)), True),
        # Ran, then stopped: Running flipped back after the others were written.
        (status_with(("Running", "False", 90), ("Restarting", "True", 90), ("Finished", "False", 0)), False),
        # A status of an operator without Finished: ran, restarted, ran, then suspended and resumed.
        (status_with(("Running", "False", 400), ("Restarting", "False", 300), ("Suspended", "False", 500)), False),
        (status_with(("Running", "True", 30), ("Finished", "False", 0), phase="Running"), False),
    ],
)
def test_never_ran_reads_the_running_conditions_history(status: DGXTrainingJobStatus | None, first: bool) -> None:
    assert never_ran(status) is first


def test_job_status_written_counts_only_transitions() -> None:
    m = Metrics()
    running = status_with(("Running", "True", 10), ("Finished", "False", 0), phase="Running")
    failed = status_with(("Running", "False", 20), ("Failed", "True", 20), ("Finished", "True", 20), phase="Failed")
    failed.conditions[1].reason = "DeadlineExceeded"
    failed.start_time, failed.completion_time = T0, T0 + timedelta(hours=30)
    m.job_status_written(CREATED, running, failed)
    m.job_status_written(CREATED, failed, failed.model_copy(update={"restarts": 1}))  # a later write
    assert finished(m) == {("Failed", "DeadlineExceeded"): 1}
    assert histogram(m, "kubedgx_job_run_duration_seconds", outcome="Failed") == (1, 30 * 3600.0)
    assert value(m, "kubedgx_job_run_duration_seconds_bucket", outcome="Failed", le="86400.0") == 0
    assert value(m, "kubedgx_job_run_duration_seconds_bucket", outcome="Failed", le="172800.0") == 1


def test_usage_counters_add_what_each_write_added_by_capacity() -> None:
    """Counted by the write that carried the usage, with what it added: a write that repeats it, or
    a second replica reading it, adds nothing."""
    from dgx_operator.api.trainingjob import Usage

    m = Metrics()
    m.prices(Catalog.load())
    assert value(m, "kubedgx_price_per_gpu_hour", family="a100.80g", capacity="spot", currency="USD") == 0.70

    def usage(norm: int, spot: int) -> Usage:
        return Usage.model_validate(
            {
                "currency": "USD",
                "buckets": [
                    {
                        "capacity": "norm",
                        "pricePerGpuHour": "1.80",
                        "referencePricePerGpuHour": "1.80",
                        "gpuSeconds": norm,
                    },
                    {
                        "capacity": "spot",
                        "pricePerGpuHour": "0.70",
                        "referencePricePerGpuHour": "1.80",
                        "gpuSeconds": spot,
                    },
                ],
            }
        )

    labels = {"namespace": "team-a", "instance": "dgxa100.80g.8.norm", "queue": "research"}
    m.usage_written(*labels.values(), None, usage(3600, 0))
    m.usage_written(*labels.values(), usage(3600, 0), usage(7200, 7200))
    m.usage_written(*labels.values(), usage(7200, 7200), usage(7200, 7200))  # nothing new
    assert value(m, "kubedgx_gpu_seconds_total", capacity="norm", **labels) == 7200
    assert value(m, "kubedgx_gpu_seconds_total", capacity="spot", **labels) == 7200
    assert value(m, "kubedgx_cost_total", capacity="norm", currency="USD", **labels) == pytest.approx(3.60)
    assert value(m, "kubedgx_cost_total", capacity="spot", currency="USD", **labels) == pytest.approx(1.40)
    assert value(m, "kubedgx_spot_savings_total", currency="USD", **labels) == pytest.approx(2.20)


def test_the_pre_initialised_outcome_reasons_are_the_vocabularys() -> None:
    """Every reason a job can end with (api.vocabulary) has its series from the start, so the first
    failure of a kind shows in increase(); the planner can only end a job with a declared reason
    (tests/unit/test_vocabulary.py checks every finish() against the declarations)."""
    m = Metrics()
    declared = {(JobPhase.SUCCEEDED, r) for r in reasons_of(JOB, JobPhase.SUCCEEDED)}
    declared |= {(JobPhase.FAILED, r) for r in reasons_of(JOB, JobPhase.FAILED)}
    assert ("Failed", "BackoffLimitExceeded") in declared
    assert {("Failed", r) for r in PERMANENT_WAITING} <= declared
    for outcome, reason in declared:
        assert ("kubedgx_jobs_finished_total", frozenset({("outcome", outcome), ("reason", reason)})) in samples_of(m)


# -- phases, leadership, build info, process metrics ----------------------------------------------


def test_each_operator_keeps_its_own_registry() -> None:
    first, second = Metrics(), Metrics()
    first.api_error("get", 500)
    first.phase(JOB_KIND, ("ml", "a"), "Running")
    assert value(first, "kubedgx_api_errors_total", verb="get", code="500") == 1
    assert ("kubedgx_api_errors_total", frozenset({("verb", "get"), ("code", "500")})) not in samples_of(second)
    assert value(second, "kubedgx_jobs", phase="Running") == 0


def test_a_replica_that_stops_leading_reports_no_phases() -> None:
    m = Metrics(leader=False)
    assert value(m, "kubedgx_leader") == 0
    m.leading(True)
    m.phase(JOB_KIND, ("ml", "a"), "Running")
    m.phase(JOB_KIND, ("ml", "b"), "Succeeded")
    m.phase(MOUNT_KIND, ("ml", "d"), "Ready")
    m.finished.labels("Succeeded", "Completed").inc()
    assert (value(m, "kubedgx_leader"), value(m, "kubedgx_jobs", phase="Running")) == (1, 1)
    m.leading(False)
    assert value(m, "kubedgx_leader") == 0
    assert sum(v for (name, _), v in samples_of(m).items() if name in ("kubedgx_jobs", "kubedgx_data_mounts")) == 0
    assert finished(m) == {("Succeeded", "Completed"): 1}  # counters never go back
    m.leading(True)
    m.phase(JOB_KIND, ("ml", "a"), "Running")  # the new term's reconciles fill the gauges again
    assert value(m, "kubedgx_jobs", phase="Running") == 1
    assert Metrics().leader_gauge._value.get() == 1  # without an election, the one replica leads


def test_build_info_and_process_metrics_are_exposed() -> None:
    m = Metrics()
    (info,) = [labels for (name, labels), v in samples_of(m).items() if name == "kubedgx_build_info" and v == 1]
    assert dict(info) == {
        "version": metadata.version("kubedgx"),
        "python_version": platform.python_version(),
        "kopf_version": metadata.version("kopf"),
    }
    names = {name for name, _ in samples_of(m)}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"} <= names
    assert {"python_info", "python_gc_collections_total"} <= names


# -- no *_created series, in either format ---------------------------------------------------------


def test_no_created_series_in_the_text_format() -> None:
    text = populated().exposition().decode()
    assert "kubedgx_reconcile_total" in text
    assert "_created" not in text


def test_no_created_series_even_if_something_turned_them_back_on() -> None:
    """The switch is process-wide: the operator's Metrics turns it off again when it is made."""
    enable_created_metrics()  # type: ignore[no-untyped-call]
    other = CollectorRegistry()
    Counter("other_things", "Things.", registry=other).inc()
    assert "other_things_created" in generate_latest(other).decode()  # the switch is on here
    m = populated()
    assert "_created" not in m.exposition().decode()
    assert "_created" not in generate_latest(other).decode()


@pytest_asyncio.fixture
async def served() -> AsyncIterator[tuple[Metrics, str]]:
    m = populated()
    runner = await serve(m, 0, "127.0.0.1")
    port = runner.addresses[0][1]
    try:
        yield m, f"http://127.0.0.1:{port}/metrics"
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_the_endpoint_serves_the_text_format_by_default(served: tuple[Metrics, str]) -> None:
    _, url = served
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        text = await response.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["kubedgx_jobs_finished"].type == "counter"
    assert families["kubedgx_job_time_to_running_seconds"].type == "histogram"
    assert "_created" not in text
    assert 'kubedgx_jobs_finished_total{outcome="Succeeded",reason="Completed"} 1.0' in text


@pytest.mark.asyncio
async def test_the_endpoint_serves_openmetrics_when_asked(served: tuple[Metrics, str]) -> None:
    _, url = served
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    async with aiohttp.ClientSession() as http, http.get(url, headers={"Accept": accept}) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
        text = await response.text()
    assert text.endswith("# EOF\n")
    assert "_created" not in text
    families = {f.name: f for f in openmetrics_families(text)}
    assert families["kubedgx_build"].type == "info"
    assert families["kubedgx_webhook_requests"].type == "counter"
    (sample,) = [
        s for s in families["kubedgx_webhook_requests"].samples if s.labels == {
            "kind": JOB_KIND, "operation": "CREATE", "result": "denied"}
    ]  # fmt: skip
    assert sample.value == 1


@pytest.mark.asyncio
async def test_the_endpoint_compresses_when_asked(served: tuple[Metrics, str]) -> None:
    _, url = served
    async with (
        aiohttp.ClientSession(auto_decompress=False) as http,
        http.get(url, headers={"Accept-Encoding": "gzip"}) as response,
    ):
        assert response.headers.get("Content-Encoding") == "gzip"
        body = await response.read()
    assert b"kubedgx_leader 1.0" in gzip.decompress(body)


# -- the webhook -------------------------------------------------------------------------------------


@functools.cache
def webhooks() -> types.ModuleType:
    """dgx_operator.runtime.webhooks, its validating handlers registered in a kopf registry of their own: in
    kopf's default one they would make every later operator of this test session that runs without a
    webhook server refuse to start (as tests/integration/test_admission.py explains)."""
    assert dgx_operator.runtime.handlers.JOB  # imported first, into the default registry, where it belongs
    saved = kopf.get_default_registry()
    kopf.set_default_registry(kopf.OperatorRegistry())
    try:
        module = sys.modules.get("dgx_operator.runtime.webhooks")
        return (
            importlib.reload(module) if module is not None else importlib.import_module("dgx_operator.runtime.webhooks")
        )
    finally:
        kopf.set_default_registry(saved)


@pytest.mark.parametrize(
    ("outcome", "result"),
    [
        (None, "allowed"),
        (kopf.AdmissionError("spec.instance: unknown", code=422), "denied"),
        (kopf.AdmissionError("could not read DGXDataMount data", code=admission.RETRY_CODE), "error"),
        (RuntimeError("a bug"), "error"),
    ],
)
@pytest.mark.asyncio
async def test_each_review_is_counted_by_its_result_and_timed(
    monkeypatch: pytest.MonkeyPatch, outcome: BaseException | None, result: str
) -> None:
    started = asyncio.Event()

    async def review(*_: Any) -> None:
        started.set()
        if outcome is not None:
            raise outcome

    monkeypatch.setattr(admission, "review", review)
    m = Metrics()
    memo = kopf.Memo(metrics=m)
    body = {"kind": "DGXDataMount", "metadata": {"name": "d"}}
    if outcome is None:
        await webhooks().reviewed(MOUNT_KIND, body, memo, body, "UPDATE", [])
    else:
        with pytest.raises(type(outcome)):
            await webhooks().reviewed(MOUNT_KIND, body, memo, body, "UPDATE", [])
    assert started.is_set()
    counted = {
        dict(labels)["result"]: v
        for (name, labels), v in samples_of(m).items()
        if name == "kubedgx_webhook_requests_total" and dict(labels)["kind"] == MOUNT_KIND
        and dict(labels)["operation"] == "UPDATE"
    }  # fmt: skip
    assert counted == {r: (1.0 if r == result else 0.0) for r in ("allowed", "denied", "error")}
    assert histogram(m, "kubedgx_webhook_request_duration_seconds", kind=MOUNT_KIND)[0] == 1
    assert histogram(m, "kubedgx_webhook_request_duration_seconds", kind=JOB_KIND)[0] == 0


@pytest.mark.asyncio
async def test_a_review_without_the_operators_metrics_still_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str | None] = []

    async def review(memo: Any, body: Any, old: Any, operation: str | None, warnings: Any) -> None:
        calls.append(operation)

    monkeypatch.setattr(admission, "review", review)
    await webhooks().reviewed(JOB_KIND, {"kind": "DGXTrainingJob"}, kopf.Memo(), None, "CREATE", [])
    assert calls == ["CREATE"]


# -- our own naming rules (promlint checks Prometheus' own: tests/metrics/test_promlint.py) -------


def naming_problems(found: list[Metric]) -> list[str]:
    """Our rules: kubedgx_ names in snake_case; a counter ends in _total and nothing else does; a
    histogram and any time carries its base unit (_seconds), never an abbreviation; help is a
    sentence; labels are snake_case and never Prometheus' reserved ones."""
    problems: list[str] = []
    for f in found:
        exposed = {s.name for s in f.samples}
        if not re.fullmatch(r"kubedgx(_[a-z0-9]+)+", f.name):
            problems.append(f"{f.name}: not snake_case under kubedgx_")
        if f.type == "counter" and not all(n.endswith("_total") for n in exposed):
            problems.append(f"{f.name}: a counter must end in _total")
        if f.type != "counter" and any(n.endswith("_total") for n in exposed):
            problems.append(f"{f.name}: only counters end in _total")
        if f.type == "histogram" and not f.name.endswith("_seconds"):
            problems.append(f"{f.name}: a histogram of ours measures time in seconds")
        if re.search(r"(duration|time|latency|age)", f.name) and not f.name.endswith("_seconds"):
            problems.append(f"{f.name}: a time must be in _seconds")
        if re.search(r"_(ms|millis|milliseconds|secs?|minutes|hours|days|kb|mb|gb|percent)(_|$)", f.name):
            problems.append(f"{f.name}: not a base unit")
        sentence = f.documentation[:1].isupper() or f.documentation[:1].isdigit()
        if not sentence or not f.documentation.endswith((".", ")")):
            problems.append(f"{f.name}: help must be a sentence: {f.documentation!r}")
        for sample in f.samples:
            for label in sample.labels:
                if label not in ("le", "quantile") and not re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", label):
                    problems.append(f"{f.name}: label {label!r}")
    return problems


def test_names_follow_our_rules() -> None:
    ours = [f for f in populated().registry.collect() if f.name.startswith("kubedgx_")]
    assert {f.name for f in ours} >= {
        "kubedgx_reconcile", "kubedgx_jobs_finished", "kubedgx_worker_restarts", "kubedgx_webhook_requests",
        "kubedgx_webhook_request_duration_seconds", "kubedgx_job_time_to_running_seconds",
        "kubedgx_job_run_duration_seconds", "kubedgx_build", "kubedgx_leader",
    }  # fmt: skip
    assert naming_problems(ours) == []


def bad_metric(name: str, kind: str, sample: str, help_: str = "A metric.") -> Metric:
    metric = Metric(name, help_, kind)
    metric.add_sample(sample, {}, 1.0)
    return metric


@pytest.mark.parametrize(
    "bad",
    [
        bad_metric("kubedgx_reconcile_time", "gauge", "kubedgx_reconcile_time"),
        bad_metric("kubedgx_restarts", "counter", "kubedgx_restarts"),
        bad_metric("kubedgx_jobs_total", "gauge", "kubedgx_jobs_total"),
        bad_metric("kubedgx_sync_duration_ms", "gauge", "kubedgx_sync_duration_ms"),
        bad_metric("kubedgx_jobs", "gauge", "kubedgx_jobs", help_="jobs"),
        bad_metric("kubedgxJobs", "gauge", "kubedgxJobs"),
    ],
)
def test_the_naming_rules_can_fail(bad: Metric) -> None:
    assert naming_problems([bad]) != []


def test_merge_patch_is_what_the_cluster_applies() -> None:
    """The in-memory cluster applies the controller's patches as the apiserver does."""
    before = {"phase": "Pending", "workers": {"active": 1, "ready": 0}}
    after = {"phase": "Running", "workers": {"active": 1, "ready": 1}}
    assert apply_patch(before, merge_patch(before, after)) == after
