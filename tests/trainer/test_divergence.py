"""A diverged run stops itself (training.stopOnNonFiniteLoss), names LossDiverged with the fix in
its termination message, and is not trained again by torchrun's restarts of the same config.

Real torch on the CPU: a learning rate of 1.0 without gradient clipping drives the tiny Llama's
loss to NaN within a few dozen steps (step 19 with the base config's seed), which is what a real
divergence looks like to the trainer: the HF Trainer logs NaN, every rank sees the same mean.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.trainer.conftest import config_data, run_trainer, write_config

#: A learning rate that makes the loss NaN, reported at every step.
DIVERGING = {
    "training.maxSteps": 60,
    "training.learningRate": 1.0,
    "training.maxGradNorm": 0.0,
    "training.loggingSteps": 1,
    "training.saveSteps": 1000,
}


def termination(out: Path) -> str:
    return (out / "termination-log").read_text(encoding="utf-8")


def non_finite_steps(events: list[dict[str, object]]) -> list[int]:
    """Steps whose progress line has no loss: the trainer writes NaN as null (JSON has no NaN)."""
    return [int(str(e["step"])) for e in events if e["event"] == "progress" and e.get("loss") is None]


def test_a_nan_loss_stops_the_run_with_loss_diverged(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_trainer(write_config(tmp_path, config_data(out, DIVERGING)), tmp_path / "logs", output_dir=out)
    assert result.returncode == 4, result.describe()
    nan_steps = non_finite_steps(result.events)
    assert len(nan_steps) == 3, result.describe()  # the default: three reports in a row, then stop
    last = max(int(str(e["step"])) for e in result.events if e["event"] == "progress")
    assert last == nan_steps[-1] < 60, "stopped at the third NaN report, not trained on to maxSteps"
    message = termination(out)
    assert message.startswith("LossDiverged: the training loss was nan at 3 reports in a row"), message
    assert f"steps {', '.join(map(str, nan_steps))}" in message
    assert "lower training.learningRate" in message
    assert not (out / "adapter").exists(), "a diverged run saves no adapter"
    marker = json.loads((out / ".kubedgx" / "diverged.json").read_text(encoding="utf-8"))
    assert marker["message"] in message


def test_the_same_config_is_not_trained_again_but_a_changed_one_is(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = write_config(tmp_path, config_data(out, DIVERGING))
    first = run_trainer(config, tmp_path / "logs-1", output_dir=out)
    assert first.returncode == 4, first.describe()
    # What torchrun's restart of the group would run: the same config, the same output directory.
    again = run_trainer(config, tmp_path / "logs-2", output_dir=out)
    assert again.returncode == 4, again.describe()
    assert [e for e in again.events if e["event"] == "progress"] == [], "not trained again"
    assert "diverged here before" in termination(out)
    # A fixed config (here: stopping turned off, as a user who wants the NaN run would) trains.
    changes = {**DIVERGING, "training.maxSteps": 22, "training.stopOnNonFiniteLoss": 0}
    fixed = write_config(tmp_path, config_data(out, changes))
    third = run_trainer(fixed, tmp_path / "logs-3", output_dir=out)
    assert third.returncode == 0, third.describe()
    assert max(int(str(e["step"])) for e in third.events if e["event"] == "progress") == 22


def test_the_limit_counts_reports_in_a_row() -> None:
    """A finite loss between NaN reports resets the count; 0 never stops."""
    from types import SimpleNamespace

    import pytest

    from dgx_trainer.train import LossDivergedError, _Divergence

    def feed(callback: _Divergence, losses: list[float]) -> None:
        for step, loss in enumerate(losses, 1):
            callback.on_log(None, SimpleNamespace(global_step=step), None, logs={"loss": loss})

    nan, inf = float("nan"), float("inf")
    feed(_Divergence(3), [1.0, nan, nan, 2.0, nan, inf, 3.0])  # never three in a row
    feed(_Divergence(0), [nan] * 50)
    streak = _Divergence(3)
    feed(streak, [nan, nan])
    streak.on_log(None, SimpleNamespace(global_step=3), None, logs={"eval_loss": nan})  # no training loss
    assert streak.steps == [1, 2]  # an eval report neither counts nor resets
    with pytest.raises(LossDivergedError, match=r"inf at 3 reports in a row \(steps 5, 6, 7\)"):
        feed(_Divergence(3), [1.0, nan, 2.0, 3.0, nan, nan, inf])
