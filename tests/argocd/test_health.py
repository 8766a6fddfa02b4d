"""Argo CD's view of kubedgx resources: the Lua health checks in charts/kubedgx/files/argocd (run as Argo CD runs
them, see tests/argocd/health.py) evaluated on the statuses the real operator writes (the integration emulator,
the test playing kubelet and scheduler; data mounts against moto's S3); and the promise behind "no drift": over a
whole lifecycle the operator never writes a spec.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import pytest

from tests.argocd.health import Health, health
from tests.integration.conftest import RunOperator
from tests.integration.emulator import Emulator, parse_route
from tests.integration.mount_scenarios import (
    FILES,
    SECRET,
    job_using,
    mount_of,
    out_mount_ready,
    succeed_with_a_failed_archive,
    wait_mount,
)
from tests.integration.scenarios import (
    FINALIZER,
    JOB,
    JOBS,
    MOUNTS,
    NS,
    PROGRESS,
    Body,
    Operator,
    condition,
    exit_pod,
    expect_pods,
    get_job,
    job_with,
    run_pod,
    run_pods,
    start_operator,
    two_workers,
    wait_phase,
    worker,
)
from tests.s3 import S3, secret

pytestmark = pytest.mark.asyncio


def job_health(emulator: Emulator, name: str = JOB) -> Health:
    return health(get_job(emulator, name))


def mount_health(emulator: Emulator, name: str = "data") -> Health:
    mount = emulator.get(MOUNTS, NS, name)
    assert mount is not None, f"mount {name} does not exist"
    return health(mount)


def message_of(status: Mapping[str, Any], type_: str) -> str:
    return str(condition(status, type_)["message"])


# --------------------------------------------------------------------------------------------
# DGXTrainingJob, on the statuses the operator writes
# --------------------------------------------------------------------------------------------


async def test_a_job_from_creation_to_success(emulator: Emulator, run_operator: RunOperator) -> None:
    emulator.create(JOBS, two_workers())  # synced by Argo CD before the operator saw it
    assert job_health(emulator) == Health("Progressing", "waiting for the operator")

    op = await start_operator(emulator, run_operator)
    await expect_pods(emulator, {worker(0): "0", worker(1): "0"})
    status = await wait_phase(emulator, "Pending")
    assert job_health(emulator) == Health("Progressing", "Pending: 0/2 workers running, need 2 (2 not scheduled yet)")
    assert job_health(emulator).message == f"Pending: {message_of(status, 'Running')}"

    run_pods(emulator, worker(0), worker(1))
    await wait_phase(emulator, "Running", lambda s: s.get("nodes") == "2/2")
    assert job_health(emulator) == Health("Progressing", "Running: 2/2 workers running")
    report = {"step": 10, "totalSteps": 100, "loss": 1.25}
    emulator.patch("pods", NS, worker(0), {"metadata": {"annotations": {PROGRESS: json.dumps(report)}}})
    await wait_phase(emulator, "Running", lambda s: "progress" in s)
    assert job_health(emulator) == Health("Progressing", "Running: 2/2 workers running (step 10/100)")

    # A spec edit synced from Git: until the operator has planned with it, the old status says nothing about it.
    async with op.paused():
        emulator.patch(JOBS, NS, JOB, {"spec": {"maxDuration": "48h"}})
        assert job_health(emulator) == Health(
            "Progressing", "waiting for the operator to observe generation 2 (the status describes generation 1)"
        )
    await wait_phase(emulator, "Running", lambda s: s.get("observedGeneration") == 2)
    assert job_health(emulator) == Health("Progressing", "Running: 2/2 workers running (step 10/100)")

    exit_pod(emulator, worker(0), 0)
    status = await wait_phase(emulator, "Succeeded")
    assert job_health(emulator) == Health("Healthy", "job-worker-0 exited 0: training completed")
    assert job_health(emulator).message == message_of(status, "Succeeded")


async def test_a_restarting_job_then_one_past_its_backoff_limit(emulator: Emulator, run_operator: RunOperator) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.hold_pod_deletion = True  # the failed worker stays Terminating: Restarting lasts until it is gone
    emulator.create(JOBS, job_with({"spec.restartPolicy": "OnFailure", "spec.backoffLimit": 1}))
    await expect_pods(emulator, {worker(0): "0"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")
    assert job_health(emulator) == Health("Progressing", "Running: 1/1 workers running")

    exit_pod(emulator, worker(0), 1, message="NCCL error: unhandled system error")
    status = await wait_phase(emulator, "Restarting")
    await op.settle()
    assert job_health(emulator) == Health(
        "Progressing", "Restarting: 0/1 workers running, below minNodes 1; recreating"
    )
    assert job_health(emulator).message == f"Restarting: {message_of(status, 'Restarting')}"

    emulator.finish_pod_deletion(NS, worker(0))
    await expect_pods(emulator, {worker(0): "1"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")
    assert job_health(emulator).status == "Progressing"

    exit_pod(emulator, worker(0), 1, message="NCCL error: unhandled system error")
    status = await wait_phase(emulator, "Failed")
    assert condition(status, "Failed")["reason"] == "BackoffLimitExceeded"
    assert job_health(emulator) == Health(
        "Degraded",
        f"{worker(0)} exited with code 1: NCCL error: unhandled system error; backoffLimit 1 reached after 1 "
        "restart(s)",
    )


async def test_a_suspended_job(emulator: Emulator, run_operator: RunOperator) -> None:
    await start_operator(emulator, run_operator)
    emulator.create(JOBS, two_workers(**{"spec.suspend": True}))  # as Kueue wants them
    await wait_phase(emulator, "Suspended")
    assert job_health(emulator) == Health("Suspended", "spec.suspend is true: workers deleted, the job is kept")

    emulator.patch(JOBS, NS, JOB, {"spec": {"suspend": False}})  # admitted
    await wait_phase(emulator, "Pending")
    assert job_health(emulator) == Health("Progressing", "Pending: 0/2 workers running, need 2 (2 not scheduled yet)")


async def fail_worker_never(op: Operator) -> None:
    op.emulator.create(JOBS, job_with({"spec.restartPolicy": "Never"}))
    await expect_pods(op.emulator, {worker(0): "0"})
    run_pod(op.emulator, worker(0))
    await wait_phase(op.emulator, "Running")
    exit_pod(op.emulator, worker(0), 1, message="RuntimeError: CUDA error: an illegal memory access was encountered")


async def fail_deadline(op: Operator) -> None:
    op.emulator.create(JOBS, job_with({"spec.maxDuration": "1h"}))
    await expect_pods(op.emulator, {worker(0): "0"})
    run_pod(op.emulator, worker(0))
    await wait_phase(op.emulator, "Running")
    op.clock.advance(timedelta(hours=1))
    await op.trigger()


async def fail_pending_timeout(op: Operator) -> None:
    op.emulator.create(JOBS, two_workers(**{"spec.maxPending": "10m"}))
    await expect_pods(op.emulator, {worker(0): "0", worker(1): "0"})
    run_pod(op.emulator, worker(0))
    await wait_phase(op.emulator, "Pending", lambda s: s.get("nodes") == "1/2")
    op.clock.advance(timedelta(minutes=10))
    await op.trigger()


async def fail_invalid_spec(op: Operator) -> None:
    op.emulator.create(JOBS, job_with({"spec.instance": "dgxz999.80g.8.norm"}))  # well-formed, not in the catalog


FAILURES: dict[str, tuple[Callable[[Operator], Any], str]] = {
    "WorkerFailed": (
        fail_worker_never,
        f"{worker(0)} exited with code 1: RuntimeError: CUDA error: an illegal memory access was encountered; "
        "restartPolicy is Never",
    ),
    "DeadlineExceeded": (fail_deadline, "the job ran longer than spec.maxDuration (1h)"),
    "PendingTimeout": (
        fail_pending_timeout,
        "fewer than minNodes workers ran for spec.maxPending (10m): 1/2 workers running, need 2 (1 not scheduled yet)",
    ),
    "InvalidSpec": (fail_invalid_spec, ""),
}


@pytest.mark.parametrize("reason", sorted(FAILURES))
async def test_a_failed_job_is_degraded_with_the_failed_condition_message(
    emulator: Emulator, run_operator: RunOperator, reason: str
) -> None:
    op = await start_operator(emulator, run_operator)
    scenario, expected = FAILURES[reason]
    await scenario(op)
    status = await wait_phase(emulator, "Failed")
    failed = condition(status, "Failed")
    assert failed["reason"] == reason
    assert job_health(emulator) == Health("Degraded", failed["message"])
    if expected:
        assert failed["message"] == expected
    else:
        assert "dgxz999.80g.8.norm" in failed["message"]


# --------------------------------------------------------------------------------------------
# DGXDataMount, and jobs waiting for or failed by one
# --------------------------------------------------------------------------------------------


async def test_a_mount_syncing_then_ready_and_its_job_waiting_for_data(
    emulator: Emulator, run_operator: RunOperator, s3: S3
) -> None:
    bucket = s3.bucket(objects=FILES)
    emulator.create(MOUNTS, mount_of(s3, bucket))  # its Secret is applied later (kubectl apply -f dir/)
    assert mount_health(emulator) == Health("Progressing", "waiting for the operator")
    op = await start_operator(emulator, run_operator)
    emulator.create(JOBS, job_using(("data", "/data")))

    def credentials_missing(m: Body) -> bool:
        ready = [c for c in (m.get("status") or {}).get("conditions", []) if c["type"] == "Ready"]
        return bool(ready) and ready[0]["reason"] == "CredentialsMissing"

    mount = await emulator.wait_for_object(MOUNTS, NS, "data", credentials_missing)
    assert mount["status"]["phase"] == "Syncing"
    assert mount_health(emulator) == Health("Progressing", f"Syncing: {message_of(mount['status'], 'Ready')}")
    assert mount_health(emulator).message.endswith("(retrying)")
    status = await wait_phase(emulator, "WaitingForData", lambda s: message_of(s, "DataReady").endswith("(Syncing)"))
    assert job_health(emulator) == Health("Progressing", "WaitingForData: waiting for DGXDataMount data (Syncing)")
    assert job_health(emulator).message == f"WaitingForData: {message_of(status, 'DataReady')}"

    emulator.create("secrets", secret(SECRET))
    status = await wait_mount(emulator, "Ready")
    total = sum(len(v) for k, v in FILES.items() if k.startswith("prefix/"))
    assert mount_health(emulator) == Health("Healthy", f"3 objects, {total} B at s3://{bucket}/prefix")
    assert mount_health(emulator).message == message_of(status, "Ready")
    await expect_pods(emulator, {worker(0): "0"})
    await wait_phase(emulator, "Pending")
    assert job_health(emulator).status == "Progressing"

    # The spec edited in Git while the operator is away: the Ready status is of the old spec.
    await op.stop()
    emulator.patch(MOUNTS, NS, "data", {"spec": {"include": ["train/*"]}})
    assert mount_health(emulator) == Health(
        "Progressing", "the spec changed; waiting for the operator to list generation 2"
    )


async def test_a_failed_mount_and_the_job_it_fails(emulator: Emulator, run_operator: RunOperator, s3: S3) -> None:
    await start_operator(emulator, run_operator)
    emulator.create("secrets", secret(SECRET))
    emulator.create(MOUNTS, mount_of(s3, "kubedgx-no-such-bucket"))
    status = await wait_mount(emulator, "Failed")
    assert condition(status, "Ready")["reason"] == "BucketNotFound"
    assert mount_health(emulator) == Health("Degraded", message_of(status, "Ready"))
    assert "kubedgx-no-such-bucket" in mount_health(emulator).message

    emulator.create(JOBS, job_using(("data", "/data")))
    job = await wait_phase(emulator, "Failed")
    assert condition(job, "Failed")["reason"] == "DataMountFailed"
    assert job_health(emulator) == Health("Degraded", f"DGXDataMount data failed: {message_of(status, 'Ready')}")


async def test_an_output_mount_is_healthy_once_writable(emulator: Emulator, run_operator: RunOperator, s3: S3) -> None:
    await start_operator(emulator, run_operator)
    bucket, _ = await out_mount_ready(emulator, s3)
    assert mount_health(emulator, "ckpt") == Health("Healthy", f"s3://{bucket}/prefix is writable")


async def test_a_success_whose_archive_failed_is_healthy_and_says_so(
    emulator: Emulator, run_operator: RunOperator, s3: S3
) -> None:
    """The training succeeded (Healthy: a sync wave waiting on it may go on), but the final model the job was asked
    to archive is not in the bucket: the message says so rather than hide it."""
    await start_operator(emulator, run_operator)
    status, error = await succeed_with_a_failed_archive(emulator, s3)
    assert condition(status, "Archived")["reason"] == "ArchiveFailed"
    assert job_health(emulator) == Health(
        "Healthy",
        f"{worker(0)} exited 0: training completed; the final model was not archived to ckpt: "
        f"{worker(0)}/checkpoints-0: {error['message']}",
    )


# --------------------------------------------------------------------------------------------
# No drift: the operator writes status and finalizers, never a spec
# --------------------------------------------------------------------------------------------


def operator_writes(emulator: Emulator) -> list[tuple[str, str, str | None, Any]]:
    """(method, plural, subresource, body) of every write request to a DGXTrainingJob or DGXDataMount.

    The test's own changes go through the emulator's direct helpers, not HTTP: every request is the operator's.
    """
    out = []
    for request in emulator:
        route = parse_route(request.url.path)
        if route is None or route.plural not in (JOBS, MOUNTS) or request.method.value in ("GET", "HEAD"):
            continue
        out.append((request.method.value, route.plural, route.subresource, request.data))
    return out


def spec_of(emulator: Emulator, plural: str, name: str) -> tuple[Body, int]:
    stored = emulator.get(plural, NS, name)
    assert stored is not None
    return stored["spec"], stored["metadata"]["generation"]


async def test_the_operator_never_writes_a_spec(emulator: Emulator, run_operator: RunOperator, s3: S3) -> None:
    """A manifest applied from Git stays exactly as applied: the stored spec is the manifest's (defaults are the
    operator's business, never written back), and across a lifecycle with data, a restart, a suspension, success
    and deletion, the operator patches only /status and metadata.finalizers. So Argo CD re-applying an unchanged
    manifest finds nothing to change."""
    op = await start_operator(emulator, run_operator)
    bucket = s3.bucket(objects=FILES)
    emulator.create("secrets", secret(SECRET))
    mount = mount_of(s3, bucket)
    emulator.create(MOUNTS, mount)
    job = job_using(("data", "/data"), **{"spec.restartPolicy": "OnFailure", "spec.backoffLimit": 2})
    emulator.create(JOBS, job)

    await wait_mount(emulator, "Ready")
    await expect_pods(emulator, {worker(0): "0"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")
    exit_pod(emulator, worker(0), 1, message="NCCL error: unhandled system error")  # a counted restart
    await expect_pods(emulator, {worker(0): "1"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running", lambda s: s.get("restarts") == 1)
    assert spec_of(emulator, JOBS, JOB) == (job["spec"], 1)
    assert spec_of(emulator, MOUNTS, "data") == (mount["spec"], 1)

    emulator.patch(JOBS, NS, JOB, {"spec": {"suspend": True}})
    await wait_phase(emulator, "Suspended")
    await expect_pods(emulator, {})
    emulator.patch(JOBS, NS, JOB, {"spec": {"suspend": False}})
    await expect_pods(emulator, {worker(0): "1"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running", lambda s: s.get("observedGeneration") == 3)
    exit_pod(emulator, worker(0), 0)
    await wait_phase(emulator, "Succeeded")
    await op.settle()
    # Only the test's two edits moved the generation; the spec is the manifest's, suspend as last set.
    assert spec_of(emulator, JOBS, JOB) == ({**job["spec"], "suspend": False}, 3)
    assert spec_of(emulator, MOUNTS, "data") == (mount["spec"], 1)
    assert get_job(emulator)["metadata"]["finalizers"] == [FINALIZER]

    emulator.delete(JOBS, NS, JOB)
    emulator.delete(MOUNTS, NS, "data")
    await emulator.wait_for_absence(JOBS, NS, JOB)
    await emulator.wait_for_absence(MOUNTS, NS, "data")

    writes = operator_writes(emulator)
    kinds = {(method, plural, sub) for method, plural, sub, _ in writes}
    # Status writes and finalizer patches of both kinds happened (the check below is not vacuous) ...
    assert kinds == {
        ("PATCH", JOBS, "status"),
        ("PATCH", JOBS, None),
        ("PATCH", MOUNTS, "status"),
        ("PATCH", MOUNTS, None),
    }, kinds
    # ... and nothing else: no PUT, no create, no delete of a job or mount, no spec in any body.
    for method, plural, sub, body in writes:
        where = f"{method} {plural}{'/' + sub if sub else ''}: {body}"
        assert isinstance(body, dict), where
        assert "spec" not in body, where
        if sub == "status":
            assert set(body) <= {"apiVersion", "kind", "metadata", "status"}, where
            assert set(body.get("metadata") or {}) <= {"resourceVersion"}, where
        else:
            assert set(body) == {"metadata"}, where
            assert set(body["metadata"]) <= {"finalizers", "resourceVersion"}, where
            assert "finalizers" in body["metadata"], where
