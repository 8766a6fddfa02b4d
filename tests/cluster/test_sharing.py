"""Sharing DGX nodes on the real scheduler (issue 32, docs/sharing.md): sub-node shapes and MIG slices
placed by kube-scheduler running the packing profile exactly as docs/sharing.md writes it, the workers
rendered by the operator started from the chart with ``scheduling.schedulerName: kubedgx-packing``.

The module runs on a control plane of its own: five fake DGX A100 80GB nodes (three whole, one cut
``all-1g.10gb``, one ``all-balanced``, labelled and sized as GPU Feature Discovery and the device plugin
show them under the ``mixed`` strategy) and a kube-scheduler with a second profile. The session's
cluster keeps its default scheduler and its nodes.

Every job asks its shape's own requests (the catalog's share, no ``resources`` override), so the
scheduler's fit is the one a real DGX node would give; nothing sleeps, every step waits on a condition
the API shows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import pytest
import yaml

from dgx_operator.catalog import Catalog
from dgx_operator.render.quantity import value as quantity
from tests.chart.conftest import Rendered, one
from tests.cluster.controlplane import CONTEXT, ControlPlane, NodePool
from tests.cluster.fixtures import started_control_plane
from tests.cluster.operator import Operator, install
from tests.conftest import ROOT
from tests.e2e.jobs import command_job, live_workers, running_with, wait_job, worker_pods
from tests.e2e.kubectl import JOBS, Kubectl, dig, wait_for

TIMEOUT = 120
SCHEDULER = "kubedgx-packing"
DOC = ROOT / "docs" / "sharing.md"
#: The comment above the fenced block of docs/sharing.md that holds the scheduler configuration.
MARKER = "<!-- kubedgx:packing-profile"

A100 = "dgxa100.80g"
WHOLE = f"{A100}.8.norm"
ALL_1G = {"1g.10gb": 56}
BALANCED = {"1g.10gb": 16, "2g.20gb": 8, "3g.40gb": 8}
POOLS = (
    NodePool(WHOLE, 3),
    NodePool(WHOLE, 1, mig=ALL_1G, mig_config="all-1g.10gb"),
    NodePool(WHOLE, 1, mig=BALANCED, mig_config="all-balanced"),
)
GPU = "nvidia.com/gpu"
#: The catalog's memoryGiB per MIG profile of the family.
CATALOG_MIG_GIB = {m.profile: m.memory_gi_b for m in Catalog.load().get(WHOLE).family.mig}


def packing_profile(doc: str | None = None) -> dict[str, Any]:
    """The KubeSchedulerConfiguration of docs/sharing.md: the first fenced yaml block after MARKER."""
    text = DOC.read_text(encoding="utf-8") if doc is None else doc
    at = text.find(MARKER)
    assert at >= 0, f"{DOC}: no {MARKER} comment"
    match = re.compile(r"^```ya?ml\n(.*?)^```", re.MULTILINE | re.DOTALL).search(text, at)
    assert match is not None, f"{DOC}: no ```yaml block after {MARKER}"
    config: dict[str, Any] = yaml.safe_load(match[1])
    return config


# -- the module's cluster ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """This module's own control plane (module docstring), in place of the session's."""
    yield from started_control_plane(
        tmp_path_factory, "control-plane-sharing", pools=POOLS, scheduler_config=packing_profile()
    )


@pytest.fixture(scope="module")
def kubectl(control_plane: ControlPlane) -> Kubectl:
    return Kubectl(CONTEXT, binary=control_plane.kubectl_binary, kubeconfig=str(control_plane.kubeconfig))


@pytest.fixture(scope="module")
def chart(kubectl: Kubectl) -> list[Rendered]:
    """The chart with the packing profile named; the operator (conftest's fixture) runs from it."""
    rendered = install(kubectl, {"scheduling": {"schedulerName": SCHEDULER}})
    container = one(rendered, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env.get("KUBEDGX_SCHEDULER_NAME") == SCHEDULER, f"the chart does not pass scheduling.schedulerName: {env}"
    return rendered


@pytest.fixture(autouse=True)
def nodes_empty(control_plane: ControlPlane) -> None:
    """Each test starts on empty nodes (the namespaces of earlier tests are gone with their pods)."""
    wait_for(
        "no pod left on any node from an earlier test",
        lambda: not bound_pods(control_plane) or None,
        timeout=TIMEOUT,
        interval=0.5,
        diagnose=lambda: "\n".join(f"{pod_name(p)} on {dig(p, 'spec', 'nodeName')}" for p in bound_pods(control_plane)),
    )


# -- jobs and where they land ---------------------------------------------------------------------


def job(name: str, instance: str, *, workers: int = 1) -> dict[str, Any]:
    """A job that idles, of ``instance``, asking the shape's own requests."""
    manifest = command_job(name, min_nodes=workers, max_nodes=workers)
    manifest["spec"]["instance"] = instance
    del manifest["spec"]["resources"]
    return manifest


def placed(k: Kubectl, name: str, *, workers: int = 1) -> list[str]:
    """Run ``name`` until its ``workers`` are Running; the nodes they were bound to, by worker index.
    Every worker names the packing profile."""
    wait_job(k, name, f"{workers}/{workers} workers Running", running_with(workers), timeout=TIMEOUT)
    pods = sorted(live_workers(k, name), key=pod_name)
    assert len(pods) == workers, [pod_name(p) for p in pods]
    for pod in pods:
        assert dig(pod, "spec", "schedulerName") == SCHEDULER, f"{pod_name(pod)}: {dig(pod, 'spec', 'schedulerName')}"
    where = [str(dig(p, "spec", "nodeName")) for p in pods]
    print(f"{name}: {', '.join(where)}")  # the placements, in the report of a failed test (or with -s)
    return where


def delete_job(k: Kubectl, name: str) -> None:
    """Delete the job and wait until its workers are gone (their GPUs free again)."""
    k.delete(JOBS, name)
    wait_for(f"{name}'s workers to be gone", lambda: not worker_pods(k, name) or None, timeout=TIMEOUT, interval=0.5)


def pod_name(pod: Mapping[str, Any]) -> str:
    return f"{dig(pod, 'metadata', 'namespace')}/{dig(pod, 'metadata', 'name')}"


def nodes(plane: ControlPlane) -> dict[str, dict[str, Any]]:
    answer = plane.get("/api/v1/nodes")
    assert answer is not None
    return {n["metadata"]["name"]: n for n in answer["items"]}


def whole_gpu_nodes(plane: ControlPlane) -> list[str]:
    return sorted(n for n, node in nodes(plane).items() if "nvidia.com/mig.strategy" not in node["metadata"]["labels"])


def mig_node(plane: ControlPlane, config: str) -> str:
    (name,) = [
        n for n, node in nodes(plane).items() if node["metadata"]["labels"].get("nvidia.com/mig.config") == config
    ]
    return name


def bound_pods(plane: ControlPlane, node: str | None = None) -> list[dict[str, Any]]:
    """Pods bound to ``node`` (any node: None), every namespace, as the API has them; not the ones
    that ended (the scheduler does not count them)."""
    selector = f"spec.nodeName={node}" if node else "spec.nodeName!="
    answer = plane.get(f"/api/v1/pods?fieldSelector={quote(selector)}")
    assert answer is not None
    return [p for p in answer["items"] if dig(p, "status", "phase") not in ("Succeeded", "Failed")]


# -- resources, as the scheduler adds them -------------------------------------------------------


def _add(a: Mapping[str, Decimal], b: Mapping[str, Decimal]) -> dict[str, Decimal]:
    return {k: a.get(k, Decimal(0)) + b.get(k, Decimal(0)) for k in {*a, *b}}


def _max(a: Mapping[str, Decimal], b: Mapping[str, Decimal]) -> dict[str, Decimal]:
    return {k: max(a.get(k, Decimal(0)), b.get(k, Decimal(0))) for k in {*a, *b}}


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """What the scheduler counts for a pod: its containers' requests, its sidecars' (restartable init
    containers) on top, at least what any init container needs beside the sidecars started before
    it, plus the pod's overhead."""

    def requests(c: Mapping[str, Any]) -> dict[str, Decimal]:
        return {k: quantity(v) for k, v in (dig(c, "resources", "requests", default={}) or {}).items()}

    regular: dict[str, Decimal] = {}
    for c in dig(pod, "spec", "containers", default=[]) or []:
        regular = _add(regular, requests(c))
    sidecars: dict[str, Decimal] = {}
    init_peak: dict[str, Decimal] = {}
    for c in dig(pod, "spec", "initContainers", default=[]) or []:
        if c.get("restartPolicy") == "Always":
            sidecars = _add(sidecars, requests(c))
            init_peak = _max(init_peak, sidecars)
        else:
            init_peak = _max(init_peak, _add(sidecars, requests(c)))
    overhead = {k: quantity(v) for k, v in (dig(pod, "spec", "overhead", default={}) or {}).items()}
    return _add(_max(_add(regular, sidecars), init_peak), overhead)


def requested_on(plane: ControlPlane, node: str) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for pod in bound_pods(plane, node):
        total = _add(total, pod_requests(pod))
    return total


def assert_fits(plane: ControlPlane, k: Kubectl) -> dict[str, dict[str, Decimal]]:
    """For every node a worker of ``k``'s namespace is bound to: the requests of all pods on it are
    within its allocatable, read back from the API. Returns the sums, by node."""
    sums = {}
    for node_name in sorted({str(dig(p, "spec", "nodeName")) for p in k.select("pods") if dig(p, "spec", "nodeName")}):
        node = nodes(plane)[node_name]
        allocatable = {r: quantity(v) for r, v in node["status"]["allocatable"].items()}
        asked = requested_on(plane, node_name)
        over = {r: f"{v} > {allocatable.get(r, 0)}" for r, v in asked.items() if v > allocatable.get(r, Decimal(0))}
        assert not over, f"node {node_name}: the pods bound there ask more than it has: {over}"
        sums[node_name] = asked
    return sums


def gpus_on(plane: ControlPlane, node: str) -> Decimal:
    return requested_on(plane, node).get(GPU, Decimal(0))


def unschedulable(k: Kubectl, pod: str) -> str | None:
    """The scheduler's verdict on a Pending pod (PodScheduled False, Unschedulable): its message."""
    obj = k.get("pod", pod)
    for cond in dig(obj, "status", "conditions", default=[]) or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            return str(cond.get("message"))
    return None


# -- the tests ------------------------------------------------------------------------------------


def test_the_scheduler_runs_the_profile_of_the_doc(control_plane: ControlPlane) -> None:
    """docs/sharing.md's block is what kube-scheduler was started with (a second profile, the default
    one as it was), and the MIG nodes look as the device plugin shows them under ``mixed``."""
    config = packing_profile()
    profiles = {p["schedulerName"]: p for p in config["profiles"]}
    assert set(profiles) == {"default-scheduler", SCHEDULER}
    assert set(profiles["default-scheduler"]) == {"schedulerName"}, "the default profile stays as it was"
    (fit,) = [c for c in profiles[SCHEDULER]["pluginConfig"] if c["name"] == "NodeResourcesFit"]
    strategy = fit["args"]["scoringStrategy"]
    assert strategy["type"] == "MostAllocated"
    weights = {r["name"]: r["weight"] for r in strategy["resources"]}
    assert weights == {
        GPU: 10,
        "nvidia.com/mig-1g.10gb": 10,
        "nvidia.com/mig-2g.20gb": 10,
        "nvidia.com/mig-3g.40gb": 10,
        "cpu": 1,
        "memory": 1,
    }
    assert control_plane.scheduler_config is not None
    assert any(
        a == f"--config={control_plane.scheduler_config}" for a in control_plane.components["kube-scheduler"].argv
    )
    written = yaml.safe_load(control_plane.scheduler_config.read_text())
    assert written["profiles"] == config["profiles"]

    all_1g, balanced = (
        nodes(control_plane)[mig_node(control_plane, "all-1g.10gb")],
        nodes(control_plane)[mig_node(control_plane, "all-balanced")],
    )
    for node, mig in ((all_1g, ALL_1G), (balanced, BALANCED)):
        labels, allocatable = node["metadata"]["labels"], node["status"]["allocatable"]
        assert labels["nvidia.com/mig.strategy"] == "mixed"
        assert labels["nvidia.com/gpu.count"] == "8", "gpu.count stays the physical count under mixed"
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
        assert allocatable[GPU] == "0", "every GPU is in MIG mode"
        for profile, count in mig.items():
            assert allocatable[f"nvidia.com/mig-{profile}"] == str(count)
            assert labels[f"nvidia.com/mig-{profile}.count"] == str(count)
            assert labels[f"nvidia.com/mig-{profile}.memory"] == str(CATALOG_MIG_GIB[profile] * 1024)
    for name in whole_gpu_nodes(control_plane):
        assert nodes(control_plane)[name]["status"]["allocatable"][GPU] == "8"


def plain_pod(name: str, scheduler: str) -> dict[str, Any]:
    """A pod asking half a DGX A100 (4 GPUs, 100 CPU, 800Gi), placed by ``scheduler``."""
    half = {GPU: "4", "cpu": "100", "memory": "800Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "restartPolicy": "Never",
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "busybox", "resources": {"requests": half, "limits": half}}],
        },
    }


