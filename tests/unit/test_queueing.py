"""Kueue's job integration for DGXTrainingJob (reconcile.queueing) and its use by the planner and
the worker builder: pure functions over realistic Workload and ResourceFlavor bodies, no cluster."""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from dgx_operator.api import DGXTrainingJob
from dgx_operator.api.trainingjob import DGXTrainingJobStatus
from dgx_operator.reconcile.planner import Observed, Plan, plan
from dgx_operator.reconcile.queueing import (
    DEACTIVATED_ANNOTATION,
    DEFAULT_QUEUE,
    JOB_UID_LABEL,
    PODSET_ANNOTATION,
    QUEUE_LABEL,
    Flavor,
    Gate,
    PriorityClass,
    Queueing,
    WorkloadView,
    WorkloadWrites,
    decide,
    pod_set,
    pod_set_template,
    pods_ready_status,
    podset_hash,
    queue_of,
    slim_workload,
    workload,
    workload_name,
)
from dgx_operator.render import BuildContext, JobIdentity, resolve, worker_pod
from dgx_operator.render.resolved import Placement
from tests.unit.planner_sim import (
    OLD_UID,
    UID,
    at,
    cond,
    created,
    created_pods,
    deleted,
    make_job,
    make_pod,
    observe,
    step,
)

V1B2 = "kueue.x-k8s.io/v1beta2"
V1B1 = "kueue.x-k8s.io/v1beta1"
NOW = "2025-03-01T12:00:00Z"
EARLIER = "2025-03-01T11:00:00Z"
WL_UID = "5d1c0e7a-0000-4000-8000-00000000a001"

# --- realistic Kueue objects ---------------------------------------------------------------------

GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
TEAM_TAINT = {"key": "kubedgx.io/dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
SPOT_TAINT = {"key": "cloud.example.com/spot", "operator": "Exists", "effect": "NoExecute"}

DGX_NORM_BODY: dict[str, Any] = {
    "apiVersion": V1B2,
    "kind": "ResourceFlavor",
    "metadata": {"name": "dgx-norm", "uid": "rf-1", "resourceVersion": "11"},
    "spec": {
        "nodeLabels": {"kubedgx.io/pool": "norm", "topology.kubernetes.io/zone": "zone-a"},
        "tolerations": [TEAM_TAINT, GPU_TAINT],
    },
}
CPU_POOL_BODY: dict[str, Any] = {
    "apiVersion": V1B2,
    "kind": "ResourceFlavor",
    "metadata": {"name": "cpu-spot"},
    "spec": {"nodeLabels": {"cloud.example.com/capacity": "spot"}, "tolerations": [GPU_TAINT, SPOT_TAINT]},
}
FLAVORS = {"dgx-norm": Flavor.of(DGX_NORM_BODY), "cpu-spot": Flavor.of(CPU_POOL_BODY)}

QUOTA_RESERVED = {
    "type": "QuotaReserved",
    "status": "True",
    "reason": "QuotaReserved",
    "message": "Quota reserved in ClusterQueue cq-dgx",
    "lastTransitionTime": EARLIER,
    "observedGeneration": 1,
}
ADMITTED = {
    "type": "Admitted",
    "status": "True",
    "reason": "Admitted",
    "message": "The workload is admitted",
    "lastTransitionTime": EARLIER,
    "observedGeneration": 1,
}
PENDING_MESSAGE = (
    "couldn't assign flavors to pod set workers: insufficient quota for nvidia.com/gpu in flavor dgx-norm, "
    "previously considered podsets requests (0) + current podset request (32) > maximum capacity (16)"
)
QUOTA_PENDING = {
    "type": "QuotaReserved",
    "status": "False",
    "reason": "Pending",
    "message": PENDING_MESSAGE,
    "lastTransitionTime": EARLIER,
    "observedGeneration": 1,
}
PREEMPTED_MESSAGE = (
    "Preempted to accommodate a workload (UID: 0c7b, JobUID: 9f2e) due to prioritization in the ClusterQueue"
)


def evicted(reason: str = "Preempted", message: str = PREEMPTED_MESSAGE) -> dict[str, Any]:
    return {
        "type": "Evicted",
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": NOW,
        "observedGeneration": 1,
    }


def admission(count: int, flavors: Mapping[str, str] | None = None) -> dict[str, Any]:
    flavors = {"nvidia.com/gpu": "dgx-norm", "cpu": "dgx-norm"} if flavors is None else flavors
    return {
        "clusterQueue": "cq-dgx",
        "podSetAssignments": [
            {
                "name": "workers",
                "flavors": dict(flavors),
                "count": count,
                "resourceUsage": {"cpu": f"{224 * count}", "nvidia.com/gpu": f"{8 * count}"},
            }
        ],
    }


def admitted_status(count: int, flavors: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {"admission": admission(count, flavors), "conditions": [QUOTA_RESERVED, ADMITTED]}


def evicted_status(count: int, reason: str = "Preempted") -> dict[str, Any]:
    return {"admission": admission(count), "conditions": [QUOTA_RESERVED, ADMITTED, evicted(reason)]}


PENDING_STATUS: dict[str, Any] = {"conditions": [QUOTA_PENDING]}

# A worker as the builders make it, in miniature: what the pod set keeps and what it drops.
WORKER: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "job-worker-0",
        "labels": {
            "kubedgx.io/job-name": "job",
            "kubedgx.io/attempt": "0",
            QUEUE_LABEL: "team",
            "kueue.x-k8s.io/priority-class": "research",
        },
        "annotations": {"kubedgx.io/instance": "dgxa100.80g.8.norm"},
    },
    "spec": {
        "restartPolicy": "Never",
        "hostname": "job-worker-0",
        "subdomain": "job",
        "initContainers": [
            {
                "name": "prepare-cache",
                "image": "trainer:1",
                "command": ["/bin/sh", "-c", "chown"],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                "volumeMounts": [{"name": "data-0", "mountPath": "/kubedgx/prepare/data-0"}],
            },
            {
                "name": "checkpoints-0",
                "image": "trainer:1",
                "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "2", "memory": "2Gi"}},
                "env": [{"name": "X", "value": "1"}],
            },
        ],
        "containers": [
            {
                "name": "trainer",
                "image": "trainer:1",
                "command": ["python", "-m", "dgx_trainer"],
                "env": [{"name": "PET_NNODES", "value": "1:4"}],
                "ports": [{"name": "rdzv", "containerPort": 29400}],
                "resources": {
                    "requests": {"cpu": "224", "memory": "1760Gi", "nvidia.com/gpu": "8"},
                    "limits": {"cpu": "224", "memory": "1760Gi", "nvidia.com/gpu": "8"},
                },
                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
            }
        ],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}},
        "tolerations": [GPU_TAINT],
        "priorityClassName": "kubedgx-normal",
        "securityContext": {"fsGroup": 10001},
    },
}
PODSET = pod_set(WORKER, 1, 4)
WPC = PriorityClass("WorkloadPriorityClass", "research", 1000)
POD_PC = PriorityClass("PriorityClass", "kubedgx-high", 100000)


