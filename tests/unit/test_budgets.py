"""DGXBudget: the model's rules (offline, as the API server runs them) and the pure ledger of
reconcile/budgets.py: periods in time zones across DST, scoping a job's usage, settling (idempotent,
pro rata at boundaries, hourly for rolling windows), rolling periods, reservations, and whether a run
fits, with the message a held job shows."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dgx_api.schema import validate
from dgx_operator.api.budget import DGXBudget, DGXBudgetSpec, DGXBudgetStatus, Period
from dgx_operator.api.crdgen import BUDGETS, openapi_schema
from dgx_operator.catalog import Catalog
from dgx_operator.reconcile import budgets as b
from dgx_operator.reconcile import spending
from dgx_operator.reconcile.budgets import (
    MONEY_QUANTUM,
    JobUsage,
    Ledger,
    Reservation,
    Row,
    Scoped,
    Window,
)
from dgx_operator.reconcile.usage import Bucket, Usage
from dgx_operator.validation.validator import Validator
from tests.conftest import BASE_BUDGET, with_changes

H = timedelta(hours=1)
USD = "USD"


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def spec(**changes: Any) -> DGXBudgetSpec:
    base: dict[str, Any] = {"limits": {"cost": "10000"}, "period": {"calendar": "Month", "timeZone": "Europe/Berlin"}}
    base.update(changes)
    return DGXBudgetSpec.model_validate(base)


def period(**fields: Any) -> Period:
    return Period.model_validate(fields)


def job(uid: str, gpu_seconds: int, cost: str | Decimal, until: datetime, since: datetime | None = None) -> JobUsage:
    return JobUsage(uid, f"job-{uid}", Scoped(gpu_seconds, Decimal(cost), until, 0, since))


DECEMBER = Window(utc(2026, 11, 30, 23), utc(2026, 12, 31, 23))  # Europe/Berlin, CET (+01:00)
NOVEMBER = Window(utc(2026, 10, 31, 23), utc(2026, 11, 30, 23))


# -- the model and its CRD ------------------------------------------------------------------------------


def crd_problems(obj: dict[str, Any]) -> list[str]:
    return [str(p) for p in validate(openapi_schema(BUDGETS), obj)]


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"spec.limits": {}}, "spec.limits: set cost, gpuHours or both"),
        ({"spec.limits": {"cost": "-5"}}, "spec.limits.cost: invalid value"),
        ({"spec.limits": {"cost": 5}}, "spec.limits.cost: must be of type string"),
        ({"spec.period": {}}, "spec.period: set exactly one of calendar or rolling"),
        (
            {"spec.period": {"calendar": "Month", "rolling": "24h"}},
            "spec.period: set exactly one of calendar or rolling",
        ),
        ({"spec.period": {"calendar": "Year"}}, 'spec.period.calendar: Unsupported value: "Year"'),
        ({"spec.period": {"rolling": "745h"}}, "spec.period.rolling: must be between 1h and 744h (31 days)"),
        ({"spec.period": {"rolling": "30m"}}, "spec.period.rolling: must be between 1h and 744h"),
        ({"spec.period": {"rolling": "168h", "timeZone": "UTC"}}, "spec.period.timeZone: timeZone applies only to"),
        ({"spec.period": {"calendar": "Month", "weekStart": "Sunday"}}, "spec.period.weekStart: weekStart applies"),
        ({"spec.period": {"calendar": "Month", "timeZone": "../etc"}}, "spec.period.timeZone: invalid value"),
        ({"spec.capacities": ["norm", "cheap"]}, "spec.capacities[1]: Unsupported value"),
        ({"spec.enforcement": "Warn"}, "spec.enforcement: Unsupported value"),
        (
            {"spec.jobSelector": {"matchExpressions": [{"key": "team", "operator": "In"}]}},
            "spec.jobSelector.matchExpressions[0].values: In and NotIn need values",
        ),
        (
            {"spec.jobSelector": {"matchExpressions": [{"key": "team", "operator": "Exists", "values": ["a"]}]}},
            "spec.jobSelector.matchExpressions[0].values: In and NotIn need values",
        ),
    ],
)
def test_the_crd_refuses_bad_budgets(changes: dict[str, Any], problem: str) -> None:
    problems = crd_problems(with_changes(BASE_BUDGET, changes))
    assert any(p.startswith(problem) for p in problems), problems


@pytest.mark.parametrize(
    "period_spec",
    [
        {"calendar": "Month"},
        {"calendar": "Week", "timeZone": "Asia/Kolkata", "weekStart": "Sunday"},
        {"rolling": "168h"},
        {"rolling": "744h"},
        {"rolling": "1h"},
    ],
)
def test_the_crd_and_the_model_take_good_periods(period_spec: dict[str, Any]) -> None:
    obj = with_changes(BASE_BUDGET, {"spec.period": period_spec})
    assert crd_problems(obj) == []
    assert DGXBudget.model_validate(obj).spec.period.calendar == period_spec.get("calendar")


def test_an_unknown_time_zone_is_refused_by_the_model_and_kubedgx_validate(catalog: Catalog) -> None:
    """The CRD checks the name's shape; only the time zone database knows the zones."""
    obj = with_changes(BASE_BUDGET, {"spec.period.timeZone": "Mars/Olympus_Mons"})
    assert crd_problems(obj) == []
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus_Mons'"):
        DGXBudget.model_validate(obj)
    outcome = Validator(catalog).validate(obj)
    assert [str(p) for p in outcome.problems] == [
        "spec.period.timeZone: unknown time zone 'Mars/Olympus_Mons': use an IANA name such as UTC or Europe/Berlin"
    ]
    assert Validator(catalog).validate(BASE_BUDGET).problems == ()


