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

Nothing here follows a link inside DEST (see :mod:`dgx_datasync.beneath`): the state directory is
held open as a descriptor and every state file is opened relative to it, so a ``.kubedgx`` (or a
``lock``, ``journal.jsonl``, ...) that is a link is refused, not written through.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import secrets
import stat
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from dgx_api.checkpoints import complete
from dgx_api.progress import COMPLETE_MARKER, now_iso
from dgx_datasync import beneath
from dgx_datasync.beneath import UnsafePathError
from dgx_datasync.errors import SyncError, shown
from dgx_datasync.logs import event
from dgx_datasync.store import STATE_DIR, ObjectInfo, listing_digest

PARTIAL = re.compile(r"^\..+\.kubedgx-partial-[0-9a-f]{12}$")
JOURNAL: Final = "journal.jsonl"
MANIFEST: Final = "manifest.json"
MANIFEST_VERSION: Final = 1
#: The checkpoint uploader's record, in the trainer's output directory.
UPLOADED: Final = "uploaded.json"
LOCK: Final = "lock"
#: The longest file name (one path component) Linux file systems take, in bytes.
NAME_MAX: Final = 255


def local_error(exc: OSError, what: str) -> SyncError:
    reason = exc.strerror or type(exc).__name__
    where = exc.filename or what
    return SyncError("LocalError", f"cannot {what} ({where}: {reason}): check the local volume's space and permissions")


def refusal(refused: UnsafePathError) -> SyncError:
    """Writing through a link would write outside the directory: no retry fixes that, a person does."""
    return SyncError(
        "LocalError",
        f"{shown(refused.path)} is {refused.what}, and datasync does not write through links inside the "
        "directories it fills: remove it and run again (the directory given on the command line may itself "
        "be a link)",
    )


