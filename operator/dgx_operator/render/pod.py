"""Worker pods: one per node, placed by GPU product, shape, NVLink domain and capacity pool."""

from __future__ import annotations

import posixpath
from typing import Any

import yaml

from dgx_operator.api.common import API_VERSION
from dgx_operator.api.datamount import DGXDataMountSpec
from dgx_operator.api.trainingjob import KIND, DGXTrainingJobSpec
from dgx_operator.render.datasync import MountPlan, archives, out_local_dir, sync_containers
from dgx_operator.render.names import (
    CAPACITY_ANNOTATION,
    CONFIG_FILE,
    CONFIG_LABEL,
    CONTAINER_NAME,
    INSTANCE_ANNOTATION,
    config_digest,
    config_map_name,
    job_selector,
    service_name,
    worker_labels,
    worker_name,
)
from dgx_operator.render.resolved import BuildContext, JobIdentity, Resolved

HOSTNAME_KEY = "kubernetes.io/hostname"

#: The interactive debug worker idles until deleted, and exits at once on SIGTERM.
IDLE_COMMAND = [
    "/bin/sh",
    "-c",
    "trap 'exit 0' TERM; echo 'kubedgx: interactive debug worker, idle'; sleep infinity & wait",
]


class BuildError(ValueError):
    """The job cannot be turned into children; ``path`` names the spec field at fault."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def owner_reference(job: JobIdentity) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def rendezvous_host(job: JobIdentity) -> str:
    """Worker 0's stable DNS name through the headless Service (hostname + subdomain)."""
    return f"{worker_name(job.name, 0)}.{service_name(job.name)}.{job.namespace}.svc"


