"""`training.reportTo`: TensorBoard event files land in the run's output (so an Out mount archives
them) and hold the losses the progress lines report; MLflow and W&B default to the output too."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgx_api.trainer_config import ConfigError
from dgx_trainer import tracking
from tests.trainer.conftest import config_data, run_trainer, write_config


def test_tensorboard_event_files_are_written_into_the_output_and_hold_the_reported_losses(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = write_config(tmp_path, config_data(out, {"training.maxSteps": 4, "training.reportTo": ["tensorboard"]}))
    result = run_trainer(config, tmp_path / "logs", output_dir=out)
    assert result.returncode == 0, result.describe()

    files = tracking.event_files(out)
    assert files, f"no TensorBoard event files under {out / 'runs'}"
    assert all(f.is_relative_to(out / "runs") for f in files)
    logged = tracking.scalars(out, "train/loss")
    assert [step for step, _ in logged] == [1, 2, 3, 4]
    for step, value in logged:
        assert value == pytest.approx(result.losses[step], rel=1e-5), f"step {step}"


def test_a_run_without_report_to_writes_no_tracker_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = write_config(tmp_path, config_data(out, {"training.maxSteps": 1}))
    result = run_trainer(config, tmp_path / "logs", output_dir=out)
    assert result.returncode == 0, result.describe()
    assert not (out / "runs").exists()
    assert not (out / "mlruns").exists()


def test_trackers_default_to_the_output_directory_and_wandb_to_offline(tmp_path: Path) -> None:
    env = tracking.environment(["tensorboard", "mlflow", "wandb"], tmp_path, {})
    assert env == {
        "TENSORBOARD_LOGGING_DIR": str(tmp_path / "runs"),
        "MLFLOW_TRACKING_URI": (tmp_path / "mlruns").resolve().as_uri(),
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
    }
    # What the pod's environment names wins: a tracking server is the user's to choose.
    mine = {"MLFLOW_TRACKING_URI": "http://mlflow.internal:5000", "WANDB_MODE": "online"}
    assert tracking.environment(["mlflow", "wandb"], tmp_path, mine) == {"WANDB_DIR": str(tmp_path)}
    assert tracking.environment([], tmp_path, {}) == {}


def test_a_tracker_that_is_not_installed_is_a_config_error_naming_report_to(monkeypatch: pytest.MonkeyPatch) -> None:
    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(
        tracking.importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(ConfigError) as caught:
        tracking.check(["tensorboard", "wandb"])
    [problem] = caught.value.problems
    assert problem.path == "training.reportTo"
    assert "wandb is not installed" in problem.message
    assert "pip install wandb" in problem.message
    tracking.check(["tensorboard"])  # installed: no error


def test_the_pre_launch_check_refuses_a_missing_tracker_before_any_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dgx_api.trainer_config import parse_config
    from dgx_trainer import launch

    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(
        tracking.importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a)
    )
    cfg = parse_config(config_data(tmp_path / "out", {"training.reportTo": ["mlflow"]}))
    [problem] = launch.check(cfg, tmp_path, {})
    assert problem.path == "training.reportTo"
    assert "mlflow is not installed" in problem.message