def stored(
    *,
    status: Mapping[str, Any] | None = None,
    api_version: str = V1B2,
    queue: str = "team",
    podset: Mapping[str, Any] = PODSET,
    priority: PriorityClass | None = None,
    owner: str = UID,
    uid: str = WL_UID,
    rv: str = "4711",
    active: bool = True,
    deleting: bool = False,
    annotations: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """A Workload as the apiserver returns it after this integration created it (and Kueue worked on it)."""
    body = workload(
        api_version=api_version,
        job="job",
        namespace="ml",
        uid=owner,
        queue=queue,
        podset=podset,
        priority=priority,
        active=active,
    )
    meta = body["metadata"]
    meta.update(uid=uid, resourceVersion=rv, generation=1, creationTimestamp=EARLIER)
    for k, v in (annotations or {}).items():
        if v is None:
            meta["annotations"].pop(k, None)
        else:
            meta["annotations"][k] = v
    if deleting:
        meta["deletionTimestamp"] = NOW
    body["spec"].setdefault("active", True)
    if status is not None:
        body["status"] = copy.deepcopy(dict(status))
    return body


def view(**kw: Any) -> WorkloadView:
    return WorkloadView.of(stored(**kw))


def q_of(
    *workloads: WorkloadView,
    queue: str = "team",
    api: str | None = V1B2,
    flavors: Mapping[str, Flavor] = FLAVORS,
    priority: PriorityClass | None = None,
    priority_error: str | None = None,
) -> Queueing:
    return Queueing(
        queue,
        api_version=api,
        workloads=workloads,
        flavors=flavors,
        priority=priority,
        priority_error=priority_error,
    )


def run_decide(
    q: Queueing,
    *,
    podset: Mapping[str, Any] | None = PODSET,
    user_suspended: bool = False,
    finished: tuple[bool, str] | None = None,
    workers_active: int = 0,
    uid: str = UID,
) -> tuple[Gate, WorkloadWrites]:
    return decide(
        q,
        job="job",
        namespace="ml",
        uid=uid,
        podset=podset,
        user_suspended=user_suspended,
        finished=finished,
        workers_active=workers_active,
        now=NOW,
    )


def conditions_by_type(patch: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in patch["conditions"]}


# --- workload_name -------------------------------------------------------------------------------


def test_workload_name_follows_kueues_scheme() -> None:
    name = workload_name("job", UID)
    assert re.fullmatch(r"dgxtrainingjob-job-[0-9a-f]{5}", name), name
    assert workload_name("job", UID) == name  # deterministic
    assert workload_name("job", OLD_UID) != name  # a recreated job's Workload is a different one
    assert workload_name("job2", UID) != name


def test_workload_name_fits_253_characters() -> None:
    long = "a" * 253
    name = workload_name(long, UID)
    assert len(name) == 253
    assert name.startswith("dgxtrainingjob-aaaa")
    assert re.fullmatch(r"dgxtrainingjob-a+-[0-9a-f]{5}", name)
    # Two names that agree on the kept prefix still get different Workloads (the hash sees it all).
    assert workload_name("a" * 252 + "b", UID) != name


def test_workload_name_cut_never_leaves_a_separator_before_the_hash() -> None:
    job = "a" * 231 + "." + "b" * 21  # the cut (247 characters with the prefix) falls right after the dot
    name = workload_name(job, UID)
    assert len(name) <= 253
    assert re.fullmatch(r"dgxtrainingjob-a{231}-[0-9a-f]{5}", name), name


# --- the Workload --------------------------------------------------------------------------------


def test_workload_v1beta2_names_the_priority_class_by_ref() -> None:
    body = workload(api_version=V1B2, job="job", namespace="ml", uid=UID, queue="team", podset=PODSET, priority=WPC)
    assert body["apiVersion"] == V1B2
    assert body["kind"] == "Workload"
    spec = body["spec"]
    assert spec["queueName"] == "team"
    assert spec["podSets"] == [PODSET]
    assert spec["priority"] == 1000
    assert spec["priorityClassRef"] == {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "research"}
    assert "priorityClassName" not in spec
    assert "priorityClassSource" not in spec
    assert "active" not in spec  # Kueue's default (true)
    pod = workload(api_version=V1B2, job="job", namespace="ml", uid=UID, queue="team", podset=PODSET, priority=POD_PC)
    assert pod["spec"]["priorityClassRef"] == {
        "group": "scheduling.k8s.io",
        "kind": "PriorityClass",
        "name": "kubedgx-high",
    }
    assert pod["spec"]["priority"] == 100000


def test_workload_v1beta1_names_the_priority_class_and_its_source() -> None:
    body = workload(api_version=V1B1, job="job", namespace="ml", uid=UID, queue="team", podset=PODSET, priority=WPC)
    spec = body["spec"]
    assert body["apiVersion"] == V1B1
    assert spec["priorityClassName"] == "research"
    assert spec["priorityClassSource"] == "kueue.x-k8s.io/workloadpriorityclass"
    assert spec["priority"] == 1000
    assert "priorityClassRef" not in spec
    pod = workload(api_version=V1B1, job="job", namespace="ml", uid=UID, queue="team", podset=PODSET, priority=POD_PC)
    assert pod["spec"]["priorityClassName"] == "kubedgx-high"
    assert pod["spec"]["priorityClassSource"] == "scheduling.k8s.io/priorityclass"
    assert pod["spec"]["priority"] == 100000


def test_workload_without_priority_carries_none() -> None:
    spec = workload(api_version=V1B2, job="job", namespace="ml", uid=UID, queue="q", podset=PODSET, priority=None)[
        "spec"
    ]
    assert set(spec) == {"queueName", "podSets"}


def test_workload_metadata_owner_labels_and_hash() -> None:
    body = workload(api_version=V1B2, job="job", namespace="ml", uid=UID, queue="team", podset=PODSET, priority=WPC)
    meta = body["metadata"]
    assert meta["name"] == workload_name("job", UID)
    assert meta["namespace"] == "ml"
    assert meta["labels"] == {JOB_UID_LABEL: UID}
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "kubedgx.io/v1alpha1",
            "kind": "DGXTrainingJob",
            "name": "job",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert meta["annotations"] == {PODSET_ANNOTATION: podset_hash(PODSET, WPC)}
    assert re.fullmatch(r"[0-9a-f]{16}", meta["annotations"][PODSET_ANNOTATION])


def test_workload_created_suspended_is_inactive_and_marked_ours() -> None:
    body = workload(
        api_version=V1B2,
        job="job",
        namespace="ml",
        uid=UID,
        queue="team",
        podset=PODSET,
        priority=None,
        active=False,
    )
    assert body["spec"]["active"] is False
    assert body["metadata"]["annotations"][DEACTIVATED_ANNOTATION] == "true"
    assert WorkloadView.of(body).deactivated_by_us is True
    assert WorkloadView.of(body).active is False


def test_podset_hash_changes_with_shape_and_priority_but_not_its_value() -> None:
    base = podset_hash(PODSET, WPC)
    assert podset_hash(copy.deepcopy(PODSET), WPC) == base
    assert podset_hash(pod_set(WORKER, 1, 3), WPC) != base
    assert podset_hash(PODSET, None) != base
    assert podset_hash(PODSET, POD_PC) != base
    # The value is only read when a Workload is made: a stored one is judged by class, not value.
    assert podset_hash(PODSET, dataclasses.replace(WPC, value=7)) == base


# --- the pod set ---------------------------------------------------------------------------------


def test_pod_set_counts_max_nodes_and_min_only_when_elastic() -> None:
    elastic = pod_set(WORKER, 2, 4)
    assert elastic["name"] == "workers"
    assert elastic["count"] == 4
    assert elastic["minCount"] == 2
    fixed = pod_set(WORKER, 3, 3)
    assert fixed["count"] == 3
    assert "minCount" not in fixed
    assert fixed["template"] == pod_set_template(WORKER)


def test_pod_set_template_keeps_requests_and_placement_only() -> None:
    template = pod_set_template(WORKER)
    spec = template["spec"]
    assert spec["containers"] == [
        {
            "name": "trainer",
            "resources": {
                "requests": {"cpu": "224", "memory": "1760Gi", "nvidia.com/gpu": "8"},
                "limits": {"cpu": "224", "memory": "1760Gi", "nvidia.com/gpu": "8"},
            },
        }
    ]
    assert spec["initContainers"] == [
        {"name": "prepare-cache", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
        {
            "name": "checkpoints-0",
            "restartPolicy": "Always",  # a sidecar: Kueue counts it alongside the trainer
            "resources": {"requests": {"cpu": "2", "memory": "2Gi"}},
        },
    ]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert spec["affinity"] == WORKER["spec"]["affinity"]
    assert spec["tolerations"] == [GPU_TAINT]
    assert spec["priorityClassName"] == "kubedgx-normal"
    assert set(spec) == {"containers", "initContainers", "nodeSelector", "affinity", "tolerations", "priorityClassName"}
    # No image (Kueue does not read it; a new image is no new shape) and no labels (the queue and
    # priority labels are the Workload's queueName and priority).
    assert set(template) == {"spec"}


def test_pod_set_template_of_a_plain_worker() -> None:
    worker = {"spec": {"containers": [{"name": "c", "image": "i", "env": [{"name": "A", "value": "b"}]}]}}
    assert pod_set_template(worker) == {"spec": {"containers": [{"name": "c"}]}}


# --- reading stored Workloads --------------------------------------------------------------------


V1BETA2_ADMITTED: dict[str, Any] = {
    "apiVersion": V1B2,
    "kind": "Workload",
    "metadata": {
        "name": "dgxtrainingjob-job-1a2b3",
        "namespace": "ml",
        "uid": WL_UID,
        "resourceVersion": "90210",
        "generation": 1,
        "labels": {JOB_UID_LABEL: UID},
        "annotations": {PODSET_ANNOTATION: "0123456789abcdef"},
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "not-it", "controller": False},
            {
                "apiVersion": "kubedgx.io/v1alpha1",
                "kind": "DGXTrainingJob",
                "name": "job",
                "uid": UID,
                "controller": True,
                "blockOwnerDeletion": True,
            },
        ],
    },
    "spec": {
        "active": True,
        "queueName": "team",
        "priority": 1000,
        "priorityClassRef": {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "research"},
        "podSets": [PODSET],
    },
    "status": {
        "admission": {
            "clusterQueue": "cq-dgx",
            "podSetAssignments": [
                {
                    "name": "workers",
                    "flavors": {"nvidia.com/gpu": "dgx-norm", "cpu": "dgx-norm"},
                    "count": 3,
                    "resourceUsage": {"cpu": "672", "nvidia.com/gpu": "24"},
                }
            ],
        },
        "conditions": [QUOTA_RESERVED, ADMITTED],
        "requeueState": {"count": 1},
    },
}


