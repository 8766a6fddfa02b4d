"""A job's effective settings: the spec with every default filled in from the models and the
instance catalog. Builders, semantic validation and (later) the reconcile planner all read this
one record, so "what does an unset nprocPerNode mean" is decided in exactly one place.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from dgx_operator.api.common import parse_duration
from dgx_operator.api.datamount import DGXDataMountSpec
from dgx_operator.api.trainingjob import DGXTrainingJob, DGXTrainingJobSpec, Elastic, Resources
from dgx_operator.catalog import Catalog, Instance

#: restartPolicy ExitCode without retryableExitCodes: retry only deaths by signal (128 + n, n >= 1).
#: Not 128 itself: the kubelet reports a container that could not start (StartError: a bad command,
#: a missing binary) as exit 128, a spec problem that a new pod repeats.
SIGNAL_EXIT_CODES = tuple(range(129, 256))

DEFAULT_TRAINER_IMAGE = "ghcr.io/kubedgx/trainer:0.1.0"


@dataclass(frozen=True)
class Defaults:
    """Cluster-wide settings the operator gets from its Helm values; pure data for the builders."""

    trainer_image: str = DEFAULT_TRAINER_IMAGE
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    priority_classes: Mapping[str, str] = field(
        default_factory=lambda: {"low": "kubedgx-low", "normal": "kubedgx-normal", "high": "kubedgx-high"}
    )
    #: Seconds a worker gets after SIGTERM (a spot reclaim notice) to write a last checkpoint.
    termination_grace_seconds: int = 120
    master_port: int = 23456
    config_dir: str = "/etc/kubedgx"
    cache_root: str = "/raid/kubedgx"
    #: Image of the data sync containers; the trainer image (which carries dgx_datasync) when unset.
    datasync_image: str | None = None
    #: Parallel transfers of each sync container.
    sync_workers: int = 8
    #: Pull and restore init containers, at most (each gets the smaller of this and the trainer's cpu and
    #: memory: they run before the trainer, so they add nothing to what the pod asks of its node).
    sync_resources: Mapping[str, str] = field(default_factory=lambda: {"cpu": "4", "memory": "4Gi"})
    #: Seconds between the checkpoint uploader's scans of the trainer's output directory.
    checkpoint_sync_interval: float = 30.0
    #: The checkpoint uploader sidecar, which runs beside the trainer for the whole job.
    sidecar_resources: Mapping[str, str] = field(default_factory=lambda: {"cpu": "1", "memory": "1Gi"})
    #: Grace period of workers whose sidecar archives the final model: SIGTERM reaches the sidecar when
    #: the trainer exits, and it finishes the upload in flight and the archive within this time.
    archive_grace_seconds: int = 900
    #: The trainer image's user and group (Dockerfile.trainer): volumes are made writable for them.
    #: fsGroup covers the volumes the kubelet can chown (emptyDir, PVCs); hostPath caches get the
    #: prepare-cache init container.
    run_as_user: int = 10001
    fs_group: int = 10001
    #: PEM of the private CAs object stores' certificates are signed by (the chart's caBundle): every
    #: data sync container gets it in KUBEDGX_CA_BUNDLE_PEM and adds it to its default trust.
    ca_bundle_pem: str | None = None
    #: Workers' spec.schedulerName: a kube-scheduler profile (one that packs GPU nodes, docs/sharing.md);
    #: None: the cluster's default scheduler.
    scheduler_name: str | None = None


@dataclass(frozen=True)
class Resolved:
    """Effective settings of one job on one catalog."""

    instance: Instance
    gpus: int
    cpu: str
    memory: str
    shm: str
    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    max_restarts: int
    rdzv_port: int
    join_timeout_s: int
    last_call_timeout_s: int
    retryable_exit_codes: tuple[int, ...]
    interactive: bool
    debug: bool
    max_duration_s: int | None
    max_pending_s: int | None
    max_idle_s: int | None = None

    @property
    def elastic(self) -> bool:
        return self.min_nodes < self.max_nodes

    @property
    def whole_node(self) -> bool:
        """Its workers ask every GPU of their node (the resources keep a second worker off)."""
        return self.instance.mig is None and self.gpus >= self.instance.node_gpus


def _seconds(text: str | None) -> int | None:
    return None if text is None else max(1, math.ceil(parse_duration(text).total_seconds()))


def resolve(spec: DGXTrainingJobSpec, catalog: Catalog) -> Resolved:
    """Fill in defaults. Raises :class:`~dgx_operator.catalog.UnknownInstanceError` for unknown types."""
    instance = catalog.get(spec.instance)
    res = spec.resources or Resources()
    el = spec.elastic or Elastic()
    gpus = res.gpu if res.gpu is not None else instance.gpus
    # The GPUs' share of the node, for the shape and a resources.gpu override alike (catalog.yaml's
    # header): a 1-GPU worker on an 8-GPU shape asks what a 1-GPU shape does, so others share the node.
    cpu, memory, shm = instance.requests(gpus)
    interactive = bool(spec.debug and spec.debug.interactive)
    if spec.restart_policy == "ExitCode":
        codes = tuple(sorted(set(spec.retryable_exit_codes or SIGNAL_EXIT_CODES)))
    else:
        codes = ()
    return Resolved(
        instance=instance,
        gpus=gpus,
        cpu=str(res.cpu) if res.cpu is not None else cpu,
        memory=str(res.memory) if res.memory is not None else memory,
        shm=str(res.shm) if res.shm is not None else shm,
        min_nodes=el.min_nodes,
        max_nodes=el.max_nodes if el.max_nodes is not None else el.min_nodes,
        nproc_per_node=el.nproc_per_node if el.nproc_per_node is not None else gpus,
        max_restarts=el.max_restarts,
        rdzv_port=el.rendezvous.port,
        join_timeout_s=_seconds(el.rendezvous.join_timeout) or 1,
        last_call_timeout_s=_seconds(el.rendezvous.last_call_timeout) or 1,
        retryable_exit_codes=codes,
        interactive=interactive,
        debug=bool(spec.debug and (spec.debug.enabled or spec.debug.interactive)),
        max_duration_s=_seconds(spec.max_duration),
        max_pending_s=_seconds(spec.max_pending),
        max_idle_s=_seconds(spec.max_idle),
    )


@dataclass(frozen=True)
class Placement:
    """Kueue's admission of a job (see reconcile.queueing): how many workers Kueue admitted, and
    what admission adds to them, the flavors' node labels (as a node selector) and tolerations."""

    count: int
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    flavors: tuple[str, ...] = ()
    cluster_queue: str = ""


