"""The validating webhook's TLS modes as the chart uses them (docs/operator.md, "Running the operator"):

* self-signed: the operator makes its own CA and serving certificate for the Service's DNS names, serves TLS with
  them, and creates (or, on a later start, patches) the ValidatingWebhookConfiguration with a Service clientConfig
  and that CA, which must verify what the server presents under the Service's name;
* certificate files (cert-manager's Secret): served as given, and the operator writes no configuration.

The operator runs in-process against the emulator, which serves admissionregistration.k8s.io/v1 for these tests
(it does not emulate webhooks: the test plays the API server calling one). The webhook's readiness is the
moment kopf's server yields its client config (the test's ``admission.WebhookServer`` subclass reports it), or, in
self-signed mode, the configuration's appearance, which the operator writes only once its socket listens.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import ssl
import types
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from kubernetes_asyncio.client.exceptions import ApiException

from dgx_operator import admission
from dgx_operator.kube import Kube
from dgx_operator.metrics import Metrics
from dgx_operator.settings import OperatorConfig, WebhookConfig
from tests.conftest import BASE_JOB, with_changes
from tests.integration.conftest import OperatorRun, RunOperator
from tests.integration.emulator import Emulator, Kind
from tests.integration.test_admission import (
    JOB_PATH,
    MIB,
    MOUNT_PATH,
    operator_registry,
    padded,
    review_request,
    stored,
)
from tests.integration.test_cli_operator import free_port

pytestmark = pytest.mark.asyncio

Body = dict[str, Any]
VWCS = "validatingwebhookconfigurations"
VWC_KIND = Kind("admissionregistration.k8s.io", "v1", VWCS, "ValidatingWebhookConfiguration", namespaced=False)
SERVICE, NAMESPACE = "kubedgx-webhook", "kubedgx-system"
HOSTNAME = f"{SERVICE}.{NAMESPACE}.svc"
BAD_JOB = with_changes(
    BASE_JOB, {"metadata.uid": str(uuid.uuid4()), "spec.instance": "dgxa100.80g.16.norm"}
)  # an instance type the catalog does not have


def self_signed_env(port: int, **extra: str) -> dict[str, str]:
    """What the chart sets for self-signed mode."""
    return {
        "KUBEDGX_WEBHOOK_PORT": str(port),
        "KUBEDGX_WEBHOOK_SELF_SIGNED": "1",
        "KUBEDGX_WEBHOOK_SERVICE": SERVICE,
        "KUBEDGX_WEBHOOK_NAMESPACE": NAMESPACE,
        **extra,
    }


def quick(config: OperatorConfig) -> OperatorConfig:
    return dataclasses.replace(config, error_backoffs=(0.1, 0.2, 0.5, 1.0), retry_base=0.05)


async def start(run_operator: RunOperator, config: OperatorConfig, memo: kopf.Memo | None = None) -> OperatorRun:
    """The operator with its validating webhook (``memo``: to read what its startup put there)."""
    operator = types.ModuleType("kubedgx_operator_with_webhook")
    operator.registry = operator_registry()  # type: ignore[attr-defined]
    memo = memo if memo is not None else kopf.Memo()
    memo.config = config
    return await run_operator(operator, memo=memo)


@pytest.fixture
def listening(monkeypatch: pytest.MonkeyPatch) -> asyncio.Queue[kopf.WebhookClientConfig]:
    """The client config of every kopf webhook server started from now on, once its socket listens."""
    queue: asyncio.Queue[kopf.WebhookClientConfig] = asyncio.Queue()

    class ObservedWebhookServer(admission.WebhookServer):
        async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
            async for client_config in super().__call__(fn):
                queue.put_nowait(client_config)
                yield client_config

    monkeypatch.setattr(admission, "WebhookServer", ObservedWebhookServer)
    return queue


@pytest.fixture
def vwc_served(emulator: Emulator) -> Emulator:
    emulator._register(VWC_KIND)  # the emulator serves no admissionregistration kinds of its own
    return emulator


def tls_client(ca_pem: bytes) -> ssl.SSLContext:
    """As the API server calls a webhook: trusting only the caBundle."""
    return ssl.create_default_context(cadata=ca_pem.decode("ascii"))


def large_update() -> Body:
    """An UPDATE review of 4 MiB (the object and the old one, 2 MiB each): four times aiohttp's default limit."""
    old = stored(padded(BASE_JOB, 2 * MIB), resourceVersion="5")
    return review_request("UPDATE", with_changes(old, {"spec.elastic.maxNodes": 2}), old)


