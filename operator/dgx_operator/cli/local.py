"""`kubedgx run FILE --local`: a DGXTrainingJob's fine-tune on this machine, under torchrun.

The same trainer the image runs: ``python -m dgx_trainer launch`` checks the config, model, data
and memory once, then execs ``torch.distributed.run`` as a one-node job: the job's processes per
node, capped to the GPUs (or CPU cores) present, and its torchrun restart budget. Relative paths in
the manifest resolve against the manifest's directory; outputs go to ``./kubedgx-runs/<job>`` (or
``--output``), and after the run its loss curve (``loss.html``, and ``loss.png`` with matplotlib)
next to ``summary.json``. No torch import here: the operator package must stay without it, so torch
is only ever in the child process.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from dgx_api.history import parse_lines
from dgx_api.progress import parse_event
from dgx_operator.api import DGXTrainingJob
from dgx_operator.catalog import Catalog
from dgx_operator.client import plot
from dgx_operator.render.resolved import resolve


class LocalRunError(Exception):
    """The job cannot run locally; the message says why and what to do."""


@dataclass(frozen=True)
class LocalPlan:
    job: DGXTrainingJob
    nproc: int
    max_restarts: int
    base_dir: Path
    output_dir: Path
    config_path: Path
    command: list[str]
    env: dict[str, str]


def gpus_present() -> int:
    """GPUs NVML sees here (0 without a driver), without importing torch."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


