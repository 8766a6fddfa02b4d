"""The operator's Prometheus metrics (docs/operator.md, "Metrics"), scraped over HTTP from the running operator:
reconcile counts and phases of jobs and data mounts, restarts the planner decided, failed API calls. And the
settings as the chart passes them (KUBEDGX_* variables only) reaching `kubedgx operator`: watched namespaces,
the metrics port and the health port.

The in-process scenarios run ``dgx_operator.runtime.handlers`` through scenarios.py's ``start_operator``, with the
metrics server on a free port; the last one runs the CLI in a subprocess, as the chart's Deployment does.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import os
import socket
import sys
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

import dgx_operator.runtime.handlers
import tests.integration.scenarios as scenarios
from dgx_operator.controllers.metrics import Metrics, serve
from dgx_operator.runtime.settings import OperatorConfig
from tests.conftest import BASE_JOB, BASE_MOUNT, with_changes
from tests.integration.admission_helpers import JOB_PATH, MOUNT_PATH, Webhook, operator_registry, stored
from tests.integration.conftest import RunOperator
from tests.integration.emulator import Emulator
from tests.integration.mount_scenarios import SECRET, mount_of, wait_mount
from tests.integration.operator_process import STARTUP_TIMEOUT, OperatorProcess
from tests.integration.scenarios import (
    JOBS,
    MOUNTS,
    NS,
    exit_pod,
    expect_pods,
    get_job,
    job_with,
    run_pod,
    start_operator,
    wait_phase,
    worker,
)
from tests.s3 import S3, secret
from tests.support.ports import free_port

pytestmark = pytest.mark.asyncio

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
JOB_KIND = "DGXTrainingJob"
MOUNT_KIND = "DGXDataMount"


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 when the series is absent."""
    return samples.get((name, frozenset(labels.items())), 0.0)


async def scrape(port: int) -> Samples:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse(await response.text())


@pytest.fixture
def metrics_port(monkeypatch: pytest.MonkeyPatch) -> int:
    """start_operator's config, with the metrics server on a free port."""
    port = free_port()
    config = scenarios.operator_config()
    monkeypatch.setattr(
        scenarios,
        "operator_config",
        lambda status_interval=0.0: dataclasses.replace(config, metrics_port=port, status_interval=status_interval),
    )
    return port


