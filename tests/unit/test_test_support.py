"""The test suite's own machinery (tests/support): the order modules are handed to pytest-xdist's
workers in, the per-worker port blocks, the one wait, the paused timeout, the folder of a test id.
A mistake here would not fail a test of the product; it would make the suite slower, or flaky."""

from __future__ import annotations

import signal
import socket
from collections import OrderedDict

import pytest

from tests.conftest import ROOT
from tests.support import ports, schedule
from tests.support.paths import folder_of
from tests.support.timeouts import timeout_paused
from tests.support.wait import WaitTimeoutError, wait_until

MODULES = {
    "tests/unit/test_a.py": 0,
    "tests/cluster/test_b.py": 0,
    "tests/trainer/test_c.py": 0,
    "tests/e2e/test_d.py": 0,
    "tests/unit/test_e.py": 0,
}
WEIGHTS = {"tests/unit/test_a.py": 2.0, "tests/cluster/test_b.py": 300.0, "tests/trainer/test_c.py": 60.0,
           "tests/e2e/test_d.py": 40.0}  # fmt: skip


def test_modules_go_longest_first_and_unknown_ones_count_as_a_few_seconds() -> None:
    assert schedule.order(MODULES, WEIGHTS, defer_control_plane=False) == [
        "tests/cluster/test_b.py",
        "tests/trainer/test_c.py",
        "tests/e2e/test_d.py",
        "tests/unit/test_e.py",  # unknown: UNKNOWN_SECONDS, more than test_a's 2 s
        "tests/unit/test_a.py",
    ]


def test_while_the_control_plane_builds_its_modules_go_last() -> None:
    assert schedule.order(MODULES, WEIGHTS, defer_control_plane=True) == [
        "tests/trainer/test_c.py",
        "tests/unit/test_e.py",
        "tests/unit/test_a.py",
        "tests/cluster/test_b.py",
        "tests/e2e/test_d.py",
    ]


def test_ties_keep_the_collection_order() -> None:
    modules = {"tests/unit/test_z.py": 0, "tests/unit/test_y.py": 0, "tests/unit/test_x.py": 0}
    assert schedule.order(modules, {}, defer_control_plane=False) == list(modules)


def test_only_the_cluster_layer_counts_as_waiting_on_controllers() -> None:
    assert not schedule.cpu_bound("tests/cluster/test_ha.py")
    assert not schedule.cpu_bound("tests/e2e/test_elastic.py")
    assert schedule.cpu_bound("tests/trainer/test_local.py")
    assert schedule.cpu_bound("tests/unit/test_planner.py")


def test_the_recorded_durations_name_modules_that_exist() -> None:
    """A renamed module would silently lose its weight (and sort as an unknown one)."""
    missing = [m for m in schedule.recorded() if not (ROOT / m).is_file()]
    assert not missing, f"tests/support/durations.json names modules that do not exist: {missing}"


@pytest.fixture
def fresh_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """The port sequence drawn anew (the module's own is put back after the test)."""
    monkeypatch.setattr(ports, "_pool", None)
    monkeypatch.setattr(ports, "_pid", None)


@pytest.mark.parametrize(("worker", "block"), [("gw0", 0), ("gw1", 1), ("gw5", 5)])
def test_each_worker_draws_ports_from_its_own_block_below_the_ephemeral_range(
    worker: str, block: int, monkeypatch: pytest.MonkeyPatch, fresh_pool: None
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    low, _ = ports._ephemeral_range()
    start = ports.POOL_START + block * ports.BLOCK
    drawn = [ports.free_port() for _ in range(50)]
    assert len(set(drawn)) == 50, "a port handed out twice in a row"
    assert all(start <= p < start + ports.BLOCK for p in drawn), drawn
    assert all(p < low for p in drawn)


def test_a_port_something_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch, fresh_pool: None) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    first = ports.free_port()
    monkeypatch.setattr(ports, "_pool", None)  # the same sequence again, with its first port taken
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first))
        taken.listen()
        assert ports.free_port() != first


def test_wait_until_returns_the_probes_value() -> None:
    answers = iter([None, False, 0, "", "ready"])
    assert wait_until(lambda: next(answers), timeout=5, interval=0) == "ready"


