"""watch --logs: the progress history (DIR/history/*.jsonl) and TensorBoard's event files (DIR/runs/)
uploaded beside the checkpoints as they change, against each object store in turn (moto's S3
server, then fake-gcs-server's GCS JSON API)."""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from dgx_datasync import parse_uri
from dgx_datasync.watch import Watcher
from tests.datasync.conftest import BOTH, CliResult, ObjectStore
from tests.datasync.test_watch import checkpoint, client_attempts, in_thread, trainer_files
from tests.gcs import Hit
from tests.support.wait import wait_until

pytestmark = BOTH

SEGMENT = "history/20261129T204507Z-job-worker-0.jsonl"
EVENTS = "runs/Nov29_20-45-07_job-worker-0/events.out.tfevents.1764449107.job-worker-0.1.0"


def progress_line(step: int) -> bytes:
    return json.dumps({"event": "progress", "step": step, "totalSteps": 100, "loss": 3.0 - step / 100}).encode() + b"\n"


def write_logs(out: Path) -> dict[str, bytes]:
    """What a trainer with reportTo: [tensorboard] has written after a few steps."""
    files = {SEGMENT: progress_line(10) + progress_line(20), EVENTS: os.urandom(700)}
    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    return files


def log_writes(store: ObjectStore, bucket: str, mark: int) -> list[str]:
    return [k for k in store.object_writes(bucket, mark) if "/logs/" in k]


