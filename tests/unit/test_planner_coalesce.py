"""Status writes coalesced (issue 30.1, reconcile/planner/coalesce.py): the counts in flight (running
workers, NODES, the numbers in a condition's message) are written at most once per status interval,
everything a reader acts on at once, and the status is never more than an interval behind.

The Sim counts a write whenever a plan's status differs from the stored one, as the controller's
merge patch does; its clock is explicit.
"""

from __future__ import annotations

from typing import Any

import pytest

from dgx_operator.reconcile.planner.coalesce import SETTLE
from dgx_operator.render import BuildContext
from tests.unit.planner_sim import Sim, created, pods_of, sim_of

WORKERS = 8
INTERVAL = 10.0


def job(ctx: BuildContext, *, min_nodes: int = WORKERS, interval: float = INTERVAL, **changes: Any) -> Sim:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": min_nodes, "maxNodes": WORKERS}, **changes})
    sim.status_interval = interval
    assert created(sim.reconcile(at_s=0)) == list(range(WORKERS))
    assert sim.writes == 1  # the job's start: Pending, its workers counted active
    return sim


def not_scheduled(sim: Sim, index: int) -> dict[str, Any]:
    """A worker as created: Pending, no node yet, nothing said about it."""
    pod = sim.pod(index, "scheduled")
    pod["status"] = {"phase": "Pending"}
    return pod


def states(sim: Sim, running: int, scheduled: int = 0) -> list[dict[str, Any]]:
    """The first ``running`` workers run, the next ``scheduled`` wait for their containers, the
    rest wait for a node."""
    pods = []
    for i in range(WORKERS):
        if i < running:
            pods.append(sim.pod(i, "running"))
        elif i < running + scheduled:
            pods.append(sim.pod(i, "scheduled"))
        else:
            pods.append(not_scheduled(sim, i))
    return pods


def running_message(sim: Sim) -> str:
    return next(c.message for c in sim.status.conditions if c.type == "Running")


@pytest.mark.parametrize("gap", [0.0, 0.25, 0.5])
def test_workers_turning_running_one_by_one_make_two_writes(ctx: BuildContext, gap: float) -> None:
    """The issue's pin: N workers scheduled and then Running one by one make at most two status
    writes, the job's start and its Running transition, which carries every count (all within an
    interval; further apart, see test_slow_workers_are_shown_within_an_interval)."""
    sim = job(ctx)
    t = 0.5
    for k in range(1, WORKERS + 1):  # scheduled one by one
        sim.reconcile(states(sim, 0, scheduled=k), at_s=t)
        t += gap
    for k in range(1, WORKERS + 1):  # then Running one by one
        sim.reconcile(states(sim, k, scheduled=WORKERS - k), at_s=t)
        t += gap
    assert sim.writes <= 2
    assert sim.phase() == "Running"
    assert sim.status.nodes == f"{WORKERS}/{WORKERS}"
    assert sim.workers().ready == WORKERS
    assert running_message(sim).startswith(f"{WORKERS}/{WORKERS} workers running")


def test_without_an_interval_every_count_is_a_write(ctx: BuildContext) -> None:
    """The same walk with the interval 0 (the setting's off switch): one write per change, which
    is what the coalescing saves."""
    sim = job(ctx, interval=0)
    for k in range(1, WORKERS + 1):
        sim.reconcile(states(sim, k, scheduled=WORKERS - k), at_s=float(k))
    assert sim.writes == 1 + WORKERS


def test_a_held_count_goes_out_when_the_interval_ends(ctx: BuildContext) -> None:
    sim = job(ctx)
    assert sim.status.nodes == f"0/{WORKERS}"
    three = states(sim, 3, scheduled=2)
    result = sim.reconcile(three, at_s=4)
    assert sim.writes == 1  # held: only counts moved
    assert sim.status.nodes == f"0/{WORKERS}"
    assert result.requeue_after == pytest.approx(INTERVAL - 4)  # the pass that writes it is asked for
    sim.reconcile(three, at_s=INTERVAL)
    assert sim.writes == 2
    assert sim.status.nodes == f"3/{WORKERS}"
    assert sim.workers().ready == 3
    assert running_message(sim).startswith(f"3/{WORKERS} workers running, need {WORKERS} (3 not scheduled yet)")


