"""The jobs and budgets of `kubedgx usage`'s tests, and of the report shown in docs/cost.md.

Two teams at 2026-12-05 10:00 UTC, at the catalog's example prices for H100s (norm 3.40 USD per
GPU-hour, spot 1.10, savings measured against norm):

- ``team-a`` (label ``team=a``) has a DGXBudget ``monthly`` (``enforcement: Report``, calendar
  month in UTC, every job) whose ledger counts December: ``llama-a`` (running, 8 GPUs on norm,
  settled at 08:00 with 36000 GPU-seconds, 45000 by its usage watermark at 09:55) and ``llama-b``,
  deleted by its TTL after 40 GPU-hours on spot (44.00 USD). ``bert-c`` ran on spot in November
  (10 hours x 8 GPUs, 88.00 USD, 184.00 saved); November's history: 100 GPU-hours, 156.00 USD.
- ``team-b`` (label ``team=b``) has no budget: ``vit-b`` (finished, 4 hours x 8 GPUs on spot, queue
  ``research``) and ``vit-c`` (running, 2 hours x 8 GPUs on norm, queue ``prod``).

December for team-a is therefore 12.50 + 40.00 = 52.50 GPU-hours and 42.50 + 44.00 = 86.50 USD
(llama-a's 9000 GPU-seconds since the settle included); team-b's 32.00 + 16.00 = 48.00 GPU-hours,
35.20 + 54.40 = 89.60 USD, 73.60 saved.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

NOW = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)
NORM, SPOT = Decimal("3.40"), Decimal("1.10")
QUEUE = "kueue.x-k8s.io/queue-name"
NAMESPACES = {"team-a": {"team": "a"}, "team-b": {"team": "b"}}
#: Job uids where the test picks them (the emulator assigns its own).
UIDS = {"llama-a": "uid-llama-a", "bert-c": "uid-bert-c", "vit-b": "uid-vit-b", "vit-c": "uid-vit-c"}


def _two(value: Decimal) -> str:
    return str(value.quantize(Decimal("0.01")))


def usage(capacity: str, gpu_seconds: int, until: str, *, running: int = 0) -> dict[str, Any]:
    """``status.usage`` of a job that used ``gpu_seconds`` on one capacity, ``running`` GPUs still held."""
    price = NORM if capacity == "norm" else SPOT
    cost = gpu_seconds * price / 3600
    saved = gpu_seconds * (NORM - price) / 3600
    holding = (
        [
            {
                "pod": "pod-0",
                "gpus": running,
                "capacity": capacity,
                "pricePerGpuHour": str(price),
                "referencePricePerGpuHour": str(NORM),
            }
        ]
        if running
        else []
    )
    return {
        "gpuSeconds": gpu_seconds,
        "gpuHours": _two(Decimal(gpu_seconds) / 3600),
        "cost": _two(cost),
        "currency": "USD",
        "spotSavings": _two(saved),
        "examplePrices": True,
        "accountedUntil": until,
        "buckets": [
            {
                "capacity": capacity,
                "pricePerGpuHour": str(price),
                "referencePricePerGpuHour": str(NORM),
                "gpuSeconds": gpu_seconds,
            }
        ],
        "running": holding,
    }


def job(
    namespace: str,
    name: str,
    created: str,
    phase: str,
    status_usage: Mapping[str, Any] | None,
    queue: str | None = None,
) -> dict[str, Any]:
    """A DGXTrainingJob as the API server lists it."""
    labels = {QUEUE: queue} if queue else {}
    return {
        "apiVersion": "kubedgx.io/v1alpha1",
        "kind": "DGXTrainingJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": UIDS.get(name, f"uid-{name}"),
            "creationTimestamp": created,
            "labels": labels,
        },
        "spec": {"instance": "dgxh100.80g.8.norm", "command": ["true"], "maxDuration": "24h"},
        "status": {"phase": phase, **({"usage": dict(status_usage)} if status_usage else {})},
    }


SPECS = {
    "team-a/llama-a": (
        "2026-12-02T00:00:00Z",
        "Running",
        usage("norm", 45000, "2026-12-05T09:55:00Z", running=8),
        None,
    ),
    "team-a/bert-c": ("2026-11-20T00:00:00Z", "Succeeded", usage("spot", 288000, "2026-11-22T00:00:00Z"), None),
    "team-b/vit-b": ("2026-12-03T00:00:00Z", "Succeeded", usage("spot", 115200, "2026-12-03T06:00:00Z"), "research"),
    "team-b/vit-c": (
        "2026-12-05T07:00:00Z",
        "Running",
        usage("norm", 57600, "2026-12-05T09:55:00Z", running=8),
        "prod",
    ),
}


def jobs() -> list[dict[str, Any]]:
    out = []
    for key, (created, phase, status_usage, queue) in SPECS.items():
        namespace, name = key.split("/")
        out.append(job(namespace, name, created, phase, status_usage, queue))
    return out


BUDGET_SPEC: dict[str, Any] = {
    "limits": {"cost": "10000"},
    "period": {"calendar": "Month", "timeZone": "UTC"},
    "enforcement": "Report",
}


def budget_status(uids: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ledger of team-a/monthly as the budget controller last wrote it (at 08:00): llama-a
    settled up to 36000 GPU-seconds, llama-b deleted with its 40 spot GPU-hours, bert-c's row kept
    from November (live, nothing in December)."""
    ids = {**UIDS, **(uids or {})}
    return {
        "currency": "USD",
        "period": {"start": "2026-12-01T00:00:00Z", "end": "2027-01-01T00:00:00Z"},
        "spent": {"gpuHours": "50.00", "cost": "78.00"},
        "ledger": [
            {
                "job": "bert-c",
                "uid": ids["bert-c"],
                "seenGpuSeconds": 288000,
                "seenCost": "88",
                "seenUntil": "2026-11-22T00:00:00Z",
                "gpuSeconds": 0,
                "cost": "0",
            },
            {
                "job": "llama-a",
                "uid": ids["llama-a"],
                "seenGpuSeconds": 36000,
                "seenCost": "34",
                "seenUntil": "2026-12-05T08:00:00Z",
                "gpuSeconds": 36000,
                "cost": "34",
            },
            {
                "job": "llama-b",
                "uid": "uid-llama-b",
                "seenGpuSeconds": 144000,
                "seenCost": "44",
                "seenUntil": "2026-12-04T12:00:00Z",
                "gpuSeconds": 144000,
                "cost": "44",
            },
        ],
        "history": [
            {
                "start": "2026-11-01T00:00:00Z",
                "end": "2026-12-01T00:00:00Z",
                "gpuSeconds": 360000,
                "gpuHours": "100.00",
                "cost": "156",
                "jobs": 2,
            },
        ],
    }


def budget(uids: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "kubedgx.io/v1alpha1",
        "kind": "DGXBudget",
        "metadata": {"name": "monthly", "namespace": "team-a"},
        "spec": BUDGET_SPEC,
        "status": budget_status(uids),
    }
