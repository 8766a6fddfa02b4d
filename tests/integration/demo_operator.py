"""A tiny kopf operator used only by the emulator's own tests (test_emulator.py).

It does, against the API, what a real operator does: kopf's finalizer and progress annotations, a child pod
with an owner reference (kopf.adopt), status patches through the /status subresource, an event, a timer, and
pod events folded back into the owner's status. Its handlers live in their own registry, so that importing
it never adds handlers to an operator that uses kopf's default registry in the same test session.
"""

from __future__ import annotations

import os
from typing import Any

import kopf
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

registry = kopf.OperatorRegistry()

GROUP, VERSION, JOBS = "kubedgx.io", "v1alpha1", "dgxtrainingjobs"
JOB_LABEL = "kubedgx.io/job"
#: Pod phase -> job phase (both enums happen to share these names).
PHASES = {"Pending": "Pending", "Running": "Running", "Succeeded": "Succeeded", "Failed": "Failed"}


def worker_name(job: str) -> str:
    return f"{job}-worker-0"


@kopf.on.login(registry=registry)
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """Log in with the kubeconfig KUBECONFIG points at (kopf's implicit fallbacks read it at import time)."""
    return kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup(registry=registry)
async def open_client(memo: kopf.Memo, **_: Any) -> None:
    """One API client for the handlers' own requests, from the same kubeconfig."""
    configuration = client.Configuration()
    await config.load_kube_config(config_file=os.environ["KUBECONFIG"], client_configuration=configuration)
    memo.api = client.ApiClient(configuration)


@kopf.on.cleanup(registry=registry)
async def close_client(memo: kopf.Memo, **_: Any) -> None:
    await memo.api.close()


@kopf.on.create(GROUP, VERSION, JOBS, backoff=0.2, registry=registry)
async def create_worker(
    body: kopf.Body, name: str, namespace: str | None, memo: kopf.Memo, patch: kopf.Patch, **_: Any
) -> None:
    """One worker pod owned by the job; a 409 means it exists already (a retried handler)."""
    assert namespace is not None  # jobs are namespaced
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": worker_name(name), "labels": {JOB_LABEL: name}},
        "spec": {"containers": [{"name": "trainer", "image": "busybox"}], "restartPolicy": "Never"},
    }
    kopf.adopt(pod, owner=body)
    try:
        await client.CoreV1Api(memo.api).create_namespaced_pod(namespace, pod)  # type: ignore[arg-type]
    except ApiException as exc:
        if exc.status != 409:
            raise
    patch.status["phase"] = "Pending"
    kopf.info(body, reason="WorkerCreated", message=f"created pod {worker_name(name)}")


@kopf.on.event("v1", "pods", labels={JOB_LABEL: kopf.PRESENT}, registry=registry)
async def follow_worker(
    event: kopf.RawEvent, body: kopf.Body, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    """Copy the worker's phase into its job's status (the job may be gone already: a 404 is fine)."""
    phase = PHASES.get(body.get("status", {}).get("phase", ""))
    if event["type"] == "DELETED" or phase is None:
        return
    job = body["metadata"]["labels"][JOB_LABEL]
    try:
        # Without _content_type the client sends this dict as a JSON patch, which the API server refuses (400).
        await client.CustomObjectsApi(memo.api).patch_namespaced_custom_object_status(  # type: ignore[call-arg]
            GROUP,
            VERSION,
            str(namespace),
            JOBS,
            job,
            {"status": {"phase": phase}},
            _content_type="application/merge-patch+json",
        )
    except ApiException as exc:
        if exc.status != 404:
            raise


@kopf.timer(GROUP, VERSION, JOBS, interval=0.2, registry=registry)
def observe_generation(meta: kopf.Meta, status: kopf.Status, patch: kopf.Patch, **_: Any) -> None:
    """Level-triggered: status.observedGeneration follows metadata.generation."""
    if status.get("observedGeneration") != meta.get("generation"):
        patch.status["observedGeneration"] = meta.get("generation")


@kopf.on.delete(GROUP, VERSION, JOBS, registry=registry)
def release_job(name: str, logger: kopf.Logger, **_: Any) -> None:
    """Nothing to clean up: the pod goes with its owner. Having the handler makes kopf hold a finalizer."""
    logger.info(f"job {name} released; its pod follows through its ownerReference")
