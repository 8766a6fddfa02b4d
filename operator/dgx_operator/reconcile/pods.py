"""What a worker pod's status means for the job: running, finished, failed by the program, or
disrupted by the cluster (eviction, preemption, node loss, spot reclaim), which never counts
against backoffLimit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dgx_operator.build.names import ATTEMPT_LABEL, CONTAINER_NAME, INDEX_LABEL

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
    def active(self) -> bool:
        """Exists and may still run: counts as a worker of the job."""
        return not self.finished and not self.terminating

    @property
    def deadline_exceeded(self) -> bool:
        """Killed by its activeDeadlineSeconds, i.e. the job's maxDuration."""
        return self.reason == "DeadlineExceeded"

    def describe_failure(self) -> str:
        if self.exit_code is not None:
            text = f"{self.name} exited with code {self.exit_code}"
            if self.reason and self.reason not in ("Error", "Completed"):
                text += f" ({self.reason})"
        else:
            text = f"{self.name} failed ({self.reason or self.phase})"
        if self.message:
            text += f": {self.message.strip().splitlines()[-1][:300]}"
        return text

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodView:
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
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        disruption = conditions.get(DISRUPTION_CONDITION, {}).get("status") == "True"
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
            termination_message=(terminated or {}).get("message"),
            progress_annotation=annotations.get("kubedgx.io/progress"),
        )


def slim(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a pod that :meth:`PodView.of` reads, and nothing else. The operator's pod index
    holds this instead of whole pods: at 1000 jobs x 8 workers the full bodies (env, affinity,
    volumes) would be most of its memory."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    return {
        "metadata": {
            "name": meta.get("name"),
            "labels": {k: labels[k] for k in (INDEX_LABEL, ATTEMPT_LABEL) if k in labels},
            "annotations": {k: v for k, v in annotations.items() if k == "kubedgx.io/progress"},
            "ownerReferences": [o for o in meta.get("ownerReferences") or [] if o.get("controller")],
            **({"deletionTimestamp": meta["deletionTimestamp"]} if meta.get("deletionTimestamp") else {}),
        },
        "status": {
            "phase": status.get("phase"),
            "reason": status.get("reason"),
            "message": status.get("message"),
            "hostIP": status.get("hostIP"),
            "conditions": [
                {"type": c.get("type"), "status": c.get("status")}
                for c in status.get("conditions") or []
                if c.get("type") in ("PodScheduled", DISRUPTION_CONDITION)
            ],
            "containerStatuses": [c for c in status.get("containerStatuses") or [] if c.get("name") == CONTAINER_NAME],
        },
    }


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
            data = json.loads(text)
        except ValueError:
            continue
        if isinstance(data, dict):
            inner = data.get("progress", data)
            if isinstance(inner, dict):
                return inner
    return None
