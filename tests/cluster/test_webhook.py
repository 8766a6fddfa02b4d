"""The validating webhook, called by the real kube-apiserver over TLS.

The operator runs as a local process in certificate mode (the cert-manager mode of the chart) with a
serving certificate for 127.0.0.1 signed by a CA of the test's own; the apiserver reaches it through
a URL clientConfig, because a Service's endpoints need a routable pod IP and kwok's pods have none.
The webhooks are otherwise exactly the operator's own ValidatingWebhookConfiguration
(admission.webhook_configuration: rules, failure policy, match conditions), scoped by a
namespaceSelector to this module's namespaces so no other test meets them.

The webhook dry-runs each job's children against this apiserver, with PodSecurity, Priority and
ResourceQuota admission on: what they refuse for good is refused at `kubectl apply`, what the
cluster may lift (quota) is admitted with a warning. The chart maps spec.priority high to a
PriorityClass of this module's own (``ABSENT_CLASS``), which exists when the operator starts (a class
missing then is dropped with a warning: dgx_operator/runtime/priorities.py) and is deleted by the test that
needs it missing, so that no cluster-scoped object other tests use is changed.
"""

from __future__ import annotations

import copy
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dgx_operator.api import DGXTrainingJob
from dgx_operator.catalog import Catalog
from dgx_operator.render import BuildContext, Defaults
from dgx_operator.webhook import admission
from tests.chart.conftest import Rendered
from tests.cluster.controlplane import ControlPlane
from tests.cluster.operator import (
    Operator,
    chart_operator,
    install,
    serving_certificate,
    url_webhook_configuration,
    webhook_args,
)
from tests.conftest import BASE_JOB, with_changes
from tests.e2e.jobs import command_job, unknown_instance_job
from tests.e2e.kubectl import JOBS, Kubectl, KubectlError, dig, wait_for
from tests.support.ports import free_port
from tests.unit.bad_input_rows import ACCEPTED_NEAR_WEBHOOK_ROWS, WEBHOOK_ROWS, manifest

SUFFIX = f"w{secrets.token_hex(3)}"  # a label value: never all digits or 839e12
SCOPE_LABEL = "test.kubedgx.io/webhook"
CONFIGURATION = f"kubedgx-webhook-test-{SUFFIX}"
#: spec.priority high maps to this PriorityClass, which nobody creates.
ABSENT_CLASS = f"kubedgx-absent-{SUFFIX}"
DENIED = 'admission webhook "dgxtrainingjobs.kubedgx.io" denied the request'


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return serving_certificate(tmp_path_factory.mktemp("webhook-pki"))


@pytest.fixture(scope="module")
def port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane, kubectl: Kubectl, serving: dict[str, Path], port: int,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:  # fmt: skip
    install(kubectl)  # the default PriorityClasses
    chart: list[Rendered] = install(kubectl, {"priorityClasses": {"create": False, "high": {"name": ABSENT_CLASS}}})
    kubectl.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": ABSENT_CLASS},
                   "value": 100000})  # fmt: skip
    work = tmp_path_factory.mktemp("operator-webhook")
    try:
        with chart_operator(control_plane, kubectl, __name__, chart, work, webhook_args(serving, port)) as op:
            yield op
    finally:
        kubectl.run("delete", "priorityclass", ABSENT_CLASS, "--ignore-not-found")
        install(kubectl)  # the chart's default RBAC again


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
    """Its children dry-run clean: no warning either (a warning would mean the dry-run could not be made,
    e.g. the chart's RBAC refusing the operator's create)."""
    proc = scoped.apply(command_job("good"))
    assert scoped.get(JOBS, "good") is not None
    assert "Warning" not in proc.stderr, proc.stderr


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


# -- the children, dry-run by the webhook against this apiserver -------------------------------------------------


def input_mount(name: str, cache: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"source": "s3://bucket/prefix"}
    if cache is not None:
        spec["cache"] = cache
    return {"apiVersion": "kubedgx.io/v1alpha1", "kind": "DGXDataMount", "metadata": {"name": name}, "spec": spec}


def mounting(job: dict[str, Any], mount: str) -> dict[str, Any]:
    job["spec"]["dataMounts"] = [{"name": mount, "mountPath": "/data"}]
    return job


def test_pod_security_baseline_refuses_a_job_whose_workers_cache_on_host_path(
    scoped: Kubectl, kubectl: Kubectl
) -> None:
    """An input mount is cached in a hostPath directory of the node by default, which PodSecurity's baseline
    level forbids: the operator could never create a worker. `kubectl apply` says so with the apiserver's
    words, and nothing is stored; the same job with a PVC cache (an ephemeral volume) is admitted."""
    kubectl.run("label", "namespace", str(scoped.namespace), "pod-security.kubernetes.io/enforce=baseline")
    scoped.apply(input_mount("data"), input_mount("volume", {"type": "pvc", "size": "10Gi"}))
    with pytest.raises(KubectlError) as refused:
        scoped.apply(mounting(command_job("cached"), "data"))
    assert (
        f'{DENIED}: spec: the apiserver would refuse worker pod cached-worker-0: pods "cached-worker-0" is '
        'forbidden: violates PodSecurity "baseline:latest": hostPath volumes (volume "data-0")'
    ) in refused.value.stderr
    assert scoped.get(JOBS, "cached") is None
    proc = scoped.apply(mounting(command_job("on-volume"), "volume"))
    assert scoped.get(JOBS, "on-volume") is not None
    assert "Warning" not in proc.stderr, proc.stderr


