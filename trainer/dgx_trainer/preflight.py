"""Preflight: does this node have the GPUs the job was placed for, with NVLink up?

A worker that lands on a node with a missing GPU or a dead NVLink would train at a fraction of the
speed, or hang in NCCL; failing at once with a message an admin can act on is better. The
expectations come from the operator (KUBEDGX_GPUS_PER_NODE, KUBEDGX_GPU_PRODUCTS, KUBEDGX_NVLINK);
NVML is reached through an injectable module so tests can present any topology.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("dgx_trainer.preflight")

#: NVML_NVLINK_MAX_LINKS in nvml.h (18 on Hopper/Blackwell; older GPUs answer "not supported").
MAX_NVLINK_LINKS = 18


class PreflightError(RuntimeError):
    """The node cannot run this job; the message says what is wrong and who can fix it."""


@dataclass(frozen=True)
class Expectation:
    """What the job was placed for."""

    gpus: int = 0
    products: tuple[str, ...] = ()
    nvlink: bool = False
    nproc: int = 1
    allow_cpu: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, allow_cpu: bool) -> Expectation:
        products = tuple(p for p in env.get("KUBEDGX_GPU_PRODUCTS", "").split(",") if p)
        return cls(
            gpus=int(env.get("KUBEDGX_GPUS_PER_NODE", "0") or 0),
            products=products,
            nvlink=env.get("KUBEDGX_NVLINK", "false") == "true",
            nproc=int(env.get("LOCAL_WORLD_SIZE", "1") or 1),
            allow_cpu=allow_cpu,
        )


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_gib: float
    nvlinks_up: int
    nvlinks_supported: bool


@dataclass(frozen=True)
class Report:
    """What preflight found; ``cpu_only`` when the job runs without GPUs (allowed by its config)."""

    gpus: tuple[Gpu, ...] = ()
    cpu_only: bool = False
    notes: tuple[str, ...] = field(default=())

    def topology(self) -> str:
        if self.cpu_only:
            return "no NVIDIA GPU: running on the CPU"
        return "; ".join(
            f"GPU{g.index} {g.name} {g.memory_gib:.0f} GiB, "
            + (f"{g.nvlinks_up} NVLink(s) up" if g.nvlinks_supported else "no NVLink")
            for g in self.gpus
        )


def label_form(name: str) -> str:
    """GPU Feature Discovery's label value for an NVML device name: spaces become dashes."""
    return re.sub(r"\s+", "-", name.strip())


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def probe(nvml: Any) -> tuple[Gpu, ...]:
    """Every GPU NVML reports, with its NVLink state."""
    count = nvml.nvmlDeviceGetCount()
    gpus = []
    for i in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        name = _text(nvml.nvmlDeviceGetName(handle))
        memory = nvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
        up, supported = 0, False
        for link in range(MAX_NVLINK_LINKS):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except nvml.NVMLError:
                continue  # link index not present, or NVLink not supported on this GPU
            supported = True
            up += 1 if state else 0
        gpus.append(Gpu(i, name, memory, up, supported))
    return tuple(gpus)


def check(expect: Expectation, nvml: Any = None) -> Report:
    """Raise :class:`PreflightError` when the node does not match the job; report what it has."""
    if nvml is None:
        try:
            import pynvml  # nvidia-ml-py

            nvml = pynvml
        except ImportError:
            nvml = None
    try:
        if nvml is None:
            raise RuntimeError("nvidia-ml-py is not installed")
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        reason = str(exc) or type(exc).__name__
        if expect.allow_cpu:
            note = f"no NVIDIA driver reachable (NVML: {reason}); running on the CPU because trainer.allowCpu is true"
            log.warning(note)
            return Report(cpu_only=True, notes=(note,))
        raise PreflightError(
            f"no NVIDIA driver reachable on this node (NVML: {reason}). The job asked for "
            f"{expect.gpus or 'some'} GPU(s): check that the NVIDIA driver and device plugin run on the node "
            "(kubectl describe node: nvidia.com/gpu capacity), or set trainer.allowCpu for a CPU run."
        ) from exc
    try:
        gpus = probe(nvml)
    finally:
        with contextlib.suppress(Exception):  # shutting down a library that failed is not news
            nvml.nvmlShutdown()
    report = Report(gpus=gpus)
    problems = []
    need = max(expect.gpus, expect.nproc if not expect.allow_cpu else 0)
    if len(gpus) < need:
        problems.append(
            f"{len(gpus)} GPU(s) visible but the job needs {need} per node: a GPU may have fallen off the bus "
            "(dmesg: Xid 79) or the device plugin handed out fewer than requested"
        )
    if expect.products:
        wanted = {label_form(p) for p in expect.products}
        odd = [g for g in gpus if label_form(g.name) not in wanted]
        if odd:
            problems.append(
                "GPU product mismatch: found "
                + ", ".join(f"GPU{g.index} {label_form(g.name)}" for g in odd)
                + f", expected one of {', '.join(sorted(wanted))}: the node's nvidia.com/gpu.product label is wrong"
            )
    if expect.nvlink and len(gpus) > 1:
        down = [g for g in gpus if g.nvlinks_supported and g.nvlinks_up == 0]
        missing = [g for g in gpus if not g.nvlinks_supported]
        if down or missing:
            which = ", ".join(f"GPU{g.index}" for g in (*down, *missing))
            problems.append(
                f"NVLink down on {which}: collective traffic would fall back to PCIe. Check nvidia-smi nvlink "
                "--status and the fabric manager (systemctl status nvidia-fabricmanager), then drain the node"
            )
    if problems:
        raise PreflightError(
            f"node {os.environ.get('KUBEDGX_NODE_NAME', '?')} does not match the job: " + "; ".join(problems)
        )
    log.info("preflight: %s", report.topology())
    return report
