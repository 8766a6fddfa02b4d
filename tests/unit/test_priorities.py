"""priorities.py: which configured PriorityClasses the operator keeps after asking the apiserver, what it
says about the rest, and the PriorityClasses `kubedgx manifests` prints for the no-Helm path."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from dgx_operator.api.crdgen import KINDS
from dgx_operator.catalog import Catalog
from dgx_operator.cli.main import main
from dgx_operator.kube import ApiError, TransientError
from dgx_operator.runtime import priorities
from dgx_operator.runtime.settings import DEFAULT_PRIORITY_CLASSES, OperatorConfig
from dgx_operator.validation.validator import Validator

CHART = dict(DEFAULT_PRIORITY_CLASSES)
FIX = "kubedgx manifests | kubectl apply -f -"


class Cluster:
    """The apiserver's answers to GET priorityclasses/<name>: a value, absent (404), or an exception."""

    def __init__(self, classes: Mapping[str, int | BaseException]) -> None:
        self.classes = dict(classes)
        self.asked: list[str] = []

    async def get(self, name: str) -> int | None:
        self.asked.append(name)
        answer = self.classes.get(name)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def priority_value(self, group: str, version: str, plural: str, name: str) -> int | None:
        """Kube.priority_value's signature, for :func:`priorities.checked`."""
        assert (group, version, plural) == ("scheduling.k8s.io", "v1", "priorityclasses")
        return await self.get(name)


def forbidden() -> ApiError:
    return ApiError(status=403, reason="Forbidden")


def run_check(classes: Mapping[str, str], cluster: Cluster) -> priorities.Check:
    return asyncio.run(priorities.check(classes, cluster.get))


def test_the_manifest_names_are_the_operators_defaults() -> None:
    """What `kubedgx manifests` creates is what an operator with no KUBEDGX_PRIORITY_CLASSES names."""
    assert {level: name for level, (name, _) in priorities.CHART_CLASSES.items()} == CHART


def test_existing_classes_are_kept_and_missing_ones_dropped() -> None:
    result = run_check(CHART, Cluster({"kubedgx-high": 100000}))
    assert result.usable == {"high": "kubedgx-high"}
    assert result.missing == {"low": "kubedgx-low", "normal": "kubedgx-normal"}
    assert result.unknown == {}
    assert run_check(CHART, Cluster(dict.fromkeys(CHART.values(), 1))).usable == CHART
    assert run_check(CHART, Cluster({})).usable == {}


def test_a_class_that_could_not_be_read_is_kept() -> None:
    """403 (RBAC), a 5xx or a network error say nothing about the class: dropping it would change the
    priority of every job on a cluster where it exists."""
    cluster = Cluster(
        {
            "kubedgx-low": forbidden(),
            "kubedgx-normal": TransientError("get: HTTP 503"),
            "kubedgx-high": OSError("reset"),
        }
    )
    result = run_check(CHART, cluster)
    assert result.usable == CHART
    assert result.missing == {}
    assert result.unknown == {"low": "HTTP 403 Forbidden", "normal": "get: HTTP 503", "high": "reset"}


def test_each_class_is_asked_for_once() -> None:
    cluster = Cluster({"shared": 5})
    result = run_check({"low": "shared", "normal": "shared", "high": "gone"}, cluster)
    assert sorted(cluster.asked) == ["gone", "shared"]
    assert result.usable == {"low": "shared", "normal": "shared"}


def test_cancellation_is_not_taken_for_an_unknown_answer() -> None:
    with pytest.raises(asyncio.CancelledError):
        run_check(CHART, Cluster({"kubedgx-low": asyncio.CancelledError()}))


def test_the_warning_names_each_missing_class_its_priority_and_the_fix() -> None:
    (line,) = run_check(CHART, Cluster({"kubedgx-high": 1})).warnings()
    assert line.startswith(
        "PriorityClasses kubedgx-low (spec.priority low), kubedgx-normal (spec.priority normal) do not exist: "
    ), line
    assert "instead of being refused" in line
    assert f"`{FIX}`" in line
    assert "restart the operator" in line
    assert "KUBEDGX_PRIORITY_CLASSES" in line
    (one,) = run_check({"normal": "kubedgx-normal"}, Cluster({})).warnings()
    assert one.startswith("PriorityClass kubedgx-normal (spec.priority normal) does not exist: "), one
    assert "create it with" in one


