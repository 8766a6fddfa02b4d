"""A failed worker's cause read where the kubelet's 2 KiB termination message does not reach: the
operator reads the failed worker's log tail once (pods/log) when the message names no cause, and
the job ends (or restarts) with the cause the log shows (docs/operator.md, "Failures, diagnosed").

The test plays the kubelet: the termination message it keeps (the log's last 2 KiB: torchrun's
summary) and the log it serves (PyTorch's watchdog line further up)."""

from __future__ import annotations

import pytest

from tests.conftest import DELETE
from tests.integration.conftest import RunOperator
from tests.integration.emulator import Emulator
from tests.integration.scenarios import (
    JOBS,
    NS,
    condition,
    exit_pod,
    expect_pods,
    job_with,
    run_pod,
    start_operator,
    wait_phase,
    worker,
)

pytestmark = pytest.mark.asyncio

WATCHDOG = (
    "[rank0]:[E1204 10:12:01.123456 88 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1801, OpType=ALLREDUCE, NumelIn=8650752, NumelOut=8650752, Timeout(ms)=600000) ran "
    "for 600094 milliseconds before timing out.\n"
)
SUMMARY = (
    "Root Cause (first observed failure):\n[0]:\n  time      : 2026-12-04_10:12:02\n  host      : job-worker-0\n"
    "  rank      : 0 (local_rank: 0)\n  exitcode  : -6 (pid: 88) (SIGABRT)\n  error_file: <N/A>\n"
    "  traceback : Signal 6 (SIGABRT) received by PID 88\n" + "=" * 60 + "\n"
)
COMMAND = {"spec.trainer": DELETE, "spec.command": ["torchrun", "train.py"], "spec.restartPolicy": "Never"}


def log_reads(emulator: Emulator) -> int:
    return len(emulator.calls("get", "pods", subresource="log"))


async def test_a_watchdog_line_above_the_kept_message_is_read_from_the_log(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator)
    op.controller.progress_interval = 0.0  # only the failure's read goes to pods/log
    emulator.create(JOBS, job_with(COMMAND))
    await expect_pods(emulator, {worker(0): "0"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")
    noise = "".join(f"[rank0]: an NCCL debug line {i} of the collective that hung\n" for i in range(60))
    emulator.set_log(NS, worker(0), "trainer", "starting\n" + WATCHDOG + noise + SUMMARY)
    exit_pod(emulator, worker(0), 1, message=SUMMARY)  # what the kubelet kept: no watchdog line
    status = await wait_phase(emulator, "Failed")
    failed = condition(status, "Failed")
    assert failed["reason"] == "NCCLTimeout", status
    assert "NCCLTimeout: rank 0: a collective ALLREDUCE did not complete in 600 s" in failed["message"]
    reads = log_reads(emulator)
    assert reads == 1
    await op.settle()
    assert log_reads(emulator) == reads  # read once, not on every pass


async def test_a_log_that_names_nothing_leaves_the_kept_message(emulator: Emulator, run_operator: RunOperator) -> None:
    op = await start_operator(emulator, run_operator)
    op.controller.progress_interval = 0.0
    emulator.create(JOBS, job_with(COMMAND))
    await expect_pods(emulator, {worker(0): "0"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")
    emulator.set_log(NS, worker(0), "trainer", "starting\nValueError: a bad row\n" + SUMMARY)
    exit_pod(emulator, worker(0), 1, message=SUMMARY)
    status = await wait_phase(emulator, "Failed")
    failed = condition(status, "Failed")
    assert failed["reason"] == "WorkerFailed", status
    assert "rank 0 (local_rank 0) exited with code -6 (SIGABRT) on job-worker-0" in failed["message"]
    assert "Signal 6 (SIGABRT) received by PID 88" in failed["message"]
