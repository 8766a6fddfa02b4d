"""How far training got, told three ways (the contract is in docs/trainer.md):

- JSON lines on stdout, one per logging step (``{"event": "progress", ...}``), which
  ``kubedgx run --local`` turns into a progress bar and log collectors can parse;
- ``progress.json`` in the output directory, rewritten atomically at each report;
- on exit, a compact summary in the container's termination message (``/dev/termination-log``,
  at most 4 KiB), which the operator copies into the job's ``status.progress``;
- every line again in ``history/<segment>.jsonl`` under the output directory, the run's history
  that outlives the pod (the datasync sidecar uploads it; :mod:`dgx_api.history` reads it back).

Only the global rank 0 reports: the other ranks train the same steps.

On GPUs a report also says why its throughput is what it is: the utilization and memory of rank
0's GPU (a :class:`GpuSampler`, NVML in the trainer) and the model FLOPs utilization (``mfu``) its
tokens per second amount to (a :class:`FlopsBasis`). Both are injected, so this module stays free
of torch and NVML and the arithmetic is testable anywhere; without them (a CPU run, an NVML error,
a GPU whose peak is unknown) the fields are absent, never zero.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import socket
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Protocol, TextIO

#: The kubelet truncates termination messages beyond this.
TERMINATION_LIMIT = 4096
#: Marker a checkpoint directory gets once every file of it is written (see checkpoints.py).
COMPLETE_MARKER = "kubedgx-complete.json"
#: The output directory's folder of progress history files (one ``<segment>.jsonl`` per Reporter:
#: see :meth:`Reporter.emit`). Defined here, beside the writer; :mod:`dgx_api.history` re-exports it.
HISTORY_DIR: Final = "history"
#: A segment's start, in its file name: sortable as text, and free of ``:`` (not in every file system).
SEGMENT_TIME: Final = "%Y%m%dT%H%M%SZ"

_LOG = logging.getLogger(__name__)


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


def segment_name(started: datetime, hostname: str) -> str:
    """``<UTC start>-<hostname>``: the history file of one Reporter. The start makes a restart's
    file a new one that sorts after the old (names sort by start), and the host keeps two nodes'
    files apart even if they started the same second. A host name has only letters, digits, ``-``
    and ``.``; anything else (it is only ever a file name here) becomes ``-``."""
    host = re.sub(r"[^A-Za-z0-9.-]", "-", hostname).strip(".") or "localhost"
    return f"{started.astimezone(UTC).strftime(SEGMENT_TIME)}-{host}"


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


@dataclass(frozen=True)
class GpuSample:
    """One look at a GPU; a figure the device would not give is None (and left out of the report)."""

    name: str
    #: Percent of time a kernel ran, averaged since the previous sample where the sampler can.
    utilization: float | None = None
    #: Device memory in use as the driver counts it: the CUDA context, the caching allocator's
    #: reserve and any other process's, so more than the tensors alone.
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None


class GpuSampler(Protocol):
    """What a report asks the GPU; None, or an exception, leaves the GPU fields out of it."""

    def sample(self) -> GpuSample | None: ...


@dataclass(frozen=True)
class FlopsBasis:
    """What ``mfu`` = achieved model FLOPs/s / peak FLOPs/s is computed from.

    ``flops_per_token`` is the model's FLOPs for one trained token, forward and backward;
    ``peak_flops`` the dense peak of all the GPUs the tokens are counted on (the world size times
    one GPU's). How the trainer gets both is in docs/trainer.md ("Throughput")."""

    flops_per_token: float
    peak_flops: float

    def mfu(self, tokens_per_second: float) -> float | None:
        if self.peak_flops <= 0 or self.flops_per_token <= 0:
            return None
        return tokens_per_second * self.flops_per_token / self.peak_flops


class Reporter:
    """Turns trainer log records into progress reports, with throughput measured between them.

    ``gpu`` and ``flops`` explain the throughput (see the module docstring); ``flops`` may be set
    after construction, because the trainable parameters exist only once the trainer has wrapped
    the model, after the reporter was handed to it."""

    def __init__(
        self,
        output_dir: Path,
        *,
        precision: str,
        quantization: str,
        samples_per_step: int,
        enabled: bool,
        stream: TextIO | None = None,
        gpu: GpuSampler | None = None,
        flops: FlopsBasis | None = None,
    ) -> None:
        self.output_dir = output_dir
        self.gpu = gpu
        self.flops = flops
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
        #: This Reporter's history file, named at its first write (:meth:`_append_history`).
        self.history_file: Path | None = None
        self._history_warned = False

    def emit(self, event: str, payload: dict[str, Any]) -> None:
        """One event: a JSON line on the stream and the same line appended to the history file."""
        if self.enabled:
            line = json.dumps(finite({"event": event, **payload}), default=str, allow_nan=False) + "\n"
            self.stream.write(line)
            self.stream.flush()
            self._append_history(line)

    def _append_history(self, line: str) -> None:
        """``line`` at the end of ``<output_dir>/history/<segment>.jsonl``.

        The segment (:func:`segment_name`) is fixed at the first write, so a restarted or resumed
        run, on this node or another, writes a file of its own and never appends to a file that an
        earlier run's sidecar may be uploading. Each line is opened, appended (``O_APPEND``: whole
        lines, one write each) and closed: a reader or the uploader always sees whole lines, and no
        descriptor is held for the life of training. A failure to write (a full or read-only disk)
        is logged once and otherwise ignored: the history is a record of training, never a reason
        for it to stop; the stdout line and progress.json are written regardless."""
        try:
            if self.history_file is None:
                directory = self.output_dir / HISTORY_DIR
                directory.mkdir(parents=True, exist_ok=True)
                self.history_file = directory / f"{segment_name(datetime.now(UTC), socket.gethostname())}.jsonl"
            data = line.encode("utf-8")
            fd = os.open(self.history_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
        except OSError as exc:
            if not self._history_warned:
                self._history_warned = True
                where = self.history_file or self.output_dir / HISTORY_DIR
                _LOG.warning("cannot write the progress history %s (%s); training goes on without it", where, exc)

    def start(self, step: int, total: int) -> None:
        self._mark = (time.monotonic(), step, 0.0)
        self._gpu_fields()  # opens the GPU's window: the first report averages training, not loading
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
                rate = (tokens - self._mark[2]) / elapsed
                report["tokensPerSecond"] = round(rate, 1)
                mfu = self.flops.mfu(rate) if self.flops is not None else None
                if mfu is not None:
                    report["mfu"] = round(mfu, 4)
        report.update(self._gpu_fields())
        report.update(self._eval)
        self._mark = (now, step, tokens)
        self.last = report
        self.emit("progress", report)
        self._write_progress()

    def _gpu_fields(self) -> dict[str, Any]:
        """The GPU's figures for a report: whatever the sampler could read, nothing if it failed.
        A metric must never stop training, so any error of the sampler only leaves them out."""
        if self.gpu is None:
            return {}
        try:
            sample = self.gpu.sample()
        except Exception:
            return {}
        if sample is None:
            return {}
        fields = {
            "gpuUtilization": None if sample.utilization is None else round(sample.utilization, 1),
            "gpuMemoryUsedBytes": sample.memory_used_bytes,
            "gpuMemoryTotalBytes": sample.memory_total_bytes,
        }
        return {k: v for k, v in fields.items() if v is not None}

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
