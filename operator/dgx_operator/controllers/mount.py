"""The DGXDataMount controller: lists a mount's store when its spec is new or changed, writes the
result into its status, and holds deletion of a mount while a job that uses it has not ended.

The operator lists the store itself rather than through a Job: listing is cheap (keys, sizes and
ETags, no data), the result must land in the mount's status anyway, and the same code
(`dgx_datasync`) computes the digest the pull containers later compare their node copies
with. The cost: the operator needs network access to the stores and read access to the Secrets
that mounts name (the chart grants it only when asked). Data itself never passes through it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from dgx_operator.api.datamount import DGXDataMount, DGXDataMountSpec, DGXDataMountStatus
from dgx_operator.api.vocabulary import MountPhase, MountReason
from dgx_operator.controllers.loop import EventSink, Key, ReconcileLoop, utcnow
from dgx_operator.controllers.metrics import MOUNT_KIND, Metrics
from dgx_operator.kube import MOUNTS, Kube, TransientError
from dgx_operator.reconcile.mounts import (
    MOUNT_FINALIZER,
    READY,
    Listed,
    needs_listing,
    parse_mount,
    plan_mount,
    syncing,
    users,
)
from dgx_operator.reconcile.status import merge_patch
from dgx_operator.render.datasync import CA_BUNDLE_ENV, GCS_KEY_DEFAULT

log = logging.getLogger("kubedgx")

#: (spec, credential environment) -> what the store said. Blocking; runs in a worker thread.
Lister = Callable[[DGXDataMountSpec, Mapping[str, str]], Listed]
AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
#: The Ready reason of a mount whose store's TLS certificate was not trusted (dgx_datasync's).
UNTRUSTED = MountReason.CERTIFICATE_UNTRUSTED


def list_store(spec: DGXDataMountSpec, env: Mapping[str, str]) -> Listed:
    """List an input mount's source (or check that an output mount's destination is writable), with
    the environment a sync container of the mount gets: its credentials and the private CAs
    (KUBEDGX_CA_BUNDLE_PEM, added to the default trust as the containers add them)."""
    from dgx_datasync import StoreOptions, SyncError, check_writable, list_source, parse_uri, trust

    try:
        with trust.bundle_for(env) as ca_bundle:
            location = parse_uri(spec.source)
            options = StoreOptions(endpoint_url=spec.endpoint, region=spec.region, env=dict(env), ca_bundle=ca_bundle)
            if spec.direction == "Out":
                check_writable(location, options)
                return Listed()
            listing = list_source(location, options, spec.include, spec.exclude)
    except SyncError as exc:
        return Listed(error=exc.reason, message=exc.message, transient=exc.transient)
    return Listed(objects=len(listing.objects), total_bytes=listing.total_bytes, digest=listing.digest)


@dataclass
class MountController(ReconcileLoop):
    """See the module docstring. One pass per mount at a time, as for jobs."""

    kind: ClassVar[str] = MOUNT_KIND
    kube: Kube
    post_event: EventSink
    lister: Lister = list_store
    now: Callable[[], datetime] = utcnow
    #: A listing that takes longer than this is abandoned and retried (a huge prefix or a hung store).
    list_timeout: float = 600.0
    #: How often a mount whose deletion waits for its jobs is looked at again (job ends also trigger it).
    in_use_recheck: float = 30.0
    retry_base: float = 1.0
    metrics: Metrics | None = None
    #: PEM of the private CAs the stores' certificates may be signed by (OperatorConfig.ca_bundle),
    #: added to the default trust of every listing.
    ca_bundle: str | None = None
    dirty: set[Key] = field(default_factory=set)
    workers: dict[Key, asyncio.Task[None]] = field(default_factory=dict)
    timers: dict[Key, asyncio.TimerHandle] = field(default_factory=dict)
    failures: dict[Key, int] = field(default_factory=dict)
    #: Mounts whose "in use" warning was posted, so a waiting deletion does not repeat it.
    warned: set[Key] = field(default_factory=set)
    #: Mounts whose "stored spec no longer parses" warning was posted (until it parses again).
    unreadable: set[Key] = field(default_factory=set)
    #: Mounts Failed with CertificateUntrusted that this operator listed again (see recheck_trust).
    rechecked: set[Key] = field(default_factory=set)

    def forget(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        self.cancel_timer(key)
        self.forget_key(key)
        self.failures.pop(key, None)
        self.warned.discard(key)
        self.unreadable.discard(key)
        self.rechecked.discard(key)
        if self.metrics is not None:
            self.metrics.forget(self.kind, key)

    async def step(self, key: Key) -> float | None:
        namespace, name = key
        body = await self.kube.get_mount(namespace, name)
        if body is None:
            self.forget(namespace, name)
            return None
        meta = body["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if meta.get("deletionTimestamp"):
            return await self.deleting(key, body, finalizers)
        if MOUNT_FINALIZER not in finalizers:
            body = await self.kube.set_finalizers(
                namespace, name, meta.get("resourceVersion"), [*finalizers, MOUNT_FINALIZER], plural=MOUNTS
            )
            if not body:
                return None
        mount, why = parse_mount(body)
        if mount is None:
            if key not in self.unreadable:
                self.unreadable.add(key)
                self.post_event(body, "Warning", MountReason.INVALID_SPEC, why)
            log.warning("DGXDataMount %s/%s: %s", namespace, name, why)
            return None
        self.unreadable.discard(key)
        if not needs_listing(mount) and not self.recheck_trust(key, mount):
            self.observed(key, mount.status)
            return None
        await self.write_status(mount, syncing(mount, self.now()))
        listed = await self.list_mount(mount)
        plan = plan_mount(mount, listed, self.now())
        await self.write_status(mount, plan.status)
        for type_, reason, message in plan.events:
            self.post_event(body, type_, reason, message)
        if plan.retry:
            raise TransientError(f"{mount.spec.source}: {listed.message}")
        return None

    def recheck_trust(self, key: Key, mount: DGXDataMount) -> bool:
        """A mount that failed because the store's certificate was not trusted is listed once more by
        each operator that starts: the CA bundle is read at startup, and the admin's fix (the chart's
        caBundle) arrives as a new operator, not as an edit of the mount's spec."""
        status = mount.status
        if status is None or status.phase != MountPhase.FAILED or key in self.rechecked:
            return False
        reason = next((c.reason for c in status.conditions if c.type == READY), None)
        if reason != UNTRUSTED:
            return False
        self.rechecked.add(key)
        return True

    async def list_mount(self, mount: DGXDataMount) -> Listed:
        namespace = mount.metadata.namespace or "default"
        with tempfile.TemporaryDirectory(prefix="kubedgx-credentials-") as scratch:
            env, problem = await self.credentials(namespace, mount.spec, scratch)
            if problem is not None:
                return problem
            if self.ca_bundle:
                env[CA_BUNDLE_ENV] = self.ca_bundle
            try:
                return await asyncio.wait_for(asyncio.to_thread(self.lister, mount.spec, env), self.list_timeout)
            except TimeoutError:
                return Listed(
                    error=MountReason.UNREACHABLE,
                    message=f"listing {mount.spec.source} took longer than {self.list_timeout:.0f}s",
                    transient=True,
                )

    async def credentials(
        self, namespace: str, spec: DGXDataMountSpec, scratch: str
    ) -> tuple[dict[str, str], Listed | None]:
        """The environment the listing runs with: only the mount's own Secret (never the
        operator's ambient credentials when a Secret is named)."""
        ref = spec.credentials_secret_ref
        if ref is None:
            return {}, None
        data = await self.kube.get_secret_data(namespace, ref.name)
        if data is None:
            # Retried: the Secret may be applied just after the mount (kubectl apply -f dir/).
            return {}, Listed(
                error=MountReason.CREDENTIALS_MISSING,
                message=f"Secret {namespace}/{ref.name} (spec.credentialsSecretRef) not found",
                transient=True,
            )
        if spec.source.startswith("gs://"):
            key = ref.key or GCS_KEY_DEFAULT
            if key not in data:
                return {}, Listed(
                    error=MountReason.CREDENTIALS_MISSING,
                    message=f"Secret {namespace}/{ref.name} has no key {key!r} (spec.credentialsSecretRef.key)",
                )
            path = os.path.join(scratch, "key.json")
            with open(path, "wb") as handle:
                handle.write(data[key])
            return {"GOOGLE_APPLICATION_CREDENTIALS": path}, None
        missing = [k for k in AWS_KEYS[:2] if k not in data]
        if missing:
            return {}, Listed(
                error=MountReason.CREDENTIALS_MISSING,
                message=f"Secret {namespace}/{ref.name} lacks {', '.join(missing)} (spec.credentialsSecretRef)",
            )
        return {k: data[k].decode("utf-8").strip() for k in AWS_KEYS if k in data}, None

    async def write_status(self, mount: DGXDataMount, status: DGXDataMountStatus) -> None:
        old = mount.status.to_manifest() if mount.status is not None else {}
        patch = merge_patch(old, status.to_manifest())
        if patch:
            namespace = mount.metadata.namespace or "default"
            await self.kube.patch_mount_status(namespace, mount.metadata.name, None, patch)
            mount.status = status
        self.observed((mount.metadata.namespace or "default", mount.metadata.name), status)

    def observed(self, key: Key, status: DGXDataMountStatus | None) -> None:
        if self.metrics is not None:
            self.metrics.phase(self.kind, key, status.phase if status is not None else None)

    async def deleting(self, key: Key, body: Mapping[str, Any], finalizers: list[str]) -> float | None:
        """Let the deletion through once no job that has not ended references the mount."""
        namespace, name = key
        if MOUNT_FINALIZER not in finalizers:
            return None
        using = users(name, await self.kube.list_jobs(namespace))
        if using:
            if key not in self.warned:
                self.warned.add(key)
                self.post_event(
                    body,
                    "Warning",
                    MountReason.IN_USE,
                    f"deletion waits until DGXTrainingJob {', '.join(using)} ended (delete the job to free it now)",
                )
            return self.in_use_recheck
        remaining = [f for f in finalizers if f != MOUNT_FINALIZER]
        await self.kube.set_finalizers(
            namespace, name, body["metadata"].get("resourceVersion"), remaining, plural=MOUNTS
        )
        self.warned.discard(key)
        return None
