"""kopf wiring of the validating webhook. A separate module because kopf refuses to start with
validation handlers but no webhook server: `kubedgx operator` imports it when a webhook port is
configured (KUBEDGX_WEBHOOK_PORT or --webhook-port); without one the operator runs no admission.
Each handler is served at ``/<its id>``: /validate-dgxtrainingjob and /validate-dgxdatamount."""

from __future__ import annotations

from typing import Any

import kopf

from dgx_operator import admission
from dgx_operator.handlers import JOB, MOUNT


@kopf.on.validate(*JOB, id=admission.JOB_WEBHOOK)
async def validate_job(
    body: Any, memo: Any, old: Any = None, operation: Any = None, warnings: Any = None, **_: Any
) -> None:
    await admission.review(memo, dict(body), dict(old) if old else None, operation, warnings)


@kopf.on.validate(*MOUNT, id=admission.MOUNT_WEBHOOK)
async def validate_mount(
    body: Any, memo: Any, old: Any = None, operation: Any = None, warnings: Any = None, **_: Any
) -> None:
    await admission.review(memo, dict(body), dict(old) if old else None, operation, warnings)
