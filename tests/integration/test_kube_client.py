"""The operator's own API client (dgx_operator.kube): each call against the emulator's HTTP API, and
the transport against a small aiohttp server that records what it is sent (the token a rotated
ServiceAccount file holds, the token an ``exec`` plugin prints, Retry-After carried to the caller).

kube.py speaks plain JSON over aiohttp since it stopped using kubernetes_asyncio's generated models
(docs/benchmarks.md: 40 MB of the operator's memory); these tests pin that each verb still means
what the controllers rely on: 404 on a read is None, on a delete False; 409 on a create is "exists"
only for the job's own child; 409 on a status patch is a TransientError; an error answer carries
the apiserver's Status for :func:`refusal` to read.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import pytest_asyncio
import yaml
from aiohttp import web

from dgx_operator.api import GROUP, VERSION
from dgx_operator.kube import (
    JOBS,
    ApiError,
    ForeignObjectError,
    Http,
    Kube,
    TransientError,
    credentials,
    refusal,
)
from tests.conftest import BASE_JOB
from tests.integration.conftest import Kubes
from tests.integration.emulator import Emulator
from tests.support.ports import free_port

pytestmark = pytest.mark.asyncio

NS = "ml"
OWNER_UID = "0b5e0c3a-0000-4000-8000-000000000001"


def owned_pod(name: str, owner_uid: str = OWNER_UID) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"kubedgx.io/job": "job"},
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "DGXTrainingJob",
                    "name": "job",
                    "uid": owner_uid,
                    "controller": True,
                }
            ],
        },
        "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]},
    }


async def test_a_child_is_created_once_and_an_existing_one_is_told_apart_by_its_owner(
    emulator: Emulator, kubes: Kubes
) -> None:
    kube = await kubes()
    assert await kube.create(owned_pod("job-worker-0"), OWNER_UID) == "created"
    assert emulator.get("pods", NS, "job-worker-0") is not None
    assert await kube.create(owned_pod("job-worker-0"), OWNER_UID) == "exists"
    # Left by a deleted job of the same name (another uid): it goes with its owner, wait.
    emulator.create("pods", owned_pod("job-worker-1", owner_uid="0b5e0c3a-0000-4000-8000-00000000dead"))
    assert await kube.create(owned_pod("job-worker-1"), OWNER_UID) == "blocked"
    # Someone else's object under the name (no owner the emulator would collect): never adopted.
    foreign = owned_pod("job-worker-2")
    del foreign["metadata"]["ownerReferences"]
    emulator.create("pods", foreign)
    with pytest.raises(ForeignObjectError, match="controlled by no controller, not this job"):
        await kube.create(owned_pod("job-worker-2"), OWNER_UID)


async def test_a_dry_run_create_stores_nothing_and_a_refusal_carries_the_apiservers_status(
    emulator: Emulator, kubes: Kubes
) -> None:
    kube = await kubes()
    await kube.dry_run_create(owned_pod("job-worker-0"))
    assert emulator.get("pods", NS, "job-worker-0") is None
    assert [c.params.get("dryRun") for c in emulator.calls("create", "pods")] == ["All"]
    invalid = owned_pod("job-worker-0")
    invalid["metadata"]["name"] = "Not_A_DNS_Name"
    with pytest.raises(ApiError) as caught:
        await kube.dry_run_create(invalid)
    refused = refusal(caught.value)
    assert refused is not None
    assert refused.kind == "permanent"
    assert refused.code == caught.value.status == 422
    assert "Not_A_DNS_Name" in refused.message  # the Status's message, not the HTTP dump
    assert "HTTP response body" not in refused.message


async def test_reads_deletes_and_label_patches_of_what_is_gone(emulator: Emulator, kubes: Kubes) -> None:
    kube = await kubes()
    assert await kube.get_job(NS, "nothing") is None
    assert await kube.get_mount(NS, "nothing") is None
    assert await kube.get_secret_data(NS, "nothing") is None
    assert await kube.delete_pod(NS, "nothing") is False
    assert await kube.delete_config_map(NS, "nothing") is False
    assert await kube.patch_pod_labels(NS, "nothing", {"a": "b"}) is False
    assert await kube.set_finalizers(NS, "nothing", None, ["x"]) == {}
    await kube.delete_job(NS, "nothing")  # gone already is fine
    emulator.create("pods", owned_pod("p"))
    assert await kube.patch_pod_labels(NS, "p", {"a": "b", "kubedgx.io/job": None}) is True
    assert emulator.get("pods", NS, "p")["metadata"]["labels"] == {"a": "b"}  # None removed the label
    assert await kube.delete_pod(NS, "p") is True
    assert emulator.get("pods", NS, "p") is None


async def test_a_status_patch_from_a_stale_version_is_a_transient_conflict(emulator: Emulator, kubes: Kubes) -> None:
    kube = await kubes()
    errors: list[tuple[str, int]] = []
    kube.on_error = lambda verb, code: errors.append((verb, code))
    stored = emulator.create(JOBS, BASE_JOB, namespace=NS)
    version = stored["metadata"]["resourceVersion"]
    patched = await kube.patch_job_status(NS, "job", version, {"phase": "Pending"})
    assert patched["status"]["phase"] == "Pending"
    assert [j["metadata"]["name"] for j in await kube.list_jobs(NS)] == ["job"]
    with pytest.raises(TransientError, match="409"):
        await kube.patch_job_status(NS, "job", version, {"phase": "Running"})  # written since
    assert errors == [("patch", 409)]
    assert (await kube.get_job(NS, "job") or {})["status"]["phase"] == "Pending"
    with_finalizer = await kube.set_finalizers(NS, "job", patched["metadata"]["resourceVersion"], ["kubedgx.io/x"])
    assert with_finalizer["metadata"]["finalizers"] == ["kubedgx.io/x"]


async def test_throttling_is_transient_and_keeps_its_retry_after(emulator: Emulator, kubes: Kubes) -> None:
    kube = await kubes()
    emulator.fail("get", JOBS, code=429, retry_after=7)
    with pytest.raises(TransientError) as caught:
        await kube.get_job(NS, "job")
    assert caught.value.retry_after == 7.0


async def test_secrets_discovery_and_logs(emulator: Emulator, kubes: Kubes) -> None:
    kube = await kubes()
    assert await kube.create_secret(NS, "pair", {"tls.crt": b"\x00cert"}) is True
    assert await kube.create_secret(NS, "pair", {"tls.crt": b"other"}) is False  # another replica made it
    assert await kube.get_secret_data(NS, "pair") == {"tls.crt": b"\x00cert"}
    stored = await kube.get_secret(NS, "pair") or {}
    version = stored["metadata"]["resourceVersion"]
    assert await kube.update_secret_data(NS, "pair", {"tls.crt": b"new"}, version) is not None
    assert await kube.update_secret_data(NS, "pair", {"tls.crt": b"newer"}, version) is None  # stale: read again
    assert await kube.get_secret_data(NS, "pair") == {"tls.crt": b"new"}

    assert await kube.served_version(GROUP, (VERSION,)) == VERSION
    assert await kube.served_version("kueue.x-k8s.io", ("v1beta1",)) is None  # not installed
    plurals = {r["name"] for r in await kube.api_resources(GROUP, VERSION)}
    assert {"dgxtrainingjobs", "dgxdatamounts"} <= plurals

    emulator.create("pods", owned_pod("job-worker-0"))
    emulator.set_log(NS, "job-worker-0", "trainer", "".join(f"line {i}\n" for i in range(10)))
    assert await kube.pod_log_tail(NS, "job-worker-0", "trainer", lines=2, limit_bytes=1000) == "line 8\nline 9\n"
    assert await kube.pod_log_tail(NS, "gone", "trainer", lines=2, limit_bytes=1000) is None


# -- the transport: credentials as they are sent -----------------------------------------------------------------


@pytest_asyncio.fixture
async def recorder() -> AsyncIterator[tuple[str, list[str]]]:
    """An HTTP server that answers every request with an empty JSON object and records the
    Authorization header it was sent."""
    seen: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({"kind": "Status", "apiVersion": "v1"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    yield f"http://127.0.0.1:{port}", seen
    await runner.cleanup()


async def test_a_rotated_service_account_token_is_read_again(recorder: tuple[str, list[str]], tmp_path: Path) -> None:
    server, seen = recorder
    token = tmp_path / "token"
    token.write_text("first\n")
    http = Http(kopf.ConnectionInfo(server=server, token="first"), token_file=str(token))
    try:
        await http.request("GET", "/api")
        token.write_text("second\n")  # the kubelet rotates the projected token
        os.utime(token, (1_000_000_000, 1_000_000_000))  # a new mtime, whatever the clock's resolution
        await http.request("GET", "/api")
    finally:
        await http.close()
    assert seen == ["Bearer first", "Bearer second"]


async def test_an_exec_plugin_kubeconfig_gets_its_token_from_the_plugin(
    recorder: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EKS and GKE kubeconfigs: kopf's minimal parser finds no credentials there; kube.credentials
    runs the plugin through kubernetes_asyncio's loader (`kubedgx check-install` from a laptop)."""
    server, seen = recorder
    plugin = tmp_path / "plugin"
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": "from-the-plugin"},
    }
    plugin.write_text(f"#!{sys.executable}\nprint({json.dumps(json.dumps(credential))})\n")
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [
            {
                "name": "u",
                "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)}},
            }
        ],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "ml"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    info = credentials()
    assert info.token == "from-the-plugin"
    kube = await Kube.connect(info)
    try:
        await kube.get_job(NS, "job")
    finally:
        await kube.close()
    assert seen == ["Bearer from-the-plugin"]


async def test_without_a_kubeconfig_or_a_pod_the_error_says_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    with pytest.raises(kopf.LoginError, match=re.escape("set KUBECONFIG or write ~/.kube/config")):
        credentials()
