"""The validating webhook as the API server talks to it: kopf's HTTP server in the running operator, fed
AdmissionReview v1 requests over loopback.

The operator runs in-process against the emulator with a plain-HTTP webhook on 127.0.0.1 (``WebhookConfig(
insecure=True)``, which ``admission.setup`` turns into ``admission.WebhookServer``, kopf's). kopf serves every
validating handler at ``/<handler id>``: ``/validate-dgxtrainingjob`` and ``/validate-dgxdatamount``
(kopf/_kits/webhooks.py routes ``POST {path}/{id}``; kopf/_core/engines/admission.py runs only the handlers
whose id is that ``id``, and appends it to the server's URL in the webhook configurations it manages).

Readiness is an event, not a poll: the ``webhook`` fixture's (conftest.py) ``admission.WebhookServer``
subclass resolves a future with the client config kopf's server yields, which it does right after its
socket is listening.

The operator gets a registry of its own (admission_helpers.py): ``dgx_operator.runtime.handlers`` and
``dgx_operator.runtime.webhooks`` are (re)imported while kopf's default registry points at a fresh one. Importing
``dgx_operator.runtime.webhooks`` into kopf's default registry instead would make every later test of this session
that runs ``dgx_operator.runtime.handlers`` without a webhook server crash at startup ("Admission handlers exist, but no
admission server/tunnel is configured").
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from dgx_operator.webhook import admission
from tests.conftest import BASE_JOB, BASE_MOUNT, DELETE, with_changes
from tests.integration.admission_helpers import JOB_PATH, MIB, MOUNT_PATH, Body, Webhook, padded, review_request, stored
from tests.integration.emulator import ApiError, Emulator

pytestmark = pytest.mark.asyncio

STARTED = "2024-05-01T12:00:00Z"
#: BASE_JOB, run once: restartPolicy Never on norm capacity cannot be restarted in a new pod, so an allowed review
#: of it carries no checkpoint warning (validation/durability.py; its own tests are at the end of this file).
JOB = with_changes(BASE_JOB, {"spec.restartPolicy": "Never"})


def running(body: Body) -> Body:
    return with_changes(body, {"status": {"phase": "Running", "startTime": STARTED}})


def data_job(output_dir: str) -> Body:
    return with_changes(
        JOB, {"spec.dataMounts": [{"name": "data", "mountPath": "/data"}], "spec.trainer.output.dir": output_dir}
    )


# -- the server and its paths -----------------------------------------------------------------------


async def test_the_webhook_listens_where_the_config_says_in_plain_http(webhook: Webhook) -> None:
    """``WebhookConfig(host, port, insecure=True)`` reaches kopf: plain HTTP on that address, no CA bundle."""
    assert webhook.client_config == {"url": f"http://127.0.0.1:{webhook.port}"}
    async with webhook.http.get(webhook.url + JOB_PATH) as response:
        assert response.status == 405  # the server answers; kopf routes only POST


async def test_each_handler_is_served_at_its_id(webhook: Webhook) -> None:
    await webhook.allowed(JOB_PATH, "CREATE", stored(JOB))
    await webhook.allowed(MOUNT_PATH, "CREATE", stored(BASE_MOUNT))
    job_errors = await webhook.refused(JOB_PATH, "CREATE", stored(with_changes(JOB, {"spec.typo": 1})))
    mount_errors = await webhook.refused(MOUNT_PATH, "CREATE", stored(with_changes(BASE_MOUNT, {"spec.typo": 1})))
    assert job_errors == mount_errors == ["spec.typo: unknown field"]


async def test_a_path_selects_its_handler_only(webhook: Webhook) -> None:
    """kopf runs only the handler named by the path: an invalid job sent to the mount's path (or to a path no
    handler has) meets no handler and is allowed. The webhook configuration must route each kind to its own
    path; kopf writes such configurations itself only with ``settings.admission.managed``, which kubedgx
    leaves off (the chart installs them)."""
    invalid = stored(with_changes(JOB, {"spec.instance": "dgxv100.32g.8.norm"}))
    await webhook.refused(JOB_PATH, "CREATE", invalid)
    await webhook.allowed(MOUNT_PATH, "CREATE", invalid)
    await webhook.allowed("/validate-something-else", "CREATE", invalid)


# -- DGXTrainingJob -----------------------------------------------------------------------------------


async def test_a_schema_error_is_refused_with_its_field(webhook: Webhook) -> None:
    job = stored(with_changes(JOB, {"spec.elastic.minNodes": "two", "spec.elastic.rendezvous.port": 80}))
    assert await webhook.refused(JOB_PATH, "CREATE", job) == [
        'spec.elastic.minNodes: must be of type integer, got string "two"',
        "spec.elastic.rendezvous.port: should be greater than or equal to 1024 (got 80)",
    ]


async def test_a_cel_cross_field_rule_is_refused_with_its_field(webhook: Webhook) -> None:
    job = stored(with_changes(JOB, {"spec.elastic.minNodes": 3, "spec.elastic.maxNodes": 2}))
    assert await webhook.refused(JOB_PATH, "CREATE", job) == ["spec.elastic.minNodes: must be <= spec.elastic.maxNodes"]
    await webhook.allowed(JOB_PATH, "CREATE", stored(with_changes(job, {"spec.elastic.maxNodes": 3})))


async def test_an_instance_outside_the_catalog_is_refused(webhook: Webhook) -> None:
    job = stored(with_changes(JOB, {"spec.instance": "dgxv100.32g.8.norm"}))
    (line,) = await webhook.refused(JOB_PATH, "CREATE", job)
    assert line.startswith("spec.instance: unknown instance type 'dgxv100.32g.8.norm': no GPU family 'v100.32g'")


async def test_changing_the_instance_of_a_running_job_is_refused(webhook: Webhook) -> None:
    old = running(stored(JOB, resourceVersion="7", generation=1))
    new = with_changes(old, {"spec.instance": "dgxh100.80g.8.norm", "metadata.generation": 2})
    assert await webhook.refused(JOB_PATH, "UPDATE", new, old) == [
        "spec.instance: cannot change while the job is Running: suspend it first (spec.suspend: true) "
        "or create a new job"
    ]
    # The same write is fine for a suspended job, and other fields may change while it runs.
    suspended = with_changes(old, {"status.phase": "Suspended"})
    await webhook.allowed(JOB_PATH, "UPDATE", with_changes(new, {"status.phase": "Suspended"}), suspended)
    await webhook.allowed(JOB_PATH, "UPDATE", with_changes(old, {"spec.maxDuration": "2h"}), old)


async def test_an_output_dir_inside_an_input_mount_of_the_cluster_is_refused(
    webhook: Webhook, emulator: Emulator
) -> None:
    job = stored(data_job("/data/out"))
    await webhook.allowed(JOB_PATH, "CREATE", job)  # no such mount yet: the operator reports it later
    emulator.create("dgxdatamounts", BASE_MOUNT)  # direction In by default
    assert await webhook.refused(JOB_PATH, "CREATE", job) == [
        "spec.trainer.output.dir: /data/out is inside /data, which workers see read-only (an input mount or "
        "the config); write outputs to a direction: Out mount or another directory"
    ]
    await webhook.allowed(JOB_PATH, "CREATE", stored(data_job("/output")))
    # The webhook looked the mount up on every admission (the mount controller, running in the same
    # operator, reads it too once it exists: hence at least).
    lookups = [c for c in emulator.calls("get", "dgxdatamounts") if c.name == "data" and c.namespace == "ml"]
    assert [c.status for c in lookups][:1] == [404]
    assert len(lookups) >= 3
    assert all(c.status == 200 for c in lookups[1:])


async def test_an_output_dir_inside_an_output_mount_is_allowed(webhook: Webhook, emulator: Emulator) -> None:
    emulator.create("dgxdatamounts", with_changes(BASE_MOUNT, {"spec.direction": "Out"}))
    await webhook.allowed(JOB_PATH, "CREATE", stored(data_job("/data/out")))
    statuses = [c.status for c in emulator.calls("get", "dgxdatamounts")]
    assert statuses
    assert set(statuses) == {200}


async def test_delete_is_allowed_even_for_an_invalid_object(webhook: Webhook) -> None:
    old = running(stored(with_changes(JOB, {"spec.instance": "dgxv100.32g.8.norm"})))
    await webhook.allowed(JOB_PATH, "DELETE", None, old)
    mount = stored(with_changes(BASE_MOUNT, {"spec.source": "http://x"}))
    await webhook.allowed(MOUNT_PATH, "DELETE", None, mount)


# -- DGXDataMount -------------------------------------------------------------------------------------


async def test_a_mount_with_a_bad_source_uri_is_refused(webhook: Webhook) -> None:
    mount = stored(with_changes(BASE_MOUNT, {"spec.source": "https://bucket.example.com/prefix"}))
    assert await webhook.refused(MOUNT_PATH, "CREATE", mount) == [
        'spec.source: invalid value "https://bucket.example.com/prefix": must be an object-store URI such as '
        "s3://bucket/prefix or gs://bucket/prefix (bucket: 3-63 lower-case letters, digits, '.', '-' or '_')"
    ]


async def test_a_mount_update_is_checked_too(webhook: Webhook) -> None:
    old = stored(BASE_MOUNT, resourceVersion="3")
    new = with_changes(old, {"spec.source": "gs://bucket/prefix", "spec.region": "eu-west-1"})
    assert await webhook.refused(MOUNT_PATH, "UPDATE", new, old) == [
        "spec.region: region applies only to s3:// sources"
    ]
    await webhook.allowed(MOUNT_PATH, "UPDATE", with_changes(new, {"spec.region": DELETE}), old)


# -- what the apiserver may send -------------------------------------------------------------------------------


def encoded(request: Body, size: int | None = None) -> bytes:
    """The request as the apiserver sends it; with ``size``, exactly that long (JSON allows trailing blanks)."""
    data = json.dumps(request).encode()
    if size is not None:
        assert len(data) <= size
        data += b" " * (size - len(data))
    return data


async def post_raw(webhook: Webhook, data: bytes) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"}
    async with webhook.http.post(webhook.url + JOB_PATH, data=data, headers=headers) as response:
        return response.status, await response.text()


async def test_an_update_of_two_large_objects_is_read_and_checked(webhook: Webhook) -> None:
    """An UPDATE review carries the object and the old one: a 2 MiB spec makes it 4 MiB, four times aiohttp's
    default limit, which kopf's server kept (413, and with failurePolicy Fail a refused write)."""
    old = stored(padded(JOB, 2 * MIB), resourceVersion="5")
    new = with_changes(old, {"spec.maxDuration": "2h"})
    assert 4 * MIB < len(encoded(review_request("UPDATE", new, old))) < 4.1 * MIB
    await webhook.allowed(JOB_PATH, "UPDATE", new, old)
    # Read and checked, not waved through:
    bad = with_changes(new, {"spec.elastic.minNodes": 0})
    assert await webhook.refused(JOB_PATH, "UPDATE", bad, old) == [
        "spec.elastic.minNodes: should be greater than or equal to 1 (got 0)"
    ]
    # A CREATE of an object between 1 MiB and what etcd stores (1.5 MiB):
    await webhook.allowed(JOB_PATH, "CREATE", stored(padded(JOB, 1400 * 2**10)))


