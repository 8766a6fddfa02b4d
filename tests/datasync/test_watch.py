"""watch (the checkpoint uploader and archiver) and restore, against each object store in turn (moto's
S3 server, then fake-gcs-server's GCS JSON API), with a fake trainer output directory written by the
tests (checkpoint dirs + the trainer's marker)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import shutil
import signal
import tarfile
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dgx_api.checkpoints import complete, mark_complete
from dgx_api.progress import COMPLETE_MARKER, write_atomic
from dgx_datasync import parse_uri
from dgx_datasync.errors import SyncError
from dgx_datasync.local import load_uploaded
from dgx_datasync.store import PART_SIZE
from dgx_datasync.watch import Watcher
from tests.datasync.conftest import BOTH, CliResult, Hit, MotoS3, ObjectStore, Spawned
from tests.datasync.gcs_helpers import gs_md5, upload_session
from tests.support.wait import wait_until

pytestmark = BOTH


def checkpoint(root: Path, step: int, files: dict[str, bytes], *, marked: bool = True) -> Path:
    directory = root / f"checkpoint-{step}"
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    if marked:
        mark_complete(directory, step)
    return directory


def trainer_files(seed: int) -> dict[str, bytes]:
    return {
        "adapter_model.safetensors": os.urandom(3000 + seed),
        "optimizer.pt": os.urandom(5000 + seed),
        "trainer_state.json": json.dumps({"step": seed}).encode(),
        "rng/rng_state_0.pth": os.urandom(100),
    }


def succeed(root: Path, merged: bool = False) -> dict[str, bytes]:
    """What the trainer leaves after a successful run: adapter/, optionally merged/, summary.json."""
    files = {"adapter/adapter_config.json": b'{"r": 16}', "adapter/adapter_model.safetensors": os.urandom(4096)}
    if merged:
        files["merged/model.safetensors"] = os.urandom(8192)
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    summary = json.dumps({"status": "Succeeded", "step": 150}).encode()
    write_atomic(root / "summary.json", summary.decode())
    files["summary.json"] = summary
    return files


def checkpoint_writes(store: ObjectStore, bucket: str, mark: int) -> list[str]:
    return [k for k in store.object_writes(bucket, mark) if "/checkpoint-" in k]


def assert_marker_last(writes: list[str], prefix: str, step: int) -> None:
    mine = [w for w in writes if w.startswith(f"{prefix}/checkpoint-{step}/")]
    assert mine, f"nothing written for checkpoint-{step}"
    assert mine[-1] == f"{prefix}/checkpoint-{step}/{COMPLETE_MARKER}"
    assert mine.count(mine[-1]) == 1


def test_only_complete_checkpoints_in_step_order(store: ObjectStore, tmp_path: Path) -> None:
    bucket = store.bucket("watch")
    dest = parse_uri(store.uri(bucket, "run/checkpoints"))
    out = tmp_path / "out"
    two = trainer_files(2)
    checkpoint(out, 2, two)
    checkpoint(out, 4, trainer_files(4), marked=False)  # still being written

    mark = store.mark()
    first = Watcher(out, dest, store.options(), once=True).run()
    assert first == {"checkpoints": [2]}
    assert store.keys(bucket, "run/checkpoints/checkpoint-") == sorted(
        [f"run/checkpoints/checkpoint-2/{k}" for k in two] + [f"run/checkpoints/checkpoint-2/{COMPLETE_MARKER}"]
    )
    for name, data in two.items():
        assert store.get(bucket, f"run/checkpoints/checkpoint-2/{name}") == data
    assert_marker_last(checkpoint_writes(store, bucket, mark), "run/checkpoints", 2)

    # The trainer finishes checkpoint-4 and writes checkpoint-6; 2 is not sent again.
    mark_complete(out / "checkpoint-4", 4)
    checkpoint(out, 6, trainer_files(6))
    mark = store.mark()
    second = Watcher(out, dest, store.options(), once=True, workers=3).run()
    assert second == {"checkpoints": [2, 4, 6]}
    writes = checkpoint_writes(store, bucket, mark)
    assert not [w for w in writes if "/checkpoint-2/" in w]
    assert_marker_last(writes, "run/checkpoints", 4)
    assert_marker_last(writes, "run/checkpoints", 6)
    last_of_4 = max(i for i, w in enumerate(writes) if "/checkpoint-4/" in w)
    first_of_6 = min(i for i, w in enumerate(writes) if "/checkpoint-6/" in w)
    assert last_of_4 < first_of_6  # step order: 4 complete remotely before 6 starts

    # A restarted sidecar that lost its record finds the remote markers and uploads nothing.
    (out / ".kubedgx" / "uploaded.json").unlink()
    mark = store.mark()
    third = Watcher(out, dest, store.options(), once=True).run()
    assert third == {"checkpoints": [2, 4, 6]}
    assert checkpoint_writes(store, bucket, mark) == []


def client_attempts(store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> int:
    """How many times the client library tries a failing request before the watcher sees the error:
    botocore's three on s3, gcsfs's six on gs, where the waits between them are made a hundredth as
    long (gcsfs waits 1, 2, 4, 8 and 16 s, plus up to 1 s each)."""
    if store.scheme != "gs":
        return 3
    import gcsfs.retry

    sleep = asyncio.sleep

    def shorter(seconds: float) -> Coroutine[Any, Any, None]:
        return sleep(seconds / 100)

    monkeypatch.setattr(gcsfs.retry, "asyncio", SimpleNamespace(sleep=shorter))
    return 6


def test_transient_errors_are_retried(
    store: ObjectStore, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """503s on a checkpoint file that use up the client library's own attempts (botocore's three on
    s3, gcsfs's six on gs), so the watcher's own backoff retries the checkpoint, which then completes."""
    caplog.set_level(logging.INFO, logger="dgx_datasync")
    attempts = client_attempts(store, monkeypatch)
    bucket = store.bucket("flaky")
    out = tmp_path / "out"
    files = trainer_files(2)
    checkpoint(out, 2, files)
    target = "ckpt/checkpoint-2/optimizer.pt"

    def optimizer_write(hit: Hit) -> bool:
        return hit.op == "write" and hit.bucket == bucket and hit.key == target

    watcher = Watcher(out, parse_uri(store.uri(bucket, "ckpt")), store.options(), once=True, retry_base=0.05)
    with store.fail(optimizer_write, times=attempts) as fault:
        result = watcher.run()
    assert fault.served == attempts
    assert result == {"checkpoints": [2]}
    assert store.get(bucket, target) == files["optimizer.pt"]
    assert "upload checkpoint-2 failed, retrying" in caplog.text
    assert "injected by the test" in caplog.text  # the store's own words
    assert ("ServiceUnavailable" if store.scheme == "s3" else "503") in caplog.text


def test_checkpoint_deleted_while_uploading(
    store: ObjectStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """save_total_limit removed the checkpoint before it was uploaded: skipped with a log line, no
    marker remotely, what was sent of it removed again."""
    caplog.set_level(logging.INFO, logger="dgx_datasync")
    bucket = store.bucket("watch")
    dest = parse_uri(store.uri(bucket, "ckpt"))
    out = tmp_path / "out"
    doomed = checkpoint(out, 8, {"a.bin": b"a" * 100, "b.bin": b"b" * 100, "c.bin": b"c" * 100})
    watcher = Watcher(out, dest, store.options(), once=True, workers=1)
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(watcher.run())
        except BaseException as exc:
            errors.append(exc)

    def first_write(hit: Hit) -> bool:
        return hit.op == "write" and hit.bucket == bucket and hit.key == "ckpt/checkpoint-8/a.bin"

    with store.gate(first_write) as gate:
        thread = threading.Thread(target=run)
        thread.start()
        wait_until(gate.held.is_set, timeout=30, what="the first file's upload")
        shutil.rmtree(doomed)
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert not errors
    assert results == [{"checkpoints": []}]
    assert store.keys(bucket, "ckpt/checkpoint-8") == []
    assert "checkpoint-8 was deleted before it was uploaded" in caplog.text


def watcher_state(store: ObjectStore, bucket: str, mark: int, proc: Spawned) -> str:
    """For a failure message: the watcher's exit code, its requests to ``bucket``, its log."""
    sent = [(h.method, h.op, h.key) for h in store.since(mark) if h.bucket == bucket]
    return f"watcher exit code {proc.proc.poll()}, requests {sent}, stderr:\n{proc.stderr}"


