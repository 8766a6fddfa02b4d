"""What a worker pod's status means for the job: running, finished, failed by the program, or
disrupted by the cluster (eviction, preemption, node loss, spot reclaim), which never counts
against backoffLimit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from dgx_api.progress import loads_finite, parse_event
from dgx_operator.api.vocabulary import JobReason
from dgx_operator.reconcile.diagnosis import Diagnosis, Fields, diagnose, summary
from dgx_operator.render.datasync import SIDECAR_PREFIX
from dgx_operator.render.names import (
    ATTEMPT_LABEL,
    CAPACITY_ANNOTATION,
    CONFIG_LABEL,
    CONTAINER_NAME,
    DETACHED_SUFFIX,
    GPU_RESOURCE,
    INDEX_LABEL,
    JOB_LABEL,
)

#: Pod-level reasons for a failure the program did not cause.
DISRUPTION_REASONS = frozenset(
    {
        "Evicted",
        "Preempting",
        "Preempted",
        "NodeLost",
        "Shutdown",
        "NodeShutdown",
        "Terminated",
        "NodeAffinity",
        "UnexpectedAdmissionError",
    }
)
#: Reasons kubelet gives when it rejects a pod at admission: OutOfcpu, OutOfmemory, OutOfnvidia.com/gpu...
DISRUPTION_REASON_PREFIXES = ("OutOf",)
#: The DisruptionTarget condition (Kubernetes >= 1.26) names the same events explicitly.
DISRUPTION_CONDITION = "DisruptionTarget"

#: How long past its deletionTimestamp (the end of its grace period) a terminating pod may still
#: exist before it counts as gone: a kubelet that is alive kills the containers when the grace
#: period ends and removes the pod within seconds; one that is not (a lost node) never does, and the
#: pod stays Terminating until someone force-deletes it.
STUCK_AFTER = timedelta(seconds=60)

#: Waiting reasons of a container that waiting cannot heal: the job ends with them.
PERMANENT_WAITING = JobReason.PERMANENT_WAITING
#: Waiting reasons worth reporting while a worker is not running yet (api.vocabulary).
REPORTED_WAITING = JobReason.REPORTED_WAITING

#: A MIG slice's resource as the NVIDIA device plugin names it (mixed strategy).
MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-(?P<slices>[1-7])g\.")


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp from the API (``2026-12-01T10:00:00Z``), or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True)
class PodView:
    """The facts about one worker pod that the planner decides on."""

    name: str
    index: int | None
    attempt: int
    phase: str
    running: bool
    terminating: bool
    scheduled: bool
    exit_code: int | None
    reason: str
    message: str
    disrupted: bool
    owner_uid: str | None
    owner_kind: str | None
    owner_name: str | None
    termination_message: str | None
    progress_annotation: str | None
    #: (container, termination message) of the checkpoint sidecars that have ended: their report of
    #: what they uploaded and archived.
    sidecar_reports: tuple[tuple[str, str], ...] = ()
    #: The data sync init container that failed (the trainer never started), if one did.
    failed_init: str | None = None
    #: When the pod's grace period ends (metadata.deletionTimestamp), if it is being deleted.
    deletion_time: datetime | None = None
    #: A DisruptionTarget condition says the cluster is taking the pod away (taint manager after
    #: node loss, preemption, eviction).
    disruption_target: bool = False
    #: When the container whose exit failed the pod ended (state.terminated.finishedAt).
    finished_at: datetime | None = None
    #: (container, reason, message) of containers waiting for a reason worth reporting.
    waiting: tuple[tuple[str, str, str], ...] = ()
    #: The scheduler's message while it cannot place the pod (PodScheduled False, Unschedulable).
    unschedulable: str | None = None
    #: The trainer ConfigMap the pod mounts (its kubedgx.io/trainer-config label).
    config: str | None = None
    #: Let go of by its job (JOB_LABEL "<job>.detached"): gone for every purpose but its name.
    detached: bool = False
    #: The trainer container's current state is terminated (its lastState does not count).
    exited: bool = False
    #: The pod's uid: a worker re-created under the same name is another pod (usage accounting).
    uid: str | None = None
    #: When the scheduler bound it to a node (PodScheduled True's lastTransitionTime).
    bound_at: datetime | None = None
    #: When a finished pod's last container ended (every container's and init container's
    #: finishedAt, native sidecars included): it let go of its node then.
    ended_at: datetime | None = None
    #: The GPUs its trainer container holds (its nvidia.com/gpu limit); None: not read (a pod the
    #: operator created and has not seen yet).
    gpus: int | None = None
    #: A MIG worker's slice, in compute slices of 7 (its nvidia.com/mig-<g>g.* limit): it holds g/7 of
    #: a GPU, which is what it is charged. None: whole GPUs.
    mig_slices: int | None = None
    #: The capacity pool it was placed in (its kubedgx.io/capacity annotation); None on a worker made
    #: before the operator wrote it: the job's instance's capacity then.
    capacity: str | None = None

    @property
    def failed(self) -> bool:
        return self.phase == "Failed" or self.phase == "Unknown"

    @property
    def succeeded(self) -> bool:
        return self.phase == "Succeeded"

    @property
    def finished(self) -> bool:
        return self.failed or self.succeeded

    @property
    def ending(self) -> bool:
        """The trainer has exited and the pod's phase has not caught up yet. A real kubelet reports
        the container terminated (and the pod not Ready) about a second before it writes the phase,
        and much longer while native sidecars finish their final uploads. Such a worker is neither
        running nor lost: its phase will say how it ended."""
        return self.exited and not self.finished

    @property
    def active(self) -> bool:
        """Exists and may still run: counts as a worker of the job."""
        return not self.finished and not self.terminating

    def gone(self, now: datetime) -> bool:
        """Being deleted, and its kubelet is not going to finish that: the cluster marked it for
        disruption (the taint manager does so after node loss), or its grace period ended well
        ago. Such a pod holds its name for ever; the job treats it as gone."""
        if self.detached:
            return True
        if not self.terminating or self.phase in ("Succeeded", "Failed"):
            return False
        if self.disruption_target:
            return True
        return self.deletion_time is not None and now >= self.deletion_time + STUCK_AFTER

    def waiting_reason(self) -> tuple[str, str] | None:
        """(reason, "container: message") of the first reported waiting container, if any."""
        for container, reason, message in self.waiting:
            detail = f"{container}: {message}" if message else container
            return reason, detail
        return None

    @property
    def deadline_exceeded(self) -> bool:
        """Killed by its activeDeadlineSeconds, i.e. the job's maxDuration."""
        return self.reason == "DeadlineExceeded"

    def diagnose(self, fields: Fields | None = None) -> Diagnosis | None:
        """The named cause of this worker's failure (:mod:`dgx_operator.reconcile.diagnosis`), or
        None when nothing recognises it. A data sync init container's failure is the data's, not
        the program's: it is not diagnosed here."""
        if self.failed_init is not None:
            return None
        return diagnose(self.termination_message, reason=self.reason, exit_code=self.exit_code, fields=fields)

    def describe_failure(self) -> str:
        if self.failed_init is not None:
            text = f"{self.name}: data sync {self.failed_init} exited with code {self.exit_code}"
            if self.message:
                text += f": {self.message.strip().splitlines()[-1][:300]}"
            return text
        if self.exit_code is not None:
            text = f"{self.name} exited with code {self.exit_code}"
            if self.reason and self.reason not in ("Error", "Completed"):
                text += f" ({self.reason})"
        else:
            text = f"{self.name} failed ({self.reason or self.phase})"
        line = summary(self.message)
        if line:
            text += f": {line}"
        return text

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodView:
        gpus, slices = _devices(pod.get("spec") or {})
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        labels = meta.get("labels") or {}
        index_label = labels.get(INDEX_LABEL)
        phase = str(status.get("phase") or "Pending")
        container: Mapping[str, Any] = next(
            (c for c in status.get("containerStatuses") or [] if c.get("name") == CONTAINER_NAME),
            {},
        )
        state = container.get("state") or {}
        terminated = state.get("terminated") or (container.get("lastState") or {}).get("terminated")
        exit_code = terminated.get("exitCode") if terminated else None
        reason = str(status.get("reason") or (terminated or {}).get("reason") or "")
        failed_init, init_exit, init_message = _failed_init(status)
        if terminated is None and failed_init is not None:
            # The trainer never ran: a pull or restore failed (bad credentials, missing bucket...).
            # Its exit code decides like the trainer's would (2: permanent, see docs/datasync.md).
            terminated = {"exitCode": init_exit, "reason": "DataSyncFailed", "message": init_message}
            exit_code = init_exit
            reason = str(status.get("reason") or "DataSyncFailed")
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        disruption = conditions.get(DISRUPTION_CONDITION, {}).get("status") == "True"
        scheduled_condition = conditions.get("PodScheduled", {})
        disrupted = (
            disruption
            or str(status.get("reason") or "") in DISRUPTION_REASONS
            or str(status.get("reason") or "").startswith(DISRUPTION_REASON_PREFIXES)
            or phase == "Unknown"
            # Failed without the program ever having run (rejected at admission by the kubelet).
            or (phase == "Failed" and terminated is None and status.get("reason") != "DeadlineExceeded")
        )
        owner = next(
            (o for o in meta.get("ownerReferences") or [] if o.get("controller")),
            None,
        )
        annotations = meta.get("annotations") or {}
        return cls(
            name=str(meta.get("name", "")),
            index=_int(index_label, -1) if index_label is not None else None,
            attempt=_int(labels.get(ATTEMPT_LABEL), 0),
            phase=phase,
            running=phase == "Running" and "running" in state,
            terminating=bool(meta.get("deletionTimestamp")),
            scheduled=conditions.get("PodScheduled", {}).get("status") == "True" or bool(status.get("hostIP")),
            exit_code=_int(exit_code, -1) if exit_code is not None else None,
            reason=reason,
            message=str((terminated or {}).get("message") or status.get("message") or ""),
            disrupted=disrupted and phase != "Succeeded",
            owner_uid=str(owner["uid"]) if owner and owner.get("uid") else None,
            owner_kind=str(owner.get("kind")) if owner else None,
            owner_name=str(owner.get("name")) if owner else None,
            termination_message=(terminated or {}).get("message") if failed_init is None else None,
            progress_annotation=annotations.get("kubedgx.io/progress"),
            sidecar_reports=_sidecar_reports(status),
            failed_init=failed_init if exit_code is not None and failed_init is not None else None,
            deletion_time=parse_time(meta.get("deletionTimestamp")),
            disruption_target=disruption,
            finished_at=parse_time((terminated or {}).get("finishedAt")),
            waiting=_waiting(status),
            unschedulable=(
                str(scheduled_condition.get("message") or "the scheduler cannot place it")
                if scheduled_condition.get("status") == "False" and scheduled_condition.get("reason") == "Unschedulable"
                else None
            ),
            config=labels.get(CONFIG_LABEL),
            detached=str(labels.get(JOB_LABEL) or "").endswith(DETACHED_SUFFIX),
            exited="terminated" in state,
            uid=str(meta["uid"]) if meta.get("uid") else None,
            bound_at=(
                parse_time(scheduled_condition.get("lastTransitionTime"))
                if scheduled_condition.get("status") == "True"
                else None
            ),
            ended_at=_ended_at(status) if phase in ("Succeeded", "Failed") else None,
            gpus=gpus,
            mig_slices=slices,
            capacity=annotations.get(CAPACITY_ANNOTATION),
        )


