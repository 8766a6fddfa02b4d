"""The local side: where objects land, and the small files that make a sync resumable.

Layout of a pulled directory::

    DEST/<key>                       the objects, at their relative keys
    DEST/.kubedgx/journal.jsonl      one {"key","size","etag"} line per object completed by a pull
                                     that has not finished yet (emptied once the manifest is written)
    DEST/.kubedgx/manifest.json      written when a pull is complete and verified
    DEST/.kubedgx/lock               flock'ed by the pull in progress

Files are downloaded to ``.<name>.kubedgx-partial-<random>`` beside their final name and renamed
into place, so a file at its final name is always whole; a journal line is appended only after the
rename, and before a file that an earlier record vouched for is overwritten, a ``replacing`` line
withdraws that record. A pull killed at any moment therefore leaves whole files (some not yet
journalled, which are fetched again), partial files (removed by the next pull) and records that
name only files whose content they describe.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import secrets
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from dgx_api.progress import now_iso, write_atomic
from dgx_datasync.errors import SyncError
from dgx_datasync.logs import event
from dgx_datasync.store import STATE_DIR, ObjectInfo, listing_digest

PARTIAL = re.compile(r"^\..+\.kubedgx-partial-[0-9a-f]{12}$")
JOURNAL: Final = "journal.jsonl"
MANIFEST: Final = "manifest.json"
MANIFEST_VERSION: Final = 1
#: The checkpoint uploader's record, in the trainer's output directory.
UPLOADED: Final = "uploaded.json"
LOCK: Final = "lock"


def local_error(exc: OSError, what: str) -> SyncError:
    reason = exc.strerror or type(exc).__name__
    where = exc.filename or what
    return SyncError("LocalError", f"cannot {what} ({where}: {reason}): check the local volume's space and permissions")


@contextlib.contextmanager
def exclusive(dest: Path) -> Iterator[None]:
    """One pull at a time into ``dest``: two pods on one node may pull the same mount into the same
    hostPath cache. The second waits, then finds the files there and skips them. (flock: local
    file systems; a shared network volume may not honour it.)"""
    state = dest / STATE_DIR
    try:
        state.mkdir(parents=True, exist_ok=True)
        fd = os.open(state / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise local_error(exc, f"prepare {dest}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            event(logging.INFO, f"another pull into {dest} is running; waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def partial_name(target: Path) -> Path:
    return target.with_name(f".{target.name}.kubedgx-partial-{secrets.token_hex(6)}")


def remove_partials(root: Path) -> int:
    """Delete partial downloads left by a killed run; returns how many."""
    removed = 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != STATE_DIR]
        for name in files:
            if PARTIAL.match(name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(folder, name))
                    removed += 1
    return removed


def local_path(root: Path, key: str) -> Path:
    """Where ``key`` goes under ``root``; keys that cannot be a relative file path are refused."""
    parts = key.split("/")
    if any(p in {"", ".", ".."} for p in parts) or "\x00" in key or PARTIAL.match(parts[-1]):
        raise SyncError(
            "LocalError", f"object key {key!r} cannot be stored as a local file: leave it out with spec.exclude"
        )
    return root.joinpath(*parts)


def check_collisions(keys: Iterable[str]) -> None:
    """An object ``a`` and an object ``a/b`` cannot both be files on a local disk."""
    present = set(keys)
    for key in present:
        parts = key.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent in present:
                raise SyncError(
                    "LocalError",
                    f"object {parent!r} and object {key!r} cannot both exist locally (a file and a directory of "
                    "the same name): leave one out with spec.exclude",
                )


class Journal:
    """Append-only record of completed files, safe to call from many threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def record(self, obj: ObjectInfo) -> None:
        """``obj`` is at its final name, whole."""
        self._write({"key": obj.key, "size": obj.size, "etag": obj.etag})

    def replacing(self, key: str) -> None:
        """``key``'s file is about to be overwritten: until its ``record`` line, nothing recorded
        earlier (here or in a manifest) vouches for the file at that name."""
        self._write({"key": key, "replacing": True})

    def _write(self, item: dict[str, Any]) -> None:
        line = json.dumps(item, separators=(",", ":")) + "\n"
        with self._lock:
            # One write() of one line with O_APPEND: a kill cannot leave half of it behind.
            os.write(self._fd, line.encode("utf-8"))

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def clear(self) -> None:
        """Drop the records once a manifest holds the same facts."""
        with self._lock:
            os.ftruncate(self._fd, 0)

    @staticmethod
    def read(path: Path, known: Mapping[str, tuple[int, str]] | None = None) -> dict[str, tuple[int, str]]:
        """Apply the journal at ``path`` to ``known`` (key -> (size, etag), e.g. from a manifest) and
        return it: completions add, ``replacing`` lines remove. Unreadable lines are ignored (a
        conservative reading: the file is fetched again)."""
        known = dict(known or {})
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return known
        for line in text.splitlines():
            with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
                item = json.loads(line)
                if item.get("replacing"):
                    known.pop(str(item["key"]), None)
                else:
                    known[str(item["key"])] = (int(item["size"]), str(item["etag"]))
        return known

    @staticmethod
    def pending(path: Path) -> bool:
        """Whether a pull that did not finish left records (its files may differ from the manifest)."""
        try:
            return path.stat().st_size > 0
        except FileNotFoundError:
            return False


