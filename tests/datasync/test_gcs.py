"""What only gs:// has: the service-account key a pod mounts, Google's token endpoint, GCS's error
answers, against fake-gcs-server behind tests/gcs.py's authenticating proxy. Every case runs the
data plane's command line as the sync containers run it: exit code, one ``datasync:`` line, the
termination message the operator reads."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.datasync.conftest import CliResult, ObjectStore
from tests.gcs import FakeGCS

pytestmark = pytest.mark.parametrize("store", ["gs"], indirect=True)


def refused(result: CliResult, reason: str, *words: str) -> None:
    """Exit 2 (no retry helps), the reason in the termination message, one line naming the fix."""
    assert result.rc == 2, result
    assert result.termination["error"] == reason, result.termination
    message = result.termination["message"]
    for word in words:
        assert word in message, message
    last = result.stderr_lines[-1]
    assert last.startswith("datasync: "), result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_a_bucket_that_does_not_exist(store: ObjectStore, run_cli: Callable[..., CliResult], tmp_path: Path) -> None:
    source = tmp_path / "out"
    source.mkdir()
    (source / "a.txt").write_text("a")
    uri = "gs://kubedgx-no-such-bucket/prefix"
    for args in (("list", uri), ("pull", uri, str(tmp_path / "in")), ("push", str(source), uri)):
        refused(run_cli(*args), "BucketNotFound", "kubedgx-no-such-bucket", "does not exist")


def test_a_key_file_that_is_not_there_or_not_a_key(
    store: ObjectStore, run_cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    bucket = store.bucket(objects={"p/a": b"a"})
    missing = run_cli("list", f"gs://{bucket}/p", env={"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "nope.json")})
    refused(missing, "CredentialsMissing", "nope.json", "service-account")
    garbage = tmp_path / "garbage.json"
    garbage.write_text("this is not JSON")
    refused(
        run_cli("list", f"gs://{bucket}/p", env={"GOOGLE_APPLICATION_CREDENTIALS": str(garbage)}),
        "CredentialsInvalid",
        "not JSON",
    )
    half = tmp_path / "half.json"
    half.write_text(json.dumps({"type": "service_account", "client_email": "x@kubedgx-test.iam.gserviceaccount.com"}))
    refused(
        run_cli("list", f"gs://{bucket}/p", env={"GOOGLE_APPLICATION_CREDENTIALS": str(half)}),
        "CredentialsInvalid",
        "GOOGLE_APPLICATION_CREDENTIALS",
    )


def test_no_key_at_all_is_credentials_missing(store: ObjectStore, run_cli: Callable[..., CliResult]) -> None:
    """No Secret and no workload identity: google-auth's default chain finds nothing (the metadata
    server is not asked: NO_GCE_CHECK, as on a machine outside GCP)."""
    bucket = store.bucket(objects={"p/a": b"a"})
    refused(run_cli("list", f"gs://{bucket}/p", credentials=False), "CredentialsMissing", "no credentials")


def test_a_forged_key_fails_at_once_with_the_token_endpoints_words(
    store: ObjectStore, run_cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    """A key Google no longer accepts (deleted, or not the account's) is refused at the token
    endpoint with invalid_grant. gcsfs would retry that as a 401 six times over half a minute; the
    sync asks once and never sends a storage request without a token."""
    assert isinstance(store, FakeGCS)
    bucket = store.bucket(objects={"p/a": b"a"})
    forged = store.key(tmp_path, "admin", forged=True)
    before, mark = store.token_requests("admin"), store.mark()
    result = run_cli("list", f"gs://{bucket}/p", env={"GOOGLE_APPLICATION_CREDENTIALS": str(forged)})
    refused(result, "CredentialsInvalid", "Invalid JWT Signature", "create a new key")
    assert store.token_requests("admin") - before == 1
    assert store.since(mark) == []


def test_roles_decide_what_the_key_may_do(
    store: ObjectStore, run_cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    """A reader's key pulls but may not push; a key without a role may not even list. GCS's message
    names the permission, and the fix names the role."""
    assert isinstance(store, FakeGCS)
    bucket = store.bucket(objects={"p/a": b"a"})
    reader, nobody = store.env("reader"), store.env("none")
    pulled = run_cli("pull", f"gs://{bucket}/p", str(tmp_path / "in"), env=reader)
    assert pulled.rc == 0, pulled
    assert (tmp_path / "in" / "a").read_bytes() == b"a"
    source = tmp_path / "out"
    source.mkdir()
    (source / "model.bin").write_bytes(b"weights")
    refused(
        run_cli("push", str(source), f"gs://{bucket}/out", env=reader),
        "AccessDenied",
        "storage.objects.create",
        "roles/storage.objectAdmin",
    )
    assert store.keys(bucket, "out/") == []
    refused(run_cli("list", f"gs://{bucket}/p", env=nobody), "AccessDenied", "storage.objects.list")


def test_a_passing_5xx_is_retried_and_a_lasting_one_is_unreachable(
    store: ObjectStore, run_cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    bucket = store.bucket(objects={f"p/f{i}": b"%d" % i for i in range(5)})
    with store.fail(lambda h: h.op == "get" and h.key == "p/f3", times=1) as fault:
        result = run_cli("pull", f"gs://{bucket}/p", str(tmp_path / "once"))
    assert result.rc == 0, result
    assert fault.served == 1
    assert (tmp_path / "once" / "f3").read_bytes() == b"3"

    with store.fail(lambda h: h.op == "get" and h.key == "p/f3", times=10_000) as fault:
        lasting = run_cli("pull", f"gs://{bucket}/p", str(tmp_path / "lasting"), timeout=300)
    assert lasting.rc == 1, lasting
    assert lasting.termination["error"] == "Unreachable", lasting.termination
    assert "503" in lasting.termination["message"]
    assert fault.served >= 3  # each GET tried three times before the pull gives up
