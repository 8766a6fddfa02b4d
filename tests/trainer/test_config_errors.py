"""Configs that cannot run fail with an error naming the field: through the real
`python -m dgx_trainer` (exit code 2, one stderr line per problem) and in-process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dgx_api.trainer_config import ConfigError, parse_config
from tests.conftest import DELETE
from tests.trainer.conftest import OFFLINE, config_data, write_config

LLAMA_LINEAR = "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"


def trainer_cli(config: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**OFFLINE, "KUBEDGX_TERMINATION_LOG": str(cwd / "termination-log"), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "dgx_trainer", "--config", str(config)],
        cwd=cwd,
        env={**_inherited(), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _inherited() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("KUBEDGX_FAULT")}


def problems_of(exc: ConfigError) -> dict[str, str]:
    return {p.path: p.message for p in exc.problems}


# --- through the real CLI -----------------------------------------------------------------------


def test_cli_reports_every_schema_problem_and_exits_2(tmp_path: Path) -> None:
    data = config_data(
        tmp_path / "out",
        {
            "dataset": DELETE,
            "training.maxSeqLength": 0,
            "quantization": {"loadIn4bit": True, "loadIn8bit": True},
        },
    )
    config = write_config(tmp_path, data)
    result = trainer_cli(config, tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert f"dgx_trainer: {config}: invalid trainer config:" in lines
    assert "  dataset: Required value" in lines
    assert "  training.maxSeqLength: should be greater than or equal to 1 (got 0)" in lines
    assert (
        "  quantization.loadIn8bit: loadIn4bit and loadIn8bit are mutually exclusive: pick one (4-bit is QLoRA)"
        in lines
    )
    assert result.stderr.count("invalid trainer config") == 1, "each prefix once (issue 14 item 10)"
    termination = (tmp_path / "termination-log").read_text(encoding="utf-8")
    assert termination.startswith(f"{config}: invalid trainer config:\n")
    assert termination.count("invalid trainer config") == 1
    assert "training.maxSeqLength" in termination
    assert not (tmp_path / "out").exists(), "nothing may run for an invalid config"


def test_cli_unknown_target_modules_lists_the_models_linear_layers(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = write_config(tmp_path, config_data(out, {"lora.targetModules": ["q_proj", "qkv_proj", "c_attn"]}))
    result = trainer_cli(config, tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stdout == "", "no training may start"
    expected = f"  lora.targetModules: qkv_proj, c_attn not found in the model; its linear layers are: {LLAMA_LINEAR}"
    assert expected in result.stderr.splitlines()
    assert not (out / "adapter").exists()
    termination = (tmp_path / "termination-log").read_text(encoding="utf-8")
    assert "lora.targetModules: qkv_proj, c_attn not found" in termination
    # Found after loading, still anchored at the config file, each prefix once (issue 14 item 10).
    assert f"dgx_trainer: {config}: invalid trainer config:" in result.stderr.splitlines()
    assert result.stderr.count("invalid trainer config") == 1
    assert termination.startswith(f"{config}: invalid trainer config:\n")
    assert termination.count("invalid trainer config") == 1


def test_cli_missing_config_file_exits_2(tmp_path: Path) -> None:
    result = trainer_cli(tmp_path / "nope.yaml", tmp_path)
    assert result.returncode == 2
    assert "nope.yaml" in result.stderr
    assert "No such file or directory" in result.stderr


# --- schema level, in-process ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "path", "message"),
    [
        ({"dataset": DELETE}, "dataset", "Required value"),
        ({"dataset.path": DELETE}, "dataset.path", "Required value"),
        ({"training.maxSeqLength": 0}, "training.maxSeqLength", "should be greater than or equal to 1 (got 0)"),
        (
            {"quantization": {"loadIn4bit": True, "loadIn8bit": True}},
            "quantization.loadIn8bit",
            "loadIn4bit and loadIn8bit are mutually exclusive: pick one (4-bit is QLoRA)",
        ),
        # loadIn4bit defaults to true: asking for 8 bits alone is fine (see the next test)
        ({"model.name": ""}, "model.name", "must be at least 1 character long (got 0)"),
        (
            {"lora.targetModules": ["all-linear", "q_proj"]},
            "lora.targetModules",
            "all-linear already selects every linear layer: list it alone",
        ),
        (
            {"lora.targetModules": []},
            "lora.targetModules",
            "set targetModules (e.g. [q_proj, v_proj] or [all-linear]) or targetParameters (MoE experts)",
        ),
        ({"dataset.textField": 7}, "dataset.textField", "must be of type string"),
    ],
)
def test_schema_errors_name_the_field(tmp_path: Path, changes: dict[str, Any], path: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(config_data(tmp_path, changes), "job.yaml")
    assert path in problems_of(info.value), info.value.problems
    assert problems_of(info.value)[path].startswith(message)
    assert str(info.value).startswith("job.yaml: invalid trainer config:\n")
    assert f"\n  {path}: {message}" in str(info.value)


def test_eight_bit_alone_is_valid(tmp_path: Path) -> None:
    assert parse_config(config_data(tmp_path, {"quantization": {"loadIn8bit": True}})).quantization_bits == 8


def test_an_empty_dataset_key_reads_cleanly(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(config_data(tmp_path, {"dataset": None}))
    assert problems_of(info.value)["dataset"] == "must be of type object, got null (an empty value)"


# --- found while running, in-process: after preflight, before any training ----------------------


def run_in_process(tmp_path: Path, changes: dict[str, Any]) -> ConfigError:
    from dgx_trainer import train

    out = tmp_path / "out"
    cfg = parse_config(config_data(out, changes))
    rt = train.Runtime(base_dir=tmp_path, output_dir=out, termination_log=tmp_path / "termination-log", env={})
    with pytest.raises(ConfigError) as info:
        train.run(cfg, rt)
    assert not (out / "adapter").exists()
    assert not (out / "summary.json").exists()
    return info.value


def test_dataset_path_that_does_not_exist(tmp_path: Path) -> None:
    error = run_in_process(tmp_path, {"dataset.path": "data/missing.jsonl"})
    # relative paths resolve against the base directory, and the message shows where it looked
    assert problems_of(error) == {"dataset.path": f"no such file or directory: {tmp_path / 'data/missing.jsonl'}"}


def test_dataset_directory_without_data_files(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.md").write_text("no data here", encoding="utf-8")
    error = run_in_process(tmp_path, {"dataset.path": str(tmp_path / "empty"), "dataset.format": "auto"})
    assert list(problems_of(error)) == ["dataset.path"]
    assert "holds no .jsonl or .json or .parquet files" in problems_of(error)["dataset.path"]


def test_missing_text_column(tmp_path: Path) -> None:
    error = run_in_process(tmp_path, {"dataset.template": "text", "dataset.textField": "body"})
    assert problems_of(error) == {
        "dataset.textField": "column 'body' is not in the data (columns: instruction, input, output)"
    }


def test_missing_output_column_of_the_instruction_template(tmp_path: Path) -> None:
    error = run_in_process(tmp_path, {"dataset.outputField": "answer"})
    assert problems_of(error) == {
        "dataset.outputField": "column 'answer' is not in the data (columns: instruction, input, output)"
    }


def test_unknown_builtin_model(tmp_path: Path) -> None:
    error = run_in_process(tmp_path, {"model.name": "builtin:tiny-gpt"})
    known = "builtin:tiny-llama, builtin:tiny-mixtral"
    assert problems_of(error) == {"model.name": f"unknown built-in model 'builtin:tiny-gpt' (known: {known})"}


def test_unknown_target_modules_in_process(tmp_path: Path) -> None:
    error = run_in_process(tmp_path, {"lora.targetModules": ["query_key_value"]})
    assert problems_of(error) == {
        "lora.targetModules": f"query_key_value not found in the model; its linear layers are: {LLAMA_LINEAR}"
    }


def test_unknown_target_parameters(tmp_path: Path) -> None:
    error = run_in_process(tmp_path, {"lora.targetParameters": ["experts.gate_up_proj"]})
    assert problems_of(error) == {
        "lora.targetParameters": "experts.gate_up_proj not found among the model's parameters"
    }


def test_dotted_module_suffixes_are_known_targets(tiny_llama: Path) -> None:
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from dgx_api.trainer_config import Lora
    from dgx_trainer import model

    lora = Lora.model_validate({"r": 4, "targetModules": ["self_attn.q_proj", "mlp.down_proj"]})
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_llama), model.lora_config(lora))
    adapted = {n.rsplit(".", 3)[0] for n, _ in peft_model.named_parameters() if "lora_A" in n}
    assert len(adapted) == 4, "peft adapts q_proj and down_proj of both layers with these suffixes"
    model.check_targets(AutoModelForCausalLM.from_pretrained(tiny_llama), lora)


def test_the_failure_termination_message_fits_in_4_kib(
    tmp_path: Path, tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dgx_trainer.__main__ import main

    log = tmp_path / "termination-log"
    monkeypatch.setenv("KUBEDGX_TERMINATION_LOG", str(log))
    monkeypatch.setenv("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # main() sets it; restored after the test
    names = [f"é{i:03d}" + "é" * 120 for i in range(64)]
    config = write_config(tmp_path, config_data(tmp_path / "out", {"lora.targetModules": names}))
    assert main(["--config", str(config)]) == 2
    assert log.read_text(encoding="utf-8").startswith(f"{config}: invalid trainer config:\n")
    assert len(log.read_bytes()) <= 4096
