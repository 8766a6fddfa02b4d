"""A running job's progress, live: the operator reads worker 0's log through the apiserver
(``pods/log``) at most once per progress interval and mirrors its latest progress line into
``status.progress`` (docs/operator.md, "Progress"), so training pods need no API access to report.

The test plays the kubelet (what the trainer container printed, served by the emulator's
``pods/{name}/log``) and the clock (the controller's ``now``, which the interval is measured on).
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from tests.integration.conftest import RunOperator
from tests.integration.emulator import Emulator
from tests.integration.scenarios import (
    JOBS,
    NS,
    expect_pods,
    get_job,
    job_events,
    job_with,
    run_pod,
    stamp,
    start_operator,
    wait_phase,
    worker,
)

pytestmark = pytest.mark.asyncio


def line(step: int, loss: float, **more: Any) -> str:
    """A progress line as the trainer prints it (docs/trainer.md, "Progress: the contract")."""
    return json.dumps({"event": "progress", "step": step, "totalSteps": 100, "loss": loss, **more}) + "\n"


def printed(*reports: str) -> str:
    """A trainer's stdout: progress lines among other output."""
    noise = "2026-12-04 10:00:00 WARNING [rank 0] something: a library's own line\n{'a dict': 'not ours'}\n"
    return noise + noise.join(reports) + noise


def log_reads(emulator: Emulator) -> int:
    return len(emulator.calls("get", "pods", subresource="log"))


def status_writes(emulator: Emulator) -> int:
    return len(emulator.calls("patch", "dgxtrainingjobs", subresource="status"))


async def test_status_progress_follows_worker_0s_log_while_it_runs(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, job_with({}))
    await expect_pods(emulator, {worker(0): "0"})
    emulator.set_log(NS, worker(0), "trainer", printed(line(10, 2.5), line(20, 2.25, learningRate=0.001)))
    run_pod(emulator, worker(0))
    status = await wait_phase(emulator, "Running", lambda s: "progress" in s)
    first_read = op.clock.now
    # The latest report; fields the status has no place for are dropped, as with any report. A
    # report without updatedAt (these lines have none, as a program's may not) is stamped with
    # when the operator first read it: spec.maxIdle measures silence from there.
    assert status["progress"] == {
        "step": 20,
        "totalSteps": 100,
        "loss": 2.25,
        "learningRate": 0.001,
        "updatedAt": stamp(first_read),
    }
    assert op.controller.progress_interval == 30.0  # the setting's default

    # Within the interval the log is not read again, whatever triggers a reconcile.
    reads, writes = log_reads(emulator), status_writes(emulator)
    emulator.set_log(NS, worker(0), "trainer", printed(line(10, 2.5), line(20, 2.25), line(30, 2.0)))
    for _ in range(3):
        await op.settle()
    assert log_reads(emulator) == reads
    assert status_writes(emulator) == writes
    assert get_job(emulator)["status"]["progress"]["step"] == 20

    # Past the interval, the next reconcile reads it: one read, one status write.
    op.clock.advance(timedelta(seconds=30))
    await op.settle()
    assert log_reads(emulator) == reads + 1
    assert status_writes(emulator) == writes + 1
    assert get_job(emulator)["status"]["progress"] == {
        "step": 30,
        "totalSteps": 100,
        "loss": 2.0,
        "updatedAt": stamp(op.clock.now),
    }

    # A read that learns nothing new writes nothing: the same report keeps its first stamp.
    op.clock.advance(timedelta(seconds=30))
    await op.settle()
    assert log_reads(emulator) == reads + 2
    assert status_writes(emulator) == writes + 1
    assert get_job(emulator)["status"]["progress"]["updatedAt"] == stamp(op.clock.now - timedelta(seconds=30))


async def test_a_job_whose_worker_0_goes_quiet_for_max_idle_is_restarted_as_stalled(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    """spec.maxIdle on top of live progress: the log keeps the same last report (a hung
    collective prints nothing), so after maxIdle the workers are replaced and the restart says why."""
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, job_with({"spec.maxIdle": "2m"}))
    await expect_pods(emulator, {worker(0): "0"})
    emulator.set_log(NS, worker(0), "trainer", printed(line(10, 2.5)))
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running", lambda s: "progress" in s)
    for _ in range(4):  # 120 s of reads that find the same report: still within maxIdle
        op.clock.advance(timedelta(seconds=29))
        await op.settle()
    assert get_job(emulator)["status"]["phase"] == "Running"
    op.clock.advance(timedelta(seconds=30))
    await op.settle()
    status = await wait_phase(emulator, "Restarting")
    assert status["restarts"] == 1
    restarted = [m for _, reason, m in job_events(emulator) if reason == "WorkerRestarted"]
    assert restarted
    assert restarted[-1].startswith(f"Stalled: worker 0 ({worker(0)}) reported no progress")


async def test_a_running_job_is_requeued_for_its_progress(emulator: Emulator, run_operator: RunOperator) -> None:
    """No event tells the operator that a log grew: a running job's pass asks to come back within the interval."""
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, job_with({}))
    await expect_pods(emulator, {worker(0): "0"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")
    delay = await op.controller.step((NS, "job"))
    assert delay is not None
    assert delay <= op.controller.progress_interval


async def test_garbage_and_a_missing_log_leave_the_status_alone(emulator: Emulator, run_operator: RunOperator) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, job_with({}))
    await expect_pods(emulator, {worker(0): "0"})
    emulator.set_log(NS, worker(0), "trainer", printed(line(10, 2.5)))
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running", lambda s: "progress" in s)
    # The log now holds no progress line (a truncated read, a program that prints none), then the
    # apiserver cannot serve it (the kubelet is away): neither clears nor breaks the status.
    emulator.set_log(NS, worker(0), "trainer", '{"event": "progress", "step": \nnot json\n')
    op.clock.advance(timedelta(seconds=30))
    await op.settle()
    emulator.fail("get", "pods", code=500, times=1, subresource="log")
    op.clock.advance(timedelta(seconds=30))
    await op.settle()
    status = get_job(emulator)["status"]
    assert status["phase"] == "Running"
    assert status["progress"]["step"] == 10


async def test_the_interval_0_reads_no_log(emulator: Emulator, run_operator: RunOperator) -> None:
    op = await start_operator(emulator, run_operator)
    op.controller.progress_interval = 0.0
    emulator.create(JOBS, job_with({}))
    await expect_pods(emulator, {worker(0): "0"})
    emulator.set_log(NS, worker(0), "trainer", printed(line(10, 2.5)))
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")
    await op.settle()
    assert log_reads(emulator) == 0
    assert "progress" not in get_job(emulator)["status"]
