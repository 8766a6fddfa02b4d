"""The data plane of a worker pod: init containers that pull input mounts onto the node, a restore
step that brings back the newest uploaded checkpoint, and the native sidecar that streams
checkpoints to an output mount and archives the final model.

All of them run ``python -m dgx_datasync`` (the trainer image carries it; admins can point
``Defaults.datasync_image`` elsewhere) and mount the data volume at the same path as the training
container, so every path in their arguments is the path the trainer sees.

Remote layout of a direction: Out mount (docs/datamounts.md): checkpoints under
``<source>/<job>-<uid8>/checkpoints/checkpoint-<step>/``, the run's logs (the progress history and
TensorBoard's event files) under ``<source>/<job>-<uid8>/logs/`` and the final model under
``<source>/<archive.prefix>/<job>-<uid8>/``. The job's UID is part of the path so that a new job
with an old name never resumes from, or overwrites, another run's files.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dgx_operator.api.datamount import DGXDataMountSpec
from dgx_operator.api.trainingjob import DataMountRef, DGXTrainingJobSpec
from dgx_operator.render.quantity import smaller
from dgx_operator.render.resolved import BuildContext, JobIdentity

DATASYNC = ["python", "-m", "dgx_datasync"]
#: dgx_datasync.trust.PEM_ENV, spelled here so that the builders import no data plane.
CA_BUNDLE_ENV = "KUBEDGX_CA_BUNDLE_PEM"
#: Where a gs:// service-account key is mounted in the sync containers.
CREDENTIALS_DIR = "/var/run/kubedgx/credentials"
GCS_KEY_DEFAULT = "service-account.json"
#: Container names carry the mount's index (mount names may be longer than a container name).
PULL_PREFIX = "data-in-"
RESTORE_PREFIX = "restore-"
SIDECAR_PREFIX = "checkpoints-"


@dataclass(frozen=True)
class MountPlan:
    """One referenced mount as the pod uses it."""

    index: int
    ref: DataMountRef
    spec: DGXDataMountSpec
    volume: str

    @property
    def out(self) -> bool:
        return self.spec.direction == "Out"


def run_dir(job: JobIdentity) -> str:
    """The job's directory name in an output mount, on the node and in the store."""
    return f"{job.name}-{job.uid.replace('-', '')[:8]}"


def checkpoint_uri(job: JobIdentity, spec: DGXDataMountSpec) -> str:
    return posixpath.join(spec.source.rstrip("/"), run_dir(job), "checkpoints")


def logs_uri(job: JobIdentity, spec: DGXDataMountSpec) -> str:
    """Where the sidecar uploads ``history/*.jsonl`` and ``runs/`` (``watch --logs``): beside the
    checkpoints, so a job's curves are found from its name and UID, and outlive its pods."""
    return posixpath.join(spec.source.rstrip("/"), run_dir(job), "logs")


def archive_uri(job: JobIdentity, spec: DGXDataMountSpec) -> str:
    prefix = spec.archive.prefix if spec.archive is not None else "final"
    return posixpath.join(spec.source.rstrip("/"), prefix.strip("/"), run_dir(job))


def archives(spec: DGXDataMountSpec) -> bool:
    return spec.direction == "Out" and (spec.archive is None or spec.archive.enabled)


def syncs_checkpoints(spec: DGXDataMountSpec) -> bool:
    return spec.direction == "Out" and spec.sync_checkpoints is not False


def credentials(plan: MountPlan) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(env, volumeMounts, volumes) giving a sync container the mount's credentials. No Secret:
    nothing, the pod's ambient identity (IRSA, workload identity) is used."""
    ref = plan.spec.credentials_secret_ref
    if ref is None:
        return [], [], []
    if plan.spec.source.startswith("gs://"):
        volume = f"credentials-{plan.index}"
        directory = f"{CREDENTIALS_DIR}-{plan.index}"
        key = ref.key or GCS_KEY_DEFAULT
        return (
            [{"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": posixpath.join(directory, "key.json")}],
            [{"name": volume, "mountPath": directory, "readOnly": True}],
            [{"name": volume, "secret": {"secretName": ref.name, "items": [{"key": key, "path": "key.json"}]}}],
        )

    def secret_env(name: str, optional: bool) -> dict[str, Any]:
        selector: dict[str, Any] = {"name": ref.name, "key": name}
        if optional:
            selector["optional"] = True
        return {"name": name, "valueFrom": {"secretKeyRef": selector}}

    env = [
        secret_env("AWS_ACCESS_KEY_ID", False),
        secret_env("AWS_SECRET_ACCESS_KEY", False),
        secret_env("AWS_SESSION_TOKEN", True),
    ]
    return env, [], []


def trust_env(ctx: BuildContext) -> list[dict[str, Any]]:
    """The private CAs, by value: the pod runs in the job's namespace, where no ConfigMap of the
    operator's release can be mounted (dgx_datasync.trust adds them to the default trust)."""
    pem = ctx.defaults.ca_bundle_pem
    return [{"name": CA_BUNDLE_ENV, "value": pem}] if pem else []


def store_args(spec: DGXDataMountSpec) -> list[str]:
    args: list[str] = []
    if spec.endpoint:
        args += ["--endpoint-url", spec.endpoint]
    if spec.region:
        args += ["--region", spec.region]
    return args


