"""Throughput that explains itself (dgx_trainer.throughput, dgx_api.progress): the GPU fields and
mfu of progress reports, from an injected GPU sampler and a fake NVML, so that all of it runs on
the CPU; the model FLOPs count of dense, 4-bit and mixture-of-experts models; the CPU-side sizing
of data-loading workers and tokenization processes; and tokenization in several processes giving
the rows one process gives."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dgx_api import progress
from dgx_api.progress import FlopsBasis, GpuSample, Reporter
from dgx_api.trainer_config import DatasetSource, Training, parse_config
from dgx_trainer import throughput
from dgx_trainer.throughput import Cpus, NvmlSampler
from tests.trainer.conftest import config_data

H100 = "NVIDIA H100 80GB HBM3"
GPU_FIELDS = {"gpuUtilization", "gpuMemoryUsedBytes", "gpuMemoryTotalBytes", "mfu"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(progress.time, "monotonic", fake)
    return fake


class FakeGpu:
    """A GpuSampler that answers what the test says (or raises it), one answer a call, the first
    to the reporter's start (which opens the utilization window)."""

    def __init__(self, *answers: GpuSample | Exception | None) -> None:
        self.answers = list(answers)
        self.calls = 0

    def sample(self) -> GpuSample | None:
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def reporter(stream: io.StringIO, out: Path, **kw: Any) -> Reporter:
    return Reporter(out, precision="bf16", quantization="nf4", samples_per_step=8, enabled=True, stream=stream, **kw)


def progress_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [line for line in map(json.loads, stream.getvalue().splitlines()) if line["event"] == "progress"]


# --- the report ------------------------------------------------------------------------------------


def test_a_gpu_report_carries_utilization_memory_and_mfu(tmp_path: Path, clock: Clock) -> None:
    stream = io.StringIO()
    peak = throughput.peak_flops(H100, "bf16")
    assert peak == 989e12
    # 1e9 frozen parameters and no trainable ones: 4e9 FLOPs a token; 24,725 tokens/s on one H100
    # are 9.89e13 FLOP/s, a tenth of its dense peak.
    basis = FlopsBasis(flops_per_token=throughput.flops_per_token(1e9, 0.0), peak_flops=peak)
    gpu = FakeGpu(GpuSample(H100, 3.0, 1, 80 * 2**30), GpuSample(H100, 87.25, 61 * 2**30, 80 * 2**30))
    r = reporter(stream, tmp_path, gpu=gpu, flops=basis)
    r.start(0, 100)
    assert gpu.calls == 1  # the window opens at the start: loading is not averaged into the first report
    assert "gpuUtilization" not in json.loads(stream.getvalue())  # nor reported in the start line
    clock.now += 2.0
    r.log(10, 100, 0.1, {"loss": 2.0, "num_tokens": 49450.0})
    (line,) = progress_lines(stream)
    assert line["tokensPerSecond"] == 24725.0
    assert line["mfu"] == 0.1
    assert (line["gpuUtilization"], line["gpuMemoryUsedBytes"], line["gpuMemoryTotalBytes"]) == (
        87.2,  # rounded to one decimal (half to even)
        61 * 2**30,
        80 * 2**30,
    )
    saved = json.loads((tmp_path / "progress.json").read_text(encoding="utf-8"))
    assert saved.keys() >= GPU_FIELDS


def test_mfu_counts_every_gpu_of_the_run(tmp_path: Path, clock: Clock) -> None:
    # 8 GPUs: the peak is eight times one GPU's, the tokens are all ranks' (TRL gathers them).
    stream = io.StringIO()
    frozen, trainable = 7e9, 40e6
    basis = FlopsBasis(throughput.flops_per_token(frozen, trainable), 8 * 989e12)
    r = reporter(stream, tmp_path, flops=basis)
    r.start(0, 100)
    clock.now += 10.0
    r.log(10, 100, 0.1, {"loss": 2.0, "num_tokens": 1_000_000.0})
    (line,) = progress_lines(stream)
    expected = 100_000 * (4 * frozen + 6 * trainable) / (8 * 989e12)
    assert line["mfu"] == round(expected, 4) == 0.3569


