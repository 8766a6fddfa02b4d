"""The progress history (issue 33's contract), a stand-in on the plot branch.

PLACEHOLDER: helper "history" writes the real module (with ``merge`` and ``read_dir``); at merge its
file replaces this one. Only what the plot and ``kubedgx run --local`` use is here, with the
contract's names and types.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from dgx_api.progress import parse_event

HISTORY_DIR: Final = "history"


@dataclass(frozen=True)
class Point:
    """One report."""

    step: int
    total_steps: int | None
    loss: float | None = None
    eval_loss: float | None = None
    learning_rate: float | None = None
    tokens_per_second: float | None = None
    samples_per_second: float | None = None
    epoch: float | None = None
    updated_at: str | None = None


def _number(record: dict[str, Any], key: str) -> float | None:
    value = record.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def parse_lines(lines: Iterable[str]) -> list[Point]:
    """The progress and eval lines among any other output, one point each; others ignored."""
    points: list[Point] = []
    for line in lines:
        record = parse_event(line)
        if record is None or not isinstance(record.get("step"), int):
            continue
        total = record.get("totalSteps")
        total = total if isinstance(total, int) else None
        updated = record.get("updatedAt")
        updated = updated if isinstance(updated, str) else None
        if record["event"] == "eval":
            points.append(Point(record["step"], total, eval_loss=_number(record, "evalLoss"), updated_at=updated))
        elif record["event"] == "progress":
            points.append(
                Point(
                    record["step"],
                    total,
                    loss=_number(record, "loss"),
                    learning_rate=_number(record, "learningRate"),
                    tokens_per_second=_number(record, "tokensPerSecond"),
                    samples_per_second=_number(record, "samplesPerSecond"),
                    epoch=_number(record, "epoch"),
                    updated_at=updated,
                )
            )
    return points