def test_logs_are_uploaded_and_sent_again_only_when_they_changed(store: ObjectStore, tmp_path: Path) -> None:
    bucket = store.bucket("logs")
    out = tmp_path / "out"
    checkpoint(out, 2, trainer_files(2))
    files = write_logs(out)
    (out / "history" / "notes.txt").write_text("not a history file")
    (out / "progress.json").write_text("{}")  # the output's other files are not logs
    watcher = Watcher(
        out,
        parse_uri(store.uri(bucket, "run/checkpoints")),
        store.options(),
        once=True,
        logs=parse_uri(store.uri(bucket, "run/logs")),
    )

    assert watcher.run() == {"checkpoints": [2]}
    assert store.keys(bucket, "run/logs/") == sorted(f"run/logs/{name}" for name in files)
    for name, data in files.items():
        assert store.get(bucket, f"run/logs/{name}") == data
    assert store.keys(bucket, "run/checkpoints/checkpoint-2/")  # the checkpoints as before

    # A line appended to the history: that file is sent again, whole; the unchanged event file is not.
    with (out / SEGMENT).open("ab") as f:
        f.write(progress_line(30))
    mark = store.mark()
    watcher.run()
    assert log_writes(store, bucket, mark) == [f"run/logs/{SEGMENT}"]
    assert store.get(bucket, f"run/logs/{SEGMENT}") == (out / SEGMENT).read_bytes()

    # Nothing changed: nothing sent.
    mark = store.mark()
    watcher.run()
    assert log_writes(store, bucket, mark) == []

    # The same size but a new modification time (TensorBoard rewrote it): sent again.
    rewritten = os.urandom(700)
    (out / EVENTS).write_bytes(rewritten)
    stat = (out / EVENTS).stat()
    os.utime(out / EVENTS, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    mark = store.mark()
    watcher.run()
    assert log_writes(store, bucket, mark) == [f"run/logs/{EVENTS}"]
    assert store.get(bucket, f"run/logs/{EVENTS}") == rewritten


def test_logs_go_up_without_checkpoints_too(
    store: ObjectStore, run_cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    """--no-checkpoints (syncCheckpoints: false) with --logs, through the command line."""
    bucket = store.bucket("logs")
    out = tmp_path / "out"
    checkpoint(out, 2, trainer_files(2))
    files = write_logs(out)
    result = run_cli(
        "watch", str(out), store.uri(bucket, "ckpt"), "--no-checkpoints", "--once",
        "--logs", store.uri(bucket, "job/logs"),
    )  # fmt: skip
    assert result.rc == 0, result
    assert result.termination == {"checkpoints": []}
    assert store.keys(bucket, "ckpt/") == []
    assert store.keys(bucket, "job/logs/") == sorted(f"job/logs/{name}" for name in files)


def test_no_log_is_read_through_a_link(store: ObjectStore, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A history file, a folder of runs/ and runs/ itself that are links (planted by the trainer,
    which datasync does not trust) are skipped with one warning each, scan after scan."""
    caplog.set_level(logging.INFO, logger="dgx_datasync")
    bucket = store.bucket("logs")
    secrets = tmp_path / "secrets"
    (secrets / "deep").mkdir(parents=True)
    (secrets / "token").write_text("the sync container's credentials")
    (secrets / "deep" / "token").write_text("more credentials")
    out = tmp_path / "out"
    files = write_logs(out)
    (out / "history" / "stolen.jsonl").symlink_to(secrets / "token")
    (out / "runs" / "linked").symlink_to(secrets / "deep")
    watcher = Watcher(
        out,
        parse_uri(store.uri(bucket, "ckpt")),
        store.options(),
        once=True,
        logs=parse_uri(store.uri(bucket, "logs")),
    )
    watcher.run()
    watcher.run()
    assert store.keys(bucket, "logs/") == sorted(f"logs/{name}" for name in files)
    linked = [r.getMessage() for r in caplog.records if "symbolic link" in r.getMessage()]
    assert len(linked) == 2, linked
    assert any("stolen.jsonl" in m for m in linked)
    assert any("linked" in m for m in linked)

    # runs/ itself a link: nothing of what it points at goes up.
    other = tmp_path / "other"
    (other / "history").mkdir(parents=True)
    (other / "runs").symlink_to(secrets)
    Watcher(
        other,
        parse_uri(store.uri(bucket, "ckpt2")),
        store.options(),
        once=True,
        logs=parse_uri(store.uri(bucket, "logs2")),
    ).run()
    assert store.keys(bucket, "logs2/") == []
    assert any(f"{other / 'runs'}" in r.getMessage() and "symbolic link" in r.getMessage() for r in caplog.records)


def test_a_store_failing_the_logs_does_not_fail_the_checkpoints(
    store: ObjectStore, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every write under logs/ fails (503 after the client's own attempts): the checkpoint is
    uploaded all the same, the watcher ends well, the failure is one warning for the pass (the
    store is not asked for the other files), and the next scan sends the logs."""
    caplog.set_level(logging.INFO, logger="dgx_datasync")
    client_attempts(store, monkeypatch)  # gcsfs's waits between its own attempts made short
    bucket = store.bucket("logs")
    out = tmp_path / "out"
    checkpoint(out, 2, trainer_files(2))
    files = write_logs(out)
    watcher = Watcher(
        out,
        parse_uri(store.uri(bucket, "ckpt")),
        store.options(),
        once=True,
        logs=parse_uri(store.uri(bucket, "logs")),
    )

    def log_write(hit: Hit) -> bool:
        return hit.op in {"write", "part"} and hit.bucket == bucket and (hit.key or "").startswith("logs/")

    mark = store.mark()
    with store.fail(log_write, times=1_000_000):
        assert watcher.run() == {"checkpoints": [2]}
    assert store.keys(bucket, "ckpt/checkpoint-2/")
    assert store.keys(bucket, "logs/") == []
    failed = [r.getMessage() for r in caplog.records if "uploading the logs failed" in r.getMessage()]
    assert len(failed) == 1, failed
    assert "trying again at the next scan" in failed[0]
    assert {h.key for h in store.since(mark) if log_write(h)} == {f"logs/{SEGMENT}"}  # history first, then stop

    assert watcher.run() == {"checkpoints": [2]}
    assert store.keys(bucket, "logs/") == sorted(f"logs/{name}" for name in files)


def test_a_stop_sends_the_last_lines_of_the_history(store: ObjectStore, tmp_path: Path) -> None:
    """The sidecar sent the history at its first scan and waits for the next; the trainer writes
    its last lines and exits, and the stop request's final pass sends them."""
    bucket = store.bucket("logs")
    out = tmp_path / "out"
    write_logs(out)
    watcher = Watcher(
        out,
        parse_uri(store.uri(bucket, "ckpt")),
        store.options(),
        interval=3600,
        logs=parse_uri(store.uri(bucket, "logs")),
    )
    thread, results, errors = in_thread(watcher)
    wait_until(
        lambda: store.keys(bucket, f"logs/{SEGMENT}") or not thread.is_alive(), timeout=60, what="the first scan"
    )
    assert thread.is_alive(), errors
    with (out / SEGMENT).open("ab") as f:
        f.write(progress_line(100))
    watcher.request_stop(signal.SIGTERM)
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert not errors
    assert results == [{"checkpoints": []}]
    assert store.get(bucket, f"logs/{SEGMENT}") == (out / SEGMENT).read_bytes()
    assert store.get(bucket, f"logs/{SEGMENT}").endswith(progress_line(100))


def test_logs_that_cannot_be_looked_at_do_not_fail_the_watcher(
    store: ObjectStore, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="dgx_datasync")
    bucket = store.bucket("logs")
    out = tmp_path / "out"
    checkpoint(out, 2, trainer_files(2))
    write_logs(out)

    def unreadable(self: Watcher) -> list[tuple[str, tuple[str, ...]]]:
        raise PermissionError(13, "Permission denied", str(out / "runs"))

    monkeypatch.setattr(Watcher, "_log_files", unreadable)
    watcher = Watcher(
        out,
        parse_uri(store.uri(bucket, "ckpt")),
        store.options(),
        once=True,
        logs=parse_uri(store.uri(bucket, "logs")),
    )
    assert watcher.run() == {"checkpoints": [2]}
    assert store.keys(bucket, "logs/") == []
    assert any("looking for the logs failed" in r.getMessage() for r in caplog.records)
