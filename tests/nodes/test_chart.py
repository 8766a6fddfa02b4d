"""The chart as an admin installs it (Helm's Go code through helm-python-sdk), its operator pods
running the operator image built from Dockerfile.operator on the real nodes: the kubelet runs them
under the chart's securityContext (UID 10001, read-only root filesystem, RuntimeDefault seccomp),
probes them, and the apiserver calls their webhook through the chart's Service.

What differs from a cluster with kube-proxy, and why: nothing here may write the machine's iptables,
so the ``kubernetes`` Service's ClusterIP leads nowhere; the pods reach the apiserver at the pod
bridge's gateway (tests/nodes/cluster.py's forwarder, the apiserver's certificate names that
address), told by the chart's ``extraEnv`` (KUBERNETES_SERVICE_HOST/PORT, as an admin sets them for
an apiserver behind a load balancer). The apiserver reaches the webhook at a ready endpoint of its
Service (``--enable-aggregator-routing``), not at its ClusterIP, for the same reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import helm_python as helm
import pytest

from tests.chart.conftest import CHART
from tests.cluster.controlplane import CONTEXT
from tests.e2e.jobs import command_job, phase_is, unknown_instance_job, wait_job
from tests.e2e.kubectl import JOBS, Kubectl, KubectlError, dig, wait_for
from tests.nodes.fixtures import NodesBrokenError, NodesUnavailableError, Started, chart_values, started_nodes

RELEASE = "rn"
FULLNAME = f"{RELEASE}-kubedgx"
NAMESPACE = "kubedgx-system"
JOBS_NAMESPACE = "ml"
SELECTOR = {"app.kubernetes.io/instance": RELEASE, "app.kubernetes.io/component": "operator"}
#: An operator pod's start on a 2-core machine: the image is on the node, Python imports kopf,
#: pydantic and the Kubernetes client, the leader is elected.
START_TIMEOUT = 300

pytestmark = [pytest.mark.timeout(900)]


@dataclass
class Installed:
    started: Started
    admin: Kubectl
    ops: Kubectl
    jobs: Kubectl
    config: helm.Config
    values: dict[str, Any]

    def pods(self) -> list[dict[str, Any]]:
        return [p for p in self.ops.select("pods", SELECTOR) if not dig(p, "metadata", "deletionTimestamp")]


def _ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in dig(pod, "status", "conditions", default=[])
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """Real nodes with the product's images, and the chart installed with them: the operator image
    at the tag built here, the pods' way to the apiserver, the data mounts' cache in the cluster's
    directory. No operator runs but the chart's."""
    root = tmp_path_factory.mktemp("rn")
    try:
        with started_nodes(root, product_images=True) as started:
            assert started.images is not None
            host, port = started.nodes.apiserver_for_pods
            values = chart_values(started.images, root / "raid")
            values |= {
                "kueue": {"enabled": False},
                # The GPU nodes are all there is: the operator tolerates their taints.
                "tolerations": [{"operator": "Exists"}],
                # One replica per node (the chart adds the pods' labels as the selector).
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule"}
                ],
                "extraEnv": [
                    {"name": "KUBERNETES_SERVICE_HOST", "value": host},
                    {"name": "KUBERNETES_SERVICE_PORT", "value": str(port)},
                ],
            }
            admin = started.kubectl
            for name in (NAMESPACE, JOBS_NAMESPACE):
                admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
            plane = started.nodes.plane
            assert plane is not None
            config = helm.Config(kubeconfig_path=plane.kubeconfig, kube_context=CONTEXT, namespace=NAMESPACE)
            try:
                yield Installed(
                    started, admin, admin.in_namespace(NAMESPACE), admin.in_namespace(JOBS_NAMESPACE), config, values
                )
            finally:
                config.close()
    except NodesUnavailableError as exc:
        pytest.skip(str(exc))
    except NodesBrokenError as exc:
        pytest.fail(str(exc), pytrace=False)


