"""The pre-launch check (issue 14 item 6): `python -m dgx_trainer launch` checks the model, the data
and the memory once per pod and ends a bad run with exit 2 (one line naming the field and the fix,
the termination message, no traceback) before torchrun starts any worker; a good run execs
torchrun and trains to the end. Everything through the real subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.conftest import OFFLINE, RUN_TIMEOUT, config_data, write_config

CHAT_ROWS = [
    {"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]}
    for i in range(8)
]


def launch(
    config: Path, cwd: Path, torchrun: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("KUBEDGX_FAULT")}
    full_env.update(OFFLINE)
    full_env.update(
        {
            "KUBEDGX_TERMINATION_LOG": str(cwd / "termination-log"),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        }
    )
    full_env.update(env or {})
    options = ["--standalone", "--nnodes=1", "--nproc-per-node=1", "--max-restarts=0", *torchrun]
    return subprocess.run(
        [sys.executable, "-m", "dgx_trainer", "launch", "--config", str(config), "--", *options],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )


def refused(result: subprocess.CompletedProcess[str], cwd: Path, field: str) -> str:
    """The one problem line of a run refused with exit 2 before any worker started."""
    assert result.returncode == 2, result.stderr[-4000:]
    assert "Traceback" not in result.stderr, result.stderr[-4000:]
    assert result.stdout == "", "no worker may start"
    lines = [line for line in result.stderr.splitlines() if line.startswith(f"  {field}: ")]
    assert len(lines) == 1, result.stderr[-4000:]
    assert result.stderr.count("invalid trainer config") == 1
    termination = (cwd / "termination-log").read_text(encoding="utf-8")
    assert termination.count("invalid trainer config") == 1
    assert lines[0] in termination.splitlines()
    assert not (cwd / "out").exists(), "nothing may run"
    return lines[0].strip()


def write_jsonl(path: Path, rows: Sequence[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_hub_id_while_offline_names_model_name(tmp_path: Path) -> None:
    config = write_config(tmp_path, config_data(tmp_path / "out", {"model.name": "mistralai/Mixtral-8x7B-v0.1"}))
    result = launch(config, tmp_path, env={"HF_HOME": str(tmp_path / "hf-home")})
    line = refused(result, tmp_path, "model.name")
    assert "mistralai/Mixtral-8x7B-v0.1 is a hub id, but HF_HUB_OFFLINE=1" in line
    assert "set HF_HUB_OFFLINE=0 where the hub is reachable" in line


def test_a_missing_local_model_directory_names_model_name(tmp_path: Path) -> None:
    missing = tmp_path / "models" / "llama"
    config = write_config(tmp_path, config_data(tmp_path / "out", {"model.name": str(missing)}))
    line = refused(launch(config, tmp_path), tmp_path, "model.name")
    assert line.startswith(f"model.name: no model directory at {missing}: ")


def test_a_tokenizer_without_a_chat_template_names_chat_template(tmp_path: Path, tiny_llama: Path) -> None:
    local = tmp_path / "model"
    shutil.copytree(tiny_llama, local)
    (local / "chat_template.jinja").unlink(missing_ok=True)
    tok_config = json.loads((local / "tokenizer_config.json").read_text(encoding="utf-8"))
    tok_config.pop("chat_template", None)
    (local / "tokenizer_config.json").write_text(json.dumps(tok_config), encoding="utf-8")
    data = write_jsonl(tmp_path / "chat.jsonl", CHAT_ROWS)
    changes = {"model.name": str(local), "dataset": {"path": str(data), "format": "jsonl", "template": "chat"}}
    config = write_config(tmp_path, config_data(tmp_path / "out", changes))
    line = refused(launch(config, tmp_path), tmp_path, "dataset.chatTemplate")
    assert "no chat template" in line


def test_dropout_with_lora_on_expert_parameters_names_lora_dropout(tmp_path: Path) -> None:
    """peft refuses it inside every worker; here it is one line before any worker starts."""
    changes = {"lora.targetParameters": ["experts.gate_up_proj"], "lora.dropout": 0.05}
    config = write_config(tmp_path, config_data(tmp_path / "out", changes))
    line = refused(launch(config, tmp_path), tmp_path, "lora.dropout")
    assert "set lora.dropout: 0" in line


def test_an_unknown_target_module_names_lora_target_modules_before_any_worker(tmp_path: Path) -> None:
    """Found on the model's skeleton (meta device, from config.json): no weights loaded, no worker."""
    config = write_config(tmp_path, config_data(tmp_path / "out", {"lora.targetModules": ["qkv_proj"]}))
    line = refused(launch(config, tmp_path), tmp_path, "lora.targetModules")
    assert "qkv_proj not found in the model; its linear layers are:" in line
    assert "q_proj" in line


def test_an_empty_jsonl_names_dataset_path(tmp_path: Path) -> None:
    data = tmp_path / "empty.jsonl"
    data.write_text("", encoding="utf-8")
    config = write_config(tmp_path, config_data(tmp_path / "out", {"dataset.path": str(data)}))
    line = refused(launch(config, tmp_path), tmp_path, "dataset.path")
    assert "empty" in line


