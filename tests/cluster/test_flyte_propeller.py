"""Flyte's real propeller runs workflows whose DGX tasks go through the kubedgx connector.

Propeller v1.16.8 (built from its Go modules) with docs/flyte.md's configuration block, the
connector as ``pyflyte serve connector``, the operator, moto as Flyte's blob store and a fake of
admin's event API that stores events by admin's rules (tests/cluster/flyte_propeller.py). Each test
submits a FlyteWorkflow compiled by propeller's own compiler from flytekit's serialization, lets
propeller run it, and checks what Flyte would store (the fake's view) and what the cluster did.

The stand-in kubelet (tests/cluster/flyte_kubelet.py) runs the DGX workers' ``pyflyte-execute`` and
propeller's own pods as local processes.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grpc", reason="flytekit[connector] is not installed")
pytest.importorskip("grpc_health.v1.health_pb2_grpc", reason="flytekit[connector] is not installed")
pytest.importorskip("flytekitplugins.dgx", reason="flytekitplugins-dgx is not installed (pip install -e ./flyte)")

from flyteidl.core import literals_pb2
from flyteidl.core.execution_pb2 import TaskExecution

from tests.cluster.flyte_kubelet import Kubelet
from tests.cluster.flyte_propeller import FLYTEWORKFLOWS, FlyteBackend, strip_finalizers
from tests.cluster.flyte_propeller import workflow_phase as phase_of
from tests.cluster.flyte_workflows import submit
from tests.conftest import EXAMPLES
from tests.e2e.kubectl import JOBS, Kubectl, dig, wait_for
from tests.flyte.flyte import workflows as examples

CODE = Path(__file__).parent / "flyte_code"
if str(CODE) not in sys.path:
    sys.path.insert(0, str(CODE))
import propeller_workflows as pw  # noqa: E402

#: How long a whole workflow may take here (propeller's rounds, GetTask every 10 s, pods' start-up).
RUN_TIMEOUT = 240


@pytest.fixture
def ns(namespace: Kubectl, flyte: FlyteBackend) -> Iterator[Kubectl]:
    """The test's namespace; its workflows are released if propeller could not (a failed test)."""
    yield namespace
    strip_finalizers(namespace)


def execution_id() -> str:
    """A Flyte execution name: 20 characters at most, a letter first."""
    return "f" + secrets.token_hex(9)


def kubelet(ns: Kubectl, flyte: FlyteBackend, tmp_path: Path, **kwargs: Any) -> Kubelet:
    # The workflows' modules, then what this process imports from (a checkout on PYTHONPATH, say).
    path = os.pathsep.join(filter(None, [str(CODE), str(EXAMPLES / "flyte"), os.environ.get("PYTHONPATH", "")]))
    # One process per pod: the function runs in pyflyte-execute itself. The multi-process path (torch
    # elastic in the pod) is test_flyte_run.py's and test_in_pod.py's; here it would only double each
    # pod's CPU.
    env = flyte.blob_env() | {"PYTHONPATH": path, pw.MARKS: str(tmp_path), "PET_NPROC_PER_NODE": "1"}
    return Kubelet(ns, CODE, tmp_path, propeller=True, env=env, **kwargs)


def wait_phase(ns: Kubectl, flyte: FlyteBackend, name: str, *phases: str, timeout: float = RUN_TIMEOUT) -> str:
    """Wait for the FlyteWorkflow to reach one of ``phases``; returns it."""
    seen: list[str | None] = [None]

    def reached() -> bool:
        flyte.propeller.check_alive()
        seen[0] = phase_of(ns, name)
        return seen[0] in phases

    wait_for(f"workflow {name} to reach {phases}", reached, timeout=timeout, interval=1,
             diagnose=lambda: f"phase {seen[0]}\n{flyte.diagnose()}")  # fmt: skip
    assert seen[0] is not None
    return seen[0]


def jobs_of(ns: Kubectl, execution: str) -> list[dict[str, Any]]:
    return [j for j in ns.select(JOBS) if dig(j, "metadata", "labels", "execution-id") == execution]


def sent_phases(flyte: FlyteBackend, execution: str, node: str, retry_attempt: int = 0) -> list[str]:
    """The task events propeller sent for ``node`` of ``execution`` (accepted or not), as phase names, in order."""
    events = flyte.admin.received_task_events()
    return [TaskExecution.Phase.Name(e.phase) for e in events
            if e.parent_node_execution_id.node_id == node and e.retry_attempt == retry_attempt
            and e.parent_node_execution_id.execution_id.name == execution]  # fmt: skip


