"""DGXDataMount end to end: the real operator lists a real S3 API (moto's server on loopback, see
tests/s3.py) with the credentials of the Secret the mount names, and jobs wait for, fail with, use
and archive to their mounts. The test plays the kubelet for the pods, including what the data sync
containers report when they end.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dgx_datasync import StoreOptions, list_source, parse_uri
from tests.integration.conftest import RunOperator
from tests.integration.emulator import Emulator
from tests.integration.mount_scenarios import (
    FILES,
    OUT_JOB,
    SECRET,
    end_with_sync_report,
    expect_mount_events,
    init_containers,
    job_using,
    mount_events,
    mount_of,
    out_mount_ready,
    succeed_with_a_failed_archive,
    wait_mount,
)
from tests.integration.scenarios import (
    JOBS,
    MOUNTS,
    NS,
    condition,
    conditions,
    expect_events,
    expect_pods,
    final_pods,
    get_job,
    run_pod,
    start_operator,
    wait_phase,
    worker,
)
from tests.s3 import ACCESS_KEY, S3, SECRET_KEY, secret

pytestmark = pytest.mark.asyncio


# --------------------------------------------------------------------------------------------
# The mount's own lifecycle
# --------------------------------------------------------------------------------------------


async def test_an_input_mount_is_listed_and_its_job_pulls_with_the_digest(
    emulator: Emulator, run_operator: RunOperator, s3: S3
) -> None:
    await start_operator(emulator, run_operator)
    bucket = s3.bucket(objects=FILES)
    emulator.create("secrets", secret(SECRET))
    emulator.create(MOUNTS, mount_of(s3, bucket, **{"spec.exclude": ["*.md"]}))
    status = await wait_mount(emulator, "Ready")

    expected = list_source(
        parse_uri(f"s3://{bucket}/prefix"),
        StoreOptions(
            endpoint_url=s3.endpoint, env={"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        ),
        exclude=["*.md"],
    )
    assert [o.key for o in expected.objects] == ["train/a.jsonl", "train/b.jsonl"]
    assert status["objects"] == 2
    assert status["totalBytes"] == len(FILES["prefix/train/a.jsonl"]) + len(FILES["prefix/train/b.jsonl"])
    assert status["manifestDigest"] == expected.digest
    assert status["observedGeneration"] == 1
    ready = condition(status, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Listed")
    assert ready["message"] == f"2 objects, {status['totalBytes']} B at s3://{bucket}/prefix"
    stored = emulator.get(MOUNTS, NS, "data")
    assert stored is not None
    assert "kubedgx.io/data-mount-in-use" in stored["metadata"]["finalizers"]
    await expect_mount_events(emulator, [("Normal", "Ready")])

    emulator.create(JOBS, job_using(("data", "/data"), **{"spec.dataCache": "preload"}))
    await expect_pods(emulator, {worker(0): "0"})
    pull = init_containers(emulator, worker(0))["data-in-0"]
    assert pull["command"] == ["python", "-m", "dgx_datasync"]
    assert pull["args"][:3] == ["pull", f"s3://{bucket}/prefix", "/data"]
    assert pull["args"][pull["args"].index("--expect-digest") + 1] == expected.digest
    assert "--reuse" in pull["args"]
    assert pull["args"][pull["args"].index("--exclude") + 1] == "*.md"
    assert pull["args"][pull["args"].index("--endpoint-url") + 1] == s3.endpoint
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in pull["env"] if "valueFrom" in e}
    assert refs["AWS_ACCESS_KEY_ID"] == {"name": SECRET, "key": "AWS_ACCESS_KEY_ID"}
    assert refs["AWS_SESSION_TOKEN"] == {"name": SECRET, "key": "AWS_SESSION_TOKEN", "optional": True}
    status = await wait_phase(emulator, "Pending")
    assert conditions(status)["DataReady"] == ("True", "DataReady")
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")


async def test_a_job_waits_while_its_mount_cannot_be_listed_yet(
    emulator: Emulator, run_operator: RunOperator, s3: S3
) -> None:
    """The Secret is applied after the mount (kubectl apply -f dir/ in any order): the mount stays Syncing,
    retried with backoff, and the job waits in WaitingForData until the listing succeeds."""
    op = await start_operator(emulator, run_operator)
    bucket = s3.bucket(objects=FILES)
    emulator.create(MOUNTS, mount_of(s3, bucket))
    emulator.create(JOBS, job_using(("data", "/data")))
    status = await wait_mount(emulator, "Syncing")
    await emulator.wait_for_object(
        MOUNTS, NS, "data", lambda m: condition(m.get("status") or {}, "Ready")["reason"] == "CredentialsMissing"
    )
    job = await wait_phase(
        emulator, "WaitingForData", lambda s: condition(s, "DataReady")["message"].endswith("(Syncing)")
    )
    assert conditions(job)["Running"] == ("False", "DataNotReady")
    await op.settle()
    assert emulator.select("pods", NS) == []

    emulator.create("secrets", secret(SECRET))
    status = await wait_mount(emulator, "Ready")
    assert status["objects"] == 3
    await expect_pods(emulator, {worker(0): "0"})
    await wait_phase(emulator, "Pending")


async def test_a_missing_bucket_fails_the_mount_and_its_job(
    emulator: Emulator, run_operator: RunOperator, s3: S3
) -> None:
    op = await start_operator(emulator, run_operator)
    emulator.create("secrets", secret(SECRET))
    emulator.create(MOUNTS, mount_of(s3, "kubedgx-no-such-bucket"))
    status = await wait_mount(emulator, "Failed")
    failed = condition(status, "Ready")
    assert failed["reason"] == "BucketNotFound"
    assert "kubedgx-no-such-bucket" in failed["message"]
    assert "\n" not in failed["message"]
    assert status["observedGeneration"] == 1
    await expect_mount_events(emulator, [("Warning", "BucketNotFound")])

    emulator.create(JOBS, job_using(("data", "/data")))
    job = await wait_phase(emulator, "Failed")
    assert condition(job, "Failed")["reason"] == "DataMountFailed"
    assert condition(job, "Failed")["message"] == f"DGXDataMount data failed: {failed['message']}"
    await final_pods(op, {})
    await expect_events(emulator, [("Warning", "DataMountFailed")])


async def test_a_changed_spec_is_listed_again(emulator: Emulator, run_operator: RunOperator, s3: S3) -> None:
    await start_operator(emulator, run_operator)
    bucket = s3.bucket(objects=FILES)
    emulator.create("secrets", secret(SECRET))
    emulator.create(MOUNTS, mount_of(s3, bucket))
    first = await wait_mount(emulator, "Ready")
    assert first["objects"] == 3
    emulator.patch(MOUNTS, NS, "data", {"spec": {"include": ["train/*"]}})
    second = (
        await emulator.wait_for_object(
            MOUNTS, NS, "data", lambda m: (m.get("status") or {}).get("observedGeneration") == 2
        )
    )["status"]
    assert second["phase"] == "Ready"
    assert second["objects"] == 2
    assert second["manifestDigest"] != first["manifestDigest"]


async def test_an_output_mount_is_checked_for_writing(emulator: Emulator, run_operator: RunOperator, s3: S3) -> None:
    await start_operator(emulator, run_operator)
    bucket, status = await out_mount_ready(emulator, s3)
    assert condition(status, "Ready")["reason"] == "Writable"
    assert "objects" not in status
    assert not [k for k in s3.keys(bucket) if not k.startswith("prefix/.kubedgx/")], "the check left objects"


# --------------------------------------------------------------------------------------------
# Jobs and their mounts
# --------------------------------------------------------------------------------------------


def artifact_report(bucket: str, run: str) -> dict[str, Any]:
    base = f"s3://{bucket}/prefix/final/{run}"
    return {
        "checkpoints": [4, 8],
        "artifacts": [
            {"name": "adapter", "uri": f"{base}/adapter/"},
            {"name": "summary", "uri": f"{base}/summary.json"},
        ],
    }


async def test_artifacts_are_listed_when_the_job_succeeds(
    emulator: Emulator, run_operator: RunOperator, s3: S3
) -> None:
    op = await start_operator(emulator, run_operator)
    bucket, _ = await out_mount_ready(emulator, s3)
    emulator.create(JOBS, job_using(("ckpt", "/out"), **OUT_JOB))
    await expect_pods(emulator, {worker(0): "0"})
    pod = emulator.get("pods", NS, worker(0))
    assert pod is not None
    uid = get_job(emulator)["metadata"]["uid"]
    run = f"job-{uid.replace('-', '')[:8]}"
    containers = init_containers(emulator, worker(0))
    assert list(containers) == ["prepare-cache", "restore-0", "checkpoints-0"]
    checkpoints = f"s3://{bucket}/prefix/{run}/checkpoints"
    assert containers["restore-0"]["args"][:3] == ["restore", checkpoints, "/out/run"]
    sidecar = containers["checkpoints-0"]
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["args"][:3] == ["watch", "/out/run", checkpoints]
    assert sidecar["args"][sidecar["args"].index("--archive") + 1] == f"s3://{bucket}/prefix/final/{run}"
    assert sidecar["args"][sidecar["args"].index("--logs") + 1] == f"s3://{bucket}/prefix/{run}/logs"
    assert pod["spec"]["terminationGracePeriodSeconds"] == 900
    assert {v["name"]: v for v in pod["spec"]["volumes"]}["data-0"]["hostPath"]["path"].endswith(f"/ml/ckpt/{run}")

    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")
    report = artifact_report(bucket, run)
    end_with_sync_report(emulator, worker(0), trainer_exit=0, init=[("restore-0", 0, {"restored": None}),
                                                                      ("checkpoints-0", 0, report)])  # fmt: skip
    status = await wait_phase(emulator, "Succeeded")
    assert status["artifacts"] == [
        {"name": "adapter", "uri": report["artifacts"][0]["uri"], "mount": "ckpt"},
        {"name": "summary", "uri": report["artifacts"][1]["uri"], "mount": "ckpt"},
    ]
    archived = condition(status, "Archived")
    assert (archived["status"], archived["reason"]) == ("True", "Archived")
    assert archived["message"] == "2 artifact(s) archived to ckpt"
    await final_pods(op, {worker(0): "0"})
    await expect_events(
        emulator,
        [
            ("Normal", "WorkersPending"),
            ("Normal", "AllWorkersRunning"),
            ("Normal", "Completed"),
            ("Normal", "Archived"),
        ],
    )


async def test_a_failed_archive_is_reported_not_hidden(emulator: Emulator, run_operator: RunOperator, s3: S3) -> None:
    await start_operator(emulator, run_operator)
    status, error = await succeed_with_a_failed_archive(emulator, s3)  # the training itself succeeded
    assert status.get("artifacts", []) == []
    archived = condition(status, "Archived")
    assert (archived["status"], archived["reason"]) == ("False", "ArchiveFailed")
    assert archived["message"] == (
        f"the final model was not archived to ckpt: {worker(0)}/checkpoints-0: {error['message']}"
    )


async def test_a_failed_pull_fails_the_job_naming_the_data_sync(
    emulator: Emulator, run_operator: RunOperator, s3: S3
) -> None:
    """Exit 2 of the pull (bad credentials at pull time) is permanent under the ExitCode policy, and the
    failure is the program's, not a disruption: the trainer never started."""
    op = await start_operator(emulator, run_operator)
    bucket = s3.bucket(objects=FILES)
    emulator.create("secrets", secret(SECRET))
    emulator.create(MOUNTS, mount_of(s3, bucket))
    await wait_mount(emulator, "Ready")
    emulator.create(JOBS, job_using(("data", "/data"), **{"spec.restartPolicy": "ExitCode"}))
    await expect_pods(emulator, {worker(0): "0"})
    message = f"the access key was refused by s3://{bucket}/prefix: fix Secret {SECRET}"
    end_with_sync_report(
        emulator,
        worker(0),
        trainer_exit=None,
        init=[("data-in-0", 2, {"error": "CredentialsInvalid", "message": message})],
    )
    status = await wait_phase(emulator, "Failed")
    failed = condition(status, "Failed")
    assert failed["reason"] == "WorkerFailed"
    assert f"{worker(0)}: data sync data-in-0 exited with code 2: {message}" in failed["message"]
    assert status["restarts"] == 0
    await final_pods(op, {worker(0): "0"})


