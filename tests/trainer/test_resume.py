"""Resume equivalence after a real SIGKILL, and which checkpoint counts as complete."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest

from dgx_api import checkpoints
from dgx_api.progress import COMPLETE_MARKER
from tests.trainer.conftest import RESUME_CHANGES, Baseline, TrainerProcess, config_data, run_trainer, write_config

KILL_AFTER = 8  # a complete checkpoint-8 must exist and the run must have gone past it
PLANTED = 12  # a half-written checkpoint-12 is planted after the kill
STEPS = 16


def plant_half_written(output_dir: Path, source: Path, step: int) -> Path:
    """A checkpoint directory as a worker killed mid-save leaves it: plausible files, a truncated
    optimizer state, a trainer_state.json claiming ``step``, no completion marker."""
    target = output_dir / f"checkpoint-{step}"
    shutil.copytree(source, target)
    (target / COMPLETE_MARKER).unlink()
    state = json.loads((target / "trainer_state.json").read_text(encoding="utf-8"))
    state["global_step"] = step
    (target / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")
    optimizer = target / "optimizer.pt"
    blob = optimizer.read_bytes()
    optimizer.write_bytes(blob[: len(blob) // 2])
    return target


def test_resume_after_sigkill_gives_the_uninterrupted_losses(baseline_run: Baseline, tmp_path: Path) -> None:
    base = baseline_run.losses
    assert sorted(base) == list(range(1, STEPS + 1)), baseline_run.result.describe()

    out = tmp_path / "out"
    config = write_config(tmp_path, config_data(out, RESUME_CHANGES))
    marker = out / f"checkpoint-{KILL_AFTER}" / COMPLETE_MARKER

    first = TrainerProcess(config, tmp_path / "first", output_dir=out)
    try:
        killed_after: int | None = None
        for event in first.events():
            if event["event"] == "progress" and event["step"] > KILL_AFTER and marker.is_file():
                killed_after = int(event["step"])
                first.kill()
                break
        result = first.finish()
    finally:
        first.close()
    assert killed_after is not None, f"the run never went past a complete checkpoint-{KILL_AFTER}: {result.describe()}"
    assert result.returncode == -signal.SIGKILL, result.describe()
    assert not result.of("summary")
    assert not (out / "summary.json").exists()
    # Up to the kill, the run is the uninterrupted one.
    assert sorted(result.losses)[:killed_after] == list(range(1, killed_after + 1))
    for step, loss in result.losses.items():
        assert loss == pytest.approx(base[step], abs=1e-5), f"step {step} before the kill"

    # Whatever the killed process began after checkpoint-8 gives way to a planted half-written
    # checkpoint-12: newer than checkpoint-8, and not complete.
    for later in out.glob("checkpoint-*"):
        if int(later.name.split("-")[1]) > KILL_AFTER:
            shutil.rmtree(later)
    planted = plant_half_written(out, out / f"checkpoint-{KILL_AFTER}", PLANTED)
    assert checkpoints.latest_complete(out) == out / f"checkpoint-{KILL_AFTER}"

    resumed = run_trainer(config, tmp_path / "resumed", output_dir=out)
    assert resumed.returncode == 0, resumed.describe()
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["resumedFrom"] == str(out / f"checkpoint-{KILL_AFTER}")
    assert summary["step"] == STEPS
    assert [e["step"] for e in resumed.of("start")] == [KILL_AFTER]
    assert sorted(resumed.losses) == list(range(KILL_AFTER + 1, STEPS + 1))
    for step, loss in resumed.losses.items():
        assert loss == pytest.approx(base[step], abs=1e-5), f"step {step}: resumed {loss}, uninterrupted {base[step]}"
    # The real checkpoint-12 replaced the planted one and was marked complete.
    assert checkpoints.is_complete(planted)
    final = out / f"checkpoint-{STEPS}" / "optimizer.pt"
    assert (planted / "optimizer.pt").stat().st_size == final.stat().st_size, "the truncated file was kept"
    assert json.loads((planted / COMPLETE_MARKER).read_text(encoding="utf-8"))["step"] == PLANTED
    assert checkpoints.latest_complete(out) == out / f"checkpoint-{STEPS}"


# ---------------------------------------------------------------------------------------------
# checkpoints.latest_complete and friends, without training
# ---------------------------------------------------------------------------------------------


def make_checkpoint(output_dir: Path, name: str, *, complete: bool) -> Path:
    path = output_dir / name
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(b"weights")
    if complete:
        step = int(name.rsplit("-", 1)[1])
        checkpoints.mark_complete(path, step)
    return path


def test_latest_complete_of_a_missing_or_empty_directory(tmp_path: Path) -> None:
    assert checkpoints.latest_complete(tmp_path / "absent") is None
    assert checkpoints.latest_complete(tmp_path) is None
    assert checkpoints.complete(tmp_path / "absent") == []


def test_latest_complete_ignores_unmarked_directories(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, "checkpoint-10", complete=True)
    make_checkpoint(tmp_path, "checkpoint-20", complete=False)
    assert checkpoints.latest_complete(tmp_path) == tmp_path / "checkpoint-10"


def test_latest_complete_orders_by_step_not_by_name(tmp_path: Path) -> None:
    for step in (9, 100, 20):
        make_checkpoint(tmp_path, f"checkpoint-{step}", complete=True)
    assert checkpoints.latest_complete(tmp_path) == tmp_path / "checkpoint-100"
    assert [step for step, _ in checkpoints.complete(tmp_path)] == [9, 20, 100]


def test_latest_complete_ignores_lookalikes(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, "checkpoint-5", complete=True)
    for name in ("checkpoint-50.tmp", "checkpoint-x", "old-checkpoint-60", "tmp-checkpoint-70", "checkpoint-"):
        path = tmp_path / name
        path.mkdir()
        (path / COMPLETE_MARKER).write_text("{}", encoding="utf-8")
    (tmp_path / "checkpoint-80").write_text("a file, not a directory", encoding="utf-8")
    marker_dir = tmp_path / "checkpoint-90"
    (marker_dir / COMPLETE_MARKER).mkdir(parents=True)  # the marker must be a file
    assert checkpoints.latest_complete(tmp_path) == tmp_path / "checkpoint-5"


def test_mark_complete_writes_the_step_atomically(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path, "checkpoint-7", complete=False)
    assert not checkpoints.is_complete(path)
    checkpoints.mark_complete(path, 7)
    assert checkpoints.is_complete(path)
    marker = json.loads((path / COMPLETE_MARKER).read_text(encoding="utf-8"))
    assert marker["step"] == 7
    assert marker["completedAt"].endswith("Z")
    assert sorted(p.name for p in path.iterdir()) == sorted(["adapter_model.safetensors", COMPLETE_MARKER])
