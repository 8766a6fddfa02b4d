"""`python -m dgx_trainer [launch] --config FILE`: the trainer image's entry point.

``launch`` is the pod's command: it checks the config, the node, the model, the data and the
memory estimate once (:mod:`dgx_trainer.launch`), then execs torchrun, whose workers run the plain
form. The config is validated before torch is imported, so a bad config fails in a fraction of a
second with every problem named, instead of after a ten-second import. Exit codes: 0 done,
1 crashed, 2 invalid config, data or model (do not retry), 3 the node does not match the job
(preflight), 4 the loss diverged (training.stopOnNonFiniteLoss; do not retry), 5 CUDA out of
memory (the termination message names the settings to lower), 143 stopped by SIGTERM (128 + 15)
after saving a checkpoint of the current step to resume from (a worker's code; torchrun, itself
signalled, exits 1, so the termination message ``Interrupted: ...`` is what tells the two apart).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path

from dgx_api.progress import write_termination
from dgx_api.trainer_config import ConfigError, TrainerConfig, load_config


def _setup_logging() -> None:
    rank = int(os.environ.get("RANK", "0"))
    level = os.environ.get("KUBEDGX_LOG_LEVEL", "INFO" if rank == 0 else "WARNING").upper()
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, level, logging.INFO),
        format=f"%(asctime)s %(levelname)s [rank {rank}] %(name)s: %(message)s",
    )
    for noisy in ("httpx", "urllib3", "filelock", "datasets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # bitsandbytes suggests installing `kernels` (a hub download) at import: not for us.
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    # Library deprecation notices and per-map progress bars drown the lines an operator needs.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")


def _terminate(message: str) -> None:
    """The failure as the pod's termination message, so `kubectl describe` and the job's
    condition show the reason rather than a truncated traceback."""
    path = os.environ.get("KUBEDGX_TERMINATION_LOG", "/dev/termination-log")
    write_termination(message, Path(path) if path else None)


def _out_of_memory(exc: BaseException, cfg: TrainerConfig, rank: int) -> str | None:
    """The termination message for a CUDA out-of-memory error, with the settings that lower the
    memory a rank needs and their values now; None for any other error. torch raises
    ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError`` is the same class); some older
    code paths (extensions, bitsandbytes) raise a plain RuntimeError with torch's text. The first
    word is for the operator, as ``LossDiverged`` and ``Interrupted`` are."""
    import torch

    text = str(exc).strip()
    if not isinstance(exc, torch.OutOfMemoryError) and not (
        isinstance(exc, RuntimeError) and "CUDA out of memory" in text
    ):
        return None
    t = cfg.training
    checkpointing = (
        "training.gradientCheckpointing is already on"
        if t.gradient_checkpointing
        else "turn on training.gradientCheckpointing (now off)"
    )
    return (
        f"OutOfMemory: CUDA out of memory on rank {rank} ({text.splitlines()[0] if text else 'no details'}); "
        f"lower training.perDeviceBatchSize (now {t.per_device_batch_size}) or training.maxSeqLength "
        f"(now {t.max_seq_length}), {checkpointing}"
    )


def _invalid(exc: ConfigError, config: str) -> int:
    """Report a config error once: on stderr, and as the termination message. Its text already
    starts with "<source>: invalid trainer config:"; errors found after loading (source "trainer
    config") are re-anchored at the config file, so every report names the file the same way."""
    if exc.source != config:
        exc = ConfigError(config, exc.problems)
    print(f"dgx_trainer: {exc}", file=sys.stderr)
    _terminate(str(exc))
    return 2


def _launch(cfg: TrainerConfig, args: argparse.Namespace, torchrun_options: list[str]) -> int:
    """The pre-launch checks, then torchrun in this process's place (no return on success)."""
    from dgx_trainer import launch
    from dgx_trainer.preflight import PreflightError

    log = logging.getLogger("dgx_trainer")
    try:
        problems = launch.check(cfg, Path(args.base_dir), dict(os.environ))
    except PreflightError as exc:
        log.error("preflight: %s", exc)
        _terminate(f"preflight: {exc}")
        return 3
    except ConfigError as exc:
        problems = list(exc.problems)
    if problems:
        return _invalid(ConfigError(args.config, problems), args.config)
    worker = ["--config", args.config, "--base-dir", args.base_dir]
    if args.output_dir:
        worker += ["--output-dir", args.output_dir]
    command = launch.torchrun_command(worker, torchrun_options)
    log.info("pre-launch checks passed: starting %s", " ".join(command[1:]))
    launch.exec_torchrun(command)
    return 1  # not reached: exec replaced this process


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    launching = argv[:1] == ["launch"]
    torchrun_options: list[str] = []
    if launching:
        argv = argv[1:]
        if "--" in argv:
            cut = argv.index("--")
            argv, torchrun_options = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m dgx_trainer launch" if launching else "python -m dgx_trainer",
        description=__doc__,
        allow_abbrev=False,
        epilog=(
            "launch [OPTIONS] [-- TORCHRUN OPTIONS]: check once, then exec torchrun (torchrun reads PET_* "
            "variables; options after -- are passed to it)"
        ),
    )
    parser.add_argument(
        "--config",
        default=os.environ.get("KUBEDGX_TRAINER_CONFIG"),
        help="trainer config YAML/JSON (default: $KUBEDGX_TRAINER_CONFIG)",
    )
    parser.add_argument("--output-dir", help="override output.dir")
    parser.add_argument(
        "--base-dir",
        default=os.getcwd(),
        help="directory relative paths in the config are resolved against (default: the working directory)",
    )
    args = parser.parse_args(argv)
    if not args.config:
        parser.error("--config is required (or set KUBEDGX_TRAINER_CONFIG)")
    _setup_logging()
    log = logging.getLogger("dgx_trainer")
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        return _invalid(exc, args.config)
    except OSError as exc:
        message = f"{args.config}: cannot read the trainer config: {exc.strerror or exc}"
        print(f"dgx_trainer: {message}", file=sys.stderr)
        _terminate(message)
        return 2
    if launching:
        return _launch(cfg, args, torchrun_options)

    from dgx_trainer import train
    from dgx_trainer.preflight import PreflightError

    runtime = train.Runtime.from_env(cfg, Path(args.base_dir), args.output_dir)
    try:
        train.run(cfg, runtime)
    except ConfigError as exc:
        return _invalid(exc, args.config)
    except PreflightError as exc:
        log.error("preflight: %s", exc)
        _terminate(f"preflight: {exc}")
        return 3
    except train.LossDivergedError as exc:
        log.error("LossDiverged: %s", exc)
        _terminate(f"LossDiverged: {exc}")
        return 4
    except train.InterruptedBySignal as exc:
        log.warning("Interrupted: %s", exc)
        # One message per pod (its node's first process: local ranks share the file). Every pod
        # of the group stopped, and the operator reads each pod's own: a reclaimed node's worker is
        # rarely global rank 0, and without it the pod's message would be torchrun's traceback.
        if runtime.local_rank == 0:
            _terminate(f"Interrupted: {exc}")
        return 143
    except train.RepeatedOutOfMemoryError as exc:
        log.error("%s", exc)
        _terminate(str(exc))
        return 5
    except Exception as exc:
        oom = _out_of_memory(exc, cfg, runtime.rank)
        if oom is not None:
            log.error("%s", oom, exc_info=exc)
            _terminate(oom)
            # torchrun's restarts of the group (maxRestarts) would load the model and run out again.
            train.mark_out_of_memory(runtime, cfg, oom)
            return 5
        log.exception("training failed")
        _terminate(f"{type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
