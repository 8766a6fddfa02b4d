"""The connector reads the function's error.pb from Flyte's blob store (moto's S3 here): its message and
kind when it can, nothing when the function wrote none, and when the store refuses the connector (no
credentials), a line saying so and what to do instead of losing the error silently.

flytekit builds a context's FileAccessProvider from the environment once; each read here runs in a
context of its own with a provider made from the environment of that moment, so what a test sets is
what the read uses.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from flyteidl.core.errors_pb2 import ContainerError, ErrorDocument
from flytekit.configuration import DataConfig
from flytekit.core.context_manager import FlyteContextManager
from flytekit.core.data_persistence import FileAccessProvider

from flytekitplugins.dgx.connector import BLOB_STORE_HINT, TaskError, task_error
from tests.s3 import ACCESS_KEY, S3, SECRET_KEY, s3  # noqa: F401  (the session's moto server)

#: Where a connector might otherwise find credentials: none of them may answer for the test's keys.
AWS_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")
FLYTE_VARIABLES = ("FLYTE_AWS_ENDPOINT", "FLYTE_AWS_ACCESS_KEY_ID", "FLYTE_AWS_SECRET_ACCESS_KEY")


def document(message: str, kind: int) -> bytes:
    error = ContainerError(code="USER:ValueError", message=message, kind=kind)
    return bytes(ErrorDocument(error=error).SerializeToString())


@contextmanager
def store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **env: str) -> Iterator[None]:
    """A flytekit context whose file access is made now, from exactly ``env`` (no other AWS or Flyte
    settings, no instance metadata, no credentials file)."""
    with monkeypatch.context() as m:
        for name in (*AWS_VARIABLES, *FLYTE_VARIABLES):
            m.delenv(name, raising=False)
        m.setenv("AWS_EC2_METADATA_DISABLED", "true")
        m.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
        m.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
        for name, value in env.items():
            m.setenv(name, value)
        files = FileAccessProvider(tempfile.mkdtemp(dir=tmp_path), str(tmp_path / "raw"), data_config=DataConfig.auto())
        ctx = FlyteContextManager.current_context()
        with FlyteContextManager.with_context(ctx.with_file_access(files)):
            yield


def credentials(s3: S3) -> dict[str, str]:  # noqa: F811
    return {"FLYTE_AWS_ENDPOINT": s3.endpoint, "FLYTE_AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "FLYTE_AWS_SECRET_ACCESS_KEY": SECRET_KEY}  # fmt: skip


@pytest.fixture
def prefix(s3: S3) -> str:  # noqa: F811
    """An attempt's output prefix holding the error.pb of a FlyteRecoverableException."""
    bucket = s3.bucket("flyte", {
        "metadata/run/n0/data/0/error.pb": document("FlyteRecoverableException: USER:Recoverable: the\n  store blinked",
                                                    ContainerError.RECOVERABLE),
        "metadata/run/n1/data/0/error.pb": document("ValueError: no square for -1", ContainerError.NON_RECOVERABLE),
        "metadata/run/n2/data/0/error.pb": b"not an error document",
        "metadata/run/n3/data/0/error.pb": document(
            "Trace:\n\n    Traceback (most recent call last):\n      File \"task.py\", line 82, in execute\n\n"
            "Message:\n\n    RuntimeError: worker process of global rank 0 failed: ValueError: no square for -1",
            ContainerError.NON_RECOVERABLE),
    })  # fmt: skip
    return f"s3://{bucket}/metadata/run/n0/data/0"


def test_with_the_store_s_credentials_the_message_and_the_kind_come_back(
    s3: S3,  # noqa: F811
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    with store(monkeypatch, tmp_path, **credentials(s3)):
        recoverable = task_error(prefix)
        plain = task_error(prefix.replace("/n0/", "/n1/") + "/")
    assert recoverable == TaskError(
        "the task raised: FlyteRecoverableException: USER:Recoverable: the store blinked", ContainerError.RECOVERABLE
    )
    assert plain == TaskError("the task raised: ValueError: no square for -1", ContainerError.NON_RECOVERABLE)
    # flytekit's user-error text: the traceback is the worker log's business, the raised words are the message
    with store(monkeypatch, tmp_path, **credentials(s3)):
        traced = task_error(prefix.replace("/n0/", "/n3/"))
    assert traced == TaskError(
        "the task raised: RuntimeError: worker process of global rank 0 failed: ValueError: no square for -1",
        ContainerError.NON_RECOVERABLE,
    )


def test_no_error_pb_is_none_the_job_s_reason_stands_alone(
    s3: S3,  # noqa: F811
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    with store(monkeypatch, tmp_path, **credentials(s3)):
        assert task_error(prefix.replace("/data/0", "/data/1")) is None
        assert task_error("") is None
    local = tmp_path / "local-run"
    local.mkdir()
    with store(monkeypatch, tmp_path):
        assert task_error(str(local)) is None
        (local / "error.pb").write_bytes(document("KeyError: 'n'", ContainerError.NON_RECOVERABLE))
        assert task_error(str(local)) == TaskError("the task raised: KeyError: 'n'", ContainerError.NON_RECOVERABLE)


def test_without_credentials_the_message_says_error_pb_could_not_be_read_and_what_to_do(
    s3: S3,  # noqa: F811
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    with store(monkeypatch, tmp_path, FLYTE_AWS_ENDPOINT=s3.endpoint):
        refused = task_error(prefix)
        absent_or_not = task_error(prefix.replace("/data/0", "/data/1"))  # cannot be told apart: also unreadable
    uri = f"{prefix}/error.pb"
    assert refused == TaskError(
        f"error.pb at {uri} could not be read (NoCredentialsError: Unable to locate credentials): {BLOB_STORE_HINT}",
        None,
    )
    assert BLOB_STORE_HINT == (
        'give the connector read access to Flyte\'s blob store (docs/flyte.md, "Deploying the connector")'
    )
    assert absent_or_not is not None
    assert absent_or_not.kind is None
    assert "could not be read (NoCredentialsError" in absent_or_not.message
    # The same file with the keys: it was the credentials, not the file.
    with store(monkeypatch, tmp_path, **credentials(s3)):
        assert task_error(prefix) is not None
        assert task_error(prefix).kind == ContainerError.RECOVERABLE  # type: ignore[union-attr]


def test_a_file_that_is_no_error_document_says_so(
    s3: S3,  # noqa: F811
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    bad = prefix.replace("/n0/", "/n2/")
    with store(monkeypatch, tmp_path, **credentials(s3)):
        error = task_error(bad)
    assert error == TaskError(
        f"error.pb at {bad}/error.pb is not an ErrorDocument (DecodeError: Error parsing message with type "
        "'flyteidl.core.ErrorDocument': Wire format was corrupt)",
        None,
    )
