"""The trainer's config contract: loaded from a file with the CRD's own schema and CEL rules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dgx_api.trainer_config import ConfigError, TrainerConfig, load_config, parse_config

MINIMAL = {"model": {"name": "builtin:tiny-llama"}, "dataset": {"path": "data/train.jsonl"}}


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "trainer.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_minimal_config_gets_qlora_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL))
    assert config.quantization_bits == 4
    assert config.quantization.quant_type == "nf4"
    assert config.lora.target_modules == ["all-linear"]
    assert config.training.save_steps == 100
    assert config.allow_cpu is False


@pytest.mark.parametrize(
    ("quantization", "bits"),
    [({}, 4), ({"loadIn4bit": True}, 4), ({"loadIn8bit": True}, 8), ({"loadIn4bit": False}, None)],
)
def test_quantization_mode(quantization: dict[str, bool], bits: int | None) -> None:
    assert parse_config({**MINIMAL, "quantization": quantization}).quantization_bits == bits


@pytest.mark.parametrize(
    ("changes", "path", "fragment"),
    [
        ({"dataset": None}, "dataset", "Required value"),
        ({"quantization": {"loadIn4bit": True, "loadIn8bit": True}}, "quantization.loadIn8bit", "mutually exclusive"),
        ({"training": {"maxSeqLength": 0}}, "training.maxSeqLength", "should be greater than or equal to 1 (got 0)"),
        ({"lora": {"targetModules": []}}, "lora.targetModules", "set targetModules"),
        ({"lora": {"r": "sixteen"}}, "lora.r", "must be of type integer"),
        ({"training": {"evalSteps": 10}}, "training.evalSteps", "needs dataset.evalFraction > 0"),
        ({"training": {"optimiser": "sgd"}}, "training.optimiser", "did you mean 'optimizer'?"),
        ({"dataset": {"path": "/d", "messagesField": "m"}}, "dataset.messagesField", "only with template: chat"),
    ],
)
def test_bad_configs_name_the_field(tmp_path: Path, changes: dict[str, object], path: str, fragment: str) -> None:
    data = {**MINIMAL, **changes}
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, data))
    matching = [p for p in info.value.problems if p.path == path]
    assert matching, info.value.problems
    assert fragment in matching[0].message
    assert str(tmp_path / "trainer.yaml") in str(info.value)


def test_invalid_yaml_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "trainer.yaml"
    path.write_text("model: [unclosed", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_round_trip_through_the_manifest_form() -> None:
    config = parse_config({**MINIMAL, "lora": {"r": 4, "targetParameters": ["experts.down_proj"]}})
    again = parse_config(config.to_manifest())
    assert again == config
    assert isinstance(again, TrainerConfig)


def test_the_contract_imports_no_torch() -> None:
    code = (
        "import sys, dgx_api.trainer_config, dgx_api.schema; "
        "bad = [m for m in ('torch', 'transformers', 'peft', 'trl', 'dgx_operator') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_precision_on_a_cpu_is_documented_as_downgraded_where_users_read_it() -> None:
    """One rule for bf16/fp16 without GPUs (fp32, a warning, fp32 in progress), stated in the CRD's
    description that `kubectl explain` shows (tests/trainer/test_model.py checks the behaviour)."""
    from dgx_api.trainer_config import trainer_schema

    description = trainer_schema()["properties"]["training"]["properties"]["precision"]["description"]
    assert "without GPUs" in description
    assert "trains in fp32" in description
    assert "refused" in description  # bf16 on a GPU without it
