"""The fine-tune: TRL's SFTTrainer with LoRA or QLoRA, resumable after any interruption.

Every start resumes from the newest complete checkpoint that every rank has (each node has its
own output directory), so a crash or a torchrun restart loses at most ``training.saveSteps`` steps,
and a pod deleted or reclaimed (SIGTERM) none beyond the step it was in (:class:`_Sigterm`). Under
torchrun the run is data-parallel (gloo on CPU, NCCL on GPU), set up by the HF Trainer from the
environment torchrun provides.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PrinterCallback, TrainerCallback, set_seed

from dgx_api import checkpoints
from dgx_api.progress import Reporter, now_iso, termination_message, write_atomic
from dgx_api.trainer_config import TrainerConfig
from dgx_trainer import builtin, data, model, moe, preflight, throughput, tracking

log = logging.getLogger("dgx_trainer")


@dataclass(frozen=True)
class Runtime:
    """Where and as what this process runs: paths, ranks, and the environment it was given."""

    base_dir: Path
    output_dir: Path
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    termination_log: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, cfg: TrainerConfig, base_dir: Path, output_dir: str | None = None) -> Runtime:
        env = dict(os.environ)
        out = Path(output_dir or cfg.output.dir)
        term = env.get("KUBEDGX_TERMINATION_LOG", "/dev/termination-log")
        return cls(
            base_dir=base_dir,
            output_dir=out if out.is_absolute() else base_dir / out,
            rank=int(env.get("RANK", "0")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            world_size=int(env.get("WORLD_SIZE", "1")),
            termination_log=Path(term) if term else None,
            env=env,
        )

    @property
    def main(self) -> bool:
        return self.rank == 0


class _Hooks(TrainerCallback):
    """Progress reports, checkpoint completion markers, and the test-only fault injection."""

    def __init__(self, reporter: Reporter, rt: Runtime) -> None:
        self.reporter = reporter
        self.rt = rt
        fault = rt.env.get("KUBEDGX_FAULT_AT_STEP")
        self.fault_step = int(fault) if fault else None
        self.fault_once = rt.env.get("KUBEDGX_FAULT_ONCE_FILE")

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.reporter.start(state.global_step, state.max_steps)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if logs:
            self.reporter.log(state.global_step, state.max_steps, state.epoch, logs)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Every rank gets here after its own part of the save (each rank writes its RNG state,
        # each node's local main the rest: save_on_each_node). The marker says the node's copy is
        # whole, so it waits for every rank; the RNG files are shared first so that any node's
        # copy can resume any rank (ranks move between nodes at a rendezvous, and a node restored
        # from an Out mount may get another node's upload).
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        _share_rng_states(ckpt, self.rt)
        if self.rt.local_rank == 0 and ckpt.is_dir():
            # Every node's copy counts for resuming; only global rank 0's node uploads it.
            checkpoints.mark_complete(ckpt, state.global_step, upload=self.rt.main)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Tests crash a worker here (KUBEDGX_FAULT_AT_STEP), once: the marker file makes the
        # restarted group train on. os._exit skips every cleanup, as a real crash would.
        if (
            self.fault_step is not None
            and state.global_step == self.fault_step
            and self.rt.rank == int(self.rt.env.get("KUBEDGX_FAULT_RANK", "0"))
        ):
            if self.fault_once and Path(self.fault_once).exists():
                return
            if self.fault_once:
                Path(self.fault_once).write_text(str(state.global_step))
            log.error("fault injection: exiting at step %d", state.global_step)
            os._exit(17)


class _LossWindows(TrainerCallback):
    """Stamps each logged loss in the trainer state's log history with the number of steps it
    averages (``lossSteps``). The log history travels in every checkpoint, so after a resume the
    whole run's mean loss can be computed from it (:func:`checkpoints.run_mean_loss`), even across
    several resumes whose first windows are shorter than the distance to the entry before."""

    def __init__(self) -> None:
        self.last_logged = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.last_logged = state.global_step  # as the HF Trainer counts its first window

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if logs and "loss" in logs and state.log_history and "loss" in state.log_history[-1]:
            state.log_history[-1]["lossSteps"] = state.global_step - self.last_logged
            self.last_logged = state.global_step


class LossDivergedError(RuntimeError):
    """The training loss was NaN or infinite for ``training.stopOnNonFiniteLoss`` reports in a row.

    Its message is the job's: the operator shows the termination message ``LossDiverged: ...`` with
    reason LossDiverged and does not restart (the same config diverges the same way)."""


class _Divergence(TrainerCallback):
    """Stops a diverged run instead of training on NaN weights to the end (or, restarted, again).

    The HF Trainer logs the loss averaged over the ranks, so every rank sees the same value and
    raises at the same step; ``logging_nan_inf_filter`` is off (see :func:`sft_config`), or the
    Trainer would log the average of earlier steps in place of a NaN one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.steps: list[int] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not self.limit or not logs or not isinstance(logs.get("loss"), (int, float)):
            return
        loss = float(logs["loss"])
        if math.isfinite(loss):
            self.steps = []
            return
        self.steps.append(state.global_step)
        if len(self.steps) >= self.limit:
            raise LossDivergedError(
                f"the training loss was {loss} at {len(self.steps)} reports in a row (steps "
                f"{', '.join(map(str, self.steps))}): the run diverged and a restart would diverge again; "
                "lower training.learningRate, use precision bf16 rather than fp16, or check the data for broken rows"
            )


