"""Mixture-of-experts models under QLoRA: 4-bit fused experts, LoRA on them, routers left alone.

With transformers 5, MoE experts (Mixtral, Qwen2/3-MoE, ...) are fused 3-D ``nn.Parameter`` stacks
(``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``), not ``nn.Linear``. ``BitsAndBytesConfig``
quantizes only ``nn.Linear``, so without this module about 97% of Mixtral-8x7B would stay bf16, and
``prepare_model_for_kbit_training`` would then upcast it to fp32 while progress said ``nf4``.

What is done here, and why:

- :func:`quantize_experts` puts every fused expert stack into bitsandbytes' NF4/FP4 storage with
  ``bitsandbytes.nn.parametrize.replace_parameter_4bit`` (uint8 storage, dequantized on access). It
  must run after ``from_pretrained`` on the final device (the quant state does not follow ``.to()``)
  and before ``prepare_model_for_kbit_training``, which leaves uint8 tensors alone.
- Parametrized parameters change names (``experts.parametrizations.gate_up_proj.original``):
  :func:`logical_parameter_names` gives the names a user writes in ``lora.targetParameters``, and
  :func:`resolve_target_parameters` turns those suffixes into the full names peft 0.21 needs to
  match a parametrized parameter.
- :func:`patch_peft` fixes two peft 0.21 bugs with LoRA on parametrized parameters.
- :func:`router_modules` lists the ``nn.Linear`` routers/gates that ``all-linear`` must not adapt.
- :func:`configure_aux_loss` applies ``training.routerAuxLossCoef``; TRL adds and logs the loss.
- :func:`bytes_per_parameter`: what the loaded model really holds per logical parameter.
- :func:`load_staged`: 4-bit MoE on CUDA loads on the CPU and moves the experts to the GPU one
  tensor at a time, quantizing each there, so the GPU never holds every expert in bf16 (Mixtral-8x7B:
  about 84 GiB, more than an 80 GB card, for a model that is about 23 GiB once 4-bit). Ranks of a
  node take turns (:func:`node_lock`) so host RAM holds one bf16 copy at a time.
  :func:`staged_load` says when it is used; :func:`load_peak_bytes` is the GPU peak of either path.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from torch.nn.utils import parametrize

from dgx_api.schema import Problem
from dgx_api.trainer_config import ConfigError, Lora

log = logging.getLogger("dgx_trainer.moe")

#: Config attributes that hold an MoE model's expert count, by architecture family.
_EXPERT_COUNT_ATTRS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
#: Last name component of routing layers (Mixtral/Qwen ``gate``, Qwen2-MoE ``shared_expert_gate``, others ``router``).
_ROUTER_NAMES = ("gate", "router", "shared_expert_gate", "gating")
_PARAMETRIZED = re.compile(r"\.?parametrizations\.([^.]+)\.original$")


def expert_count(config: Any) -> int | None:
    """The number of experts per MoE layer the model config declares, or None (a dense model)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for attr in _EXPERT_COUNT_ATTRS:
        value = getattr(text, attr, None)
        if isinstance(value, int) and value > 1:
            return value
    return None


