"""The planner and the namespace's guard rails (planner/guardrails.py, timers.py): at a job's first
pass the defaults it takes are pinned into status.limits and run its clocks (a later edit of the limits
moves nothing), and a job that breaks a limit (it slipped past the webhook) fails InvalidSpec; a job
already under way is never failed for a limit."""

from __future__ import annotations

from typing import Any

from dgx_operator.api.limits import DGXLimits
from dgx_operator.render import BuildContext
from dgx_operator.validation.limits import Effective, effective
from tests.unit.planner_sim import created, sim_of


def limits(spec: dict[str, Any]) -> Effective:
    body = {
        "apiVersion": "kubedgx.io/v1alpha1",
        "kind": "DGXLimits",
        "metadata": {"name": "default", "namespace": "ml"},
    }
    return effective(None, DGXLimits.model_validate({**body, "spec": spec}), "ml")


ONE_HOUR = limits({"maxDuration": {"default": "1h"}, "maxPending": {"default": "30m"}})


def condition(sim: Any, type_: str) -> Any:
    return next(c for c in sim.status.conditions if c.type == type_)


def test_the_default_deadline_is_pinned_and_a_later_edit_of_the_limits_does_not_move_it(ctx: BuildContext) -> None:
    sim = sim_of(ctx)
    first = sim.reconcile(at_s=0, limits=ONE_HOUR)
    assert sim.job.spec.max_duration is None  # the spec is never written
    pinned = sim.status.limits
    assert pinned is not None
    assert (pinned.max_duration, pinned.max_pending, pinned.source) == ("1h", "30m", "DGXLimits ml/default")
    # The worker carries what is left of the pinned default, as it would of spec.maxDuration.
    (worker,) = [c for c in first.create if c["kind"] == "Pod"]
    assert worker["spec"]["activeDeadlineSeconds"] == 3600
    sim.reconcile([sim.pod(0, "running")], at_s=60, limits=limits({"maxDuration": {"default": "10h"}}))
    assert sim.phase() == "Running"
    assert sim.status.limits == pinned
    sim.reconcile([sim.pod(0, "running")], at_s=3601)
    assert sim.phase() == "Failed"
    failed = condition(sim, "Failed")
    assert failed.reason == "DeadlineExceeded"
    assert failed.message == (
        "the job ran longer than maxDuration (1h, the default of DGXLimits ml/default, pinned in status.limits)"
    )


def test_the_spec_wins_over_a_default(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.maxDuration": "2h"})
    first = sim.reconcile(at_s=0, limits=limits({"maxDuration": {"default": "1h"}}))
    assert sim.status.limits is None
    (worker,) = [c for c in first.create if c["kind"] == "Pod"]
    assert worker["spec"]["activeDeadlineSeconds"] == 7200


def test_the_pinned_max_pending_ends_a_job_that_waits_for_nodes(ctx: BuildContext) -> None:
    sim = sim_of(ctx)
    sim.reconcile(at_s=0, limits=ONE_HOUR)
    sim.reconcile([sim.pod(0, "unscheduled")], at_s=10)
    sim.reconcile([sim.pod(0, "unscheduled")], at_s=1801)
    assert sim.phase() == "Failed"
    failed = condition(sim, "Failed")
    assert failed.reason == "PendingTimeout"
    assert failed.message.startswith(
        "fewer than minNodes workers ran for maxPending (30m, the default of DGXLimits ml/default, pinned in "
        "status.limits): "
    )


def test_an_interactive_session_takes_the_interactive_default(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.debug": {"interactive": True}})
    sim.reconcile(at_s=0, limits=limits({"maxDuration": {"default": "24h"}, "interactive": {"default": "4h"}}))
    assert sim.status.limits is not None
    assert sim.status.limits.max_duration == "4h"


def test_a_job_that_slipped_past_the_webhook_fails_invalid_spec_at_its_first_pass(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.priority": "high"})
    result = sim.reconcile(at_s=0, limits=limits({"priorities": ["low", "normal"]}))
    assert created(result) == []
    assert sim.phase() == "Failed"
    failed = condition(sim, "Failed")
    assert failed.reason == "InvalidSpec"
    assert failed.message == (
        "the job breaks the namespace's guard rails (the webhook, which refuses this at kubectl apply, did not "
        "check it): spec.priority: high is not allowed in namespace ml (DGXLimits ml/default allows low, normal)"
    )


def test_a_job_under_way_is_never_failed_for_a_limit(ctx: BuildContext) -> None:
    sim = sim_of(ctx, {"spec.priority": "high"})
    sim.reconcile(at_s=0)  # no limits when it was made
    assert sim.phase() == "Pending"
    strict = limits({"priorities": ["low"], "maxDuration": {"max": "1h"}})
    sim.reconcile([sim.pod(0, "running")], at_s=10, limits=strict)
    assert sim.phase() == "Running"
    assert sim.status.limits is None
