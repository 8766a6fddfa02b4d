"""MoE QLoRA that is QLoRA (issue 14 item 1) and the per-rank quantization probe (item 9).

A tiny Mixtral-shaped model, built offline from a config (seeded random weights) and shaped so
that its experts dominate its parameters as in Mixtral-8x7B: loaded in 4-bit, its fused experts
must be 4-bit too (<= 0.6 resident bytes per parameter, loaded and after k-bit preparation, where
the path without moe.quantize_experts holds > 0.6), LoRA must reach the 4-bit experts through
``targetParameters`` and train every adapter tensor, ``all-linear`` must leave routers alone, and
the router's auxiliary loss must reach the progress lines.

Staged loading (4-bit MoE on CUDA: load on the CPU, experts to the GPU one tensor at a time) is
driven here with the CPU as its target, where every move is a no-op: the tests check that it gives
the direct load's model bit for bit and that its order is one expert tensor at a time; what it saves
on a GPU is arithmetic (moe.load_peak_bytes), not measured here."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch

from dgx_api.progress import parse_event
from dgx_api.trainer_config import ConfigError, Lora, TrainerConfig, parse_config
from dgx_trainer import model, moe, train
from tests.trainer.conftest import ROOT, config_data

EXPERTS = ["experts.gate_up_proj", "experts.down_proj"]
FP32 = model.Precision("fp32", torch.float32)
QLORA = {"quantization": {"loadIn4bit": True, "quantType": "nf4", "doubleQuant": True}}


def mixtral_cfg(path: Path, changes: dict[str, Any] | None = None) -> TrainerConfig:
    return parse_config(config_data(Path("/unused"), {"model.name": str(path), **QLORA, **(changes or {})}))


def load(path: Path, changes: dict[str, Any] | None = None) -> model.Loaded:
    return model.load(mixtral_cfg(path, changes), str(path), "cpu", FP32)


def is_uint8_4bit(m: Any, name: str) -> bool:
    module_name, _, param = name.rpartition(".")
    module = m.get_submodule(module_name)
    return moe.is_4bit_parametrized(module, param) and module.parametrizations[param].original.dtype == torch.uint8


# --- (a) the experts are 4-bit, and it shows in the bytes -----------------------------------------


def test_4bit_load_quantizes_the_fused_experts(tiny_mixtral: Path) -> None:
    loaded = load(tiny_mixtral, {"model.dtype": "bfloat16"})
    fused = [f"{n}.{p}" for n, _, p in moe.fused_expert_parameters(loaded.model)]
    assert sorted(fused) == sorted(f"model.layers.{i}.mlp.{e}" for i in range(2) for e in EXPERTS)
    assert all(is_uint8_4bit(loaded.model, name) for name in fused), fused
    assert loaded.quantization == "nf4"
    # the experts still read as their 3-D bf16 selves (dequantized on access)
    experts = loaded.model.get_submodule("model.layers.0.mlp.experts")
    assert experts.gate_up_proj.shape == (8, 1024, 256)
    assert experts.gate_up_proj.dtype == torch.bfloat16


def test_resident_bytes_per_parameter_at_most_0_6_and_above_without_the_fix(
    tiny_mixtral: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from peft import prepare_model_for_kbit_training

    changes = {"model.dtype": "bfloat16", "training.gradientCheckpointing": False}
    # load() already ran prepare_model_for_kbit_training; measure before it too.
    monkeypatch.setattr("peft.prepare_model_for_kbit_training", lambda m, **_: m)
    fixed = load(tiny_mixtral, changes).model
    fixed_loaded = moe.bytes_per_parameter(fixed)
    fixed_prepared = moe.bytes_per_parameter(prepare_model_for_kbit_training(fixed, use_gradient_checkpointing=False))
    with monkeypatch.context() as mp:
        mp.setattr(moe, "quantize_experts", lambda *a, **k: [])  # today's path: only nn.Linear is 4-bit
        today = load(tiny_mixtral, changes)
    today_loaded = moe.bytes_per_parameter(today.model)
    today_prepared = moe.bytes_per_parameter(prepare_model_for_kbit_training(today.model))
    print(f"bytes/param loaded, prepared: today {today_loaded:.3f}, {today_prepared:.3f}")
    print(f"bytes/param loaded, prepared: fixed {fixed_loaded:.3f}, {fixed_prepared:.3f}")
    assert fixed_loaded <= 0.6
    assert fixed_prepared <= 0.6
    assert today_loaded > 0.6
    assert today_prepared > 3.0  # the bf16 experts upcast to fp32 by k-bit preparation
    assert today.quantization == "nf4 (fused experts unquantized)"  # and it says so


def test_the_experts_stay_4bit_through_k_bit_preparation(tiny_mixtral: Path) -> None:
    loaded = load(tiny_mixtral)  # load() ran prepare_model_for_kbit_training
    assert all(is_uint8_4bit(loaded.model, f"{n}.{p}") for n, _, p in moe.fused_expert_parameters(loaded.model))
    assert moe.bytes_per_parameter(loaded.model) <= 0.6


def test_fallback_leaves_the_experts_unquantized_and_says_so(
    tiny_mixtral: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model, "quantization_usable", lambda bits, device: (False, "no kernels"))
    loaded = load(tiny_mixtral)
    assert loaded.quantization == "none (fallback from nf4)"
    experts = loaded.model.get_submodule("model.layers.0.mlp.experts")
    assert not torch.nn.utils.parametrize.is_parametrized(experts)
    assert experts.down_proj.dtype == torch.float32


def test_8bit_leaves_the_experts_unquantized_and_says_so(tiny_mixtral: Path, caplog: pytest.LogCaptureFixture) -> None:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(tiny_mixtral)
    q = mixtral_cfg(tiny_mixtral).quantization
    with caplog.at_level(logging.WARNING, logger="dgx_trainer.model"):
        assert model._quantize_experts(m, q, 8, "int8") == "int8 (fused experts unquantized)"
    assert "fused expert tensors stay unquantized" in caplog.text
    assert not any(torch.nn.utils.parametrize.is_parametrized(mod) for mod in m.modules())


def test_targets_are_checked_under_the_unquantized_names(tiny_mixtral: Path) -> None:
    loaded = load(tiny_mixtral)
    names = [n for n, _ in loaded.model.named_parameters()]
    assert "model.layers.0.mlp.experts.parametrizations.gate_up_proj.original" in names
    assert "model.layers.0.mlp.experts.gate_up_proj" in moe.logical_parameter_names(loaded.model)
    model.check_targets(loaded.model, Lora.model_validate({"dropout": 0.0, "targetParameters": EXPERTS}))
    with pytest.raises(ConfigError) as error:
        model.check_targets(loaded.model, Lora.model_validate({"dropout": 0.0, "targetParameters": ["experts.up"]}))
    assert "experts.up not found among the model's parameters" in str(error.value)
    # peft matches parametrized parameters by full name only
    resolved = moe.resolve_target_parameters(loaded.model, EXPERTS)
    assert sorted(resolved) == sorted(f"model.layers.{i}.mlp.{e}" for i in range(2) for e in EXPERTS)
    assert moe.resolve_target_parameters(loaded.model, ["lm_head.weight"]) == ["lm_head.weight"]


def test_lora_on_the_router_s_weight_is_refused(tiny_mixtral: Path) -> None:
    """Mixtral's router is no nn.Linear (all-linear cannot reach it), but targetParameters could."""
    loaded = load(tiny_mixtral)
    assert type(loaded.model.get_submodule("model.layers.0.mlp.gate")).__name__ == "MixtralTopKRouter"
    for target in ("gate.weight", "mlp.gate.weight", "model.layers.1.mlp.gate.weight"):
        with pytest.raises(ConfigError) as error:
            model.check_targets(loaded.model, Lora.model_validate({"dropout": 0.0, "targetParameters": [target]}))
        [problem] = error.value.problems
        assert problem.path == "lora.targetParameters"
        assert "belong to the router" in problem.message
        assert "model.layers.1.mlp.gate.weight" in problem.message
    assert moe.router_parameters(loaded.model, EXPERTS) == []