async def test_deleting_a_mount_in_use_waits_for_the_job_to_end(
    emulator: Emulator, run_operator: RunOperator, s3: S3
) -> None:
    await start_operator(emulator, run_operator)
    bucket = s3.bucket(objects=FILES)
    emulator.create("secrets", secret(SECRET))
    emulator.create(MOUNTS, mount_of(s3, bucket))
    await wait_mount(emulator, "Ready")
    emulator.create(JOBS, job_using(("data", "/data")))
    await expect_pods(emulator, {worker(0): "0"})
    run_pod(emulator, worker(0))
    await wait_phase(emulator, "Running")

    emulator.delete(MOUNTS, NS, "data")
    await emulator.wait_for(
        lambda: ("Warning", "InUse") in [(t, r) for t, r, _ in mount_events(emulator)],
        message=lambda: f"an InUse event; now {mount_events(emulator)}",
    )
    stored = emulator.get(MOUNTS, NS, "data")
    assert stored is not None
    assert stored["metadata"].get("deletionTimestamp")
    in_use = next(m for t, r, m in mount_events(emulator) if r == "InUse")
    assert in_use == "deletion waits until DGXTrainingJob job ended (delete the job to free it now)"

    end_with_sync_report(emulator, worker(0), trainer_exit=0, init=[])
    await wait_phase(emulator, "Succeeded")
    await emulator.wait_for_absence(MOUNTS, NS, "data")


