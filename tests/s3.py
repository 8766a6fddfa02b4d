"""A real S3 API on loopback for tests: moto's server in a thread of this process (no patched
clients), with boto3 for the test's own setup, and the Secret a DGXDataMount names to reach it.

Moto keeps its state per process; tests use bucket names of their own (``S3.bucket()``) instead of
resetting, so tests sharing one server never see each other's objects.
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from moto.server import ThreadedMotoServer

#: What the Secrets in tests carry; moto accepts any key unless IAM auth is switched on.
ACCESS_KEY = "AKIAKUBEDGXTEST00001"
SECRET_KEY = "kubedgx-test-secret-key"
REGION = "us-east-1"

_names = itertools.count(1)


class S3:
    """A started moto server: ``endpoint``, ``client`` (boto3), bucket helpers."""

    def __init__(self) -> None:
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        import boto3

        self.client: Any = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def bucket(self, objects: Mapping[str, bytes] | None = None, *, prefix: str = "kubedgx") -> str:
        """A new bucket with a unique name, holding ``objects`` (key -> bytes)."""
        name = f"{prefix}-{next(_names)}"
        self.client.create_bucket(Bucket=name)
        for key, data in (objects or {}).items():
            self.client.put_object(Bucket=name, Key=key, Body=data)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def stop(self) -> None:
        self._server.stop()


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
