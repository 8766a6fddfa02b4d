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
    for reports in terminalreporter.stats.values():
        for report in reports:
            if not isinstance(report, pytest.TestReport):
                continue
            modules[report.nodeid.split("::", 1)[0]] += report.duration
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