def bound_to(k: Kubectl, pod: str) -> str:
    return str(
        wait_for(
            f"pod {pod} bound",
            lambda: dig(k.get("pod", pod), "spec", "nodeName"),
            timeout=TIMEOUT,
            interval=0.5,
            diagnose=lambda: str(unschedulable(k, pod)),
        )
    )


def test_the_profile_packs_where_the_default_spreads(control_plane: ControlPlane, namespace: Kubectl) -> None:
    """The same two half-node pods: the default profile puts them on two nodes (LeastAllocated), the
    packing profile on one. So the doc's block, not chance, is what the job tests below rely on."""
    namespace.apply(plain_pod("spread-a", "default-scheduler"))
    first = bound_to(namespace, "spread-a")
    namespace.apply(plain_pod("spread-b", "default-scheduler"))
    assert bound_to(namespace, "spread-b") != first
    namespace.run("delete", "pod", "spread-a", "spread-b", "--wait=true")
    namespace.apply(plain_pod("pack-a", SCHEDULER))
    first = bound_to(namespace, "pack-a")
    namespace.apply(plain_pod("pack-b", SCHEDULER))
    assert bound_to(namespace, "pack-b") == first
    assert_fits(control_plane, namespace)


def two_four_gpu_jobs(k: Kubectl) -> str:
    """Jobs four-a and four-b, 4 GPUs each, packed onto one node: that node."""
    k.apply(job("four-a", f"{A100}.4.norm"))
    (shared,) = placed(k, "four-a")
    k.apply(job("four-b", f"{A100}.4.norm"))
    assert placed(k, "four-b") == [shared]
    return shared


