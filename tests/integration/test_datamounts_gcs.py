"""gs:// DGXDataMounts end to end: the real operator lists, and checks for writing, a GCS JSON API
(fake-gcs-server behind tests/gcs.py's authenticating proxy) with the service-account key of the
Secret the mount names, exchanged for a token at the key's token_uri as google-auth does against
Google. The statuses and reasons are the ones an s3:// mount gets (tests/integration/test_datamounts.py).
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from dgx_datasync import list_source, parse_uri
from tests.conftest import BASE_MOUNT, with_changes
from tests.gcs import FakeGCS
from tests.integration.conftest import RunOperator
from tests.integration.emulator import Emulator
from tests.integration.mount_scenarios import FILES, expect_mount_events, init_containers, job_using, wait_mount
from tests.integration.scenarios import JOBS, MOUNTS, NS, Body, condition, expect_pods, start_operator, worker

pytestmark = pytest.mark.asyncio

SECRET = "gcs-key"


def key_secret(key_json: str, name: str = SECRET, key: str = "service-account.json") -> Body:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NS},
        "type": "Opaque",
        "data": {key: base64.b64encode(key_json.encode()).decode()},
    }


def gs_mount(gcs: FakeGCS, bucket: str, name: str = "data", **changes: Any) -> Body:
    return with_changes(
        BASE_MOUNT,
        {
            "metadata.name": name,
            "spec.source": f"gs://{bucket}/prefix",
            "spec.endpoint": gcs.endpoint,
            "spec.credentialsSecretRef": {"name": SECRET},
            **changes,
        },
    )


async def test_an_input_mount_is_listed_with_generations_and_its_job_gets_the_key(
    emulator: Emulator, run_operator: RunOperator, gcs: FakeGCS
) -> None:
    await start_operator(emulator, run_operator)
    bucket = gcs.bucket(objects=FILES)
    before = gcs.token_requests("admin")
    emulator.create("secrets", key_secret(gcs.key_json("admin")))
    emulator.create(MOUNTS, gs_mount(gcs, bucket, **{"spec.exclude": ["*.md"]}))
    status = await wait_mount(emulator, "Ready")

    expected = list_source(parse_uri(f"gs://{bucket}/prefix"), gcs.options(), exclude=["*.md"])
    assert [(o.key, o.etag) for o in expected.objects] == [
        ("train/a.jsonl", gcs.version(bucket, "prefix/train/a.jsonl")),
        ("train/b.jsonl", gcs.version(bucket, "prefix/train/b.jsonl")),
    ]
    assert status["objects"] == 2
    assert status["totalBytes"] == len(FILES["prefix/train/a.jsonl"]) + len(FILES["prefix/train/b.jsonl"])
    assert status["manifestDigest"] == expected.digest
    ready = condition(status, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Listed")
    assert ready["message"] == f"2 objects, {status['totalBytes']} B at gs://{bucket}/prefix"
    # The operator's listing exchanged the Secret's key for a token, as the sync containers will.
    assert gcs.token_requests("admin") > before
    await expect_mount_events(emulator, [("Normal", "Ready")])

    emulator.create(JOBS, job_using(("data", "/data"), **{"spec.dataCache": "preload"}))
    await expect_pods(emulator, {worker(0): "0"})
    pull = init_containers(emulator, worker(0))["data-in-0"]
    assert pull["args"][:3] == ["pull", f"gs://{bucket}/prefix", "/data"]
    assert pull["args"][pull["args"].index("--expect-digest") + 1] == expected.digest
    assert pull["args"][pull["args"].index("--endpoint-url") + 1] == gcs.endpoint
    assert "--region" not in pull["args"]
    env = {e["name"]: e for e in pull["env"]}
    assert not [name for name in env if name.startswith("AWS_")]
    key_path = env["GOOGLE_APPLICATION_CREDENTIALS"]["value"]
    pod = emulator.get("pods", NS, worker(0))
    assert pod is not None
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounted = [m for m in pull["volumeMounts"] if key_path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert len(mounted) == 1, pull["volumeMounts"]
    secret_volume = volumes[mounted[0]["name"]]["secret"]
    assert secret_volume["secretName"] == SECRET
    assert {i["key"] for i in secret_volume["items"]} == {"service-account.json"}


async def test_an_output_mount_is_checked_for_writing_and_left_clean(
    emulator: Emulator, run_operator: RunOperator, gcs: FakeGCS
) -> None:
    await start_operator(emulator, run_operator)
    bucket = gcs.bucket()
    mark = gcs.mark()
    emulator.create("secrets", key_secret(gcs.key_json("admin")))
    emulator.create(MOUNTS, gs_mount(gcs, bucket, "ckpt", **{"spec.direction": "Out"}))
    status = await wait_mount(emulator, "Ready", "ckpt")
    assert condition(status, "Ready")["reason"] == "Writable"
    assert "objects" not in status
    assert gcs.object_writes(bucket, mark) == ["prefix/.kubedgx/probe"]  # the probe, written once
    assert gcs.keys(bucket) == [], "the check left its probe behind"


@pytest.mark.parametrize(
    ("case", "reason", "words"),
    [
        ("missing-bucket", "BucketNotFound", "does not exist"),
        ("reader-output", "AccessDenied", "storage.objects.create"),
        ("creator-output", "AccessDenied", "storage.objects.list"),
        ("no-role", "AccessDenied", "storage.objects.list"),
        ("forged-key", "CredentialsInvalid", "Invalid JWT Signature"),
        ("not-a-key", "CredentialsInvalid", "GOOGLE_APPLICATION_CREDENTIALS"),
    ],
)
async def test_a_mount_the_store_refuses_fails_with_the_reason(
    emulator: Emulator, run_operator: RunOperator, gcs: FakeGCS, tmp_path: Any, case: str, reason: str, words: str
) -> None:
    """What GCS answers (or Google's token endpoint, for a key it no longer knows) becomes the mount's
    Failed reason, one line naming the fix; none of these is retried."""
    await start_operator(emulator, run_operator)
    bucket = gcs.bucket(objects=FILES)
    changes: dict[str, Any] = {}
    key = gcs.key_json("admin")
    if case == "missing-bucket":
        bucket = "kubedgx-no-such-bucket"
    elif case == "reader-output":
        key = gcs.key_json("reader")
        changes["spec.direction"] = "Out"
    elif case == "creator-output":
        key = gcs.key_json("creator")
        changes["spec.direction"] = "Out"
    elif case == "no-role":
        key = gcs.key_json("none")
    elif case == "forged-key":
        key = gcs.key(tmp_path, "admin", forged=True).read_text()
    elif case == "not-a-key":
        key = '{"client_email": "someone@example.com"}'
    emulator.create("secrets", key_secret(key))
    emulator.create(MOUNTS, gs_mount(gcs, bucket, **changes))
    status = await wait_mount(emulator, "Failed")
    failed = condition(status, "Ready")
    assert failed["reason"] == reason, failed
    assert words in failed["message"], failed["message"]
    assert "\n" not in failed["message"]
    assert status["observedGeneration"] == 1
    await expect_mount_events(emulator, [("Warning", reason)])
    if case.endswith("-output"):  # refused before the probe was written, or its write was refused
        assert gcs.keys(bucket, "prefix/.kubedgx/") == []


async def test_a_secret_without_the_key_file_waits_naming_the_key(
    emulator: Emulator, run_operator: RunOperator, gcs: FakeGCS
) -> None:
    await start_operator(emulator, run_operator)
    bucket = gcs.bucket(objects=FILES)
    emulator.create("secrets", key_secret(gcs.key_json("admin"), key="key.json"))
    emulator.create(MOUNTS, gs_mount(gcs, bucket))

    def ready_reason(mount: Body) -> str | None:
        found = [c for c in (mount.get("status") or {}).get("conditions", []) if c["type"] == "Ready"]
        return found[0].get("reason") if found else None

    mount = await emulator.wait_for_object(MOUNTS, NS, "data", lambda m: ready_reason(m) == "CredentialsMissing")
    assert "service-account.json" in condition(mount["status"], "Ready")["message"]
    # Naming the key the Secret has is the fix.
    emulator.patch(MOUNTS, NS, "data", {"spec": {"credentialsSecretRef": {"name": SECRET, "key": "key.json"}}})
    status = await wait_mount(emulator, "Ready")
    assert status["objects"] == 3
