"""Throughput that explains itself: what feeds the GPUs, and how busy they are.

Two halves, both sized here rather than hard-coded in train.py:

- **CPU side.** Data loading and tokenization get worker processes sized from the CPUs this
  process may really use (its affinity mask, capped by the cgroup's CPU quota: a Kubernetes CPU
  limit is a quota the mask does not show) shared by the node's ranks, which all do the same work
  at once. A DGX node has 24-28 CPUs per GPU; the defaults stay well inside that, so eight ranks
  never starve each other or the NCCL and kubelet threads.
- **GPU side.** Each progress report of global rank 0 carries its GPU's utilization and memory
  (NVML, :class:`NvmlSampler`) and ``mfu``, the model FLOPs utilization its tokens per second
  amount to (:func:`flops_basis`). Anything NVML or the peak table cannot answer is left out of
  the report; training never stops for a metric.

docs/trainer.md ("Throughput") states the formulas and where the peak figures come from. No torch
import at module level: the CPU half is used before any model exists, and tests use it alone.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgx_api.progress import FlopsBasis, GpuSample
from dgx_api.trainer_config import DatasetSource, Training

log = logging.getLogger("dgx_trainer.throughput")

# --- CPU side -------------------------------------------------------------------------------------

#: Most data-loading workers a rank gets by default: a QLoRA step on a DGX GPU consumes a batch in
#: well over 100 ms and collating a batch of token ids takes milliseconds; more workers only add
#: memory (each holds prefetched batches).
MAX_AUTO_WORKERS = 4
#: Most tokenization processes a rank gets by default (eight ranks of a node tokenize at once).
MAX_AUTO_TOKENIZERS = 8
#: Rows each tokenization process should have at least: below this, starting a process and
#: shipping it its share costs more than tokenizing the rows in place.
ROWS_PER_TOKENIZER = 1000


def _cgroup_cpu_limit(root: Path) -> float | None:
    """The cgroup's CPU quota in CPUs (cgroup v2 ``cpu.max``, else v1 ``cfs_quota_us``), or None."""
    try:
        quota, period = (root / "cpu.max").read_text(encoding="utf-8").split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text(encoding="utf-8"))
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def available_cpus(affinity: int | None = None, cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs this process may use: its affinity mask (``os.sched_getaffinity``), capped by the
    cgroup's CPU quota rounded up. A container with a CPU limit but no cpuset sees every CPU of the
    node in its mask; sizing pools by that would oversubscribe its quota many times over."""
    if affinity is None:
        affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limit = _cgroup_cpu_limit(cgroup)
    cpus = affinity if limit is None else min(affinity, math.ceil(limit))
    return max(1, cpus)


@dataclass(frozen=True)
class Cpus:
    """The CPUs this process may use and how many ranks of the node share them."""

    available: int
    local_processes: int = 1

    @classmethod
    def of(cls, env: Mapping[str, str]) -> Cpus:
        """For this process; torchrun's ``LOCAL_WORLD_SIZE`` says how many ranks share the node."""
        return cls(available_cpus(), max(1, int(env.get("LOCAL_WORLD_SIZE", "1") or 1)))

    @property
    def per_process(self) -> int:
        return max(1, self.available // self.local_processes)


def dataloader_workers(training: Training, cpus: Cpus, device: str) -> int:
    """``training.dataloaderWorkers``, or its default: min(4, CPUs per rank - 1), keeping one CPU
    per rank for the training loop (0 with one CPU per rank: the loop loads between steps), and 0
    without GPUs, where the CPUs are doing the training and a worker would only take from it."""
    if training.dataloader_workers is not None:
        return training.dataloader_workers
    if device != "cuda":
        return 0
    return max(0, min(MAX_AUTO_WORKERS, cpus.per_process - 1))


def tokenization_processes(dataset: DatasetSource, cpus: Cpus, rows: int | None) -> int:
    """``dataset.tokenizationProcesses``, or its default: min(8, CPUs per rank, rows / 1000), at
    least 1. ``rows`` None (unknown) does not cap it."""
    if dataset.tokenization_processes is not None:
        return dataset.tokenization_processes
    wanted = min(MAX_AUTO_TOKENIZERS, cpus.per_process)
    if rows is not None:
        wanted = min(wanted, rows // ROWS_PER_TOKENIZER)
    return max(1, wanted)


# --- GPU side: the peak -----------------------------------------------------------------------------

#: Dense (no structured sparsity) BF16/FP16 tensor-core peak of one GPU, in FLOP/s, from NVIDIA's
#: datasheets (A100, H100, H200, B200/DGX B200, GB200 NVL72; where a datasheet gives the sparse
#: figure only, half of it). Matched against the NVML device name with runs of spaces, dashes and
#: underscores read as one space, first match wins; a GPU not listed gets no ``mfu``.
PEAK_FLOPS: tuple[tuple[re.Pattern[str], float], ...] = (
    (re.compile(r"\bA100\b"), 312e12),  # SXM4 and PCIe alike
    (re.compile(r"\bH100 (80GB HBM3|SXM)"), 989e12),
    (re.compile(r"\bH100 PCIE\b"), 756e12),
    (re.compile(r"\bH100 NVL\b"), 835e12),
    (re.compile(r"\bH200 NVL\b"), 835e12),
    (re.compile(r"\bH200( 141GB| SXM|$)"), 989e12),
    (re.compile(r"\bGB200\b"), 2.5e15),
    (re.compile(r"\bB200\b"), 2.25e15),
)
#: Precisions the table's figures are for: an fp32 run uses other (TF32 or CUDA) units.
PEAK_PRECISIONS = ("bf16", "fp16")


def peak_flops(name: str, precision: str = "bf16") -> float | None:
    """One GPU's dense peak for ``precision`` by its NVML name, or None when the table has none."""
    if precision not in PEAK_PRECISIONS:
        return None
    key = re.sub(r"[\s_-]+", " ", name).strip().upper()
    return next((peak for pattern, peak in PEAK_FLOPS if pattern.search(key)), None)


# --- GPU side: the model's FLOPs --------------------------------------------------------------------

_EXPERTS = re.compile(r"(^|\.)experts(\.|$)")


def _logical_numel(module: Any, name: str, param: Any) -> int:
    """Elements ``param`` stands for: bitsandbytes stores 4-bit weights packed (two to a byte, or
    more in a wider storage type), as a ``Params4bit`` or a parametrization's ``original``."""
    state = getattr(param, "quant_state", None)
    if state is None and name == "original" and type(module).__name__ == "ParametrizationList":
        state = next((p.quant_state for p in module if getattr(p, "quant_state", None) is not None), None)
    shape = getattr(state, "shape", None)
    if shape is not None:
        return math.prod(int(d) for d in shape)
    if type(param).__name__ == "Params4bit":
        return int(param.numel()) * 2 * int(param.element_size())
    return int(param.numel())


def parameter_counts(model: Any) -> tuple[float, float]:
    """(frozen, trainable) parameters one token's forward pass multiplies by.

    Counted at their logical size (4-bit weights unpacked). Left out: embedding tables (a lookup,
    not a matmul) unless tied to the output head, and the frozen originals peft keeps beside
    ``modulesToSave`` copies. Expert parameters of a mixture-of-experts model count at
    top-k / experts, the share of them a token runs through."""
    import torch

    from dgx_trainer import moe

    config = getattr(model, "config", None)
    experts = moe.expert_count(config) if config is not None else None
    text: Any = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    top_k = getattr(text, "num_experts_per_tok", None)
    expert_share = top_k / experts if experts and isinstance(top_k, int) and 0 < top_k <= experts else 1.0
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_ids = {id(p) for p in head.parameters()} if isinstance(head, torch.nn.Module) else set()
    frozen = trainable = 0.0
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            full = f"{module_name}.{name}" if module_name else name
            if isinstance(module, torch.nn.Embedding) and id(param) not in head_ids:
                continue
            if ".original_module." in f".{full}":
                continue
            count = float(_logical_numel(module, name, param))
            if _EXPERTS.search(full):  # fused stacks, parametrized ones, per-expert modules, their LoRA
                count *= expert_share
            if param.requires_grad:
                trainable += count
            else:
                frozen += count
    return frozen, trainable


def flops_per_token(frozen: float, trainable: float) -> float:
    """Model FLOPs of one trained token of a LoRA/QLoRA fine-tune: 2 per frozen parameter forward
    and 2 backward (the activations' gradient; a frozen weight gets none), 6 per trainable one
    (forward, activations' and weights' gradients). Attention's score products and the recompute of
    gradient checkpointing are not counted (MFU counts the model's FLOPs, not the hardware's)."""
    return 4.0 * frozen + 6.0 * trainable


def flops_basis(model: Any, gpu: NvmlSampler | GpuSample | None, precision: str, world_size: int) -> FlopsBasis | None:
    """What ``mfu`` needs, or None: no GPU sample, a GPU the peak table lacks, an fp32 run, or a
    model whose parameters cannot be counted. The run is assumed homogeneous (the operator places
    a job on one GPU product), so the peak is ``world_size`` times rank 0's GPU's."""
    if gpu is None:
        return None
    peak = peak_flops(gpu.name, precision)
    if peak is None:
        log.info("no mfu in progress: no dense %s peak known for %s", precision, gpu.name)
        return None
    try:
        frozen, trainable = parameter_counts(model)
    except Exception as exc:  # an exotic model must not stop the run for a metric
        log.warning("no mfu in progress: cannot count the model's parameters (%s)", exc)
        return None
    return FlopsBasis(flops_per_token=flops_per_token(frozen, trainable), peak_flops=peak * max(1, world_size))


# --- GPU side: NVML -----------------------------------------------------------------------------------

#: ``nvmlValueType_t``: which member of a sample's value union holds it.
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


class NvmlSampler:
    """Rank 0's GPU through NVML (nvidia-ml-py's ``pynvml``, injectable for tests).

    Utilization is the mean of the samples the driver logged since the previous call
    (``nvmlDeviceGetSamples``: the driver keeps a bounded buffer of recent ones, so a long logging
    interval averages its most recent part), or NVML's current value (its last sample period,
    1/6 s to 1 s) where the driver keeps no samples. Memory is the device's used and total memory as
    the driver counts it (what nvidia-smi shows). Any NVML error leaves that figure out."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml = nvml
        self.handle = handle
        self.name = _text(nvml.nvmlDeviceGetName(handle))
        self._seen = 0
        self.utilization()  # from now on: what came before was loading, not training

    @classmethod
    def open(cls, cuda_index: int, nvml: Any = None) -> NvmlSampler | None:
        """The sampler for CUDA device ``cuda_index``, or None (with a log line) where NVML cannot
        give one. NVML numbers GPUs by PCI bus, CUDA fastest first: the device is found by its
        UUID (then its PCI bus id), never by the index."""
        try:
            if nvml is None:
                import pynvml  # nvidia-ml-py

                nvml = pynvml
            nvml.nvmlInit()
            return cls(nvml, _handle(nvml, cuda_index))
        except Exception as exc:
            log.warning("no GPU utilization or memory in progress: NVML: %s", str(exc) or type(exc).__name__)
            return None

    def _utilization_samples(self) -> float | None:
        kind, samples = self.nvml.nvmlDeviceGetSamples(self.handle, self.nvml.NVML_GPU_UTILIZATION_SAMPLES, self._seen)
        member = _VALUE_MEMBERS.get(int(kind))
        fresh = [s for s in samples if int(s.timeStamp) > self._seen]
        if member is None or not fresh:
            return None
        self._seen = max(int(s.timeStamp) for s in fresh)
        return sum(float(getattr(s.sampleValue, member)) for s in fresh) / len(fresh)

    def utilization(self) -> float | None:
        try:
            mean = self._utilization_samples()
        except self.nvml.NVMLError:
            mean = None  # not supported here, or no new sample (NVML_ERROR_NOT_FOUND)
        if mean is not None:
            return mean
        try:
            return float(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
        except self.nvml.NVMLError:
            return None

    def sample(self) -> GpuSample | None:
        used = total = None
        try:
            memory = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
            used, total = int(memory.used), int(memory.total)
        except self.nvml.NVMLError:
            pass
        return GpuSample(self.name, self.utilization(), used, total)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _handle(nvml: Any, cuda_index: int) -> Any:
    import torch

    props: Any = torch.cuda.get_device_properties(cuda_index)  # the PCI fields are missing from its stubs
    uuid = str(getattr(props, "uuid", "") or "")
    if uuid:
        try:
            return nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
        except nvml.NVMLError:
            pass
    bus = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
    return nvml.nvmlDeviceGetHandleByPciBusId(bus)


def gpu_sampler(device: str, local_rank: int) -> NvmlSampler | None:
    """Rank 0's sampler: None without a CUDA device (the GPU fields are then absent, not zero)."""
    return NvmlSampler.open(local_rank) if device == "cuda" else None
