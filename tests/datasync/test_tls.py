"""An S3-compatible store behind a private CA (MinIO, Ceph RGW on premises), as the sync containers
meet it: ``python -m dgx_datasync`` against moto's S3 served over HTTPS with a certificate of a CA
no default trust store has (tests/s3.py's ``s3_private_ca``).

Without the CA the command fails at once with CertificateUntrusted: exit 2, one line naming the
endpoint and the fix, never a traceback or a retry loop. With the CA in ``KUBEDGX_CA_BUNDLE_PEM``
(what the operator renders into every sync container) pull, push and list work; and the CA is added
to the default trust store, not put in its place: a store the defaults trust is still trusted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dgx_datasync import trust
from tests.datasync.conftest import CliResult
from tests.private_ca import PrivateCA, server_context
from tests.s3 import S3, PrivateS3, s3_private_ca  # noqa: F401

FILES = {"data/a.jsonl": b'{"text": "a"}\n' * 50, "data/sub/b.bin": bytes(range(256)) * 40}


@pytest.fixture(scope="module")
def private_bucket(s3_private_ca: PrivateS3) -> str:  # noqa: F811
    return s3_private_ca.s3.bucket("tls", objects=FILES)


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".kubedgx" not in p.parts
    }


def untrusted_line(result: CliResult, endpoint: str, uri: str) -> str:
    assert result.rc == 2, result
    assert "Traceback" not in result.stderr, result
    assert len(result.stderr_lines) == 1, result
    line = result.stderr_lines[0]
    assert line.startswith("datasync: the TLS certificate of the endpoint " + endpoint), line
    assert f"is not accepted for {uri} (unable to get local issuer certificate)" in line, line
    assert "caBundle" in line, line
    assert result.termination == {"error": "CertificateUntrusted", "message": line.removeprefix("datasync: ")}
    return line


def test_without_the_ca_the_sync_fails_at_once_naming_the_certificate(
    s3_private_ca: PrivateS3,  # noqa: F811
    private_bucket: str,
    run_cli: Callable[..., CliResult],
    tmp_path: Path,
) -> None:
    endpoint = s3_private_ca.s3.endpoint
    uri = f"s3://{private_bucket}/data"
    # The same command line refusing a URI before any network: the interpreter's start, which a loaded
    # machine stretches; the certificate error must add little to it (no retries as network trouble).
    baseline = run_cli("pull", "http://bucket/data", str(tmp_path / "b"), endpoint=endpoint)
    assert baseline.rc == 2, baseline
    pulled = run_cli("pull", uri, str(tmp_path / "dest"), endpoint=endpoint)
    untrusted_line(pulled, endpoint, uri)
    assert pulled.seconds - baseline.seconds < 20, "a certificate error is not retried as network trouble"
    assert not (tmp_path / "dest").exists() or tree(tmp_path / "dest") == {}
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x.txt").write_bytes(b"x")
    pushed = run_cli("push", str(tmp_path / "out"), f"s3://{private_bucket}/pushed", endpoint=endpoint)
    untrusted_line(pushed, endpoint, f"s3://{private_bucket}/pushed")


def test_with_the_ca_in_the_environment_pull_push_and_list_work(
    s3_private_ca: PrivateS3,  # noqa: F811
    private_bucket: str,
    run_cli: Callable[..., CliResult],
    tmp_path: Path,
) -> None:
    endpoint = s3_private_ca.s3.endpoint
    env = {trust.PEM_ENV: s3_private_ca.ca_pem}
    uri = f"s3://{private_bucket}/data"
    pulled = run_cli("pull", uri, str(tmp_path / "dest"), endpoint=endpoint, env=env)
    assert pulled.rc == 0, pulled
    assert pulled.result["objects"] == 2
    assert tree(tmp_path / "dest") == {k.removeprefix("data/"): hashlib.sha256(v).hexdigest() for k, v in FILES.items()}
    listed = run_cli("list", uri, endpoint=endpoint, env=env)
    assert listed.rc == 0, listed
    assert listed.result["digest"] == pulled.result["digest"]
    pushed = run_cli("push", str(tmp_path / "dest"), f"s3://{private_bucket}/copy", endpoint=endpoint, env=env)
    assert pushed.rc == 0, pushed
    assert s3_private_ca.s3.keys(private_bucket, "copy/") == ["copy/a.jsonl", "copy/sub/b.bin"]


@pytest.mark.parametrize(
    ("pem", "complaint"),
    [
        ("not a certificate", "holds no PEM certificate"),
        ("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "a certificate does not parse"),
        ("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "holds a PRIVATE KEY block"),
    ],
    ids=["text", "garbage", "key"],
)
def test_a_bundle_that_cannot_be_used_is_one_line_and_exit_2(
    pem: str, complaint: str, run_cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    result = run_cli("list", "s3://some-bucket/x", env={trust.PEM_ENV: pem})
    assert result.rc == 2, result
    assert result.stderr_lines == [f"datasync: {trust.PEM_ENV} {result.termination['message'].split(' ', 1)[1]}"]
    assert complaint in result.stderr_lines[0]
    assert result.termination["error"] == "LocalError"


# -- the CA is added to the defaults ----------------------------------------------------------------


def test_the_bundle_file_is_botocore_s_default_followed_by_the_private_cas(s3_private_ca: PrivateS3) -> None:  # noqa: F811
    import certifi
    from botocore.httpsession import get_cert_path

    assert trust.default_bundle() == Path(get_cert_path(True)) == Path(certifi.where())
    pem = s3_private_ca.ca_pem
    with trust.bundle_for({trust.PEM_ENV: "# our CA\n" + pem}) as path:
        assert path is not None
        text = Path(path).read_text(encoding="utf-8")
        assert Path(path).stat().st_mode & 0o777 == 0o600
        defaults = trust.default_bundle().read_text(encoding="utf-8").rstrip("\n") + "\n"
        assert text.startswith(defaults)
        assert text.endswith(pem)
        assert "# our CA" not in text  # only the certificates are copied
    assert not Path(path).exists()
    with trust.bundle_for({}) as nothing:
        assert nothing is None


@pytest.fixture
def public_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3]:
    """Another HTTPS store, signed by a CA that stands for a public one: it is put into the default
    bundle (what certifi would hold for AWS), as botocore would find it."""
    public = PrivateCA("kubedgx test 'public' CA")
    defaults = tmp_path / "default-bundle.pem"
    defaults.write_text(public.pem, encoding="ascii")
    monkeypatch.setattr(trust, "default_bundle", lambda: defaults)
    server = S3(ssl_context=server_context(public.issue(["127.0.0.1"])), ca_file=str(defaults))
    try:
        yield server
    finally:
        server.stop()


def test_the_private_ca_is_added_to_the_default_trust_not_put_in_its_place(
    s3_private_ca: PrivateS3,  # noqa: F811
    private_bucket: str,
    public_store: S3,
    run_main: Callable[..., CliResult],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job reading from a store the defaults trust (AWS) and writing to a private one (MinIO): with
    the private CA set, both are reached in one process (the file botocore verifies with holds the
    default bundle, here a stand-in, and the private CA); the private one is not trusted without it."""
    public_bucket = public_store.bucket("public", objects={"data/p.txt": b"public"})
    monkeypatch.setenv(trust.PEM_ENV, s3_private_ca.ca_pem)
    both = {
        "public": run_main("list", f"s3://{public_bucket}/data", endpoint=public_store.endpoint),
        "private": run_main("list", f"s3://{private_bucket}/data", endpoint=s3_private_ca.s3.endpoint),
    }
    seen = {name: (r.rc, r.result["objects"]) for name, r in both.items()}
    assert seen == {"public": (0, 1), "private": (0, 2)}, both
    monkeypatch.delenv(trust.PEM_ENV)
    # Without it botocore's own default is used, untouched, which the private CA is not in.
    private = run_main("list", f"s3://{private_bucket}/data", endpoint=s3_private_ca.s3.endpoint)
    assert private.rc == 2, private
    assert private.termination["error"] == "CertificateUntrusted"
