"""What a user sees when the store says no: exit 2 and exactly one line for problems a retry cannot
fix, exit 1 for an unreachable store after quick retries; the termination message either way.

Credential tests switch moto's IAM authentication on (``s3.auth()``) and use bucket-root URIs (see
the quirk noted in conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dgx_datasync import StoreOptions, SyncError, check_writable, list_source, parse_uri
from tests.datasync.conftest import REGION, CliResult, MotoS3
from tests.support.ports import free_port


def assert_one_line(result: CliResult, rc: int, reason: str, *fragments: str) -> None:
    assert result.rc == rc, result
    assert len(result.stderr_lines) == 1, result
    line = result.stderr_lines[0]
    assert line.startswith("datasync: "), line
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in line, line
    assert result.termination == {"error": reason, "message": line.removeprefix("datasync: ")}
    assert result.stdout == ""


@pytest.fixture(scope="module")
def filled(s3: MotoS3) -> str:
    bucket = s3.bucket("auth")
    for i in range(5):
        s3.client.put_object(Bucket=bucket, Key=f"f{i}", Body=b"x" * i)
    return bucket


def test_wrong_access_key(s3: MotoS3, filled: str, run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    with s3.auth():
        bad = {"AWS_ACCESS_KEY_ID": "AKIANOSUCHKEY0000000", "AWS_SECRET_ACCESS_KEY": "wrong"}
        result = run_cli("pull", f"s3://{filled}", str(tmp_path / "d"), env=bad)
    assert_one_line(result, 2, "CredentialsInvalid", "InvalidAccessKeyId", f"s3://{filled}", "credentials Secret")


def test_wrong_secret(s3: MotoS3, filled: str, run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    with s3.auth() as users:
        bad = {**users["good"], "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
        result = run_cli("list", f"s3://{filled}", env=bad)
    assert_one_line(result, 2, "CredentialsInvalid", "SignatureDoesNotMatch")


def test_access_denied(s3: MotoS3, filled: str, run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    with s3.auth() as users:
        result = run_cli("pull", f"s3://{filled}", str(tmp_path / "d"), env=users["nobody"])
        writable = run_cli("watch", str(tmp_path / "out"), f"s3://{filled}", "--once", env=users["nobody"])
    assert_one_line(result, 2, "AccessDenied", f"bucket '{filled}'")
    assert_one_line(writable, 2, "AccessDenied")


def test_good_credentials_under_authentication(
    s3: MotoS3, filled: str, run_cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    """The keys really come from the environment: the same command with the good user works."""
    with s3.auth() as users:
        result = run_cli("pull", f"s3://{filled}", str(tmp_path / "d"), env=users["good"])
        listing = list_source(
            parse_uri(f"s3://{filled}"), StoreOptions(endpoint_url=s3.endpoint, region=REGION, env=users["good"])
        )
        with pytest.raises(SyncError) as denied:
            check_writable(
                parse_uri(f"s3://{filled}"),
                StoreOptions(endpoint_url=s3.endpoint, region=REGION, env=users["nobody"]),
            )
    assert result.rc == 0, result
    assert result.result["objects"] == 5
    assert result.result["digest"] == listing.digest
    assert denied.value.reason == "AccessDenied"


def test_missing_credentials(run_cli: Callable[..., CliResult], filled: str, tmp_path: Path) -> None:
    """No keys and no ambient identity (metadata service off, no config files)."""
    result = run_cli("pull", f"s3://{filled}", str(tmp_path / "d"), credentials=False)
    assert_one_line(result, 2, "CredentialsMissing", "spec.credentialsSecretRef")
    half = run_cli("list", f"s3://{filled}", credentials=False, env={"AWS_ACCESS_KEY_ID": "AKIAONLYTHEKEY000000"})
    assert_one_line(half, 2, "CredentialsMissing", "AWS_SECRET_ACCESS_KEY is not")


def test_missing_bucket(s3: MotoS3, run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    result = run_cli("pull", "s3://no-such-bucket-here/data", str(tmp_path / "d"))
    assert_one_line(result, 2, "BucketNotFound", "bucket 'no-such-bucket-here' does not exist", "spec.source")
    push_dir = tmp_path / "up"
    push_dir.mkdir()
    (push_dir / "f").write_bytes(b"1")
    pushed = run_cli("push", str(push_dir), "s3://no-such-bucket-here/data")
    assert_one_line(pushed, 2, "BucketNotFound")
    restored = run_cli("restore", "s3://no-such-bucket-here/ckpt", str(tmp_path / "r"))
    assert_one_line(restored, 2, "BucketNotFound")


@pytest.mark.parametrize(
    ("uri", "fragment"),
    [("http://bucket/data", "unsupported scheme"), ("s3://", "no bucket"), ("s3://UPPER/data", "invalid bucket")],
)
def test_bad_uri(run_cli: Callable[..., CliResult], uri: str, fragment: str, tmp_path: Path) -> None:
    result = run_cli("pull", uri, str(tmp_path / "d"))
    assert_one_line(result, 2, "InvalidURI", fragment)


def test_unreachable_endpoint(run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    """A closed port: botocore's few quick retries, then exit 1 (transient: the caller may retry).

    "Quick" against a baseline run side by side, not a wall clock alone: the same command line
    refusing a URI before any network (the interpreter's start and imports, which a loaded machine
    stretches), plus what the retries may add."""
    closed = f"http://127.0.0.1:{free_port()}"
    baseline = run_cli("pull", "http://bucket/data", str(tmp_path / "b"), endpoint=closed, timeout=60)
    assert baseline.rc == 2, baseline
    result = run_cli("pull", "s3://bucket/data", str(tmp_path / "d"), endpoint=closed, timeout=60)
    assert_one_line(result, 1, "Unreachable", closed, "s3://bucket/data")
    assert result.seconds - baseline.seconds < 15, (result.seconds, baseline.seconds)


def test_gs_missing_key_file(run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    """gs:// credential problems are caught before any request (no GCS here to talk to)."""
    missing = tmp_path / "key.json"
    result = run_cli("list", "gs://bucket/data", endpoint=None, env={"GOOGLE_APPLICATION_CREDENTIALS": str(missing)})
    assert_one_line(result, 2, "CredentialsMissing", str(missing), "does not exist")
