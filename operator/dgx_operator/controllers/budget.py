"""The DGXBudget controller (issue 31): a pass per budget settles every live job of its namespace
it covers (their ``status.usage`` growth since the ledger last saw them), rolls the period when it
ends, releases the reservations of runs that ended, and writes the budget's numbers (spent,
committed, remaining) when they changed; then it wakes the namespace's jobs held ``BudgetExceeded``,
which judge their runs again. It looks again every ``interval`` (the numbers stay that fresh, and a
period rolls within it), and whenever the budget changes.

The ledger is the budget's status (controllers/ledger.py writes it, guarded by resourceVersion), so
a restarted operator or a new leader goes on from it and counts nothing twice."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import ClassVar

from dgx_operator.api.crdgen import BUDGETS
from dgx_operator.catalog import Catalog
from dgx_operator.controllers import ledger
from dgx_operator.controllers.loop import Key, ReconcileLoop, utcnow
from dgx_operator.controllers.metrics import Metrics
from dgx_operator.kube import Kube

#: How often a budget is settled and its numbers written, at most (a period rolls within it).
DEFAULT_INTERVAL = 60.0


@dataclass
class BudgetController(ReconcileLoop):
    """See the module docstring."""

    kind: ClassVar[str] = BUDGETS.kind
    kube: Kube
    catalog: Catalog
    #: Wakes a namespace's jobs (the job controller's trigger of every job held by a budget).
    wake_jobs: Callable[[str], None] = lambda namespace: None
    now: Callable[[], datetime] = utcnow
    interval: float = DEFAULT_INTERVAL
    retry_base: float = 1.0
    metrics: Metrics | None = None
    dirty: set[Key] = field(default_factory=set)
    workers: dict[Key, asyncio.Task[None]] = field(default_factory=dict)
    timers: dict[Key, asyncio.TimerHandle] = field(default_factory=dict)
    failures: dict[Key, int] = field(default_factory=dict)

    def forget(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        self.cancel_timer(key)
        self.forget_key(key)
        self.failures.pop(key, None)
        self.wake_jobs(namespace)  # a deleted budget holds nothing any more

    async def step(self, key: Key) -> float | None:
        namespace, name = key
        exists = await ledger.reconcile_budget(self.kube, namespace, name, self.catalog, self.now())
        self.wake_jobs(namespace)
        return self.interval if exists else None
