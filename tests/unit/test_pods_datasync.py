"""What the data sync containers' statuses mean for a worker (reconcile/pods.py): a failed pull or
restore is the pod's failure (never a disruption), a sidecar's exit never is; the sidecars' reports
and the artifacts in them; the slim copy the operator indexes keeps all of it."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest

from dgx_operator.reconcile.planner import MountState
from dgx_operator.reconcile.pods import PodView, artifacts_of, slim
from tests.unit.planner_sim import cond, sim_of
from tests.unit.render_helpers import one_pod

#: In mount "data" at /data (index 0), Out mount "ckpt" holding the trainer's output (index 1).
MOUNTS = {"data": {}, "ckpt": {"direction": "Out", "source": "s3://bucket/out"}}
REFS = {"spec.dataMounts": [{"name": "data", "mountPath": "/data"}, {"name": "ckpt", "mountPath": "/workspace/output"}]}
DENIED = {"error": "AccessDenied", "message": "access denied to s3://bucket/prefix: check the policy"}
MISSING = {"error": "NotFound", "message": "no checkpoint under s3://bucket/out/job-5f0c2a4e/checkpoints"}
FINAL = "s3://bucket/out/final/job-5f0c2a4e"
REPORT = {
    "checkpoints": [100, 200],
    "artifacts": [{"name": "adapter", "uri": f"{FINAL}/adapter/"}, {"name": "summary", "uri": f"{FINAL}/summary.json"}],
}
SUMMARY = json.dumps({"step": 200, "totalSteps": 200, "loss": 0.5})
SCHEDULED = {"type": "PodScheduled", "status": "True"}


def terminated(code: int, message: Any = None, reason: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "exitCode": code,
        "reason": reason or ("Completed" if code == 0 else "Error"),
        "startedAt": "2025-03-01T12:00:00Z",
        "finishedAt": "2025-03-01T12:10:00Z",
    }
    if message is not None:
        out["message"] = message if isinstance(message, str) else json.dumps(message)
    return out


def container(name: str, state: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A container status as the kubelet writes it (init or regular)."""
    return {
        "name": name,
        "image": "ghcr.io/kubedgx/trainer:0.1.0",
        "imageID": "ghcr.io/kubedgx/trainer@sha256:" + "0" * 64,
        "ready": False,
        "restartCount": 0,
        "state": state,
        **extra,
    }


def ended(name: str, code: int, message: Any = None, reason: str | None = None) -> dict[str, Any]:
    return container(name, {"terminated": terminated(code, message, reason)})


def waiting(name: str, reason: str = "PodInitializing") -> dict[str, Any]:
    return container(name, {"waiting": {"reason": reason}})


def running(name: str, **extra: Any) -> dict[str, Any]:
    return container(name, {"running": {"startedAt": "2025-03-01T12:00:00Z"}}, **extra)


def status(phase: str, inits: list[dict[str, Any]], trainer: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "phase": phase,
        "hostIP": "10.0.0.10",
        "conditions": [SCHEDULED, {"type": "Initialized", "status": "False"}],
        "initContainerStatuses": inits,
        "containerStatuses": [trainer],
        **extra,
    }


def pull_failed(code: int, report: Any, container_reason: str | None = None, **pod: Any) -> dict[str, Any]:
    """data-in-0 ended with ``code``; ``pod``: pod-level status fields (reason, message, conditions)."""
    return status(
        "Failed",
        [ended("data-in-0", code, report, container_reason), waiting("restore-1"), waiting("checkpoints-1")],
        waiting("trainer"),
        **pod,
    )


SYNCED = [ended("data-in-0", 0, {"objects": 3, "digest": "sha256:d"}), ended("restore-1", 0, {"restored": None})]