def test_workload_view_of_an_admitted_v1beta2_body() -> None:
    wl = WorkloadView.of(V1BETA2_ADMITTED)
    assert wl.name == "dgxtrainingjob-job-1a2b3"
    assert wl.uid == WL_UID
    assert wl.resource_version == "90210"
    assert wl.api_version == V1B2
    assert wl.owner_uid == UID
    assert wl.queue == "team"
    assert wl.active is True
    assert wl.deleting is False
    assert wl.podset_hash == "0123456789abcdef"
    assert wl.deactivated_by_us is False
    assert wl.cluster_queue == "cq-dgx"
    assert wl.admitted_count == 3
    assert dict(wl.flavors) == {"nvidia.com/gpu": "dgx-norm", "cpu": "dgx-norm"}
    assert set(wl.conditions) == {"QuotaReserved", "Admitted"}
    assert wl.conditions["QuotaReserved"].message == "Quota reserved in ClusterQueue cq-dgx"
    assert wl.admitted is True
    assert wl.evicted is False
    assert wl.finished is False
    assert wl.raw_conditions == (QUOTA_RESERVED, ADMITTED)


def test_workload_view_of_v1beta1_evicted_and_finished_bodies() -> None:
    body = copy.deepcopy(V1BETA2_ADMITTED)
    body["apiVersion"] = V1B1
    del body["spec"]["priorityClassRef"]
    body["spec"].update(priorityClassName="research", priorityClassSource="kueue.x-k8s.io/workloadpriorityclass")
    body["status"]["conditions"] = [QUOTA_RESERVED, ADMITTED, evicted()]
    wl = WorkloadView.of(body)
    assert wl.api_version == V1B1
    assert wl.evicted is True
    assert wl.conditions["Evicted"].reason == "Preempted"
    assert wl.conditions["Evicted"].message == PREEMPTED_MESSAGE
    assert wl.admitted is True  # still, until the reservation is cleared
    done = copy.deepcopy(body)
    done["status"]["conditions"] = [
        QUOTA_RESERVED,
        ADMITTED,
        {"type": "Finished", "status": "True", "reason": "Succeeded", "message": "done", "lastTransitionTime": NOW},
    ]
    assert WorkloadView.of(done).finished is True
    assert WorkloadView.of(done).evicted is False


def test_workload_view_of_a_pending_and_a_deleting_body() -> None:
    wl = view(status=PENDING_STATUS, deleting=True, active=False)
    assert wl.admitted is False
    assert wl.admitted_count is None
    assert dict(wl.flavors) == {}
    assert wl.cluster_queue is None
    assert wl.deleting is True
    assert wl.active is False
    assert wl.deactivated_by_us is True
    assert wl.conditions["QuotaReserved"].reason == "Pending"


def test_workload_view_needs_both_conditions_and_a_count_to_be_admitted() -> None:
    reserved_only = copy.deepcopy(V1BETA2_ADMITTED)
    reserved_only["status"]["conditions"] = [QUOTA_RESERVED]
    assert WorkloadView.of(reserved_only).admitted is False
    no_count = copy.deepcopy(V1BETA2_ADMITTED)
    del no_count["status"]["admission"]["podSetAssignments"][0]["count"]
    # Kueue: an assignment without a count (older Workloads) admitted the pod set's whole count.
    assert WorkloadView.of(no_count).admitted_count == no_count["spec"]["podSets"][0]["count"]
    assert WorkloadView.of(slim_workload(no_count)).admitted_count == no_count["spec"]["podSets"][0]["count"]
    no_podset = copy.deepcopy(no_count)
    no_podset["spec"]["podSets"] = []
    assert WorkloadView.of(no_podset).admitted is False
    other_podset = copy.deepcopy(V1BETA2_ADMITTED)
    other_podset["status"]["admission"]["podSetAssignments"][0]["name"] = "main"
    assert WorkloadView.of(other_podset).admitted_count is None


