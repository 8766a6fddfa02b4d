"""The control plane itself: that each part the kubedgx tests rely on is really there and behaves as
Kubernetes does — the stamped version, the fake DGX nodes from the catalog, the scheduler's resource
fit and taints, RBAC, PodSecurity admission, garbage collection, and every pod and node fate the
kwok stages play (exit codes, eviction, NotReady, an unreachable node)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dgx_operator.catalog import Catalog
from tests.cluster.controlplane import (
    DEFAULT_POOLS,
    EVICT_LABEL,
    EXIT_CODE_LABEL,
    LOSSY_LABEL,
    LOSSY_TAINT,
    MESSAGE_ANNOTATION,
    NODE_NOT_READY_LABEL,
    ControlPlane,
)
from tests.e2e.fakegpu import GPU_RESOURCE
from tests.e2e.kubectl import Kubectl, KubectlError, dig, wait_for

H100 = Catalog.load().get("dgxh100.80g.8.norm")
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def pod(
    name: str,
    *,
    gpus: int = 0,
    node_selector: dict[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if gpus:
        container["resources"] = {"limits": {GPU_RESOURCE: str(gpus)}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": node_selector or {H100.labels.product: H100.products[0]},
            "tolerations": [GPU_TOLERATION, *(tolerations or [])],
            "containers": [container],
        },
    }


def phase(k: Kubectl, name: str) -> str | None:
    obj = k.get("pod", name)
    return None if obj is None else str(dig(obj, "status", "phase"))


def running(k: Kubectl, name: str, timeout: float = 30) -> dict[str, Any]:
    return wait_for(f"pod {name} Running", lambda: (o := k.get("pod", name)) and dig(o, "status", "phase") == "Running"
                    and o, timeout=timeout, interval=0.3)  # fmt: skip


def test_the_apiserver_reports_the_version_it_was_built_as(control_plane: ControlPlane, kubectl: Kubectl) -> None:
    version = control_plane.get("/version")
    assert version["gitVersion"] == control_plane.bin.kubernetes_version
    assert (version["major"], version["minor"]) == ("1", control_plane.bin.kubernetes_version.split(".")[1])
    client = json.loads(kubectl.run("version", "-o", "json").stdout)
    assert client["serverVersion"]["gitVersion"] == control_plane.bin.kubernetes_version
    assert client["clientVersion"]["gitVersion"] == control_plane.bin.kubernetes_version


def test_the_fake_nodes_pass_for_their_catalog_instance_types(kubectl: Kubectl) -> None:
    nodes = kubectl.select("nodes")
    assert len(nodes) == sum(p.count for p in DEFAULT_POOLS)
    catalog = Catalog.load()
    for pool in DEFAULT_POOLS:
        inst = catalog.get(pool.instance)
        mine = [
            n
            for n in nodes
            if dig(n, "metadata", "labels", inst.labels.product) in inst.products
            and all(dig(n, "metadata", "labels", k) == v for k, v in inst.node_selector.items())
            and (dig(n, "metadata", "labels", inst.labels.clique) == pool.clique if pool.clique else True)
            and (dig(n, "metadata", "labels", LOSSY_LABEL) == "true") == pool.lossy
        ]
        assert len(mine) >= pool.count, pool
        for node in mine:
            assert dig(node, "status", "allocatable", GPU_RESOURCE) == str(inst.gpus)
            ready = [c for c in dig(node, "status", "conditions", default=[]) if c["type"] == "Ready"]
            assert [c["status"] for c in ready] == ["True"], node["metadata"]["name"]
            taints = {(t["key"], t["effect"]) for t in dig(node, "spec", "taints", default=[])}
            assert ("nvidia.com/gpu", "NoSchedule") in taints
            assert ((LOSSY_TAINT["key"], "NoSchedule") in taints) == pool.lossy


def test_the_scheduler_fits_gpus_and_leaves_the_rest_pending(namespace: Kubectl) -> None:
    """Four H100 nodes of 8 GPUs (the lossy fifth is tainted): four 8-GPU pods fit one per node,
    a fifth stays Pending with the scheduler's reason."""
    names = [f"gpu-{i}" for i in range(5)]
    namespace.apply(*(pod(n, gpus=8) for n in names))
    placed = [dig(running(namespace, n), "spec", "nodeName") for n in names[:4]]
    assert len(set(placed)) == 4

    def unschedulable() -> str | None:  # fmt: skip
        obj = namespace.get("pod", names[4])
        cond = [c for c in dig(obj, "status", "conditions", default=[]) if c["type"] == "PodScheduled"]
        return cond[0].get("message") if cond and cond[0].get("reason") == "Unschedulable" else None

    message = wait_for("the fifth pod to be Unschedulable", unschedulable, timeout=30, interval=0.3)
    assert f"Insufficient {GPU_RESOURCE}" in message
    assert "untolerated taint" in message  # spot, debug, lossy and A100/GB200 pools refuse it too


def test_kwok_plays_exit_codes_and_the_termination_message(namespace: Kubectl) -> None:
    namespace.apply(pod("ok"), pod("crash"))
    for name, code, message in (("ok", "0", '{"status":"Succeeded"}'), ("crash", "3", "boom")):
        running(namespace, name)
        namespace.run("annotate", "pod", name, f"{MESSAGE_ANNOTATION}={message}")
        namespace.run("label", "pod", name, f"{EXIT_CODE_LABEL}={code}")
    wait_for("both pods to end", lambda: {phase(namespace, "ok"), phase(namespace, "crash")} == {"Succeeded", "Failed"},
             timeout=30, interval=0.3)  # fmt: skip
    crashed = dig(namespace.get("pod", "crash"), "status", "containerStatuses", 0, "state", "terminated")
    assert crashed["exitCode"] == 3
    assert crashed["message"] == "boom"
    done = dig(namespace.get("pod", "ok"), "status", "containerStatuses", 0, "state", "terminated")
    assert (done["exitCode"], done["message"]) == (0, '{"status":"Succeeded"}')


