"""Which refused creates end a job, which wait for quota, which are retried (kube.refusal). The
messages are the real apiserver's (v1.34), as tests/cluster met them."""

from __future__ import annotations

import json

import pytest

from dgx_operator.kube import ApiError, refusal, status_of


def answer(code: int, message: str | None, reason: str = "Forbidden", causes: list[str] | None = None) -> ApiError:
    exc = ApiError(status=code, reason=reason)
    if message is not None:
        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason,
                "code": code, "details": {"causes": [{"reason": c} for c in causes or []]}}  # fmt: skip
        exc.body = json.dumps(body).encode()
    exc.headers = {"Audit-Id": "1f2e", "Content-Type": "application/json"}
    return exc


POD_SECURITY = (
    'pods "x-worker-0" is forbidden: violates PodSecurity "baseline:latest": hostPath volumes (volume "data-0")'
)
PRIORITY = 'pods "x-worker-0" is forbidden: no PriorityClass with name kubedgx-high was found'
LIMIT_RANGE = 'pods "x-worker-0" is forbidden: maximum cpu usage per Container is 4, but limit is 96'
QUOTA = 'pods "x-worker-1" is forbidden: exceeded quota: one-pod, requested: pods=1, used: pods=1, limited: pods=1'
QUOTA_UNKNOWN = 'pods "x-worker-0" is forbidden: status unknown for quota: one-pod, resources: pods'
NO_SA = (
    'pods "x-worker-0" is forbidden: error looking up service account ml/trainer: serviceaccount "trainer" not found'
)
RBAC = 'pods is forbidden: User "system:serviceaccount:kubedgx:kubedgx" cannot create resource "pods" in API group ""'
INVALID = 'Service "x" is invalid: spec.ports[1]: Duplicate value: {"port":29500,"protocol":"TCP"}'
WEBHOOK = 'admission webhook "validate.kyverno.svc" denied the request: images must come from registry.acme'


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (answer(403, POD_SECURITY), "permanent"),
        (answer(403, PRIORITY), "permanent"),
        (answer(403, LIMIT_RANGE), "permanent"),
        (answer(422, INVALID, "Invalid"), "permanent"),
        (answer(400, WEBHOOK, "BadRequest"), "permanent"),
        (answer(403, QUOTA), "quota"),
        (answer(403, QUOTA_UNKNOWN), "passing"),
        (answer(403, NO_SA), "passing"),
        (answer(403, RBAC), None),
        (answer(403, "unable to create new content in namespace ml", causes=["NamespaceTerminating"]), None),
        (answer(429, "too many requests", "TooManyRequests"), None),
        (answer(500, 'Internal error occurred: failed calling webhook "x"', "InternalError"), None),
        (answer(409, 'pods "x-worker-0" already exists', "AlreadyExists"), None),
        (answer(404, 'namespaces "ml" not found', "NotFound"), None),
    ],
    ids=lambda v: v if isinstance(v, str) or v is None else str(v.status),
)
def test_each_answer_is_classified(exc: ApiError, kind: str | None) -> None:
    found = refusal(exc)
    assert (found.kind if found is not None else None) == kind
    if found is not None:
        assert found.message == json.loads(exc.body)["message"]  # the apiserver's words, no headers
        assert "Audit-Id" not in str(found)


def test_an_answer_without_a_status_body_says_its_http_reason() -> None:
    assert status_of(answer(502, None, "Bad Gateway")) == ("", "Bad Gateway")
    assert refusal(answer(400, None, "Bad Request")) is not None