async def test_bodies_up_to_the_bound_are_read_and_larger_ones_get_a_clean_413(webhook: Webhook) -> None:
    old = stored(padded(JOB, 3 * MIB), resourceVersion="5")
    request = review_request("UPDATE", with_changes(old, {"spec.maxDuration": "2h"}), old)
    status, text = await post_raw(webhook, encoded(request, admission.MAX_REVIEW_BYTES))
    assert status == 200, text
    assert json.loads(text)["response"]["allowed"] is True
    status, text = await post_raw(webhook, encoded(request, admission.MAX_REVIEW_BYTES + 1))
    assert status == 413
    assert str(admission.MAX_REVIEW_BYTES) in text
    # The server goes on serving.
    await webhook.allowed(JOB_PATH, "CREATE", stored(JOB))


async def test_a_failed_mount_lookup_is_a_retryable_refusal(webhook: Webhook, emulator: Emulator) -> None:
    """Not kopf's generic failure (code 500 and the exception's text): 503, the entry, the reason, retry."""
    emulator.fail("get", "dgxdatamounts", code=500, name="data")
    job = stored(data_job("/data/out"))
    assert await webhook.refused(JOB_PATH, "CREATE", job, code=503) == [
        "spec.dataMounts[0]: cannot check against DGXDataMount ml/data: get dgxdatamounts ml/data: HTTP 500 "
        "Internal Server Error; retry"
    ]
    await webhook.allowed(JOB_PATH, "CREATE", job)  # the retry: the mount does not exist (yet)


