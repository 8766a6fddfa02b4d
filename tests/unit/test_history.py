"""The progress history (dgx_api.history and the Reporter's history files): the lines a run appends
to ``<output>/history/<segment>.jsonl``, read back and merged into one point per step."""

from __future__ import annotations

import io
import json
import logging
import socket
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dgx_api import history, progress
from dgx_api.history import HISTORY_DIR, Point, merge, parse_lines, read_dir
from dgx_api.progress import Reporter, segment_name


def line(event: str, **fields: Any) -> str:
    return json.dumps({"event": event, **fields})


def report(step: int, loss: float, **fields: Any) -> str:
    return line("progress", step=step, totalSteps=100, loss=loss, learningRate=0.001, **fields)


# --- parse_lines ---------------------------------------------------------------------------------


def test_a_progress_line_gives_every_figure_of_its_step() -> None:
    text = line(
        "progress",
        step=10,
        totalSteps=150,
        epoch=0.5263,
        loss=5.5,
        learningRate=0.005,
        tokensPerSecond=2500.0,
        samplesPerSecond=40,
        precision="bf16",
        gpuUtilization=98.8,
        updatedAt="2026-11-29T20:45:07Z",
    )
    assert parse_lines([text]) == [
        Point(
            step=10,
            total_steps=150,
            loss=5.5,
            learning_rate=0.005,
            tokens_per_second=2500.0,
            samples_per_second=40.0,
            epoch=0.5263,
            updated_at="2026-11-29T20:45:07Z",
        )
    ]


def test_junk_and_other_events_are_ignored() -> None:
    lines = [
        "Loading checkpoint shards: 100%",
        "{'loss': 1.0, 'step': 3}",  # a library's dict, not JSON
        '{"loss": 1.0, "step": 3}',  # JSON, but no event
        line("start", step=0, totalSteps=100, precision="fp32"),
        report(10, 2.0),
        '{"event": "progress", "step": 20, "loss": 1.',  # cut short
        line("progress", step="20", loss=1.0),  # a step that is not a number
        line("progress", step=20.5, loss=1.0),
        line("progress", step=True, loss=1.0),
        line("progress", step=-1, loss=1.0),
        line("progress", loss=1.0),
        line("summary", status="Succeeded", step=100, loss=0.5),
        line("eval", step=10, evalLoss=2.5, evalStep=10),
        "",
    ]
    assert [(p.step, p.loss, p.eval_loss) for p in parse_lines(lines)] == [(10, 2.0, None), (10, None, 2.5)]


def test_a_field_of_the_wrong_type_or_not_finite_is_absent() -> None:
    [point] = parse_lines(
        [
            '{"event": "progress", "step": 5, "totalSteps": "many", "loss": NaN, "learningRate": "0.1", '
            '"tokensPerSecond": 1e999, "samplesPerSecond": true, "epoch": null, "updatedAt": 12}'
        ]
    )
    assert point == Point(step=5, total_steps=None)


def test_a_progress_line_carries_an_earlier_evaluation_that_is_not_its_own() -> None:
    """Progress lines repeat the last evaluation's loss for the job's status; the history keeps it
    only at the step that was evaluated."""
    lines = [
        line("eval", step=10, totalSteps=100, evalLoss=2.5, evalStep=10, updatedAt="t1"),
        report(10, 3.0, evalLoss=2.5, evalStep=10),
        report(20, 2.8, evalLoss=2.5, evalStep=10),
    ]
    points = parse_lines(lines)
    assert [(p.step, p.loss, p.eval_loss) for p in points] == [(10, None, 2.5), (10, 3.0, 2.5), (20, 2.8, None)]


# --- merge ---------------------------------------------------------------------------------------


def test_an_evaluation_is_merged_into_the_progress_point_of_its_step() -> None:
    points = parse_lines(
        [
            report(10, 3.0),
            line("eval", step=10, totalSteps=100, evalLoss=2.5, evalStep=10, updatedAt="later"),
            report(20, 2.8),
            line("eval", step=25, totalSteps=100, evalLoss=2.4, evalStep=25),  # no report at 25
        ]
    )
    merged = merge([points])
    assert [(p.step, p.loss, p.eval_loss, p.learning_rate) for p in merged] == [
        (10, 3.0, 2.5, 0.001),
        (20, 2.8, None, 0.001),
        (25, None, 2.4, None),
    ]
    assert merged[0].updated_at == "later"  # the later report's figures win where it has them
    # The evaluation first (as the Reporter prints one that the HF Trainer logs with the loss): the same.
    assert merge([list(reversed(points[:2]))])[0] == Point(
        10, 100, loss=3.0, eval_loss=2.5, learning_rate=0.001, updated_at="later"
    )


