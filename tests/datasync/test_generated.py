"""Generated input through the command line (hypothesis): object keys, URIs and endpoint URLs that
someone else chose. Whatever they are, ``main()`` exits 0, 1 or 2, never with a traceback, with
one ``datasync:`` line for a refusal, in bounded time.

Derandomized and without an example database: the same examples every run (a failure reproduces),
and nothing written into the checkout (``DATASYNC_FUZZ=N`` runs N times as many, freshly random).
The examples run in this process (``cli.main``), against
moto's server for keys and URIs, and against no server at all for endpoints.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from dgx_datasync import StoreOptions, SyncError
from dgx_datasync.local import StateDir, write_manifest
from dgx_datasync.store import MAX_KEY, listing_digest
from tests.datasync.conftest import REGION, CliResult, MotoS3

#: Per command; moto answers in milliseconds, nothing may wait for a network.
BOUND = 10.0


#: ``DATASYNC_FUZZ=N``: N times the examples, freshly random (a longer hunt than the suite's).
FUZZ = int(os.environ.get("DATASYNC_FUZZ") or 0)


def generated(examples: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    return settings(
        max_examples=examples * max(1, FUZZ),
        deadline=timedelta(seconds=BOUND),
        derandomize=not FUZZ,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


def check(result: CliResult) -> None:
    """The property; also tells hypothesis's statistics which outcome this example had."""
    reason = result.termination.get("error") if result.rc and result.termination_path.exists() else None
    event(f"exit {result.rc} {reason or ''}".strip())
    assert result.rc in {0, 1, 2}, result
    assert "Traceback" not in result.stderr, result
    lines = [line for line in result.stderr_lines if line.startswith("datasync: ")]
    assert len(lines) <= 1, result
    if result.rc == 2 and lines:
        assert lines == result.stderr_lines[-1:], result
        assert result.termination["message"] == lines[0].removeprefix("datasync: ")
    assert result.seconds < BOUND, result


# Names that have broken things or come close: path tricks, our own names, NAME_MAX, controls.
TRICKY = st.sampled_from(
    [
        *[".", "..", "", ".kubedgx", ".a.kubedgx-partial-0123456789ab", "x" * 244, "y" * 255, "z" * 256, "é" * 128],
        *["\x1b[2J", "a\rb", "tab\there", "new\nline", "nul\x00l", "\u202eevil", "-rf", "~", "$(x)", " sp ace "],
    ]
)
SEGMENT = st.one_of(TRICKY, st.text(st.characters(exclude_categories=["Cs"], exclude_characters="/"), max_size=40))
KEY = st.lists(SEGMENT, min_size=1, max_size=4).map("/".join).filter(lambda k: len(k.encode()) <= MAX_KEY - 40)


@pytest.fixture(scope="module")
def keys_bucket(s3: MotoS3) -> str:
    return s3.bucket("generated")


@generated(40)
@given(keys=st.lists(KEY, min_size=1, max_size=3, unique=True))
def test_generated_object_keys(
    s3: MotoS3, keys_bucket: str, run_main: Callable[..., CliResult], tmp_path: Path, keys: list[str]
) -> None:
    prefix = uuid.uuid4().hex
    for key in keys:
        try:
            s3.client.put_object(Bucket=keys_bucket, Key=f"{prefix}/{key}", Body=key.encode())
        except Exception:  # keys boto3 or moto refuse: nothing to pull
            assume(False)
    dest = tmp_path / prefix
    result = run_main("pull", f"s3://{keys_bucket}/{prefix}", str(dest))
    check(result)
    if result.rc == 2:  # a key that cannot be a local file, and the line says what to do about it
        assert result.termination["error"] == "LocalError", result
        assert "spec.exclude" in result.termination["message"], result
    if result.rc == 0:
        pulled = result.result["objects"]
        assert pulled <= len(keys)
        for key in keys:
            path = dest.joinpath(*key.split("/"))
            if os.path.isfile(path) and not os.path.islink(path):  # not Path's: ENAMETOOLONG raises there
                assert path.read_bytes() == key.encode()