def test_two_four_gpu_jobs_share_one_node(control_plane: ControlPlane, operator: Operator, namespace: Kubectl) -> None:
    namespace.apply(job("four-a", f"{A100}.4.norm"))
    (first,) = placed(namespace, "four-a")
    namespace.apply(job("four-b", f"{A100}.4.norm"))
    (second,) = placed(namespace, "four-b")
    assert second == first, "packing: the second 4-GPU job goes to the node the first half fills, not an empty one"
    assert gpus_on(control_plane, first) == 8
    assert_fits(control_plane, namespace)


def test_an_eight_gpu_job_never_lands_beside_them(
    control_plane: ControlPlane, operator: Operator, namespace: Kubectl
) -> None:
    shared = two_four_gpu_jobs(namespace)
    namespace.apply(job("eight-a", WHOLE))
    (whole,) = placed(namespace, "eight-a")
    assert whole != shared
    # With 4 GPUs free on the shared node and one empty node: the next 8-GPU job takes the empty one.
    delete_job(namespace, "four-b")
    namespace.apply(job("eight-b", WHOLE))
    (other,) = placed(namespace, "eight-b")
    assert other not in (shared, whole)
    # Now only the shared node has free GPUs (4): an 8-GPU job waits, the scheduler saying why.
    assert {n: int(gpus_on(control_plane, n)) for n in whole_gpu_nodes(control_plane)} == {
        shared: 4,
        whole: 8,
        other: 8,
    }
    namespace.apply(job("eight-c", WHOLE))
    message = wait_for(
        "eight-c's worker Unschedulable",
        lambda: unschedulable(namespace, "eight-c-worker-0"),
        timeout=TIMEOUT,
        interval=0.5,
    )
    assert f"Insufficient {GPU}" in message, message
    assert not dig(namespace.get("pod", "eight-c-worker-0"), "spec", "nodeName")
    assert gpus_on(control_plane, shared) == 4
    assert_fits(control_plane, namespace)


