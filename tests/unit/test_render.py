"""The pure builders: a DGXTrainingJob (+ catalog, defaults, data mounts) -> ConfigMap, Service, worker pods."""

from __future__ import annotations

import copy
import functools
import re
import subprocess
import sys
import uuid
from collections.abc import Mapping
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dgx_api.trainer_config import parse_config
from dgx_operator.api import DGXDataMountSpec, DGXTrainingJob
from dgx_operator.catalog import Catalog, Instance
from dgx_operator.render import (
    BuildContext,
    BuildError,
    Defaults,
    JobIdentity,
    Resolved,
    build_children,
    resolve,
    worker_pod,
)
from tests.conftest import BASE_JOB, DELETE
from tests.unit.render_helpers import (
    CATALOG,
    COMMAND_MODE,
    UID,
    assert_valid,
    build,
    context,
    job_obj,
    one_pod,
    pods_of,
    the_container,
    volume_at,
)

INSTANCE_NAMES = sorted(CATALOG.instances)
#: Whole-GPU shapes (any number of workers); MIG slices run one worker each.
WHOLE_GPU_NAMES = sorted(n for n, i in CATALOG.instances.items() if i.mig is None)
MIG_NAMES = sorted(n for n, i in CATALOG.instances.items() if i.mig is not None)

JOB_LABEL = "kubedgx.io/job-name"
GPU = "nvidia.com/gpu"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SPOT_TOLERATION = {"key": "kubedgx.io/capacity", "operator": "Equal", "value": "spot", "effect": "NoSchedule"}
OWNER = {
    "apiVersion": "kubedgx.io/v1alpha1",
    "kind": "DGXTrainingJob",
    "name": "job",
    "uid": UID,
    "controller": True,
    "blockOwnerDeletion": True,
}
TRAINER_ARGV = ["python", "-m", "dgx_trainer", "launch", "--config", "/etc/kubedgx/trainer.yaml"]


# --- helpers -------------------------------------------------------------------------------------


def env_names(pod: dict[str, Any]) -> list[str]:
    return [e["name"] for e in the_container(pod)["env"]]


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    """Literal env values by name; fails on a duplicate name."""
    names = env_names(pod)
    assert len(names) == len(set(names)), f"duplicate env names: {sorted(n for n in names if names.count(n) > 1)}"
    return {e["name"]: e["value"] for e in the_container(pod)["env"] if "value" in e}


def mount_paths(pod: dict[str, Any]) -> list[str]:
    return [m["mountPath"] for m in the_container(pod)["volumeMounts"]]


def per_gpu(inst: Instance) -> tuple[int, int, int]:
    pg = inst.family.per_gpu
    return pg.cpu, pg.memory_gi, pg.shm_gi


# --- children: order, names, Service -------------------------------------------------------------


def test_trainer_mode_children_in_creation_order() -> None:
    children = build({"spec.elastic": {"minNodes": 3}})
    config = children[0]["metadata"]["name"]
    assert re.fullmatch(r"job-trainer-[0-9a-f]{10}", config), config  # keyed by content (and the job's uid)
    assert [(c["kind"], c["metadata"]["name"]) for c in children] == [
        ("ConfigMap", config),
        ("Service", "job"),
        ("Pod", "job-worker-0"),
        ("Pod", "job-worker-1"),
        ("Pod", "job-worker-2"),
    ]
    assert {c["metadata"]["namespace"] for c in children} == {"ml"}


def test_command_mode_has_no_config_map() -> None:
    children = build(COMMAND_MODE)
    assert [(c["kind"], c["metadata"]["name"]) for c in children] == [("Service", "job"), ("Pod", "job-worker-0")]


def test_elastic_job_gets_max_nodes_workers() -> None:
    children = build({"spec.elastic": {"minNodes": 2, "maxNodes": 4}, **COMMAND_MODE})
    assert [c["metadata"]["name"] for c in pods_of(children)] == [f"job-worker-{i}" for i in range(4)]


def test_names_follow_the_job_name_and_namespace() -> None:
    children = build({"metadata.name": "llama-ft", "metadata.namespace": "team-a"})
    names = [c["metadata"]["name"] for c in children]
    assert re.fullmatch(r"llama-ft-trainer-[0-9a-f]{10}", names[0]), names
    assert names[1:] == ["llama-ft", "llama-ft-worker-0"]
    assert {c["metadata"]["namespace"] for c in children} == {"team-a"}


def test_namespace_argument_overrides_the_manifest() -> None:
    children = build(namespace="other")
    assert {c["metadata"]["namespace"] for c in children} == {"other"}
    assert env_of(pods_of(children)[0])["PET_RDZV_ENDPOINT"] == "job-worker-0.job.other.svc:29400"


def test_headless_service() -> None:
    children = build({"spec.elastic": {"rendezvous": {"port": 29555}}}, defaults=Defaults(master_port=24000))
    (svc,) = [c for c in children if c["kind"] == "Service"]
    assert svc["apiVersion"] == "v1"
    assert svc["metadata"]["name"] == "job"
    spec = svc["spec"]
    assert spec["clusterIP"] == "None"
    assert spec["publishNotReadyAddresses"] is True
    assert spec["selector"] == {JOB_LABEL: "job", "kubedgx.io/replica-index": "0"}
    assert [(p["name"], p["port"], p["targetPort"], p["protocol"]) for p in spec["ports"]] == [
        ("rdzv", 29555, 29555, "TCP"),
        ("master", 24000, 24000, "TCP"),
    ]


def test_service_selects_worker_0_and_no_worker_publishes_its_ip() -> None:
    """Worker 0's name is the rendezvous address; a Service selecting every worker would bring the
    scheduler's default spreading to all of them. No PET_LOCAL_ADDR: torchrun sorts a rendezvous'
    nodes by the address each registers, and only FQDNs keep worker 0 rank 0."""
    children = build({"spec.elastic": {"minNodes": 2, "maxNodes": 3}})
    (svc,) = [c for c in children if c["kind"] == "Service"]
    selected = []
    for pod in pods_of(children):
        labels = pod["metadata"]["labels"]
        if all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()):
            selected.append(pod["metadata"]["name"])
        assert "PET_LOCAL_ADDR" not in {e["name"] for e in the_container(pod)["env"]}
    assert selected == ["job-worker-0"]


@pytest.mark.parametrize("mode", ["trainer", "command"])
def test_interactive_debug_is_one_idle_worker_with_torchrun_env(mode: str) -> None:
    changes: dict[str, Any] = {"spec.debug": {"interactive": True}}
    if mode == "command":
        changes.update(COMMAND_MODE)
    children = build(changes)
    pods = pods_of(children)
    assert [p["metadata"]["name"] for p in pods] == ["job-worker-0"]
    container = the_container(pods[0])
    argv = [*container["command"], *container.get("args", [])]
    assert "torchrun" not in " ".join(argv)
    assert "/app/train.py" not in argv
    assert "sleep" in " ".join(argv)
    env = env_of(pods[0])
    assert env["PET_NNODES"] == "1"
    assert env["PET_NPROC_PER_NODE"] == "8"
    assert env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_RDZV_ENDPOINT"] == "job-worker-0.job.ml.svc:29400"
    assert env["PET_RDZV_ID"] == UID
    assert env["PET_NODE_RANK"] == "0"
    # interactive implies debug logging
    assert env["NCCL_DEBUG"] == "INFO"


