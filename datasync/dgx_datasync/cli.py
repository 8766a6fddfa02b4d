"""``python -m dgx_datasync``: the sync containers' entry point (docs/datasync.md).

Exit codes: 0 done; 2 a SyncError that retrying cannot fix (bad URI, credentials, bucket, access),
printed as exactly one ``datasync: <message>`` line; 1 anything else (transient errors once the
retries ran out, unexpected exceptions with their traceback). The result, or the error, also goes
to the termination message file as compact JSON, which the operator reads from the pod status.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dgx_api.progress import TERMINATION_LIMIT, write_termination
from dgx_datasync import logs, sync, trust
from dgx_datasync.errors import SyncError
from dgx_datasync.store import StoreOptions, list_source, parse_uri
from dgx_datasync.watch import watch

TERMINATION_ENV = "KUBEDGX_TERMINATION_LOG"
DEFAULT_TERMINATION = "/dev/termination-log"


def compact(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), default=str)


def fit_termination(result: dict[str, Any], limit: int = TERMINATION_LIMIT) -> str:
    """Whole JSON within ``limit`` bytes: the oldest checkpoint steps go first (their count stays),
    then long messages are shortened."""
    data = dict(result)
    text = compact(data)
    steps = list(data.get("checkpoints") or [])
    omitted = 0
    while len(text.encode("utf-8")) > limit and steps:
        drop = max(1, len(steps) // 4)
        steps, omitted = steps[drop:], omitted + drop
        data["checkpoints"], data["checkpointsOmitted"] = steps, omitted
        text = compact(data)
    if len(text.encode("utf-8")) > limit and isinstance(data.get("message"), str):
        data["message"] = data["message"][:1000] + "..."
        text = compact(data)
    if len(text.encode("utf-8")) > limit:
        text = compact({key: data[key] for key in ("error", "objects", "digest", "restored") if key in data})
    return text


def _options(args: argparse.Namespace) -> StoreOptions:
    return StoreOptions(endpoint_url=args.endpoint_url, region=args.region, ca_bundle=getattr(args, "ca_bundle", None))


def cmd_pull(args: argparse.Namespace) -> dict[str, Any]:
    return sync.pull(
        parse_uri(args.source),
        Path(args.dest),
        _options(args),
        include=args.include,
        exclude=args.exclude,
        expect_digest=args.expect_digest,
        reuse=args.reuse,
        workers=args.workers,
    )


def cmd_push(args: argparse.Namespace) -> dict[str, Any]:
    dest = parse_uri(args.dest)
    return sync.push(
        Path(args.source_dir), dest, _options(args), include=args.include, exclude=args.exclude, workers=args.workers
    )


def cmd_watch(args: argparse.Namespace) -> dict[str, Any]:
    dest = parse_uri(args.dest)
    archive = parse_uri(args.archive) if args.archive else None
    logs = parse_uri(args.logs) if args.logs else None
    return watch(
        Path(args.dir),
        dest,
        _options(args),
        interval=args.interval,
        archive=archive,
        archive_format=args.archive_format,
        once=args.once,
        workers=args.workers,
        checkpoints=not args.no_checkpoints,
        logs=logs,
    )


def cmd_restore(args: argparse.Namespace) -> dict[str, Any]:
    return sync.restore(parse_uri(args.dest), Path(args.dir), _options(args), workers=args.workers)


def cmd_list(args: argparse.Namespace) -> dict[str, Any]:
    listing = list_source(parse_uri(args.source), _options(args), include=args.include, exclude=args.exclude)
    return listing.summary()


def _check_trust(env: Mapping[str, str]) -> None:
    """A CA bundle that cannot be used is a mistake no retry fixes: exit 2 naming the variable."""
    pem = (env.get(trust.PEM_ENV) or "").strip()
    if pem:
        try:
            trust.certificates(pem)
        except ValueError as exc:
            raise SyncError("LocalError", f"{trust.PEM_ENV} {exc}") from None


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError("must be a number greater than 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--endpoint-url", help="S3-compatible endpoint (MinIO, Ceph RGW, ...); AWS when unset")
    common.add_argument("--region", help="S3 region")
    common.add_argument(
        "--workers", type=_positive_int, default=sync.DEFAULT_WORKERS, help="transfers in flight (default 8)"
    )
    common.add_argument("--log-format", choices=("text", "json"), default="text", help="stderr log lines")
    filters = argparse.ArgumentParser(add_help=False)
    filters.add_argument("--include", action="append", default=[], metavar="GLOB", help="keep only matching keys")
    filters.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="leave out matching keys")

    parser = argparse.ArgumentParser(
        prog="python -m dgx_datasync",
        description="Object storage (s3://, gs://) <-> local directories for kubedgx: data pulls, "
        "checkpoint upload and restore, final-model archive.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("pull", parents=[common, filters], help="mirror a prefix into a local directory")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("dest", metavar="DEST")
    p.add_argument("--expect-digest", metavar="D", help="the digest the DGXDataMount recorded")
    p.add_argument("--reuse", action="store_true", help="with --expect-digest: keep a verified local copy")
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("push", parents=[common, filters], help="upload a local directory to a prefix")
    p.add_argument("source_dir", metavar="SOURCE_DIR")
    p.add_argument("dest", metavar="DEST")
    p.set_defaults(func=cmd_push)

    p = sub.add_parser("watch", parents=[common], help="upload complete checkpoints as they appear")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("dest", metavar="DEST")
    p.add_argument("--interval", type=_positive_float, default=10.0, metavar="SECONDS", help="scan period (10)")
    p.add_argument("--archive", metavar="DEST2", help="upload the final model here once training succeeded")
    p.add_argument("--archive-format", choices=("files", "tar.gz"), default="files")
    p.add_argument("--once", action="store_true", help="one scan (and the archive if due), then exit")
    p.add_argument("--no-checkpoints", action="store_true", help="upload no checkpoints, only the archive (and --logs)")
    p.add_argument(
        "--logs",
        metavar="DEST3",
        help="also upload DIR/history/*.jsonl (the progress history) and DIR/runs/ (TensorBoard) here, as they change",
    )
    p.set_defaults(func=cmd_watch)

    p = sub.add_parser("restore", parents=[common], help="bring back the newest complete remote checkpoint")
    p.add_argument("dest", metavar="DEST")
    p.add_argument("dir", metavar="DIR")
    p.set_defaults(func=cmd_restore)

    p = sub.add_parser("list", parents=[common, filters], help="print a prefix's listing summary as JSON")
    p.add_argument("source", metavar="SOURCE")
    p.set_defaults(func=cmd_list)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "pull" and args.reuse and not args.expect_digest:
        parser.error("--reuse needs --expect-digest")
    logs.configure(args.log_format)
    termination = Path(os.environ.get(TERMINATION_ENV) or DEFAULT_TERMINATION)
    try:
        _check_trust(os.environ)
        # The private CAs the operator passed (the chart's caBundle), added to the default ones.
        with trust.bundle_for(os.environ) as args.ca_bundle:
            result = args.func(args)
    except SyncError as err:
        write_termination(fit_termination({"error": err.reason, "message": err.message}), termination)
        print(f"datasync: {err.message}", file=sys.stderr, flush=True)
        return 1 if err.transient else 2
    except KeyboardInterrupt:
        write_termination(compact({"error": "Interrupted", "message": "interrupted"}), termination)
        return 130
    except Exception as exc:
        message = " ".join(f"{type(exc).__name__}: {exc}".split())
        write_termination(fit_termination({"error": "Internal", "message": message}), termination)
        traceback.print_exc()
        return 1
    write_termination(fit_termination(result), termination)
    print(compact(result), flush=True)
    return 0
