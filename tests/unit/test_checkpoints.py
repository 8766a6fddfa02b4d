"""The group's resume step (checkpoints.agree), unmarking, and the whole run's mean loss after a
resume (checkpoints.run_mean_loss): pure functions, no training."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dgx_api import checkpoints
from dgx_api.progress import COMPLETE_MARKER


@pytest.mark.parametrize(
    ("per_rank", "expected"),
    [
        pytest.param([[4, 8], [4, 8]], 8, id="all the same"),
        pytest.param([[4, 8, 12], [4, 8]], 8, id="one node behind: its newest save did not finish"),
        pytest.param([[4, 8], [4, 8, 12]], 8, id="a node with an extra newer one"),
        pytest.param([[4, 8], []], None, id="one node empty: all start from scratch"),
        pytest.param([[], []], None, id="a fresh run"),
        pytest.param([[4, 8], [12]], None, id="nothing in common"),
        pytest.param([[8, 4, 12], [12, 4]], 12, id="order does not matter"),
        pytest.param([[4, 8], [4, 8], [4], [4, 8]], 4, id="the oldest newest of four ranks"),
        pytest.param([[16]], 16, id="a single rank"),
        pytest.param([], None, id="no ranks"),
    ],
)
def test_agree_is_the_newest_step_every_rank_has(per_rank: list[list[int]], expected: int | None) -> None:
    assert checkpoints.agree(per_rank) == expected


def make_checkpoint(output_dir: Path, step: int) -> Path:
    path = output_dir / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(b"weights")
    checkpoints.mark_complete(path, step)
    return path


def test_a_checkpoint_restored_from_an_out_mount_counts_for_the_node(tmp_path: Path) -> None:
    """A rescheduled node has only what `datasync restore` put into its empty output directory
    (files and marker, as uploaded): that is its list, and the group resumes there."""
    node_a, node_b, store = tmp_path / "node-a", tmp_path / "node-b", tmp_path / "store"
    for step in (4, 8, 12):
        make_checkpoint(node_a, step)
    make_checkpoint(store, 8)
    node_b.mkdir()
    shutil.copytree(store / "checkpoint-8", node_b / "checkpoint-8")
    lists = [[s for s, _ in checkpoints.complete(node)] for node in (node_a, node_b)]
    assert lists == [[4, 8, 12], [8]]
    assert checkpoints.agree(lists) == 8


def test_unmark_makes_a_checkpoint_incomplete_and_keeps_its_files(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path, 12)
    checkpoints.unmark(path)
    assert not checkpoints.is_complete(path)
    assert (path / "adapter_model.safetensors").is_file()
    assert not (path / COMPLETE_MARKER).exists()
    checkpoints.unmark(path)  # twice is fine
    assert checkpoints.latest_complete(tmp_path) is None


def logs(*entries: tuple[int, float, int | None]) -> list[dict[str, object]]:
    """log_history entries (step, loss, lossSteps or None), with the keys the HF Trainer adds."""
    out: list[dict[str, object]] = []
    for step, loss, steps in entries:
        entry: dict[str, object] = {"loss": loss, "grad_norm": 1.0, "learning_rate": 1e-3, "epoch": 0.1, "step": step}
        if steps is not None:
            entry["lossSteps"] = steps
        out.append(entry)
    return out


def test_run_mean_loss_without_a_resume_is_the_trainers_own() -> None:
    history = logs((1, 5.0, 1), (2, 4.0, 1))
    assert checkpoints.run_mean_loss(history, 0, 4.5, 2) == 4.5
    assert checkpoints.run_mean_loss([], 0, None, 0) is None


def test_run_mean_loss_after_a_resume_covers_the_steps_before_it() -> None:
    # Losses 1..8 per step; resumed at 4, so the trainer's own mean covers steps 5..8 only.
    history = logs(*[(s, float(s), 1) for s in range(1, 9)])
    own = sum(range(5, 9)) / 4
    assert checkpoints.run_mean_loss(history, 4, own, 8) == pytest.approx(sum(range(1, 9)) / 8)


def test_run_mean_loss_weighs_logging_windows_by_their_length() -> None:
    # loggingSteps 2: each entry is the mean of two steps. Without lossSteps (a checkpoint of an
    # older trainer) the window is the distance to the entry before.
    history = logs((2, 6.0, None), (4, 4.0, None), (6, 3.0, None))
    assert checkpoints.run_mean_loss(history, 4, 3.0, 6) == pytest.approx((6 * 2 + 4 * 2 + 3 * 2) / 6)


def test_run_mean_loss_uses_the_stamped_window_after_an_earlier_resume() -> None:
    # loggingSteps 3, saveSteps 4: logged at 3; crashed, resumed at 4 (step 4 was never logged);
    # the next window is 5..6, two steps, logged at 6; checkpoint at 8, resumed there.
    history = logs((3, 6.0, 3), (6, 5.0, 2))
    assert checkpoints.run_mean_loss(history, 8, 4.0, 12) == pytest.approx((6 * 3 + 5 * 2 + 4 * 4) / 9)
    unstamped = logs((3, 6.0, None), (6, 5.0, None))
    assert checkpoints.run_mean_loss(unstamped, 8, 4.0, 12) == pytest.approx((6 * 3 + 5 * 3 + 4 * 4) / 10)


def test_run_mean_loss_ignores_entries_that_are_not_training_losses() -> None:
    history: list[dict[str, object]] = [
        *logs((2, 2.0, 2)),
        {"eval_loss": 9.0, "step": 2},
        {"train_loss": 7.0, "train_runtime": 1.0, "step": 2},
        {"loss": float("nan"), "step": "2"},
    ]
    assert checkpoints.run_mean_loss(history, 2, 4.0, 4) == pytest.approx((2.0 * 2 + 4.0 * 2) / 4)