def read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("version") == MANIFEST_VERSION else None


def manifest_objects(manifest: Mapping[str, Any]) -> list[ObjectInfo]:
    out = []
    for item in manifest.get("objects") or []:
        with contextlib.suppress(ValueError, TypeError, KeyError):
            out.append(ObjectInfo(str(item["key"]), int(item["size"]), str(item["etag"])))
    return out


def write_manifest(dest: Path, source: str, objects: tuple[ObjectInfo, ...]) -> dict[str, Any]:
    manifest = {
        "version": MANIFEST_VERSION,
        "source": source,
        "digest": listing_digest(objects),
        "totalBytes": sum(o.size for o in objects),
        "objects": [{"key": o.key, "size": o.size, "etag": o.etag} for o in objects],
        "completedAt": now_iso(),
    }
    write_atomic(dest / STATE_DIR / MANIFEST, json.dumps(manifest, separators=(",", ":")) + "\n")
    return manifest


def verify(dest: Path, manifest: Mapping[str, Any]) -> str | None:
    """Why the manifest does not describe ``dest`` (``None``: it does): every object is present
    with its size, and the digest recomputes from the objects listed."""
    objects = manifest_objects(manifest)
    if len(objects) != len(manifest.get("objects") or []):
        return "the manifest has malformed entries"
    if listing_digest(objects) != manifest.get("digest"):
        return "the manifest's digest does not match its objects"
    for obj in objects:
        try:
            size = local_path(dest, obj.key).stat().st_size
        except (OSError, SyncError):
            return f"{obj.key} is missing"
        if size != obj.size:
            return f"{obj.key} has {size} bytes, the manifest says {obj.size}"
    return None


def load_uploaded(directory: Path, destination: str) -> dict[str, Any]:
    """What the checkpoint uploader sent from ``directory`` to ``destination`` (a URI); a record about
    another destination counts as nothing uploaded."""
    fresh: dict[str, Any] = {"version": 1, "destination": destination, "checkpoints": [], "archive": None}
    try:
        data = json.loads((directory / STATE_DIR / UPLOADED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return fresh
    if not isinstance(data, dict) or data.get("destination") != destination:
        return fresh
    steps = data.get("checkpoints")
    if isinstance(steps, list):
        fresh["checkpoints"] = sorted({s for s in steps if isinstance(s, int)})
    if isinstance(data.get("archive"), dict):
        fresh["archive"] = data["archive"]
    return fresh


def save_uploaded(directory: Path, state: Mapping[str, Any]) -> None:
    write_atomic(directory / STATE_DIR / UPLOADED, json.dumps(state, indent=2) + "\n")


def remember_uploaded(directory: Path, destination: str, step: int) -> None:
    """Record checkpoint ``step`` as present at ``destination`` (restore: it came from there)."""
    state = load_uploaded(directory, destination)
    state["checkpoints"] = sorted({*state["checkpoints"], step})
    save_uploaded(directory, state)
