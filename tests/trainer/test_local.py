"""`kubedgx run FILE --local`: the quickstart end to end through the real console script, and the
plan (processes, restarts, command, environment) without running anything."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dgx_operator.api import DGXTrainingJob
from dgx_operator.catalog import Catalog
from dgx_operator.cli import local
from dgx_operator.cli import main as cli
from tests.conftest import DELETE, with_changes
from tests.trainer.conftest import EXAMPLES, OFFLINE, QUICKSTART, RUN_TIMEOUT
from tests.trainer.local_run import console_script, run_local


def quickstart_doc() -> dict[str, Any]:
    doc = yaml.safe_load(QUICKSTART.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def test_quickstart_runs_end_to_end(tmp_path: Path, kubedgx_cache: Path) -> None:
    from dgx_trainer import model

    out = tmp_path / "run"
    result = run_local(QUICKSTART, tmp_path, kubedgx_cache, out)

    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["status"] == "Succeeded"
    assert summary["step"] == summary["totalSteps"] == 150
    assert summary["loss"] < summary["firstLoss"], summary
    assert summary["device"] == "cpu"
    assert summary["worldSize"] == 1
    expected_quantization = "nf4" if model.quantization_usable(4, "cpu")[0] else "none (fallback from nf4)"
    assert summary["quantization"] == expected_quantization
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    assert (out / "adapter" / "adapter_config.json").is_file()
    progress = json.loads((out / "progress.json").read_text(encoding="utf-8"))
    assert progress["step"] == 150
    termination = json.loads((out / "termination-log").read_text(encoding="utf-8"))
    assert termination["status"] == "Succeeded"
    assert termination["progress"]["step"] == 150
    assert termination["progress"]["loss"] == summary["loss"]

    # The config the trainer ran: the manifest's spec.trainer, with the output directory set.
    ran = yaml.safe_load((out / "trainer.yaml").read_text(encoding="utf-8"))
    assert ran["output"]["dir"] == str(out)
    assert ran["dataset"]["path"] == "data/instructions.jsonl"  # resolved against the manifest's directory

    # stdout: a bar line per progress report (not a TTY), then the summary lines; no raw JSON.
    bars = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert len(bars) == 15, result.stdout
    assert re.fullmatch(r"\[#{30}\] 150/150  loss \d+\.\d{4}.*", bars[-1]), bars[-1]
    assert re.fullmatch(r"\[##\.{28}\] 10/150  loss \d+\.\d{4}.*", bars[0]), bars[0]
    assert re.search(
        rf"^done in \d+s: 150 steps, loss {summary['firstLoss']:.4f} -> {summary['loss']:.4f}, "
        rf"{re.escape(expected_quantization)} on cpu \(fp32\)$",
        result.stdout,
        re.MULTILINE,
    ), result.stdout
    assert f"adapter: {out / 'adapter'}" in result.stdout
    assert '{"event"' not in result.stdout
    # The loss curve next to summary.json (tests/unit/test_plot.py looks at the pictures themselves).
    pictures = [out / "loss.html"] + ([out / "loss.png"] if importlib.util.find_spec("matplotlib") else [])
    assert f"loss curve: {', '.join(map(str, pictures))}" in result.stdout
    assert all(p.stat().st_size > 0 for p in pictures)
    assert 'data-series="loss"' in (out / "loss.html").read_text(encoding="utf-8")
    assert f"kubedgx: running quickstart locally with 1 process(es) on the CPU; outputs in {out}" in result.stderr
    assert not (tmp_path / "kubedgx-runs").exists()


def test_the_moe_quickstart_trains_4bit_experts_end_to_end(tmp_path: Path, kubedgx_cache: Path) -> None:
    """examples/moe-quickstart.yaml: the Mixtral example's path (4-bit fused experts, LoRA on them,
    the router's aux loss) at toy size, through the console script."""
    out = tmp_path / "run"
    result = run_local(EXAMPLES / "moe-quickstart.yaml", tmp_path, kubedgx_cache, out)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["quantization"] == "nf4", "every fused expert tensor must be 4-bit for nf4 to be reported"
    assert summary["step"] == 60
    assert summary["loss"] < summary["firstLoss"] - 1.0, summary
    assert "quantized 4 fused expert tensors to 4-bit nf4" in result.stderr  # 2 layers x 2 stacks
    progress = json.loads((out / "progress.json").read_text(encoding="utf-8"))
    assert progress["auxLoss"] > 0
    adapter = json.loads((out / "adapter" / "adapter_config.json").read_text(encoding="utf-8"))
    assert any("experts.gate_up_proj" in t for t in adapter["target_parameters"]), adapter


