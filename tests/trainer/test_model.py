"""The model side, in-process: LoRA and QLoRA (NF4 on the CPU) train only the adapters and save an
adapter that reloads to the same logits; LoRA on fused MoE experts; the factories; the honest
quantization fallback.

The trainings here are few and short (3 steps of builtin:tiny-llama). ``train.run`` is wrapped, not
changed: ``model.load`` is spied on to snapshot the base weights as loaded, and ``train._Hooks`` is
subclassed to see the trained PEFT model."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from dgx_api.progress import parse_event
from dgx_api.trainer_config import ConfigError, Lora, Quantization, TrainerConfig, parse_config
from dgx_trainer import model, train
from tests.trainer.conftest import ROOT, config_data

STEPS = 3
PROMPTS = [
    "### Instruction:\nAdd the two numbers.\n\n### Input:\n6 + 20\n\n### Response:\n",
    "### Instruction:\nName the capital.\n\n### Response:\nParis",
]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor: packed 4-bit storage held in a float dtype may contain NaN
    patterns, which torch.equal would call different from themselves."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def base_name(name: str) -> str:
    """A base-model state_dict key as it was before peft wrapped the layer (nested wrappers too:
    each target parameter of one module adds a ``base_layer``)."""
    while ".base_layer." in name:
        name = name.replace(".base_layer.", ".")
    return name


@dataclass
class Trained:
    summary: dict[str, Any]
    cfg: TrainerConfig
    output_dir: Path
    model_path: str = ""
    loaded: model.Loaded | None = None
    before: dict[str, torch.Tensor] = field(default_factory=dict)  # base state_dict as loaded
    lora_at_begin: dict[str, torch.Tensor] = field(default_factory=dict)
    trainable_at_begin: list[str] = field(default_factory=list)
    peft_model: Any = None
    stdout_events: list[dict[str, Any]] = field(default_factory=list)


def train_in_process(output_dir: Path, changes: dict[str, Any]) -> Trained:
    """``train.run`` of a short training, with ``model.load`` and the callback spied on."""
    cfg = parse_config(config_data(output_dir, {"training.maxSteps": STEPS, **changes}))
    trained = Trained(summary={}, cfg=cfg, output_dir=output_dir)
    real_load = model.load

    def spy_load(cfg: TrainerConfig, model_path: str, device: str, p: model.Precision) -> model.Loaded:
        loaded = real_load(cfg, model_path, device, p)
        trained.model_path, trained.loaded = model_path, loaded
        trained.before = {k: v.detach().clone() for k, v in loaded.model.state_dict().items()}
        return loaded

    class Hooks(train._Hooks):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            peft_model = kwargs["model"]
            trained.lora_at_begin = {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_" in n}
            trained.trainable_at_begin = [n for n, p in peft_model.named_parameters() if p.requires_grad]
            super().on_train_begin(args, state, control, **kwargs)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            trained.peft_model = kwargs["model"]

    rt = train.Runtime(base_dir=ROOT, output_dir=output_dir, termination_log=output_dir / "termination-log", env={})
    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(stdout):
        mp.setattr(model, "load", spy_load)
        mp.setattr(train, "_Hooks", Hooks)
        trained.summary = train.run(cfg, rt)
    trained.stdout_events = [e for e in map(parse_event, stdout.getvalue().splitlines()) if e]
    return trained


def assert_only_lora_trained(t: Trained) -> None:
    assert t.loaded is not None
    assert t.peft_model is not None
    assert t.trainable_at_begin, "nothing was trainable"
    assert all("lora_" in n for n in t.trainable_at_begin), [n for n in t.trainable_at_begin if "lora_" not in n]
    assert set(t.trainable_at_begin) == set(t.lora_at_begin)
    now = dict(t.peft_model.named_parameters())
    unchanged = [n for n, before in t.lora_at_begin.items() if torch.equal(before, now[n].detach())]
    assert not unchanged, f"LoRA weights that did not train: {unchanged}"
    # Every base tensor (quantized storage and its quantization state included) is bit-identical
    # to what was loaded: peft wraps the loaded model in place.
    after = {base_name(k): v for k, v in t.loaded.model.state_dict().items() if "lora_" not in k}
    assert after.keys() == t.before.keys()
    changed = [k for k, v in after.items() if not same(v, t.before[k])]
    assert not changed, f"base weights changed: {changed}"


def logits(m: Any, tokenizer: Any) -> torch.Tensor:
    """The logits of :data:`PROMPTS`, computed in train mode on purpose: on CPUs with AVX512-BF16,
    bitsandbytes 0.50 repacks a 4-bit weight for a faster inference kernel on its first eval-mode
    forward (with other rounding, ~3e-3), so two models would be compared through different
    kernels depending on which forwards each had seen. Every dropout of these runs is 0, so train
    mode computes the same function, always through the training kernel."""
    assert all(not isinstance(d, torch.nn.Dropout) or d.p == 0 for d in m.modules()), "a dropout would make this random"
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    m.train()
    with torch.no_grad():
        return m(**batch).logits.float()


def assert_adapter_reloads_to_the_same_logits(t: Trained) -> None:
    from peft import PeftModel
    from transformers import AutoTokenizer

    adapter = t.output_dir / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file()
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    expected = logits(t.peft_model, tokenizer)
    fresh = model.load(t.cfg, t.model_path, "cpu", model.precision("fp32", "cpu")).model
    base = logits(fresh, tokenizer)
    reloaded = PeftModel.from_pretrained(fresh, str(adapter))
    got = logits(reloaded, tokenizer)
    assert not torch.allclose(base, expected, atol=1e-3), "the adapter makes no difference: nothing to compare"
    assert torch.allclose(got, expected, atol=1e-5), f"max difference {(got - expected).abs().max().item()}"


# --- LoRA and QLoRA -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lora_run(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    return train_in_process(tmp_path_factory.mktemp("lora") / "out", {})


@pytest.fixture(scope="module")
def qlora_run(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    ok, reason = model.quantization_usable(4, "cpu")
    assert ok, f"bitsandbytes 4-bit should run on this CPU: {reason}"
    return train_in_process(
        tmp_path_factory.mktemp("qlora") / "out", {"quantization": {"loadIn4bit": True, "quantType": "nf4"}}
    )


def saved_adapter(t: Trained) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(t.output_dir / "adapter" / "adapter_model.safetensors"))


def assert_saved_adapter_holds_the_trained_weights(t: Trained) -> None:
    saved = saved_adapter(t)
    trained = {n: p for n, p in t.peft_model.named_parameters() if "lora_" in n}
    assert len(saved) == len(trained)
    for name, param in trained.items():
        key = name.replace(".default.", ".")
        assert key in saved, f"{key} not in the saved adapter ({sorted(saved)[:4]}...)"
        assert same(saved[key], param), name


def test_lora_trains_only_the_adapter(lora_run: Trained) -> None:
    assert lora_run.summary["quantization"] == "none"
    assert lora_run.summary["step"] == STEPS
    assert_only_lora_trained(lora_run)
    adapter_config = json.loads((lora_run.output_dir / "adapter" / "adapter_config.json").read_text(encoding="utf-8"))
    targets = adapter_config["target_modules"]
    assert len(targets) == 14  # all-linear: 7 projections x 2 layers, not the output head
    assert {t.rsplit(".", 1)[-1] for t in targets} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    assert_saved_adapter_holds_the_trained_weights(lora_run)


def test_lora_adapter_reloads_to_the_same_logits(lora_run: Trained) -> None:
    assert_adapter_reloads_to_the_same_logits(lora_run)


def test_qlora_nf4_on_the_cpu_keeps_the_quantized_base_frozen(qlora_run: Trained) -> None:
    import bitsandbytes as bnb

    t = qlora_run
    assert t.summary["quantization"] == "nf4"
    assert t.loaded is not None
    quantized = [m for m in t.loaded.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(quantized) == 14  # 7 projections x 2 layers; the output head stays unquantized
    assert all(m.weight.quant_state.quant_type == "nf4" for m in quantized)
    packed = [k for k in t.before if k.endswith("q_proj.weight")]
    assert len(packed) == 2
    for key in packed:  # two 4-bit values per byte of storage
        assert t.before[key].numel() * t.before[key].element_size() * 2 == 128 * 128, key
    assert any(k.endswith(".weight.absmax") for k in t.before), "no quantization state in the state_dict"
    assert_only_lora_trained(t)
    assert_saved_adapter_holds_the_trained_weights(t)


def test_qlora_adapter_reloads_to_the_same_logits(qlora_run: Trained) -> None:
    assert_adapter_reloads_to_the_same_logits(qlora_run)


def test_qlora_adapters_train_in_the_run_precision(qlora_run: Trained) -> None:
    """TRL casts a quantized model's adapters to bf16; an fp32 run must not compute them in bf16."""
    assert qlora_run.summary["precision"] == "fp32"
    assert qlora_run.summary["adapterDtype"] == "float32"
    dtypes = {p.dtype for n, p in qlora_run.peft_model.named_parameters() if "lora_" in n}
    assert dtypes == {torch.float32}
    assert {t.dtype for t in saved_adapter(qlora_run).values()} == {torch.float32}


