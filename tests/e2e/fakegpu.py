"""What a kind node must look like to pass for a GPU node of one catalog instance type.

One source for run.sh (which labels, taints and patches the nodes) and for the tests (which find
those nodes and check, without a cluster, that the pods the operator renders would land on them):

    python -m tests.e2e.fakegpu labels dgxh100.80g.8.norm   # key=value per line
    python -m tests.e2e.fakegpu taints dgxh100.80g.8.norm   # key=value:Effect per line
    python -m tests.e2e.fakegpu gpus   dgxh100.80g.8.norm   # GPUs per node

The labels are the ones GPU Feature Discovery sets (the catalog names the keys); the capacity is
the ``nvidia.com/gpu`` extended resource that NVIDIA's device plugin would advertise. No device
plugin runs, so containers get no GPU: the kubelet admits pods against the advertised number and
the trainer's preflight finds no driver (the quickstart runs with ``allowCpu``).
"""

from __future__ import annotations

import sys
from typing import Any

from dgx_operator.catalog import Catalog, Instance

#: The instance type the e2e nodes pretend to be (run.sh and the tests read the same variable).
DEFAULT_INSTANCE = "dgxh100.80g.8.norm"
GPU_RESOURCE = "nvidia.com/gpu"
#: Marks the nodes run.sh faked, so nobody mistakes them for real GPU nodes.
FAKE_LABEL = "kubedgx.io/e2e-fake-gpu"
ZONE = "e2e-zone-a"
CLIQUE = "e2e-cluster.0"


def instance(name: str = DEFAULT_INSTANCE) -> Instance:
    return Catalog.load().get(name)


def node_labels(inst: Instance) -> dict[str, str]:
    """GFD's labels for this shape, the capacity pool's node selector, one topology zone (and one
    NVLink clique for multi-node NVLink products), so every worker of a job may share them."""
    labels = {
        inst.labels.product: inst.products[0],
        inst.labels.count: str(inst.gpus),
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.memory": str(inst.gpu_memory_gib * 1024),
        inst.topology_key or "topology.kubernetes.io/zone": ZONE,
        FAKE_LABEL: "true",
        **inst.node_selector,
    }
    if inst.multi_node_nvlink:
        labels[inst.labels.clique] = CLIQUE
    return labels


def node_taints(inst: Instance) -> list[dict[str, str]]:
    """The taints of a real GPU pool: nvidia.com/gpu (every GPU node) and the capacity pool's own
    (spot, debug): one per toleration the workers carry, so the workers' tolerations are tested."""
    taints: list[dict[str, str]] = []
    for tol in inst.tolerations:
        key = tol.get("key")
        if not key:
            continue
        taint = {"key": str(key), "value": str(tol.get("value") or "present"), "effect": str(tol.get("effect") or "")}
        if not taint["effect"]:
            taint["effect"] = "NoSchedule"
        if taint not in taints:
            taints.append(taint)
    return taints


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or argv[0] not in ("labels", "taints", "gpus"):
        print("usage: python -m tests.e2e.fakegpu labels|taints|gpus [INSTANCE]", file=sys.stderr)
        return 2
    inst = instance(argv[1] if len(argv) == 2 else DEFAULT_INSTANCE)
    out: list[Any]
    if argv[0] == "labels":
        out = [f"{k}={v}" for k, v in node_labels(inst).items()]
    elif argv[0] == "taints":
        out = [f"{t['key']}={t['value']}:{t['effect']}" for t in node_taints(inst)]
    else:
        out = [inst.gpus]
    for line in out:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
