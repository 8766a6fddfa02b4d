"""The chart's opt-in objects and its `helm test` hook on the real control plane (issue 17, item 4).

A release installed by Helm (helm-python-sdk) with the NetworkPolicy (egress restricted too), the
PodMonitor (a stand-in CRD: prometheus-operator is not installed here), a CA bundle for object
stores and the test hook on; its operator pods and the hook's pod run as local processes
(tests/cluster/podrunner.py, in the control plane's operator slot, as tests/cluster/test_ha.py does),
so the webhook the hook calls is the chart's own replicas, reached by the apiserver through the
chart's Service and TLS.

What is real: Helm's install, its `helm test` action (hooks created in weight order, the test pod
watched to Succeeded or Failed, the succeeded hooks deleted), the apiserver's validation of every
object, RBAC of the hook's ServiceAccount, the dry-run creates and the validating webhook. What
kwok and the runner stand in for: the kubelet. No CNI enforces the NetworkPolicy here: the apiserver
accepting it is what is shown; its rules are checked against the pods in tests/chart/test_compose.py.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import helm_python as helm
import pytest

from tests.chart.conftest import CHART, Rendered, is_hook
from tests.cluster.chart_helpers import render, stub_crd
from tests.cluster.controlplane import CONTEXT, ControlPlane
from tests.cluster.podrunner import NODE_SELECTOR, PodRunner, can_add_addresses, operator_executables
from tests.e2e.kubectl import Kubectl, dig, wait_for
from tests.private_ca import PrivateCA

RELEASE = "hooks"
FULLNAME = "hooks-kubedgx"
NAMESPACE = "kubedgx-hooks"
JOBS_NAMESPACE = "hooks-jobs"
OWNER = "tests/cluster/test_chart_hooks"
OPERATOR_IMAGE = "ghcr.io/kubedgx/operator"
SELECTOR = {"app.kubernetes.io/instance": RELEASE, "app.kubernetes.io/component": "operator"}
TEST_POD = f"{FULLNAME}-test"
TIMEOUT = 120
PODMONITOR_CRD = stub_crd("monitoring.coreos.com", "PodMonitor", "podmonitors")
CA = PrivateCA("kubedgx hooks test CA")

#: An on-premises object store the operator may reach (egress restricted to it, DNS and the apiserver).
MINIO_RULE = {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}], "ports": [{"port": 9000, "protocol": "TCP"}]}
PODMONITORS = "podmonitors.monitoring.coreos.com"

VALUES: dict[str, Any] = {
    # The CRDs and PriorityClasses exist already (the base chart objects, fixture ``chart``).
    "crds": {"enabled": False},
    "priorityClasses": {"create": False},
    "watchNamespaces": [JOBS_NAMESPACE],
    "kueue": {"enabled": False},
    "leaderElection": {"leaseDuration": "6s", "renewDeadline": "4s", "retryPeriod": "1s"},
    "shutdownDelay": "1s",
    "networkPolicy": {
        "enabled": True,
        "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        "egress": {"enabled": True, "objectStores": [MINIO_RULE]},
    },
    "metrics": {"podMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
    "caBundle": {"pem": CA.pem},
    "tests": {"timeoutSeconds": 30},
    "nodeSelector": NODE_SELECTOR,
}

pytestmark = pytest.mark.skipif(
    (why := can_add_addresses()) is not None, reason=f"the operator's pods need addresses of their own: {why}"
)


@dataclass
class Hooks:
    """The release, the runner of its pods, kubectl in its namespace."""

    plane: ControlPlane
    runner: PodRunner
    config: helm.Config
    admin: Kubectl
    ops: Kubectl

    def stop(self) -> None:
        """The control plane's operator slot calls this when another module takes it."""
        with contextlib.suppress(Exception):
            self.config.uninstall(RELEASE, ignore_not_found=True)
        self.runner.stop()
        self.config.close()

    def ready(self) -> bool:
        dep = self.ops.get("deployment", f"{FULLNAME}-operator")
        status = (dep or {}).get("status") or {}
        want = dig(dep, "spec", "replicas")
        pods = [p for p in self.ops.select("pods", SELECTOR) if not p["metadata"].get("deletionTimestamp")]
        return bool(
            dep is not None
            and status.get("observedGeneration") == dep["metadata"]["generation"]
            and status.get("readyReplicas") == want == status.get("updatedReplicas") == status.get("replicas")
            and len(pods) == want
        )

    def wait_ready(self) -> None:
        wait_for("the operator's replicas ready", self.ready, timeout=TIMEOUT, interval=0.3, diagnose=self.diagnose)

    def test_log(self) -> str:
        """What the latest hook pod's container printed (the runner keeps its log after the pod is deleted)."""
        logs = sorted(self.runner.workdir.glob(f"{NAMESPACE}.{TEST_POD}.*/*.log"), key=lambda p: p.stat().st_mtime)
        return logs[-1].read_text(errors="replace") if logs else ""

    def diagnose(self) -> str:
        lines = [f"runner errors: {self.runner.errors[-5:]}"]
        for p in self.ops.select("pods"):
            lines.append(f"{p['metadata']['name']}: {dig(p, 'status', 'phase')} "
                         f"{dig(p, 'status', 'containerStatuses', 0, 'state')}")  # fmt: skip
        for name, text in self.runner.logs():
            lines.append(f"--- {name}\n" + "\n".join(text.splitlines()[-15:]))
        return "\n".join(lines)


