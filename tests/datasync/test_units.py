"""Pure parts of dgx_datasync: URIs, globs, digests, ETags, error mapping, gs credentials."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from dgx_datasync import Listing, Location, ObjectInfo, StoreOptions, SyncError, listing_digest, parse_uri
from dgx_datasync.cli import fit_termination
from dgx_datasync.errors import classify
from dgx_datasync.local import check_collisions, local_path
from dgx_datasync.store import (
    MAX_PARTS,
    PART_SIZE,
    filesystem_kwargs,
    is_state_key,
    make_filesystem,
    multipart_etag,
    part_size_for,
    s3_etag,
    selected,
)

# -- URIs -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://bucket/some/prefix", Location("s3", "bucket", "some/prefix")),
        ("s3://bucket/some/prefix/", Location("s3", "bucket", "some/prefix")),
        ("s3://bucket//some/prefix//", Location("s3", "bucket", "some/prefix")),
        ("s3://bucket", Location("s3", "bucket", "")),
        ("s3://bucket/", Location("s3", "bucket", "")),
        ("gs://my_bucket.v2/data", Location("gs", "my_bucket.v2", "data")),
        ("s3://bucket/Mixed/Case.txt", Location("s3", "bucket", "Mixed/Case.txt")),
    ],
)
def test_parse_uri_good(uri: str, expected: Location) -> None:
    loc = parse_uri(uri)
    assert loc == expected
    assert parse_uri(loc.uri) == loc  # the canonical form parses to itself
    assert not loc.uri.endswith("/")


@pytest.mark.parametrize(
    ("uri", "fragment"),
    [
        ("", "empty"),
        ("s3://", "no bucket"),
        ("s3:///prefix", "no bucket"),
        ("http://bucket/prefix", "unsupported scheme 'http://'"),
        ("file:///tmp/x", "unsupported scheme"),
        ("bucket/prefix", "not an object-store URI"),
        ("s3://Bucket/prefix", "invalid bucket name 'Bucket'"),
        ("s3://ab/prefix", "invalid bucket name 'ab'"),
        ("s3://-bucket/prefix", "invalid bucket name"),
        ("s3://bucket/a/../b", "'..'"),
        ("s3://bucket/a//b", "empty"),
        ("s3://bucket/with space", "whitespace"),
    ],
)
def test_parse_uri_bad(uri: str, fragment: str) -> None:
    with pytest.raises(SyncError) as info:
        parse_uri(uri)
    assert info.value.reason == "InvalidURI"
    assert not info.value.transient
    assert fragment in info.value.message
    assert "\n" not in info.value.message
    assert str(info.value) == info.value.message


def test_location_child_and_uri() -> None:
    root = parse_uri("s3://bucket")
    assert root.uri == "s3://bucket"
    assert root.child("a", "/b/", "", "c.txt") == Location("s3", "bucket", "a/b/c.txt")
    data = parse_uri("gs://bucket/data")
    assert data.child("x").uri == "gs://bucket/data/x"
    assert data.path == "bucket/data"


# -- filtering, digests, ETags ------------------------------------------------------------------------


def test_globs_cross_slashes() -> None:
    assert selected("a/b/c.bin", ["*.bin"], [])
    assert selected("a/b/c.bin", [], [])
    assert not selected("a/b/c.txt", ["*.bin"], [])
    assert not selected("a/b/c.bin", [], ["a/*"])
    assert selected("a/b/c.bin", ["a/*", "z/*"], ["*.txt"])
    assert not selected("a/b/c.txt", ["a/*"], ["*.txt"])  # exclude wins
    assert selected("x/[x].bin", ["x/[[]x].bin"], [])


def test_state_keys_are_ours() -> None:
    assert is_state_key(".kubedgx/probe")
    assert is_state_key("data/.kubedgx/journal.jsonl")
    assert not is_state_key("data/.kubedgx")  # a file named so is data
    assert not is_state_key("data/kubedgx/x")


def test_digest_is_order_independent_and_sensitive() -> None:
    objects = [ObjectInfo("b", 2, "e2"), ObjectInfo("a", 1, "e1"), ObjectInfo("c/d", 3, "e3")]
    digest = listing_digest(objects)
    assert digest.startswith("sha256:")
    assert listing_digest(reversed(objects)) == digest
    expected = hashlib.sha256(b"a\t1\te1\nb\t2\te2\nc/d\t3\te3\n").hexdigest()
    assert digest == f"sha256:{expected}"
    assert listing_digest([ObjectInfo("b", 3, "e2"), *objects[1:]]) != digest
    assert listing_digest([ObjectInfo("b", 2, "e9"), *objects[1:]]) != digest
    assert listing_digest(objects[1:]) != digest
    listing = Listing("s3://b/p", tuple(sorted(objects, key=lambda o: o.key)))
    assert listing.digest == digest
    assert listing.total_bytes == 6


def test_multipart_etag(tmp_path: Path) -> None:
    part = 1024
    data = os.urandom(2 * part + 100)
    path = tmp_path / "f"
    path.write_bytes(data)
    digests = b"".join(hashlib.md5(data[i : i + part]).digest() for i in (0, part, 2 * part))
    assert multipart_etag(path, part) == hashlib.md5(digests).hexdigest() + "-3"


def test_s3_etag_follows_the_upload_rule(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.write_bytes(b"hello")
    assert s3_etag(small) == hashlib.md5(b"hello").hexdigest()
    # s3fs sends one PUT below two parts' worth: exactly two parts is multipart.
    big = tmp_path / "big"
    with big.open("wb") as f:
        f.truncate(2 * PART_SIZE)
    assert s3_etag(big).endswith("-2")
    assert part_size_for(10) == PART_SIZE
    assert part_size_for(PART_SIZE * MAX_PARTS) == PART_SIZE
    grown = part_size_for(PART_SIZE * MAX_PARTS + 1)
    assert grown > PART_SIZE
    assert grown % 2**20 == 0
    assert (PART_SIZE * MAX_PARTS + 1) / grown <= MAX_PARTS


def test_local_paths_refuse_escapes(tmp_path: Path) -> None:
    assert local_path(tmp_path, "a/b.bin") == tmp_path / "a" / "b.bin"
    for key in ("../x", "a/../../x", "a//b", "/abs", "a/./b", "a/.b.kubedgx-partial-0123456789ab"):
        with pytest.raises(SyncError) as info:
            local_path(tmp_path, key)
        assert info.value.reason == "LocalError"
    check_collisions(["a/b", "a/c", "ab"])
    with pytest.raises(SyncError, match="cannot both exist locally"):
        check_collisions(["a", "a/b"])


def test_journal_records_and_withdrawals(tmp_path: Path) -> None:
    """A completion vouches for a file; a "replacing" line withdraws what an earlier record (or the
    manifest) said, until the new completion; a torn last line is ignored."""
    from dgx_datasync.local import Journal, StateDir

    manifest = {"a": (1, "e1"), "b": (2, "e2")}
    with StateDir.open(tmp_path) as state:
        journal = Journal(state, "journal.jsonl")
        journal.record(ObjectInfo("c", 3, "e3"))
        journal.replacing("a")
        journal.replacing("b")
        journal.record(ObjectInfo("b", 2, "e2-new"))
        journal.close()
        with (tmp_path / ".kubedgx" / "journal.jsonl").open("a") as f:
            f.write('{"key": "d", "si')  # a kill in the middle of nothing we write, but be lenient
        assert Journal.read(state, "journal.jsonl", manifest) == {"b": (2, "e2-new"), "c": (3, "e3")}
        assert manifest == {"a": (1, "e1"), "b": (2, "e2")}  # not modified
        assert Journal.pending(state, "journal.jsonl")
        assert not Journal.pending(state, "none")


def test_termination_message_stays_whole_json() -> None:
    text = fit_termination({"checkpoints": list(range(0, 2_000_000, 100)), "artifacts": []})
    assert len(text.encode()) <= 4096
    data = json.loads(text)
    assert data["checkpoints"][-1] == 1_999_900  # the newest are kept
    assert data["checkpointsOmitted"] + len(data["checkpoints"]) == 20_000
    text = fit_termination({"error": "Unreachable", "message": "ü" * 5000})
    assert len(text.encode()) <= 4096
    assert json.loads(text)["error"] == "Unreachable"


# -- error mapping ----------------------------------------------------------------------------------


def _client_error(code: str, status: int, wrap: type[Exception] = PermissionError) -> Exception:
    """What s3fs raises: a builtin exception whose __cause__ is botocore's ClientError."""
    from botocore.exceptions import ClientError

    cause = ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "ListObjectsV2"
    )
    exc = wrap("m")
    exc.__cause__ = cause
    return exc