async def review(
    port: int, ca_pem: bytes, hostname: str, path: str = JOB_PATH, job: Body = BAD_JOB, request: Body | None = None
) -> Body:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"https://127.0.0.1:{port}{path}",
            json=request if request is not None else review_request("CREATE", job),
            ssl=tls_client(ca_pem),
            server_hostname=hostname,
        ) as response,
    ):
        assert response.status == 200, await response.text()
        answer: Body = await response.json()
        return answer


async def served_certificate(port: int, ca_pem: bytes, hostname: str) -> bytes:
    """The DER certificate the server presents, verified against ``ca_pem`` for ``hostname``."""
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls_client(ca_pem), server_hostname=hostname)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        assert isinstance(der, bytes)
        return der
    finally:
        writer.close()
        await writer.wait_closed()


def ca_bundle(vwc: Body) -> bytes:
    bundles = {hook["clientConfig"]["caBundle"] for hook in vwc["webhooks"]}
    assert len(bundles) == 1
    return base64.b64decode(bundles.pop())


# -- self-signed ----------------------------------------------------------------------------------------------


async def test_self_signed_mode_registers_a_configuration_whose_ca_verifies_the_server(
    vwc_served: Emulator, run_operator: RunOperator
) -> None:
    emulator, port = vwc_served, free_port()
    config = quick(OperatorConfig.from_env(self_signed_env(port, KUBEDGX_WEBHOOK_FAILURE_POLICY="Ignore")))
    await start(run_operator, config)
    vwc = await emulator.wait_for_object(VWCS, None, "kubedgx", timeout=10)

    assert vwc["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "kubedgx-operator"}
    ca = ca_bundle(vwc)
    hooks = {hook["name"]: hook for hook in vwc["webhooks"]}
    assert sorted(hooks) == ["dgxdatamounts.kubedgx.io", "dgxtrainingjobs.kubedgx.io"]
    for name, path, plural in (
        ("dgxtrainingjobs.kubedgx.io", JOB_PATH, "dgxtrainingjobs"),
        ("dgxdatamounts.kubedgx.io", MOUNT_PATH, "dgxdatamounts"),
    ):
        hook = hooks[name]
        assert hook["clientConfig"]["service"] == {"name": SERVICE, "namespace": NAMESPACE, "port": 443, "path": path}
        assert "url" not in hook["clientConfig"]
        assert hook["rules"] == [
            {
                "apiGroups": ["kubedgx.io"],
                "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": [plural],
                "scope": "Namespaced",
            }
        ]
        assert (hook["failurePolicy"], hook["sideEffects"], hook["timeoutSeconds"]) == ("Ignore", "None", 10)
        assert hook["admissionReviewVersions"] == ["v1"]
        assert "namespaceSelector" not in hook
        assert "objectSelector" not in hook

    # The API server's view: the caBundle verifies the served certificate under the Service's DNS names.
    answer = await review(port, ca, HOSTNAME)
    assert answer["response"]["allowed"] is False
    assert "spec.instance: unknown instance type 'dgxa100.80g.16.norm'" in answer["response"]["status"]["message"]
    assert (await review(port, ca, f"{HOSTNAME}.cluster.local", job=BASE_JOB))["response"]["allowed"] is True
    assert (await review(port, ca, HOSTNAME, request=large_update()))["response"]["allowed"] is True
    certificate = x509.load_der_x509_certificate(await served_certificate(port, ca, HOSTNAME))
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [HOSTNAME, f"{HOSTNAME}.cluster.local"]
    with pytest.raises(ssl.SSLCertVerificationError):  # another name, or another CA, is refused
        await served_certificate(port, ca, "kubedgx-webhook.elsewhere.svc")
    with pytest.raises(ssl.SSLCertVerificationError):
        await served_certificate(port, admission.self_signed([HOSTNAME]).ca, HOSTNAME)


async def test_a_second_start_patches_the_configuration_with_its_new_ca(
    vwc_served: Emulator, run_operator: RunOperator
) -> None:
    emulator, port = vwc_served, free_port()
    config = quick(OperatorConfig.from_env(self_signed_env(port)))
    memo = kopf.Memo()
    first = await start(run_operator, config, memo)
    created = await emulator.wait_for_object(VWCS, None, "kubedgx", timeout=10)
    key_directory = Path(memo.webhook.directory)
    assert sorted(p.name for p in key_directory.iterdir()) == ["tls.crt", "tls.key"]
    assert (key_directory / "tls.key").stat().st_mode & 0o077 == 0  # the key is the operator's alone
    await first.stop()
    assert not key_directory.exists()  # removed at cleanup

    await start(run_operator, config)
    patched = await emulator.wait_for_object(
        VWCS, None, "kubedgx", lambda vwc: ca_bundle(vwc) != ca_bundle(created), timeout=10
    )
    assert len(emulator.select(VWCS)) == 1
    assert patched["metadata"]["uid"] == created["metadata"]["uid"]  # the same object, patched
    assert [hook["failurePolicy"] for hook in patched["webhooks"]] == ["Fail", "Fail"]  # the default
    writes = [(c.verb, c.status) for c in emulator.calls(resource=VWCS) if c.write]
    assert writes == [("create", 201), ("create", 409), ("patch", 200)]
    # The new CA verifies the server; the old one no longer does.
    assert (await review(port, ca_bundle(patched), HOSTNAME))["response"]["allowed"] is False
    with pytest.raises(ssl.SSLCertVerificationError):
        await served_certificate(port, ca_bundle(created), HOSTNAME)


CLUSTER_ROLES = "clusterroles"
CLUSTER_ROLE_KIND = Kind("rbac.authorization.k8s.io", "v1", CLUSTER_ROLES, "ClusterRole", namespaced=False)


async def test_the_configuration_is_owned_by_the_chart_s_cluster_role(
    vwc_served: Emulator, run_operator: RunOperator
) -> None:
    """Uninstalling the release deletes the ClusterRole, and with it (garbage collection) the configuration: no
    webhook is left that refuses every write to the kept CRDs once no operator serves it. Re-owned on a patch."""
    emulator, port = vwc_served, free_port()
    emulator._register(CLUSTER_ROLE_KIND)  # the emulator serves no RBAC kinds of its own
    role = emulator.create(
        CLUSTER_ROLES,
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "kubedgx"}},
    )
    env = self_signed_env(port, KUBEDGX_WEBHOOK_OWNER_CLUSTERROLE="kubedgx")
    config = quick(OperatorConfig.from_env(env))
    assert config.webhook is not None
    assert config.webhook.owner_cluster_role == "kubedgx"
    first = await start(run_operator, config)
    vwc = await emulator.wait_for_object(VWCS, None, "kubedgx", timeout=10)
    owner = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "name": "kubedgx",
        "uid": role["metadata"]["uid"],
    }
    assert vwc["metadata"]["ownerReferences"] == [owner]
    await first.stop()

    emulator.patch(VWCS, None, "kubedgx", {"metadata": {"ownerReferences": None}})  # lost, say by a manual edit
    await start(run_operator, config)
    patched = await emulator.wait_for_object(
        VWCS, None, "kubedgx", lambda v: v["metadata"].get("ownerReferences"), timeout=10
    )
    assert patched["metadata"]["ownerReferences"] == [owner]


