"""A job that archives to a direction: Out mount (reconcile/planner/archives.py): success waits for the workers
that may still be uploading, then status.artifacts and the Archived condition come from what the
sidecars reported; jobs without such a mount are unaffected."""

from __future__ import annotations

from typing import Any

import pytest

from dgx_operator.api.trainingjob import Artifact, DGXTrainingJobStatus
from dgx_operator.catalog import Catalog
from dgx_operator.reconcile.planner import Plan
from dgx_operator.render import BuildContext
from tests.unit.planner_sim import at, cond, event_reasons, reporting, sim_with, start_running, uploaded
from tests.unit.render_helpers import mount_specs

RUN = "job-8a1f3c52"  # planner_sim's job name and UID
OUT_FINAL = f"s3://bucket/out/final/{RUN}"
TAR_FINAL = f"gs://models/out/runs/{RUN}"
MOUNTS: dict[str, dict[str, Any]] = {
    "data": {},
    "out": {"direction": "Out", "source": "s3://bucket/out"},
    "tarball": {"direction": "Out", "source": "gs://models/out", "archive": {"prefix": "runs", "format": "tar.gz"}},
    "ckptonly": {"direction": "Out", "source": "s3://bucket/ckpt", "archive": {"enabled": False}},
}
DENIED = {"error": "AccessDenied", "message": "access denied to s3://bucket/out/final: check the policy"}
NO_REPORT = "no uploader reported an archive (see the checkpoints-* logs)"


@pytest.fixture
def ctx(catalog: Catalog) -> BuildContext:
    return BuildContext(catalog, data_mounts=mount_specs(MOUNTS))


def archived(status: DGXTrainingJobStatus) -> tuple[str, str, str] | None:
    found = next((c for c in status.conditions if c.type == "Archived"), None)
    return None if found is None else (found.status, found.reason, found.message)


def events(result: Plan) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in result.events]


def artifact(name: str, uri: str, mount: str | None) -> Artifact:
    return Artifact(name=name, uri=uri, mount=mount)


OUT_ARTIFACTS = [
    artifact("adapter", f"{OUT_FINAL}/adapter/", "out"),
    artifact("summary", f"{OUT_FINAL}/summary.json", "out"),
]


# --- waiting for the uploaders ------------------------------------------------------------------------


def test_success_waits_for_every_worker_then_lists_the_artifacts(ctx: BuildContext) -> None:
    sim = sim_with(ctx, ("out", "/workspace/output"), spec__elastic={"minNodes": 2})
    start_running(sim, 2)
    # Worker 0 is done; worker 1's trainer has exited and its sidecar (rank 0's node) is archiving.
    waiting = sim.reconcile([sim.pod(0, "succeeded"), sim.pod(1, "sidecar")], at_s=3600)
    assert sim.phase() == "Running"
    running = next(c for c in sim.status.conditions if c.type == "Running")
    assert (running.status, running.reason, running.message) == (
        "True",
        "Finishing",
        "job-worker-0 completed; waiting for job-worker-1 to end",
    )
    assert running.last_transition_time == at(60)  # still running since then
    assert (waiting.create, waiting.delete, waiting.events, waiting.requeue_after) == ([], [], [], 30.0)
    assert (archived(sim.status), sim.status.artifacts, sim.status.completion_time) == (None, [], None)
    assert sim.workers().desired == 1

    report = uploaded(OUT_FINAL, "adapter", "summary")
    done = sim.reconcile(
        [sim.pod(0, "succeeded"), reporting(sim.pod(1, "succeeded"), ("checkpoints-0", 0, report))], at_s=3700
    )
    assert (sim.phase(), cond(sim.status, "Succeeded")) == ("Succeeded", ("True", "Completed"))
    assert events(done) == [("Normal", "Completed"), ("Normal", "Archived")]
    assert done.delete == []
    assert sim.status.artifacts == OUT_ARTIFACTS
    assert archived(sim.status) == ("True", "Archived", "2 artifact(s) archived to out")
    assert sim.status.completion_time == at(3700)

    # Later passes, with the pods still there or gone, keep what was reported and say nothing new.
    for pods in ([sim.pod(0, "succeeded"), reporting(sim.pod(1, "succeeded"), ("checkpoints-0", 0, report))], []):
        later = sim.reconcile(pods, at_s=3800)
        assert (later.events, sim.status.artifacts) == ([], OUT_ARTIFACTS)
        assert archived(sim.status) == ("True", "Archived", "2 artifact(s) archived to out")