@pytest.mark.parametrize(
    ("exc", "reason", "transient"),
    [
        (_client_error("NoSuchBucket", 404, FileNotFoundError), "BucketNotFound", False),
        (_client_error("InvalidAccessKeyId", 403), "CredentialsInvalid", False),
        (_client_error("SignatureDoesNotMatch", 403), "CredentialsInvalid", False),
        (_client_error("ExpiredToken", 400), "CredentialsInvalid", False),
        (_client_error("AccessDenied", 403), "AccessDenied", False),
        (_client_error("403", 403), "AccessDenied", False),
        (_client_error("PreconditionFailed", 412, OSError), "SourceChanged", False),
        (_client_error("InternalError", 500, OSError), "Unreachable", True),
        (_client_error("SlowDown", 503, OSError), "Unreachable", True),
        (ConnectionRefusedError(111, "refused"), "Unreachable", True),
        (TimeoutError("timed out"), "Unreachable", True),
    ],
)
def test_classify_s3(exc: Exception, reason: str, transient: bool) -> None:
    error = classify(exc, "s3://bkt/data", "bkt", endpoint="http://minio:9000")
    assert error is not None
    assert (error.reason, error.transient) == (reason, transient)
    assert "\n" not in error.message
    assert "s3://bkt/data" in error.message or "'bkt'" in error.message


