"""PodView reads the same facts from a whole pod and from the slim copy the operator indexes."""

from __future__ import annotations

from typing import Any

import pytest

from dgx_operator.api import DGXTrainingJob
from dgx_operator.catalog import Catalog
from dgx_operator.reconcile.pods import PodView, progress_in_log, read_progress, slim
from dgx_operator.render import BuildContext, build_children
from tests.conftest import BASE_JOB

TRAINER = "trainer"
STATES: dict[str, dict[str, Any]] = {
    "new": {},
    "scheduled": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}], "hostIP": "10.0.0.1"},
    "running": {"phase": "Running", "containerStatuses": [{"name": TRAINER, "state": {"running": {}}}]},
    "evicted": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."},
    "oom": {
        "phase": "Failed",
        "containerStatuses": [
            {"name": "sidecar", "state": {"terminated": {"exitCode": 0}}},
            {
                "name": TRAINER,
                "state": {
                    "terminated": {
                        "exitCode": 137,
                        "reason": "OOMKilled",
                        "message": "oom",
                        "finishedAt": "2026-11-28T23:00:00Z",
                    }
                },
            },
        ],
        "conditions": [{"type": "DisruptionTarget", "status": "True"}, {"type": "Ready", "status": "False"}],
    },
    "unschedulable": {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/9 nodes are available: 9 Insufficient nvidia.com/gpu.",
            }
        ],
    },
    "pull-backoff": {
        "phase": "Pending",
        "initContainerStatuses": [
            {"name": "prepare-cache", "state": {"terminated": {"exitCode": 0}}},
            {"name": "pull-0", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling"}}},
        ],
    },
    "config-error": {
        "phase": "Pending",
        "containerStatuses": [
            {
                "name": TRAINER,
                "state": {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "hf" not found'}},
            }
        ],
    },
    "lost-node": {
        "phase": "Running",
        "containerStatuses": [{"name": TRAINER, "state": {"running": {}}}],
        "conditions": [
            {"type": "Ready", "status": "False"},
            {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"},
        ],
    },
    "done": {
        "phase": "Succeeded",
        "containerStatuses": [
            {"name": TRAINER, "state": {"terminated": {"exitCode": 0, "message": '{"step": 7, "loss": 1.5}'}}}
        ],
    },
}


@pytest.fixture(scope="module")
def pod() -> dict[str, Any]:
    job = DGXTrainingJob.model_validate(BASE_JOB)
    children = build_children(job, BuildContext(Catalog.load()), uid="6f1c2c1e-0000-4000-8000-000000000001")
    return next(c for c in children if c["kind"] == "Pod")


@pytest.mark.parametrize("state", sorted(STATES))
@pytest.mark.parametrize("terminating", [False, True])
def test_slim_pod_reads_the_same(pod: dict[str, Any], state: str, terminating: bool) -> None:
    whole = {**pod, "status": STATES[state]}
    if terminating:
        whole["metadata"] = {**whole["metadata"], "deletionTimestamp": "2026-11-29T00:00:00Z"}
    whole["metadata"]["annotations"] = {**whole["metadata"]["annotations"], "kubedgx.io/progress": '{"step": 3}'}
    small = slim(whole)
    assert PodView.of(small) == PodView.of(whole)
    # A finished worker's termination message is its final word; a running one reports by annotation.
    expected = {"step": 7, "loss": 1.5} if state == "done" else {"step": 3}
    assert read_progress(PodView.of(small)) == expected
    assert len(repr(small)) < len(repr(whole)) / 3  # the point of it: most of a pod is not kept


def test_slim_pod_drops_the_spec_but_the_gpus(pod: dict[str, Any]) -> None:
    small = slim({**pod, "status": STATES["running"]})
    # Of the spec only the trainer's GPU limit: what a worker holds is what its usage counts.
    assert small["spec"] == {"containers": [{"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}
    assert set(small["metadata"]["labels"]) == {
        "kubedgx.io/job-name",
        "kubedgx.io/replica-index",
        "kubedgx.io/attempt",
        "kubedgx.io/trainer-config",
    }


def test_progress_in_log_is_the_last_progress_line() -> None:
    text = "\n".join(
        [
            '{"event": "progress", "step": 1, "loss": 3.0}',
            "WARNING something else",
            '{"event": "eval", "step": 2, "evalLoss": 2.0}',
            '{"event": "progress", "step": 2, "loss": NaN}',
            "{'not': 'json'}",
            '{"event": "summary", "status": "Succeeded"}',
            '{"event": "progress", "step": 3, "lo',  # a line cut by the read's byte limit
        ]
    )
    assert progress_in_log(text) == {"step": 2, "loss": None}  # NaN is read as null, the cut line ignored
    assert progress_in_log("no report here\n") is None
    assert progress_in_log("") is None
