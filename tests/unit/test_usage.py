"""The pure accounting of a job's GPU use (dgx_operator.reconcile.usage): restarts, reclaims, elastic
node counts, suspend/resume, spot against on-demand, a price edit, a vanished pod, clocks, and the
two properties that make it safe to run from any pass of any operator: a pass applied twice adds
nothing, and splitting time into passes never changes the total."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dgx_operator.reconcile.pods import PodView
from dgx_operator.reconcile.usage import Span, Usage, accrue, span_of

T0 = datetime(2026, 12, 1, 8, 0, 0, tzinfo=UTC)
PRICES = {"norm": Decimal("3.00"), "spot": Decimal("1.20"), "debug": Decimal("3.00")}


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def passes(spans_at: list[tuple[float, list[Span]]], prices: dict[str, Decimal | None] | None = None) -> Usage:
    """Run one pass per (minute, the pods it sees)."""
    usage = Usage()
    for minute, spans in spans_at:
        usage = accrue(usage, spans, prices or PRICES, "norm", at(minute))
    return usage


def test_one_worker_for_an_hour_on_demand() -> None:
    usage = passes([(60, [Span("a", 8, "norm", at(0))])])
    assert usage.gpu_seconds == 8 * 3600
    assert usage.cost == Decimal("24.00")
    assert usage.savings == 0
    assert usage.priced
    assert [h.pod for h in usage.holding] == ["a"]  # still on its node
    assert usage.until == at(60)


def test_every_attempt_counts_failed_ones_included() -> None:
    """A restart makes new pods (new uids); the failed attempt's time on the node is paid for too."""
    first = [Span("a0", 8, "norm", at(0), at(10)), Span("a1", 8, "norm", at(1), at(10))]
    second = [Span("b0", 8, "norm", at(12)), Span("b1", 8, "norm", at(12))]
    usage = passes([(5, first), (11, first), (20, second)])
    assert usage.gpu_seconds == 8 * 60 * (10 + 9 + 8 + 8)
    assert sorted(h.pod for h in usage.holding) == ["b0", "b1"]


def test_a_reclaimed_spot_worker_is_paid_until_its_deletion_and_saves_against_on_demand() -> None:
    usage = passes([(30, [Span("s", 8, "spot", at(0))]), (60, [Span("s", 8, "spot", at(0), end=at(45))])])
    assert usage.gpu_seconds_on("spot") == 8 * 45 * 60
    assert usage.cost == Decimal("7.20")  # 6 GPU-hours at 1.20
    assert usage.savings == Decimal("10.80")  # 6 GPU-hours at 3.00 - 1.20
    assert usage.holding == ()


def test_elastic_node_counts_changing() -> None:
    three = [Span(f"w{i}", 8, "norm", at(0)) for i in range(3)]
    five = [*three, Span("w3", 8, "norm", at(10)), Span("w4", 8, "norm", at(10))]
    two = [Span(f"w{i}", 8, "norm", at(0), end=at(20) if i >= 2 else None) for i in range(3)]
    two += [Span("w3", 8, "norm", at(10), end=at(20)), Span("w4", 8, "norm", at(10), end=at(20))]
    usage = passes([(10, three), (20, five), (30, two)])
    # 3 workers x 30 min + 2 workers x 10 min... by worker: w0, w1 30 min; w2 20; w3, w4 10.
    assert usage.gpu_seconds == 8 * 60 * (30 + 30 + 20 + 10 + 10)


def test_suspended_time_costs_nothing() -> None:
    running = [Span("a", 8, "norm", at(0), end=at(10))]
    resumed = [Span("b", 8, "norm", at(50))]
    usage = passes([(10, running), (30, []), (50, []), (60, resumed)])
    assert usage.gpu_seconds == 8 * 60 * (10 + 10)


def test_a_price_edit_applies_from_then_on() -> None:
    """A worker keeps the price it was accounted at until the next pass; the past is never repriced."""
    span = [Span("a", 1, "norm", at(0))]
    usage = accrue(Usage(), span, PRICES, "norm", at(60))
    edited = {**PRICES, "norm": Decimal("4.00")}
    usage = accrue(usage, span, edited, "norm", at(120))  # the hour up to now ran at 3.00
    usage = accrue(usage, span, edited, "norm", at(180))  # this one at 4.00
    assert [(b.price, b.gpu_seconds) for b in usage.buckets] == [(Decimal("3.00"), 7200), (Decimal("4.00"), 3600)]
    assert usage.cost == Decimal("10.00")