def test_classify_botocore_exceptions() -> None:
    from botocore.exceptions import EndpointConnectionError, NoCredentialsError

    error = classify(EndpointConnectionError(endpoint_url="http://x"), "s3://b/p", "b")
    assert error is not None
    assert error.reason == "Unreachable"
    assert error.transient
    error = classify(NoCredentialsError(), "s3://b/p", "b")
    assert error is not None
    assert error.reason == "CredentialsMissing"


def test_classify_gcs_http_errors() -> None:
    from gcsfs.retry import HttpError

    def http_error(code: int, message: str) -> Exception:
        error: Exception = HttpError({"code": code, "message": message})
        return error

    cases = {
        401: ("Invalid Credentials", "CredentialsInvalid"),
        403: ("x@p.iam.gserviceaccount.com does not have storage.objects.list access", "AccessDenied"),
        404: ("The specified bucket does not exist.", "BucketNotFound"),
        503: ("Backend Error", "Unreachable"),
    }
    for code, (message, reason) in cases.items():
        error = classify(http_error(code, message), "gs://b/p", "b")
        assert error is not None, code
        assert error.reason == reason, code


def test_classify_what_gcsfs_and_google_auth_raise_besides_http_errors() -> None:
    """gcsfs's validate_response raises a bare OSError for a 403 and FileExistsError for a 412; a
    refused key surfaces as google-auth's RefreshError under gcsfs's NonRetryableError."""
    from gcsfs.retry import NonRetryableError
    from google.auth.exceptions import RefreshError

    said = "sa@p.iam.gserviceaccount.com does not have storage.objects.create access to the bucket."
    forbidden = classify(OSError(f"Forbidden: http://h/upload/storage/v1/b/b/o\n{said}"), "gs://b/p", "b")
    assert forbidden is not None
    assert forbidden.reason == "AccessDenied"
    assert said in forbidden.message
    assert "roles/storage.objectAdmin" in forbidden.message
    changed = classify(FileExistsError("http://h/b/o"), "gs://b/p", "b")
    assert changed is not None
    assert changed.reason == "SourceChanged"
    # A local file that exists is not the store's precondition.
    assert classify(FileExistsError(17, "File exists", "/data/x"), "gs://b/p", "b") is None
    try:
        try:
            raise RefreshError("invalid_grant: Invalid JWT Signature.", {"error": "invalid_grant"}, retryable=False)
        except RefreshError as cause:
            raise NonRetryableError(str(cause)) from cause
    except NonRetryableError as exc:
        refused = classify(exc, "gs://b/p", "b")
    assert refused is not None
    assert refused.reason == "CredentialsInvalid"
    assert "invalid_grant: Invalid JWT Signature." in refused.message
    assert "service-account.json" in refused.message
    # On s3 a 401 still names the access key, not a service-account key.
    from gcsfs.retry import HttpError

    s3_refused = classify(HttpError({"code": 401, "message": "no"}), "s3://b/p", "b")
    assert s3_refused is not None
    assert "access key" in s3_refused.message