# --- every child validates against the Kubernetes schemas ----------------------------------------


@functools.cache
def built_for_instance(name: str) -> tuple[dict[str, Any], ...]:
    """Two workers on ``name`` (trainer mode), built once per instance for the tests below."""
    return tuple(build({"spec.instance": name, "spec.elastic": {"minNodes": 2}}))


@pytest.mark.parametrize("name", WHOLE_GPU_NAMES)
def test_every_instance_builds_valid_children(name: str) -> None:
    children = list(built_for_instance(name))
    assert [c["kind"] for c in children] == ["ConfigMap", "Service", "Pod", "Pod"]
    assert_valid(children)


@pytest.mark.parametrize("name", WHOLE_GPU_NAMES)
def test_every_instance_sizes_its_workers(name: str) -> None:
    """g GPUs of a node take g x perGpu of its CPU, memory and shm (catalog.yaml's header)."""
    inst = CATALOG.instances[name]
    cpu, memory_gi, shm_gi = per_gpu(inst)
    expected = {"cpu": str(cpu * inst.gpus), "memory": f"{memory_gi * inst.gpus}Gi", GPU: str(inst.gpus)}
    for pod in pods_of(list(built_for_instance(name))):
        resources = the_container(pod)["resources"]
        assert resources["requests"] == expected
        assert resources["limits"] == expected
        _, shm = volume_at(pod, "/dev/shm")
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{shm_gi * inst.gpus}Gi"}
        env = env_of(pod)
        assert env["PET_NPROC_PER_NODE"] == str(inst.gpus)
        assert env["WORLD_SIZE"] == str(2 * inst.gpus)


def resolve_gpus(pod: dict[str, Any]) -> int:
    return int(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])


@pytest.mark.parametrize("name", WHOLE_GPU_NAMES)
def test_every_instance_places_its_workers(name: str) -> None:
    """A whole-node shape on nodes of exactly its GPUs; a smaller one on any node of the product with at
    least its GPUs (shared with other jobs), never two of its job's workers on one node."""
    inst = CATALOG.instances[name]
    node_gpus = inst.family.node_gpus
    count = (
        {"key": "nvidia.com/gpu.count", "operator": "In", "values": [str(node_gpus)]}
        if inst.gpus == node_gpus
        else {"key": "nvidia.com/gpu.count", "operator": "Gt", "values": [str(inst.gpus - 1)]}
    )
    for pod in pods_of(list(built_for_instance(name))):
        spec = pod["spec"]
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [
            {
                "matchExpressions": [
                    {"key": "nvidia.com/gpu.product", "operator": "In", "values": list(inst.family.products)},
                    count,
                ]
            }
        ]
        if inst.family.multi_node_nvlink:  # two workers: one NVLink clique
            assert set(spec["affinity"]["podAffinity"]) == {"requiredDuringSchedulingIgnoredDuringExecution"}
        else:  # the catalog names no topologyKey: no preference the scheduler pays for on every pod
            assert "podAffinity" not in spec["affinity"]
        if resolve_gpus(pod) < node_gpus:  # part of a node: hard, one worker per node (test_one_worker_per_node)
            assert spec["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "DoNotSchedule"
        elif pod["metadata"]["labels"]["kubedgx.io/replica-index"] != "0":
            # The GPU request keeps a second worker off; no spreading for the scheduler to score.
            assert "topologySpreadConstraints" not in spec
        else:  # worker 0, which the Service selects: a soft spread in place of the scheduler's default
            assert spec["topologySpreadConstraints"] == [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": {JOB_LABEL: pod["metadata"]["labels"][JOB_LABEL]}},
                    "nodeAffinityPolicy": "Ignore",
                    "nodeTaintsPolicy": "Ignore",
                }
            ]
        capacity = CATALOG.spec.capacities[inst.capacity]
        pool_tolerations = [t.model_dump(by_alias=True, exclude_none=True) for t in capacity.tolerations]
        assert spec["tolerations"] == [GPU_TOLERATION, *pool_tolerations]
        assert spec.get("nodeSelector", {}) == dict(capacity.node_selector)
        assert pod["metadata"]["annotations"]["kubedgx.io/instance"] == name