def test_defaults_live_in_the_model_not_the_crd() -> None:
    p = period(calendar="Week")
    assert p.zone.key == "UTC"
    assert p.week_start is None  # read as Monday by current_period
    assert spec().enforcement == "Hold"
    assert "default" not in str(openapi_schema(BUDGETS)["properties"]["spec"])


# -- periods --------------------------------------------------------------------------------------------


def test_a_month_in_berlin_starts_at_local_midnight_and_the_dst_month_is_an_hour_short() -> None:
    march = b.current_period(period(calendar="Month", timeZone="Europe/Berlin"), utc(2026, 3, 15))
    assert march == Window(utc(2026, 2, 28, 23), utc(2026, 3, 31, 22))  # CET start, CEST end
    assert march.end - march.start == timedelta(days=31) - H
    october = b.current_period(period(calendar="Month", timeZone="Europe/Berlin"), utc(2026, 10, 31, 22, 59))
    assert october.end - october.start == timedelta(days=31) + H
    # December to January: the year rolls.
    assert b.current_period(period(calendar="Month", timeZone="Europe/Berlin"), utc(2026, 12, 31, 22, 59)) == DECEMBER


def test_a_boundary_belongs_to_the_period_it_starts() -> None:
    p = period(calendar="Month", timeZone="Europe/Berlin")
    assert b.current_period(p, utc(2026, 12, 31, 23)).start == utc(2026, 12, 31, 23)
    assert b.current_period(p, utc(2026, 12, 31, 22, 59, 59)) == DECEMBER


def test_the_week_of_a_dst_change_in_berlin() -> None:
    spring = b.current_period(period(calendar="Week", timeZone="Europe/Berlin"), utc(2026, 3, 29, 12))
    assert spring == Window(utc(2026, 3, 22, 23), utc(2026, 3, 29, 22))  # Monday 00:00 CET to Monday 00:00 CEST
    assert spring.end - spring.start == timedelta(hours=167)
    autumn = b.current_period(period(calendar="Week", timeZone="Europe/Berlin"), utc(2026, 10, 22))
    assert autumn == Window(utc(2026, 10, 18, 22), utc(2026, 10, 25, 23))  # Monday 00:00 CEST to Monday 00:00 CET
    assert autumn.end - autumn.start == timedelta(hours=169)


def test_a_half_hour_zone_and_a_week_starting_on_sunday() -> None:
    kolkata = period(calendar="Month", timeZone="Asia/Kolkata")
    assert b.current_period(kolkata, utc(2026, 12, 10)) == Window(utc(2026, 11, 30, 18, 30), utc(2026, 12, 31, 18, 30))
    # 2026-11-30 19:00 UTC is already December 1st 00:30 in Kolkata.
    assert b.current_period(kolkata, utc(2026, 11, 30, 19)).start == utc(2026, 11, 30, 18, 30)
    sunday = period(calendar="Week", timeZone="Asia/Kolkata", weekStart="Sunday")
    # Wednesday 2026-12-09: the week began Sunday 2026-12-06 00:00 +05:30.
    assert b.current_period(sunday, utc(2026, 12, 9)) == Window(utc(2026, 12, 5, 18, 30), utc(2026, 12, 12, 18, 30))


def test_a_rolling_window_ends_now() -> None:
    now = utc(2026, 12, 9, 10, 30)
    assert b.current_period(period(rolling="168h"), now) == Window(now - timedelta(days=7), now, timedelta(days=7))


# -- scoping a job's usage ---------------------------------------------------------------------------


def test_scope_keeps_the_budgets_capacities_and_prices_exactly() -> None:
    usage = Usage(
        until=utc(2026, 12, 3, 10),
        buckets=(
            Bucket("norm", Decimal("2.50"), Decimal("2.50"), 16 * 3600),  # 40.00
            Bucket("norm", Decimal("3.00"), Decimal("3.00"), 8 * 1800),  # 12.00: the price edited mid-run
            Bucket("spot", Decimal("1.40"), Decimal("2.50"), 7),  # 0.002722222...
            Bucket("debug", None, None, 600),
        ),
    )
    norm = b.scope(usage, ["norm"])
    assert norm == Scoped(16 * 3600 + 8 * 1800, Decimal("52.000000000"), utc(2026, 12, 3, 10), 0, None)
    everything = b.scope(usage, [], since=utc(2026, 12, 1))
    assert everything.gpu_seconds == 16 * 3600 + 8 * 1800 + 7 + 600
    assert everything.cost == Decimal("52.002722222")  # rounded once, down, to 1e-9
    assert everything.unpriced_gpu_seconds == 600
    assert everything.since == utc(2026, 12, 1)
    assert b.scope(Usage(), ["norm"]) == Scoped()


