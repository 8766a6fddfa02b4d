"""push: a local directory to a prefix, on each object store in turn; unchanged files never re-sent.
s3: multipart above two parts; gs: gcsfs's resumable upload above 5 MiB, in chunks."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from dgx_datasync.store import PART_SIZE, s3_etag
from tests.datasync.conftest import BOTH, CliResult, Hit, MotoS3, ObjectStore
from tests.datasync.gcs_helpers import gs_md5, upload_session
from tests.gcs import FakeGCS

#: What only gs has (the chunks of a resumable upload); s3's multipart is in test_push_multipart_and_skip.
GS_ONLY = pytest.mark.parametrize("store", ["gs"], indirect=True)


def resumable_chunk() -> int:
    """gcsfs's put_file: one request below 5 MiB, above it a resumable upload in chunks of the
    store's GS_CHUNK (smaller than gcsfs's 50 MiB default, which it holds in memory per file)."""
    from dgx_datasync.store import GS_CHUNK

    assert GS_CHUNK >= 5 * 2**20, GS_CHUNK
    assert GS_CHUNK % (256 * 2**10) == 0, GS_CHUNK
    return GS_CHUNK


def resumable(store: ObjectStore, bucket: str, key: str, mark: int) -> tuple[Hit, list[Hit]]:
    """The start and the chunks of the one resumable upload of ``key`` since ``mark``."""
    hits = [h for h in store.since(mark) if h.bucket == bucket and h.key == key]
    assert hits, f"no request for {key}"
    start, chunks = hits[0], hits[1:]
    assert (start.method, start.op, upload_session(start)) == ("POST", "part", None), start
    assert "uploadType=resumable" in start.query, start
    sessions = {upload_session(h) for h in chunks}
    assert None not in sessions, chunks
    assert len(sessions) == 1, chunks  # every chunk to one session
    return start, chunks


@BOTH
def test_push_multipart_and_skip(store: ObjectStore, run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = {f"small/{i:02d}.txt": os.urandom(i * 37) for i in range(20)}
    files["weights/model.bin"] = os.urandom(2 * PART_SIZE + 12345)  # s3: three parts; gs: resumable
    for key, data in files.items():
        (src / key).parent.mkdir(parents=True, exist_ok=True)
        (src / key).write_bytes(data)
    (src / ".kubedgx").mkdir()
    (src / ".kubedgx" / "journal.jsonl").write_text("{}\n")  # our state stays local
    bucket = store.bucket("push")
    dest = store.uri(bucket, "out")

    mark = store.mark()
    first = run_cli("push", str(src), dest, "--workers", "4")
    assert first.rc == 0, first
    total = sum(len(d) for d in files.values())
    assert first.result == {"objects": 21, "totalBytes": total, "transferred": 21, "skipped": 0}
    assert first.termination == first.result
    assert store.keys(bucket) == sorted(f"out/{k}" for k in files)
    for key, data in files.items():
        assert store.get(bucket, f"out/{key}") == data
    assert sorted(store.object_writes(bucket, mark)) == sorted(f"out/{k}" for k in files)  # each once
    if isinstance(store, MotoS3):
        big_etag = store.etag(bucket, "out/weights/model.bin")
        assert big_etag.endswith("-3")  # multipart happened, with our part size
        assert big_etag == s3_etag(src / "weights" / "model.bin")
        part_puts = [h for h in store.since(mark) if h.op == "part" and "partNumber=" in h.query]
        assert len(part_puts) == 3
    else:
        # What the skip below compares: GCS's md5 of the whole object, whatever the upload's shape.
        assert store.info(bucket, "out/weights/model.bin")["md5Hash"] == gs_md5(files["weights/model.bin"])
        _, chunks = resumable(store, bucket, "out/weights/model.bin", mark)
        size = len(files["weights/model.bin"])
        assert len(chunks) == -(-size // resumable_chunk())  # above 5 MiB: resumable, in our chunks
        small = [h for h in store.since(mark) if h.key and h.key.startswith("out/small/") and h.op == "write"]
        assert len(small) == 20
        assert not [h for h in small if upload_session(h)]  # one request each

    mark = store.mark()
    again = run_cli("push", str(src), dest)
    assert again.rc == 0, again
    assert again.result == {"objects": 21, "totalBytes": total, "transferred": 0, "skipped": 21}
    assert store.object_writes(bucket, mark) == []
    assert [h for h in store.since(mark) if h.op == "part"] == []

    (src / "small" / "03.txt").write_bytes(b"changed")
    mark = store.mark()
    changed = run_cli("push", str(src), dest, "--exclude", "weights/*")
    assert changed.rc == 0, changed
    assert changed.result["transferred"] == 1
    assert changed.result["objects"] == 20
    assert store.object_writes(bucket, mark) == ["out/small/03.txt"]
    assert store.get(bucket, "out/small/03.txt") == b"changed"


@BOTH
def test_push_of_a_missing_directory(run_cli: Callable[..., CliResult], store: ObjectStore, tmp_path: Path) -> None:
    bucket = store.bucket("push")
    mark = store.mark()
    result = run_cli("push", str(tmp_path / "nope"), store.uri(bucket, "x"))
    assert result.rc == 2, result
    assert result.stderr_lines == [f"datasync: {tmp_path / 'nope'} is not a directory: nothing to upload"]
    assert result.termination["error"] == "LocalError"
    assert store.since(mark) == []  # refused before any request


def two_chunks_and_a_bit(tmp_path: Path) -> tuple[Path, bytes]:
    """A source directory with one file of two resumable chunks and 1 MiB: three chunks to send."""
    src = tmp_path / "src"
    src.mkdir()
    big = os.urandom(2 * resumable_chunk() + 2**20)
    (src / "model.bin").write_bytes(big)
    return src, big


@GS_ONLY
def test_push_large_file_as_resumable_chunks(
    store: ObjectStore, run_cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    """A file of two gcsfs chunks and a bit goes as one resumable upload in three chunks: the
    object appears once, with the file's bytes and md5; a second push sends nothing."""
    assert isinstance(store, FakeGCS)
    src, big = two_chunks_and_a_bit(tmp_path)
    bucket = store.bucket("push-large")
    dest = store.uri(bucket, "out")
    key = "out/model.bin"

    mark = store.mark()
    first = run_cli("push", str(src), dest)
    assert first.rc == 0, first
    assert first.result == {"objects": 1, "totalBytes": len(big), "transferred": 1, "skipped": 0}
    _, chunks = resumable(store, bucket, key, mark)
    assert len(chunks) == 3
    assert [h.op for h in chunks[:-1]] == ["part", "part"]  # not visible before the last chunk
    assert store.object_writes(bucket, mark) == [key]
    assert store.get(bucket, key) == big
    info = store.info(bucket, key)
    assert int(info["size"]) == len(big)
    assert info["md5Hash"] == gs_md5(big)

    mark = store.mark()
    again = run_cli("push", str(src), dest)
    assert again.rc == 0, again
    assert again.result == {"objects": 1, "totalBytes": len(big), "transferred": 0, "skipped": 1}
    assert [h for h in store.since(mark) if h.op in ("part", "write")] == []
    assert store.version(bucket, key) == info["generation"]  # the object was not replaced