DIVERGED_MARKER = Path(".kubedgx") / "diverged.json"


def config_digest(cfg: TrainerConfig) -> str:
    """What a divergence marker is valid for: the same config diverges again, a changed one may not."""
    return hashlib.sha256(cfg.model_dump_json(by_alias=True).encode()).hexdigest()[:16]


def mark_diverged(rt: Runtime, cfg: TrainerConfig, message: str) -> None:
    """Remember on the node that this config diverged, so that torchrun's restarts of the group
    (which cannot tell this failure from a crash) fail at once instead of training into it again."""
    path = rt.output_dir / DIVERGED_MARKER
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"config": config_digest(cfg), "message": message}) + "\n")


def diverged_before(rt: Runtime, cfg: TrainerConfig) -> str | None:
    """The message of an earlier divergence of this very config in this output directory."""
    found = _marked(rt, cfg, DIVERGED_MARKER)
    return None if found is None else found or "the loss diverged"


#: Like DIVERGED_MARKER, for a CUDA out-of-memory error: the same config on the same GPUs runs out
#: again, and torchrun's maxRestarts would otherwise load the model and fail once more each time.
OUT_OF_MEMORY_MARKER = Path(".kubedgx") / "out-of-memory.json"


class RepeatedOutOfMemoryError(RuntimeError):
    """This config ran out of GPU memory in this output directory before: not trained again. Its
    message is the earlier termination message (``OutOfMemory: ...``)."""


def mark_out_of_memory(rt: Runtime, cfg: TrainerConfig, message: str) -> None:
    """Remember on the node that this config ran out of GPU memory (see OUT_OF_MEMORY_MARKER)."""
    path = rt.output_dir / OUT_OF_MEMORY_MARKER
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"config": config_digest(cfg), "message": message}) + "\n")