# -- settling ------------------------------------------------------------------------------------------


def test_settling_adds_the_growth_once() -> None:
    first = b.settle(Ledger(window=DECEMBER), job("a", 3600, "2.5", utc(2026, 12, 2)), DECEMBER)
    assert first.rows == (Row("job-a", "a", 3600, Decimal("2.5"), utc(2026, 12, 2), 3600, Decimal("2.5")),)
    assert b.settle(first, job("a", 3600, "2.5", utc(2026, 12, 2)), DECEMBER) == first
    grown = b.settle(first, job("a", 10800, "7.5", utc(2026, 12, 2, 1)), DECEMBER)
    assert b.spent(grown) == b.Amount(10800, Decimal("7.5"))
    assert grown.row("a") == Row("job-a", "a", 10800, Decimal("7.5"), utc(2026, 12, 2, 1), 10800, Decimal("7.5"))


def test_a_usage_below_what_was_seen_adds_nothing() -> None:
    ledger = b.settle(Ledger(window=DECEMBER), job("a", 7200, "5", utc(2026, 12, 2)), DECEMBER)
    again = b.settle(ledger, job("a", 3600, "2.5", utc(2026, 12, 3)), DECEMBER)
    assert b.spent(again) == b.Amount(7200, Decimal(5))
    assert again.row("a") is not None
    assert again.row("a").seen_gpu_seconds == 7200  # type: ignore[union-attr]


def test_a_job_without_usage_leaves_no_row() -> None:
    ledger = Ledger(window=DECEMBER)
    assert b.settle(ledger, job("a", 0, "0", utc(2026, 12, 2)), DECEMBER) == ledger
    assert b.settle(ledger, JobUsage("a", "a", Scoped(5, Decimal(1), None)), DECEMBER) == ledger


def test_a_first_settle_counts_only_what_falls_in_the_period() -> None:
    """A budget created mid-period, or a job that started before it: its usage is spread from its
    creation, and the part before the period started is not this period's."""
    # 12 hours before the period, 36 inside: 48 h of one 8-GPU node at 2.50.
    usage = job("a", 48 * 8 * 3600, "960", utc(2026, 12, 2, 11), since=utc(2026, 11, 30, 11))
    ledger = b.settle(Ledger(window=DECEMBER), usage, DECEMBER)
    assert b.spent(ledger) == b.Amount(36 * 8 * 3600, Decimal(720))
    assert ledger.row("a") == Row(
        "job-a", "a", 48 * 8 * 3600, Decimal(960), utc(2026, 12, 2, 11), 36 * 8 * 3600, Decimal(720)
    )
    # Without a start, all of it is taken as used at the watermark.
    at_once = b.settle(Ledger(window=DECEMBER), job("a", 48 * 8 * 3600, "960", utc(2026, 12, 2, 11)), DECEMBER)
    assert b.spent(at_once) == b.Amount(48 * 8 * 3600, Decimal(960))


def test_usage_after_the_stored_period_waits_for_the_next_one() -> None:
    """Settled into November after November ended: November gets its share, December the rest, nothing twice."""
    seen = b.settle(Ledger(window=NOVEMBER), job("a", 3600, "2", utc(2026, 11, 30, 21)), NOVEMBER)
    late = job("a", 3600 + 4 * 3600, "10", utc(2026, 12, 1, 1))  # 4 GPU-hours over 4 h, 2 of them in December
    closing = b.settle(seen, late, NOVEMBER)
    assert closing.row("a") == Row(
        "job-a", "a", 3600 + 2 * 3600, Decimal(6), utc(2026, 11, 30, 23), 3 * 3600, Decimal(6)
    )
    rolled = b.roll(closing, period(calendar="Month", timeZone="Europe/Berlin"), utc(2026, 12, 1, 1), {"a"})
    assert rolled.window == DECEMBER
    assert rolled.history == (b.Closed(NOVEMBER.start, NOVEMBER.end, 3 * 3600, Decimal(6), 1),)
    december = b.settle(rolled, late, DECEMBER)
    assert b.spent(december) == b.Amount(2 * 3600, Decimal(4))
    assert b.settle(december, late, DECEMBER) == december


def test_a_live_job_settled_after_a_missed_roll_counts_only_its_share() -> None:
    """The operator was down over the boundary: the job's row kept its November watermark; December
    gets the part of the growth after December started."""
    ledger = Ledger(
        window=DECEMBER,
        rows=(Row("job-a", "a", 1000, Decimal(1), utc(2026, 11, 30, 21), 0, Decimal(0)),),
    )
    grown = b.settle(ledger, job("a", 1000 + 4 * 3600, "17", utc(2026, 12, 1, 1)), DECEMBER)
    assert b.spent(grown) == b.Amount(2 * 3600, Decimal(8))  # half of the 4 h since the watermark


