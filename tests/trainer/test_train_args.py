"""What train.run hands the HF Trainer for the collective timeout, NaN logging and the CPU side of
data feeding (in-process, no training): training.collectiveTimeoutSeconds, its defaults by model
kind, NaN losses logged as NaN so that training.stopOnNonFiniteLoss can see a divergence
(tests/trainer/test_divergence.py runs it end to end), and training.dataloaderWorkers and
dataset.tokenizationProcesses with their CPU-sized defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dgx_api.trainer_config import ConfigError, parse_config
from tests.trainer.conftest import config_data


@pytest.mark.parametrize(
    ("changes", "moe_model", "seconds"),
    [
        ({}, False, 1800),
        ({}, True, 7200),
        ({"training.collectiveTimeoutSeconds": 600}, False, 600),
        ({"training.collectiveTimeoutSeconds": 600}, True, 600),
    ],
)
def test_the_collective_timeout(tmp_path: Path, changes: dict[str, int], moe_model: bool, seconds: int) -> None:
    from dgx_trainer import model, train

    cfg = parse_config(config_data(tmp_path / "out", changes))
    rt = train.Runtime(base_dir=tmp_path, output_dir=tmp_path / "out", env={})
    args = train.sft_config(cfg, rt, model.precision("fp32", "cpu"), False, "cpu", moe_model=moe_model)
    assert args.ddp_timeout == seconds
    assert args.logging_nan_inf_filter is False


@pytest.mark.parametrize(
    ("field", "value"),
    [("training.collectiveTimeoutSeconds", 59), ("training.stopOnNonFiniteLoss", -1)],
)
def test_out_of_range_values_are_refused_naming_the_field(tmp_path: Path, field: str, value: int) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(config_data(tmp_path / "out", {field: value}))
    assert field in str(caught.value)


def _args(tmp_path: Path, changes: dict[str, int], device: str, env: dict[str, str], rows: int | None = None) -> Any:
    from dgx_trainer import model, train

    cfg = parse_config(config_data(tmp_path / "out", changes))
    rt = train.Runtime(base_dir=tmp_path, output_dir=tmp_path / "out", env=env)
    return train.sft_config(cfg, rt, model.precision("fp32", "cpu"), False, device, rows=rows)


def test_dataloader_workers_and_tokenization_processes_reach_the_trainer(tmp_path: Path) -> None:
    args = _args(tmp_path, {"training.dataloaderWorkers": 3, "dataset.tokenizationProcesses": 5}, "cpu", {}, rows=10)
    assert (args.dataloader_num_workers, args.dataset_num_proc) == (3, 5)
    assert args.dataloader_pin_memory is False  # nothing to copy to


def test_their_defaults_follow_the_cpus_the_node_s_ranks_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A DGX H100 pod with a 192-CPU limit and 8 ranks: 24 CPUs a rank."""
    from dgx_trainer import throughput

    monkeypatch.setattr(throughput, "available_cpus", lambda: 192)
    node = {"LOCAL_WORLD_SIZE": "8"}
    gpu = _args(tmp_path, {}, "cuda", node, rows=1_000_000)
    assert (gpu.dataloader_num_workers, gpu.dataset_num_proc, gpu.dataloader_pin_memory) == (4, 8, True)
    small = _args(tmp_path, {}, "cuda", node, rows=2_500)
    assert small.dataset_num_proc == 2  # at least 1000 rows a process
    monkeypatch.setattr(throughput, "available_cpus", lambda: 8)
    starved = _args(tmp_path, {}, "cuda", node, rows=1_000_000)
    assert (starved.dataloader_num_workers, starved.dataset_num_proc) == (0, 1)  # one CPU a rank
    cpu = _args(tmp_path, {}, "cpu", {}, rows=1_000_000)
    assert cpu.dataloader_num_workers == 0  # without GPUs the CPUs train


@pytest.mark.parametrize(("field", "value"), [("training.dataloaderWorkers", -1), ("dataset.tokenizationProcesses", 0)])
def test_worker_counts_out_of_range_are_refused_naming_the_field(tmp_path: Path, field: str, value: int) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(config_data(tmp_path / "out", {field: value}))
    assert field in str(caught.value)
