"""A real S3 API on loopback for tests: moto's server in a thread of this process (no patched
clients), with boto3 for the test's own setup, and the Secret a DGXDataMount names to reach it.

Moto keeps its state per process; tests use bucket names of their own (``S3.bucket()``) instead of
resetting, so tests sharing one server never see each other's objects.
"""

from __future__ import annotations

import base64
import logging
import ssl
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

#: What the Secrets in tests carry; moto accepts any key unless IAM auth is switched on.
ACCESS_KEY = "AKIAKUBEDGXTEST00001"
SECRET_KEY = "kubedgx-test-secret-key"
REGION = "us-east-1"


class S3:
    """A started moto server: ``endpoint``, ``client`` (boto3), bucket helpers. ``wrap`` puts WSGI
    middleware in front of moto (tests/datasync counts and gates requests with it). With
    ``ssl_context`` it serves HTTPS (``endpoint`` is https://) with that context's certificate;
    ``client`` then trusts ``ca_file``. ``host``: the address it listens on (the real nodes' pods
    reach it on their bridge's address)."""

    def __init__(
        self,
        wrap: Callable[[Any], Any] | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        ca_file: str | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        import boto3
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
        app = DomainDispatcherApplication(create_backend_app)
        self.app: Any = wrap(app) if wrap is not None else app
        self.server = make_server(host, 0, self.app, threaded=True, ssl_context=ssl_context)
        self.thread = threading.Thread(target=self.server.serve_forever, name="moto", daemon=True)
        self.thread.start()
        scheme = "https" if ssl_context is not None else "http"
        self.endpoint = f"{scheme}://{host}:{self.server.server_port}"
        self.client: Any = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
            verify=ca_file if ca_file is not None else True,
        )

    def bucket(self, prefix: str = "kubedgx", objects: Mapping[str, bytes] | None = None) -> str:
        """A new bucket with a unique name starting with ``prefix``, holding ``objects`` (key -> bytes)."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=name)
        for key, data in (objects or {}).items():
            self.client.put_object(Bucket=name, Key=key, Body=data)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)


def secret(name: str, namespace: str = "ml", **extra: str) -> dict[str, Any]:
    """The Secret of a DGXDataMount's credentialsSecretRef, with the test keys."""
    data = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, **extra}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


@pytest.fixture(scope="session")
def s3() -> Iterator[S3]:
    server = S3()
    try:
        yield server
    finally:
        server.stop()


@dataclass(frozen=True)
class PrivateS3:
    """moto's S3 over HTTPS with a certificate of a private CA, as an on-premises MinIO or Ceph RGW
    serves: ``s3.endpoint`` is https://127.0.0.1:<port>, ``ca_pem`` the CA that signed it (no
    default trust store has it), ``ca_file`` the same PEM in a file."""

    s3: S3
    ca_pem: str
    ca_file: str


@pytest.fixture(scope="session")
def s3_private_ca() -> Iterator[PrivateS3]:
    from tests.private_ca import PrivateCA, server_context

    ca = PrivateCA()
    with tempfile.TemporaryDirectory(prefix="kubedgx-test-ca-") as directory:
        ca_file = Path(directory) / "ca.crt"
        ca_file.write_text(ca.pem, encoding="ascii")
        server = S3(ssl_context=server_context(ca.issue(["127.0.0.1", "localhost"])), ca_file=str(ca_file))
        try:
            yield PrivateS3(server, ca.pem, str(ca_file))
        finally:
            server.stop()