async def test_a_missing_owner_leaves_the_configuration_unowned(
    vwc_served: Emulator, run_operator: RunOperator
) -> None:
    emulator, port = vwc_served, free_port()
    emulator._register(CLUSTER_ROLE_KIND)
    config = quick(OperatorConfig.from_env(self_signed_env(port, KUBEDGX_WEBHOOK_OWNER_CLUSTERROLE="absent")))
    await start(run_operator, config)
    vwc = await emulator.wait_for_object(VWCS, None, "kubedgx", timeout=10)
    assert "ownerReferences" not in vwc["metadata"]


async def test_a_failed_registration_is_retried_and_counted(vwc_served: Emulator, run_operator: RunOperator) -> None:
    emulator, port = vwc_served, free_port()
    emulator.fail("create", VWCS, code=503, times=2)
    memo = kopf.Memo()
    await start(run_operator, quick(OperatorConfig.from_env(self_signed_env(port))), memo)
    await emulator.wait_for_object(VWCS, None, "kubedgx", timeout=10)
    assert [c.status for c in emulator.calls("create", VWCS)] == [503, 503, 201]
    metrics: Metrics = memo.metrics
    exposition = metrics.exposition().decode()
    assert 'kubedgx_api_errors_total{code="503",verb="create"} 2.0' in exposition


