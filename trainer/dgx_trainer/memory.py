"""The memory preflight: per-GPU memory of a run, estimated from the model's config.json alone.

A run that cannot fit its GPUs used to find out after minutes of loading weights (or hours into
training, at the longest batch), as a CUDA out-of-memory crash that torchrun restarts to no end.
This module predicts the peak from the model's shape and the trainer config, before anything heavy
is loaded, so the pre-launch check (:mod:`dgx_trainer.launch`) can end the pod with the numbers
and the fields that would make it fit. Pure functions: a config dict in, an :class:`Estimate` out;
no torch, so it is cheap and testable anywhere.

What is counted, per GPU (DDP: every GPU holds a whole replica):

* **weights**: Linear layers (and, at 4-bit, the fused MoE experts: kubedgx quantizes those too)
  at the quantized size, NF4 0.5 byte/param plus its absmax constants (one per 64 weights; 8-bit
  with double quantization, fp32 otherwise), LLM.int8 1 byte/param plus an fp32 scale per row.
  Embeddings, the output head, norms, routers and biases stay unquantized, and
  ``prepare_model_for_kbit_training`` upcasts them (and, at 8-bit, fused experts) to fp32.
* **adapters and optimizer**: LoRA's r*(in+out) per adapted module (per expert for
  ``targetParameters``), ``modulesToSave`` copies, their gradients, the optimizer states (AdamW:
  two per parameter, in the parameter's dtype; paged 8-bit AdamW: 2 bytes; Adafactor: factored)
  and DDP's gradient buckets.
* **activations**: with gradient checkpointing one saved hidden state per layer plus one layer
  recomputed in full; without, every layer in full. The logits (batch*seq*vocab, in the compute
  dtype, upcast to fp32 for the loss, and their fp32 gradient) are often the largest term of a
  small model. Eager attention adds its seq*seq scores.
* **overhead**: :data:`OVERHEAD_GIB` for the CUDA context, cuBLAS/NCCL workspaces and allocator
  slack, plus the transient dequantized copy of the largest quantized tensor (a whole layer of
  experts for MoE: every experts forward dequantizes all of them).

It is compared with the GPU's memory less :data:`HEADROOM` (fragmentation). The figures are
estimates: good to ~10-15% for the models named here, deliberately on the safe side.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("dgx_trainer.memory")

GIB = 2**30
#: CUDA context (~0.5 GiB with lazy module loading), cuBLAS/cuDNN workspaces, NCCL buffers and the
#: caching allocator's reserved-but-free blocks: measured runs need 1-2 GiB beyond the tensors.
OVERHEAD_GIB = 1.5
#: Share of each GPU's memory kept free: fragmentation of the caching allocator.
HEADROOM = 0.05
#: NF4/FP4: half a byte per weight; absmax per 64-weight block: fp32, or with double quantization
#: 8-bit per block plus an fp32 constant per 256 blocks.
NF4_BYTES = 0.5
ABSMAX_BYTES = 4 / 64
ABSMAX_DOUBLE_QUANT_BYTES = 1 / 64 + 4 / (64 * 256)

KNOWN_TYPES = {"llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "gemma", "phi3"}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class Shape:
    """The parts of a decoder-only transformer's config.json that decide its memory."""

    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    experts: int = 0
    top_k: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    moe_layers: tuple[int, ...] = ()
    attention_bias: bool = False