def fused_expert_parameters(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """``(module name, module, parameter name)`` of every fused expert stack: a 3-D ``nn.Parameter``
    held directly by a module that is an experts container (its class name says Expert(s), or its
    first dimension is the config's expert count). Conv1d kernels are 3-D too; they are neither."""
    n_experts = expert_count(getattr(model, "config", None)) if hasattr(model, "config") else None
    found = []
    for module_name, module in model.named_modules():
        is_experts = "expert" in type(module).__name__.lower()
        shapes = {name: param.shape for name, param in module.named_parameters(recurse=False)}
        for name in getattr(module, "parametrizations", {}):  # already 4-bit: the shape it stands for
            state = _4bit_state(module, name)
            if state is not None:
                shapes[name] = torch.Size(state.shape)
        for param_name, shape in shapes.items():
            if len(shape) == 3 and (is_experts or (n_experts is not None and shape[0] == n_experts)):
                found.append((module_name, module, param_name))
    return found


def _4bit_state(module: nn.Module, param_name: str) -> Any:
    """The bitsandbytes quant state of a 4-bit parametrized parameter, or None."""
    from bitsandbytes.nn.parametrize import Bnb4bitParametrization

    if not parametrize.is_parametrized(module, param_name):
        return None
    parametrizations: Any = module.parametrizations
    plist = parametrizations[param_name]
    return next((p.quant_state for p in plist if isinstance(p, Bnb4bitParametrization)), None)


def quantize_experts(model: nn.Module, quant_type: Literal["nf4", "fp4"], double_quant: bool) -> list[str]:
    """Quantize every fused expert stack to 4 bits in place; returns their (logical) full names.

    Must run on the model's final device, after loading and before k-bit preparation."""
    from bitsandbytes.nn.parametrize import replace_parameter_4bit

    done, new = [], 0
    for module_name, module, param_name in fused_expert_parameters(model):
        if not is_4bit_parametrized(module, param_name):  # the staged load quantized them already
            replace_parameter_4bit(module, param_name, compress_statistics=double_quant, quant_type=quant_type)
            new += 1
        done.append(f"{module_name}.{param_name}" if module_name else param_name)
    if new:
        log.info("quantized %d fused expert tensors to 4-bit %s", new, quant_type)
    return done


def is_4bit_parametrized(module: nn.Module, param_name: str) -> bool:
    return _4bit_state(module, param_name) is not None


def logical_parameter_names(model: nn.Module) -> list[str]:
    """``named_parameters()`` with parametrized parameters under the names they had before
    (``experts.parametrizations.gate_up_proj.original`` is ``experts.gate_up_proj``)."""
    return [_PARAMETRIZED.sub(r".\1", name).lstrip(".") for name, _ in model.named_parameters()]


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith(f".{target}")


def resolve_target_parameters(model: nn.Module, targets: Sequence[str]) -> list[str]:
    """``lora.targetParameters`` as peft 0.21 must get them: a suffix that names parametrized
    (4-bit) parameters becomes their full names, since peft matches those only exactly; a suffix
    of plain parameters stays as written (peft matches it itself, and adapter_config.json keeps
    the user's form)."""
    parametrized = {
        f"{module_name}.{param_name}" if module_name else param_name
        for module_name, module in model.named_modules()
        for param_name in getattr(module, "parametrizations", {})
    }
    resolved: list[str] = []
    for target in targets:
        full = sorted(name for name in parametrized if _matches(name, target))
        for name in full or [target]:
            if name not in resolved:
                resolved.append(name)
    return resolved


def router_modules(model: nn.Module) -> list[str]:
    """Full names of the ``nn.Linear`` layers that route tokens to experts in an MoE model (and any
    linear inside a router module): ``all-linear`` must not adapt them. A LoRA on a router shifts
    the expert assignment the frozen experts were trained for. Empty for dense models."""
    moe = expert_count(getattr(model, "config", None)) is not None or bool(fused_expert_parameters(model))
    if not moe:
        return []
    routers: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) and "Linear" not in type(module).__name__:
            continue
        parts = name.split(".")
        in_router = any(
            "router" in type(model.get_submodule(".".join(parts[:i]))).__name__.lower() for i in range(1, len(parts))
        )
        if parts[-1] in _ROUTER_NAMES or in_router:
            routers.append(name)
    return routers


def router_parameters(model: nn.Module, targets: Sequence[str]) -> list[str]:
    """The parameters ``targets`` (``lora.targetParameters``) would adapt that belong to a router
    (Mixtral's ``MixtralTopKRouter.weight`` is no nn.Linear, so :func:`router_modules` does not see
    it). A LoRA there moves the expert assignment the frozen experts were trained for, so training
    it is refused rather than done quietly."""
    found: list[str] = []
    for name, _ in model.named_parameters():
        owner = name.rsplit(".", 1)[0] if "." in name else ""
        parts = owner.split(".") if owner else []
        routed = any(
            "router" in type(model.get_submodule(".".join(parts[: i + 1]))).__name__.lower() for i in range(len(parts))
        )
        if (routed or (parts and parts[-1] in _ROUTER_NAMES)) and any(_matches(name, t) for t in targets):
            found.append(name)
    return found


def check_lora(lora: Lora) -> None:
    """What peft refuses for LoRA on parameters, as a config error before the model loads."""
    if lora.target_parameters and lora.dropout != 0:
        raise ConfigError(
            "trainer config",
            [
                Problem(
                    "lora.dropout",
                    f"{lora.dropout} is not supported with lora.targetParameters (peft has no dropout for LoRA on "
                    "parameters, and one dropout applies to the whole adapter): set lora.dropout: 0",
                )
            ],
        )