def test_the_chart_runs_its_operator_image_on_the_real_nodes(installed: Installed) -> None:
    """helm install; both replicas Running and Ready (the kubelet's probes of /healthz), one per
    node, in the operator image; one leads; the webhook, served through the chart's Service with
    the caBundle the replicas set, refuses a job the catalog has no shape for; a job runs to
    Succeeded reconciled by the chart's operator; helm uninstall takes the pods away."""
    i = installed
    summary = i.config.install(str(CHART), RELEASE, i.values)
    assert summary["status"] == "deployed", summary

    def rolled_out() -> bool:
        pods = i.pods()
        return len(pods) == 2 and all(_ready(p) for p in pods)

    wait_for("both operator replicas Ready", rolled_out, timeout=START_TIMEOUT, interval=2)
    pods = i.pods()
    operator_image = i.values["image"]["repository"] + ":" + i.values["image"]["tag"]
    for pod in pods:
        (container,) = dig(pod, "status", "containerStatuses")
        assert container["image"].endswith(operator_image.split("/", 1)[1]), container
        assert container["restartCount"] == 0, (container, i.ops.logs(pod["metadata"]["name"], tail=50))
        assert container["ready"] is True, container
    # The topology spread constraint of the values: one replica per node.
    assert {dig(p, "spec", "nodeName") for p in pods} == {n.name for n in i.started.nodes.nodes}, pods
    names = {dig(p, "metadata", "name") for p in pods}
    # The holder's identity is <pod>_<random> (the chart's README).
    wait_for(
        "a replica to hold the leader lease",
        lambda: _holder(i).rsplit("_", 1)[0] in names,
        timeout=120,
        interval=1,
    )

    # The webhook, through the Service: the replicas set the caBundle, the apiserver calls them.
    vwc = i.admin.get("validatingwebhookconfiguration", f"{FULLNAME}-webhook")
    assert all(dig(w, "clientConfig", "caBundle") for w in vwc["webhooks"]), vwc
    assert all(dig(w, "clientConfig", "service", "name") for w in vwc["webhooks"]), vwc
    refused = _refusal_when_served(i.jobs, unknown_instance_job("bad-shape"))
    assert "admission webhook" in refused, refused
    assert "denied the request: spec.instance" in refused, refused

    # A job reconciled by the chart's operator (no other runs here), its worker on a real node.
    job = command_job("hello", script="echo kubedgx-on-real-nodes")
    i.jobs.apply(job)
    done = wait_job(i.jobs, "hello", "phase Succeeded", phase_is("Succeeded"), timeout=300, fail_on=("Failed",))
    assert dig(done, "status", "workers", "succeeded") == 1, done["status"]
    assert "kubedgx-on-real-nodes" in i.jobs.logs("hello-worker-0", container="trainer")
    i.jobs.run("delete", JOBS, "hello", "--wait=true", timeout=120)

    forbidden = [
        line
        for p in pods
        for line in i.ops.logs(p["metadata"]["name"], tail=2000).splitlines()
        if "forbidden" in line.lower()
    ]
    assert forbidden == [], forbidden[:20]

    i.config.uninstall(RELEASE)
    wait_for("the operator pods gone", lambda: not i.ops.select("pods", SELECTOR), timeout=180, interval=2)


def _holder(i: Installed) -> str:
    try:
        lease = i.ops.get("lease", f"{FULLNAME}-leader")
    except KubectlError:
        return ""
    return str(dig(lease, "spec", "holderIdentity", default="") or "")


def _refusal_when_served(k: Kubectl, obj: dict[str, Any]) -> str:
    """Apply ``obj`` and return the refusal, retried while the webhook is not reachable yet (a
    replica Ready a moment before its endpoint is in the EndpointSlice the apiserver reads): the
    refusal this test wants is the webhook's answer, not a failed call. "" where it was admitted."""

    def attempt() -> str | None:
        try:
            k.apply(obj)
        except KubectlError as exc:
            text = str(exc)
            if "failed calling webhook" in text or "no endpoints available" in text:
                return None  # look again
            return text
        return "admitted"

    answer = wait_for("the webhook to answer", attempt, timeout=120, interval=2)
    return "" if answer == "admitted" else answer