@pytest.fixture(scope="module")
def hooks(
    control_plane: ControlPlane, kubectl: Kubectl, chart: list[Rendered], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Hooks]:
    """The release installed with VALUES, its replicas running (they read the CA bundle at startup: a
    bundle they could not read would stop them with exit 2, and they would never be ready)."""
    for name in (NAMESPACE, JOBS_NAMESPACE):
        kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    created_crd = kubectl.get("customresourcedefinition", PODMONITORS) is None
    if created_crd:
        kubectl.apply(PODMONITOR_CRD)

    def established() -> bool:
        conditions = dig(kubectl.get("customresourcedefinition", PODMONITORS), "status", "conditions", default=[])
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions or [])

    wait_for("the PodMonitor stand-in CRD Established", established, timeout=60, interval=0.3)
    workdir = tmp_path_factory.mktemp("hooks")

    def start() -> Hooks:
        runner = PodRunner(control_plane, workdir / "pods", operator_executables(OPERATOR_IMAGE), index=2)
        runner.start()
        config = helm.Config(kubeconfig_path=control_plane.kubeconfig, kube_context=CONTEXT, namespace=NAMESPACE)
        running = Hooks(control_plane, runner, config, kubectl, kubectl.in_namespace(NAMESPACE))
        try:
            summary = config.install(str(CHART), RELEASE, VALUES)
            assert summary["status"] == "deployed", summary
            running.wait_ready()
        except BaseException:
            running.stop()
            raise
        return running

    running = control_plane.slot.take(OWNER, start)
    try:
        yield running
    finally:
        control_plane.slot.release(OWNER)
        kubectl.run("delete", "namespace", JOBS_NAMESPACE, NAMESPACE, "--wait=false", "--ignore-not-found")
        if created_crd:
            kubectl.run("delete", "customresourcedefinition", PODMONITORS, "--wait=false")


def rendered(values: dict[str, Any]) -> list[dict[str, Any]]:
    return render(CHART, values, name=RELEASE, namespace=NAMESPACE)


