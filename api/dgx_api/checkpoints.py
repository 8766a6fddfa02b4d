"""Which checkpoint to resume from: the newest *complete* one that every node has.

The HF Trainer writes ``checkpoint-<step>/`` file by file; a worker killed mid-save (a spot
reclaim) leaves a directory that looks like a checkpoint and is not one. After each save the
trainer drops a marker into the directory, written atomically; only marked directories count, here
and in the checkpoint uploader (`datasync watch`).

Each node (pod) has its own output directory, so after a failure the nodes may disagree: one was
killed before its newest save finished, another was rescheduled and got only what the Out mount
restored. Every rank of the group must resume from the same step (a rank at step N and another at
0 wait for each other forever), so the group resumes from :func:`agree`'s step: the newest one
every rank has complete.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from dgx_api.progress import COMPLETE_MARKER, now_iso, write_atomic

PATTERN = re.compile(r"^checkpoint-(\d+)$")


def mark_complete(checkpoint: Path, step: int, *, upload: bool = True) -> None:
    """Mark ``checkpoint`` whole. ``upload`` says whether this node's checkpoint uploader should
    send it to an Out mount: every node keeps (and marks) a whole copy to resume from, but the
    copies are the same, so one node, the one global rank 0 ran on, sends it; N nodes writing the
    same keys at once would cost N times the egress and race each other's markers."""
    record = {"step": step, "completedAt": now_iso(), "upload": upload}
    write_atomic(checkpoint / COMPLETE_MARKER, json.dumps(record) + "\n")


def for_upload(checkpoint: Path) -> bool:
    """Whether the checkpoint's marker asks for an upload: yes unless it says ``"upload": false``
    (markers written before the flag existed, and unreadable ones, are uploaded as before)."""
    try:
        record = json.loads((checkpoint / COMPLETE_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True
    return not (isinstance(record, dict) and record.get("upload") is False)


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


def unmark(checkpoint: Path) -> None:
    """Make ``checkpoint`` incomplete again: the group resumes from an older step, so this one
    will be written anew, file by file, and a crash during that rewrite must not leave a marked
    mixture of the two."""
    (checkpoint / COMPLETE_MARKER).unlink(missing_ok=True)


def agree(steps_per_rank: Sequence[Iterable[int]]) -> int | None:
    """The step the whole group resumes from: the newest one of which every rank can read a
    complete checkpoint, ``None`` (all from scratch) when there is none they share.

    Each rank contributes the steps complete in its own output directory (including those restored
    from an Out mount). The newest common step, not each rank's newest, because a rank without
    that checkpoint cannot load it; and never a mix of resumed and fresh ranks, whose step counts
    differ and whose collectives would never match up.
    """
    if not steps_per_rank:
        return None
    common = set(steps_per_rank[0]).intersection(*steps_per_rank[1:])
    return max(common) if common else None


def run_mean_loss(
    log_history: Sequence[Mapping[str, object]], resumed_step: int, call_mean: float | None, final_step: int
) -> float | None:
    """The mean training loss over the whole run, for a run that resumed at ``resumed_step``.

    The HF Trainer's ``train_loss`` (``call_mean``) averages only the steps of this ``train()`` call:
    the running total is not in a checkpoint. The steps before the resume are in the checkpoint's
    ``log_history`` though, one entry per logging window, with its mean loss; a window's length is
    the entry's ``lossSteps`` where the trainer stamped it (a window after an earlier resume is
    shorter than the distance to the entry before), else the distance to the entry before. Without
    a resume this is ``call_mean`` itself. Steps run after the last log before the resume were
    never logged and are lost with the crashed process; with ``loggingSteps`` dividing
    ``saveSteps`` there are none.
    """
    total = 0.0
    counted = 0
    previous = 0
    for entry in log_history:
        step, loss = entry.get("step"), entry.get("loss")
        if not isinstance(step, int) or not isinstance(loss, (int, float)) or step > resumed_step:
            continue
        window = entry.get("lossSteps")
        steps = window if isinstance(window, int) and window > 0 else step - previous
        previous = step
        total += float(loss) * steps
        counted += steps
    ran = final_step - resumed_step
    if call_mean is not None and ran > 0:
        total += call_mean * ran
        counted += ran
    return total / counted if counted else call_mean
