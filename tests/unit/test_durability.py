"""The checkpoint warning (validation/durability.py): which jobs can be restarted in a new pod, where their
checkpoints are then, and the field and fix the warning names. Pure: jobs and mount specs in, warnings out."""

from __future__ import annotations

from typing import Any

import pytest

from dgx_api.schema import Problem
from dgx_operator.api import DGXDataMountSpec, DGXTrainingJob
from dgx_operator.catalog import Catalog
from dgx_operator.render.resolved import resolve
from dgx_operator.validation.durability import checkpoint_warnings, reference_warnings, restart_reasons
from tests.conftest import BASE_JOB, BASE_MOUNT, DELETE, with_changes

Body = dict[str, Any]

#: A job that cannot be restarted in a new pod: every case below makes it restartable in one way.
ONCE = with_changes(BASE_JOB, {"spec.restartPolicy": "Never"})
SPOT = with_changes(ONCE, {"spec.instance": "dgxa100.80g.8.spot"})
OUT = DGXDataMountSpec.model_validate({"source": "s3://bucket/ckpt", "direction": "Out"})
NO_SYNC = DGXDataMountSpec.model_validate({"source": "s3://bucket/ckpt", "direction": "Out", "syncCheckpoints": False})
IN = DGXDataMountSpec.model_validate({"source": "s3://bucket/data"})


def mounted(body: Body, output_dir: str | None, *refs: tuple[str, str]) -> Body:
    """``body`` with these (name, mountPath) data mounts and output.dir (None: the default, /workspace/output)."""
    changes: dict[str, Any] = {"spec.dataMounts": [{"name": n, "mountPath": p} for n, p in refs]}
    if output_dir is not None:
        changes["spec.trainer.output.dir"] = output_dir
    return with_changes(body, changes)


def warnings(catalog: Catalog, body: Body, mounts: dict[str, DGXDataMountSpec] | None = None) -> list[Problem]:
    job = DGXTrainingJob.model_validate(body)
    return checkpoint_warnings(job, resolve(job.spec, catalog), mounts or {})


def reasons(catalog: Catalog, body: Body) -> list[str]:
    job = DGXTrainingJob.model_validate(body)
    return restart_reasons(job.spec, resolve(job.spec, catalog))


# -- which jobs -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        pytest.param({}, [], id="never-norm-fixed"),
        pytest.param({"spec.instance": "dgxa100.80g.8.spot"}, ["spot capacity"], id="spot"),
        pytest.param({"spec.restartPolicy": DELETE}, ["restartPolicy OnFailure, the default"], id="default-policy"),
        pytest.param({"spec.restartPolicy": "OnFailure"}, ["restartPolicy OnFailure"], id="on-failure"),
        pytest.param({"spec.restartPolicy": "ExitCode"}, ["restartPolicy ExitCode"], id="exit-code"),
        pytest.param({"spec.elastic.maxNodes": 4}, ["elastic between 1 and 4 nodes"], id="elastic"),
        pytest.param({"spec.elastic": {"minNodes": 2, "maxNodes": 2}}, [], id="fixed-multi-node"),
        pytest.param(
            {"spec.instance": "dgxa100.80g.8.spot", "spec.restartPolicy": "ExitCode", "spec.elastic.maxNodes": 2},
            ["spot capacity", "restartPolicy ExitCode", "elastic between 1 and 2 nodes"],
            id="all-three",
        ),
        # Nothing trains in an interactive worker; the debug pool runs experiments nobody resumes.
        pytest.param(
            {"spec.instance": "dgxa100.80g.1.spot", "spec.restartPolicy": DELETE, "spec.debug.interactive": True},
            [],
            id="interactive",
        ),
        pytest.param({"spec.instance": "dgxa100.80g.8.debug", "spec.restartPolicy": DELETE}, [], id="debug-pool"),
        # Verbose logging is still a real run.
        pytest.param(
            {"spec.instance": "dgxa100.80g.8.spot", "spec.debug.enabled": True}, ["spot capacity"], id="debug-logs"
        ),
    ],
)
def test_which_jobs_can_be_restarted_in_a_new_pod(catalog: Catalog, changes: Body, expected: list[str]) -> None:
    assert reasons(catalog, with_changes(ONCE, changes)) == expected


