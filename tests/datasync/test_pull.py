"""pull against either object store (moto's S3, fake-gcs-server's GCS JSON API): byte-identical
mirrors, filters, manifests, resume after SIGKILL, cache reuse without contacting the store, sources
that change under the pull. Every test runs once per store ([s3], [gs])."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from dgx_datasync import list_source, parse_uri
from dgx_datasync.sync import pull
from tests.datasync.conftest import (
    BOTH,
    CliResult,
    MotoS3,
    ObjectStore,
    Spawned,
)
from tests.gcs import FakeGCS, Hit
from tests.support.ports import free_port
from tests.support.wait import wait_until

pytestmark = BOTH

SMALL = 1000
BIG = 3
BIG_SIZE = 50 * 10**6


@dataclass
class Dataset:
    bucket: str
    prefix: str
    uri: str
    digests: dict[str, str]  # key (relative to the prefix) -> sha256 hex

    def small_keys(self) -> set[str]:
        return {k for k in self.digests if k.startswith("small/")}

    def big_keys(self) -> set[str]:
        return {k for k in self.digests if k.startswith("big/")}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def dataset(store: ObjectStore) -> Dataset:
    """1,000 small objects (0-8 KiB, random) in ten directories, and three of 50 MB; on S3 one of them
    is a multipart upload (its ETag has a "-"), on GCS each lists its generation."""
    rng = random.Random(20261129)
    bucket = store.bucket("pull")
    prefix = "datasets/v1"
    objects = {f"small/d{i % 10}/f{i:04d}.bin": rng.randbytes(rng.randint(0, 8192)) for i in range(SMALL)}
    digests = {key: _sha(data) for key, data in objects.items()}
    store.put_many(bucket, {f"{prefix}/{key}": data for key, data in objects.items()})
    for i in range(BIG):
        data = os.urandom(BIG_SIZE)
        key = f"big/shard-{i}.bin"
        digests[key] = _sha(data)
        if i == 0 and isinstance(store, MotoS3):
            from boto3.s3.transfer import TransferConfig

            config = TransferConfig(multipart_threshold=16 * 2**20, multipart_chunksize=16 * 2**20)
            store.client.upload_fileobj(io.BytesIO(data), bucket, f"{prefix}/{key}", Config=config)
        else:
            store.put(bucket, f"{prefix}/{key}", data)
    # Our own state under the prefix is never listed, nor pulled.
    store.put(bucket, f"{prefix}/.kubedgx/probe", b"")
    version = store.version(bucket, f"{prefix}/big/shard-0.bin")
    if store.scheme == "s3":
        assert "-" in version  # a multipart ETag: not the md5 of the bytes
    else:
        assert version.isdigit()  # GCS has no multipart ETag: the generation stands for the version
    return Dataset(bucket, prefix, store.uri(bucket, prefix), digests)


def local_digests(root: Path) -> dict[str, str]:
    out = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not rel.startswith(".kubedgx/"):
            out[rel] = _sha(path.read_bytes())
    return out


def partial_files(root: Path) -> list[Path]:
    return list(root.rglob("*kubedgx-partial*"))


def test_pull_mirrors_the_prefix_byte_for_byte(
    store: ObjectStore, dataset: Dataset, run_cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    dest = tmp_path / "data"
    mark = store.mark()
    first = run_cli("pull", dataset.uri, str(dest), "--workers", "8")
    assert first.rc == 0, first
    assert local_digests(dest) == dataset.digests
    gets = store.object_gets(dataset.bucket, mark)
    assert set(gets) == {f"{dataset.prefix}/{k}" for k in dataset.digests}  # .kubedgx/probe never read
    assert set(gets.values()) == {1}

    listing = list_source(parse_uri(dataset.uri), store.options())
    assert len(listing.objects) == SMALL + BIG
    # What a listing records per object is the store's version of it: S3's ETag, GCS's generation.
    assert {o.key: o.etag for o in listing.objects if o.key.startswith("big/")} == {
        k: store.version(dataset.bucket, f"{dataset.prefix}/{k}") for k in dataset.big_keys()
    }
    manifest = json.loads((dest / ".kubedgx" / "manifest.json").read_text())
    assert manifest["version"] == 1
    assert manifest["source"] == dataset.uri
    assert manifest["digest"] == listing.digest
    assert manifest["totalBytes"] == listing.total_bytes
    assert [(o["key"], o["size"], o["etag"]) for o in manifest["objects"]] == [
        (o.key, o.size, o.etag) for o in listing.objects
    ]
    assert not (dest / ".kubedgx" / "journal.jsonl").exists()
    expected = {
        "objects": SMALL + BIG,
        "totalBytes": listing.total_bytes,
        "digest": listing.digest,
        "transferred": SMALL + BIG,
        "skipped": 0,
        "reused": False,
    }
    assert first.result == expected
    assert first.termination == expected

    # Nothing changed: the second pull lists and reads no object.
    mark = store.mark()
    second = run_cli("pull", dataset.uri, str(dest))
    assert second.rc == 0, second
    assert second.result["transferred"] == 0
    assert second.result["skipped"] == SMALL + BIG
    assert second.result["digest"] == listing.digest
    assert any(h.op == "list" and h.bucket == dataset.bucket for h in store.since(mark))
    assert sum(store.object_gets(dataset.bucket, mark).values()) == 0

    # list prints the same summary the operator records.
    listed = run_cli("list", dataset.uri)
    assert listed.rc == 0, listed
    assert listed.result == {
        "source": dataset.uri,
        "objects": SMALL + BIG,
        "totalBytes": listing.total_bytes,
        "digest": listing.digest,
    }


def test_include_exclude(store: ObjectStore, dataset: Dataset, tmp_path: Path) -> None:
    include, exclude = ["small/d1/*", "small/d2/*", "big/shard-9*"], ["*/f00??.bin"]
    source = parse_uri(dataset.uri)
    mark = store.mark()
    result = pull(source, tmp_path, store.options(), include=include, exclude=exclude)
    expected = {
        k: v for k, v in dataset.digests.items() if k.startswith(("small/d1/", "small/d2/")) and int(k[-8:-4]) >= 100
    }
    assert len(expected) == 180
    assert local_digests(tmp_path) == expected
    assert set(store.object_gets(dataset.bucket, mark)) == {f"{dataset.prefix}/{k}" for k in expected}
    listing = list_source(source, store.options(), include, exclude)
    assert result["digest"] == listing.digest
    assert result["objects"] == len(expected)
    assert {o.key for o in listing.objects} == set(expected)


def _token_requests(store: ObjectStore) -> int:
    """Access tokens the gs data plane asked for (S3 signs each request itself: none)."""
    return store.token_requests("admin") if isinstance(store, FakeGCS) else 0


def test_reuse_skips_the_store_entirely(
    store: ObjectStore, dataset: Dataset, run_cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    dest = tmp_path / "cache"
    args = ["--include", "small/d3/*"]
    tokens = _token_requests(store)
    first = run_cli("pull", dataset.uri, str(dest), *args)
    assert first.rc == 0, first
    digest = first.result["digest"]
    if store.scheme == "gs":
        assert _token_requests(store) > tokens  # the check below would see a token request

    # With the store out of reach (a closed port), a verified local copy is enough.
    closed = f"http://127.0.0.1:{free_port()}"
    mark, tokens = store.mark(), _token_requests(store)
    reused = run_cli("pull", dataset.uri, str(dest), *args, "--expect-digest", digest, "--reuse", endpoint=closed)
    assert reused.rc == 0, reused
    assert reused.result == {
        "objects": 100,
        "totalBytes": first.result["totalBytes"],
        "digest": digest,
        "transferred": 0,
        "skipped": 100,
        "reused": True,
    }
    assert reused.termination["reused"] is True
    assert store.since(mark) == []  # not one request, not even a listing
    assert _token_requests(store) == tokens  # (gs) nor a token for one

    # A local file that no longer matches its manifest: no reuse, the store is asked and repairs it.
    victim = next(iter(sorted((dest / "small" / "d3").iterdir())))
    victim.write_bytes(victim.read_bytes() + b"x")
    mark = store.mark()
    repaired = run_cli("pull", dataset.uri, str(dest), *args, "--expect-digest", digest, "--reuse")
    assert repaired.rc == 0, repaired
    assert repaired.result["reused"] is False
    assert repaired.result["transferred"] == 1
    assert "not reusing the local copy" in repaired.stderr
    assert store.object_gets(dataset.bucket, mark) == {f"{dataset.prefix}/small/d3/{victim.name}": 1}
    assert local_digests(dest) == {k: v for k, v in dataset.digests.items() if k.startswith("small/d3/")}

    # A pull into it that did not finish (its journal is there): its files may not match the manifest.
    journal = dest / ".kubedgx" / "journal.jsonl"
    journal.write_text(json.dumps({"key": "small/d3/f0003.bin", "replacing": True}) + "\n")
    mark = store.mark()
    unfinished = run_cli("pull", dataset.uri, str(dest), *args, "--expect-digest", digest, "--reuse")
    assert unfinished.rc == 0, unfinished
    assert unfinished.result["reused"] is False
    assert "a pull into it did not finish" in unfinished.stderr
    assert unfinished.result["transferred"] == 1  # the record withdrawn by "replacing" is fetched again
    assert store.object_gets(dataset.bucket, mark) == {f"{dataset.prefix}/small/d3/f0003.bin": 1}
    assert not journal.exists()

    # A different expected digest (the data changed since the mount was listed): warn, pull the current.
    other = run_cli("pull", dataset.uri, str(dest), *args, "--expect-digest", "sha256:" + "0" * 64, "--reuse")
    assert other.rc == 0, other
    assert other.result["digest"] == digest
    assert "the source changed since the DGXDataMount was listed" in other.stderr


def _journal_keys(path: Path) -> set[str]:
    keys = set()
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError):
                keys.add(json.loads(line)["key"])
    return keys


def test_pull_resumes_after_sigkill(
    store: ObjectStore,
    dataset: Dataset,
    spawn_cli: Callable[..., Spawned],
    run_cli: Callable[..., CliResult],
    tmp_path: Path,
) -> None:
    """300 object GETs are let through, the rest held; once the journal has those 300, SIGKILL. The
    second run reads exactly the objects the journal did not have, each once."""
    dest = tmp_path / "resume"
    journal = dest / ".kubedgx" / "journal.jsonl"
    small = dataset.small_keys()
    prefix = f"{dataset.prefix}/small/"

    def small_get(hit: Hit) -> bool:
        return hit.op == "get" and hit.bucket == dataset.bucket and (hit.key or "").startswith(prefix)

    with store.gate(small_get, allow=300) as gate:
        proc = spawn_cli("pull", dataset.uri, str(dest), "--include", "small/*", "--workers", "8")
        wait_until(gate.held.is_set, timeout=60, what="the pull to reach the held requests")
        wait_until(lambda: len(_journal_keys(journal)) >= 300, timeout=60, what="300 journalled files")
        proc.signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    done = _journal_keys(journal)
    assert len(done) == 300
    assert done < small
    assert partial_files(dest)  # the held downloads left partial files behind

    mark = store.mark()
    second = run_cli("pull", dataset.uri, str(dest), "--include", "small/*")
    assert second.rc == 0, second
    gets = store.object_gets(dataset.bucket, mark)
    fetched = {k.removeprefix(f"{dataset.prefix}/") for k in gets}
    assert fetched == small - done
    assert set(gets.values()) == {1}
    assert second.result["transferred"] == SMALL - 300
    assert second.result["skipped"] == 300
    assert local_digests(dest) == {k: dataset.digests[k] for k in small}
    assert partial_files(dest) == []
    assert "partialFilesRemoved" in second.stderr


def test_object_replaced_during_the_pull(store: ObjectStore, tmp_path: Path) -> None:
    """Every GET is pinned to the listed version (S3: If-Match on the ETag; GCS: the generation): an
    object overwritten after the listing fails its GET (412 / 404); the pull lists again and gets the
    new version instead of mixing the two."""
    bucket = store.bucket("changing")
    store.put_many(bucket, {f"p/f{i:02d}": b"old-%d" % i for i in range(20)})
    old = store.version(bucket, "p/f07")

    def target(hit: Hit) -> bool:
        return hit.op == "get" and hit.bucket == bucket and hit.key == "p/f07"

    def overwrite() -> None:
        # The same size: only the version (ETag, generation) tells them apart.
        store.put(bucket, "p/f07", b"NEW-7")

    source = parse_uri(store.uri(bucket, "p"))
    mark = store.mark()
    with store.gate(target, action=overwrite) as gate:
        result = pull(source, tmp_path, store.options(), workers=4)
        assert gate.held.is_set()
    hits = store.since(mark)
    new = store.version(bucket, "p/f07")
    assert new != old
    assert (tmp_path / "f07").read_bytes() == b"NEW-7"
    assert (tmp_path / "f06").read_bytes() == b"old-6"
    listing = list_source(source, store.options())
    assert result["digest"] == listing.digest
    assert {o.key: o.etag for o in listing.objects}["f07"] == new
    manifest = json.loads((tmp_path / ".kubedgx" / "manifest.json").read_text())
    assert {o["key"]: o["etag"] for o in manifest["objects"]}["f07"] == new

    # The GET the gate held (for the old version) was refused; only f07 was read again, after a new listing.
    gets = store.object_gets(bucket, mark)
    assert gets == {f"p/f{i:02d}": 2 if i == 7 else 1 for i in range(20)}
    assert [h.op for h in hits if h.op == "list" and h.bucket == bucket] == ["list", "list"]
    f07 = [h for h in hits if target(h)]
    refusal = 412 if store.scheme == "s3" else 404  # If-Match failed / that generation is gone
    assert [h.status for h in f07] == [refusal, 200]
    if store.scheme == "gs":
        assert [parse_qs(h.query).get("generation") for h in f07] == [[old], [new]]


def test_empty_prefix_is_an_empty_mirror(store: ObjectStore, run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    bucket = store.bucket("empty")
    result = run_cli("pull", store.uri(bucket, "nothing/here"), str(tmp_path / "d"))
    assert result.rc == 0, result
    assert result.result["objects"] == 0
    assert result.result["digest"] == "sha256:" + hashlib.sha256(b"").hexdigest()
    assert (tmp_path / "d" / ".kubedgx" / "manifest.json").is_file()


def test_concurrent_pulls_into_one_directory(
    store: ObjectStore, spawn_cli: Callable[..., Spawned], tmp_path: Path
) -> None:
    """Two pods on one node pulling the same mount into the same cache: the second waits for the
    first's lock, then finds every file there; each object is read once."""
    bucket = store.bucket("shared")
    store.put_many(bucket, {f"d/f{i:03d}": b"%d" % i * (i + 1) for i in range(200)})
    dest = tmp_path / "cache"
    mark = store.mark()

    def get(hit: Hit) -> bool:
        return hit.op == "get" and hit.key_in(bucket) is not None

    with store.gate(get, allow=50) as gate:
        first = spawn_cli("pull", store.uri(bucket, "d"), str(dest))
        wait_until(gate.held.is_set, timeout=60, what="the first pull to be under way")
        second = spawn_cli("pull", store.uri(bucket, "d"), str(dest))
        wait_until(lambda: "is running; waiting for it" in second.stderr, timeout=60, what="the second pull to wait")
    assert first.wait(60) == 0, first.stderr
    assert second.wait(60) == 0, second.stderr
    assert first.termination["transferred"] == 200
    assert second.termination["transferred"] == 0
    gets = store.object_gets(bucket, mark)
    assert len(gets) == 200
    assert set(gets.values()) == {1}
    assert (dest / "f150").read_bytes() == b"150" * 151
