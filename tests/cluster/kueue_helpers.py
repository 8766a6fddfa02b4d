"""What the Kueue tests read off the cluster (test_kueue.py, test_kueue_examples.py): Kueue's labels, a
job's Workloads and their admission, the H100 norm nodes and a pod's node."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tests.e2e.kubectl import Kubectl, condition, dig

WORKLOADS = "workloads.kueue.x-k8s.io"
CAPACITY = "kubedgx.io/capacity"
QUEUE = "kueue.x-k8s.io/queue-name"
PRIORITY = "kueue.x-k8s.io/priority-class"


def h100_norm_nodes(kubectl: Kubectl) -> list[dict[str, Any]]:
    return [
        n
        for n in kubectl.select("nodes")
        if n["metadata"]["name"].startswith("dgxh100-80g-8-norm-") and "lossy" not in n["metadata"]["name"]
    ]


def condition_true_of(obj: Mapping[str, Any] | None, type_: str) -> bool:
    cond = condition(obj or {}, type_)
    return cond is not None and cond.get("status") == "True"


def workloads_of(k: Kubectl, job: str) -> list[dict[str, Any]]:
    body = k.get("dgxtrainingjob", job)
    uid = dig(body, "metadata", "uid")
    return [
        w
        for w in k.select(WORKLOADS)
        if any(o.get("uid") == uid and o.get("controller") for o in w["metadata"].get("ownerReferences") or [])
    ]


def assignment(workload: Mapping[str, Any]) -> dict[str, Any]:
    (podset,) = dig(workload, "status", "admission", "podSetAssignments")
    return dict(podset)


def node_of(k: Kubectl, pod: Mapping[str, Any]) -> dict[str, Any]:
    node = k.get("node", str(dig(pod, "spec", "nodeName")))
    assert node is not None
    return node
