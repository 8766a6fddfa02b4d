"""What the real nodes do that kwok does not: run containers. Each test here proves a behaviour of a
real kubelet that the operator relies on and that no fake node shows (kwok writes a pod's container
state and phase at once, never runs a process, never kills one)."""

from __future__ import annotations

import json
from typing import Any

from tests.e2e import fakegpu
from tests.e2e.kubectl import Kubectl, KubectlError
from tests.nodes.cluster import RealNodes
from tests.nodes.images import BUSYBOX
from tests.support.wait import wait_until

NS = "default"
#: A finalizer of the tests' own: holds a deleted pod until the test has read it.
HOLD = "kubedgx.io/test-hold"


def pod(
    name: str,
    script: str,
    *,
    node: str | None = None,
    memory: str = "64Mi",
    grace: int = 30,
    labels: dict[str, str] | None = None,
    subdomain: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": grace,
        "tolerations": [{"operator": "Exists"}],  # the GPU nodes' taints
        "containers": [
            {
                "name": "main",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "resources": {"limits": {"cpu": "100m", "memory": memory}},
            }
        ],
    }
    if node:
        spec["nodeName"] = node
    if subdomain:
        spec["hostname"], spec["subdomain"] = name, subdomain
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def phase_of(k: Kubectl, name: str) -> str | None:
    found = k.get("pod", name)
    return None if found is None else found.get("status", {}).get("phase")


def ended(k: Kubectl, name: str, timeout: float = 120) -> dict[str, Any]:
    """The pod once its phase is Succeeded or Failed."""

    def probe() -> dict[str, Any] | None:
        found = k.get("pod", name)
        return found if found is not None and found["status"].get("phase") in ("Succeeded", "Failed") else None

    return wait_until(
        probe,
        timeout=timeout,
        what=f"pod {name} to end",
        diagnose=lambda: json.dumps((k.get("pod", name) or {}).get("status"), indent=1),
    )


def terminated(p: dict[str, Any]) -> dict[str, Any]:
    (status,) = p["status"]["containerStatuses"]
    return dict(status["state"]["terminated"])


def test_two_nodes_are_ready_with_the_gpu_shape_of_the_fake_dgx_nodes(real_nodes: RealNodes, kubectl: Kubectl) -> None:
    inst = fakegpu.instance(real_nodes.instance)
    for node in real_nodes.nodes:
        found = kubectl.get("node", node.name)
        assert found is not None
        assert found["status"]["allocatable"][fakegpu.GPU_RESOURCE] == str(inst.gpus)
        assert fakegpu.node_labels(inst).items() <= found["metadata"]["labels"].items()
        addresses = {a["type"]: a["address"] for a in found["status"]["addresses"]}
        assert addresses["InternalIP"] == node.network.node_ip(node.index)
        assert found["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")


def test_pods_on_two_nodes_resolve_each_other_by_cluster_dns_and_talk(real_nodes: RealNodes, kubectl: Kubectl) -> None:
    """The path torchrun's rendezvous takes: a headless Service, a pod's per-pod DNS name
    (<hostname>.<subdomain>.<namespace>.svc), and a TCP connection across nodes."""
    k = kubectl.in_namespace(NS)
    first, second = (n.name for n in real_nodes.nodes)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "peers"},
        "spec": {
            "clusterIP": "None",
            "selector": {"app": "peers"},
            "ports": [{"name": "p", "port": 29500}],
            "publishNotReadyAddresses": True,
        },
    }
    k.apply(service)
    k.apply(
        pod("server", "echo hello-from-server | nc -l -p 29500", node=first, labels={"app": "peers"}, subdomain="peers")
    )
    client = (
        "for i in $(seq 60); do "
        "nslookup server.peers.default.svc.cluster.local >/dev/null 2>&1 && break; sleep 1; done; "
        "nslookup kubernetes.default.svc.cluster.local | grep -q 10.96.0.1 || exit 3; "
        "for i in $(seq 30); do nc server.peers.default.svc.cluster.local 29500 && exit 0; sleep 1; done; exit 4"
    )
    k.apply(pod("client", client, node=second, labels={"app": "peers"}, subdomain="peers"))
    done = ended(k, "client")
    assert done["status"]["phase"] == "Succeeded", k.logs("client")
    assert "hello-from-server" in k.logs("client")
    assert ended(k, "server")["spec"]["nodeName"] == first


def test_a_container_over_its_memory_limit_is_oomkilled_with_exit_137(kubectl: Kubectl) -> None:
    k = kubectl.in_namespace(NS)
    # The container's own process (exec) is what the kernel kills: when only a child is, the
    # container ends 0 with reason OOMKilled all the same (a real kubelet's report, seen here).
    # dd allocates and fills its one 100 MiB block before it writes anything.
    k.apply(pod("hog", "exec dd if=/dev/zero of=/dev/null bs=104857600 count=1", memory="32Mi"))
    state = terminated(ended(k, "hog"))
    assert (state["reason"], state["exitCode"]) == ("OOMKilled", 137)


def test_a_deleted_pod_gets_sigterm_and_its_grace_period(kubectl: Kubectl) -> None:
    """What a job's deletion relies on: SIGTERM first, the grace period to finish (an upload in
    flight), the termination message kept until the pod goes."""
    k = kubectl.in_namespace(NS)
    script = (
        "trap 'echo got-term > /dev/termination-log; sleep 2; echo finished >> /dev/termination-log; exit 0' TERM; "
        "echo ready; while true; do sleep 1; done"
    )
    held = pod("graceful", script, grace=20)
    held["metadata"]["finalizers"] = [HOLD]  # the pod stays readable after its containers ended
    k.apply(held)
    try:
        wait_until(lambda: "ready" in k.logs("graceful"), timeout=60, what="the pod to start", retry_on=(KubectlError,))
        k.run("delete", "pod", "graceful", "--wait=false")

        def container_ended() -> dict[str, Any] | None:
            found = k.get("pod", "graceful")
            return found if found is not None and _terminated_now(found) else None

        seen = wait_until(
            container_ended,
            timeout=60,
            what="the container to end",
        )
        state = terminated(seen)
        # exit 0 after the 2 s the trap took: a SIGKILL would have ended it with 137 and no "finished"
        assert (state["exitCode"], state.get("message", "").split()) == (0, ["got-term", "finished"])
    finally:
        k.patch("pod", "graceful", {"metadata": {"finalizers": None}})


def _terminated_now(p: dict[str, Any]) -> bool:
    statuses = p["status"].get("containerStatuses") or []
    return bool(statuses) and "terminated" in statuses[0]["state"]
