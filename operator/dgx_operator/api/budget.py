"""DGXBudget (kubedgx.io/v1alpha1): a namespace's limit on money and GPU-hours per period (issue 31).

ResourceQuota for spending: a limit per calendar week or month, or per rolling window, on the jobs of
the namespace the budget selects. The spec is the admin's; the status is the operator's ledger, the
only place the spend of deleted jobs survives (a job's own ``status.usage`` goes with the job), so
everything that makes counting exact and idempotent is in it: per job, what was already seen of its
usage. The arithmetic lives in :mod:`dgx_operator.reconcile.budgets`; docs/research/cost-control.md
section 3.4 has the design.

Amounts are decimal strings, never floats (Kubernetes' API conventions): limits as the admin writes
them, the ledger's exact values to the nano-unit of the catalog's currency (:data:`EXACT_PATTERN`),
and display values with two decimals.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator

from dgx_api.schema import KubeModel, cel, pattern
from dgx_operator.api.common import (
    API_VERSION,
    BUDGET_KIND,
    DURATION_PATTERN,
    Condition,
    Duration,
    ObjectMeta,
    condition_list_field,
)

KIND: Final = BUDGET_KIND

#: The longest rolling window: hourly buckets keep at most this many hours (744) in the status.
MAX_ROLLING_HOURS: Final = 744
#: Closed calendar periods kept in ``status.history``.
MAX_HISTORY: Final = 12
#: Rows of ``status.ledger`` (jobs counted in one period); etcd's 1.5 MiB request limit bounds it.
MAX_LEDGER: Final = 2000
#: Runs in progress that one budget can hold reservations for.
MAX_RESERVATIONS: Final = 1000

AMOUNT_PATTERN = pattern(
    r"^[0-9]{1,12}(\.[0-9]{1,6})?$",
    'must be a decimal number of at least 0 written as a string, such as "10000" or "2500.50" '
    "(at most 12 digits before the point and 6 after)",
)
#: A limit as the admin writes it.
Amount = Annotated[str, Field(pattern=AMOUNT_PATTERN, max_length=19)]

EXACT_PATTERN = pattern(r"^[0-9]{1,15}(\.[0-9]{1,9})?$", "must be a decimal number such as 31.2 or 0.000388889")
#: A ledger amount: exact to 1e-9 of the currency (see reconcile/budgets.py, MONEY_QUANTUM).
Exact = Annotated[str, Field(pattern=EXACT_PATTERN, max_length=25)]

DISPLAY_PATTERN = pattern(r"^-?[0-9]{1,15}\.[0-9]{2}$", "must be a decimal number with two decimals")
#: A number for people (and printer columns): two decimals, negative when a limit is overrun.
Display = Annotated[str, Field(pattern=DISPLAY_PATTERN, max_length=19)]

ZONE_PATTERN = pattern(
    r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+){0,2}$",
    "must be an IANA time zone name such as UTC, Europe/Berlin or America/New_York",
)

Weekday = Literal["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
Capacity = Literal["norm", "spot", "debug"]
LabelValue = Annotated[str, Field(max_length=63)]


class Limits(KubeModel):
    """How much the selected jobs may use per period; at least one of the two."""

    cel_rules = (cel("has(self.cost) || has(self.gpuHours)", "set cost, gpuHours or both"),)

    cost: Amount | None = Field(
        default=None,
        description=(
            "Money per period, in the currency of the operator's catalog (catalog.pricing.currency; status.currency "
            "shows it). Only jobs on priced instances can fit a cost limit."
        ),
    )
    gpu_hours: Amount | None = Field(
        default=None,
        description="GPU-hours per period: every worker's GPUs times the hours it held a node.",
    )


class Period(KubeModel):
    """The period a limit applies to: a calendar week or month in a time zone, or a rolling window."""

    cel_rules = (
        cel("has(self.calendar) != has(self.rolling)", "set exactly one of calendar or rolling"),
        cel(
            "!has(self.timeZone) || has(self.calendar)",
            "timeZone applies only to calendar periods (a rolling window has no boundaries)",
            field_path=".timeZone",
        ),
        cel(
            "!has(self.weekStart) || (has(self.calendar) && self.calendar == 'Week')",
            "weekStart applies only to calendar: Week",
            field_path=".weekStart",
        ),
        cel(
            f"!has(self.rolling) || !self.rolling.matches(r'{DURATION_PATTERN}') || "
            f"(duration(self.rolling) >= duration('1h') && duration(self.rolling) <= duration('{MAX_ROLLING_HOURS}h'))",
            f"must be between 1h and {MAX_ROLLING_HOURS}h (31 days): the window is kept in hourly buckets",
            field_path=".rolling",
        ),
    )

    calendar: Literal["Month", "Week"] | None = Field(
        default=None,
        description=(
            "A calendar period: Month starts on the 1st, Week on weekStart, both at midnight in timeZone. Spending "
            "of a closed period moves to status.history; the new period starts at zero."
        ),
    )
    time_zone: str | None = Field(
        default=None,
        max_length=64,
        pattern=ZONE_PATTERN,
        description=(
            "IANA time zone whose midnight starts a calendar period (e.g. Europe/Berlin); daylight saving time "
            "moves the boundary with the clocks. Defaults to UTC."
        ),
    )
    week_start: Weekday | None = Field(default=None, description="First day of a calendar week. Defaults to Monday.")
    rolling: Duration | None = Field(
        default=None,
        description=(
            "A rolling window ending now (e.g. 168h for the last 7 days), 1h to 744h: spending leaves the window "
            "hour by hour."
        ),
    )

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, name: str | None) -> str | None:
        """The schema checks the name's shape; whether the zone exists needs the time zone database."""
        if name is not None:
            try:
                ZoneInfo(name)
            except (ZoneInfoNotFoundError, ValueError):
                raise ValueError(f"unknown time zone {name!r}: use an IANA name such as UTC or Europe/Berlin") from None
        return name

    @property
    def zone(self) -> ZoneInfo:
        """The time zone calendar boundaries are computed in."""
        return ZoneInfo(self.time_zone or "UTC")