# -- the warning ----------------------------------------------------------------------------------------------


def test_a_spot_job_whose_checkpoints_stay_in_the_pod_is_told_which_mount_to_add(catalog: Catalog) -> None:
    (warning,) = warnings(catalog, with_changes(SPOT, {"spec.trainer.output.dir": "/output/run-1"}))
    assert warning == Problem(
        "spec.dataMounts",
        "this job can be restarted in a new pod (spot capacity), but its checkpoints (output.dir /output/run-1) stay "
        "in the pod: a replacement starts at step 0. Add a DGXDataMount with direction: Out and syncCheckpoints: "
        "true, mounted at /output/run-1 or a directory above it",
    )


def test_a_job_restartable_only_by_its_policy_is_also_offered_restart_policy_never(catalog: Catalog) -> None:
    """The default OnFailure is said to be the default (it is not in the manifest); Never is a fix here, not
    for spot or elastic jobs, whose workers are replaced whatever the policy."""
    (warning,) = warnings(catalog, BASE_JOB)
    assert str(warning) == (
        "spec.dataMounts: this job can be restarted in a new pod (restartPolicy OnFailure, the default), but its "
        "checkpoints (output.dir /workspace/output) stay in the pod: a replacement starts at step 0. Add a "
        "DGXDataMount with direction: Out and syncCheckpoints: true, mounted at /workspace/output or a directory "
        "above it; or set restartPolicy: Never if a failed run should end the job"
    )
    (elastic,) = warnings(catalog, with_changes(BASE_JOB, {"spec.elastic.maxNodes": 2}))
    assert "restartPolicy OnFailure, the default, elastic between 1 and 2 nodes)" in elastic.message
    assert "restartPolicy: Never" not in elastic.message


@pytest.mark.parametrize(
    ("output_dir", "refs"),
    [
        pytest.param("/output/run-1", [("ckpt", "/output")], id="below-the-mount"),
        pytest.param("/output", [("ckpt", "/output")], id="the-mount-itself"),
        pytest.param("/output/run-1", [("ckpt", "/output/")], id="mount-path-with-a-slash"),
        pytest.param("/mnt/a/b/c", [("data", "/data"), ("ckpt", "/mnt")], id="beside-an-input"),
        # The deeper mount has a volume of its own: it holds output.dir, and it uploads.
        pytest.param("/output/ckpt/run", [("scratch", "/output"), ("ckpt", "/output/ckpt")], id="nested-deeper"),
    ],
)
def test_checkpoints_in_an_out_mount_that_syncs_them_are_durable(
    catalog: Catalog, output_dir: str, refs: list[tuple[str, str]]
) -> None:
    mounts = {"ckpt": OUT, "data": IN, "scratch": NO_SYNC}
    assert warnings(catalog, mounted(SPOT, output_dir, *refs), mounts) == []


def test_an_out_mount_that_keeps_checkpoints_on_the_node_is_named_with_its_setting(catalog: Catalog) -> None:
    """syncCheckpoints: false keeps them in the mount's node directory: a worker recreated on the same node
    finds them, one on another node does not. The deeper of two nested mounts is the one that holds them."""
    body = mounted(SPOT, "/output/scratch/run", ("ckpt", "/output"), ("scratch", "/output/scratch"))
    (warning,) = warnings(catalog, body, {"ckpt": OUT, "scratch": NO_SYNC})
    assert warning.path == "spec.dataMounts[1]"
    assert warning.message == (
        "this job can be restarted in a new pod (spot capacity), but DGXDataMount scratch, which holds its "
        "checkpoints (output.dir /output/scratch/run), has syncCheckpoints: false: they stay on the node, and a "
        "replacement on another node starts at step 0. Set syncCheckpoints: true in DGXDataMount scratch (or leave "
        "it out: it defaults to true)"
    )