def test_the_apiserver_keeps_the_network_policy_the_pod_monitor_and_the_ca_bundle_as_rendered(hooks: Hooks) -> None:
    objects = rendered(VALUES)
    policy = next(o for o in objects if o["kind"] == "NetworkPolicy")
    stored = hooks.ops.get("networkpolicy", f"{FULLNAME}-operator")
    assert stored is not None
    assert stored["spec"] == policy["spec"]  # defaulting adds nothing: every field was given
    monitor = next(o for o in objects if o["kind"] == "PodMonitor")
    assert dig(hooks.ops.get("podmonitor", f"{FULLNAME}-operator"), "spec") == monitor["spec"]
    bundle = hooks.ops.get("configmap", f"{FULLNAME}-ca-bundle")
    assert dig(bundle, "data", "ca.crt") == CA.pem
    # The replicas run with it mounted where KUBEDGX_CA_BUNDLE points (the runner writes the volume).
    pods = hooks.ops.select("pods", SELECTOR)
    assert pods
    for pod in pods:
        assert pod["spec"].get("nodeName") in hooks.runner.nodes, hooks.diagnose()
        mounted = list(hooks.runner.workdir.glob(f"{NAMESPACE}.{pod['metadata']['name']}.*/volumes/ca-bundle/ca.crt"))
        assert len(mounted) == 1, hooks.diagnose()
        assert mounted[0].read_text(encoding="utf-8") == CA.pem
    # helm install applied no hook: the test's account and pod appear only with helm test.
    assert hooks.ops.get("serviceaccount", TEST_POD) is None
    assert hooks.ops.get("pod", TEST_POD) is None


def test_helm_test_runs_the_check_in_a_pod_and_passes_against_the_chart_s_replicas(hooks: Hooks) -> None:
    """`helm test hooks`: the ServiceAccount, Role and RoleBinding first (weight -1), then the pod, which
    the runner runs as `kubedgx check-install` with that account's token; it dry-runs a job in the
    watched namespace through the webhook (the chart's replicas, over the Service's TLS) and sees the
    webhook refuse an unknown instance type. Passed, Helm deletes every hook."""
    answer = hooks.config.test(RELEASE, timeout=TIMEOUT)
    assert dig(answer, "release", "status") == "deployed", answer
    log = hooks.test_log()
    assert "4 of 4 checks passed" in log, hooks.diagnose()
    assert f"kubedgx check-install: namespace {JOBS_NAMESPACE}, catalog /" in log
    assert re.search(r"^ok {4}a DGXTrainingJob on dgx\S+ is accepted", log, re.M), log
    assert 'admission webhook "dgxtrainingjobs.kubedgx.io" denied the request: ' in log, log
    assert "unknown instance type" in log, log
    placed = {"pod": NAMESPACE, "serviceaccount": NAMESPACE, "role": JOBS_NAMESPACE, "rolebinding": JOBS_NAMESPACE}

    def all_deleted() -> bool | None:
        left = [kind for kind, ns in placed.items() if hooks.admin.in_namespace(ns).get(kind, TEST_POD) is not None]
        return None if left else True

    wait_for("the succeeded hooks deleted", all_deleted, timeout=60, interval=0.3)
    # The dry runs stored nothing.
    assert hooks.admin.in_namespace(JOBS_NAMESPACE).select("dgxtrainingjobs") == []


def test_the_hook_s_account_may_create_jobs_only_where_it_checks_and_nothing_else(
    hooks: Hooks, control_plane: ControlPlane
) -> None:
    """The Role as the apiserver's authorizer reads it, created from the chart's hook objects."""
    [role] = [o for o in render_hooks() if o["kind"] == "Role"]
    user = f"system:serviceaccount:{NAMESPACE}:{TEST_POD}"

    def allowed(namespace: str, verb: str, resource: str) -> bool:
        attributes = {"namespace": namespace, "verb": verb, "group": "kubedgx.io", "resource": resource}
        groups = ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"]
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "resourceAttributes": attributes},
        }
        status, answer = control_plane.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body)
        assert status == 201, answer
        return bool(dig(answer, "status", "allowed"))

    objects = [o for o in render_hooks() if o["kind"] in ("Role", "RoleBinding")]
    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    jobs = hooks.admin.in_namespace(JOBS_NAMESPACE)
    jobs.run("apply", "-f", "-", input=text)
    try:
        assert role["metadata"]["namespace"] == JOBS_NAMESPACE
        assert allowed(JOBS_NAMESPACE, "create", "dgxtrainingjobs")
        assert not allowed(JOBS_NAMESPACE, "delete", "dgxtrainingjobs")
        assert not allowed(JOBS_NAMESPACE, "get", "dgxtrainingjobs")
        assert not allowed(JOBS_NAMESPACE, "create", "dgxdatamounts")
        assert not allowed(NAMESPACE, "create", "dgxtrainingjobs")
    finally:
        jobs.run("delete", "-f", "-", "--ignore-not-found", input=text)


