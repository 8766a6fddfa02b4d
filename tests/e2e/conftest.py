"""e2e fixtures: ``cluster`` (the gate and what the session found, see tests/e2e/cluster.py) and
``ns`` (a fresh namespace per test, as a kubectl bound to it)."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import (
    E2E_ENV,
    KEEP_ENV,
    Cluster,
    delete_namespace,
    find_cluster,
    namespace_name,
    verdict,
    wanted,
)
from tests.e2e.jobs import describe
from tests.e2e.kubectl import Kubectl


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here that needs a cluster is marked ``e2e`` and ``cluster``: ``-m "not cluster"``
    (the inner loop, docs/testing.md) leaves the e2e scenarios out with the cluster suite, and keeps
    the few of test_manifests.py that need none."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents and "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    """The gate (skip, or with KUBEDGX_E2E=1 stop the run), then what the cluster must have:
    kubedgx installed and nodes faked as the e2e instance type. With no context, this machine's
    own control plane (tests/cluster), which skips where there is no Go toolchain."""
    v = verdict()
    if v.local:
        from tests.cluster.operator import local_e2e_cluster

        plane = request.getfixturevalue("control_plane")
        found_local = local_e2e_cluster(plane, request.getfixturevalue("admin_kubectl"), tmp_path_factory.mktemp("e2e"))
        if isinstance(found_local, str):
            pytest.fail(f"kubedgx e2e on the local control plane: {found_local}", pytrace=False)
        assert isinstance(found_local, Cluster)
        return found_local
    if v.refuse:
        pytest.exit(f"kubedgx e2e: {v.reason}", returncode=4)
    if not v.run:
        if wanted():
            pytest.exit(f"kubedgx e2e: {E2E_ENV}=1 but {v.reason}", returncode=1)
        pytest.skip(f"{v.reason} (see tests/e2e/README.md)")
    assert v.context is not None
    found = find_cluster(v.context)
    if isinstance(found, str):
        pytest.exit(f"kubedgx e2e: {found}", returncode=1)
    return found


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item, so the namespace fixture knows whether the test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture
def ns(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Kubectl]:
    """A fresh namespace for one test, as a kubectl bound to it; deleted afterwards (kept with
    KUBEDGX_E2E_KEEP_NAMESPACES=1). A failed test prints the namespace's jobs, pods, events and
    logs, and the operator's last log lines."""
    name = namespace_name(request.node.name)
    if cluster.ensure_operator is not None:
        cluster.ensure_operator()
    k = cluster.kubectl
    k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"kubedgx.io/e2e": "true"}}})
    kn = k.in_namespace(name)
    yield kn
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(f"\n===== kubedgx e2e: state of namespace {name} after the failure =====\n{describe(kn)}")
    if os.environ.get(KEEP_ENV) == "1":
        print(f"kubedgx e2e: keeping namespace {name} ({KEEP_ENV}=1)")
        return
    delete_namespace(k, name)
