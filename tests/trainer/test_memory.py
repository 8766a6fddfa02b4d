"""The memory preflight's estimator (issue 14 item 2): the Mixtral example fits its DGX A100 with the
4-bit expert path and does not without quantization; a run that cannot fit names only the fields
that would help; and the parameter terms agree with real models built here (so the estimator can
be wrong, and these tests would say so)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from dgx_api.trainer_config import TrainerConfig, parse_config
from dgx_trainer import memory
from tests.trainer.conftest import EXAMPLES, config_data

MIXTRAL_CONFIG = json.loads((Path(__file__).parent / "fixtures" / "mixtral-8x7b" / "config.json").read_text())
#: dgxa100.80g.8.norm: 8 x A100-SXM4-80GB; NVML reports 81920 MiB each.
A100_80GB = [("NVIDIA A100-SXM4-80GB", 80.0)] * 8


def mixtral_example() -> TrainerConfig:
    docs = list(yaml.safe_load_all((EXAMPLES / "mixtral-qlora.yaml").read_text(encoding="utf-8")))
    (job,) = [d for d in docs if d["kind"] == "DGXTrainingJob"]
    assert job["spec"]["instance"] == "dgxa100.80g.8.norm"
    return parse_config(job["spec"]["trainer"])


def settings(cfg: TrainerConfig, **changes: Any) -> memory.Settings:
    return dataclasses.replace(memory.Settings.of(cfg, processes=8), **changes)


def test_mixtral_parameter_count_is_the_published_46_7b() -> None:
    e = memory.estimate(MIXTRAL_CONFIG, settings(mixtral_example()))
    assert e is not None
    assert e.params == pytest.approx(46.7e9, rel=0.005)
    # LoRA r=16 on q/k/v/o of 32 layers, and on both fused expert stacks of 8 experts each.
    lora = mixtral_example().lora
    assert (lora.r, lora.target_modules) == (16, ["q_proj", "k_proj", "v_proj", "o_proj"])
    assert lora.target_parameters == ["experts.gate_up_proj", "experts.down_proj"]
    attention = 16 * (4096 + 4096) * 2 + 16 * (4096 + 1024) * 2
    experts = 8 * (16 * (4096 + 2 * 14336) + 16 * (14336 + 4096))
    assert e.trainable == 32 * (attention + experts)


def test_the_mixtral_example_fits_its_dgx_a100_with_4_bit_experts() -> None:
    cfg = mixtral_example()
    verdict = memory.check(MIXTRAL_CONFIG, settings(cfg), A100_80GB)
    assert verdict is not None
    assert verdict.fits, verdict.message
    e = verdict.estimate
    gib = memory.GIB
    # NF4 + double quant for the linear layers and the fused experts (~0.516 B/param), the
    # embeddings and lm_head in fp32 after prepare_model_for_kbit_training.
    assert 22 * gib < e.weights < 25 * gib
    assert 1 * gib < e.adapters < 3 * gib  # 223M LoRA params (the experts'): bf16, grads, 8-bit states, DDP
    assert 5 * gib < e.activations < 15 * gib
    assert 30 * gib < e.total < 45 * gib, e.breakdown()
    assert verdict.message.startswith(f"needs ~{e.total / gib:.1f} GiB per GPU (weights ")
    assert "GPU0 NVIDIA A100-SXM4-80GB has 80.0 GiB" in verdict.message


def test_the_mixtral_example_s_lora_targets_exist_in_mixtral_8x7b() -> None:
    """The pre-launch target check on Mixtral-8x7B's own skeleton (meta device, from its config.json):
    the example adapts attention and both expert stacks, and nothing of the router."""
    from transformers import AutoConfig

    from dgx_trainer import launch

    cfg = mixtral_example()
    hf_config = AutoConfig.from_pretrained(Path(__file__).parent / "fixtures" / "mixtral-8x7b")
    assert launch.check_targets(cfg, launch.ModelFiles(path="mixtral-8x7b", hf_config=hf_config)) == []
    router = {"dropout": 0.0, "targetParameters": ["gate.weight"]}
    bad = parse_config({**cfg.model_dump(by_alias=True, exclude_none=True), "lora": router})
    [problem] = launch.check_targets(bad, launch.ModelFiles(path="mixtral-8x7b", hf_config=hf_config))
    assert problem.path == "lora.targetParameters"
    assert "model.layers.0.mlp.gate.weight" in problem.message


#: Qwen2.5-7B's config.json (the fields the estimate reads): examples/one-gpu-qlora.yaml's model, never
#: downloaded by a test.
QWEN25_7B = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}
#: dgxh100.80g.1.norm: one H100 SXM5 80GB; NVML reports 81559 MiB.
H100_80GB = [("NVIDIA H100 80GB HBM3", 81559 / 1024)]


def one_gpu_example() -> tuple[str, TrainerConfig]:
    text = (EXAMPLES / "one-gpu-qlora.yaml").read_text(encoding="utf-8")
    (job,) = [d for d in yaml.safe_load_all(text) if d["kind"] == "DGXTrainingJob"]
    assert job["spec"]["instance"] == "dgxh100.80g.1.norm"
    assert job["spec"]["trainer"]["model"]["name"] == "Qwen/Qwen2.5-7B"
    header = " ".join(line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#"))
    return header, parse_config(job["spec"]["trainer"])


def test_the_one_gpu_qlora_example_fits_one_h100_as_its_header_says() -> None:
    header, cfg = one_gpu_example()
    e = memory.estimate(QWEN25_7B, memory.Settings.of(cfg, processes=1))
    assert e is not None
    assert e.params == pytest.approx(7.62e9, rel=0.005)  # Qwen2.5-7B's published 7.61B
    verdict = memory.check(QWEN25_7B, memory.Settings.of(cfg, processes=1), H100_80GB)
    assert verdict is not None
    assert verdict.fits, verdict.message
    gib = memory.GIB
    said = (
        f"puts it at ~{e.total / gib:.1f} GiB of the GPU's 80: weights {e.weights / gib:.1f}, adapters and "
        f"optimizer {e.adapters / gib:.1f}, activations {e.activations / gib:.1f}, overhead {e.overhead / gib:.1f}"
    )
    assert said in header, said
    # "on a 40 GB GPU it would refuse to start and name the batch size and sequence length that fit"
    small = memory.check(QWEN25_7B, memory.Settings.of(cfg, processes=1), [("NVIDIA A100-SXM4-40GB", 40.0)])
    assert small is not None
    assert not small.fits
    assert "lower training.perDeviceBatchSize (8) to " in small.message
    assert "lower training.maxSeqLength (2048) to " in small.message


def test_the_mixtral_example_without_quantization_does_not_fit_and_names_load_in_4bit() -> None:
    cfg = mixtral_example()
    verdict = memory.check(MIXTRAL_CONFIG, settings(cfg, bits=None), A100_80GB)
    assert verdict is not None
    assert not verdict.fits
    assert verdict.estimate.weights / memory.GIB == pytest.approx(46.7e9 * 2 / memory.GIB, rel=0.01)  # bf16
    assert "set quantization.loadIn4bit: true" in verdict.message
    # Only what helps: the batch, the sequence length or the optimizer cannot save 87 GiB of weights.
    advice = verdict.message.split("kept free): ", 1)[1]
    assert advice == "set quantization.loadIn4bit: true, or set memoryCheck: warn"
    assert verdict.message.endswith("or set memoryCheck: warn")
    # Through the real config: loadIn4bit false reaches the estimate as bits=None.
    off = parse_config({**cfg.model_dump(by_alias=True, exclude_none=True), "quantization": {"loadIn4bit": False}})
    assert memory.Settings.of(off).bits is None


def test_8_bit_leaves_the_fused_experts_unquantized_and_does_not_fit() -> None:
    verdict = memory.check(MIXTRAL_CONFIG, settings(mixtral_example(), bits=8), A100_80GB)
    assert verdict is not None
    assert not verdict.fits
    assert "loadIn4bit: true (and loadIn8bit: false)" in verdict.message
    assert any("fused experts stay floating point" in n for n in verdict.estimate.notes)


def test_a_batch_and_sequence_that_cannot_fit_name_batch_size_and_sequence_length() -> None:
    cfg = mixtral_example()
    verdict = memory.check(MIXTRAL_CONFIG, settings(cfg, batch=64, seq=32768), A100_80GB)
    assert verdict is not None
    assert not verdict.fits
    assert "lower training.perDeviceBatchSize (64) to " in verdict.message
    assert "lower training.maxSeqLength (32768) to " in verdict.message
    advice = verdict.message.split("kept free): ", 1)[1]
    assert "loadIn4bit" not in advice  # already 4-bit
    assert "gradientCheckpointing" not in advice  # already on
    # The suggested values fit.
    batch = int(re.search(r"perDeviceBatchSize \(64\) to (\d+)", verdict.message).group(1))  # type: ignore[union-attr]
    seq = int(re.search(r"maxSeqLength \(32768\) to (\d+)", verdict.message).group(1))  # type: ignore[union-attr]
    assert memory.check(MIXTRAL_CONFIG, settings(cfg, batch=batch, seq=32768), A100_80GB).fits  # type: ignore[union-attr]
    assert memory.check(MIXTRAL_CONFIG, settings(cfg, batch=64, seq=seq), A100_80GB).fits  # type: ignore[union-attr]


def test_gradient_checkpointing_is_named_when_it_alone_would_fit() -> None:
    cfg = mixtral_example()
    s = settings(cfg, checkpointing=False, batch=8)
    verdict = memory.check(MIXTRAL_CONFIG, s, A100_80GB)
    assert verdict is not None
    assert not verdict.fits
    assert "turn on training.gradientCheckpointing" in verdict.message
    assert memory.estimate(MIXTRAL_CONFIG, dataclasses.replace(s, checkpointing=True)).total < (  # type: ignore[union-attr]
        verdict.estimate.total
    )


def test_activations_grow_with_batch_and_sequence_and_logits_dominate_a_tiny_model() -> None:
    cfg = parse_config(config_data(Path("/unused")))
    small = {
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 32000,
    }
    s = memory.Settings.of(cfg)
    e = memory.estimate(small, s)
    double = memory.estimate(small, dataclasses.replace(s, batch=2 * s.batch))
    assert e is not None
    assert double is not None
    assert double.activations == pytest.approx(2 * e.activations)
    assert e.detail["logits"] > e.detail["layers"]


def test_unknown_or_incomplete_configs_are_skipped_or_estimated_never_crash() -> None:
    s = memory.Settings()
    assert memory.estimate({"model_type": "whisper", "d_model": 512}, s) is None
    assert memory.check({"model_type": "whisper"}, s, A100_80GB) is None
    generic = memory.estimate(
        {
            "model_type": "newthing",
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "vocab_size": 100,
        },
        s,
    )
    assert generic is not None
    assert any("llama-style" in n for n in generic.notes)


def test_qwen2_moe_counts_shared_experts_and_sparse_steps() -> None:
    cfg = {
        "model_type": "qwen2_moe",
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 96,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 4,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "tie_word_embeddings": False,
    }
    shape, _ = memory.shape_of(cfg)
    assert shape is not None
    assert shape.moe_layers == (1, 3)
    names = [t.name for t in memory.tensors(shape)]
    assert "model.layers.1.mlp.shared_expert.gate_proj" in names
    assert "model.layers.0.mlp.gate_proj" in names  # a dense layer
    assert "model.layers.0.mlp.experts.gate_up_proj" not in names


# --- against real models -------------------------------------------------------------------------


def _param_bytes(model: Any) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_weights_and_adapters_of_tiny_llama_match_the_real_model(tiny_llama: Path) -> None:
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from dgx_trainer import model as trainer_model

    cfg = parse_config(config_data(Path("/unused"), {"lora.r": 4}))  # fp32, plain LoRA, all-linear
    config = json.loads((tiny_llama / "config.json").read_text())
    e = memory.estimate(config, memory.Settings.of(cfg))
    assert e is not None
    real = AutoModelForCausalLM.from_pretrained(tiny_llama)
    assert e.params == sum(p.numel() for p in real.parameters())
    assert e.weights == pytest.approx(_param_bytes(real), rel=0.01)
    peft_model = get_peft_model(real, trainer_model.lora_config(cfg.lora))
    assert e.trainable == sum(p.numel() for p in peft_model.parameters() if p.requires_grad)


def test_weights_and_expert_adapters_of_a_tiny_mixtral_match_the_real_model() -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import MixtralConfig, MixtralForCausalLM

    hf = MixtralConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    real = MixtralForCausalLM(hf).to(torch.float32)
    cfg = parse_config(
        config_data(
            Path("/unused"),
            {
                "lora.r": 2,
                "lora.dropout": 0.0,
                "lora.targetModules": ["q_proj", "v_proj"],
                "lora.targetParameters": ["experts.gate_up_proj", "experts.down_proj"],
            },
        )
    )
    e = memory.estimate(hf.to_dict(), memory.Settings.of(cfg))
    assert e is not None
    assert e.params == sum(p.numel() for p in real.parameters())
    assert e.weights == pytest.approx(_param_bytes(real), rel=0.01)
    lora = LoraConfig(
        r=2,
        lora_alpha=4,
        lora_dropout=0.0,
        target_modules=["q_proj", "v_proj"],
        target_parameters=["experts.gate_up_proj", "experts.down_proj"],
    )
    peft_model = get_peft_model(real, lora)
    assert e.trainable == sum(p.numel() for p in peft_model.parameters() if p.requires_grad)


def test_nf4_weights_of_tiny_llama_match_bitsandbytes(tiny_llama: Path) -> None:
    """The 4-bit path on a real quantized model, where bitsandbytes runs here (CPU in 0.50)."""
    from dgx_trainer import model as trainer_model

    if not trainer_model.quantization_usable(4, "cpu")[0]:
        pytest.skip("bitsandbytes 4-bit does not run on this machine")
    import torch
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    q = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_quant_storage=torch.bfloat16,
    )
    real = AutoModelForCausalLM.from_pretrained(
        tiny_llama, dtype=torch.bfloat16, quantization_config=q, device_map={"": "cpu"}
    )
    real = prepare_model_for_kbit_training(real, use_gradient_checkpointing=False)

    def quant_state_bytes(state: Any) -> int:
        n = sum(t.numel() * t.element_size() for t in (state.absmax, state.code))
        return n + (quant_state_bytes(state.state2) + state.offset.numel() * 4 if state.nested else 0)

    measured = _param_bytes(real) + sum(
        quant_state_bytes(p.quant_state) for p in real.parameters() if getattr(p, "quant_state", None) is not None
    )
    cfg = parse_config(
        config_data(Path("/unused"), {"quantization": {"loadIn4bit": True}, "training.precision": "bf16"})
    )
    config = json.loads((tiny_llama / "config.json").read_text())
    e = memory.estimate(config, memory.Settings.of(cfg))
    assert e is not None
    # The per-layer NF4 code tables (16 floats each) are the only thing not modelled.
    assert e.weights == pytest.approx(measured, rel=0.05)
