"""The operator's Metrics with every metric of ours observed at least once, and the job statuses
that feed them: for the naming checks of tests/unit/test_metrics.py and promlint's
(tests/metrics/test_promlint.py)."""

from __future__ import annotations

from datetime import datetime, timedelta

from dgx_operator.api.trainingjob import DGXTrainingJobStatus
from dgx_operator.controllers.metrics import JOB_KIND, MOUNT_KIND, Metrics
from tests.unit.planner_sim import T0


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


CREATED = T0  # the job's creationTimestamp


def status_with(*conditions: tuple[str, str, float], phase: str = "Pending") -> DGXTrainingJobStatus:
    return DGXTrainingJobStatus.model_validate(
        {
            "phase": phase,
            "conditions": [
                {"type": t, "status": s, "reason": "R", "lastTransitionTime": stamp(T0 + timedelta(seconds=at))}
                for t, s, at in conditions
            ],
        }
    )


def populated() -> Metrics:
    """A registry with every metric of ours observed at least once."""
    m = Metrics()
    m.reconciled(JOB_KIND, "ok", 0.01)
    m.reconciled(MOUNT_KIND, "error", 2.0)
    m.phase(JOB_KIND, ("ml", "a"), "Running")
    m.phase(MOUNT_KIND, ("ml", "d"), "Ready")
    m.api_error("patch", 409)
    m.restarted("WorkerLost", 2)
    running = status_with(("Running", "True", 10), ("Finished", "False", 0), phase="Running")
    done = status_with(("Running", "False", 20), ("Succeeded", "True", 20), ("Finished", "True", 20), phase="Succeeded")
    done.start_time, done.completion_time = T0, T0 + timedelta(minutes=20)
    done.conditions[1].reason = "Completed"
    m.job_status_written(CREATED, status_with(("Running", "False", 0), ("Finished", "False", 0)), running)
    m.job_status_written(CREATED, running, done)
    m.admission(JOB_KIND, "CREATE", "denied", 0.003)
    m.leading(True)
    return m