def test_on_the_cpu_the_gpu_fields_are_absent(tmp_path: Path, clock: Clock) -> None:
    """No sampler and no FLOPs basis (what train.run gives a CPU run): not zeros, nothing."""
    assert throughput.gpu_sampler("cpu", 0) is None
    assert throughput.flops_basis(object(), None, "fp32", 1) is None
    stream = io.StringIO()
    r = reporter(stream, tmp_path)
    r.start(0, 100)
    clock.now += 2.0
    r.log(10, 100, 0.1, {"loss": 2.0, "num_tokens": 5000.0})
    (line,) = progress_lines(stream)
    assert line["tokensPerSecond"] == 2500.0
    assert not GPU_FIELDS & line.keys()


def test_a_failing_sampler_leaves_the_fields_out_and_training_on(tmp_path: Path, clock: Clock) -> None:
    stream = io.StringIO()
    gpu = FakeGpu(None, RuntimeError("NVML went away"), None, GpuSample(H100, None, 5, None))
    r = reporter(stream, tmp_path, gpu=gpu)
    r.start(0, 100)
    for step in (1, 2, 3):
        clock.now += 1.0
        r.log(step, 100, None, {"loss": 2.0})
    first, second, third = progress_lines(stream)
    assert not GPU_FIELDS & (first.keys() | second.keys())
    assert GPU_FIELDS & third.keys() == {"gpuMemoryUsedBytes"}  # only what the GPU answered


def test_no_mfu_without_a_token_rate(tmp_path: Path, clock: Clock) -> None:
    stream = io.StringIO()
    r = reporter(stream, tmp_path, flops=FlopsBasis(4e9, 989e12))
    r.start(0, 100)
    clock.now += 1.0
    r.log(1, 100, None, {"loss": 2.0})  # a record without num_tokens
    (line,) = progress_lines(stream)
    assert "mfu" not in line


# --- the peak table ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100-SXM4-40GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA-H100-SXM5-80GB", 989e12),  # GPU Feature Discovery's label form reads the same
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA H200 NVL", 835e12),
        ("NVIDIA B200", 2.25e15),
        ("NVIDIA GB200", 2.5e15),
        ("NVIDIA H100", None),  # which H100? no guess
        ("Tesla T4", None),
        ("NVIDIA L40S", None),
    ],
)
def test_peak_flops_by_nvml_name(name: str, peak: float | None) -> None:
    assert throughput.peak_flops(name) == peak


def test_no_peak_for_fp32_and_no_basis_for_an_unknown_gpu() -> None:
    assert throughput.peak_flops(H100, "fp16") == 989e12
    assert throughput.peak_flops(H100, "fp32") is None
    assert throughput.flops_basis(object(), GpuSample("Tesla T4"), "bf16", 1) is None
    assert throughput.flops_basis(object(), GpuSample(H100), "fp32", 1) is None


# --- NVML ---------------------------------------------------------------------------------------------


