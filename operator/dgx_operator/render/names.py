"""Deterministic names and labels of a job's children.

Names never come from generateName: the operator must be able to tell, after a crash, whether
worker 3 exists, by its name alone.
"""

from __future__ import annotations

from collections.abc import Mapping

LABEL_PREFIX = "kubedgx.io"
#: Held on every job until none of its workers runs (the operator manages it, not kopf).
FINALIZER = f"{LABEL_PREFIX}/finalizer"
JOB_LABEL = f"{LABEL_PREFIX}/job-name"
INDEX_LABEL = f"{LABEL_PREFIX}/replica-index"
ATTEMPT_LABEL = f"{LABEL_PREFIX}/attempt"
COMPONENT_LABEL = "app.kubernetes.io/component"
#: Labels copied from the job to its pods, so Kueue and similar admission systems see them.
PROPAGATED_LABEL_PREFIXES = ("kueue.x-k8s.io/",)

CONTAINER_NAME = "trainer"
CONFIG_FILE = "trainer.yaml"


def worker_name(job: str, index: int) -> str:
    return f"{job}-worker-{index}"


def service_name(job: str) -> str:
    return job


def config_map_name(job: str) -> str:
    return f"{job}-trainer"


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
