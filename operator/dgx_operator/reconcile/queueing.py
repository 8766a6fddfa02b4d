"""Kueue's job integration for DGXTrainingJob, as pure decisions (docs/kueue.md).

Kueue admits *Workloads*; every kind it queues has an integration (Kueue's ``jobframework`` for its
built-in kinds) that creates one Workload per job, keeps the job stopped until the Workload is
admitted, starts it with what was admitted, stops it on eviction and marks the Workload finished when
the job ends. This module is that integration's decision half for DGXTrainingJob: it builds the
Workload, reads a stored one (``v1beta2`` or ``v1beta1``: the version the cluster serves is detected,
the shapes differ in how the priority class is named), and turns (job, its Workloads, the
ResourceFlavors) into a :class:`Gate` for the planner plus the Workload writes for the controller.

Why the operator holds the job back itself instead of flipping ``spec.suspend`` as Kueue's built-in
integrations do: ``spec.suspend`` stays the user's (and Git's, under Argo CD); a job that names a
queue never starts a worker before Kueue admits it, whatever ``spec.suspend`` says, with no
mutating webhook and no window between create and suspend. The admission (count, the flavors'
node labels and tolerations) is read from the Workload at every reconcile, not copied into the
job: the Workload is the truth, and a restart of the operator loses nothing.

No ``kueue.x-k8s.io/resource-in-use`` finalizer on the Workload: it is owned by the job, and the
job's own finalizer is released only once its workers have ended, so garbage collection removes
the Workload (and Kueue frees the quota) exactly when the job's pods are gone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dgx_operator.api.common import API_VERSION
from dgx_operator.api.trainingjob import KIND
from dgx_operator.api.vocabulary import JobReason
from dgx_operator.render.resolved import Placement

GROUP = "kueue.x-k8s.io"
#: The Workload API versions this integration speaks, the one it prefers first.
VERSIONS = ("v1beta2", "v1beta1")
QUEUE_LABEL = f"{GROUP}/queue-name"
PRIORITY_LABEL = f"{GROUP}/priority-class"
JOB_UID_LABEL = f"{GROUP}/job-uid"
#: The hash of the pod set a Workload was made from: a different one means the job changed shape.
PODSET_ANNOTATION = "kubedgx.io/podset-hash"
#: Set on a Workload this operator deactivated because the user suspended the job.
DEACTIVATED_ANNOTATION = "kubedgx.io/deactivated-by-suspend"
#: The one pod set of a DGXTrainingJob.
PODSET = "workers"
#: The LocalQueue a job without the label goes to when the operator manages such jobs (Kueue's
#: LocalQueueDefaulting uses the same name).
DEFAULT_QUEUE = "default"
#: Kueue's eviction reasons after which the Workload is requeued at once (jobframework does the same).
REQUEUED_AFTER = ("Preempted", "NodeFailures")

#: The pod spec fields Kueue reads from a pod set: requests and placement. The rest of the worker
#: (env, volumes, command) is the operator's and would only make the Workload large.
_POD_FIELDS = ("nodeSelector", "affinity", "tolerations", "priorityClassName", "runtimeClassName", "overhead")
#: No image: Kueue does not read it, and a new image is no new shape.
_CONTAINER_FIELDS = ("name", "resources", "restartPolicy")


def workload_name(job: str, uid: str) -> str:
    """Kueue's own format (jobframework.GetWorkloadNameForOwnerWithGVK): ``<kind>-<job>-<hash5>``,
    the prefix cut to fit 253 characters; the hash (over name, uid and kind, not byte for byte
    Kueue's) keeps a recreated job's Workload apart from its predecessor's."""
    digest = hashlib.sha1(f"{job}\n{uid}\n{GROUP_OF_JOB}/{KIND}".encode()).hexdigest()[:5]
    return f"{KIND.lower()}-{job}"[: 253 - 6].rstrip("-.") + f"-{digest}"


GROUP_OF_JOB = API_VERSION.split("/")[0]


# -- what the operator observes ------------------------------------------------------------------


@dataclass(frozen=True)
class Flavor:
    """A ResourceFlavor: what admission on it adds to the workers."""

    name: str
    node_labels: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> Flavor:
        spec = body.get("spec") or {}
        return cls(
            name=str((body.get("metadata") or {}).get("name") or ""),
            node_labels={str(k): str(v) for k, v in (spec.get("nodeLabels") or {}).items()},
            tolerations=tuple(dict(t) for t in spec.get("tolerations") or []),
        )


@dataclass(frozen=True)
class KueueCondition:
    status: str
    reason: str
    message: str

    @classmethod
    def of(cls, c: Mapping[str, Any]) -> KueueCondition:
        return cls(str(c.get("status")), str(c.get("reason") or ""), str(c.get("message") or ""))


@dataclass(frozen=True)
class WorkloadView:
    """A stored Workload, either API version, reduced to what the integration decides on."""

    name: str
    uid: str
    resource_version: str
    api_version: str
    owner_uid: str | None
    queue: str
    active: bool
    deleting: bool
    podset_hash: str | None
    deactivated_by_us: bool
    conditions: Mapping[str, KueueCondition]
    cluster_queue: str | None
    #: The admitted pod count and the flavor of each resource, of our pod set.
    admitted_count: int | None
    flavors: Mapping[str, str]
    #: The whole status.conditions list, as stored (the status writes replace it whole).
    raw_conditions: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> WorkloadView:
        meta = body.get("metadata") or {}
        spec = body.get("spec") or {}
        status = body.get("status") or {}
        owner = next(
            (o for o in meta.get("ownerReferences") or [] if o.get("controller") and o.get("kind") == KIND), None
        )
        raw = tuple(c for c in status.get("conditions") or [] if isinstance(c, Mapping))
        conditions = {str(c.get("type")): KueueCondition.of(c) for c in raw}
        admission = status.get("admission") or {}
        assignment = next(
            (a for a in admission.get("podSetAssignments") or [] if a.get("name") == PODSET),
            None,
        )
        count = assignment.get("count") if assignment else None
        if assignment and count is None:  # older Workloads: the pod set's whole count was admitted
            podset: Mapping[str, Any] = next((p for p in spec.get("podSets") or [] if p.get("name") == PODSET), {})
            count = podset.get("count")
        annotations = meta.get("annotations") or {}
        return cls(
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            resource_version=str(meta.get("resourceVersion") or ""),
            api_version=str(body.get("apiVersion") or ""),
            owner_uid=str(owner.get("uid")) if owner else None,
            queue=str(spec.get("queueName") or ""),
            active=spec.get("active", True) is not False,
            deleting=bool(meta.get("deletionTimestamp")),
            podset_hash=annotations.get(PODSET_ANNOTATION),
            deactivated_by_us=annotations.get(DEACTIVATED_ANNOTATION) == "true",
            conditions=conditions,
            cluster_queue=str(admission.get("clusterQueue")) if admission.get("clusterQueue") else None,
            admitted_count=int(count) if isinstance(count, int) else None,
            flavors={str(k): str(v) for k, v in ((assignment or {}).get("flavors") or {}).items()},
            raw_conditions=raw,
        )

    def holds(self, type_: str) -> bool:
        c = self.conditions.get(type_)
        return c is not None and c.status == "True"

    @property
    def admitted(self) -> bool:
        return self.holds("Admitted") and self.holds("QuotaReserved") and self.admitted_count is not None

    @property
    def evicted(self) -> bool:
        return self.holds("Evicted")

    @property
    def finished(self) -> bool:
        return self.holds("Finished")


def slim_workload(body: Mapping[str, Any]) -> dict[str, Any]:
    """What :meth:`WorkloadView.of` reads, for the operator's index (not the pod template)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    return {
        "apiVersion": body.get("apiVersion"),
        "metadata": {
            k: meta[k]
            for k in ("name", "uid", "resourceVersion", "ownerReferences", "annotations", "deletionTimestamp")
            if k in meta
        },
        "spec": {
            **{k: spec[k] for k in ("queueName", "active") if k in spec},
            # Names and counts only (the count admitted when an old Workload's assignment has none).
            "podSets": [{k: p[k] for k in ("name", "count") if k in p} for p in spec.get("podSets") or []],
        },
        "status": {k: status[k] for k in ("conditions", "admission") if k in status},
    }


@dataclass(frozen=True)
class PriorityClass:
    """The priority a Workload carries: a WorkloadPriorityClass (label) or the workers' PriorityClass."""

    kind: str  # "WorkloadPriorityClass" | "PriorityClass"
    name: str
    value: int


@dataclass(frozen=True)
class Queueing:
    """What the controller observed for one job's queueing."""

    #: The LocalQueue the job goes to; None when Kueue does not manage this job.
    queue: str | None
    #: The Workload API version the cluster serves; None when it serves no Kueue API.
    api_version: str | None = None
    workloads: Sequence[WorkloadView] = ()
    flavors: Mapping[str, Flavor] = field(default_factory=dict)
    priority: PriorityClass | None = None
    #: Why the priority could not be resolved (a WorkloadPriorityClass that does not exist).
    priority_error: str | None = None


def queue_of(labels: Mapping[str, str], manage_without_queue_name: bool) -> str | None:
    """The LocalQueue a job goes to, or None when Kueue does not manage it."""
    queue = labels.get(QUEUE_LABEL)
    if queue:
        return queue
    return DEFAULT_QUEUE if manage_without_queue_name else None


# -- the Workload ------------------------------------------------------------------------------


def pod_set_template(worker: Mapping[str, Any]) -> dict[str, Any]:
    """A worker pod reduced to what Kueue sizes and places: every container's requests (init and
    sidecar containers included, as Kueue counts them), the node selector, affinity, tolerations and
    priority class."""
    spec = worker.get("spec") or {}
    out: dict[str, Any] = {
        "containers": [{k: c[k] for k in _CONTAINER_FIELDS if k in c} for c in spec.get("containers") or []],
    }
    if spec.get("initContainers"):
        out["initContainers"] = [{k: c[k] for k in _CONTAINER_FIELDS if k in c} for c in spec["initContainers"]]
    out.update({k: spec[k] for k in _POD_FIELDS if k in spec})
    # No labels: the queue and priority labels are the Workload's queueName and priority (moving a
    # waiting job to another LocalQueue patches its queueName; it is no new shape).
    return {"spec": out}


def pod_set(worker: Mapping[str, Any], min_nodes: int, max_nodes: int) -> dict[str, Any]:
    """The one pod set: maxNodes workers, and minNodes as Kueue's partial-admission floor, so an
    elastic job starts on what the quota has room for."""
    out: dict[str, Any] = {"name": PODSET, "count": max_nodes, "template": pod_set_template(worker)}
    if min_nodes < max_nodes:
        out["minCount"] = min_nodes
    return out


def podset_hash(podset: Mapping[str, Any], queue_independent_priority: PriorityClass | None) -> str:
    text = json.dumps({"podSet": podset, "priority": _priority_key(queue_independent_priority)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _priority_key(priority: PriorityClass | None) -> list[Any] | None:
    return [priority.kind, priority.name] if priority is not None else None


def workload(
    *,
    api_version: str,
    job: str,
    namespace: str,
    uid: str,
    queue: str,
    podset: Mapping[str, Any],
    priority: PriorityClass | None,
    active: bool = True,
) -> dict[str, Any]:
    """The Workload of a job, in the API version the cluster serves: owned by the job (so it goes
    with it), named and labelled as Kueue's own integrations name theirs."""
    spec: dict[str, Any] = {"queueName": queue, "podSets": [dict(podset)]}
    if not active:
        spec["active"] = False
    if priority is not None:
        spec["priority"] = priority.value
        if api_version.endswith("/v1beta1"):
            spec["priorityClassName"] = priority.name
            spec["priorityClassSource"] = (
                f"{GROUP}/workloadpriorityclass"
                if priority.kind == "WorkloadPriorityClass"
                else "scheduling.k8s.io/priorityclass"
            )
        else:
            group = GROUP if priority.kind == "WorkloadPriorityClass" else "scheduling.k8s.io"
            spec["priorityClassRef"] = {"group": group, "kind": priority.kind, "name": priority.name}
    annotations = {PODSET_ANNOTATION: podset_hash(podset, priority)}
    if not active:
        annotations[DEACTIVATED_ANNOTATION] = "true"
    return {
        "apiVersion": api_version,
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job, uid),
            "namespace": namespace,
            "labels": {JOB_UID_LABEL: uid},
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": KIND,
                    "name": job,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


# -- the decision ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gate:
    """The planner's answer from Kueue: run with ``placement``, or hold the job (no workers) with a
    reason and message for its Suspended condition. ``evicted``: the hold follows an eviction."""

    placement: Placement | None
    reason: str = ""
    message: str = ""
    evicted: bool = False
    #: The admitted Workload (with ``placement``): its PodsReady condition follows the workers.
    workload: WorkloadView | None = None


@dataclass
class WorkloadWrites:
    """What the controller writes to Workloads in this pass."""

    create: dict[str, Any] | None = None
    #: (name, uid): deleted with a uid precondition.
    delete: list[tuple[str, str]] = field(default_factory=list)
    #: (name, resourceVersion, spec/metadata merge patch).
    patch: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    #: (name, resourceVersion, status merge patch): the conditions list replaced whole, guarded.
    status: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.create or self.delete or self.patch or self.status)


def _set(
    conditions: Sequence[Mapping[str, Any]],
    type_: str,
    status: str,
    reason: str,
    message: str,
    now: str,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """metav1.Condition semantics (apimeta.SetStatusCondition): the transition time moves only when
    the status does."""
    old = next((c for c in conditions if c.get("type") == type_), None)
    since = old.get("lastTransitionTime") if old is not None and old.get("status") == status else now
    new: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": since,
    }
    if generation is not None:
        new["observedGeneration"] = generation
    out = [dict(c) for c in conditions if c.get("type") != type_]
    out.append(new)
    return out


def clear_reservation(wl: WorkloadView, reason: str, message: str, now: str) -> dict[str, Any]:
    """After an eviction, once the job has stopped: what jobframework does
    (workload.UnsetQuotaReservationWithCondition and SetRequeuedCondition): QuotaReserved False
    (Pending), the admission cleared, Admitted False (NoReservation), Requeued True when Kueue
    evicted it to requeue it (preemption, node failures)."""
    conditions: list[dict[str, Any]] = [dict(c) for c in wl.raw_conditions]
    conditions = _set(conditions, "Requeued", "True" if reason in REQUEUED_AFTER else "False", reason, message, now)
    conditions = _set(conditions, "QuotaReserved", "False", "Pending", message, now)
    if wl.holds("Admitted"):
        conditions = _set(conditions, "Admitted", "False", "NoReservation", "The workload has no reservation", now)
    return {"admission": None, "conditions": conditions}


def pods_ready_status(wl: WorkloadView, ready: bool, now: str) -> dict[str, Any] | None:
    """The Workload's PodsReady condition as jobframework writes it (generatePodsReadyCondition), so
    that Kueue's waitForPodsReady can evict a job whose admitted workers never all start: True
    (Started, or Recovered after a wait for recovery) once every admitted worker runs; False
    WaitForStart before that, WaitForRecovery after it was True. None when it already says so."""
    old = wl.conditions.get("PodsReady")
    if ready:
        recovering = old is not None and old.reason in ("WaitForRecovery", "Recovered")
        status, reason = "True", "Recovered" if recovering else "Started"
        message = "All pods reached readiness and the workload is running"
    elif old is not None and old.status == "True":
        status, reason, message = "False", "WaitForRecovery", "At least one pod has failed, waiting for recovery"
    elif old is not None and old.reason == "WaitForRecovery":
        return None
    else:
        status, reason, message = "False", "WaitForStart", "Not all pods are ready or succeeded"
    if old is not None and (old.status, old.reason) == (status, reason):
        return None
    return {"conditions": _set(wl.raw_conditions, "PodsReady", status, reason, message, now)}


def finish_status(wl: WorkloadView, succeeded: bool, message: str, now: str) -> dict[str, Any]:
    """The job ended: Finished True (Succeeded or Failed), so Kueue returns the quota at once."""
    reason = "Succeeded" if succeeded else "Failed"
    return {"conditions": _set(wl.raw_conditions, "Finished", "True", reason, message or reason, now)}


def _placement(wl: WorkloadView, flavors: Mapping[str, Flavor]) -> tuple[Placement | None, str]:
    names = sorted(set(wl.flavors.values()))
    missing = [n for n in names if n not in flavors]
    if missing:
        return None, f"ResourceFlavor {', '.join(missing)} is not known to the operator yet"
    selector: dict[str, str] = {}
    tolerations: list[Mapping[str, Any]] = []
    for name in names:
        selector.update(flavors[name].node_labels)
        tolerations += [t for t in flavors[name].tolerations if t not in tolerations]
    return (
        Placement(
            count=wl.admitted_count or 0,
            node_selector=selector,
            tolerations=tuple(tolerations),
            flavors=tuple(names),
            cluster_queue=wl.cluster_queue or "",
        ),
        "",
    )


def decide(
    q: Queueing,
    *,
    job: str,
    namespace: str,
    uid: str,
    podset: Mapping[str, Any] | None,
    user_suspended: bool,
    finished: tuple[bool, str] | None,
    workers_active: int,
    now: str,
) -> tuple[Gate, WorkloadWrites]:
    """The integration's step for one job (jobframework's ReconcileGenericJob, for this kind).

    ``podset`` is None when the job's spec cannot be built into workers (the planner fails it on its
    own); ``finished`` is (succeeded, message) once the job ended; ``workers_active`` counts the
    workers not yet gone (an evicted job's reservation is cleared only when it is 0)."""
    writes = WorkloadWrites()
    queue = q.queue or ""
    ours = [w for w in q.workloads if w.owner_uid == uid]
    if finished is not None:
        for wl in ours:
            if not wl.finished and not wl.deleting:
                writes.status.append((wl.name, wl.resource_version, finish_status(wl, finished[0], finished[1], now)))
        return Gate(None), writes
    if q.api_version is None:
        return (
            Gate(
                None,
                JobReason.KUEUE_NOT_INSTALLED,
                f"the job names the Kueue LocalQueue {queue!r} (label {QUEUE_LABEL}) but this cluster "
                f"serves no {GROUP} API: install Kueue, or remove the label to run the job without queueing",
            ),
            writes,
        )
    if q.priority_error is not None:
        return Gate(None, JobReason.PRIORITY_CLASS_NOT_FOUND, q.priority_error), writes
    if podset is None:
        return Gate(None, JobReason.INVALID_SPEC, "the job's workers cannot be built"), writes
    wanted = podset_hash(podset, q.priority)
    # An admitted Workload is kept while it runs, even if the job changed shape since (an elastic
    # job's new maxNodes, other requests): the job runs on what was admitted, and the change takes
    # effect with its next admission (after an eviction or a suspend), never by stopping it.
    current = [
        w
        for w in ours
        if not w.deleting and not w.finished and (w.podset_hash == wanted or (w.admitted and not w.evicted))
    ]
    stale = [w for w in ours if not w.deleting and w not in current]
    # A changed shape (instance, node counts, resources, priority) needs a new admission: the old
    # Workload goes (Kueue's integrations recreate theirs the same way), then a new one is made.
    writes.delete += [(w.name, w.uid) for w in stale]
    if len(current) > 1:
        writes.delete += [(w.name, w.uid) for w in current[1:]]
        current = current[:1]
    if not current:
        if any(w.deleting for w in ours) or stale:
            why = "the job's pod set changed: waiting for its old Workload to go"
            return Gate(None, JobReason.WORKLOAD_RECREATED, why), writes
        writes.create = workload(
            api_version=q.api_version,
            job=job,
            namespace=namespace,
            uid=uid,
            queue=queue,
            podset=podset,
            priority=q.priority,
            active=not user_suspended,
        )
        return Gate(
            None,
            JobReason.QUEUED,
            f"created Workload {writes.create['metadata']['name']} in LocalQueue {queue!r}: "
            "waiting for Kueue to admit it",
        ), writes
    wl = current[0]
    # The user's spec.suspend deactivates the Workload (its quota returns); lifting it reactivates
    # only a Workload this operator deactivated, never one Kueue itself deactivated.
    if user_suspended and wl.active:
        writes.patch.append(
            (
                wl.name,
                wl.resource_version,
                {"spec": {"active": False}, "metadata": {"annotations": {DEACTIVATED_ANNOTATION: "true"}}},
            )
        )
    elif not user_suspended and not wl.active and wl.deactivated_by_us:
        writes.patch.append(
            (
                wl.name,
                wl.resource_version,
                {"spec": {"active": True}, "metadata": {"annotations": {DEACTIVATED_ANNOTATION: None}}},
            )
        )
    elif wl.queue != queue and not wl.admitted:
        writes.patch.append((wl.name, wl.resource_version, {"spec": {"queueName": queue}}))
    if wl.evicted:
        ev = wl.conditions["Evicted"]
        if workers_active == 0 and wl.holds("QuotaReserved"):
            writes.status.append((wl.name, wl.resource_version, clear_reservation(wl, ev.reason, ev.message, now)))
        return (
            Gate(
                None,
                ev.reason or JobReason.EVICTED,
                f"Kueue evicted Workload {wl.name} ({ev.reason}): {ev.message}; the workers are stopped "
                "and the job waits to be admitted again",
                evicted=True,
            ),
            writes,
        )
    if wl.admitted:
        placement, why = _placement(wl, q.flavors)
        if placement is None:
            return Gate(None, JobReason.FLAVOR_UNKNOWN, why), writes
        return Gate(placement, workload=wl), writes
    reserved = wl.conditions.get("QuotaReserved")
    if not wl.active and not user_suspended and not wl.deactivated_by_us:  # ours is reactivated above
        why = f"Kueue deactivated Workload {wl.name}: {reserved.message if reserved else ''}"
        return Gate(None, JobReason.DEACTIVATED, why), writes
    reason = reserved.reason if reserved is not None and reserved.reason else JobReason.QUEUED
    detail = reserved.message if reserved is not None and reserved.message else "not admitted yet"
    if wl.holds("QuotaReserved"):
        admitted = wl.conditions.get("Admitted")
        reason = admitted.reason if admitted is not None and admitted.reason else JobReason.QUOTA_RESERVED
        detail = admitted.message if admitted is not None and admitted.message else "quota reserved, checks pending"
    message = f"waiting for Kueue to admit Workload {wl.name} in LocalQueue {queue!r}: {detail}"
    return Gate(None, reason, message), writes