def test_workload_view_owner_must_be_the_jobs_controller_reference() -> None:
    body = copy.deepcopy(V1BETA2_ADMITTED)
    body["metadata"]["ownerReferences"][1]["controller"] = False
    assert WorkloadView.of(body).owner_uid is None
    assert WorkloadView.of({}).owner_uid is None
    assert WorkloadView.of({}).name == ""


def test_slim_workload_keeps_what_the_view_reads() -> None:
    slim = slim_workload(V1BETA2_ADMITTED)
    assert WorkloadView.of(slim) == WorkloadView.of(V1BETA2_ADMITTED)
    assert all(set(p) <= {"name", "count"} for p in slim["spec"]["podSets"])
    assert "requeueState" not in slim["status"]
    assert "labels" not in slim["metadata"]


def test_flavor_of_reads_node_labels_and_tolerations() -> None:
    flavor = Flavor.of(DGX_NORM_BODY)
    assert flavor.name == "dgx-norm"
    assert dict(flavor.node_labels) == {"kubedgx.io/pool": "norm", "topology.kubernetes.io/zone": "zone-a"}
    assert flavor.tolerations == (TEAM_TAINT, GPU_TAINT)
    assert Flavor.of({"metadata": {"name": "bare"}}) == Flavor("bare")


# --- queue_of ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "manage", "queue"),
    [
        ({QUEUE_LABEL: "team"}, False, "team"),
        ({QUEUE_LABEL: "team"}, True, "team"),
        ({}, False, None),
        ({}, True, DEFAULT_QUEUE),
        ({QUEUE_LABEL: ""}, False, None),
        ({QUEUE_LABEL: ""}, True, "default"),
        ({"app": "x"}, False, None),
    ],
)
def test_queue_of(labels: dict[str, str], manage: bool, queue: str | None) -> None:
    assert queue_of(labels, manage) == queue


# --- decide --------------------------------------------------------------------------------------


def test_decide_without_kueue_holds_the_job_and_names_the_fix() -> None:
    gate, writes = run_decide(Queueing("team"))
    assert gate.placement is None
    assert gate.reason == "KueueNotInstalled"
    assert QUEUE_LABEL in gate.message
    assert "'team'" in gate.message
    assert "install Kueue" in gate.message
    assert "remove the label" in gate.message
    assert not writes


def test_decide_without_a_workload_creates_one() -> None:
    gate, writes = run_decide(q_of(priority=WPC))
    assert gate.placement is None
    assert gate.reason == "Queued"
    assert workload_name("job", UID) in gate.message
    assert "'team'" in gate.message
    assert writes.create == workload(
        api_version=V1B2, job="job", namespace="ml", uid=UID, queue="team", podset=PODSET, priority=WPC
    )
    assert writes.delete == []
    assert writes.patch == []
    assert writes.status == []
    assert bool(writes) is True


def test_decide_creates_in_the_served_version() -> None:
    _, writes = run_decide(q_of(api=V1B1, priority=WPC))
    assert writes.create is not None
    assert writes.create["apiVersion"] == V1B1
    assert writes.create["spec"]["priorityClassSource"] == "kueue.x-k8s.io/workloadpriorityclass"


def test_decide_ignores_workloads_of_another_uid() -> None:
    foreign = view(owner=OLD_UID, uid="old-wl", status=admitted_status(4))
    gate, writes = run_decide(q_of(foreign))
    assert gate.placement is None
    assert writes.create is not None
    assert writes.create["metadata"]["ownerReferences"][0]["uid"] == UID
    assert writes.delete == []  # the predecessor's Workload goes with the predecessor
    _, done = run_decide(q_of(foreign), finished=(True, "ok"))
    assert not done


@pytest.mark.parametrize(("succeeded", "reason"), [(True, "Succeeded"), (False, "Failed")])
def test_decide_marks_only_unfinished_workloads_finished(succeeded: bool, reason: str) -> None:
    finished_already = {
        "type": "Finished",
        "status": "True",
        "reason": "Succeeded",
        "message": "x",
        "lastTransitionTime": EARLIER,
    }
    running = view(status=admitted_status(2), uid="wl-a", rv="10")
    stale = view(status=PENDING_STATUS, uid="wl-b", rv="11", podset=pod_set(WORKER, 1, 2))
    done = view(status={"conditions": [QUOTA_RESERVED, finished_already]}, uid="wl-c", rv="12")
    going = view(status=admitted_status(2), uid="wl-d", rv="13", deleting=True)
    gate, writes = run_decide(
        q_of(running, stale, done, going), finished=(succeeded, "job-worker-0 exited 0: training completed")
    )
    assert gate == Gate(None)
    assert writes.create is None
    assert writes.delete == []
    assert writes.patch == []
    assert [(rv, conditions_by_type(p)["Finished"]["reason"]) for _, rv, p in writes.status] == [
        ("10", reason),
        ("11", reason),
    ]
    _, _, patch = writes.status[0]
    by_type = conditions_by_type(patch)
    assert set(by_type) == {"QuotaReserved", "Admitted", "Finished"}  # the others kept
    assert by_type["Finished"] == {
        "type": "Finished",
        "status": "True",
        "reason": reason,
        "message": "job-worker-0 exited 0: training completed",
        "lastTransitionTime": NOW,
    }
    assert by_type["Admitted"] == ADMITTED


def test_decide_finished_without_message_uses_the_reason() -> None:
    _, writes = run_decide(q_of(view(status=admitted_status(1))), finished=(False, ""))
    assert conditions_by_type(writes.status[0][2])["Finished"]["message"] == "Failed"


def test_decide_finished_needs_no_kueue_api() -> None:
    gate, writes = run_decide(Queueing("team"), finished=(True, "done"))
    assert gate == Gate(None)
    assert not writes


def test_decide_admitted_gives_the_placement() -> None:
    wl = view(status=admitted_status(3))
    gate, writes = run_decide(q_of(wl), workers_active=3)
    assert gate.reason == ""
    assert gate.placement == Placement(
        count=3,
        node_selector={"kubedgx.io/pool": "norm", "topology.kubernetes.io/zone": "zone-a"},
        tolerations=(TEAM_TAINT, GPU_TAINT),
        flavors=("dgx-norm",),
        cluster_queue="cq-dgx",
    )
    assert not writes


def test_decide_admitted_on_two_flavors_unites_labels_and_tolerations() -> None:
    wl = view(status=admitted_status(2, {"nvidia.com/gpu": "dgx-norm", "cpu": "cpu-spot", "memory": "cpu-spot"}))
    gate, _ = run_decide(q_of(wl))
    assert gate.placement is not None
    assert gate.placement.count == 2
    assert gate.placement.flavors == ("cpu-spot", "dgx-norm")
    assert dict(gate.placement.node_selector) == {
        "cloud.example.com/capacity": "spot",
        "kubedgx.io/pool": "norm",
        "topology.kubernetes.io/zone": "zone-a",
    }
    # GPU_TAINT is in both flavors: once.
    assert gate.placement.tolerations == (GPU_TAINT, SPOT_TAINT, TEAM_TAINT)