def filter_args(spec: DGXDataMountSpec) -> list[str]:
    args: list[str] = []
    for glob in spec.include:
        args += ["--include", glob]
    for glob in spec.exclude:
        args += ["--exclude", glob]
    return args


def _contains(mount_path: str, path: str) -> bool:
    root = mount_path.rstrip("/") or "/"
    return path == root or path.startswith(root.rstrip("/") + "/")


def watched_dir(plan: MountPlan, spec: DGXTrainingJobSpec, others: list[MountPlan] | None = None) -> str:
    """The directory the trainer writes checkpoint-<step>/ into: its output.dir when that lies in
    this mount (and in no mount nested deeper inside it, whose own volume would hold it), else the
    mount itself (a command job writing there in the same layout)."""
    mount_path = plan.ref.mount_path.rstrip("/") or "/"
    if spec.trainer is not None:
        out = spec.trainer.output.dir
        deeper = [
            o
            for o in others or []
            if o is not plan
            and len(o.ref.mount_path.rstrip("/")) > len(mount_path)
            and _contains(o.ref.mount_path, out)
        ]
        if _contains(mount_path, out) and not deeper:
            return out
    return mount_path


def _container(
    name: str,
    args: list[str],
    plan: MountPlan,
    ctx: BuildContext,
    resources: Mapping[str, str],
    *,
    sidecar: bool = False,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    env, cred_mounts, cred_volumes = credentials(plan)
    container: dict[str, Any] = {
        "name": name,
        "image": ctx.defaults.datasync_image or ctx.defaults.trainer_image,
        "imagePullPolicy": ctx.defaults.image_pull_policy,
        "command": list(DATASYNC),
        "args": args,
        "env": [*env, *trust_env(ctx), {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "volumeMounts": [{"name": plan.volume, "mountPath": plan.ref.mount_path}, *cred_mounts],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if sidecar:
        container["restartPolicy"] = "Always"  # a native sidecar (Kubernetes >= 1.29)
    return container, cred_volumes


def sync_containers(
    job: JobIdentity,
    spec: DGXTrainingJobSpec,
    plans: list[MountPlan],
    ctx: BuildContext,
    within: Mapping[str, str] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(initContainers, extra volumes): pulls of input mounts, then checkpoint restores, then the
    uploader sidecars, in that order (a sidecar starts once the init containers before it ended).

    ``within``: the trainer's cpu and memory. A pull or restore gets the smaller of its default
    and the trainer's share of each: it runs before the trainer, so then it adds nothing to what
    the pod asks of its node (a pod's request is the larger of its biggest init container and its
    containers' sum). Larger, it would: a 2-CPU job would ask for 4 and fit no 2-CPU node."""
    common = ["--workers", str(ctx.defaults.sync_workers), "--log-format", "json"]
    init_resources = dict(ctx.defaults.sync_resources)
    for key, limit in (within or {}).items():
        if key in init_resources:
            init_resources[key] = smaller(init_resources[key], limit)
    pulls: list[dict[str, Any]] = []
    restores: list[dict[str, Any]] = []
    sidecars: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    for p in plans:
        if not p.out:
            args = ["pull", p.spec.source, p.ref.mount_path, *filter_args(p.spec), *store_args(p.spec), *common]
            digest = ctx.data_digests.get(p.ref.name)
            if digest:
                args += ["--expect-digest", digest]
                if spec.data_cache == "preload":
                    args.append("--reuse")
            container, extra = _container(f"{PULL_PREFIX}{p.index}", args, p, ctx, init_resources)
            pulls.append(container)
            volumes += extra
            continue
        directory = watched_dir(p, spec, plans)
        checkpoints = checkpoint_uri(job, p.spec)
        if syncs_checkpoints(p.spec):
            args = ["restore", checkpoints, directory, *store_args(p.spec), *common]
            container, extra = _container(f"{RESTORE_PREFIX}{p.index}", args, p, ctx, init_resources)
            restores.append(container)
            volumes += extra
        if not (syncs_checkpoints(p.spec) or archives(p.spec)):
            continue
        interval = f"{ctx.defaults.checkpoint_sync_interval:g}"
        args = ["watch", directory, checkpoints, "--interval", interval, "--logs", logs_uri(job, p.spec)]
        if not syncs_checkpoints(p.spec):
            args.append("--no-checkpoints")
        if archives(p.spec):
            fmt = p.spec.archive.format if p.spec.archive is not None else "files"
            args += ["--archive", archive_uri(job, p.spec), "--archive-format", fmt]
        args += [*store_args(p.spec), *common]
        container, extra = _container(
            f"{SIDECAR_PREFIX}{p.index}", args, p, ctx, ctx.defaults.sidecar_resources, sidecar=True
        )
        sidecars.append(container)
        volumes += extra
    unique: dict[str, dict[str, Any]] = {}
    for volume in volumes:
        unique.setdefault(volume["name"], volume)
    return [*pulls, *restores, *sidecars], list(unique.values())


def out_local_dir(job: JobIdentity, mount_name: str, root: str) -> str:
    """A direction: Out mount's directory on the node: one per job run, so two jobs writing to one
    mount never share checkpoints, and a worker recreated on the same node finds its own."""
    return posixpath.join(root, job.namespace, mount_name, run_dir(job))