#: Pod statuses over the life of a worker with sync containers.
SHAPES: dict[str, dict[str, Any]] = {
    "pulling": status(
        "Pending", [running("data-in-0"), waiting("restore-1"), waiting("checkpoints-1")], waiting("trainer")
    ),
    "pull-failed": pull_failed(2, DENIED),
    "pull-failed-logs": pull_failed(1, "Traceback (most recent call last):\n  ...\nOSError: [Errno 28] disk full\n"),
    "pull-failed-silent": pull_failed(1, None),
    "pull-oom": pull_failed(137, None, "OOMKilled"),
    # Pod-level reasons and conditions, set by the kubelet, the scheduler or the eviction API.
    "pull-evicted": pull_failed(
        137, None, reason="Evicted", message="The node was low on resource: ephemeral-storage."
    ),
    "pull-deadline": pull_failed(
        137, None, reason="DeadlineExceeded", message="Pod was active on the node longer than the specified deadline"
    ),
    "pull-preempted": pull_failed(
        143,
        None,
        conditions=[SCHEDULED, {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
    ),
    "restore-failed": status(
        "Failed", [SYNCED[0], ended("restore-1", 2, MISSING), waiting("checkpoints-1")], waiting("trainer")
    ),
    "training": status("Running", [*SYNCED, running("checkpoints-1", started=True)], running("trainer", ready=True)),
    "sidecar-restarting": status(
        "Running", [*SYNCED, ended("checkpoints-1", 1, DENIED)], running("trainer", ready=True)
    ),
    "archiving": status("Running", [*SYNCED, running("checkpoints-1", started=True)], ended("trainer", 0, SUMMARY)),
    "archived": status("Succeeded", [*SYNCED, ended("checkpoints-1", 0, REPORT)], ended("trainer", 0, SUMMARY)),
    "archive-failed": status("Succeeded", [*SYNCED, ended("checkpoints-1", 2, DENIED)], ended("trainer", 0, SUMMARY)),
    "sidecar-silent": status("Succeeded", [*SYNCED, ended("checkpoints-1", 0)], ended("trainer", 0, SUMMARY)),
    "trainer-failed": status(
        "Failed",
        [*SYNCED, ended("checkpoints-1", 143, {"checkpoints": [100]})],
        ended("trainer", 1, "Traceback (most recent call last):\nValueError: bad batch"),
    ),
}


def pod_in(shape: str) -> dict[str, Any]:
    pod = one_pod(REFS, mounts=MOUNTS)
    pod["status"] = copy.deepcopy(SHAPES[shape])
    return pod


def view(shape: str) -> PodView:
    return PodView.of(pod_in(shape))


def test_the_pod_under_test_has_these_init_containers() -> None:
    pod = one_pod(REFS, mounts=MOUNTS)
    assert [c["name"] for c in pod["spec"]["initContainers"]] == [
        "prepare-cache",
        "data-in-0",
        "restore-1",
        "checkpoints-1",
    ]


# shape -> (phase, failed, running, exit_code, failed_init, reason, message, disrupted, deadline, termination_message)
FACTS: dict[str, tuple[str, bool, bool, int | None, str | None, str, str, bool, bool, str | None]] = {
    "pulling": ("Pending", False, False, None, None, "", "", False, False, None),
    "pull-failed": ("Failed", True, False, 2, "data-in-0", "DataSyncFailed", DENIED["message"], False, False, None),
    "pull-failed-logs": (
        "Failed",
        True,
        False,
        1,
        "data-in-0",
        "DataSyncFailed",
        "Traceback (most recent call last):\n  ...\nOSError: [Errno 28] disk full\n",
        False,
        False,
        None,
    ),
    "pull-failed-silent": ("Failed", True, False, 1, "data-in-0", "DataSyncFailed", "Error", False, False, None),
    "pull-oom": ("Failed", True, False, 137, "data-in-0", "DataSyncFailed", "OOMKilled", False, False, None),
    "pull-evicted": ("Failed", True, False, 137, "data-in-0", "Evicted", "Error", True, False, None),
    "pull-deadline": ("Failed", True, False, 137, "data-in-0", "DeadlineExceeded", "Error", False, True, None),
    "pull-preempted": ("Failed", True, False, 143, "data-in-0", "DataSyncFailed", "Error", True, False, None),
    "restore-failed": ("Failed", True, False, 2, "restore-1", "DataSyncFailed", MISSING["message"], False, False, None),
    "training": ("Running", False, True, None, None, "", "", False, False, None),
    "sidecar-restarting": ("Running", False, True, None, None, "", "", False, False, None),
    "archiving": ("Running", False, False, 0, None, "Completed", SUMMARY, False, False, SUMMARY),
    "archived": ("Succeeded", False, False, 0, None, "Completed", SUMMARY, False, False, SUMMARY),
    "archive-failed": ("Succeeded", False, False, 0, None, "Completed", SUMMARY, False, False, SUMMARY),
    "sidecar-silent": ("Succeeded", False, False, 0, None, "Completed", SUMMARY, False, False, SUMMARY),
    "trainer-failed": (
        "Failed",
        True,
        False,
        1,
        None,
        "Error",
        "Traceback (most recent call last):\nValueError: bad batch",
        False,
        False,
        "Traceback (most recent call last):\nValueError: bad batch",
    ),
}
REPORTS: dict[str, tuple[tuple[str, str], ...]] = {
    "sidecar-restarting": (("checkpoints-1", json.dumps(DENIED)),),
    "archived": (("checkpoints-1", json.dumps(REPORT)),),
    "archive-failed": (("checkpoints-1", json.dumps(DENIED)),),
    "trainer-failed": (("checkpoints-1", json.dumps({"checkpoints": [100]})),),
}


def test_facts_cover_every_shape() -> None:
    assert set(FACTS) == set(SHAPES)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_pod_view_of_sync_container_states(shape: str) -> None:
    v = view(shape)
    phase, failed, is_running, code, failed_init, reason, message, disrupted, deadline, termination = FACTS[shape]
    assert (v.name, v.index, v.attempt) == ("job-worker-0", 0, 0)
    assert v.phase == phase
    assert v.failed is failed
    assert v.running is is_running
    assert v.exit_code == code
    assert v.failed_init == failed_init
    assert v.reason == reason
    assert v.message == message
    assert v.disrupted is disrupted
    assert v.deadline_exceeded is deadline
    assert v.termination_message == termination
    assert v.sidecar_reports == REPORTS.get(shape, ())


@pytest.mark.parametrize(
    ("shape", "text"),
    [
        ("pull-failed", f"job-worker-0: data sync data-in-0 exited with code 2: {DENIED['message']}"),
        ("pull-failed-logs", "job-worker-0: data sync data-in-0 exited with code 1: OSError: [Errno 28] disk full"),
        ("pull-failed-silent", "job-worker-0: data sync data-in-0 exited with code 1: Error"),
        ("pull-oom", "job-worker-0: data sync data-in-0 exited with code 137: OOMKilled"),
        ("restore-failed", f"job-worker-0: data sync restore-1 exited with code 2: {MISSING['message']}"),
        ("trainer-failed", "job-worker-0 exited with code 1: ValueError: bad batch"),
    ],
)
def test_describe_failure_names_the_sync_container(shape: str, text: str) -> None:
    assert view(shape).describe_failure() == text


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        (DENIED, DENIED["message"]),
        ({"error": "AccessDenied"}, '{"error": "AccessDenied"}'),  # no message: the report as written
        ({"error": "X", "message": 5}, '{"error": "X", "message": 5}'),
        (["not", "a", "report"], '["not", "a", "report"]'),
        ("datasync: plain text", "datasync: plain text"),
        ("", "Error"),  # an empty message: the container's reason
    ],
)
def test_sync_termination_message_forms(message: Any, shown: str) -> None:
    pod = pod_in("pull-failed")
    pod["status"]["initContainerStatuses"][0] = ended("data-in-0", 2, message)
    v = PodView.of(pod)
    assert (v.failed_init, v.message) == ("data-in-0", shown)