def test_a_pod_that_vanished_between_passes_is_paid_until_noticed() -> None:
    usage = passes([(10, [Span("a", 8, "norm", at(0))]), (25, [])])
    assert usage.gpu_seconds == 8 * 25 * 60
    assert usage.holding == ()


def test_unplaced_pods_and_unpriced_capacities() -> None:
    prices: dict[str, Decimal | None] = {"norm": Decimal("3.00"), "spot": None}
    usage = passes(
        [(60, [Span("pending", 8, "norm", None), Span("s", 8, "spot", at(0)), Span("n", 1, "norm", at(30))])],
        prices,
    )
    assert usage.gpu_seconds_on("spot") == 8 * 3600
    assert usage.gpu_seconds_on("norm") == 1800
    assert not usage.priced  # some seconds had no price: the cost leaves them out
    assert usage.cost == Decimal("1.50")


def test_clocks_and_stale_passes_add_nothing() -> None:
    usage = accrue(Usage(), [Span("a", 8, "norm", at(10))], PRICES, "norm", at(5))  # bound "after" now
    assert usage.gpu_seconds == 0
    assert [h.pod for h in usage.holding] == ["a"]
    later = accrue(usage, [Span("a", 8, "norm", at(10))], PRICES, "norm", at(20))
    assert later.gpu_seconds == 8 * 600
    assert accrue(later, [Span("a", 8, "norm", at(10))], PRICES, "norm", at(15)) == later  # before the watermark


def test_sub_second_times_are_whole_seconds() -> None:
    start = T0 + timedelta(microseconds=700_000)
    usage = accrue(Usage(), [Span("a", 2, "norm", start)], PRICES, "norm", T0 + timedelta(seconds=10, microseconds=900))
    assert usage.gpu_seconds == 20
    assert usage.until == T0 + timedelta(seconds=10)


spans_strategy = st.lists(
    st.tuples(
        st.integers(0, 100),  # start minute
        st.one_of(st.none(), st.integers(0, 120)),  # length in minutes, None: still running
        st.sampled_from(["norm", "spot"]),
        st.sampled_from([1, 2, 4, 8]),
    ),
    max_size=6,
)


def as_spans(raw: list[tuple[int, int | None, str, int]], now_minute: int) -> list[Span]:
    """The pods a pass at ``now_minute`` sees: those bound by then, ended ones with their end if it is past."""
    out = []
    for i, (start, length, capacity, gpus) in enumerate(raw):
        if start > now_minute:
            continue
        end = None if length is None or start + length > now_minute else at(start + length)
        out.append(Span(f"p{i}", gpus, capacity, at(start), end))
    return out


@settings(max_examples=200, deadline=None)
@given(raw=spans_strategy, cuts=st.lists(st.integers(1, 239), max_size=5))
def test_splitting_time_into_passes_never_changes_the_total(
    raw: list[tuple[int, int | None, str, int]], cuts: list[int]
) -> None:
    end = 240
    one = accrue(Usage(), as_spans(raw, end), PRICES, "norm", at(end))
    many = Usage()
    for minute in [*sorted(set(cuts)), end]:
        many = accrue(many, as_spans(raw, minute), PRICES, "norm", at(minute))
    assert many.buckets == one.buckets
    assert many.cost == one.cost
    assert accrue(many, as_spans(raw, end), PRICES, "norm", at(end)) == many  # applied twice: nothing added


# --- a span from a pod as the API server shows it -----------------------------------------------------------


def pod(phase: str, **status: Any) -> PodView:
    body: dict[str, Any] = {
        "metadata": {"name": "job-worker-0", "uid": "u-1", "labels": {"kubedgx.io/replica-index": "0"}},
        "status": {"phase": phase, **status},
    }
    if "deletionTimestamp" in status:
        body["metadata"]["deletionTimestamp"] = status.pop("deletionTimestamp")
        body["status"] = {"phase": phase, **status}
    return PodView.of(body)