async def test_a_stored_mount_this_kubedgx_cannot_read_is_a_warning(webhook: Webhook, emulator: Emulator) -> None:
    # Stored under a schema that allowed it: written past the emulator's validation, as an older CRD let it in.
    emulator._commit(
        emulator.kind("dgxdatamounts"), "ADDED", stored(with_changes(BASE_MOUNT, {"spec.direction": "Sideways"})), None
    )
    answer = await webhook.post(JOB_PATH, review_request("CREATE", stored(data_job("/data/out"))))
    assert answer["response"]["allowed"] is True
    (warning,) = answer["response"]["warnings"]
    assert warning.startswith("spec.dataMounts[0]: DGXDataMount ml/data cannot be read by this kubedgx")


async def test_a_wrong_typed_status_does_not_block_a_spec_change(webhook: Webhook) -> None:
    old = with_changes(stored(JOB, resourceVersion="5"), {"status": "x"})
    await webhook.allowed(JOB_PATH, "UPDATE", with_changes(old, {"spec.maxDuration": "2h"}), old)
    old = with_changes(old, {"status": {"phase": 5}})
    await webhook.allowed(JOB_PATH, "UPDATE", with_changes(old, {"spec.instance": "dgxh100.80g.8.norm"}), old)


# -- the children, dry-run against the API server ---------------------------------------------------------------

