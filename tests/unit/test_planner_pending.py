"""Pending says why (issue 13.4): the kubelet's waiting reasons (image pulls, a bad secretKeyRef) and
the scheduler's Unschedulable message reach the job's Running condition, its reason (the Reason
column of `kubectl get`) and message; what waiting cannot heal ends the job with that reason.

The Unschedulable case also runs on the real scheduler (tests/cluster/test_operator.py).
"""

from __future__ import annotations

import pytest

from dgx_operator.render import BuildContext
from tests.unit.planner_sim import Sim, created_job, phase_reason, waiting


def running_condition(sim: Sim) -> tuple[str, str]:
    found = next(c for c in sim.status.conditions if c.type == "Running")
    return found.reason, found.message


@pytest.mark.parametrize(
    ("container", "reason", "message"),
    [
        ("trainer", "ImagePullBackOff", 'Back-off pulling image "ghcr.io/acme/trainer:v9"'),
        ("trainer", "ErrImagePull", "rpc error: manifest unknown"),
        ("trainer", "CreateContainerConfigError", "couldn't find key token in Secret ml/hf"),
        ("pull-0", "ImagePullBackOff", 'Back-off pulling image "ghcr.io/acme/datasync:v9"'),
    ],
)
def test_a_waiting_reason_is_the_pending_reason_with_its_message(
    ctx: BuildContext, container: str, reason: str, message: str
) -> None:
    sim = created_job(ctx)
    result = sim.reconcile([waiting(sim, 0, container, reason, message), sim.pod(1, "scheduled")], at_s=30)
    assert sim.phase() == "Pending"
    assert phase_reason(sim.status) == reason
    why, text = running_condition(sim)
    assert why == reason
    assert f"job-worker-0: {reason} ({container}: {message})" in text
    assert result.delete == []  # it may heal: waiting is bounded by maxPending, not cut short


def test_the_scheduler_message_is_shown(ctx: BuildContext) -> None:
    sim = created_job(ctx)
    sim.reconcile([sim.pod(0, "running"), sim.pod(1, "unscheduled")], at_s=30)
    assert sim.phase() == "Pending"
    reason, message = running_condition(sim)
    assert reason == "Unschedulable"
    assert "job-worker-1: Unschedulable: 0/4 nodes are available: 4 Insufficient nvidia.com/gpu." in message
    assert "not scheduled yet" not in message  # the scheduler said why; no vaguer count next to it


def test_max_pending_ends_the_job_with_the_reason_it_waited_for(ctx: BuildContext) -> None:
    sim = created_job(ctx, **{"spec.maxPending": "10m"})
    pods = [waiting(sim, 0, "trainer", "ImagePullBackOff", "Back-off pulling image"), sim.pod(1, "scheduled")]
    sim.reconcile(pods, at_s=30)
    sim.reconcile(pods, at_s=601)
    assert sim.phase() == "Failed"
    failed = next(c for c in sim.status.conditions if c.type == "Failed")
    assert failed.reason == "PendingTimeout"
    assert "ImagePullBackOff" in failed.message


@pytest.mark.parametrize("reason", ["InvalidImageName", "ErrImageNeverPull"])
def test_what_waiting_cannot_heal_ends_the_job(ctx: BuildContext, reason: str) -> None:
    sim = created_job(ctx)
    result = sim.reconcile([waiting(sim, 0, "trainer", reason, "bad image"), sim.pod(1, "scheduled")], at_s=30)
    assert sim.phase() == "Failed"
    failed = next(c for c in sim.status.conditions if c.type == "Failed")
    assert failed.reason == reason
    assert failed.message == f"job-worker-0: container trainer: {reason}: bad image"
    assert sorted(result.delete) == ["job-worker-0", "job-worker-1"]
    assert sim.status.restarts == 0


def test_ordinary_startup_states_are_not_reasons(ctx: BuildContext) -> None:
    sim = created_job(ctx)
    pods = [waiting(sim, 0, "trainer", "ContainerCreating", ""), waiting(sim, 1, "pull-0", "PodInitializing", "")]
    sim.reconcile(pods, at_s=30)
    assert phase_reason(sim.status) == "WorkersPending"
    assert running_condition(sim)[1] == "0/2 workers running, need 2"


def test_a_restarting_job_says_what_its_replacement_waits_for(ctx: BuildContext) -> None:
    sim = created_job(ctx)
    sim.reconcile([sim.pod(0, "running"), sim.pod(1, "running")], at_s=30)
    assert sim.phase() == "Running"
    sim.reconcile([sim.pod(0, "running"), sim.pod(1, "failed", exit_code=137)], at_s=60)
    replacement = waiting(sim, 1, "trainer", "ImagePullBackOff", "Back-off pulling image")
    replacement["metadata"]["labels"]["kubedgx.io/attempt"] = "1"
    sim.reconcile([sim.pod(0, "running"), replacement], at_s=90)
    assert sim.phase() == "Restarting"
    assert "job-worker-1: ImagePullBackOff (trainer: Back-off pulling image)" in running_condition(sim)[1]