def test_finishing_from_restarting_moves_the_phase_to_running(ctx: BuildContext) -> None:
    """Phase and Running condition agree while finishing, whatever the phase of the pass before."""
    sim = sim_with(ctx, ("out", "/workspace/output"), spec__elastic={"minNodes": 2})
    start_running(sim, 2)
    sim.status.phase = "Restarting"
    plan = sim.reconcile([sim.pod(0, "succeeded"), sim.pod(1, "sidecar")], at_s=3600)
    assert sim.phase() == "Running"
    running = next(c for c in sim.status.conditions if c.type == "Running")
    assert (running.status, running.reason) == ("True", "Finishing")
    assert events(plan) == [("Normal", "Finishing")]


def test_every_busy_worker_is_named_while_finishing(ctx: BuildContext) -> None:
    sim = sim_with(ctx, ("out", "/workspace/output"), spec__elastic={"minNodes": 3})
    start_running(sim, 3)
    sim.reconcile([sim.pod(0, "succeeded"), sim.pod(1, "running"), sim.pod(2, "sidecar")], at_s=3600)
    running = next(c for c in sim.status.conditions if c.type == "Running")
    assert (running.reason, running.message) == (
        "Finishing",
        "job-worker-0 completed; waiting for job-worker-1, job-worker-2 to end",
    )
    assert sim.workers().desired == 2


def test_a_worker_that_never_started_is_not_waited_for(ctx: BuildContext) -> None:
    """An elastic job runs with the workers it got; the rest may stay unschedulable for ever. They never
    ran the trainer, hold no model and will never end by themselves: the job must not wait for them."""
    sim = sim_with(ctx, ("out", "/workspace/output"), spec__elastic={"minNodes": 2, "maxNodes": 4})
    sim.reconcile(at_s=0)
    pending = [sim.pod(2, "unscheduled"), sim.pod(3, "scheduled")]
    sim.reconcile([sim.pod(0, "running"), sim.pod(1, "running"), *pending], at_s=60)
    assert cond(sim.status, "Running") == ("True", "ElasticMinimumRunning")
    report = uploaded(OUT_FINAL, "adapter", "summary")
    finished = [reporting(sim.pod(0, "succeeded"), ("checkpoints-0", 0, report)), sim.pod(1, "succeeded")]
    done = sim.reconcile([*finished, *pending], at_s=3600)
    assert sim.phase() == "Succeeded"
    assert done.delete == ["job-worker-2", "job-worker-3"]
    assert sim.status.artifacts == OUT_ARTIFACTS