def test_a_resume_replaces_the_steps_it_redoes() -> None:
    """The first run logged steps 10..50 and was stopped; its newest checkpoint was at step 30, so
    the resumed run redoes 40 and 50 (and an evaluation at 40 that the first run also made). The
    first run's 40 and 50 belong to a trajectory nobody continued: they are gone, 10..30 stay."""
    first = parse_lines(
        [
            *(report(step, 10.0 - step / 10) for step in (10, 20, 30, 40)),
            line("eval", step=40, evalLoss=9.0, evalStep=40),
            report(50, 5.0),
        ]
    )
    second = parse_lines(
        [
            line("start", step=30, totalSteps=100),
            report(40, 4.4),
            report(50, 4.3),
            report(60, 4.2),
        ]
    )
    merged = merge([first, second])
    assert [(p.step, p.loss, p.eval_loss) for p in merged] == [
        (10, 9.0, None),
        (20, 8.0, None),
        (30, 7.0, None),
        (40, 4.4, None),
        (50, 4.3, None),
        (60, 4.2, None),
    ]
    # Given in the wrong order, the older segment would win: the order is the caller's to get right.
    assert [p.loss for p in merge([second, first])][3:] == [6.0, 5.0]


def test_a_segment_whose_steps_go_back_is_a_restart() -> None:
    """One stream holding a run and its restart (kubectl logs of a container whose trainer was
    restarted in place): the restart's steps replace the first run's from its first step on."""
    points = parse_lines([report(10, 3.0), report(20, 2.0), report(30, 1.0), report(20, 2.5), report(25, 2.4)])
    assert [(p.step, p.loss) for p in merge([points])] == [(10, 3.0), (20, 2.5), (25, 2.4)]


def test_merge_of_nothing_is_nothing() -> None:
    assert merge([]) == []
    assert merge([[], []]) == []


steps = st.lists(st.integers(min_value=0, max_value=60), max_size=25)


@given(st.lists(steps, max_size=5))
def test_merge_gives_one_point_per_step_in_order_from_the_newest_segment_that_has_it(
    segments_steps: list[list[int]],
) -> None:
    """Whatever the segments (sorted or not, repeating steps or not): one point per step, sorted;
    every point is a step some segment reported, and the last segment's last run is all there."""
    segments = [
        [Point(step, 60, loss=float(index * 1000 + position)) for position, step in enumerate(seg)]
        for index, seg in enumerate(segments_steps)
    ]
    merged = merge(segments)
    got = [p.step for p in merged]
    assert got == sorted(set(got))
    assert set(got) <= {s for seg in segments_steps for s in seg}
    last = next((seg for seg in reversed(segments_steps) if seg), [])
    tail: list[int] = []
    for step in last:  # the last run of the newest non-empty segment: after its last step back
        if tail and step < max(tail):
            tail = []
        tail.append(step)
    assert set(tail) <= set(got)
    if tail:
        assert max(got) == max(tail)  # nothing of an older trajectory beyond the newest run


# --- the Reporter's history files ----------------------------------------------------------------


def new_reporter(out: Path, *, enabled: bool = True, stream: io.StringIO | None = None) -> Reporter:
    return Reporter(
        out, precision="bf16", quantization="nf4", samples_per_step=8, enabled=enabled, stream=stream or io.StringIO()
    )


def test_segment_names_sort_by_start_and_are_file_names() -> None:
    started = datetime(2026, 11, 29, 20, 45, 7, tzinfo=UTC)
    assert segment_name(started, "job-worker-0") == "20261129T204507Z-job-worker-0"
    assert segment_name(started, "odd/host name") == "20261129T204507Z-odd-host-name"
    assert segment_name(started, "") == "20261129T204507Z-localhost"
    later = datetime(2026, 11, 29, 21, 0, 0, tzinfo=UTC)
    assert segment_name(started, "zz") < segment_name(later, "aa")


