"""The connector's ownerReference on a data mount: appended (never replacing another job's), once,
guarded by the mount's resourceVersion, read again after a conflict; a mount gone meanwhile is said.
(tests/cluster/test_flyte_connector.py has the garbage collector delete a mount with its last job.)"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from flytekitplugins.dgx.connector import DGXConnectorError, add_owner


def owner(name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "kubedgx.io/v1alpha1", "kind": "DGXTrainingJob", "name": name, "uid": uid,
            "blockOwnerDeletion": False}  # fmt: skip


JOB = {"apiVersion": "kubedgx.io/v1alpha1", "kind": "DGXTrainingJob", "metadata": {"name": "flyte-b", "uid": "u-b"}}


class FakeMounts:
    """The API server's side of one mount: merge patches checked against its resourceVersion."""

    def __init__(self, stored: dict[str, Any] | None, conflicts: int = 0) -> None:
        self.stored = stored
        self.conflicts = conflicts  # a writer that gets in before each of the first patches
        self.patches: list[dict[str, Any]] = []

    async def patch_namespaced_custom_object(self, *args: Any, _content_type: str = "", **kwargs: Any) -> Any:
        assert _content_type == "application/merge-patch+json"
        patch = args[5]
        self.patches.append(copy.deepcopy(patch))
        if self.stored is None:
            raise ApiException(status=404, reason="Not Found")
        if self.conflicts:
            self.conflicts -= 1
            meta = self.stored["metadata"]
            meta["ownerReferences"] = [*meta.get("ownerReferences", []), owner("flyte-c", "u-c")]
            meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        if patch["metadata"]["resourceVersion"] != self.stored["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self.stored["metadata"]["ownerReferences"] = patch["metadata"]["ownerReferences"]
        self.stored["metadata"]["resourceVersion"] = str(int(self.stored["metadata"]["resourceVersion"]) + 1)
        return self.stored

    async def get_namespaced_custom_object(self, *args: Any) -> Any:
        if self.stored is None:
            raise ApiException(status=404, reason="Not Found")
        return copy.deepcopy(self.stored)


def mount(*owners: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "flyte-in-abc", "namespace": "ml", "resourceVersion": "7"}
    if owners:
        meta["ownerReferences"] = list(owners)
    return {"metadata": meta}


def test_the_job_is_appended_to_the_owners_once() -> None:
    api = FakeMounts(mount(owner("flyte-a", "u-a")))
    asyncio.run(add_owner(api, copy.deepcopy(api.stored), JOB))  # type: ignore[arg-type]
    assert api.stored is not None
    assert api.stored["metadata"]["ownerReferences"] == [owner("flyte-a", "u-a"), owner("flyte-b", "u-b")]
    again = copy.deepcopy(api.stored)
    asyncio.run(add_owner(api, again, JOB))  # type: ignore[arg-type]
    assert len(api.patches) == 1, "an owner already there is not added again"


def test_a_mount_changed_meanwhile_is_read_again_and_keeps_the_other_writer_s_owner() -> None:
    api = FakeMounts(mount(), conflicts=1)
    asyncio.run(add_owner(api, copy.deepcopy(api.stored), JOB))  # type: ignore[arg-type]
    assert api.stored is not None
    assert api.stored["metadata"]["ownerReferences"] == [owner("flyte-c", "u-c"), owner("flyte-b", "u-b")]
    assert [p["metadata"]["resourceVersion"] for p in api.patches] == ["7", "8"]


def test_a_mount_that_keeps_changing_or_is_gone_is_named() -> None:
    busy = FakeMounts(mount(), conflicts=99)
    with pytest.raises(DGXConnectorError, match=r"DGXDataMount ml/flyte-in-abc kept changing"):
        asyncio.run(add_owner(busy, copy.deepcopy(busy.stored), JOB))  # type: ignore[arg-type]
    gone = FakeMounts(None)
    with pytest.raises(DGXConnectorError, match=r"ml/flyte-in-abc was deleted as job flyte-b was created"):
        asyncio.run(add_owner(gone, mount(), JOB))  # type: ignore[arg-type]
    assert json.dumps(gone.patches[0]["metadata"]["ownerReferences"]) == json.dumps([owner("flyte-b", "u-b")])