def test_a_survivor_of_an_earlier_attempt_is_waited_for(ctx: BuildContext) -> None:
    """Worker 0 failed and was replaced in attempt 1; worker 1 kept running (attempt 0) and torchrun took
    the replacement into its group. Rank 0 may be on either node: the survivor is still uploading."""
    sim = sim_with(ctx, ("out", "/workspace/output"), spec__elastic={"minNodes": 1, "maxNodes": 2})
    start_running(sim, 2)
    sim.reconcile([sim.pod(0, "failed"), sim.pod(1, "running")], at_s=120)
    assert (sim.status.attempt, sim.last.delete if sim.last else None) == (1, ["job-worker-0"])
    sim.reconcile([sim.pod(1, "running", attempt=0)], at_s=130)
    assert sim.last is not None
    assert [p["metadata"]["labels"]["kubedgx.io/attempt"] for p in sim.last.create] == ["1"]
    sim.reconcile([sim.pod(0, "running", attempt=1), sim.pod(1, "running", attempt=0)], at_s=200)

    waiting = sim.reconcile([sim.pod(0, "succeeded", attempt=1), sim.pod(1, "sidecar", attempt=0)], at_s=3600)
    assert (sim.phase(), cond(sim.status, "Running")) == ("Running", ("True", "Finishing"))
    assert waiting.delete == []

    report = uploaded(OUT_FINAL, "adapter", "summary")
    survivor = reporting(sim.pod(1, "succeeded", attempt=0), ("checkpoints-0", 0, report))
    sim.reconcile([sim.pod(0, "succeeded", attempt=1), survivor], at_s=3700)
    assert sim.phase() == "Succeeded"
    assert sim.status.artifacts == OUT_ARTIFACTS


def test_workers_already_deleted_or_failed_are_not_waited_for(ctx: BuildContext) -> None:
    sim = sim_with(ctx, ("out", "/workspace/output"), spec__elastic={"minNodes": 3})
    start_running(sim, 3)
    report = uploaded(OUT_FINAL, "summary")
    pods = [
        reporting(sim.pod(0, "succeeded"), ("checkpoints-0", 0, report)),
        sim.pod(1, "failed"),
        sim.pod(2, "sidecar", terminating=True),
    ]
    done = sim.reconcile(pods, at_s=3600)
    assert sim.phase() == "Succeeded"
    assert (done.delete, sim.status.artifacts) == ([], [artifact("summary", f"{OUT_FINAL}/summary.json", "out")])


@pytest.mark.parametrize(
    "mounts",
    [
        (),
        (("data", "/data"),),
        (("ckptonly", "/workspace/output"),),  # streams checkpoints, archives nothing
    ],
)
def test_jobs_without_an_archiving_mount_finish_at_once(ctx: BuildContext, mounts: tuple[tuple[str, str], ...]) -> None:
    sim = sim_with(ctx, *mounts, spec__elastic={"minNodes": 2})
    start_running(sim, 2)
    # Even a report with artifacts (not from an archiving mount) lists nothing.
    report = uploaded(OUT_FINAL, "adapter")
    pods = [reporting(sim.pod(0, "succeeded"), ("checkpoints-0", 0, report)), sim.pod(1, "sidecar")]
    done = sim.reconcile(pods, at_s=3600)
    assert (sim.phase(), done.delete, events(done)) == ("Succeeded", ["job-worker-1"], [("Normal", "Completed")])
    assert (archived(sim.status), sim.status.artifacts) == (None, [])
    sim.reconcile(pods[:1], at_s=3700)
    assert (archived(sim.status), sim.status.artifacts) == (None, [])


def test_a_failed_job_gets_no_archived_condition(ctx: BuildContext) -> None:
    sim = sim_with(ctx, ("out", "/workspace/output"), spec__restartPolicy="Never")
    start_running(sim, 1)
    failed = reporting(sim.pod(0, "failed"), ("checkpoints-0", 143, {"checkpoints": [100]}))
    sim.reconcile([failed], at_s=600)
    assert (sim.phase(), archived(sim.status), sim.status.artifacts) == ("Failed", None, [])
    sim.reconcile([failed], at_s=700)
    assert archived(sim.status) is None


