"""The connector's calls without a cluster: what it answers is decided here, the cluster's part (reading,
annotating, deleting the job; reading error.pb) is replaced by recorders. The same calls against the real
control plane: tests/cluster/test_flyte_connector.py and test_flyte_grpc.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from flyteidl.core.errors_pb2 import ContainerError
from flyteidl.core.execution_pb2 import TaskExecution
from flytekit import task
from flytekit.extend.backend.utils import is_terminal_phase

from flytekitplugins.dgx import DGXConfig, DGXConfigError
from flytekitplugins.dgx import connector as module
from flytekitplugins.dgx.connector import DGXConnector, DGXJobMetadata, TaskError
from flytekitplugins.dgx.manifest import build
from flytekitplugins.dgx.phases import RAN_ANNOTATION
from tests.flyte.flyte import metadata, template

PREFIX = "s3://flyte-bucket/metadata/run/n0/data/0"


@task(task_config=DGXConfig(instance="not-an-instance"))
def misplaced() -> int:
    return 1


def job(phase: str, *conditions: tuple[str, str, str, str], annotated: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ml", "name": "flyte-x", "uid": "u1"}
    if annotated:
        meta["annotations"] = {RAN_ANNOTATION: "2026-05-01T10:00:00Z"}
    status = {"phase": phase, "conditions": [{"type": t, "status": s, "reason": r, "message": m}
                                             for t, s, r, m in conditions]}  # fmt: skip
    return {"metadata": meta, "status": status}


class Cluster:
    """What the connector's calls did to the cluster, and what it reads from it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.job: dict[str, Any] | None = None
        self.error: TaskError | None = None
        self.calls: list[str] = []

        async def read_job(meta: DGXJobMetadata) -> dict[str, Any] | None:
            self.calls.append(f"read {meta.name}")
            return self.job

        async def mark_ran(meta: DGXJobMetadata) -> None:
            self.calls.append(f"mark {meta.name}")

        async def refuse(*args: Any, **kwargs: Any) -> Any:
            self.calls.append("cluster")
            raise AssertionError("the cluster was asked")

        def task_error(prefix: str) -> TaskError | None:
            self.calls.append(f"error.pb {prefix}")
            return self.error

        monkeypatch.setattr(module, "read_job", read_job)
        monkeypatch.setattr(module, "mark_ran", mark_ran)
        monkeypatch.setattr(module, "apply_plan", refuse)
        monkeypatch.setattr(module, "delete_job", refuse)
        monkeypatch.setattr(module, "read_log", refuse)
        monkeypatch.setattr(module, "task_error", task_error)


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    monkeypatch.delenv("KUBEDGX_FLYTE_LOG_TEMPLATE", raising=False)
    return Cluster(monkeypatch)


META = DGXJobMetadata("ml", "flyte-x", "u1", output_prefix=PREFIX)


def get(meta: DGXJobMetadata = META) -> Any:
    return asyncio.run(DGXConnector().get(resource_meta=meta))


# -- a refused config --------------------------------------------------------------------------


def test_under_flyte_s_backend_a_refused_config_is_answered_and_gettask_fails_it_for_good(cluster: Cluster) -> None:
    """Propeller retries a CreateTask that errs (a retryable failure) though no retry can pass: the refusal is
    answered instead, and GetTask reports it as FAILED, a permanent failure, with kubedgx validate's lines."""
    tt = template(misplaced, PREFIX)
    with pytest.raises(DGXConfigError) as local:
        build(tt, PREFIX, metadata())
    (line,) = local.value.lines
    connector = DGXConnector()
    meta = asyncio.run(connector.create(task_template=tt, output_prefix=PREFIX, task_execution_metadata=metadata()))
    assert isinstance(meta, DGXJobMetadata)
    assert meta.refused == str(local.value)
    assert line in meta.refused
    resource = get(DGXJobMetadata.decode(meta.encode()))  # as propeller hands it back
    assert (TaskExecution.Phase.Name(resource.phase), resource.message) == ("FAILED", str(local.value))
    sent = asyncio.run(resource.to_flyte_idl())
    assert (sent.phase, sent.message) == (TaskExecution.FAILED, str(local.value))
    asyncio.run(DGXConnector().delete(resource_meta=meta))  # an abort of it: nothing to delete
    logs = asyncio.run(DGXConnector().get_logs(resource_meta=meta))
    assert list(logs.body.results) == [
        "no log: no job was made, kubedgx refused the task's config (the task's error has its lines)"
    ]
    assert cluster.calls == [], "nothing may reach the cluster"


def test_a_local_run_s_refused_config_still_raises(cluster: Cluster) -> None:
    """pyflyte run (no execution metadata) fails at once, before anything is made."""
    with pytest.raises(DGXConfigError, match="not-an-instance"):
        asyncio.run(DGXConnector().create(task_template=template(misplaced, PREFIX), output_prefix=PREFIX))
    assert cluster.calls == []


def test_the_metadata_carries_refused_only_when_there_is_a_refusal() -> None:
    """A connector of the version before reads every metadata it was not refused in (it has no such field)."""
    assert "refused" not in json.loads(META.encode())
    assert DGXJobMetadata.decode(META.encode()) == META
    refused = DGXJobMetadata("", "", refused="task 't' cannot run on kubedgx:\n  spec.instance: ...")
    assert DGXJobMetadata.decode(refused.encode()) == refused
    older = json.dumps({"namespace": "ml", "name": "flyte-x", "uid": "u1", "task_type": "dgx_training"}).encode()
    assert DGXJobMetadata.decode(older) == DGXJobMetadata("ml", "flyte-x", "u1")


