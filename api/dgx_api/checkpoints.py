"""Which checkpoint to resume from: the newest *complete* one.

The HF Trainer writes ``checkpoint-<step>/`` file by file; a worker killed mid-save (a spot
reclaim) leaves a directory that looks like a checkpoint and is not one. After each save the
trainer drops a marker into the directory, written atomically; only marked directories count, here
and in the checkpoint uploader (`datasync watch`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from dgx_api.progress import COMPLETE_MARKER, now_iso, write_atomic

PATTERN = re.compile(r"^checkpoint-(\d+)$")


def mark_complete(checkpoint: Path, step: int) -> None:
    write_atomic(checkpoint / COMPLETE_MARKER, json.dumps({"step": step, "completedAt": now_iso()}) + "\n")


def is_complete(checkpoint: Path) -> bool:
    return (checkpoint / COMPLETE_MARKER).is_file()


def complete(output_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``output_dir``, oldest first."""
    if not output_dir.is_dir():
        return []
    found = []
    for child in output_dir.iterdir():
        match = PATTERN.match(child.name)
        if match and child.is_dir() and is_complete(child):
            found.append((int(match[1]), child))
    return sorted(found)


def latest_complete(output_dir: Path) -> Path | None:
    done = complete(output_dir)
    return done[-1][1] if done else None
