"""DGXDataMount scenarios against the in-memory API server: mounts of a real S3 API (moto's server on
loopback, tests/s3.py) with the Secret they name, the jobs that use them, and what the data sync
containers report when they end (the test plays the kubelet). Shared by test_datamounts.py,
test_datamounts_gcs.py, test_ca_bundle.py, test_metrics.py, the chart's RBAC test and the Argo CD
health checks."""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import BASE_MOUNT, with_changes
from tests.integration.emulator import Emulator
from tests.integration.scenarios import (
    JOBS,
    MOUNTS,
    NS,
    Body,
    _container,
    _scheduled,
    expect_pods,
    job_with,
    run_pod,
    wait_phase,
    worker,
)
from tests.s3 import S3, secret

SECRET = "s3-credentials"
FILES = {
    "prefix/train/a.jsonl": b'{"text": "a"}\n' * 10,
    "prefix/train/b.jsonl": b'{"text": "b"}\n' * 20,
    "prefix/notes.md": b"# not training data\n",
    "elsewhere/c.jsonl": b"{}\n",
}


def mount_of(s3: S3, bucket: str, name: str = "data", **changes: Any) -> Body:
    return with_changes(
        BASE_MOUNT,
        {
            "metadata.name": name,
            "spec.source": f"s3://{bucket}/prefix",
            "spec.endpoint": s3.endpoint,
            "spec.credentialsSecretRef": {"name": SECRET},
            **changes,
        },
    )


def job_using(*refs: tuple[str, str], **changes: Any) -> Body:
    return job_with({"spec.dataMounts": [{"name": n, "mountPath": p} for n, p in refs], **changes})


async def wait_mount(emulator: Emulator, phase: str, name: str = "data", *, timeout: float = 10.0) -> Body:
    def reached(mount: Body) -> bool:
        return bool((mount.get("status") or {}).get("phase") == phase)

    mount = await emulator.wait_for_object(MOUNTS, NS, name, reached, timeout=timeout)
    status: Body = mount["status"]
    return status


def mount_events(emulator: Emulator, name: str = "data") -> list[tuple[str, str, str]]:
    events = [
        e
        for e in emulator.select("events", NS)
        if e.get("involvedObject", {}).get("kind") == "DGXDataMount" and e["involvedObject"].get("name") == name
    ]
    events.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [(e["type"], e["reason"], e.get("message", "")) for e in events]


async def expect_mount_events(emulator: Emulator, expected: list[tuple[str, str]], name: str = "data") -> None:
    """The mount's events, (type, reason) oldest first, are exactly these (kopf posts them asynchronously)."""
    await emulator.wait_for(
        lambda: len(mount_events(emulator, name)) >= len(expected),
        message=lambda: f"{len(expected)} events for mount {name}; now {mount_events(emulator, name)}",
    )
    assert [(t, r) for t, r, _ in mount_events(emulator, name)] == expected


def init_containers(emulator: Emulator, pod: str) -> dict[str, Body]:
    stored = emulator.get("pods", NS, pod)
    assert stored is not None
    return {c["name"]: c for c in stored["spec"].get("initContainers", [])}


def end_with_sync_report(
    emulator: Emulator, pod: str, *, trainer_exit: int | None, init: list[tuple[str, int, dict[str, Any]]]
) -> None:
    """The kubelet's final status of a pod: init containers (sidecars included) terminated with these exit
    codes and termination messages; the trainer exited with ``trainer_exit`` (None: never started)."""
    statuses = [
        {
            "name": name,
            "image": "trainer",
            "imageID": "registry.example/trainer@sha256:" + "1" * 64,
            "ready": False,
            "restartCount": 0,
            "state": {
                "terminated": {
                    "exitCode": code,
                    "reason": "Completed" if code == 0 else "Error",
                    "message": json.dumps(report),
                    "startedAt": "2025-01-01T00:00:00Z",
                    "finishedAt": "2025-01-01T01:00:00Z",
                }
            },
        }
        for name, code, report in init
    ]
    if trainer_exit is None:
        trainer = _container(emulator, pod, {"waiting": {"reason": "PodInitializing"}}, ready=False)
    else:
        terminated = {
            "exitCode": trainer_exit,
            "reason": "Completed" if trainer_exit == 0 else "Error",
            "startedAt": "2025-01-01T00:00:00Z",
            "finishedAt": "2025-01-01T01:00:00Z",
        }
        trainer = _container(emulator, pod, {"terminated": terminated}, ready=False)
    # One write, as the kubelet's: the sidecars end before the pod's phase is final.
    emulator.patch_status(
        "pods",
        NS,
        pod,
        {
            "phase": "Succeeded" if trainer_exit == 0 else "Failed",
            **_scheduled(False),
            "initContainerStatuses": statuses,
            "containerStatuses": trainer,
        },
    )


OUT_JOB = {"spec.trainer.output": {"dir": "/out/run"}}


async def out_mount_ready(emulator: Emulator, s3: S3) -> tuple[str, Body]:
    """A direction: Out mount ``ckpt`` on a new bucket, with its Secret: (bucket, its Ready status)."""
    bucket = s3.bucket()
    emulator.create("secrets", secret(SECRET))
    emulator.create(MOUNTS, mount_of(s3, bucket, "ckpt", **{"spec.direction": "Out"}))
    return bucket, await wait_mount(emulator, "Ready", "ckpt")


async def succeed_with_a_failed_archive(emulator: Emulator, s3: S3) -> tuple[Body, dict[str, str]]:
    """A job writing to an Out mount whose trainer succeeds while its uploader fails to archive:
    (the job's Succeeded status, the uploader's error report)."""
    bucket, _ = await out_mount_ready(emulator, s3)
    emulator.create(JOBS, job_using(("ckpt", "/out"), **OUT_JOB))
    await expect_pods(emulator, {worker(0): "0"})
    run_pod(emulator, worker(0))
    error = {"error": "AccessDenied", "message": f"access denied to s3://{bucket}/prefix/final: check the policy"}
    end_with_sync_report(emulator, worker(0), trainer_exit=0, init=[("checkpoints-0", 2, error)])
    return await wait_phase(emulator, "Succeeded"), error