def test_the_reporter_appends_every_line_it_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "job-worker-0")
    monkeypatch.setattr(time, "monotonic", lambda: 1000.0)  # no time passes: no rates
    stream = io.StringIO()
    r = new_reporter(tmp_path, stream=stream)
    r.start(0, 100)
    r.log(10, 100, 0.1, {"loss": 3.0, "learning_rate": 0.001})
    r.log(10, 100, 0.1, {"eval_loss": 2.5})
    r.emit("summary", {"status": "Succeeded"})
    [file] = (tmp_path / HISTORY_DIR).iterdir()
    assert file == r.history_file
    assert file.name.endswith("-job-worker-0.jsonl")
    assert file.read_text(encoding="utf-8") == stream.getvalue()  # the same lines, whole
    [point] = read_dir(tmp_path)
    assert point.updated_at is not None
    assert point == Point(10, 100, loss=3.0, eval_loss=2.5, learning_rate=0.001, epoch=0.1, updated_at=point.updated_at)


def test_each_reporter_writes_a_segment_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resumed run (here on another node) starts a new file and leaves the old one alone; read
    back, the resumed run's steps replace those it redid."""
    monkeypatch.setattr(socket, "gethostname", lambda: "node-a")
    first = new_reporter(tmp_path)
    first.start(0, 40)
    for step in (10, 20, 30):
        first.log(step, 40, None, {"loss": 5.0 - step / 10})
    before = first.history_file.read_bytes() if first.history_file else b""
    monkeypatch.setattr(socket, "gethostname", lambda: "node-b")
    second = new_reporter(tmp_path)
    second.start(10, 40)
    for step in (20, 30, 40):
        second.log(step, 40, None, {"loss": 1.0 - step / 100})
    assert first.history_file is not None
    assert second.history_file is not None
    assert first.history_file != second.history_file
    assert first.history_file.read_bytes() == before
    names = sorted(p.name for p in (tmp_path / HISTORY_DIR).iterdir())
    assert names == [first.history_file.name, second.history_file.name]  # by start, then host
    assert [(p.step, p.loss) for p in read_dir(tmp_path)] == [(10, 4.0), (20, 0.8), (30, 0.7), (40, 0.6)]


def test_only_rank_0_keeps_a_history(tmp_path: Path) -> None:
    r = new_reporter(tmp_path, enabled=False)
    r.start(0, 10)
    r.log(1, 10, None, {"loss": 1.0})
    assert not (tmp_path / HISTORY_DIR).exists()
    assert read_dir(tmp_path) == []


def test_a_history_that_cannot_be_written_is_warned_about_once_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / HISTORY_DIR).write_text("a file where the folder would be")
    stream = io.StringIO()
    r = new_reporter(tmp_path, stream=stream)
    with caplog.at_level(logging.WARNING, logger="dgx_api.progress"):
        r.start(0, 10)
        r.log(1, 10, None, {"loss": 1.0})
        r.log(2, 10, None, {"loss": 0.9})
    assert len(stream.getvalue().splitlines()) == 3  # every line printed all the same
    assert json.loads((tmp_path / "progress.json").read_text())["step"] == 2
    warnings = [rec.getMessage() for rec in caplog.records if rec.name == "dgx_api.progress"]
    assert len(warnings) == 1, warnings
    assert "cannot write the progress history" in warnings[0]
    assert "training goes on" in warnings[0]


def test_read_dir_reads_the_segments_in_name_order_and_skips_what_is_not_one(tmp_path: Path) -> None:
    folder = tmp_path / HISTORY_DIR
    folder.mkdir()
    (folder / "20260101T000000Z-a.jsonl").write_text(report(10, 3.0) + "\n" + report(20, 2.0) + "\n")
    (folder / "20260101T010000Z-b.jsonl").write_bytes((report(20, 1.5) + "\n").encode() + b'{"event": "pro\xff')
    (folder / "notes.txt").write_text(report(30, 0.1))
    (folder / "20260101T020000Z-c.jsonl").mkdir()
    assert [(p.step, p.loss) for p in read_dir(tmp_path)] == [(10, 3.0), (20, 1.5)]
    assert read_dir(tmp_path / "nothing") == []
    assert history.HISTORY_DIR == progress.HISTORY_DIR == "history"
