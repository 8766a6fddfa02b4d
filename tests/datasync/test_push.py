"""push: a local directory to a prefix, multipart above two parts, unchanged files never re-sent."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from dgx_datasync.store import PART_SIZE, s3_etag
from tests.datasync.conftest import CliResult, MotoS3


def test_push_multipart_and_skip(s3: MotoS3, run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = {f"small/{i:02d}.txt": os.urandom(i * 37) for i in range(20)}
    files["weights/model.bin"] = os.urandom(2 * PART_SIZE + 12345)  # three parts
    for key, data in files.items():
        (src / key).parent.mkdir(parents=True, exist_ok=True)
        (src / key).write_bytes(data)
    (src / ".kubedgx").mkdir()
    (src / ".kubedgx" / "journal.jsonl").write_text("{}\n")  # our state stays local
    bucket = s3.bucket("push")
    dest = f"s3://{bucket}/out"

    mark = s3.mark()
    first = run_cli("push", str(src), dest, "--workers", "4")
    assert first.rc == 0, first
    total = sum(len(d) for d in files.values())
    assert first.result == {"objects": 21, "totalBytes": total, "transferred": 21, "skipped": 0}
    assert first.termination == first.result
    assert s3.keys(bucket) == sorted(f"out/{k}" for k in files)
    for key, data in files.items():
        assert s3.get(bucket, f"out/{key}") == data
    big_etag = s3.etag(bucket, "out/weights/model.bin")
    assert big_etag.endswith("-3")  # multipart happened, with our part size
    assert big_etag == s3_etag(src / "weights" / "model.bin")
    part_puts = [h for h in s3.since(mark) if h.method == "PUT" and "partNumber=" in h.query]
    assert len(part_puts) == 3

    mark = s3.mark()
    again = run_cli("push", str(src), dest)
    assert again.rc == 0, again
    assert again.result == {"objects": 21, "totalBytes": total, "transferred": 0, "skipped": 21}
    assert s3.object_writes(bucket, mark) == []

    (src / "small" / "03.txt").write_bytes(b"changed")
    mark = s3.mark()
    changed = run_cli("push", str(src), dest, "--exclude", "weights/*")
    assert changed.rc == 0, changed
    assert changed.result["transferred"] == 1
    assert changed.result["objects"] == 20
    assert s3.object_writes(bucket, mark) == ["out/small/03.txt"]
    assert s3.get(bucket, "out/small/03.txt") == b"changed"


def test_push_of_a_missing_directory(run_cli: Callable[..., CliResult], s3: MotoS3, tmp_path: Path) -> None:
    bucket = s3.bucket("push")
    result = run_cli("push", str(tmp_path / "nope"), f"s3://{bucket}/x")
    assert result.rc == 2, result
    assert result.stderr_lines == [f"datasync: {tmp_path / 'nope'} is not a directory: nothing to upload"]
    assert result.termination["error"] == "LocalError"
