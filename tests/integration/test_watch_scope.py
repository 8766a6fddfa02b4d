"""What the operator asks the API server for: its children (pods, Services, ConfigMaps) selected by our job
label on the server, and every initial LIST in pages (settings.configure, docs/operator.md "What the operator
watches"). Read from the emulator's request log: every LIST and WATCH the real kopf operator sent.

That the API server then sends no other object is the API's contract (the emulator's own tests check its
selectors); tests/cluster/test_watch_scope.py checks what a real apiserver sent the operator.
"""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from dgx_operator.controllers.job import Controller
from dgx_operator.runtime.settings import OperatorConfig
from tests.conftest import BASE_JOB
from tests.integration.conftest import RunOperator
from tests.integration.emulator import Emulator

pytestmark = pytest.mark.asyncio

NS = "ml"
JOBS, MOUNTS = "dgxtrainingjobs", "dgxdatamounts"
CHILDREN = ("pods", "services", "configmaps")
JOB_LABEL = "kubedgx.io/job-name"  # docs/operator.md's name, spelled out
PAGE = 2


def pod(name: str, labels: dict[str, str], namespace: str = NS) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
    }


async def test_children_are_listed_and_watched_by_our_label_in_pages(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    # Before the operator starts: three pods of a job (more than a page) and someone else's objects, in
    # the jobs' namespace and in another one.
    emulator.create_namespace("web")
    for i in range(3):
        emulator.create("pods", pod(f"old-worker-{i}", {JOB_LABEL: "old"}))
    for namespace in (NS, "web"):
        emulator.create("pods", pod("web-0", {"app": "web"}, namespace))
        emulator.create("configmaps", {"metadata": {"name": "web", "namespace": namespace}, "data": {"a": "b"}})
        service = {"metadata": {"name": "web", "namespace": namespace}, "spec": {"ports": [{"port": 80}]}}
        emulator.create("services", service)
    for i in range(3):
        emulator.create(JOBS, {**BASE_JOB, "metadata": {"name": f"job-{i}", "namespace": NS}})

    config = OperatorConfig(list_chunk_size=PAGE, error_backoffs=(0.1, 0.2, 0.5, 1.0), retry_base=0.1)
    memo = kopf.Memo(config=config)
    await run_operator("dgx_operator.runtime.handlers", clusterwide=True, wait_for=(JOBS, MOUNTS, *CHILDREN), memo=memo)
    controller: Controller = memo.controller

    # The operator works as before: the jobs' children are created, and its pod index sees them.
    await emulator.wait_for(
        lambda: all(
            emulator.select(resource, NS, labels={JOB_LABEL: f"job-{i}"}) for resource in CHILDREN for i in range(3)
        ),
        message="every job has its ConfigMap, Service and worker",
    )
    await emulator.wait_for(
        lambda: all(controller.pods_of(NS, f"job-{i}") for i in range(3)), message="the pod index holds the workers"
    )
    old = sorted(p.name for p in controller.pods_of(NS, "old"))
    assert old == [f"old-worker-{i}" for i in range(3)]

    for resource in CHILDREN:
        lists, watches = emulator.calls("list", resource), emulator.calls("watch", resource)
        assert lists, resource
        assert watches, resource
        for call in lists + watches:
            assert call.path.startswith(f"/api/v1/{resource}"), call  # core v1, every namespace
            assert call.params.get("labelSelector") == JOB_LABEL, call
        for call in lists:
            assert call.params.get("limit") == str(PAGE), call
    # Three labelled pods in pages of two: a first page, then one that continues it.
    pods = emulator.calls("list", "pods")
    assert [bool(c.params.get("continue")) for c in pods] == [False, True]

    # Our own kinds are not narrowed by the children's selector, but paged all the same.
    for resource in (JOBS, MOUNTS):
        lists = emulator.calls("list", resource)
        assert lists, resource
        for call in lists + emulator.calls("watch", resource):
            assert "labelSelector" not in call.params, call
        assert all(c.params.get("limit") == str(PAGE) for c in lists)
    assert [bool(c.params.get("continue")) for c in emulator.calls("list", JOBS)] == [False, True]