def test_a_rolling_window_splits_usage_into_hours() -> None:
    window = b.current_period(period(rolling="24h"), utc(2026, 12, 9, 12))
    ledger = Ledger(window=window)
    usage = job("a", 8 * 5400, "30", utc(2026, 12, 9, 11, 30), since=utc(2026, 12, 9, 10))  # 1.5 h, 8 GPUs
    settled = b.settle(ledger, usage, window)
    assert settled.hours == (
        b.Hour(utc(2026, 12, 9, 10), 8 * 3600, Decimal(20)),
        b.Hour(utc(2026, 12, 9, 11), 8 * 1800, Decimal(10)),
    )
    assert b.spent(settled) == b.Amount(8 * 5400, Decimal(30))
    assert b.settle(settled, usage, window) == settled
    # Usage from before the window is not counted; a day later the hours leave.
    later = b.roll(settled, period(rolling="24h"), utc(2026, 12, 10, 11, 30), {"a"})
    assert later.hours == (b.Hour(utc(2026, 12, 9, 11), 8 * 1800, Decimal(10)),)
    assert b.spent(later) == b.Amount(8 * 1800, Decimal(10))
    gone = b.roll(later, period(rolling="24h"), utc(2026, 12, 10, 12, 1), set())
    assert gone.hours == ()
    assert gone.rows == ()  # the job was deleted and its last settle left the window


def test_rolling_splits_round_down_and_add_up() -> None:
    window = b.current_period(period(rolling="168h"), utc(2026, 12, 9, 12))
    usage = job("a", 1001, "1.000000001", utc(2026, 12, 9, 3), since=utc(2026, 12, 9, 0, 0, 7))
    settled = b.settle(Ledger(window=window), usage, window)
    assert len(settled.hours) == 3
    assert sum(h.gpu_seconds for h in settled.hours) == 1001
    assert sum(h.cost for h in settled.hours) == Decimal("1.000000001")
    assert all(h.cost == h.cost.quantize(MONEY_QUANTUM) for h in settled.hours)


# -- rolling a calendar period ------------------------------------------------------------------------


def test_a_roll_closes_the_period_and_keeps_only_live_jobs_seen_values() -> None:
    ledger = Ledger(window=NOVEMBER)
    ledger = b.settle(ledger, job("live", 7200, "5", NOVEMBER.end), NOVEMBER)  # last settled at the boundary
    ledger = b.settle(ledger, job("deleted", 3600, "2.5", utc(2026, 11, 21)), NOVEMBER)
    ledger = b.reserve(ledger, Reservation("job-live", "live", "norm", 1, 8, Decimal("2.5"), utc(2026, 11, 20), None))
    p = period(calendar="Month", timeZone="Europe/Berlin")
    assert b.roll(ledger, p, utc(2026, 11, 30, 22), {"live"}) == ledger  # still November in Berlin
    rolled = b.roll(ledger, p, utc(2026, 12, 1), {"live"})
    assert rolled.window == DECEMBER
    assert rolled.history == (b.Closed(NOVEMBER.start, NOVEMBER.end, 10800, Decimal("7.5"), 2),)
    assert rolled.rows == (Row("job-live", "live", 7200, Decimal(5), NOVEMBER.end, 0, Decimal(0)),)
    assert rolled.reservations == ledger.reservations
    assert b.spent(rolled) == b.Amount()
    # The live job's next settle adds only what is new.
    assert b.spent(b.settle(rolled, job("live", 9000, "6.25", utc(2026, 12, 1, 1)), DECEMBER)) == b.Amount(
        1800, Decimal("1.25")
    )


