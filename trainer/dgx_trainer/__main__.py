"""`python -m dgx_trainer --config FILE`: the trainer image's entry point, run under torchrun.

The config is validated before torch is imported, so a bad config fails in a fraction of a second
with every problem named, instead of after a ten-second import. Exit codes: 0 done, 1 crashed,
2 invalid config, 3 the node does not match the job (preflight).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path

from dgx_api.progress import write_termination
from dgx_api.trainer_config import ConfigError, load_config


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dgx_trainer", description=__doc__)
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
    except (ConfigError, OSError) as exc:
        print(f"dgx_trainer: {exc}", file=sys.stderr)
        _terminate(f"invalid trainer config: {exc}")
        return 2

    from dgx_trainer import train
    from dgx_trainer.preflight import PreflightError

    runtime = train.Runtime.from_env(cfg, Path(args.base_dir), args.output_dir)
    try:
        train.run(cfg, runtime)
    except ConfigError as exc:
        print(f"dgx_trainer: {exc}", file=sys.stderr)
        _terminate(f"invalid trainer config: {exc}")
        return 2
    except PreflightError as exc:
        log.error("preflight: %s", exc)
        _terminate(f"preflight: {exc}")
        return 3
    except Exception as exc:
        log.exception("training failed")
        _terminate(f"{type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