@GS_ONLY
def test_push_resends_a_chunk_that_failed(
    store: ObjectStore, run_cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    """A 503 on the middle chunk of a resumable upload: gcsfs sends that chunk again (after its
    backoff of 1-2 s) into the same session, and the push succeeds with the right bytes."""
    assert isinstance(store, FakeGCS)
    src, big = two_chunks_and_a_bit(tmp_path)
    bucket = store.bucket("push-retry")
    key = "out/model.bin"
    seen: list[Hit] = []

    def middle_chunk(hit: Hit) -> bool:
        if hit.bucket != bucket or hit.key != key or upload_session(hit) is None:
            return False
        seen.append(hit)
        return len(seen) == 2

    mark = store.mark()
    with store.fail(middle_chunk, times=1) as fault:
        result = run_cli("push", str(src), store.uri(bucket, "out"))
    assert result.rc == 0, result
    assert fault.served == 1
    assert result.result == {"objects": 1, "totalBytes": len(big), "transferred": 1, "skipped": 0}
    _, chunks = resumable(store, bucket, key, mark)
    assert len(chunks) == 4  # the three, and the middle one again
    assert chunks[1].query == chunks[2].query  # resent to the same session
    assert store.object_writes(bucket, mark) == [key]
    assert store.get(bucket, key) == big
    assert store.info(bucket, key)["md5Hash"] == gs_md5(big)
