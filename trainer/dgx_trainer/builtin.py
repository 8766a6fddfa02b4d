"""Built-in models: `builtin:tiny-llama` and `builtin:tiny-mixtral`, made on this machine from a
config, never downloaded.

The quickstart and the tests need a model with no network: a Llama-shaped model (or a
Mixtral-shaped one, with fused experts and a router, for the MoE QLoRA path) with random weights
and a byte-level BPE tokenizer trained on the job's own training texts. Both are
deterministic (fixed seed, fixed texts), cached under ``$KUBEDGX_CACHE`` (default
``~/.cache/kubedgx``) by a digest of the recipe and the texts, and built under a file lock so the
processes of one torchrun group build it once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PREFIX = "builtin:"

#: name -> model shape. Small enough to train in seconds on a laptop CPU, big enough to learn.
RECIPES: dict[str, dict[str, int]] = {
    "tiny-llama": {
        "vocab_size": 512,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
    },
    # Experts are 92% of its parameters (Mixtral-8x7B: 96.6%), with tied embeddings, so that
    # bytes per parameter of a 4-bit load say what they would on the real model's experts.
    "tiny-mixtral": {
        "vocab_size": 512,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
}

SPECIAL = {"bos": "<s>", "eos": "</s>", "pad": "<pad>"}
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def is_builtin(name: str) -> bool:
    return name.startswith(PREFIX)


def cache_root() -> Path:
    return Path(os.environ.get("KUBEDGX_CACHE") or Path.home() / ".cache" / "kubedgx")


def digest(name: str, texts: Sequence[str]) -> str:
    h = hashlib.sha256(json.dumps({"name": name, "recipe": RECIPES[name]}, sort_keys=True).encode())
    for text in texts:
        h.update(text.encode("utf-8", "replace"))
        h.update(b"\0")
    return h.hexdigest()[:16]


def texts(records: Any, source: Any) -> list[str]:
    """The texts a built-in model's tokenizer trains on: the job's records rendered by its dataset
    template. One function, because the pre-launch check builds the model and the workers must
    find that same build in the cache (the digest is of these texts)."""
    from dgx_trainer import data

    found: list[str] = data.sample_texts(data.render(records, source, SPECIAL["eos"]))
    return found


def ensure(model: str, texts: Sequence[str], root: Path | None = None) -> Path:
    """The directory of the built model (building it if needed); usable by from_pretrained."""
    name = model[len(PREFIX) :]
    if name not in RECIPES:
        known = ", ".join(PREFIX + n for n in RECIPES)
        from dgx_api.schema import Problem
        from dgx_api.trainer_config import ConfigError

        raise ConfigError(
            "trainer config", [Problem("model.name", f"unknown built-in model {model!r} (known: {known})")]
        )
    root = root or cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{name}-{digest(name, texts)}"
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").exists():
            staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
            try:
                _build(name, texts, staging)
                if target.exists():
                    shutil.rmtree(target)
                staging.rename(target)  # atomic: a half-built model is never seen
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return target


def _build(name: str, texts: Sequence[str], out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    recipe = RECIPES[name]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe["vocab_size"],
        special_tokens=list(SPECIAL.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(texts) or ["kubedgx"], trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{SPECIAL['bos']} $A", special_tokens=[(SPECIAL["bos"], tokenizer.token_to_id(SPECIAL["bos"]))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=SPECIAL["bos"],
        eos_token=SPECIAL["eos"],
        pad_token=SPECIAL["pad"],
        model_max_length=recipe["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    # Any: the config classes' keyword arguments are typed one by one, the recipe is a plain dict.
    shape: dict[str, Any] = {k: v for k, v in recipe.items() if k != "vocab_size"}
    tokens: dict[str, Any] = {
        "bos_token_id": fast.bos_token_id,
        "eos_token_id": fast.eos_token_id,
        "pad_token_id": fast.pad_token_id,
    }
    if "num_local_experts" in recipe:
        from transformers import MixtralConfig, MixtralForCausalLM

        mixtral = MixtralConfig(vocab_size=len(fast), **shape, **tokens, tie_word_embeddings=True)
        save_random(MixtralForCausalLM, mixtral, out)
        return
    config = LlamaConfig(vocab_size=len(fast), **shape, **tokens, tie_word_embeddings=False)
    save_random(LlamaForCausalLM, config, out)


def save_random(model_class: Any, config: Any, out: Path, seed: int = 0) -> None:
    """A model with seeded random weights saved to ``out``: the same bytes on every machine, without
    disturbing the caller's random state (a training seeded before may be running in this process)."""
    import torch

    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model_class(config).save_pretrained(out)
    finally:
        torch.random.set_rng_state(generator_state)