def test_a_class_of_the_admins_own_is_created_with_kubectl_not_our_manifests() -> None:
    (line,) = run_check({"high": "team-urgent"}, Cluster({})).warnings()
    assert "`kubectl create priorityclass team-urgent --value=N`" in line
    assert FIX not in line


def test_classes_that_could_not_be_checked_get_a_line_of_their_own() -> None:
    lines = run_check(CHART, Cluster({"kubedgx-low": forbidden(), "kubedgx-high": 1})).warnings()
    assert len(lines) == 2
    assert lines[0].startswith("PriorityClass kubedgx-normal (spec.priority normal) does not exist")
    assert "kubedgx-low (spec.priority low): HTTP 403 Forbidden" in lines[1]
    assert "kept as configured" in lines[1]
    assert "`get` on scheduling.k8s.io priorityclasses" in lines[1]


def checked(config: OperatorConfig, cluster: Cluster) -> OperatorConfig:
    kube: Any = cluster
    return asyncio.run(priorities.checked(config, kube))


def test_checked_drops_the_missing_classes_from_the_operators_config(caplog: pytest.LogCaptureFixture) -> None:
    config = OperatorConfig(trainer_image="registry.example/trainer:1")
    with caplog.at_level(logging.INFO, logger=priorities.__name__):
        out = checked(config, Cluster({"kubedgx-low": 1, "kubedgx-high": 3}))
    assert out.priority_classes == {"low": "kubedgx-low", "high": "kubedgx-high"}
    assert out.defaults().priority_classes == {"low": "kubedgx-low", "high": "kubedgx-high"}
    assert out.trainer_image == config.trainer_image, "everything else stays"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert "PriorityClass kubedgx-normal (spec.priority normal) does not exist" in warnings[0].getMessage()


def test_checked_leaves_a_config_whose_classes_all_exist(caplog: pytest.LogCaptureFixture) -> None:
    config = OperatorConfig()
    with caplog.at_level(logging.INFO, logger=priorities.__name__):
        assert checked(config, Cluster(dict.fromkeys(CHART.values(), 1))) is config
    assert [r.levelname for r in caplog.records] == ["INFO"]
    assert "low=kubedgx-low, normal=kubedgx-normal, high=kubedgx-high" in caplog.records[0].getMessage()


def test_checked_asks_nothing_when_no_class_is_configured() -> None:
    config = OperatorConfig(priority_classes={})
    cluster = Cluster({})
    assert checked(config, cluster) is config
    assert cluster.asked == []


# -- kubedgx manifests -----------------------------------------------------------------------------


def manifests() -> list[dict[str, Any]]:
    out = io.StringIO()
    assert main(["manifests"], out=out) == 0
    return [d for d in yaml.safe_load_all(out.getvalue()) if d]


def test_manifests_prints_the_crds_then_the_priority_classes() -> None:
    docs = manifests()
    assert [d["kind"] for d in docs] == ["CustomResourceDefinition"] * len(KINDS) + ["PriorityClass"] * 3
    crds = io.StringIO()
    main(["crds"], out=crds)
    assert docs[: len(KINDS)] == list(yaml.safe_load_all(crds.getvalue())), "the same CRDs as `kubedgx crds`"
    classes = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PriorityClass"}
    assert classes == {d["metadata"]["name"]: d for d in priorities.priority_class_manifests()}
    assert set(classes) == set(CHART.values())
    assert all(d["globalDefault"] is False for d in classes.values()), "never the cluster's default"


def test_manifests_pass_the_kubernetes_schemas() -> None:
    validator = Validator(Catalog.load())
    for doc in manifests():
        outcome = validator.validate(doc)
        assert outcome.ok, (doc["metadata"]["name"], outcome.problems)
