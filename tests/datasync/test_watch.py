"""watch (the checkpoint uploader and archiver) and restore, against moto's S3 server, with a fake
trainer output directory written by the tests (checkpoint dirs + the trainer's marker)."""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import signal
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dgx_api.checkpoints import complete, mark_complete
from dgx_api.progress import COMPLETE_MARKER, write_atomic
from dgx_datasync import StoreOptions, parse_uri
from dgx_datasync.store import PART_SIZE
from dgx_datasync.watch import Watcher
from tests.datasync.conftest import ACCESS_KEY, REGION, SECRET_KEY, CliResult, Hit, MotoS3, Spawned, wait_until


def options(s3: MotoS3) -> StoreOptions:
    return StoreOptions(
        endpoint_url=s3.endpoint,
        region=REGION,
        env={"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY},
    )


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


def checkpoint_writes(s3: MotoS3, bucket: str, mark: int) -> list[str]:
    return [k for k in s3.object_writes(bucket, mark) if "/checkpoint-" in k]


def assert_marker_last(writes: list[str], prefix: str, step: int) -> None:
    mine = [w for w in writes if w.startswith(f"{prefix}/checkpoint-{step}/")]
    assert mine, f"nothing written for checkpoint-{step}"
    assert mine[-1] == f"{prefix}/checkpoint-{step}/{COMPLETE_MARKER}"
    assert mine.count(mine[-1]) == 1


def test_only_complete_checkpoints_in_step_order(s3: MotoS3, tmp_path: Path) -> None:
    bucket = s3.bucket("watch")
    dest = parse_uri(f"s3://{bucket}/run/checkpoints")
    out = tmp_path / "out"
    two = trainer_files(2)
    checkpoint(out, 2, two)
    checkpoint(out, 4, trainer_files(4), marked=False)  # still being written

    mark = s3.mark()
    first = Watcher(out, dest, options(s3), once=True).run()
    assert first == {"checkpoints": [2]}
    assert s3.keys(bucket, "run/checkpoints/checkpoint-") == sorted(
        [f"run/checkpoints/checkpoint-2/{k}" for k in two] + [f"run/checkpoints/checkpoint-2/{COMPLETE_MARKER}"]
    )
    for name, data in two.items():
        assert s3.get(bucket, f"run/checkpoints/checkpoint-2/{name}") == data
    assert_marker_last(checkpoint_writes(s3, bucket, mark), "run/checkpoints", 2)

    # The trainer finishes checkpoint-4 and writes checkpoint-6; 2 is not sent again.
    mark_complete(out / "checkpoint-4", 4)
    checkpoint(out, 6, trainer_files(6))
    mark = s3.mark()
    second = Watcher(out, dest, options(s3), once=True, workers=3).run()
    assert second == {"checkpoints": [2, 4, 6]}
    writes = checkpoint_writes(s3, bucket, mark)
    assert not [w for w in writes if "/checkpoint-2/" in w]
    assert_marker_last(writes, "run/checkpoints", 4)
    assert_marker_last(writes, "run/checkpoints", 6)
    last_of_4 = max(i for i, w in enumerate(writes) if "/checkpoint-4/" in w)
    first_of_6 = min(i for i, w in enumerate(writes) if "/checkpoint-6/" in w)
    assert last_of_4 < first_of_6  # step order: 4 complete remotely before 6 starts

    # A restarted sidecar that lost its record finds the remote markers and uploads nothing.
    (out / ".kubedgx" / "uploaded.json").unlink()
    mark = s3.mark()
    third = Watcher(out, dest, options(s3), once=True).run()
    assert third == {"checkpoints": [2, 4, 6]}
    assert checkpoint_writes(s3, bucket, mark) == []


def test_transient_errors_are_retried(s3: MotoS3, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Three 503s on a checkpoint file use up botocore's three attempts, so the watcher's own
    backoff retries the checkpoint, which then completes."""
    caplog.set_level(logging.INFO, logger="dgx_datasync")
    bucket = s3.bucket("flaky")
    out = tmp_path / "out"
    files = trainer_files(2)
    checkpoint(out, 2, files)
    target = f"/{bucket}/ckpt/checkpoint-2/optimizer.pt"
    watcher = Watcher(out, parse_uri(f"s3://{bucket}/ckpt"), options(s3), once=True, retry_base=0.05)
    with s3.fail(lambda h: h.method == "PUT" and h.path == target, times=3) as fault:
        result = watcher.run()
    assert fault.served == 3
    assert result == {"checkpoints": [2]}
    assert s3.get(bucket, "ckpt/checkpoint-2/optimizer.pt") == files["optimizer.pt"]
    assert "upload checkpoint-2 failed, retrying" in caplog.text
    assert "ServiceUnavailable" in caplog.text


def test_checkpoint_deleted_while_uploading(s3: MotoS3, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """save_total_limit removed the checkpoint before it was uploaded: skipped with a log line, no
    marker remotely, what was sent of it removed again."""
    caplog.set_level(logging.INFO, logger="dgx_datasync")
    bucket = s3.bucket("watch")
    dest = parse_uri(f"s3://{bucket}/ckpt")
    out = tmp_path / "out"
    doomed = checkpoint(out, 8, {"a.bin": b"a" * 100, "b.bin": b"b" * 100, "c.bin": b"c" * 100})
    watcher = Watcher(out, dest, options(s3), once=True, workers=1)
    results: list[dict[str, Any]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(watcher.run())
        except BaseException as exc:
            errors.append(exc)

    first_put = f"/{bucket}/ckpt/checkpoint-8/a.bin"
    with s3.gate(lambda h: h.method == "PUT" and h.path == first_put) as gate:
        thread = threading.Thread(target=run)
        thread.start()
        wait_until(gate.held.is_set, 30, "the first file's upload")
        shutil.rmtree(doomed)
    thread.join(timeout=60)
    assert not errors
    assert results == [{"checkpoints": []}]
    assert s3.keys(bucket, "ckpt/checkpoint-8") == []
    assert "checkpoint-8 was deleted before it was uploaded" in caplog.text


def test_sigterm_finishes_the_upload_in_flight_then_archives(
    s3: MotoS3, spawn_cli: Callable[..., Spawned], tmp_path: Path
) -> None:
    """SIGTERM while a 40 MiB file of checkpoint-10 is being sent: that checkpoint is completed
    (marker and all), checkpoint-12 is not started, the due archive is done, exit 0."""
    bucket = s3.bucket("sigterm")
    out = tmp_path / "out"
    big = os.urandom(5 * PART_SIZE)
    checkpoint(out, 10, {"big.bin": big, "state.json": b"{}"})
    checkpoint(out, 12, {"state.json": b"{}"})
    big_key = f"/{bucket}/ckpt/checkpoint-10/big.bin"

    def big_part(hit: Hit) -> bool:
        return hit.method == "PUT" and hit.path == big_key and "partNumber=1&" in hit.query + "&"

    with s3.gate(big_part) as gate:
        proc = spawn_cli(
            "watch", str(out), f"s3://{bucket}/ckpt", "--interval", "0.2",
            "--archive", f"s3://{bucket}/final", "--workers", "2",
        )  # fmt: skip
        wait_until(gate.held.is_set, 60, "checkpoint-10's big file in flight")
        archived = succeed(out)  # the trainer finishes meanwhile
        proc.signal(signal.SIGTERM)
        wait_until(lambda: "SIGTERM" in proc.stderr, 30, "the sidecar to take the SIGTERM")
    assert proc.wait(60) == 0, proc.stderr
    assert s3.get(bucket, "ckpt/checkpoint-10/big.bin") == big
    assert s3.etag(bucket, "ckpt/checkpoint-10/big.bin").endswith("-5")
    assert COMPLETE_MARKER in [k.rsplit("/", 1)[-1] for k in s3.keys(bucket, "ckpt/checkpoint-10/")]
    assert s3.keys(bucket, "ckpt/checkpoint-12") == []
    for name, data in archived.items():
        assert s3.get(bucket, f"final/{name}") == data
    assert proc.termination == {
        "checkpoints": [10],
        "artifacts": [
            {"name": "adapter", "uri": f"s3://{bucket}/final/adapter/"},
            {"name": "summary", "uri": f"s3://{bucket}/final/summary.json"},
        ],
    }


def test_archive_files_once(s3: MotoS3, run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    bucket = s3.bucket("archive")
    out = tmp_path / "out"
    checkpoint(out, 3, trainer_files(3))
    files = succeed(out, merged=True)
    mark = s3.mark()
    args = ["watch", str(out), f"s3://{bucket}/ckpt", "--archive", f"s3://{bucket}/final/job-1", "--interval", "60"]
    first = run_cli(*args)  # not --once: a succeeded run with its archive done exits by itself
    assert first.rc == 0, first
    expected = {
        "checkpoints": [3],
        "artifacts": [
            {"name": "adapter", "uri": f"s3://{bucket}/final/job-1/adapter/"},
            {"name": "merged", "uri": f"s3://{bucket}/final/job-1/merged/"},
            {"name": "summary", "uri": f"s3://{bucket}/final/job-1/summary.json"},
        ],
    }
    assert first.termination == expected
    assert s3.keys(bucket, "final/") == sorted(f"final/job-1/{k}" for k in files)
    for name, data in files.items():
        assert s3.get(bucket, f"final/job-1/{name}") == data
    archive_writes = [k for k in s3.object_writes(bucket, mark) if k.startswith("final/")]
    assert archive_writes[-1] == "final/job-1/summary.json"  # summary last: the archive's marker

    mark = s3.mark()
    again = run_cli(*args)
    assert again.rc == 0, again
    assert again.termination == expected
    assert s3.object_writes(bucket, mark) == ["ckpt/.kubedgx/probe", "final/job-1/.kubedgx/probe"]


def test_archive_tarball(s3: MotoS3, tmp_path: Path) -> None:
    bucket = s3.bucket("archive")
    out = tmp_path / "out"
    files = succeed(out, merged=True)
    result = Watcher(
        out,
        parse_uri(f"s3://{bucket}/ckpt"),
        options(s3),
        archive=parse_uri(f"s3://{bucket}/final"),
        archive_format="tar.gz",
        once=True,
    ).run()
    assert result == {
        "checkpoints": [],
        "artifacts": [
            {"name": "model.tar.gz", "uri": f"s3://{bucket}/final/model.tar.gz"},
            {"name": "summary", "uri": f"s3://{bucket}/final/summary.json"},
        ],
    }
    assert s3.keys(bucket, "final/") == ["final/model.tar.gz", "final/summary.json"]
    with tarfile.open(fileobj=io.BytesIO(s3.get(bucket, "final/model.tar.gz")), mode="r:gz") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert members == files
    assert not (out / ".kubedgx" / "model.tar.gz").exists()  # the local tarball is not kept


def test_archive_only(s3: MotoS3, tmp_path: Path) -> None:
    """--no-checkpoints (syncCheckpoints: false): complete checkpoints stay local, the model goes up."""
    bucket = s3.bucket("archive")
    out = tmp_path / "out"
    checkpoint(out, 5, trainer_files(5))
    succeed(out)
    result = Watcher(
        out,
        parse_uri(f"s3://{bucket}/ckpt"),
        options(s3),
        archive=parse_uri(f"s3://{bucket}/final"),
        checkpoints=False,
        once=True,
    ).run()
    assert result["checkpoints"] == []
    assert [a["name"] for a in result["artifacts"]] == ["adapter", "summary"]
    assert s3.keys(bucket, "ckpt/") == []


def test_restore_newest_complete(s3: MotoS3, run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    bucket = s3.bucket("restore")
    four = trainer_files(4)
    for name, data in four.items():
        s3.client.put_object(Bucket=bucket, Key=f"ckpt/checkpoint-4/{name}", Body=data)
    marker = json.dumps({"step": 4, "completedAt": "2026-11-29T00:00:00Z"}).encode()
    s3.client.put_object(Bucket=bucket, Key=f"ckpt/checkpoint-4/{COMPLETE_MARKER}", Body=marker)
    for name, data in trainer_files(8).items():  # newer, but its upload never finished
        s3.client.put_object(Bucket=bucket, Key=f"ckpt/checkpoint-8/{name}", Body=data)
    out = tmp_path / "out"

    mark = s3.mark()
    result = run_cli("restore", f"s3://{bucket}/ckpt", str(out))
    assert result.rc == 0, result
    assert result.result == {"restored": 4}
    assert result.termination == {"restored": 4}
    assert [step for step, _ in complete(out)] == [4]
    for name, data in four.items():
        assert (out / "checkpoint-4" / name).read_bytes() == data
    assert (out / "checkpoint-4" / COMPLETE_MARKER).read_bytes() == marker
    assert not (out / "checkpoint-8").exists()
    gets = [h.key_in(bucket) for h in s3.since(mark) if h.method == "GET" and h.key_in(bucket)]
    assert gets[-1] == f"ckpt/checkpoint-4/{COMPLETE_MARKER}"  # marker last
    assert len(gets) == len(four) + 1

    # The uploader knows checkpoint-4 is remote already.
    mark = s3.mark()
    watched = Watcher(out, parse_uri(f"s3://{bucket}/ckpt"), options(s3), once=True).run()
    assert watched == {"checkpoints": [4]}
    assert checkpoint_writes(s3, bucket, mark) == []

    again = run_cli("restore", f"s3://{bucket}/ckpt", str(out))
    assert again.rc == 0, again
    assert again.result == {"restored": None}

    empty = run_cli("restore", f"s3://{bucket}/nothing-yet", str(tmp_path / "fresh"))
    assert empty.rc == 0, empty
    assert empty.result == {"restored": None}


def test_a_checkpoint_another_node_uploads_is_left_alone(s3: MotoS3, tmp_path: Path) -> None:
    """Every node of a multi-node job keeps a whole, marked copy to resume from; only the copy of
    the node global rank 0 ran on says upload, so the store gets each step once."""
    bucket = s3.bucket("watch-nodes")
    dest = parse_uri(f"s3://{bucket}/run/checkpoints")
    out = tmp_path / "out"
    checkpoint(out, 2, trainer_files(2), marked=False)
    mark_complete(out / "checkpoint-2", 2, upload=False)  # another node's to send
    checkpoint(out, 4, trainer_files(4))
    legacy = checkpoint(out, 6, trainer_files(6), marked=False)
    write_atomic(legacy / COMPLETE_MARKER, json.dumps({"step": 6}))  # a marker from before the flag

    assert Watcher(out, dest, options(s3), once=True).run() == {"checkpoints": [4, 6]}
    assert [step for step, _ in complete(out)] == [2, 4, 6]  # still complete here, for resuming
    assert not s3.keys(bucket, "run/checkpoints/checkpoint-2/")
    assert s3.keys(bucket, f"run/checkpoints/checkpoint-4/{COMPLETE_MARKER}")
    assert s3.keys(bucket, f"run/checkpoints/checkpoint-6/{COMPLETE_MARKER}")
