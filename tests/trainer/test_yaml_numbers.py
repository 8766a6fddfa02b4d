"""YAML numbers as kubectl reads them (YAML 1.2: ``2e-4`` is a number; PyYAML's YAML 1.1 reads it as
a string): `kubedgx validate`, `render`, `run --local` and the trainer itself accept a manifest
written the way ML engineers write learning rates, and train with the value it says."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from dgx_api.trainer_config import load_config
from dgx_operator.cli.main import main
from tests.trainer.conftest import DATA
from tests.trainer.local_run import run_local

#: Written by hand, not by yaml.safe_dump (which would quote nothing and write 0.0002).
MANIFEST = f"""\
apiVersion: kubedgx.io/v1alpha1
kind: DGXTrainingJob
metadata:
  name: sci-notation
spec:
  instance: dgxa100.40g.1.norm
  trainer:
    allowCpu: true
    model:
      name: builtin:tiny-llama
    dataset:
      path: {DATA}
      format: jsonl
      template: instruction
    quantization:
      loadIn4bit: false
    lora:
      r: 8
      alpha: 16
      dropout: 0e0
    training:
      maxSteps: 2
      perDeviceBatchSize: 4
      learningRate: 2e-4
      weightDecay: 1E-2
      warmupRatio: 0e0
      lrScheduler: constant
      maxSeqLength: 64
      gradientCheckpointing: false
      precision: fp32
      loggingSteps: 1
"""


def test_pyyaml_alone_would_read_these_as_strings() -> None:
    """The case is real: without kubedgx's YAML 1.2 number rules, 2e-4 is the string '2e-4'."""
    assert yaml.safe_load("lr: 2e-4")["lr"] == "2e-4"


def test_validate_accepts_yaml_1_2_numbers(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(MANIFEST, encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    assert main(["validate", str(path)], out=out, err=err) == 0, err.getvalue()


def test_render_writes_the_numbers_into_the_trainer_config(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(MANIFEST, encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    assert main(["render", str(path)], out=out, err=err) == 0, err.getvalue()
    [config_map] = [d for d in yaml.safe_load_all(out.getvalue()) if d and d["kind"] == "ConfigMap"]
    [text] = config_map["data"].values()
    training = yaml.safe_load(text)["training"]
    assert training["learningRate"] == pytest.approx(2e-4)
    assert training["weightDecay"] == pytest.approx(1e-2)
    assert isinstance(training["learningRate"], float)


def test_the_trainer_reads_yaml_1_2_numbers_from_its_config_file(tmp_path: Path) -> None:
    trainer = yaml.safe_load(MANIFEST.replace("2e-4", "0.0002"))["spec"]["trainer"]  # the shape
    text = yaml.safe_dump(trainer, sort_keys=False).replace("learningRate: 0.0002", "learningRate: 2e-4")
    assert "learningRate: 2e-4" in text
    path = tmp_path / "trainer.yaml"
    path.write_text(text, encoding="utf-8")
    assert load_config(path).training.learning_rate == pytest.approx(2e-4)


def test_run_local_trains_with_the_learning_rate_the_manifest_says(tmp_path: Path, kubedgx_cache: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(MANIFEST, encoding="utf-8")
    out = tmp_path / "run"
    run_local(path, tmp_path, kubedgx_cache, out)
    progress = json.loads((out / "progress.json").read_text(encoding="utf-8"))
    assert progress["learningRate"] == pytest.approx(2e-4)  # constant schedule, no warm-up
