"""A Flyte workflow's DGX task queued by Kueue, as Flyte's real propeller shows it.

The FlyteWorkflow carries Kueue's queue label; propeller hands the workflow's labels to the
connector, which puts them on the DGXTrainingJob; Kueue (its real manager) holds the job's Workload
for lack of quota, the operator keeps the job Suspended with Kueue's words, and Flyte stores
WAITING_FOR_RESOURCES with them. A module of its own: Kueue's manager and propeller run for it
alone (tests/cluster/test_flyte_propeller.py runs without Kueue).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc", reason="flytekit[connector] is not installed")
pytest.importorskip("grpc_health.v1.health_pb2_grpc", reason="flytekit[connector] is not installed")
pytest.importorskip("flytekitplugins.dgx", reason="flytekitplugins-dgx is not installed (pip install -e ./flyte)")

from tests.cluster.flyte_propeller import FLYTEWORKFLOWS, FlyteBackend, strip_finalizers
from tests.cluster.flyte_workflows import submit
from tests.cluster.kueue_helpers import QUEUE, condition_true_of
from tests.cluster.operator import Operator
from tests.cluster.test_flyte_propeller import execution_id, jobs_of, pw, stored_phase_is
from tests.e2e.kubectl import Kubectl, dig, wait_for

SUFFIX = secrets.token_hex(3)
FLAVOR = f"flyte-any-{SUFFIX}"
KUEUE = "kueue.x-k8s.io/v1beta2"


@pytest.fixture(scope="module")
def operator(kueue: Any, operator: Operator) -> Operator:
    """conftest's operator, started once Kueue's API is served (it discovers the Workload version)."""
    return operator


@pytest.fixture
def no_gpu_queue(kubectl: Kubectl, namespace: Kubectl) -> Iterator[str]:
    """A LocalQueue whose ClusterQueue has no GPU quota: every GPU job waits in it."""
    name = f"no-gpus-{SUFFIX}"
    kubectl.apply(
        {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}, "spec": {}},
        {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": {
            "namespaceSelector": {},
            "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [{
                "name": FLAVOR, "resources": [{"name": "cpu", "nominalQuota": "1000"},
                                              {"name": "memory", "nominalQuota": "100Ti"},
                                              {"name": "nvidia.com/gpu", "nominalQuota": "0"}]}]}]}},
    )  # fmt: skip
    namespace.apply({"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": name},
                     "spec": {"clusterQueue": name}})  # fmt: skip
    wait_for(f"LocalQueue {name} active", lambda: condition_true_of(namespace.get("localqueue", name), "Active"),
             timeout=90, interval=0.5)  # fmt: skip
    yield name
    strip_finalizers(namespace)
    kubectl.run("delete", "clusterqueue", name, "--ignore-not-found", "--wait=false")
    kubectl.run("delete", "resourceflavor", FLAVOR, "--ignore-not-found", "--wait=false")


def test_a_job_queued_by_kueue_is_waiting_for_resources(
    flyte: FlyteBackend, namespace: Kubectl, no_gpu_queue: str, tmp_path: Path
) -> None:
    ex = execution_id()
    submit(flyte.kubectl_flyte, namespace, tmp_path, pw.runs_forever, ex, labels={QUEUE: no_gpu_queue})
    stored = stored_phase_is(flyte, ex, "n0", "WAITING_FOR_RESOURCES")
    (job,) = jobs_of(namespace, ex)
    assert dig(job, "metadata", "labels", QUEUE) == no_gpu_queue, "the workflow's label reached the job"
    assert dig(job, "status", "phase") == "Suspended"
    assert stored.reasons, flyte.admin.dump()
    assert stored.reasons[-1].startswith("queued by Kueue: "), flyte.admin.dump()
    namespace.run("delete", FLYTEWORKFLOWS, ex, "--wait=false")
    wait_for("the job to go", lambda: not jobs_of(namespace, ex), timeout=120, interval=1, diagnose=flyte.diagnose)
    assert flyte.admin.stored_task("n0", execution=ex).phase == "ABORTED", flyte.admin.dump()
