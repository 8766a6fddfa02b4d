"""pull, push and restore: parallel, resumable copies between a prefix and a local directory.

Transfers run on a thread pool of ``workers``; each thread calls the synchronous fsspec API, which
runs the I/O on fsspec's own event loop, so ``workers`` is the number of requests in flight.

Local directories are walked and opened as :mod:`dgx_datasync.beneath` says: an upload skips a link
(and anything that is not a regular file) with a warning, a download refuses to write through one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

from dgx_api.checkpoints import PATTERN as CHECKPOINT_PATTERN
from dgx_api.progress import COMPLETE_MARKER
from dgx_datasync import beneath, local
from dgx_datasync.beneath import UnsafePathError
from dgx_datasync.errors import SyncError, shown
from dgx_datasync.logs import event
from dgx_datasync.store import (
    MAX_KEY,
    STATE_DIR,
    Listing,
    Location,
    RemoteObject,
    Store,
    StoreOptions,
    is_state_key,
    selected,
)

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_WORKERS: Final = 8
#: How often a pull lists again when objects change under it before giving up.
LIST_ATTEMPTS: Final = 3


def run_parallel(
    fn: Callable[[T], R], items: Iterable[T], workers: int, on_done: Callable[[R], None] | None = None
) -> None:
    """``fn`` over ``items`` on ``workers`` threads; the first exception cancels what has not started
    and is re-raised once the calls in flight have returned (none is abandoned half way).

    At most ``2 * workers`` calls are queued at a time, so a million objects do not become a million
    futures."""
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="datasync") as pool:
        pending: set[Future[R]] = set()

        def drain(block_until: int) -> None:
            nonlocal pending
            while len(pending) > block_until:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    result = future.result()
                    if on_done is not None:
                        on_done(result)

        try:
            for item in items:
                pending.add(pool.submit(fn, item))
                drain(2 * max(1, workers))
            drain(0)
        except BaseException:
            for future in pending:
                future.cancel()
            raise


@dataclass
class Progress:
    """A log line at most every ``every`` seconds, and one at the end."""

    what: str
    total: int
    total_bytes: int
    every: float = 5.0
    done: int = 0
    done_bytes: int = 0
    started: float = field(default_factory=time.monotonic)
    _last: float = field(default_factory=time.monotonic)

    def add(self, size: int) -> None:
        self.done += 1
        self.done_bytes += size
        now = time.monotonic()
        if now - self._last >= self.every:
            self._last = now
            event(
                logging.INFO,
                f"{self.what}: {self.done}/{self.total} objects",
                bytes=self.done_bytes,
                totalBytes=self.total_bytes,
            )

    def finish(self) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        event(
            logging.INFO,
            f"{self.what}: {self.done} objects transferred",
            bytes=self.done_bytes,
            seconds=round(elapsed, 3),
            mbPerSecond=round(self.done_bytes / elapsed / 1e6, 2),
        )


def mirror(
    store: Store,
    base: Location,
    objects: Sequence[RemoteObject],
    root: Path,
    journal: local.Journal,
    known: dict[str, tuple[int, str]],
    workers: int,
    what: str,
    sub: Sequence[str] = (),
) -> int:
    """Download the ``objects`` (keys relative to ``base``) into ``root/sub...`` unless already there;
    a file counts as there when its size matches and ``known`` (journal, manifest) has the same etag.
    Returns how many were transferred. Every key is checked before the first download."""
    local.check_collisions(o.key for o in objects)
    todo: list[tuple[RemoteObject, tuple[str, ...]]] = []
    for obj in objects:
        parts = (*sub, *local.key_parts(obj.key))
        if known.get(obj.key) == (obj.size, obj.etag) and local.regular_size(root.joinpath(*parts)) == obj.size:
            continue
        todo.append((obj, parts))
    if not todo:
        return 0
    local.refuse_links(root, {parts[:-1] for _, parts in todo})
    progress = Progress(what, len(todo), sum(o.size for o, _ in todo))

    def fetch(item: tuple[RemoteObject, tuple[str, ...]]) -> int:
        obj, parts = item
        target = root.joinpath(*parts)
        try:
            folder = beneath.open_dir(root, parts[:-1], create=True)
        except UnsafePathError as refused:
            raise local.refusal(refused) from None
        except OSError as exc:
            raise local.local_error(exc, "create a directory") from exc
        try:
            _fetch_into(folder, parts[-1], obj, lambda fd: store.download(base.child(obj.key), obj, fd), known, journal)
        except OSError as exc:
            if exc.filename is not None:
                raise local.local_error(exc, f"write {target}") from exc
            raise
        finally:
            os.close(folder)
        journal.record(obj.info())
        return obj.size

    run_parallel(fetch, todo, workers, progress.add)
    progress.finish()
    return len(todo)


def _fetch_into(
    folder: int,
    name: str,
    obj: RemoteObject,
    download: Callable[[int], None],
    known: dict[str, tuple[int, str]],
    journal: local.Journal,
) -> None:
    """Download to a partial file beside ``name`` in the directory ``folder``, then rename it over
    ``name`` (a link there is replaced, not followed)."""
    tmp = local.partial_name(name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o644, dir_fd=folder)
        try:
            download(fd)
        finally:
            os.close(fd)
        if obj.key in known:
            journal.replacing(obj.key)
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
        raise


def _known(state: local.StateDir) -> dict[str, tuple[int, str]]:
    """What the last complete pull (manifest) and the unfinished one since (journal) vouch for."""
    known: dict[str, tuple[int, str]] = {}
    manifest = local.read_manifest(state)
    if manifest is not None:
        known.update({o.key: (o.size, o.etag) for o in local.manifest_objects(manifest)})
    return local.Journal.read(state, local.JOURNAL, known)


def pull(
    source: Location,
    dest: Path,
    options: StoreOptions,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    expect_digest: str | None = None,
    reuse: bool = False,
    workers: int = DEFAULT_WORKERS,
) -> dict[str, Any]:
    """Mirror ``source`` into ``dest``; see docs/datasync.md for the resume and reuse rules.

    Local files that are not in the source are left alone: a pull never deletes."""
    with local.StateDir.open(dest) as state, local.exclusive(state):
        if reuse and expect_digest:
            reused = _reusable(dest, state, expect_digest)
            if reused is not None:
                return reused
        return _pull(source, dest, state, options, include, exclude, expect_digest, workers)


def _reusable(dest: Path, state: local.StateDir, expect_digest: str) -> dict[str, Any] | None:
    """The result of reusing ``dest`` as it is, or None (with a log line saying why not)."""
    manifest = local.read_manifest(state)
    if manifest is None:
        why: str | None = "there is no manifest"
    elif manifest.get("digest") != expect_digest:
        why = f"the local copy has digest {shown(manifest.get('digest'))}"
    elif local.Journal.pending(state, local.JOURNAL):
        why = "a pull into it did not finish"
    else:
        why = local.verify(dest, manifest)
    if why is not None:
        event(logging.INFO, f"not reusing the local copy: {why}")
        return None
    assert manifest is not None
    event(logging.INFO, "reusing the local copy: its manifest has the expected digest", digest=expect_digest)
    objects = local.manifest_objects(manifest)
    count = len(objects)
    return {
        "objects": count,
        "totalBytes": sum(o.size for o in objects),
        "digest": expect_digest,
        "transferred": 0,
        "skipped": count,
        "reused": True,
    }


def _pull(
    source: Location,
    dest: Path,
    state: local.StateDir,
    options: StoreOptions,
    include: Sequence[str],
    exclude: Sequence[str],
    expect_digest: str | None,
    workers: int,
) -> dict[str, Any]:
    try:
        removed = local.remove_partials(dest)
    except OSError as exc:
        raise local.local_error(exc, f"prepare {dest}") from exc
    store = Store(source, options)
    transferred = 0
    listing: Listing | None = None
    for attempt in range(1, LIST_ATTEMPTS + 1):
        remote = [o for o in store.list(source) if selected(o.key, include, exclude)]
        listing = Listing(source.uri, tuple(o.info() for o in remote))
        if attempt == 1:
            event(
                logging.INFO,
                f"listed {source.uri}",
                objects=len(remote),
                totalBytes=listing.total_bytes,
                digest=listing.digest,
                partialFilesRemoved=removed,
            )
            if expect_digest and listing.digest != expect_digest:
                event(
                    logging.WARNING,
                    "the source changed since the DGXDataMount was listed: pulling the current data",
                    expected=expect_digest,
                    current=listing.digest,
                )
        try:
            journal = local.Journal(state, local.JOURNAL)
        except OSError as exc:
            raise local.local_error(exc, "open the journal") from exc
        try:
            transferred += mirror(store, source, remote, dest, journal, _known(state), workers, f"pull {source.uri}")
        except SyncError as err:
            if err.reason != "SourceChanged" or attempt == LIST_ATTEMPTS:
                raise
            event(logging.WARNING, f"{err.message}; listing again", attempt=attempt)
            continue
        finally:
            journal.close()
        break
    assert listing is not None
    try:
        manifest = local.write_manifest(state, source.uri, listing.objects)
    except OSError as exc:
        raise local.local_error(exc, "write the manifest") from exc
    why = local.verify(dest, manifest)
    if why is not None:
        raise SyncError("LocalError", f"the pulled copy in {dest} does not verify: {why}")
    state.unlink(local.JOURNAL)  # the manifest now holds the same facts
    return {
        "objects": len(listing.objects),
        "totalBytes": listing.total_bytes,
        "digest": listing.digest,
        "transferred": transferred,
        "skipped": max(0, len(listing.objects) - transferred),
        "reused": False,
    }


@dataclass(frozen=True)
class LocalFile:
    """A regular file found under ``root``, to be opened again below it (:func:`open_upload`)."""

    key: str
    root: Path
    #: Below ``root``; none of them is followed when the file is opened.
    parts: tuple[str, ...]
    size: int

    @property
    def path(self) -> Path:
        return self.root.joinpath(*self.parts)


def skipped(path: Path, why: str) -> None:
    event(logging.WARNING, f"not uploading {shown(path)}: {why}")


def local_files(
    root: Path, include: Sequence[str] = (), exclude: Sequence[str] = (), *, sub: Sequence[str] = ()
) -> list[LocalFile]:
    """The regular files under ``root/sub...`` (keys relative to that), without our state and
    partial downloads. Links are not followed and are skipped with a warning, as is anything else
    that is not a regular file or whose name is not UTF-8 (an object name is text).

    ``root`` is followed; a link in ``sub`` raises :class:`UnsafePathError`."""
    try:
        top = beneath.open_dir(root, sub)
    except (NotADirectoryError, FileNotFoundError):
        raise SyncError("LocalError", f"{root.joinpath(*sub)} is not a directory: nothing to upload") from None
    out = []
    try:
        for folder, dirs, files, fd in os.fwalk(".", dir_fd=top):
            here = () if folder == "." else tuple(folder[2:].split("/"))
            base = root.joinpath(*sub, *here)
            keep = []
            for name in sorted(dirs):
                if name == STATE_DIR:
                    continue
                why = _unusable_dir(fd, name)
                if why is None:
                    keep.append(name)
                else:
                    skipped(base / name, why)
            dirs[:] = keep  # fwalk would not enter a link anyway; it would not say so either
            for name in sorted(files):
                key = "/".join((*here, name))
                if local.PARTIAL.match(name) or is_state_key(key):
                    continue
                if not _text(name):
                    skipped(base / name, "its name is not UTF-8, and an object key is")
                    continue
                if not selected(key, include, exclude):
                    continue
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISLNK(st.st_mode):
                    skipped(base / name, "it is a symbolic link, and datasync uploads no links")
                elif not stat.S_ISREG(st.st_mode):
                    skipped(base / name, "it is not a regular file")
                else:
                    out.append(LocalFile(key, root, (*sub, *here, name), st.st_size))
    finally:
        os.close(top)
    return out


def _text(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _unusable_dir(folder: int, name: str) -> str | None:
    if not _text(name):
        return "its name is not UTF-8, and an object key is"
    try:
        if stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
            return "it is a symbolic link (to a directory), and datasync uploads no links"
    except FileNotFoundError:
        pass
    return None


def send(store: Store, fd: int, loc: Location, remote: RemoteObject | None) -> int | None:
    """Upload the file ``fd`` to ``loc`` unless ``remote`` already holds its bytes; the size sent, or
    None when it was already there."""
    if store.same_content(remote, fd):
        return None
    store.upload(fd, loc)
    return os.fstat(fd).st_size


def upload_files(store: Store, dest: Location, files: Sequence[LocalFile], workers: int, what: str) -> int:
    """Upload ``files`` under ``dest``, skipping those whose remote copy has the same size and ETag
    (as computed for our part size), and those that became links since they were listed. Returns
    how many were sent."""
    remote = {o.key: o for o in store.list(dest)} if files else {}

    def one(item: LocalFile) -> int:
        loc = dest.child(item.key)
        if len(loc.prefix.encode("utf-8")) > MAX_KEY:
            skipped(item.path, f"its object key would be longer than the {MAX_KEY} bytes a store takes")
            return -1
        try:
            fd = beneath.open_file(item.root, item.parts)
        except UnsafePathError as refused:
            skipped(refused.path, f"it is {refused.what}")
            return -1
        try:
            size = send(store, fd, loc, remote.get(item.key))
        finally:
            os.close(fd)
        return -1 if size is None else size

    sent = Progress(what, len(files), sum(f.size for f in files))
    count = 0

    def done(size: int) -> None:
        nonlocal count
        if size >= 0:
            count += 1
            sent.add(size)

    run_parallel(one, files, workers, done)
    if count:
        sent.finish()
    return count


def push(
    source_dir: Path,
    dest: Location,
    options: StoreOptions,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    workers: int = DEFAULT_WORKERS,
) -> dict[str, Any]:
    """Upload a local directory to ``dest`` (``.kubedgx/`` left out); unchanged files are skipped."""
    files = local_files(source_dir, include, exclude)
    store = Store(dest, options)
    try:
        transferred = upload_files(store, dest, files, workers, f"push {dest.uri}")
    except FileNotFoundError as exc:
        if exc.filename is None:
            raise
        raise SyncError("LocalError", f"{exc.filename} disappeared during the upload: run the push again") from exc
    return {
        "objects": len(files),
        "totalBytes": sum(f.size for f in files),
        "transferred": transferred,
        "skipped": len(files) - transferred,
    }


def remote_checkpoints(objects: Iterable[RemoteObject]) -> dict[int, list[RemoteObject]]:
    """Objects grouped by ``checkpoint-<step>/``, keys made relative to that directory."""
    found: dict[int, list[RemoteObject]] = {}
    for obj in objects:
        top, _, rest = obj.key.partition("/")
        match = CHECKPOINT_PATTERN.match(top)
        if match and rest:
            found.setdefault(int(match[1]), []).append(RemoteObject(rest, obj.size, obj.etag, obj.checksum))
    return found


def restore(
    dest: Location, directory: Path, options: StoreOptions, *, workers: int = DEFAULT_WORKERS
) -> dict[str, Any]:
    """Bring the newest complete remote checkpoint into ``directory`` unless a local one is as new.

    The marker is written last, so the trainer sees the checkpoint complete only when it is."""
    store = Store(dest, options)
    groups = remote_checkpoints(store.list(dest))
    marked = sorted(step for step, objs in groups.items() if any(o.key == COMPLETE_MARKER for o in objs))
    if not marked:
        event(logging.INFO, f"no complete checkpoint under {dest.uri}")
        return {"restored": None}
    step = marked[-1]
    have, _ = local.own_checkpoints(directory)
    if have and have[-1][0] >= step:
        event(logging.INFO, f"checkpoint-{have[-1][0]} is already here; nothing to restore", remote=step)
        return {"restored": None}
    sub = (f"checkpoint-{step}",)
    target = directory.joinpath(*sub)
    base = dest.child(f"checkpoint-{step}")
    objects = groups[step]
    marker = [o for o in objects if o.key == COMPLETE_MARKER]
    files = [o for o in objects if o.key != COMPLETE_MARKER]
    journal_name = f"restore-{step}.jsonl"
    with local.StateDir.open(directory) as state:
        try:
            with beneath.opened_dir(directory, sub, create=True):
                pass
            local.remove_partials(directory, sub)
            journal = local.Journal(state, journal_name)
        except UnsafePathError as refused:
            raise local.refusal(refused) from None
        except OSError as exc:
            raise local.local_error(exc, f"prepare {target}") from exc
        try:
            known = local.Journal.read(state, journal_name)
            mirror(store, base, files, directory, journal, known, workers, f"restore checkpoint-{step}", sub)
            mirror(store, base, marker, directory, journal, {}, 1, f"restore checkpoint-{step} marker", sub)
        finally:
            journal.close()
        state.unlink(journal_name)
    local.remember_uploaded(directory, dest.uri, step)  # so the uploader does not send it back
    event(logging.INFO, f"restored checkpoint-{step} from {base.uri}", objects=len(objects))
    return {"restored": step}
