"""The operator names the instances its catalog leaves unpriced when it starts (docs: catalog.yaml's
pricing block): no price is never a price of 0, and an admin who added a family (the chart's
catalogExtraGpus) without pricing it learns so from the operator's log."""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path

import kopf
import pytest
import yaml

from dgx_operator.runtime.settings import OperatorConfig
from tests.integration.conftest import RunOperator
from tests.integration.emulator import Emulator
from tests.integration.scenarios import JOBS

pytestmark = pytest.mark.asyncio


async def test_instances_left_unpriced_are_named_at_start(
    emulator: Emulator, run_operator: RunOperator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = yaml.safe_load(resources.files("dgx_operator").joinpath("catalog.yaml").read_text(encoding="utf-8"))
    data["pricing"]["perGpuHour"]["h100.80g"].pop("spot")
    data["pricing"]["perGpuHour"]["a100.40g"]["burst"] = "9.99"
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    memo = kopf.Memo(config=OperatorConfig(retry_base=0.1, status_interval=0, catalog_path=str(path)))
    with caplog.at_level(logging.WARNING, logger="dgx_operator.runtime.handlers"):
        await run_operator("dgx_operator.runtime.handlers", wait_for=(JOBS, "pods"), memo=memo)
        await emulator.wait_for(lambda: memo.get("controller"), timeout=10, message="the startup handler ran")
    warnings = [r.getMessage() for r in caplog.records if r.name == "dgx_operator.runtime.handlers"]
    assert warnings == [
        "the catalog's prices (pricing.perGpuHour) leave out h100.80g.spot: those instances have no price, "
        "and what they run is counted in GPU-hours only",
        "pricing.perGpuHour prices a100.40g.burst, which the catalog does not have (families: a100.40g, "
        "a100.80g, b200.180g, gb200.186g, h100.80g, h200.141g; capacities: norm, spot, debug): ignored",
    ]


async def test_a_fully_priced_catalog_warns_of_nothing(
    emulator: Emulator, run_operator: RunOperator, caplog: pytest.LogCaptureFixture
) -> None:
    memo = kopf.Memo(config=OperatorConfig(retry_base=0.1, status_interval=0))
    with caplog.at_level(logging.WARNING, logger="dgx_operator.runtime.handlers"):
        await run_operator("dgx_operator.runtime.handlers", wait_for=(JOBS, "pods"), memo=memo)
        await emulator.wait_for(lambda: memo.get("controller"), timeout=10, message="the startup handler ran")
    assert [r.getMessage() for r in caplog.records if r.name == "dgx_operator.runtime.handlers"] == []
