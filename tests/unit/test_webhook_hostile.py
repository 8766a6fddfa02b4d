""":func:`admission.review` when what it depends on misbehaves: a mount lookup that fails or hangs, a stored
DGXDataMount this kubedgx cannot read, a status of the wrong type, a bug. Every outcome is an allow or a
``kopf.AdmissionError`` with a message a user can act on (docs/operator.md, "Admission"), never another exception:
kopf would answer that with its generic failure (code 500 and the exception's text).

The fakes answer ``get_mount`` as :class:`dgx_operator.kube.Kube` can: the stored object, None (404), one of the
errors it raises (TransientError for retryable answers, ApiError for others, aiohttp's and asyncio's errors of
the connection), or never.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf
import pytest

from dgx_operator.kube import ApiError, TransientError
from dgx_operator.runtime.settings import OperatorConfig
from dgx_operator.validation.validator import Outcome
from dgx_operator.webhook import admission
from dgx_operator.webhook.config import WebhookConfig
from tests.conftest import BASE_JOB, BASE_MOUNT, with_changes

Body = dict[str, Any]

#: Longer than any review here may take: reached only when a review hangs.
GUARD_S = 10.0
STARTED = "2024-05-01T12:00:00Z"
OUT_DIR_IN_INPUT = (
    "spec.trainer.output.dir: /data/out is inside /data, which workers see read-only (an input mount or the "
    "config); write outputs to a direction: Out mount or another directory"
)


class Kube:
    """``get_mount`` per (namespace, name): a stored mount, None (absent), an exception to raise, or ``HANG``."""

    HANG = object()

    def __init__(self, answers: Mapping[tuple[str, str], Any]) -> None:
        self.answers = dict(answers)
        self.in_flight = 0
        self.most_in_flight = 0
        self.cancelled: list[str] = []

    async def get_limits(self, namespace: str) -> Body | None:
        return None  # no guard rails: these tests are about the mounts (test_admission.py has the limits')

    async def list_budgets(self, namespace: str) -> list[Body]:
        return []  # no budgets either (test_admission.py has their warning)

    async def get_mount(self, namespace: str, name: str) -> Body | None:
        answer = self.answers.get((namespace, name))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0)  # every lookup is under way before the first answers
            if answer is Kube.HANG:
                try:
                    await asyncio.Event().wait()  # no answer, ever: the review's own timeout ends it
                except asyncio.CancelledError:
                    self.cancelled.append(name)
                    raise
            if isinstance(answer, BaseException):
                raise answer
            assert answer is None or isinstance(answer, dict)
            return answer
        finally:
            self.in_flight -= 1


def outcome(
    body: Body, old: Body | None = None, operation: str = "CREATE", kube: Kube | None = None, memo: Any = None
) -> tuple[kopf.AdmissionError | None, list[str]]:
    """(the AdmissionError ``review`` raised, or None for an allow; the warnings it gave)."""
    if memo is None:
        memo = kopf.Memo(config=OperatorConfig())
        if kube is not None:
            memo.kube = kube
    warnings: list[str] = []

    async def run() -> None:
        async with asyncio.timeout(GUARD_S):
            await admission.review(memo, body, old, operation, warnings)

    try:
        asyncio.run(run())
    except kopf.AdmissionError as exc:
        return exc, warnings
    return None, warnings


def refusal(body: Body, old: Body | None = None, operation: str = "CREATE", **kwargs: Any) -> tuple[int | None, str]:
    error, _ = outcome(body, old, operation, **kwargs)
    assert error is not None, f"{operation} was allowed"
    return error.code, str(error)


#: BASE_JOB, run once (restartPolicy Never on norm capacity): an allowed review of it has no warning at all, not
#: even the checkpoint warning of a job that can be restarted in a new pod (validation/durability.py).
JOB = with_changes(BASE_JOB, {"spec.restartPolicy": "Never"})


def data_job(*names: str, output_dir: str = "/data/out") -> Body:
    mounts = [{"name": name, "mountPath": "/data" if i == 0 else f"/data{i}"} for i, name in enumerate(names)]
    return with_changes(BASE_JOB, {"spec.dataMounts": mounts, "spec.trainer.output.dir": output_dir})


def mount(name: str = "data", **changes: Any) -> Body:
    return with_changes(BASE_MOUNT, {"metadata.name": name, **changes})


def running(body: Body) -> Body:
    return with_changes(body, {"status": {"phase": "Running", "startTime": STARTED}})


# -- a mount lookup that fails ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        pytest.param(
            TransientError("get dgxdatamounts ml/data: HTTP 503 Service Unavailable"),
            "get dgxdatamounts ml/data: HTTP 503 Service Unavailable",
            id="retryable-answer",
        ),
        pytest.param(
            ApiError(status=403, reason="Forbidden"), "the API server answered HTTP 403 Forbidden", id="forbidden"
        ),
        pytest.param(
            aiohttp.ClientConnectionError("Cannot connect to host 10.96.0.1:443"),
            "Cannot connect to host 10.96.0.1:443",
            id="connection",
        ),
        pytest.param(aiohttp.ServerDisconnectedError(), "Server disconnected", id="disconnected"),
        pytest.param(TimeoutError(), "the request to the API server timed out", id="client-timeout"),
    ],
)
def test_a_failed_mount_lookup_refuses_as_retryable_naming_the_entry(error: Exception, reason: str) -> None:
    """The webhook cannot check the job against a mount it cannot read: refused, as Kubernetes' webhooks do
    when a dependency fails, with 503 (retrying the same write may succeed) rather than 422 (invalid)."""
    code, message = refusal(data_job("data"), kube=Kube({("ml", "data"): error}))
    assert code == admission.RETRY_CODE == 503
    assert message == f"spec.dataMounts[0]: cannot check against DGXDataMount ml/data: {reason}; retry"


def test_a_lookup_that_never_answers_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "MOUNT_LOOKUP_TIMEOUT_S", 0.05)
    kube = Kube({("ml", "data"): Kube.HANG})
    code, message = refusal(data_job("data"), kube=kube)
    assert (code, message) == (
        503,
        "spec.dataMounts[0]: cannot check against DGXDataMount ml/data: the API server did not answer within "
        "0.05s; retry",
    )
    assert kube.cancelled == ["data"]  # not left running after the answer


def test_the_lookup_bound_is_well_under_the_apiservers_timeout() -> None:
    """An answer of ours, not the apiserver's timeout (which failurePolicy would turn into something else)."""
    hook = admission.webhook_configuration(WebhookConfig(), b"CA")["webhooks"][0]
    assert hook["timeoutSeconds"] / 2 >= admission.MOUNT_LOOKUP_TIMEOUT_S


