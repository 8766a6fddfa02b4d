"""The operator's validating webhook as the API server talks to it: AdmissionReview v1 requests, the
objects as the API server hands them over, and :class:`Webhook`, kopf's server in the running operator
(the ``webhook`` fixture in conftest.py starts it). Shared by test_admission.py, test_webhook_tls.py,
test_metrics.py and the chart's tests.

The operator gets a registry of its own (:func:`operator_registry`): ``dgx_operator.runtime.handlers`` and
``dgx_operator.runtime.webhooks`` are (re)imported while kopf's default registry points at a fresh one.
Importing ``dgx_operator.runtime.webhooks`` into kopf's default registry instead would make every later test
of this session that runs ``dgx_operator.runtime.handlers`` without a webhook server crash at startup
("Admission handlers exist, but no admission server/tunnel is configured").
"""

from __future__ import annotations

import functools
import importlib
import sys
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf

import dgx_operator.runtime.handlers
from tests.conftest import with_changes

Body = dict[str, Any]

JOB_PATH = "/validate-dgxtrainingjob"
MOUNT_PATH = "/validate-dgxdatamount"
PLURALS = {"DGXTrainingJob": "dgxtrainingjobs", "DGXDataMount": "dgxdatamounts"}
READY_TIMEOUT_S = 10.0


@functools.cache
def operator_registry() -> kopf.OperatorRegistry:
    """The operator's handlers and its validating webhook, registered in a registry of their own."""
    saved = kopf.get_default_registry()
    registry = kopf.OperatorRegistry()
    kopf.set_default_registry(registry)
    try:
        importlib.reload(dgx_operator.runtime.handlers)
        # The validating handlers: on first import, or again now that the default registry is this one.
        if "dgx_operator.runtime.webhooks" in sys.modules:
            importlib.reload(sys.modules["dgx_operator.runtime.webhooks"])
        else:
            importlib.import_module("dgx_operator.runtime.webhooks")
    finally:
        kopf.set_default_registry(saved)
    return registry


def stored(body: Body, **meta: Any) -> Body:
    """``body`` as the API server hands it to a validating webhook: with a uid and a creation time."""
    return with_changes(
        body,
        {"metadata.uid": str(uuid.uuid4()), "metadata.creationTimestamp": "2024-05-01T11:59:00Z"}
        | {f"metadata.{key}": value for key, value in meta.items()},
    )


def review_request(operation: str, obj: Body | None, old: Body | None = None) -> Body:
    """An AdmissionReview v1 request as kube-apiserver sends it."""
    subject = obj if obj is not None else old
    assert subject is not None
    group, version = subject["apiVersion"].split("/")
    kind = {"group": group, "version": version, "kind": subject["kind"]}
    resource = {"group": group, "version": version, "resource": PLURALS[subject["kind"]]}
    options_kind = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}[operation]
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": kind,
            "resource": resource,
            "requestKind": kind,
            "requestResource": resource,
            "name": subject["metadata"]["name"],
            "namespace": subject["metadata"]["namespace"],
            "operation": operation,
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
            "object": obj,
            "oldObject": old,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": options_kind},
        },
    }


@dataclass
class Webhook:
    """The operator's webhook server, as the API server reaches it."""

    client_config: dict[str, Any]  # what kopf's server yielded: its URL (no path), and a CA bundle with TLS
    port: int  # the one the operator was configured with
    http: aiohttp.ClientSession

    @property
    def url(self) -> str:
        url: str = self.client_config["url"]
        return url

    async def post(self, path: str, request: Body) -> Body:
        """POST an AdmissionReview; the review kopf answers with (the HTTP status must be 200)."""
        async with self.http.post(self.url + path, json=request) as response:
            assert response.status == 200, await response.text()
            answer: Body = await response.json()
        assert answer["apiVersion"] == "admission.k8s.io/v1"
        assert answer["kind"] == "AdmissionReview"
        assert answer["response"]["uid"] == request["request"]["uid"]
        assert "patch" not in answer["response"]  # validating only: never a mutation
        return answer

    async def allowed(self, path: str, operation: str, obj: Body | None, old: Body | None = None) -> None:
        answer = await self.post(path, review_request(operation, obj, old))
        assert answer["response"] == {"uid": answer["response"]["uid"], "allowed": True}, answer["response"]

    async def refused(
        self, path: str, operation: str, obj: Body | None, old: Body | None = None, code: int = 422
    ) -> list[str]:
        """The lines of a refusal's message (422 unless told)."""
        answer = await self.post(path, review_request(operation, obj, old))
        response = answer["response"]
        assert response["allowed"] is False, response
        assert response["status"]["code"] == code, response
        message: str = response["status"]["message"]
        return message.splitlines()


ENV_VALUE_MAX = 131072  # spec.env[].value's maxLength: the largest free-form field a valid spec has
MIB = 2**20


def padded(body: Body, size: int) -> Body:
    """``body`` with about ``size`` more bytes of spec, in spec.env values (valid: 128 KiB each at most)."""
    count, rest = divmod(size, ENV_VALUE_MAX)
    values = [ENV_VALUE_MAX] * count + ([rest] if rest else [])
    return with_changes(body, {"spec.env": [{"name": f"PAD_{i}", "value": "x" * n} for i, n in enumerate(values)]})