def test_no_message_and_no_reason_falls_back_to_the_pods_message() -> None:
    pod = pod_in("pull-failed")
    pod["status"]["initContainerStatuses"][0]["state"]["terminated"] = {"exitCode": 2}
    pod["status"]["message"] = "pod-level words"
    v = PodView.of(pod)
    assert (v.exit_code, v.message) == (2, "pod-level words")
    assert v.describe_failure() == "job-worker-0: data sync data-in-0 exited with code 2: pod-level words"


def test_the_first_failed_sync_container_is_the_failure() -> None:
    pod = pod_in("pull-failed")
    pod["status"]["initContainerStatuses"] = [
        ended("data-in-0", 0),
        ended("data-in-1", 1, {"error": "Unreachable", "message": "first"}),
        ended("restore-2", 2, {"error": "AccessDenied", "message": "second"}),
    ]
    v = PodView.of(pod)
    assert (v.failed_init, v.exit_code, v.message) == ("data-in-1", 1, "first")


@pytest.mark.parametrize("code", [0, 1, 2, 137])
def test_a_sidecar_exit_is_never_the_pods_failure(code: int) -> None:
    pod = pod_in("archived")
    pod["status"]["initContainerStatuses"] = [*SYNCED, ended("checkpoints-1", code, DENIED)]
    v = PodView.of(pod)
    assert (v.succeeded, v.failed, v.disrupted, v.failed_init, v.exit_code) == (True, False, False, None, 0)
    assert v.sidecar_reports == (("checkpoints-1", json.dumps(DENIED)),)