def test_decide_admitted_on_an_unknown_flavor_holds() -> None:
    wl = view(status=admitted_status(2, {"nvidia.com/gpu": "dgx-norm", "cpu": "brand-new"}))
    gate, writes = run_decide(q_of(wl))
    assert gate.placement is None
    assert gate.reason == "FlavorUnknown"
    assert "brand-new" in gate.message
    assert "dgx-norm" not in gate.message
    assert not writes


def test_decide_evicted_with_workers_still_running_only_holds() -> None:
    wl = view(status=evicted_status(3))
    gate, writes = run_decide(q_of(wl), workers_active=2)
    assert gate.placement is None
    assert gate.evicted is True
    assert gate.reason == "Preempted"
    assert PREEMPTED_MESSAGE in gate.message
    assert wl.name in gate.message
    assert not writes  # the reservation stays until the workers are gone


@pytest.mark.parametrize(
    ("reason", "requeued"),
    [("Preempted", "True"), ("NodeFailures", "True"), ("PodsReadyTimeout", "False"), ("InactiveWorkload", "False")],
)
def test_decide_evicted_and_stopped_clears_the_reservation(reason: str, requeued: str) -> None:
    wl = view(status=evicted_status(3, reason))
    gate, writes = run_decide(q_of(wl), workers_active=0)
    assert gate.evicted is True
    assert gate.reason == reason
    assert writes.create is None
    assert writes.patch == []
    [(name, rv, patch)] = writes.status
    assert (name, rv) == (wl.name, "4711")
    assert patch["admission"] is None
    assert "admission" in patch  # a merge patch removing it
    by_type = conditions_by_type(patch)
    assert by_type["QuotaReserved"] == {
        "type": "QuotaReserved",
        "status": "False",
        "reason": "Pending",
        "message": PREEMPTED_MESSAGE,
        "lastTransitionTime": NOW,
    }
    assert by_type["Admitted"] == {
        "type": "Admitted",
        "status": "False",
        "reason": "NoReservation",
        "message": "The workload has no reservation",
        "lastTransitionTime": NOW,
    }
    assert by_type["Requeued"]["status"] == requeued
    assert by_type["Requeued"]["reason"] == reason
    assert by_type["Evicted"] == evicted(reason)  # Kueue's own condition untouched


def test_clear_reservation_keeps_transition_times_of_unchanged_conditions() -> None:
    requeued = {
        "type": "Requeued",
        "status": "True",
        "reason": "Preempted",
        "message": "earlier",
        "lastTransitionTime": EARLIER,
    }
    wl = view(status={"admission": admission(2), "conditions": [QUOTA_RESERVED, evicted(), requeued]})
    _, writes = run_decide(q_of(wl))
    by_type = conditions_by_type(writes.status[0][2])
    assert by_type["Requeued"]["lastTransitionTime"] == EARLIER  # still True: not a transition
    assert by_type["Requeued"]["message"] == PREEMPTED_MESSAGE
    assert by_type["QuotaReserved"]["lastTransitionTime"] == NOW  # True -> False
    assert "Admitted" not in by_type  # never admitted: nothing to unset


def test_decide_evicted_with_reservation_already_cleared_writes_nothing() -> None:
    cleared = {
        "conditions": [
            {**QUOTA_PENDING, "message": PREEMPTED_MESSAGE, "lastTransitionTime": NOW},
            evicted(),
            {"type": "Requeued", "status": "True", "reason": "Preempted", "lastTransitionTime": NOW},
        ]
    }
    gate, writes = run_decide(q_of(view(status=cleared)))
    assert gate.evicted is True
    assert gate.placement is None
    assert not writes


def test_decide_pending_tells_kueues_reason_and_message() -> None:
    wl = view(status=PENDING_STATUS)
    gate, writes = run_decide(q_of(wl))
    assert gate.placement is None
    assert gate.reason == "Pending"
    assert PENDING_MESSAGE in gate.message
    assert wl.name in gate.message
    assert "'team'" in gate.message
    assert not writes


def test_decide_before_kueue_looked_is_queued() -> None:
    gate, writes = run_decide(q_of(view()))
    assert gate.reason == "Queued"
    assert gate.message.endswith("not admitted yet")
    assert not writes


def test_decide_quota_reserved_waits_for_admission_checks() -> None:
    checks = {
        "type": "Admitted",
        "status": "False",
        "reason": "UnsatisfiedChecks",
        "message": "The workload has not all admission checks ready",
        "lastTransitionTime": NOW,
    }
    gate, _ = run_decide(q_of(view(status={"admission": admission(2), "conditions": [QUOTA_RESERVED, checks]})))
    assert gate.placement is None
    assert gate.reason == "UnsatisfiedChecks"
    assert "The workload has not all admission checks ready" in gate.message


def test_decide_changed_podset_keeps_an_admitted_workload_running() -> None:
    """The job runs on what was admitted; a new shape waits for its next admission."""
    old = view(status=admitted_status(4), podset=pod_set(WORKER, 1, 8), uid="old-wl-uid")
    assert old.podset_hash != podset_hash(PODSET, None)
    gate, writes = run_decide(q_of(old), workers_active=4)
    assert gate.placement is not None
    assert gate.placement.count == 4
    assert not writes


def test_decide_changed_podset_recreates_the_workload() -> None:
    old = view(status=PENDING_STATUS, podset=pod_set(WORKER, 1, 8), uid="old-wl-uid")
    assert old.podset_hash != podset_hash(PODSET, None)
    gate, writes = run_decide(q_of(old), workers_active=0)
    assert gate.placement is None
    assert gate.reason == "WorkloadRecreated"
    assert writes.delete == [(old.name, "old-wl-uid")]
    assert writes.create is None  # not in the same pass: the new one has the same name
    # Next pass: the old one is being deleted; wait, write nothing.
    going = view(status=PENDING_STATUS, podset=pod_set(WORKER, 1, 8), uid="old-wl-uid", deleting=True)
    gate, writes = run_decide(q_of(going))
    assert gate.reason == "WorkloadRecreated"
    assert not writes
    # Then it is gone: the new one is made.
    _, writes = run_decide(q_of())
    assert writes.create is not None
    assert writes.create["metadata"]["annotations"][PODSET_ANNOTATION] == podset_hash(PODSET, None)


def test_decide_changed_priority_class_recreates_the_workload() -> None:
    old = view(status=PENDING_STATUS, priority=WPC)
    gate, writes = run_decide(q_of(old, priority=POD_PC))
    assert gate.reason == "WorkloadRecreated"
    assert writes.delete == [(old.name, WL_UID)]
    # The same class with the value not read again (0) is the same Workload.
    gate, writes = run_decide(q_of(old, priority=dataclasses.replace(WPC, value=0)))
    assert gate.reason == "Pending"
    assert not writes


def test_decide_finished_workload_of_a_running_job_is_replaced() -> None:
    done = {"type": "Finished", "status": "True", "reason": "Failed", "message": "x", "lastTransitionTime": NOW}
    old = view(status={"conditions": [done]})
    gate, writes = run_decide(q_of(old))
    assert gate.reason == "WorkloadRecreated"
    assert writes.delete == [(old.name, WL_UID)]
    assert writes.create is None