def render_hooks() -> list[dict[str, Any]]:
    from tests.chart.conftest import render as render_chart

    return [r.obj for r in render_chart(VALUES, name=RELEASE, namespace=NAMESPACE, hooks=True) if is_hook(r.obj)]


def test_the_apiserver_takes_a_preemption_policy_per_priority_class(hooks: Hooks) -> None:
    """preemptionPolicy Never on the low class (server-side dry run: the classes are cluster-scoped,
    and the session's own, of these names, exist)."""
    levels = {
        "low": {"name": "hooks-low", "preemptionPolicy": "Never"},
        "normal": {"name": "hooks-normal"},
        "high": {"name": "hooks-high", "preemptionPolicy": "PreemptLowerPriority"},
    }
    values = {"priorityClasses": levels}
    classes = [o for o in rendered(values) if o["kind"] == "PriorityClass"]
    assert {o["metadata"]["name"]: o.get("preemptionPolicy") for o in classes} == {
        "hooks-low": "Never", "hooks-normal": None, "hooks-high": "PreemptLowerPriority"}  # fmt: skip
    stored = {}
    for obj in classes:
        answer = hooks.admin.run("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(obj))
        stored[obj["metadata"]["name"]] = json.loads(answer.stdout)["preemptionPolicy"]
    # Unset, the apiserver's default: what the chart leaves out is what Kubernetes would choose.
    assert stored == {
        "hooks-low": "Never",
        "hooks-normal": "PreemptLowerPriority",
        "hooks-high": "PreemptLowerPriority",
    }
    bad = json.dumps({**classes[0], "preemptionPolicy": "Sometimes"})
    refused = hooks.admin.run("create", "--dry-run=server", "-f", "-", input=bad, check=False)
    assert refused.returncode != 0
    assert "preemptionPolicy" in refused.stderr, refused.stderr  # the chart's enum is the apiserver's


def test_helm_test_fails_naming_the_check_when_the_webhook_is_not_called(hooks: Hooks) -> None:
    """The check can fail: with no replica and failurePolicy Ignore (a webhook that is never called lets
    every job through) a job on an unknown instance type is accepted, and the test says so. Helm reports
    the failed hook; the pod and its account stay for `kubectl logs` (hook-succeeded only)."""
    broken = {**VALUES, "replicaCount": 0, "webhook": {"failurePolicy": "Ignore"}}
    summary = hooks.config.upgrade(str(CHART), RELEASE, broken)
    assert summary["status"] == "deployed", summary
    wait_for("no operator pod", lambda: not hooks.ops.select("pods", SELECTOR), timeout=TIMEOUT, interval=0.3)
    with pytest.raises(helm.HelmReleaseError, match=TEST_POD):
        hooks.config.test(RELEASE, timeout=TIMEOUT)
    log = hooks.test_log()
    assert "FAIL  the validating webhook dgxtrainingjobs.kubedgx.io refuses instance type" in log, log
    assert "accepted: the webhook was not called" in log, log
    assert "3 of 4 checks passed" in log, log
    pod = hooks.ops.get("pod", TEST_POD)
    assert dig(pod, "status", "phase") == "Failed"
    assert dig(pod, "status", "containerStatuses", 0, "state", "terminated", "exitCode") == 1
