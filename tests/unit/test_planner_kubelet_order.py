"""The order in which a real kubelet reports an exit: the trainer container ``terminated`` (and the
pod not Ready) first, the pod's phase about a second later, or only once the native sidecars have
finished their final uploads. kwok writes both at once, so only a real node showed that the job
flashed ``Running -> Restarting -> Succeeded`` with a Warning ``NodesBelowMinimum ... recreating``
on every successful run. A worker in that window has ended its part, it is not lost: the job keeps
its phase, and the pod's phase decides what happens next.
"""

from __future__ import annotations

import pytest

from dgx_operator.render import BuildContext
from tests.unit.planner_sim import Sim, created, deleted, event_reasons, phase_reason, sim_of, start_running


def running_message(sim: Sim) -> str:
    """The message of the Running condition, which says what the workers are doing."""
    found = next(c for c in sim.status.conditions if c.type == "Running")
    return found.message or ""


def two_workers(ctx: BuildContext, **changes: object) -> Sim:
    return sim_of(ctx, {"spec.elastic": {"minNodes": 2, "maxNodes": 2}, **changes})


def test_a_success_goes_running_then_succeeded_and_nothing_in_between(ctx: BuildContext) -> None:
    sim = two_workers(ctx)
    start_running(sim, 2)
    ending = sim.reconcile([sim.pod(0, "exited"), sim.pod(1, "exited")], at_s=600)
    assert (sim.phase(), phase_reason(sim.status)) == ("Running", "AllWorkersRunning")
    assert "2 exited (pod ending)" in running_message(sim)
    assert (event_reasons(ending), created(ending), deleted(ending)) == ([], [], [])
    assert (sim.status.restarts, sim.status.attempt) == (0, 0)
    done = sim.reconcile([sim.pod(0, "succeeded"), sim.pod(1, "succeeded")], at_s=601)
    assert sim.phase() == "Succeeded"
    assert event_reasons(done) == ["Completed"]


def test_workers_that_exit_one_after_the_other_keep_the_job_running(ctx: BuildContext) -> None:
    sim = two_workers(ctx)
    start_running(sim, 2)
    phases: list[str | None] = []
    for pods in (
        [sim.pod(0, "running"), sim.pod(1, "exited")],
        [sim.pod(0, "running"), sim.pod(1, "succeeded")],
        [sim.pod(0, "exited"), sim.pod(1, "succeeded")],
    ):
        result = sim.reconcile(pods, at_s=600 + len(phases))
        phases.append(sim.phase())
        assert (event_reasons(result), created(result), deleted(result)) == ([], [], [])
    assert phases == ["Running", "Running", "Running"]
    sim.reconcile([sim.pod(0, "succeeded"), sim.pod(1, "succeeded")], at_s=700)
    assert sim.phase() == "Succeeded"


def test_a_single_worker_that_exited_is_not_recreated_before_its_phase(ctx: BuildContext) -> None:
    sim = sim_of(ctx)
    start_running(sim, 1)
    ending = sim.reconcile([sim.pod(0, "exited")], at_s=600)
    assert sim.phase() == "Running"
    assert (event_reasons(ending), created(ending), deleted(ending)) == ([], [], [])


@pytest.mark.parametrize(("policy", "after"), [("OnFailure", "Restarting"), ("Never", "Failed")])
def test_a_failed_exit_is_decided_by_the_pods_phase_not_before(ctx: BuildContext, policy: str, after: str) -> None:
    """Exit 1 with the phase still Running: no restart is counted and nothing is recreated until
    the kubelet says Failed; then the restart policy decides as it always does."""
    sim = two_workers(ctx, **{"spec.restartPolicy": policy})
    start_running(sim, 2)
    ending = sim.reconcile([sim.pod(0, "running"), sim.pod(1, "exited", exit_code=1)], at_s=600)
    assert (sim.phase(), sim.status.restarts) == ("Running", 0)
    assert (event_reasons(ending), created(ending), deleted(ending)) == ([], [], [])
    assert "1 exited (pod ending)" in running_message(sim)
    sim.reconcile([sim.pod(0, "running"), sim.pod(1, "failed", exit_code=1)], at_s=601)
    assert sim.phase() == after


def test_an_exited_worker_does_not_stand_in_for_a_missing_one_below_the_minimum(ctx: BuildContext) -> None:
    """The window holds the phase only for workers that were there: one exited worker of two with
    the other gone is still below minNodes."""
    sim = two_workers(ctx)
    start_running(sim, 2)
    sim.reconcile([sim.pod(0, "exited")], at_s=600)  # worker 1 vanished (a node lost)
    assert sim.phase() == "Restarting"