def test_a_sidecar_failure_before_the_trainer_starts_is_not_the_pods_failure() -> None:
    """Only a pull or restore failing stops the trainer; a sidecar that crashed is restarted."""
    pod = pod_in("pulling")
    pod["status"]["initContainerStatuses"] = [*SYNCED, ended("checkpoints-1", 1, DENIED)]
    v = PodView.of(pod)
    assert (v.phase, v.failed, v.failed_init, v.exit_code) == ("Pending", False, None, None)


def test_sidecar_reports_only_from_ended_sidecars_with_a_message() -> None:
    pod = pod_in("archived")
    pod["status"]["initContainerStatuses"] = [
        ended("data-in-0", 0, {"objects": 1}),  # a pull's report is not a sidecar's
        ended("restore-1", 0, {"restored": 100}),
        ended("checkpoints-1", 0, REPORT),
        running("checkpoints-2"),
        ended("checkpoints-3", 0),  # no message
        ended("checkpoints-4", 0, ""),
        ended("checkpoints-5", 2, DENIED),
    ]
    assert PodView.of(pod).sidecar_reports == (
        ("checkpoints-1", json.dumps(REPORT)),
        ("checkpoints-5", json.dumps(DENIED)),
    )


# --- artifacts_of ------------------------------------------------------------------------------------


def with_reports(*reports: tuple[str, Any]) -> PodView:
    texts = tuple((name, r if isinstance(r, str) else json.dumps(r)) for name, r in reports)
    return dataclasses.replace(view("archived"), sidecar_reports=texts)