def _marked(rt: Runtime, cfg: TrainerConfig, marker_path: Path) -> str | None:
    """The message a marker holds when it was left for this very config; None otherwise."""
    try:
        marker = json.loads((rt.output_dir / marker_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("config") != config_digest(cfg):
        return None
    return str(marker.get("message") or "")


class InterruptedBySignal(BaseException):
    """The run stopped for SIGTERM (pod deletion, a spot reclaim, a node drain), not for a fault.

    Its message is the job's: ``__main__`` writes ``Interrupted: ...`` as the termination message of
    each node's first process (one per pod) and exits 143 (128 + SIGTERM). A BaseException, as
    KeyboardInterrupt is, because before training it is raised from the signal handler wherever the
    main thread happens to be, and the libraries' ``except Exception`` fallbacks (a quantization
    probe, a tokenizer load) must not swallow it and carry on."""


class _Sigterm(TrainerCallback):
    """SIGTERM ends the run at the end of the current step with a complete checkpoint of that step.

    The kubelet signals the pod's PID 1, torchrun's agent, which sends the same signal to each
    worker's process group and waits for them at most ``--shutdown-timeout`` seconds (environment
    ``PET_SHUTDOWN_TIMEOUT``, else ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, else 30 s in torch 2.13:
    ``SimpleElasticAgent.run`` -> ``PContext.close(death_sig, timeout)``, one deadline for all
    workers) before it SIGKILLs them, then exits 1 itself; the pod's ``terminationGracePeriodSeconds``
    bounds it all. So the rest of the step and the save must fit in the smaller of the two. Without a
    handler Python dies at once and up to ``training.saveSteps`` steps are lost.

    The handler only sets a flag: a signal during a save lets the save finish, one during a step
    lets the step finish. Before training (model load, data preparation) there is nothing to save,
    so it raises :class:`InterruptedBySignal` at once. At each step's end the ranks agree whether
    any of them was signalled (one scalar all_reduce MAX per step; a reclaim may reach one node
    only, or the nodes a step apart, and a rank that saved alone would wait in the checkpoint's
    collectives forever); if so, the step is logged (its loss reaches the checkpoint's log history,
    for the run's mean loss), saved and training stops. This callback comes after the HF Trainer's
    DefaultFlowCallback, whose flags ``_maybe_log_save_evaluate`` acts on right after
    ``on_step_end``, so the checkpoint is of this very step, and :class:`_Hooks` marks it complete
    on every node once whole. A signal that arrives during a regular save is agreed on in
    ``on_save`` and stops there, without another step.

    Not the HF Trainer's ``enable_jit_checkpoint``: it saves on each rank alone after a fixed wait,
    does not call ``on_save`` (no completion marker) and stops ranks signalled at different steps at
    different steps.
    """

    def __init__(self) -> None:
        self.received = False
        self.training = False
        #: The step training stopped at because of the signal, once the ranks agreed on it.
        self.stopped_at: int | None = None
        self._previous: Any = None
        self._installed = False

    def install(self) -> None:
        """Handle SIGTERM in this process; only the main thread may set a handler (an in-process
        caller on another thread keeps its own)."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("not on the main thread: SIGTERM is not handled, the steps since the last checkpoint are lost")
            return
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        self._installed = True

    def restore(self) -> None:
        if self._installed:
            # None: a handler set outside Python, which cannot be put back; the default is the closest.
            signal.signal(signal.SIGTERM, signal.SIG_DFL if self._previous is None else self._previous)
            self._installed = False

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.training:
            raise InterruptedBySignal(
                "SIGTERM before training began (loading the model and data): nothing to save; "
                "a replacement starts from the newest complete checkpoint"
            )
        if not self.received:
            log.warning("SIGTERM: saving a checkpoint at the end of this step, then stopping")
            # The agent signals this rank's whole process group, DataLoader workers included, and
            # they die of it (torch's worker handler re-raises a SIGTERM its parent did not send).
            # torch's SIGCHLD handler would then raise "DataLoader worker ... is killed by signal"
            # here, mid-step or mid-save. No batch is fetched after this step, so their deaths are
            # not reported; the process is ending, so it is not put back. (A signal while this rank
            # waits for a batch still fails that fetch: then the group resumes from the checkpoint
            # before, as without a handler.)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.received = True

    def _agreed(self, args: Any) -> bool:
        """Whether any rank was signalled. The tensor lives on the rank's training device: NCCL
        reduces only CUDA tensors, gloo (the CPU runs) CPU ones."""
        signalled = self.received
        if _distributed():
            flag = torch.tensor([int(signalled)], dtype=torch.int32, device=args.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            signalled = bool(flag.item())
        return signalled

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.training = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.stopped_at is None and self._agreed(args):
            control.should_log = True
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Every rank gets here with the same flags, so every rank joins the collective or none does.
        if self.stopped_at is None and not control.should_training_stop and self._agreed(args):
            control.should_training_stop = True
            self.stopped_at = state.global_step

    def interrupted(self, rt: Runtime, step: int, total: int) -> InterruptedBySignal | None:
        """What to raise after ``trainer.train()`` returned: None when it was not stopped by the
        signal or trained to the end anyway (then the adapter is saved as on any other success)."""
        if self.stopped_at is None or step >= total:
            return None
        ckpt = rt.output_dir / f"checkpoint-{step}"
        if rt.local_rank != 0 or checkpoints.is_complete(ckpt):
            saved = f"{ckpt.name} saved and marked complete; a replacement resumes from it"
        else:
            saved = f"{ckpt.name} is not complete; a replacement resumes from the newest complete checkpoint"
        return InterruptedBySignal(f"SIGTERM at step {step} of {total}; {saved}")


def _distributed() -> bool:
    return (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    )


def _share_rng_states(ckpt: Path, rt: Runtime) -> None:
    """Give this node's copy of ``ckpt`` every rank's RNG state, not just its own ranks'.

    The HF Trainer writes ``rng_state_<rank>.pth`` where each rank runs, and a rank resuming
    without its file trains on with fresh randomness (dropout, sampling), so the losses leave the
    uninterrupted run's. After a restart a rank may land on another node (ranks are assigned at
    each rendezvous) or read a copy restored from an Out mount that another node uploaded. The
    files are a few kilobytes each. The gather also waits for every rank's save to be finished.
    """
    if not _distributed():
        return
    own = ckpt / f"rng_state_{torch.distributed.get_rank()}.pth"
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, own.read_bytes() if own.is_file() else None)
    if rt.local_rank != 0:
        return
    for rank, blob in enumerate(gathered):
        target = ckpt / f"rng_state_{rank}.pth"
        if isinstance(blob, bytes) and not target.is_file():
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            tmp.write_bytes(blob)
            os.replace(tmp, target)


def _agreed_resume(rt: Runtime) -> Path | None:
    """The checkpoint this rank resumes from, the same step on every rank of the group.

    Each node has its own output directory (an emptyDir or hostPath of its pod), holding what it
    saved and what an Out mount restored into it; the group takes the newest step every rank has
    complete (:func:`checkpoints.agree`). Newer checkpoints a node has are unmarked: training
    writes them again, and until it has they are not this run's.
    """
    local = [step for step, _ in checkpoints.complete(rt.output_dir)]
    per_rank: list[Any] = [local]
    if rt.world_size > 1 and not _distributed():
        # The HF Trainer sets the group up when it is created; without it the ranks cannot agree.
        raise RuntimeError(f"WORLD_SIZE is {rt.world_size} but no process group is set up to agree on a resume step")
    if _distributed():
        per_rank = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(per_rank, local)
    step = checkpoints.agree(per_rank)
    if rt.main:
        log.info("complete checkpoints per rank: %s", dict(enumerate(per_rank)))
    if step is None:
        log.info("start at step 0: no complete checkpoint that every rank has (complete here: %s)", local)
    else:
        log.info("resume at step %d, the newest complete checkpoint every rank has (complete here: %s)", step, local)
    if rt.local_rank == 0:
        for stale, path in checkpoints.complete(rt.output_dir):
            if step is None or stale > step:
                log.warning("%s is newer than the group's resume step: unmarked, it will be written again", path)
                checkpoints.unmark(path)
    return None if step is None else rt.output_dir / f"checkpoint-{step}"


def _model_path(cfg: TrainerConfig, rt: Runtime, records: Any) -> str:
    name = cfg.model.name
    if builtin.is_builtin(name):
        # The built-in tokenizer is trained on the texts themselves, so they come before loading it.
        return str(builtin.ensure(name, builtin.texts(records, cfg.dataset)))
    local = rt.base_dir / name
    return str(local) if not Path(name).is_absolute() and local.exists() else name


def collective_timeout(cfg: TrainerConfig, moe_model: bool) -> int:
    """training.collectiveTimeoutSeconds, else PyTorch's 30 minutes, or 2 hours for a MoE model: a
    node's ranks load a 4-bit MoE model one after another (moe.node_lock bounds host RAM to one bf16
    copy), so the first rank can wait several loads at the first collective, too close to 30
    minutes for 8 ranks reading ~90 GB each from network storage."""
    if cfg.training.collective_timeout_seconds is not None:
        return cfg.training.collective_timeout_seconds
    return 7200 if moe_model else 1800


def sft_config(
    cfg: TrainerConfig,
    rt: Runtime,
    p: model.Precision,
    has_eval: bool,
    device: str,
    *,
    moe_model: bool = False,
    rows: int | None = None,
) -> Any:
    """``rows``: the training data's, which caps the default tokenization processes (throughput.py)."""
    from trl import SFTConfig

    t = cfg.training
    cpus = throughput.Cpus.of(rt.env)
    eval_strategy = "steps" if has_eval and t.eval_steps else "no"
    return SFTConfig(
        output_dir=str(rt.output_dir),
        num_train_epochs=t.epochs,
        max_steps=t.max_steps if t.max_steps is not None else -1,
        per_device_train_batch_size=t.per_device_batch_size,
        per_device_eval_batch_size=t.per_device_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        learning_rate=t.learning_rate,
        lr_scheduler_type=t.lr_scheduler,
        warmup_steps=t.warmup_ratio,  # a float below 1 is a ratio in transformers 5
        weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm,
        optim=t.optimizer if device == "cuda" or "paged" not in t.optimizer else "adamw_torch",
        max_length=t.max_seq_length,
        packing=t.packing,
        gradient_checkpointing=t.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if t.gradient_checkpointing else None,
        bf16=p.bf16,
        fp16=p.fp16,
        use_cpu=device == "cpu",
        seed=t.seed,
        data_seed=t.seed,
        logging_steps=t.logging_steps,
        save_strategy="steps",
        save_steps=t.save_steps,
        save_total_limit=t.save_total_limit,
        # Output directories are node-local (each pod its own): every node saves a whole checkpoint.
        save_on_each_node=True,
        eval_strategy=eval_strategy,
        eval_steps=t.eval_steps if eval_strategy == "steps" else None,
        dataset_text_field="text",
        # The loss on the answer (dataset.lossOn): prompt/completion rows get TRL's completion mask
        # from this; chat rows come with labels made by data.tokenize_conversations, because TRL's
        # assistant_only_loss needs {% generation %} markers that few chat templates have.
        completion_only_loss=data.completion_only_loss(cfg.dataset),
        assistant_only_loss=False,
        report_to=tracking.setup(t.report_to, rt.output_dir),
        disable_tqdm=True,
        ddp_find_unused_parameters=False,
        ddp_timeout=collective_timeout(cfg, moe_model),
        # A NaN loss is logged as NaN (the default filter logs the earlier steps' mean in its place),
        # so that training.stopOnNonFiniteLoss can see the run diverge.
        logging_nan_inf_filter=False,
        # Batches are collated by worker processes sized to the CPUs the node's ranks share, into
        # pinned memory on GPUs (an asynchronous copy): the CPU side no longer bounds the GPUs.
        dataloader_num_workers=throughput.dataloader_workers(t, cpus, device),
        dataloader_pin_memory=device == "cuda",
        dataset_num_proc=throughput.tokenization_processes(cfg.dataset, cpus, rows),
        log_level="warning",
    )