URI = st.one_of(
    st.text(max_size=60),
    st.builds(
        lambda scheme, rest: f"{scheme}{rest}",
        st.sampled_from(["s3://", "gs://", "S3://", "s3:/", "http://", "s3://UPPER", "s3://a", ""]),
        st.text(st.characters(exclude_categories=["Cs"]), max_size=60),
    ),
    st.builds(lambda prefix: f"s3://generated-bucket-that-is-not-there/{prefix}", SEGMENT),
)


@generated(60)
@given(uri=URI)
def test_generated_uris(run_main: Callable[..., CliResult], uri: str) -> None:
    result = run_main("list", "--", uri)
    check(result)
    assert result.rc == 2, result  # no such bucket, or not a URI at all


HOST = st.one_of(
    st.from_regex(r"\A[a-z0-9.-]{0,20}\Z"),
    st.sampled_from(["[::1]", "[::1", "[fe80::1%25eth0]", "[v1.x]", "127.0.0.1", "user:pw@host", "host_name"]),
    st.sampled_from(["-host", "a..b", "xn--bcher-kva.example", "bücher.example", "a" * 64, ("a" * 63 + ".") * 5]),
    st.text(max_size=12),
)
ENDPOINT = st.one_of(
    st.text(max_size=40),
    st.builds(  # mostly good ones: what is let through must work
        lambda scheme, host, port, path: f"{scheme}://{host}{port}{path}",
        st.sampled_from(["http", "https"]),
        st.from_regex(r"\A([a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?\.){0,3}[a-z0-9]{1,10}\Z")
        | st.ip_addresses().map(lambda ip: f"[{ip}]" if ip.version == 6 else str(ip)),
        st.one_of(st.just(""), st.integers(1, 65_535).map(lambda p: f":{p}")),
        st.sampled_from(["", "/", "/minio", "/a/b/"]),
    ),
    st.builds(
        lambda scheme, host, port, path: f"{scheme}{host}{port}{path}",
        st.sampled_from(["http://", "https://", "HTTPS://", "ftp://", "", "//", "http:/", "s3://"]),
        HOST,
        st.one_of(st.just(""), st.integers(-5, 70_000).map(lambda p: f":{p}"), st.sampled_from([":", ":x", ":8 0"])),
        st.sampled_from(["", "/", "/path/x", "?q=1", "#f", "/ x", "/\x00"]),
    ),
)


@functools.cache
def _botocore() -> Any:
    import botocore.session

    return botocore.session.get_session()


def botocore_takes(endpoint: str) -> None:
    """botocore builds a client for ``endpoint`` and resolves a request's URL with it (the stub
    answers instead of a server): what datasync lets through does not fail later, in a request."""
    from botocore.stub import Stubber

    client = _botocore().create_client(
        "s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="k", aws_secret_access_key="s"
    )
    with Stubber(client) as stub:
        stub.add_response("head_bucket", {}, {"Bucket": "bucket"})
        client.head_bucket(Bucket="bucket")


@pytest.fixture
def reusable(tmp_path: Path) -> Path:
    """A pulled copy of an empty prefix: a pull with --reuse exits 0 without a request."""
    dest = tmp_path / "reused"
    with StateDir.open(dest) as state:
        write_manifest(state, "s3://bucket/x", ())
    return dest


@generated(150)
@given(endpoint=ENDPOINT)
def test_generated_endpoints(run_main: Callable[..., CliResult], reusable: Path, endpoint: str) -> None:
    refused: SyncError | None = None
    try:
        StoreOptions(endpoint_url=endpoint)
    except SyncError as err:
        refused = err
    accepted = refused is None
    if refused is not None:
        assert refused.reason == "InvalidURI"
        assert "--endpoint-url" in refused.message
    elif endpoint:
        botocore_takes(endpoint)
    digest = listing_digest(())
    args = ["pull", f"--endpoint-url={endpoint}", "--expect-digest", digest, "--reuse", "s3://bucket/x", str(reusable)]
    result = run_main(*args, endpoint=None)
    check(result)
    assert result.rc == (0 if accepted else 2), result
    if not accepted:
        assert len(result.stderr_lines) == 1, result
        assert result.termination["error"] == "InvalidURI"
