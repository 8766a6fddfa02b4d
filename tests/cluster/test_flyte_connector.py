"""The kubedgx connector against the real control plane with the operator running: the job's phases
come from the operator and the workers' fates from kwok (a label makes a worker exit with a code),
so what Flyte is told is what a cluster really goes through: running, a restart, success; a job too
wide for the nodes there are; a job suspended after it ran (still RUNNING to Flyte); an abort
deleting the job and its pods; rank 0's log (kwok serves none: the apiserver's words come back); a
data mount shared by two tasks' jobs, deleted by the garbage collector once the last of them is gone."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from flyteidl.core.execution_pb2 import TaskExecution
from flytekit import task

from flytekitplugins.dgx import DGXConfig, DGXDataConfig, DGXTorchElastic
from flytekitplugins.dgx.connector import DGXConnector, DGXJobMetadata
from flytekitplugins.dgx.phases import RAN_ANNOTATION
from tests.cluster.controlplane import CONTEXT, EXIT_CODE_LABEL, ControlPlane
from tests.cluster.operator import Operator
from tests.e2e.jobs import live_workers, running_workers
from tests.e2e.kubectl import Kubectl, dig, wait_for
from tests.flyte.flyte import metadata, template

TIMEOUT = 90
PREFIX = "s3://flyte-bucket/metadata/run/n0/0"


@task(task_config=DGXConfig(instance="dgxh100.80g.8.norm", restart_policy="OnFailure", backoff_limit=3))
def retried() -> int:
    return 1


@task(task_config=DGXTorchElastic(instance="dgxh100.80g.8.norm", min_nodes=16, max_nodes=16))
def too_wide() -> int:
    return 1


#: One input prefix, read by two tasks: one DGXDataMount (named after what it reads) for both.
SHARED = "s3://flyte-shared-inputs/corpus"


@task(task_config=DGXDataConfig(instance="dgxh100.80g.8.norm", input_mounts=[SHARED]))
def reads_a() -> int:
    return 1


@task(task_config=DGXDataConfig(instance="dgxh100.80g.8.norm", input_mounts=[SHARED]))
def reads_b() -> int:
    return 2


@pytest.fixture
def connector(control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> DGXConnector:
    monkeypatch.setenv("KUBEDGX_FLYTE_KUBECONFIG", str(control_plane.kubeconfig))
    monkeypatch.setenv("KUBEDGX_FLYTE_CONTEXT", CONTEXT)
    monkeypatch.delenv("KUBEDGX_FLYTE_NAMESPACE", raising=False)
    monkeypatch.setenv("KUBEDGX_FLYTE_LOG_TEMPLATE", "https://logs.example/{namespace}/{pod}")
    return DGXConnector()


def create(connector: DGXConnector, t: Any, ns: str, name: str = "exec1") -> DGXJobMetadata:
    meta = asyncio.run(
        connector.create(
            task_template=template(t, PREFIX), output_prefix=PREFIX, task_execution_metadata=metadata(ns, name)
        )
    )
    assert isinstance(meta, DGXJobMetadata)
    return meta


def flyte_phase(connector: DGXConnector, meta: DGXJobMetadata, phase: int, words: str = "") -> Any:
    """Wait until the connector reports ``phase`` with ``words`` in its message; the Resource."""

    def probe() -> Any:
        resource = asyncio.run(connector.get(resource_meta=meta))
        return resource if resource.phase == phase and words in (resource.message or "") else None

    return wait_for(f"Flyte phase {TaskExecution.Phase.Name(phase)} {words!r} of {meta.name}", probe, timeout=TIMEOUT,
                    interval=0.5)  # fmt: skip


def exit_worker(k: Kubectl, pod: str, code: int) -> None:
    k.run("label", "pod", pod, f"{EXIT_CODE_LABEL}={code}", "--overwrite")


def test_running_then_a_restart_then_success_as_flyte_sees_them(
    operator: Operator, namespace: Kubectl, connector: DGXConnector
) -> None:
    ns = str(namespace.namespace)
    meta = create(connector, retried, ns)
    assert create(connector, retried, ns) == meta, "a repeated create adopts the job"
    running = flyte_phase(connector, meta, TaskExecution.RUNNING, "running: nodes 1/1")
    assert [(link.name, link.uri) for link in running.log_links] == [
        ("worker 0", f"https://logs.example/{ns}/{meta.name}-worker-0")
    ]
    # What `pyflyte serve connector` sends propeller: the protobuf Resource, the links in it.
    sent = asyncio.run(running.to_flyte_idl())
    assert [(link.name, link.uri, link.ShowWhilePending) for link in sent.log_links] == [
        ("worker 0", f"https://logs.example/{ns}/{meta.name}-worker-0", False)
    ]
    # Rank 0's log: the pod runs on a kwok node, whose "kubelet" serves no log; the apiserver says so.
    logs = asyncio.run(connector.get_logs(resource_meta=meta))
    assert list(logs.body.results) == [
        f"no log of pod {ns}/{meta.name}-worker-0, container trainer: 404 the server could not find the requested "
        f"resource ( pods/log {meta.name}-worker-0)"
    ]
    (first,) = running_workers(namespace, meta.name)
    exit_worker(namespace, first["metadata"]["name"], 1)
    # The worker is replaced (restartPolicy OnFailure) and the restart is counted in the message.
    flyte_phase(connector, meta, TaskExecution.RUNNING, "restarts 1")
    (second,) = wait_for("the replacement worker running", lambda: [p for p in running_workers(namespace, meta.name)
                         if p["metadata"]["uid"] != first["metadata"]["uid"]] or None, timeout=TIMEOUT)  # fmt: skip
    exit_worker(namespace, second["metadata"]["name"], 0)
    done = flyte_phase(connector, meta, TaskExecution.SUCCEEDED, "succeeded")
    assert done.outputs is None, "a function task's outputs are its outputs.pb"
    assert done.custom_info["restarts"] == 1


def test_a_job_wider_than_the_cluster_waits_for_resources_with_the_scheduler_s_words(
    operator: Operator, namespace: Kubectl, connector: DGXConnector
) -> None:
    meta = create(connector, too_wide, str(namespace.namespace))
    resource = flyte_phase(connector, meta, TaskExecution.WAITING_FOR_RESOURCES, "waiting for nodes: Unschedulable")
    assert "nodes are available" in resource.message


def test_a_job_suspended_after_it_ran_stays_running_to_flyte_saying_suspended_and_runs_when_resumed(
    operator: Operator, namespace: Kubectl, connector: DGXConnector
) -> None:
    """Propeller sends each phase once per attempt: a WAITING_FOR_RESOURCES after RUNNING would be stored, the
    RUNNING after it never sent, and Flyte would show the task waiting until it ends. The first RUNNING answer
    marks the job; from then on a suspension is RUNNING whose message says suspended."""
    meta = create(connector, retried, str(namespace.namespace))
    assert RAN_ANNOTATION not in (dig(namespace.get("dgxtrainingjobs", meta.name), "metadata", "annotations") or {})
    flyte_phase(connector, meta, TaskExecution.RUNNING)
    assert dig(namespace.get("dgxtrainingjobs", meta.name), "metadata", "annotations", RAN_ANNOTATION)
    namespace.patch("dgxtrainingjobs", meta.name, {"spec": {"suspend": True}})
    wait_for("the job Suspended", lambda: dig(namespace.get("dgxtrainingjobs", meta.name), "status", "phase")
             == "Suspended", timeout=TIMEOUT)  # fmt: skip
    suspended = asyncio.run(connector.get(resource_meta=meta))
    assert (TaskExecution.Phase.Name(suspended.phase), suspended.message) == (
        "RUNNING",
        "suspended (spec.suspend): Suspended: spec.suspend is true: workers deleted, the job is kept",
    )
    wait_for("the workers deleted", lambda: not live_workers(namespace, meta.name), timeout=TIMEOUT)
    namespace.patch("dgxtrainingjobs", meta.name, {"spec": {"suspend": False}})
    flyte_phase(connector, meta, TaskExecution.RUNNING, "running: nodes 1/1")


def test_abort_deletes_the_job_and_its_workers_and_a_second_delete_is_harmless(
    operator: Operator, namespace: Kubectl, connector: DGXConnector
) -> None:
    meta = create(connector, retried, str(namespace.namespace))
    flyte_phase(connector, meta, TaskExecution.RUNNING)
    asyncio.run(connector.delete(resource_meta=meta))
    wait_for("the job gone", lambda: namespace.get("dgxtrainingjobs", meta.name) is None, timeout=TIMEOUT)
    wait_for("its workers gone", lambda: not namespace.select("pods", {"kubedgx.io/job-name": meta.name}),
             timeout=TIMEOUT)  # fmt: skip
    asyncio.run(connector.delete(resource_meta=meta))
    gone = asyncio.run(connector.get(resource_meta=meta))
    assert gone.phase == TaskExecution.FAILED
    assert "gone" in gone.message
    logs = asyncio.run(connector.get_logs(resource_meta=meta))
    assert list(logs.body.results) == [
        f"no log: pod {namespace.namespace}/{meta.name}-worker-0 does not exist (its job has not created it yet, or "
        "the job ended or was deleted and its workers with it)"
    ]
    # A new create for the same execution after the abort makes a new job (a new uid), not the old one.
    again = create(connector, retried, str(namespace.namespace))
    assert (again.name, again.uid != meta.uid) == (meta.name, True)
    assert dig(namespace.get("dgxtrainingjobs", meta.name), "metadata", "uid") == again.uid


def test_a_mount_is_deleted_when_its_last_job_goes(
    operator: Operator, namespace: Kubectl, connector: DGXConnector
) -> None:
    """Each job the connector makes owns the mounts it reads (blockOwnerDeletion false, not their
    controller); the garbage collector deletes a dependent once all its owners are gone."""
    ns = str(namespace.namespace)
    first = create(connector, reads_a, ns, "share1")
    second = create(connector, reads_b, ns, "share2")
    assert create(connector, reads_a, ns, "share1") == first, "a repeated create adopts the job"
    (mount,) = namespace.select("dgxdatamounts")
    name = mount["metadata"]["name"]
    assert mount["spec"]["source"] == SHARED
    owners = mount["metadata"].get("ownerReferences") or []
    assert sorted(owners, key=lambda o: o["name"]) == [
        {"apiVersion": "kubedgx.io/v1alpha1", "kind": "DGXTrainingJob", "name": job.name, "uid": job.uid,
         "blockOwnerDeletion": False}
        for job in sorted((first, second), key=lambda j: j.name)
    ], "one reference per job, the repeated create added none"  # fmt: skip

    def owners_of_mount() -> list[str] | None:
        found = namespace.get("dgxdatamounts", name)
        return None if found is None else [o["uid"] for o in found["metadata"].get("ownerReferences") or []]

    # The first job deleted (by hand, its TTL, or an abort while it runs; the mount's source is not
    # reachable here, so the job may already have failed, and the connector keeps an ended job).
    namespace.run("delete", "dgxtrainingjobs", first.name, "--wait=false")
    wait_for("the first job gone", lambda: namespace.get("dgxtrainingjobs", first.name) is None, timeout=TIMEOUT)
    # The collector drops the reference to the owner that is gone and keeps the mount for the other.
    wait_for(f"{name} owned by the second job alone", lambda: owners_of_mount() == [second.uid], timeout=TIMEOUT,
             interval=0.5)  # fmt: skip
    assert dig(namespace.get("dgxdatamounts", name), "metadata", "deletionTimestamp") is None

    namespace.run("delete", "dgxtrainingjobs", second.name, "--wait=false")  # by hand, or its TTL
    wait_for(f"{name} deleted with its last job", lambda: namespace.get("dgxdatamounts", name) is None,
             timeout=TIMEOUT, interval=0.5)  # fmt: skip
