"""First light: the real operator against the emulator, happy path."""

from __future__ import annotations

import copy
from typing import Any

import kopf
import pytest

from dgx_operator.settings import OperatorConfig
from tests.conftest import BASE_JOB
from tests.integration.emulator import Emulator

pytestmark = pytest.mark.asyncio

FAST = OperatorConfig(error_backoffs=(0.1, 0.2, 0.5, 1.0), retry_base=0.1)


async def test_happy_path(emulator: Emulator, run_operator: Any) -> None:
    await run_operator("dgx_operator.handlers", wait_for=("dgxtrainingjobs", "pods"), memo=kopf.Memo(config=FAST))
    job = copy.deepcopy(BASE_JOB)
    job["spec"]["elastic"] = {"minNodes": 2, "maxNodes": 2}
    emulator.create("dgxtrainingjobs", job, namespace="ml")
    await emulator.wait_for_object("pods", "ml", "job-worker-1")
    for i in range(2):
        emulator.patch_status(
            "pods",
            "ml",
            f"job-worker-{i}",
            {"phase": "Running", "containerStatuses": [{"name": "trainer", "state": {"running": {}}}]},
        )
    obj = await emulator.wait_for_object(
        "dgxtrainingjobs", "ml", "job", lambda j: (j.get("status") or {}).get("phase") == "Running"
    )
    print(obj["status"]); print("META", obj["metadata"])
    emulator.patch_status(
        "pods",
        "ml",
        "job-worker-0",
        {"phase": "Succeeded", "containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 0}}}]},
    )
    await emulator.wait_for_object(
        "dgxtrainingjobs", "ml", "job", lambda j: (j.get("status") or {}).get("phase") == "Succeeded"
    )
    await emulator.wait_for_absence("pods", "ml", "job-worker-1")
    writes = [c for c in emulator.log if c.write]
    for c in writes:
        print(c.verb, c.resource, c.subresource, c.name, c.status)
