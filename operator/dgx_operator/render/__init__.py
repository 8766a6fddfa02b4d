"""Pure builders: a job (+ catalog, defaults, data mounts) -> the child objects the operator
creates, as plain dicts. No API access, no kopf, no kubernetes client, no torch (the import
contract in pyproject.toml enforces it); `kubedgx render` prints exactly their output.
"""

from __future__ import annotations

from typing import Any

from dgx_operator.api.trainingjob import DGXTrainingJob, DGXTrainingJobSpec
from dgx_operator.render.names import (
    CONFIG_FILE,
    INDEX_LABEL,
    common_labels,
    job_selector,
    service_name,
)
from dgx_operator.render.pod import BuildError, owner_reference, trainer_config, worker_pod
from dgx_operator.render.resolved import BuildContext, Defaults, JobIdentity, Resolved, resolve

__all__ = [
    "BuildContext",
    "BuildError",
    "Defaults",
    "JobIdentity",
    "Resolved",
    "build_children",
    "headless_service",
    "resolve",
    "trainer_config",
    "trainer_config_map",
    "worker_pod",
]


def headless_service(job: JobIdentity, r: Resolved, master_port: int) -> dict[str, Any]:
    """DNS for <job>-worker-0.<job>, the rendezvous address; publishes not-ready pods, since
    rendezvous precedes readiness.

    It selects worker 0 only. Every other worker is a pod no Service selects, which the scheduler
    places without spreading it: a pod a Service selects, with no spread constraint of its own, gets
    the scheduler's default spreading over hostnames and zones, and scoring any spread walks the
    cluster's nodes for every pod (0.53 of plain pods' rate at 800 nodes with every worker selected
    and declaring the cheapest spread; docs/benchmarks.md, "Placement cost"). The others need no name
    in DNS: torchrun's agents register under their FQDN (``socket.getfqdn()``, which a pod with a
    hostname and subdomain reads from its own /etc/hosts), rendezvous sorts them by it so worker 0
    is rank 0, and rank 0 publishes its own FQDN, this Service's name, as the address every worker
    connects to (PET_LOCAL_ADDR stays unset: with pod IPs there, the sort is by IP and rank 0 can be
    any worker, whose progress the operator would not read)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(job.name),
            "namespace": job.namespace,
            "labels": common_labels(job.name, "rendezvous"),
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {**job_selector(job.name), INDEX_LABEL: "0"},
            "ports": [
                {"name": "rdzv", "port": r.rdzv_port, "targetPort": r.rdzv_port, "protocol": "TCP"},
                {"name": "master", "port": master_port, "targetPort": master_port, "protocol": "TCP"},
            ],
        },
    }


def trainer_config_map(job: JobIdentity, spec: DGXTrainingJobSpec) -> dict[str, Any] | None:
    """The trainer config with every default spelled out: the trainer runs exactly what the
    operator saw, even if the trainer image's defaults drift. Named by content (see
    config_map_name); the workers mount it by the same name (render.pod.trainer_config)."""
    config = trainer_config(job, spec)
    if config is None:
        return None
    name, _, text = config
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": job.namespace,
            "labels": common_labels(job.name, "trainer-config"),
            "ownerReferences": [owner_reference(job)],
        },
        "data": {CONFIG_FILE: text},
    }


def build_children(
    job: DGXTrainingJob, ctx: BuildContext, *, namespace: str | None = None, uid: str | None = None
) -> list[dict[str, Any]]:
    """Everything created when the job starts, in creation order: config, Service, workers
    0..maxNodes-1 (one in interactive debug mode)."""
    ident = JobIdentity.of(job, namespace, uid)
    r = resolve(job.spec, ctx.catalog)
    children: list[dict[str, Any]] = []
    config = trainer_config_map(ident, job.spec)
    if config is not None:
        children.append(config)
    children.append(headless_service(ident, r, ctx.defaults.master_port))
    workers = 1 if r.interactive else r.max_nodes
    children.extend(worker_pod(ident, job.spec, i, r, ctx) for i in range(workers))
    return children
