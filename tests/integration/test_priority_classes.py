"""The operator's startup check of its PriorityClasses (dgx_operator.runtime.priorities, wired into handlers.startup),
end to end against the in-memory API server: a configured class the cluster lacks is never named by a
worker, a class it has still is, and the log says which was dropped and how to create it.

The emulator serves no scheduling.k8s.io; a cluster-scoped stand-in CRD of that group and plural gives
the operator's GET the same URL and answers (200 with the object, 404 without). tests/cluster proves
the same on a real apiserver, where a worker naming the missing class would be refused."""

from __future__ import annotations

import logging

import pytest

from dgx_operator.runtime import priorities
from tests.conftest import BASE_JOB, with_changes
from tests.integration.conftest import RunOperator
from tests.integration.emulator import Emulator
from tests.integration.scenarios import JOBS, NS, get_job, start_operator, worker

pytestmark = pytest.mark.asyncio

PRIORITY_CLASS_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "priorityclasses.scheduling.k8s.io"},
    "spec": {
        "group": "scheduling.k8s.io",
        "scope": "Cluster",
        "names": {
            "plural": "priorityclasses",
            "singular": "priorityclass",
            "kind": "PriorityClass",
            "listKind": "PriorityClassList",
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }
        ],
    },
}


async def test_workers_never_name_a_priority_class_the_cluster_lacks(
    emulator: Emulator, run_operator: RunOperator, caplog: pytest.LogCaptureFixture
) -> None:
    emulator.create("customresourcedefinitions", PRIORITY_CLASS_CRD)
    (high,) = [pc for pc in priorities.priority_class_manifests() if pc["metadata"]["name"] == "kubedgx-high"]
    emulator.create("priorityclasses", high)  # only this one of the operator's three exists
    with caplog.at_level(logging.INFO, logger=priorities.__name__):
        op = await start_operator(emulator, run_operator)
    assert op.memo.config.priority_classes == {"high": "kubedgx-high"}

    emulator.create(JOBS, with_changes(BASE_JOB, {"metadata.name": "urgent", "spec.priority": "high"}))
    emulator.create(JOBS, BASE_JOB)  # spec.priority normal, the default
    urgent = await emulator.wait_for_object("pods", NS, worker(0, "urgent"))
    normal = await emulator.wait_for_object("pods", NS, worker(0))
    assert urgent["spec"]["priorityClassName"] == "kubedgx-high"
    assert "priorityClassName" not in normal["spec"]
    assert (get_job(emulator).get("status") or {}).get("phase") != "Failed"

    warnings = [r.getMessage() for r in caplog.records if r.name == priorities.__name__ and r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(
        "PriorityClasses kubedgx-low (spec.priority low), kubedgx-normal (spec.priority normal) do not exist"
    )
    assert f"`{priorities.APPLY_COMMAND}`" in warnings[0]
