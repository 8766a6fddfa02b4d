"""Guard rails (DGXLimits) on the real kube-apiserver: the CRD's own rules, and the webhook refusing an
over-limit job at `kubectl apply` with the message that names the limit and where it is set (issue 31,
"Done when"); the default it warns about is pinned by the operator into the job's status.limits; a Kueue
priority-class label added later is sent to the webhook too (the widened match condition) and refused.

The operator and its webhook run as in test_webhook.py: a local process as the chart's ServiceAccount
(so the chart's RBAC must let it read dgxlimits), certificate mode, the apiserver reaching it through a URL
clientConfig scoped to this module's namespaces.
"""

from __future__ import annotations

import io
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dgx_operator.api.limits import KUEUE_PRIORITY_LABEL
from dgx_operator.cli.main import main
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
from tests.e2e.jobs import command_job, unknown_instance_job
from tests.e2e.kubectl import JOBS, Kubectl, KubectlError, dig, wait_for
from tests.support.ports import free_port

SUFFIX = f"l{secrets.token_hex(3)}"
SCOPE_LABEL = "test.kubedgx.io/limits"
CONFIGURATION = f"kubedgx-limits-test-{SUFFIX}"
DENIED = 'admission webhook "dgxtrainingjobs.kubedgx.io" denied the request'
LIMITS = "dgxlimits"


def dgx_limits(spec: dict[str, Any], name: str = "default") -> dict[str, Any]:
    return {"apiVersion": "kubedgx.io/v1alpha1", "kind": "DGXLimits", "metadata": {"name": name}, "spec": spec}


def established(kubectl: Kubectl, crd: str) -> bool:
    conditions = dig(kubectl.get("customresourcedefinition", crd), "status", "conditions", default=[]) or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return serving_certificate(tmp_path_factory.mktemp("limits-pki"))


@pytest.fixture(scope="module")
def port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane, kubectl: Kubectl, serving: dict[str, Path], port: int,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:  # fmt: skip
    chart: list[Rendered] = install(kubectl)
    wait_for(
        "CRD dgxlimits Established", lambda: established(kubectl, "dgxlimits.kubedgx.io"), timeout=60, interval=0.3
    )
    work = tmp_path_factory.mktemp("operator-limits")
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
    """The test's namespace, inside the webhook's namespaceSelector, once the apiserver calls the webhook there."""
    kubectl.run("label", "namespace", str(namespace.namespace), f"{SCOPE_LABEL}={SUFFIX}")
    text = json.dumps(unknown_instance_job("probe"))

    def refused() -> bool:
        proc = namespace.run("apply", "--dry-run=server", "-f", "-", input=text, check=False)
        return proc.returncode != 0 and "denied the request" in proc.stderr

    wait_for("the apiserver to call the webhook", refused, timeout=30, interval=0.5)
    return namespace


def test_a_namespace_has_one_dgxlimits_named_default_and_a_default_over_its_maximum_is_refused(
    namespace: Kubectl, operator: Operator
) -> None:
    """The CRD's CEL rules, by the apiserver itself (no webhook involved)."""
    with pytest.raises(KubectlError) as named:
        namespace.apply(dgx_limits({}, name="team"))
    assert "a namespace has one DGXLimits, named default: rename it to default" in named.value.stderr
    with pytest.raises(KubectlError) as inverted:
        namespace.apply(dgx_limits({"maxDuration": {"default": "96h", "max": "72h"}}))
    assert "must not exceed max: a job that takes the default would be refused" in inverted.value.stderr
    namespace.apply(dgx_limits({"maxDuration": {"default": "24h", "max": "72h"}}))
    assert dig(namespace.get(LIMITS, "default"), "spec", "maxDuration", "max") == "72h"


def test_an_over_limit_job_is_refused_at_kubectl_apply_with_the_limit_and_its_source(scoped: Kubectl) -> None:
    ns = scoped.namespace
    scoped.apply(dgx_limits({"maxDuration": {"default": "24h", "max": "72h"}, "priorities": ["low", "normal"]}))
    job = command_job("long")
    job["spec"]["maxDuration"] = "96h"
    job["spec"]["priority"] = "high"
    with pytest.raises(KubectlError) as refused:
        scoped.apply(job)
    message = refused.value.stderr
    assert DENIED in message
    assert (
        f"spec.maxDuration: 96h exceeds the maximum 72h set by DGXLimits {ns}/default (spec.maxDuration.max)" in message
    )
    assert (
        f"spec.priority: high is not allowed in namespace {ns} (DGXLimits {ns}/default allows low, normal)" in message
    )
    assert scoped.get(JOBS, "long") is None


def test_the_default_is_a_warning_at_apply_and_pinned_in_the_jobs_status(scoped: Kubectl) -> None:
    ns = scoped.namespace
    scoped.apply(dgx_limits({"maxDuration": {"default": "24h", "max": "72h"}}))
    job = command_job("plain")
    del job["spec"]["maxDuration"]  # the e2e job sets one
    proc = scoped.apply(job)
    assert f"spec.maxDuration unset: 24h applies (DGXLimits {ns}/default)" in proc.stderr, proc.stderr
    assert dig(scoped.get(JOBS, "plain"), "spec", "maxDuration") is None  # never written into the spec
    wait_for(
        "the operator to pin the default",
        lambda: dig(scoped.get(JOBS, "plain"), "status", "limits", "maxDuration") == "24h",
        timeout=60,
        interval=0.3,
    )
    assert dig(scoped.get(JOBS, "plain"), "status", "limits", "source") == f"DGXLimits {ns}/default"