def test_decide_duplicate_workloads_keep_one() -> None:
    first = view(status=admitted_status(2), uid="wl-1")
    second = view(status=PENDING_STATUS, uid="wl-2")
    gate, writes = run_decide(q_of(first, second))
    assert writes.delete == [(second.name, "wl-2")]
    assert gate.placement is not None
    assert gate.placement.count == 2


def test_decide_user_suspend_deactivates_the_workload() -> None:
    wl = view(status=admitted_status(2), rv="77")
    gate, writes = run_decide(q_of(wl), user_suspended=True, workers_active=2)
    assert writes.patch == [
        (wl.name, "77", {"spec": {"active": False}, "metadata": {"annotations": {DEACTIVATED_ANNOTATION: "true"}}})
    ]
    assert writes.create is None
    assert writes.status == []
    assert gate.placement is not None  # the planner's spec.suspend check stops the workers


def test_decide_user_suspend_before_any_workload_creates_it_inactive() -> None:
    _, writes = run_decide(q_of(), user_suspended=True)
    assert writes.create is not None
    assert writes.create["spec"]["active"] is False
    assert writes.create["metadata"]["annotations"][DEACTIVATED_ANNOTATION] == "true"


def test_decide_user_suspend_of_a_deactivated_workload_writes_nothing() -> None:
    wl = view(status=PENDING_STATUS, active=False)
    gate, writes = run_decide(q_of(wl), user_suspended=True)
    assert not writes
    assert gate.placement is None


def test_decide_lifting_the_suspend_reactivates_our_workload() -> None:
    wl = view(status=PENDING_STATUS, active=False, rv="78")
    assert wl.deactivated_by_us
    gate, writes = run_decide(q_of(wl))
    assert writes.patch == [
        (wl.name, "78", {"spec": {"active": True}, "metadata": {"annotations": {DEACTIVATED_ANNOTATION: None}}})
    ]
    assert gate.placement is None


def test_decide_never_reactivates_a_workload_kueue_deactivated() -> None:
    wl = view(
        status={"conditions": [{**QUOTA_PENDING, "message": "exceeded the maximum execution time"}]},
        active=False,
        annotations={DEACTIVATED_ANNOTATION: None},
    )
    assert not wl.deactivated_by_us
    gate, writes = run_decide(q_of(wl))
    assert writes.patch == []
    assert not writes
    assert gate.placement is None
    assert gate.reason == "Deactivated"
    assert wl.name in gate.message
    assert "exceeded the maximum execution time" in gate.message


def test_decide_moves_a_waiting_workload_to_the_new_queue() -> None:
    wl = view(status=PENDING_STATUS, queue="team", rv="79")
    gate, writes = run_decide(q_of(wl, queue="team-b"))
    assert writes.patch == [(wl.name, "79", {"spec": {"queueName": "team-b"}})]
    assert writes.delete == []
    assert writes.create is None
    assert gate.placement is None
    assert "'team-b'" in gate.message


def test_decide_leaves_an_admitted_workload_in_its_queue() -> None:
    wl = view(status=admitted_status(2), queue="team")
    gate, writes = run_decide(q_of(wl, queue="team-b"))
    assert not writes
    assert gate.placement is not None


def test_decide_priority_error_holds_the_job() -> None:
    why = "WorkloadPriorityClass 'nope' (label kueue.x-k8s.io/priority-class) does not exist"
    gate, writes = run_decide(q_of(priority_error=why))
    assert gate == Gate(None, "PriorityClassNotFound", why)
    assert not writes


def test_decide_without_a_pod_set_holds_as_invalid() -> None:
    gate, writes = run_decide(q_of(), podset=None)
    assert gate.reason == "InvalidSpec"
    assert gate.placement is None
    assert not writes


# --- the worker builder --------------------------------------------------------------------------


def test_worker_pod_takes_the_placement(ctx: BuildContext) -> None:
    job = make_job({"spec.nodeSelector": {"rack": "r7"}, "spec.tolerations": [{"key": "maint", "operator": "Exists"}]})
    r = resolve(job.spec, ctx.catalog)
    plain = worker_pod(JobIdentity.of(job), job.spec, 1, r, ctx)
    placement = Placement(
        count=2,
        node_selector={"kubedgx.io/pool": "norm"},
        tolerations=(GPU_TAINT, TEAM_TAINT),
        flavors=("dgx-norm",),
        cluster_queue="cq-dgx",
    )
    placed = worker_pod(JobIdentity.of(job), job.spec, 1, r, dataclasses.replace(ctx, placement=placement))
    assert placed["spec"]["nodeSelector"] == {**plain["spec"].get("nodeSelector", {}), "kubedgx.io/pool": "norm"}
    assert placed["spec"]["nodeSelector"]["rack"] == "r7"
    assert GPU_TAINT in plain["spec"]["tolerations"]
    # The flavor's tolerations follow the instance's and the job's, none twice.
    assert placed["spec"]["tolerations"] == [*plain["spec"]["tolerations"], TEAM_TAINT]
    assert placed["spec"]["tolerations"].count(GPU_TAINT) == 1
    rest = {k: v for k, v in placed["spec"].items() if k not in ("nodeSelector", "tolerations")}
    assert rest == {k: v for k, v in plain["spec"].items() if k not in ("nodeSelector", "tolerations")}


# --- the planner ---------------------------------------------------------------------------------

QUEUED_LABELS = {"metadata.labels": {QUEUE_LABEL: "team"}}
ELASTIC = {**QUEUED_LABELS, "spec.elastic": {"minNodes": 1, "maxNodes": 4}}


def queued_job(changes: Mapping[str, Any] | None = None, status: DGXTrainingJobStatus | None = None) -> DGXTrainingJob:
    return make_job({**QUEUED_LABELS, **(changes or {})}, status=status)


def observe_q(q: Queueing | None, pods: Sequence[Mapping[str, Any]] = ()) -> Observed:
    return dataclasses.replace(observe(pods), queueing=q)


def the_workload(job: DGXTrainingJob, ctx: BuildContext, *, queue: str = "team") -> dict[str, Any]:
    """The Workload the planner asks for on the job's first pass."""
    first = plan(job, ctx, observe_q(q_of(queue=queue)), at(0))
    assert first.workloads.create is not None
    return first.workloads.create


def as_stored(created_body: Mapping[str, Any], status: Mapping[str, Any] | None, rv: str = "500") -> WorkloadView:
    body = copy.deepcopy(dict(created_body))
    body["metadata"].update(uid=WL_UID, resourceVersion=rv)
    if status is not None:
        body["status"] = copy.deepcopy(dict(status))
    return WorkloadView.of(body)


def suspended_reason(result: Plan) -> tuple[str, str] | None:
    return cond(result.status, "Suspended")


