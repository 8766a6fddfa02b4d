"""The per-worker lines of tests/support/report.py: which worker ran out of work when, and on what."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support.report import _clock, _Worker, _worker_of


def report(nodeid: str, worker: str | None, start: float, stop: float) -> pytest.TestReport:
    made = pytest.TestReport(nodeid, ("f.py", 1, "t"), {}, "passed", None, "call", duration=stop - start,
                             start=start, stop=stop)  # fmt: skip
    if worker is not None:
        made.node = SimpleNamespace(gateway=SimpleNamespace(id=worker))  # type: ignore[attr-defined]
    return made


def test_each_worker_spans_its_first_start_to_its_last_stop_and_names_the_last_module() -> None:
    workers: dict[str, _Worker] = {}
    for r in (report("tests/a.py::x", "gw0", 10.0, 12.0), report("tests/b.py::y", "gw0", 12.0, 30.0),
              report("tests/c.py::z", "gw1", 11.0, 14.0), report("tests/a.py::w", "gw0", 5.0, 6.0)):  # fmt: skip
        _worker_of(workers, r)
    assert workers["gw0"].first == 5.0
    assert workers["gw0"].last == 30.0
    assert workers["gw0"].last_module == "tests/b.py"
    assert workers["gw0"].busy == pytest.approx(21.0)
    assert workers["gw1"] == _Worker(11.0, 14.0, 3.0, "tests/c.py")


def test_reports_of_a_run_without_workers_are_left_out() -> None:
    workers: dict[str, _Worker] = {}
    _worker_of(workers, report("tests/a.py::x", None, 1.0, 2.0))
    assert workers == {}


@pytest.mark.parametrize(("seconds", "text"), [(0, "0m00s"), (59.6, "1m00s"), (1337.2, "22m17s")])
def test_clock(seconds: float, text: str) -> None:
    assert _clock(seconds) == text