def test_dropout_with_target_parameters_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as error:
        moe.check_lora(Lora.model_validate({"dropout": 0.05, "targetParameters": EXPERTS}))
    assert error.value.problems[0].path == "lora.dropout"
    assert "set lora.dropout: 0" in str(error.value)
    moe.check_lora(Lora.model_validate({"dropout": 0.05}))  # no targetParameters: dropout is fine


# --- (b) all-linear never adapts a router -----------------------------------------------------------


def test_all_linear_leaves_nn_linear_routers_alone() -> None:
    """Qwen2-MoE's shared_expert_gate is an nn.Linear, which peft's all-linear would adapt."""
    from peft import get_peft_model
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    config = Qwen2MoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=32,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_experts=4,
        num_experts_per_tok=2,
    )
    base = Qwen2MoeForCausalLM(config)
    assert moe.router_modules(base) == ["model.layers.0.mlp.shared_expert_gate"]
    unguarded = get_peft_model(Qwen2MoeForCausalLM(config), model.lora_config(Lora(dropout=0.0)))
    assert any("shared_expert_gate.lora_A" in n for n, _ in unguarded.named_parameters())  # what is guarded against
    peft_model = get_peft_model(base, model.lora_config(Lora(dropout=0.0), base))
    adapted = [n for n, _ in peft_model.named_parameters() if "lora_A" in n]
    assert adapted, "all-linear adapted nothing"
    assert not [n for n in adapted if "gate." in n or "router" in n], adapted
    assert any("shared_expert.gate_proj" in n for n in adapted)  # the shared expert's own MLP is not a router


