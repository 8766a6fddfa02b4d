"""The model side of QLoRA: small pure factories (quantization, LoRA, precision) in TRL's style,
the probe that decides whether 4-bit can run here, and loading the base model and tokenizer.

Quantization falls back honestly: when 4/8-bit was asked for but bitsandbytes cannot run its
kernels on this device, the model trains as plain LoRA in bf16/fp32, one warning is logged, and the
effective mode travels into progress and summary.json.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dgx_api.schema import Problem
from dgx_api.trainer_config import ConfigError, Lora, Quantization, TrainerConfig
from dgx_trainer import moe

log = logging.getLogger("dgx_trainer.model")

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class Precision:
    """Mixed precision for the optimizer step and the dtype the non-quantized weights load in."""

    name: str  # bf16 | fp16 | fp32
    dtype: torch.dtype

    @property
    def bf16(self) -> bool:
        return self.name == "bf16"

    @property
    def fp16(self) -> bool:
        return self.name == "fp16"


def device_kind() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def precision(requested: str, device: str) -> Precision:
    """`auto` is bf16 on GPUs that have it, else fp16 on a GPU, fp32 on the CPU.

    One rule, the one `training.precision` documents: bf16/fp16 on a run without GPUs (allowCpu)
    trains in fp32, with a warning, and says `fp32` in progress and summary.json (a CPU has no
    mixed precision to give; refusing would make every GPU manifest fail `kubedgx run --local`);
    bf16 on a GPU without it is refused (that manifest asks for something this node cannot do)."""
    if requested == "auto":
        if device == "cuda":
            return (
                Precision("bf16", torch.bfloat16)
                if torch.cuda.is_bf16_supported()
                else Precision("fp16", torch.float16)
            )
        return Precision("fp32", torch.float32)
    if requested in ("bf16", "fp16") and device == "cpu":
        log.warning("training.precision %s needs a GPU; this CPU run uses fp32", requested)
        return Precision("fp32", torch.float32)
    if requested == "bf16" and not torch.cuda.is_bf16_supported():
        raise ConfigError("trainer config", [Problem("training.precision", "bf16 is not supported by this GPU")])
    return Precision(requested, {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[requested])


def adapter_dtype(p: Precision) -> torch.dtype:
    """The dtype the trainable LoRA weights live in: bf16 in a bf16 run (the QLoRA paper's choice,
    which TRL applies to quantized models), fp32 otherwise — fp16 weights cannot be stepped by the
    fp16 grad scaler, and an fp32 run that computes its adapters in bf16 is not an fp32 run."""
    return torch.bfloat16 if p.bf16 else torch.float32


def align_adapters(peft_model: Any, p: Precision) -> torch.dtype:
    """Put every trainable parameter in :func:`adapter_dtype`; returns that dtype.

    TRL's SFTTrainer casts a quantized model's adapters to bf16 whatever the run's precision; on a
    CPU (fp32) that made the LoRA maths bf16 and the saved adapter reload to different logits. Must
    run before the optimizer exists (the HF Trainer creates it in ``train()``)."""
    dtype = adapter_dtype(p)
    for param in peft_model.parameters():
        if param.requires_grad and param.dtype != dtype:
            param.data = param.data.to(dtype)
    return dtype


def compute_dtype(q: Quantization, p: Precision) -> torch.dtype:
    return p.dtype if q.compute_dtype == "auto" else DTYPES[q.compute_dtype]


def quantization_config(q: Quantization, p: Precision, bits: int | None) -> Any:
    """The BitsAndBytesConfig for ``bits`` (4: NF4/FP4 QLoRA, 8: LLM.int8), or None."""
    if bits is None:
        return None
    from transformers import BitsAndBytesConfig

    if bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=q.quant_type,
        bnb_4bit_use_double_quant=q.double_quant,
        bnb_4bit_compute_dtype=compute_dtype(q, p),
        bnb_4bit_quant_storage=compute_dtype(q, p),
    )


def lora_config(lora: Lora, base: Any = None) -> Any:
    """peft's LoraConfig. Given the loaded ``base`` model, MoE specifics apply (see moe.py):
    ``all-linear`` leaves the routers out, and ``targetParameters`` naming 4-bit experts become the
    full names peft needs for them."""
    from peft import LoraConfig

    targets: str | list[str] | None = list(lora.target_modules) or None
    if targets == ["all-linear"]:
        targets = "all-linear"
    target_parameters = list(lora.target_parameters)
    exclude = None
    if base is not None:
        target_parameters = moe.resolve_target_parameters(base, target_parameters)
        exclude = (moe.router_modules(base) or None) if targets == "all-linear" else None
    moe.patch_peft()
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        target_parameters=target_parameters or None,
        exclude_modules=exclude,
        bias=lora.bias,
        modules_to_save=list(lora.modules_to_save) or None,
        task_type="CAUSAL_LM",
    )


def quantization_usable(bits: int, device: str) -> tuple[bool, str]:
    """Whether bitsandbytes runs ``bits``-bit layers here, by running a tiny one forward and
    backward; the reason when not."""
    try:
        import bitsandbytes as bnb

        logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # its 'kernels' hint is noise here
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            # This rank's GPU, not cuda:0: a probe on cuda:0 from every rank puts one CUDA context
            # per rank on GPU 0 (hundreds of MB each) and tests a device the rank will not use.
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(dev)
        if bits == 4:
            layer = bnb.nn.Linear4bit(16, 16, compute_dtype=torch.float32, quant_type="nf4").to(dev)
        else:
            layer = bnb.nn.Linear8bitLt(16, 16, has_fp16_weights=False).to(dev)
        x = torch.randn(2, 16, device=dev, requires_grad=True)
        layer(x).sum().backward()
        if x.grad is None:
            return False, "no gradient through the quantized layer"
        return True, ""
    except Exception as exc:  # missing library, unsupported device, missing kernels...
        return False, f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


@dataclass
class Loaded:
    model: Any
    tokenizer: Any
    quantization: str  # nf4 | fp4 | int8 | none | "none (fallback from nf4)" | "int8 (fused experts unquantized)"
    precision: Precision
    router_aux_loss_coef: float = 0.0  # for TRL's SFTConfig (moe.configure_aux_loss); 0: no aux loss


def load(cfg: TrainerConfig, model_path: str, device: str, p: Precision, *, staged: bool | None = None) -> Loaded:
    """The base model (quantized when asked and possible) and its tokenizer.

    4-bit MoE models on CUDA load staged (moe.load_staged: on the CPU, then expert by expert onto
    the GPU), since the direct load holds every expert in bf16 on the GPU first. ``staged``
    overrides that choice (None: moe.staged_load decides from the model config); it applies only to
    a 4-bit load."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    moe.check_lora(cfg.lora)
    bits = cfg.quantization_bits
    wanted = {4: cfg.quantization.quant_type, 8: "int8", None: "none"}[bits]
    effective = wanted
    if bits is not None:
        ok, reason = quantization_usable(bits, device)
        if not ok:
            if not cfg.quantization.allow_fallback:
                raise ConfigError(
                    "trainer config",
                    [Problem("quantization", f"{bits}-bit loading is not usable on {device}: {reason}")],
                )
            log.warning(
                "%d-bit quantization is not usable on %s (%s): training plain LoRA in %s instead "
                "(quantization.allowFallback is true)",
                bits,
                device,
                reason,
                p.name,
            )
            bits, effective = None, f"none (fallback from {wanted})"
    kwargs: dict[str, Any] = {
        "dtype": DTYPES[cfg.model.dtype] if cfg.model.dtype != "auto" else p.dtype,
        "trust_remote_code": cfg.model.trust_remote_code,
    }
    if cfg.model.revision:
        kwargs["revision"] = cfg.model.revision
    if cfg.model.attn_implementation:
        kwargs["attn_implementation"] = cfg.model.attn_implementation
    q = quantization_config(cfg.quantization, p, bits)
    if q is not None:
        kwargs["quantization_config"] = q
        kwargs["device_map"] = {"": _local_device(device)}
    if staged is None and bits == 4 and device == "cuda":
        config = AutoConfig.from_pretrained(
            model_path, revision=cfg.model.revision, trust_remote_code=cfg.model.trust_remote_code
        )
        staged = moe.staged_load(config, bits, device)
    if staged and bits == 4:
        qc, target = cfg.quantization, _local_device(device)
        load_cpu = AutoModelForCausalLM.from_pretrained
        model = moe.load_staged(load_cpu, model_path, kwargs, target, qc.quant_type, qc.double_quant)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_path, **kwargs)
    effective = _quantize_experts(model, cfg.quantization, bits, effective)  # staged: already done
    if q is not None:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg.training.gradient_checkpointing)
    tokenizer = AutoTokenizer.from_pretrained(model_path, revision=cfg.model.revision)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    coef = moe.configure_aux_loss(model, cfg.training.router_aux_loss_coef)
    return Loaded(model=model, tokenizer=tokenizer, quantization=effective, precision=p, router_aux_loss_coef=coef)