SCHEDULED = {"conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-01T08:00:00Z"}]}


def terminated(name: str, finished: str) -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {"exitCode": 0, "finishedAt": finished}}}


def test_a_pod_waiting_for_the_scheduler_holds_nothing() -> None:
    unscheduled = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
    assert span_of(pod("Pending", **unscheduled), 8, "norm") == Span("u-1", 8, "norm", None, None)


def test_a_running_pod_holds_its_node_from_its_binding() -> None:
    assert span_of(pod("Running", **SCHEDULED), 8, "spot") == Span("u-1", 8, "spot", at(0), None)


def test_a_finished_pod_let_go_when_its_last_container_ended_sidecars_included() -> None:
    finished = {
        **SCHEDULED,
        "containerStatuses": [terminated("trainer", "2026-12-01T09:00:00Z")],
        "initContainerStatuses": [terminated("ckpt-upload", "2026-12-01T09:02:30Z")],
    }
    assert span_of(pod("Succeeded", **finished), 8, "norm").end == at(62.5)


def test_a_pod_being_deleted_holds_its_node_until_its_grace_period_ends() -> None:
    reclaimed = pod("Running", deletionTimestamp="2026-12-01T08:45:00Z", **SCHEDULED)
    assert span_of(reclaimed, 8, "spot").end == at(45)


def test_a_worker_ending_in_the_watermarks_second_is_let_go_in_that_second() -> None:
    """Two passes in one second (the kubelet's write and the operator's reaction): the second one
    adds nothing but sees the worker's end, so the job's usage is final at once."""
    start = datetime(2026, 12, 5, 1, 0, 0, tzinfo=UTC)
    end = start + timedelta(seconds=24)
    running = accrue(Usage(), [Span("p", 8, "norm", start)], PRICES, "norm", end)
    assert running.holding
    done = accrue(running, [Span("p", 8, "norm", start, end)], PRICES, "norm", end + timedelta(microseconds=400))
    assert done.holding == ()
    assert done.gpu_seconds == running.gpu_seconds == 8 * 24


# -- MIG slices (issue 32): a slice of g compute slices is g/7 of a GPU --------------------------------


def test_a_mig_slice_is_charged_its_sevenths_of_a_gpu() -> None:
    slice_ = Span("m", 1, "norm", at(0), share=Fraction(1, 7))
    usage = passes([(70, [slice_])])
    assert usage.gpu_seconds == 70 * 60 // 7  # 600: a 1g slice for 70 minutes is 10 GPU-minutes
    two = passes([(70, [Span("m", 1, "norm", at(0), share=Fraction(2, 7))])])
    assert two.gpu_seconds == 1200


@given(cuts=st.lists(st.integers(min_value=1, max_value=3599), max_size=30, unique=True))
@settings(max_examples=200, deadline=None)
def test_a_slices_gpu_seconds_do_not_depend_on_how_the_passes_split_it(cuts: list[int]) -> None:
    """Floored on the whole span, not per pass: passes every few seconds must not lose a seventh each."""
    span = Span("m", 1, "norm", T0, T0 + timedelta(seconds=3600), share=Fraction(3, 7))
    usage = Usage()
    for second in sorted(cuts):
        usage = accrue(usage, [span], {"norm": Decimal("3.00")}, "norm", T0 + timedelta(seconds=second))
    usage = accrue(usage, [span], {"norm": Decimal("3.00")}, "norm", T0 + timedelta(seconds=3600))
    assert usage.gpu_seconds == 3600 * 3 // 7


def test_a_mig_workers_pod_says_its_slice() -> None:
    pod = {
        "metadata": {"name": "w", "uid": "u"},
        "spec": {
            "containers": [
                {"name": "trainer", "resources": {"limits": {"nvidia.com/mig-2g.20gb": "1", "cpu": "8"}}},
            ]
        },
        "status": {},
    }
    view = PodView.of(pod)
    assert (view.gpus, view.mig_slices) == (1, 2)
    whole = {**pod, "spec": {"containers": [{"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}
    assert (PodView.of(whole).gpus, PodView.of(whole).mig_slices) == (8, None)