def test_all_linear_on_mixtral_adapts_attention_only() -> None:
    """peft 0.21 rewrites all-linear on Mixtral as a transformers-4 config: the router (gate.weight)
    and the experts at rank 2r become target parameters. kubedgx's all-linear is the linear layers."""
    from peft import get_peft_model
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_local_experts=4,
    )
    base = MixtralForCausalLM(config)
    peft_model = get_peft_model(base, model.lora_config(Lora(dropout=0.0), base))
    adapted = {n.split("layers.0.")[1].split(".lora_A")[0] for n, _ in peft_model.named_parameters() if "lora_A" in n}
    assert adapted == {f"self_attn.{x}_proj" for x in "qkvo"}
    assert not peft_model.peft_config["default"].target_parameters
    assert not peft_model.peft_config["default"].rank_pattern


def test_dense_models_have_no_routers(tiny_llama: Path) -> None:
    from transformers import AutoModelForCausalLM

    assert moe.router_modules(AutoModelForCausalLM.from_pretrained(tiny_llama)) == []


# --- (c) training: every LoRA tensor trains, aux loss in progress -----------------------------------


def test_aux_loss_coefficient_follows_the_config(tiny_mixtral: Path) -> None:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(tiny_mixtral)
    assert m.config.output_router_logits is False
    assert moe.configure_aux_loss(m, None) == 0.0  # unset keeps the model's choice: off
    m.config.output_router_logits = True
    assert moe.configure_aux_loss(m, None) == pytest.approx(m.config.router_aux_loss_coef)
    assert moe.configure_aux_loss(m, 0.0) == 0.0
    assert m.config.output_router_logits is False
    assert moe.configure_aux_loss(m, 0.02) == 0.02
    assert (m.config.output_router_logits, m.config.router_aux_loss_coef) == (True, 0.02)


