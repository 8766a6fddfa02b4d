"""Preflight: does this node have the GPUs the job was placed for, with NVLink up?

A worker that lands on a node with a missing GPU or a dead NVLink would train at a fraction of the
speed, or hang in NCCL; failing at once with a message an admin can act on is better. The
expectations come from the operator (KUBEDGX_GPUS_PER_NODE, KUBEDGX_GPU_PRODUCTS, KUBEDGX_NVLINK,
and KUBEDGX_MIG_PROFILE for a MIG instance); NVML is reached through an injectable module so tests
can present any topology.

A container given one MIG slice still sees the slice's parent GPU through ``nvmlDeviceGetCount``;
the parent's memory is the whole GPU's (or a permission error), so :func:`probe` reports the MIG
devices of a GPU in MIG mode instead of the GPU itself, each with its own memory: the memory
estimate then compares with the slice's ~10 GiB, not the parent's 80.
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
    #: The MIG profile of a MIG instance ("1g.10gb", the device plugin's spelling); None: whole GPUs.
    mig_profile: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, allow_cpu: bool) -> Expectation:
        products = tuple(p for p in env.get("KUBEDGX_GPU_PRODUCTS", "").split(",") if p)
        return cls(
            gpus=int(env.get("KUBEDGX_GPUS_PER_NODE", "0") or 0),
            products=products,
            nvlink=env.get("KUBEDGX_NVLINK", "false") == "true",
            nproc=int(env.get("LOCAL_WORLD_SIZE", "1") or 1),
            allow_cpu=allow_cpu,
            mig_profile=env.get("KUBEDGX_MIG_PROFILE", "").strip().lower() or None,
        )


@dataclass(frozen=True)
class Gpu:
    """A device the job can use: a whole GPU, or a MIG slice (``parent`` set; CUDA sees it as a GPU).

    ``index`` is the position in what :func:`probe` found (NVML's index while no GPU is in MIG mode).
    """

    index: int
    name: str
    memory_gib: float
    nvlinks_up: int
    nvlinks_supported: bool
    #: A slice's profile as the device plugin spells it ("1g.10gb"); None for a whole GPU, or for a
    #: slice whose NVML name does not say it.
    mig_profile: str | None = None
    #: A slice's physical GPU (NVML's name): the product its node is labelled with.
    parent: str | None = None

    @property
    def is_slice(self) -> bool:
        return self.parent is not None

    @property
    def product(self) -> str:
        """The physical GPU's NVML name, which GPU Feature Discovery labels (mixed strategy)."""
        return self.parent if self.parent is not None else self.name

    def found(self) -> str:
        """How a failure message names what this container was given."""
        if self.parent is None:
            return f"a whole {self.name}"
        if self.mig_profile is None:
            return f"a MIG slice of {self.parent} whose NVML name ({self.name}) carries no profile"
        return f"a MIG {self.mig_profile} slice of {self.parent}"


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
            + (
                "MIG slice, no NVLink"
                if g.is_slice
                else f"{g.nvlinks_up} NVLink(s) up"
                if g.nvlinks_supported
                else "no NVLink"
            )
            for g in self.gpus
        )


def label_form(name: str) -> str:
    """GPU Feature Discovery's label value for an NVML device name: spaces become dashes."""
    return re.sub(r"\s+", "-", name.strip())


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


#: A MIG profile inside a MIG device's NVML name: "NVIDIA A100-SXM4-80GB MIG 1g.10gb" (how NVML and
#: nvidia-smi name a slice), "... MIG 1c.3g.20gb" (a compute instance smaller than its GPU instance),
#: "... MIG 1g.10gb+me" (with media engines).
MIG_PROFILE = re.compile(r"(?<![\w.])((?:\d+c\.)?\d+g\.\d+gb(?:\+\w+)*)", re.IGNORECASE)


def mig_profile(name: str) -> str | None:
    """The MIG profile a MIG device's NVML name carries, in the device plugin's spelling
    ("1g.10gb"); None when the name has none."""
    found = MIG_PROFILE.search(name)
    return found.group(1).lower() if found else None


def _errors(nvml: Any, *names: str) -> tuple[type[BaseException], ...]:
    """pynvml's error classes of these names that this pynvml has (an old one may lack some)."""
    found = (getattr(nvml, name, None) for name in names)
    return tuple(c for c in found if isinstance(c, type) and issubclass(c, BaseException))


def _mig_enabled(nvml: Any, handle: Any) -> bool:
    """Whether this GPU is in MIG mode now (a pending mode counts after the next reset, not now).
    A pynvml without the function, a driver without it or a GPU without MIG: not in MIG mode."""
    get_mode = getattr(nvml, "nvmlDeviceGetMigMode", None)
    if get_mode is None:
        return False
    try:
        current, _pending = get_mode(handle)
    except _errors(nvml, "NVMLError_NotSupported", "NVMLError_FunctionNotFound"):
        return False
    return bool(current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))


