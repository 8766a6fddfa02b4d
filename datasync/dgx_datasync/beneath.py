"""Paths below a directory that someone else can write, reached without following a link.

The training container writes the directories datasync uploads from (checkpoints, the final model)
and can write those it downloads into (a pull's cache, the output directory a checkpoint is
restored to), and it is not trusted with the sync container's view of the file system. A link it
plants would otherwise make datasync read what the link points at (``checkpoint-5/x ->
/proc/self/environ`` uploads the sync container's store credentials) or write there
(``DEST/.kubedgx -> /elsewhere``).

So a path below a root is opened one component at a time, each relative to the descriptor of the
one before and with ``O_NOFOLLOW``, and what was opened is what is then read, written or renamed
in: a link that replaces a checked directory a moment later is not followed either. The root
itself is the caller's (a command-line argument, perhaps a hostPath mount point that is a link) and
is followed. Linux only: uploads hand fsspec ``/proc/self/fd/N``, which reopens the file a
descriptor holds rather than resolving a path again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

from dgx_datasync.errors import shown

_DIRECTORY: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
_READ: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class UnsafePathError(Exception):
    """``path`` is a symbolic link (or not a regular file) where datasync will not go."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        super().__init__(f"{shown(path)} is {what}")


def _is_link(folder: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _at(exc: OSError, path: Path) -> OSError:
    """``exc`` naming the whole path (an ``*at`` call names only the last component)."""
    return type(exc)(exc.errno, exc.strerror, str(path))


def open_dir(root: Path, parts: Sequence[str], *, create: bool = False) -> int:
    """A descriptor of ``root/parts...``; ``create`` makes what is missing, ``root`` included.

    Raises :class:`UnsafePathError` when a component is a link, OSError (naming the path) otherwise."""
    if create:
        root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for depth, part in enumerate(parts):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
            try:
                child = os.open(part, _DIRECTORY, dir_fd=fd)
            except OSError as exc:
                path = root.joinpath(*parts[: depth + 1])
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(fd, part):
                    raise UnsafePathError(path, "a symbolic link") from None
                raise _at(exc, path) from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def opened_dir(root: Path, parts: Sequence[str], *, create: bool = False) -> Iterator[int]:
    fd = open_dir(root, parts, create=create)
    try:
        yield fd
    finally:
        os.close(fd)


def open_file(root: Path, parts: Sequence[str]) -> int:
    """A read-only descriptor of the regular file ``root/parts...`` (:class:`UnsafePathError`: a link on
    the way, or not a regular file: a FIFO would block, a device is nobody's upload)."""
    path = root.joinpath(*parts)
    with opened_dir(root, parts[:-1]) as folder:
        try:
            fd = os.open(parts[-1], _READ, dir_fd=folder)
        except OSError as exc:
            if exc.errno == errno.ELOOP and _is_link(folder, parts[-1]):
                raise UnsafePathError(path, "a symbolic link") from None
            raise _at(exc, path) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePathError(path, "not a regular file")
    return fd


def read_fd(fd: int, limit: int | None = None) -> bytes:
    """What ``fd`` holds from its offset on, at most ``limit`` bytes (None: all)."""
    chunks = []
    left = limit
    while left is None or left > 0:
        chunk = os.read(fd, 2**20 if left is None else min(left, 2**20))
        if not chunk:
            break
        chunks.append(chunk)
        if left is not None:
            left -= len(chunk)
    return b"".join(chunks)


def fd_path(fd: int) -> str:
    """A path that opens the file ``fd`` holds, whatever is at its name now (for APIs that take
    paths: fsspec's ``put_file`` and ``get_file``)."""
    return f"/proc/self/fd/{fd}"


def write_atomic(folder: int, name: str, data: bytes) -> None:
    """Write-then-rename inside the directory ``folder``: readers never see half a file, and
    neither name is followed if it is a link (a link at ``name`` is replaced)."""
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=folder)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
        raise
