"""DGXDataMount (kubedgx.io/v1alpha1): object storage mirrored onto node-local NVMe.

Direction In: a prefix synced to the node before training. Direction Out: a destination that
checkpoints stream to during training and the final model is archived to afterwards.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Final, Literal

from pydantic import Field

from dgx_api.schema import KubeModel, cel, pattern
from dgx_api.trainer_config import AbsolutePath
from dgx_operator.api.common import (
    API_VERSION,
    MOUNT_KIND,
    Condition,
    ObjectMeta,
    ObjectName,
    Quantity,
    condition_list_field,
)
from dgx_operator.api.vocabulary import MountPhaseName

KIND: Final = MOUNT_KIND

SOURCE_PATTERN = pattern(
    r"^(s3|gs)://[a-z0-9][a-z0-9._-]{1,61}[a-z0-9](/[^\s]*)?$",
    "must be an object-store URI such as s3://bucket/prefix or gs://bucket/prefix "
    "(bucket: 3-63 lower-case letters, digits, '.', '-' or '_')",
)
ENDPOINT_PATTERN = pattern(
    r"^https?://[^\s/]+(/[^\s]*)?$", "must be an http(s) URL such as https://minio.storage.svc:9000"
)

Glob = Annotated[str, Field(min_length=1, max_length=1024)]


class SecretRef(KubeModel):
    """A Secret in the mount's namespace holding the store's credentials."""

    name: ObjectName = Field(
        description=(
            "Secret name. For s3:// its keys AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and optionally "
            "AWS_SESSION_TOKEN) become the sync container's environment; for gs:// the key named by `key` is "
            "mounted as GOOGLE_APPLICATION_CREDENTIALS."
        )
    )
    key: str | None = Field(
        default=None,
        max_length=253,
        description="For gs://: the key holding the service-account JSON. Defaults to service-account.json.",
    )


class Cache(KubeModel):
    """Where the data lives on the node: node-local NVMe (hostPath) or a PVC."""

    cel_rules = (
        cel(
            "!has(self.type) || self.type != 'pvc' || has(self.size)",
            "a pvc cache needs a size (e.g. 500Gi)",
            field_path=".size",
        ),
        cel(
            "!has(self.storageClassName) || (has(self.type) && self.type == 'pvc')",
            "storageClassName applies only to type: pvc",
            field_path=".storageClassName",
        ),
        cel(
            "!has(self.path) || !has(self.type) || self.type == 'hostPath'",
            "path applies only to type: hostPath",
            field_path=".path",
        ),
    )

    type: Literal["hostPath", "pvc"] = Field(
        default="hostPath", description="hostPath: a directory on the node's NVMe; pvc: a claim per worker."
    )
    path: AbsolutePath | None = Field(
        default=None,
        description="Directory on the node for hostPath caches. Defaults to /raid/kubedgx (the DGX NVMe RAID).",
    )
    storage_class_name: ObjectName | None = Field(
        default=None, description="StorageClass of the PVCs (e.g. a local-NVMe class)."
    )
    size: Quantity | None = Field(default=None, description="Capacity of each PVC.")


class Archive(KubeModel):
    """What happens to the final model when a job that writes to this mount succeeds."""

    enabled: bool = Field(default=True, description="Upload the final adapter, merged model and summary.")
    prefix: str = Field(
        default="final",
        max_length=1024,
        pattern=pattern(r"^[^/\s][^\s]*$", "must be a relative key prefix such as final or runs/2026-11"),
        description="Key prefix under the mount's source for the final artifacts.",
    )
    format: Literal["files", "tar.gz"] = Field(
        default="files", description="Upload files as they are, or one compressed tarball."
    )


class DGXDataMountSpec(KubeModel):
    """An object-store prefix and how it is mirrored to and from the nodes."""

    cel_rules = (
        cel(
            "!has(self.region) || self.source.startsWith('s3://')",
            "region applies only to s3:// sources",
            field_path=".region",
        ),
        cel(
            "!has(self.archive) || (has(self.direction) && self.direction == 'Out')",
            "archive applies only to direction: Out (where the final model is written)",
            field_path=".archive",
        ),
        cel(
            "!has(self.syncCheckpoints) || (has(self.direction) && self.direction == 'Out')",
            "syncCheckpoints applies only to direction: Out",
            field_path=".syncCheckpoints",
        ),
        cel(
            "!has(self.credentialsSecretRef) || !has(self.credentialsSecretRef.key) || self.source.startsWith('gs://')",
            "credentialsSecretRef.key is for gs:// service-account JSON; s3:// reads the AWS_* keys",
            field_path=".credentialsSecretRef.key",
        ),
    )

    source: str = Field(
        pattern=SOURCE_PATTERN,
        max_length=2048,
        description="s3://bucket/prefix or gs://bucket/prefix. For direction Out, the destination.",
    )
    direction: Literal["In", "Out"] = Field(
        default="In",
        description="In: synced to the nodes before training. Out: checkpoints and the model go here.",
    )
    endpoint: str | None = Field(
        default=None,
        pattern=ENDPOINT_PATTERN,
        max_length=2048,
        description=(
            "URL of the store's API: for s3://, an S3-compatible store (MinIO, Ceph RGW, ...), AWS when unset; "
            "for gs://, a Private Service Connect endpoint or another server of the GCS JSON API, "
            "https://storage.googleapis.com when unset."
        ),
    )
    region: str | None = Field(default=None, max_length=64, description="S3 region.")
    credentials_secret_ref: SecretRef | None = Field(
        default=None,
        description="Credentials; unset uses the pod's ambient identity (IRSA, GKE workload identity).",
    )
    include: list[Glob] = Field(
        default_factory=list,
        max_length=64,
        description="Only keys matching one of these globs (relative to the prefix).",
    )
    exclude: list[Glob] = Field(
        default_factory=list, max_length=64, description="Skip keys matching any of these globs."
    )
    cache: Cache | None = Field(
        default=None, description="Node-local storage; a hostPath under /raid/kubedgx by default."
    )
    archive: Archive | None = Field(default=None, description="Final-model archiving (direction Out).")
    sync_checkpoints: bool | None = Field(
        default=None,
        description="Stream each completed checkpoint here while training runs (direction Out). Defaults to true.",
    )


class DGXDataMountStatus(KubeModel):
    """The mount as last listed by the operator."""

    phase: MountPhaseName | None = Field(default=None, description="Lifecycle phase.")
    conditions: list[Condition] = condition_list_field(
        "Latest observations, one per condition type: Ready, True once the store was listed (In) or found "
        "writable (Out) for the current spec."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation this status describes."
    )
    objects: int | None = Field(default=None, ge=0, description="Objects under the prefix (after include/exclude).")
    total_bytes: int | None = Field(default=None, ge=0, description="Their total size in bytes.")
    manifest_digest: str | None = Field(
        default=None,
        max_length=128,
        description="sha256 of the object listing; equal digests mean equal data.",
    )
    last_sync_time: datetime | None = Field(default=None, description="When the listing was taken.")


class DGXDataMount(KubeModel):
    """A DGXDataMount as stored in the cluster or written in a manifest."""

    api_version: Literal["kubedgx.io/v1alpha1"] = Field(default=API_VERSION, description="API version.")
    kind: Literal["DGXDataMount"] = Field(default=KIND, description="Kind.")
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    spec: DGXDataMountSpec = Field(description="Desired state.")
    status: DGXDataMountStatus | None = Field(default=None, description="Observed state.")