def _first(config: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        value = config.get(key)
        if value is not None:
            return value
    return None


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def shape_of(config: Mapping[str, Any]) -> tuple[Shape | None, list[str]]:
    """The shape of a llama/mistral/qwen2/mixtral/qwen2_moe-style config (others from the same
    generic fields, with a note); None, with the reason, when the fields are not there."""
    notes: list[str] = []
    if isinstance(config.get("text_config"), Mapping):  # multimodal wrappers nest the language model
        config = {**config["text_config"], "model_type": config["text_config"].get("model_type", "")}
    model_type = str(config.get("model_type") or "unknown")
    hidden = _first(config, "hidden_size", "n_embd", "d_model")
    layers = _first(config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _first(config, "num_attention_heads", "n_head")
    vocab: Any = config.get("vocab_size")
    if not (_positive(hidden) and _positive(layers) and _positive(heads) and _positive(vocab)):
        return None, [f"model type {model_type!r}: no hidden_size/num_hidden_layers/num_attention_heads/vocab_size"]
    hidden, layers, heads, vocab = int(hidden), int(layers), int(heads), int(vocab)
    if model_type not in KNOWN_TYPES:
        notes.append(f"model type {model_type!r} is estimated as a llama-style decoder")
    kv = int(_first(config, "num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    intermediate = int(_first(config, "intermediate_size", "n_inner") or 4 * hidden)
    experts = int(_first(config, "num_local_experts", "num_experts", "n_routed_experts") or 0)
    moe_layers: tuple[int, ...] = ()
    if experts > 1:
        step = int(config.get("decoder_sparse_step") or 1)
        dense = set(config.get("mlp_only_layers") or ()) | set(range(int(config.get("first_k_dense_replace") or 0)))
        moe_layers = tuple(i for i in range(layers) if (i + 1) % step == 0 and i not in dense)
    shared = int(config.get("shared_expert_intermediate_size") or 0)
    if not shared and config.get("n_shared_experts"):
        shared = int(config["n_shared_experts"]) * int(config.get("moe_intermediate_size") or intermediate)
    return (
        Shape(
            model_type=model_type,
            hidden=hidden,
            layers=layers,
            heads=heads,
            kv_heads=kv,
            head_dim=head_dim,
            intermediate=intermediate,
            vocab=vocab,
            tied=bool(config.get("tie_word_embeddings", False)),
            experts=experts if experts > 1 else 0,
            top_k=int(_first(config, "num_experts_per_tok", "moe_topk") or 2) if experts > 1 else 0,
            expert_intermediate=int(config.get("moe_intermediate_size") or intermediate) if experts > 1 else 0,
            shared_intermediate=shared if experts > 1 else 0,
            moe_layers=moe_layers,
            attention_bias=bool(config.get("attention_bias")) or model_type.startswith("qwen2"),
        ),
        notes,
    )


@dataclass(frozen=True)
class Tensor:
    """One weight of the model, as far as memory goes. ``kind``: linear (nn.Linear, quantizable),
    experts (a fused [E, out, in] parameter), other (embeddings, norms, routers, biases, lm_head)."""

    name: str
    kind: str
    n_in: int
    n_out: int
    count: int = 1  # experts in a fused parameter

    @property
    def params(self) -> int:
        return self.count * self.n_in * self.n_out


def tensors(s: Shape) -> Iterator[Tensor]:
    """The model's weights under transformers' module names (``model.layers.0.self_attn.q_proj``)."""
    h, q, kv = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    yield Tensor("model.embed_tokens", "other", s.vocab, h)
    moe = set(s.moe_layers)
    for i in range(s.layers):
        p = f"model.layers.{i}."
        yield Tensor(p + "self_attn.q_proj", "linear", h, q)
        yield Tensor(p + "self_attn.k_proj", "linear", h, kv)
        yield Tensor(p + "self_attn.v_proj", "linear", h, kv)
        yield Tensor(p + "self_attn.o_proj", "linear", q, h)
        if s.attention_bias:
            yield Tensor(p + "self_attn.bias", "other", 1, q + 2 * kv)
        yield Tensor(p + "norms", "other", 1, 2 * h)
        if i in moe:
            e, ie = s.experts, s.expert_intermediate
            yield Tensor(p + "mlp.gate", "other", h, e)  # the router: not an nn.Linear in transformers 5
            yield Tensor(p + "mlp.experts.gate_up_proj", "experts", h, 2 * ie, e)
            yield Tensor(p + "mlp.experts.down_proj", "experts", ie, h, e)
            if s.shared_intermediate:
                si = s.shared_intermediate
                yield Tensor(p + "mlp.shared_expert.gate_proj", "linear", h, si)
                yield Tensor(p + "mlp.shared_expert.up_proj", "linear", h, si)
                yield Tensor(p + "mlp.shared_expert.down_proj", "linear", si, h)
                yield Tensor(p + "mlp.shared_expert_gate", "linear", h, 1)
        else:
            yield Tensor(p + "mlp.gate_proj", "linear", h, s.intermediate)
            yield Tensor(p + "mlp.up_proj", "linear", h, s.intermediate)
            yield Tensor(p + "mlp.down_proj", "linear", s.intermediate, h)
    yield Tensor("model.norm", "other", 1, h)
    if not s.tied:
        yield Tensor("lm_head", "other", h, s.vocab)


def _matches(name: str, target: str) -> bool:
    """peft's rule for a list entry: the whole name, or a suffix after a dot."""
    return name == target or name.endswith("." + target)


@dataclass(frozen=True)
class Settings:
    """What of the trainer config decides memory, flat, so alternatives are one replace() away."""

    bits: int | None = 4
    double_quant: bool = True
    load_bytes: int = 2  # non-quantized weights (model.dtype, auto: the precision's)
    compute_bytes: int = 2  # matmul outputs (bf16/fp16 autocast, fp32)
    adapter_bytes: int = 2  # trainable weights: bf16 in a bf16 run, else fp32 (model.adapter_dtype)
    r: int = 16
    target_modules: tuple[str, ...] = ("all-linear",)
    target_parameters: tuple[str, ...] = ()
    modules_to_save: tuple[str, ...] = ()
    dropout: float = 0.05
    batch: int = 4
    seq: int = 2048
    checkpointing: bool = True
    optimizer: str = "adamw_torch"
    eager_attention: bool = False
    processes: int = 1

    @classmethod
    def of(cls, cfg: Any, processes: int = 1) -> Settings:
        """From a :class:`~dgx_api.trainer_config.TrainerConfig`, for a GPU run (what is checked)."""
        t = cfg.training
        precision = "bf16" if t.precision == "auto" else t.precision  # auto: bf16 on A100/H100-class GPUs
        compute = {"bf16": 2, "fp16": 2, "fp32": 4}[precision]
        load = compute if cfg.model.dtype == "auto" else DTYPE_BYTES[cfg.model.dtype]
        return cls(
            bits=cfg.quantization_bits,
            double_quant=cfg.quantization.double_quant,
            load_bytes=load,
            compute_bytes=compute,
            adapter_bytes=2 if precision == "bf16" else 4,
            r=cfg.lora.r,
            target_modules=tuple(cfg.lora.target_modules),
            target_parameters=tuple(cfg.lora.target_parameters),
            modules_to_save=tuple(cfg.lora.modules_to_save),
            dropout=cfg.lora.dropout,
            batch=t.per_device_batch_size,
            seq=t.max_seq_length,
            checkpointing=t.gradient_checkpointing,
            optimizer=t.optimizer,
            eager_attention=cfg.model.attn_implementation == "eager",
            processes=processes,
        )


@dataclass(frozen=True)
class Estimate:
    """Per-GPU bytes by term; ``params``/``trainable`` are parameter counts."""

    weights: float
    adapters: float  # trainable weights, their gradients, optimizer states, DDP buckets
    activations: float
    overhead: float
    params: int
    trainable: int
    detail: Mapping[str, float] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> float:
        return self.weights + self.adapters + self.activations + self.overhead

    def breakdown(self) -> str:
        g = {k: getattr(self, k) / GIB for k in ("weights", "adapters", "activations", "overhead")}
        return (
            f"weights {g['weights']:.1f}, adapters+optimizer {g['adapters']:.1f}, "
            f"activations {g['activations']:.1f}, overhead {g['overhead']:.1f}"
        )


def _weight_bytes(t: Tensor, s: Settings) -> float:
    upcast = 4 if s.bits is not None else s.load_bytes  # prepare_model_for_kbit_training: fp32
    if t.kind == "other":
        return t.params * max(upcast, s.load_bytes)
    if s.bits == 4:
        return t.params * (NF4_BYTES + (ABSMAX_DOUBLE_QUANT_BYTES if s.double_quant else ABSMAX_BYTES))
    if s.bits == 8:
        # LLM.int8 quantizes nn.Linear only; fused experts stay floating point and are upcast.
        return t.params + 4 * t.count * t.n_out if t.kind == "linear" else t.params * max(upcast, s.load_bytes)
    return t.params * s.load_bytes


def _lora(ts: Sequence[Tensor], s: Settings) -> tuple[int, int]:
    """(LoRA parameters, modulesToSave parameters)."""
    lora = 0
    for t in ts:
        if t.kind == "linear":
            hit = s.target_modules == ("all-linear",) or any(_matches(t.name, m) for m in s.target_modules)
        elif t.kind == "experts":
            hit = any(_matches(t.name, p) for p in s.target_parameters)
        else:  # lm_head may be named explicitly; all-linear leaves it out, as peft does
            hit = t.name == "lm_head" and "lm_head" in s.target_modules
        if hit:
            lora += t.count * s.r * (t.n_in + t.n_out)
    saved = sum(t.params for t in ts if any(_matches(t.name, m) for m in s.modules_to_save))
    return lora, saved


def _optimizer_bytes(trainable: int, s: Settings) -> float:
    if s.optimizer == "paged_adamw_8bit":
        return 2.0 * trainable  # two 8-bit states (plus per-block statistics, negligible)
    if s.optimizer == "paged_adamw_32bit":
        return 8.0 * trainable
    if s.optimizer == "adafactor":
        return 4.0 * trainable / max(1, s.r)  # factored second moment: rows + columns per matrix
    return 2.0 * s.adapter_bytes * trainable  # torch AdamW: exp_avg and exp_avg_sq like the parameter


def _layer_activations(shape: Shape, s: Settings, moe: bool) -> float:
    """One decoder layer's saved tensors for the backward pass (bytes)."""
    tokens = s.batch * s.seq
    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    resid = 4 if s.bits is not None else s.compute_bytes  # prepare upcasts the residual stream to fp32
    c = s.compute_bytes
    # norms' inputs and outputs, residual adds; q, k, v (and after rotary), attention output, o_proj input
    per_token = resid * 4 * h + c * (6 * h + 4 * kv)
    if moe:
        k, ie = shape.top_k, shape.expert_intermediate
        per_token += c * k * (4 * ie + 2 * h) + 4 * shape.experts  # routed copies, gate/up/act/product, logits
        if shape.shared_intermediate:
            per_token += c * 4 * shape.shared_intermediate
    else:
        per_token += c * 4 * shape.intermediate
    if s.dropout > 0:
        per_token += c * 2 * h  # dropout copies of the adapted inputs (the large ones)
    scores = shape.heads * s.seq * s.seq * (2 * c + 1) * s.batch if s.eager_attention else 0
    return tokens * per_token + scores


def estimate(config: Mapping[str, Any], s: Settings) -> Estimate | None:
    """Per-GPU bytes of a run of the model ``config`` (config.json's dict) with settings ``s``;
    None when the config has too little to go on (the reason is logged)."""
    shape, notes = shape_of(config)
    if shape is None:
        for note in notes:
            log.info("memory estimate skipped: %s", note)
        return None
    ts = list(tensors(shape))
    weights = sum(_weight_bytes(t, s) for t in ts)
    lora, saved = _lora(ts, s)
    trainable = lora + saved
    params_bytes = trainable * s.adapter_bytes
    ddp = params_bytes if s.processes > 1 else 0.0
    adapters = 2 * params_bytes + _optimizer_bytes(trainable, s) + ddp
    tokens = s.batch * s.seq
    moe = set(shape.moe_layers)
    full = [_layer_activations(shape, s, i in moe) for i in range(shape.layers)]
    resid = 4 if s.bits is not None else s.compute_bytes
    checkpointed = shape.layers * tokens * shape.hidden * resid + max(full)
    layers = checkpointed if s.checkpointing else sum(full)
    logits = tokens * shape.vocab * (s.compute_bytes + 8)
    # Working set: the largest quantized tensor dequantized (a layer's experts: all at once), twice
    # when LoRA sits on the experts (W and W + dW are both materialized).
    dequant = 0.0
    if s.bits is not None:
        quantized = [t.params for t in ts if t.kind == "linear" or (t.kind == "experts" and s.bits == 4)]
        layer_experts = sum(
            t.params for t in ts if t.kind == "experts" and t.name.startswith(f"model.layers.{min(moe, default=0)}.")
        )
        if s.bits == 4 and layer_experts:
            dequant = layer_experts * s.compute_bytes * (2 if s.target_parameters else 1)
        elif quantized:
            dequant = max(quantized) * s.compute_bytes
    if s.bits == 8 and shape.experts:
        notes.append("8-bit quantizes nn.Linear only: the fused experts stay floating point (fp32 after prepare)")
    return Estimate(
        weights=weights,
        adapters=adapters,
        activations=layers + logits,
        overhead=OVERHEAD_GIB * GIB + dequant,
        params=sum(t.params for t in ts),
        trainable=trainable,
        detail={"layers": layers, "logits": logits, "dequantized": dequant, "ddpBuckets": ddp},
        notes=tuple(notes),
    )


@dataclass(frozen=True)
class Verdict:
    """Whether the run fits the smallest GPU; ``message`` has the numbers (and the fixes when not)."""

    fits: bool
    message: str
    estimate: Estimate


def usable_gib(total_gib: float) -> float:
    return total_gib * (1 - HEADROOM)


def _fits(config: Mapping[str, Any], s: Settings, gib: float) -> bool:
    e = estimate(config, s)
    return e is not None and e.total / GIB <= usable_gib(gib)


def _largest(config: Mapping[str, Any], s: Settings, gib: float, field: str, current: int) -> int | None:
    """The largest value of ``field`` (batch or seq) at or below ``current`` that fits, halving."""
    value = current // 2
    while value >= 1:
        alt = dataclasses.replace(s, batch=value) if field == "batch" else dataclasses.replace(s, seq=value)
        if _fits(config, alt, gib):
            return value
        value //= 2
    return None


def fixes(config: Mapping[str, Any], s: Settings, gib: float) -> tuple[list[str], bool]:
    """The config changes that would each make the run fit ``gib`` (and True); when none does
    alone, those that shrink the estimate by 2% or more, biggest first (and False: combine them).
    Only fields that help are named."""
    base = estimate(config, s)
    assert base is not None
    candidates: list[tuple[str, Settings]] = []
    if s.bits != 4:
        text = "set quantization.loadIn4bit: true" + (" (and loadIn8bit: false)" if s.bits else "")
        candidates.append((text, dataclasses.replace(s, bits=4)))
    if not s.checkpointing:
        candidates.append(("turn on training.gradientCheckpointing", dataclasses.replace(s, checkpointing=True)))
    if s.optimizer not in ("paged_adamw_8bit", "adafactor"):
        alt = dataclasses.replace(s, optimizer="paged_adamw_8bit")
        candidates.append(("set training.optimizer: paged_adamw_8bit", alt))
    if s.eager_attention:
        alt = dataclasses.replace(s, eager_attention=False)
        candidates.append(("unset model.attnImplementation (eager attention keeps seq x seq scores)", alt))
    if s.modules_to_save:
        alt = dataclasses.replace(s, modules_to_save=())
        candidates.append((f"drop lora.modulesToSave ({', '.join(s.modules_to_save)})", alt))
    if s.r > 8:
        candidates.append((f"lower lora.r ({s.r})", dataclasses.replace(s, r=8)))
    alone = [text for text, alt in candidates if _fits(config, alt, gib)]
    batch = _largest(config, s, gib, "batch", s.batch)
    if batch is not None:
        alone.append(
            f"lower training.perDeviceBatchSize ({s.batch}) to {batch} "
            "(raise training.gradientAccumulationSteps to keep the effective batch)"
        )
    seq = _largest(config, s, gib, "seq", s.seq)
    if seq is not None:
        alone.append(f"lower training.maxSeqLength ({s.seq}) to {seq}")
    if alone:
        return alone, True
    if s.batch > 1:
        candidates.append((f"lower training.perDeviceBatchSize ({s.batch})", dataclasses.replace(s, batch=1)))
    if s.seq > 1:
        candidates.append((f"lower training.maxSeqLength ({s.seq})", dataclasses.replace(s, seq=max(1, s.seq // 4))))
    savings: list[tuple[float, str]] = []
    for text, alt in candidates:
        e = estimate(config, alt)
        if e is not None and base.total - e.total >= 0.02 * base.total:
            savings.append((base.total - e.total, text))
    savings.sort(reverse=True)
    return [text for _, text in savings], False


def check(config: Mapping[str, Any], s: Settings, gpus: Sequence[tuple[str, float]]) -> Verdict | None:
    """Compare the estimate with the smallest of ``gpus`` ((name, GiB) per GPU); None when the
    config cannot be estimated (logged)."""
    e = estimate(config, s)
    if e is None or not gpus:
        return None
    index, (name, gib) = min(enumerate(gpus), key=lambda g: g[1][1])
    need = e.total / GIB
    head = f"needs ~{need:.1f} GiB per GPU ({e.breakdown()})"
    where = f"GPU{index} {name} has {gib:.1f} GiB ({usable_gib(gib):.1f} usable, {HEADROOM:.0%} kept free)"
    if need <= usable_gib(gib):
        return Verdict(True, f"{head}; {where}: fits", e)
    found, alone = fixes(config, s, gib)
    advice = ", ".join(found) + ("" if alone or not found else " (no one change is enough: combine them)")
    advice = (advice + ", " if advice else "use GPUs with more memory, ") + "or set memoryCheck: warn"
    return Verdict(False, f"{head} but {where}: {advice}", e)