def test_history_keeps_twelve_periods_newest_first() -> None:
    p = period(calendar="Month", timeZone="UTC")
    ledger = Ledger()
    for month in range(1, 16):
        now = utc(2026 + (month - 1) // 12, (month - 1) % 12 + 1, 2)
        ledger = b.roll(ledger, p, now, set())
    assert len(ledger.history) == 12
    assert ledger.history[0].start == utc(2027, 2, 1)
    assert ledger.history[-1].start == utc(2026, 3, 1)


def test_a_deleted_jobs_spend_stays_until_the_period_closes() -> None:
    """A job deleted by its TTL: settled before its finalizer went, its row stays in the period."""
    p = period(calendar="Month", timeZone="Europe/Berlin")
    ledger = b.advance(Ledger(), p, [job("ttl", 7200, "5", utc(2026, 12, 3))], utc(2026, 12, 3))
    after = b.advance(ledger, p, [], utc(2026, 12, 20))
    assert b.spent(after) == b.Amount(7200, Decimal(5))
    next_month = b.advance(after, p, [], utc(2027, 1, 2))
    assert next_month.rows == ()
    assert next_month.history[0].cost == Decimal(5)


def test_a_clock_that_goes_back_rolls_nothing() -> None:
    ledger = b.advance(Ledger(), period(calendar="Month"), [job("a", 3600, "2", utc(2026, 12, 3))], utc(2026, 12, 3))
    assert b.roll(ledger, period(calendar="Month"), utc(2026, 11, 30, 23, 59), {"a"}) == ledger


def test_a_changed_period_closes_the_old_one_at_the_change() -> None:
    ledger = b.advance(Ledger(), period(calendar="Month"), [job("a", 3600, "2", utc(2026, 12, 3))], utc(2026, 12, 3))
    weekly = b.roll(ledger, period(calendar="Week"), utc(2026, 12, 9, 12), {"a"})
    assert weekly.window == Window(utc(2026, 12, 7), utc(2026, 12, 14))
    assert weekly.history == (b.Closed(utc(2026, 12, 1), utc(2026, 12, 9, 12), 3600, Decimal(2), 1),)
    rolling = b.roll(ledger, period(rolling="24h"), utc(2026, 12, 9, 12), {"a"})
    assert rolling.window == Window(utc(2026, 12, 8, 12), utc(2026, 12, 9, 12), timedelta(hours=24))
    assert rolling.rows[0].seen_gpu_seconds == 3600
    back = b.roll(rolling, period(calendar="Month"), utc(2026, 12, 9, 13), {"a"})
    assert back.window == Window(utc(2026, 12, 1), utc(2027, 1, 1))
    assert back.hours == ()


def test_advance_settles_across_a_boundary_once() -> None:
    p = period(calendar="Month", timeZone="Europe/Berlin")
    ledger = b.advance(Ledger(), p, [job("a", 3600, "2", utc(2026, 11, 30, 21))], utc(2026, 11, 30, 21))
    late = job("a", 3600 + 4 * 3600, "10", utc(2026, 12, 1, 1))
    once = b.advance(ledger, p, [late], utc(2026, 12, 1, 1))
    assert once.history[0].gpu_seconds == 3 * 3600
    assert b.spent(once) == b.Amount(2 * 3600, Decimal(4))
    assert b.advance(once, p, [late], utc(2026, 12, 1, 1)) == once


# -- reservations and what is committed ---------------------------------------------------------------


def reservation(uid: str = "r", nodes: int = 2, hours: int = 24, price: str | None = "2.50", **kw: Any) -> Reservation:
    start = kw.pop("start", utc(2026, 12, 10))
    until = start + timedelta(hours=hours) if hours else None
    return Reservation(
        f"job-{uid}", uid, kw.pop("capacity", "norm"), nodes, 8, None if price is None else Decimal(price), start, until
    )


def test_committed_runs_from_each_jobs_watermark() -> None:
    ledger = b.reserve(b.reserve(Ledger(), reservation("a")), reservation("b", nodes=1, hours=20))
    fresh = b.committed(ledger, {})
    assert fresh.gpu_seconds == (2 * 8 * 24 + 8 * 20) * 3600
    assert fresh.cost == Decimal(960 + 400)
    # job a has used 4 h (its usage is exact up to its watermark): 20 h of 16 GPUs are left.
    later = b.committed(ledger, {"a": utc(2026, 12, 10, 4), "b": None})
    assert later.gpu_seconds == (2 * 8 * 20 + 8 * 20) * 3600
    assert later.cost == Decimal(800 + 400)
    # Past until: nothing left; a watermark older than the run's start (a previous run) counts from the start.
    assert b.committed(ledger, {"a": utc(2026, 12, 12), "b": utc(2026, 12, 1)}).cost == Decimal(400)
    assert b.committed(ledger, {}, excluding="a").cost == Decimal(400)


def test_reserve_replaces_and_release_removes() -> None:
    ledger = b.reserve(Ledger(), reservation("a"))
    again = b.reserve(ledger, reservation("a", nodes=1, start=utc(2026, 12, 11)))
    assert len(again.reservations) == 1
    assert again.reservations[0].nodes == 1
    assert b.release(again, "a").reservations == ()
    assert b.release(again, "other") == again


def test_unpriced_and_unbounded_reservations_are_named_not_counted() -> None:
    ledger = b.reserve(b.reserve(Ledger(), reservation("a", price=None)), reservation("b", hours=0))
    got = b.committed(ledger, {})
    assert got == b.Committed(2 * 8 * 24 * 3600, Decimal(0), ("job-a",), ("job-b",))


# -- covers and fits ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "labels", "capacity", "expected"),
    [
        (None, {}, "norm", True),
        (None, {}, "spot", False),
        ({"matchLabels": {"team": "a"}}, {"team": "a", "x": "y"}, "norm", True),
        ({"matchLabels": {"team": "a"}}, {"team": "b"}, "norm", False),
        ({"matchExpressions": [{"key": "q", "operator": "In", "values": ["gold"]}]}, {"q": "gold"}, "norm", True),
        ({"matchExpressions": [{"key": "q", "operator": "In", "values": ["gold"]}]}, {}, "norm", False),
        ({"matchExpressions": [{"key": "q", "operator": "NotIn", "values": ["gold"]}]}, {}, "norm", True),
        ({"matchExpressions": [{"key": "q", "operator": "NotIn", "values": ["gold"]}]}, {"q": "gold"}, "norm", False),
        ({"matchExpressions": [{"key": "q", "operator": "Exists"}]}, {"q": ""}, "norm", True),
        ({"matchExpressions": [{"key": "q", "operator": "DoesNotExist"}]}, {"q": ""}, "norm", False),
    ],
)
def test_covers(selector: dict[str, Any] | None, labels: dict[str, str], capacity: str, expected: bool) -> None:
    assert b.covers(spec(capacities=["norm", "debug"], jobSelector=selector), labels, capacity) is expected
    # Without capacities, every capacity counts: only the selector decides.
    assert b.covers(spec(jobSelector=selector), labels, "spot") is (expected or capacity == "spot")


