"""The shared per-object reconcile loop (dgx_operator.controllers.loop): a bounded number of objects reconcile at
once, and an object waiting for a slot still coalesces its triggers into one pass."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from dgx_operator.controllers.loop import MAX_CONCURRENT_RECONCILES, Key, ReconcileLoop

pytestmark = pytest.mark.asyncio


@dataclass
class Gated(ReconcileLoop):
    """Every pass waits until the test opens the gate; counts passes and the most at once."""

    kind: ClassVar[str] = "Test"
    metrics: None = None
    dirty: set[Key] = field(default_factory=set)
    workers: dict[Key, asyncio.Task[None]] = field(default_factory=dict)
    timers: dict[Key, asyncio.TimerHandle] = field(default_factory=dict)
    failures: dict[Key, int] = field(default_factory=dict)
    retry_base: float = 1.0
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    running: int = 0
    most: int = 0
    passes: dict[Key, int] = field(default_factory=dict)

    async def step(self, key: Key) -> float | None:
        async with self.changed:
            self.running += 1
            self.most = max(self.most, self.running)
            self.changed.notify_all()
        await self.gate.wait()
        async with self.changed:
            self.running -= 1
            self.passes[key] = self.passes.get(key, 0) + 1
            self.changed.notify_all()
        return None

    async def until(self, predicate: object, timeout: float = 5.0) -> None:
        assert callable(predicate)
        async with asyncio.timeout(timeout), self.changed:
            await self.changed.wait_for(predicate)


async def test_a_burst_reconciles_a_bounded_number_at_once_and_every_object_once() -> None:
    loop = Gated()
    keys = [("ns", f"job-{i}") for i in range(3 * MAX_CONCURRENT_RECONCILES)]
    for key in keys:
        loop.trigger(*key)
    await loop.until(lambda: loop.running == MAX_CONCURRENT_RECONCILES)
    # Triggers of an object that waits for a slot, or is being reconciled, are one more pass at most.
    for key in keys:
        loop.trigger(*key)
        loop.trigger(*key)
    loop.gate.set()
    await loop.until(lambda: sum(loop.passes.values()) >= len(keys) + MAX_CONCURRENT_RECONCILES)
    await asyncio.gather(*loop.workers.values())
    assert loop.most == MAX_CONCURRENT_RECONCILES
    running_first = keys[:MAX_CONCURRENT_RECONCILES]
    assert {k: n for k, n in loop.passes.items() if n != 1} == dict.fromkeys(running_first, 2)
    assert set(loop.passes) == set(keys)
