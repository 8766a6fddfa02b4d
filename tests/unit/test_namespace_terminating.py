"""A create refused because the namespace is being deleted is not retried (the real apiserver's
403 NamespaceTerminating, which tests/cluster met at every namespace teardown), while any other
403 still is an error."""

from __future__ import annotations

import json

from dgx_operator.controllers.job import namespace_terminating
from dgx_operator.kube import ApiError

TERMINATING = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": 'pods "j-worker-0" is forbidden: unable to create new content in namespace ml because it is being '
    "terminated",
    "reason": "Forbidden",
    "details": {"name": "j-worker-0", "kind": "pods", "causes": [{"reason": "NamespaceTerminating"}]},
    "code": 403,
}
RBAC = {
    "kind": "Status",
    "status": "Failure",
    "message": 'pods is forbidden: User "system:serviceaccount:kubedgx:kubedgx-operator" cannot create resource',
    "reason": "Forbidden",
    "code": 403,
}


def refused(status: int, body: dict[str, object] | None) -> ApiError:
    exc = ApiError(status=status, reason="Forbidden")
    exc.body = json.dumps(body) if body is not None else None
    return exc


def test_a_terminating_namespace_is_recognised() -> None:
    assert namespace_terminating(refused(403, TERMINATING))


def test_other_refusals_are_not() -> None:
    assert not namespace_terminating(refused(403, RBAC))
    assert not namespace_terminating(refused(403, None))
    assert not namespace_terminating(refused(409, TERMINATING))
