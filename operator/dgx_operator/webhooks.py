"""kopf wiring of the validating webhook. A separate module because kopf refuses to start with
validation handlers but no webhook server: `kubedgx operator --webhook-port` imports it; without
the flag the operator runs no admission (the chart always sets it)."""

from __future__ import annotations

from typing import Any

import kopf

from dgx_operator import admission
from dgx_operator.handlers import JOB, MOUNT


@kopf.on.validate(*JOB, id="validate-dgxtrainingjob")
async def validate_job(body: Any, memo: Any, old: Any = None, operation: Any = None, **_: Any) -> None:
    await admission.review(memo, dict(body), dict(old) if old else None, operation)


@kopf.on.validate(*MOUNT, id="validate-dgxdatamount")
async def validate_mount(body: Any, memo: Any, old: Any = None, operation: Any = None, **_: Any) -> None:
    await admission.review(memo, dict(body), dict(old) if old else None, operation)
