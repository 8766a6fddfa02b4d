"""pull against moto's S3 server: byte-identical mirrors, filters, manifests, resume after SIGKILL,
cache reuse without contacting the store, sources that change under the pull."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from dgx_datasync import StoreOptions, list_source, parse_uri
from dgx_datasync.sync import pull
from tests.datasync.conftest import (
    ACCESS_KEY,
    REGION,
    SECRET_KEY,
    CliResult,
    Hit,
    MotoS3,
    Spawned,
    free_port,
    wait_until,
)

SMALL = 1000
BIG = 3
BIG_SIZE = 50 * 10**6


@dataclass
class Dataset:
    bucket: str
    prefix: str
    digests: dict[str, str]  # key (relative to the prefix) -> sha256 hex

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def small_keys(self) -> set[str]:
        return {k for k in self.digests if k.startswith("small/")}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def dataset(s3: MotoS3) -> Dataset:
    """1,000 small objects (0-8 KiB, random) in ten directories, and three of 50 MB, one of them a
    multipart upload (its ETag has a "-")."""
    from boto3.s3.transfer import TransferConfig

    rng = random.Random(20261129)
    bucket = s3.bucket("pull")
    prefix = "datasets/v1"
    objects = {f"small/d{i % 10}/f{i:04d}.bin": rng.randbytes(rng.randint(0, 8192)) for i in range(SMALL)}
    digests = {key: _sha(data) for key, data in objects.items()}
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda kv: s3.client.put_object(Bucket=bucket, Key=f"{prefix}/{kv[0]}", Body=kv[1]), objects.items()
            )
        )
    config = TransferConfig(multipart_threshold=16 * 2**20, multipart_chunksize=16 * 2**20)
    for i in range(BIG):
        data = os.urandom(BIG_SIZE)
        key = f"big/shard-{i}.bin"
        digests[key] = _sha(data)
        if i == 0:
            s3.client.upload_fileobj(io.BytesIO(data), bucket, f"{prefix}/{key}", Config=config)
        else:
            s3.client.put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=data)
    # Our own state under the prefix is never listed, nor pulled.
    s3.client.put_object(Bucket=bucket, Key=f"{prefix}/.kubedgx/probe", Body=b"")
    assert "-" in s3.etag(bucket, f"{prefix}/big/shard-0.bin")
    return Dataset(bucket, prefix, digests)


def options(s3: MotoS3) -> StoreOptions:
    return StoreOptions(
        endpoint_url=s3.endpoint,
        region=REGION,
        env={"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY},
    )


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
    s3: MotoS3, dataset: Dataset, run_cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    dest = tmp_path / "data"
    mark = s3.mark()
    first = run_cli("pull", dataset.uri, str(dest), "--workers", "8")
    assert first.rc == 0, first
    assert local_digests(dest) == dataset.digests
    gets = s3.object_gets(dataset.bucket, mark)
    assert set(gets) == {f"{dataset.prefix}/{k}" for k in dataset.digests}  # .kubedgx/probe never read

    listing = list_source(parse_uri(dataset.uri), options(s3))
    assert len(listing.objects) == SMALL + BIG
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
    mark = s3.mark()
    second = run_cli("pull", dataset.uri, str(dest))
    assert second.rc == 0, second
    assert second.result["transferred"] == 0
    assert second.result["skipped"] == SMALL + BIG
    assert second.result["digest"] == listing.digest
    assert sum(s3.object_gets(dataset.bucket, mark).values()) == 0

    # list prints the same summary the operator records.
    listed = run_cli("list", dataset.uri)
    assert listed.rc == 0, listed
    assert listed.result == {
        "source": dataset.uri,
        "objects": SMALL + BIG,
        "totalBytes": listing.total_bytes,
        "digest": listing.digest,
    }


def test_include_exclude(s3: MotoS3, dataset: Dataset, tmp_path: Path) -> None:
    include, exclude = ["small/d1/*", "small/d2/*", "big/shard-9*"], ["*/f00??.bin"]
    source = parse_uri(dataset.uri)
    result = pull(source, tmp_path, options(s3), include=include, exclude=exclude)
    expected = {
        k: v for k, v in dataset.digests.items() if k.startswith(("small/d1/", "small/d2/")) and int(k[-8:-4]) >= 100
    }
    assert len(expected) == 180
    assert local_digests(tmp_path) == expected
    listing = list_source(source, options(s3), include, exclude)
    assert result["digest"] == listing.digest
    assert result["objects"] == len(expected)
    assert {o.key for o in listing.objects} == set(expected)


def test_reuse_skips_the_store_entirely(
    s3: MotoS3, dataset: Dataset, run_cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    dest = tmp_path / "cache"
    args = ["--include", "small/d3/*"]
    first = run_cli("pull", dataset.uri, str(dest), *args)
    assert first.rc == 0, first
    digest = first.result["digest"]

    # With the store out of reach (a closed port), a verified local copy is enough.
    closed = f"http://127.0.0.1:{free_port()}"
    mark = s3.mark()
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
    assert s3.since(mark) == []  # not one request, not even a listing

    # A local file that no longer matches its manifest: no reuse, the store is asked and repairs it.
    victim = next(iter(sorted((dest / "small" / "d3").iterdir())))
    victim.write_bytes(victim.read_bytes() + b"x")
    mark = s3.mark()
    repaired = run_cli("pull", dataset.uri, str(dest), *args, "--expect-digest", digest, "--reuse")
    assert repaired.rc == 0, repaired
    assert repaired.result["reused"] is False
    assert repaired.result["transferred"] == 1
    assert "not reusing the local copy" in repaired.stderr
    assert sum(s3.object_gets(dataset.bucket, mark).values()) == 1
    assert local_digests(dest) == {k: v for k, v in dataset.digests.items() if k.startswith("small/d3/")}

    # A pull into it that did not finish (its journal is there): its files may not match the manifest.
    journal = dest / ".kubedgx" / "journal.jsonl"
    journal.write_text(json.dumps({"key": "small/d3/f0003.bin", "replacing": True}) + "\n")
    unfinished = run_cli("pull", dataset.uri, str(dest), *args, "--expect-digest", digest, "--reuse")
    assert unfinished.rc == 0, unfinished
    assert unfinished.result["reused"] is False
    assert "a pull into it did not finish" in unfinished.stderr
    assert unfinished.result["transferred"] == 1  # the record withdrawn by "replacing" is fetched again
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
    s3: MotoS3,
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
    prefix = f"/{dataset.bucket}/{dataset.prefix}/small/"

    def small_get(hit: Hit) -> bool:
        return hit.method == "GET" and hit.path.startswith(prefix)

    with s3.gate(small_get, allow=300) as gate:
        proc = spawn_cli("pull", dataset.uri, str(dest), "--include", "small/*", "--workers", "8")
        wait_until(gate.held.is_set, 60, "the pull to reach the held requests")
        wait_until(lambda: len(_journal_keys(journal)) >= 300, 60, "300 journalled files")
        proc.signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    done = _journal_keys(journal)
    assert len(done) == 300
    assert done < small
    assert partial_files(dest)  # the held downloads left partial files behind

    mark = s3.mark()
    second = run_cli("pull", dataset.uri, str(dest), "--include", "small/*")
    assert second.rc == 0, second
    gets = s3.object_gets(dataset.bucket, mark)
    fetched = {k.removeprefix(f"{dataset.prefix}/") for k in gets}
    assert fetched == small - done
    assert set(gets.values()) == {1}
    assert second.result["transferred"] == SMALL - 300
    assert second.result["skipped"] == 300
    assert local_digests(dest) == {k: dataset.digests[k] for k in small}
    assert partial_files(dest) == []
    assert "partialFilesRemoved" in second.stderr


def test_object_replaced_during_the_pull(s3: MotoS3, tmp_path: Path) -> None:
    """If-Match on every GET: an object overwritten after the listing fails its GET (412); the pull
    lists again and gets the new version instead of mixing the two."""
    bucket = s3.bucket("changing")
    for i in range(20):
        s3.client.put_object(Bucket=bucket, Key=f"p/f{i:02d}", Body=b"old-%d" % i)
    target = f"/{bucket}/p/f07"

    def overwrite() -> None:
        # The same size: only the ETag tells the versions apart.
        s3.client.put_object(Bucket=bucket, Key="p/f07", Body=b"NEW-7")

    with s3.gate(lambda h: h.method == "GET" and h.path == target, action=overwrite) as gate:
        result = pull(parse_uri(f"s3://{bucket}/p"), tmp_path, options(s3), workers=4)
        assert gate.held.is_set()
    assert (tmp_path / "f07").read_bytes() == b"NEW-7"
    assert (tmp_path / "f06").read_bytes() == b"old-6"
    assert result["digest"] == list_source(parse_uri(f"s3://{bucket}/p"), options(s3)).digest


def test_empty_prefix_is_an_empty_mirror(s3: MotoS3, run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    bucket = s3.bucket("empty")
    result = run_cli("pull", f"s3://{bucket}/nothing/here", str(tmp_path / "d"))
    assert result.rc == 0, result
    assert result.result["objects"] == 0
    assert result.result["digest"] == "sha256:" + hashlib.sha256(b"").hexdigest()
    assert (tmp_path / "d" / ".kubedgx" / "manifest.json").is_file()


def test_concurrent_pulls_into_one_directory(s3: MotoS3, spawn_cli: Callable[..., Spawned], tmp_path: Path) -> None:
    """Two pods on one node pulling the same mount into the same cache: the second waits for the
    first's lock, then finds every file there; each object is read once."""
    bucket = s3.bucket("shared")
    for i in range(200):
        s3.client.put_object(Bucket=bucket, Key=f"d/f{i:03d}", Body=b"%d" % i * (i + 1))
    dest = tmp_path / "cache"
    mark = s3.mark()

    def get(hit: Hit) -> bool:
        return hit.method == "GET" and hit.key_in(bucket) is not None

    with s3.gate(get, allow=50) as gate:
        first = spawn_cli("pull", f"s3://{bucket}/d", str(dest))
        wait_until(gate.held.is_set, 60, "the first pull to be under way")
        second = spawn_cli("pull", f"s3://{bucket}/d", str(dest))
        wait_until(lambda: "is running; waiting for it" in second.stderr, 60, "the second pull to wait")
    assert first.wait(60) == 0, first.stderr
    assert second.wait(60) == 0, second.stderr
    assert first.termination["transferred"] == 200
    assert second.termination["transferred"] == 0
    gets = s3.object_gets(bucket, mark)
    assert len(gets) == 200
    assert set(gets.values()) == {1}
    assert (dest / "f150").read_bytes() == b"150" * 151
