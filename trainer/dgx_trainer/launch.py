"""`python -m dgx_trainer launch --config FILE [-- TORCHRUN OPTIONS]`: the pod's command.

Checks once per pod what would otherwise fail inside every worker, then execs torchrun. A config,
data or model error in a worker exits 2 ("do not retry"), but torchrun restarts the group
``maxRestarts`` times and reports exit 1 at the end, so the operator saw a crash and retried it
again, minutes later each time. Here, before any worker exists, such an error ends the pod at once
with exit code 2, one line per problem naming the field and the fix, the termination message
written, and no traceback.

What is checked (nothing loads weights):

1. the config (done by ``__main__`` before this runs);
2. the node: NVML preflight (exit 3), as the workers do again (it is cheap);
3. the model: ``builtin:`` models are built (cached, under a lock); a local directory must exist and
   hold a config.json; a hub id needs the hub, or the cache when HF_HUB_OFFLINE=1. Only config.json
   and the tokenizer are read;
4. the LoRA targets against the model's layers (a skeleton on the meta device), and the data:
   every row once (:func:`dgx_trainer.data.check`, before a builtin model is built from them),
   then the chat template on the job's tokenizer;
5. memory: :mod:`dgx_trainer.memory`'s estimate against the GPUs' memory (``memoryCheck``; a MIG
   slice's own memory on a MIG instance).

Then ``os.execvp`` replaces this process with torchrun (``python -m torch.distributed.run``, the
same interpreter), so torchrun is the container's process and gets its signals; its workers run
``python -m dgx_trainer --config FILE``, which does not repeat steps 3-5.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgx_api.schema import Problem
from dgx_api.trainer_config import ConfigError, TrainerConfig
from dgx_trainer import builtin, memory, preflight

log = logging.getLogger("dgx_trainer.launch")

#: Overrides the GPU memory the memory check compares with (GiB per GPU, e.g. ``80``): for trying
#: an estimate against a GPU this machine does not have, and for tests.
GPU_MEMORY_ENV = "KUBEDGX_GPU_MEMORY_GIB"
#: A hub id: ``name`` or ``owner/name`` (huggingface_hub's repo id characters).
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
TRUE = {"1", "on", "yes", "true"}


@dataclass
class ModelFiles:
    """Where the model's files are, and what was read of them."""

    path: str | None = None  # local directory or hub id that from_pretrained can open
    config: Mapping[str, Any] | None = None
    tokenizer: Any = None
    hf_config: Any = None  # the PretrainedConfig, for building the model's skeleton


def offline(env: Mapping[str, str]) -> bool:
    return env.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def locate_model(cfg: TrainerConfig, base_dir: Path, env: Mapping[str, str]) -> tuple[str | None, list[Problem]]:
    """(what from_pretrained should open, problems). Relative names that exist under ``base_dir``
    are local directories, as in train.py; absolute, ./ or ~ names must exist; other names that look
    like hub ids are hub ids."""
    name = cfg.model.name
    if builtin.is_builtin(name):
        from dgx_trainer import data

        texts = builtin.texts(data.load_records(cfg.dataset, base_dir), cfg.dataset)
        return str(builtin.ensure(name, texts)), []
    expanded = Path(name).expanduser()
    local = expanded if expanded.is_absolute() else base_dir / expanded
    looks_local = expanded.is_absolute() or name.startswith((".", "~")) or not HUB_ID.fullmatch(name)
    if local.exists() or looks_local:
        if not local.is_dir():
            return None, [
                Problem(
                    "model.name",
                    f"no model directory at {local}: save the model there (e.g. on a DGXDataMount's mountPath) "
                    "or point model.name at the directory save_pretrained wrote",
                )
            ]
        if not (local / "config.json").is_file():
            return None, [
                Problem(
                    "model.name",
                    f"{local} has no config.json: point model.name at the directory save_pretrained wrote",
                )
            ]
        return str(local), []
    return name, []