def kubedgx(k: Kubectl, *argv: str) -> tuple[int, str, str]:
    """``kubedgx ARGV`` in this process with the test's kubeconfig and namespace."""
    out, err = io.StringIO(), io.StringIO()
    assert k.kubeconfig
    assert k.namespace
    flags = ["--kubeconfig", k.kubeconfig, "--context", k.context, "-n", k.namespace]
    return main([*argv, *flags], out=out, err=err, stdin=io.StringIO("")), out.getvalue(), err.getvalue()


def test_kubedgx_submit_shows_the_webhooks_refusal_and_warnings_as_kubectl_does(
    scoped: Kubectl, tmp_path: Path
) -> None:
    """`kubedgx submit` (issue 33) through the webhook: the refusal in the webhook's words, nothing
    created; a default's warning printed once, as kubectl prints it."""
    ns = scoped.namespace
    scoped.apply(dgx_limits({"maxDuration": {"default": "24h", "max": "72h"}}))
    job = command_job("sublong")
    job["spec"]["maxDuration"] = "96h"
    path = tmp_path / "long.yaml"
    path.write_text(json.dumps(job), encoding="utf-8")
    code, out, err = kubedgx(scoped, "submit", str(path))
    assert code == 1, (out, err)
    assert DENIED in err
    assert f"spec.maxDuration: 96h exceeds the maximum 72h set by DGXLimits {ns}/default" in err
    assert "forbidden (403)" not in err
    assert scoped.get(JOBS, "sublong") is None

    plain = command_job("subplain")
    del plain["spec"]["maxDuration"]
    path.write_text(json.dumps(plain), encoding="utf-8")
    code, out, err = kubedgx(scoped, "submit", str(path))
    assert code == 0, err
    assert out.strip() == "dgxtrainingjob/subplain created"
    warning = f"Warning: spec.maxDuration unset: 24h applies (DGXLimits {ns}/default)"
    assert [line for line in err.splitlines() if line.startswith("Warning:")] == [warning], err


def test_a_kueue_priority_class_label_added_later_is_refused(scoped: Kubectl) -> None:
    """A metadata-only update: the match condition sends it because that label changed (open question 10)."""
    ns = scoped.namespace
    scoped.apply(dgx_limits({"kueuePriorityClasses": ["research"]}))
    scoped.apply(command_job("queued"))
    with pytest.raises(KubectlError) as refused:
        scoped.run("label", JOBS, "queued", f"{KUEUE_PRIORITY_LABEL}=production")
    assert (
        f'metadata.labels["{KUEUE_PRIORITY_LABEL}"]: production is not allowed in namespace {ns} '
        f"(DGXLimits {ns}/default allows research)"
    ) in refused.value.stderr
    assert dig(scoped.get(JOBS, "queued"), "metadata", "labels", KUEUE_PRIORITY_LABEL) is None
    scoped.run("label", JOBS, "queued", f"{KUEUE_PRIORITY_LABEL}=research")
    assert dig(scoped.get(JOBS, "queued"), "metadata", "labels", KUEUE_PRIORITY_LABEL) == "research"
    scoped.run("label", JOBS, "queued", "team=nlp")  # other labels are never sent


def test_a_job_that_cannot_fit_a_budget_is_applied_with_kubectl_printing_the_warning(scoped: Kubectl) -> None:
    """DGXBudgets (issue 31): the webhook, as the chart's ServiceAccount, lists the namespace's budgets and jobs and
    warns, never refuses; kubectl prints the admission warning on stderr."""
    ns = scoped.namespace
    wait_for(
        "CRD dgxbudgets Established", lambda: established(scoped, "dgxbudgets.kubedgx.io"), timeout=60, interval=0.3
    )
    budget: dict[str, Any] = {
        "apiVersion": "kubedgx.io/v1alpha1",
        "kind": "DGXBudget",
        "metadata": {"name": "small"},
        "spec": {"limits": {"gpuHours": "1"}, "period": {"calendar": "Month"}},
    }
    scoped.apply(budget)
    proc = scoped.apply(command_job("over"))  # 1 node x 8 GPUs x 30m = 4 GPU-hours
    assert (
        f"Warning: DGXBudget {ns}/small: this run's worst case 1 node x 8 GPUs x 30m = 4.00 GPU-hours does not fit: "
        "spent 0.00 + committed 0.00 of 1.00 GPU-hours ("
    ) in proc.stderr, proc.stderr
    assert "this job will wait (BudgetExceeded) until then" in proc.stderr, proc.stderr
    assert scoped.get(JOBS, "over") is not None
    budget["spec"]["limits"] = {"gpuHours": "100"}
    scoped.apply(budget)
    proc = scoped.apply(command_job("fits"))
    assert "DGXBudget" not in proc.stderr, proc.stderr