def configure_aux_loss(model: nn.Module, coef: float | None) -> float:
    """Apply ``training.routerAuxLossCoef`` to the model config and return the coefficient for TRL's
    ``SFTConfig.router_aux_loss_coef`` (TRL then adds ``coef * aux_loss`` and logs ``aux_loss``).

    Unset keeps the model config's choice: its coefficient if it outputs router logits, else 0 (TRL
    itself would turn the loss on with the config's coefficient). 0 for dense models."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    if text is None or not hasattr(text, "output_router_logits"):
        if coef:
            log.warning("training.routerAuxLossCoef is set but this model has no router: ignored")
        return 0.0
    if coef is None:
        return float(getattr(text, "router_aux_loss_coef", 0.0) or 0.0) if text.output_router_logits else 0.0
    text.output_router_logits = coef > 0
    text.router_aux_loss_coef = coef
    return coef


# --- peft 0.21 workarounds --------------------------------------------------------------------

_PATCHED_PEFT = ("0.21.",)


def patch_peft() -> bool:
    """Fix three peft 0.21 problems with MoE models under transformers 5; returns whether the patch
    is (now) applied.

    1. ``ParamWrapper._remove_parametrizations`` removes only ``_LoraParameterProxy``, not the
       single-adapter ``_LoraFactorsProxy``: with a parameter that already carries a parametrization
       (our 4-bit experts) the proxy stays registered and the next forward fails with "only Tensors
       of floating point dtype can require gradients".
    2. With two wrapped parameters on one module (``gate_up_proj`` and ``down_proj``), the inner
       wrapper reads its parameter inside the outer wrapper's ``parametrize.cached()``, so the cache
       keeps the pre-LoRA (dequantized) value: ``down_proj``'s LoRA has no effect and no gradient.
    3. ``convert_peft_config_for_transformers`` rewrites every LoRA config for Mixtral as if it
       were written for transformers 4: ``all-linear`` gains the router (``gate.weight``) and both
       expert stacks (``gate_up_proj`` at rank 2r) as target parameters. It is meant for adapters
       trained on v4 module names; it is skipped for ``all-linear`` and for target lists whose
       every entry names a module the (v5) model has.

    Applied only to the peft versions checked (0.21.x, the trainer's pin) and only once. When peft is
    upgraded: re-run tests/trainer/test_moe.py without the patch; if every LoRA tensor still trains
    and all-linear leaves the router alone, delete this function."""
    import peft
    from peft.tuners.lora import layer as lora_layer
    from peft.utils import transformers_weight_conversion as conversion

    wrapper: Any = lora_layer.ParamWrapper
    if getattr(wrapper, "_kubedgx_patched", False):
        return True
    if not peft.__version__.startswith(_PATCHED_PEFT):
        log.warning("peft %s: LoRA on MoE experts is unverified with it (kubedgx checked 0.21)", peft.__version__)
        return False
    proxies = (lora_layer._LoraParameterProxy, lora_layer._LoraFactorsProxy)

    def _remove_parametrizations(self: Any) -> None:
        base = self.get_base_layer()
        plist = base.parametrizations[self.parameter_name]
        if len(plist) == 1:
            parametrize.remove_parametrizations(base, self.parameter_name, leave_parametrized=False)
            return
        for i in reversed(range(len(plist))):
            if isinstance(plist[i], proxies):
                del plist[i]
                return
        raise RuntimeError(f"LoRA parametrization not found on {self.parameter_name}")

    activate = wrapper._activate_lora

    @contextmanager
    def _activate_lora(self: Any, active_adapters: list[str]) -> Iterator[None]:
        with activate(self, active_adapters):
            # The value cached before this wrapper's proxy was registered is the one without LoRA.
            parametrize._cache.pop((id(self.get_base_layer()), self.parameter_name), None)
            yield

    convert = conversion.convert_peft_config_for_transformers

    def convert_peft_config_for_transformers(peft_config: Any, model: Any, conversions: Any) -> None:
        targets = getattr(peft_config, "target_modules", None)
        if isinstance(targets, str) and targets.lower() == "all-linear":
            return
        if targets is not None and not isinstance(targets, str):
            names = [name for name, _ in model.named_modules()]
            if all(any(_matches(name, t) for name in names) for t in targets):
                return
        convert(peft_config, model, conversions)

    wrapper._remove_parametrizations = _remove_parametrizations
    wrapper._activate_lora = _activate_lora
    conversion.convert_peft_config_for_transformers = convert_peft_config_for_transformers
    wrapper._kubedgx_patched = True
    return True


# --- memory -----------------------------------------------------------------------------------


def _quant_state_bytes(state: Any) -> int:
    total: int = sum(t.numel() * t.element_size() for t in (state.absmax, state.code))
    if getattr(state, "nested", False):
        total += _quant_state_bytes(state.state2) + state.offset.numel() * state.offset.element_size()
    return total


def resident_bytes(model: nn.Module) -> tuple[int, int]:
    """``(bytes, logical parameters)`` the model holds: every parameter and buffer, plus each 4-bit
    quant state (absmax, code, the nested state), which is neither. A quantized tensor counts the
    parameters it stands for (its quant state's shape), not its packed storage elements."""
    from bitsandbytes.nn.parametrize import Bnb4bitParametrization

    total = count = 0
    seen: set[int] = set()  # tied weights (embeddings and lm_head) are one tensor
    for module in model.modules():
        tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        for name, tensor in tensors:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
            state = getattr(tensor, "quant_state", None)  # Linear4bit's Params4bit
            if state is None and name == "original" and isinstance(module, parametrize.ParametrizationList):
                state = next((p.quant_state for p in module if isinstance(p, Bnb4bitParametrization)), None)
            if state is not None:
                total += _quant_state_bytes(state)
                count += int(torch.Size(state.shape).numel())
            elif isinstance(tensor, nn.Parameter):
                count += tensor.numel()
    return total, count


def bytes_per_parameter(model: nn.Module) -> float:
    total, count = resident_bytes(model)
    return total / count


# --- staged loading (4-bit MoE on CUDA) -------------------------------------------------------


def staged_load(config: Any, bits: int | None, device: str) -> bool:
    """Whether ``model.load`` takes the staged path: 4-bit, a model config with more than one expert
    per layer (its experts are fused 3-D parameters that BitsAndBytesConfig leaves in bf16), on CUDA.

    Dense models, 8-bit (no parametrization for the experts: they stay bf16 anyway) and CPU runs
    (loading on the CPU is already the final device) keep the direct ``from_pretrained`` path."""
    return bits == 4 and device == "cuda" and expert_count(config) is not None


def load_peak_bytes(final_bytes: int, experts: Sequence[tuple[int, int]], *, staged: bool) -> int:
    """Device bytes at the peak of loading a 4-bit MoE model, weights only (no CUDA context,
    allocator slack or transformers' per-shard loading buffers).

    ``final_bytes``: the loaded 4-bit model's resident bytes (what :func:`resident_bytes` counts).
    ``experts``: every fused expert tensor in load order (module order), as ``(bytes in the load
    dtype, bytes once 4-bit with its quant state)``.

    - direct (``staged=False``, ``from_pretrained`` onto the device, then :func:`quantize_experts`):
      every expert arrives in the load dtype; quantizing tensor k briefly holds its bf16 and 4-bit
      forms, the earlier ones already 4-bit: ``max_k(final - sum(4bit) + sum_{i<k} 4bit_i +
      sum_{i>=k} bf16_i + 4bit_k)``: the first tensor is the peak.
    - staged (:func:`load_staged`): only expert tensors are on the device until the last one is
      4-bit, one in bf16 at a time: ``max(final, max_k(sum_{i<=k} 4bit_i + bf16_k))``.

    Mixtral-8x7B in NF4 with double quant, computed from its shapes: final 22.8 GiB, direct 85.6
    GiB, staged 23.2 GiB (the last ``gate_up_proj``, 1.75 GiB in bf16, next to the experts
    already 4-bit). Arithmetic, not a GPU measurement."""
    if not experts:
        return final_bytes
    load = [b for b, _ in experts]
    quant = [q for _, q in experts]
    if staged:
        done, peak = 0, final_bytes
        for b, q in experts:
            done += q
            peak = max(peak, done + b)
        return peak
    rest = final_bytes - sum(quant)
    return max(rest + sum(quant[:k]) + sum(load[k:]) + quant[k] for k in range(len(experts)))


@contextmanager
def node_lock(name: str = "moe-load", directory: str | Path | None = None) -> Iterator[float]:
    """Hold an exclusive ``flock`` on ``<directory>/kubedgx-<name>-<uid>.lock``; yields the seconds
    waited for it (logged with LOCAL_RANK).

    The ranks of a pod share its node's RAM and, with ``/tmp``, the lock file (the default
    directory, ``tempfile.gettempdir()``, is node-local, unlike a shared cache volume on which
    ``flock`` may not work): the staged load holds a whole bf16 copy of the model on the host
    (about 93 GB for 8x7B), so eight ranks at once would need about 750 GB. The lock is released
    when the process dies, so a crashed rank never blocks the others."""
    path = Path(directory or tempfile.gettempdir()) / f"kubedgx-{name}-{os.getuid()}.lock"
    rank = os.environ.get("LOCAL_RANK", "0")
    started = time.monotonic()
    with open(path, "a") as lock:  # "a": never truncates a file another rank holds
        fcntl.flock(lock, fcntl.LOCK_EX)
        waited = time.monotonic() - started
        log.info("local rank %s waited %.1f s for the node's %s lock", rank, waited, name)
        try:
            yield waited
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """One tensor to the target device (the tests replace this to tell moved tensors apart on a CPU)."""
    return tensor.to(device)


def stage_to_device(
    model: nn.Module, device: torch.device, quant_type: Literal["nf4", "fp4"], double_quant: bool
) -> list[str]:
    """Move a model loaded on the CPU (Linear layers already 4-bit, experts in the load dtype) to
    ``device``: each fused expert tensor alone, quantized there before the next one moves (its CPU
    copy is dropped when its parameter is replaced), then everything else. Returns the experts'
    names, as :func:`quantize_experts` does.

    The experts are quantized on ``device`` because their quant state is a plain attribute of the
    parametrization, which ``Module.to`` does not move. ``Linear4bit`` weights are
    ``Params4bit``, whose ``.to`` moves their quant state in place (bitsandbytes 0.50
    ``Params4bit.to`` -> ``QuantState.to``), and transformers 5.24's ``PreTrainedModel.to`` refuses
    only a dtype change of a bnb model. With ``device`` the CPU every move is a no-op."""
    from bitsandbytes.nn.parametrize import replace_parameter_4bit

    done = []
    for module_name, module, param_name in fused_expert_parameters(model):
        if not is_4bit_parametrized(module, param_name):
            moved = _to_device(getattr(module, param_name).data, device)
            setattr(module, param_name, nn.Parameter(moved, requires_grad=False))  # frees the CPU copy
            del moved
            replace_parameter_4bit(module, param_name, compress_statistics=double_quant, quant_type=quant_type)
        done.append(f"{module_name}.{param_name}" if module_name else param_name)
    _check_no_cpu_packing(model, device)
    model.to(device)
    for module in model.modules():  # experts that were 4-bit before (none after from_pretrained)
        for plist in getattr(module, "parametrizations", {}).values():
            for p in plist:
                state = getattr(p, "quant_state", None)
                if state is not None:
                    state.to(device)  # in place, a no-op where it already is
    if getattr(model, "hf_device_map", None) is not None:  # 5.24 sets none for a one-device map
        setattr(model, "hf_device_map", {"": device.index if device.type == "cuda" else device.type})  # noqa: B010
    log.info("staged load: quantized %d fused expert tensors to 4-bit %s on %s", len(done), quant_type, device)
    return done


def _check_no_cpu_packing(model: nn.Module, device: torch.device) -> None:
    """bitsandbytes repacks a ``Params4bit`` for AVX512 at its first CPU inference forward, and only
    ``.cuda()`` (not ``.to``) undoes that. No forward runs between loading and the move, so this
    never fires; it is here so that a change to that is an error, not wrong weights on the GPU."""
    if device.type == "cpu":
        return
    for name, param in model.named_parameters():
        if getattr(getattr(param, "quant_state", None), "packing_format_for_cpu", False):
            raise RuntimeError(f"{name} is in bitsandbytes' CPU packing: it cannot move to {device} with .to()")


def load_staged(
    from_pretrained: Callable[..., Any],
    model_path: str,
    kwargs: dict[str, Any],
    target: int | str,
    quant_type: Literal["nf4", "fp4"],
    double_quant: bool,
    lock_dir: str | Path | None = None,
) -> Any:
    """``from_pretrained(model_path, **kwargs)`` on the CPU (transformers + bitsandbytes quantize
    the Linear layers there), then :func:`stage_to_device` onto ``target`` (a CUDA index, or "cpu"),
    all under the node's :func:`node_lock`: the host copy is gone when the lock is released.

    Device peak: :func:`load_peak_bytes` with ``staged=True``. Host peak: one bf16 copy of the model
    per node at a time. Cost: the ranks of a node load one after another."""
    device = torch.device("cuda", target) if isinstance(target, int) else torch.device(target)
    with node_lock("moe-load", lock_dir):
        started = time.monotonic()
        model = from_pretrained(model_path, **{**kwargs, "device_map": {"": "cpu"}})
        stage_to_device(model, device, quant_type, double_quant)
        seconds = time.monotonic() - started
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        log.info("staged load took %.0f s; peak %.2f GiB allocated on %s", seconds, peak, device)
    else:
        log.info("staged load took %.1f s", seconds)
    return model