BASELINE = (
    'pods "job-worker-0" is forbidden: violates PodSecurity "baseline:latest": hostPath volumes (volume "data-0")'
)


def pod_security_baseline(operation: str, kind: Any, new: Body, old: Body | None) -> None:
    """The emulator's stand-in for PodSecurity enforcing baseline in namespace ml: no hostPath volumes."""
    if kind.plural == "pods" and new["metadata"]["namespace"] == "ml":
        host_paths = [v["name"] for v in new["spec"].get("volumes", []) if "hostPath" in v]
        if host_paths:
            message = f'pods "{new["metadata"]["name"]}" is forbidden: violates PodSecurity "baseline:latest": '
            raise ApiError(403, "Forbidden", message + f'hostPath volumes (volume "{host_paths[0]}")')


def dry_runs(emulator: Emulator) -> list[tuple[str | None, str | None]]:
    """(resource, namespace) of every dry-run create the emulator served."""
    return [(c.resource, c.namespace) for c in emulator.calls("create") if c.params.get("dryRun") == "All"]


async def test_a_job_has_its_children_dry_run_and_none_is_stored(webhook: Webhook, emulator: Emulator) -> None:
    await webhook.allowed(JOB_PATH, "CREATE", stored(JOB))
    # All at once (asyncio.gather): in whatever order they arrive.
    assert sorted(dry_runs(emulator)) == [("configmaps", "ml"), ("pods", "ml"), ("services", "ml")]
    assert emulator.select("pods", "ml") == []
    assert emulator.select("services", "ml") == []
    assert emulator.select("configmaps", "ml", labels={"kubedgx.io/job-name": "job"}) == []


async def test_a_job_whose_worker_the_api_server_refuses_is_refused_with_its_message(
    webhook: Webhook, emulator: Emulator
) -> None:
    emulator.admission.append(pod_security_baseline)
    job = stored(data_job("/output"))
    await webhook.allowed(JOB_PATH, "CREATE", job)  # no mount yet: worker 0 cannot be rendered, nor refused
    emulator.create("dgxdatamounts", BASE_MOUNT)  # an input mount: a hostPath cache on the node
    assert await webhook.refused(JOB_PATH, "CREATE", job) == [
        f"spec: the apiserver would refuse worker pod job-worker-0: {BASELINE}"
    ]
    # A mount cached on an ephemeral volume instead is fine under baseline.
    emulator.patch("dgxdatamounts", "ml", "data", {"spec": {"cache": {"type": "pvc", "size": "10Gi"}}})
    await webhook.allowed(JOB_PATH, "CREATE", job)