def busy_december() -> tuple[Ledger, list[JobUsage]]:
    """9400.00 USD spent (8000 settled, 1400 used since), and a running job with 400.00 still ahead."""
    ledger = Ledger(
        window=DECEMBER,
        rows=(Row("gone", "gone", 3_200_000, Decimal(8000), utc(2026, 12, 5), 3_200_000, Decimal(8000)),),
    )
    running = job("run", 560_000, "1400", utc(2026, 12, 15, 4), since=utc(2026, 12, 1))
    ledger = b.reserve(ledger, reservation("run", nodes=1, hours=24, start=utc(2026, 12, 15)))  # 4 h used, 20 left
    return ledger, [running]


def test_a_run_that_does_not_fit_is_held_with_the_numbers() -> None:
    ledger, live = busy_december()
    now = utc(2026, 12, 15, 4)
    candidate = reservation("new", nodes=2, hours=24, start=now)
    verdict = b.fits("team-a/burst", spec(), ledger, live, candidate, now, USD)
    assert verdict == b.Verdict(
        False,
        "DGXBudget team-a/burst: this run's worst case 2 nodes x 8 GPUs x 2.50 USD/GPU-h x 24h = 960.00 USD does not "
        "fit: spent 9400.00 + committed 400.00 of 10000.00 USD (2026-12-01 to 2027-01-01, Europe/Berlin); it starts "
        "when the budget is raised, a running job ends, or the period rolls on 2027-01-01",
    )
    # One node for 8 hours fits (160.00); so does the big run once the limit is raised.
    assert b.fits("team-a/burst", spec(), ledger, live, reservation("new", nodes=1, hours=8, start=now), now, USD).ok
    raised = spec(limits={"cost": "11000"})
    assert b.fits("team-a/burst", raised, ledger, live, candidate, now, USD).ok
    # Report counts, never holds; a spot run does not count in a budget of norm only.
    assert b.fits("team-a/burst", spec(enforcement="Report"), ledger, live, candidate, now, USD).ok
    spot = reservation("new", nodes=2, hours=24, start=now, capacity="spot")
    assert b.fits("team-a/burst", spec(capacities=["norm"]), ledger, live, spot, now, USD).ok


def test_the_period_rolling_lets_the_run_start() -> None:
    ledger, live = busy_december()
    january = utc(2026, 12, 31, 23)
    candidate = reservation("new", nodes=2, hours=24, start=january)
    # The running job's reservation ran out on 12-16; January starts empty.
    assert b.fits("team-a/burst", spec(), ledger, live, candidate, january, USD).ok


def test_unsettled_usage_of_live_jobs_counts() -> None:
    ledger, _ = busy_december()
    now = utc(2026, 12, 15, 4)
    small = reservation("new", nodes=1, hours=10, start=now)  # 200.00
    assert b.fits("a/b", spec(), ledger, [], small, now, USD).ok  # 8000 + 480 (20 h from the start) + 200
    grown = [job("run", 560_000 + 100_000, "1650", now, since=utc(2026, 12, 1))]
    verdict = b.fits("a/b", spec(), ledger, grown, small, now, USD)
    assert not verdict.ok
    assert "spent 9650.00 + committed 400.00 of 10000.00 USD" in verdict.message


def test_a_run_bigger_than_the_limit_is_told_so() -> None:
    now = utc(2026, 12, 15)
    verdict = b.fits("a/b", spec(limits={"cost": "500"}), Ledger(), [], reservation("new", start=now), now, USD)
    assert not verdict.ok
    assert verdict.message.endswith(
        "of 500.00 USD (2026-12-01 to 2027-01-01, Europe/Berlin), and alone exceeds the limit; it starts when the "
        "budget is raised or the run asks for less (fewer nodes, a shorter spec.maxDuration)"
    )


