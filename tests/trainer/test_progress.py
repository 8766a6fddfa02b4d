"""The progress contract (docs/trainer.md): JSON lines on stdout, progress.json, the termination
message, and summary.json, first pure, then after a real run."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from dgx_api import progress
from dgx_api.history import HISTORY_DIR, read_dir
from dgx_api.progress import TERMINATION_LIMIT, Reporter, finite, loads_finite, termination_message, write_atomic
from tests.trainer.conftest import RESUME_CHANGES, Baseline

ISO_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
SUMMARY_KEYS = {
    "status",
    "model",
    "device",
    "worldSize",
    "precision",
    "quantization",
    "adapterDtype",
    "step",
    "totalSteps",
    "epoch",
    "firstLoss",
    "loss",
    "trainLoss",
    "evalLoss",
    "samplesPerSecond",
    "runtimeSeconds",
    "resumedFrom",
    "adapter",
    "merged",
    "completedAt",
}


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(progress.time, "monotonic", fake)
    return fake


def reporter(out: Path, stream: io.StringIO, *, enabled: bool = True, samples_per_step: int = 8) -> Reporter:
    return Reporter(
        out, precision="bf16", quantization="nf4", samples_per_step=samples_per_step, enabled=enabled, stream=stream
    )


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    text = stream.getvalue()
    assert text.endswith("\n") or not text
    return [json.loads(line) for line in text.splitlines()]


# --- Reporter -----------------------------------------------------------------------------------


def test_start_line(tmp_path: Path, clock: Clock) -> None:
    stream = io.StringIO()
    reporter(tmp_path, stream).start(40, 150)
    assert lines(stream) == [
        {"event": "start", "step": 40, "totalSteps": 150, "precision": "bf16", "quantization": "nf4"}
    ]
    assert not (tmp_path / "progress.json").exists()


def test_progress_lines_and_progress_json(tmp_path: Path, clock: Clock) -> None:
    stream = io.StringIO()
    r = reporter(tmp_path, stream)
    r.start(0, 150)
    clock.now += 2.0
    r.log(10, 150, 0.526315, {"loss": 5.5, "learning_rate": 0.005, "num_tokens": 5000.0, "grad_norm": 1.2})
    start, line = lines(stream)
    assert start["event"] == "start"
    assert line.pop("event") == "progress"
    assert ISO_Z.match(line.pop("updatedAt"))
    assert line == {
        "step": 10,
        "totalSteps": 150,
        "epoch": 0.5263,
        "loss": 5.5,
        "learningRate": 0.005,
        "precision": "bf16",
        "quantization": "nf4",
        "samplesPerSecond": 40.0,  # 10 steps x 8 samples / 2 s
        "tokensPerSecond": 2500.0,  # 5000 tokens / 2 s
    }
    saved = json.loads((tmp_path / "progress.json").read_text(encoding="utf-8"))
    assert saved == r.last
    assert saved["samplesPerSecond"] == 40.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history", "progress.json"]  # no temporary file left behind


def test_throughput_is_measured_between_reports(tmp_path: Path, clock: Clock) -> None:
    stream = io.StringIO()
    r = reporter(tmp_path, stream, samples_per_step=32)
    r.start(100, 200)  # a resumed run: throughput counts from the resume step, not from 0
    clock.now += 4.0
    r.log(110, 200, 1.0, {"loss": 3.0, "num_tokens": 1000.0})
    clock.now += 1.0
    r.log(120, 200, 1.1, {"loss": 2.9, "num_tokens": 1000.0})  # tokens did not grow: no token rate
    r.log(130, 200, 1.2, {"loss": 2.8})  # no time passed: no rates at all
    first, second, third = (line for line in lines(stream) if line["event"] == "progress")
    assert first["samplesPerSecond"] == 80.0
    assert first["tokensPerSecond"] == 250.0
    assert second["samplesPerSecond"] == 320.0
    assert "tokensPerSecond" not in second
    assert "samplesPerSecond" not in third
    assert "tokensPerSecond" not in third


def test_records_without_a_loss_are_not_reported(tmp_path: Path, clock: Clock) -> None:
    stream = io.StringIO()
    r = reporter(tmp_path, stream)
    r.log(150, 150, 8.0, {"train_runtime": 12.0, "train_loss": 4.5})
    r.log(150, 150, 8.0, {})
    assert stream.getvalue() == ""
    assert r.last == {}
    assert not (tmp_path / "progress.json").exists()


def test_other_ranks_stay_silent(tmp_path: Path, clock: Clock) -> None:
    stream = io.StringIO()
    r = reporter(tmp_path, stream, enabled=False)
    r.start(0, 10)
    clock.now += 1
    r.log(1, 10, 0.1, {"loss": 1.0})
    r.emit("summary", {"status": "Succeeded"})
    assert stream.getvalue() == ""
    assert not (tmp_path / "progress.json").exists()


def test_progress_json_is_replaced_atomically(tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader sees the old complete file or the new one: the new text goes to a temporary file
    in the same directory, which is renamed over the target."""
    stream = io.StringIO()
    r = reporter(tmp_path, stream)
    r.start(0, 10)
    clock.now += 1
    r.log(1, 10, 0.1, {"loss": 2.0})
    target = tmp_path / "progress.json"
    old = target.read_text(encoding="utf-8")
    replaced: list[tuple[Path, Path, str]] = []
    real_replace = os.replace

    def spy(src: Any, dst: Any) -> None:
        replaced.append((Path(src), Path(dst), Path(dst).read_text(encoding="utf-8")))
        real_replace(src, dst)

    monkeypatch.setattr(progress.os, "replace", spy)
    clock.now += 1
    r.log(2, 10, 0.2, {"loss": 1.5})
    ((src, dst, seen_before),) = replaced
    assert dst == target
    assert src.parent == target.parent
    assert src != target
    assert seen_before == old  # the target was untouched until the rename
    assert not src.exists()
    assert json.loads(target.read_text(encoding="utf-8"))["loss"] == 1.5