def read_model(
    cfg: TrainerConfig, path: str, env: Mapping[str, str], *, tokenizer: bool
) -> tuple[ModelFiles, list[Problem]]:
    """config.json (as a dict) and, when asked, the tokenizer: never the weights."""
    from transformers import AutoConfig, AutoTokenizer

    is_hub = not Path(path).is_dir()
    no_hub = offline(env)
    kwargs: dict[str, Any] = {"trust_remote_code": cfg.model.trust_remote_code, "local_files_only": no_hub}
    if cfg.model.revision:
        kwargs["revision"] = cfg.model.revision
    found = ModelFiles(path=path)
    try:
        found.hf_config = AutoConfig.from_pretrained(path, **kwargs)
        found.config = found.hf_config.to_dict()
    except Exception as exc:  # OSError for a missing repo or file, ValueError for an unknown model type
        if is_hub and no_hub:
            from huggingface_hub import constants

            message = (
                f"{path} is a hub id, but HF_HUB_OFFLINE=1 and it is not in the hub cache "
                f"({constants.HF_HUB_CACHE}): save the model under a data mount and set "
                "model.name to its directory, or set HF_HUB_OFFLINE=0 where the hub is reachable"
            )
        elif is_hub:
            message = (
                f"cannot read {path} from the Hugging Face hub ({_first_line(exc)}): check the id and "
                "model.revision (and HF_TOKEN for a gated model), or save the model under a data mount and set "
                "model.name to its directory"
            )
        else:
            message = f"cannot read the model config in {path} ({_first_line(exc)}): is it a transformers model?"
        return found, [Problem("model.name", message)]
    if tokenizer:
        try:
            found.tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        except Exception as exc:
            return found, [
                Problem(
                    "model.name",
                    f"cannot load the tokenizer of {path} ({_first_line(exc)}): save the tokenizer with the model "
                    "(tokenizer.save_pretrained into the same directory)",
                )
            ]
    return found, []


def _data_problems(step: Any, *args: Any) -> tuple[Any, list[Problem]]:
    """(what ``step`` returned, []) or (None, its problems). Anything else it raises (a reader's
    error on a file it could not parse) is still the data's fault here: one line, not a traceback."""
    try:
        return step(*args), []
    except ConfigError as exc:
        return None, list(exc.problems)
    except Exception as exc:
        message = f"cannot read the data ({type(exc).__name__}: {_first_line(exc)}): check the files and dataset.format"
        return None, [Problem("dataset.path", message)]


def check_data(cfg: TrainerConfig, base_dir: Path) -> tuple[Any, list[Problem]]:
    """Every row of the training and eval data (:func:`dgx_trainer.data.check`, without a
    tokenizer): (its Checked, []) or (None, the problems). Run once; the chat template is checked
    on that result when the tokenizer is there (:func:`check_chat_template`)."""
    from dgx_trainer import data

    return _data_problems(data.check, cfg, base_dir)


def check_chat_template(cfg: TrainerConfig, base_dir: Path, tokenizer: Any, checked: Any) -> list[Problem]:
    from dgx_trainer import data

    return _data_problems(data.use_chat_template, cfg.dataset, base_dir, tokenizer, checked)[1]


def check_targets(cfg: TrainerConfig, files: ModelFiles) -> list[Problem]:
    """``lora.targetModules`` and ``targetParameters`` against the model's own layers, on a skeleton
    built from config.json on the meta device (no weights, no memory): an unknown module or a
    router's parameter fails here once, not in every worker after the weights have loaded."""
    if files.hf_config is None:
        return []
    import torch
    from transformers import AutoModelForCausalLM

    from dgx_trainer import model

    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
                files.hf_config, trust_remote_code=cfg.model.trust_remote_code
            )
    except Exception as exc:  # an architecture this transformers cannot build: the workers will say
        log.info("target check skipped: cannot build %s on the meta device (%s)", files.path, _first_line(exc))
        return []
    try:
        model.check_targets(skeleton, cfg.lora)
    except ConfigError as exc:
        return list(exc.problems)
    return []


def check_quantization(cfg: TrainerConfig, report: preflight.Report) -> list[Problem]:
    """With ``quantization.allowFallback: false``, whether bitsandbytes runs here, by the same probe
    the workers run (a tiny 4/8-bit layer forward and backward): refused once, before the load."""
    bits = cfg.quantization_bits
    if bits is None or cfg.quantization.allow_fallback:
        return []
    from dgx_trainer import model

    device = "cpu" if report.cpu_only else model.device_kind()
    ok, reason = model.quantization_usable(bits, device)
    if ok:
        return []
    return [
        Problem(
            "quantization",
            f"{bits}-bit loading is not usable on {device}: {reason}; set quantization.allowFallback: true to "
            "train plain LoRA instead, or quantization.loadIn4bit: false",
        )
    ]