def test_gpu_hour_limits_and_rolling_windows() -> None:
    now = utc(2026, 12, 15)
    s = spec(limits={"gpuHours": "400"}, period={"rolling": "168h"})
    ledger = b.advance(Ledger(), s.period, [job("a", 20 * 3600, "0", now - 2 * H, since=now - 4 * H)], now)
    verdict = b.fits("ml/gpu", s, ledger, [], reservation("new", start=now), now, None)
    assert verdict == b.Verdict(
        False,
        "DGXBudget ml/gpu: this run's worst case 2 nodes x 8 GPUs x 24h = 384.00 GPU-hours does not fit: spent 20.00 + "
        "committed 0.00 of 400.00 GPU-hours (the last 168h); it starts when the budget is raised, a running job ends, "
        "or earlier spending leaves the 168h window",
    )
    # A GPU-hour limit needs no prices.
    assert b.fits("ml/gpu", s, Ledger(), [], reservation("new", start=now, price=None), now, None).ok


def test_a_run_without_a_worst_case_cannot_fit_a_hold_budget() -> None:
    now = utc(2026, 12, 15)
    unbounded = reservation("new", hours=0, start=now)
    verdict = b.fits("a/b", spec(), Ledger(), [], unbounded, now, USD)
    assert not verdict.ok
    assert "set spec.maxDuration" in verdict.message
    assert b.fits("a/b", spec(enforcement="Report"), Ledger(), [], unbounded, now, USD).ok
    unpriced = b.fits("a/b", spec(), Ledger(), [], reservation("new", start=now, price=None), now, USD)
    assert unpriced == b.Verdict(
        False,
        "DGXBudget a/b limits cost, and this run's instance has no price in the catalog (catalog.pricing): it cannot "
        "be counted; it starts when a price is set or the budget's cost limit is removed",
    )


def test_a_new_run_of_a_job_replaces_its_own_reservation() -> None:
    now = utc(2026, 12, 15)
    ledger = b.reserve(Ledger(window=DECEMBER), reservation("new", start=now - 20 * H))
    assert b.fits("a/b", spec(limits={"cost": "1000"}), ledger, [], reservation("new", start=now), now, USD).ok


# -- status ------------------------------------------------------------------------------------------


def test_the_status_round_trips_and_satisfies_the_crd() -> None:
    ledger, live = busy_december()
    s = spec(limits={"cost": "10000", "gpuHours": "4000"})
    ledger = b.advance(ledger, s.period, live, utc(2026, 12, 15, 4))
    ledger = b.reserve(ledger, reservation("unpriced", price=None, hours=0))
    ledger = replace_history(ledger)
    status = b.render_status(s, ledger, {j.uid: j.scoped.until for j in live}, currency=USD, generation=3)
    doc = status.to_manifest()
    assert doc["period"] == {"start": "2026-12-01T00:00:00+01:00", "end": "2027-01-01T00:00:00+01:00"}
    assert doc["spent"] == {"gpuHours": "1044.44", "cost": "9400.00"}
    assert doc["committed"] == {"gpuHours": "160.00", "cost": "400.00"}
    assert doc["remaining"] == {"gpuHours": "2795.56", "cost": "200.00"}
    assert doc["ledger"][0]["seenCost"] == "8000"
    assert doc["reservations"][1]["from"] == "2026-12-10T00:00:00Z"
    assert "until" not in doc["reservations"][1]
    assert b.summary(s, status) == (
        "spent 9400.00 + committed 400.00 of 10000.00 USD; spent 1044.44 + committed 160.00 of 4000.00 GPU-hours"
    )
    obj = {**BASE_BUDGET, "spec": s.to_manifest(), "status": doc}
    assert crd_problems(obj) == []
    assert b.from_status(DGXBudgetStatus.model_validate(doc)) == ledger
    assert b.from_status(None) == Ledger()


def replace_history(ledger: Ledger) -> Ledger:
    return replace(ledger, history=(b.Closed(NOVEMBER.start, NOVEMBER.end, 7200, Decimal("0.000388889"), 1),))


def test_without_prices_the_status_shows_no_money() -> None:
    s = spec(limits={"gpuHours": "10"})
    ledger = b.advance(Ledger(), s.period, [job("a", 3600 * 12, "0", utc(2026, 12, 2))], utc(2026, 12, 2))
    doc = b.render_status(s, ledger, {}, currency=None, generation=1).to_manifest()
    assert doc["spent"] == {"gpuHours": "12.00"}
    assert doc["remaining"] == {"gpuHours": "-2.00"}  # a limit lowered below what was used


def test_a_rolling_status_names_its_window() -> None:
    s = spec(limits={"gpuHours": "10"}, period={"rolling": "168h"})
    now = utc(2026, 12, 9, 12, 0, 0)
    ledger = b.advance(Ledger(), s.period, [job("a", 3600, "1", now - H, since=now - 2 * H)], now)
    doc = b.render_status(s, ledger, {}, currency=USD, generation=1).to_manifest()
    assert doc["period"] == {"start": "2026-12-02T12:00:00Z", "end": "2026-12-09T12:00:00Z", "rolling": "168h"}
    assert [bk["start"] for bk in doc["buckets"]] == ["2026-12-09T10:00:00Z"]
    assert b.from_status(DGXBudgetStatus.model_validate(doc)) == ledger