def test_qlora_trains_every_expert_adapter_and_reports_aux_loss(tiny_mixtral: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cfg = parse_config(
        config_data(
            out,
            {
                "model.name": str(tiny_mixtral),
                **QLORA,
                "lora.targetModules": ["all-linear"],
                "lora.targetParameters": EXPERTS,
                "training.routerAuxLossCoef": 0.02,
                "training.maxSteps": 3,
                "training.maxSeqLength": 64,
            },
        )
    )
    seen: dict[str, Any] = {}

    class Hooks(train._Hooks):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seen["before"] = {n: p.detach().clone() for n, p in kwargs["model"].named_parameters() if p.requires_grad}
            super().on_train_begin(args, state, control, **kwargs)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seen["model"] = kwargs["model"]

    rt = train.Runtime(base_dir=ROOT, output_dir=out, termination_log=out / "termination-log", env={})
    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(stdout):
        mp.setattr(train, "_Hooks", Hooks)
        summary = train.run(cfg, rt)
    events = [e for e in map(parse_event, stdout.getvalue().splitlines()) if e]

    assert summary["quantization"] == "nf4"
    before, peft_model = seen["before"], seen["model"]
    assert all("lora_" in n for n in before), [n for n in before if "lora_" not in n]
    from peft.tuners.lora.layer import ParamWrapper

    wrapped = sorted(
        (name.replace(".base_layer", ""), m.parameter_name)
        for name, m in peft_model.named_modules()
        if isinstance(m, ParamWrapper)
    )
    assert [w[1] for w in wrapped] == ["down_proj", "gate_up_proj"] * 2, wrapped
    expert_adapters = [n for n in before if ".experts." in n]
    assert len(expert_adapters) == 8, expert_adapters  # lora_A and lora_B of both stacks in both layers
    assert not [n for n in before if ".gate." in n or "router" in n]  # all-linear left the router alone
    assert {n.split(".layers.0.")[1].split(".lora_")[0] for n in before if ".layers.0.self_attn" in n} == {
        f"self_attn.{x}_proj" for x in "qkvo"
    }
    now = dict(peft_model.named_parameters())
    unchanged = [n for n, p in before.items() if torch.equal(p, now[n].detach())]
    assert not unchanged, f"LoRA tensors that did not train: {unchanged}"
    # the base experts are still 4-bit under peft
    experts = peft_model.get_base_model().get_submodule("model.layers.0.mlp.experts")
    while hasattr(experts, "base_layer"):
        experts = experts.base_layer
    assert moe.is_4bit_parametrized(experts, "down_proj")
    progress = [e for e in events if e["event"] == "progress"]
    assert len(progress) == 3
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in progress)
    assert all(isinstance(e.get("auxLoss"), float) and e["auxLoss"] > 0 for e in progress), progress
    assert all(e["quantization"] == "nf4" for e in progress)


# --- item 9: the probe runs on this rank's GPU -----------------------------------------------------