def test_a_one_gpu_job_packs_onto_a_partly_used_node(
    control_plane: ControlPlane, operator: Operator, namespace: Kubectl
) -> None:
    shared = two_four_gpu_jobs(namespace)
    delete_job(namespace, "four-a")
    empty = [n for n in whole_gpu_nodes(control_plane) if n != shared and not bound_pods(control_plane, n)]
    assert len(empty) == 2, "two empty whole-GPU nodes the default (spreading) scoring would prefer"
    namespace.apply(job("one", f"{A100}.1.norm"))
    assert placed(namespace, "one") == [shared], f"packing: onto the partly used {shared}, not an empty {empty}"
    assert gpus_on(control_plane, shared) == 5
    assert_fits(control_plane, namespace)


def test_a_two_worker_four_gpu_job_spreads_its_workers(
    control_plane: ControlPlane, operator: Operator, namespace: Kubectl
) -> None:
    namespace.apply(job("pair", f"{A100}.4.norm", workers=2))
    first, second = placed(namespace, "pair", workers=2)
    assert first != second, "one worker of a job per node, though packing alone would put both on one node"
    for pod in worker_pods(namespace, "pair"):
        (spread,) = dig(pod, "spec", "topologySpreadConstraints")
        assert spread["topologyKey"] == "kubernetes.io/hostname"
        assert spread["whenUnsatisfiable"] == "DoNotSchedule"
    assert_fits(control_plane, namespace)


