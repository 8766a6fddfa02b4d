"""DGXDataMount decisions, pure: when to list a mount's store again, and what the listing (or the
error it gave) means for the mount's status and for deleting it.

The operator lists a source itself (docs/datamounts.md says why): the listing is what the job's
pull containers compare their node copies with, and its digest is what `dataCache: preload`
reuses a copy by. A permanent error (credentials, a missing bucket) fails the mount; a transient one
keeps it Syncing and is retried with backoff.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dgx_operator.api.datamount import DGXDataMount, DGXDataMountStatus
from dgx_operator.api.vocabulary import JobPhase, MountCondition, MountPhase, MountReason
from dgx_operator.reconcile.status import set_condition
from dgx_operator.reconcile.stored import parse_stored

READY = MountCondition.READY
#: Held on every DGXDataMount so that deleting one a running job uses waits for the job to end.
MOUNT_FINALIZER = "kubedgx.io/data-mount-in-use"
#: Phases of a job after which its mounts are no longer in use.
JOB_DONE = JobPhase.TERMINAL


@dataclass(frozen=True)
class Listed:
    """What listing (In) or checking (Out) the store gave."""

    objects: int | None = None
    total_bytes: int | None = None
    digest: str | None = None
    error: str | None = None  # dgx_datasync.SyncError.reason
    message: str = ""
    transient: bool = False


@dataclass
class MountPlan:
    status: DGXDataMountStatus
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    retry: bool = False  # a transient error: list again after a backoff


def needs_listing(mount: DGXDataMount) -> bool:
    """Never listed, or listed for an older generation of the spec, or still mid-listing (an
    operator that restarted while Syncing)."""
    status = mount.status
    if status is None or status.phase in (None, MountPhase.PENDING, MountPhase.SYNCING):
        return True
    return status.observed_generation != (mount.metadata.generation or 0)


def _set(status: DGXDataMountStatus, ok: bool, reason: str, message: str, generation: int, now: datetime) -> None:
    status.conditions = set_condition(status.conditions, READY, ok, reason, message, now, generation)


def syncing(mount: DGXDataMount, now: datetime) -> DGXDataMountStatus:
    """The status written before a listing starts, so `kubectl get` shows the work in progress.

    A retry of the generation already Syncing keeps the last attempt's condition (its reason says
    what is retried: CredentialsMissing, Unreachable...) until this attempt has an answer: writing
    Syncing before every retry made the status flap between the two, two writes per retry, each
    waking every job that uses the mount, for as long as the cause lasts."""
    status = (mount.status or DGXDataMountStatus()).model_copy(deep=True)
    generation = mount.metadata.generation or 0
    ready = next((c for c in status.conditions if c.type == READY), None)
    if status.phase == MountPhase.SYNCING and ready is not None and ready.observed_generation == generation:
        return status
    status.phase = MountPhase.SYNCING
    verb = "listing" if mount.spec.direction == "In" else "checking"
    _set(status, False, MountReason.SYNCING, f"{verb} {mount.spec.source}", generation, now)
    return status


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def plan_mount(mount: DGXDataMount, listed: Listed, now: datetime) -> MountPlan:
    """The status after a listing. Ready and Failed record the generation they describe; a
    transient error keeps the mount Syncing with the error in its condition."""
    status = (mount.status or DGXDataMountStatus()).model_copy(deep=True)
    generation = mount.metadata.generation or 0
    old_phase = status.phase
    plan = MountPlan(status=status)
    if listed.error is not None and listed.transient:
        status.phase = MountPhase.SYNCING
        _set(status, False, listed.error, f"{listed.message} (retrying)", generation, now)
        plan.retry = True
        return plan
    if listed.error is not None:
        status.phase = MountPhase.FAILED
        status.observed_generation = generation
        status.objects = status.total_bytes = status.manifest_digest = None
        _set(status, False, listed.error, listed.message, generation, now)
        old_reason = next(
            (c.reason for c in (mount.status.conditions if mount.status else []) if c.type == READY), None
        )
        if old_phase != MountPhase.FAILED or old_reason != listed.error:
            plan.events.append(("Warning", listed.error, listed.message))
        return plan
    status.phase = MountPhase.READY
    status.observed_generation = generation
    status.last_sync_time = now
    if mount.spec.direction == "In":
        status.objects = listed.objects
        status.total_bytes = listed.total_bytes
        status.manifest_digest = listed.digest
        message = f"{listed.objects} objects, {human_bytes(listed.total_bytes or 0)} at {mount.spec.source}"
        if not listed.objects:
            message += " (the prefix is empty: check spec.source, include and exclude)"
    else:
        status.objects = status.total_bytes = status.manifest_digest = None
        message = f"{mount.spec.source} is writable"
    _set(
        status,
        True,
        MountReason.LISTED if mount.spec.direction == "In" else MountReason.WRITABLE,
        message,
        generation,
        now,
    )
    if old_phase != MountPhase.READY or status.manifest_digest != (
        mount.status.manifest_digest if mount.status else None
    ):
        plan.events.append(("Normal", MountReason.READY, message))
    return plan


def users(mount_name: str, jobs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Names of the jobs (in the mount's namespace) that reference the mount and have not ended."""
    found = []
    for job in jobs:
        refs = (job.get("spec") or {}).get("dataMounts") or []
        phase = (job.get("status") or {}).get("phase")
        if phase in JOB_DONE:
            continue
        if any(ref.get("name") == mount_name for ref in refs):
            found.append(str((job.get("metadata") or {}).get("name")))
    return sorted(found)


def mount_state(mount: DGXDataMount) -> tuple[str, str, str | None]:
    """(phase, message, digest) of a mount as a job sees it: a Ready or Failed status that describes an
    older generation of the spec is being re-listed, so it reads as Syncing (a Failed verdict on the
    spec the user just fixed must not fail a job that sees it before the operator lists again)."""
    status = mount.status
    if status is None or status.phase is None:
        return MountPhase.PENDING, "", None
    ready = next((c for c in status.conditions if c.type == READY), None)
    message = ready.message if ready is not None else ""
    if status.phase in (MountPhase.READY, MountPhase.FAILED) and status.observed_generation != (
        mount.metadata.generation or 0
    ):
        return MountPhase.SYNCING, "the spec changed; listing again", None
    return status.phase, message, status.manifest_digest if status.phase == MountPhase.READY else None


def parse_mount(body: Mapping[str, Any]) -> tuple[DGXDataMount | None, str]:
    """The stored mount as the model, or ``None`` and why not (see :func:`parse_stored`)."""
    return parse_stored(DGXDataMount, body)
