"""The checkpoint uploader: a native sidecar beside the trainer.

Every ``interval`` it uploads the complete checkpoints (``checkpoint-<step>/`` holding the trainer's
marker) that are not remote yet, oldest first, each with its files first and the marker last, so a
remote checkpoint is complete exactly when its marker exists. An unmarked directory is never
touched: it may be half written.

When the trainer has succeeded (``summary.json`` says so) and an archive destination is given, it
uploads the final artifacts once and exits: the job's work is done.

SIGTERM or SIGINT (a stop request) comes from the kubelet when the pod is deleted or its node
reclaimed, and for a native sidecar only after the trainer has exited, which it does after saving a
final checkpoint. So the newest checkpoint is the one the replacement pod must resume from, and
this pod's grace period is all the time left to send it. On a stop request the watcher:

1. finishes the checkpoint upload in flight, if any (a half-sent checkpoint helps nobody, and its
   files may already be most of the way);
2. looks once more and uploads the *newest* complete checkpoint if it is not remote yet, files
   first and marker last as always; the older ones not remote yet are left (logged as skipped):
   they would spend the grace period on checkpoints nobody resumes from;
3. does the archive if it is due;
4. exits 0.

A second signal changes nothing (it is logged): the final upload is what the pod is waiting for,
and the kubelet's SIGKILL at the end of the grace period is the deadline anyway. From the stop
request on, each transfer gets :attr:`Watcher.stop_attempts` attempts against a store that fails
transiently (a retry wait under way is cut short, and the next waits are short); when they run
out, the watcher logs which checkpoints (and archive) it did not upload and exits 1 with an
Unreachable termination message, rather than retrying until a SIGKILL that says nothing.

Skipping the older checkpoints cannot mislead a resume. ``restore`` brings back only the newest
remote checkpoint that has its marker, so a remote gap below it is never looked at; a node whose
newest complete step is older (a fresh one, or one whose own final save did not complete) restores
it, so the nodes have it and :func:`dgx_api.checkpoints.agree` picks it. Should the final upload
fail, the remote newest is what it would have been without this pass (the last one uploaded while
the trainer ran; a half-sent checkpoint has no marker and is ignored), which is where the pod
resumed from before as well. The skipped steps are not remembered as uploaded, so a sidecar that later finds
them again in the same directory uploads them then, oldest first: they are whole and older than
the newest remote one, which ``restore`` keeps preferring.

With ``logs`` (``--logs``), each scan, and the final pass of a stop or of a done archive, also
uploads the run's logs: the progress history ``DIR/history/*.jsonl`` (the trainer appends to it,
see :mod:`dgx_api.history`) to ``<logs>/history/<name>`` and TensorBoard's event files
``DIR/runs/**`` to ``<logs>/runs/<path>``, each file whose size or modification time changed since
this watcher last sent it, whole (they are small, and an object cannot be appended to). They come
after the checkpoints of the pass, get one attempt each pass, and a failure is logged and tried
again at the next scan: logs are a record of the run, never a reason to fail it or to keep a
checkpoint waiting. What was sent is remembered in memory only, so a restarted sidecar sends each
log file once more.

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
import stat
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
from dgx_api.progress import COMPLETE_MARKER, HISTORY_DIR
from dgx_datasync import beneath, local, sync
from dgx_datasync.beneath import UnsafePathError
from dgx_datasync.errors import SyncError, shown
from dgx_datasync.logs import event
from dgx_datasync.store import MAX_KEY, Location, Store, StoreOptions

T = TypeVar("T")

SUMMARY: Final = "summary.json"
#: The trainer's summary is a few kilobytes; a file far larger is not one.
SUMMARY_LIMIT: Final = 16 * 2**20
ARTIFACTS: Final = ("adapter", "merged")
#: TensorBoard's event files under the trainer's output (dgx_trainer.tracking).
RUNS_DIR: Final = "runs"
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
    #: Attempts each transfer gets from a stop request on (the same budget as ``--once``): the pod
    #: has only its grace period left, and giving up first lets the sidecar say what it did not send.
    stop_attempts: int = 4
    #: The wait before the first retry after a stop request, doubling: seconds, not the usual minute.
    stop_retry_base: float = 1.0
    #: Where the history and TensorBoard logs go (``--logs``); None: they are not uploaded.
    logs: Location | None = None

    def __post_init__(self) -> None:
        self.stop = threading.Event()
        #: The checkpoint being sent: a give-up names it.
        self.sending: int | None = None
        #: Links already warned about: the sidecar scans every interval and says it once.
        self.warned: set[Path] = set()
        self.state = local.load_uploaded(self.directory, self.dest.uri)
        self.store = Store(self.dest, self.options)
        self.archive_store = Store(self.archive, self.options) if self.archive is not None else None
        self.logs_store = Store(self.logs, self.options) if self.logs is not None else None
        #: (size, mtime_ns) of each log file (by its key below ``logs``) when it was last sent.
        self.logs_sent: dict[str, tuple[int, int]] = {}
        # --once gives up on a store that stays unreachable; the sidecar retries for as long as it runs.
        self.max_attempts: int | None = 4 if self.once else None

    # -- control -----------------------------------------------------------------------------------

    def request_stop(self, signum: int, frame: FrameType | None = None) -> None:
        """The signal handler. A repeated signal only says so: it must not cut the final upload short
        (the kubelet's SIGKILL at the end of the grace period does that if it comes to it)."""
        name = signal.Signals(signum).name
        if not self.stop.is_set():
            event(
                logging.INFO,
                f"{name}: finishing the upload in flight and sending the newest checkpoint, then stopping",
            )
        else:
            event(logging.INFO, f"{name} again: still finishing the uploads of the stop")
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
        try:
            return self._watch()
        except SyncError as err:
            if not (err.transient and self.stop.is_set()):
                raise
            raise self._gave_up(err) from err

    def _watch(self) -> dict[str, Any]:
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
            logs=self.logs.uri if self.logs else None,
        )
        while True:
            self.scan()
            # Read once: a stop request arriving after this point is seen on the next round (the
            # wait below returns at once), so no stop skips the final checkpoint.
            stopping = self.stop.is_set()
            if stopping:
                self.final_checkpoint()
            self.upload_logs()  # after the checkpoints: a log never keeps one waiting
            summary = self.summary() if self.archive is not None else None
            if self.archive is not None and summary is not None:
                if not self._archived():
                    archive = partial(self.do_archive, summary)
                    self._retrying(archive, f"archive to {self.archive.uri}", interruptible=False)
                self.upload_logs()  # whatever the trainer wrote until it exited
                event(logging.INFO, "training succeeded and the model is archived: done")
                return self.result()
            if self.once or stopping:
                return self.result()
            self.stop.wait(self.interval)

    def _gave_up(self, err: SyncError) -> SyncError:
        """After a stop request the store failed ``stop_attempts`` times: say what is not uploaded,
        in a log line and in the error the termination message carries. The pod is going away, so
        this is the last word anybody gets from this sidecar about its uploads."""
        missing: list[str] = []
        if self.sending is not None and self.sending not in self.state["checkpoints"]:
            missing.append(f"checkpoint-{self.sending}")
        newest = self._newest()
        if newest is not None and f"checkpoint-{newest[0]}" not in missing:
            missing.append(f"checkpoint-{newest[0]}")
        if self.archive is not None and not self._archived() and self.summary() is not None:
            missing.append(f"the archive ({self.archive.uri})")
        what = ", ".join(missing) if missing else "nothing was pending"
        event(
            logging.ERROR,
            f"stopping without uploading {what}: the store still failed after {self.stop_attempts} attempts",
            error=err.message,
        )
        return SyncError(err.reason, f"stopped before uploading {what}: {err.message}", transient=True)

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
        an interruptible wait (re-raising the error); work in flight keeps retrying, but a stop
        request cuts its wait short and leaves it ``stop_attempts`` attempts, ``stop_retry_base``
        apart and doubling: the pod's grace period is running out, and a wait of a minute between
        attempts would spend it on sleeping."""
        delay = self.retry_base
        attempt = 0
        since_stop = 0  # attempts begun after the stop request
        while True:
            attempt += 1
            if self.stop.is_set():
                since_stop += 1
            try:
                return fn()
            except SyncError as err:
                if not err.transient:
                    raise
                stopping = self.stop.is_set()
                if (
                    (self.max_attempts is not None and attempt >= self.max_attempts)
                    or (interruptible and stopping)
                    or since_stop >= self.stop_attempts
                ):
                    raise
                if stopping:
                    pause = self.stop_retry_base * 2 ** max(since_stop - 1, 0) * random.uniform(0.5, 1.0)
                else:
                    pause = delay * random.uniform(0.5, 1.0)
                    delay = min(delay * 2, self.retry_max)
                event(logging.WARNING, f"{what} failed, retrying in {pause:.1f}s: {err.message}", attempt=attempt)
                if stopping:
                    time.sleep(pause)  # a further signal does not shorten it: nothing is waited for
                elif self.stop.wait(pause) and interruptible:
                    raise

    # -- checkpoints -------------------------------------------------------------------------------

    def scan(self) -> None:
        """Upload every complete checkpoint not uploaded yet, oldest first, until a stop request."""
        if not self.checkpoints:
            return
        for step, path in self._own():
            if self.stop.is_set():
                return
            if not self._send(step, path, final=False):
                return

    def final_checkpoint(self) -> None:
        """After a stop request: the newest complete checkpoint, if it is not remote yet, and no
        other (why, and why that cannot mislead a resume: the module docstring)."""
        newest = self._newest()
        if newest is None:
            return
        step, path = newest
        skipped = [
            s for s, p in self._own() if s < step and s not in self.state["checkpoints"] and checkpoints.for_upload(p)
        ]
        if skipped:
            event(
                logging.INFO,
                f"stopping: sending the newest checkpoint, checkpoint-{step}, and not the older ones not uploaded yet",
                skipped=skipped,
            )
        self._send(step, path, final=True)

    def _own(self) -> list[tuple[int, Path]]:
        """DIR's complete checkpoints, oldest first, without those that are links (warned once)."""
        found, linked = local.own_checkpoints(self.directory)
        for link in linked:
            self._warn_once(link, f"not uploading {shown(link)}: it is a symbolic link, and datasync uploads no links")
        return found

    def _newest(self) -> tuple[int, Path] | None:
        """The newest complete checkpoint when it is this node's to upload and not uploaded yet.
        Only the newest counts: an older one is no use to a resume once a newer one is whole here."""
        if not self.checkpoints:
            return None
        found = self._own()
        if not found:
            return None
        step, path = found[-1]
        if step in self.state["checkpoints"] or not checkpoints.for_upload(path):
            return None  # uploaded already, or another node's to send (the one global rank 0 ran on)
        return step, path

    def _send(self, step: int, path: Path, *, final: bool) -> bool:
        """checkpoint-<step> unless it is uploaded already or another node's to send. False when a
        stop request came before its upload began (the final pass then looks at the newest
        checkpoint instead, with the stop's few attempts)."""
        if step in self.state["checkpoints"]:
            return True
        if not checkpoints.for_upload(path):
            return True  # another node of the job uploads this step (the one global rank 0 ran on)
        marker = self.dest.child(f"checkpoint-{step}", COMPLETE_MARKER)
        try:
            remote = self._retrying(partial(self.store.head, marker), f"check {marker.uri}", interruptible=not final)
        except SyncError as err:
            if final or not (err.transient and self.stop.is_set()):
                raise
            return False
        if remote is not None:
            event(logging.INFO, f"checkpoint-{step} is already at {self.dest.uri}")
            self._remember(step)
            return True
        if not final and self.stop.is_set():
            return False  # the stop came during the look: this upload is not in flight yet
        self.sending = step
        upload = partial(self.upload_checkpoint, step, path)
        if self._retrying(upload, f"upload checkpoint-{step}", interruptible=False):
            self._remember(step)
        self.sending = None
        return True

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

    # -- logs --------------------------------------------------------------------------------------

    def upload_logs(self) -> int:
        """Send the log files that changed since this watcher last sent them (history first: it is
        what a plot reads); how many were sent. A failure is logged and the file is tried again at
        the next scan; a store that does not answer (a transient error) ends the pass, so that it
        costs each scan one attempt, not one per file."""
        if self.logs is None or self.logs_store is None:
            return 0
        try:
            files = self._log_files()
        except Exception as exc:  # an unreadable directory: the same as a failed upload
            event(logging.WARNING, f"looking for the logs failed, trying again at the next scan: {exc}")
            return 0
        sent = 0
        for key, parts in files:
            target = self.logs.child(key)
            path = self.directory.joinpath(*parts)
            if len(target.prefix.encode("utf-8")) > MAX_KEY:
                self._warn_once(
                    path, f"not uploading {shown(path)}: its object key would be longer than {MAX_KEY} bytes"
                )
                continue
            try:
                sent += self._send_log(self.logs_store, target, key, parts)
            except UnsafePathError as refused:  # a link or a FIFO: never read
                self._warn_once(refused.path, f"not uploading {shown(refused.path)}: it is {refused.what}")
            except Exception as exc:  # logs never fail the watcher, whatever the error
                transient = isinstance(exc, SyncError) and exc.transient
                error = exc.message if isinstance(exc, SyncError) else f"{type(exc).__name__}: {exc}"
                event(
                    logging.WARNING,
                    f"uploading the logs failed, trying again at the next scan: {error}",
                    file=key,
                    destination=target.uri,
                )
                if transient:
                    break
        return sent

    def _send_log(self, store: Store, target: Location, key: str, parts: tuple[str, ...]) -> bool:
        """``DIR/parts...`` to ``target`` unless it is as this watcher last sent it. Its size and time
        are those of the file opened, taken before the read: a line appended meanwhile changes
        them, so the file is sent again at the next scan. The first upload of a file is logged."""
        try:
            fd = beneath.open_file(self.directory, parts)
        except FileNotFoundError:
            return False  # deleted since it was listed
        try:
            st = os.fstat(fd)
            seen = (st.st_size, st.st_mtime_ns)
            if self.logs_sent.get(key) == seen:
                return False
            store.upload(fd, target)
        finally:
            os.close(fd)
        if key not in self.logs_sent:
            event(logging.INFO, f"uploaded {key}", destination=target.uri, bytes=seen[0])
        self.logs_sent[key] = seen
        return True

    def _log_files(self) -> list[tuple[str, tuple[str, ...]]]:
        """(key below ``logs``, path parts below DIR) of ``history/*.jsonl`` and of every file under
        ``runs/``, found without following a link: one is warned about once and left out."""
        found: list[tuple[str, tuple[str, ...]]] = []
        for top, deep in ((HISTORY_DIR, False), (RUNS_DIR, True)):
            try:
                fd = beneath.open_dir(self.directory, (top,))
            except UnsafePathError as refused:
                self._warn_once(refused.path, f"not uploading {shown(refused.path)}: it is {refused.what}")
                continue
            except OSError:
                continue  # not there (yet), or not a directory: nothing to send
            try:
                # fwalk lists a link to a directory among the directories and does not enter it.
                for folder, dirs, files, dir_fd in os.fwalk(".", dir_fd=fd):
                    here = (top,) if folder == "." else (top, *folder[2:].split("/"))
                    keep = []
                    for name in sorted(dirs) if deep else []:
                        why = _unusable(dir_fd, name)
                        if why is None:
                            keep.append(name)
                        else:
                            self._warn_once(self.directory.joinpath(*here, name), why)
                    dirs[:] = keep
                    for name in sorted(files):
                        if not deep and not name.endswith(".jsonl"):
                            continue
                        why = _unusable(dir_fd, name)
                        if why is None:
                            found.append(("/".join((*here, name)), (*here, name)))
                        else:
                            self._warn_once(self.directory.joinpath(*here, name), why)
            finally:
                os.close(fd)
        return found

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


def _unusable(folder: int, name: str) -> str | None:
    """Why the log file or folder ``name`` in ``folder`` is not uploaded (a warning), or None."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return f"not uploading {shown(name)}: its name is not UTF-8, and an object key is"
    try:
        mode = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
    except OSError:
        return None  # gone: opening it will say so
    if stat.S_ISLNK(mode):
        return f"not uploading {shown(name)}: it is a symbolic link, and datasync uploads no links"
    return None


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
    logs: Location | None = None,
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
        logs=logs,
    ).run()
