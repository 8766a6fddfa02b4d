"""Status writes coalesced by the running operator (issue 30.1): with a status interval, a job's
workers turning Running one by one cost two status writes (its start and its Running transition),
a count held back is written once the interval has passed, and a real transition is written at once.

The planner's side (reconcile/planner/coalesce.py) is pinned in tests/unit/test_planner_coalesce.py;
here the whole loop runs: kopf's watches, the controller's memory of its last write, the requeue.
The test plays scheduler and kubelet (run_pod) and the clock the interval is measured on.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.integration.conftest import RunOperator
from tests.integration.emulator import Emulator
from tests.integration.scenarios import (
    JOBS,
    NS,
    Body,
    exit_pod,
    expect_pods,
    get_job,
    job_with,
    run_pod,
    start_operator,
    wait_phase,
    worker,
)

pytestmark = pytest.mark.asyncio

INTERVAL = 10.0


def elastic(nodes: int) -> Body:
    return job_with({"spec.elastic.minNodes": nodes, "spec.elastic.maxNodes": nodes, "spec.restartPolicy": "OnFailure"})


def status_writes(emulator: Emulator) -> int:
    return len(emulator.calls("patch", "dgxtrainingjobs", subresource="status"))


async def test_workers_turning_running_one_by_one_make_two_status_writes(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator, status_interval=INTERVAL)
    assert op.controller.status_interval == INTERVAL
    emulator.create(JOBS, elastic(4))
    await expect_pods(emulator, {worker(i): "0" for i in range(4)})
    await wait_phase(emulator, "Pending")
    assert status_writes(emulator) == 1  # the job's start
    for i in range(3):
        run_pod(emulator, worker(i))
        await op.settle()
        assert get_job(emulator)["status"]["nodes"] == "0/4"  # held: only a count moved
    assert status_writes(emulator) == 1
    run_pod(emulator, worker(3))
    status = await wait_phase(emulator, "Running")
    assert status["nodes"] == "4/4"
    assert status["workers"]["ready"] == 4
    assert status_writes(emulator) == 2


async def test_a_held_count_is_written_when_the_interval_has_passed(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator, status_interval=INTERVAL)
    emulator.create(JOBS, elastic(4))
    await expect_pods(emulator, {worker(i): "0" for i in range(4)})
    await wait_phase(emulator, "Pending")
    run_pod(emulator, worker(0))
    run_pod(emulator, worker(1))
    await op.settle()
    assert (status_writes(emulator), get_job(emulator)["status"]["nodes"]) == (1, "0/4")
    # The held pass asked to be run again when the interval ends (the controller's own timer).
    timer = op.controller.timers.get((NS, "job"))
    assert timer is not None
    op.clock.advance(timedelta(seconds=INTERVAL))
    await op.settle()
    status = get_job(emulator)["status"]
    assert (status_writes(emulator), status["nodes"], status["workers"]["ready"]) == (2, "2/4", 2)
    message = next(c["message"] for c in status["conditions"] if c["type"] == "Running")
    assert message.startswith("2/4 workers running, need 4")


async def test_a_failure_is_written_at_once_within_the_interval(emulator: Emulator, run_operator: RunOperator) -> None:
    await start_operator(emulator, run_operator, status_interval=INTERVAL)
    emulator.create(JOBS, elastic(2))
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    run_pod(emulator, worker(0))
    run_pod(emulator, worker(1))
    await wait_phase(emulator, "Running")
    written = status_writes(emulator)
    exit_pod(emulator, worker(1), 1)
    status = await wait_phase(emulator, "Restarting")
    assert status["restarts"] == 1
    assert status_writes(emulator) == written + 1