@dataclass(frozen=True)
class BuildContext:
    """Everything besides the job that decides its children: pure inputs, no API access."""

    catalog: Catalog
    defaults: Defaults = field(default_factory=Defaults)
    #: DGXDataMount specs by name, as the operator (or `kubedgx render`) found them.
    data_mounts: Mapping[str, DGXDataMountSpec] = field(default_factory=dict)
    #: status.manifestDigest of Ready input mounts by name: the pull init containers compare it with
    #: the node's cached copy (``dataCache: preload`` reuses a copy with the same digest).
    data_digests: Mapping[str, str] = field(default_factory=dict)
    #: Kueue's admission: the admitted flavors' node labels and tolerations join the workers'.
    placement: Placement | None = None


@dataclass(frozen=True)
class JobIdentity:
    """Who owns the children: the job's name, namespace and UID."""

    name: str
    namespace: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, job: DGXTrainingJob, namespace: str | None = None, uid: str | None = None) -> JobIdentity:
        ns = namespace or job.metadata.namespace or "default"
        return cls(
            name=job.metadata.name,
            namespace=ns,
            uid=uid or job.metadata.uid or placeholder_uid(ns, job.metadata.name),
            labels=dict(job.metadata.labels),
        )


def placeholder_uid(namespace: str, name: str) -> str:
    """A stable stand-in for metadata.uid when rendering a manifest that was never stored."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"kubedgx.io/{namespace}/{name}"))