async def test_a_stored_mount_the_model_refuses_is_reported_not_retried_for_ever(
    emulator: Emulator, run_operator: RunOperator, s3: S3
) -> None:
    """A mount stored under an older, looser CRD (a negative PVC size, accepted before issue 12 made
    quantities non-negative) no longer parses. Before, both controllers raised on it at every pass:
    the mount's reconcile failed over and over and every job using it never got a status. Now the
    mount gets one InvalidSpec warning, its jobs wait naming the field, and a fixed spec goes on."""
    op = await start_operator(emulator, run_operator)
    emulator.create("secrets", secret(SECRET))
    bucket = s3.bucket(objects=FILES)
    emulator.create(MOUNTS, mount_of(s3, bucket, **{"spec.cache": {"type": "pvc", "size": "1Gi"}}))
    await wait_mount(emulator, "Ready")
    # What the older apiserver stored, written past today's schema (the emulator's own commit).
    old = emulator.get(MOUNTS, NS, "data")
    assert old is not None
    stale = copy.deepcopy(old)
    stale["spec"]["cache"]["size"] = "-1Gi"
    stale["metadata"]["generation"] = old["metadata"]["generation"] + 1
    emulator._commit(emulator.kind(MOUNTS), "MODIFIED", stale, old)

    def invalid() -> list[str]:
        return [m for _, r, m in mount_events(emulator) if r == "InvalidSpec"]

    await emulator.wait_for(lambda: bool(invalid()), message=lambda: f"an InvalidSpec event; {mount_events(emulator)}")
    assert invalid()[0].startswith("its stored spec no longer parses (spec.cache.size")
    assert invalid()[0].endswith("re-apply the DGXDataMount with a valid spec")

    emulator.create(JOBS, job_using(("data", "/data")))
    job = await wait_phase(
        emulator, "WaitingForData", lambda s: "stored spec no longer parses" in condition(s, "DataReady")["message"]
    )
    assert condition(job, "DataReady")["message"].startswith("waiting for DGXDataMount data (its stored spec")
    await op.settle()
    assert len(invalid()) == 1  # one warning, not one per pass
    assert emulator.select("pods", NS) == []

    emulator.patch(MOUNTS, NS, "data", {"spec": {"cache": {"size": "2Gi"}}})
    await wait_mount(emulator, "Ready")
    await expect_pods(emulator, {worker(0): "0"})
