"""The in-memory Kubernetes API is test infrastructure: these tests hold it to the API server's behaviour.

Most go through HTTP (kubernetes_asyncio or plain aiohttp), as the operator will; the last ones run the
demo kopf operator against it through a whole lifecycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from tests.conftest import BASE_JOB, with_changes
from tests.integration.conftest import RunOperator
from tests.integration.demo_operator import worker_name
from tests.integration.emulator import ApiError, Emulator, label_selector, parse_route

pytestmark = pytest.mark.asyncio

Body = dict[str, Any]
JOBS = "/apis/kubedgx.io/v1alpha1/namespaces/ml/dgxtrainingjobs"
PODS = "/api/v1/namespaces/ml/pods"
CONFIGMAPS = "/api/v1/namespaces/ml/configmaps"
MERGE = {"Content-Type": "application/merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
DEMO = "tests.integration.demo_operator"
KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"


def pod(name: str, labels: dict[str, str] | None = None, namespace: str = "ml", **meta: Any) -> Body:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}, **meta},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


def owned_by(owner: Body, *, block: bool = True) -> list[Body]:
    meta = owner["metadata"]
    ref = {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"], "uid": meta["uid"]}
    return [{**ref, "controller": True, "blockOwnerDeletion": block}]


async def send(http: aiohttp.ClientSession, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Body]:
    async with http.request(method, path, json=body, **kw) as response:
        return response.status, await response.json()


EventReader = Callable[..., Awaitable[Body | None]]


@contextlib.asynccontextmanager
async def watching(http: aiohttp.ClientSession, path: str, **params: str) -> AsyncIterator[EventReader]:
    """Open a watch; yields ``next_event()``, which returns None once the server has ended the stream."""
    async with http.get(path, params={"watch": "true", **params}) as response:
        assert response.status == 200

        async def next_event(timeout: float = 2.0) -> Body | None:
            async with asyncio.timeout(timeout):
                line = await response.content.readline()
            return json.loads(line) if line else None

        yield next_event


# --------------------------------------------------------------------------------------------
# Metadata
# --------------------------------------------------------------------------------------------


async def test_create_sets_server_metadata(http: aiohttp.ClientSession, emulator: Emulator) -> None:
    code, job = await send(http, "POST", JOBS, BASE_JOB)
    assert code == 201
    meta = job["metadata"]
    assert uuid.UUID(meta["uid"]).version == 4
    assert meta["generation"] == 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["creationTimestamp"])
    code, generated = await send(http, "POST", PODS, pod("", generateName="worker-"))
    assert code == 201
    assert re.fullmatch(r"worker-[bcdfghjklmnpqrstvwxz2456789]{5}", generated["metadata"]["name"])
    # One counter for every kind: each write gets the next resourceVersion.
    assert int(generated["metadata"]["resourceVersion"]) == int(meta["resourceVersion"]) + 1
    assert emulator.get("pods", "ml", generated["metadata"]["name"]) == generated


async def test_generation_bumps_only_when_the_spec_changes(emulator: Emulator) -> None:
    job = emulator.create("dgxtrainingjobs", BASE_JOB)
    labelled = emulator.patch("dgxtrainingjobs", "ml", "job", {"metadata": {"labels": {"team": "a"}}})
    with_status = emulator.patch_status("dgxtrainingjobs", "ml", "job", {"phase": "Running"})
    respecced = emulator.patch("dgxtrainingjobs", "ml", "job", {"spec": {"priority": "high"}})
    versions = [int(o["metadata"]["resourceVersion"]) for o in (job, labelled, with_status, respecced)]
    assert versions == sorted(set(versions))
    assert [o["metadata"]["generation"] for o in (job, labelled, with_status, respecced)] == [1, 1, 1, 2]


async def test_updates_ratchet_errors_at_unchanged_values(emulator: Emulator) -> None:
    """As the API server since 1.33 (tests/cluster/test_crds.py proves it there): a value stored under
    a looser schema survives updates that leave it alone, and another bad value is refused."""
    old = emulator.create("dgxtrainingjobs", with_changes(BASE_JOB, {"spec.resources.memory": "1Gi"}))
    stale = json.loads(json.dumps(old))
    stale["spec"]["resources"]["memory"] = "-1Gi"
    emulator._commit(emulator.kind("dgxtrainingjobs"), "MODIFIED", stale, old)  # what an older CRD allowed
    labelled = emulator.patch("dgxtrainingjobs", "ml", "job", {"metadata": {"labels": {"team": "a"}}})
    assert labelled["spec"]["resources"]["memory"] == "-1Gi"
    with pytest.raises(ApiError) as refused:
        emulator.patch("dgxtrainingjobs", "ml", "job", {"spec": {"resources": {"memory": "-2Gi"}}})
    assert refused.value.code == 422


async def test_a_write_that_changes_nothing_is_not_written(emulator: Emulator) -> None:
    first = emulator.patch(
        "dgxtrainingjobs", "ml", emulator.create("dgxtrainingjobs", BASE_JOB)["metadata"]["name"], {}
    )
    again = emulator.patch("dgxtrainingjobs", "ml", "job", {"spec": {"instance": BASE_JOB["spec"]["instance"]}})
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert len(emulator.objects["kubedgx.io/v1alpha1/dgxtrainingjobs", "ml", "job"].history) == 1


async def test_duplicate_create_is_409_already_exists(http: aiohttp.ClientSession) -> None:
    assert (await send(http, "POST", JOBS, BASE_JOB))[0] == 201
    code, status = await send(http, "POST", JOBS, BASE_JOB)
    assert code == 409
    assert status["kind"] == "Status"
    assert status["reason"] == "AlreadyExists"
    assert status["details"] == {"name": "job", "group": "kubedgx.io", "kind": "dgxtrainingjobs"}
    assert status["message"] == 'dgxtrainingjobs.kubedgx.io "job" already exists'


@pytest.mark.parametrize("method", ["GET", "PATCH", "PUT", "DELETE"])
async def test_a_missing_object_is_404_not_found(http: aiohttp.ClientSession, method: str) -> None:
    body: Body | None = {} if method in ("PATCH", "PUT") else None
    code, status = await send(http, method, f"{PODS}/nope", body, headers=MERGE if method == "PATCH" else None)
    assert (code, status["reason"], status["message"]) == (404, "NotFound", 'pods "nope" not found')
    assert status["details"]["name"] == "nope"


async def test_objects_need_an_existing_namespace_and_a_dns_name(http: aiohttp.ClientSession) -> None:
    code, status = await send(http, "POST", "/api/v1/namespaces/nowhere/pods", pod("p", namespace="nowhere"))
    assert (code, status["message"]) == (404, 'namespaces "nowhere" not found')
    code, status = await send(http, "POST", PODS, pod("Not_A_Name"))
    assert (code, status["reason"], status["details"]["causes"][0]["field"]) == (422, "Invalid", "metadata.name")


# --------------------------------------------------------------------------------------------
# Writes: optimistic concurrency, patch types, status isolation
# --------------------------------------------------------------------------------------------


async def test_stale_resource_version_is_409_conflict(http: aiohttp.ClientSession) -> None:
    _, job = await send(http, "POST", JOBS, BASE_JOB)
    stale = job["metadata"]["resourceVersion"]
    code, job = await send(http, "PATCH", f"{JOBS}/job", {"metadata": {"labels": {"a": "1"}}}, headers=MERGE)
    assert code == 200
    code, status = await send(http, "PUT", f"{JOBS}/job", with_changes(job, {"metadata.resourceVersion": stale}))
    assert (code, status["reason"]) == (409, "Conflict")
    assert "the object has been modified" in status["message"]
    patch = {"metadata": {"resourceVersion": stale, "labels": {"a": "2"}}}
    assert (await send(http, "PATCH", f"{JOBS}/job", patch, headers=MERGE))[0] == 409
    code, updated = await send(http, "PUT", f"{JOBS}/job", with_changes(job, {"spec.priority": "low"}))
    assert (code, updated["spec"]["priority"]) == (200, "low")
    # Custom resources allow no unconditional update.
    unconditional = with_changes(updated, {"metadata.resourceVersion": ""})
    code, status = await send(http, "PUT", f"{JOBS}/job", unconditional)
    assert (code, status["details"]["causes"][0]["field"]) == (422, "metadata.resourceVersion")


async def test_json_patch_test_operation_guards_like_kopf_expects(http: aiohttp.ClientSession) -> None:
    """kopf adds its finalizer with a JSON patch whose first op tests the resourceVersion: 422 if it moved."""
    _, job = await send(http, "POST", JOBS, BASE_JOB)
    rv = job["metadata"]["resourceVersion"]
    add = [{"op": "add", "path": "/metadata/finalizers", "value": ["x/y"]}]
    code, status = await send(
        http,
        "PATCH",
        f"{JOBS}/job",
        [{"op": "test", "path": "/metadata/resourceVersion", "value": "0"}, *add],
        headers=JSON_PATCH,
    )
    assert (code, status["reason"]) == (422, "Invalid")
    guarded = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}, *add]
    code, job = await send(http, "PATCH", f"{JOBS}/job", guarded, headers=JSON_PATCH)
    assert (code, job["metadata"]["finalizers"]) == (200, ["x/y"])
    ops = [
        {"op": "add", "path": "/metadata/finalizers/-", "value": "z/w"},
        {"op": "remove", "path": "/metadata/finalizers/0"},
        {"op": "add", "path": "/spec/priority", "value": "low"},
        {"op": "replace", "path": "/spec/priority", "value": "high"},
        {"op": "add", "path": "/metadata/annotations", "value": {"a~b/c": "1"}},
        {"op": "move", "from": "/metadata/annotations/a~0b~1c", "path": "/metadata/annotations/moved"},
        {"op": "copy", "from": "/spec/priority", "path": "/metadata/annotations/copied"},
    ]
    code, job = await send(http, "PATCH", f"{JOBS}/job", ops, headers=JSON_PATCH)
    assert code == 200
    assert (job["metadata"]["finalizers"], job["spec"]["priority"]) == (["z/w"], "high")
    assert job["metadata"]["annotations"] == {"moved": "1", "copied": "high"}
    missing = [{"op": "replace", "path": "/spec/nothing", "value": 1}]
    assert (await send(http, "PATCH", f"{JOBS}/job", missing, headers=JSON_PATCH))[0] == 422


async def test_patch_content_types(http: aiohttp.ClientSession) -> None:
    await send(http, "POST", CONFIGMAPS, {"metadata": {"name": "cm"}, "data": {"a": "1", "b": "2"}})
    await send(http, "POST", JOBS, BASE_JOB)
    code, cm = await send(http, "PATCH", f"{CONFIGMAPS}/cm", {"data": {"a": None, "c": "3"}}, headers=MERGE)
    assert (code, cm["data"]) == (200, {"b": "2", "c": "3"})
    strategic = {"Content-Type": "application/strategic-merge-patch+json"}
    code, cm = await send(http, "PATCH", f"{CONFIGMAPS}/cm", {"data": {"d": "4"}}, headers=strategic)
    assert (code, cm["data"]) == (200, {"b": "2", "c": "3", "d": "4"})
    # The API server has no strategic merge for custom resources...
    code, status = await send(http, "PATCH", f"{JOBS}/job", {"spec": {}}, headers=strategic)
    assert (code, status["reason"]) == (415, "UnsupportedMediaType")
    # ...and a merge patch sent as a JSON patch (kubernetes' CustomObjectsApi does that by default) is a 400.
    code, status = await send(http, "PATCH", f"{JOBS}/job", {"spec": {}}, headers=JSON_PATCH)
    assert (code, status["reason"]) == (400, "BadRequest")


async def test_status_is_a_separate_subresource(http: aiohttp.ClientSession) -> None:
    code, job = await send(http, "POST", JOBS, {**BASE_JOB, "status": {"phase": "Running"}})
    assert (code, "status" in job) == (201, False)  # status is ignored on create
    both = {"spec": {"priority": "high"}, "status": {"phase": "Failed"}}
    code, job = await send(http, "PATCH", f"{JOBS}/job", both, headers=MERGE)
    assert (job["spec"]["priority"], "status" in job) == ("high", False)
    code, job = await send(
        http,
        "PATCH",
        f"{JOBS}/job/status",
        {"spec": {"priority": "low"}, "status": {"phase": "Running"}},
        headers=MERGE,
    )
    assert (job["spec"]["priority"], job["status"]) == ("high", {"phase": "Running"})
    code, fetched = await send(http, "GET", f"{JOBS}/job/status")
    assert (code, fetched["status"]) == (200, {"phase": "Running"})


async def test_pods_and_services_get_the_api_servers_defaults(http: aiohttp.ClientSession) -> None:
    """An operator diffing the pod it wants against the stored one meets these fields in a cluster too."""
    wanted = pod("p")
    wanted["spec"]["containers"][0].update(image="trainer:1.0", resources={"limits": {"nvidia.com/gpu": 8}})
    code, stored = await send(http, "POST", PODS, wanted)
    spec, container = stored["spec"], stored["spec"]["containers"][0]
    assert (code, spec["restartPolicy"], spec["dnsPolicy"], spec["serviceAccountName"]) == (
        201,
        "Always",
        "ClusterFirst",
        "default",
    )
    assert (container["imagePullPolicy"], container["resources"]["requests"]) == ("IfNotPresent", {"nvidia.com/gpu": 8})
    assert {t["key"] for t in spec["tolerations"]} == {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/var/run/secrets/kubernetes.io/serviceaccount"]
    assert stored["status"] == {"phase": "Pending"}
    # Only images (and a few scheduling fields) of a pod may change.
    image = [{"op": "replace", "path": "/spec/containers/0/image", "value": "trainer:1.1"}]
    assert (await send(http, "PATCH", f"{PODS}/p", image, headers=JSON_PATCH))[0] == 200
    code, status = await send(http, "PATCH", f"{PODS}/p", {"spec": {"restartPolicy": "Never"}}, headers=MERGE)
    assert (code, status["details"]["causes"][0]["field"]) == (422, "spec")
    assert (await send(http, "PATCH", f"{PODS}/p", {"spec": {"nodeName": "dgx-1"}}, headers=MERGE))[0] == 200
    assert (await send(http, "PATCH", f"{PODS}/p", {"spec": {"nodeName": "dgx-2"}}, headers=MERGE))[0] == 422
    services = "/api/v1/namespaces/ml/services"
    _, plain = await send(http, "POST", services, {"metadata": {"name": "s"}, "spec": {"ports": [{"port": 29400}]}})
    _, headless = await send(http, "POST", services, {"metadata": {"name": "h"}, "spec": {"clusterIP": "None"}})
    assert re.fullmatch(r"10\.96\.\d+\.\d+", plain["spec"]["clusterIP"])
    assert plain["spec"]["ports"] == [{"port": 29400, "protocol": "TCP", "targetPort": 29400}]
    assert headless["spec"]["clusterIPs"] == ["None"]
    _, kept = await send(http, "PUT", f"{services}/s", {**plain, "spec": {"ports": plain["spec"]["ports"]}})
    assert kept["spec"]["clusterIP"] == plain["spec"]["clusterIP"]


# --------------------------------------------------------------------------------------------
# Validation of custom resources
# --------------------------------------------------------------------------------------------


async def test_an_invalid_training_job_is_422_with_field_paths(http: aiohttp.ClientSession, emulator: Emulator) -> None:
    bad = with_changes(BASE_JOB, {"spec.elastic.minNodes": 3, "spec.elastic.maxNodes": 2, "spec.priority": "urgent"})
    code, status = await send(http, "POST", JOBS, bad)
    assert (code, status["reason"]) == (422, "Invalid")
    assert status["details"]["kind"] == "DGXTrainingJob"
    causes = {c["field"]: c for c in status["details"]["causes"]}
    assert set(causes) == {"spec.elastic.minNodes", "spec.priority"}
    assert causes["spec.elastic.minNodes"]["message"] == "must be <= spec.elastic.maxNodes"
    assert causes["spec.priority"]["reason"] == "FieldValueNotSupported"
    assert status["message"].startswith('DGXTrainingJob.kubedgx.io "job" is invalid: [')
    assert emulator.get("dgxtrainingjobs", "ml", "job") is None
    # Updates are validated too, and a valid job is accepted.
    assert (await send(http, "POST", JOBS, BASE_JOB))[0] == 201
    code, status = await send(
        http, "PATCH", f"{JOBS}/job", {"spec": {"elastic": {"minNodes": 3, "maxNodes": 2}}}, headers=MERGE
    )
    assert (code, [c["field"] for c in status["details"]["causes"]]) == (422, ["spec.elastic.minNodes"])
    code, status = await send(http, "PATCH", f"{JOBS}/job/status", {"status": {"phase": "Dancing"}}, headers=MERGE)
    assert (code, status["details"]["causes"][0]["field"]) == (422, "status.phase")


async def test_unknown_fields_are_pruned_with_a_warning_or_refused_when_strict(http: aiohttp.ClientSession) -> None:
    typo = with_changes(BASE_JOB, {"spec.elastic.minNode": 2})
    async with http.post(JOBS, json=typo) as response:
        job = await response.json()
        assert response.status == 201
        assert response.headers.getall("Warning") == ['299 - "unknown field \\"spec.elastic.minNode\\""']
    assert job["spec"].get("elastic") == {}
    code, status = await send(
        http, "POST", JOBS, with_changes(typo, {"metadata.name": "strict"}), params={"fieldValidation": "Strict"}
    )
    assert (code, status["message"]) == (400, 'strict decoding error: unknown field "spec.elastic.minNode"')


async def test_admission_hooks_can_deny(emulator: Emulator) -> None:
    def no_spot(operation: str, kind: Any, new: Body, old: Body | None) -> None:
        if kind.plural == "dgxtrainingjobs" and new["spec"]["instance"].endswith(".spot"):
            raise ApiError(403, "Forbidden", f"{operation}: spot capacity is closed")

    emulator.admission.append(no_spot)
    emulator.create("dgxtrainingjobs", BASE_JOB)
    with pytest.raises(ApiError, match="spot capacity is closed") as denied:
        emulator.patch("dgxtrainingjobs", "ml", "job", {"spec": {"instance": "dgxh100.80g.8.spot"}})
    assert denied.value.code == 403


async def test_a_dry_run_create_is_checked_and_admitted_but_never_stored(
    http: aiohttp.ClientSession, emulator: Emulator
) -> None:
    """The webhook's dry-run of a job's children (kube.Kube.dry_run_create) meets the API server's order: the
    admission hooks run, the name is checked after them, and nothing is written or watched."""
    seen: list[str] = []

    def no_host_path(operation: str, kind: Any, new: Body, old: Body | None) -> None:
        seen.append(new["metadata"]["name"])
        if kind.plural == "pods" and any("hostPath" in v for v in new["spec"].get("volumes", [])):
            raise ApiError(403, "Forbidden", f'pods "{new["metadata"]["name"]}" is forbidden: hostPath volumes')

    emulator.admission.append(no_host_path)
    first = int(emulator.create("pods", pod("first"))["metadata"]["resourceVersion"])
    code, created = await send(http, "POST", f"{PODS}?dryRun=All", pod("p"))
    assert code == 201
    assert created["metadata"]["uid"]
    assert created["spec"]["restartPolicy"] == "Always"  # defaulted as a stored pod would be
    assert emulator.get("pods", "ml", "p") is None
    assert [c for c in emulator.calls("create", "pods") if c.params.get("dryRun") == "All"]
    host_path = with_changes(pod("h"), {"spec.volumes": [{"name": "cache", "hostPath": {"path": "/raid"}}]})
    code, status = await send(http, "POST", f"{PODS}?dryRun=All", host_path)
    assert (code, status["message"]) == (403, 'pods "h" is forbidden: hostPath volumes')
    emulator.create("pods", pod("taken"))
    code, status = await send(http, "POST", f"{PODS}?dryRun=All", host_path | {"metadata": {"name": "taken"}})
    assert code == 403  # admission first, as the API server orders it ...
    code, status = await send(http, "POST", f"{PODS}?dryRun=All", pod("taken"))
    assert (code, status["reason"]) == (409, "AlreadyExists")  # ... then the name
    code, status = await send(http, "POST", f"{PODS}?dryRun=Some", pod("q"))
    assert (code, status["reason"]) == (422, "Invalid")
    assert emulator.get("pods", "ml", "q") is None
    last = int(emulator.create("pods", pod("last"))["metadata"]["resourceVersion"])
    assert seen == ["first", "p", "h", "taken", "taken", "taken", "last"]
    # Only the real creates were written: the dry-runs took no resourceVersion (no write, no watch event).
    assert int(emulator.get("pods", "ml", "taken")["metadata"]["resourceVersion"]) == first + 1
    assert last == first + 2


# --------------------------------------------------------------------------------------------
# Deletion: finalizers, garbage collection, pods, namespaces
# --------------------------------------------------------------------------------------------


async def test_finalizers_hold_an_object_with_a_deletion_timestamp(
    http: aiohttp.ClientSession, emulator: Emulator
) -> None:
    await send(http, "POST", JOBS, with_changes(BASE_JOB, {"metadata.finalizers": ["a/b", "c/d"]}))
    code, job = await send(http, "DELETE", f"{JOBS}/job")
    assert code == 200
    assert job["metadata"]["deletionTimestamp"]
    assert job["metadata"]["deletionGracePeriodSeconds"] == 0
    code, again = await send(http, "DELETE", f"{JOBS}/job")  # deleting a terminating object changes nothing
    assert (code, again["metadata"]["resourceVersion"]) == (200, job["metadata"]["resourceVersion"])
    code, status = await send(
        http, "PATCH", f"{JOBS}/job", {"metadata": {"finalizers": ["a/b", "c/d", "e/f"]}}, headers=MERGE
    )
    assert (code, status["details"]["causes"][0]["reason"]) == (422, "FieldValueForbidden")  # none may be added now
    code, job = await send(http, "PATCH", f"{JOBS}/job", {"metadata": {"finalizers": ["c/d"]}}, headers=MERGE)
    assert (code, job["metadata"]["finalizers"]) == (200, ["c/d"])
    code, job = await send(http, "PATCH", f"{JOBS}/job", {"metadata": {"finalizers": None}}, headers=MERGE)
    assert code == 200
    assert emulator.get("dgxtrainingjobs", "ml", "job") is None
    assert (await send(http, "GET", f"{JOBS}/job"))[0] == 404


async def test_dependents_are_garbage_collected_with_their_owner(emulator: Emulator) -> None:
    job = emulator.create("dgxtrainingjobs", BASE_JOB)
    other = emulator.create("configmaps", {"metadata": {"name": "other"}}, namespace="ml")
    emulator.create("pods", pod("only", ownerReferences=owned_by(job)))
    emulator.create("pods", pod("shared", ownerReferences=owned_by(job) + owned_by(other, block=False)))
    emulator.create("pods", pod("grandchild", ownerReferences=owned_by(emulator.get("pods", "ml", "only") or {})))
    assert emulator.delete("dgxtrainingjobs", "ml", "job") is None
    assert emulator.get("pods", "ml", "only") is None
    assert emulator.get("pods", "ml", "grandchild") is None  # cascades
    shared = emulator.get("pods", "ml", "shared")
    assert shared is not None
    assert [ref["uid"] for ref in shared["metadata"]["ownerReferences"]] == [other["metadata"]["uid"]]


async def test_orphan_and_foreground_propagation(emulator: Emulator) -> None:
    job = emulator.create("dgxtrainingjobs", BASE_JOB)
    emulator.create("pods", pod("kept", ownerReferences=owned_by(job)))
    emulator.delete("dgxtrainingjobs", "ml", "job", propagation="Orphan")
    kept = emulator.get("pods", "ml", "kept")
    assert kept is not None
    assert "ownerReferences" not in kept["metadata"]
    # Foreground: the owner waits, Terminating, until its blocking dependents are gone.
    job = emulator.create("dgxtrainingjobs", BASE_JOB)
    emulator.create("pods", pod("slow", ownerReferences=owned_by(job), finalizers=["x/y"]))
    owner = emulator.delete("dgxtrainingjobs", "ml", "job", propagation="Foreground")
    assert owner is not None
    assert owner["metadata"]["finalizers"] == ["foregroundDeletion"]
    assert (emulator.get("pods", "ml", "slow") or {})["metadata"]["deletionTimestamp"]
    emulator.patch("pods", "ml", "slow", {"metadata": {"finalizers": []}})
    assert emulator.get("pods", "ml", "slow") is None
    assert emulator.get("dgxtrainingjobs", "ml", "job") is None


async def test_pods_go_at_once_or_stay_terminating_when_held(http: aiohttp.ClientSession, emulator: Emulator) -> None:
    await send(http, "POST", PODS, pod("quick"))
    code, gone = await send(http, "DELETE", f"{PODS}/quick")
    assert (code, gone["metadata"]["name"]) == (200, "quick")
    assert emulator.get("pods", "ml", "quick") is None
    emulator.hold_pod_deletion = True
    await send(http, "POST", PODS, pod("slow"))
    code, terminating = await send(http, "DELETE", f"{PODS}/slow", params={"gracePeriodSeconds": "10"})
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 10
    assert emulator.get("pods", "ml", "slow") is not None
    emulator.finish_pod_deletion("ml", "slow")
    assert emulator.get("pods", "ml", "slow") is None


async def test_deleting_a_namespace_deletes_its_contents(emulator: Emulator) -> None:
    emulator.create_namespace("scratch")
    emulator.create("configmaps", {"metadata": {"name": "cm"}}, namespace="scratch")
    emulator.create("pods", pod("held", namespace="scratch", finalizers=["x/y"]))
    namespace = emulator.delete("namespaces", None, "scratch")
    assert namespace is not None
    assert namespace["status"]["phase"] == "Terminating"
    assert emulator.get("configmaps", "scratch", "cm") is None
    with pytest.raises(ApiError, match="being terminated"):
        emulator.create("configmaps", {"metadata": {"name": "late"}}, namespace="scratch")
    emulator.patch("pods", "scratch", "held", {"metadata": {"finalizers": None}})
    assert emulator.get("namespaces", None, "scratch") is None


async def test_deletecollection_honours_selectors(http: aiohttp.ClientSession, emulator: Emulator) -> None:
    for name, app in (("a", "x"), ("b", "x"), ("c", "y")):
        emulator.create("pods", pod(name, {"app": app}))
    code, status = await send(http, "DELETE", PODS, params={"labelSelector": "app=x"})
    assert (code, status["status"]) == (200, "Success")
    assert [p["metadata"]["name"] for p in emulator.select("pods", "ml")] == ["c"]


# --------------------------------------------------------------------------------------------
# List
# --------------------------------------------------------------------------------------------

LABELLED = {"a": {"app": "web", "tier": "front"}, "b": {"app": "web", "tier": "back"}, "c": {"app": "db"}, "d": {}}


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("app=web", "ab"),
        ("app==web", "ab"),
        ("app!=web", "cd"),
        ("app in (web, db)", "abc"),
        ("tier notin (front)", "bcd"),
        ("tier", "ab"),
        ("!tier", "cd"),
        ("app=web,tier!=front", "b"),
        ("app in (web),!tier", ""),
    ],
)
async def test_label_selectors(http: aiohttp.ClientSession, emulator: Emulator, selector: str, names: str) -> None:
    for name, labels in LABELLED.items():
        emulator.create("pods", pod(name, labels))
    code, listed = await send(http, "GET", PODS, params={"labelSelector": selector})
    assert code == 200
    assert "".join(item["metadata"]["name"] for item in listed["items"]) == names
    assert "".join(p["metadata"]["name"] for p in emulator.select("pods", "ml", labels=selector)) == names


async def test_bad_selectors_are_400(http: aiohttp.ClientSession) -> None:
    assert (await send(http, "GET", PODS, params={"labelSelector": "app in web"}))[0] == 400
    assert (await send(http, "GET", PODS, params={"fieldSelector": "spec.image=x"}))[0] == 400
    with pytest.raises(ApiError):
        label_selector("=x")


async def test_list_field_selectors_scope_and_resource_version(http: aiohttp.ClientSession, emulator: Emulator) -> None:
    emulator.create_namespace("other")
    for namespace in ("ml", "other"):
        for name in ("p1", "p2"):
            emulator.create("pods", pod(name, namespace=namespace))
    code, everything = await send(http, "GET", "/api/v1/pods")
    assert code == 200
    assert everything["kind"] == "PodList"
    assert [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in everything["items"]] == [
        ("ml", "p1"),
        ("ml", "p2"),
        ("other", "p1"),
        ("other", "p2"),
    ]
    assert "kind" not in everything["items"][0]  # typed lists carry kind on the list only
    newest = max(int(i["metadata"]["resourceVersion"]) for i in everything["items"])
    assert int(everything["metadata"]["resourceVersion"]) >= newest
    _, some = await send(
        http, "GET", "/api/v1/pods", params={"fieldSelector": "metadata.name=p2,metadata.namespace!=ml"}
    )
    assert [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in some["items"]] == [("other", "p2")]
    _, ns_only = await send(http, "GET", PODS)
    assert len(ns_only["items"]) == 2


async def test_list_pages_with_limit_and_continue(http: aiohttp.ClientSession, emulator: Emulator) -> None:
    for i in range(5):
        emulator.create("pods", pod(f"p{i}"))
    names: list[str] = []
    params = {"limit": "2"}
    for _ in range(3):
        _, page = await send(http, "GET", PODS, params=params)
        names += [i["metadata"]["name"] for i in page["items"]]
        params = {"limit": "2", "continue": page["metadata"].get("continue", "")}
    assert names == [f"p{i}" for i in range(5)]
    assert not params["continue"]


# --------------------------------------------------------------------------------------------
# Watch
# --------------------------------------------------------------------------------------------


async def test_watch_streams_every_change_in_order(http: aiohttp.ClientSession, emulator: Emulator) -> None:
    emulator.create("pods", pod("existing"))
    async with watching(http, PODS) as next_event:
        first = await next_event()
        assert first is not None
        assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "existing")
        emulator.create("pods", pod("new"))
        emulator.patch_status("pods", "ml", "new", {"phase": "Running"})
        emulator.delete("pods", "ml", "new")
        events = [await next_event() for _ in range(3)]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events if e] == [
        ("ADDED", "new"),
        ("MODIFIED", "new"),
        ("DELETED", "new"),
    ]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events if e]
    assert versions == sorted(set(versions))


async def test_watch_resumes_from_a_resource_version_and_expires_old_ones(
    http: aiohttp.ClientSession, emulator: Emulator
) -> None:
    start = emulator.create("pods", pod("a"))["metadata"]["resourceVersion"]
    emulator.patch("pods", "ml", "a", {"metadata": {"labels": {"x": "1"}}})
    emulator.create("configmaps", {"metadata": {"name": "noise"}}, namespace="ml")
    emulator.create("pods", pod("b"))
    async with watching(http, PODS, resourceVersion=start) as next_event:
        replayed = [await next_event(), await next_event()]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in replayed if e] == [("MODIFIED", "a"), ("ADDED", "b")]
    emulator.compact()
    async with watching(http, PODS, resourceVersion=start) as next_event:
        error = await next_event()
        assert error is not None
        assert (error["type"], error["object"]["code"], error["object"]["reason"]) == ("ERROR", 410, "Expired")
        assert await next_event() is None


async def test_watch_honours_namespace_labels_and_selector_transitions(
    http: aiohttp.ClientSession, emulator: Emulator
) -> None:
    emulator.create_namespace("other")
    async with watching(http, PODS, labelSelector="app=web") as next_event:
        emulator.create("pods", pod("elsewhere", {"app": "web"}, namespace="other"))
        emulator.create("pods", pod("db", {"app": "db"}))
        emulator.create("pods", pod("web", {"app": "web"}))
        emulator.patch("pods", "ml", "web", {"metadata": {"labels": {"app": "db"}}})  # leaves the selector
        emulator.patch("pods", "ml", "db", {"metadata": {"labels": {"app": "web"}}})  # enters it
        events = [await next_event() for _ in range(3)]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events if e] == [
        ("ADDED", "web"),
        ("DELETED", "web"),
        ("ADDED", "db"),
    ]


async def test_watch_timeout_bookmarks_and_initial_events(http: aiohttp.ClientSession, emulator: Emulator) -> None:
    emulator.create("pods", pod("a"))
    emulator.bookmark_interval = 0.05
    params = {"timeoutSeconds": "1", "allowWatchBookmarks": "true", "sendInitialEvents": "true"}
    events: list[Body] = []
    async with watching(http, PODS, **params) as next_event:
        while (event := await next_event(timeout=3)) is not None:  # until the server's timeout ends the stream
            events.append(event)
    types = [e["type"] for e in events]
    assert types[:2] == ["ADDED", "BOOKMARK"]
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert len(types) > 3
    assert set(types[2:]) == {"BOOKMARK"}  # idle: periodic bookmarks at the current resourceVersion
    assert events[-1]["object"]["metadata"]["resourceVersion"] == events[0]["object"]["metadata"]["resourceVersion"]


async def test_dropped_watches_end_and_can_reconnect(http: aiohttp.ClientSession, emulator: Emulator) -> None:
    async with watching(http, PODS) as first, watching(http, CONFIGMAPS) as second:
        await emulator.wait_for(lambda: emulator.open_watches() == 2)
        assert emulator.drop_watches() == 2
        assert await first() is None
        assert await second() is None
    await emulator.wait_for(lambda: emulator.open_watches() == 0)


async def test_kubernetes_asyncio_watch_works(api_client: client.ApiClient, emulator: Emulator) -> None:
    """The Python clients send watch=True (capitalised); the API server parses it like Go's ParseBool."""
    core = client.CoreV1Api(api_client)
    await core.create_namespaced_pod("ml", pod("p"))  # type: ignore[arg-type]
    seen: list[tuple[str, str]] = []
    async with watch.Watch().stream(core.list_namespaced_pod, "ml", timeout_seconds=5) as stream:
        async for event in stream:
            seen.append((event["type"], event["object"].metadata.name))
            if len(seen) == 1:
                emulator.delete("pods", "ml", "p")
            else:
                break
    assert seen == [("ADDED", "p"), ("DELETED", "p")]


