"""pull, push and restore: parallel, resumable copies between a prefix and a local directory.

Transfers run on a thread pool of ``workers``; each thread calls the synchronous fsspec API, which
runs the I/O on fsspec's own event loop, so ``workers`` is the number of requests in flight.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

from dgx_api.checkpoints import PATTERN as CHECKPOINT_PATTERN
from dgx_api.checkpoints import complete
from dgx_api.progress import COMPLETE_MARKER
from dgx_datasync import local
from dgx_datasync.errors import SyncError
from dgx_datasync.logs import event
from dgx_datasync.store import (
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


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size if path.is_file() else None
    except OSError:
        return None


def mirror(
    store: Store,
    base: Location,
    objects: Sequence[RemoteObject],
    dest: Path,
    journal: local.Journal,
    known: dict[str, tuple[int, str]],
    workers: int,
    what: str,
) -> int:
    """Download the ``objects`` (keys relative to ``base``) into ``dest`` unless already there; a file
    counts as there when its size matches and ``known`` (journal, manifest) has the same etag.
    Returns how many were transferred."""
    local.check_collisions(o.key for o in objects)
    todo: list[tuple[RemoteObject, Path]] = []
    for obj in objects:
        path = local.local_path(dest, obj.key)
        if known.get(obj.key) == (obj.size, obj.etag) and _size(path) == obj.size:
            continue
        todo.append((obj, path))
    if not todo:
        return 0
    progress = Progress(what, len(todo), sum(o.size for o, _ in todo))

    def fetch(item: tuple[RemoteObject, Path]) -> int:
        obj, target = item
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise local.local_error(exc, "create a directory") from exc
        tmp = local.partial_name(target)
        try:
            store.download(base.child(obj.key), obj, tmp)
            if obj.key in known:
                journal.replacing(obj.key)
            os.replace(tmp, target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.filename is not None:
                raise local.local_error(exc, f"write {target}") from exc
            raise
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        journal.record(obj.info())
        return obj.size

    run_parallel(fetch, todo, workers, progress.add)
    progress.finish()
    return len(todo)


def _known(state: Path) -> dict[str, tuple[int, str]]:
    """What the last complete pull (manifest) and the unfinished one since (journal) vouch for."""
    known: dict[str, tuple[int, str]] = {}
    manifest = local.read_manifest(state / local.MANIFEST)
    if manifest is not None:
        known.update({o.key: (o.size, o.etag) for o in local.manifest_objects(manifest)})
    return local.Journal.read(state / local.JOURNAL, known)


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
    with local.exclusive(dest):
        if reuse and expect_digest:
            reused = _reusable(dest, expect_digest)
            if reused is not None:
                return reused
        return _pull(source, dest, options, include, exclude, expect_digest, workers)


def _reusable(dest: Path, expect_digest: str) -> dict[str, Any] | None:
    """The result of reusing ``dest`` as it is, or None (with a log line saying why not)."""
    state = dest / STATE_DIR
    manifest = local.read_manifest(state / local.MANIFEST)
    if manifest is None:
        why: str | None = "there is no manifest"
    elif manifest.get("digest") != expect_digest:
        why = f"the local copy has digest {manifest.get('digest')}"
    elif local.Journal.pending(state / local.JOURNAL):
        why = "a pull into it did not finish"
    else:
        why = local.verify(dest, manifest)
    if why is not None:
        event(logging.INFO, f"not reusing the local copy: {why}")
        return None
    assert manifest is not None
    event(logging.INFO, "reusing the local copy: its manifest has the expected digest", digest=expect_digest)
    count = len(manifest.get("objects") or [])
    return {
        "objects": count,
        "totalBytes": int(manifest.get("totalBytes") or 0),
        "digest": expect_digest,
        "transferred": 0,
        "skipped": count,
        "reused": True,
    }


def _pull(
    source: Location,
    dest: Path,
    options: StoreOptions,
    include: Sequence[str],
    exclude: Sequence[str],
    expect_digest: str | None,
    workers: int,
) -> dict[str, Any]:
    state = dest / STATE_DIR
    try:
        removed = local.remove_partials(dest)
    except OSError as exc:
        raise local.local_error(exc, f"prepare {dest}") from exc
    store = Store(source, options)
    journal_path = state / local.JOURNAL
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
            journal = local.Journal(journal_path)
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
        manifest = local.write_manifest(dest, source.uri, listing.objects)
    except OSError as exc:
        raise local.local_error(exc, "write the manifest") from exc
    why = local.verify(dest, manifest)
    if why is not None:
        raise SyncError("LocalError", f"the pulled copy in {dest} does not verify: {why}")
    journal_path.unlink(missing_ok=True)  # the manifest now holds the same facts
    return {
        "objects": len(listing.objects),
        "totalBytes": listing.total_bytes,
        "digest": listing.digest,
        "transferred": transferred,
        "skipped": max(0, len(listing.objects) - transferred),
        "reused": False,
    }


def local_files(root: Path, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> list[tuple[str, Path]]:
    """(key, path) of the regular files under ``root``, without our state and partial downloads."""
    if not root.is_dir():
        raise SyncError("LocalError", f"{root} is not a directory: nothing to upload")
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != STATE_DIR)
        for name in sorted(files):
            path = Path(folder, name)
            key = path.relative_to(root).as_posix()
            if local.PARTIAL.match(name) or is_state_key(key) or not path.is_file():
                continue
            if selected(key, include, exclude):
                out.append((key, path))
    return out


def upload_files(store: Store, dest: Location, files: Sequence[tuple[str, Path]], workers: int, what: str) -> int:
    """Upload ``files`` under ``dest``, skipping those whose remote copy has the same size and ETag
    (as computed for our part size). Returns how many were sent."""
    remote = {o.key: o for o in store.list(dest)} if files else {}

    def send(item: tuple[str, Path]) -> int:
        key, path = item
        if store.same_content(remote.get(key), path):
            return -1
        store.upload(path, dest.child(key))
        return path.stat().st_size

    sent = Progress(what, len(files), sum(p.stat().st_size for _, p in files))
    count = 0

    def done(size: int) -> None:
        nonlocal count
        if size >= 0:
            count += 1
            sent.add(size)

    run_parallel(send, files, workers, done)
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
        "totalBytes": sum(p.stat().st_size for _, p in files),
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
    have = complete(directory)
    if have and have[-1][0] >= step:
        event(logging.INFO, f"checkpoint-{have[-1][0]} is already here; nothing to restore", remote=step)
        return {"restored": None}
    target = directory / f"checkpoint-{step}"
    base = dest.child(f"checkpoint-{step}")
    objects = groups[step]
    marker = [o for o in objects if o.key == COMPLETE_MARKER]
    files = [o for o in objects if o.key != COMPLETE_MARKER]
    journal_path = directory / STATE_DIR / f"restore-{step}.jsonl"
    try:
        target.mkdir(parents=True, exist_ok=True)
        local.remove_partials(target)
        journal = local.Journal(journal_path)
    except OSError as exc:
        raise local.local_error(exc, f"prepare {target}") from exc
    try:
        known = local.Journal.read(journal_path)
        mirror(store, base, files, target, journal, known, workers, f"restore checkpoint-{step}")
        mirror(store, base, marker, target, journal, {}, 1, f"restore checkpoint-{step} marker")
    finally:
        journal.close()
    journal_path.unlink(missing_ok=True)
    local.remember_uploaded(directory, dest.uri, step)  # so the uploader does not send it back
    event(logging.INFO, f"restored checkpoint-{step} from {base.uri}", objects=len(objects))
    return {"restored": step}