def test_planner_holds_a_queued_job_until_admission(ctx: BuildContext) -> None:
    job = queued_job()
    first = plan(job, ctx, observe_q(q_of()), at(0))
    assert created_pods(first) == []
    assert first.status.phase == "Suspended"
    assert suspended_reason(first) == ("True", "Queued")
    assert first.workloads.create is not None
    assert first.workloads.create["spec"]["queueName"] == "team"
    assert first.workloads.create["spec"]["podSets"][0]["count"] == 1
    assert first.status.workers is not None
    assert first.status.workers.desired == 0
    assert first.status.start_time is None
    # Kueue answers: no room. Still held, Kueue's words in the status.
    wl = as_stored(first.workloads.create, PENDING_STATUS)
    second = plan(step(job, first), ctx, observe_q(q_of(wl)), at(10))
    assert created_pods(second) == []
    assert second.status.phase == "Suspended"
    assert suspended_reason(second) == ("True", "Pending")
    found = next(c for c in second.status.conditions if c.type == "Suspended")
    assert PENDING_MESSAGE in found.message
    assert not second.workloads


def pods_ready_of(result: Plan) -> tuple[str, str] | None:
    """(status, reason) of the PodsReady condition in the pass's one Workload status write."""
    (write,) = result.workloads.status
    (ready,) = [c for c in write[2]["conditions"] if c["type"] == "PodsReady"]
    return ready["status"], ready["reason"]


def test_pods_ready_follows_jobframeworks_transitions() -> None:
    def with_ready(status: str, reason: str) -> WorkloadView:
        conditions = [
            *admitted_status(2)["conditions"],
            {
                "type": "PodsReady",
                "status": status,
                "reason": reason,
                "message": "m",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
            },
        ]
        return view(status={**admitted_status(2), "conditions": conditions})

    def reads(patch: dict[str, Any] | None) -> tuple[str, str] | None:
        if patch is None:
            return None
        (c,) = [c for c in patch["conditions"] if c["type"] == "PodsReady"]
        return c["status"], c["reason"]

    fresh = view(status=admitted_status(2))
    assert reads(pods_ready_status(fresh, False, NOW)) == ("False", "WaitForStart")
    assert reads(pods_ready_status(fresh, True, NOW)) == ("True", "Started")
    assert reads(pods_ready_status(with_ready("True", "Started"), True, NOW)) is None
    assert reads(pods_ready_status(with_ready("True", "Started"), False, NOW)) == ("False", "WaitForRecovery")
    assert reads(pods_ready_status(with_ready("False", "WaitForRecovery"), False, NOW)) is None
    assert reads(pods_ready_status(with_ready("False", "WaitForRecovery"), True, NOW)) == ("True", "Recovered")
    assert reads(pods_ready_status(with_ready("False", "WaitForStart"), False, NOW)) is None


def test_planner_without_kueue_installed_holds_the_job(ctx: BuildContext) -> None:
    result = plan(queued_job(), ctx, observe_q(Queueing("team")), at(0))
    assert created_pods(result) == []
    assert result.status.phase == "Suspended"
    assert suspended_reason(result) == ("True", "KueueNotInstalled")
    assert not result.workloads


def test_planner_runs_the_admitted_count_on_the_flavors_nodes(ctx: BuildContext) -> None:
    job = make_job(ELASTIC)
    body = the_workload(job, ctx)
    assert body["spec"]["podSets"][0]["count"] == 4
    assert body["spec"]["podSets"][0]["minCount"] == 1
    wl = as_stored(body, admitted_status(2))
    result = plan(job, ctx, observe_q(q_of(wl)), at(5))
    assert created(result) == [0, 1]
    assert result.status.workers is not None
    assert result.status.workers.desired == 2
    assert result.status.phase == "Pending"
    for pod in created_pods(result):
        spec = pod["spec"]
        assert spec["nodeSelector"]["kubedgx.io/pool"] == "norm"
        assert spec["nodeSelector"]["topology.kubernetes.io/zone"] == "zone-a"
        assert TEAM_TAINT in spec["tolerations"]
        assert spec["tolerations"].count(GPU_TAINT) == 1
    # Nothing but the PodsReady condition, as jobframework writes it (Kueue's waitForPodsReady).
    assert pods_ready_of(result) == ("False", "WaitForStart")
    # The admitted pods running: Running, all of the admitted count.
    job = step(job, result)
    pods = [make_pod(job, ctx, i, "running") for i in (0, 1)]
    running = plan(job, ctx, observe_q(q_of(wl), pods), at(30))
    assert running.status.phase == "Running"
    assert cond(running.status, "Running") == ("True", "AllWorkersRunning")
    assert created(running) == []
    assert pods_ready_of(running) == ("True", "Started")
    # Once the Workload says so, nothing more is written.
    (_, _, patch) = running.workloads.status[0]
    told = as_stored(body, {**admitted_status(2), "conditions": patch["conditions"]})
    again = plan(step(job, running), ctx, observe_q(q_of(told), pods), at(40))
    assert not again.workloads
    assert running.delete == []


def _admitted_and_running(ctx: BuildContext) -> tuple[DGXTrainingJob, dict[str, Any], list[dict[str, Any]]]:
    job = queued_job({"spec.elastic": {"minNodes": 2}})
    body = the_workload(job, ctx)
    wl = as_stored(body, admitted_status(2))
    first = plan(job, ctx, observe_q(q_of(wl)), at(5))
    assert created(first) == [0, 1]
    job = step(job, first)
    pods = [make_pod(job, ctx, i, "running") for i in (0, 1)]
    result = plan(job, ctx, observe_q(q_of(wl), pods), at(60))
    assert result.status.phase == "Running"
    return step(job, result), body, pods


def test_planner_evicted_job_stops_its_workers_without_counting_a_restart(ctx: BuildContext) -> None:
    job, body, pods = _admitted_and_running(ctx)
    assert job.status is not None
    restarts, attempt = job.status.restarts, job.status.attempt
    wl = as_stored(body, evicted_status(2))
    result = plan(job, ctx, observe_q(q_of(wl), pods), at(120))
    assert sorted(deleted(result)) == [0, 1]
    assert created(result) == []
    assert result.status.phase == "Suspended"
    assert suspended_reason(result) == ("True", "Preempted")
    assert result.status.restarts == restarts
    assert result.status.attempt == attempt
    assert result.status.start_time is None
    assert result.workloads.status == []  # the workers are still there
    # Once they are gone, the reservation is cleared (Kueue requeues the Workload).
    gone = plan(step(job, result), ctx, observe_q(q_of(wl)), at(150))
    [(name, rv, patch)] = gone.workloads.status
    assert (name, rv) == (wl.name, "500")
    assert patch["admission"] is None
    assert conditions_by_type(patch)["Requeued"]["status"] == "True"
    assert gone.status.restarts == restarts
    assert gone.status.attempt == attempt
    assert gone.status.phase == "Suspended"


def test_planner_marks_the_workload_finished_when_the_job_succeeds(ctx: BuildContext) -> None:
    job, body, _ = _admitted_and_running(ctx)
    wl = as_stored(body, admitted_status(2))
    pods = [make_pod(job, ctx, 0, "succeeded"), make_pod(job, ctx, 1, "succeeded")]
    result = plan(job, ctx, observe_q(q_of(wl), pods), at(600))
    assert result.status.phase == "Succeeded"
    assert result.workloads.create is None
    [(name, rv, patch)] = result.workloads.status
    assert (name, rv) == (wl.name, "500")
    finished = conditions_by_type(patch)["Finished"]
    assert finished["status"] == "True"
    assert finished["reason"] == "Succeeded"
    assert finished["message"] == "job-worker-0 exited 0: training completed"
    assert finished["lastTransitionTime"] == "2025-03-01T12:10:00Z"
    # Next pass, the Workload says Finished: nothing more to write.
    done = as_stored(body, {"conditions": patch["conditions"]})
    again = plan(step(job, result), ctx, observe_q(q_of(done)), at(660))
    assert not again.workloads