MOUNT_REF = [{"name": "data", "mountPath": "/data"}]
SCENARIOS: dict[str, tuple[dict[str, Any], dict[str, dict[str, Any]]]] = {
    "trainer": ({}, {}),
    "command": (COMMAND_MODE, {}),
    "command-no-args": ({**COMMAND_MODE, "spec.args": DELETE}, {}),
    "elastic": ({"spec.elastic": {"minNodes": 2, "maxNodes": 4, "nprocPerNode": 4, "maxRestarts": 10}}, {}),
    "debug": ({"spec.debug": {"enabled": True}, "spec.env": [{"name": "NCCL_DEBUG", "value": "WARN"}]}, {}),
    "interactive": ({"spec.debug": {"interactive": True}}, {}),
    "hostpath-default": ({"spec.dataMounts": MOUNT_REF}, {"data": {}}),
    "hostpath-explicit": (
        {"spec.dataMounts": MOUNT_REF},
        {"data": {"cache": {"type": "hostPath", "path": "/mnt/nvme"}}},
    ),
    "pvc": (
        {"spec.dataMounts": MOUNT_REF},
        {"data": {"cache": {"type": "pvc", "size": "500Gi", "storageClassName": "local-nvme"}}},
    ),
    "out-mount": (
        {"spec.dataMounts": [*MOUNT_REF, {"name": "ckpt", "mountPath": "/workspace/output"}]},
        {"data": {}, "ckpt": {"direction": "Out", "source": "s3://bucket/out"}},
    ),
    "spot": (
        {
            "spec.instance": "dgxh100.80g.8.spot",
            "spec.nodeSelector": {"example.com/rack": "r1"},
            "spec.tolerations": [
                {"key": "example.com/maint", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}
            ],
        },
        {},
    ),
    "everything": (
        {
            "metadata.labels": {"kueue.x-k8s.io/queue-name": "team-a", "team": "ml"},
            "spec.instance": "dgxgb200.186g.4.debug",
            "spec.priority": "high",
            "spec.maxDuration": "1h30m",
            "spec.image": "registry.example.com/team/trainer:1.2.3",
            "spec.resources": {"gpu": 2, "cpu": 64, "memory": "512Gi", "shm": "32Gi"},
            "spec.serviceAccountName": "trainer",
            "spec.imagePullSecrets": [{"name": "regcred"}],
            "spec.env": [
                {"name": "HF_HOME", "value": "/cache/hf"},
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
            ],
            "spec.restartPolicy": "ExitCode",
            "spec.retryableExitCodes": [1, 137],
        },
        {},
    ),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_scenario_children_validate(scenario: str) -> None:
    changes, mounts = SCENARIOS[scenario]
    children = build(changes, mounts=mounts)
    assert pods_of(children)
    assert_valid(children)
    for pod in pods_of(children):
        env_of(pod)  # unique env names
        paths = mount_paths(pod)
        assert len(paths) == len(set(paths))
        volumes = [v["name"] for v in pod["spec"]["volumes"]]
        assert len(volumes) == len(set(volumes))
        assert {m["name"] for m in the_container(pod)["volumeMounts"]} == set(volumes)


# --- pods ----------------------------------------------------------------------------------------


def test_pods_restart_never_with_stable_dns() -> None:
    pods = pods_of(build({"spec.elastic": {"minNodes": 3}}))
    for i, pod in enumerate(pods):
        spec = pod["spec"]
        assert spec["restartPolicy"] == "Never"
        assert spec["hostname"] == f"job-worker-{i}"
        assert spec["subdomain"] == "job"
        assert f"{spec['hostname']}.{spec['subdomain']}" == f"job-worker-{i}.job"


def test_gpu_limits_default_to_the_instance() -> None:
    resources = the_container(one_pod({"spec.instance": "dgxh200.141g.4.norm"}))["resources"]
    assert resources["limits"][GPU] == "4"
    assert resources["requests"][GPU] == "4"


def test_gpu_override_asks_the_share_of_its_gpus_like_the_smaller_shape() -> None:
    """resources.gpu: 2 on an 8-GPU shape renders the requests and placement of the 2-GPU shape (the
    instance annotation aside): the rest of the node stays free for other jobs (issue 32)."""
    pod = one_pod({"spec.resources": {"gpu": 2}})
    resources = the_container(pod)["resources"]
    assert resources["limits"] == resources["requests"] == {"cpu": "56", "memory": "440Gi", GPU: "2"}
    _, shm = volume_at(pod, "/dev/shm")
    assert shm["emptyDir"]["sizeLimit"] == "32Gi"
    assert env_of(pod)["PET_NPROC_PER_NODE"] == "2"
    shape = one_pod({"spec.instance": "dgxa100.80g.2.norm"})
    assert the_container(shape)["resources"] == resources
    assert shape["spec"]["affinity"] == pod["spec"]["affinity"]
    exprs = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]["matchExpressions"]
    assert {"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["1"]} in exprs
    # An explicit CPU still wins over the share.
    explicit = the_container(one_pod({"spec.resources": {"gpu": 2, "cpu": 100}}))["resources"]["requests"]
    assert explicit == {"cpu": "100", "memory": "440Gi", GPU: "2"}


def test_guaranteed_qos_with_instance_defaults() -> None:
    # dgxa100.80g.8: 28 cpu, 220Gi memory and 16Gi shm per GPU.
    pod = one_pod()
    resources = the_container(pod)["resources"]
    expected = {"cpu": "224", "memory": "1760Gi", GPU: "8"}
    assert resources == {"requests": expected, "limits": expected}
    _, shm = volume_at(pod, "/dev/shm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "128Gi"}


def test_guaranteed_qos_with_overrides() -> None:
    pod = one_pod({"spec.resources": {"cpu": 96, "memory": "900Gi", "shm": "64Gi"}})
    resources = the_container(pod)["resources"]
    expected = {"cpu": "96", "memory": "900Gi", GPU: "8"}
    assert resources == {"requests": expected, "limits": expected}
    _, shm = volume_at(pod, "/dev/shm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}


def test_shm_mount_is_writable() -> None:
    mount, _ = volume_at(one_pod(), "/dev/shm")
    assert not mount.get("readOnly", False)


def test_node_affinity_on_product_and_count() -> None:
    """A 4-GPU shape: an H100 node with more than 3 GPUs (an 8-GPU DGX, shared with others)."""
    pod = one_pod({"spec.instance": "dgxh100.80g.4.norm"})
    node_affinity = pod["spec"]["affinity"]["nodeAffinity"]
    assert node_affinity == {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {
                            "key": "nvidia.com/gpu.product",
                            "operator": "In",
                            "values": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB"],
                        },
                        {"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["3"]},
                    ]
                }
            ]
        }
    }


def test_one_worker_per_node() -> None:
    """A worker asking part of a node's GPUs is kept off nodes where one of its job's runs; a
    whole-node worker needs no such term: it asks every GPU the node has (the GPU-count term)."""
    part = one_pod({"spec.resources.gpu": 4, "spec.elastic": {"minNodes": 2, "maxNodes": 3}})["spec"]
    assert "podAntiAffinity" not in part["affinity"]  # it would tax every later pod of the cluster
    assert part["topologySpreadConstraints"] == [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {JOB_LABEL: "job"}},
            "minDomains": 3,
        }
    ]
    whole = pods_of(build({"spec.elastic": {"minNodes": 2}}))
    assert all("podAntiAffinity" not in p["spec"]["affinity"] for p in whole)
    assert "topologySpreadConstraints" not in whole[1]["spec"]
    assert whole[0]["spec"]["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "ScheduleAnyway"
    whole = whole[0]["spec"]
    gpus = whole["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    count = whole["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert {"key": "nvidia.com/gpu.count", "operator": "In", "values": [gpus]} in count["matchExpressions"]


def test_gb200_requires_one_nvlink_clique() -> None:
    pod_affinity = one_pod({"spec.instance": "dgxgb200.186g.4.norm"})["spec"]["affinity"]["podAffinity"]
    assert pod_affinity == {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {JOB_LABEL: "job"}}, "topologyKey": "nvidia.com/gpu.clique"}
        ]
    }


@pytest.mark.parametrize("instance", ["dgxa100.40g.8.norm", "dgxh100.80g.8.spot", "dgxb200.180g.2.debug"])
def test_other_products_prefer_the_topology_key_when_the_catalog_names_one(instance: str) -> None:
    assert "podAffinity" not in one_pod({"spec.instance": instance})["spec"]["affinity"]  # by default: none
    data = CATALOG.spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    data["topologyKey"] = "topology.kubernetes.io/zone"
    zoned = Catalog.from_mapping(data)
    pod_affinity = one_pod({"spec.instance": instance}, catalog=zoned)["spec"]["affinity"]["podAffinity"]
    assert pod_affinity == {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "labelSelector": {"matchLabels": {JOB_LABEL: "job"}},
                    "topologyKey": "topology.kubernetes.io/zone",
                },
            }
        ]
    }


def test_topology_key_and_labels_come_from_the_catalog() -> None:
    data = CATALOG.spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    data["topologyKey"] = "network.example.com/rail-block"
    data["labels"] = {"product": "example.com/gpu-model", "count": "example.com/gpus", "clique": "example.com/nvl"}
    custom = Catalog.from_mapping(data)
    affinity = one_pod(catalog=custom)["spec"]["affinity"]
    term = affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "network.example.com/rail-block"
    exprs = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"
    ]
    assert [e["key"] for e in exprs] == ["example.com/gpu-model", "example.com/gpus"]
    gb200 = one_pod({"spec.instance": "dgxgb200.186g.4.norm"}, catalog=custom)["spec"]["affinity"]
    assert gb200["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"] == (
        "example.com/nvl"
    )


def test_norm_has_no_node_selector_and_only_the_gpu_toleration() -> None:
    spec = one_pod()["spec"]
    assert "nodeSelector" not in spec
    assert spec["tolerations"] == [GPU_TOLERATION]


def test_spot_selects_and_tolerates_the_spot_pool() -> None:
    spec = one_pod({"spec.instance": "dgxa100.80g.8.spot"})["spec"]
    assert spec["nodeSelector"] == {"kubedgx.io/capacity": "spot"}
    assert spec["tolerations"] == [GPU_TOLERATION, SPOT_TOLERATION]