class StateDir:
    """``<root>/.kubedgx`` held open: every state file is opened relative to this descriptor, so a
    link at ``.kubedgx`` or at a state file never sends the lock, journal or manifest elsewhere."""

    def __init__(self, root: Path, fd: int) -> None:
        self.root = root
        self.path = root / STATE_DIR
        self.fd = fd

    @classmethod
    def open(cls, root: Path) -> StateDir:
        """Created (with ``root``) when missing."""
        found = cls._open(root, create=True)
        assert found is not None
        return found

    @classmethod
    def find(cls, root: Path) -> StateDir | None:
        """None when there is none yet; nothing is created."""
        return cls._open(root, create=False)

    @classmethod
    def _open(cls, root: Path, *, create: bool) -> StateDir | None:
        try:
            return cls(root, beneath.open_dir(root, [STATE_DIR], create=create))
        except UnsafePathError as refused:
            raise refusal(refused) from None
        except FileNotFoundError as exc:
            if not create:
                return None
            raise local_error(exc, f"prepare {root / STATE_DIR}") from exc
        except OSError as exc:
            raise local_error(exc, f"prepare {root / STATE_DIR}") from exc

    def __enter__(self) -> StateDir:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def open_file(self, name: str, flags: int, mode: int = 0o644) -> int:
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise refusal(UnsafePathError(self.path / name, "a symbolic link")) from None
            raise type(exc)(exc.errno, exc.strerror, str(self.path / name)) from None

    def read(self, name: str) -> bytes | None:
        """The regular file ``name``; None when it is missing, a link or anything else."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.fd)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return beneath.read_fd(fd)
        except OSError:
            return None
        finally:
            os.close(fd)

    def read_json(self, name: str) -> Any:
        """The JSON in ``name``; None when there is none that parses (the training container may
        have written anything there)."""
        return parse_json(self.read(name))

    def write_atomic(self, name: str, text: str) -> None:
        beneath.write_atomic(self.fd, name, text.encode("utf-8"))

    def unlink(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)

    def size(self, name: str) -> int:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_size
        except FileNotFoundError:
            return 0

    def scratch(self, name: str) -> int:
        """A new file of our own, read-write, already unlinked: nothing else can open, replace or
        leave it behind (the tarball before its upload)."""
        tmp = f".{name}.{secrets.token_hex(6)}"
        fd = self.open_file(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.unlink(tmp, dir_fd=self.fd)
        return fd


def parse_json(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


@contextlib.contextmanager
def exclusive(state: StateDir) -> Iterator[None]:
    """One pull at a time into a directory: two pods on one node may pull the same mount into the
    same hostPath cache. The second waits, then finds the files there and skips them. (flock: local
    file systems; a shared network volume may not honour it.)"""
    try:
        fd = state.open_file(LOCK, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        raise local_error(exc, f"prepare {state.root}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            event(logging.INFO, f"another pull into {state.root} is running; waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def partial_name(name: str) -> str:
    """Where ``name`` is downloaded to before the rename: beside it, hidden, recognisably ours, and
    within NAME_MAX (the name part is shortened; the random part keeps it unique)."""
    suffix = f".kubedgx-partial-{secrets.token_hex(6)}"
    room = NAME_MAX - 1 - len(suffix)
    head = name.encode("utf-8", "surrogateescape")[:room].decode("utf-8", "ignore")
    return f".{head or '_'}{suffix}"


def remove_partials(root: Path, parts: Sequence[str] = ()) -> int:
    """Delete partial downloads a killed run left under ``root/parts...``; returns how many.

    Raises :class:`UnsafePathError` when ``parts`` crosses a link; links below are not entered."""
    removed = 0
    with beneath.opened_dir(root, parts) as top:
        for _, dirs, files, folder in os.fwalk(".", dir_fd=top):
            dirs[:] = [d for d in dirs if d != STATE_DIR]
            for name in files:
                if PARTIAL.match(name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=folder)
                        removed += 1
    return removed


def key_parts(key: str) -> list[str]:
    """The path components ``key`` becomes locally; keys that cannot be a relative file path are
    refused, before anything is downloaded."""
    parts = key.split("/")
    if any(p in {"", ".", ".."} for p in parts) or "\x00" in key or PARTIAL.match(parts[-1]):
        raise SyncError(
            "LocalError", f"object key {key!r} cannot be stored as a local file: leave it out with spec.exclude"
        )
    for part in parts:
        size = len(part.encode("utf-8", "surrogatepass"))
        if size > NAME_MAX:
            raise SyncError(
                "LocalError",
                f"object key {key!r} has a path component of {size} bytes, and a local file name can have at most "
                f"{NAME_MAX}: leave it out with spec.exclude",
            )
    if parts[-1] == STATE_DIR:
        raise SyncError(
            "LocalError",
            f"object key {key!r} would be a file named {STATE_DIR}, the name datasync keeps for its own state: "
            "leave it out with spec.exclude",
        )
    return parts


def local_path(root: Path, key: str) -> Path:
    """Where ``key`` goes under ``root`` (see :func:`key_parts`)."""
    return root.joinpath(*key_parts(key))


def regular_size(path: Path) -> int | None:
    """The size of the regular file at ``path`` (a link there is not one), else None."""
    try:
        st = os.lstat(path)
    except (OSError, ValueError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def refuse_links(root: Path, folders: Iterable[Sequence[str]]) -> None:
    """Fail before the first download when a directory downloads go to is a link (each download
    refuses it anyway, but only after others went through)."""
    seen: set[tuple[str, ...]] = set()
    for folder in folders:
        for depth in range(1, len(folder) + 1):
            prefix = tuple(folder[:depth])
            if prefix in seen:
                continue
            seen.add(prefix)
            path = root.joinpath(*prefix)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                break  # missing: created by the download, which checks as it goes
            if stat.S_ISLNK(mode):
                raise refusal(UnsafePathError(path, "a symbolic link"))


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

    def __init__(self, state: StateDir, name: str = JOURNAL) -> None:
        self.path = state.path / name
        self._lock = threading.Lock()
        self._fd = state.open_file(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

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
    def read(
        state: StateDir, name: str = JOURNAL, known: Mapping[str, tuple[int, str]] | None = None
    ) -> dict[str, tuple[int, str]]:
        """Apply the journal ``name`` to ``known`` (key -> (size, etag), e.g. from a manifest) and
        return it: completions add, ``replacing`` lines remove. Unreadable lines are ignored (a
        conservative reading: the file is fetched again)."""
        known = dict(known or {})
        data = state.read(name)
        if data is None:
            return known
        for line in data.decode("utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError, RecursionError):
                item = json.loads(line)
                if item.get("replacing"):
                    known.pop(str(item["key"]), None)
                else:
                    known[str(item["key"])] = (int(item["size"]), str(item["etag"]))
        return known

    @staticmethod
    def pending(state: StateDir, name: str = JOURNAL) -> bool:
        """Whether a pull that did not finish left records (its files may differ from the manifest)."""
        return state.size(name) > 0


def read_manifest(state: StateDir) -> dict[str, Any] | None:
    data = state.read_json(MANIFEST)
    return data if isinstance(data, dict) and data.get("version") == MANIFEST_VERSION else None


def manifest_objects(manifest: Mapping[str, Any]) -> list[ObjectInfo]:
    items = manifest.get("objects")
    out = []
    for item in items if isinstance(items, list) else []:
        with contextlib.suppress(ValueError, TypeError, KeyError):
            out.append(ObjectInfo(str(item["key"]), int(item["size"]), str(item["etag"])))
    return out


def write_manifest(state: StateDir, source: str, objects: tuple[ObjectInfo, ...]) -> dict[str, Any]:
    manifest = {
        "version": MANIFEST_VERSION,
        "source": source,
        "digest": listing_digest(objects),
        "totalBytes": sum(o.size for o in objects),
        "objects": [{"key": o.key, "size": o.size, "etag": o.etag} for o in objects],
        "completedAt": now_iso(),
    }
    state.write_atomic(MANIFEST, json.dumps(manifest, separators=(",", ":")) + "\n")
    return manifest


def verify(dest: Path, manifest: Mapping[str, Any]) -> str | None:
    """Why the manifest does not describe ``dest`` (``None``: it does): every object is present
    as a regular file with its size, and the digest recomputes from the objects listed."""
    objects = manifest_objects(manifest)
    listed = manifest.get("objects")
    if not isinstance(listed, list) or len(objects) != len(listed):
        return "the manifest has malformed entries"
    if listing_digest(objects) != manifest.get("digest"):
        return "the manifest's digest does not match its objects"
    for obj in objects:
        try:
            size = regular_size(local_path(dest, obj.key))
        except SyncError:
            size = None
        if size is None:
            return f"{shown(obj.key)} is missing"
        if size != obj.size:
            return f"{shown(obj.key)} has {size} bytes, the manifest says {obj.size}"
    return None


def load_uploaded(directory: Path, destination: str) -> dict[str, Any]:
    """What the checkpoint uploader sent from ``directory`` to ``destination`` (a URI); a record about
    another destination counts as nothing uploaded. A ``.kubedgx`` that is a link is refused."""
    fresh: dict[str, Any] = {"version": 1, "destination": destination, "checkpoints": [], "archive": None}
    state = StateDir.find(directory)
    if state is None:
        return fresh
    with state:
        data = state.read_json(UPLOADED)
    if not isinstance(data, dict) or data.get("destination") != destination:
        return fresh
    steps = data.get("checkpoints")
    if isinstance(steps, list):
        fresh["checkpoints"] = sorted({s for s in steps if isinstance(s, int) and not isinstance(s, bool)})
    if isinstance(data.get("archive"), dict):
        fresh["archive"] = data["archive"]
    return fresh


def save_uploaded(directory: Path, state: Mapping[str, Any]) -> None:
    try:
        with StateDir.open(directory) as folder:
            folder.write_atomic(UPLOADED, json.dumps(state, indent=2) + "\n")
    except OSError as exc:
        raise local_error(exc, f"record the upload in {directory / STATE_DIR / UPLOADED}") from exc


def remember_uploaded(directory: Path, destination: str, step: int) -> None:
    """Record checkpoint ``step`` as present at ``destination`` (restore: it came from there)."""
    state = load_uploaded(directory, destination)
    state["checkpoints"] = sorted({*state["checkpoints"], step})
    save_uploaded(directory, state)


def own_checkpoints(directory: Path) -> tuple[list[tuple[int, Path]], list[Path]]:
    """The complete checkpoints in ``directory`` (oldest first) that are its own, and the links that
    disqualify the others: a checkpoint directory or marker that is a link is somebody else's."""
    kept: list[tuple[int, Path]] = []
    linked: list[Path] = []
    for step, path in complete(directory):
        link = next((p for p in (path, path / COMPLETE_MARKER) if p.is_symlink()), None)
        if link is None:
            kept.append((step, path))
        else:
            linked.append(link)
    return kept, linked