def _slices(nvml: Any, parent: Any, parent_name: str, first: int) -> list[Gpu]:
    """The MIG devices of a GPU in MIG mode that this container was given. Slices of other
    containers (or not created) answer NotFound. The parent's memory is never read: NVML gives the
    aggregate, or NoPermission in a container; each slice's handle gives its own."""
    not_found = _errors(nvml, "NVMLError_NotFound")
    slices: list[Gpu] = []
    for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i)
        except not_found:
            continue
        name = _text(nvml.nvmlDeviceGetName(handle))
        memory = nvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
        # NVLink and P2P do not exist between MIG instances: not probed.
        slices.append(Gpu(first + len(slices), name, memory, 0, False, mig_profile(name), parent_name))
    if not slices:
        log.warning("GPU %s is in MIG mode, but none of its MIG devices is visible to this container", parent_name)
    return slices


def probe(nvml: Any) -> tuple[Gpu, ...]:
    """Every GPU NVML reports, with its NVLink state; for a GPU in MIG mode, its visible slices."""
    count = nvml.nvmlDeviceGetCount()
    gpus: list[Gpu] = []
    for i in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        name = _text(nvml.nvmlDeviceGetName(handle))
        if _mig_enabled(nvml, handle):
            gpus += _slices(nvml, handle, name, len(gpus))
            continue
        memory = nvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
        up, supported = 0, False
        for link in range(MAX_NVLINK_LINKS):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except nvml.NVMLError:
                continue  # link index not present, or NVLink not supported on this GPU
            supported = True
            up += 1 if state else 0
        gpus.append(Gpu(len(gpus), name, memory, up, supported))
    return tuple(gpus)


def _mig_problems(profile: str, gpus: tuple[Gpu, ...]) -> list[str]:
    """A MIG instance runs on exactly one slice of its profile; anything else means the node's
    MIG setup (strategy, layout, device plugin) is not what the catalog assumed."""
    whole = [g for g in gpus if not g.is_slice]
    other = [g for g in gpus if g.is_slice and g.mig_profile != profile]
    right = [g for g in gpus if g.is_slice and g.mig_profile == profile]
    problems = []
    if whole:
        problems.append(
            f"expected a MIG {profile} slice, found {', '.join(g.found() for g in whole)}: "
            "the node's nvidia.com/mig.strategy or the device plugin is not what the catalog says"
        )
    if other:
        problems.append(
            f"expected a MIG {profile} slice, found {', '.join(g.found() for g in other)}: the node's MIG "
            f"layout (nvidia.com/mig.config) or the device plugin's nvidia.com/mig-{profile} resource is not "
            "what the catalog says"
        )
    if not gpus:
        problems.append(
            f"no MIG {profile} slice visible: the device plugin handed out none; check the node's "
            f"nvidia.com/mig-{profile} capacity (kubectl describe node) and that its GPUs are in MIG mode"
        )
    elif len(right) > 1:
        problems.append(
            f"{len(right)} MIG {profile} slices visible but the job runs on one: the device plugin handed out "
            "more than requested"
        )
    return problems


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
    if expect.mig_profile:  # one slice of the profile stands for the GPU count
        problems += _mig_problems(expect.mig_profile, gpus)
    else:
        if slices := [g for g in gpus if g.is_slice]:  # counted as GPUs, but too small and without NVLink
            problems.append(
                f"expected whole GPUs, found {', '.join(g.found() for g in slices)}: the node's "
                "nvidia.com/mig.strategy (single hands out slices as nvidia.com/gpu) or the device plugin is "
                "not what the catalog says"
            )
        if len(gpus) < need:
            problems.append(
                f"{len(gpus)} GPU(s) visible but the job needs {need} per node: a GPU may have fallen off the "
                "bus (dmesg: Xid 79) or the device plugin handed out fewer than requested"
            )
    if expect.products:
        wanted = {label_form(p) for p in expect.products}
        odd = [g for g in gpus if label_form(g.product) not in wanted]  # a slice: its physical GPU's
        if odd:
            problems.append(
                "GPU product mismatch: found "
                + ", ".join(f"GPU{g.index} {label_form(g.product)}" for g in odd)
                + f", expected one of {', '.join(sorted(wanted))}: the node's nvidia.com/gpu.product label is wrong"
            )
    if expect.nvlink and len(gpus) > 1 and not expect.mig_profile:  # no NVLink between MIG slices
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
