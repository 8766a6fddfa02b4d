"""Guard rails (DGXLimits and the chart value ``limits``), checked: pure functions shared by the
webhook (at `kubectl apply`), `kubedgx validate --limits FILE` and the planner (a job's first pass,
for a job that slipped past the webhook, and the defaults it pins).

:func:`effective` combines the cluster's limits (the chart) with a namespace's DGXLimits and keeps,
for every value, where it was set: a refusal must say which object (or chart value) to ask an
admin about, because the user who meets it cannot read the chart and may not know the DGXLimits
exists. The rules of combination, as LimitRange users expect them:

- a default: the namespace's overrides the chart's (the namespace knows its work better); one that
  exceeds the effective maximum is replaced by that maximum, so that a job taking the default is
  never refused for it;
- a maximum (durations, maxNodes): the smaller of the two;
- a list (instances, capacities, priorities, Kueue priority classes): each that is set must allow
  the value, so the namespace's list narrows the chart's and can never widen it.

Interactive debug sessions (spec.debug.interactive) take the ``interactive`` default and maximum
for their maxDuration; where neither the chart nor the namespace sets one, maxDuration's applies,
so a namespace with a maximum run time does not get unbounded sessions by leaving ``interactive``
out.

:func:`check` returns problems (refusals, ``(field path, message)`` like the validator's) and
warnings (a default that will apply). The defaults are never written into the job: the operator
pins them into ``status.limits`` at the job's first pass (:func:`pinned`).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from datetime import timedelta
from typing import Generic, TypeVar

from pydantic import ValidationError

from dgx_api.schema import Problem, join_path
from dgx_operator.api.common import parse_duration
from dgx_operator.api.limits import KIND, KUEUE_PRIORITY_LABEL, DGXLimits, DurationLimit, LimitsSpec
from dgx_operator.api.trainingjob import DGXTrainingJob
from dgx_operator.catalog import Catalog, UnknownInstanceError

T = TypeVar("T")

#: Where the chart's limits come from, as messages name it.
CHART = "the chart"


@dataclass(frozen=True)
class Source:
    """Where one limit is set: a DGXLimits object and its field, or a chart value."""

    #: ``DGXLimits team-a/default`` or :data:`CHART`.
    owner: str
    #: The field there: ``spec.maxDuration.max`` or ``limits.maxDuration.max``.
    field: str

    def __str__(self) -> str:
        """``DGXLimits team-a/default (spec.maxDuration.max)`` or ``the chart value limits.maxDuration.max``."""
        return f"{CHART} value {self.field}" if self.owner == CHART else f"{self.owner} ({self.field})"

    @property
    def brief(self) -> str:
        """``DGXLimits team-a/default`` or ``the chart value limits.priorities``: for the sentences that
        name the object alone (the field is clear from the rest)."""
        return f"{CHART} value {self.field}" if self.owner == CHART else self.owner


@dataclass(frozen=True)
class Limit(Generic[T]):
    """One effective value and where it was set."""

    value: T
    source: Source


@dataclass(frozen=True)
class DurationRule:
    """The effective default and maximum of one duration field."""

    default: Limit[str] | None = None
    max: Limit[str] | None = None


@dataclass(frozen=True)
class Effective:
    """The limits that apply to the jobs of one namespace, each with its source. Lists are kept per
    source (each must allow a value); an empty tuple allows everything."""

    namespace: str
    max_duration: DurationRule = DurationRule()
    max_pending: DurationRule = DurationRule()
    interactive: DurationRule = DurationRule()
    max_nodes: Limit[int] | None = None
    instances: tuple[Limit[tuple[str, ...]], ...] = ()
    capacities: tuple[Limit[tuple[str, ...]], ...] = ()
    priorities: tuple[Limit[tuple[str, ...]], ...] = ()
    kueue_priority_classes: tuple[Limit[tuple[str, ...]], ...] = ()

    @property
    def empty(self) -> bool:
        """Nothing is limited: the checks can be skipped."""
        return self == Effective(self.namespace)

    def durations(self, interactive: bool) -> DurationRule:
        """The rule for spec.maxDuration of a job (an interactive session's, when it is one)."""
        if not interactive:
            return self.max_duration
        return DurationRule(
            default=self.interactive.default or self.max_duration.default,
            max=self.interactive.max or self.max_duration.max,
        )


# -- combining the chart's and the namespace's ------------------------------------------------------


def _sources(cluster: LimitsSpec | None, namespace: DGXLimits | None) -> list[tuple[LimitsSpec, str, str]]:
    """(spec, owner, field prefix) of each side that exists: the chart first."""
    out: list[tuple[LimitsSpec, str, str]] = []
    if cluster is not None:
        out.append((cluster, CHART, "limits"))
    if namespace is not None:
        out.append((namespace.spec, namespace.label, "spec"))
    return out


def _seconds(text: str) -> timedelta:
    return parse_duration(text)


def _duration_rule(sides: list[tuple[LimitsSpec, str, str]], name: str, attr: str) -> DurationRule:
    default: Limit[str] | None = None
    most: Limit[str] | None = None
    for spec, owner, prefix in sides:
        limit: DurationLimit | None = getattr(spec, attr)
        if limit is None:
            continue
        if limit.default is not None:  # the later side (the namespace) overrides
            default = Limit(limit.default, Source(owner, f"{prefix}.{name}.default"))
        if limit.max is not None and (most is None or _seconds(limit.max) < _seconds(most.value)):
            most = Limit(limit.max, Source(owner, f"{prefix}.{name}.max"))
    if default is not None and most is not None and _seconds(default.value) > _seconds(most.value):
        default = most  # a default the maximum refuses would refuse every job that takes it
    return DurationRule(default, most)


def _lists(sides: list[tuple[LimitsSpec, str, str]], name: str, attr: str) -> tuple[Limit[tuple[str, ...]], ...]:
    return tuple(
        Limit(tuple(values), Source(owner, f"{prefix}.{name}"))
        for spec, owner, prefix in sides
        if (values := getattr(spec, attr))
    )


def effective(cluster: LimitsSpec | None, namespace: DGXLimits | None, namespace_name: str | None = None) -> Effective:
    """The limits for the jobs of a namespace: the chart's (``cluster``) and the namespace's
    DGXLimits (None when it has none) combined as the module docstring says."""
    ns = namespace_name or (namespace.metadata.namespace if namespace is not None else None) or "default"
    sides = _sources(cluster, namespace)
    max_nodes: Limit[int] | None = None
    for spec, owner, prefix in sides:
        if spec.max_nodes is not None and (max_nodes is None or spec.max_nodes < max_nodes.value):
            max_nodes = Limit(spec.max_nodes, Source(owner, f"{prefix}.maxNodes"))
    return Effective(
        namespace=ns,
        max_duration=_duration_rule(sides, "maxDuration", "max_duration"),
        max_pending=_duration_rule(sides, "maxPending", "max_pending"),
        interactive=_duration_rule(sides, "interactive", "interactive"),
        max_nodes=max_nodes,
        instances=_lists(sides, "instances", "instances"),
        capacities=_lists(sides, "capacities", "capacities"),
        priorities=_lists(sides, "priorities", "priorities"),
        kueue_priority_classes=_lists(sides, "kueuePriorityClasses", "kueue_priority_classes"),
    )


# -- checking a job ---------------------------------------------------------------------------------


def _interactive(job: DGXTrainingJob) -> bool:
    return bool(job.spec.debug and job.spec.debug.interactive)


def _duration(
    path: str, value: str | None, rule: DurationRule, namespace: str, what: str
) -> tuple[list[Problem], list[str]]:
    """One duration field against its rule. ``what``: "" or " for interactive debug sessions"."""
    if value is None:
        if rule.default is not None:
            session = " to this interactive debug session" if what else ""
            return [], [f"{path} unset: {rule.default.value} applies{session} ({rule.default.source.brief})"]
        if rule.max is not None:
            return [
                Problem(
                    path,
                    f"is required in namespace {namespace}: {rule.max.source} sets a maximum of "
                    f"{rule.max.value}{what}; set {path} up to {rule.max.value}",
                )
            ], []
        return [], []
    if rule.max is not None and _seconds(value) > _seconds(rule.max.value):
        return [Problem(path, f"{value} exceeds the maximum {rule.max.value}{what} set by {rule.max.source}")], []
    return [], []


def _not_allowed(
    path: str, value: str, namespace: str, lists: tuple[Limit[tuple[str, ...]], ...], glob: bool
) -> list[Problem]:
    for limit in lists:
        allowed = any(fnmatch.fnmatchcase(value, pattern) for pattern in limit.value) if glob else value in limit.value
        if not allowed:
            return [
                Problem(
                    path,
                    f"{value} is not allowed in namespace {namespace} "
                    f"({limit.source.brief} allows {', '.join(limit.value)})",
                )
            ]
    return []


def _capacity(instance: str, catalog: Catalog | None) -> str:
    """The instance's capacity pool, as the catalog has it (else the name's last part)."""
    if catalog is not None:
        try:
            return catalog.get(instance).capacity
        except UnknownInstanceError:
            pass  # refused by the validator; the name still says which pool was meant
    return instance.rsplit(".", 1)[-1]


def check(job: DGXTrainingJob, limits: Effective, catalog: Catalog | None = None) -> tuple[list[Problem], list[str]]:
    """(problems, warnings) of ``job`` under ``limits``. Each problem names the field, the value, the
    limit and where it is set; each warning a default that will apply."""
    if limits.empty:
        return [], []
    spec, ns = job.spec, limits.namespace
    problems: list[Problem] = []
    warnings: list[str] = []
    interactive = _interactive(job)
    for refused, warned in (
        _duration(
            "spec.maxDuration",
            spec.max_duration,
            limits.durations(interactive),
            ns,
            " for interactive debug sessions" if interactive else "",
        ),
        _duration("spec.maxPending", spec.max_pending, limits.max_pending, ns, ""),
    ):
        problems += refused
        warnings += warned
    if limits.max_nodes is not None:
        elastic = spec.elastic
        most = limits.max_nodes
        if elastic is not None and elastic.max_nodes is not None:
            path, count = "spec.elastic.maxNodes", elastic.max_nodes
        else:
            path, count = "spec.elastic.minNodes", elastic.min_nodes if elastic is not None else 1
        if count > most.value:
            problems.append(
                Problem(path, f"{count} exceeds the maximum of {most.value} nodes per job set by {most.source}")
            )
    problems += _not_allowed("spec.instance", spec.instance, ns, limits.instances, glob=True)
    capacity = _capacity(spec.instance, catalog)
    pools = _not_allowed("spec.instance", capacity, ns, limits.capacities, glob=False)
    problems += [Problem(p.path, f"{spec.instance}: capacity {p.message}") for p in pools]
    problems += _not_allowed("spec.priority", spec.priority, ns, limits.priorities, glob=False)
    label = job.metadata.labels.get(KUEUE_PRIORITY_LABEL)
    if label:
        problems += _not_allowed(
            join_path("metadata.labels", KUEUE_PRIORITY_LABEL), label, ns, limits.kueue_priority_classes, glob=False
        )
    return problems, warnings


def new_problems(
    job: DGXTrainingJob, old: DGXTrainingJob | None, limits: Effective, catalog: Catalog | None = None
) -> tuple[list[Problem], list[str]]:
    """:func:`check` of an update: only the problems the stored job did not have already. Limits are
    checked when a job is created or changed, never later (as LimitRange): a limit tightened after
    the job was made must not refuse every edit of it (Kueue's suspend and resume among them), only
    an edit that itself breaks one."""
    problems, warnings = check(job, limits, catalog)
    if old is None:
        return problems, warnings
    before, _ = check(old, limits, catalog)
    return [p for p in problems if p not in before], warnings


# -- the defaults a job takes ----------------------------------------------------------------------


@dataclass(frozen=True)
class Pinned:
    """The defaults that apply to a job that leaves the fields unset (None: no default applies), and
    where they come from: what the operator writes into ``status.limits`` at the job's first pass."""

    max_duration: str | None = None
    max_pending: str | None = None
    source: str = ""

    @property
    def empty(self) -> bool:
        return self.max_duration is None and self.max_pending is None


def pinned(job: DGXTrainingJob, limits: Effective) -> Pinned:
    """The defaults of ``limits`` that ``job`` takes (for the fields its spec leaves unset)."""
    duration = limits.durations(_interactive(job)).default if job.spec.max_duration is None else None
    pending = limits.max_pending.default if job.spec.max_pending is None else None
    sources = list(dict.fromkeys(limit.source.brief for limit in (duration, pending) if limit is not None))
    return Pinned(
        max_duration=duration.value if duration is not None else None,
        max_pending=pending.value if pending is not None else None,
        source="; ".join(sources),
    )


def parse_limits(body: object) -> tuple[DGXLimits | None, str | None]:
    """(the stored DGXLimits, None), or (None, why this kubedgx cannot read it): a DGXLimits stored
    under an older schema must be reported, not taken for "no limits"."""
    try:
        return DGXLimits.model_validate(body), None
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ""
        for part in first["loc"]:
            path = join_path(path, part)
        return None, f"{KIND} cannot be read by this kubedgx ({path}: {first['msg']}); re-apply it with a valid spec"
