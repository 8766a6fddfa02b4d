"""``real_nodes``: a control plane of tests/cluster's binaries with two real nodes (kubelet and
containerd each), CoreDNS and GPU labels; one per test module, stopped after, and nothing of it left
on the machine (asserted). Skipped with the reason where the machine cannot run it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.controlplane import CONTEXT, StartError, UnavailableError, build
from tests.e2e.kubectl import Kubectl
from tests.nodes import host, images
from tests.nodes.build import node_binaries, small_images
from tests.nodes.cluster import RealNodes, interrupt_safe_stop
from tests.support.timeouts import timeout_paused

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
    problems = host.missing() + images.have_tools()
    if problems:
        pytest.skip("real nodes: " + "; ".join(problems))
    with timeout_paused():
        try:
            binaries = build(out=sys.stderr)
            node_bins = node_binaries()
            archives = small_images(tmp_path_factory.mktemp("images"))
        except UnavailableError as exc:
            pytest.skip(str(exc))
        except (StartError, subprocess.CalledProcessError) as exc:
            pytest.fail(f"real nodes: the binaries or images could not be built: {exc}", pytrace=False)
    # Short: the kubelet's socket paths must stay under 108 bytes.
    root = Path(tmp_path_factory.mktemp("rn"))
    nodes = RealNodes(root, binaries, node_bins, archives)
    with timeout_paused():
        try:
            nodes.start()
        except StartError as exc:
            pytest.fail(f"real nodes did not start: {exc}", pytrace=False)
    print(f"\nreal nodes up: {nodes.timings}", file=sys.stderr)
    try:
        yield nodes
    finally:
        interrupt_safe_stop(nodes)
        if os.environ.get(KEEP_ENV) != "1":
            left = nodes.leftovers()
            assert left == [], f"the real nodes left this on the machine: {left}"


@pytest.fixture(scope="module")
def kubectl(real_nodes: RealNodes) -> Kubectl:
    plane = real_nodes.plane
    assert plane is not None
    return Kubectl(CONTEXT, binary=plane.kubectl_binary, kubeconfig=str(plane.kubeconfig))