def test_adapter_dtype_is_bf16_only_in_a_bf16_run() -> None:
    assert model.adapter_dtype(BF16) == torch.bfloat16
    assert model.adapter_dtype(FP32) == torch.float32
    assert model.adapter_dtype(model.Precision("fp16", torch.float16)) == torch.float32


def test_align_adapters_casts_only_trainable_parameters() -> None:
    layer = torch.nn.Linear(4, 4).to(torch.bfloat16)
    layer.bias.requires_grad_(False)
    assert model.align_adapters(layer, FP32) == torch.float32
    assert layer.weight.dtype == torch.float32
    assert layer.bias.dtype == torch.bfloat16


# --- MoE: LoRA on fused expert parameters -----------------------------------------------------


def test_moe_target_parameters_train_only_the_expert_adapters(tiny_mixtral: Path, tmp_path: Path) -> None:
    experts = ["experts.gate_up_proj", "experts.down_proj"]
    t = train_in_process(
        tmp_path / "out",
        {"model.name": str(tiny_mixtral), "lora.targetModules": [], "lora.targetParameters": experts},
    )
    assert t.summary["step"] == STEPS
    assert t.before["model.layers.0.mlp.experts.gate_up_proj"].dim() == 3, "experts should be fused 3-D parameters"
    assert_only_lora_trained(t)
    assert all(".mlp.experts." in n for n in t.trainable_at_begin), t.trainable_at_begin
    layers = json.loads((tiny_mixtral / "config.json").read_text(encoding="utf-8"))["num_hidden_layers"]
    assert len(t.trainable_at_begin) == 4 * layers  # lora_A and lora_B of both parameters in each layer
    adapter_config = json.loads((t.output_dir / "adapter" / "adapter_config.json").read_text(encoding="utf-8"))
    assert sorted(adapter_config["target_parameters"]) == sorted(experts)
    assert not adapter_config["target_modules"]