def plan(
    job: DGXTrainingJob,
    manifest: Path,
    catalog: Catalog,
    *,
    nproc: int | None = None,
    output: Path | None = None,
    gpus: int | None = None,
    cpus: int | None = None,
) -> LocalPlan:
    """Everything needed to start the run; writes nothing."""
    spec = job.spec
    if spec.trainer is None:
        raise LocalRunError(
            f"{job.metadata.name}: only jobs with spec.trainer run locally; spec.command runs your own program, "
            "which you can start with torchrun directly"
        )
    resolved = resolve(spec, catalog)
    gpus = gpus_present() if gpus is None else gpus
    cpus = (os.cpu_count() or 1) if cpus is None else cpus
    wanted = nproc if nproc is not None else resolved.nproc_per_node
    if gpus == 0 and not spec.trainer.allow_cpu:
        raise LocalRunError(
            f"{job.metadata.name}: no GPU here and spec.trainer.allowCpu is false; set it to true for a (slow) CPU run"
        )
    cap = gpus if gpus > 0 else cpus
    count = max(1, min(wanted, cap))
    base_dir = manifest.resolve().parent
    out = (output or Path.cwd() / "kubedgx-runs" / job.metadata.name).resolve()
    config_path = out / "trainer.yaml"
    # The trainer's pre-launch check (config, model, data, memory) runs once, then execs torchrun
    # with the options after "--": a data error ends the run with its one-line message and exit 2
    # instead of being restarted maxRestarts times by torchrun.
    command = [
        sys.executable,
        "-m",
        "dgx_trainer",
        "launch",
        "--config",
        str(config_path),
        "--base-dir",
        str(base_dir),
        "--output-dir",
        str(out),
        "--",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={count}",
        f"--max-restarts={resolved.max_restarts}",
    ]
    env = {
        **os.environ,
        # A fresh TCP store per restart round (see docs/architecture.md).
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "KUBEDGX_TERMINATION_LOG": str(out / "termination-log"),
        "KUBEDGX_GPUS_PER_NODE": str(min(resolved.gpus, gpus)) if gpus else "0",
        "PYTHONUNBUFFERED": "1",
    }
    if count > 1 and gpus == 0:
        env.setdefault("OMP_NUM_THREADS", str(max(1, cpus // count)))
    return LocalPlan(job, count, resolved.max_restarts, base_dir, out, config_path, command, env)


def _bar(report: dict[str, Any], width: int = 30) -> str:
    step, total = int(report.get("step") or 0), int(report.get("totalSteps") or 0)
    filled = int(width * step / total) if total else 0
    parts = [f"[{'#' * filled}{'.' * (width - filled)}] {step}/{total}"]
    if report.get("loss") is not None:
        parts.append(f"loss {float(report['loss']):.4f}")
    if report.get("samplesPerSecond"):
        parts.append(f"{float(report['samplesPerSecond']):.1f} samples/s")
    return "  ".join(parts)


def write_pictures(lines: Sequence[str], output_dir: Path, *, title: str) -> list[Path]:
    """The run's loss curve from its progress lines: ``loss.html`` always, ``loss.png`` when
    matplotlib is importable (the ``plot`` extra); none without a progress report. Returns what it wrote."""
    points = parse_lines(lines)
    if not points:
        return []
    written = [plot.write(points, output_dir / "loss.html", title=title)]
    if importlib.util.find_spec("matplotlib") is not None:
        written.append(plot.write(points, output_dir / "loss.png", title=title))
    return written


def execute(p: LocalPlan, out: TextIO, err: TextIO) -> int:
    """Start torchrun, draw the trainer's progress lines as a bar, print the summary."""
    if any(importlib.util.find_spec(m) is None for m in ("torch", "trl", "dgx_trainer")):
        raise LocalRunError(
            "the trainer is not installed: pip install torch==2.13.0 && pip install -e ./api -e ./trainer "
            "(CPU, from a checkout), or kubedgx[trainer] on top of your CUDA torch"
        )
    p.output_dir.mkdir(parents=True, exist_ok=True)
    trainer = p.job.spec.trainer
    assert trainer is not None
    data = trainer.model_dump(by_alias=True, exclude_none=True, mode="json")
    data["output"]["dir"] = str(p.output_dir)
    p.config_path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    device = f"{p.nproc} process(es)" + (" on the CPU" if p.env.get("KUBEDGX_GPUS_PER_NODE") == "0" else "")
    print(f"kubedgx: running {p.job.metadata.name} locally with {device}; outputs in {p.output_dir}", file=err)
    started = time.monotonic()
    summary: dict[str, Any] | None = None
    events: list[str] = []  # the progress and eval lines, for the pictures
    tty = out.isatty()
    proc = subprocess.Popen(p.command, env=p.env, stdout=subprocess.PIPE, text=True, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        record = parse_event(line)
        if record is None:
            out.write(line)
            continue
        if record.get("event") in ("progress", "eval"):
            events.append(line)
        if record.get("event") == "progress":
            text = _bar(record)
            out.write(("\r" + text) if tty else (text + "\n"))
            out.flush()
        elif record.get("event") == "summary":
            summary = record
    code = proc.wait()
    if tty:
        out.write("\n")
    # Drawn whatever the exit: a diverged loss is what one wants to look at after a failure.
    try:
        pictures = write_pictures(events, p.output_dir, title=f"{p.job.metadata.name} (kubedgx run --local)")
    except (plot.PlotError, OSError) as exc:  # the run is over: a picture that cannot be drawn only warns
        pictures = []
        print(f"kubedgx: no loss curve drawn: {exc}", file=err)
    if code != 0:
        print(f"kubedgx: the trainer exited with code {code} after {time.monotonic() - started:.0f}s", file=err)
        if pictures:
            print(f"kubedgx: loss curve: {', '.join(map(str, pictures))}", file=err)
        return code
    if summary is not None:
        first, last = summary.get("firstLoss"), summary.get("loss")
        print(
            f"done in {time.monotonic() - started:.0f}s: {summary.get('step')} steps, loss "
            f"{first:.4f} -> {last:.4f}, {summary.get('quantization')} on {summary.get('device')} "
            f"({summary.get('precision')})"
            if isinstance(first, float) and isinstance(last, float)
            else f"done in {time.monotonic() - started:.0f}s",
            file=out,
        )
        print(f"adapter: {summary.get('adapter')}", file=out)
        print(f"summary: {p.output_dir / 'summary.json'}", file=out)
    if pictures:
        print(f"loss curve: {', '.join(map(str, pictures))}", file=out)
    return 0


def pick_job(jobs: Sequence[DGXTrainingJob], name: str | None) -> DGXTrainingJob:
    if name is not None:
        for job in jobs:
            if job.metadata.name == name:
                return job
        raise LocalRunError(f"no DGXTrainingJob named {name!r} (found: {', '.join(j.metadata.name for j in jobs)})")
    if len(jobs) != 1:
        names = ", ".join(j.metadata.name for j in jobs) or "none"
        raise LocalRunError(f"expected one DGXTrainingJob, found {len(jobs)} ({names}): choose one with --job")
    return jobs[0]