def test_planner_marks_the_workload_failed_when_the_job_fails(ctx: BuildContext) -> None:
    job, body, _ = _admitted_and_running(ctx)
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"restart_policy": "Never"})})
    wl = as_stored(body, admitted_status(2))
    pods = [make_pod(job, ctx, 0, "running"), make_pod(job, ctx, 1, "failed")]
    result = plan(job, ctx, observe_q(q_of(wl), pods), at(600))
    assert result.status.phase == "Failed"
    assert deleted(result) == [0]
    [(_, _, patch)] = result.workloads.status
    finished = conditions_by_type(patch)["Finished"]
    assert finished["reason"] == "Failed"
    assert "restartPolicy is Never" in finished["message"]


def test_planner_user_suspend_deactivates_the_workload(ctx: BuildContext) -> None:
    job, body, pods = _admitted_and_running(ctx)
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"suspend": True})})
    wl = as_stored(body, admitted_status(2), rv="501")
    result = plan(job, ctx, observe_q(q_of(wl), pods), at(120))
    assert result.status.phase == "Suspended"
    assert suspended_reason(result) == ("True", "Suspended")
    assert sorted(deleted(result)) == [0, 1]
    assert result.workloads.patch == [
        (wl.name, "501", {"spec": {"active": False}, "metadata": {"annotations": {DEACTIVATED_ANNOTATION: "true"}}})
    ]
    assert result.workloads.create is None


def test_planner_suspended_new_job_creates_an_inactive_workload(ctx: BuildContext) -> None:
    job = queued_job({"spec.suspend": True})
    result = plan(job, ctx, observe_q(q_of()), at(0))
    assert result.status.phase == "Suspended"
    assert suspended_reason(result) == ("True", "Suspended")
    assert result.workloads.create is not None
    assert result.workloads.create["spec"]["active"] is False
    assert created_pods(result) == []


def test_planner_without_queueing_runs_as_before(ctx: BuildContext) -> None:
    job = make_job({"spec.elastic": {"minNodes": 1, "maxNodes": 4}})
    result = plan(job, ctx, observe_q(None), at(0))
    baseline = plan(job, ctx, observe(), at(0))
    assert created(result) == [0, 1, 2, 3]
    assert result.create == baseline.create
    assert result.status.model_dump() == baseline.status.model_dump()
    assert not result.workloads
    for pod in created_pods(result):
        assert "kubedgx.io/pool" not in (pod["spec"].get("nodeSelector") or {})
        assert TEAM_TAINT not in pod["spec"]["tolerations"]


def test_planner_builds_the_workload_from_the_real_worker(ctx: BuildContext) -> None:
    job = queued_job({"spec.elastic": {"minNodes": 2, "maxNodes": 3}})
    body = the_workload(job, ctx)
    r = resolve(job.spec, ctx.catalog)
    worker = worker_pod(JobIdentity.of(job), job.spec, 0, r, ctx)
    assert body["spec"]["podSets"] == [pod_set(worker, 2, 3)]
    template = body["spec"]["podSets"][0]["template"]["spec"]
    assert template["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert "env" not in template["containers"][0]
    assert "volumes" not in template
    assert body["metadata"]["ownerReferences"][0]["uid"] == UID
    assert body["metadata"]["namespace"] == "ml"


def test_planner_spec_change_of_a_running_job_keeps_its_admission(ctx: BuildContext) -> None:
    """An edit of a running queued job (here minNodes) never stops it: it runs on what was admitted."""
    job, body, pods = _admitted_and_running(ctx)
    raw = job.model_dump(by_alias=True, exclude_none=True, mode="json")
    raw["spec"]["elastic"]["minNodes"] = 3
    grown = DGXTrainingJob.model_validate(raw)
    wl = as_stored(body, admitted_status(2))
    result = plan(grown, ctx, observe_q(q_of(wl), pods), at(120))
    assert (result.workloads.create, result.workloads.delete, result.workloads.patch) == (None, [], [])
    assert deleted(result) == []
    assert result.status.phase != "Suspended"


# --- a production bug: the queue label is part of the pod set --------------------------------------
#
# Job labels under kueue.x-k8s.io/ are propagated to the worker pods (render.names.propagated_labels),
# and pod_set_template keeps a worker's kueue.x-k8s.io/ labels, so the queue-name label ends up in
# the pod set and in its hash. Relabelling a job to another LocalQueue therefore reads as "the pod
# set changed": the Workload is deleted and recreated instead of getting spec.queueName patched
# (decide's branch for that is unreachable through the planner), and an admitted, running job is
# stopped (workers deleted) although decide means to leave an admitted Workload in its queue.
# The fix: leave QUEUE_LABEL out of pod_set_template's labels (or out of podset_hash).


def test_planner_relabelled_waiting_job_moves_its_workload(ctx: BuildContext) -> None:
    job = queued_job()
    wl = as_stored(the_workload(job, ctx), PENDING_STATUS, rv="600")
    moved = queued_job({"metadata.labels": {QUEUE_LABEL: "team-b"}}, status=job.status)
    result = plan(moved, ctx, observe_q(q_of(wl, queue="team-b")), at(10))
    assert result.workloads.delete == []
    assert result.workloads.patch == [(wl.name, "600", {"spec": {"queueName": "team-b"}})]


def test_planner_relabelled_running_job_keeps_running(ctx: BuildContext) -> None:
    job, body, pods = _admitted_and_running(ctx)
    raw = job.model_dump(by_alias=True, exclude_none=True, mode="json")
    raw["metadata"]["labels"][QUEUE_LABEL] = "team-b"
    moved = DGXTrainingJob.model_validate(raw)
    wl = as_stored(body, admitted_status(2))
    result = plan(moved, ctx, observe_q(q_of(wl, queue="team-b"), pods), at(120))
    assert result.delete == []
    assert result.workloads.delete == []
    assert result.status.phase == "Running"


def test_planner_a_job_whose_queue_label_went_deletes_its_workload_and_runs(ctx: BuildContext) -> None:
    """Unqueued (the label removed while it waited): its Workload is deleted, the job runs at once."""
    job = queued_job()
    wl = as_stored(the_workload(job, ctx), PENDING_STATUS)
    raw = job.model_dump(by_alias=True, exclude_none=True, mode="json")
    raw["metadata"]["labels"] = {}
    unqueued = DGXTrainingJob.model_validate(raw)
    result = plan(unqueued, ctx, observe_q(Queueing(None, api_version=V1B2, workloads=(wl,))), at(10))
    assert result.workloads.delete == [(wl.name, WL_UID)]
    assert result.workloads.create is None
    assert created(result) != []
    assert result.status.phase != "Suspended"
