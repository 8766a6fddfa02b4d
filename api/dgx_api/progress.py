"""How far training got, told three ways (the contract is in docs/trainer.md):

- JSON lines on stdout, one per logging step (``{"event": "progress", ...}``), which
  ``kubedgx run --local`` turns into a progress bar and log collectors can parse;
- ``progress.json`` in the output directory, rewritten atomically at each report;
- on exit, a compact summary in the container's termination message (``/dev/termination-log``,
  at most 4 KiB), which the operator copies into the job's ``status.progress``.

Only the global rank 0 reports: the other ranks train the same steps.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

#: The kubelet truncates termination messages beyond this.
TERMINATION_LIMIT = 4096
#: Marker a checkpoint directory gets once every file of it is written (see checkpoints.py).
COMPLETE_MARKER = "kubedgx-complete.json"


def now_iso() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def write_atomic(path: Path, text: str) -> None:
    """Write-then-rename: a reader (the checkpoint uploader, a human) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _finite_float(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def loads_finite(text: str) -> Any:
    """``json.loads`` that reads ``NaN``, ``Infinity`` and numbers too large for a double (``1e999``)
    as null. Python's json reads and writes them, JSON does not: a status patch carrying one is
    refused by the API server on every pass, so they must not get past where reports are read."""
    return json.loads(text, parse_constant=lambda _: None, parse_float=_finite_float)


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (a diverged loss is NaN) replaced by null, for writing."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def parse_event(line: str) -> dict[str, Any] | None:
    """A progress-contract line (``{"event": ...}``) read back, or None for any other output (the
    libraries underneath print their own lines, some of them dicts)."""
    text = line.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    try:
        value = loads_finite(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) and "event" in value else None


def clip_utf8(text: str, limit: int = TERMINATION_LIMIT) -> str:
    """At most ``limit`` bytes of UTF-8: the kubelet's limit is in bytes, and a cut in the middle
    of a character would leave bytes the operator cannot decode."""
    data = text.encode("utf-8")
    return text if len(data) <= limit else data[:limit].decode("utf-8", errors="ignore")


def termination_message(report: dict[str, Any], path: Path | None) -> str:
    """Write the summary for the operator, trimmed to fit the kubelet's 4 KiB; returns the text.

    Too long, it drops the summary and keeps status and progress; still too long (a pathological
    progress), status alone. What is written is always whole JSON."""
    candidates = (
        report,
        {"status": report.get("status"), "progress": report.get("progress", {})},
        {"status": report.get("status")},
    )
    text = ""
    for candidate in candidates:
        text = json.dumps(finite(candidate), separators=(",", ":"), default=str, allow_nan=False)
        if len(text.encode("utf-8")) <= TERMINATION_LIMIT:
            break
    else:
        text = clip_utf8(text)
    write_termination(text, path)
    return text


def write_termination(text: str, path: Path | None) -> None:
    """Best effort: not in a pod (or not writable), the stdout lines and summary.json remain."""
    if path is not None:
        with contextlib.suppress(OSError):
            path.write_text(clip_utf8(text), encoding="utf-8")


class Reporter:
    """Turns trainer log records into progress reports, with throughput measured between them."""

    def __init__(
        self,
        output_dir: Path,
        *,
        precision: str,
        quantization: str,
        samples_per_step: int,
        enabled: bool,
        stream: TextIO | None = None,
    ) -> None:
        self.output_dir = output_dir
        self.precision = precision
        self.quantization = quantization
        self.samples_per_step = samples_per_step
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self.last: dict[str, Any] = {}
        self._mark: tuple[float, int, float] | None = None  # (time, step, tokens)
        #: evalLoss and evalStep of the last evaluation, carried by every later report: evaluations
        #: are rarer than progress lines, and the job's status must not lose the number between them.
        self._eval: dict[str, Any] = {}

    def emit(self, event: str, payload: dict[str, Any]) -> None:
        if self.enabled:
            self.stream.write(json.dumps(finite({"event": event, **payload}), default=str, allow_nan=False) + "\n")
            self.stream.flush()

    def start(self, step: int, total: int) -> None:
        self._mark = (time.monotonic(), step, 0.0)
        self.emit(
            "start",
            {"step": step, "totalSteps": total, "precision": self.precision, "quantization": self.quantization},
        )

    def log(self, step: int, total: int, epoch: float | None, logs: dict[str, Any]) -> None:
        if "eval_loss" in logs:  # the HF Trainer logs an evaluation's metrics on their own
            self.evaluated(step, total, float(logs["eval_loss"]))
        if "loss" not in logs:
            return
        now = time.monotonic()
        tokens = float(logs.get("num_tokens", 0.0) or 0.0)
        report: dict[str, Any] = {
            "step": step,
            "totalSteps": total,
            "epoch": round(epoch, 4) if epoch is not None else None,
            "loss": float(logs["loss"]),
            "learningRate": float(logs.get("learning_rate", 0.0)),
            "precision": self.precision,
            "quantization": self.quantization,
            "updatedAt": now_iso(),
        }
        if "aux_loss" in logs:  # MoE router load-balancing loss (TRL logs it, unweighted, when it is on)
            report["auxLoss"] = float(logs["aux_loss"])
        if self._mark is not None and now > self._mark[0] and step > self._mark[1]:
            elapsed = now - self._mark[0]
            report["samplesPerSecond"] = round((step - self._mark[1]) * self.samples_per_step / elapsed, 3)
            if tokens > self._mark[2]:
                report["tokensPerSecond"] = round((tokens - self._mark[2]) / elapsed, 1)
        report.update(self._eval)
        self._mark = (now, step, tokens)
        self.last = report
        self.emit("progress", report)
        self._write_progress()

    def evaluated(self, step: int, total: int, eval_loss: float) -> None:
        """An ``eval`` event; the loss goes into the last report (progress.json, the termination
        message) at once and into every later one."""
        self._eval = {"evalLoss": eval_loss, "evalStep": step}
        self.emit("eval", {"step": step, "totalSteps": total, **self._eval, "updatedAt": now_iso()})
        self.last = {**(self.last or {"step": step, "totalSteps": total}), **self._eval}
        self._write_progress()

    def _write_progress(self) -> None:
        if self.enabled:
            write_atomic(
                self.output_dir / "progress.json", json.dumps(finite(self.last), indent=2, allow_nan=False) + "\n"
            )
