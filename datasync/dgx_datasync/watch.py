"""The checkpoint uploader: a native sidecar beside the trainer.

Every ``interval`` it uploads the complete checkpoints (``checkpoint-<step>/`` holding the trainer's
marker) that are not remote yet, oldest first, each with its files first and the marker last, so a
remote checkpoint is complete exactly when its marker exists. An unmarked directory is never
touched: it may be half written.

When the trainer has succeeded (``summary.json`` says so) and an archive destination is given, it
uploads the final artifacts once and exits: the job's work is done. SIGTERM (the kubelet stopping
the sidecar after the trainer exits) lets the checkpoint upload in flight finish, then does the
archive if it is due, then exits 0; it starts no other checkpoint.

What was uploaded is remembered in ``DIR/.kubedgx/uploaded.json`` (and a checkpoint whose marker is
already remote counts as uploaded), so a restarted sidecar does not upload anything twice.

DIR is the trainer's, and the trainer is not trusted with the sidecar's view of the file system:
nothing below DIR is read through a link (:mod:`dgx_datasync.beneath`). A link inside a checkpoint
or the model is skipped with a warning; a checkpoint directory, marker, ``adapter/`` or ``merged/``
that is a link is not uploaded at all (a warning says so, once); a ``summary.json`` that is a link
is not the training's summary, so nothing is archived.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import random
import signal
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, Final, Literal, TypeVar

from dgx_api import checkpoints
from dgx_api.progress import COMPLETE_MARKER
from dgx_datasync import beneath, local, sync
from dgx_datasync.beneath import UnsafePathError
from dgx_datasync.errors import SyncError, shown
from dgx_datasync.logs import event
from dgx_datasync.store import Location, Store, StoreOptions

T = TypeVar("T")

SUMMARY: Final = "summary.json"
#: The trainer's summary is a few kilobytes; a file far larger is not one.
SUMMARY_LIMIT: Final = 16 * 2**20
ARTIFACTS: Final = ("adapter", "merged")
ArchiveFormat = Literal["files", "tar.gz"]


@dataclass
class Watcher:
    """Uploads DIR's complete checkpoints to ``dest`` and, once training succeeded, the model to
    ``archive``; :meth:`run` until done, a stop request or ``once`` (see the module docstring)."""

    directory: Path
    dest: Location
    options: StoreOptions
    interval: float = 10.0
    archive: Location | None = None
    archive_format: ArchiveFormat = "files"
    once: bool = False
    workers: int = sync.DEFAULT_WORKERS
    #: False: archive only (a mount with syncCheckpoints: false); DEST is then not written.
    checkpoints: bool = True
    retry_base: float = 1.0
    retry_max: float = 60.0

    def __post_init__(self) -> None:
        self.stop = threading.Event()
        #: Links already warned about: the sidecar scans every interval and says it once.
        self.warned: set[Path] = set()
        self.state = local.load_uploaded(self.directory, self.dest.uri)
        self.store = Store(self.dest, self.options)
        self.archive_store = Store(self.archive, self.options) if self.archive is not None else None
        # --once gives up on a store that stays unreachable; the sidecar retries for as long as it runs.
        self.max_attempts: int | None = 4 if self.once else None

    # -- control -----------------------------------------------------------------------------------

    def request_stop(self, signum: int, frame: FrameType | None = None) -> None:
        if not self.stop.is_set():
            event(
                logging.INFO,
                f"{signal.Signals(signum).name}: finishing the upload in flight, then stopping",
            )
        self.stop.set()

    def run(self) -> dict[str, Any]:
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self.request_stop)
        try:
            return self._run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run(self) -> dict[str, Any]:
        if self.checkpoints:
            check = partial(self.store.check_writable, self.dest)
            self._retrying(check, f"check {self.dest.uri}", interruptible=True)
        if self.archive is not None and self.archive_store is not None:
            store, target = self.archive_store, self.archive
            self._retrying(lambda: store.check_writable(target), f"check {target.uri}", interruptible=True)
        event(
            logging.INFO,
            f"watching {self.directory}",
            checkpoints=self.dest.uri if self.checkpoints else None,
            archive=self.archive.uri if self.archive else None,
        )
        while True:
            self.scan()
            summary = self.summary() if self.archive is not None else None
            if self.archive is not None and summary is not None:
                if not self._archived():
                    archive = partial(self.do_archive, summary)
                    self._retrying(archive, f"archive to {self.archive.uri}", interruptible=False)
                event(logging.INFO, "training succeeded and the model is archived: done")
                return self.result()
            if self.once or self.stop.is_set():
                return self.result()
            self.stop.wait(self.interval)

    def summary(self) -> bytes | None:
        """summary.json's bytes when it says the training succeeded. Read once and through no link:
        these bytes are what the archive holds."""
        try:
            fd = beneath.open_file(self.directory, [SUMMARY])
        except UnsafePathError as refused:
            self._warn_once(refused.path, f"not archiving: {shown(refused.path)} is {refused.what}")
            return None
        except OSError:
            return None
        try:
            data = beneath.read_fd(fd, SUMMARY_LIMIT + 1)
        except OSError:
            return None
        finally:
            os.close(fd)
        parsed = local.parse_json(data) if len(data) <= SUMMARY_LIMIT else None
        return data if isinstance(parsed, dict) and parsed.get("status") == "Succeeded" else None

    def _warn_once(self, path: Path, message: str) -> None:
        if path not in self.warned:
            self.warned.add(path)
            event(logging.WARNING, message)

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {"checkpoints": list(self.state["checkpoints"])}
        if self._archived():
            out["artifacts"] = list(self.state["archive"].get("artifacts") or [])
        return out

    def _retrying(self, fn: Callable[[], T], what: str, *, interruptible: bool) -> T:
        """``fn`` again after transient errors, 1 s doubling to 60 s, jittered. A stop request ends
        an interruptible wait (re-raising the error); work in flight keeps retrying."""
        delay = self.retry_base
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except SyncError as err:
                if not err.transient:
                    raise
                if (self.max_attempts is not None and attempt >= self.max_attempts) or (
                    interruptible and self.stop.is_set()
                ):
                    raise
                pause = delay * random.uniform(0.5, 1.0)
                event(logging.WARNING, f"{what} failed, retrying in {pause:.1f}s: {err.message}", attempt=attempt)
                if interruptible:
                    if self.stop.wait(pause):
                        raise
                else:
                    time.sleep(pause)
                delay = min(delay * 2, self.retry_max)

    # -- checkpoints -------------------------------------------------------------------------------

    def scan(self) -> None:
        """Upload every complete checkpoint not uploaded yet, oldest first, until a stop request."""
        if not self.checkpoints:
            return
        found, linked = local.own_checkpoints(self.directory)
        for link in linked:
            self._warn_once(link, f"not uploading {shown(link)}: it is a symbolic link, and datasync uploads no links")
        for step, path in found:
            if self.stop.is_set():
                return
            if step in self.state["checkpoints"]:
                continue
            if not checkpoints.for_upload(path):
                continue  # another node of the job uploads this step (the one global rank 0 ran on)
            marker = self.dest.child(f"checkpoint-{step}", COMPLETE_MARKER)
            remote = self._retrying(partial(self.store.head, marker), f"check {marker.uri}", interruptible=True)
            if remote is not None:
                event(logging.INFO, f"checkpoint-{step} is already at {self.dest.uri}")
                self._remember(step)
                continue
            upload = partial(self.upload_checkpoint, step, path)
            if self._retrying(upload, f"upload checkpoint-{step}", interruptible=False):
                self._remember(step)

    def _remember(self, step: int) -> None:
        self.state["checkpoints"] = sorted({*self.state["checkpoints"], step})
        local.save_uploaded(self.directory, self.state)

    def upload_checkpoint(self, step: int, path: Path) -> bool:
        """Files, then the marker. False when the trainer deleted the checkpoint meanwhile."""
        base = self.dest.child(f"checkpoint-{step}")
        sub = (path.name,)
        started = time.monotonic()
        try:
            try:
                files = [f for f in sync.local_files(self.directory, sub=sub) if f.key != COMPLETE_MARKER]
                sync.upload_files(self.store, base, files, self.workers, f"upload checkpoint-{step}")
                marker = beneath.open_file(self.directory, (*sub, COMPLETE_MARKER))
            except UnsafePathError as refused:  # replaced by a link since the scan
                event(logging.WARNING, f"not uploading checkpoint-{step}: {refused}")
                self._remove_remote(base)
                return False
            try:
                self.store.upload(marker, base.child(COMPLETE_MARKER))
            finally:
                os.close(marker)
        except (OSError, SyncError) as exc:
            if path.is_dir() and (path / COMPLETE_MARKER).is_file():
                raise
            event(
                logging.INFO,
                f"checkpoint-{step} was deleted before it was uploaded (save_total_limit); skipped",
                error=str(exc),
            )
            self._remove_remote(base)
            return False
        size = sum(f.size for f in files)
        event(
            logging.INFO,
            f"uploaded checkpoint-{step}",
            destination=base.uri,
            files=len(files) + 1,
            bytes=size,
            seconds=round(time.monotonic() - started, 3),
        )
        return True

    def _remove_remote(self, base: Location) -> None:
        """Best effort: without its marker a remote checkpoint is ignored anyway; this saves space."""
        with contextlib.suppress(SyncError, OSError):
            objects = self.store.list(base)
            self.store.delete([base.child(o.key) for o in objects])

    # -- archive -----------------------------------------------------------------------------------

    def _archived(self) -> bool:
        record = self.state.get("archive")
        return (
            self.archive is not None
            and isinstance(record, dict)
            and record.get("destination") == self.archive.uri
            and record.get("format") == self.archive_format
        )

    def _artifacts(self) -> list[str]:
        """adapter/ and merged/ where they are directories of DIR's own (a link is warned about)."""
        parts = []
        for name in ARTIFACTS:
            path = self.directory / name
            if path.is_symlink():
                event(
                    logging.WARNING,
                    f"not archiving {shown(path)}: it is a symbolic link, and datasync uploads no links",
                )
            elif path.is_dir():
                parts.append(name)
            elif name == "adapter":
                event(logging.WARNING, f"training succeeded but {path} is missing")
        return parts

    def _files(self, name: str) -> list[sync.LocalFile]:
        try:
            return sync.local_files(self.directory, sub=(name,))
        except UnsafePathError as refused:  # replaced by a link since it was looked at
            event(logging.WARNING, f"not archiving {name}: {refused}")
            return []

    def do_archive(self, summary: bytes) -> None:
        """adapter/, merged/ (if any) and ``summary`` (summary.json's bytes) to the archive
        destination, summary last."""
        assert self.archive is not None
        assert self.archive_store is not None
        archive, store = self.archive, self.archive_store
        parts = self._artifacts()
        artifacts: list[dict[str, str]] = []
        started = time.monotonic()
        if self.archive_format == "files":
            for name in parts:
                files = self._files(name)
                sync.upload_files(store, archive.child(name), files, self.workers, f"archive {name}")
                artifacts.append({"name": name, "uri": archive.child(name).uri + "/"})
        else:
            target = archive.child("model.tar.gz")
            tarball = self._make_tarball(parts, summary)
            try:
                sync.send(store, tarball, target, store.head(target))
            finally:
                os.close(tarball)
            artifacts.append({"name": "model.tar.gz", "uri": target.uri})
        store.put_bytes(archive.child(SUMMARY), summary)
        artifacts.append({"name": "summary", "uri": archive.child(SUMMARY).uri})
        self.state["archive"] = {"destination": archive.uri, "format": self.archive_format, "artifacts": artifacts}
        local.save_uploaded(self.directory, self.state)
        event(
            logging.INFO,
            f"archived the model to {archive.uri}",
            format=self.archive_format,
            seconds=round(time.monotonic() - started, 3),
        )

    def _make_tarball(self, parts: list[str], summary: bytes) -> int:
        """adapter/, merged/ and summary.json in one gzip tarball (level 1: weights barely compress),
        in an unlinked file under DIR/.kubedgx (returned open): the trainer can neither swap it for
        a link before the upload nor find it left behind. Regular files only: tarfile.add would
        store a link as a link, and read through one swapped in between its lstat and its open."""
        with local.StateDir.open(self.directory) as state:
            fd = state.scratch("model.tar.gz")
        try:
            with (
                os.fdopen(os.dup(fd), "wb") as raw,
                tarfile.open(fileobj=raw, mode="w:gz", compresslevel=1, dereference=True) as tar,
            ):
                for name in parts:
                    for item in self._files(name):
                        try:
                            member = beneath.open_file(item.root, item.parts)
                        except UnsafePathError as refused:
                            sync.skipped(refused.path, f"it is {refused.what}")
                            continue
                        with os.fdopen(member, "rb") as f:
                            tar.addfile(tar.gettarinfo(arcname=f"{name}/{item.key}", fileobj=f), f)
                info = tarfile.TarInfo(SUMMARY)
                info.size, info.mtime, info.mode = len(summary), int(time.time()), 0o644
                tar.addfile(info, io.BytesIO(summary))
        except BaseException:
            os.close(fd)
            raise
        return fd


def watch(
    directory: Path,
    dest: Location,
    options: StoreOptions,
    *,
    interval: float = 10.0,
    archive: Location | None = None,
    archive_format: ArchiveFormat = "files",
    once: bool = False,
    workers: int = sync.DEFAULT_WORKERS,
    checkpoints: bool = True,
) -> dict[str, Any]:
    return Watcher(
        directory,
        dest,
        options,
        interval=interval,
        archive=archive,
        archive_format=archive_format,
        once=once,
        workers=workers,
        checkpoints=checkpoints,
    ).run()