def stored_phase_is(flyte: FlyteBackend, execution: str, node: str, phase: str) -> Any:
    """Wait until the stored task execution of ``node`` (attempt 0) is in ``phase``; returns it."""

    def reached(a: Any) -> Any:
        task = a.stored_task(node, execution=execution)
        return task if task.phase == phase else None

    return flyte.admin.wait(reached, timeout=RUN_TIMEOUT, what=f"{execution} {node}'s stored task phase {phase}")


def literal_at(flyte: FlyteBackend, uri: str) -> literals_pb2.LiteralMap:
    bucket, key = uri.removeprefix("s3://").split("/", 1)
    body = flyte.s3.client.get_object(Bucket=bucket, Key=key)["Body"].read()
    return literals_pb2.LiteralMap.FromString(body)


# -- S1 -------------------------------------------------------------------------------------------


def test_a_workflow_runs_the_dgx_task_and_hands_its_output_to_the_next_task(
    flyte: FlyteBackend, ns: Kubectl, tmp_path: Path
) -> None:
    ex = execution_id()
    with kubelet(ns, flyte, tmp_path) as k:
        submit(flyte.kubectl_flyte, ns, tmp_path, examples().wf, ex, n=4)
        assert wait_phase(ns, flyte, ex, "Success", "Failed") == "Success", flyte.diagnose() + k.logs_text()
    assert not k.errors, k.errors
    (job,) = jobs_of(ns, ex)
    assert dig(job, "status", "phase") == "Succeeded"
    assert dig(job, "spec", "command", 0) == "pyflyte-execute"
    assert dig(job, "metadata", "labels", "node-id") == "n0"  # the execution's labels, for kubectl -l
    square = flyte.admin.stored_task("n0", execution=ex)
    assert square.phase == "SUCCEEDED", flyte.admin.dump()
    assert square.custom_info["job"] == f"{ns.namespace}/{job['metadata']['name']}"
    # plus_one ran as propeller's own pod and read square's output from the blob store: 4*4 + 1.
    plus_one = flyte.admin.stored_node("n1", execution=ex)
    assert plus_one.output_uri, flyte.admin.dump()
    assert literal_at(flyte, plus_one.output_uri).literals["o0"].scalar.primitive.integer == 17
    # QUEUED's reasons are propeller's own; the connector's "pending: ..." never reaches Flyte.
    assert square.reasons == ["Allocation token required", "launched"], flyte.admin.dump()
    # The deck: written by the connector before it answered SUCCEEDED, stored on the node.
    deck = flyte.admin.stored_node("n0", execution=ex).deck_uri
    assert deck.endswith("/n0/data/0/deck.html"), flyte.admin.dump()
    page = flyte.s3.client.get_object(Bucket=flyte.bucket, Key=deck.removeprefix(f"s3://{flyte.bucket}/"))
    assert job["metadata"]["name"] in page["Body"].read().decode()
    # The connector ran as docs/flyte.md's ClusterRole allows: nothing it asked was refused.
    refused = [line for line in flyte.connector.tail(2000).splitlines() if "forbidden" in line.lower()]
    assert not refused, refused
    # What propeller sent for the DGX task, in order: no repeated phase, RUNNING once.
    phases = sent_phases(flyte, ex, "n0")
    assert phases[-1] == "SUCCEEDED", phases
    assert phases.count("RUNNING") <= 1, phases  # none when the job ended within one GetTask interval


# -- S2 -------------------------------------------------------------------------------------------