@pytest.mark.parametrize(
    ("reports", "found", "errors"),
    [
        ((), [], []),
        (
            (("checkpoints-1", REPORT),),
            [(1, "adapter", f"{FINAL}/adapter/"), (1, "summary", f"{FINAL}/summary.json")],
            [],
        ),
        ((("checkpoints-1", DENIED),), [], [f"job-worker-0/checkpoints-1: {DENIED['message']}"]),
        ((("checkpoints-1", {"error": "AccessDenied"}),), [], ["job-worker-0/checkpoints-1: AccessDenied"]),
        ((("checkpoints-1", {"error": "", "checkpoints": [1]}),), [], []),
        (
            (("checkpoints-1", {**DENIED, "artifacts": [{"name": "summary", "uri": f"{FINAL}/summary.json"}]}),),
            [(1, "summary", f"{FINAL}/summary.json")],
            [f"job-worker-0/checkpoints-1: {DENIED['message']}"],
        ),
        ((("checkpoints-1", "not json"),), [], []),
        ((("checkpoints-1", ["a"]),), [], []),
        ((("checkpoints-1", {"artifacts": None}),), [], []),
        ((("checkpoints-1", {"artifacts": 7}),), [], []),
        ((("checkpoints-1", {"artifacts": {"uri": "s3://b/x"}}),), [], []),
        (
            (
                (
                    "checkpoints-1",
                    {
                        "artifacts": [
                            {"name": "no-uri"},
                            "a string",
                            {"name": "empty", "uri": ""},
                            {"uri": "s3://bucket/out/model.tar.gz"},
                        ]
                    },
                ),
            ),
            [(1, "", "s3://bucket/out/model.tar.gz")],
            [],
        ),
        (
            (
                ("checkpoints-0", {"artifacts": [{"name": "a", "uri": "s3://b/a"}]}),
                ("checkpoints-12", {"artifacts": [{"name": "b", "uri": "gs://b/b"}]}),
                ("checkpoints-x", {"artifacts": [{"name": "c", "uri": "s3://b/c"}]}),
            ),
            [(0, "a", "s3://b/a"), (12, "b", "gs://b/b"), (-1, "c", "s3://b/c")],
            [],
        ),
    ],
)
def test_artifacts_of(
    reports: tuple[tuple[str, Any], ...], found: list[tuple[int, str, str]], errors: list[str]
) -> None:
    assert artifacts_of(with_reports(*reports)) == (found, errors)


def test_artifacts_of_a_whole_pod() -> None:
    assert artifacts_of(view("archived")) == (
        [(1, "adapter", f"{FINAL}/adapter/"), (1, "summary", f"{FINAL}/summary.json")],
        [],
    )
    assert artifacts_of(view("archive-failed")) == ([], [f"job-worker-0/checkpoints-1: {DENIED['message']}"])
    assert artifacts_of(view("pull-failed")) == ([], [])


# --- describe_failure wording ------------------------------------------------------------------------

LONG = "x" * 400


@pytest.mark.parametrize(
    ("changes", "text"),
    [
        ({"failed_init": "data-in-0", "exit_code": 2, "message": ""}, "w: data sync data-in-0 exited with code 2"),
        (
            {"failed_init": "restore-3", "exit_code": 1, "message": "  first\nlast line  \n"},
            "w: data sync restore-3 exited with code 1: last line",
        ),
        (
            {"failed_init": "data-in-0", "exit_code": 1, "message": LONG},
            f"w: data sync data-in-0 exited with code 1: {'x' * 300}",
        ),
        ({"exit_code": 137, "reason": "OOMKilled", "message": "oom"}, "w exited with code 137 (OOMKilled): oom"),
        ({"exit_code": 1, "reason": "Error", "message": "boom"}, "w exited with code 1: boom"),
        ({"exit_code": 0, "reason": "Completed", "message": ""}, "w exited with code 0"),
        ({"exit_code": 143, "reason": "", "message": ""}, "w exited with code 143"),
        ({"exit_code": None, "reason": "Evicted", "message": "low on memory"}, "w failed (Evicted): low on memory"),
        ({"exit_code": None, "reason": "", "message": ""}, "w failed (Failed)"),
    ],
)
def test_describe_failure_wording(changes: dict[str, Any], text: str) -> None:
    base = dataclasses.replace(view("trainer-failed"), name="w", failed_init=None)
    assert dataclasses.replace(base, **changes).describe_failure() == text


# --- slim keeps what PodView reads -------------------------------------------------------------------


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("terminating", [False, True])
@pytest.mark.parametrize("progress", [None, '{"step": 3}'])
def test_slim_pod_reads_the_same(shape: str, terminating: bool, progress: str | None) -> None:
    pod = pod_in(shape)
    if terminating:
        pod["metadata"]["deletionTimestamp"] = "2025-03-01T12:30:00Z"
    if progress is not None:
        pod["metadata"]["annotations"]["kubedgx.io/progress"] = progress
    small = slim(pod)
    assert PodView.of(small) == PodView.of(pod)
    assert slim(small) == small  # slimming twice changes nothing
    assert len(repr(small)) < len(repr(pod)) / 2


