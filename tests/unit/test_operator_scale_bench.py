"""The pure pieces of benchmarks/operator_scale.py: what it reads of kube-scheduler's /metrics, the
plain pods it compares kubedgx's workers with, and the steady-state window's arithmetic."""

from __future__ import annotations

from typing import Any

import pytest
from benchmarks import operator_scale as bench

from dgx_operator.api import DGXTrainingJob
from dgx_operator.catalog import Catalog
from dgx_operator.reconcile.pods import progress_in_log
from dgx_operator.render import BuildContext, build_children

#: kube-scheduler v1.34's /metrics as it reads before and after pods are scheduled (an excerpt).
SCRAPE = """\
# HELP scheduler_schedule_attempts_total [STABLE] Number of attempts to schedule pods, by the result.
# TYPE scheduler_schedule_attempts_total counter
scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"} 160
scheduler_schedule_attempts_total{profile="default-scheduler",result="unschedulable"} 3
scheduler_schedule_attempts_total{profile="other",result="scheduled"} 2
scheduler_scheduling_attempt_duration_seconds_bucket{profile="default-scheduler",result="scheduled",le="0.001"} 4
scheduler_scheduling_attempt_duration_seconds_sum{profile="default-scheduler",result="scheduled"} 1.5
scheduler_scheduling_attempt_duration_seconds_count{profile="default-scheduler",result="scheduled"} 160
scheduler_scheduling_attempt_duration_seconds_sum{profile="default-scheduler",result="unschedulable"} 0.5
scheduler_scheduling_attempt_duration_seconds_count{profile="default-scheduler",result="unschedulable"} 3
scheduler_scheduling_algorithm_duration_seconds_sum 0.25
scheduler_scheduling_algorithm_duration_seconds_count 163
scheduler_framework_extension_point_duration_seconds_sum{extension_point="Filter",profile="default-scheduler",status="Success"} 0.1
scheduler_framework_extension_point_duration_seconds_count{extension_point="Filter",profile="default-scheduler",status="Success"} 160
scheduler_framework_extension_point_duration_seconds_sum{extension_point="Filter",profile="default-scheduler",status="Unschedulable"} 0.06
scheduler_framework_extension_point_duration_seconds_count{extension_point="Filter",profile="default-scheduler",status="Unschedulable"} 3
scheduler_pending_pods{queue="active"} 0
"""  # noqa: E501


def test_the_scheduler_metrics_are_summed_over_profiles_and_results() -> None:
    sample = bench.scheduler_sample(SCRAPE)
    assert sample["attempts scheduled"] == 162
    assert sample["attempts unschedulable"] == 3
    assert sample["attempt sum"] == pytest.approx(2.0)
    assert sample["attempt count"] == 163
    assert sample["algorithm count"] == 163
    assert sample["Filter sum"] == pytest.approx(0.16)
    assert sample["Filter count"] == 163
    assert not any(k.endswith("bucket") or "pending" in k for k in sample)


def test_a_fresh_scheduler_has_no_attempt_series_and_reads_as_zero() -> None:
    """Before the first pod the scheduler has no scheduler_schedule_attempts_total line at all."""
    before = bench.scheduler_sample("scheduler_scheduling_algorithm_duration_seconds_count 0\n")
    delta = bench.metric_delta(bench.scheduler_sample(SCRAPE), before)
    assert delta["attempts scheduled"] == 162
    line = bench.scheduler_detail(delta)
    assert "scheduled 162" in line
    assert "unschedulable 3" in line
    assert "mean attempt 12.27 ms" in line
    assert "algorithm 1.53 ms (1 / that: 652 pods/s)" in line
    assert "Filter 0.98 ms" in line
    assert "PreScore -" in line


def worker_pod() -> dict[str, Any]:
    job = DGXTrainingJob.model_validate(bench.job_manifest(0, "bench-baseline"))
    return next(c for c in build_children(job, BuildContext(Catalog.load())) if c["kind"] == "Pod")


def test_a_plain_pod_asks_a_node_what_a_worker_asks_and_nothing_else() -> None:
    worker = worker_pod()
    plain = bench.plain_pod(worker, "plain-0000-0", "bench-plain")
    assert plain["metadata"] == {"name": "plain-0000-0", "namespace": "bench-plain", "labels": {"bench": "plain"}}
    assert [c["resources"] for c in plain["spec"]["containers"]] == [
        c["resources"] for c in worker["spec"]["containers"]
    ]
    # The kwok nodes carry the GPU pool's taint: without the workers' tolerations nothing would fit.
    assert plain["spec"]["tolerations"] == worker["spec"]["tolerations"]
    assert "affinity" in worker["spec"]
    assert set(plain["spec"]) <= {"containers", "restartPolicy", "tolerations", "nodeSelector"}
    # The node it wants, as a plain pod says it: the product and the GPU count, one value each.
    assert plain["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8",
    }
    assert not any(k.startswith(("kubedgx.io/", "app.kubernetes.io/")) for k in plain["metadata"]["labels"])


def test_the_progress_lines_are_what_the_operator_reads() -> None:
    report = progress_in_log(bench.progress_log(42))
    assert report is not None
    assert report["step"] == 42


@pytest.mark.parametrize(
    ("hold", "interval", "most"),
    [(60, 30, 3), (40, 30, 2), (30, 30, 2), (10, 30, 1), (60, 0, 0)],
)
def test_the_most_progress_writes_a_job_makes_in_a_hold(hold: float, interval: float, most: float) -> None:
    assert bench.hold_bound(hold, interval) == most


def test_writes_per_job_minute() -> None:
    assert bench.per_job_minute(100, 100, 40) == pytest.approx(1.5)
    assert bench.per_job_minute(0, 20, 30) == 0


def test_the_hold_splits_job_status_writes_from_the_rest() -> None:
    def event(resource: str, subresource: str | None = None) -> dict[str, Any]:
        ref = {"resource": resource, **({"subresource": subresource} if subresource else {})}
        return {"verb": "patch", "objectRef": ref}

    events = [event("dgxtrainingjobs", "status"), event("dgxtrainingjobs"), event("leases"), event("pods", "status")]
    assert bench.hold_split(events) == (1, 3)