def test_mig_slices_land_only_on_sliced_nodes_and_whole_gpus_never_there(
    control_plane: ControlPlane, operator: Operator, namespace: Kubectl
) -> None:
    all_1g, balanced = mig_node(control_plane, "all-1g.10gb"), mig_node(control_plane, "all-balanced")
    namespace.apply(job("slice-1g", f"{A100}.mig-1g.10gb.norm"))
    (one_g,) = placed(namespace, "slice-1g")
    assert one_g in (all_1g, balanced)
    namespace.apply(job("slice-2g", f"{A100}.mig-2g.20gb.norm"))
    assert placed(namespace, "slice-2g") == [balanced], "only the all-balanced node has 2g.20gb slices"
    for name, resource in (("slice-1g", "nvidia.com/mig-1g.10gb"), ("slice-2g", "nvidia.com/mig-2g.20gb")):
        (pod,) = worker_pods(namespace, name)
        limits = dig(pod, "spec", "containers", 0, "resources", "limits")
        assert limits[resource] == "1", limits
        assert GPU not in limits, limits
    # Whole GPUs: the sliced nodes are of the same product and report gpu.count 8, and they carry the
    # CPU and memory the slices asked (MostAllocated's favourites); only their nvidia.com/gpu: 0 keeps
    # these off them.
    namespace.apply(job("whole-1", f"{A100}.1.norm"))
    (w1,) = placed(namespace, "whole-1")
    namespace.apply(job("whole-4", f"{A100}.4.norm"))
    (w4,) = placed(namespace, "whole-4")
    assert {w1, w4} <= set(whole_gpu_nodes(control_plane)), (w1, w4)
    assert all_1g not in (w1, w4)
    for node in (all_1g, balanced):
        assert gpus_on(control_plane, node) == 0
    assert_fits(control_plane, namespace)


def test_no_node_is_asked_for_more_than_it_has(
    control_plane: ControlPlane, operator: Operator, namespace: Kubectl
) -> None:
    """A mixed load that fills a node's GPUs exactly and cuts into the MIG nodes; every node a worker is
    bound to has at least the sum of what its pods ask (read back from the API)."""
    for name, instance in (
        ("four", f"{A100}.4.norm"),
        ("two", f"{A100}.2.norm"),
        ("one-a", f"{A100}.1.norm"),
        ("one-b", f"{A100}.1.norm"),
        ("eight", WHOLE),
        ("slice-1g-a", f"{A100}.mig-1g.10gb.norm"),
        ("slice-1g-b", f"{A100}.mig-1g.10gb.norm"),
        ("slice-2g", f"{A100}.mig-2g.20gb.norm"),
        ("slice-3g", f"{A100}.mig-3g.40gb.norm"),
    ):
        namespace.apply(job(name, instance))
        placed(namespace, name)
    sums = assert_fits(control_plane, namespace)
    full = [n for n, asked in sums.items() if asked.get(GPU) == 8]
    assert len(full) == 2, f"the 4+2+1+1 node and the 8-GPU one, each at its 8 GPUs: {sums}"
    assert sum(v for asked in sums.values() for r, v in asked.items() if r.startswith("nvidia.com/mig-")) == 4


def test_workers_are_placed_by_the_packing_profile(
    control_plane: ControlPlane, operator: Operator, namespace: Kubectl
) -> None:
    """spec.schedulerName names the profile, and the profile is what bound them: the Scheduled event's
    reporting component is the profile's name (kube-scheduler records events per profile)."""
    namespace.apply(job("pair", f"{A100}.2.norm", workers=2))
    placed(namespace, "pair", workers=2)
    for pod in worker_pods(namespace, "pair"):
        assert dig(pod, "spec", "schedulerName") == SCHEDULER
        name = str(dig(pod, "metadata", "name"))
        scheduled = wait_for(
            f"the Scheduled event of {name}",
            lambda name=name: [e for e in namespace.events_for("Pod", name) if e.get("reason") == "Scheduled"],  # type: ignore[misc]
            timeout=TIMEOUT,
            interval=0.5,
        )
        assert {e.get("reportingComponent") for e in scheduled} == {SCHEDULER}, scheduled