def test_a_failing_task_s_error_is_stored_with_the_job_s_reason_and_message(
    flyte: FlyteBackend, ns: Kubectl, tmp_path: Path
) -> None:
    """The function raises in the pod: the job fails (restartPolicy Never, WorkerFailed), and the
    stored task error carries the job's reason and message and the function's own exception (read
    from error.pb by the connector). A plain exception is not recoverable: Flyte does not retry."""
    ex = execution_id()
    with kubelet(ns, flyte, tmp_path) as k:
        submit(flyte.kubectl_flyte, ns, tmp_path, pw.fails, ex, n=-1)
        assert wait_phase(ns, flyte, ex, "Success", "Failed") == "Failed", k.logs_text()
    (job,) = jobs_of(ns, ex)
    assert dig(job, "status", "phase") == "Failed"
    stored = flyte.admin.stored_task("n0", execution=ex)
    assert stored.phase == "FAILED", flyte.admin.dump()
    assert stored.error is not None, flyte.admin.dump()
    message = stored.error.message
    assert message.startswith("failed to run the job: WorkerFailed: "), message  # propeller's prefix, then the job's
    assert job["metadata"]["name"] in message, message
    assert "the task raised: " in message, message
    assert "no square for -1" in message, message
    assert stored.error.kind == "USER", stored.error
    assert flyte.admin.stored_node("n0", execution=ex).deck_uri == "", "Flyte keeps no deck of a failed task"
    assert [r[2] for r in k.runs] == [1], k.runs  # one attempt: a permanent failure
    assert [
        t.retry_attempt for t in flyte.admin.stored_tasks() if t.node_id == "n0" and t.execution.endswith(f"/{ex}")
    ] == [0], "no second attempt"


# -- S3 -------------------------------------------------------------------------------------------


def test_a_flyte_retry_makes_a_job_of_its_own(flyte: FlyteBackend, ns: Kubectl, tmp_path: Path) -> None:
    """Attempt 0 raises FlyteRecoverableException: error.pb says RECOVERABLE, the connector reports a
    retryable failure, Flyte runs attempt 1 (retries=1) as a new task execution, and the connector
    makes it a new DGXTrainingJob, which succeeds."""
    ex = execution_id()
    with kubelet(ns, flyte, tmp_path) as k:
        submit(flyte.kubectl_flyte, ns, tmp_path, pw.retried, ex, n=1)
        assert wait_phase(ns, flyte, ex, "Success", "Failed") == "Success", k.logs_text()
    jobs = sorted(jobs_of(ns, ex), key=lambda j: j["metadata"]["creationTimestamp"])
    assert len(jobs) == 2, [j["metadata"]["name"] for j in jobs]
    assert [dig(j, "status", "phase") for j in jobs] == ["Failed", "Succeeded"]  # attempt 0's job kept, to look at
    keys = {dig(j, "metadata", "labels", "flyte.kubedgx.io/key") for j in jobs}
    assert len(keys) == 2, keys
    first, second = flyte.admin.stored_task("n0", 0, execution=ex), flyte.admin.stored_task("n0", 1, execution=ex)
    assert first.phase == "FAILED", flyte.admin.dump()
    assert second.phase == "SUCCEEDED", flyte.admin.dump()
    assert first.error is not None, flyte.admin.dump()
    assert "attempt 0 of flaky(1) gives up" in first.error.message, first.error
    assert [r[2] for r in k.runs] == [1, 0], k.runs


# -- S4 -------------------------------------------------------------------------------------------


def test_deleting_the_workflow_aborts_the_job(flyte: FlyteBackend, ns: Kubectl, tmp_path: Path) -> None:
    """A running DGX task's workflow is deleted: propeller aborts the node, the connector's
    DeleteTask deletes the job (its workers with it), Flyte stores ABORTED, and the workflow goes."""
    ex = execution_id()
    with kubelet(ns, flyte, tmp_path, hold=lambda pod: "idle" in str(pod["spec"])) as k:
        submit(flyte.kubectl_flyte, ns, tmp_path, pw.runs_forever, ex)
        stored_phase_is(flyte, ex, "n0", "RUNNING")
        (job,) = jobs_of(ns, ex)
        assert dig(job, "status", "phase") == "Running"
        # Reported RUNNING: the connector marked the job (docs/flyte.md's ClusterRole lets it patch jobs).
        assert dig(job, "metadata", "annotations", "flyte.kubedgx.io/reported-running"), job["metadata"]
        ns.run("delete", FLYTEWORKFLOWS, ex, "--wait=false")
        wait_for("the workflow to go", lambda: ns.get(FLYTEWORKFLOWS, ex) is None, timeout=120, interval=1,
                 diagnose=flyte.diagnose)  # fmt: skip
        wait_for("the job to go", lambda: not jobs_of(ns, ex), timeout=120, interval=1, diagnose=flyte.diagnose)
    assert k.runs == [], "the worker was held, never run"
    stored = flyte.admin.stored_task("n0", execution=ex)
    assert stored.phase == "ABORTED", flyte.admin.dump()
    node = flyte.admin.stored_node("n0", execution=ex)
    assert node.phase == "ABORTED", flyte.admin.dump()
    assert node.error is not None, flyte.admin.dump()
    assert (node.error.code, node.error.message) == ("NodeAborted", "Workflow aborted."), node.error
    assert flyte.admin.workflow_phases(ex)[-1] == "ABORTED", flyte.admin.dump()
    assert not [p for p in ns.select("pods") if "idle" in str(p["spec"])], "the workers went with the job"


