"""How pytest-xdist hands test modules to its workers: whole modules, the longest first.

pytest-xdist's ``loadscope`` keeps a module on one worker (its module fixtures, its operator in the
control plane's slot, its Kueue manager are made once) but orders modules by their number of tests,
so a 3-test cluster module of two minutes starts after a 500-test unit module of ten seconds, and
the run ends with one worker still on it while the others idle. This scheduler keeps the module as
the unit and hands them out longest first (the classic LPT rule), by the seconds each module took in
a recorded run (``durations.json`` beside this file; a run with ``--module-durations
tests/support/durations.json`` rewrites it, tests/support/report.py). A module not recorded there
counts as ``UNKNOWN_SECONDS``.

Modules that keep the CPU busy (everything but the cluster layer: training on tiny models, torchrun,
in-process servers) are handed out at most ``cpu_count()`` at a time; a worker that asks for work
while that many run gets a module of the cluster layer, which mostly waits on controllers (their
control plane's processes take about a sixth of a core each). Four CPU-bound modules on two cores at
once ran each of them four times slower, close to their timeouts, and left the waiting modules
queued behind them. Once no module of the cluster layer is left in the queue, any worker takes
the next module.

One exception, for a machine whose Go builds are still running (CI's cold start, where .ci/run builds
in the background while the tests run): modules that need the control plane (tests/cluster,
tests/e2e) go after all the others, so workers are not parked on the build's lock while other work
waits. The cap holds then too: a worker that would exceed it takes a module of the cluster layer and
waits on the build's lock, while .ci/run's build runs niced, so the tests' own processes (each with
a timeout) come first. The decision is made once, here in the controller, when the run starts.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

HERE = Path(__file__).resolve().parent
DURATIONS = HERE / "durations.json"
ROOT = HERE.parents[1]

#: The seconds assumed for a module that no recorded run knows.
UNKNOWN_SECONDS = 5.0

#: Folders whose modules need the control plane built from Go modules.
NEEDS_CONTROL_PLANE = ("tests/cluster/", "tests/e2e/", "tests/nodes/")


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def recorded() -> dict[str, float]:
    try:
        data = json.loads(DURATIONS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.get("modules", {}).items()}


def control_plane_built() -> bool:
    """Whether tests/cluster/build.sh has every binary in its cache (it answers in milliseconds and
    builds nothing with --print-bin-dir)."""
    try:
        done = subprocess.run(["bash", str(ROOT / "tests/cluster/build.sh"), "--print-bin-dir"],
                              capture_output=True, timeout=60, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def cpu_bound(module: str) -> bool:
    return not module.startswith(NEEDS_CONTROL_PLANE)


def order(modules: Mapping[str, Any], weights: Mapping[str, float], *, defer_control_plane: bool) -> list[str]:
    """The modules longest first; with ``defer_control_plane``, those needing the control plane after
    the rest (each part longest first). Ties keep collection order."""
    position = {m: i for i, m in enumerate(modules)}

    def key(module: str) -> tuple[int, float, int]:
        deferred = defer_control_plane and module.startswith(NEEDS_CONTROL_PLANE)
        return (1 if deferred else 0, -weights.get(module, UNKNOWN_SECONDS), position[module])

    return sorted(modules, key=key)


class ModuleScheduling(LoadScopeScheduling):
    """``loadscope`` by module, in ``order()``'s order (module docstring)."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self.weights = recorded()
        self.defer_control_plane = not control_plane_built()
        self.cpu_slots = max(1, os.cpu_count() or 1)

    def _cpu_bound_running(self) -> int:
        return sum(
            1
            for work in self.assigned_work.values()
            for scope, tests in work.items()
            if cpu_bound(scope) and not all(tests.values())
        )

    def _assign_work_unit(self, node: Any) -> None:
        """The first module in order, unless ``cpu_slots`` CPU-bound modules run already and a
        module of the cluster layer is still queued: then the first of those (module docstring)."""
        assert self.workqueue
        if self._cpu_bound_running() >= self.cpu_slots:
            waiting = next((m for m in self.workqueue if not cpu_bound(m)), None)
            if waiting is not None:
                self.workqueue.move_to_end(waiting, last=False)
        super()._assign_work_unit(node)

    def _split_scope(self, nodeid: str) -> str:
        return module_of(nodeid)

    def schedule(self) -> None:
        """LoadScopeScheduling.schedule with the work queue in ``order()``'s order (the rest as
        pytest-xdist 3.8 does it: same-collection check, surplus workers shut down, each worker
        given a first module)."""
        assert self.collection_is_completed
        if self.collection is not None:
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(next(iter(self.registered_collections.values())))
        if not self.collection:
            return
        units: dict[str, dict[str, bool]] = {}
        for nodeid in self.collection:
            units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
        self.workqueue = OrderedDict(
            (m, units[m]) for m in order(units, self.weights, defer_control_plane=self.defer_control_plane)
        )
        for _ in range(len(self.nodes) - len(self.workqueue)):
            unused, _assigned = self.assigned_work.popitem()
            unused.shutdown()
        for node in self.nodes:
            self._assign_work_unit(node)
        for node in self.nodes:
            self._reschedule(node)
        if not self.workqueue:
            for node in self.nodes:
                node.shutdown()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> ModuleScheduling | None:
    """Our scheduler for ``-n N`` (pytest-xdist's default ``--dist load``) and ``--dist loadscope``;
    any other ``--dist`` (loadfile, loadgroup, worksteal) as pytest-xdist does it."""
    if config.getoption("dist") in ("load", "loadscope"):
        return ModuleScheduling(config, log)
    return None
