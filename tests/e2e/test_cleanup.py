"""Scenario 4: deleting a job takes its children with it (pods, headless Service, trainer
ConfigMap: all controlled by the job through ownerReferences), and the operator releases its
finalizer once no worker runs, so the deletion completes."""

from __future__ import annotations

import pytest

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
from tests.e2e.kubectl import JOBS, Kubectl, dig

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