def test_user_node_selector_and_tolerations_are_added() -> None:
    user_toleration = {"key": "example.com/maint", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}
    spec = one_pod(
        {
            "spec.instance": "dgxa100.80g.8.spot",
            "spec.nodeSelector": {"example.com/rack": "r1"},
            "spec.tolerations": [user_toleration, {"key": "example.com/dedicated", "value": "ml"}],
        }
    )["spec"]
    assert spec["nodeSelector"] == {"kubedgx.io/capacity": "spot", "example.com/rack": "r1"}
    assert spec["tolerations"] == [
        GPU_TOLERATION,
        SPOT_TOLERATION,
        user_toleration,
        {"key": "example.com/dedicated", "value": "ml"},
    ]


def test_user_node_selector_on_norm() -> None:
    spec = one_pod({"spec.nodeSelector": {"example.com/rack": "r1"}})["spec"]
    assert spec["nodeSelector"] == {"example.com/rack": "r1"}


@pytest.mark.parametrize(
    ("priority", "klass"), [("low", "kubedgx-low"), ("normal", "kubedgx-normal"), ("high", "kubedgx-high")]
)
def test_priority_class(priority: str, klass: str) -> None:
    assert one_pod({"spec.priority": priority})["spec"]["priorityClassName"] == klass


def test_default_priority_is_normal() -> None:
    assert one_pod()["spec"]["priorityClassName"] == "kubedgx-normal"


def test_priority_class_names_come_from_defaults() -> None:
    defaults = Defaults(priority_classes={"high": "team-urgent"})
    assert one_pod({"spec.priority": "high"}, defaults=defaults)["spec"]["priorityClassName"] == "team-urgent"
    assert "priorityClassName" not in one_pod({"spec.priority": "low"}, defaults=defaults)["spec"]


@pytest.mark.parametrize(("duration", "seconds"), [("6h", 21600), ("1h30m", 5400), ("45m", 2700), ("90s", 90)])
def test_active_deadline_from_max_duration(duration: str, seconds: int) -> None:
    pods = pods_of(build({"spec.maxDuration": duration, "spec.elastic": {"minNodes": 2}}))
    assert [p["spec"]["activeDeadlineSeconds"] for p in pods] == [seconds, seconds]


def test_no_active_deadline_without_max_duration() -> None:
    assert "activeDeadlineSeconds" not in one_pod()["spec"]


def _direct(changes: Mapping[str, Any] | None = None) -> tuple[JobIdentity, DGXTrainingJob, BuildContext, Resolved]:
    job = DGXTrainingJob.model_validate(job_obj(changes))
    ctx = context()
    ident = JobIdentity.of(job, uid=UID)
    return ident, job, ctx, resolve(job.spec, ctx.catalog)


def test_worker_pod_deadline_argument_overrides_max_duration() -> None:
    ident, job, ctx, r = _direct({"spec.maxDuration": "6h"})
    pod = worker_pod(ident, job.spec, 0, r, ctx, active_deadline_seconds=1234)
    assert pod["spec"]["activeDeadlineSeconds"] == 1234


def test_worker_pod_deadline_argument_without_max_duration() -> None:
    ident, job, ctx, r = _direct()
    pod = worker_pod(ident, job.spec, 0, r, ctx, active_deadline_seconds=600)
    assert pod["spec"]["activeDeadlineSeconds"] == 600


def test_worker_pod_attempt_argument() -> None:
    ident, job, ctx, r = _direct({"spec.elastic": {"minNodes": 2}})
    pod = worker_pod(ident, job.spec, 1, r, ctx, attempt=3)
    assert pod["metadata"]["name"] == "job-worker-1"
    labels = pod["metadata"]["labels"]
    assert labels["kubedgx.io/attempt"] == "3"
    assert labels["kubedgx.io/replica-index"] == "1"
    env = env_of(pod)
    assert env["KUBEDGX_ATTEMPT"] == "3"
    assert env["PET_NODE_RANK"] == "1"


def test_owner_references_on_every_child() -> None:
    children = build({"spec.elastic": {"minNodes": 2}})
    assert len(children) == 4
    for child in children:
        assert child["metadata"]["ownerReferences"] == [OWNER]


def test_owner_uid_from_metadata_when_no_argument() -> None:
    children = build({"metadata.uid": "11111111-2222-3333-4444-555555555555"}, uid=None)
    refs = [c["metadata"]["ownerReferences"][0]["uid"] for c in children]
    assert refs == ["11111111-2222-3333-4444-555555555555"] * len(children)
    assert env_of(pods_of(children)[0])["PET_RDZV_ID"] == "11111111-2222-3333-4444-555555555555"


def test_uid_argument_wins_over_metadata() -> None:
    children = build({"metadata.uid": "11111111-2222-3333-4444-555555555555"}, uid=UID)
    assert {c["metadata"]["ownerReferences"][0]["uid"] for c in children} == {UID}


def test_placeholder_uid_is_stable_per_job() -> None:
    first = build(uid=None)[0]["metadata"]["ownerReferences"][0]["uid"]
    again = build(uid=None)[0]["metadata"]["ownerReferences"][0]["uid"]
    other = build({"metadata.name": "other"}, uid=None)[0]["metadata"]["ownerReferences"][0]["uid"]
    assert first == again
    assert first != other
    assert str(uuid.UUID(first)) == first


def test_pod_labels() -> None:
    pods = pods_of(
        build(
            {
                "spec.elastic": {"minNodes": 2},
                "metadata.labels": {
                    "kueue.x-k8s.io/queue-name": "team-a",
                    "kueue.x-k8s.io/priority-class": "urgent",
                    "team": "ml",
                    "app.kubernetes.io/name": "my-app",
                },
            }
        )
    )
    for i, pod in enumerate(pods):
        labels = pod["metadata"]["labels"]
        assert labels[JOB_LABEL] == "job"
        assert labels["kubedgx.io/replica-index"] == str(i)
        assert labels["kubedgx.io/attempt"] == "0"
        assert labels["kueue.x-k8s.io/queue-name"] == "team-a"
        assert labels["kueue.x-k8s.io/priority-class"] == "urgent"
        assert "team" not in labels
        assert labels["app.kubernetes.io/name"] == "kubedgx"


def test_job_labels_do_not_reach_service_or_config_map() -> None:
    children = build({"metadata.labels": {"kueue.x-k8s.io/queue-name": "team-a"}})
    for child in children:
        if child["kind"] != "Pod":
            assert "kueue.x-k8s.io/queue-name" not in child["metadata"]["labels"]
            assert child["metadata"]["labels"][JOB_LABEL] == "job"


def test_termination_message() -> None:
    container = the_container(one_pod())
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_optional_pod_fields() -> None:
    spec = one_pod({"spec.serviceAccountName": "trainer", "spec.imagePullSecrets": [{"name": "regcred"}]})["spec"]
    assert spec["serviceAccountName"] == "trainer"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    plain = one_pod()["spec"]
    assert "serviceAccountName" not in plain
    assert "imagePullSecrets" not in plain


def test_container_ports() -> None:
    ports = the_container(one_pod({"spec.elastic": {"rendezvous": {"port": 29555}}}))["ports"]
    assert ports == [
        {"name": "rdzv", "containerPort": 29555, "protocol": "TCP"},
        {"name": "master", "containerPort": 23456, "protocol": "TCP"},
    ]