def test_kwok_plays_an_eviction_with_a_disruption_target(namespace: Kubectl) -> None:
    namespace.apply(pod("victim"))
    running(namespace, "victim")
    namespace.run("label", "pod", "victim", f"{EVICT_LABEL}=true")
    wait_for("the pod to be evicted", lambda: phase(namespace, "victim") == "Failed", timeout=30, interval=0.3)
    status = dig(namespace.get("pod", "victim"), "status")
    assert status["reason"] == "Evicted"
    (target,) = [c for c in status["conditions"] if c["type"] == "DisruptionTarget"]
    assert target["status"] == "True"


def _taints(k: Kubectl, node: str) -> set[tuple[str, str]]:
    return {(t["key"], t["effect"]) for t in dig(k.get("node", node), "spec", "taints", default=[]) or []}


def test_a_not_ready_node_is_tainted_and_its_pods_are_evicted(
    control_plane: ControlPlane, kubectl: Kubectl, namespace: Kubectl
) -> None:
    """kwok reports the node NotReady; the node lifecycle controller taints it NoExecute and, past
    the pods' default toleration, the taint manager deletes them; the kubelet (kwok) confirms."""
    node = "dgxa100-80g-8-norm-1"
    a100 = Catalog.load().get("dgxa100.80g.8.norm")
    namespace.apply(pod("on-a100", node_selector={"kubernetes.io/hostname": node}))
    assert dig(running(namespace, "on-a100"), "spec", "nodeName") == node
    kubectl.run("label", "node", node, f"{NODE_NOT_READY_LABEL}=true")
    try:
        wait_for("the not-ready NoExecute taint", lambda: ("node.kubernetes.io/not-ready", "NoExecute")
                 in _taints(kubectl, node), timeout=60, interval=0.5)  # fmt: skip
        wait_for("the pod to be evicted and gone", lambda: namespace.get("pod", "on-a100") is None, timeout=60,
                 interval=0.5)  # fmt: skip
    finally:
        kubectl.run("label", "node", node, f"{NODE_NOT_READY_LABEL}-")
    assert a100.labels.product in dig(kubectl.get("node", node), "metadata", "labels")


def test_an_unreachable_node_leaves_its_pods_terminating_until_it_returns(
    control_plane: ControlPlane, kubectl: Kubectl, namespace: Kubectl
) -> None:
    (node,) = control_plane.lossy_nodes()
    tolerate = [{"key": LOSSY_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]
    namespace.apply(pod("stranded", node_selector={"kubernetes.io/hostname": node}, tolerations=tolerate))
    running(namespace, "stranded")
    control_plane.lose_lossy_nodes()
    try:
        wait_for("the node to go Unknown", lambda: (c := [x for x in dig(kubectl.get("node", node), "status",
                 "conditions", default=[]) if x["type"] == "Ready"]) and c[0]["status"] == "Unknown",
                 timeout=60, interval=0.5)  # fmt: skip
        wait_for("the unreachable NoExecute taint", lambda: ("node.kubernetes.io/unreachable", "NoExecute")
                 in _taints(kubectl, node), timeout=60, interval=0.5)  # fmt: skip
        stuck = wait_for("the pod to be marked for deletion", lambda: (o := namespace.get("pod", "stranded"))
                         and dig(o, "metadata", "deletionTimestamp") and o, timeout=60, interval=0.5)  # fmt: skip
        assert dig(stuck, "status", "phase") == "Running"  # nobody confirms: it stays Terminating
    finally:
        control_plane.recover_lossy_nodes()
    wait_for("the pod to be gone once the node is back", lambda: namespace.get("pod", "stranded") is None,
             timeout=60, interval=0.5)  # fmt: skip


def test_rbac_refuses_a_service_account_without_roles(namespace: Kubectl) -> None:
    namespace.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "nobody"}})
    who = f"system:serviceaccount:{namespace.namespace}:nobody"
    answer = namespace.run("auth", "can-i", "create", "pods", "--as", who, check=False)
    assert answer.stdout.strip() == "no"
    with pytest.raises(KubectlError, match=r"(?i)forbidden"):
        namespace.run("get", "pods", "--as", who)


def test_pod_security_admission_refuses_a_privileged_pod(kubectl: Kubectl, namespace: Kubectl) -> None:
    kubectl.run("label", "namespace", str(namespace.namespace), "pod-security.kubernetes.io/enforce=restricted")
    privileged = pod("root")
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(KubectlError, match="violates PodSecurity"):
        namespace.apply(privileged)


def test_the_garbage_collector_deletes_what_an_owner_leaves(namespace: Kubectl) -> None:
    namespace.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}})
    uid = dig(namespace.get("configmap", "owner"), "metadata", "uid")
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid, "controller": True}
    namespace.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "child", "ownerReferences": [ref]}})
    namespace.delete("configmap", "owner")
    wait_for("the child to be collected", lambda: namespace.get("configmap", "child") is None, timeout=60, interval=0.5)