class FakeNvml:
    """The part of pynvml the sampler uses; ``samples`` is the driver's buffer of (time, percent)."""

    NVML_GPU_UTILIZATION_SAMPLES = 1

    class NVMLError(Exception):
        pass

    def __init__(self, samples: list[tuple[int, int]] | None, instant: int | None = 42) -> None:
        self.samples = samples
        self.instant = instant
        self.memory: tuple[int, int] | None = (3 * 2**30, 141 * 2**30)

    def nvmlDeviceGetName(self, handle: Any) -> bytes:  # noqa: N802 (NVML's names)
        return b"NVIDIA H200"

    def nvmlDeviceGetSamples(self, handle: Any, kind: int, since: int) -> tuple[int, list[Any]]:  # noqa: N802
        if self.samples is None:
            raise self.NVMLError("Not Supported")
        fresh = [s for s in self.samples if s[0] > since]
        if not fresh:
            raise self.NVMLError("Not Found")  # what the driver answers when nothing is new
        return 1, [SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=v)) for t, v in fresh]

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:  # noqa: N802
        if self.instant is None:
            raise self.NVMLError("Not Supported")
        return SimpleNamespace(gpu=self.instant, memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:  # noqa: N802
        if self.memory is None:
            raise self.NVMLError("Unknown Error")
        return SimpleNamespace(used=self.memory[0], total=self.memory[1], free=0)


def test_utilization_is_the_mean_of_the_samples_since_the_last_report() -> None:
    nvml = FakeNvml([(1, 0), (2, 0)])  # before the sampler opened: loading, not training
    sampler = NvmlSampler(nvml, "handle")
    assert sampler.name == "NVIDIA H200"
    assert nvml.samples is not None
    nvml.samples += [(3, 90), (4, 100), (5, 80)]
    assert sampler.sample() == GpuSample("NVIDIA H200", 90.0, 3 * 2**30, 141 * 2**30)
    nvml.samples += [(6, 50)]
    assert sampler.utilization() == 50.0  # only what came since
    assert sampler.utilization() == 42.0  # nothing new: NVML's current value


def test_without_samples_the_instant_value_and_without_anything_nothing() -> None:
    nvml = FakeNvml(None, instant=73)
    sampler = NvmlSampler(nvml, "handle")
    assert sampler.utilization() == 73.0
    nvml.instant, nvml.memory = None, None
    assert sampler.sample() == GpuSample("NVIDIA H200", None, None, None)


def test_an_nvml_that_does_not_start_gives_no_sampler() -> None:
    class Broken(FakeNvml):
        def nvmlInit(self) -> None:  # noqa: N802
            raise self.NVMLError("Driver Not Loaded")

    assert NvmlSampler.open(0, Broken([])) is None


# --- the model's FLOPs --------------------------------------------------------------------------------


def _lora(model: Any) -> Any:
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj"]))


def test_dense_counts_leave_out_the_embedding_table_but_not_the_head() -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    shape = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2}
    heads = {"num_attention_heads": 4, "num_key_value_heads": 2}
    untied = _lora(LlamaForCausalLM(LlamaConfig(**shape, **heads, tie_word_embeddings=False)))
    frozen, trainable = throughput.parameter_counts(untied)
    trained, everything = untied.get_nb_trainable_parameters()
    assert trainable == trained == 2 * 4 * (32 + 32)  # r x (in + out) per layer
    assert frozen == everything - trained - 64 * 32  # all but the adapters and the embedding table

    tied = _lora(LlamaForCausalLM(LlamaConfig(**shape, **heads, tie_word_embeddings=True)))
    frozen_tied, _ = throughput.parameter_counts(tied)
    assert frozen_tied == frozen  # the shared table is counted once, as the head it also is


def test_experts_count_at_top_k_of_all(tiny_mixtral: Path) -> None:
    """A token runs through top-k of the E experts; the rest of the layer it runs through whole."""
    from transformers import AutoModelForCausalLM

    moe = AutoModelForCausalLM.from_pretrained(tiny_mixtral).requires_grad_(False)  # frozen, as under LoRA
    config = moe.config
    k, e = config.num_experts_per_tok, config.num_local_experts
    experts = sum(p.numel() for n, p in moe.named_parameters() if ".experts." in f".{n}.")
    assert experts > 0
    everything = sum(p.numel() for p in moe.parameters())  # tied: the table once, and it is the head
    frozen, trainable = throughput.parameter_counts(moe)
    assert trainable == 0
    assert frozen == pytest.approx(everything - experts + experts * k / e)


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_mixtral"])
def test_four_bit_weights_count_as_the_weights_they_stand_for(
    request: pytest.FixtureRequest, tmp_path: Path, name: str
) -> None:
    """NF4 packs two weights to a byte (Params4bit, and the parametrized fused experts): the count
    must be the model's, not its storage's, or a QLoRA run's mfu would be about half the truth."""
    from dgx_trainer import model

    path: Path = request.getfixturevalue(name)
    p = model.precision("fp32", "cpu")
    counts = []
    for bits in ({"loadIn4bit": False}, {"loadIn4bit": True, "allowFallback": False}):
        cfg = parse_config(config_data(tmp_path / "out", {"quantization": bits}))
        loaded = model.load(cfg, str(path), "cpu", p)
        counts.append(sum(throughput.parameter_counts(loaded.model)))
    plain, nf4 = counts
    assert nf4 == pytest.approx(plain)