async def test_a_worker_the_quota_or_the_api_server_cannot_take_now_admits_with_a_warning(
    webhook: Webhook, emulator: Emulator
) -> None:
    quota = (
        'pods "job-worker-0" is forbidden: exceeded quota: compute, requested: pods=1, used: pods=2, limited: pods=2'
    )

    def exhausted(operation: str, kind: Any, new: Body, old: Body | None) -> None:
        if kind.plural == "pods":
            raise ApiError(403, "Forbidden", quota)

    emulator.admission.append(exhausted)
    answer = await webhook.post(JOB_PATH, review_request("CREATE", stored(JOB)))
    assert answer["response"]["allowed"] is True
    (warning,) = answer["response"]["warnings"]
    assert warning.startswith(f"spec: the apiserver would not create worker pod job-worker-0 now: {quota}; admitted")

    emulator.admission.remove(exhausted)
    emulator.fail("create", "services", code=500)
    answer = await webhook.post(JOB_PATH, review_request("CREATE", stored(JOB)))
    assert answer["response"]["allowed"] is True
    assert answer["response"]["warnings"] == [
        "spec: could not dry-run Service job (HTTP 500: injected 500 InternalError for POST "
        "/api/v1/namespaces/ml/services); admitted without that check"
    ]


# -- the checkpoint warning --------------------------------------------------------------------------------------


async def test_a_restartable_job_whose_checkpoints_stay_on_the_node_is_allowed_with_a_warning(
    webhook: Webhook, emulator: Emulator
) -> None:
    """Spot capacity: a reclaim replaces the worker in a new pod, which resumes only from uploaded checkpoints. The
    webhook judges with the mounts as the cluster has them, says nothing about a mount it did not find, and never
    refuses for it: kubectl prints the warning, the job is stored."""
    spot = stored(
        with_changes(
            JOB,
            {
                "spec.instance": "dgxa100.80g.8.spot",
                "spec.dataMounts": [{"name": "ckpt", "mountPath": "/output"}],
                "spec.trainer.output.dir": "/output/run-1",
            },
        )
    )
    await webhook.allowed(JOB_PATH, "CREATE", spot)  # no such mount yet: not guessed at
    out = with_changes(BASE_MOUNT, {"metadata.name": "ckpt", "spec.direction": "Out", "spec.syncCheckpoints": False})
    emulator.create("dgxdatamounts", out)
    answer = await webhook.post(JOB_PATH, review_request("CREATE", spot))
    assert answer["response"]["allowed"] is True
    assert answer["response"]["warnings"] == [
        "spec.dataMounts[0]: this job can be restarted in a new pod (spot capacity), but DGXDataMount ckpt, which "
        "holds its checkpoints (output.dir /output/run-1), has syncCheckpoints: false: they stay on the node, and a "
        "replacement on another node starts at step 0. Set syncCheckpoints: true in DGXDataMount ckpt (or leave it "
        "out: it defaults to true)"
    ]
    emulator.patch("dgxdatamounts", "ml", "ckpt", {"spec": {"syncCheckpoints": True}})
    await webhook.allowed(JOB_PATH, "CREATE", spot)  # uploaded: a replacement restores the newest checkpoint

    elastic = stored(with_changes(JOB, {"metadata.name": "grows", "spec.elastic.maxNodes": 4}))
    answer = await webhook.post(JOB_PATH, review_request("CREATE", elastic))
    assert answer["response"]["allowed"] is True
    (warning,) = answer["response"]["warnings"]
    assert warning.startswith(
        "spec.dataMounts: this job can be restarted in a new pod (elastic between 1 and 4 nodes), but its checkpoints "
        "(output.dir /workspace/output) stay in the pod: a replacement starts at step 0."
    )


async def test_the_checkpoint_warning_is_not_repeated_for_updates_the_user_did_not_make(webhook: Webhook) -> None:
    """Kueue flips spec.suspend and the operator writes finalizers: those updates leave what the user
    asked for as it was, so the warning the user saw at create does not come back on each (into
    Kueue's and the operator's logs); an update of the spec itself is judged again."""
    elastic = stored(with_changes(JOB, {"metadata.name": "grows", "spec.elastic.maxNodes": 4}))
    created = await webhook.post(JOB_PATH, review_request("CREATE", elastic))
    assert len(created["response"]["warnings"]) == 1
    for change in ({"spec.suspend": True}, {"metadata.finalizers": ["kubedgx.io/finalizer"]}):
        quiet = await webhook.post(JOB_PATH, review_request("UPDATE", stored(with_changes(elastic, change)), elastic))
        assert quiet["response"]["allowed"] is True
        assert not quiet["response"].get("warnings"), change
    grown = stored(with_changes(elastic, {"spec.elastic.maxNodes": 6}))
    again = await webhook.post(JOB_PATH, review_request("UPDATE", grown, elastic))
    assert again["response"]["allowed"] is True
    assert len(again["response"]["warnings"]) == 1
