"""The validating webhook, called by the real kube-apiserver over TLS.

The operator runs as a local process in certificate mode (the cert-manager mode of the chart) with a
serving certificate for 127.0.0.1 signed by a CA of the test's own; the apiserver reaches it through
a URL clientConfig, because a Service's endpoints need a routable pod IP and kwok's pods have none.
The webhooks are otherwise exactly the operator's own ValidatingWebhookConfiguration
(admission.webhook_configuration: rules, failure policy, match conditions), scoped by a
namespaceSelector to this module's namespaces so no other test meets them.
"""

from __future__ import annotations

import copy
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chart.conftest import Rendered
from tests.cluster.controlplane import ControlPlane, free_port
from tests.cluster.operator import (
    Operator,
    chart_operator,
    install,
    serving_certificate,
    url_webhook_configuration,
    webhook_args,
)
from tests.e2e.jobs import command_job, unknown_instance_job
from tests.e2e.kubectl import JOBS, Kubectl, KubectlError, dig, wait_for

SUFFIX = f"w{secrets.token_hex(3)}"  # a label value: never all digits or 839e12
SCOPE_LABEL = "test.kubedgx.io/webhook"
CONFIGURATION = f"kubedgx-webhook-test-{SUFFIX}"


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return serving_certificate(tmp_path_factory.mktemp("webhook-pki"))


@pytest.fixture(scope="module")
def port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane, kubectl: Kubectl, serving: dict[str, Path], port: int,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:  # fmt: skip
    chart: list[Rendered] = install(kubectl)
    work = tmp_path_factory.mktemp("operator-webhook")
    with chart_operator(control_plane, kubectl, __name__, chart, work, webhook_args(serving, port)) as op:
        yield op


@pytest.fixture(scope="module")
def webhook(operator: Operator, kubectl: Kubectl, serving: dict[str, Path], port: int) -> Iterator[dict[str, Any]]:
    config = url_webhook_configuration(CONFIGURATION, serving["ca"].read_bytes(), port, {SCOPE_LABEL: SUFFIX})
    kubectl.apply(config)
    yield config
    kubectl.run("delete", "validatingwebhookconfiguration", CONFIGURATION, "--ignore-not-found")


@pytest.fixture
def scoped(namespace: Kubectl, kubectl: Kubectl, webhook: dict[str, Any]) -> Kubectl:
    """The test's namespace, inside the webhook's namespaceSelector; returns once the apiserver calls
    the webhook there (a bad job is refused on a server-side dry run)."""
    kubectl.run("label", "namespace", str(namespace.namespace), f"{SCOPE_LABEL}={SUFFIX}")
    text = json.dumps(unknown_instance_job("probe"))

    def refused() -> bool:
        proc = namespace.run("apply", "--dry-run=server", "-f", "-", input=text, check=False)
        return proc.returncode != 0 and "denied the request" in proc.stderr

    wait_for("the apiserver to call the webhook", refused, timeout=30, interval=0.5)
    return namespace


def test_the_apiserver_calls_the_webhook_over_tls_and_refuses_with_its_message(scoped: Kubectl) -> None:
    with pytest.raises(KubectlError) as refused:
        scoped.apply(unknown_instance_job("bad"))
    message = refused.value.stderr
    assert 'admission webhook "dgxtrainingjobs.kubedgx.io" denied the request' in message
    assert "spec.instance" in message
    assert scoped.get(JOBS, "bad") is None


def test_a_valid_job_passes_the_webhook(scoped: Kubectl) -> None:
    scoped.apply(command_job("good"))
    assert scoped.get(JOBS, "good") is not None


def test_with_the_webhook_down_deletes_and_finalizer_removal_still_go_through(
    scoped: Kubectl, kubectl: Kubectl, operator: Operator, webhook: dict[str, Any]
) -> None:
    """failurePolicy Fail must not hold a job hostage: deleting it, and the operator's removal of its
    finalizer (an UPDATE of metadata only), go through while the webhook cannot be reached."""
    scoped.apply(command_job("hostage"))
    wait_for("the operator's finalizer", lambda: dig(scoped.get(JOBS, "hostage"), "metadata", "finalizers"),
             timeout=30, interval=0.3)  # fmt: skip
    down = copy.deepcopy(webhook)
    closed = free_port()
    for hook in down["webhooks"]:
        hook["clientConfig"]["url"] = f"https://127.0.0.1:{closed}/nowhere"
    kubectl.apply(down)
    try:
        with pytest.raises(KubectlError, match="failed calling webhook"):
            scoped.apply(command_job("while-down"))  # the webhook is really down: a CREATE fails
        scoped.delete(JOBS, "hostage")
        wait_for("the job to be gone (finalizer released through the apiserver)",
                 lambda: scoped.get(JOBS, "hostage") is None, timeout=60, interval=0.5)  # fmt: skip
    finally:
        kubectl.apply(webhook)


#: spec.env values at their maxLength (128 KiB): the largest free-form field a valid spec has.
ENV_VALUE_MAX = 131072


def large_job(name: str, size: int) -> dict[str, Any]:
    """A valid job whose spec holds about ``size`` bytes, in spec.env values."""
    job = command_job(name)
    count = -(-size // ENV_VALUE_MAX)
    job["spec"]["env"] = [{"name": f"PAD_{i}", "value": "x" * ENV_VALUE_MAX} for i in range(count)]
    return job


def test_a_job_over_1_mib_is_created_updated_and_deleted_with_the_webhook_in_the_loop(scoped: Kubectl) -> None:
    """The UPDATE review carries the object and the old one (2.25 MiB here); aiohttp's default limit of 1 MiB
    answered it 413, and failurePolicy Fail turned that into a refused write. Not `kubectl apply`: its
    last-applied annotation would hold the whole object, over the apiserver's 256 KiB for annotations."""
    job = large_job("large", 1152 * 2**10)
    text = json.dumps(job)
    assert len(text) > 1.1 * 2**20
    # The webhook reads the large CREATE, rather than waving it through: a catalog problem is refused.
    unknown = unknown_instance_job()["spec"]["instance"]
    bad = large_job("large-bad", 1152 * 2**10)
    bad["spec"]["instance"] = unknown
    with pytest.raises(KubectlError) as refused:
        scoped.run("create", "-f", "-", input=json.dumps(bad))
    assert 'admission webhook "dgxtrainingjobs.kubedgx.io" denied the request' in refused.value.stderr
    assert "spec.instance" in refused.value.stderr

    scoped.run("create", "-f", "-", input=text)
    scoped.patch(JOBS, "large", {"spec": {"maxDuration": "45m"}})
    assert dig(scoped.get(JOBS, "large"), "spec", "maxDuration") == "45m"
    with pytest.raises(KubectlError) as refused:
        scoped.patch(JOBS, "large", {"spec": {"instance": unknown}})
    assert 'admission webhook "dgxtrainingjobs.kubedgx.io" denied the request' in refused.value.stderr
    assert "spec.instance" in refused.value.stderr

    scoped.delete(JOBS, "large")
    wait_for("the large job to be gone", lambda: scoped.get(JOBS, "large") is None, timeout=60, interval=0.5)