# --------------------------------------------------------------------------------------------
# Discovery, CRDs, events
# --------------------------------------------------------------------------------------------


async def test_discovery_lists_resources_verbs_and_status(http: aiohttp.ClientSession) -> None:
    _, core = await send(http, "GET", "/api/v1")
    by_name = {r["name"]: r for r in core["resources"]}
    assert core["groupVersion"] == "v1"
    assert {"pods", "pods/status", "services", "configmaps", "events", "namespaces", "secrets"} <= set(by_name)
    assert {"persistentvolumeclaims", "persistentvolumeclaims/status"} <= set(by_name)
    assert set(by_name["pods"]["verbs"]) == {
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    }
    assert sorted(by_name["pods/status"]["verbs"]) == ["get", "patch", "update"]
    assert by_name["namespaces"]["namespaced"] is False
    _, ours = await send(http, "GET", "/apis/kubedgx.io/v1alpha1")
    by_name = {r["name"]: r for r in ours["resources"]}
    assert set(by_name) == {
        "dgxtrainingjobs",
        "dgxtrainingjobs/status",
        "dgxdatamounts",
        "dgxdatamounts/status",
        "dgxbudgets",
        "dgxbudgets/status",
        "dgxlimits",
    }
    assert (by_name["dgxtrainingjobs"]["kind"], by_name["dgxtrainingjobs"]["namespaced"]) == ("DGXTrainingJob", True)
    _, groups = await send(http, "GET", "/apis")
    assert {"kubedgx.io", "apiextensions.k8s.io", "coordination.k8s.io"} <= {g["name"] for g in groups["groups"]}
    assert (await send(http, "GET", "/apis/kopf.dev/v1"))[0] == 404  # kopf runs standalone: no peering


