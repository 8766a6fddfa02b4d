"""The progress history: every report of a run, read back from the files the trainer appends to.

Progress lines on stdout (docs/trainer.md, "Progress: the contract") are gone with the pod, and
``progress.json`` holds only the last report. So the trainer's :class:`~dgx_api.progress.Reporter`
also appends each line it prints to ``<output_dir>/history/<segment>.jsonl``, one file per Reporter
(``<UTC start>-<hostname>``: a restarted or resumed run writes a new one), and the datasync sidecar
uploads them next to the checkpoints. This module turns those files, or any output holding progress
lines (a ``kubectl logs``), into the points a loss curve is drawn from.

Standard library only, like the rest of the contract: the operator's client, the trainer and a
notebook all read histories with it.

Which lines count:

- ``progress`` gives a :class:`Point` with the training figures of its step. It also carries the
  last evaluation's ``evalLoss`` (for the job's status), which becomes the point's ``eval_loss``
  only when its ``evalStep`` is the point's own step: elsewhere it is an older step's number, and
  an eval curve drawn from it would show steps that were never evaluated.
- ``eval`` gives a Point with ``eval_loss`` at its step (merged with that step's progress point).
- ``start`` and ``summary`` give nothing: a start holds no figure of a step (its total is on every
  report), and a summary repeats the last report's.
- Anything else is ignored: other output, a line cut short, a report whose step is not a whole
  number. Numbers that are not finite were read as null (:func:`dgx_api.progress.loads_finite`);
  a field of the wrong type is taken as absent, so one odd line cannot stop a plot.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgx_api.progress import HISTORY_DIR, parse_event

__all__ = ["HISTORY_DIR", "Point", "merge", "parse_lines", "read_dir"]

#: Point's optional number fields and the progress-line fields they are read from.
_NUMBERS = {
    "loss": "loss",
    "learning_rate": "learningRate",
    "tokens_per_second": "tokensPerSecond",
    "samples_per_second": "samplesPerSecond",
    "epoch": "epoch",
}


@dataclass(frozen=True)
class Point:
    """One report: the figures of one step, None where the report had none."""

    step: int
    total_steps: int | None
    loss: float | None = None
    eval_loss: float | None = None
    learning_rate: float | None = None
    tokens_per_second: float | None = None
    samples_per_second: float | None = None
    epoch: float | None = None
    updated_at: str | None = None


def _count(value: Any) -> int | None:
    """A step or step count: a whole number of at least 0 (bool is not one, though Python says so)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _point(event: dict[str, Any]) -> Point | None:
    """The Point of a ``progress`` or ``eval`` event, None for any other event or a bad step."""
    kind = event.get("event")
    step = _count(event.get("step"))
    if kind not in ("progress", "eval") or step is None:
        return None
    total = _count(event.get("totalSteps"))
    updated = _text(event.get("updatedAt"))
    eval_loss = _number(event.get("evalLoss"))
    if kind == "eval":
        return Point(step, total, eval_loss=eval_loss, updated_at=updated)
    if event.get("evalStep") != step:
        eval_loss = None  # an earlier evaluation's loss, carried along (see the module docstring)
    numbers = {name: _number(event.get(field)) for name, field in _NUMBERS.items()}
    return Point(step, total, eval_loss=eval_loss, updated_at=updated, **numbers)


def parse_lines(lines: Iterable[str]) -> list[Point]:
    """The points of the ``progress`` and ``eval`` lines among ``lines``, in their order.

    ``lines`` may hold any other output (a container log): what is not a progress-contract line is
    skipped. Nothing is merged here: an evaluation and the progress report of its step are two
    points, and a run restarted within the same output shows its steps again; :func:`merge` of
    ``[points]`` makes one point per step of them."""
    points = []
    for line in lines:
        event = parse_event(line)
        point = _point(event) if event is not None else None
        if point is not None:
            points.append(point)
    return points


def _runs(segment: Sequence[Point]) -> Iterator[Sequence[Point]]:
    """``segment`` cut where its steps go back: the same output written by a run and then by its
    restart (a log holding both, or a segment file continued by a restart in the same second on
    the same host). Equal steps stay together: an evaluation and a report of one step."""
    start = 0
    highest = -1
    for index, point in enumerate(segment):
        if point.step < highest:
            yield segment[start:index]
            start = index
        highest = point.step if index == start else max(highest, point.step)
    yield segment[start:]


def _combined(earlier: Point, later: Point) -> Point:
    """Two reports of one step as one: the later one's figures, the earlier one's where the later has
    none (an ``eval`` point adds its loss to the progress point of its step, and the reverse)."""
    figures = {f.name: getattr(later, f.name) for f in dataclasses.fields(later) if getattr(later, f.name) is not None}
    return dataclasses.replace(earlier, **figures)


def merge(segments: Sequence[Sequence[Point]]) -> list[Point]:
    """One point per step, sorted by step, from ``segments`` given oldest first.

    A resumed run starts again from its checkpoint, so it redoes the steps between that checkpoint
    and where the run before it stopped: a later segment's points replace the earlier segments'
    points at every step from its first step on (the old ones belong to a trajectory nobody
    continued). Points of the same step within a segment (an evaluation and the report of that
    step) are combined. A segment whose steps go back is taken as several, cut there."""
    by_step: dict[int, Point] = {}
    for segment in segments:
        for run in _runs(segment):
            if not run:
                continue
            first = run[0].step
            by_step = {step: point for step, point in by_step.items() if step < first}
            for point in run:
                earlier = by_step.get(point.step)
                by_step[point.step] = point if earlier is None else _combined(earlier, point)
    return [by_step[step] for step in sorted(by_step)]


def read_dir(directory: Path) -> list[Point]:
    """The merged history under ``directory`` (a run's output directory, or a downloaded ``logs/``):
    every ``history/*.jsonl`` there, one segment each, in name order, which is start order.

    No history yet is an empty list. A file is read as UTF-8 with undecodable bytes replaced: a
    line cut short, or damaged, is skipped like any other that is not a progress line."""
    folder = directory / HISTORY_DIR
    if not folder.is_dir():
        return []
    segments = []
    for path in sorted(folder.glob("*.jsonl"), key=lambda p: p.name):
        if path.is_file():
            segments.append(parse_lines(path.read_text(encoding="utf-8", errors="replace").splitlines()))
    return merge(segments)
