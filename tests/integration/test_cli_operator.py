"""`kubedgx operator` as users and the chart run it: a separate process, configured by flags, with
kopf's liveness endpoint, JSON logs, a webhook port, and a clean exit on SIGTERM."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from tests.conftest import BASE_JOB
from tests.integration.emulator import Emulator
from tests.integration.operator_process import STARTUP_TIMEOUT, OperatorProcess
from tests.support.ports import free_port

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def operator_process(emulator: Emulator, kubeconfig: Path) -> AsyncIterator[tuple[OperatorProcess, int, int]]:
    liveness, webhook = free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dgx_operator.cli.main", "operator",
        "--standalone", "-n", "ml", "--log-format", "json",
        "--liveness", f"http://127.0.0.1:{liveness}/healthz",
        "--webhook-port", str(webhook), "--webhook-insecure", "--metrics-port", "0",
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    running = OperatorProcess(proc)
    try:
        # Started once kopf watches the jobs and the pods.
        await emulator.wait_for(
            lambda: (
                proc.returncode is not None
                or (emulator.open_watches("dgxtrainingjobs") and emulator.open_watches("pods"))
            ),
            timeout=STARTUP_TIMEOUT,
            message=lambda: "operator watching\n" + "\n".join(running.lines[-20:]),
        )
        assert proc.returncode is None, "\n".join(running.lines[-40:])
        yield running, liveness, webhook
    finally:
        await running.stop()


async def test_the_cli_operator_reconciles_serves_probes_and_stops_cleanly(
    emulator: Emulator, operator_process: tuple[OperatorProcess, int, int]
) -> None:
    running, liveness, webhook = operator_process
    emulator.create("dgxtrainingjobs", copy.deepcopy(BASE_JOB), namespace="ml")
    job = await emulator.wait_for_object(
        "dgxtrainingjobs", "ml", "job", lambda j: (j.get("status") or {}).get("phase") == "Pending"
    )
    assert emulator.get("pods", "ml", "job-worker-0") is not None
    assert job["metadata"]["finalizers"] == ["kubedgx.io/finalizer"]

    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{liveness}/healthz") as response:
            assert response.status == 200
            probes = await response.json()
        assert "jobs" in probes  # our probe is part of kopf's liveness report
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "9f0c2b1e-0000-4000-8000-000000000001",
                "kind": {"group": "kubedgx.io", "version": "v1alpha1", "kind": "DGXTrainingJob"},
                "resource": {"group": "kubedgx.io", "version": "v1alpha1", "resource": "dgxtrainingjobs"},
                "operation": "CREATE",
                "namespace": "ml",
                "name": "bad",
                "object": {**copy.deepcopy(BASE_JOB), "metadata": {"name": "bad", "namespace": "ml"},
                           "spec": {**BASE_JOB["spec"], "instance": "dgxa100.80g.16.norm"}},
                "userInfo": {"username": "tester"},
                "dryRun": False,
            },
        }  # fmt: skip
        async with http.post(f"http://127.0.0.1:{webhook}/validate-dgxtrainingjob", json=review) as response:
            answer = await response.json()
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 422
    assert "spec.instance: unknown instance type 'dgxa100.80g.16.norm'" in answer["response"]["status"]["message"]

    code = await running.stop()
    assert code == 0, "\n".join(running.lines[-40:])
    records = [json.loads(line) for line in running.lines if line.startswith("{")]
    assert records, "\n".join(running.lines[-20:])  # --log-format json: one JSON object per line
    assert all("message" in r for r in records)