# --- the Archived condition -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sidecars", "detail"),
    [
        ((), NO_REPORT),
        ((("checkpoints-0", 0, {"checkpoints": [100, 200]}),), NO_REPORT),  # uploaded checkpoints, no archive
        ((("checkpoints-0", 0, "not json"),), NO_REPORT),
        ((("checkpoints-0", 2, DENIED),), f"job-worker-0/checkpoints-0: {DENIED['message']}"),
        ((("checkpoints-0", 1, {"error": "Interrupted"}),), "job-worker-0/checkpoints-0: Interrupted"),
    ],
)
def test_no_archive_is_said_not_hidden(
    ctx: BuildContext, sidecars: tuple[tuple[str, int, Any], ...], detail: str
) -> None:
    sim = sim_with(ctx, ("out", "/workspace/output"))
    start_running(sim, 1)
    done = sim.reconcile([reporting(sim.pod(0, "succeeded"), *sidecars)], at_s=3600)
    assert sim.phase() == "Succeeded"  # the training itself succeeded
    assert events(done) == [("Normal", "Completed"), ("Warning", "ArchiveFailed")]
    message = f"the final model was not archived to out: {detail}"
    assert done.events[1].message == message
    assert archived(sim.status) == ("False", "ArchiveFailed", message)
    assert sim.status.artifacts == []


def test_errors_of_every_worker_are_joined_and_the_message_is_bounded(ctx: BuildContext) -> None:
    sim = sim_with(ctx, ("out", "/workspace/output"), spec__elastic={"minNodes": 2})
    start_running(sim, 2)
    long = {"error": "Internal", "message": "x" * 2000}
    pods = [
        reporting(sim.pod(0, "succeeded"), ("checkpoints-0", 2, DENIED)),
        reporting(sim.pod(1, "succeeded"), ("checkpoints-0", 1, long)),
    ]
    sim.reconcile(pods, at_s=3600)
    found = archived(sim.status)
    assert found is not None
    head = f"the final model was not archived to out: job-worker-0/checkpoints-0: {DENIED['message']}; "
    assert found[2] == (head + "job-worker-1/checkpoints-0: " + "x" * 2000)[:1000]
    assert len(found[2]) == 1000


def test_a_late_report_turns_archived_true(ctx: BuildContext) -> None:
    """The kubelet may post the sidecar's termination message after the pass that ended the job."""
    sim = sim_with(ctx, ("out", "/workspace/output"))
    start_running(sim, 1)
    first = sim.reconcile([sim.pod(0, "succeeded")], at_s=3600)
    assert events(first) == [("Normal", "Completed"), ("Warning", "ArchiveFailed")]
    assert archived(sim.status) == ("False", "ArchiveFailed", f"the final model was not archived to out: {NO_REPORT}")

    # A sidecar error seen later refines the message; no second Warning, the transition time stays.
    error = sim.reconcile([reporting(sim.pod(0, "succeeded"), ("checkpoints-0", 1, DENIED))], at_s=3620)
    assert error.events == []
    detail = f"job-worker-0/checkpoints-0: {DENIED['message']}"
    assert archived(sim.status) == ("False", "ArchiveFailed", f"the final model was not archived to out: {detail}")
    assert next(c for c in sim.status.conditions if c.type == "Archived").last_transition_time == at(3600)

    report = uploaded(OUT_FINAL, "adapter", "summary")
    late = sim.reconcile([reporting(sim.pod(0, "succeeded"), ("checkpoints-0", 0, report))], at_s=3650)
    assert events(late) == [("Normal", "Archived")]
    assert late.events[0].message == "2 artifact(s) archived to out"
    assert archived(sim.status) == ("True", "Archived", "2 artifact(s) archived to out")
    assert next(c for c in sim.status.conditions if c.type == "Archived").last_transition_time == at(3650)
    assert sim.status.artifacts == OUT_ARTIFACTS
    assert (sim.phase(), sim.status.completion_time) == ("Succeeded", at(3600))

    again = sim.reconcile([], at_s=3700)  # the pod is gone: what was reported stays
    assert (again.events, sim.status.artifacts) == ([], OUT_ARTIFACTS)
    assert archived(sim.status) == ("True", "Archived", "2 artifact(s) archived to out")


