"""Guard rails (validation/limits.py): every field's refusal with its source, the defaults a job takes,
how the chart's and a namespace's limits combine, globs, the Kueue priority-class label, interactive
sessions, and the DGXLimits kind's own schema (CEL) offline."""

from __future__ import annotations

from typing import Any

import pytest

from dgx_api.schema import validate
from dgx_operator.api.crdgen import LIMITS, openapi_schema
from dgx_operator.api.limits import KUEUE_PRIORITY_LABEL, DGXLimits, LimitsSpec
from dgx_operator.api.trainingjob import DGXTrainingJob
from dgx_operator.catalog import Catalog
from dgx_operator.reconcile.queueing import PRIORITY_LABEL
from dgx_operator.validation.limits import Effective, check, effective, new_problems, parse_limits, pinned
from tests.conftest import BASE_JOB, with_changes

CATALOG = Catalog.load()
NS = "ml"
OWNER = f"DGXLimits {NS}/default"


def limits(spec: dict[str, Any], name: str = "default", namespace: str = NS) -> DGXLimits:
    return DGXLimits.model_validate(
        {
            "apiVersion": "kubedgx.io/v1alpha1",
            "kind": "DGXLimits",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
    )


def chart(spec: dict[str, Any]) -> LimitsSpec:
    return LimitsSpec.model_validate(spec)


def job(changes: dict[str, Any] | None = None) -> DGXTrainingJob:
    return DGXTrainingJob.model_validate(with_changes(BASE_JOB, changes or {}))


def lines(j: DGXTrainingJob, eff: Effective) -> list[str]:
    problems, _ = check(j, eff, CATALOG)
    return [str(p) for p in problems]


def warnings(j: DGXTrainingJob, eff: Effective) -> list[str]:
    problems, warned = check(j, eff, CATALOG)
    assert problems == []
    return warned


def ns(spec: dict[str, Any]) -> Effective:
    return effective(None, limits(spec))


# -- durations ---------------------------------------------------------------------------------------


def test_a_max_duration_over_the_namespaces_maximum_is_refused_naming_the_object_and_field() -> None:
    eff = ns({"maxDuration": {"max": "72h"}})
    assert lines(job({"spec.maxDuration": "96h"}), eff) == [
        "spec.maxDuration: 96h exceeds the maximum 72h set by DGXLimits ml/default (spec.maxDuration.max)"
    ]
    assert lines(job({"spec.maxDuration": "72h"}), eff) == []
    assert lines(job({"spec.maxDuration": "4320m"}), eff) == []  # 72h in other words


def test_a_max_duration_over_the_charts_maximum_names_the_chart_value() -> None:
    eff = effective(chart({"maxDuration": {"max": "72h"}}), None, NS)
    assert lines(job({"spec.maxDuration": "96h"}), eff) == [
        "spec.maxDuration: 96h exceeds the maximum 72h set by the chart value limits.maxDuration.max"
    ]


def test_an_unset_max_duration_takes_the_default_with_a_warning() -> None:
    eff = ns({"maxDuration": {"default": "24h", "max": "72h"}})
    assert warnings(job(), eff) == ["spec.maxDuration unset: 24h applies (DGXLimits ml/default)"]
    assert pinned(job(), eff).max_duration == "24h"
    assert pinned(job(), eff).source == OWNER
    # A job that sets the field takes no default.
    assert warnings(job({"spec.maxDuration": "10h"}), eff) == []
    assert pinned(job({"spec.maxDuration": "10h"}), eff).empty


def test_an_unset_max_duration_without_a_default_is_refused_where_a_maximum_is_set() -> None:
    eff = ns({"maxDuration": {"max": "72h"}})
    assert lines(job(), eff) == [
        "spec.maxDuration: is required in namespace ml: DGXLimits ml/default (spec.maxDuration.max) sets a "
        "maximum of 72h; set spec.maxDuration up to 72h"
    ]


def test_max_pending_has_its_own_default_and_maximum() -> None:
    eff = ns({"maxPending": {"default": "2h", "max": "12h"}})
    assert lines(job({"spec.maxPending": "13h"}), eff) == [
        "spec.maxPending: 13h exceeds the maximum 12h set by DGXLimits ml/default (spec.maxPending.max)"
    ]
    assert warnings(job(), eff) == ["spec.maxPending unset: 2h applies (DGXLimits ml/default)"]
    assert pinned(job(), eff).max_pending == "2h"
    assert pinned(job(), eff).max_duration is None


INTERACTIVE = {"spec.debug": {"interactive": True}}


def test_interactive_sessions_take_the_interactive_limits_instead_of_max_durations() -> None:
    eff = ns({"maxDuration": {"default": "24h", "max": "72h"}, "interactive": {"default": "4h", "max": "8h"}})
    assert warnings(job(INTERACTIVE), eff) == [
        "spec.maxDuration unset: 4h applies to this interactive debug session (DGXLimits ml/default)"
    ]
    assert pinned(job(INTERACTIVE), eff).max_duration == "4h"
    assert lines(job({**INTERACTIVE, "spec.maxDuration": "10h"}), eff) == [
        "spec.maxDuration: 10h exceeds the maximum 8h for interactive debug sessions set by DGXLimits ml/default "
        "(spec.interactive.max)"
    ]
    # A training job is not held to the sessions' limits.
    assert lines(job({"spec.maxDuration": "10h"}), eff) == []


def test_without_interactive_limits_sessions_are_held_to_max_durations() -> None:
    """A namespace that bounds run time does not get unbounded sessions by leaving interactive out."""
    eff = ns({"maxDuration": {"default": "24h", "max": "72h"}})
    assert pinned(job(INTERACTIVE), eff).max_duration == "24h"
    assert lines(job({**INTERACTIVE, "spec.maxDuration": "96h"}), eff) == [
        "spec.maxDuration: 96h exceeds the maximum 72h for interactive debug sessions set by DGXLimits ml/default "
        "(spec.maxDuration.max)"
    ]


def test_a_default_end_for_debug_sessions_alone() -> None:
    eff = ns({"interactive": {"default": "4h"}})
    assert pinned(job(INTERACTIVE), eff).max_duration == "4h"
    assert pinned(job(), eff).empty


# -- combining the chart's and the namespace's ------------------------------------------------------


def test_the_smaller_maximum_wins_and_is_named() -> None:
    cluster = chart({"maxDuration": {"max": "48h"}, "maxNodes": 16})
    tight = effective(cluster, limits({"maxDuration": {"max": "24h"}, "maxNodes": 32}))
    assert lines(job({"spec.maxDuration": "30h", "spec.elastic.maxNodes": 20}), tight) == [
        "spec.maxDuration: 30h exceeds the maximum 24h set by DGXLimits ml/default (spec.maxDuration.max)",
        "spec.elastic.maxNodes: 20 exceeds the maximum of 16 nodes per job set by the chart value limits.maxNodes",
    ]
    loose = effective(cluster, limits({"maxDuration": {"max": "96h"}}))
    assert lines(job({"spec.maxDuration": "50h"}), loose) == [
        "spec.maxDuration: 50h exceeds the maximum 48h set by the chart value limits.maxDuration.max"
    ]


def test_the_namespaces_default_overrides_the_charts() -> None:
    cluster = chart({"maxDuration": {"default": "12h"}, "maxPending": {"default": "1h"}})
    eff = effective(cluster, limits({"maxDuration": {"default": "6h"}}))
    found = pinned(job(), eff)
    assert (found.max_duration, found.max_pending) == ("6h", "1h")
    assert found.source == "DGXLimits ml/default; the chart value limits.maxPending.default"
    assert pinned(job(), effective(cluster, None, NS)).max_duration == "12h"


def test_a_default_over_the_effective_maximum_becomes_that_maximum() -> None:
    """The chart's default of 48h under a namespace maximum of 24h would refuse every job that takes it."""
    eff = effective(chart({"maxDuration": {"default": "48h"}}), limits({"maxDuration": {"max": "24h"}}))
    assert warnings(job(), eff) == ["spec.maxDuration unset: 24h applies (DGXLimits ml/default)"]


def test_a_namespaces_list_narrows_the_charts_and_never_widens_it() -> None:
    eff = effective(chart({"priorities": ["low", "normal"]}), limits({"priorities": ["low", "normal", "high"]}))
    assert lines(job({"spec.priority": "high"}), eff) == [
        "spec.priority: high is not allowed in namespace ml (the chart value limits.priorities allows low, normal)"
    ]
    narrow = effective(chart({"priorities": ["low", "normal"]}), limits({"priorities": ["low"]}))
    assert lines(job({"spec.priority": "normal"}), narrow) == [
        "spec.priority: normal is not allowed in namespace ml (DGXLimits ml/default allows low)"
    ]


def test_no_limits_check_nothing() -> None:
    assert effective(None, None, NS).empty
    assert effective(chart({}), limits({})).empty
    assert check(job({"spec.maxDuration": "9999h"}), effective(None, None, NS), CATALOG) == ([], [])


# -- nodes, instances, capacities, priorities, the Kueue label ---------------------------------------


def test_max_nodes_applies_to_elastic_max_nodes_and_to_min_nodes_alone() -> None:
    eff = ns({"maxNodes": 8})
    assert lines(job({"spec.elastic.maxNodes": 9}), eff) == [
        "spec.elastic.maxNodes: 9 exceeds the maximum of 8 nodes per job set by DGXLimits ml/default (spec.maxNodes)"
    ]
    assert lines(job({"spec.elastic.minNodes": 9}), eff) == [
        "spec.elastic.minNodes: 9 exceeds the maximum of 8 nodes per job set by DGXLimits ml/default (spec.maxNodes)"
    ]
    assert lines(job({"spec.elastic.minNodes": 2, "spec.elastic.maxNodes": 8}), eff) == []
    assert lines(job(), eff) == []


def test_instances_are_globs_over_the_catalogs_names() -> None:
    eff = ns({"instances": ["dgxh100.80g.*.*", "dgxa100.80g.8.spot"]})
    assert lines(job({"spec.instance": "dgxh100.80g.8.norm"}), eff) == []
    assert lines(job({"spec.instance": "dgxa100.80g.8.spot"}), eff) == []
    assert lines(job(), eff) == [
        "spec.instance: dgxa100.80g.8.norm is not allowed in namespace ml "
        "(DGXLimits ml/default allows dgxh100.80g.*.*, dgxa100.80g.8.spot)"
    ]


def test_capacities_are_the_instances_pool() -> None:
    eff = ns({"capacities": ["spot"]})
    assert lines(job({"spec.instance": "dgxa100.80g.8.spot"}), eff) == []
    assert lines(job(), eff) == [
        "spec.instance: dgxa100.80g.8.norm: capacity norm is not allowed in namespace ml "
        "(DGXLimits ml/default allows spot)"
    ]


def test_priorities_keep_high_for_those_an_admin_allows() -> None:
    eff = ns({"priorities": ["low", "normal"]})
    assert lines(job({"spec.priority": "high"}), eff) == [
        "spec.priority: high is not allowed in namespace ml (DGXLimits ml/default allows low, normal)"
    ]
    assert lines(job(), eff) == []  # no priority is normal


def test_the_kueue_priority_class_label_is_checked_and_a_job_without_it_is_not_limited() -> None:
    assert KUEUE_PRIORITY_LABEL == PRIORITY_LABEL  # the label the operator's Kueue integration reads
    eff = ns({"kueuePriorityClasses": ["research"]})
    assert lines(job({"metadata.labels": {KUEUE_PRIORITY_LABEL: "production"}}), eff) == [
        'metadata.labels["kueue.x-k8s.io/priority-class"]: production is not allowed in namespace ml '
        "(DGXLimits ml/default allows research)"
    ]
    assert lines(job({"metadata.labels": {KUEUE_PRIORITY_LABEL: "research"}}), eff) == []
    assert lines(job(), eff) == []


def test_every_problem_is_reported_at_once() -> None:
    eff = ns({"maxDuration": {"max": "1h"}, "maxNodes": 1, "priorities": ["low"], "capacities": ["spot"]})
    found = lines(job({"spec.maxDuration": "2h", "spec.elastic.maxNodes": 2, "spec.priority": "high"}), eff)
    assert [line.split(":")[0] for line in found] == [
        "spec.maxDuration",
        "spec.elastic.maxNodes",
        "spec.instance",
        "spec.priority",
    ]


def test_an_update_is_refused_only_for_what_it_breaks() -> None:
    """A limit tightened after the job was made refuses no edit of it (Kueue flips spec.suspend), only an
    edit that breaks one itself."""
    eff = ns({"maxDuration": {"max": "24h"}, "priorities": ["low", "normal"]})
    old = job({"spec.maxDuration": "48h"})
    assert new_problems(job({"spec.maxDuration": "48h", "spec.suspend": True}), old, eff, CATALOG)[0] == []
    problems, _ = new_problems(job({"spec.maxDuration": "48h", "spec.priority": "high"}), old, eff, CATALOG)
    assert [p.path for p in problems] == ["spec.priority"]
    assert [p.path for p in new_problems(job({"spec.maxDuration": "49h"}), old, eff, CATALOG)[0]] == [
        "spec.maxDuration"
    ]


# -- the kind ---------------------------------------------------------------------------------------

SCHEMA = openapi_schema(LIMITS)


def manifest(spec: dict[str, Any], name: str = "default") -> dict[str, Any]:
    return {"apiVersion": "kubedgx.io/v1alpha1", "kind": "DGXLimits", "metadata": {"name": name, "namespace": NS},
            "spec": spec}  # fmt: skip


def problems_of(doc: dict[str, Any]) -> list[str]:
    return [str(p) for p in validate(SCHEMA, doc)]


def test_the_kind_is_one_per_namespace_named_default() -> None:
    assert problems_of(manifest({}, name="team")) == [
        "metadata.name: a namespace has one DGXLimits, named default: rename it to default"
    ]
    assert problems_of(manifest({})) == []


@pytest.mark.parametrize("field", ["maxDuration", "maxPending", "interactive"])
def test_a_default_over_its_maximum_is_refused_by_the_crd(field: str) -> None:
    assert problems_of(manifest({field: {"default": "96h", "max": "72h"}})) == [
        f"spec.{field}.default: must not exceed max: a job that takes the default would be refused"
    ]
    assert problems_of(manifest({field: {"default": "72h", "max": "72h"}})) == []
    assert problems_of(manifest({field: {"max": "0s"}})) == [f"spec.{field}.max: must be longer than 0s"]


def test_bad_values_name_the_field_and_the_fix() -> None:
    found = problems_of(manifest({"maxDuration": {"max": "3 days"}, "priorities": ["urgent"], "capacities": ["Spot"]}))
    assert found == [
        'spec.capacities[0]: invalid value "Spot": must be a capacity pool of the catalog, such as norm, spot or debug',
        'spec.maxDuration.max: invalid value "3 days": must be a Go duration such as 90m, 24h or 1h30m (units: h, '
        "m, s, ms, us, ns; at most 6 digits per part)",
        'spec.priorities[0]: Unsupported value: "urgent": supported values: "low", "normal", "high"',
    ]


def test_an_unreadable_stored_object_says_why() -> None:
    body = manifest({"maxNodes": "many"})
    found, why = parse_limits(body)
    assert found is None
    assert why is not None
    assert why.startswith("DGXLimits cannot be read by this kubedgx (spec.maxNodes: ")
    found, why = parse_limits(manifest({"maxNodes": 4}))
    assert why is None
    assert found is not None
    assert found.spec.max_nodes == 4