def _limits(spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for c in spec.get("containers") or []:
        if c.get("name") == CONTAINER_NAME:
            limits: Mapping[str, Any] = (c.get("resources") or {}).get("limits") or {}
            return limits
    return None


def _mig(spec: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """The trainer container's MIG resource (``nvidia.com/mig-1g.10gb``) and its slice's compute
    slices (1), if it asks one."""
    for key in _limits(spec) or {}:
        match = MIG_RESOURCE.match(str(key))
        if match:
            return str(key), int(match["slices"])
    return None, None


def _devices(spec: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """The trainer container's GPU limit (extended resources are requested as limits): its
    ``nvidia.com/gpu``, or its MIG slices (each one device); and a MIG slice's compute slices."""
    limits = _limits(spec)
    if limits is None:
        return None, None
    mig, slices = _mig(spec)
    return _int(limits.get(mig if mig is not None else GPU_RESOURCE), 0), slices


def _ended_at(status: Mapping[str, Any]) -> datetime | None:
    """The last finishedAt of all the pod's containers (None if none reports one)."""
    times = [
        parse_time(((c.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for c in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    ]
    found = [t for t in times if t is not None]
    return max(found) if found else None


def _waiting(status: Mapping[str, Any]) -> tuple[tuple[str, str, str], ...]:
    """Init containers first (they run first), then the trainer."""
    out = []
    for c in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (c.get("state") or {}).get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        if reason in REPORTED_WAITING:
            out.append((str(c.get("name", "")), reason, str(waiting.get("message") or "")[:500]))
    return tuple(out)


def _init_terminated(status: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    out = []
    for c in status.get("initContainerStatuses") or []:
        terminated = (c.get("state") or {}).get("terminated")
        if terminated:
            out.append((str(c.get("name", "")), terminated))
    return out


def _sync_message(text: str) -> str:
    """datasync writes {"error": ..., "message": ...} as its termination message; show the message."""
    try:
        data = json.loads(text)
    except ValueError:
        return text
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return str(data["message"])
    return text


def _failed_init(status: Mapping[str, Any]) -> tuple[str | None, int, str]:
    for name, terminated in _init_terminated(status):
        if name.startswith(SIDECAR_PREFIX):
            continue  # a sidecar's exit is not the pod's failure
        code = _int(terminated.get("exitCode"), -1)
        if code != 0:
            return name, code, _sync_message(str(terminated.get("message") or terminated.get("reason") or ""))
    return None, 0, ""


def _sidecar_reports(status: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(
        (name, str(t.get("message") or ""))
        for name, t in _init_terminated(status)
        if name.startswith(SIDECAR_PREFIX) and t.get("message")
    )


def artifacts_of(pod: PodView) -> tuple[list[tuple[int, str, str]], list[str]]:
    """([(mount index, artifact name, uri)], [errors]) from the pod's sidecar reports."""
    found: list[tuple[int, str, str]] = []
    errors: list[str] = []
    for container, text in pod.sidecar_reports:
        index = _int(container.removeprefix(SIDECAR_PREFIX), -1)
        try:
            data = json.loads(text)
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        if data.get("error"):
            errors.append(f"{pod.name}/{container}: {data.get('message') or data['error']}")
        items = data.get("artifacts")
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict) and item.get("uri"):
                found.append((index, str(item.get("name") or ""), str(item["uri"])))
    return found, errors


def slim(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a pod that :meth:`PodView.of` reads, and nothing else. The controller's
    expectations hold this for each worker it created until the watch shows it, instead of the whole
    manifest (env, affinity, volumes); the pod index holds PodViews."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    gpus = _devices(pod.get("spec") or {})[0]
    resource = _mig(pod.get("spec") or {})[0] or GPU_RESOURCE
    return {
        "metadata": {
            "name": meta.get("name"),
            **({"uid": meta["uid"]} if meta.get("uid") else {}),
            "labels": {k: labels[k] for k in (JOB_LABEL, INDEX_LABEL, ATTEMPT_LABEL, CONFIG_LABEL) if k in labels},
            "annotations": {k: v for k, v in annotations.items() if k in ("kubedgx.io/progress", CAPACITY_ANNOTATION)},
            "ownerReferences": [o for o in meta.get("ownerReferences") or [] if o.get("controller")],
            **({"deletionTimestamp": meta["deletionTimestamp"]} if meta.get("deletionTimestamp") else {}),
        },
        **(
            {"spec": {"containers": [{"name": CONTAINER_NAME, "resources": {"limits": {resource: str(gpus)}}}]}}
            if gpus is not None
            else {}
        ),
        "status": {
            "phase": status.get("phase"),
            "reason": status.get("reason"),
            "message": status.get("message"),
            "hostIP": status.get("hostIP"),
            "conditions": [
                {
                    k: str(c[k])[:1000]
                    for k in ("type", "status", "reason", "message", "lastTransitionTime")
                    if c.get(k) is not None
                }
                for c in status.get("conditions") or []
                if c.get("type") in ("PodScheduled", DISRUPTION_CONDITION)
            ],
            "containerStatuses": [
                c
                if c.get("name") == CONTAINER_NAME
                else {"name": c.get("name"), "state": {"terminated": {"finishedAt": ended}}}
                for c in status.get("containerStatuses") or []
                if c.get("name") == CONTAINER_NAME
                or (ended := ((c.get("state") or {}).get("terminated") or {}).get("finishedAt"))
            ],
            "initContainerStatuses": [
                {"name": name, "state": {"terminated": dict(t)}} for name, t in _init_terminated(status)
            ]
            + [
                {"name": name, "state": {"waiting": {"reason": reason, "message": message}}}
                for name, reason, message in _waiting({"initContainerStatuses": status.get("initContainerStatuses")})
            ],
        },
    }


def progress_in_log(text: str) -> dict[str, Any] | None:
    """The last progress report in a worker's log: the trainer's (and any ``spec.command``
    program's) ``{"event": "progress", ...}`` lines on stdout (docs/trainer.md, "Progress: the
    contract"), read by the operator while the worker runs. Other lines, and reports that are not
    objects, are ignored."""
    for line in reversed(text.splitlines()):
        event = parse_event(line)
        if event is not None and event.get("event") == "progress":
            return {k: v for k, v in event.items() if k != "event"}
    return None


def read_progress(pod: PodView) -> dict[str, Any] | None:
    """The trainer's progress report: the JSON summary in its termination message once the worker
    ended (the final word), else the pod annotation written while it runs. Anything unparseable is
    ignored, never fatal."""
    sources = (pod.termination_message, pod.progress_annotation)
    if not pod.finished:
        sources = (pod.progress_annotation, pod.termination_message)
    for text in sources:
        if not text:
            continue
        try:
            data = loads_finite(text)  # NaN/Infinity would make the status patch not JSON
        except ValueError:
            continue
        if isinstance(data, dict):
            inner = data.get("progress", data)
            if isinstance(inner, dict):
                return inner
    return None