def test_an_archive_on_one_worker_outweighs_an_error_on_another(ctx: BuildContext) -> None:
    sim = sim_with(ctx, ("out", "/workspace/output"), spec__elastic={"minNodes": 2})
    start_running(sim, 2)
    report = uploaded(OUT_FINAL, "adapter", "summary")
    pods = [
        reporting(sim.pod(0, "succeeded"), ("checkpoints-0", 2, DENIED)),
        reporting(sim.pod(1, "succeeded"), ("checkpoints-0", 0, report)),
    ]
    done = sim.reconcile(pods, at_s=3600)
    assert event_reasons(done) == ["Completed", "Archived"]
    assert archived(sim.status) == ("True", "Archived", "2 artifact(s) archived to out")


def test_artifacts_are_sorted_deduplicated_and_named_by_their_mount(ctx: BuildContext) -> None:
    sim = sim_with(
        ctx,
        ("data", "/data"),
        ("out", "/workspace/output"),
        ("tarball", "/tarball"),
        ("ckptonly", "/ckpt"),
        spec__elastic={"minNodes": 2},
    )
    start_running(sim, 2)
    pods = [
        reporting(
            sim.pod(0, "succeeded"),
            ("checkpoints-1", 0, uploaded(OUT_FINAL, "summary", "adapter")),
            ("checkpoints-2", 0, uploaded(TAR_FINAL, "summary", "model.tar.gz")),
            ("checkpoints-3", 0, {"checkpoints": [100]}),
        ),
        # The same upload reported by another worker is listed once.
        reporting(sim.pod(1, "succeeded"), ("checkpoints-1", 0, uploaded(OUT_FINAL, "adapter", "merged"))),
    ]
    done = sim.reconcile(pods, at_s=3600)
    assert sim.status.artifacts == [
        artifact("model.tar.gz", f"{TAR_FINAL}/model.tar.gz", "tarball"),
        artifact("summary", f"{TAR_FINAL}/summary.json", "tarball"),
        artifact("adapter", f"{OUT_FINAL}/adapter/", "out"),
        artifact("merged", f"{OUT_FINAL}/merged/", "out"),
        artifact("summary", f"{OUT_FINAL}/summary.json", "out"),
    ]
    assert archived(sim.status) == ("True", "Archived", "5 artifact(s) archived to out, tarball")
    assert done.events[1].message == "5 artifact(s) archived to out, tarball"


def test_at_most_32_artifacts_are_listed(ctx: BuildContext) -> None:
    sim = sim_with(ctx, ("out", "/workspace/output"))
    start_running(sim, 1)
    many = {"artifacts": [{"name": f"part-{i:02d}", "uri": f"{OUT_FINAL}/part-{i:02d}"} for i in range(40)]}
    sim.reconcile([reporting(sim.pod(0, "succeeded"), ("checkpoints-0", 0, many))], at_s=3600)
    assert [a.name for a in sim.status.artifacts] == [f"part-{i:02d}" for i in range(32)]
    assert archived(sim.status) == ("True", "Archived", "32 artifact(s) archived to out")


def test_a_report_from_a_mount_that_does_not_archive_has_no_mount_name(ctx: BuildContext) -> None:
    """Only what the uploaders reported, and the mount only where the container index names one."""
    sim = sim_with(ctx, ("out", "/workspace/output"), ("ckptonly", "/ckpt"))
    start_running(sim, 1)
    odd = {"artifacts": [{"name": "stray", "uri": "s3://bucket/ckpt/stray"}]}
    pods = [
        reporting(
            sim.pod(0, "succeeded"),
            ("checkpoints-0", 0, uploaded(OUT_FINAL, "summary")),
            ("checkpoints-1", 0, odd),
        )
    ]
    sim.reconcile(pods, at_s=3600)
    assert sim.status.artifacts == [
        artifact("stray", "s3://bucket/ckpt/stray", None),
        artifact("summary", f"{OUT_FINAL}/summary.json", "out"),
    ]