def test_quantization_probe_uses_the_local_rank_s_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import bitsandbytes as bnb

    placed: list[torch.device] = []
    current: list[Any] = []

    class Probe(torch.nn.Module):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__()

        def to(self, device: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            placed.append(torch.device(device))
            raise RuntimeError("no GPU in this test")

    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(bnb.nn, "Linear4bit", Probe)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    ok, reason = model.quantization_usable(4, "cuda")
    assert (ok, reason) == (False, "RuntimeError: no GPU in this test")
    assert placed == [torch.device("cuda", 3)]
    assert [torch.device(d) for d in current] == [torch.device("cuda", 3)]
    placed.clear()
    assert not model.quantization_usable(4, "cpu")[0]
    assert placed == [torch.device("cpu")]


# --- staged loading: the CPU first, then the experts one tensor at a time ----------------------------


def _quantized_tensors(m: Any) -> dict[str, torch.Tensor]:
    """Every parameter and buffer, and every 4-bit quant state's absmax and code, by name."""
    out = {n: t.detach().clone() for n, t in [*m.named_parameters(), *m.named_buffers()]}
    for name, module in m.named_modules():
        for pname, param in module.named_parameters(recurse=False):
            if getattr(param, "quant_state", None) is not None:
                out[f"{name}.{pname}.absmax"] = param.quant_state.absmax.clone()
        for pname in getattr(module, "parametrizations", {}):
            state = moe._4bit_state(module, pname)
            if state is not None:
                out[f"{name}.{pname}.absmax"] = state.absmax.clone()
                out[f"{name}.{pname}.code"] = state.code.clone()
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _logits(m: Any) -> torch.Tensor:
    m.eval()
    with torch.no_grad():
        return m(input_ids=torch.arange(3, 35).reshape(2, 16)).logits


def test_staged_load_gives_the_direct_load_s_model(
    tiny_mixtral: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the node lock's directory
    cfg = mixtral_cfg(tiny_mixtral, {"model.dtype": "bfloat16"})
    direct = model.load(cfg, str(tiny_mixtral), "cpu", FP32)
    with caplog.at_level(logging.INFO, logger="dgx_trainer.moe"):
        staged = model.load(cfg, str(tiny_mixtral), "cpu", FP32, staged=True)
    assert "staged load: quantized 4 fused expert tensors to 4-bit nf4 on cpu" in caplog.text
    assert "waited" in caplog.text
    assert (tmp_path / f"kubedgx-moe-load-{os.getuid()}.lock").exists()
    assert staged.quantization == direct.quantization == "nf4"
    assert all(is_uint8_4bit(staged.model, f"{n}.{p}") for n, _, p in moe.fused_expert_parameters(staged.model))
    a, b = _quantized_tensors(direct.model), _quantized_tensors(staged.model)
    assert a.keys() == b.keys()
    # bit for bit: 4-bit storage in a float dtype (quant storage = compute dtype) holds NaN patterns
    different = [n for n in a if a[n].dtype != b[n].dtype or not torch.equal(_bits(a[n]), _bits(b[n]))]
    assert not different, different
    assert moe.bytes_per_parameter(staged.model) == moe.bytes_per_parameter(direct.model)
    assert getattr(staged.model, "hf_device_map", None) == getattr(direct.model, "hf_device_map", None)
    assert torch.equal(_logits(staged.model), _logits(direct.model))


def test_staged_load_moves_and_quantizes_one_expert_tensor_at_a_time(
    tiny_mixtral: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU a move is a no-op, so moved tensors are told apart by a copy: at each quantization,
    exactly one not-yet-4-bit expert tensor is on the target (the one being quantized), its CPU
    original is already gone, and the rest of the model moves only after the last expert."""
    import bitsandbytes.nn.parametrize as bnb_parametrize
    from transformers import PreTrainedModel

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    moved: set[int] = set()
    events: list[Any] = []
    originals: list[weakref.ref[torch.Tensor]] = []
    holder: dict[str, Any] = {}

    def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        copy = tensor.to(device).clone()
        moved.add(copy.data_ptr())
        return copy

    stage = moe.stage_to_device

    def stage_to_device(m: Any, *args: Any) -> list[str]:
        holder["model"] = m
        originals.extend(weakref.ref(getattr(mod, p)) for _, mod, p in moe.fused_expert_parameters(m))
        return stage(m, *args)

    replace = bnb_parametrize.replace_parameter_4bit

    def replace_parameter_4bit(module: Any, name: str, **kwargs: Any) -> None:
        m = holder["model"]
        pending = [
            (mod, p)
            for _, mod, p in moe.fused_expert_parameters(m)
            if not moe.is_4bit_parametrized(mod, p) and getattr(mod, p).data_ptr() in moved
        ]
        alive = sum(ref() is not None for ref in originals)
        param = getattr(module, name)
        events.append((name, param.device.type, param.dtype, len(pending), alive))
        replace(module, name, **kwargs)

    to = PreTrainedModel.to

    def model_to(self: Any, *args: Any, **kwargs: Any) -> Any:
        events.append("model.to")
        return to(self, *args, **kwargs)

    monkeypatch.setattr(moe, "_to_device", to_device)
    monkeypatch.setattr(moe, "stage_to_device", stage_to_device)
    monkeypatch.setattr(bnb_parametrize, "replace_parameter_4bit", replace_parameter_4bit)
    monkeypatch.setattr(PreTrainedModel, "to", model_to)
    cfg = mixtral_cfg(tiny_mixtral, {"model.dtype": "bfloat16"})
    loaded = model.load(cfg, str(tiny_mixtral), "cpu", FP32, staged=True)

    assert len(originals) == 4
    names = ["gate_up_proj", "down_proj"] * 2
    assert events[:4] == [(n, "cpu", torch.bfloat16, 1, 3 - i) for i, n in enumerate(names)], events
    assert events[4:5] == ["model.to"], events
    assert all(is_uint8_4bit(loaded.model, f"{n}.{p}") for n, _, p in moe.fused_expert_parameters(loaded.model))


def test_the_node_lock_serializes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first_in, release, second_in = threading.Event(), threading.Event(), threading.Event()
    waited: list[float] = []

    def first() -> None:
        with moe.node_lock("test", tmp_path):
            first_in.set()
            release.wait(timeout=30)

    def second() -> None:
        with moe.node_lock("test", tmp_path) as seconds:
            waited.append(seconds)
            second_in.set()

    a = threading.Thread(target=first)
    b = threading.Thread(target=second)
    with caplog.at_level(logging.INFO, logger="dgx_trainer.moe"):
        a.start()
        assert first_in.wait(timeout=30)
        b.start()
        assert not second_in.wait(timeout=0.5), "the second holder got in while the first held the lock"
        release.set()
        assert second_in.wait(timeout=30)
        a.join(timeout=30)
        b.join(timeout=30)
    assert len(waited) == 1
    assert waited[0] >= 0.5
    assert caplog.text.count("for the node's test lock") == 2


def test_staged_only_for_4bit_moe_on_cuda(tiny_llama: Path, tiny_mixtral: Path) -> None:
    from transformers import AutoConfig, Qwen2MoeConfig

    mixtral, llama = AutoConfig.from_pretrained(tiny_mixtral), AutoConfig.from_pretrained(tiny_llama)
    assert moe.staged_load(mixtral, 4, "cuda")
    assert moe.staged_load(Qwen2MoeConfig(num_experts=4), 4, "cuda")  # num_experts
    assert not moe.staged_load(mixtral, 8, "cuda")  # the experts stay bf16 at 8-bit anyway
    assert not moe.staged_load(mixtral, None, "cuda")
    assert not moe.staged_load(mixtral, 4, "cpu")  # the CPU is the final device already
    assert not moe.staged_load(llama, 4, "cuda")  # dense


class _ChosenError(Exception):
    pass


def test_load_on_cuda_picks_the_path_from_the_config(
    tiny_llama: Path, tiny_mixtral: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a GPU: load() is stopped where it chooses, on this rank's GPU (LOCAL_RANK 2)."""
    from transformers import AutoModelForCausalLM

    def direct(path: str, **kwargs: Any) -> Any:
        raise _ChosenError("direct", kwargs["device_map"])

    def staged(load: Any, path: str, kwargs: dict[str, Any], target: Any, *args: Any) -> Any:
        raise _ChosenError("staged", target, args)

    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setattr(model, "quantization_usable", lambda bits, device: (True, ""))
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", direct)
    monkeypatch.setattr(moe, "load_staged", staged)
    with pytest.raises(_ChosenError) as chosen:
        model.load(mixtral_cfg(tiny_mixtral), str(tiny_mixtral), "cuda", FP32)
    assert chosen.value.args == ("staged", 2, ("nf4", True))
    with pytest.raises(_ChosenError) as chosen:
        model.load(mixtral_cfg(tiny_llama), str(tiny_llama), "cuda", FP32)
    assert chosen.value.args == ("direct", {"": 2})
    with pytest.raises(_ChosenError) as chosen:  # forced off
        model.load(mixtral_cfg(tiny_mixtral), str(tiny_mixtral), "cuda", FP32, staged=False)
    assert chosen.value.args == ("direct", {"": 2})


def test_load_peak_bytes() -> None:
    experts = [(8, 2), (4, 1), (8, 2)]  # (bf16 bytes, 4-bit bytes), in load order; 5 bytes of the rest
    # direct: all bf16 + the rest, plus the first tensor's 4-bit output: 5 + 20 + 2
    assert moe.load_peak_bytes(10, experts, staged=False) == 27
    # staged: the last tensor in bf16 next to every expert 4-bit: 2 + 1 + 2 + 8; above the final 10
    assert moe.load_peak_bytes(10, experts, staged=True) == 13
    assert moe.load_peak_bytes(100, experts, staged=True) == 100  # the rest dominates: the final size
    assert moe.load_peak_bytes(10, [], staged=True) == moe.load_peak_bytes(10, [], staged=False) == 10
