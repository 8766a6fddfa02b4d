"""kopf wiring of the validating webhook. A separate module because kopf refuses to start with
validation handlers but no webhook server: `kubedgx operator` imports it when a webhook port is
configured (KUBEDGX_WEBHOOK_PORT or --webhook-port); without one the operator runs no admission.
Each handler is served at ``/<its id>``: /validate-dgxtrainingjob and /validate-dgxdatamount.

Every review is counted and timed here (``kubedgx_webhook_requests_total``,
``kubedgx_webhook_request_duration_seconds``), around :func:`dgx_operator.webhook.admission.review`, whose
refusals say what happened: code 422 for an invalid object, anything else (503: it could not be
checked) for a review that decided nothing."""

from __future__ import annotations

import time
from typing import Any

import kopf

from dgx_operator.api.crdgen import DATA_MOUNTS, TRAINING_JOBS
from dgx_operator.controllers.metrics import JOB_KIND, MOUNT_KIND, Metrics
from dgx_operator.webhook import admission


def result_of(error: BaseException | None) -> str:
    """allowed, denied (the object is invalid: a 4xx refusal) or error (not decided: the apiserver
    applies the webhook's failurePolicy, so a rise of these is an outage, not bad manifests)."""
    if error is None:
        return "allowed"
    if isinstance(error, kopf.AdmissionError) and error.code is not None and 400 <= error.code < 500:
        return "denied"
    return "error"


async def reviewed(kind: str, body: Any, memo: Any, old: Any, operation: Any, warnings: Any) -> None:
    """admission.review, counted and timed (memo.metrics is absent where a test calls a handler
    without the operator's startup)."""
    metrics: Metrics | None = memo.get("metrics")
    started = time.perf_counter()
    error: BaseException | None = None
    try:
        await admission.review(memo, dict(body), dict(old) if old else None, operation, warnings)
    except BaseException as exc:  # counted, never swallowed
        error = exc
        raise
    finally:
        if metrics is not None:
            metrics.admission(kind, operation, result_of(error), time.perf_counter() - started)


@kopf.on.validate(*TRAINING_JOBS.resource, id=admission.JOB_WEBHOOK)
async def validate_job(
    body: Any, memo: Any, old: Any = None, operation: Any = None, warnings: Any = None, **_: Any
) -> None:
    await reviewed(JOB_KIND, body, memo, old, operation, warnings)


@kopf.on.validate(*DATA_MOUNTS.resource, id=admission.MOUNT_WEBHOOK)
async def validate_mount(
    body: Any, memo: Any, old: Any = None, operation: Any = None, warnings: Any = None, **_: Any
) -> None:
    await reviewed(MOUNT_KIND, body, memo, old, operation, warnings)
