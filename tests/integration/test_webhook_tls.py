"""The validating webhook's TLS modes as the chart uses them (docs/operator.md, "Running the operator"):

* self-signed: the replicas share one CA and serving certificate for the Service's DNS names, kept in a Secret
  (the first to find it empty fills it), serve TLS with it, and set its CA as the caBundle of the
  ValidatingWebhookConfiguration (the chart's; created only when missing), which must verify what the server
  presents under the Service's name; a restart keeps the pair, an expiring pair is renewed keeping the old CA;
* certificate files (cert-manager's Secret): served as given, and the operator writes no configuration.

The operator runs in-process against the emulator, which serves admissionregistration.k8s.io/v1 for these tests
(it does not emulate webhooks: the test plays the API server calling one). The webhook's readiness is the
moment kopf's server yields its client config (the test's ``admission.WebhookServer`` subclass reports it), or, in
self-signed mode, the configuration's appearance, which the operator writes only once its socket listens.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
import ssl
import tempfile
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

from dgx_operator.controllers.metrics import Metrics
from dgx_operator.kube import Kube
from dgx_operator.runtime.settings import OperatorConfig
from dgx_operator.webhook import admission
from dgx_operator.webhook.certificates import CertificateKeeper, PublishError, SelfSigned, self_signed, unusable
from dgx_operator.webhook.config import WebhookConfig
from tests.conftest import BASE_JOB, with_changes
from tests.integration.admission_helpers import (
    JOB_PATH,
    MIB,
    MOUNT_PATH,
    operator_registry,
    padded,
    review_request,
    stored,
)
from tests.integration.conftest import Kubes, OperatorRun, RunOperator
from tests.integration.emulator import Emulator, Kind
from tests.support.ports import free_port

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
    """Fast retries, and no metrics server: the environments above leave KUBEDGX_METRICS_PORT to its
    default, 8080 on every address, which another operator of the test run (another pytest-xdist
    worker's) may hold."""
    return dataclasses.replace(config, error_backoffs=(0.1, 0.2, 0.5, 1.0), retry_base=0.05, metrics_port=0)


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

SECRETS = "secrets"
SECRET = f"{SERVICE}-tls"


@pytest.fixture
def self_signed_served(vwc_served: Emulator) -> Emulator:
    """The emulator with the release's namespace (the Secret lives there)."""
    vwc_served.create_namespace(NAMESPACE)
    return vwc_served


def chart_configuration(**hook: Any) -> Body:
    """The configuration as the chart renders it: no caBundle (the replicas set it)."""
    body = admission.webhook_configuration(
        WebhookConfig(self_signed=True, service=SERVICE, namespace=NAMESPACE, configuration="kubedgx", **hook), b""
    )
    for webhook in body["webhooks"]:
        del webhook["clientConfig"]["caBundle"]
    return body


def stored_pair(emulator: Emulator) -> SelfSigned | None:
    secret = emulator.get(SECRETS, NAMESPACE, SECRET)
    data = {k: base64.b64decode(v) for k, v in ((secret or {}).get("data") or {}).items()}
    return SelfSigned.of(data)


async def test_self_signed_mode_registers_a_configuration_whose_ca_verifies_the_server(
    self_signed_served: Emulator, run_operator: RunOperator
) -> None:
    """Run without the chart: the Secret and the configuration are missing, and the operator creates both."""
    emulator, port = self_signed_served, free_port()
    config = quick(OperatorConfig.from_env(self_signed_env(port, KUBEDGX_WEBHOOK_FAILURE_POLICY="Ignore")))
    memo = kopf.Memo()
    await start(run_operator, config, memo)
    vwc = await emulator.wait_for_object(VWCS, None, "kubedgx", timeout=10)
    await emulator.wait_for(lambda: "webhook" in memo, timeout=10)
    await asyncio.wait_for(memo.webhook.listening.wait(), timeout=10)

    assert vwc["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "kubedgx-operator"}
    ca = ca_bundle(vwc)
    pair = stored_pair(emulator)
    assert pair is not None
    assert ca == pair.ca  # the Secret's CA is the caBundle
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


async def test_the_chart_s_configuration_gets_its_ca_bundle_and_nothing_else(
    self_signed_served: Emulator, run_operator: RunOperator
) -> None:
    """The chart renders the configuration and an empty Secret; the operator fills the Secret and patches only the
    caBundle of its two webhooks (a third webhook of the configuration, and every other field, stay as they are)."""
    emulator, port = self_signed_served, free_port()
    rendered = chart_configuration(timeout_seconds=7)
    other = {**copy.deepcopy(rendered["webhooks"][0]), "name": "someone-else.example.com"}
    rendered["webhooks"].insert(0, other)
    emulator.create(VWCS, rendered)
    emulator.create(SECRETS, {"metadata": {"name": SECRET, "namespace": NAMESPACE}, "type": "Opaque"})
    memo = kopf.Memo()
    await start(run_operator, quick(OperatorConfig.from_env(self_signed_env(port))), memo)
    vwc = await emulator.wait_for_object(
        VWCS, None, "kubedgx", lambda v: "caBundle" in v["webhooks"][1]["clientConfig"], timeout=10
    )
    await emulator.wait_for(lambda: "webhook" in memo, timeout=10)
    await asyncio.wait_for(memo.webhook.listening.wait(), timeout=10)
    pair = stored_pair(emulator)
    assert pair is not None
    assert "caBundle" not in vwc["webhooks"][0]["clientConfig"]  # not ours
    for mine in vwc["webhooks"][1:]:
        assert base64.b64decode(mine["clientConfig"]["caBundle"]) == pair.ca
        assert mine["timeoutSeconds"] == 7  # the chart's, untouched
    without_ca = copy.deepcopy(vwc)
    for webhook in without_ca["webhooks"]:
        webhook["clientConfig"].pop("caBundle", None)
    assert without_ca["webhooks"] == rendered["webhooks"]
    writes = [(c.verb, c.status) for c in emulator.calls(resource=VWCS) if c.write]
    assert writes == [("patch", 200)]  # one patch: nothing created
    assert (await review(port, pair.ca, HOSTNAME))["response"]["allowed"] is False


async def test_a_restart_keeps_the_pair_so_the_ca_bundle_never_changes(
    self_signed_served: Emulator, run_operator: RunOperator
) -> None:
    emulator, port = self_signed_served, free_port()
    config = quick(OperatorConfig.from_env(self_signed_env(port)))
    memo = kopf.Memo()
    first = await start(run_operator, config, memo)
    created = await emulator.wait_for_object(VWCS, None, "kubedgx", timeout=10)
    key_directory = Path(memo.webhook.directory)
    assert sorted(p.name for p in key_directory.iterdir()) == ["tls.crt", "tls.key"]
    assert (key_directory / "tls.key").stat().st_mode & 0o077 == 0  # the key is the operator's alone
    await asyncio.wait_for(memo.webhook.listening.wait(), timeout=10)  # the VWC is patched before the socket binds
    served = await served_certificate(port, ca_bundle(created), HOSTNAME)
    await first.stop()
    assert not key_directory.exists()  # removed at cleanup

    memo = kopf.Memo()
    await start(run_operator, config, memo)
    await emulator.wait_for(lambda: "webhook" in memo, timeout=10)  # set once the Secret was read
    await asyncio.wait_for(memo.webhook.listening.wait(), timeout=10)
    again = await served_certificate(port, ca_bundle(created), HOSTNAME)  # no TLS error after the restart
    assert again == served
    assert emulator.get(VWCS, None, "kubedgx")["webhooks"] == created["webhooks"]
    secret_writes = [c.verb for c in emulator.calls(resource=SECRETS) if c.write]
    assert secret_writes == ["create"]  # the first start made the pair; the second only read it


async def test_two_replicas_starting_together_end_with_one_pair(self_signed_served: Emulator, kubes: Kubes) -> None:
    emulator = self_signed_served
    emulator.create(SECRETS, {"metadata": {"name": SECRET, "namespace": NAMESPACE}, "type": "Opaque"})
    hook = WebhookConfig(self_signed=True, service=SERVICE, namespace=NAMESPACE, secret=SECRET)
    keepers = [keeper(hook, await kubes(), tmp) for tmp in ("a", "b")]
    first, second = await asyncio.gather(*(k.ensure() for k in keepers))
    assert first == second == stored_pair(emulator)
    patches = [c for c in emulator.calls(resource=SECRETS) if c.write]
    assert [c.status for c in patches] in ([200, 409], [409, 200])  # one wrote, the other read the winner's
    for k in keepers:
        assert Path(k.certfile).read_bytes() == first.certificate


def keeper(hook: WebhookConfig, kube: Kube, name: str) -> CertificateKeeper:
    directory = Path(tempfile.mkdtemp(prefix=f"keeper-{name}-"))
    return CertificateKeeper(
        kube=kube, namespace=NAMESPACE, secret=SECRET, dns_names=hook.dns_names, configuration="kubedgx",
        webhooks=("dgxtrainingjobs.kubedgx.io", "dgxdatamounts.kubedgx.io"),
        body=lambda ca: admission.webhook_configuration(hook, ca), directory=str(directory),
    )  # fmt: skip


async def test_an_expiring_pair_is_renewed_keeping_the_old_ca_in_the_bundle(
    self_signed_served: Emulator, kubes: Kubes
) -> None:
    """A replica still serving the old certificate stays trusted until it reads the new pair."""
    emulator = self_signed_served
    hook = WebhookConfig(self_signed=True, service=SERVICE, namespace=NAMESPACE, secret=SECRET)
    old = self_signed(hook.dns_names, days=20)  # inside the 30 days before expiry
    data = {k: base64.b64encode(v).decode() for k, v in old.data().items()}
    emulator.create(SECRETS, {"metadata": {"name": SECRET, "namespace": NAMESPACE}, "type": "Opaque", "data": data})
    renewed = await keeper(hook, await kubes(), "r").ensure()
    assert renewed.certificate != old.certificate
    assert renewed.ca.endswith(old.ca)  # the new CA first, then the old one
    assert stored_pair(emulator) == renewed
    assert unusable(renewed, hook.dns_names) is None
    old_certificate = x509.load_pem_x509_certificate(old.certificate)
    assert any(old_certificate.issuer == c.subject for c in x509.load_pem_x509_certificates(renewed.ca))


async def test_a_failed_read_of_the_secret_is_retried_and_counted(
    self_signed_served: Emulator, run_operator: RunOperator
) -> None:
    emulator, port = self_signed_served, free_port()
    emulator.fail("get", SECRETS, code=503, times=2)
    memo = kopf.Memo()
    await start(run_operator, quick(OperatorConfig.from_env(self_signed_env(port))), memo)
    await emulator.wait_for_object(VWCS, None, "kubedgx", timeout=10)
    assert [c.status for c in emulator.calls("get", SECRETS)][:3] == [503, 503, 404]
    metrics: Metrics = memo.metrics
    exposition = metrics.exposition().decode()
    assert 'kubedgx_api_errors_total{code="503",verb="get"} 2.0' in exposition


async def test_a_configuration_it_may_not_create_is_reported_not_retried_at_once(
    self_signed_served: Emulator, kubes: Kubes
) -> None:
    """RBAC without create (the chart's) and no configuration (deleted by hand): the log says what to do."""
    emulator = self_signed_served
    emulator.fail("create", VWCS, code=403)
    hook = WebhookConfig(self_signed=True, service=SERVICE, namespace=NAMESPACE, secret=SECRET)
    k = keeper(hook, await kubes(), "f")
    pair = await k.ensure()
    with pytest.raises(PublishError, match="does not exist and this operator may not create it"):
        await k.inject(pair)
    assert [c.status for c in emulator.calls(resource=VWCS) if c.write] == [403]


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
    body = admission.webhook_configuration(hook, b"CA", namespaces=("ml",))
    assert body["metadata"]["name"] == "mine"
    assert [h["name"].count(".") for h in body["webhooks"]] == [2, 2]
    assert [h["clientConfig"]["service"]["path"] for h in body["webhooks"]] == [JOB_PATH, MOUNT_PATH]
    assert {h["clientConfig"]["caBundle"] for h in body["webhooks"]} == {base64.b64encode(b"CA").decode()}
    assert [h["namespaceSelector"]["matchExpressions"][0]["values"] for h in body["webhooks"]] == [["ml"], ["ml"]]