def test_slow_workers_are_shown_within_an_interval_and_the_settle(ctx: BuildContext) -> None:
    """Workers further apart than the interval: each count waits SETTLE (a transition may follow it
    within seconds) and is then written, so the status is never more than an interval plus SETTLE
    behind."""
    sim = job(ctx)
    settle = SETTLE.total_seconds()
    for k in range(1, 4):
        pods = states(sim, k, scheduled=WORKERS - k)
        result = sim.reconcile(pods, at_s=INTERVAL * 2 * k)
        assert sim.workers().ready == k - 1
        assert result.requeue_after == pytest.approx(settle)
        sim.reconcile(pods, at_s=INTERVAL * 2 * k + settle)
        assert sim.workers().ready == k
    assert sim.writes == 4


def test_a_count_a_transition_follows_within_the_settle_rides_along(ctx: BuildContext) -> None:
    """As seen at N=300 on the real control plane: a job's first worker Running long after its start,
    the rest a second later. The first count waits; the Running transition carries it."""
    sim = job(ctx)
    sim.reconcile(states(sim, 1, scheduled=WORKERS - 1), at_s=40)
    assert sim.writes == 1
    sim.reconcile(states(sim, WORKERS), at_s=41)
    assert (sim.writes, sim.phase(), sim.status.nodes) == (2, "Running", f"{WORKERS}/{WORKERS}")


def test_what_a_reader_acts_on_is_written_at_once(ctx: BuildContext) -> None:
    """Within the interval: the elastic minimum reached (phase), every worker running (reason), a
    worker failing (a restart) are each written in the pass that sees them."""
    sim = job(ctx, min_nodes=2)
    sim.reconcile(states(sim, 1, scheduled=WORKERS - 1), at_s=1)
    assert sim.writes == 1
    sim.reconcile(states(sim, 2, scheduled=WORKERS - 2), at_s=2)
    assert (sim.writes, sim.phase(), sim.status.nodes) == (2, "Running", f"2/{WORKERS}")
    sim.reconcile(states(sim, 5, scheduled=WORKERS - 5), at_s=3)
    assert (sim.writes, sim.status.nodes) == (2, f"2/{WORKERS}")  # elastic growth alone: held
    everyone = states(sim, WORKERS)
    sim.reconcile(everyone, at_s=4)
    reason = next(c.reason for c in sim.status.conditions if c.type == "Running")
    assert (sim.writes, reason, sim.status.nodes) == (3, "AllWorkersRunning", f"{WORKERS}/{WORKERS}")
    failing = [*everyone[:-1], sim.pod(WORKERS - 1, "failed", exit_code=1, message="boom")]
    sim.reconcile(failing, at_s=5)
    assert sim.writes == 4
    assert sim.status.restarts == 1


def test_a_reason_change_is_written_at_once(ctx: BuildContext) -> None:
    sim = job(ctx)
    pods = states(sim, 2, scheduled=WORKERS - 2)
    pods[-1] = sim.pod(WORKERS - 1, "unscheduled")
    sim.reconcile(pods, at_s=1)
    assert sim.writes == 2
    reason = next(c.reason for c in sim.status.conditions if c.type == "Running")
    assert reason == "Unschedulable"


def test_progress_is_written_at_once_with_the_counts_beside_it(ctx: BuildContext) -> None:
    sim = job(ctx, min_nodes=2)
    sim.reconcile(states(sim, 2, scheduled=WORKERS - 2), at_s=1)
    written = sim.writes
    report = {"step": 10, "totalSteps": 100, "loss": 2.5, "updatedAt": "2025-03-01T12:00:02Z"}
    sim.reconcile(states(sim, 4, scheduled=WORKERS - 4), at_s=2, progress=report, progress_live=True)
    assert sim.writes == written + 1
    assert sim.status.progress is not None
    assert sim.status.progress.step == 10
    assert sim.status.nodes == f"4/{WORKERS}"  # rode along


def test_an_operator_that_never_wrote_writes_at_once(ctx: BuildContext) -> None:
    """A restarted operator (or a new leader) does not know when the status was last written."""
    sim = job(ctx)
    sim.written_at = None
    sim.reconcile(states(sim, 3, scheduled=WORKERS - 3), at_s=1)
    assert sim.writes == 2
    assert sim.status.nodes == f"3/{WORKERS}"


def test_the_end_is_written_at_once(ctx: BuildContext) -> None:
    sim = job(ctx)
    sim.reconcile(states(sim, WORKERS), at_s=1)
    done = pods_of(sim, dict.fromkeys(range(WORKERS), "succeeded"))
    sim.reconcile(done, at_s=2)
    assert sim.phase() == "Succeeded"
    assert sim.writes == 3