def torchrun_env(job: JobIdentity, index: int, r: Resolved, master_port: int) -> dict[str, str]:
    """torchrun's configuration in Kubeflow PyTorchJob's variable names, so existing images work.

    Elastic jobs get no PET_NODE_RANK or WORLD_SIZE: both are decided at rendezvous, and torchrun
    gives each process the true values. Claiming a fixed world size there would be a lie.
    """
    host = rendezvous_host(job)
    env = {
        "PET_NNODES": f"{r.min_nodes}:{r.max_nodes}" if r.elastic else str(r.max_nodes),
        "PET_NPROC_PER_NODE": str(r.nproc_per_node),
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": f"{host}:{r.rdzv_port}",
        "PET_RDZV_ID": job.uid,
        "PET_RDZV_CONF": f"join_timeout={r.join_timeout_s},last_call_timeout={r.last_call_timeout_s}",
        "PET_MAX_RESTARTS": str(r.max_restarts),
        "MASTER_ADDR": host,
        "MASTER_PORT": str(master_port),
        # A fresh TCP store per restart round: with the shared store a worker that died after
        # init_process_group makes the next round fail or hang (see docs/architecture.md).
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
    if not r.elastic:
        env["PET_NODE_RANK"] = str(index)
        env["WORLD_SIZE"] = str(r.max_nodes * r.nproc_per_node)
    return env


def kubedgx_env(
    job: JobIdentity, index: int, attempt: int, spec: DGXTrainingJobSpec, r: Resolved, config_dir: str
) -> dict[str, str]:
    """What the trainer's preflight and progress reporting need to know about its placement."""
    env = {
        "KUBEDGX_JOB_NAME": job.name,
        "KUBEDGX_REPLICA_INDEX": str(index),
        "KUBEDGX_ATTEMPT": str(attempt),
        "KUBEDGX_INSTANCE": r.instance.name,
        "KUBEDGX_GPUS_PER_NODE": str(r.gpus),
        "KUBEDGX_GPU_PRODUCTS": ",".join(r.instance.products),
        # A MIG slice has no NVLink (nor P2P) to anything: one device, one process.
        "KUBEDGX_NVLINK": "true" if r.gpus > 1 and r.instance.mig is None else "false",
        "KUBEDGX_MULTI_NODE_NVLINK": "true" if r.instance.multi_node_nvlink and r.instance.mig is None else "false",
    }
    if r.instance.mig_profile is not None:
        env["KUBEDGX_MIG_PROFILE"] = r.instance.mig_profile
    if spec.trainer is not None:
        env["KUBEDGX_TRAINER_CONFIG"] = posixpath.join(config_dir, CONFIG_FILE)
    if r.debug:
        env.update(
            {
                "KUBEDGX_LOG_LEVEL": "DEBUG",
                "NCCL_DEBUG": "INFO",
                # INFO, not DETAIL: with DETAIL, torch 2.13's DistributedDataParallel segfaults in
                # its constructor (gloo, CPU; found running an interactive worker on a real node;
                # tests/trainer/test_debug_env.py). A job's own env may still set DETAIL.
                "TORCH_DISTRIBUTED_DEBUG": "INFO",
                "TORCH_CPP_LOG_LEVEL": "INFO",
                "PYTHONFAULTHANDLER": "1",
            }
        )
    return env


def shutdown_timeout(grace: int) -> int:
    """torchrun's --shutdown-timeout (PET_SHUTDOWN_TIMEOUT) for a pod of ``grace`` seconds: on
    SIGTERM (a reclaim, a deletion) torchrun passes the signal to its workers and SIGKILLs those
    still running after this long; its default, 30 s, cuts the built-in trainer's SIGTERM save
    short on a large model. Half the grace period: the rest is the checkpoint sidecar's, which the
    kubelet stops only after the trainer has exited, to upload that checkpoint."""
    return max(30, grace // 2)


def container_env(
    job: JobIdentity,
    index: int,
    attempt: int,
    spec: DGXTrainingJobSpec,
    r: Resolved,
    ctx: BuildContext,
    *,
    grace: int | None = None,
) -> list[dict[str, Any]]:
    """Operator variables first, then the user's. Reserved names were rejected at admission; any
    other name the user sets (NCCL_DEBUG, say) replaces the operator's default."""
    ours = {
        **torchrun_env(job, index, r, ctx.defaults.master_port),
        **kubedgx_env(job, index, attempt, spec, r, ctx.defaults.config_dir),
    }
    if grace is not None:
        ours["PET_SHUTDOWN_TIMEOUT"] = str(shutdown_timeout(grace))
    user_names = {e.name for e in spec.env}
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in ours.items() if k not in user_names]
    env.append({"name": "KUBEDGX_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}})
    env.append({"name": "KUBEDGX_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    env.extend(e.to_manifest() for e in spec.env)
    return env


def node_terms(r: Resolved) -> list[dict[str, Any]]:
    """The nodes a worker may run on: its GPU product, and

    - a whole-node worker: nodes with exactly the family's GPUs per node (GPU Feature Discovery's
      count; under MIG's mixed strategy it stays the physical count, and the resource fit keeps the
      worker off a node whose GPUs are partly sliced);
    - a worker of fewer GPUs: nodes with at least that many (``Gt g-1``), so it shares a node of its
      family with others (the resource fit counts what is free);
    - a MIG slice: nodes whose GPU operator runs the mixed strategy (the only one that advertises a
      slice as ``nvidia.com/mig-<profile>``); its resource says which slice."""
    inst = r.instance
    terms: list[dict[str, Any]] = [{"key": inst.labels.product, "operator": "In", "values": list(inst.products)}]
    if inst.mig is not None:
        terms.append({"key": inst.labels.mig_strategy, "operator": "In", "values": ["mixed"]})
    elif r.whole_node:
        terms.append({"key": inst.labels.count, "operator": "In", "values": [str(inst.node_gpus)]})
    else:
        terms.append({"key": inst.labels.count, "operator": "Gt", "values": [str(r.gpus - 1)]})
    return terms


def affinity(job: JobIdentity, r: Resolved) -> dict[str, Any]:
    """Nodes of the right GPU (:func:`node_terms`), a GB200 job's workers in one NVLink clique, and
    the catalog's topology preference when it names one."""
    inst = r.instance

    def same_job() -> dict[str, Any]:
        return {"matchLabels": job_selector(job.name)}

    out: dict[str, Any] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": node_terms(r)}]
            }
        },
    }
    if inst.multi_node_nvlink and inst.mig is None and (r.whole_node or r.max_nodes > 1):
        # GB200 NVL: GPUs talk over NVLink only inside one clique, so every worker must share it.
        # The first worker matches itself, which the scheduler accepts for self-affinity.
        out["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": same_job(), "topologyKey": inst.labels.clique}
            ]
        }
    elif inst.topology_key:
        # Opt-in (the catalog's topologyKey): the scheduler scores it by walking every node of the
        # cluster for every pod it places, ours or anyone's (scheduler-placement-cost.md).
        out["podAffinity"] = {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {"labelSelector": same_job(), "topologyKey": inst.topology_key},
                }
            ]
        }
    return out