# --- torchrun environment ------------------------------------------------------------------------


def test_non_elastic_two_nodes() -> None:
    pods = pods_of(build({"spec.elastic": {"minNodes": 2}}))
    assert len(pods) == 2
    for i, pod in enumerate(pods):
        env = env_of(pod)
        assert env["PET_NNODES"] == "2"
        assert env["PET_NODE_RANK"] == str(i)
        assert env["WORLD_SIZE"] == "16"
        assert env["PET_NPROC_PER_NODE"] == "8"


def test_min_equal_max_is_not_elastic() -> None:
    pods = pods_of(build({"spec.elastic": {"minNodes": 2, "maxNodes": 2}}))
    assert [env_of(p)["PET_NNODES"] for p in pods] == ["2", "2"]
    assert [env_of(p)["PET_NODE_RANK"] for p in pods] == ["0", "1"]


def test_elastic_two_to_four() -> None:
    pods = pods_of(build({"spec.elastic": {"minNodes": 2, "maxNodes": 4}}))
    assert len(pods) == 4
    for pod in pods:
        env = env_of(pod)
        assert env["PET_NNODES"] == "2:4"
        assert "PET_NODE_RANK" not in env
        assert "WORLD_SIZE" not in env
        assert env["PET_NPROC_PER_NODE"] == "8"


def test_nproc_per_node_follows_elastic_setting() -> None:
    pods = pods_of(build({"spec.elastic": {"minNodes": 2, "nprocPerNode": 4}}))
    for pod in pods:
        env = env_of(pod)
        assert env["PET_NPROC_PER_NODE"] == "4"
        assert env["WORLD_SIZE"] == "8"


def test_rendezvous_settings() -> None:
    env = env_of(
        one_pod(
            {
                "metadata.name": "llama",
                "metadata.namespace": "team-a",
                "spec.elastic": {
                    "maxRestarts": 7,
                    "rendezvous": {"port": 29555, "joinTimeout": "20m", "lastCallTimeout": "45s"},
                },
            },
            defaults=Defaults(master_port=24000),
        )
    )
    assert env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_RDZV_ENDPOINT"] == "llama-worker-0.llama.team-a.svc:29555"
    assert env["PET_RDZV_ID"] == UID
    assert env["PET_MAX_RESTARTS"] == "7"
    assert env["PET_RDZV_CONF"] == "join_timeout=1200,last_call_timeout=45"
    assert env["MASTER_ADDR"] == "llama-worker-0.llama.team-a.svc"
    assert env["MASTER_PORT"] == "24000"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_rendezvous_defaults() -> None:
    env = env_of(one_pod())
    assert env["PET_RDZV_ENDPOINT"] == "job-worker-0.job.ml.svc:29400"
    assert env["PET_MAX_RESTARTS"] == "3"
    assert env["PET_RDZV_CONF"] == "join_timeout=900,last_call_timeout=30"
    assert env["MASTER_ADDR"] == "job-worker-0.job.ml.svc"
    assert env["MASTER_PORT"] == "23456"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_every_worker_points_at_worker_zero() -> None:
    pods = pods_of(build({"spec.elastic": {"minNodes": 2, "maxNodes": 3}}))
    assert {env_of(p)["PET_RDZV_ENDPOINT"] for p in pods} == {"job-worker-0.job.ml.svc:29400"}
    assert {env_of(p)["MASTER_ADDR"] for p in pods} == {"job-worker-0.job.ml.svc"}


def test_user_env_comes_after_ours() -> None:
    user = [
        {"name": "HF_HOME", "value": "/cache/hf"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
    ]
    env = the_container(one_pod({"spec.env": user}))["env"]
    assert env[-2:] == user
    names = [e["name"] for e in env]
    for ours in ("PET_NNODES", "PET_RDZV_ENDPOINT", "MASTER_ADDR", "WORLD_SIZE", "KUBEDGX_JOB_NAME"):
        assert names.index(ours) < names.index("HF_HOME")


def test_debug_sets_verbose_logging() -> None:
    env = env_of(one_pod({"spec.debug": {"enabled": True}}))
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["TORCH_DISTRIBUTED_DEBUG"] == "INFO"  # DETAIL crashes DDP: tests/trainer/test_debug_env.py
    assert "NCCL_DEBUG" not in env_of(one_pod())


def test_user_variable_replaces_the_operator_default() -> None:
    pod = one_pod({"spec.debug": {"enabled": True}, "spec.env": [{"name": "NCCL_DEBUG", "value": "WARN"}]})
    entries = [e for e in the_container(pod)["env"] if e["name"] == "NCCL_DEBUG"]
    assert entries == [{"name": "NCCL_DEBUG", "value": "WARN"}]
    assert env_of(pod)["TORCH_DISTRIBUTED_DEBUG"] == "INFO"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_env_names_unique(scenario: str) -> None:
    changes, mounts = SCENARIOS[scenario]
    for pod in pods_of(build(changes, mounts=mounts)):
        names = env_names(pod)
        assert len(names) == len(set(names))
        assert "PET_NNODES" in names


# --- trainer mode --------------------------------------------------------------------------------

RICH_TRAINER: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B", "revision": "main", "dtype": "bfloat16"},
    "dataset": {"path": "/data/train.jsonl", "evalFraction": 0.05},
    "lora": {"r": 64, "alpha": 128, "targetModules": ["q_proj", "v_proj"]},
    "training": {"epochs": 2.5, "learningRate": 1e-5, "perDeviceBatchSize": 2, "evalSteps": 50},
    "output": {"dir": "/ckpt/run1", "saveMerged": True},
}


@pytest.mark.parametrize("trainer", [BASE_JOB["spec"]["trainer"], RICH_TRAINER], ids=["base", "rich"])
def test_config_map_round_trips_the_trainer_config(trainer: dict[str, Any]) -> None:
    job = DGXTrainingJob.model_validate(job_obj({"spec.trainer": trainer}))
    (config_map,) = [c for c in build_children(job, context(), uid=UID) if c["kind"] == "ConfigMap"]
    assert set(config_map["data"]) == {"trainer.yaml"}
    parsed = parse_config(yaml.safe_load(config_map["data"]["trainer.yaml"]), "trainer.yaml")
    assert parsed == job.spec.trainer
    assert parsed == parse_config(trainer)


def test_config_map_spells_out_defaults() -> None:
    (config_map,) = [c for c in build() if c["kind"] == "ConfigMap"]
    data = yaml.safe_load(config_map["data"]["trainer.yaml"])
    assert data["model"] == {"name": "org/model", "trustRemoteCode": False, "dtype": "auto"}
    assert data["dataset"]["path"] == "/data/train.jsonl"
    assert data["dataset"]["split"] == "train"
    assert data["lora"]["r"] == 16
    assert data["lora"]["alpha"] == 32
    assert data["lora"]["dropout"] == 0.05
    assert data["quantization"]["quantType"] == "nf4"
    assert data["training"]["epochs"] == 1.0
    assert data["training"]["learningRate"] == 2e-4
    assert data["training"]["seed"] == 42
    assert data["output"] == {"dir": "/workspace/output", "saveMerged": False}
    assert data["allowCpu"] is False


