"""The cluster suite's fixtures: the session's control plane (``control_plane``, from
tests/cluster/fixtures.py), a kubectl bound to it as admin, and a fresh namespace per test.

Every test under tests/cluster is marked ``cluster``: ``-m "not cluster"`` leaves them out. Where
this machine has no Go toolchain they skip with that reason; where it has one, a failed build or
start is an error of every test that needs the cluster, with the reason and the components' logs.
A failed test gets the last lines of every component's log in its report.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chart.conftest import Rendered
from tests.cluster.controlplane import ControlPlane
from tests.cluster.operator import Operator, chart_operator, install
from tests.e2e.cluster import delete_namespace
from tests.e2e.kubectl import Kubectl, wait_for

#: How long a test's namespace may take to lose its jobs, mounts and pods once deleted.
NAMESPACE_TIMEOUT = 60

#: Keep the control plane's directory (certificates, logs, etcd) after the session.
KEEP_ENV = "KUBEDGX_CLUSTER_KEEP"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    plane = getattr(item, "funcargs", {}).get("control_plane")
    if report.failed and isinstance(plane, ControlPlane):
        report.sections.append(("control plane logs (last lines of each component)", plane.logs(25)))
    return report


@pytest.fixture(scope="session")
def kubectl(admin_kubectl: Kubectl) -> Kubectl:
    """kubectl as the cluster's admin (the shared ``admin_kubectl``, by a shorter name)."""
    return admin_kubectl


@pytest.fixture
def namespace(kubectl: Kubectl, request: pytest.FixtureRequest) -> Iterator[Kubectl]:
    """A fresh namespace for one test (kubectl bound to it), deleted afterwards without waiting."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower().removeprefix("test_")).strip("-")[:40].strip("-")
    name = f"t-{slug}-{secrets.token_hex(3)}"
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait_for(
        f"the default ServiceAccount of {name}",
        lambda: kubectl.in_namespace(name).get("serviceaccount", "default"),
        timeout=120,
        interval=0.2,
    )
    yield kubectl.in_namespace(name)
    # While the test's operator still runs: a job that does not go away holds a finalizer nobody
    # releases, which a user would meet as a job (and its namespace) stuck Terminating.
    delete_namespace(kubectl, name, timeout=NAMESPACE_TIMEOUT)


@pytest.fixture(scope="module")
def chart(kubectl: Kubectl) -> list[Rendered]:
    """The chart's objects with its default values (modules that need other values define their own)."""
    return install(kubectl)


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane,
    kubectl: Kubectl,
    chart: list[Rendered],
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Operator]:
    """The module's operator as the chart's ServiceAccount, in the control plane's operator slot."""
    workdir = tmp_path_factory.mktemp("operator")
    with chart_operator(control_plane, kubectl, request.module.__name__, chart, workdir) as op:
        yield op


# -- Kueue (tests/cluster/kueue.py) --------------------------------------------------------------

from tests.cluster.kueue import Kueue, serving  # noqa: E402


@pytest.fixture(scope="module")
def kueue(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kueue]:
    """Kueue's manager for one test module (its CRDs, its webhooks for its own resources, kubedgx's
    DGXTrainingJob as an external framework); on exit every Kueue object is deleted, the process
    stopped and the webhook configurations removed. ``kueue.workload_versions()`` says which
    Workload API versions the apiserver serves. A module that needs other settings overrides this
    fixture with its own ``Kueue(control_plane, workdir, config={...})`` under ``serving``."""
    with serving(Kueue(control_plane, tmp_path_factory.mktemp("kueue"))) as running:
        yield running


# -- moto's S3 (tests/s3.py): Flyte's blob store for the real-propeller modules -----------------------

from tests.s3 import S3, s3  # noqa: E402, F401


@pytest.fixture(scope="module")
def flyte(
    control_plane: ControlPlane,
    kubectl: Kubectl,
    s3: S3,  # noqa: F811  (the fixture imported above)
    operator: Operator,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Any]:
    """Flyte's propeller, the connector, the fake admin and the blob store, with the module's operator
    (tests/cluster/flyte_propeller.py; a module without an operator defines its own)."""
    from tests.cluster.flyte_propeller import flyte_backend

    with flyte_backend(control_plane, kubectl, s3, tmp_path_factory.mktemp("flyte")) as backend:
        yield backend
