"""torchrun with two workers (gloo on CPU): a worker crashes mid-training, the elastic agent restarts
the group, and training resumes from the last complete checkpoint to the end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dgx_api import checkpoints
from tests.trainer.conftest import config_data, run_trainer, write_config

FAULT_STEP = 6
SAVE_STEPS = 4
MAX_STEPS = 12


def test_a_crashed_worker_is_restarted_and_training_resumes(tmp_path: Path, kubedgx_cache: Path) -> None:
    out = tmp_path / "out"
    fault = tmp_path / "fault-fired"
    config = write_config(
        tmp_path,
        config_data(out, {"training.maxSteps": MAX_STEPS, "training.saveSteps": SAVE_STEPS}),
    )
    result = run_trainer(
        config,
        tmp_path / "logs",
        output_dir=out,
        torchrun=True,
        nproc=2,
        max_restarts=2,
        env={"KUBEDGX_FAULT_AT_STEP": str(FAULT_STEP), "KUBEDGX_FAULT_ONCE_FILE": str(fault)},
    )
    assert result.returncode == 0, result.describe()

    # The fault fired exactly once, in rank 0, right after step 6.
    assert fault.read_text(encoding="utf-8") == str(FAULT_STEP)
    assert f"fault injection: exiting at step {FAULT_STEP}" in result.stderr
    assert "exitcode: 17" in result.stderr, "torchrun did not see the worker's exit code 17"

    # Two group starts: the first at step 0, the restart at checkpoint-4 after the crash.
    starts = [i for i, e in enumerate(result.events) if e["event"] == "start"]
    assert [result.events[i]["step"] for i in starts] == [0, SAVE_STEPS], result.describe()
    before = [e for e in result.events[starts[0] : starts[1]] if e["event"] == "progress"]
    after = [e for e in result.events[starts[1] :] if e["event"] == "progress"]
    assert [e["step"] for e in before] == list(range(1, FAULT_STEP)), "the crashed step must not be reported"
    assert [e["step"] for e in after] == list(range(SAVE_STEPS + 1, MAX_STEPS + 1))
    # The re-run step 5 repeats the first attempt's step 5.
    assert after[0]["loss"] == pytest.approx(before[-1]["loss"], abs=1e-5)
    assert all(e["totalSteps"] == MAX_STEPS for e in before + after)

    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary == {k: v for k, v in result.summary.items() if k != "event"}
    assert summary["status"] == "Succeeded"
    assert summary["resumedFrom"] == str(out / f"checkpoint-{SAVE_STEPS}")
    assert summary["step"] == MAX_STEPS
    assert summary["worldSize"] == 2
    assert summary["device"] == "cpu"
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    assert [step for step, _ in checkpoints.complete(out)] == [4, 8, 12]
    termination = json.loads((out / "termination-log").read_text(encoding="utf-8"))
    assert termination["status"] == "Succeeded"
    assert termination["progress"]["step"] == MAX_STEPS
    # Both workers of both rounds used one built-in model, built once under the file lock.
    assert len(list(kubedgx_cache.glob("tiny-llama-*"))) == 1
    assert not list(kubedgx_cache.glob(".tiny-llama-*")), "a staging directory was left behind"