def test_trainer_pod_runs_the_builtin_trainer() -> None:
    pod = one_pod()
    container = the_container(pod)
    assert [*container["command"], *container["args"]] == TRAINER_ARGV
    mount, volume = volume_at(pod, "/etc/kubedgx")
    assert mount["readOnly"] is True
    (config,) = [c for c in build() if c["kind"] == "ConfigMap"]
    assert volume["configMap"] == {"name": config["metadata"]["name"]}
    assert pod["metadata"]["labels"]["kubedgx.io/trainer-config"] == config["metadata"]["name"].rsplit("-", 1)[1]
    assert env_of(pod)["KUBEDGX_TRAINER_CONFIG"] == "/etc/kubedgx/trainer.yaml"


def test_trainer_config_dir_from_defaults() -> None:
    pod = one_pod(defaults=Defaults(config_dir="/opt/kubedgx/config"))
    container = the_container(pod)
    assert container["args"] == ["-m", "dgx_trainer", "launch", "--config", "/opt/kubedgx/config/trainer.yaml"]
    mount, _ = volume_at(pod, "/opt/kubedgx/config")
    assert mount["readOnly"] is True


def test_output_dir_gets_an_empty_dir() -> None:
    mount, volume = volume_at(one_pod(), "/workspace/output")
    assert volume["emptyDir"] == {}
    assert not mount.get("readOnly", False)


def test_custom_output_dir_gets_an_empty_dir() -> None:
    mount, volume = volume_at(one_pod({"spec.trainer.output": {"dir": "/ckpt/run1"}}), "/ckpt/run1")
    assert volume["emptyDir"] == {}
    assert not mount.get("readOnly", False)


def test_relative_output_dir_gets_no_volume() -> None:
    pod = one_pod({"spec.trainer.output": {"dir": "out"}})
    assert not any(v.get("emptyDir") == {} for v in pod["spec"]["volumes"])
    assert mount_paths(pod) == ["/dev/shm", "/etc/kubedgx"]


@pytest.mark.parametrize("mount_path", ["/workspace/output", "/workspace", "/workspace/"])
def test_out_mount_covering_the_output_dir_replaces_the_empty_dir(mount_path: str) -> None:
    pod = one_pod(
        {"spec.dataMounts": [{"name": "ckpt", "mountPath": mount_path}]},
        mounts={"ckpt": {"direction": "Out", "source": "s3://bucket/out"}},
    )
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["dshm", "trainer-config", "data-0"]
    assert mount_paths(pod) == ["/dev/shm", "/etc/kubedgx", mount_path]
    mount, volume = volume_at(pod, mount_path)
    assert mount["readOnly"] is False
    # One directory per job run (name and UID) under the mount's directory on the node.
    assert volume["hostPath"]["type"] == "DirectoryOrCreate"
    assert re.fullmatch(r"/raid/kubedgx/ml/ckpt/job-[0-9a-f]{8}", volume["hostPath"]["path"])


def test_out_mount_beside_the_output_dir_does_not_cover_it() -> None:
    pod = one_pod(
        {"spec.dataMounts": [{"name": "ckpt", "mountPath": "/workspace/output2"}]},
        mounts={"ckpt": {"direction": "Out"}},
    )
    _, volume = volume_at(pod, "/workspace/output")
    assert volume["emptyDir"] == {}


def test_in_mount_is_read_only() -> None:
    pod = one_pod({"spec.dataMounts": [{"name": "data", "mountPath": "/data"}]}, mounts={"data": {"direction": "In"}})
    mount, _ = volume_at(pod, "/data")
    assert mount["readOnly"] is True
    _, output = volume_at(pod, "/workspace/output")
    assert output["emptyDir"] == {}


@pytest.mark.parametrize("mount_path", ["/workspace", "/workspace/output"])
def test_output_dir_inside_an_input_mount_is_refused(mount_path: str) -> None:
    """A read-only input cannot hold outputs (nor host a writable mount point inside it)."""
    with pytest.raises(BuildError) as info:
        one_pod({"spec.dataMounts": [{"name": "data", "mountPath": mount_path}]}, mounts={"data": {"direction": "In"}})
    assert info.value.path == "spec.trainer.output.dir"
    assert f"inside {mount_path}," in info.value.message


@pytest.mark.parametrize("mount_path", ["/dev/shm", "/etc/kubedgx"])
def test_data_mount_at_a_path_kubedgx_uses_is_refused(mount_path: str) -> None:
    with pytest.raises(BuildError) as info:
        one_pod({"spec.dataMounts": [{"name": "data", "mountPath": mount_path}]}, mounts={"data": {}})
    assert info.value.path == "spec.dataMounts[0].mountPath"


def test_data_mount_volumes_in_order() -> None:
    pod = one_pod(
        {
            "spec.dataMounts": [
                {"name": "data", "mountPath": "/data"},
                {"name": "models", "mountPath": "/models"},
                {"name": "ckpt", "mountPath": "/workspace/output"},
            ]
        },
        mounts={
            "data": {},
            "models": {"cache": {"type": "pvc", "size": "1Ti"}},
            "ckpt": {"direction": "Out"},
        },
    )
    mounts = the_container(pod)["volumeMounts"]
    assert [(m["name"], m["mountPath"], m.get("readOnly")) for m in mounts] == [
        ("dshm", "/dev/shm", None),
        ("trainer-config", "/etc/kubedgx", True),
        ("data-0", "/data", True),
        ("data-1", "/models", True),
        ("data-2", "/workspace/output", False),
    ]


def test_host_path_cache_default_root() -> None:
    pod = one_pod({"spec.dataMounts": [{"name": "data", "mountPath": "/data"}]}, mounts={"data": {}})
    _, volume = volume_at(pod, "/data")
    assert volume["hostPath"] == {"path": "/raid/kubedgx/ml/data", "type": "DirectoryOrCreate"}


def test_host_path_cache_explicit_path_and_default_root() -> None:
    explicit = one_pod(
        {"spec.dataMounts": [{"name": "data", "mountPath": "/data"}]},
        mounts={"data": {"cache": {"type": "hostPath", "path": "/mnt/nvme"}}},
    )
    assert volume_at(explicit, "/data")[1]["hostPath"]["path"] == "/mnt/nvme/ml/data"
    rooted = one_pod(
        {"spec.dataMounts": [{"name": "data", "mountPath": "/data"}]},
        mounts={"data": {}},
        defaults=Defaults(cache_root="/scratch"),
    )
    assert volume_at(rooted, "/data")[1]["hostPath"]["path"] == "/scratch/ml/data"


def test_pvc_cache_is_a_generic_ephemeral_volume() -> None:
    pod = one_pod(
        {"spec.dataMounts": [{"name": "data", "mountPath": "/data"}]},
        mounts={"data": {"cache": {"type": "pvc", "size": "500Gi", "storageClassName": "local-nvme"}}},
    )
    _, volume = volume_at(pod, "/data")
    assert volume == {
        "name": "data-0",
        "ephemeral": {
            "volumeClaimTemplate": {
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "500Gi"}},
                    "storageClassName": "local-nvme",
                }
            }
        },
    }


def test_pvc_cache_without_storage_class() -> None:
    pod = one_pod(
        {"spec.dataMounts": [{"name": "data", "mountPath": "/data"}]},
        mounts={"data": {"cache": {"type": "pvc", "size": "2Ti"}}},
    )
    claim = volume_at(pod, "/data")[1]["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert claim == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2Ti"}}}


