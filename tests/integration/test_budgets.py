"""DGXBudgets through the running operator (issue 31) on the in-memory API server: a job's usage
reaches its namespace's budget and stays there after the job is deleted by its TTL; a second job
waits BudgetExceeded while the first runs and starts when the budget is raised. The real control
plane's versions of these are tests/cluster/test_cost.py; here the clock is the test's.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.integration.conftest import RunOperator
from tests.integration.emulator import Emulator
from tests.integration.scenarios import (
    JOBS,
    NS,
    Operator,
    expect_pods,
    get_job,
    job_with,
    run_pod,
    stamp,
    start_operator,
    wait_phase,
    worker,
)

pytestmark = pytest.mark.asyncio

BUDGETS = "dgxbudgets"
GPUS = 8  # dgxa100.80g.8.norm: 1.80 USD per GPU-hour in the example prices


def budget(name: str, cost: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubedgx.io/v1alpha1",
        "kind": "DGXBudget",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"limits": {"cost": cost}, "period": {"calendar": "Month"}, **spec},
    }


def bound(emulator: Emulator, pod: str, op: Operator, seconds_ago: int) -> None:
    """The scheduler's binding time, which usage counts from."""
    stored = emulator.get("pods", NS, pod)
    assert stored is not None
    conditions = [dict(c) for c in stored["status"].get("conditions") or []]
    for c in conditions:
        if c["type"] == "PodScheduled":
            c["lastTransitionTime"] = stamp(op.clock.now - timedelta(seconds=seconds_ago))
    emulator.patch_status("pods", NS, pod, {"conditions": conditions})


def finish(emulator: Emulator, pod: str, op: Operator) -> None:
    """The trainer exits 0 now (the operator's clock)."""
    stored = emulator.get("pods", NS, pod)
    assert stored is not None
    statuses = [dict(c) for c in stored["status"]["containerStatuses"]]
    for c in statuses:
        c["ready"] = False
        c["state"] = {
            "terminated": {
                "exitCode": 0,
                "reason": "Completed",
                "startedAt": stamp(op.clock.now),
                "finishedAt": stamp(op.clock.now),
            }
        }
    emulator.patch_status("pods", NS, pod, {"phase": "Succeeded", "containerStatuses": statuses})


def ledger_row(emulator: Emulator, name: str, uid: str) -> dict[str, Any] | None:
    found = emulator.get(BUDGETS, NS, name)
    rows = ((found or {}).get("status") or {}).get("ledger") or []
    return next((r for r in rows if r["uid"] == uid), None)