def topology_spread(job: JobIdentity, r: Resolved, index: int) -> list[dict[str, Any]]:
    """One worker of a job per node where the resources do not already say so, in the cheapest form
    the scheduler offers, and none of the scheduler's default spreading.

    A whole-node worker asks every GPU the node has (the GPU-count term of its node affinity), so the
    scheduler's resource fit keeps a second one off: no term. A worker asking part of a node's GPUs
    could share a node with another of its job's (other jobs' workers may share it: that is what a
    smaller shape is for); when the job has more than one, a hard spread over hostnames (maxSkew 1, with
    minDomains the job's largest worker count, so that the minimum it measures skew against stays 0
    and never a second worker fits on a node) forbids it. Its cost falls on the job's own pods only,
    where a required pod anti-affinity term would make the scheduler check every later pod of the
    cluster, anyone's, against every pod that carries one
    (benchmarks/notes/scheduler-placement-cost.md).

    Default spreading: a pod a Service selects that declares no spread of its own is spread over
    hostnames and zones, and the scheduler scores that by counting the matching pods on every node of
    the cluster (14 ms a worker at 8,000 nodes, docs/benchmarks.md "Placement cost"); over zones is
    also the opposite of what training wants. The headless Service selects worker 0 alone
    (render.headless_service), so a whole-node worker 0 declares a soft spread over hostnames, which
    replaces the default and moves nothing (one worker per node anyway): its score is counted on the
    candidate nodes only, and with both inclusion policies Ignore every other node costs a label
    lookup. The other whole-node workers carry no spread at all."""
    selector = {"matchLabels": job_selector(job.name)}
    if not r.whole_node and r.max_nodes > 1:
        return [
            {
                "maxSkew": 1,
                "topologyKey": HOSTNAME_KEY,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": selector,
                "minDomains": max(1, r.max_nodes),
            }
        ]
    if index != 0:
        return []
    return [
        {
            "maxSkew": 1,
            "topologyKey": HOSTNAME_KEY,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": selector,
            "nodeAffinityPolicy": "Ignore",
            "nodeTaintsPolicy": "Ignore",
        }
    ]


def _data_volume(job: JobIdentity, mount_name: str, mount: DGXDataMountSpec, ctx: BuildContext) -> dict[str, Any]:
    """Input mounts: one directory per mount and namespace on the node, shared by the jobs that use
    it (the pull is incremental and ``preload`` reuses it). Output mounts: one per job run."""
    cache = mount.cache
    if cache is not None and cache.type == "pvc":
        claim: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": str(cache.size)}},
        }
        if cache.storage_class_name:
            claim["storageClassName"] = cache.storage_class_name
        return {"ephemeral": {"volumeClaimTemplate": {"spec": claim}}}
    root = (cache.path if cache is not None and cache.path else None) or ctx.defaults.cache_root
    if mount.direction == "Out":
        return {"hostPath": {"path": out_local_dir(job, mount_name, root), "type": "DirectoryOrCreate"}}
    return {"hostPath": {"path": posixpath.join(root, job.namespace, mount_name), "type": "DirectoryOrCreate"}}


def _under(path: str, mount_path: str) -> bool:
    return path == mount_path or path.startswith(mount_path.rstrip("/") + "/")


def trainer_config(job: JobIdentity, spec: DGXTrainingJobSpec) -> tuple[str, str, str] | None:
    """(ConfigMap name, digest, trainer.yaml) of a trainer job; None in command mode."""
    if spec.trainer is None:
        return None
    text = yaml.safe_dump(
        spec.trainer.model_dump(by_alias=True, exclude_none=True, mode="json"), sort_keys=False, width=100
    )
    digest = config_digest(job.uid or "", text)
    return config_map_name(job.name, digest), digest, text