def test_a_malformed_jsonl_names_dataset_path_and_the_line(tmp_path: Path) -> None:
    data = tmp_path / "bad.jsonl"
    good = json.dumps({"instruction": "say hi", "output": "hi"})
    data.write_text(f"{good}\n{{'instruction': 'not json'\n{good}\n", encoding="utf-8")
    config = write_config(tmp_path, config_data(tmp_path / "out", {"dataset.path": str(data)}))
    line = refused(launch(config, tmp_path), tmp_path, "dataset.path")
    assert "bad.jsonl:2" in line


def test_parquet_files_that_disagree_name_dataset_path(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "parquet"
    root.mkdir()
    pq.write_table(pa.table({"instruction": ["a", "b"], "output": ["c", "d"]}), root / "part-0.parquet")
    pq.write_table(pa.table({"instruction": ["a", "b"], "output": [1, 2]}), root / "part-1.parquet")
    changes = {"dataset": {"path": str(root), "format": "parquet", "template": "instruction"}}
    config = write_config(tmp_path, config_data(tmp_path / "out", changes))
    line = refused(launch(config, tmp_path), tmp_path, "dataset.path")
    assert "part-1.parquet" in line


def test_a_data_error_torchrun_would_restart_ends_at_once_with_exit_2(tmp_path: Path) -> None:
    """Without the check, two workers would each fail with exit 2, torchrun would restart them three
    times, and the pod would end with exit 1 after four rounds; now no worker starts."""
    data = tmp_path / "bad.jsonl"
    data.write_text("not json\n", encoding="utf-8")
    config = write_config(tmp_path, config_data(tmp_path / "out", {"dataset.path": str(data)}))
    result = launch(config, tmp_path, torchrun=["--nproc-per-node=2", "--max-restarts=3"])
    line = refused(result, tmp_path, "dataset.path")
    assert result.stderr.count(line) == 1, "reported once, by the launcher, not by restarted workers"
    assert "ChildFailedError" not in result.stderr
    assert "torch.distributed" not in result.stderr


def test_a_node_without_gpus_is_exit_3_before_anything_loads(tmp_path: Path) -> None:
    config = write_config(tmp_path, config_data(tmp_path / "out", {"allowCpu": False}))
    result = launch(config, tmp_path, env={"KUBEDGX_GPUS_PER_NODE": "8"})
    if result.returncode == 0:
        pytest.skip("this machine has a working NVIDIA driver")
    assert result.returncode == 3, result.stderr[-4000:]
    assert "Traceback" not in result.stderr
    assert (tmp_path / "termination-log").read_text(encoding="utf-8").startswith("preflight: no NVIDIA driver")


def test_a_run_that_cannot_fit_the_gpu_names_the_fields(tmp_path: Path) -> None:
    """KUBEDGX_GPU_MEMORY_GIB stands in for NVML's memory: tiny-llama does not fit 0.01 GiB."""
    config = write_config(tmp_path, config_data(tmp_path / "out"))
    result = launch(config, tmp_path, env={"KUBEDGX_GPU_MEMORY_GIB": "0.01"})
    line = refused(result, tmp_path, "memoryCheck")
    assert line.startswith("memoryCheck: needs ~")
    assert "has 0.0 GiB" in line
    assert line.endswith("or set memoryCheck: warn")


def test_a_good_config_execs_torchrun_and_trains_to_the_end(tmp_path: Path) -> None:
    """memoryCheck: warn logs a misfit and trains anyway, through torchrun."""
    out = tmp_path / "out"
    config = write_config(tmp_path, config_data(out, {"memoryCheck": "warn"}))
    result = launch(config, tmp_path, env={"KUBEDGX_GPU_MEMORY_GIB": "0.01"})
    assert result.returncode == 0, result.stderr[-6000:]
    assert "memoryCheck: warn, training anyway" in result.stderr
    assert "pre-launch checks passed: starting -m torch.distributed.run" in result.stderr
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["status"] == "Succeeded"
    assert summary["step"] == summary["totalSteps"] == 3
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    termination = json.loads((tmp_path / "termination-log").read_text(encoding="utf-8"))
    assert termination["status"] == "Succeeded"


def test_quantization_without_fallback_is_probed_before_any_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """allowFallback: false on a device bitsandbytes cannot run: one problem from the same probe the
    workers run, in the launcher; with fallback allowed, no problem (the workers fall back)."""
    from dgx_api.trainer_config import parse_config
    from dgx_trainer import launch, model, preflight

    probed: list[tuple[int, str]] = []

    def unusable(bits: int, device: str) -> tuple[bool, str]:
        probed.append((bits, device))
        return False, "RuntimeError: no kernels for this device"

    monkeypatch.setattr(model, "quantization_usable", unusable)
    cpu = preflight.Report(cpu_only=True)
    strict = parse_config(config_data(tmp_path, {"quantization": {"loadIn4bit": True, "allowFallback": False}}))
    [problem] = launch.check_quantization(strict, cpu)
    assert problem.path == "quantization"
    assert problem.message.startswith("4-bit loading is not usable on cpu: RuntimeError: no kernels")
    assert "allowFallback: true" in problem.message
    assert probed == [(4, "cpu")]
    lenient = parse_config(config_data(tmp_path, {"quantization": {"loadIn4bit": True}}))
    assert launch.check_quantization(lenient, cpu) == []
    plain = parse_config(config_data(tmp_path, {"quantization": {"loadIn4bit": False, "allowFallback": False}}))
    assert launch.check_quantization(plain, cpu) == []
    assert probed == [(4, "cpu")]