async def test_a_job_deleted_by_its_ttl_keeps_its_spend_in_the_budget(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create(BUDGETS, budget("ledger", "1000", enforcement="Report"), namespace=NS)
    emulator.create(JOBS, job_with({"spec.maxDuration": "1h", "spec.ttlSecondsAfterFinished": 30}))
    await expect_pods(emulator, {worker(0): "0"})
    run_pod(emulator, worker(0))
    bound(emulator, worker(0), op, seconds_ago=600)
    await wait_phase(emulator, "Running")
    uid = get_job(emulator)["metadata"]["uid"]
    op.clock.advance(timedelta(seconds=120))
    finish(emulator, worker(0), op)
    done = await wait_phase(emulator, "Succeeded")
    await emulator.wait_for(
        lambda: not (get_job(emulator)["status"].get("usage") or {}).get("running"), timeout=10, message="final usage"
    )
    usage = get_job(emulator)["status"]["usage"]
    assert usage["gpuSeconds"] == GPUS * 720, done
    op.clock.advance(timedelta(seconds=60))  # past the TTL
    await op.trigger()
    await emulator.wait_for(
        lambda: emulator.get(JOBS, NS, "job") is None, timeout=10, message="the job deleted by its TTL"
    )
    row = await emulator.wait_for(
        lambda: ledger_row(emulator, "ledger", uid), timeout=10, message="the job's ledger row"
    )
    assert row["gpuSeconds"] == GPUS * 720
    stored = emulator.get(BUDGETS, NS, "ledger")
    assert stored is not None
    assert stored["status"]["spent"]["cost"] == usage["cost"] == "2.88"  # 1.6 GPU-hours x 1.80
    assert ready(emulator, "ledger") is not None
    assert ready(emulator, "ledger")["reason"] == "Counting"


async def test_a_second_job_waits_for_the_budget_and_starts_when_it_is_raised(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    """Each run's worst case is 8 GPUs x 1.80 x 1h = 14.40 USD: one fits 20, two do not."""
    op = await start_operator(emulator, run_operator)
    emulator.create(BUDGETS, budget("team", "20"), namespace=NS)
    emulator.create(JOBS, job_with({"metadata.name": "first", "spec.maxDuration": "1h"}))
    await expect_pods(emulator, {"first-worker-0": "0"})
    emulator.create(JOBS, job_with({"metadata.name": "second", "spec.maxDuration": "1h"}))
    held = await wait_phase(emulator, "Suspended", name="second")
    suspended = next(c for c in held["conditions"] if c["type"] == "Suspended")
    assert suspended["reason"] == "BudgetExceeded"
    assert suspended["message"].startswith(
        f"DGXBudget {NS}/team: this run's worst case 1 node x 8 GPUs x 1.80 USD/GPU-h x 1h = 14.40 USD"
    )
    assert "committed 14.40 of 20.00 USD" in suspended["message"]
    assert emulator.get("pods", NS, "second-worker-0") is None
    stored = emulator.get(BUDGETS, NS, "team")
    assert stored is not None
    assert [r["job"] for r in stored.get("status", {}).get("reservations", [])] == ["first"], stored
    emulator.patch(BUDGETS, NS, "team", {"spec": {"limits": {"cost": "40"}}})
    await expect_pods(emulator, {"first-worker-0": "0", "second-worker-0": "0"})
    await emulator.wait_for(lambda: op.controller.budget_held == set(), timeout=5, message="nothing held")


def ready(emulator: Emulator, name: str) -> dict[str, Any] | None:
    found = emulator.get(BUDGETS, NS, name)
    conditions = ((found or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Ready"), None)


async def test_a_budget_the_operator_cannot_read_says_so_in_its_ready_condition(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    """A time zone the schema's shape accepts but no zone database has: the budget counts and holds
    nothing, and says so (field and fix) instead of a line in the operator's log only; fixed, it counts."""
    await start_operator(emulator, run_operator)
    emulator.create(
        BUDGETS, budget("zone", "1", period={"calendar": "Month", "timeZone": "Mars/Olympus"}), namespace=NS
    )
    refused = await emulator.wait_for(lambda: ready(emulator, "zone"), timeout=10, message="the Ready condition")
    assert (refused["status"], refused["reason"]) == ("False", "InvalidSpec")
    assert "spec.period.timeZone" in refused["message"]
    assert "unknown time zone 'Mars/Olympus'" in refused["message"]
    stored = emulator.get(BUDGETS, NS, "zone")
    assert stored is not None
    assert "spent" not in stored["status"]
    # A job its 1 USD limit would hold runs: the budget holds nothing while unreadable.
    emulator.create(JOBS, job_with({"spec.maxDuration": "1h"}))
    await expect_pods(emulator, {worker(0): "0"})
    emulator.patch(BUDGETS, NS, "zone", {"spec": {"period": {"timeZone": "Europe/Berlin"}}})
    counting = await emulator.wait_for(
        lambda: (c := ready(emulator, "zone")) and c["status"] == "True" and c, timeout=10, message="Ready True"
    )
    assert counting["reason"] == "Counting"
    assert "BudgetExceeded" in counting["message"]
    stored = emulator.get(BUDGETS, NS, "zone")
    assert stored is not None
    assert stored["status"]["period"]["start"].endswith("+01:00")
