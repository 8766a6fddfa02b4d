"""Scenario 1: the quickstart fine-tune, applied to a real cluster, runs to Succeeded on a CPU.

The nodes advertise fake GPUs, so the worker is placed exactly as on a DGX node (all of a node's
GPUs, the GPU product and count labels, the GPU taint tolerated); no device plugin hands it a GPU,
the trainer's preflight finds no driver and, as the quickstart allows, trains on the CPU.

On this machine's own control plane, whose kwok nodes run no containers, the test brings real nodes
(tests/nodes: kubelets, containerd, the trainer image built from Dockerfile.trainer) and skips, with
the reason, only where the machine cannot run them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.jobs import (
    QUICKSTART_STEPS,
    QUICKSTART_TIMEOUT,
    PhaseWatch,
    condition_true,
    phase_is,
    quickstart_job,
    trainer_config_of,
    wait_job,
    worker_pods,
)
from tests.e2e.kubectl import Kubectl, dig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(QUICKSTART_TIMEOUT + 300)]


@pytest.fixture(scope="module")
def cluster(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The session's cluster where its nodes run containers; else one real node of tests/nodes."""
    if cluster.runs_containers:
        yield cluster
        return
    from tests.nodes.fixtures import NodesBrokenError, NodesUnavailableError, trainer_cluster

    try:
        with trainer_cluster(tmp_path_factory.mktemp("rn"), count=1) as found:
            yield found.cluster
    except NodesUnavailableError as exc:
        pytest.skip(
            f"this cluster's nodes run no containers (kwok) and {exc} (tests/nodes/README.md): the fine-tune "
            "itself is proven by kubedgx run --local and tests/trainer"
        )
    except NodesBrokenError as exc:
        pytest.fail(str(exc), pytrace=False)


def test_quickstart_runs_to_success_on_cpu(ns: Kubectl, cluster: Cluster) -> None:
    with PhaseWatch(ns, "quickstart") as watch:
        ns.apply(quickstart_job("quickstart"))
        wait_job(
            ns, "quickstart", "phase Succeeded", phase_is("Succeeded"), timeout=QUICKSTART_TIMEOUT, fail_on=("Failed",)
        )
    # Nothing in between: no Restarting flash while the kubelet writes the exit before the phase.
    assert [p for p in watch.phases if p not in ("Pending", "Running")] == ["Succeeded"], watch.phases
    warnings = [e for e in ns.events_for("DGXTrainingJob", "quickstart") if e.get("type") == "Warning"]
    assert warnings == [], [(e.get("reason"), e.get("message")) for e in warnings]
    # Progress comes from worker 0's termination message, normally in the same status write.
    job = wait_job(
        ns,
        "quickstart",
        "status.progress from the trainer's summary",
        lambda j: dig(j, "status", "progress", "step") is not None,
        timeout=60,
        fail_on=("Failed",),
    )
    status = job["status"]
    assert condition_true(job, "Succeeded"), status.get("conditions")
    assert not condition_true(job, "Failed"), status.get("conditions")
    progress = status["progress"]
    assert progress["step"] == QUICKSTART_STEPS, progress
    assert progress.get("totalSteps") == QUICKSTART_STEPS, progress
    assert status.get("restarts", 0) == 0, status
    assert status.get("startTime"), status
    assert status.get("completionTime"), status

    # Worker 0 exited 0 and is kept, so its logs stay readable.
    pods = {dig(p, "metadata", "name"): p for p in worker_pods(ns, "quickstart")}
    worker = pods.get("quickstart-worker-0")
    assert worker is not None, f"worker 0 should be kept after success; pods: {sorted(pods)}"
    assert dig(worker, "status", "phase") == "Succeeded", dig(worker, "status")
    trainer = next(c for c in dig(worker, "status", "containerStatuses", default=[]) if c["name"] == "trainer")
    assert dig(trainer, "state", "terminated", "exitCode") == 0, trainer
    # Placed like a DGX worker: all of a (fake) node's GPUs, the GPU taint tolerated.
    limits = dig(worker, "spec", "containers", 0, "resources", "limits", default={})
    assert int(limits["nvidia.com/gpu"]) >= 1, limits
    assert any(t.get("key") == "nvidia.com/gpu" for t in dig(worker, "spec", "tolerations", default=[])), worker["spec"]
    # The built-in trainer got its config from the job's ConfigMap.
    assert ns.get("configmap", trainer_config_of(worker)) is not None