class LabelSelectorRequirement(KubeModel):
    """One requirement of a label selector (metav1.LabelSelectorRequirement)."""

    cel_rules = (
        cel(
            "(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
            "In and NotIn need values; Exists and DoesNotExist take none",
            field_path=".values",
        ),
    )

    key: str = Field(min_length=1, max_length=317, description="The label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(description="How the key's value is matched.")
    values: list[LabelValue] = Field(
        default_factory=list, max_length=64, description="The values for In and NotIn; empty otherwise."
    )


class LabelSelector(KubeModel):
    """A label selector over the jobs of the namespace (metav1.LabelSelector); empty selects every job."""

    match_labels: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=64,
        description="Labels a job must carry with exactly these values.",
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=32, description="Requirements a job's labels must all meet."
    )


class DGXBudgetSpec(KubeModel):
    """The limit, its period and which jobs it counts."""

    limits: Limits = Field(description="The limit per period: cost, GPU-hours or both.")
    period: Period = Field(description="Calendar week or month in a time zone, or a rolling window.")
    capacities: list[Capacity] = Field(
        default_factory=list,
        max_length=8,
        description=(
            "Count only jobs on these capacities (e.g. [norm] to limit on-demand nodes and leave spot free); the "
            "capacity a worker really ran on, which under Kueue may be a spot flavor. Empty: all capacities."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    job_selector: LabelSelector | None = Field(
        default=None, description="Count only the namespace's jobs with these labels. Unset: every job."
    )
    enforcement: Literal["Hold", "Report"] = Field(
        default="Hold",
        description=(
            "Hold: a run whose worst case (nodes x GPUs x price x maxDuration) does not fit waits with reason "
            "BudgetExceeded until the budget is raised, a running job ends or the period rolls. Report: count and "
            "report, never hold."
        ),
    )


class Window(KubeModel):
    """The period the status counts."""

    start: datetime = Field(description="Start, in the period's time zone (a rolling window: now minus its length).")
    end: datetime = Field(description="End, exclusive: when the period rolls (a rolling window: the last update).")
    rolling: Duration | None = Field(default=None, description="The window's length, for a rolling window.")


class Totals(KubeModel):
    """GPU-hours and money, for display (two decimals)."""

    gpu_hours: Display | None = Field(default=None, description="GPU-hours; in remaining, only with a gpuHours limit.")
    cost: Display | None = Field(
        default=None, description="Money in status.currency; unset without prices (in remaining: without a cost limit)."
    )


class LedgerRow(KubeModel):
    """A job counted in this period. The seen values make settling idempotent: the operator adds only what a
    job's usage grew by since it last looked, so restarts, leader changes and repeated passes count nothing
    twice, and the row keeps a deleted job's spend until the period closes."""

    job: str = Field(max_length=253, description="The job's name.")
    uid: str = Field(max_length=64, description="The job's metadata.uid.")
    seen_gpu_seconds: int = Field(
        ge=0, description="The job's usage on the budget's capacities, in GPU-seconds, when last settled."
    )
    seen_cost: Exact = Field(description="Its cost then (exact), on priced instances.")
    seen_until: datetime | None = Field(
        default=None, description="The job's usage watermark (status.usage.accountedUntil) when last settled."
    )
    gpu_seconds: int = Field(ge=0, description="GPU-seconds counted in this period.")
    cost: Exact = Field(description="Money counted in this period (exact).")
    unpriced: bool | None = Field(
        default=None, description="Some of its GPU-seconds ran on an instance without a price: cost leaves them out."
    )


class HourBucket(KubeModel):
    """What one hour of a rolling window used."""

    start: datetime = Field(description="The hour, in UTC.")
    gpu_seconds: int = Field(ge=0, description="GPU-seconds used in that hour.")
    cost: Exact = Field(description="Money used in that hour (exact).")


class Reservation(KubeModel):
    """A run in progress and its worst case, which status.committed adds up."""

    job: str = Field(max_length=253, description="The job's name.")
    uid: str = Field(max_length=64, description="The job's metadata.uid.")
    capacity: Capacity = Field(description="The capacity it runs on.")
    nodes: int = Field(ge=1, le=512, description="Nodes it may hold: maxNodes, or the count Kueue admitted.")
    gpus_per_node: int = Field(ge=1, le=64, description="GPUs per node of its instance.")
    price_per_gpu_hour: Exact | None = Field(
        default=None, description="Its instance's price per GPU-hour when it started; unset: the catalog has none."
    )
    start: datetime = Field(alias="from", description="When the run started (or the reservation was taken).")
    until: datetime | None = Field(
        default=None, description="The run's start plus spec.maxDuration; unset: no maxDuration, no bound."
    )


class ClosedPeriod(KubeModel):
    """A calendar period that has ended."""

    start: datetime = Field(description="Start of the period.")
    end: datetime = Field(description="End of the period.")
    gpu_seconds: int = Field(ge=0, description="GPU-seconds counted.")
    gpu_hours: Display = Field(description="The same in GPU-hours.")
    cost: Exact = Field(description="Money counted (exact).")
    jobs: int = Field(ge=0, description="Jobs that used anything in it.")


class DGXBudgetStatus(KubeModel):
    """The ledger, written only by the operator."""

    currency: str | None = Field(
        default=None, max_length=3, description="The catalog's currency (ISO 4217); unset: the catalog has no prices."
    )
    period: Window | None = Field(default=None, description="The period counted now.")
    spent: Totals | None = Field(default=None, description="Used in this period by the selected jobs, settled.")
    committed: Totals | None = Field(
        default=None,
        description="What the runs in progress may still use: nodes x GPUs x price x the time left of maxDuration.",
    )
    remaining: Totals | None = Field(
        default=None,
        description="Limit minus spent minus committed, for each limit set; negative when a limit was lowered.",
    )
    ledger: list[LedgerRow] = Field(
        default_factory=list,
        max_length=MAX_LEDGER,
        description="Per job of this period: what was seen of its usage and what counted.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["uid"]},
    )
    buckets: list[HourBucket] = Field(
        default_factory=list,
        max_length=MAX_ROLLING_HOURS + 1,
        description="A rolling window's spending by hour; older hours leave as the window moves.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["start"]},
    )
    reservations: list[Reservation] = Field(
        default_factory=list,
        max_length=MAX_RESERVATIONS,
        description="Runs in progress, what status.committed is made of.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["uid"]},
    )
    history: list[ClosedPeriod] = Field(
        default_factory=list,
        max_length=MAX_HISTORY,
        description=f"Closed calendar periods, newest first, the last {MAX_HISTORY}.",
    )
    conditions: list[Condition] = condition_list_field(
        "Latest observations, one per condition type: Ready, True while the operator counts for this budget."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation this status describes."
    )


class DGXBudget(KubeModel):
    """A DGXBudget as stored in the cluster or written in a manifest."""

    api_version: Literal["kubedgx.io/v1alpha1"] = Field(default=API_VERSION, description="API version.")
    kind: Literal["DGXBudget"] = Field(default=KIND, description="Kind.")
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    spec: DGXBudgetSpec = Field(description="Desired state.")
    status: DGXBudgetStatus | None = Field(default=None, description="Observed state.")