@pytest.mark.parametrize(
    "output_dir",
    [
        pytest.param(None, id="default-output-dir"),
        pytest.param("/outputs/run-1", id="a-sibling-prefix-is-not-inside"),
    ],
)
def test_an_output_dir_outside_the_out_mount_is_told_to_move_inside_it(
    catalog: Catalog, output_dir: str | None
) -> None:
    """The Flyte QLoRA task's shape before it set output.dir: an Out mount, and the trainer writing elsewhere."""
    body = mounted(SPOT, output_dir, ("ckpt", "/output"))
    (warning,) = warnings(catalog, body, {"ckpt": OUT})
    assert warning.path == "spec.trainer.output.dir"
    assert "are outside /output, where DGXDataMount ckpt uploads them from: they stay in the pod" in warning.message
    assert warning.message.endswith("Set output.dir to /output or a directory below it")


def test_a_relative_output_dir_cannot_be_matched_to_a_mount(catalog: Catalog) -> None:
    """It resolves against the image's working directory, which the spec does not say; the sidecar then
    watches the mount's root. An absolute path is the fix either way."""
    (with_mount,) = warnings(catalog, mounted(SPOT, "out/run-1", ("ckpt", "/output")), {"ckpt": OUT})
    assert with_mount.path == "spec.trainer.output.dir"
    assert "output.dir out/run-1 is relative" in with_mount.message
    assert with_mount.message.endswith("Set output.dir to an absolute path inside /output, e.g. /output/out/run-1")
    (without,) = warnings(catalog, with_changes(SPOT, {"spec.trainer.output.dir": "out"}))
    assert without.path == "spec.dataMounts"
    assert without.message.endswith("mounted at /output/out or a directory above it, and set output.dir to /output/out")


@pytest.mark.parametrize(
    ("body", "mounts"),
    [
        # spec.command: where the program checkpoints is its own business (docs/api.md).
        pytest.param(
            with_changes(SPOT, {"spec.trainer": DELETE, "spec.command": ["torchrun", "train.py"]}), {}, id="command"
        ),
        # A mount kubedgx was not given: not guessed at.
        pytest.param(mounted(SPOT, "/output/run", ("ckpt", "/output")), {}, id="mount-unknown"),
        pytest.param(
            mounted(SPOT, "/output/run", ("ckpt", "/output"), ("data", "/data")),
            {"ckpt": NO_SYNC},
            id="one-of-two-unknown",
        ),
        # Inside an input mount the job is refused (read-only), not warned about.
        pytest.param(mounted(SPOT, "/data/out", ("data", "/data")), {"data": IN}, id="inside-an-input"),
        pytest.param(ONCE, {}, id="not-restartable"),
    ],
)
def test_no_warning(catalog: Catalog, body: Body, mounts: dict[str, DGXDataMountSpec]) -> None:
    assert warnings(catalog, body, mounts) == []


# -- across documents ------------------------------------------------------------------------------------------


def test_across_documents_a_job_is_checked_with_the_mounts_of_its_namespace(catalog: Catalog) -> None:
    out_mount = with_changes(BASE_MOUNT, {"metadata.name": "ckpt", "spec.direction": "Out"})
    job = mounted(SPOT, "/output/run", ("ckpt", "/output"))
    assert reference_warnings(catalog, [(out_mount, "mount"), (job, "job")]) == []
    elsewhere = with_changes(out_mount, {"metadata.namespace": "other"})
    assert reference_warnings(catalog, [(elsewhere, "mount"), (job, "job")]) == [], "unknown mount: nothing said"
    no_sync = with_changes(out_mount, {"spec.syncCheckpoints": False})
    ((key, warning),) = reference_warnings(catalog, [(no_sync, "mount"), (job, "job")])
    assert (key, warning.path) == ("job", "spec.dataMounts[0]")
    assert reference_warnings(catalog, [(no_sync, "mount")]) == []