# --- the factories ------------------------------------------------------------------------------


FP32 = model.Precision("fp32", torch.float32)
BF16 = model.Precision("bf16", torch.bfloat16)


def test_no_quantization_config_without_bits() -> None:
    assert model.quantization_config(Quantization(), FP32, None) is None


def test_nf4_double_quant_with_the_training_dtype() -> None:
    q = model.quantization_config(Quantization(), BF16, 4)
    assert q.load_in_4bit
    assert not q.load_in_8bit
    assert q.bnb_4bit_quant_type == "nf4"
    assert q.bnb_4bit_use_double_quant is True
    assert q.bnb_4bit_compute_dtype == torch.bfloat16
    assert q.bnb_4bit_quant_storage == torch.bfloat16
    assert model.quantization_config(Quantization(), FP32, 4).bnb_4bit_compute_dtype == torch.float32


def test_fp4_without_double_quant_and_an_explicit_compute_dtype() -> None:
    q = model.quantization_config(
        Quantization.model_validate({"quantType": "fp4", "doubleQuant": False, "computeDtype": "float16"}), FP32, 4
    )
    assert q.bnb_4bit_quant_type == "fp4"
    assert q.bnb_4bit_use_double_quant is False
    assert q.bnb_4bit_compute_dtype == torch.float16


def test_eight_bit() -> None:
    q = model.quantization_config(Quantization.model_validate({"loadIn8bit": True}), FP32, 8)
    assert q.load_in_8bit
    assert not q.load_in_4bit


def test_bits_follow_the_config() -> None:
    def bits_of(quantization: dict[str, Any]) -> int | None:
        return parse_config(config_data(Path("/out"), {"quantization": quantization})).quantization_bits

    assert [bits_of({}), bits_of({"loadIn4bit": True}), bits_of({"loadIn8bit": True})] == [4, 4, 8]
    assert bits_of({"loadIn4bit": False}) is None


def test_lora_config_all_linear_is_peft_s_string() -> None:
    c = model.lora_config(Lora())
    assert c.target_modules == "all-linear"
    assert (c.r, c.lora_alpha, c.lora_dropout, c.bias) == (16, 32, 0.05, "none")
    assert c.task_type == "CAUSAL_LM"
    assert not c.target_parameters
    assert c.modules_to_save is None