def test_wait_until_names_what_it_waited_for_and_the_last_value() -> None:
    with pytest.raises(WaitTimeoutError, match=r"waiting for the moon \(last: ''\)\n\nlogs"):
        wait_until(lambda: "", timeout=0.05, what="the moon", diagnose=lambda: "logs")


def test_wait_until_retries_only_the_exceptions_it_is_told_to() -> None:
    calls: list[int] = []

    def refused_twice() -> str | None:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError
        return "up"

    assert wait_until(refused_twice, timeout=5, interval=0, retry_on=(OSError,)) == "up"
    with pytest.raises(ZeroDivisionError):
        wait_until(lambda: 1 // 0, timeout=5, retry_on=(OSError,))


def test_wait_until_raises_the_error_class_it_is_given() -> None:
    class StartError(RuntimeError):
        pass

    with pytest.raises(StartError, match="the apiserver"):
        wait_until(lambda: None, timeout=0.01, what="the apiserver", error=StartError)


def test_a_paused_timeout_stops_the_timer_and_gives_back_what_was_left() -> None:
    previous = signal.setitimer(signal.ITIMER_REAL, 0)  # pytest-timeout's own, if any, is put back below
    try:
        signal.setitimer(signal.ITIMER_REAL, 100.0)
        with timeout_paused():
            assert signal.getitimer(signal.ITIMER_REAL)[0] == 0
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 90 < left <= 100
    finally:
        signal.setitimer(signal.ITIMER_REAL, *previous)


@pytest.mark.parametrize(
    ("nodeid", "folder"),
    [
        ("tests/unit/test_x.py::test_y[a/b::c]", "tests/unit"),
        ("tests/cluster/test_ha.py::test_z", "tests/cluster"),
        ("tests/test_top.py::test_t", "tests"),
    ],
)
def test_a_test_id_is_reported_under_its_folder(nodeid: str, folder: str) -> None:
    assert folder_of(nodeid) == folder


def test_the_slow_tier_names_modules_that_exist() -> None:
    from tests.support.tiers import SLOW

    assert not [m for m in SLOW if not (ROOT / m).is_file()]


class FakeNode:
    """What the scheduler asks of a pytest-xdist worker: the test indices it is sent."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices


def scheduler_with(running: dict[FakeNode, str], queued: list[str]) -> schedule.ModuleScheduling:
    """A scheduler whose workers in ``running`` each run one module, with ``queued`` in its queue."""
    sched = schedule.ModuleScheduling.__new__(schedule.ModuleScheduling)
    sched.cpu_slots = 2
    sched.assigned_work = {node: {module: {f"{module}::t": False}} for node, module in running.items()}
    sched.workqueue = OrderedDict((m, {f"{m}::t": False}) for m in queued)
    sched.registered_collections = {}
    return sched


def test_with_the_cores_taken_by_cpu_bound_modules_a_worker_gets_a_cluster_module() -> None:
    a, b, idle = FakeNode(), FakeNode(), FakeNode()
    queued = ["tests/trainer/test_x.py", "tests/unit/test_y.py", "tests/cluster/test_z.py"]
    collection = [f"{m}::t" for m in ["tests/trainer/test_a.py", "tests/trainer/test_b.py", *queued]]
    sched = scheduler_with({a: "tests/trainer/test_a.py", b: "tests/trainer/test_b.py"}, queued)
    sched.registered_collections = {idle: collection}
    sched._assign_work_unit(idle)
    assert idle.sent == [collection.index("tests/cluster/test_z.py::t")]
    assert list(sched.workqueue) == ["tests/trainer/test_x.py", "tests/unit/test_y.py"]


def test_with_a_core_free_or_no_cluster_module_left_the_order_holds() -> None:
    a, idle = FakeNode(), FakeNode()
    queued = ["tests/trainer/test_x.py", "tests/cluster/test_z.py"]
    collection = [f"{m}::t" for m in ["tests/trainer/test_a.py", *queued]]
    sched = scheduler_with({a: "tests/trainer/test_a.py"}, queued)
    sched.registered_collections = {idle: collection}
    sched._assign_work_unit(idle)
    assert idle.sent == [collection.index("tests/trainer/test_x.py::t")]
