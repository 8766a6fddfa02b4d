"""A refused child is a status, not a retry loop (issue 13.3, the operator's half): a create the
apiserver refuses for good ends the job with its message; one a ResourceQuota refuses is a
WorkersPending condition, retried on a timer. The controller plans again knowing the refusal
(Observed.refused); the real apiserver's answers are in tests/cluster/test_operator.py.
"""

from __future__ import annotations

import dataclasses

from dgx_operator.reconcile.planner import QUOTA_RETRY_SECONDS, Refused, plan
from dgx_operator.render import BuildContext
from tests.unit.planner_sim import Sim, cond, created, event_reasons, observe, phase_reason, sim_of, step

POD_SECURITY = (
    'pods "job-worker-1" is forbidden: violates PodSecurity "restricted:latest": seccompProfile (pod or container '
    '"trainer" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")'
)
QUOTA = 'pods "job-worker-1" is forbidden: exceeded quota: gpus, requested: pods=1, used: pods=1, limited: pods=1'


def replan(sim: Sim, pods: list[dict[str, object]], refused: Refused, at_s: float) -> None:
    """What the controller does: the pass's creates met ``refused``; plan that pass again knowing it."""
    first = plan(sim.job, sim.ctx, observe(pods), sim.now)
    assert ("Pod", refused.name) in {(c["kind"], c["metadata"]["name"]) for c in first.create}
    retry = dataclasses.replace(observe(pods), refused=(refused,))
    result = plan(sim.job, sim.ctx, retry, sim.now)
    sim.job = step(sim.job, result)
    sim.last = result


def test_a_permanent_refusal_fails_the_job_with_the_apiservers_message_and_one_event(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2, "maxNodes": 2}})
    replan(sim, [], Refused("Pod", "job-worker-1", permanent=True, message=POD_SECURITY), at_s=0)
    assert sim.phase() == "Failed"
    assert phase_reason(sim.status) == "CreateRefused"
    failed = next(c for c in sim.status.conditions if c.type == "Failed")
    assert failed.message == f"the apiserver refused to create Pod job-worker-1: {POD_SECURITY}"
    assert sim.last is not None
    assert sim.last.create == []
    assert event_reasons(sim.last) == ["CreateRefused"]
    # The next pass (nothing refused any more: nothing is created) keeps it Failed, silently.
    again = sim.reconcile([], at_s=10)
    assert (again.create, event_reasons(again), sim.phase()) == ([], [], "Failed")


def test_a_quota_refusal_waits_with_a_condition_and_retries_on_a_timer(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 1, "maxNodes": 2}})
    refused = Refused("Pod", "job-worker-1", permanent=False, message=QUOTA)
    replan(sim, [], refused, at_s=0)  # worker 0 is created, worker 1 refused
    assert sim.last is not None
    assert created(sim.last) == [0]
    assert sim.workers().active == 1  # the refused worker is not counted (nor "lost" next time)
    worker0 = sim.pod(0, "running")
    # The timer: worker 1 refused again, worker 0 runs now.
    replan(sim, [worker0], refused, at_s=30)
    assert sim.last.create == []
    assert sim.phase() == "Running"  # minNodes 1 runs
    assert cond(sim.status, "WorkersPending") == ("True", "QuotaExceeded")
    pending = next(c for c in sim.status.conditions if c.type == "WorkersPending")
    assert QUOTA in pending.message
    assert event_reasons(sim.last) == ["ElasticMinimumRunning"]  # QuotaExceeded was the first pass's
    assert "WorkerLost" not in event_reasons(sim.last)
    assert sim.last.requeue_after is not None
    assert sim.last.requeue_after <= QUOTA_RETRY_SECONDS
    # Refused again on the timer: the condition stays, no new event.
    replan(sim, [worker0], refused, at_s=60)
    assert event_reasons(sim.last) == []
    assert cond(sim.status, "WorkersPending") == ("True", "QuotaExceeded")
    # The quota has room: the create goes through; the condition says so.
    through = sim.reconcile([worker0], at_s=90)
    assert created(through) == [1]
    assert cond(sim.status, "WorkersPending") == ("False", "WorkersCreated")


def test_a_quota_refusal_before_anything_runs_is_the_pending_reason(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2, "maxNodes": 2}})
    replan(sim, [], Refused("Pod", "job-worker-1", permanent=False, message=QUOTA), at_s=0)
    assert sim.phase() == "Pending"
    assert phase_reason(sim.status) == "QuotaExceeded"
    assert sim.last is not None
    assert created(sim.last) == [0]  # worker 0 was not refused: it is created
    assert "QuotaExceeded" in event_reasons(sim.last)