def test_unknown_errors_pass_through() -> None:
    assert classify(ValueError("boom"), "s3://b/p", "b") is None
    assert classify(FileNotFoundError("b/p/key"), "s3://b/p", "b") is None


def test_sync_error_shape() -> None:
    err = SyncError("AccessDenied", "line one\nline two")
    assert str(err) == "line one line two"
    assert err.transient is False
    with pytest.raises(ValueError, match="unknown SyncError reason"):
        SyncError("Nope", "x")


# -- credentials ------------------------------------------------------------------------------------


def test_s3_credentials_from_options_env() -> None:
    loc = parse_uri("s3://bucket/p")
    kwargs = filesystem_kwargs(
        loc,
        StoreOptions(
            endpoint_url="http://minio:9000",
            region="eu-west-1",
            env={"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t"},
        ),
    )
    assert (kwargs["key"], kwargs["secret"], kwargs["token"]) == ("k", "s", "t")
    assert kwargs["endpoint_url"] == "http://minio:9000"
    assert kwargs["client_kwargs"] == {"region_name": "eu-west-1"}
    assert kwargs["skip_instance_cache"] is True
    assert kwargs["config_kwargs"]["retries"]["total_max_attempts"] == 3
    ambient = filesystem_kwargs(loc, StoreOptions(env={}))
    assert "key" not in ambient  # botocore's chain decides
    with pytest.raises(SyncError) as info:
        filesystem_kwargs(loc, StoreOptions(env={"AWS_ACCESS_KEY_ID": "k"}))
    assert info.value.reason == "CredentialsMissing"
    assert "AWS_SECRET_ACCESS_KEY is not" in info.value.message


def _service_account(path: Path) -> dict[str, Any]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    data = {
        "type": "service_account",
        "project_id": "kubedgx-test",
        "private_key_id": "1",
        "private_key": pem,
        "client_email": "sync@kubedgx-test.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    path.write_text(json.dumps(data), encoding="utf-8")
    return data


def test_gs_service_account_file_becomes_the_token(tmp_path: Path) -> None:
    """Built offline: gcsfs loads a service-account key without a request; the token is fetched on
    first use (which these tests never make)."""
    key_file = tmp_path / "key.json"
    _service_account(key_file)
    loc = parse_uri("gs://bucket/data")
    options = StoreOptions(env={"GOOGLE_APPLICATION_CREDENTIALS": str(key_file)})
    assert filesystem_kwargs(loc, options)["token"] == str(key_file)
    fs = make_filesystem(loc, options)
    import gcsfs
    from gcsfs.core import GCSFileSystem

    # The plain JSON-API class, not gcsfs's default subclass that asks a gRPC API about each bucket
    # first (and waits 60 s for it where the endpoint has none).
    assert type(fs) is GCSFileSystem
    assert gcsfs.GCSFileSystem is not GCSFileSystem  # the default this guards against is still gcsfs's
    assert fs.credentials.credentials.service_account_email == "sync@kubedgx-test.iam.gserviceaccount.com"
    assert filesystem_kwargs(loc, StoreOptions(env={}))["token"] == "google_default"


def test_gs_missing_or_malformed_key_file(tmp_path: Path) -> None:
    loc = parse_uri("gs://bucket/data")
    with pytest.raises(SyncError) as info:
        make_filesystem(loc, StoreOptions(env={"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "nope.json")}))
    assert info.value.reason == "CredentialsMissing"
    assert "nope.json" in info.value.message
    assert "does not exist" in info.value.message
    bad = tmp_path / "bad.json"
    for content in ("not json", "[]", "{}"):
        bad.write_text(content, encoding="utf-8")
        with pytest.raises(SyncError) as info:
            make_filesystem(loc, StoreOptions(env={"GOOGLE_APPLICATION_CREDENTIALS": str(bad)}))
        assert info.value.reason == "CredentialsInvalid", content


def test_gs_google_default_without_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No key file and no application-default credentials on this machine: CredentialsMissing."""
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    with pytest.raises(SyncError) as info:
        make_filesystem(parse_uri("gs://bucket/data"), StoreOptions(env={}))
    assert info.value.reason == "CredentialsMissing"
