"""Every incident is judged by the restart policy (issue 13.5).

A counted restart replaces only the failed worker; the survivors keep their older attempt label. A
survivor that fails *later* is a new incident, whichever attempt its pod came from; one that fails
within CASCADE_WINDOW of the restart cascades from it (NCCL errors after the peer died) and is
replaced without counting again. Both sides of that line, for each restart policy.
"""

from __future__ import annotations

import pytest

from dgx_operator.reconcile.planner import CASCADE_WINDOW
from dgx_operator.render import BuildContext
from tests.unit.planner_sim import Sim, at, created, event_reasons, sim_of, start_running


def after_one_counted_restart(ctx: BuildContext, policy: str, backoff_limit: int = 5) -> tuple[Sim, float]:
    """Three elastic workers of attempt 0 run; worker 2 exits 137 (retryable) at t=100 and the
    restart is counted. Returns the sim and the time (seconds) the restart was decided."""
    sim = sim_of(
        ctx,
        {
            "spec.elastic": {"minNodes": 3, "maxNodes": 3},
            "spec.restartPolicy": policy,
            "spec.backoffLimit": backoff_limit,
        },
    )
    start_running(sim, 3)
    crashed = sim.pod(2, "failed", exit_code=137, finished=at(100))
    decided = 101.0
    result = sim.reconcile([sim.pod(0, "running"), sim.pod(1, "running"), crashed], at_s=decided)
    assert "WorkerRestarted" in event_reasons(result)
    assert (sim.status.restarts, sim.status.attempt) == (1, 1)
    assert sim.status.last_restart_time == at(decided)
    return sim, decided


def survivor_fails(sim: Sim, at_s: float, exit_code: int, finished_s: float) -> list[str]:
    """Worker 0 (attempt 0, a survivor) fails; worker 1 (attempt 0) and the replacement of worker 2
    (attempt 1) run. Returns the event reasons of the pass."""
    pods = [
        sim.pod(0, "failed", attempt=0, exit_code=exit_code, finished=at(finished_s)),
        sim.pod(1, "running", attempt=0),
        sim.pod(2, "running", attempt=1),
    ]
    return event_reasons(sim.reconcile(pods, at_s=at_s))


def test_a_survivor_failing_later_with_a_permanent_code_ends_the_job(ctx: BuildContext) -> None:
    """The issue's report: ExitCode policy, one counted restart, then a survivor of attempt 0 exits 1
    (not retryable) minutes later. It used to be recreated without counting, for ever."""
    sim, decided = after_one_counted_restart(ctx, "ExitCode")
    later = decided + CASCADE_WINDOW.total_seconds() + 240
    survivor_fails(sim, later + 1, exit_code=1, finished_s=later)
    assert sim.phase() == "Failed"
    failed = next(c for c in sim.status.conditions if c.type == "Failed")
    assert failed.reason == "WorkerFailed"
    assert "exit code 1 is not in retryableExitCodes" in failed.message


def test_a_survivor_failing_in_the_cascade_window_is_the_same_incident(ctx: BuildContext) -> None:
    sim, decided = after_one_counted_restart(ctx, "ExitCode")
    soon = decided + CASCADE_WINDOW.total_seconds() - 1  # NCCL error right after its peer died
    reasons = survivor_fails(sim, soon + 1, exit_code=1, finished_s=soon)
    assert sim.phase() != "Failed"
    assert (sim.status.restarts, sim.status.attempt) == (1, 1)
    assert "WorkerRestarted" not in reasons
    assert sim.last is not None
    assert sim.last.delete == ["job-worker-0"]  # replaced, in the current attempt, not counted
    assert created(sim.last) == []  # its name is free only once the deletion is observed


@pytest.mark.parametrize("policy", ["OnFailure", "ExitCode"])
def test_a_later_retryable_failure_of_a_survivor_counts_a_restart(ctx: BuildContext, policy: str) -> None:
    sim, decided = after_one_counted_restart(ctx, policy)
    later = decided + CASCADE_WINDOW.total_seconds() + 1
    reasons = survivor_fails(sim, later + 5, exit_code=137, finished_s=later)
    assert "WorkerRestarted" in reasons
    assert (sim.status.restarts, sim.status.attempt) == (2, 2)
    assert sim.status.last_restart_time == at(later + 5)


def test_a_later_failure_of_a_survivor_can_exhaust_the_backoff_limit(ctx: BuildContext) -> None:
    sim, decided = after_one_counted_restart(ctx, "OnFailure", backoff_limit=1)
    later = decided + 3600
    survivor_fails(sim, later + 1, exit_code=137, finished_s=later)
    assert sim.phase() == "Failed"
    assert next(c for c in sim.status.conditions if c.type == "Failed").reason == "BackoffLimitExceeded"


def test_an_uncounted_replacement_also_opens_a_cascade_window(ctx: BuildContext) -> None:
    """A disruption (spot reclaim) is an incident too: the survivors' NCCL errors right after it
    are its cascade, not a program failure to count."""
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2, "maxNodes": 2}, "spec.restartPolicy": "ExitCode"})
    start_running(sim, 2)
    sim.reconcile([sim.pod(0, "running"), sim.pod(1, "disruption")], at_s=100)
    assert (sim.status.restarts, sim.status.attempt) == (0, 1)
    assert sim.status.last_restart_time == at(100)
    reasons = survivor_fails_two(sim, at_s=125, finished_s=120)
    assert sim.phase() != "Failed"
    assert "WorkerRestarted" not in reasons
    assert sim.status.restarts == 0


def survivor_fails_two(sim: Sim, at_s: float, finished_s: float) -> list[str]:
    pods = [
        sim.pod(0, "failed", attempt=0, exit_code=1, finished=at(finished_s)),
        sim.pod(1, "running", attempt=1),
    ]
    return event_reasons(sim.reconcile(pods, at_s=at_s))