def gpu_memory(report: preflight.Report, env: Mapping[str, str]) -> list[tuple[str, float]]:
    """(name, GiB) of each GPU the run will use: NVML's, or ``$KUBEDGX_GPU_MEMORY_GIB``. On a MIG
    instance the probed device is the slice, so this is the slice's memory (~10 GiB for a 1g.10gb),
    never its parent's 80: a run that needs a whole GPU is refused here, not by an OOM in training."""
    override = env.get(GPU_MEMORY_ENV)
    if override:
        count = max(1, len(report.gpus))
        return [(f"({GPU_MEMORY_ENV})", float(override))] * count
    return [(g.name, g.memory_gib) for g in report.gpus]


def processes(env: Mapping[str, str], report: preflight.Report) -> int:
    value = env.get("PET_NPROC_PER_NODE") or env.get("KUBEDGX_GPUS_PER_NODE") or ""
    return int(value) if value.isdigit() else max(1, len(report.gpus))


def check_memory(
    cfg: TrainerConfig, config: Mapping[str, Any], report: preflight.Report, env: Mapping[str, str]
) -> list[Problem]:
    if cfg.memory_check == "off":
        return []
    gpus = gpu_memory(report, env)
    if not gpus:
        log.info("memory check skipped: no GPU (a CPU run)")
        return []
    verdict = memory.check(config, memory.Settings.of(cfg, processes(env, report)), gpus)
    if verdict is None:
        log.warning("memory check skipped: the model's config.json has too little to estimate from")
        return []
    for note in verdict.estimate.notes:
        log.info("memory estimate: %s", note)
    if verdict.fits:
        log.info("memory: %s", verdict.message)
        return []
    if cfg.memory_check == "warn":
        log.warning("memory: %s (memoryCheck: warn, training anyway)", verdict.message)
        return []
    return [Problem("memoryCheck", verdict.message)]


def check(cfg: TrainerConfig, base_dir: Path, env: Mapping[str, str]) -> list[Problem]:
    """Every problem steps 3-5 find (step 2 raises PreflightError); [] when the run may start."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # building a builtin model draws a bar per shard
    report = preflight.check(preflight.Expectation.from_env(env, allow_cpu=cfg.allow_cpu))
    from dgx_trainer import moe, tracking

    try:
        moe.check_lora(cfg.lora)  # what peft refuses for LoRA on MoE expert parameters
        tracking.check(cfg.training.report_to)  # a tracker whose library this image lacks
    except ConfigError as exc:
        return list(exc.problems)
    checked, data_problems = check_data(cfg, base_dir)
    if data_problems and builtin.is_builtin(cfg.model.name):
        return data_problems  # a builtin model is built from the data's texts: they must be readable
    try:
        path, problems = locate_model(cfg, base_dir, env)
    except ConfigError as exc:  # builtin: an unknown name
        path, problems = None, list(exc.problems)
    files = ModelFiles()
    if path is not None:
        files, problems = read_model(cfg, path, env, tokenizer=True)
    problems += check_targets(cfg, files)
    problems += check_quantization(cfg, report)
    if data_problems:
        problems += data_problems
    elif files.tokenizer is not None:
        problems += check_chat_template(cfg, base_dir, files.tokenizer, checked)
    if files.config is not None:
        problems += check_memory(cfg, files.config, report, env)
    return problems


def torchrun_command(argv_to_worker: Sequence[str], torchrun_options: Sequence[str]) -> list[str]:
    """torchrun (as ``python -m torch.distributed.run``: the same interpreter as this one) running
    ``python -m dgx_trainer`` with the worker's arguments."""
    return [sys.executable, "-m", "torch.distributed.run", *torchrun_options, "-m", "dgx_trainer", *argv_to_worker]


def exec_torchrun(command: Sequence[str]) -> None:
    """Replace this process: torchrun becomes the container's process and gets SIGTERM itself."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(command[0], list(command))
