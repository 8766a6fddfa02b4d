"""Experiment trackers (`training.reportTo`): TensorBoard, MLflow, W&B, through the HF Trainer's own
integrations, pointed at the run's output directory unless the environment says otherwise.

Why the output directory: a pod's file system is gone when it ends, and the output directory is
the one place an Out data mount archives. TensorBoard event files under ``<output>/runs`` travel
with the checkpoints and the adapter; MLflow without ``MLFLOW_TRACKING_URI`` writes a file store
under ``<output>/mlruns``; W&B without ``WANDB_MODE`` runs offline into ``<output>/wandb`` (a cluster
node seldom reaches wandb.ai, and an online W&B that cannot connect retries for minutes before the
first step). Whatever the user set in the pod's environment wins: a tracking server is theirs to
name. Only global rank 0 writes; the HF callbacks check that themselves.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dgx_api.schema import Problem
from dgx_api.trainer_config import ConfigError

#: reportTo entry -> the module the HF integration needs, and the pip package that has it.
MODULES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "mlflow": ("mlflow", "mlflow-skinny"),
    "wandb": ("wandb", "wandb"),
}


def check(report_to: Sequence[str]) -> None:
    """A tracker whose library is not installed is a config error now, not an ImportError after the
    model has loaded (the HF Trainer raises it when it builds its callbacks)."""
    missing = [name for name in report_to if importlib.util.find_spec(MODULES[name][0]) is None]
    if missing:
        packages = " ".join(MODULES[name][1] for name in missing)
        raise ConfigError(
            "trainer config",
            [
                Problem(
                    "training.reportTo",
                    f"{', '.join(missing)} is not installed in this image: build one FROM the trainer image "
                    f"with `pip install {packages}` (kubedgx-trainer[tracking] has them), or remove it from reportTo",
                )
            ],
        )


def environment(report_to: Sequence[str], output_dir: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The variables to set so each tracker writes into ``output_dir``; those ``env`` already has
    are left out (the user's choice wins)."""
    wanted: dict[str, str] = {}
    if "tensorboard" in report_to:
        wanted["TENSORBOARD_LOGGING_DIR"] = str(output_dir / "runs")
    if "mlflow" in report_to:
        wanted["MLFLOW_TRACKING_URI"] = (output_dir / "mlruns").resolve().as_uri()
    if "wandb" in report_to:
        wanted["WANDB_MODE"] = "offline"
        wanted["WANDB_DIR"] = str(output_dir)
    return {k: v for k, v in wanted.items() if not env.get(k)}


def setup(report_to: Sequence[str], output_dir: Path) -> list[str]:
    """Check the trackers, set their defaults in this process's environment (the HF integrations
    read it when training starts), and return the SFTConfig ``report_to`` list."""
    check(report_to)
    os.environ.update(environment(report_to, output_dir, os.environ))
    return list(report_to)


def event_files(output_dir: Path) -> list[Path]:
    """TensorBoard event files under the run's output (for tests and `kubedgx` to find)."""
    return sorted((output_dir / "runs").rglob("events.out.tfevents.*"))


def scalars(output_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of one scalar across every event file, read with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points: list[tuple[int, float]] = []
    for path in event_files(output_dir):
        acc: Any = EventAccumulator(str(path))
        acc.Reload()
        if tag in acc.Tags().get("scalars", []):
            points.extend((e.step, float(e.value)) for e in acc.Scalars(tag))
    return sorted(points)