def test_sigterm_finishes_the_upload_in_flight_then_archives(
    store: ObjectStore, spawn_cli: Callable[..., Spawned], tmp_path: Path
) -> None:
    """SIGTERM while a 40 MiB file of checkpoint-10 is being sent (s3: a multipart upload of five
    parts, held at the first; gs: a resumable upload, held at its chunk): that checkpoint is completed
    (marker and all), then checkpoint-12, the newest, is sent, not checkpoint-11, then the due
    archive is done, exit 0."""
    bucket = store.bucket("sigterm")
    out = tmp_path / "out"
    big = os.urandom(5 * PART_SIZE)
    checkpoint(out, 10, {"big.bin": big, "state.json": b"{}"})
    checkpoint(out, 11, {"state.json": b"{}"})
    checkpoint(out, 12, {"state.json": b"{}"})
    big_key = "ckpt/checkpoint-10/big.bin"

    def big_part(hit: Hit) -> bool:
        if hit.bucket != bucket or hit.key != big_key:
            return False
        if store.scheme == "s3":
            return hit.op == "part" and hit.method == "PUT" and "partNumber=1&" in hit.query + "&"
        return upload_session(hit) is not None

    mark = store.mark()
    with store.gate(big_part) as gate:
        proc = spawn_cli(
            "watch", str(out), store.uri(bucket, "ckpt"), "--interval", "0.2",
            "--archive", store.uri(bucket, "final"), "--workers", "2",
        )  # fmt: skip
        try:
            wait_until(
                lambda: gate.held.is_set() or proc.proc.poll() is not None, timeout=60, what="checkpoint-10's big file"
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {watcher_state(store, bucket, mark, proc)}") from None
        assert gate.held.is_set(), watcher_state(store, bucket, mark, proc)
        archived = succeed(out)  # the trainer finishes meanwhile
        proc.signal(signal.SIGTERM)
        wait_until(lambda: "SIGTERM" in proc.stderr, timeout=30, what="the sidecar to take the SIGTERM")
    assert proc.wait(60) == 0, proc.stderr
    assert store.get(bucket, big_key) == big
    if isinstance(store, MotoS3):
        assert store.etag(bucket, big_key).endswith("-5")
    else:
        assert store.info(bucket, big_key)["md5Hash"] == gs_md5(big)
        big_hits = [h for h in store.since(mark) if h.bucket == bucket and h.key == big_key]
        assert [(h.op, upload_session(h) is None) for h in big_hits[:1]] == [("part", True)]  # the session's start
        assert len({upload_session(h) for h in big_hits[1:]} - {None}) == 1  # ... and one session's chunks
    assert store.object_writes(bucket, mark).count(big_key) == 1
    assert COMPLETE_MARKER in [k.rsplit("/", 1)[-1] for k in store.keys(bucket, "ckpt/checkpoint-10/")]
    writes = checkpoint_writes(store, bucket, mark)
    assert_marker_last(writes, "ckpt", 10)
    assert_marker_last(writes, "ckpt", 12)
    assert writes.index(f"ckpt/checkpoint-10/{COMPLETE_MARKER}") < writes.index("ckpt/checkpoint-12/state.json")
    assert store.keys(bucket, "ckpt/checkpoint-11") == []
    for name, data in archived.items():
        assert store.get(bucket, f"final/{name}") == data
    assert proc.termination == {
        "checkpoints": [10, 12],
        "artifacts": [
            {"name": "adapter", "uri": store.uri(bucket, "final/adapter/")},
            {"name": "summary", "uri": store.uri(bucket, "final/summary.json")},
        ],
    }


def in_thread(watcher: Watcher) -> tuple[threading.Thread, list[dict[str, Any]], list[BaseException]]:
    """``watcher.run()`` started in a daemon thread (no signal handlers there: a test calls
    ``request_stop`` as the handler would), with lists that receive its result or its exception."""
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(watcher.run())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, results, errors


def test_a_stop_sends_the_newest_checkpoint_after_the_one_in_flight(
    store: ObjectStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """While checkpoint-2 is being sent the trainer saves checkpoint-4 and checkpoint-6 and starts
    checkpoint-8 (no marker yet), then the stop request comes (the kubelet's SIGTERM once the
    trainer exited). checkpoint-2 is finished, then checkpoint-6, the one a resume picks, is sent,
    marker last; checkpoint-4 is not (nobody resumes from it), nor the unmarked checkpoint-8."""
    caplog.set_level(logging.INFO, logger="dgx_datasync")
    bucket = store.bucket("stop")
    dest = parse_uri(store.uri(bucket, "ckpt"))
    out = tmp_path / "out"
    two = trainer_files(2)
    checkpoint(out, 2, two)
    watcher = Watcher(out, dest, store.options(), interval=3600)

    def in_flight(hit: Hit) -> bool:
        return hit.op == "write" and hit.bucket == bucket and hit.key == "ckpt/checkpoint-2/optimizer.pt"

    mark = store.mark()
    with store.gate(in_flight) as gate:
        thread, results, errors = in_thread(watcher)
        wait_until(lambda: gate.held.is_set() or not thread.is_alive(), timeout=60, what="checkpoint-2's upload")
        assert gate.held.is_set(), errors
        checkpoint(out, 4, trainer_files(4))
        six = trainer_files(6)
        checkpoint(out, 6, six)
        checkpoint(out, 8, trainer_files(8), marked=False)
        watcher.request_stop(signal.SIGTERM)
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert not errors
    assert results == [{"checkpoints": [2, 6]}]
    writes = checkpoint_writes(store, bucket, mark)
    assert_marker_last(writes, "ckpt", 2)
    assert_marker_last(writes, "ckpt", 6)
    first_of_6 = min(i for i, w in enumerate(writes) if "/checkpoint-6/" in w)
    assert writes.index(f"ckpt/checkpoint-2/{COMPLETE_MARKER}") < first_of_6  # the one in flight first
    for step, files in ((2, two), (6, six)):
        for name, data in files.items():
            assert store.get(bucket, f"ckpt/checkpoint-{step}/{name}") == data
    assert store.keys(bucket, "ckpt/checkpoint-4") == []
    assert store.keys(bucket, "ckpt/checkpoint-8") == []
    # checkpoint-4 is not remembered as uploaded: a later sidecar on this directory still sends it.
    assert load_uploaded(out, dest.uri)["checkpoints"] == [2, 6]
    skipped = [
        getattr(r, "fields", {}).get("skipped") for r in caplog.records if "not the older ones" in r.getMessage()
    ]
    assert skipped == [[4]]


def test_a_second_sigterm_does_not_cut_the_final_upload_short(
    store: ObjectStore, spawn_cli: Callable[..., Spawned], tmp_path: Path
) -> None:
    """The sidecar has sent checkpoint-2 and waits for the next interval when the trainer saves
    checkpoint-4 and checkpoint-6 and exits; SIGTERM, and again while checkpoint-6 is being sent:
    checkpoint-6 is completed all the same (marker last), checkpoint-4 is left, exit 0."""
    bucket = store.bucket("sigterm-twice")
    out = tmp_path / "out"
    checkpoint(out, 2, {"state.json": b"{}"})
    newest_key = "ckpt/checkpoint-6/optimizer.pt"

    def newest_file(hit: Hit) -> bool:
        return hit.op == "write" and hit.bucket == bucket and hit.key == newest_key

    mark = store.mark()
    with store.gate(newest_file) as gate:
        proc = spawn_cli("watch", str(out), store.uri(bucket, "ckpt"), "--interval", "3600")
        wait_until(
            lambda: "uploaded checkpoint-2" in proc.stderr or proc.proc.poll() is not None,
            timeout=60,
            what="checkpoint-2's upload",
        )
        assert proc.proc.poll() is None, watcher_state(store, bucket, mark, proc)
        checkpoint(out, 4, trainer_files(4))
        six = trainer_files(6)
        checkpoint(out, 6, six)
        proc.signal(signal.SIGTERM)
        wait_until(lambda: gate.held.is_set() or proc.proc.poll() is not None, timeout=60, what="checkpoint-6's upload")
        assert gate.held.is_set(), watcher_state(store, bucket, mark, proc)
        proc.signal(signal.SIGTERM)
        wait_until(lambda: "SIGTERM again" in proc.stderr, timeout=30, what="the sidecar to take the second SIGTERM")
    assert proc.wait(60) == 0, proc.stderr
    assert proc.termination == {"checkpoints": [2, 6]}
    writes = checkpoint_writes(store, bucket, mark)
    assert_marker_last(writes, "ckpt", 6)
    assert store.get(bucket, newest_key) == six["optimizer.pt"]
    assert store.keys(bucket, "ckpt/checkpoint-4") == []


def test_a_stop_in_the_backoff_of_a_failing_store_gives_up_after_a_few_attempts(
    store: ObjectStore, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every checkpoint write fails (503) and the watcher waits before trying checkpoint-2 again
    (an hour: ``retry_base``) when the trainer saves checkpoint-4 and the stop request comes. The
    wait ends, checkpoint-2 gets ``stop_attempts`` more attempts (a hundredth of a second apart
    here), then the watcher gives up, naming checkpoint-2 and checkpoint-4 in an ERROR line and in
    its Unreachable error (the termination message), instead of sleeping into the kubelet's SIGKILL."""
    caplog.set_level(logging.INFO, logger="dgx_datasync")
    client_attempts(store, monkeypatch)  # for gcsfs's shorter waits: a watcher attempt takes milliseconds
    bucket = store.bucket("stop-failing")
    dest = parse_uri(store.uri(bucket, "ckpt"))
    out = tmp_path / "out"
    checkpoint(out, 2, trainer_files(2))
    watcher = Watcher(out, dest, store.options(), interval=3600, retry_base=3600, retry_max=3600, stop_retry_base=0.01)

    def checkpoint_write(hit: Hit) -> bool:
        return hit.op in {"write", "part"} and hit.bucket == bucket and (hit.key or "").startswith("ckpt/checkpoint-")

    def retries() -> list[int]:
        return [
            getattr(r, "fields", {}).get("attempt")
            for r in caplog.records
            if r.getMessage().startswith("upload checkpoint-2 failed, retrying")
        ]

    with store.fail(checkpoint_write, times=1_000_000):
        thread, results, errors = in_thread(watcher)
        wait_until(lambda: retries() or not thread.is_alive(), timeout=120, what="the first retry wait")
        assert retries() == [1], errors
        checkpoint(out, 4, trainer_files(4))
        watcher.request_stop(signal.SIGTERM)
        thread.join(timeout=120)
        assert not thread.is_alive(), "the stop did not end the retry wait"
    assert not results
    [error] = errors
    assert isinstance(error, SyncError), error
    assert (error.reason, error.transient) == ("Unreachable", True)
    assert error.message.startswith("stopped before uploading checkpoint-2, checkpoint-4: "), error.message
    assert retries() == [1, 2, 3, 4]  # one before the stop; after it four attempts, the last gives up
    gave_up = [r.getMessage() for r in caplog.records if r.name == "dgx_datasync" and r.levelno == logging.ERROR]
    assert gave_up == ["stopping without uploading checkpoint-2, checkpoint-4: the store still failed after 4 attempts"]
    assert store.keys(bucket, "ckpt/checkpoint-") == []
    assert load_uploaded(out, dest.uri)["checkpoints"] == []


def test_archive_files_once(store: ObjectStore, run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    bucket = store.bucket("archive")
    out = tmp_path / "out"
    checkpoint(out, 3, trainer_files(3))
    files = succeed(out, merged=True)
    mark = store.mark()
    args = [
        "watch", str(out), store.uri(bucket, "ckpt"),
        "--archive", store.uri(bucket, "final/job-1"), "--interval", "60",
    ]  # fmt: skip
    first = run_cli(*args)  # not --once: a succeeded run with its archive done exits by itself
    assert first.rc == 0, first
    expected = {
        "checkpoints": [3],
        "artifacts": [
            {"name": "adapter", "uri": store.uri(bucket, "final/job-1/adapter/")},
            {"name": "merged", "uri": store.uri(bucket, "final/job-1/merged/")},
            {"name": "summary", "uri": store.uri(bucket, "final/job-1/summary.json")},
        ],
    }
    assert first.termination == expected
    assert store.keys(bucket, "final/") == sorted(f"final/job-1/{k}" for k in files)
    for name, data in files.items():
        assert store.get(bucket, f"final/job-1/{name}") == data
    archive_writes = [k for k in store.object_writes(bucket, mark) if k.startswith("final/")]
    assert archive_writes[-1] == "final/job-1/summary.json"  # summary last: the archive's marker

    mark = store.mark()
    again = run_cli(*args)
    assert again.rc == 0, again
    assert again.termination == expected
    assert store.object_writes(bucket, mark) == ["ckpt/.kubedgx/probe", "final/job-1/.kubedgx/probe"]


def test_archive_tarball(store: ObjectStore, tmp_path: Path) -> None:
    bucket = store.bucket("archive")
    out = tmp_path / "out"
    files = succeed(out, merged=True)
    result = Watcher(
        out,
        parse_uri(store.uri(bucket, "ckpt")),
        store.options(),
        archive=parse_uri(store.uri(bucket, "final")),
        archive_format="tar.gz",
        once=True,
    ).run()
    assert result == {
        "checkpoints": [],
        "artifacts": [
            {"name": "model.tar.gz", "uri": store.uri(bucket, "final/model.tar.gz")},
            {"name": "summary", "uri": store.uri(bucket, "final/summary.json")},
        ],
    }
    assert store.keys(bucket, "final/") == ["final/model.tar.gz", "final/summary.json"]
    with tarfile.open(fileobj=io.BytesIO(store.get(bucket, "final/model.tar.gz")), mode="r:gz") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert members == files
    assert not (out / ".kubedgx" / "model.tar.gz").exists()  # the local tarball is not kept


def test_archive_only(store: ObjectStore, tmp_path: Path) -> None:
    """--no-checkpoints (syncCheckpoints: false): complete checkpoints stay local, the model goes up."""
    bucket = store.bucket("archive")
    out = tmp_path / "out"
    checkpoint(out, 5, trainer_files(5))
    succeed(out)
    result = Watcher(
        out,
        parse_uri(store.uri(bucket, "ckpt")),
        store.options(),
        archive=parse_uri(store.uri(bucket, "final")),
        checkpoints=False,
        once=True,
    ).run()
    assert result["checkpoints"] == []
    assert [a["name"] for a in result["artifacts"]] == ["adapter", "summary"]
    assert store.keys(bucket, "ckpt/") == []
    assert store.keys(bucket, "final/")


def test_restore_newest_complete(store: ObjectStore, run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    bucket = store.bucket("restore")
    four = trainer_files(4)
    store.put_many(bucket, {f"ckpt/checkpoint-4/{name}": data for name, data in four.items()})
    marker = json.dumps({"step": 4, "completedAt": "2026-11-29T00:00:00Z"}).encode()
    store.put(bucket, f"ckpt/checkpoint-4/{COMPLETE_MARKER}", marker)
    # newer, but its upload never finished
    store.put_many(bucket, {f"ckpt/checkpoint-8/{name}": data for name, data in trainer_files(8).items()})
    out = tmp_path / "out"

    mark = store.mark()
    result = run_cli("restore", store.uri(bucket, "ckpt"), str(out))
    assert result.rc == 0, result
    assert result.result == {"restored": 4}
    assert result.termination == {"restored": 4}
    assert [step for step, _ in complete(out)] == [4]
    for name, data in four.items():
        assert (out / "checkpoint-4" / name).read_bytes() == data
    assert (out / "checkpoint-4" / COMPLETE_MARKER).read_bytes() == marker
    assert not (out / "checkpoint-8").exists()
    gets = [h.key for h in store.since(mark) if h.op == "get" and h.key_in(bucket)]
    assert gets[-1] == f"ckpt/checkpoint-4/{COMPLETE_MARKER}"  # marker last
    assert len(gets) == len(four) + 1

    # The uploader knows checkpoint-4 is remote already.
    mark = store.mark()
    watched = Watcher(out, parse_uri(store.uri(bucket, "ckpt")), store.options(), once=True).run()
    assert watched == {"checkpoints": [4]}
    assert checkpoint_writes(store, bucket, mark) == []

    again = run_cli("restore", store.uri(bucket, "ckpt"), str(out))
    assert again.rc == 0, again
    assert again.result == {"restored": None}

    empty = run_cli("restore", store.uri(bucket, "nothing-yet"), str(tmp_path / "fresh"))
    assert empty.rc == 0, empty
    assert empty.result == {"restored": None}


def test_a_checkpoint_another_node_uploads_is_left_alone(store: ObjectStore, tmp_path: Path) -> None:
    """Every node of a multi-node job keeps a whole, marked copy to resume from; only the copy of
    the node global rank 0 ran on says upload, so the store gets each step once."""
    bucket = store.bucket("watch-nodes")
    dest = parse_uri(store.uri(bucket, "run/checkpoints"))
    out = tmp_path / "out"
    checkpoint(out, 2, trainer_files(2), marked=False)
    mark_complete(out / "checkpoint-2", 2, upload=False)  # another node's to send
    checkpoint(out, 4, trainer_files(4))
    legacy = checkpoint(out, 6, trainer_files(6), marked=False)
    write_atomic(legacy / COMPLETE_MARKER, json.dumps({"step": 6}))  # a marker from before the flag

    assert Watcher(out, dest, store.options(), once=True).run() == {"checkpoints": [4, 6]}
    assert [step for step, _ in complete(out)] == [2, 4, 6]  # still complete here, for resuming
    assert not store.keys(bucket, "run/checkpoints/checkpoint-2/")
    assert store.keys(bucket, f"run/checkpoints/checkpoint-4/{COMPLETE_MARKER}")
    assert store.keys(bucket, f"run/checkpoints/checkpoint-6/{COMPLETE_MARKER}")