# --- local.plan, without running anything --------------------------------------------------------


def job_of(changes: dict[str, Any] | None = None) -> DGXTrainingJob:
    return DGXTrainingJob.model_validate(with_changes(quickstart_doc(), changes or {}))


def test_a_local_data_error_ends_with_its_one_line_message_and_exit_2(tmp_path: Path) -> None:
    """The pre-launch check runs before torchrun here too: exit 2, not torchrun's 1 after restarts."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n", encoding="utf-8")
    manifest = tmp_path / "job.yaml"
    doc = with_changes(quickstart_doc(), {"spec.trainer.dataset.path": str(bad)})
    manifest.write_text(yaml.safe_dump(doc), encoding="utf-8")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("KUBEDGX_FAULT")}, **OFFLINE}
    result = subprocess.run(
        [console_script(), "run", str(manifest), "--local", "--output", str(tmp_path / "run")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert result.returncode == 2, result.stderr[-4000:]
    assert "Traceback" not in result.stderr
    problems = [line for line in result.stderr.splitlines() if line.startswith("  dataset.path: ")]
    assert len(problems) == 1, result.stderr[-4000:]
    assert "bad.jsonl:1: not valid JSON" in problems[0]
    assert "kubedgx: the trainer exited with code 2" in result.stderr


def test_plan_for_the_quickstart_on_a_cpu_machine(catalog: Catalog, tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = local.plan(job_of(), QUICKSTART, catalog, output=out, gpus=0, cpus=2)
    assert p.nproc == 1
    assert p.max_restarts == 3  # spec.elastic.maxRestarts' default
    assert p.base_dir == EXAMPLES.resolve()
    assert p.output_dir == out.resolve()
    assert p.config_path == out.resolve() / "trainer.yaml"
    assert p.command == [
        sys.executable,
        "-m",
        "dgx_trainer",
        "launch",
        "--config",
        str(out.resolve() / "trainer.yaml"),
        "--base-dir",
        str(EXAMPLES.resolve()),
        "--output-dir",
        str(out.resolve()),
        "--",
        "--standalone",
        "--nnodes=1",
        "--nproc-per-node=1",
        "--max-restarts=3",
    ]
    assert p.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert p.env["KUBEDGX_TERMINATION_LOG"] == str(out.resolve() / "termination-log")
    assert p.env["KUBEDGX_GPUS_PER_NODE"] == "0"
    assert p.env["PYTHONUNBUFFERED"] == "1"
    assert not out.exists(), "plan must write nothing"


def test_plan_caps_processes_to_the_cpus(catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    job = job_of({"spec.instance": "dgxh100.80g.8.norm"})
    p = local.plan(job, QUICKSTART, catalog, output=tmp_path, gpus=0, cpus=2)
    assert p.nproc == 2
    assert "--nproc-per-node=2" in p.command
    assert p.env["OMP_NUM_THREADS"] == "1"  # two processes share two cores
    assert local.plan(job, QUICKSTART, catalog, output=tmp_path, gpus=0, cpus=64).nproc == 8


def test_plan_caps_processes_to_the_gpus(catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    job = job_of({"spec.instance": "dgxh100.80g.8.norm"})
    p = local.plan(job, QUICKSTART, catalog, output=tmp_path, gpus=4, cpus=64)
    assert p.nproc == 4
    assert p.env["KUBEDGX_GPUS_PER_NODE"] == "4"
    assert "OMP_NUM_THREADS" not in p.env  # GPU processes keep their threads
    assert local.plan(job, QUICKSTART, catalog, output=tmp_path, nproc=16, gpus=8, cpus=64).nproc == 8
    assert local.plan(job, QUICKSTART, catalog, output=tmp_path, nproc=3, gpus=8, cpus=64).nproc == 3
    assert local.plan(job, QUICKSTART, catalog, output=tmp_path, nproc=0, gpus=8, cpus=64).nproc == 1


def test_plan_follows_the_elastic_settings(catalog: Catalog, tmp_path: Path) -> None:
    job = job_of({"spec.instance": "dgxh100.80g.8.norm", "spec.elastic": {"maxRestarts": 5, "nprocPerNode": 2}})
    p = local.plan(job, QUICKSTART, catalog, output=tmp_path, gpus=8, cpus=64)
    assert (p.nproc, p.max_restarts) == (2, 5)
    assert "--max-restarts=5" in p.command
    assert "--nproc-per-node=2" in p.command


def test_plan_default_output_is_under_the_working_directory(
    catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    p = local.plan(job_of(), QUICKSTART, catalog, gpus=0, cpus=2)
    assert p.output_dir == tmp_path.resolve() / "kubedgx-runs" / "quickstart"
    assert not (tmp_path / "kubedgx-runs").exists()


def test_plan_refuses_a_command_job(catalog: Catalog, tmp_path: Path) -> None:
    job = job_of({"spec.trainer": DELETE, "spec.command": ["python", "train.py"]})
    with pytest.raises(local.LocalRunError) as info:
        local.plan(job, QUICKSTART, catalog, output=tmp_path, gpus=0, cpus=2)
    assert str(info.value) == (
        "quickstart: only jobs with spec.trainer run locally; spec.command runs your own program, "
        "which you can start with torchrun directly"
    )


def test_plan_refuses_a_cpu_run_the_job_does_not_allow(catalog: Catalog, tmp_path: Path) -> None:
    job = job_of({"spec.trainer.allowCpu": False})
    with pytest.raises(local.LocalRunError) as info:
        local.plan(job, QUICKSTART, catalog, output=tmp_path, gpus=0, cpus=2)
    assert str(info.value) == (
        "quickstart: no GPU here and spec.trainer.allowCpu is false; set it to true for a (slow) CPU run"
    )
    assert local.plan(job, QUICKSTART, catalog, output=tmp_path, gpus=1, cpus=2).nproc == 1


def test_pick_job() -> None:
    a, b = job_of({"metadata.name": "a"}), job_of({"metadata.name": "b"})
    assert local.pick_job([a], None) is a
    assert local.pick_job([a, b], "b") is b
    with pytest.raises(local.LocalRunError, match=r"no DGXTrainingJob named 'c' \(found: a, b\)"):
        local.pick_job([a, b], "c")
    with pytest.raises(
        local.LocalRunError, match=r"expected one DGXTrainingJob, found 2 \(a, b\): choose one with --job"
    ):
        local.pick_job([a, b], None)
    with pytest.raises(local.LocalRunError, match=r"found 0 \(none\)"):
        local.pick_job([], None)


def test_cli_job_selection_and_refusals_run_nothing(tmp_path: Path) -> None:
    docs = [with_changes(quickstart_doc(), {"metadata.name": name}) for name in ("first", "second")]
    manifest = EXAMPLES / "quickstart.yaml"
    several = tmp_path / "jobs.yaml"
    several.write_text(yaml.safe_dump_all(docs), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["run", str(several), "--local", "--output", str(tmp_path / "o")], out=out, err=err)
    assert code == 2
    assert "expected one DGXTrainingJob, found 2 (first, second): choose one with --job" in err.getvalue()
    err = io.StringIO()
    assert cli.main(["run", str(several), "--local", "--job", "third"], out=out, err=err) == 2
    assert "no DGXTrainingJob named 'third' (found: first, second)" in err.getvalue()
    err = io.StringIO()
    assert cli.main(["run", str(manifest)], out=out, err=err) == 2
    assert "only --local is supported" in err.getvalue()
    assert out.getvalue() == ""
    assert not (tmp_path / "o").exists()
