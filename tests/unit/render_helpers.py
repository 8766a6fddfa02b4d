"""The pure builders driven for the unit tests (test_render.py, test_render_datasync.py,
test_pods_datasync.py, test_ca_bundle.py, test_planner*.py): a DGXTrainingJob manifest, its data
mounts and defaults -> the children build_children makes, and the parts of a worker pod the tests
look at."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import kubernetes_validate

from dgx_operator.api import DGXDataMountSpec, DGXTrainingJob
from dgx_operator.catalog import Catalog
from dgx_operator.render import BuildContext, Defaults, build_children
from tests.conftest import BASE_JOB, BASE_MOUNT, DELETE, with_changes

CATALOG = Catalog.load()
KUBE_VERSION = "1.34"
UID = "5f0c2a4e-8d1b-4c3e-9a7f-1b2c3d4e5f60"
COMMAND_MODE: dict[str, Any] = {
    "spec.trainer": DELETE,
    "spec.command": ["torchrun", "/app/train.py"],
    "spec.args": ["--lr", "1e-4", "--name=a b"],
}


def job_obj(changes: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return with_changes(BASE_JOB, dict(changes or {}))


def mount_specs(mounts: Mapping[str, Mapping[str, Any]] | None) -> dict[str, DGXDataMountSpec]:
    """DGXDataMount specs by name, each BASE_MOUNT's spec plus the given changes."""
    return {
        name: DGXDataMountSpec.model_validate({**copy.deepcopy(BASE_MOUNT["spec"]), **changes})
        for name, changes in (mounts or {}).items()
    }


def context(
    mounts: Mapping[str, Mapping[str, Any]] | None = None,
    defaults: Defaults | None = None,
    catalog: Catalog = CATALOG,
) -> BuildContext:
    return BuildContext(catalog, defaults or Defaults(), data_mounts=mount_specs(mounts))


def build(
    changes: Mapping[str, Any] | None = None,
    *,
    mounts: Mapping[str, Mapping[str, Any]] | None = None,
    defaults: Defaults | None = None,
    catalog: Catalog = CATALOG,
    uid: str | None = UID,
    namespace: str | None = None,
) -> list[dict[str, Any]]:
    job = DGXTrainingJob.model_validate(job_obj(changes))
    return build_children(job, context(mounts, defaults, catalog), namespace=namespace, uid=uid)


def pods_of(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in children if c["kind"] == "Pod"]


def one_pod(changes: Mapping[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    pods = pods_of(build(changes, **kwargs))
    assert pods, "no worker pods built"
    return pods[0]


def the_container(pod: dict[str, Any]) -> dict[str, Any]:
    containers = pod["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def volume_at(pod: dict[str, Any], mount_path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(volumeMount, volume) for the mount at ``mount_path``; fails unless exactly one."""
    mounts = [m for m in the_container(pod)["volumeMounts"] if m["mountPath"] == mount_path]
    assert len(mounts) == 1, f"{len(mounts)} mounts at {mount_path}"
    volumes = [v for v in pod["spec"]["volumes"] if v["name"] == mounts[0]["name"]]
    assert len(volumes) == 1
    return mounts[0], volumes[0]


def assert_valid(children: list[dict[str, Any]]) -> None:
    for child in children:
        assert kubernetes_validate.validate(child, KUBE_VERSION, strict=True) == KUBE_VERSION


OUT = {"direction": "Out", "source": "s3://bucket/out"}


def refs(*pairs: tuple[str, str]) -> dict[str, Any]:
    """spec.dataMounts referencing (name, mountPath) pairs, in order."""
    return {"spec.dataMounts": [{"name": name, "mountPath": path} for name, path in pairs]}


def children(
    changes: Mapping[str, Any] | None = None,
    *,
    mounts: Mapping[str, Mapping[str, Any]],
    digests: Mapping[str, str] | None = None,
    defaults: Defaults | None = None,
    uid: str = UID,
) -> list[dict[str, Any]]:
    """build(), plus the mounts' manifest digests the operator passes to the builders."""
    job = DGXTrainingJob.model_validate(job_obj(changes))
    ctx = BuildContext(
        CATALOG, defaults or Defaults(), data_mounts=mount_specs(mounts), data_digests=dict(digests or {})
    )
    return build_children(job, ctx, uid=uid)


def inits(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pod's data sync init containers by name, in their order (prepare-cache, which only
    prepares the hostPath caches, has tests of its own in test_render.py)."""
    return {c["name"]: c for c in sync_inits(pod)}


def sync_inits(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in pod["spec"].get("initContainers", []) if c["name"] != "prepare-cache"]
