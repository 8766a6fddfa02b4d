"""What train.run hands the HF Trainer for the collective timeout and NaN logging (in-process, no
training): training.collectiveTimeoutSeconds, its defaults by model kind, and NaN losses logged as
NaN so that training.stopOnNonFiniteLoss can see a divergence (tests/trainer/test_divergence.py runs
it end to end)."""

from __future__ import annotations

from pathlib import Path

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