def test_lora_config_named_modules_and_modules_to_save() -> None:
    lora = Lora.model_validate(
        {"r": 4, "alpha": 8, "dropout": 0.0, "targetModules": ["q_proj", "v_proj"], "modulesToSave": ["lm_head"]}
    )
    c = model.lora_config(lora)
    assert set(c.target_modules) == {"q_proj", "v_proj"}
    assert (c.r, c.lora_alpha, c.lora_dropout) == (4, 8, 0.0)
    assert c.modules_to_save == ["lm_head"]


def test_lora_config_target_parameters_for_moe() -> None:
    lora = Lora.model_validate({"targetModules": [], "targetParameters": ["experts.gate_up_proj", "experts.down_proj"]})
    c = model.lora_config(lora)
    assert not c.target_modules
    assert list(c.target_parameters) == ["experts.gate_up_proj", "experts.down_proj"]


@pytest.mark.parametrize(
    ("requested", "name", "warns"),
    [("auto", "fp32", False), ("fp32", "fp32", False), ("bf16", "fp32", True), ("fp16", "fp32", True)],
)
def test_precision_on_the_cpu(requested: str, name: str, warns: bool, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="dgx_trainer.model"):
        p = model.precision(requested, "cpu")
    assert (p.name, p.dtype) == (name, torch.float32)
    assert not p.bf16
    assert not p.fp16
    messages = [r.getMessage() for r in caplog.records if r.name == "dgx_trainer.model"]
    assert messages == ([f"training.precision {requested} needs a GPU; this CPU run uses fp32"] if warns else [])


def test_quantization_is_usable_here_and_reasons_when_not(monkeypatch: pytest.MonkeyPatch) -> None:
    assert model.quantization_usable(4, "cpu") == (True, "")
    import bitsandbytes as bnb

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no kernel for this device\nsecond line")

    monkeypatch.setattr(bnb.nn, "Linear4bit", broken)
    assert model.quantization_usable(4, "cpu") == (False, "RuntimeError: no kernel for this device")


# --- the honest fallback ------------------------------------------------------------------------


def unusable(calls: list[tuple[int, str]]) -> Callable[[int, str], tuple[bool, str]]:
    def probe(bits: int, device: str) -> tuple[bool, str]:
        calls.append((bits, device))
        return False, "RuntimeError: no 4-bit kernels here"

    return probe


def test_unusable_quantization_falls_back_to_lora_and_says_so(
    tiny_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import bitsandbytes as bnb

    calls: list[tuple[int, str]] = []
    monkeypatch.setattr(model, "quantization_usable", unusable(calls))
    with caplog.at_level(logging.WARNING, logger="dgx_trainer"):
        t = train_in_process(tmp_path / "out", {"quantization": {"loadIn4bit": True}})
    assert calls == [(4, "cpu")]
    fallback = "none (fallback from nf4)"
    warnings = [
        r.getMessage() for r in caplog.records if r.name == "dgx_trainer.model" and r.levelno >= logging.WARNING
    ]
    assert warnings == [
        "4-bit quantization is not usable on cpu (RuntimeError: no 4-bit kernels here): training plain LoRA in fp32 "
        "instead (quantization.allowFallback is true)"
    ]
    assert t.loaded is not None
    assert not any(isinstance(m, bnb.nn.Linear4bit) for m in t.loaded.model.modules())
    assert t.summary["quantization"] == fallback
    summary = json.loads((t.output_dir / "summary.json").read_text(encoding="utf-8"))
    assert summary["quantization"] == fallback
    assert json.loads((t.output_dir / "progress.json").read_text(encoding="utf-8"))["quantization"] == fallback
    kinds = [e["event"] for e in t.stdout_events]
    assert kinds == ["start"] + ["progress"] * STEPS + ["summary"]
    assert all(e["quantization"] == fallback for e in t.stdout_events)
    assert_only_lora_trained(t)


def test_unusable_quantization_without_fallback_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, str]] = []
    monkeypatch.setattr(model, "quantization_usable", unusable(calls))
    out = tmp_path / "out"
    cfg = parse_config(config_data(out, {"quantization": {"loadIn4bit": True, "allowFallback": False}}))
    rt = train.Runtime(base_dir=ROOT, output_dir=out, termination_log=None, env={})
    with pytest.raises(ConfigError) as info:
        train.run(cfg, rt)
    assert [(p.path, p.message) for p in info.value.problems] == [
        ("quantization", "4-bit loading is not usable on cpu: RuntimeError: no 4-bit kernels here")
    ]
    assert calls == [(4, "cpu")]
    assert not (out / "adapter").exists()
