"""Leader election (dgx_operator/runtime/leader.py): the pure decisions, the Lease it writes, and the elector's
loop against an in-memory Lease store with client-go's semantics (resourceVersion preconditions), on
a clock the test moves. The real apiserver's part is proven in tests/cluster/test_ha.py."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from dgx_operator.controllers.loop import ReconcileLoop
from dgx_operator.runtime.leader import ElectionConfig, LeaderElector, Record, decide, default_identity, lease_spec
from dgx_operator.runtime.settings import ConfigError, OperatorConfig
from tests.support.wait import wait_until_async

NOW = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)


def record(holder: str, *, duration: float = 15, transitions: int = 0, rv: str = "1") -> Record:
    return Record(holder, duration, "t0", "t1", transitions, rv)


# -- decide --------------------------------------------------------------------------------------


def test_no_lease_is_created() -> None:
    assert decide(None, "me", None, 100.0) == "create"


def test_my_own_lease_is_renewed() -> None:
    assert decide(record("me"), "me", 0.0, 1000.0) == "renew"


def test_a_released_lease_is_taken_at_once() -> None:
    assert decide(record(""), "me", 99.9, 100.0) == "take"


def test_another_holder_is_waited_for_until_the_lease_expires_by_our_clock() -> None:
    held = record("other", duration=15)
    assert decide(held, "me", 100.0, 114.9) == "wait"
    assert decide(held, "me", 100.0, 115.0) == "take"


def test_a_lease_never_observed_changing_is_not_taken() -> None:
    assert decide(record("other"), "me", None, 1e9) == "wait"


# -- the Lease's spec ------------------------------------------------------------------------------


def config(**changes: Any) -> ElectionConfig:
    return ElectionConfig(namespace="ops", name="lease", identity="me", **changes)


def test_taking_counts_a_transition_and_renewing_keeps_the_acquire_time() -> None:
    taken = lease_spec(config(), record("other", transitions=2), NOW)
    assert taken["holderIdentity"] == "me"
    assert taken["leaseTransitions"] == 3
    assert taken["acquireTime"] == taken["renewTime"] == "2026-12-02T12:00:00.000000Z"
    renewed = lease_spec(config(), Record("me", 15, "first", "t", 3, "9"), NOW)
    assert (renewed["acquireTime"], renewed["leaseTransitions"]) == ("first", 3)
    assert renewed["leaseDurationSeconds"] == 15


def test_releasing_leaves_no_holder_and_a_short_lease() -> None:
    released = lease_spec(config(), Record("me", 15, "first", "t", 3, "9"), NOW, release=True)
    assert (released["holderIdentity"], released["leaseDurationSeconds"]) == ("", 1)


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"lease_duration": 10, "renew_deadline": 10}, "must exceed the renew deadline"),
        ({"renew_deadline": 2, "retry_period": 2}, "must exceed 1.2 x the retry period"),
    ],
)
def test_impossible_timings_are_refused(changes: dict[str, float], problem: str) -> None:
    assert any(problem in p for p in config(**changes).problems())
    assert config().problems() == []


def test_the_identity_names_the_pod_and_differs_per_start() -> None:
    first, second = default_identity({"POD_NAME": "op-0"}), default_identity({"POD_NAME": "op-0"})
    assert first.startswith("op-0_")
    assert second.startswith("op-0_")
    assert first != second


# -- settings ---------------------------------------------------------------------------------------


def test_settings_build_the_election_from_the_environment() -> None:
    env = {
        "KUBEDGX_LEADER_ELECTION": "1",
        "KUBEDGX_LEADER_ELECTION_NAMESPACE": "kubedgx",
        "KUBEDGX_LEADER_ELECTION_ID": "kubedgx-leader",
        "KUBEDGX_LEADER_ELECTION_LEASE_DURATION": "1m",
        "KUBEDGX_LEADER_ELECTION_RENEW_DEADLINE": "40s",
        "KUBEDGX_LEADER_ELECTION_RETRY_PERIOD": "1500ms",
        "POD_NAME": "op-1",
    }
    election = OperatorConfig.from_env(env).leader_election
    assert election is not None
    assert (election.namespace, election.name) == ("kubedgx", "kubedgx-leader")
    assert (election.lease_duration, election.renew_deadline, election.retry_period) == (60.0, 40.0, 1.5)
    assert election.identity.startswith("op-1_")
    assert OperatorConfig.from_env({}).leader_election is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"KUBEDGX_LEADER_ELECTION_LEASE_DURATION": "soon"},
            "KUBEDGX_LEADER_ELECTION_LEASE_DURATION: must be a duration such as 15s, 1m30s or 500ms, got 'soon'",
        ),
        (
            {"KUBEDGX_LEADER_ELECTION_RENEW_DEADLINE": "20s"},
            "KUBEDGX_LEADER_ELECTION_LEASE_DURATION: the lease duration (15s) must exceed the renew deadline",
        ),
        ({"KUBEDGX_LEADER_ELECTION_RETRY_PERIOD": "0s"}, "KUBEDGX_LEADER_ELECTION_RETRY_PERIOD: must be longer than 0"),
    ],
)
def test_bad_election_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    base = {"KUBEDGX_LEADER_ELECTION": "1", "KUBEDGX_LEADER_ELECTION_NAMESPACE": "kubedgx"}
    with pytest.raises(ConfigError) as refused:
        OperatorConfig.from_env(base | env)
    assert str(refused.value).startswith(message)


def test_the_shutdown_delay_and_bind_address_are_read() -> None:
    config = OperatorConfig.from_env({"KUBEDGX_SHUTDOWN_DELAY": "5s", "KUBEDGX_BIND_ADDRESS": "10.1.2.3"})
    assert (config.shutdown_delay, config.bind_address) == (5.0, "10.1.2.3")
    with pytest.raises(ConfigError, match="KUBEDGX_BIND_ADDRESS: must be an IP address"):
        OperatorConfig.from_env({"KUBEDGX_BIND_ADDRESS": "localhost"})


# -- the elector against a Lease store ---------------------------------------------------------------


class Leases:
    """An apiserver's Lease semantics: create refuses an existing name, replace needs the current
    resourceVersion; ``down`` makes every call fail as an unreachable apiserver would."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.down = False
        self.calls = 0  # every call, answered or not: how a test knows an elector has looked again

    def _check(self) -> None:
        self.calls += 1
        if self.down:
            raise TimeoutError("the apiserver does not answer")

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._check()
        return copy.deepcopy(self.lease)

    async def create_lease(self, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any] | None:
        self._check()
        if self.lease is not None:
            return None
        return self._store(spec)

    async def replace_lease(self, namespace: str, name: str, spec: dict[str, Any], rv: str) -> dict[str, Any] | None:
        self._check()
        if self.lease is None or self.lease["metadata"]["resourceVersion"] != rv:
            return None
        return self._store(spec)

    def _store(self, spec: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.lease = {"metadata": {"resourceVersion": str(self.version)}, "spec": dict(spec)}
        return copy.deepcopy(self.lease)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def elector(store: Leases, clock: Clock, identity: str, events: list[str]) -> LeaderElector:
    c = ElectionConfig(
        namespace="ops", name="lease", identity=identity, retry_period=0.01, renew_deadline=0.05, lease_duration=1.0
    )  # fmt: skip (Leases count whole seconds)
    return LeaderElector(
        store,  # type: ignore[arg-type]
        c,
        on_lead=lambda: events.append(f"{identity} leads"),
        on_follow=lambda: events.append(f"{identity} follows"),
        clock=clock,
        wall=lambda: NOW,
    )


async def looked_again(store: Leases, times: int) -> None:
    """Wait until the electors have called the store ``times`` more times: what they decide on a
    clock that did not move, proven by their own retries instead of a pause."""
    target = store.calls + times
    await until(lambda: store.calls >= target)


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the electors' tasks run until ``predicate`` holds (the test's clock does not move time)."""
    await wait_until_async(predicate, timeout=timeout, what="the electors' tasks to get there", interval=0.005)


@pytest.mark.asyncio
async def test_one_of_two_candidates_leads_and_the_other_takes_over_once_the_lease_expires() -> None:
    store, clock, events = Leases(), Clock(), []
    a, b = elector(store, clock, "a", events), elector(store, clock, "b", events)
    a.start()
    await until(lambda: a.leading)
    b.start()
    await until(lambda: b._observed is not None)
    assert not b.leading
    # a dies without releasing (its task cancelled, the Lease left as it was)
    assert a._task is not None
    a._task.cancel()
    await asyncio.gather(a._task, return_exceptions=True)
    clock.now += 0.5  # not yet expired by b's clock
    await looked_again(store, times=3)
    assert not b.leading
    clock.now += 0.6
    await until(lambda: b.leading)
    assert store.lease is not None
    assert store.lease["spec"]["holderIdentity"] == "b"
    assert store.lease["spec"]["leaseTransitions"] == 1
    assert events == ["a leads", "b leads"]
    await b.release()
    assert store.lease["spec"]["holderIdentity"] == ""
    assert events[-1] == "b follows"


@pytest.mark.asyncio
async def test_a_released_lease_is_taken_without_waiting_for_it_to_expire() -> None:
    store, clock, events = Leases(), Clock(), []
    a, b = elector(store, clock, "a", events), elector(store, clock, "b", events)
    a.start()
    await until(lambda: a.leading)
    b.start()
    await a.release()
    await until(lambda: b.leading)  # the clock never moved: no expiry was waited for
    assert events == ["a leads", "a follows", "b leads"]
    await b.release()


@pytest.mark.asyncio
async def test_a_leader_that_cannot_renew_stops_leading_before_its_lease_expires() -> None:
    store, clock, events = Leases(), Clock(), []
    a = elector(store, clock, "a", events)
    a.start()
    await until(lambda: a.leading)
    store.down = True
    await looked_again(store, times=3)
    assert a.leading  # within the renew deadline
    clock.now += 0.06  # past the renew deadline (0.05), before the lease duration (1)
    await until(lambda: not a.leading)
    assert events == ["a leads", "a follows"]
    store.down = False
    await until(lambda: a.leading)  # campaigns again: its own Lease
    await a.release()


# -- the reconcile loops' gate ---------------------------------------------------------------------


class Loop(ReconcileLoop):
    kind = "Test"

    def __init__(self) -> None:
        self.metrics = None
        self.dirty: set[tuple[str, str]] = set()
        self.workers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.timers: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self.failures: dict[tuple[str, str], int] = {}
        self.retry_base = 1.0
        self.passes: list[tuple[str, str]] = []
        self.gate: asyncio.Event | None = None

    async def step(self, key: tuple[str, str]) -> float | None:
        self.passes.append(key)
        if self.gate is not None:
            await self.gate.wait()
        return None


async def settle(loop: Loop) -> None:
    await asyncio.gather(*loop.workers.values(), return_exceptions=True)


@pytest.mark.asyncio
async def test_a_stand_by_reconciles_nothing_and_a_new_leader_reconciles_everything_it_knows() -> None:
    loop = Loop()
    loop.leading = False
    for name in ("a", "b", "gone"):
        loop.trigger("ml", name)
    loop.forget_key(("ml", "gone"))
    assert loop.workers == {}  # no pass started, so none can run
    assert loop.passes == []
    loop.lead()
    await settle(loop)
    assert sorted(loop.passes) == [("ml", "a"), ("ml", "b")]


@pytest.mark.asyncio
async def test_losing_the_lead_cancels_passes_in_flight_and_they_are_redone_by_the_next_lead() -> None:
    loop = Loop()
    loop.gate = asyncio.Event()
    loop.trigger("ml", "a")
    await until(lambda: loop.passes == [("ml", "a")])
    await loop.follow()
    assert loop.workers == {}
    loop.trigger("ml", "b")  # noted, not reconciled
    assert loop.workers == {}  # no pass started, so none can run
    assert loop.passes == [("ml", "a")]
    loop.gate.set()
    loop.lead()
    await settle(loop)
    assert sorted(loop.passes[1:]) == [("ml", "a"), ("ml", "b")]