def test_mounts_are_looked_up_together_and_each_failure_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """One bound for all of them (16 hanging lookups one after another would outlast the apiserver's 10 s)."""
    monkeypatch.setattr(admission, "MOUNT_LOOKUP_TIMEOUT_S", 0.05)
    kube = Kube(
        {
            ("ml", "data"): mount("data"),
            ("ml", "slow"): Kube.HANG,
            ("ml", "gone"): None,
            ("ml", "down"): TransientError("get dgxdatamounts ml/down: HTTP 500 Internal Server Error"),
        }
    )
    code, message = refusal(data_job("data", "slow", "gone", "down"), kube=kube)
    assert kube.most_in_flight == 4
    # No reference problem (/data/out inside the input mount data) is claimed from a partial view: only the
    # lookups that failed are reported, and a retry reports the rest.
    assert code == 503
    assert message.splitlines() == [
        "spec.dataMounts[1]: cannot check against DGXDataMount ml/slow: the API server did not answer within "
        "0.05s; retry",
        "spec.dataMounts[3]: cannot check against DGXDataMount ml/down: get dgxdatamounts ml/down: HTTP 500 "
        "Internal Server Error; retry",
    ]


def test_a_definite_problem_and_a_failed_lookup_refuse_as_invalid_listing_both() -> None:
    """Retrying would not cure the definite one: 422, with the lookup's line too."""
    old = running(data_job("data"))
    new = with_changes(old, {"spec.instance": "dgxh100.80g.8.norm"})
    kube = Kube({("ml", "data"): TransientError("get dgxdatamounts ml/data: HTTP 429 Too Many Requests")})
    code, message = refusal(new, old, "UPDATE", kube=kube)
    assert code == 422
    assert message.splitlines() == [
        "spec.instance: cannot change while the job is Running: suspend it first (spec.suspend: true) or create "
        "a new job",
        "spec.dataMounts[0]: cannot check against DGXDataMount ml/data: get dgxdatamounts ml/data: HTTP 429 Too "
        "Many Requests; retry",
    ]


def test_a_finalizer_removal_never_looks_mounts_up() -> None:
    """Metadata-only updates pass before any lookup: a failing API server cannot pin a deleting job."""
    old = with_changes(data_job("data"), {"metadata.finalizers": ["kubedgx.io/finalizer"]})
    kube = Kube({("ml", "data"): TransientError("down")})
    assert outcome(with_changes(old, {"metadata.finalizers": []}), old, "UPDATE", kube=kube) == (None, [])
    assert kube.most_in_flight == 0


