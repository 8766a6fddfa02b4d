"""Resident bytes per parameter of a 4-bit MoE model: the path without fused-expert quantization
(only nn.Linear becomes 4-bit) against kubedgx's (moe.quantize_experts), side by side.

    python benchmarks/moe_memory.py

Builds a tiny Mixtral-shaped model offline (2 layers, 8 experts of 256 -> 512, tied embeddings
over 512 tokens: experts are 92% of its parameters, 96% in Mixtral-8x7B), loads it through
``dgx_trainer.model.load`` with NF4 + double quantization on the CPU, and measures
``moe.bytes_per_parameter`` as loaded and after ``prepare_model_for_kbit_training`` (which upcasts
every bf16 tensor that is not 4-bit to fp32). Then estimates Mixtral-8x7B from its config numbers
(computed, not loaded): NF4 with double quantization is 4 bits + 8/64 bits of absmax per block of
64 + the second-level state (about 0.5 + 0.0161 bytes per quantized parameter); what stays
unquantized (embeddings, lm_head, norms, routers) is bf16 loaded and fp32 after preparation.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
for sub in ("api", "trainer"):
    sys.path.insert(0, str(ROOT / sub))

import torch  # noqa: E402

DATA = ROOT / "examples" / "data" / "instructions.jsonl"

#: Mixtral-8x7B-v0.1's config.json.
MIXTRAL_8X7B = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
}
NF4_DQ = 0.5 + 1 / 64 + 4 / (64 * 256)  # packed 4 bits, uint8 absmax per 64, fp32 absmax per 256 of those


def tiny_mixtral() -> Path:
    """builtin:tiny-mixtral (the trainer's own recipe), its tokenizer trained on the example data."""
    from dgx_api.trainer_config import parse_config
    from dgx_trainer import builtin, data

    source = parse_config(
        {"model": {"name": "builtin:tiny-mixtral"}, "dataset": {"path": str(DATA), "template": "instruction"}}
    ).dataset
    return builtin.ensure("builtin:tiny-mixtral", builtin.texts(data.load_records(source, ROOT), source))


def measure(path: Path, fixed: bool) -> tuple[float, float]:
    from unittest import mock

    import peft

    from dgx_api.trainer_config import parse_config
    from dgx_trainer import model, moe

    cfg = parse_config(
        {
            "allowCpu": True,
            "model": {"name": str(path), "dtype": "bfloat16"},
            "dataset": {"path": "unused"},
            "quantization": {"loadIn4bit": True, "quantType": "nf4", "doubleQuant": True},
            "lora": {"dropout": 0.0},
            "training": {"gradientCheckpointing": False},
        }
    )
    fp32 = model.Precision("fp32", torch.float32)
    with mock.patch.object(peft, "prepare_model_for_kbit_training", lambda m, **_: m):
        if fixed:
            loaded = model.load(cfg, str(path), "cpu", fp32)
        else:
            with mock.patch.object(moe, "quantize_experts", return_value=[]):
                loaded = model.load(cfg, str(path), "cpu", fp32)
    before = moe.bytes_per_parameter(loaded.model)
    prepared = peft.prepare_model_for_kbit_training(loaded.model, use_gradient_checkpointing=False)
    return before, moe.bytes_per_parameter(prepared)


def mixtral_8x7b_estimate() -> dict[str, Any]:
    c = MIXTRAL_8X7B
    h, i, n_layers, e = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_local_experts"]
    head_dim = h // c["num_attention_heads"]
    attention = n_layers * (2 * h * h + 2 * h * c["num_key_value_heads"] * head_dim)
    experts = n_layers * e * 3 * h * i
    other = 2 * c["vocab_size"] * h + n_layers * (e * h + 2 * h) + h  # embeddings, lm_head, routers, norms
    total = attention + experts + other
    rows = {}
    for name, quantized in (("today", attention), ("fixed", attention + experts)):
        plain = total - quantized
        loaded = quantized * NF4_DQ + plain * 2
        prepared = quantized * NF4_DQ + plain * 4
        rows[name] = (loaded / total, prepared / total, prepared / 2**30)
    return {"parameters": total, "experts_share": experts / total, **rows}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("KUBEDGX_CACHE", tmp)
        path = tiny_mixtral()
        today = measure(path, fixed=False)
        fixed = measure(path, fixed=True)
    print("tiny Mixtral (2 layers, 8 experts, hidden 256, intermediate 512), bytes per parameter:")
    print(f"{'':8} {'loaded':>8} {'prepared':>9}")
    print(f"{'today':8} {today[0]:8.3f} {today[1]:9.3f}")
    print(f"{'fixed':8} {fixed[0]:8.3f} {fixed[1]:9.3f}")
    est = mixtral_8x7b_estimate()
    print(f"\nMixtral-8x7B estimate ({est['parameters'] / 1e9:.2f}B parameters, experts {est['experts_share']:.1%}):")
    for name in ("today", "fixed"):
        loaded, prepared, gib = est[name]
        print(f"{name:8} {loaded:8.3f} {prepared:9.3f}   {gib:.1f} GiB of weights per GPU after preparation")


if __name__ == "__main__":
    main()