def test_missing_data_mount_is_a_build_error() -> None:
    job = DGXTrainingJob.model_validate(
        job_obj(
            {
                "spec.dataMounts": [
                    {"name": "data", "mountPath": "/data"},
                    {"name": "missing", "mountPath": "/missing"},
                ]
            }
        )
    )
    with pytest.raises(BuildError) as info:
        build_children(job, context(mounts={"data": {}}), uid=UID)
    assert info.value.path == "spec.dataMounts[1].name"
    assert "'missing'" in info.value.message
    assert str(info.value).startswith("spec.dataMounts[1].name: ")
    assert isinstance(info.value, ValueError)


def test_missing_first_data_mount_names_index_zero() -> None:
    with pytest.raises(BuildError) as info:
        build({"spec.dataMounts": [{"name": "data", "mountPath": "/data"}]})
    assert info.value.path == "spec.dataMounts[0].name"


# --- command mode --------------------------------------------------------------------------------


def test_command_and_args_verbatim() -> None:
    pod = one_pod(COMMAND_MODE)
    container = the_container(pod)
    assert container["command"] == ["torchrun", "/app/train.py"]
    assert container["args"] == ["--lr", "1e-4", "--name=a b"]
    assert mount_paths(pod) == ["/dev/shm"]
    assert "KUBEDGX_TRAINER_CONFIG" not in env_of(pod)


def test_command_without_args() -> None:
    container = the_container(one_pod({**COMMAND_MODE, "spec.args": DELETE}))
    assert container["command"] == ["torchrun", "/app/train.py"]
    assert "args" not in container


def test_image_from_spec() -> None:
    pod = one_pod({**COMMAND_MODE, "spec.image": "registry.example.com/team/train:1.2.3"})
    assert the_container(pod)["image"] == "registry.example.com/team/train:1.2.3"


def test_image_from_defaults() -> None:
    defaults = Defaults(trainer_image="registry.example.com/kubedgx/trainer:9.9", image_pull_policy="Always")
    container = the_container(one_pod(COMMAND_MODE, defaults=defaults))
    assert container["image"] == "registry.example.com/kubedgx/trainer:9.9"
    assert container["imagePullPolicy"] == "Always"
    assert the_container(one_pod())["image"] == Defaults().trainer_image


# --- determinism and resolve() -------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_building_twice_gives_equal_output(scenario: str) -> None:
    changes, mounts = SCENARIOS[scenario]
    first = build(changes, mounts=mounts)
    second = build(changes, mounts=mounts)
    assert first == second
    assert yaml.safe_dump(first, sort_keys=False) == yaml.safe_dump(second, sort_keys=False)


def test_build_does_not_mutate_its_inputs() -> None:
    obj = job_obj({"spec.elastic": {"minNodes": 2}, "spec.env": [{"name": "A", "value": "1"}]})
    snapshot = copy.deepcopy(obj)
    job = DGXTrainingJob.model_validate(obj)
    dumped = job.model_dump()
    build_children(job, context(), uid=UID)
    assert obj == snapshot
    assert job.model_dump() == dumped


def test_resolve_defaults() -> None:
    spec = DGXTrainingJob.model_validate(job_obj()).spec
    r = resolve(spec, CATALOG)
    assert r.instance is CATALOG.get("dgxa100.80g.8.norm")
    assert (r.gpus, r.cpu, r.memory, r.shm) == (8, "224", "1760Gi", "128Gi")
    assert (r.min_nodes, r.max_nodes, r.nproc_per_node) == (1, 1, 8)
    assert r.elastic is False
    assert (r.max_restarts, r.rdzv_port, r.join_timeout_s, r.last_call_timeout_s) == (3, 29400, 900, 30)
    assert r.retryable_exit_codes == ()
    assert (r.interactive, r.debug) == (False, False)
    assert (r.max_duration_s, r.max_pending_s) == (None, None)


@pytest.mark.parametrize("name", ["dgxh200.141g.4.spot", "dgxgb200.186g.2.norm", "dgxa100.40g.1.debug"])
def test_resolve_takes_resources_from_the_instance(name: str) -> None:
    inst = CATALOG.instances[name]
    cpu, memory_gi, shm_gi = per_gpu(inst)
    r = resolve(DGXTrainingJob.model_validate(job_obj({"spec.instance": name})).spec, CATALOG)
    assert r.gpus == inst.gpus
    assert r.nproc_per_node == inst.gpus
    assert (r.cpu, r.memory, r.shm) == (str(cpu * inst.gpus), f"{memory_gi * inst.gpus}Gi", f"{shm_gi * inst.gpus}Gi")


def test_resolve_node_counts() -> None:
    def nodes(elastic: dict[str, Any]) -> tuple[int, int, bool]:
        r = resolve(DGXTrainingJob.model_validate(job_obj({"spec.elastic": elastic})).spec, CATALOG)
        return r.min_nodes, r.max_nodes, r.elastic

    assert nodes({"minNodes": 3}) == (3, 3, False)
    assert nodes({"maxNodes": 4}) == (1, 4, True)
    assert nodes({"minNodes": 2, "maxNodes": 5}) == (2, 5, True)


def test_resolve_overrides_and_durations() -> None:
    spec = DGXTrainingJob.model_validate(
        job_obj(
            {
                "spec.resources": {"gpu": 4, "cpu": "100", "memory": "1Ti", "shm": "48Gi"},
                "spec.elastic": {"rendezvous": {"joinTimeout": "1h", "lastCallTimeout": "1500ms"}},
                "spec.maxDuration": "1h30m",
                "spec.maxPending": "90m",
                "spec.debug": {"enabled": True},
            }
        )
    ).spec
    r = resolve(spec, CATALOG)
    assert (r.gpus, r.nproc_per_node, r.cpu, r.memory, r.shm) == (4, 4, "100", "1Ti", "48Gi")
    assert (r.join_timeout_s, r.last_call_timeout_s) == (3600, 2)
    assert (r.max_duration_s, r.max_pending_s) == (5400, 5400)
    assert (r.debug, r.interactive) == (True, False)


def test_resolve_interactive_implies_debug() -> None:
    r = resolve(DGXTrainingJob.model_validate(job_obj({"spec.debug": {"interactive": True}})).spec, CATALOG)
    assert (r.interactive, r.debug) == (True, True)


def test_retryable_exit_codes_default_to_signals_under_exit_code() -> None:
    spec = DGXTrainingJob.model_validate(job_obj({"spec.restartPolicy": "ExitCode"})).spec
    codes = resolve(spec, CATALOG).retryable_exit_codes
    assert codes == tuple(range(129, 256))
    assert (codes[0], codes[-1], len(codes)) == (129, 255, 127)


def test_retryable_exit_codes_sorted_and_unique() -> None:
    spec = DGXTrainingJob.model_validate(
        job_obj({"spec.restartPolicy": "ExitCode", "spec.retryableExitCodes": [137, 1, 137, 42]})
    ).spec
    assert resolve(spec, CATALOG).retryable_exit_codes == (1, 42, 137)


@pytest.mark.parametrize("policy", ["Never", "OnFailure"])
def test_no_retryable_exit_codes_outside_exit_code_policy(policy: str) -> None:
    spec = DGXTrainingJob.model_validate(job_obj({"spec.restartPolicy": policy})).spec
    assert resolve(spec, CATALOG).retryable_exit_codes == ()


