"""The operator in the chart's namespaced mode (``watchNamespaces``) on the real control plane: its
ServiceAccount gets Roles in the watched namespaces only, and the operator works there without a
single RBAC refusal, leaves every other namespace alone, and cannot read pods cluster-wide."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from tests.chart.conftest import Rendered
from tests.cluster.controlplane import ControlPlane
from tests.cluster.operator import Operator, chart_operator, install, service_account
from tests.e2e.jobs import command_job, running_with, wait_job, worker_pods
from tests.e2e.kubectl import JOBS, Kubectl, dig

RELEASE = "kns"
SUFFIX = secrets.token_hex(3)
WATCHED = (f"ml-a-{SUFFIX}", f"ml-b-{SUFFIX}")
UNWATCHED = f"other-{SUFFIX}"


@pytest.fixture(scope="module")
def namespaces(kubectl: Kubectl) -> Iterator[tuple[str, ...]]:
    names = (*WATCHED, UNWATCHED)
    kubectl.apply(*({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in names))
    yield names
    for name in names:
        kubectl.run("delete", "namespace", name, "--wait=false", "--ignore-not-found")


@pytest.fixture(scope="module")
def chart(kubectl: Kubectl, namespaces: tuple[str, ...]) -> list[Rendered]:
    return install(kubectl, {"watchNamespaces": list(WATCHED)}, release=RELEASE, namespace=RELEASE)


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane, kubectl: Kubectl, chart: list[Rendered], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    with chart_operator(control_plane, kubectl, __name__, chart, tmp_path_factory.mktemp("operator-namespaced")) as op:
        yield op


def test_the_service_account_is_bound_to_the_watched_namespaces_only(kubectl: Kubectl, chart: list[Rendered]) -> None:
    namespace, name = service_account(chart)
    who = f"system:serviceaccount:{namespace}:{name}"

    def can(*args: str) -> str:
        return kubectl.run("auth", "can-i", *args, "--as", who, check=False).stdout.strip()

    for watched in WATCHED:
        assert can("create", "pods", "-n", watched) == "yes"
        assert can("patch", f"{JOBS}/status", "-n", watched) == "yes"
    assert can("create", "pods", "-n", UNWATCHED) == "no"
    assert can("list", "pods", "--all-namespaces") == "no"


def test_jobs_run_in_each_watched_namespace_and_nowhere_else(operator: Operator, kubectl: Kubectl) -> None:
    outside = kubectl.in_namespace(UNWATCHED)
    outside.apply(command_job("ignored"))
    for watched in WATCHED:
        k = kubectl.in_namespace(watched)
        k.apply(command_job("ran"))
        wait_job(k, "ran", "Running", running_with(1), timeout=60)
    # Both watched jobs ran after the unwatched one was stored: had the operator seen it, it would
    # have given it a status and a worker by now.
    assert dig(outside.get(JOBS, "ignored"), "status") in (None, {})
    assert worker_pods(outside, "ignored") == []
