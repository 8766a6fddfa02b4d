"""Starting real nodes for a test module, and for ``up --real-nodes``: what to skip on and why, what
to build first (outside the tests' timeouts), and the trainer cluster: the nodes with the product's
images, the chart's objects and the operator as the chart's ServiceAccount (tests/e2e's Cluster).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.controlplane import CONTEXT, StartError, UnavailableError, build
from tests.e2e.cluster import Cluster
from tests.e2e.kubectl import Kubectl
from tests.nodes import buildah, host, images
from tests.nodes.build import node_binaries, small_images
from tests.nodes.cluster import RealNodes, interrupt_safe_stop
from tests.support.timeouts import timeout_paused


class NodesUnavailableError(Exception):
    """This machine cannot run the real nodes (the message says why): a reason to skip."""


class NodesBrokenError(Exception):
    """The binaries or images could not be built, or the nodes did not start: a failure."""


def problems(*, product_images: bool) -> list[str]:
    found = host.missing() + images.have_tools()
    if product_images:
        found += buildah.missing()
    return found


@dataclass
class Started:
    nodes: RealNodes
    images: buildah.Images | None = None
    #: Seconds of each image build step that ran (none where every image was cached).
    builds: dict[str, float] = field(default_factory=dict)

    @property
    def kubectl(self) -> Kubectl:
        plane = self.nodes.plane
        assert plane is not None
        return Kubectl(CONTEXT, binary=plane.kubectl_binary, kubeconfig=str(plane.kubeconfig))


@contextlib.contextmanager
def started_nodes(root: Path, *, count: int = 2, product_images: bool = False, check_leftovers: bool = True,
                  ) -> Iterator[Started]:  # fmt: skip
    """Real nodes under ``root`` (short: the kubelet's socket paths must stay under 108 bytes), with
    the trainer and operator images where ``product_images``; stopped after, and (where
    ``check_leftovers``) an AssertionError if anything of them stays on the machine.
    Raises :class:`NodesUnavailableError` or :class:`NodesBrokenError`."""
    missing = problems(product_images=product_images)
    if missing:
        raise NodesUnavailableError("real nodes: " + "; ".join(missing))
    root.mkdir(parents=True, exist_ok=True)
    with timeout_paused():
        try:
            binaries = build(out=sys.stderr)
            node_bins = node_binaries()
            archives = small_images(root / "images")
            built, builds = buildah.build_images(root / "buildah.log") if product_images else (None, {})
        except UnavailableError as exc:
            raise NodesUnavailableError(str(exc)) from exc
        except (StartError, OSError, buildah.BuildError, subprocess.CalledProcessError) as exc:
            raise NodesBrokenError(f"real nodes: the binaries or images could not be built: {exc}") from exc
    big = (built.trainer, built.operator) if built is not None else ()
    nodes = RealNodes(root, binaries, node_bins, archives, count=count, big_images=big)
    with timeout_paused():
        try:
            nodes.start()
        except StartError as exc:
            raise NodesBrokenError(f"real nodes did not start: {exc}") from exc
    print(f"\nreal nodes up: {nodes.timings}; images in: {nodes.loads}; builds: {builds}", file=sys.stderr)
    try:
        yield Started(nodes, built, builds)
    finally:
        if nodes.plane is not None:
            nodes.plane.slot.release()
        interrupt_safe_stop(nodes)
        if check_leftovers:
            left = nodes.leftovers()
            assert left == [], f"the real nodes left this on the machine: {left}"


def chart_values(built: buildah.Images, cache_root: Path) -> dict[str, Any]:
    """The chart's values for images built here (as an admin sets them for a private registry),
    and the data mounts' node cache under the cluster's own directory (not the machine's /raid)."""
    repository, tag = built.operator.rsplit(":", 1)
    trainer_repository, trainer_tag = built.trainer.rsplit(":", 1)
    return {
        "image": {"repository": repository, "tag": tag},
        "trainer": {"image": {"repository": trainer_repository, "tag": trainer_tag}},
        # The sidecars look for checkpoints every second, not 30: a tiny model's training is short.
        "dataMounts": {"cacheRoot": str(cache_root), "checkpointSyncInterval": "1s"},
        # Live progress read every 2 s, not 30: a test sees a running job's step while it runs.
        "progressInterval": "2s",
    }


@dataclass
class TrainerCluster:
    """Real nodes running the product: tests/e2e's Cluster (the admin's kubectl, the GPU nodes, the
    operator kept in its slot) on them."""

    started: Started
    cluster: Cluster
    #: The data mounts' cache root on the nodes (this machine's directory: the nodes are local).
    cache_root: Path

    @property
    def nodes(self) -> RealNodes:
        return self.started.nodes

    @property
    def images(self) -> buildah.Images:
        assert self.started.images is not None
        return self.started.images


@contextlib.contextmanager
def trainer_cluster(root: Path, *, count: int = 2) -> Iterator[TrainerCluster]:
    """:func:`started_nodes` with the product's images, the chart installed with them and the
    operator running as the chart's ServiceAccount (its webhook reached by the apiserver)."""
    from tests.cluster.operator import local_e2e_cluster

    with started_nodes(root, count=count, product_images=True) as started:
        assert started.images is not None
        assert started.nodes.plane is not None
        found = local_e2e_cluster(
            started.nodes.plane,
            started.kubectl,
            root / "e2e",
            values=chart_values(started.images, root / "raid"),
            runs_containers=True,
        )
        if isinstance(found, str):
            raise NodesBrokenError(f"kubedgx on the real nodes: {found}")
        yield TrainerCluster(started, found, root / "raid")