# --- purity --------------------------------------------------------------------------------------

PURITY_CHECK = """
import sys
import dgx_operator.render, dgx_operator.reconcile, dgx_operator.validation.validator, dgx_operator.cli.main
banned = ("torch", "kopf", "kubernetes", "kubernetes_asyncio")
loaded = sorted(m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in banned))
print("LOADED:" + ",".join(loaded))
"""


def test_pure_modules_import_no_torch_kopf_or_kubernetes_client() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PURITY_CHECK], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    match = re.search(r"^LOADED:(.*)$", proc.stdout, re.MULTILINE)
    assert match is not None, proc.stdout
    assert match[1] == "", f"banned modules imported: {match[1]}"


# --- volumes the trainer's user can write (issue 13, item 1) ------------------------------------------


def _pod_with_mounts(cache: dict[str, Any] | None) -> dict[str, Any]:
    mount: dict[str, Any] = {"source": "s3://bucket/prefix", "direction": "In"}
    out: dict[str, Any] = {"source": "s3://bucket/out", "direction": "Out"}
    if cache is not None:
        mount["cache"] = out["cache"] = cache
    job = DGXTrainingJob.model_validate(
        job_obj(
            {
                "spec.dataMounts": [{"name": "data", "mountPath": "/data"}, {"name": "out", "mountPath": "/out"}],
                "spec.trainer.output": {"dir": "/out/run"},
            }
        )
    )
    ctx = BuildContext(
        catalog=CATALOG,
        data_mounts={"data": DGXDataMountSpec.model_validate(mount), "out": DGXDataMountSpec.model_validate(out)},
    )
    (pod,) = [c for c in build_children(job, ctx) if c["kind"] == "Pod"][:1]
    return pod


def test_worker_pods_get_an_fs_group_for_kubelet_made_volumes() -> None:
    """A fresh PVC or emptyDir is root's: fsGroup 10001 (the trainer image's group) makes the kubelet
    give it to the trainer, checking only the top directory when it is already right."""
    pod = _pod_with_mounts({"type": "pvc", "size": "10Gi"})
    assert pod["spec"]["securityContext"] == {"fsGroup": 10001, "fsGroupChangePolicy": "OnRootMismatch"}
    assert "prepare-cache" not in {c["name"] for c in pod["spec"]["initContainers"]}  # no hostPath: none needed


def test_hostpath_caches_are_given_to_the_trainer_before_anything_writes_them() -> None:
    """fsGroup does not apply to hostPath, and the kubelet creates a missing directory as root 0755:
    the first init container chowns each cache's top directory to 10001:10001 (2775), as root with
    only CHOWN and FOWNER, before the pulls and restores (which run as 10001) write there."""
    pod = _pod_with_mounts(None)
    inits = pod["spec"]["initContainers"]
    prepare = inits[0]
    assert prepare["name"] == "prepare-cache"
    hostpaths = {v["name"] for v in pod["spec"]["volumes"] if "hostPath" in v}
    assert hostpaths == {"data-0", "data-1"}
    assert {m["name"] for m in prepare["volumeMounts"]} == hostpaths
    assert prepare["args"] == [f"/kubedgx/prepare/{name}" for name in ("data-0", "data-1")]
    assert "chown 10001:10001" in prepare["command"][2]
    assert "chmod 2775" in prepare["command"][2]
    assert prepare["securityContext"]["runAsUser"] == 0
    assert prepare["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]}
    assert prepare["securityContext"]["allowPrivilegeEscalation"] is False
    assert "restartPolicy" not in prepare  # a plain init container: it ends before the pulls start
    assert [c["name"] for c in inits[1:]][:1] == ["data-in-0"]


# --- sharing nodes (issue 32): MIG slices, requests that fit the node ----------------------------


@pytest.mark.parametrize("name", MIG_NAMES)
def test_every_mig_instance_asks_its_slice_on_a_mixed_strategy_node(name: str) -> None:
    inst = CATALOG.instances[name]
    assert inst.mig is not None
    children = build({"spec.instance": name})
    assert_valid(children)
    (pod,) = pods_of(children)
    resources = the_container(pod)["resources"]
    cpu, memory_gi, shm_gi = per_gpu(inst)
    g = inst.mig.slices
    expected = {
        "cpu": str(max(1, cpu * g // 7)),
        "memory": f"{max(1, memory_gi * g // 7)}Gi",
        f"nvidia.com/mig-{inst.mig.profile}": "1",
    }
    assert resources == {"requests": expected, "limits": expected}  # no nvidia.com/gpu: the slice is the GPU
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": list(inst.family.products)},
                {"key": "nvidia.com/mig.strategy", "operator": "In", "values": ["mixed"]},
            ]
        }
    ]
    env = env_of(pod)
    assert env["KUBEDGX_MIG_PROFILE"] == inst.mig.profile
    assert env["KUBEDGX_NVLINK"] == "false"
    assert env["PET_NPROC_PER_NODE"] == env["KUBEDGX_GPUS_PER_NODE"] == "1"
    _, shm = volume_at(pod, "/dev/shm")
    assert shm["emptyDir"]["sizeLimit"] == f"{max(1, shm_gi * g // 7)}Gi"


def test_a_one_gpu_worker_on_a_dgx_takes_an_eighth_of_the_node() -> None:
    """The quickstart's case: dgxa100.80g.1.norm on an 8-GPU DGX A100, one worker, no spread of its own
    beyond worker 0's soft one (nothing else of its job to keep apart)."""
    pod = one_pod({"spec.instance": "dgxa100.80g.1.norm"})
    assert the_container(pod)["resources"]["requests"] == {"cpu": "28", "memory": "220Gi", GPU: "1"}
    exprs = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]["matchExpressions"]
    assert {"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["0"]} in exprs
    assert [c["whenUnsatisfiable"] for c in pod["spec"]["topologySpreadConstraints"]] == ["ScheduleAnyway"]
    assert env_of(pod)["KUBEDGX_NVLINK"] == "false"


@given(data=st.data())
@settings(max_examples=200, deadline=None)
def test_a_nodes_workers_of_any_shapes_fit_its_allocatable(data: st.DataObject) -> None:
    """Workers of a family whose GPUs add up to at most the node's (any mix of shapes, resources.gpu
    overrides and MIG slices of at most a GPU's seven per GPU) never ask more CPU or memory than the
    node has: the scheduler can fill a node by its GPUs alone."""
    fam = data.draw(st.sampled_from([f for f in CATALOG.spec.gpus if f.node is not None]))
    assert fam.node is not None
    left, sevenths = fam.node_gpus, 0
    cpu = memory = 0
    while True:
        options = list(range(1, left + 1)) + (list(fam.mig) if fam.mig and (left or sevenths) else [])
        if not options or not data.draw(st.booleans(), label="another worker"):
            break
        pick = data.draw(st.sampled_from(options))
        if isinstance(pick, int):
            c, m, _ = fam.requests(pick)
            left -= pick
        else:
            if sevenths < pick.slices:
                if left == 0:
                    continue
                left, sevenths = left - 1, sevenths + 7
            sevenths -= pick.slices
            c, m, _ = fam.requests(1, pick.slices)
        cpu, memory = cpu + c, memory + m
    assert cpu <= fam.node.cpu
    assert memory <= fam.node.memory_gi
