"""The PriorityClasses of the no-Helm path (`kubedgx manifests`, dgx_operator.runtime.priorities) are the chart's:
same names, values and fields, so that a job has the same scheduling order however kubedgx was installed,
and an operator configured by either finds the classes it names."""

from __future__ import annotations

from typing import Any

from dgx_operator.runtime.priorities import CHART_CLASSES, priority_class_manifests
from dgx_operator.runtime.settings import DEFAULT_PRIORITY_CLASSES
from tests.chart.conftest import chart_values, find, one, render


def without_labels(obj: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "labels"}}


def test_the_manifests_are_the_charts_priority_classes_but_for_helms_labels() -> None:
    rendered = sorted(find(render(), "PriorityClass"), key=lambda o: o["value"])
    ours = sorted(priority_class_manifests(), key=lambda o: o["value"])
    assert [without_labels(o) for o in ours] == [without_labels(o) for o in rendered]


def test_the_names_and_values_are_those_of_values_yaml() -> None:
    values = chart_values()["priorityClasses"]
    assert {level: (values[level]["name"], values[level]["value"]) for level in CHART_CLASSES} == dict(CHART_CLASSES)


def test_the_chart_configures_the_operator_with_the_operators_own_defaults() -> None:
    """The operator's defaults (used when nothing sets KUBEDGX_PRIORITY_CLASSES, as on a laptop) are what
    the chart passes."""
    container = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    expected = ",".join(f"{level}={name}" for level, name in DEFAULT_PRIORITY_CLASSES.items())
    assert env["KUBEDGX_PRIORITY_CLASSES"] == expected
