"""The built-in QLoRA task under Flyte's real propeller: its adapter's URI reaches the next task.

No trainer can run here, so no operator runs in this module: the test plays the operator by
writing the DGXTrainingJob's status (Running, then Succeeded with the archived adapter in
``status.artifacts``), as tests/cluster/test_flyte_grpc.py does. Everything else is real: propeller
v1.16.8, the connector over gRPC, the blob store, and the plain task that reads the URI in its pod.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

pytest.importorskip("grpc", reason="flytekit[connector] is not installed")
pytest.importorskip("grpc_health.v1.health_pb2_grpc", reason="flytekit[connector] is not installed")
pytest.importorskip("flytekitplugins.dgx", reason="flytekitplugins-dgx is not installed (pip install -e ./flyte)")

from tests.chart.conftest import Rendered
from tests.cluster.controlplane import ControlPlane
from tests.cluster.flyte_propeller import FlyteBackend, flyte_backend
from tests.cluster.flyte_workflows import submit
from tests.cluster.operator import install
from tests.cluster.test_flyte_propeller import (
    execution_id,
    jobs_of,
    kubelet,
    literal_at,
    pw,
    wait_phase,
)
from tests.e2e.kubectl import JOBS, Kubectl, wait_for
from tests.s3 import S3


@pytest.fixture(scope="module")
def crds(control_plane: ControlPlane, kubectl: Kubectl) -> list[Rendered]:
    """The chart's objects but no operator: the test writes every job status."""
    control_plane.slot.release()  # an earlier module's operator would reconcile these jobs
    return install(kubectl)


@pytest.fixture(scope="module")
def flyte(
    control_plane: ControlPlane,
    kubectl: Kubectl,
    s3: S3,
    crds: list[Rendered],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[FlyteBackend]:
    with flyte_backend(control_plane, kubectl, s3, tmp_path_factory.mktemp("flyte")) as backend:
        yield backend


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_status(k: Kubectl, name: str, status: dict[str, object]) -> None:
    k.run("patch", JOBS, name, "--subresource=status", "--type=merge", "-p", json.dumps({"status": status}))


def test_the_qlora_task_hands_the_adapter_uri_to_the_next_task(
    flyte: FlyteBackend, namespace: Kubectl, tmp_path: Path
) -> None:
    ex = execution_id()
    with kubelet(namespace, flyte, tmp_path) as k:
        submit(flyte.kubectl_flyte, namespace, tmp_path, pw.fine_tune, ex)
        job = wait_for("the QLoRA job", lambda: (jobs_of(namespace, ex) or [None])[0], timeout=120, interval=1,
                       diagnose=flyte.diagnose)  # fmt: skip
        name = job["metadata"]["name"]
        assert job["spec"]["trainer"]["lora"] == {"r": 16, "alpha": 32}
        set_status(namespace, name, {"phase": "Running", "startTime": now(), "nodes": "1/1"})
        uri = f"s3://kubedgx-test/adapters/final/{name}/adapter/"
        set_status(namespace, name, {
            "phase": "Succeeded", "completionTime": now(),
            "conditions": [{"type": "Succeeded", "status": "True", "reason": "Completed", "message": "trained",
                            "lastTransitionTime": now()}],
            "artifacts": [{"name": "adapter", "uri": uri, "mount": "outputs"}],
        })  # fmt: skip
        assert wait_phase(namespace, flyte, ex, "Success", "Failed") == "Success", k.logs_text()
    assert flyte.admin.stored_task("n0", execution=ex).phase == "SUCCEEDED", flyte.admin.dump()
    node = flyte.admin.stored_node("n1", execution=ex)
    assert node.output_uri, flyte.admin.dump()
    assert literal_at(flyte, node.output_uri).literals["o0"].scalar.primitive.string_value == f"got {uri}"