def _quantize_experts(model: Any, q: Quantization, bits: int | None, effective: str) -> str:
    """Fused MoE experts (3-D parameters, not nn.Linear) are quantized by moe.py, not by
    BitsAndBytesConfig; the reported mode says so when they stay unquantized. 8-bit has no
    parametrization for them: they stay in the load dtype, with a warning."""
    fused = moe.fused_expert_parameters(model)
    if bits is None or not fused:
        return effective
    if bits == 8:
        log.warning(
            "8-bit loading quantizes only nn.Linear layers: the %d fused expert tensors stay unquantized; "
            "use loadIn4bit for MoE models",
            len(fused),
        )
        return f"{effective} (fused experts unquantized)"
    done = moe.quantize_experts(model, q.quant_type, q.double_quant)
    return effective if len(done) == len(fused) else f"{effective} (fused experts unquantized)"


def _local_device(device: str) -> Any:
    return int(os.environ.get("LOCAL_RANK", "0")) if device == "cuda" else "cpu"


def check_targets(model: Any, lora: Lora) -> None:
    """Unknown target modules are a config error naming the field and the modules that exist."""
    modules = [name for name, _ in model.named_modules()]
    params = set(moe.logical_parameter_names(model))  # 4-bit experts under their unquantized names

    def matches(target: str) -> bool:
        # peft's rule for a list entry: the whole module name, or a suffix after a dot.
        return any(name == target or name.endswith(f".{target}") for name in modules)

    missing = [t for t in lora.target_modules if t != "all-linear" and not matches(t)]
    if missing:
        linear = sorted(
            {
                n.rsplit(".", 1)[-1]
                for n, m in model.named_modules()
                if isinstance(m, torch.nn.Linear) or "Linear" in type(m).__name__
            }
        )
        raise ConfigError(
            "trainer config",
            [
                Problem(
                    "lora.targetModules",
                    f"{', '.join(missing)} not found in the model; its linear layers are: {', '.join(linear[:30])}",
                )
            ],
        )
    unknown = [t for t in lora.target_parameters if not any(p.endswith(t) or f".{t}." in p for p in params)]
    if unknown:
        raise ConfigError(
            "trainer config",
            [Problem("lora.targetParameters", f"{', '.join(unknown)} not found among the model's parameters")],
        )
    routers = moe.router_parameters(model, lora.target_parameters)
    if routers:
        raise ConfigError(
            "trainer config",
            [
                Problem(
                    "lora.targetParameters",
                    f"{', '.join(routers[:4])} belong to the router, which decides the experts each token goes to: "
                    "an adapter there moves tokens away from the experts they were trained with. Adapt the experts "
                    "(experts.gate_up_proj, experts.down_proj) and attention instead",
                )
            ],
        )


def save_merged(cfg: TrainerConfig, model_path: str, adapter_dir: Path, out: Path, p: Precision) -> None:
    """The base model (unquantized, in its dtype) with the adapter merged in: 4-bit weights cannot
    be merged into, so the base is loaded again in full precision for this."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    dtype = DTYPES[cfg.model.dtype] if cfg.model.dtype != "auto" else p.dtype
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, trust_remote_code=cfg.model.trust_remote_code)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(out)
