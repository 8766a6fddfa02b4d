"""Scenario 5: bad manifests are refused at ``kubectl apply`` time, with the field named.

Two layers refuse: the API server itself (the CRD's schema and CEL rules) and kubedgx's validating
webhook (the instance catalog, the data mounts that exist, fields fixed while a job runs). Each
test uses a manifest only its layer can refuse (test_manifests.py checks that without a cluster).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.jobs import (
    RUNNING_TIMEOUT,
    SLEEPER,
    bad_bounds_job,
    command_job,
    phase_is,
    running_with,
    unknown_instance_job,
    wait_job,
)
from tests.e2e.kubectl import JOBS, Kubectl, dig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2 * RUNNING_TIMEOUT + 300)]

#: How the API server words a validating webhook's refusal.
DENIED = "denied the request"


def refused(ns: Kubectl, manifest: dict[str, Any]) -> str:
    """Apply ``manifest``, expect kubectl to fail, return its stderr."""
    proc = ns.apply(manifest, check=False)
    assert proc.returncode != 0, f"kubectl apply accepted a bad manifest:\n{proc.stdout}"
    return proc.stderr


def needs_webhook(cluster: Cluster) -> None:
    assert cluster.webhooks, (
        "no ValidatingWebhookConfiguration has a webhook for kubedgx.io: install the chart with webhook.enabled=true"
    )


def test_api_server_refuses_min_nodes_above_max_nodes(ns: Kubectl) -> None:
    stderr = refused(ns, bad_bounds_job("bad-bounds"))
    assert "spec.elastic.minNodes" in stderr, stderr
    assert "must be <= spec.elastic.maxNodes" in stderr, stderr
    assert ns.get(JOBS, "bad-bounds") is None


def test_webhook_refuses_an_instance_type_the_catalog_lacks(ns: Kubectl, cluster: Cluster) -> None:
    needs_webhook(cluster)
    manifest = unknown_instance_job("bad-instance")
    stderr = refused(ns, manifest)
    assert "admission webhook" in stderr, stderr
    assert DENIED in stderr, stderr
    assert "spec.instance" in stderr, stderr
    assert f"unknown instance type {manifest['spec']['instance']!r}" in stderr, stderr
    assert ns.get(JOBS, "bad-instance") is None


def test_webhook_refuses_changing_the_program_of_a_running_job(ns: Kubectl, cluster: Cluster) -> None:
    needs_webhook(cluster)
    ns.apply(command_job("steady"))
    wait_job(ns, "steady", "Running with 1/1 nodes", running_with(1))

    changed = command_job("steady", script=SLEEPER + " # v2")
    stderr = refused(ns, changed)
    assert DENIED in stderr, stderr
    assert "spec.args" in stderr, stderr
    assert "cannot change while the job is Running" in stderr, stderr
    job = ns.get(JOBS, "steady")
    assert dig(job, "spec", "args") == [SLEEPER], "the refused change must not be stored"

    # As the message says: suspend first, then the change is accepted.
    ns.patch(JOBS, "steady", {"spec": {"suspend": True}})
    wait_job(ns, "steady", "phase Suspended", phase_is("Suspended"))
    changed["spec"]["suspend"] = True
    ns.apply(changed)
    assert dig(ns.get(JOBS, "steady"), "spec", "args") == [SLEEPER + " # v2"]
