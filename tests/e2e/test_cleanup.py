"""Scenario 4: deleting a job takes its children with it (pods, headless Service, trainer
ConfigMap: all controlled by the job through ownerReferences), and the operator releases its
finalizer once no worker runs, so the deletion completes. Deleting a namespace that holds a running
job and a mount completes too (the other tests' teardown deletes their jobs first and does not wait
for the namespace object: tests/e2e/cluster.py's delete_namespace)."""

from __future__ import annotations

import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.jobs import (
    NAMESPACE_TIMEOUT,
    RUNNING_TIMEOUT,
    interactive_trainer_job,
    owned_by,
    running_with,
    trainer_config_of,
    wait_gone,
    wait_job,
    worker_pods,
)
from tests.e2e.kubectl import JOBS, MOUNTS, Kubectl, dig, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(RUNNING_TIMEOUT + 3 * NAMESPACE_TIMEOUT + 120)]

FINALIZER = "kubedgx.io/finalizer"


def test_deleting_a_job_removes_its_children_and_releases_the_finalizer(ns: Kubectl) -> None:
    # A trainer job has every kind of child; in interactive debug mode its one worker idles.
    ns.apply(interactive_trainer_job("doomed"))
    job = wait_job(ns, "doomed", "Running with its idle debug worker", running_with(1))
    assert FINALIZER in (dig(job, "metadata", "finalizers", default=[]) or []), job["metadata"]

    config = trainer_config_of(ns.get("pod", "doomed-worker-0"))
    children = [("pod", "doomed-worker-0"), ("service", "doomed"), ("configmap", config)]
    for kind, name in children:
        child = ns.get(kind, name)
        assert child is not None, f"{kind}/{name} should exist while the job runs"
        assert owned_by(child, job), f"{kind}/{name} is not controlled by the job: {child['metadata']}"
    service = ns.get("service", "doomed")
    assert service is not None
    assert dig(service, "spec", "clusterIP") == "None", service["spec"]  # headless: per-pod DNS for rendezvous
    assert dig(service, "spec", "publishNotReadyAddresses") is True, service["spec"]

    ns.delete(JOBS, "doomed")
    # Gone means every finalizer was released: the operator's only after its worker stopped.
    wait_gone(ns, JOBS, "doomed")
    for kind, name in children:
        wait_gone(ns, kind, name)
    assert not worker_pods(ns, "doomed")


def test_deleting_a_namespace_with_a_running_job_and_a_mount_completes(ns: Kubectl, cluster: Cluster) -> None:
    """The namespace controller deletes the job under its running worker and the mount: the operator
    releases both finalizers, and the namespace goes (a user would otherwise meet it stuck Terminating)."""
    ns.apply(interactive_trainer_job("held"))
    ns.apply({"apiVersion": "kubedgx.io/v1alpha1", "kind": "DGXDataMount", "metadata": {"name": "held-data"},
              "spec": {"source": "s3://bucket/prefix"}})  # fmt: skip
    wait_job(ns, "held", "Running with its idle debug worker", running_with(1))
    wait_for("the operator's finalizer on the mount",
             lambda: dig(ns.get(MOUNTS, "held-data"), "metadata", "finalizers"), timeout=RUNNING_TIMEOUT)  # fmt: skip
    assert ns.namespace is not None
    cluster.kubectl.run("delete", "namespace", ns.namespace, "--wait=false")
    wait_gone(cluster.kubectl, "namespace", ns.namespace)