def test_write_atomic_creates_parents(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "file.json"
    write_atomic(path, "{}\n")
    assert path.read_text(encoding="utf-8") == "{}\n"
    assert [p.name for p in path.parent.iterdir()] == ["file.json"]


# --- the termination message ----------------------------------------------------------------------


def test_termination_message_is_compact_json_written_to_the_path(tmp_path: Path) -> None:
    report = {"status": "Succeeded", "progress": {"step": 3, "loss": 1.25}, "summary": {"step": 3}}
    path = tmp_path / "termination-log"
    text = termination_message(report, path)
    assert text == '{"status":"Succeeded","progress":{"step":3,"loss":1.25},"summary":{"step":3}}'
    assert path.read_text(encoding="utf-8") == text


def test_a_huge_summary_is_trimmed_to_the_progress(tmp_path: Path) -> None:
    last = {"step": 150, "totalSteps": 150, "loss": 4.2, "quantization": "nf4"}
    report = {"status": "Succeeded", "progress": last, "summary": {"notes": ["x" * 1000] * 50, "model": "é" * 3000}}
    path = tmp_path / "termination-log"
    text = termination_message(report, path)
    assert len(path.read_bytes()) <= TERMINATION_LIMIT
    assert len(text.encode()) <= TERMINATION_LIMIT
    assert json.loads(text) == {"progress": last, "status": "Succeeded"}


def test_even_a_huge_progress_fits(tmp_path: Path) -> None:
    report = {"status": "Succeeded", "progress": {"note": "ü" * 10_000}, "summary": {}}
    path = tmp_path / "termination-log"
    text = termination_message(report, path)
    assert len(path.read_bytes()) <= TERMINATION_LIMIT
    assert json.loads(path.read_text(encoding="utf-8")) == json.loads(text) == {"status": "Succeeded"}


def test_clip_utf8_never_splits_a_character() -> None:
    from dgx_api.progress import clip_utf8

    assert clip_utf8("abc", 3) == "abc"
    assert clip_utf8("ééé", 5) == "éé"  # 6 bytes; the third é would be cut in half
    assert clip_utf8("ab€", 4) == "ab"


def test_termination_message_without_a_writable_path(tmp_path: Path) -> None:
    report = {"status": "Succeeded", "progress": {}}
    assert json.loads(termination_message(report, None)) == report
    assert json.loads(termination_message(report, tmp_path / "missing-dir" / "termination-log")) == report


# --- after a real run ---------------------------------------------------------------------------


def test_stdout_holds_only_the_contract_lines(baseline_run: Baseline) -> None:
    result = baseline_run.result
    steps = RESUME_CHANGES["training.maxSteps"]
    assert result.other_stdout == []
    assert [e["event"] for e in result.events] == ["start"] + ["progress"] * steps + ["summary"]
    assert result.events[0] == {
        "event": "start",
        "step": 0,
        "totalSteps": steps,
        "precision": "fp32",
        "quantization": "none",
    }
    reports = result.of("progress")
    assert [e["step"] for e in reports] == list(range(1, steps + 1))
    for e in reports:
        assert (e["totalSteps"], e["precision"], e["quantization"]) == (steps, "fp32", "none")
        assert ISO_Z.match(e["updatedAt"])
        assert e["samplesPerSecond"] > 0
        assert e["tokensPerSecond"] > 0
    assert reports[-1]["epoch"] == pytest.approx(steps * 4 / 148, abs=1e-4)


def test_the_history_holds_the_lines_of_stdout(baseline_run: Baseline) -> None:
    """The run's one segment (one start, one host) holds exactly what stdout did, and reads back
    as one point per step with the printed losses."""
    result = baseline_run.result
    [segment] = (baseline_run.output_dir / HISTORY_DIR).iterdir()
    assert re.fullmatch(r"\d{8}T\d{6}Z-.+\.jsonl", segment.name), segment.name
    text = segment.read_text(encoding="utf-8")
    assert text.endswith("\n")
    assert [json.loads(line) for line in text.splitlines()] == result.events
    points = read_dir(baseline_run.output_dir)
    reports = result.of("progress")
    assert [(p.step, p.loss, p.learning_rate) for p in points] == [
        (e["step"], e["loss"], e["learningRate"]) for e in reports
    ]


def test_summary_json_and_the_termination_message(baseline_run: Baseline) -> None:
    out = baseline_run.output_dir
    result = baseline_run.result
    steps = RESUME_CHANGES["training.maxSteps"]
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert set(summary) == SUMMARY_KEYS
    assert summary == {k: v for k, v in result.summary.items() if k != "event"}
    reports = result.of("progress")
    assert summary["status"] == "Succeeded"
    assert summary["model"] == "builtin:tiny-llama"
    assert (summary["device"], summary["worldSize"], summary["precision"]) == ("cpu", 1, "fp32")
    assert (summary["quantization"], summary["adapterDtype"]) == ("none", "float32")
    assert summary["step"] == summary["totalSteps"] == steps
    assert summary["firstLoss"] == reports[0]["loss"]
    assert summary["loss"] == reports[-1]["loss"]
    assert summary["trainLoss"] == pytest.approx(sum(e["loss"] for e in reports) / steps, rel=1e-3)
    assert (summary["evalLoss"], summary["merged"], summary["resumedFrom"]) == (None, None, None)
    assert summary["adapter"] == str(out / "adapter")
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    assert ISO_Z.match(summary["completedAt"])
    assert summary["runtimeSeconds"] > 0

    last = json.loads((out / "progress.json").read_text(encoding="utf-8"))
    assert last == {k: v for k, v in reports[-1].items() if k != "event"}

    raw = (out / "termination-log").read_bytes()
    assert len(raw) <= TERMINATION_LIMIT
    termination = json.loads(raw)
    assert termination == {"status": "Succeeded", "progress": last, "summary": summary}


def test_non_finite_values_are_written_as_null(tmp_path: Path) -> None:
    """A diverged loss is NaN: what the trainer writes (progress lines, progress.json, the termination
    message) stays JSON, and what is read back treats NaN, Infinity and 1e999 as null."""
    assert finite({"loss": float("nan"), "lr": [float("inf"), 1.0], "step": 3}) == {
        "loss": None,
        "lr": [None, 1.0],
        "step": 3,
    }
    assert loads_finite('{"a": NaN, "b": -Infinity, "c": 1e999, "d": 2.5}') == {
        "a": None,
        "b": None,
        "c": None,
        "d": 2.5,
    }
    text = termination_message({"status": "Failed", "progress": {"loss": float("nan")}}, tmp_path / "term")
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in {text}")) == {
        "status": "Failed",
        "progress": {"loss": None},
    }
    stream = io.StringIO()
    reporter = Reporter(
        tmp_path, precision="fp32", quantization="none", samples_per_step=1, enabled=True, stream=stream
    )
    reporter.log(1, 10, 0.1, {"loss": float("nan"), "learning_rate": float("inf")})
    for line in [*stream.getvalue().splitlines(), (tmp_path / "progress.json").read_text()]:
        assert "NaN" not in line
        assert "Infinity" not in line
