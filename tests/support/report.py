"""Where the test time goes: a table per test folder at the end of every run, and on request
(``--module-durations PATH``) each module's seconds as JSON, the weights tests/support/schedule.py
hands modules to pytest-xdist's workers by.

pytest's ``--durations=30`` names the slowest tests; this adds, per folder under tests/, how many
tests ran and the seconds they took (setup, call and teardown added up, which under pytest-xdist is
the work of all workers together, not the wall time). Printed by the controller process only; the
reports it sums are the ones pytest-xdist sends back from the workers.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.paths import folder_of


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--module-durations",
        metavar="PATH",
        default=None,
        help="write each test module's seconds (setup + call + teardown) to PATH as JSON "
        "(tests/support/durations.json is what the xdist scheduler orders modules by)",
    )


@dataclass
class _Folder:
    tests: int = 0
    seconds: float = 0.0
    failed: int = 0


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    folders: dict[str, _Folder] = defaultdict(_Folder)
    modules: dict[str, float] = defaultdict(float)
    workers: dict[str, _Worker] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if not isinstance(report, pytest.TestReport):
                continue
            modules[report.nodeid.split("::", 1)[0]] += report.duration
            _worker_of(workers, report)
            entry = folders[folder_of(report.nodeid)]
            entry.seconds += report.duration
            if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
                entry.tests += 1
            if report.failed:
                entry.failed += 1
    out = config.getoption("module_durations")
    if out and modules:
        body = {"modules": {m: round(s, 1) for m, s in sorted(modules.items())}}
        Path(out).write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
    if not folders:
        return
    tr = terminalreporter
    tr.section("time per test folder (setup + call + teardown, all workers added up)")
    width = max(len(name) for name in folders)
    tr.write_line(f"{'folder':<{width}}  {'tests':>6}  {'seconds':>9}  {'failed':>6}")
    for name, entry in sorted(folders.items(), key=lambda kv: -kv[1].seconds):
        tr.write_line(f"{name:<{width}}  {entry.tests:>6}  {entry.seconds:>9.1f}  {entry.failed:>6}")
    total = _Folder(sum(f.tests for f in folders.values()), sum(f.seconds for f in folders.values()),
                    sum(f.failed for f in folders.values()))  # fmt: skip
    tr.write_line(f"{'total':<{width}}  {total.tests:>6}  {total.seconds:>9.1f}  {total.failed:>6}")
    if len(workers) > 1:
        _write_workers(tr, workers)


@dataclass
class _Worker:
    """One pytest-xdist worker's span: when its first test started, when its last ended, and which."""

    first: float
    last: float
    busy: float = 0.0
    last_module: str = ""


def _worker_of(workers: dict[str, _Worker], report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)  # set by pytest-xdist's controller on the reports it receives
    name = getattr(getattr(node, "gateway", None), "id", None)
    start, stop = getattr(report, "start", None), getattr(report, "stop", None)
    if name is None or start is None or stop is None:
        return
    worker = workers.setdefault(name, _Worker(start, stop))
    worker.first, worker.busy = min(worker.first, start), worker.busy + report.duration
    if stop >= worker.last:
        worker.last, worker.last_module = stop, report.nodeid.split("::", 1)[0]


def _write_workers(tr: pytest.TerminalReporter, workers: dict[str, _Worker]) -> None:
    """When each worker ran out of work: a worker ending minutes before the others means the last
    modules were handed out badly (or one module is longer than the rest of the run)."""
    zero = min(w.first for w in workers.values())
    tr.section("time per worker (from the first test's start)")
    for name, worker in sorted(workers.items(), key=lambda kv: kv[1].last):
        tr.write_line(f"{name:<5} busy {worker.busy:7.1f}s  ended at {_clock(worker.last - zero)}  "
                      f"last module {worker.last_module}")  # fmt: skip


def _clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s"
