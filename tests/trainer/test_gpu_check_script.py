"""benchmarks/gpu_moe_qlora.py is the one short script a session lent a GPU runs (issue 14): it must
work before device time is spent on it, so it runs here on the CPU, a few steps, and its figures
must say what the run did."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_prepared_gpu_check_runs_on_the_cpu_and_reports_trained_4bit_experts() -> None:
    spec = importlib.util.spec_from_file_location("gpu_moe_qlora", ROOT / "benchmarks" / "gpu_moe_qlora.py")
    assert spec is not None
    assert spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert script.main(["--steps", "2"]) == 0
    figures = json.loads(out.getvalue())
    assert figures["device"] == "cpu"
    assert figures["quantization"] == "nf4"
    assert figures["steps"] == 2
    assert figures["stepsPerSecond"] > 0
    assert 0 < figures["bytesPerParameter"] <= 0.6  # fp32 on the CPU; the 4-bit experts keep it low
    adapters = figures["adapters"]
    assert adapters["expertTensors"] == 8  # lora_A and lora_B of both expert stacks in both layers
    assert adapters["loraBTrained"] == adapters["loraB"] > 0, adapters
    assert figures["auxLoss"] > 0
