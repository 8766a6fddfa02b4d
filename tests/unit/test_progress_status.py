"""The trainer's GPU figures reach the job's status.progress (docs/trainer.md, "Throughput"): a line
the trainer's Reporter prints with gpuUtilization, gpuMemoryUsedBytes, gpuMemoryTotalBytes and mfu,
read from worker 0's log as the controller reads it, planned into the status and allowed by the
CRD's structural schema (which would otherwise prune the fields on write)."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pytest
import yaml

from dgx_api import progress
from dgx_api.progress import FlopsBasis, GpuSample, Reporter
from dgx_operator.reconcile.planner import plan
from dgx_operator.reconcile.pods import progress_in_log
from dgx_operator.render import BuildContext
from tests.unit.planner_sim import observe, sim_of, start_running

ROOT = Path(__file__).resolve().parents[2]
GPU_FIELDS = {"gpuUtilization", "gpuMemoryUsedBytes", "gpuMemoryTotalBytes", "mfu"}


class OneGpu:
    def sample(self) -> GpuSample:
        return GpuSample("NVIDIA H200", 93.5, 70 * 2**30, 141 * 2**30)


def trainer_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """What the trainer prints on a GPU: a start line, then a progress line 2 s of tokens later."""
    clock = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    reporter = Reporter(
        tmp_path,
        precision="bf16",
        quantization="nf4",
        samples_per_step=8,
        enabled=True,
        stream=out,
        gpu=OneGpu(),
        flops=FlopsBasis(flops_per_token=4e9, peak_flops=989e12),
    )
    reporter.start(0, 100)
    clock[0] += 2.0
    reporter.log(10, 100, 0.1, {"loss": 1.5, "num_tokens": 49450.0})
    return out.getvalue()


def test_the_gpu_figures_of_worker_0s_log_reach_status_progress(
    ctx: BuildContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = progress_in_log(trainer_log(tmp_path, monkeypatch))
    assert report is not None
    assert report.keys() >= GPU_FIELDS
    sim = sim_of(ctx)
    start_running(sim, 1)
    running = dataclasses.replace(observe([sim.pod(0, "running")]), progress=report)
    status = plan(sim.job, ctx, running, sim.now).status
    assert status.progress is not None
    written = status.progress.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert {k: written[k] for k in GPU_FIELDS} == {
        "gpuUtilization": 93.5,
        "gpuMemoryUsedBytes": 70 * 2**30,
        "gpuMemoryTotalBytes": 141 * 2**30,
        "mfu": 0.1,  # 24,725 tokens/s x 4e9 FLOPs / 989e12
    }


def test_a_cpu_report_has_none_of_them(ctx: BuildContext) -> None:
    sim = sim_of(ctx)
    start_running(sim, 1)
    live = {"step": 10, "totalSteps": 100, "loss": 2.5, "tokensPerSecond": 900.0}
    status = plan(sim.job, ctx, dataclasses.replace(observe([sim.pod(0, "running")]), progress=live), sim.now).status
    assert status.progress is not None
    assert not GPU_FIELDS & status.progress.model_dump(by_alias=True, exclude_none=True).keys()


def test_the_crd_keeps_the_gpu_figures() -> None:
    """(The chart's copy is checked against this file by test_crdgen.)"""
    crd = yaml.safe_load((ROOT / "crds" / "kubedgx.io_dgxtrainingjobs.yaml").read_text(encoding="utf-8"))
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = schema["properties"]["status"]["properties"]["progress"]["properties"]
    assert fields.keys() >= GPU_FIELDS
    assert (fields["gpuUtilization"]["minimum"], fields["gpuUtilization"]["maximum"]) == (0, 100)
    assert fields["gpuMemoryUsedBytes"]["type"] == "integer"
    assert fields["mfu"]["type"] == "number"