def test_slim_keeps_only_ended_init_containers_and_what_they_said() -> None:
    assert slim(pod_in("pulling"))["status"]["initContainerStatuses"] == []
    assert slim(pod_in("archived"))["status"]["initContainerStatuses"] == [
        {"name": "data-in-0", "state": {"terminated": terminated(0, {"objects": 3, "digest": "sha256:d"})}},
        {"name": "restore-1", "state": {"terminated": terminated(0, {"restored": None})}},
        {"name": "checkpoints-1", "state": {"terminated": terminated(0, REPORT)}},
    ]


def test_slim_does_not_share_state_with_the_pod() -> None:
    pod = pod_in("archived")
    small = slim(pod)
    small["status"]["initContainerStatuses"][2]["state"]["terminated"]["message"] = "changed"
    assert pod["status"]["initContainerStatuses"][2]["state"]["terminated"]["message"] == json.dumps(REPORT)


# --- through the planner: a failed pull is read like a trainer exit ----------------------------------


def failed_pull_pod(sim: Any, code: int, *, evicted: bool = False) -> dict[str, Any]:
    pod = sim.pod(0, "failed")
    pod["status"] = copy.deepcopy(SHAPES["pull-evicted" if evicted else "pull-failed"])
    pod["status"]["initContainerStatuses"][0] = ended("data-in-0", code, DENIED)
    return pod


@pytest.mark.parametrize(
    ("policy", "code", "phase", "restarts"),
    [
        ("ExitCode", 2, "Failed", 0),  # permanent (bad credentials, missing bucket): not retried
        ("ExitCode", 137, "Restarting", 1),
        ("OnFailure", 2, "Restarting", 1),
        ("Never", 1, "Failed", 0),
    ],
)
def test_a_failed_pull_goes_through_the_restart_policy(
    ctx: Any,
    policy: str,
    code: int,
    phase: str,
    restarts: int,
) -> None:
    sim = sim_of(ctx, {"spec.restartPolicy": policy, "spec.dataMounts": [{"name": "data", "mountPath": "/data"}]})
    sim.mounts = {"data": MountState("Ready")}
    sim.reconcile(at_s=0)
    result = sim.reconcile([failed_pull_pod(sim, code)], at_s=60)
    assert (sim.phase(), sim.status.restarts) == (phase, restarts)
    described = f"job-worker-0: data sync data-in-0 exited with code {code}: {DENIED['message']}"
    if phase == "Failed":
        failed = next(c for c in sim.status.conditions if c.type == "Failed")
        suffix = (
            f"; exit code {code} is not in retryableExitCodes" if policy == "ExitCode" else "; restartPolicy is Never"
        )
        assert (failed.reason, failed.message) == ("WorkerFailed", described + suffix)
    else:
        assert [e.reason for e in result.events] == ["WorkerRestarted", "NodesBelowMinimum"]
        assert result.events[0].message == f"{described}; restart 1 of 3 (attempt 1)"


def test_a_pull_evicted_from_its_node_does_not_count(ctx: Any) -> None:
    sim = sim_of(ctx, {"spec.restartPolicy": "Never", "spec.dataMounts": [{"name": "data", "mountPath": "/data"}]})
    sim.mounts = {"data": MountState("Ready")}
    sim.reconcile(at_s=0)
    result = sim.reconcile([failed_pull_pod(sim, 137, evicted=True)], at_s=60)
    assert (sim.status.restarts, sim.status.attempt) == (0, 1)
    assert [e.reason for e in result.events] == ["WorkerDisrupted", "NodesBelowMinimum"]
    assert result.events[0].message == (
        f"job-worker-0: data sync data-in-0 exited with code 137: {DENIED['message']}; "
        "replaced without counting against backoffLimit"
    )
    assert (sim.phase(), cond(sim.status, "Failed")) == ("Restarting", None)  # even under restartPolicy Never