# --- CPUs ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "affinity", "cpus"),
    [
        ({}, 224, 224),
        ({"cpu.max": "max 100000\n"}, 224, 224),
        ({"cpu.max": "19200000 100000\n"}, 224, 192),  # a Kubernetes limit of 192 CPUs
        ({"cpu.max": "150000 100000\n"}, 224, 2),  # 1.5 CPUs: rounded up
        ({"cpu.max": "800000 100000\n"}, 4, 4),  # a cpuset smaller than the quota
        ({"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 224, 4),  # cgroup v1
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, 224, 224),
    ],
)
def test_available_cpus_respect_the_cgroup_quota(
    tmp_path: Path, files: dict[str, str], affinity: int, cpus: int
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    assert throughput.available_cpus(affinity, tmp_path) == cpus


def test_cpus_are_shared_by_the_ranks_of_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(throughput, "available_cpus", lambda: 192)
    assert Cpus.of({"LOCAL_WORLD_SIZE": "8"}) == Cpus(192, 8)
    assert Cpus(192, 8).per_process == 24
    assert Cpus.of({}) == Cpus(192, 1)
    assert Cpus(2, 8).per_process == 1


@pytest.mark.parametrize(
    ("cpus", "device", "workers"),
    [
        (Cpus(192, 8), "cuda", 4),  # a DGX node: 24 CPUs a rank, 4 are plenty
        (Cpus(24, 8), "cuda", 2),  # 3 a rank: one for the loop, two workers
        (Cpus(8, 8), "cuda", 0),  # 1 a rank: the loop loads between steps
        (Cpus(2, 1), "cuda", 1),
        (Cpus(64, 1), "cpu", 0),  # without GPUs the CPUs train
    ],
)
def test_default_dataloader_workers(cpus: Cpus, device: str, workers: int) -> None:
    assert throughput.dataloader_workers(Training(), cpus, device) == workers
    assert throughput.dataloader_workers(Training(dataloader_workers=6), cpus, device) == 6


@pytest.mark.parametrize(
    ("cpus", "rows", "processes"),
    [
        (Cpus(192, 8), 1_000_000, 8),
        (Cpus(192, 8), 2_500, 2),  # 1000 rows a process at least
        (Cpus(192, 8), 300, 1),
        (Cpus(24, 8), 1_000_000, 3),
        (Cpus(4, 8), 1_000_000, 1),
        (Cpus(192, 8), None, 8),
    ],
)
def test_default_tokenization_processes(cpus: Cpus, rows: int | None, processes: int) -> None:
    source = DatasetSource(path="data.jsonl")
    assert throughput.tokenization_processes(source, cpus, rows) == processes
    given = DatasetSource(path="data.jsonl", tokenization_processes=3)
    assert throughput.tokenization_processes(given, cpus, 10) == 3


# --- tokenization in several processes -------------------------------------------------------------

CHAT = [
    {"role": "user", "content": "Add {a} + {b}."},
    {"role": "assistant", "content": "{a} + {b} = {c}."},
]


@pytest.mark.parametrize(
    ("changes", "row"),
    [
        (
            {"dataset.template": "chat", "dataset.chatTemplate": "chatml"},
            lambda i: {"messages": [{k: v.format(a=i, b=2 * i, c=3 * i) for k, v in t.items()} for t in CHAT]},
        ),
        ({}, lambda i: {"instruction": f"Add {i} and {i}.", "output": f"{2 * i}."}),
    ],
    ids=["chat", "instruction"],
)
def test_two_tokenization_processes_give_the_rows_of_one(
    tmp_path: Path, tiny_llama: Path, changes: dict[str, Any], row: Any
) -> None:
    from transformers import AutoTokenizer

    from dgx_trainer import data

    rows = [row(i) for i in range(23)]  # uneven shards
    file = tmp_path / "rows.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cfg = parse_config(config_data(tmp_path / "out", {"dataset.path": str(file), **changes}))
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    data.use_chat_template(cfg.dataset, tmp_path, tokenizer, data.check(cfg, tmp_path, tokenizer))
    records = data.load_records(cfg.dataset, tmp_path)
    one, _ = data.training_sets(cfg, tmp_path, records, tokenizer, num_proc=1)
    two, _ = data.training_sets(cfg, tmp_path, records, tokenizer, num_proc=2)
    assert two.to_list() == one.to_list()
    assert len(one) == len(rows)