def run(cfg: TrainerConfig, rt: Runtime) -> dict[str, Any]:
    """Train, save the adapter (and the merged model when asked), return the summary; raise
    :class:`InterruptedBySignal` when SIGTERM stopped it (see :class:`_Sigterm`)."""
    sigterm = _Sigterm()
    sigterm.install()
    try:
        return _train(cfg, rt, sigterm)
    finally:
        sigterm.restore()


def _train(cfg: TrainerConfig, rt: Runtime, sigterm: _Sigterm) -> dict[str, Any]:
    started = time.monotonic()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    report = preflight.check(preflight.Expectation.from_env(rt.env, allow_cpu=cfg.allow_cpu))
    device = "cpu" if report.cpu_only else model.device_kind()
    p = model.precision(cfg.training.precision, device)
    rt.output_dir.mkdir(parents=True, exist_ok=True)
    earlier = diverged_before(rt, cfg)
    if earlier is not None:
        raise LossDivergedError(f"{earlier} (this config diverged here before: not trained again)")
    out_of_memory = _marked(rt, cfg, OUT_OF_MEMORY_MARKER)
    if out_of_memory:
        raise RepeatedOutOfMemoryError(
            f"{out_of_memory} (this config ran out of memory here before: not trained again)"
        )

    # Every row of the training and eval data, before a model is built: a bad row is exit 2 now.
    checked = data.check(cfg, rt.base_dir)
    records = data.load_records(cfg.dataset, rt.base_dir)
    model_path = _model_path(cfg, rt, records)
    loaded = model.load(cfg, model_path, device, p)
    model.check_targets(loaded.model, cfg.lora)
    data.use_chat_template(cfg.dataset, rt.base_dir, loaded.tokenizer, checked)  # saved with the adapter
    tokenizers = throughput.tokenization_processes(cfg.dataset, throughput.Cpus.of(rt.env), len(records))
    train_set, eval_set = data.training_sets(cfg, rt.base_dir, records, loaded.tokenizer, num_proc=tokenizers)

    from trl import SFTTrainer

    samples_per_step = cfg.training.per_device_batch_size * cfg.training.gradient_accumulation_steps * rt.world_size
    gpu = throughput.gpu_sampler(device, rt.local_rank) if rt.main else None  # rank 0 reports
    reporter = Reporter(
        rt.output_dir,
        precision=p.name,
        quantization=loaded.quantization,
        samples_per_step=samples_per_step,
        enabled=rt.main,
        gpu=gpu,
    )
    set_seed(cfg.training.seed)  # before the adapters are created: their init draws from it
    moe_model = moe.expert_count(loaded.model.config) is not None
    args = sft_config(cfg, rt, p, eval_set is not None, device, moe_model=moe_model, rows=len(records))
    args.router_aux_loss_coef = loaded.router_aux_loss_coef  # MoE: TRL adds the router's aux loss and logs it
    trainer = SFTTrainer(
        model=loaded.model,
        args=args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        processing_class=loaded.tokenizer,
        peft_config=model.lora_config(cfg.lora, loaded.model),
        callbacks=[_Hooks(reporter, rt)],
    )
    trainer.remove_callback(PrinterCallback)  # stdout is for the JSON progress lines
    adapters = model.align_adapters(trainer.model, p)
    reporter.flops = throughput.flops_basis(trainer.model, gpu, p.name, rt.world_size)  # mfu needs the adapters
    trainer.add_callback(_LossWindows())
    trainer.add_callback(_Divergence(cfg.training.stop_on_non_finite_loss))
    trainer.add_callback(sigterm)  # after the DefaultFlowCallback: its save is of this step
    resume = _agreed_resume(rt)
    try:
        result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    except LossDivergedError as exc:
        if rt.local_rank == 0:
            mark_diverged(rt, cfg, str(exc))
        raise
    interrupted = sigterm.interrupted(rt, trainer.state.global_step, trainer.state.max_steps)
    if interrupted is not None:
        raise interrupted  # no adapter, no summary: the run is not done
    metrics: dict[str, Any] = dict(result.metrics)
    resumed_step = int(resume.name.rsplit("-", 1)[1]) if resume else 0
    metrics["train_loss"] = checkpoints.run_mean_loss(
        trainer.state.log_history, resumed_step, metrics.get("train_loss"), trainer.state.global_step
    )
    if eval_set is not None:
        # With evalSteps the Trainer has already evaluated at the last step: not twice.
        last_eval = next((h for h in reversed(trainer.state.log_history) if "eval_loss" in h), None)
        if last_eval is not None and last_eval.get("step") == trainer.state.global_step:
            metrics["eval_loss"] = last_eval["eval_loss"]
        else:
            metrics.update(trainer.evaluate())

    adapter_dir = rt.output_dir / "adapter"
    merged_dir = rt.output_dir / "merged" if cfg.output.save_merged else None
    if rt.main:
        peft_model: Any = trainer.model
        peft_model.save_pretrained(adapter_dir)
        loaded.tokenizer.save_pretrained(adapter_dir)
        if merged_dir is not None:
            model.save_merged(cfg, model_path, adapter_dir, merged_dir, p)
            loaded.tokenizer.save_pretrained(merged_dir)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()  # no rank exits before the artifacts exist

    state = trainer.state
    losses = [h["loss"] for h in state.log_history if "loss" in h]
    summary = {
        "status": "Succeeded",
        "model": cfg.model.name,
        "device": device,
        "worldSize": rt.world_size,
        "precision": p.name,
        "quantization": loaded.quantization,
        "adapterDtype": str(adapters).removeprefix("torch."),
        "step": state.global_step,
        "totalSteps": state.max_steps,
        "epoch": state.epoch,
        "firstLoss": losses[0] if losses else None,
        "loss": losses[-1] if losses else None,
        "trainLoss": metrics.get("train_loss"),
        "evalLoss": metrics.get("eval_loss"),
        "samplesPerSecond": metrics.get("train_samples_per_second"),
        "runtimeSeconds": round(time.monotonic() - started, 2),
        "resumedFrom": str(resume) if resume else None,
        "adapter": str(adapter_dir),
        "merged": str(merged_dir) if merged_dir else None,
        "completedAt": now_iso(),
    }
    if rt.main:
        write_atomic(rt.output_dir / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
        progress = {**reporter.last, "step": state.global_step, "totalSteps": state.max_steps}
        termination_message({"status": "Succeeded", "progress": progress, "summary": summary}, rt.termination_log)
        reporter.emit("summary", summary)
    return summary