# -- a stored mount this kubedgx cannot read ---------------------------------------------------------------------


def test_a_stored_mount_that_no_longer_parses_is_treated_as_absent_with_a_warning() -> None:
    """Like an absent mount (the job waits for it, the operator reports it), not a reason to refuse every edit
    of the job (suspending it, too) for another object's sake; the warning says which and what to do."""
    broken = mount("data", **{"spec.direction": "Sideways"})  # stored under a schema that allowed it
    error, warnings = outcome(data_job("data"), kube=Kube({("ml", "data"): broken}))
    assert error is None
    (warning,) = warnings
    assert warning.startswith(
        "spec.dataMounts[0]: DGXDataMount ml/data cannot be read by this kubedgx (spec.direction: "
    )
    assert warning.endswith(
        "), so the job was not checked against it and waits for it; re-apply the mount with a valid spec"
    )
    assert "\n" not in warning


def test_a_stored_mount_with_a_broken_status_is_still_checked() -> None:
    """Only its spec matters to the job; its status is the operator's to rewrite."""
    for status in ("x", {"phase": 5}):
        kube = Kube({("ml", "data"): mount("data", status=status)})
        assert refusal(data_job("data"), kube=kube) == (422, OUT_DIR_IN_INPUT)


# -- a status of the wrong type ------------------------------------------------------------------------------


STATUSES = [
    pytest.param("x", id="not-an-object"),
    pytest.param({"phase": 5}, id="phase-a-number"),
    pytest.param({"phase": "Running", "startTime": 7}, id="startTime-a-number"),
    pytest.param({"conditions": "x"}, id="conditions-not-a-list"),
]


@pytest.mark.parametrize("status", STATUSES)
def test_a_wrong_typed_status_does_not_block_a_valid_spec(status: Any) -> None:
    """Users cannot write the status (the apiserver drops it from a CREATE and keeps the stored one on an
    UPDATE); one stored under an older schema must not pin the spec."""
    old = with_changes(JOB, {"status": status})
    assert outcome(old) == (None, [])
    assert outcome(with_changes(old, {"spec.maxDuration": "2h"}), old, "UPDATE") == (None, [])
    stored_mount = with_changes(BASE_MOUNT, {"status": status})
    assert outcome(stored_mount) == (None, [])
    assert outcome(with_changes(stored_mount, {"spec.source": "s3://bucket/other"}), stored_mount, "UPDATE") == (
        None,
        [],
    )


@pytest.mark.parametrize("status", STATUSES)
def test_an_invalid_spec_with_a_wrong_typed_status_is_refused_for_the_spec_only(status: Any) -> None:
    old = with_changes(BASE_JOB, {"status": status})
    new = with_changes(old, {"spec.elastic.minNodes": 0})
    assert refusal(new, old, "UPDATE") == (422, "spec.elastic.minNodes: should be greater than or equal to 1 (got 0)")


def test_fields_are_immutable_only_under_a_status_the_operator_wrote() -> None:
    """A status that is not an object says nothing about running workers: the rule does not apply."""
    change = {"spec.instance": "dgxh100.80g.8.norm"}
    for status in ("x", ["Running"], {"phase": 5, "startTime": STARTED}):
        old = with_changes(JOB, {"status": status})
        assert outcome(with_changes(old, change), old, "UPDATE") == (None, [])
    old = running(BASE_JOB)
    assert refusal(with_changes(old, change), old, "UPDATE")[0] == 422


# -- anything else ---------------------------------------------------------------------------------------------


class BrokenValidator:
    catalog = None

    def validate(self, obj: Any, *, old: Any = None) -> Outcome:
        raise KeyError("spec")


def test_an_unexpected_error_refuses_as_retryable_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    memo = kopf.Memo(config=OperatorConfig(), validator=BrokenValidator())
    with caplog.at_level(logging.ERROR, logger="kubedgx"):
        code, message = refusal(BASE_JOB, memo=memo)
    assert (code, message) == (
        503,
        "DGXTrainingJob/job: the kubedgx webhook failed while checking it (KeyError: 'spec'); retry, and if this "
        "persists, the operator's log has the details",
    )
    (record,) = caplog.records
    assert record.getMessage() == "webhook: CREATE of DGXTrainingJob/job failed"
    assert record.exc_info is not None  # the traceback is in the operator's log


def test_an_unexpected_error_of_a_mount_is_refused_the_same_way() -> None:
    memo = kopf.Memo(config=OperatorConfig(), validator=BrokenValidator())
    code, message = refusal(BASE_MOUNT, memo=memo)
    assert code == 503
    assert message.startswith("DGXDataMount/data: the kubedgx webhook failed while checking it (KeyError: 'spec')")