# -- properties ----------------------------------------------------------------------------------------


steps = st.lists(
    st.tuples(st.integers(0, 50_000), st.integers(0, 10**9), st.integers(1, 7200)),
    min_size=1,
    max_size=12,
)


def sequence(parts: list[tuple[int, int, int]], start: datetime) -> list[JobUsage]:
    """Cumulative usages of one job: each step adds GPU-seconds, nano-dollars and time."""
    out, gpu, cost, t = [], 0, Decimal(0), start
    for g, c, dt in parts:
        gpu, cost, t = gpu + g, cost + Decimal(c) * MONEY_QUANTUM, t + timedelta(seconds=dt)
        out.append(JobUsage("j", "j", Scoped(gpu, cost, t, 0, start)))
    return out


@settings(max_examples=150, deadline=None)
@given(steps, st.data())
def test_settling_any_split_counts_the_same_as_settling_once(parts: list[tuple[int, int, int]], data: Any) -> None:
    start = utc(2026, 12, 5)
    usages = sequence(parts, start)
    chosen = [*data.draw(st.lists(st.sampled_from(usages), max_size=8)), usages[-1]]
    for window in (DECEMBER, b.current_period(period(rolling="744h"), utc(2026, 12, 30))):
        once = b.settle(Ledger(window=window), usages[-1], window)
        split = Ledger(window=window)
        for usage in chosen:  # in any order, repeated: later ones below what was seen add nothing
            split = b.settle(split, usage, window)
        assert b.spent(split) == b.spent(once) == b.Amount(usages[-1].scoped.gpu_seconds, usages[-1].scoped.cost)
        assert b.settle(split, usages[-1], window) == split


@settings(max_examples=100, deadline=None)
@given(steps, st.integers(0, 40 * 3600))
def test_a_boundary_splits_usage_without_losing_or_doubling_any(parts: list[tuple[int, int, int]], shift: int) -> None:
    """Usage that began in November and is settled at passes on both sides of the roll: November's
    history and December's ledger add up to all of it."""
    start = NOVEMBER.end - timedelta(seconds=shift)
    p = period(calendar="Month", timeZone="Europe/Berlin")
    ledger = Ledger(window=NOVEMBER)
    for usage in sequence(parts, start):
        assert usage.scoped.until is not None
        ledger = b.advance(ledger, p, [usage], usage.scoped.until)
    last = sequence(parts, start)[-1].scoped
    if ledger.history:  # rolled: November closed, the rest is December's
        november = b.Amount(ledger.history[0].gpu_seconds, ledger.history[0].cost)
        total = november + b.spent(ledger)
    else:  # every pass was still in November
        total = b.spent(ledger)
    assert total == b.Amount(last.gpu_seconds, last.cost)


# -- the Ready condition (reconcile/spending.py) ---------------------------------------------------


def stored_budget(**changes: Any) -> dict[str, Any]:
    body = with_changes(BASE_BUDGET, changes)
    body["metadata"].update({"namespace": "ml", "generation": 3, "resourceVersion": "7"})
    return body


def test_a_counted_budget_is_ready_and_keeps_its_transition_time() -> None:
    view = spending.parse_budget(stored_budget())
    assert view is not None
    first = spending.ready(view, utc(2026, 12, 1))
    assert [(c.type, c.status, c.reason, c.observed_generation) for c in first] == [("Ready", "True", "Counting", 3)]
    assert "BudgetExceeded" in first[0].message  # Hold says what happens to a run that does not fit
    again = spending.ready(
        replace(view, stored={"conditions": [c.model_dump(by_alias=True, mode="json") for c in first]}),
        utc(2026, 12, 2),
    )
    assert again[0].last_transition_time == utc(2026, 12, 1)
    report = spending.parse_budget(stored_budget(**{"spec.enforcement": "Report"}))
    assert report is not None
    assert "holds nothing" in spending.ready(report, utc(2026, 12, 1))[0].message


def test_a_budget_it_cannot_read_is_not_ready_and_says_which_field() -> None:
    zone = stored_budget(**{"spec.period": {"calendar": "Month", "timeZone": "Atlantis/Capital"}})
    assert spending.parse_budget(zone) is None
    conditions, why = spending.unreadable(zone, utc(2026, 12, 1))
    assert [(c.status, c.reason) for c in conditions] == [("False", "InvalidSpec")]
    assert "spec.period.timeZone" in why
    assert "re-apply the DGXBudget with a valid spec" in why
    newer = stored_budget()
    newer["status"] = {"ledger": [{"job": "a", "uid": "u", "fromTheFuture": 1}]}
    assert spending.parse_budget(newer) is None  # its ledger is never written over with an empty one
    conditions, why = spending.unreadable(newer, utc(2026, 12, 1))
    assert [(c.status, c.reason) for c in conditions] == [("False", "UnreadableStatus")]
    assert "upgrade the operator" in why