def test_a_priority_whose_class_does_not_exist_is_refused(scoped: Kubectl, kubectl: Kubectl) -> None:
    """A class deleted after the operator started (one missing at its start is dropped, with a warning)."""
    kubectl.run("delete", "priorityclass", ABSENT_CLASS)
    job = command_job("urgent")
    job["spec"]["priority"] = "high"
    with pytest.raises(KubectlError) as refused:
        scoped.apply(job)
    assert (
        f'{DENIED}: spec: the apiserver would refuse worker pod urgent-worker-0: pods "urgent-worker-0" is '
        f"forbidden: no PriorityClass with name {ABSENT_CLASS} was found"
    ) in refused.value.stderr
    assert scoped.get(JOBS, "urgent") is None
    # The classes that exist (the chart's) are fine.
    job["spec"]["priority"] = "low"
    scoped.apply(job)
    assert dig(scoped.get(JOBS, "urgent"), "spec", "priority") == "low"
    # Raising it later to the missing class is this edit's fault: refused too, and the stored spec stays.
    with pytest.raises(KubectlError, match="no PriorityClass with name"):
        scoped.patch(JOBS, "urgent", {"spec": {"priority": "high"}})
    assert dig(scoped.get(JOBS, "urgent"), "spec", "priority") == "low"


def test_an_exhausted_quota_admits_the_job_with_a_warning(scoped: Kubectl) -> None:
    """Quota is the cluster's to free (other jobs ending, an admin), not a fault of the spec."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-pods"},
        "spec": {"hard": {"pods": "0"}},
    }
    scoped.apply(quota)
    # Until the quota controller has computed its usage the apiserver refuses with "status unknown for quota";
    # wait for it, so that this test sees "exceeded quota".
    wait_for("the quota's usage", lambda: dig(scoped.get("resourcequota", "no-pods"), "status", "hard"),
             timeout=30, interval=0.3)  # fmt: skip
    proc = scoped.apply(command_job("queued"))
    assert scoped.get(JOBS, "queued") is not None
    assert (
        'Warning: spec: the apiserver would not create worker pod queued-worker-0 now: pods "queued-worker-0" is '
        "forbidden: exceeded quota: no-pods"
    ) in proc.stderr, proc.stderr


# -- what kubedgx validate refuses for the children, the apiserver refuses too -------------------------------------


def children_of(doc: dict[str, Any], namespace: str) -> list[tuple[str, dict[str, Any]]]:
    """The children the webhook dry-runs (admission.children), of a job in ``namespace``, with no
    PriorityClass (none is installed for this)."""
    job = DGXTrainingJob.model_validate({**doc, "metadata": {**doc["metadata"], "namespace": namespace}})
    return admission.children(job, BuildContext(catalog=Catalog.load(), defaults=Defaults(priority_classes={})))


def refusals(ns: Kubectl, doc: dict[str, Any]) -> list[str]:
    """What the apiserver answers a server-side dry-run create of each child with, where it refuses."""
    out = []
    for label, obj in children_of(doc, str(ns.namespace)):
        proc = ns.run("create", "--dry-run=server", "-f", "-", input=json.dumps(obj), check=False)
        if proc.returncode != 0:
            out.append(f"{label}: {proc.stderr.strip()}")
    return out


JOB_WEBHOOK_ROWS = [r for r in WEBHOOK_ROWS if r.base == "job"]


def test_every_job_the_validator_refuses_for_its_children_has_a_child_the_apiserver_refuses(
    namespace: Kubectl,
) -> None:
    """The Validator's rules about children (validation.children_problems, the webhook rows of
    tests/unit/test_bad_input.py) claim the apiserver would refuse them; here it says so itself, for each row."""
    assert len(JOB_WEBHOOK_ROWS) >= 8
    accepted = [r.id for r in JOB_WEBHOOK_ROWS if not refusals(namespace, manifest(r))]
    assert accepted == [], "the apiserver creates the children of these, which the Validator refuses"


def test_what_the_validator_accepts_next_to_those_rules_the_apiserver_accepts(namespace: Kubectl) -> None:
    """No false refusal: the base job, and each value the unit tests accept next to a webhook row."""
    docs = {"base": BASE_JOB} | {k: with_changes(BASE_JOB, v) for k, v in ACCEPTED_NEAR_WEBHOOK_ROWS.items()}
    refused = {name: found for name, doc in docs.items() if (found := refusals(namespace, doc))}
    assert refused == {}
