"""Deterministic names and labels of a job's children.

Names never come from generateName: the operator must be able to tell, after a crash, whether
worker 3 exists, by its name alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping

LABEL_PREFIX = "kubedgx.io"
#: Held on every job until none of its workers runs (the operator manages it, not kopf).
FINALIZER = f"{LABEL_PREFIX}/finalizer"
JOB_LABEL = f"{LABEL_PREFIX}/job-name"
INDEX_LABEL = f"{LABEL_PREFIX}/replica-index"
ATTEMPT_LABEL = f"{LABEL_PREFIX}/attempt"
#: The trainer ConfigMap a worker mounts (its name is keyed by content, see config_map_name).
CONFIG_LABEL = f"{LABEL_PREFIX}/trainer-config"
#: The JOB_LABEL value of a worker the job let go of (a pod stuck Terminating on a lost node): no
#: longer selected by the job's Service (so its hostname resolves to the replacement only) nor by the
#: placement terms of the job's pods, yet still seen by the operator's watch. Job names are DNS-1035
#: labels of at most 50 characters, so "<job>.detached" is never another job's name and fits 63.
DETACHED_SUFFIX = ".detached"
#: The instance type a worker was made for.
INSTANCE_ANNOTATION = f"{LABEL_PREFIX}/instance"
#: The capacity pool a worker runs in, which its GPU-seconds are priced at (reconcile.usage).
CAPACITY_ANNOTATION = f"{LABEL_PREFIX}/capacity"
COMPONENT_LABEL = "app.kubernetes.io/component"
#: Labels copied from the job to its pods, so Kueue and similar admission systems see them.
PROPAGATED_LABEL_PREFIXES = ("kueue.x-k8s.io/",)

CONTAINER_NAME = "trainer"
#: The device plugin's resource a worker's GPUs are (limits only, as for every extended resource).
GPU_RESOURCE = "nvidia.com/gpu"
CONFIG_FILE = "trainer.yaml"


def worker_name(job: str, index: int) -> str:
    return f"{job}-worker-{index}"


def detached_value(job: str) -> str:
    return f"{job}{DETACHED_SUFFIX}"


def replacement_name(job: str, index: int, taken: Collection[str], attempt: int) -> str:
    """The name of a new worker ``index``: <job>-worker-<i> when that name is free, else (a stuck
    pod still holds it) <job>-worker-<i>-<attempt>, counting up past names also taken. Its hostname
    stays <job>-worker-<i>, so rendezvous addresses do not move."""
    base = worker_name(job, index)
    if base not in taken:
        return base
    n = attempt
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


def service_name(job: str) -> str:
    return job


def config_map_name(job: str, digest: str) -> str:
    """<job>-trainer-<digest>: keyed by the job's uid and the config's content, so an edit (while
    suspended) gets a new ConfigMap that only the new workers mount, and a same-named job never
    mounts what a deleted one left behind (garbage collection may take a while)."""
    return f"{job}-trainer-{digest}"


#: What config_map_name was before it was keyed by content (ConfigMaps of jobs started then).
def legacy_config_map_name(job: str) -> str:
    return f"{job}-trainer"


def config_digest(uid: str, text: str) -> str:
    return hashlib.sha256(f"{uid}\n{text}".encode()).hexdigest()[:10]


def job_selector(job: str) -> dict[str, str]:
    """Selects every pod of the job, of any attempt."""
    return {JOB_LABEL: job}


def common_labels(job: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "kubedgx",
        "app.kubernetes.io/managed-by": "kubedgx",
        COMPONENT_LABEL: component,
        JOB_LABEL: job,
    }


def propagated_labels(job_labels: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in job_labels.items() if k.startswith(PROPAGATED_LABEL_PREFIXES)}


def worker_labels(job: str, index: int, attempt: int, job_labels: Mapping[str, str]) -> dict[str, str]:
    return {
        **propagated_labels(job_labels),
        **common_labels(job, "worker"),
        INDEX_LABEL: str(index),
        ATTEMPT_LABEL: str(attempt),
    }