# -- certificate files ------------------------------------------------------------------------------------------


async def test_certificate_files_are_served_as_given_and_no_configuration_is_written(
    vwc_served: Emulator,
    run_operator: RunOperator,
    listening: asyncio.Queue[kopf.WebhookClientConfig],
    tmp_path: Path,
) -> None:
    emulator, port = vwc_served, free_port()
    pair = admission.self_signed([HOSTNAME])  # what cert-manager would have put in the Secret
    (tmp_path / "tls.crt").write_bytes(pair.certificate)
    (tmp_path / "tls.key").write_bytes(pair.key)
    env = {
        "KUBEDGX_WEBHOOK_PORT": str(port),
        "KUBEDGX_WEBHOOK_CERT": str(tmp_path / "tls.crt"),
        "KUBEDGX_WEBHOOK_KEY": str(tmp_path / "tls.key"),
    }
    config = quick(OperatorConfig.from_env(env))
    assert config.webhook is not None
    assert config.webhook.mode == "certificate"
    await start(run_operator, config)
    await asyncio.wait_for(listening.get(), timeout=10)

    served = await served_certificate(port, pair.ca, HOSTNAME)
    assert served == x509.load_pem_x509_certificate(pair.certificate).public_bytes(Encoding.DER)
    assert (await review(port, pair.ca, HOSTNAME))["response"]["allowed"] is False
    assert (await review(port, pair.ca, HOSTNAME, request=large_update()))["response"]["allowed"] is True
    assert emulator.select(VWCS) == []
    assert emulator.calls(resource=VWCS) == []  # the chart and cert-manager own the configuration


async def test_the_self_signed_configuration_body() -> None:
    """Webhook names need three DNS segments (the API server refuses fewer); paths are kopf's handler ids."""
    hook = WebhookConfig(self_signed=True, service="svc", namespace="ns", configuration="mine", failure_policy="Fail")
    body = admission.webhook_configuration(hook, b"CA")
    assert body["metadata"]["name"] == "mine"
    assert [h["name"].count(".") for h in body["webhooks"]] == [2, 2]
    assert [h["clientConfig"]["service"]["path"] for h in body["webhooks"]] == [JOB_PATH, MOUNT_PATH]
    assert {h["clientConfig"]["caBundle"] for h in body["webhooks"]} == {base64.b64encode(b"CA").decode()}


async def test_a_refused_registration_is_not_retried(vwc_served: Emulator, api_client: Any) -> None:
    """403 (the chart gave no RBAC for it) is raised at once: kopf then stops the operator, whose log says
    why, rather than serving a CA the API server never learns."""
    emulator = vwc_served
    emulator.fail("create", VWCS, code=403)
    hook = WebhookConfig(self_signed=True, service=SERVICE, namespace=NAMESPACE)
    errors: list[tuple[str, int]] = []
    kube = Kube(api_client, on_error=lambda verb, code: errors.append((verb, code)))
    with pytest.raises(ApiException) as refused:
        await admission.publish(kube, admission.webhook_configuration(hook, b"CA"), retry_base=0.01)
    assert refused.value.status == 403
    assert [c.status for c in emulator.calls(resource=VWCS)] == [403]
    assert errors == [("create", 403)]
