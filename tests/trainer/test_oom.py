"""A CUDA out-of-memory error ends the worker with exit code 5 and a termination message that says
``OutOfMemory:``, which rank, torch's own first line, and the settings that lower the memory a
rank needs with their values now (the operator reads the first word; a person reads the rest).

Before, it was exit 1 and ``OutOfMemoryError: CUDA out of memory. Tried to allocate ...``: a crash
like any other, naming no setting. ``train.run`` is replaced by one that raises, as the first
forward pass of a too-large batch does on a GPU; the CPU-only machine has nothing to run out of.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import config_data, write_config

#: torch's text for an allocation that failed: the caching allocator's one line, as torch 2.11 wrote
#: it on an H200 asked for 64 TiB; the second line stands for what some extensions append.
TORCH_TEXT = (
    "CUDA out of memory. Tried to allocate 65536.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which "
    "139.29 GiB is free. Including non-PyTorch memory, this process has 518.00 MiB memory in use. Of the "
    "allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If "
    "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to "
    "avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/"
    "cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)\n"
    "a second line that is not part of the message"
)


def run_main(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException, **changes: object) -> int:
    from dgx_trainer import train
    from dgx_trainer.__main__ import main

    def raising(cfg: object, rt: object) -> dict[str, object]:
        raise error

    monkeypatch.setattr(train, "run", raising)
    monkeypatch.setenv("KUBEDGX_TERMINATION_LOG", str(tmp_path / "termination-log"))
    monkeypatch.setenv("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # main() sets it; restored after the test
    monkeypatch.setenv("RANK", "3")
    config = write_config(tmp_path, config_data(tmp_path / "out", changes))
    return main(["--config", str(config)])


def message(tmp_path: Path) -> str:
    return (tmp_path / "termination-log").read_text(encoding="utf-8")


def test_out_of_memory_is_exit_5_with_the_settings_to_lower(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = run_main(
        tmp_path,
        monkeypatch,
        torch.cuda.OutOfMemoryError(TORCH_TEXT),  # the same class as torch.OutOfMemoryError
        **{"training.perDeviceBatchSize": 16, "training.maxSeqLength": 4096, "training.gradientCheckpointing": False},
    )
    assert code == 5
    assert message(tmp_path) == (
        f"OutOfMemory: CUDA out of memory on rank 3 ({TORCH_TEXT.splitlines()[0]}); "
        "lower training.perDeviceBatchSize (now 16) or training.maxSeqLength (now 4096), "
        "turn on training.gradientCheckpointing (now off)"
    )


def test_the_older_runtime_error_form_is_recognised_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = run_main(
        tmp_path,
        monkeypatch,
        RuntimeError(TORCH_TEXT),
        **{"training.perDeviceBatchSize": 2, "training.maxSeqLength": 1024, "training.gradientCheckpointing": True},
    )
    assert code == 5
    text = message(tmp_path)
    assert text.startswith("OutOfMemory: CUDA out of memory on rank 3 (CUDA out of memory. Tried to allocate")
    assert text.endswith(
        "lower training.perDeviceBatchSize (now 2) or training.maxSeqLength (now 1024), "
        "training.gradientCheckpointing is already on"
    )


def test_other_runtime_errors_are_still_crashes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_main(tmp_path, monkeypatch, RuntimeError("NCCL error: unhandled system error")) == 1
    assert message(tmp_path) == "RuntimeError: NCCL error: unhandled system error"


def test_torchruns_restart_of_the_same_config_fails_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun restarts the group (maxRestarts) after any failure; an out-of-memory config would
    load the model and run out again each time. The node remembers it (keyed by the config), so a
    restart ends at once with the same message; a changed config trains."""
    from dgx_trainer import train
    from dgx_trainer.__main__ import main

    changes = {"training.perDeviceBatchSize": 16}
    assert run_main(tmp_path, monkeypatch, torch.OutOfMemoryError(TORCH_TEXT), **changes) == 5
    first = message(tmp_path)
    monkeypatch.undo()  # the real train.run from here on
    monkeypatch.setenv("KUBEDGX_TERMINATION_LOG", str(tmp_path / "termination-log"))
    monkeypatch.setenv("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.setenv("RANK", "3")
    config = write_config(tmp_path, config_data(tmp_path / "out", changes))
    assert main(["--config", str(config)]) == 5
    assert message(tmp_path) == f"{first} (this config ran out of memory here before: not trained again)"

    from dgx_api.trainer_config import load_config

    same = load_config(str(config))
    other = load_config(str(write_config(tmp_path, config_data(tmp_path / "out", {"training.perDeviceBatchSize": 8}))))
    rt = train.Runtime(base_dir=tmp_path, output_dir=tmp_path / "out")
    assert train._marked(rt, same, train.OUT_OF_MEMORY_MARKER) == first
    assert train._marked(rt, other, train.OUT_OF_MEMORY_MARKER) is None