def volumes_and_mounts(
    job: JobIdentity, spec: DGXTrainingJobSpec, ctx: BuildContext, r: Resolved, plans: list[MountPlan] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Volumes and the training container's mounts. Raises :class:`BuildError` for mounts the API
    server would reject (two at one path) or that cannot work (outputs into a read-only input)."""
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": r.shm}}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    config = trainer_config(job, spec)
    if config is not None:
        volumes.append({"name": "trainer-config", "configMap": {"name": config[0]}})
        mounts.append({"name": "trainer-config", "mountPath": ctx.defaults.config_dir, "readOnly": True})
    reserved = {m["mountPath"] for m in mounts}
    for i, ref in enumerate(spec.data_mounts):
        mount = ctx.data_mounts.get(ref.name)
        if mount is None:
            raise BuildError(
                f"spec.dataMounts[{i}].name",
                f"DGXDataMount {ref.name!r} not found (give its manifest too, or create it in namespace "
                f"{job.namespace!r})",
            )
        if ref.mount_path.rstrip("/") in reserved:
            raise BuildError(
                f"spec.dataMounts[{i}].mountPath", f"{ref.mount_path} is used by kubedgx itself; pick another path"
            )
        volume = f"data-{i}"
        volumes.append({"name": volume, **_data_volume(job, ref.name, mount, ctx)})
        mounts.append({"name": volume, "mountPath": ref.mount_path, "readOnly": mount.direction == "In"})
        if plans is not None:
            plans.append(MountPlan(i, ref, mount, volume))
    if spec.trainer is not None and spec.trainer.output.dir.startswith("/"):
        # A relative output dir lands in the container's working directory; only an absolute
        # one can get a volume of its own.
        out_dir = spec.trainer.output.dir
        holders = [m for m in mounts if _under(out_dir, m["mountPath"])]
        deepest = max(holders, key=lambda m: len(m["mountPath"]), default=None)
        if deepest is not None and deepest.get("readOnly"):
            raise BuildError(
                "spec.trainer.output.dir",
                f"{out_dir} is inside {deepest['mountPath']}, which workers see read-only (an input mount or "
                "the config); write outputs to a direction: Out mount or another directory",
            )
        if deepest is None or deepest["name"] == "dshm":
            volumes.append({"name": "output", "emptyDir": {}})
            mounts.append({"name": "output", "mountPath": out_dir})
    return volumes, mounts


#: Where the prepare-cache init container sees each hostPath cache.
PREPARE_ROOT = "/kubedgx/prepare"
PREPARE_CONTAINER = "prepare-cache"


def prepare_cache_container(volumes: list[dict[str, Any]], ctx: BuildContext) -> dict[str, Any] | None:
    """An init container that gives the hostPath caches to the trainer's user: the kubelet creates a
    missing hostPath directory (DirectoryOrCreate) as root, 0755, and fsGroup does not apply to
    hostPath, so pulls and checkpoint writes as UID 10001 failed with permission denied. It runs as
    root with only CHOWN and FOWNER, changes the top directory of each cache (owner, group, 2775)
    and nothing below it; None when the pod has no hostPath volume."""
    paths = [v["name"] for v in volumes if "hostPath" in v]
    if not paths:
        return None
    owner = f"{ctx.defaults.run_as_user}:{ctx.defaults.fs_group}"
    script = f'for d in "$@"; do chown {owner} "$d" && chmod 2775 "$d" || exit 1; done'
    return {
        "name": PREPARE_CONTAINER,
        "image": ctx.defaults.datasync_image or ctx.defaults.trainer_image,
        "imagePullPolicy": ctx.defaults.image_pull_policy,
        "command": ["/bin/sh", "-c", script, PREPARE_CONTAINER],
        "args": [posixpath.join(PREPARE_ROOT, name) for name in paths],
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]},
        },
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
        "volumeMounts": [{"name": name, "mountPath": posixpath.join(PREPARE_ROOT, name)} for name in paths],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def container_command(spec: DGXTrainingJobSpec, r: Resolved, ctx: BuildContext) -> dict[str, list[str]]:
    if r.interactive:
        return {"command": list(IDLE_COMMAND)}
    if spec.trainer is not None:
        # The trainer's pre-launch check runs once per pod, then execs torchrun (configured by the
        # PET_* variables): a config, data or model error ends the pod with exit 2 at once instead
        # of being restarted by torchrun and reported as exit 1.
        config = posixpath.join(ctx.defaults.config_dir, CONFIG_FILE)
        return {"command": ["python"], "args": ["-m", "dgx_trainer", "launch", "--config", config]}
    out: dict[str, list[str]] = {"command": list(spec.command or [])}
    if spec.args:
        out["args"] = list(spec.args)
    return out


def tolerations(spec: DGXTrainingJobSpec, r: Resolved, ctx: BuildContext) -> list[dict[str, Any]]:
    """The instance's (GPU taint, capacity pool), the job's, then the admitted Kueue flavors'."""
    out: list[dict[str, Any]] = [*r.instance.tolerations, *(t.to_manifest() for t in spec.tolerations)]
    if ctx.placement is not None:
        out += [dict(t) for t in ctx.placement.tolerations if dict(t) not in out]
    return out


def worker_pod(
    job: JobIdentity,
    spec: DGXTrainingJobSpec,
    index: int,
    r: Resolved,
    ctx: BuildContext,
    *,
    attempt: int = 0,
    active_deadline_seconds: int | None = None,
    pod_name: str | None = None,
) -> dict[str, Any]:
    """Worker ``index`` of ``job``. ``active_deadline_seconds`` is what is left of maxDuration
    (the operator passes the remainder for a worker created late); by default the whole of it.
    ``pod_name`` replaces <job>-worker-<i> when a stuck pod holds that name; the hostname stays."""
    name = worker_name(job.name, index)
    resources = {"cpu": r.cpu, "memory": r.memory, r.instance.gpu_resource: str(r.gpus)}
    plans: list[MountPlan] = []
    volumes, mounts = volumes_and_mounts(job, spec, ctx, r, plans)
    init_containers, sync_volumes = sync_containers(job, spec, plans, ctx, within={"cpu": r.cpu, "memory": r.memory})
    prepare = prepare_cache_container(volumes, ctx)
    if prepare is not None:
        init_containers.insert(0, prepare)
    volumes += sync_volumes
    grace = ctx.defaults.termination_grace_seconds
    if any(archives(p.spec) for p in plans):
        grace = max(grace, ctx.defaults.archive_grace_seconds)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image or ctx.defaults.trainer_image,
        "imagePullPolicy": ctx.defaults.image_pull_policy,
        **container_command(spec, r, ctx),
        "env": container_env(job, index, attempt, spec, r, ctx, grace=grace),
        "ports": [
            {"name": "rdzv", "containerPort": r.rdzv_port, "protocol": "TCP"},
            {"name": "master", "containerPort": ctx.defaults.master_port, "protocol": "TCP"},
        ],
        # requests == limits: Guaranteed QoS, the last to be evicted, and pinnable by the CPU manager.
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "volumeMounts": mounts,
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # the operator restarts workers, so that it can count and decide
        "hostname": name,
        "subdomain": service_name(job.name),
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": grace,
        "affinity": affinity(job, r),
        "tolerations": tolerations(spec, r, ctx),
        "containers": [container],
        "volumes": volumes,
        # Volumes the kubelet creates (a fresh PVC, an emptyDir) are root's; with fsGroup it makes them
        # group-writable for the trainer's group, checking only the top directory when it is right.
        "securityContext": {"fsGroup": ctx.defaults.fs_group, "fsGroupChangePolicy": "OnRootMismatch"},
    }
    if init_containers:
        pod_spec["initContainers"] = init_containers
    spread = topology_spread(job, r, index)
    if spread:
        pod_spec["topologySpreadConstraints"] = spread
    if ctx.defaults.scheduler_name:
        pod_spec["schedulerName"] = ctx.defaults.scheduler_name
    priority_class = ctx.defaults.priority_classes.get(spec.priority)
    if priority_class:
        pod_spec["priorityClassName"] = priority_class
    node_selector = {**r.instance.node_selector, **spec.node_selector}
    if ctx.placement is not None:
        node_selector.update(ctx.placement.node_selector)
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    deadline = active_deadline_seconds if active_deadline_seconds is not None else r.max_duration_s
    if deadline is not None:
        pod_spec["activeDeadlineSeconds"] = max(1, deadline)
    if spec.service_account_name:
        pod_spec["serviceAccountName"] = spec.service_account_name
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [s.to_manifest() for s in spec.image_pull_secrets]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name or name,
            "namespace": job.namespace,
            "labels": {
                **worker_labels(job.name, index, attempt, job.labels),
                **({CONFIG_LABEL: config[1]} if (config := trainer_config(job, spec)) is not None else {}),
            },
            "annotations": {
                INSTANCE_ANNOTATION: r.instance.name,
                # The pool it runs in (and is paid for): Kueue may admit a norm instance on spot.
                CAPACITY_ANNOTATION: ctx.catalog.capacity_of(node_selector, r.instance.capacity),
            },
            "ownerReferences": [owner_reference(job)],
        },
        "spec": pod_spec,
    }