async def test_metrics_count_reconciles_phases_restarts_and_api_errors(
    emulator: Emulator, run_operator: RunOperator, s3: S3, metrics_port: int
) -> None:
    op = await start_operator(emulator, run_operator)
    before = await scrape(metrics_port)
    # Every series is there from the start, at zero.
    assert value(before, "kubedgx_reconcile_total", kind=JOB_KIND, outcome="ok") == 0
    assert value(before, "kubedgx_worker_restarts_total", reason="WorkerRestarted") == 0
    assert value(before, "kubedgx_leader") == 1  # no election: the one replica leads
    assert not any(name.endswith("_created") for name, _ in before)
    assert any(name == "kubedgx_build_info" for name, _ in before)
    assert ("kubedgx_jobs", frozenset({("phase", "Running")})) in before
    assert ("kubedgx_data_mounts", frozenset({("phase", "Ready")})) in before

    # A job to Running, a mount listing a bucket to Ready.
    emulator.create(JOBS, job_with({"spec.restartPolicy": "OnFailure", "spec.backoffLimit": 3}))
    emulator.create("secrets", secret(SECRET))
    emulator.create(MOUNTS, mount_of(s3, s3.bucket(objects={"prefix/train/a.jsonl": b"{}\n"})))
    await expect_pods(emulator, {worker(0): "0"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")
    await wait_mount(emulator, "Ready")
    await op.settle()
    samples = await scrape(metrics_port)
    assert value(samples, "kubedgx_reconcile_total", kind=JOB_KIND, outcome="ok") > 0
    assert value(samples, "kubedgx_reconcile_total", kind=MOUNT_KIND, outcome="ok") > 0
    assert value(samples, "kubedgx_reconcile_duration_seconds_count", kind=JOB_KIND) == value(
        samples, "kubedgx_reconcile_total", kind=JOB_KIND, outcome="ok"
    )
    assert value(samples, "kubedgx_jobs", phase="Running") == 1
    assert sum(v for (name, _), v in samples.items() if name == "kubedgx_jobs") == 1
    assert value(samples, "kubedgx_data_mounts", phase="Ready") == 1
    assert not any(name == "kubedgx_api_errors_total" for name, _ in samples)
    assert value(samples, "kubedgx_job_time_to_running_seconds_count") == 1

    # The worker fails; the status write that records the restart is refused once with 503, then retried.
    emulator.fail("patch", "dgxtrainingjobs", "status", code=503)
    exit_pod(emulator, worker(0), 1)
    await wait_phase(emulator, "Restarting", lambda status: status.get("restarts") == 1)
    await op.settle()
    samples = await scrape(metrics_port)
    assert value(samples, "kubedgx_api_errors_total", verb="patch", code="503") == 1
    assert value(samples, "kubedgx_reconcile_total", kind=JOB_KIND, outcome="retry") == 1
    assert value(samples, "kubedgx_reconcile_total", kind=JOB_KIND, outcome="error") == 0
    # Counted once, when the plan was carried out: one worker, one restart in status.restarts.
    assert value(samples, "kubedgx_worker_restarts_total", reason="WorkerRestarted") == 1
    assert get_job(emulator)["status"]["restarts"] == 1
    assert (value(samples, "kubedgx_jobs", phase="Running"), value(samples, "kubedgx_jobs", phase="Restarting")) == (
        0,
        1,
    )

    # Back to Running is no first start; the job ends once, counted by its reason.
    await expect_pods(emulator, {worker(0): "1"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")
    exit_pod(emulator, worker(0), 0)
    await wait_phase(emulator, "Succeeded")
    await op.settle()
    samples = await scrape(metrics_port)
    assert value(samples, "kubedgx_job_time_to_running_seconds_count") == 1
    assert value(samples, "kubedgx_jobs_finished_total", outcome="Succeeded", reason="Completed") == 1
    assert value(samples, "kubedgx_job_run_duration_seconds_count", outcome="Succeeded") == 1

    # A deleted job leaves the gauge.
    emulator.delete(JOBS, NS, "job")
    await emulator.wait_for_absence(JOBS, NS, "job")
    memo_metrics: Metrics = op.memo.metrics
    await emulator.wait_for(lambda: not memo_metrics.phases[JOB_KIND], message="the operator forgot the job")
    samples = await scrape(metrics_port)
    assert sum(v for (name, _), v in samples.items() if name == "kubedgx_jobs") == 0
    assert value(samples, "kubedgx_data_mounts", phase="Ready") == 1


async def test_each_operator_keeps_its_own_registry() -> None:
    """Two Metrics objects share nothing (prometheus_client's global registry is never used)."""
    first, second = Metrics(), Metrics()
    first.api_error("get", 500)
    first.phase(JOB_KIND, (NS, "a"), "Running")
    first.phase(JOB_KIND, (NS, "b"), "Running")
    first.phase(JOB_KIND, (NS, "a"), "Succeeded")
    samples, other = parse(first.exposition().decode()), parse(second.exposition().decode())
    assert value(samples, "kubedgx_api_errors_total", verb="get", code="500") == 1
    assert value(other, "kubedgx_api_errors_total", verb="get", code="500") == 0
    assert (value(samples, "kubedgx_jobs", phase="Running"), value(samples, "kubedgx_jobs", phase="Succeeded")) == (
        1,
        1,
    )
    first.forget(JOB_KIND, (NS, "b"))
    first.forget(JOB_KIND, (NS, "never-seen"))
    samples = parse(first.exposition().decode())
    assert (value(samples, "kubedgx_jobs", phase="Running"), value(samples, "kubedgx_jobs", phase="Succeeded")) == (
        0,
        1,
    )


async def test_the_cli_takes_namespaces_and_ports_from_the_environment(emulator: Emulator, kubeconfig: Path) -> None:
    """As the chart runs it: no flags but --standalone; KUBEDGX_WATCH_NAMESPACES=ml, so a job in another
    namespace is never touched; /metrics and /healthz on the configured ports."""
    emulator.create_namespace("other")
    emulator.create(JOBS, job_with({"metadata.namespace": "other"}))
    metrics, health = free_port(), free_port()
    env = {name: v for name, v in os.environ.items() if not name.startswith("KUBEDGX_")}
    env |= {
        "KUBECONFIG": str(kubeconfig),
        "KUBEDGX_WATCH_NAMESPACES": "ml",
        "KUBEDGX_METRICS_PORT": str(metrics),
        "KUBEDGX_HEALTH_PORT": str(health),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dgx_operator.cli.main", "operator", "--standalone",
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    running = OperatorProcess(proc)
    try:
        await emulator.wait_for(
            lambda: proc.returncode is not None or emulator.open_watches(JOBS),
            timeout=STARTUP_TIMEOUT,
            message=lambda: "operator watching\n" + "\n".join(running.lines[-20:]),
        )
        assert proc.returncode is None, "\n".join(running.lines[-40:])
        emulator.create(JOBS, copy.deepcopy(BASE_JOB), namespace=NS)
        await wait_phase(emulator, "Pending", timeout=10)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{health}/healthz") as response:
                assert response.status == 200
                assert "jobs" in await response.json()
            async with http.get(f"http://127.0.0.1:{metrics}/metrics") as response:
                samples = parse(await response.text())
        assert value(samples, "kubedgx_jobs", phase="Pending") == 1
        # Only the watched namespace: every request the operator made, and what it wrote.
        touched = {call.namespace for call in emulator.log if call.namespace is not None}
        assert touched == {NS}, sorted(str(c) for c in emulator.log if c.namespace not in (None, NS))
        ignored = emulator.get(JOBS, "other", "job")
        assert ignored is not None
        assert "status" not in ignored
        assert not ignored["metadata"].get("finalizers")
        assert emulator.select("pods", "other") == []
        # No cluster-wide list or watch of what it reconciles (kopf itself scans namespaces and CRDs).
        watched = (JOBS, MOUNTS, "pods", "services", "configmaps")
        assert {c.namespace for c in emulator.log if c.verb in ("list", "watch") and c.resource in watched} == {NS}
    finally:
        assert await running.stop() == 0, "\n".join(running.lines[-40:])


async def test_metrics_default_to_off_in_code_and_8080_from_the_environment() -> None:
    assert OperatorConfig().metrics_port == 0
    assert OperatorConfig.from_env({}).metrics_port == 8080


async def test_a_taken_metrics_port_is_an_error() -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        with pytest.raises(OSError, match="address already in use"):
            await serve(Metrics(), taken.getsockname()[1])


@pytest.fixture
def operator_metrics(monkeypatch: pytest.MonkeyPatch) -> list[Metrics]:
    """The Metrics the operator makes at startup, as they are made (request before the operator's fixture)."""
    operator_registry()  # reloads dgx_operator.runtime.handlers once, which would undo the patch below
    made: list[Metrics] = []

    class Recorded(Metrics):
        def __post_init__(self) -> None:
            super().__post_init__()
            made.append(self)

    monkeypatch.setattr(dgx_operator.runtime.handlers, "Metrics", Recorded)
    return made


async def test_admission_reviews_are_counted_by_kind_operation_and_result(
    operator_metrics: list[Metrics], webhook: Webhook
) -> None:
    """Through kopf's webhook server, as the apiserver calls it."""
    # restartPolicy Never: a job without a durable checkpoint location is allowed with a warning otherwise.
    quiet = with_changes(BASE_JOB, {"spec.restartPolicy": "Never"})
    await webhook.allowed(JOB_PATH, "CREATE", stored(quiet))
    await webhook.allowed(JOB_PATH, "CREATE", stored(quiet))
    await webhook.refused(JOB_PATH, "CREATE", stored(with_changes(BASE_JOB, {"spec.typo": 1})))
    await webhook.refused(MOUNT_PATH, "UPDATE", stored(with_changes(BASE_MOUNT, {"spec.typo": 1})), stored(BASE_MOUNT))
    (metrics,) = operator_metrics
    samples = parse(metrics.exposition().decode())
    counted = {
        (labels["kind"], labels["operation"], labels["result"]): v
        for (name, frozen), v in samples.items()
        if name == "kubedgx_webhook_requests_total" and v
        for labels in [dict(frozen)]
    }
    assert counted == {
        (JOB_KIND, "CREATE", "allowed"): 2,
        (JOB_KIND, "CREATE", "denied"): 1,
        (MOUNT_KIND, "UPDATE", "denied"): 1,
    }
    assert value(samples, "kubedgx_webhook_request_duration_seconds_count", kind=JOB_KIND) == 3
    assert value(samples, "kubedgx_webhook_request_duration_seconds_count", kind=MOUNT_KIND) == 1