# -- S5 (nodes) ------------------------------------------------------------------------------------


def test_a_job_waiting_for_nodes_is_waiting_for_resources_with_the_reason(
    flyte: FlyteBackend, ns: Kubectl, tmp_path: Path
) -> None:
    """16 nodes asked, a few exist: the scheduler's words reach Flyte as WAITING_FOR_RESOURCES."""
    ex = execution_id()
    submit(flyte.kubectl_flyte, ns, tmp_path, pw.waits_for_nodes, ex)
    stored = stored_phase_is(flyte, ex, "n0", "WAITING_FOR_RESOURCES")
    assert stored.reasons, flyte.admin.dump()
    assert stored.reasons[-1].startswith("waiting for nodes: Unschedulable: "), stored.reasons
    assert "nodes are available" in stored.reasons[-1], stored.reasons
    (job,) = jobs_of(ns, ex)
    assert dig(job, "status", "phase") == "Pending"
    ns.run("delete", FLYTEWORKFLOWS, ex, "--wait=false")
    wait_for("the job to go", lambda: not jobs_of(ns, ex), timeout=120, interval=1, diagnose=flyte.diagnose)


# -- S7 -------------------------------------------------------------------------------------------


def test_interruptible_lands_on_spot_capacity(flyte: FlyteBackend, ns: Kubectl, tmp_path: Path) -> None:
    """``@task(interruptible=True)``: propeller resolves it per attempt and passes it as the
    ``interruptible`` label; the connector picks the default instance's spot pool."""
    ex = execution_id()
    with kubelet(ns, flyte, tmp_path) as k:
        submit(flyte.kubectl_flyte, ns, tmp_path, pw.interruptible, ex)
        assert wait_phase(ns, flyte, ex, "Success", "Failed") == "Success", k.logs_text()
    (job,) = jobs_of(ns, ex)
    assert job["spec"]["instance"] == "dgxh100.80g.8.spot", job["spec"]
    assert dig(job, "metadata", "labels", "interruptible") == "true"
    pods = [p for p in ns.select("pods") if p["metadata"]["name"].startswith(job["metadata"]["name"])]
    nodes = {dig(p, "spec", "nodeName") for p in pods}
    assert nodes, pods
    assert all(n.startswith("dgxh100-80g-8-spot-") for n in nodes), nodes
    assert flyte.admin.stored_task("n0", execution=ex).instance_class == "INTERRUPTIBLE", flyte.admin.dump()


# -- S8: what does not reach Flyte while a job runs ----------------------------------------------------


def test_a_restart_sends_no_event_until_the_task_ends(flyte: FlyteBackend, ns: Kubectl, tmp_path: Path) -> None:
    """Propeller v1.16.8 sends no event while a connector task stays RUNNING (same phase, same
    version), so a restart reaches Flyte only in the final event's custom_info. If a later propeller
    forwards progress, this test fails and docs/flyte.md's "What Flyte sees" must be rewritten."""
    ex = execution_id()
    with kubelet(ns, flyte, tmp_path) as k:
        submit(flyte.kubectl_flyte, ns, tmp_path, pw.restarts, ex, n=21)
        stored_phase_is(flyte, ex, "n0", "RUNNING")
        (tmp_path / "fail-now").write_text("Flyte saw it running\n")  # the worker dies now
        assert wait_phase(ns, flyte, ex, "Success", "Failed") == "Success", k.logs_text()
    (job,) = jobs_of(ns, ex)
    assert dig(job, "status", "restarts") == 1, job.get("status")
    assert [r[2] for r in k.runs][:2] == [1, 0], k.runs
    phases = sent_phases(flyte, ex, "n0")
    running = phases.index("RUNNING")
    assert phases[running + 1 :] == ["SUCCEEDED"], phases  # nothing between RUNNING and the end
    assert flyte.admin.stored_task("n0", execution=ex).custom_info["restarts"] == 1, flyte.admin.dump()
