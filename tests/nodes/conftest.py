"""``real_nodes``: a control plane of tests/cluster's binaries with two real nodes (kubelet and
containerd each), CoreDNS and GPU labels; one per test module, stopped after, and nothing of it left
on the machine (asserted). ``trainer``: the same with the product's images and the operator (see
tests/nodes/fixtures.py). Skipped with the reason where the machine cannot run them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.conftest import ns, pytest_runtest_makereport  # noqa: F401  (tests/e2e's namespace per test)
from tests.e2e.kubectl import Kubectl
from tests.nodes.cluster import RealNodes
from tests.nodes.fixtures import NodesBrokenError, NodesUnavailableError, TrainerCluster, started_nodes, trainer_cluster

HERE = Path(__file__).resolve().parent
KEEP_ENV = "KUBEDGX_NODES_KEEP"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here needs the control plane too: ``-m "not cluster"`` leaves them out."""
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.nodes)
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="module")
def real_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNodes]:
    try:
        with started_nodes(tmp_path_factory.mktemp("rn"), check_leftovers=os.environ.get(KEEP_ENV) != "1") as s:
            yield s.nodes
    except NodesUnavailableError as exc:
        pytest.skip(str(exc))
    except NodesBrokenError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def kubectl(real_nodes: RealNodes) -> Kubectl:
    plane = real_nodes.plane
    assert plane is not None
    from tests.cluster.controlplane import CONTEXT

    return Kubectl(CONTEXT, binary=plane.kubectl_binary, kubeconfig=str(plane.kubeconfig))


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainerCluster]:
    try:
        with trainer_cluster(tmp_path_factory.mktemp("rn")) as found:
            yield found
    except NodesUnavailableError as exc:
        pytest.skip(str(exc))
    except NodesBrokenError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def cluster(trainer: TrainerCluster) -> Cluster:
    """tests/e2e's ``ns`` fixture takes its namespaces from this cluster."""
    return trainer.cluster