async def test_a_posted_crd_is_served_and_takes_its_objects_when_deleted(
    http: aiohttp.ClientSession, emulator: Emulator
) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": {"type": "object", "properties": {"size": {"type": "integer"}}}},
                        }
                    },
                }
            ],
        },
    }
    code, created = await send(http, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    assert code == 201
    assert {c["type"] for c in created["status"]["conditions"]} == {"NamesAccepted", "Established"}
    widgets = "/apis/example.com/v1/namespaces/ml/widgets"
    assert (await send(http, "POST", widgets, {"metadata": {"name": "w"}, "spec": {"size": "big"}}))[0] == 422
    assert (await send(http, "POST", widgets, {"metadata": {"name": "w"}, "spec": {"size": 3}}))[0] == 201
    code, _ = await send(http, "DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com")
    assert code == 200
    assert (await send(http, "GET", "/apis/example.com/v1"))[0] == 404
    assert emulator.get("customresourcedefinitions", None, "widgets.example.com") is None


async def test_events_are_stored_and_listable(http: aiohttp.ClientSession, emulator: Emulator) -> None:
    """kopf posts core/v1 events without apiVersion/kind and with a generateName, then may patch them."""
    event = {
        "metadata": {"namespace": "ml", "generateName": "kopf-event-"},
        "type": "Normal",
        "reason": "Logging",
        "message": "Handler succeeded.",
        "involvedObject": {"kind": "DGXTrainingJob", "name": "job", "namespace": "ml"},
    }
    code, posted = await send(http, "POST", "/api/v1/namespaces/ml/events", event)
    assert (code, posted["kind"], posted["apiVersion"]) == (201, "Event", "v1")
    name = posted["metadata"]["name"]
    code, patched = await send(http, "PATCH", f"/api/v1/namespaces/ml/events/{name}", {"count": 2}, headers=MERGE)
    assert (code, patched["count"]) == (200, 2)
    listed = emulator.select("events", "ml", fields={"involvedObject.name": "job"})
    assert [e["reason"] for e in listed] == ["Logging"]


# --------------------------------------------------------------------------------------------
# Test controls: faults, the request log, waiting
# --------------------------------------------------------------------------------------------


async def test_fault_injection(api_client: client.ApiClient, emulator: Emulator) -> None:
    core = client.CoreV1Api(api_client)
    throttle = emulator.fail("create", "pods", code=429, retry_after=7)
    broken = emulator.fail("get", "pods", code=500, times=2)
    conflicting = emulator.fail("patch", "pods", "status", code=409)
    with pytest.raises(ApiException) as exc:
        await core.create_namespaced_pod("ml", pod("p"))  # type: ignore[arg-type]
    assert exc.value.status == 429
    assert dict(exc.value.headers or {})["Retry-After"] == "7"
    assert json.loads(exc.value.body or b"{}")["details"]["retryAfterSeconds"] == 7
    await core.create_namespaced_pod("ml", pod("p"))  # type: ignore[arg-type]  # the fault is used up
    for _ in range(2):
        with pytest.raises(ApiException, match="500"):
            await core.read_namespaced_pod("p", "ml")
    await core.patch_namespaced_pod("p", "ml", {"metadata": {"labels": {"a": "b"}}})  # main resource: no fault
    with pytest.raises(ApiException) as exc:
        await core.patch_namespaced_pod_status("p", "ml", {"status": {"phase": "Running"}})
    assert exc.value.status == 409
    assert (await core.read_namespaced_pod("p", "ml")).metadata.labels == {"a": "b"}
    assert [f.remaining for f in (throttle, broken, conflicting)] == [0, 0, 0]
    assert [c.status for c in emulator.log if c.fault] == [429, 500, 500, 409]


async def test_request_log_records_verbs_and_outcomes(http: aiohttp.ClientSession, emulator: Emulator) -> None:
    await send(http, "POST", JOBS, BASE_JOB)
    await send(http, "POST", JOBS, BASE_JOB)
    await send(http, "PATCH", f"{JOBS}/job/status", {"status": {"phase": "Running"}}, headers=MERGE)
    await send(http, "GET", JOBS)
    await send(http, "DELETE", f"{JOBS}/job")
    assert [(c.verb, c.resource, c.subresource, c.status) for c in emulator.log] == [
        ("create", "dgxtrainingjobs", None, 201),
        ("create", "dgxtrainingjobs", None, 409),
        ("patch", "dgxtrainingjobs", "status", 200),
        ("list", "dgxtrainingjobs", None, 200),
        ("delete", "dgxtrainingjobs", None, 200),
    ]
    assert [c.write for c in emulator.log] == [True, True, True, False, True]
    assert len(emulator.calls("patch", "dgxtrainingjobs.kubedgx.io", subresource="status")) == 1
    assert [c.verb for c in emulator.calls(succeeded=False)] == ["create"]
    assert emulator.log[0].namespace == "ml"
    assert str(emulator.log[1]) == f"POST {JOBS} -> 409"


async def test_wait_for_wakes_on_changes_and_explains_timeouts(emulator: Emulator) -> None:
    async def later() -> None:  # runs only once wait_for_object below has checked and is waiting
        emulator.create("pods", pod("p"))

    creator = asyncio.create_task(later())
    created = await emulator.wait_for_object("pods", "ml", "p", timeout=2)
    await creator
    assert created["metadata"]["name"] == "p"
    with pytest.raises(TimeoutError, match=r"(?s)pods ml/q exists.*last requests"):
        await emulator.wait_for_object("pods", "ml", "q", timeout=0.05)


async def test_scripted_kmock_reactions_take_precedence(http: aiohttp.ClientSession, emulator: Emulator) -> None:
    """kmock's DSL still works on the emulator: a scripted reply wins over the emulated API, and is logged."""
    emulator.create("pods", pod("p"))
    emulator[f"get {PODS}/p"] << 418
    async with http.get(f"{PODS}/p") as response:
        assert response.status == 418
    assert emulator.log[-1].status == 418
    assert (await send(http, "GET", f"{PODS}/p/status"))[0] == 200  # other paths are still emulated
    assert (await send(http, "GET", "/version"))[1]["minor"] == "33"


@pytest.mark.filterwarnings("ignore::pytest.PytestWarning")  # a sync test under the module's asyncio mark
def test_routes_are_parsed_like_the_api_server_does() -> None:
    assert parse_route("/api/v1/namespaces") == parse_route("/api/v1/namespaces/")
    route = parse_route("/api/v1/namespaces/ml")
    assert route is not None
    assert (route.plural, route.name, route.namespace) == ("namespaces", "ml", None)
    route = parse_route("/api/v1/namespaces/ml/status")
    assert route is not None
    assert (route.plural, route.name, route.subresource) == ("namespaces", "ml", "status")
    route = parse_route("/apis/kubedgx.io/v1alpha1/namespaces/ml/dgxtrainingjobs/job/status")
    assert route is not None
    assert (route.group, route.namespace, route.plural, route.name, route.subresource) == (
        "kubedgx.io",
        "ml",
        "dgxtrainingjobs",
        "job",
        "status",
    )
    assert parse_route("/version") is None


# --------------------------------------------------------------------------------------------
# The real kopf operator against the emulator
# --------------------------------------------------------------------------------------------


def phase(expected: str) -> Callable[[Body], bool]:
    return lambda obj: obj.get("status", {}).get("phase") == expected


async def test_demo_operator_full_lifecycle(emulator: Emulator, run_operator: RunOperator) -> None:
    await run_operator(DEMO, wait_for=("dgxtrainingjobs", "pods"))
    job = emulator.create("dgxtrainingjobs", BASE_JOB)
    worker = await emulator.wait_for_object("pods", "ml", worker_name("job"))
    assert [(r["uid"], r["controller"]) for r in worker["metadata"]["ownerReferences"]] == [
        (job["metadata"]["uid"], True)
    ]
    job = await emulator.wait_for_object("dgxtrainingjobs", "ml", "job", phase("Pending"))
    assert job["metadata"]["finalizers"] == [KOPF_FINALIZER]

    emulator.patch_status("pods", "ml", worker_name("job"), {"phase": "Running"})  # play the kubelet
    await emulator.wait_for_object("dgxtrainingjobs", "ml", "job", phase("Running"))

    emulator.patch("dgxtrainingjobs", "ml", "job", {"spec": {"priority": "high"}})  # generation 2: the timer follows
    await emulator.wait_for_object("dgxtrainingjobs", "ml", "job", lambda j: j["status"].get("observedGeneration") == 2)
    await emulator.wait_for(lambda: emulator.select("events", "ml", fields={"reason": "WorkerCreated"}))

    emulator.delete("dgxtrainingjobs", "ml", "job")
    await emulator.wait_for_absence("dgxtrainingjobs", "ml", "job")
    await emulator.wait_for_absence("pods", "ml", worker_name("job"))

    # kopf's own writes: finalizer by JSON patch, progress by merge patch, status through /status.
    assert emulator.calls("patch", "dgxtrainingjobs", subresource="status", succeeded=True)
    assert any(c.content_type == "application/json-patch+json" for c in emulator.calls("patch", "dgxtrainingjobs"))
    assert emulator.calls("create", "pods", succeeded=True)
    assert emulator.calls("create", "events", succeeded=True)
    assert not [c for c in emulator.calls(succeeded=False) if c.verb != "create"], emulator.describe()


async def test_demo_operator_recovers_from_dropped_watches_and_faults(
    emulator: Emulator, run_operator: RunOperator
) -> None:
    await run_operator(DEMO, wait_for=("dgxtrainingjobs", "pods"))
    emulator.drop_watches()
    await emulator.wait_for(lambda: emulator.open_watches("dgxtrainingjobs") and emulator.open_watches("pods"))
    failed_create = emulator.fail("create", "pods", code=500)  # the handler fails and kopf retries it
    throttled = emulator.fail("patch", "dgxtrainingjobs", "status", code=429, retry_after=0)  # kopf's client retries
    emulator.create("dgxtrainingjobs", BASE_JOB)
    await emulator.wait_for_object("pods", "ml", worker_name("job"))
    await emulator.wait_for_object("dgxtrainingjobs", "ml", "job", phase("Pending"))
    assert (failed_create.remaining, throttled.remaining) == (0, 0)
    emulator.drop_watches()
    emulator.patch_status("pods", "ml", worker_name("job"), {"phase": "Succeeded"})  # while nobody watches
    await emulator.wait_for_object("dgxtrainingjobs", "ml", "job", phase("Succeeded"))


async def test_demo_operator_logs_in_and_stops_cleanly(emulator: Emulator, run_operator: RunOperator) -> None:
    run = await run_operator(DEMO, wait_for=("dgxtrainingjobs",))
    await run.stop()
    assert run.task.done()
    assert emulator.open_watches() == 0
    first = emulator.log[0]
    assert (first.method, first.status) == ("GET", 200)  # discovery, with the kubeconfig's credentials


async def test_a_body_with_nan_is_400_as_the_apiservers_decoder_says(http: aiohttp.ClientSession) -> None:
    """Python's json writes NaN and Infinity; Go's decoder refuses them, and so does the emulator."""
    created = await http.post(JOBS, json=BASE_JOB)
    assert created.status == 201
    async with http.patch(
        f"{JOBS}/job/status",
        data='{"status": {"progress": {"loss": NaN}}}',
        headers={"Content-Type": "application/merge-patch+json"},
    ) as resp:
        assert resp.status == 400
        assert "not JSON" in (await resp.json())["message"]