# -- failures: retryable or not ----------------------------------------------------------------

WORKER_FAILED = ("Failed", "True", "WorkerFailed", "flyte-x-worker-0 exited with code 1; restartPolicy is Never")
INVALID_SPEC = ("Failed", "True", "InvalidSpec", "spec.instance: no such instance")


@pytest.mark.parametrize(
    ("condition", "error", "phase", "message"),
    [
        (WORKER_FAILED, None, "RETRYABLE_FAILED", WORKER_FAILED[2] + ": " + WORKER_FAILED[3]),
        (
            WORKER_FAILED,
            TaskError("the task raised: ValueError: no square for -1", ContainerError.NON_RECOVERABLE),
            "FAILED",
            f"{WORKER_FAILED[2]}: {WORKER_FAILED[3]}; the task raised: ValueError: no square for -1",
        ),
        (
            INVALID_SPEC,
            TaskError("the task raised: FlyteRecoverableException: again", ContainerError.RECOVERABLE),
            "RETRYABLE_FAILED",
            f"{INVALID_SPEC[2]}: {INVALID_SPEC[3]}; the task raised: FlyteRecoverableException: again",
        ),
        (
            WORKER_FAILED,
            TaskError("error.pb at s3://b/error.pb could not be read (NoCredentialsError: ...): give ...", None),
            "RETRYABLE_FAILED",
            f"{WORKER_FAILED[2]}: {WORKER_FAILED[3]}; error.pb at s3://b/error.pb could not be read",
        ),
        (INVALID_SPEC, None, "FAILED", f"{INVALID_SPEC[2]}: {INVALID_SPEC[3]}"),
    ],
    ids=["no-error-pb", "plain-exception", "recoverable", "unreadable", "spec"],
)
def test_a_failed_job_is_failed_or_retryable_by_error_pb_then_by_its_reason(
    cluster: Cluster, condition: tuple[str, str, str, str], error: TaskError | None, phase: str, message: str
) -> None:
    cluster.job = job("Failed", condition)
    cluster.error = error
    resource = get()
    assert TaskExecution.Phase.Name(resource.phase) == phase
    assert resource.message.startswith(message), resource.message
    assert cluster.calls == ["read flyte-x", f"error.pb {PREFIX}"]
    assert asyncio.run(resource.to_flyte_idl()).phase == resource.phase


def test_flytekit_s_local_loop_ends_on_retryable_failed_as_on_failed() -> None:
    """pyflyte run's AsyncConnectorExecutorMixin polls get() until is_terminal_phase, then raises on anything but
    SUCCEEDED: a RETRYABLE_FAILED job ends a local run as FAILED does (tests/cluster/test_flyte_run.py runs it)."""
    assert is_terminal_phase(TaskExecution.RETRYABLE_FAILED)
    assert is_terminal_phase(TaskExecution.FAILED)
    assert not is_terminal_phase(TaskExecution.RUNNING)


def test_a_job_that_is_gone_fails_for_good(cluster: Cluster) -> None:
    resource = get()
    assert (TaskExecution.Phase.Name(resource.phase), "gone" in resource.message) == ("FAILED", True)


# -- RUNNING, once reported, stays ---------------------------------------------------------------


def test_the_first_running_answer_marks_the_job_and_a_suspension_after_it_stays_running(cluster: Cluster) -> None:
    cluster.job = job("Running", ("Running", "True", "AllWorkersRunning", "1/1 workers running"))
    assert get().phase == TaskExecution.RUNNING
    assert cluster.calls == ["read flyte-x", "mark flyte-x"]
    suspended = ("Suspended", "True", "Suspended", "spec.suspend is true: workers deleted, the job is kept")
    cluster.job = job("Suspended", suspended, annotated=True)
    cluster.calls.clear()
    resource = get()
    assert (TaskExecution.Phase.Name(resource.phase), resource.message) == (
        "RUNNING",
        "suspended (spec.suspend): Suspended: spec.suspend is true: workers deleted, the job is kept",
    )
    assert cluster.calls == ["read flyte-x"], "marked once"
    cluster.job = job("Suspended", suspended)  # suspended before it was ever reported RUNNING
    assert get().phase == TaskExecution.WAITING_FOR_RESOURCES


# -- log links -----------------------------------------------------------------------------------


def test_the_job_s_link_is_shown_while_pending_and_the_workers_links_are_not(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flyte's admin keeps a link with ShowWhilePending through QUEUED and INITIALIZING: the job's link exists
    from the start; a worker's pod may not."""
    cluster.job = job("Pending")
    monkeypatch.setenv("KUBEDGX_FLYTE_LOG_TEMPLATE", "https://grafana.example/d/jobs?ns={namespace}&job={job}")
    sent = asyncio.run(get().to_flyte_idl())
    assert TaskExecution.Phase.Name(sent.phase) == "QUEUED"
    assert [(link.name, link.uri, link.ShowWhilePending) for link in sent.log_links] == [
        ("kubedgx job", "https://grafana.example/d/jobs?ns=ml&job=flyte-x", True)
    ]
    monkeypatch.setenv("KUBEDGX_FLYTE_LOG_TEMPLATE", "https://logs.example/{namespace}/{pod}")
    sent = asyncio.run(get().to_flyte_idl())
    assert [(link.name, link.uri, link.ShowWhilePending) for link in sent.log_links] == [
        ("worker 0", "https://logs.example/ml/flyte-x-worker-0", False)
    ]
