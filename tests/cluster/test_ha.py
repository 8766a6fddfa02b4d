"""The chart as a platform team installs it, on the real control plane, with its operator pods really
running: a Helm release (helm-python-sdk) whose Deployment's pods tests/cluster/podrunner.py runs as
local processes, each on its own IP, reached by the apiserver through the chart's webhook Service
(issue 17, items 1 and 2).

What is real here: Helm's install, upgrade and uninstall; the Deployment controller's rolling
update; the scheduler; the EndpointSlice controller and the apiserver's choice of a ready endpoint;
TLS from the apiserver to each replica, checked against the Service's DNS name and the caBundle the
replicas set in the chart's ValidatingWebhookConfiguration; the PodDisruptionBudget and the eviction
API; RBAC, for the operator (a ServiceAccount token bound to its pod) and for what it may not do.
What the runner stands in for is the kubelet: it starts, probes and stops the processes.

Lease timings are shortened (6 s lease, 4 s renew deadline, 1 s retry period) so that the
hand-over figures stay small; the assertions are stated in those terms.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import helm_python as helm
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from tests.chart.conftest import CHART, Rendered
from tests.cluster.controlplane import CONTEXT, ControlPlane
from tests.cluster.podrunner import NODE_SELECTOR, ApiError, PodRunner, can_add_addresses, operator_executables
from tests.e2e.jobs import command_job, unknown_instance_job, worker_pods
from tests.e2e.kubectl import JOBS, Kubectl, KubectlError, dig, wait_for

RELEASE = "ha"
FULLNAME = "ha-kubedgx"
NAMESPACE = "kubedgx-ha"
JOBS_NAMESPACE = "ha-jobs"
OWNER = "tests/cluster/test_ha"
OPERATOR_IMAGE = "ghcr.io/kubedgx/operator"
LEASE = f"{FULLNAME}-leader"
SECRET = f"{FULLNAME}-webhook-tls"
VWC = f"{FULLNAME}-webhook"
SERVICE_DNS = f"{FULLNAME}-webhook.{NAMESPACE}.svc"
SELECTOR = {"app.kubernetes.io/instance": RELEASE, "app.kubernetes.io/component": "operator"}
LEASE_S, RENEW_S, RETRY_S = 6.0, 4.0, 1.0
TIMEOUT = 120

VALUES: dict[str, Any] = {
    # The CRDs and PriorityClasses exist already (the base chart objects, fixture ``chart``).
    "crds": {"enabled": False},
    "priorityClasses": {"create": False},
    "watchNamespaces": [JOBS_NAMESPACE],
    "kueue": {"enabled": False},
    "leaderElection": {
        "leaseDuration": f"{LEASE_S:g}s",
        "renewDeadline": f"{RENEW_S:g}s",
        "retryPeriod": f"{RETRY_S:g}s",
    },
    "shutdownDelay": "3s",
    "webhook": {"timeoutSeconds": 8},
    "podAnnotations": {"test.kubedgx.io/revision": "1"},
    "nodeSelector": NODE_SELECTOR,
}

pytestmark = pytest.mark.skipif(
    (why := can_add_addresses()) is not None, reason=f"the operator's pods need addresses of their own: {why}"
)


@dataclass
class Ha:
    """The release, its pods' runner, and kubectl in its namespace and in the watched one."""

    plane: ControlPlane
    runner: PodRunner
    config: helm.Config
    admin: Kubectl
    ops: Kubectl
    jobs: Kubectl
    uninstalled: bool = False

    def refused(self, namespace: str = NAMESPACE) -> list[str]:
        """Log lines of a release's replicas that report a call RBAC refused, which the chart's rules must never
        cause (checked before an uninstall, which removes the RBAC while the replicas stop)."""
        return [
            line
            for pod, text in self.runner.logs()
            if pod.startswith(f"{namespace}.")
            for line in text.splitlines()
            if re.search(r"forbidden: User .* cannot ", line)
        ]

    def stop(self) -> None:
        """The control plane's operator slot calls this when another module takes it."""
        with contextlib.suppress(Exception):
            self.config.uninstall(RELEASE, ignore_not_found=True)
        self.runner.stop()
        self.config.close()

    # -- reading --------------------------------------------------------------------------------

    def pods(self) -> list[dict[str, Any]]:
        return [p for p in self.ops.select("pods", SELECTOR) if not p["metadata"].get("deletionTimestamp")]

    def ready_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.pods() if _ready(p)]

    def holder(self) -> str:
        return str(dig(self.ops.get("lease", LEASE), "spec", "holderIdentity", default="") or "")

    def leader_pod(self) -> str:
        """The pod whose process holds the Lease (identity ``<pod>_<random>``)."""
        holder = wait_for("a leader", lambda: self.holder() or None, timeout=TIMEOUT, interval=0.2)
        return holder.rsplit("_", 1)[0]

    def metrics(self, pod: dict[str, Any]) -> str:
        ip = dig(pod, "status", "podIP")
        with urllib.request.urlopen(f"http://{ip}:8080/metrics", timeout=5) as response:
            return str(response.read().decode())

    def rollout_done(self) -> bool:
        """The Deployment's new revision is fully rolled out: every pod of its new template ready, no
        pod of an older one left."""
        dep = self.ops.get("deployment", f"{FULLNAME}-operator")
        if dep is None:
            return False
        status, want = dep.get("status") or {}, dep["spec"]["replicas"]
        return (
            status.get("observedGeneration") == dep["metadata"]["generation"]
            and status.get("updatedReplicas") == want
            and status.get("readyReplicas") == want
            and status.get("replicas") == want
            and len(self.ready_pods()) == want
            and len(self.pods()) == want
        )

    def wait_rolled_out(self, timeout: float = TIMEOUT) -> None:
        wait_for("the operator's rollout", self.rollout_done, timeout=timeout, interval=0.3, diagnose=self.diagnose)

    def diagnose(self) -> str:
        lines = [f"runner errors: {self.runner.errors[-5:]}"]
        for p in self.ops.select("pods", SELECTOR):
            deleting = bool(p["metadata"].get("deletionTimestamp"))
            lines.append(
                f"{p['metadata']['name']}: {dig(p, 'status', 'phase')} ready={_ready(p)} deleting={deleting} "
                f"node={p['spec'].get('nodeName')} state={dig(p, 'status', 'containerStatuses', 0, 'state')}"
            )
        for name, text in self.runner.logs():
            lines.append(f"--- {name}\n" + "\n".join(text.splitlines()[-15:]))
        return "\n".join(lines)


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in dig(pod, "status", "conditions") or [])


@pytest.fixture(scope="module")
def ha(
    control_plane: ControlPlane, kubectl: Kubectl, chart: list[Rendered], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Ha]:
    """The release installed with VALUES, its two replicas running and one of them leading."""
    for name in (NAMESPACE, JOBS_NAMESPACE):
        kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    workdir = tmp_path_factory.mktemp("ha")

    def start() -> Ha:
        runner = PodRunner(control_plane, workdir / "pods", operator_executables(OPERATOR_IMAGE))
        runner.start()
        config = helm.Config(kubeconfig_path=control_plane.kubeconfig, kube_context=CONTEXT, namespace=NAMESPACE)
        ha = Ha(
            control_plane,
            runner,
            config,
            kubectl,
            kubectl.in_namespace(NAMESPACE),
            kubectl.in_namespace(JOBS_NAMESPACE),
        )
        try:
            summary = config.install(str(CHART), RELEASE, VALUES)
            assert summary["status"] == "deployed", summary
            ha.wait_rolled_out()
            ha.leader_pod()
        except BaseException:
            ha.stop()
            raise
        return ha

    running = control_plane.slot.take(OWNER, start)
    try:
        yield running
        if not running.uninstalled:  # (uninstalling removes the RBAC while the replicas stop: checked before it)
            refused = running.refused()
            assert refused == [], "the chart's RBAC refused the operator:\n" + "\n".join(refused[:20])
    finally:
        control_plane.slot.release(OWNER)
        kubectl.run("delete", "namespace", JOBS_NAMESPACE, "--wait=false", "--ignore-not-found")


def served_certificate(ip: str, ca: bytes, hostname: str = SERVICE_DNS) -> bytes:
    """The certificate a replica serves on its webhook port, verified as the apiserver verifies it:
    against the caBundle, for the Service's DNS name."""
    context = ssl.create_default_context(cadata=ca.decode())
    with (
        socket.create_connection((ip, 9443), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=hostname) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def review(ip: str, ca: bytes, job: dict[str, Any]) -> dict[str, Any]:
    """An AdmissionReview sent to one replica as the apiserver sends it."""
    job = {**job, "metadata": {**job["metadata"], "namespace": JOBS_NAMESPACE, "uid": "1"}}
    request = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "review-1",
            "kind": {"group": "kubedgx.io", "version": "v1alpha1", "kind": "DGXTrainingJob"},
            "resource": {"group": "kubedgx.io", "version": "v1alpha1", "resource": "dgxtrainingjobs"},
            "namespace": JOBS_NAMESPACE,
            "name": job["metadata"]["name"],
            "operation": "CREATE",
            "userInfo": {"username": "tests"},
            "object": job,
            "dryRun": False,
        },
    }
    context = ssl.create_default_context(cadata=ca.decode())
    with (
        socket.create_connection((ip, 9443), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=SERVICE_DNS) as tls,
    ):
        body = json.dumps(request).encode()
        tls.sendall(
            b"POST /validate-dgxtrainingjob HTTP/1.1\r\nHost: " + SERVICE_DNS.encode() + b"\r\n"
            b"Content-Type: application/json\r\nConnection: close\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    answer: dict[str, Any] = json.loads(payload)
    return answer


def ca_bundles(ha: Ha) -> set[str]:
    vwc = ha.admin.get("validatingwebhookconfiguration", VWC)
    return {str(dig(h, "clientConfig", "caBundle", default="")) for h in (vwc or {}).get("webhooks", [])}


def secret_data(ha: Ha) -> dict[str, str]:
    return dict((ha.ops.get("secret", SECRET) or {}).get("data") or {})


# --------------------------------------------------------------------------------------------
# Item 2: the release's webhook configuration, its CA in a Secret the replicas share
# --------------------------------------------------------------------------------------------


def test_the_replicas_share_one_certificate_whose_ca_is_the_release_s_configuration_s(ha: Ha) -> None:
    def filled() -> dict[str, str] | None:
        data = secret_data(ha)
        return data if "ca.crt" in data else None

    data = wait_for("the certificate Secret filled", filled, timeout=TIMEOUT)
    ca = base64.b64decode(data["ca.crt"])
    wait_for("the caBundle set", lambda: ca_bundles(ha) == {data["ca.crt"]}, timeout=60)
    vwc = ha.admin.get("validatingwebhookconfiguration", VWC)
    assert vwc is not None
    assert dig(vwc, "metadata", "annotations", "meta.helm.sh/release-name") == RELEASE  # Helm's object
    for hook in vwc["webhooks"]:
        assert hook["timeoutSeconds"] == 8  # webhook.timeoutSeconds
        assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == [JOBS_NAMESPACE]
        assert [c["name"] for c in hook["matchConditions"]] == ["not-being-deleted", "spec-or-priority-class-changed"]
    certificate = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"])).public_bytes(Encoding.DER)
    pods = ha.ready_pods()
    assert len(pods) == 2
    for pod in pods:  # every replica serves the Secret's pair, trusted by the caBundle
        assert served_certificate(dig(pod, "status", "podIP"), ca) == certificate


def test_every_replica_answers_admission_reviews_and_exactly_one_leads(ha: Ha) -> None:
    leader = ha.leader_pod()
    pods = ha.ready_pods()
    assert leader in [p["metadata"]["name"] for p in pods]
    gauges = {p["metadata"]["name"]: _sample(ha.metrics(p), "kubedgx_leader") for p in pods}
    assert gauges == {p["metadata"]["name"]: (1.0 if p["metadata"]["name"] == leader else 0.0) for p in pods}
    before = {p["metadata"]["name"]: _webhook_requests(ha.metrics(p)) for p in pods}
    for i in range(5):
        answer = ha.jobs.apply(unknown_instance_job(f"bad-{i}"), check=False)
        assert answer.returncode != 0
        assert "unknown instance type" in answer.stderr, answer.stderr  # our webhook's words, over TLS
    after = {p["metadata"]["name"]: _webhook_requests(ha.metrics(p)) for p in pods}
    # The apiserver dials a random ready endpoint and keeps the connection alive, so one replica may answer
    # all of these; every replica must be able to, as the apiserver would ask it (TLS for the Service's name).
    assert sum(after.values()) - sum(before.values()) == 5
    ca = base64.b64decode(secret_data(ha)["ca.crt"])
    for pod in pods:
        answer = review(dig(pod, "status", "podIP"), ca, unknown_instance_job("direct"))
        assert answer["response"]["allowed"] is False
        assert "unknown instance type" in answer["response"]["status"]["message"]
    ha.jobs.apply(command_job("led"))
    wait_for("the leader to create the job's worker", lambda: worker_pods(ha.jobs, "led") or None, timeout=60)
    ha.jobs.delete(JOBS, "led")


def _sample(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    assert match, f"no {name} in the exposition"
    return float(match.group(1))


def _webhook_requests(text: str) -> float:
    return sum(float(m) for m in re.findall(r"^kubedgx_webhook_requests_total\{[^}]*\} (\S+)$", text, re.M))


def test_the_operator_may_patch_only_its_own_configuration_and_create_none(ha: Ha) -> None:
    account = f"system:serviceaccount:{NAMESPACE}:{FULLNAME}-operator"

    def can(*args: str) -> bool:
        answer = ha.ops.run("auth", "can-i", *args, f"--as={account}", check=False)
        return answer.stdout.strip() == "yes"

    assert not can("create", "validatingwebhookconfigurations")
    assert can("patch", f"validatingwebhookconfigurations/{VWC}")
    assert not can("patch", "validatingwebhookconfigurations/someone-elses")
    assert not can("delete", f"validatingwebhookconfigurations/{VWC}")
    assert can("patch", f"secrets/{SECRET}")
    assert not can("get", "secrets/another-secret")
    assert can("update", f"leases/{LEASE}")
    assert not can("create", "leases")


# --------------------------------------------------------------------------------------------
# Item 1: several replicas, one leader, writes never refused
# --------------------------------------------------------------------------------------------


def processes(ha: Ha) -> str:
    """Every live process whose working directory is a pod's, with its pid (for failure reports)."""
    import os

    lines = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if str(ha.runner.workdir) in cwd:
            lines.append(f"{pid} {cwd}")
    return "\n".join(lines) + f"\nstarted: {ha.runner.started}"


def lease(ha: Ha) -> dict[str, Any]:
    found = ha.ops.get("lease", LEASE)
    assert found is not None
    spec: dict[str, Any] = found["spec"]
    return spec


def stamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def webhook_endpoints(ha: Ha) -> set[str]:
    """The ready addresses of the webhook Service's EndpointSlices: where the apiserver sends reviews."""
    slices = ha.ops.select("endpointslices", {"kubernetes.io/service-name": f"{FULLNAME}-webhook"})
    return {
        address
        for piece in slices
        for endpoint in piece.get("endpoints") or []
        if dig(endpoint, "conditions", "ready", default=False)
        for address in endpoint.get("addresses") or []
    }


def test_killing_the_leader_hands_over_within_the_lease_duration(ha: Ha) -> None:
    """SIGKILL: no release, so the others wait for the Lease to expire by their own clocks, then one of
    them (or the killed container, restarted with a new identity) takes it and reconciles. Timed by the
    Lease itself (the operator's wall clock, this machine's): not before it expired, and soon after."""
    before = lease(ha)
    leader = ha.leader_pod()
    ip = dig(ha.ops.get("pod", leader), "status", "podIP")
    killed = datetime.now(UTC)
    ha.runner.kill(leader)  # SIGKILL: no release; the Lease must expire
    # Until the kubelet reports the pod not ready and the EndpointSlice controller drops it, the
    # webhook Service still lists the dead replica, and a write the apiserver sends there is refused
    # (failurePolicy: Fail): a crash's window, which no operator can close. Writes go on after it.
    wait_for(
        "the killed replica out of the webhook Service's ready endpoints",
        lambda: None if ip in webhook_endpoints(ha) else True,
        timeout=30,
        interval=0.1,
        diagnose=ha.diagnose,
    )
    ha.jobs.apply(command_job("after-kill"))
    wait_for(
        "a worker of the job created after the kill",
        lambda: worker_pods(ha.jobs, "after-kill") or None,
        timeout=60,
        interval=0.2,
        diagnose=ha.diagnose,
    )
    after = lease(ha)
    assert after["holderIdentity"] != before["holderIdentity"], processes(ha)
    assert after["leaseTransitions"] == before["leaseTransitions"] + 1
    took = (stamp(after["acquireTime"]) - killed).total_seconds()
    assert LEASE_S - 2 * RETRY_S <= took <= LEASE_S + 2.2 * RETRY_S + 2, f"taken over {took:.1f}s after the kill"
    # The kubelet (the runner) restarted the killed container with exit code 137.
    pod = wait_for(
        "the killed replica restarted and ready",
        lambda: next(
            (
                p
                for p in ha.ready_pods()
                if p["metadata"]["name"] == leader and dig(p, "status", "containerStatuses", 0, "restartCount") == 1
            ),
            None,
        ),
        timeout=60,
    )
    assert dig(pod, "status", "containerStatuses", 0, "lastState", "terminated", "exitCode") == 137
    holder = after["holderIdentity"].rsplit("_", 1)[0]
    for p in ha.ready_pods():
        expected = 1.0 if p["metadata"]["name"] == holder else 0.0
        wait_for(
            "its leader gauge",
            lambda p=p, e=expected: _sample(ha.metrics(p), "kubedgx_leader") == e,
            timeout=30,
            interval=0.5,
        )
    ha.jobs.delete(JOBS, "after-kill")


def test_a_deleted_leader_hands_its_lease_over_at_once(ha: Ha) -> None:
    """SIGTERM (a pod deleted, drained or rolled): the leader releases its Lease, so the next one takes it
    within a retry period, not a lease duration."""
    before = lease(ha)
    leader = ha.leader_pod()
    ha.ops.run("delete", "pod", leader, "--wait=false")
    deleted = stamp(
        wait_for(
            "the deletion",
            lambda: dig(ha.ops.get("pod", leader), "metadata", "deletionTimestamp"),
            timeout=30,
            interval=0.2,
        )
    )

    def taken() -> dict[str, Any] | None:
        spec = lease(ha)
        return spec if spec["holderIdentity"] not in ("", before["holderIdentity"]) else None

    after = wait_for("another leader", taken, timeout=30, interval=0.2)
    # deletionTimestamp is in whole seconds (rounded down): up to 1 s of this is that.
    took = (stamp(after["acquireTime"]) - deleted).total_seconds()
    assert took < RETRY_S * 2.2 + 2, f"taken over {took:.1f}s after the deletion"
    assert took < LEASE_S  # the Lease did not have to expire
    assert after["holderIdentity"].rsplit("_", 1)[0] != leader
    ha.wait_rolled_out()


@dataclass
class Writer:
    """kubectl writes in a loop, as a CI pipeline or a GitOps controller would make them during an
    upgrade: create a job, change its spec, delete it, and (every third round) a job only the
    webhook refuses, which must be refused with its words: an answer from a replica, not a failed
    call."""

    k: Kubectl
    outcomes: list[tuple[float, str, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            name = f"w-{i}"
            self._write("create", lambda n=name: self.k.apply(command_job(n)))  # type: ignore[misc]
            job = command_job(name)
            job["spec"]["maxDuration"] = "45m"
            self._write("update", lambda j=job: self.k.apply(j))  # type: ignore[misc]
            self._write("delete", lambda n=name: self.k.run("delete", JOBS, n, "--wait=false"))  # type: ignore[misc]
            if i % 3 == 0:
                answer = self.k.apply(unknown_instance_job(f"bad-{i}"), check=False)
                ok = answer.returncode != 0 and "unknown instance type" in answer.stderr
                self.outcomes.append((time.monotonic(), "refused" if ok else "WRONG", answer.stderr.strip()))
            i += 1

    def _write(self, what: str, call: Any) -> None:
        try:
            call()
        except KubectlError as exc:
            self.outcomes.append((time.monotonic(), "FAILED", f"{what}: {exc}"))
        else:
            self.outcomes.append((time.monotonic(), what, ""))

    def problems(self) -> list[str]:
        return [f"{kind}: {text}" for _, kind, text in self.outcomes if kind in ("FAILED", "WRONG")]

    def between(self, start: float, end: float) -> int:
        return sum(1 for t, kind, _ in self.outcomes if start <= t <= end and kind not in ("FAILED", "WRONG"))


@contextlib.contextmanager
def writing(k: Kubectl) -> Iterator[Writer]:
    writer = Writer(k)
    thread = threading.Thread(target=writer.run, name="writer", daemon=True)
    thread.start()
    try:
        wait_for("the first writes", lambda: len(writer.outcomes) >= 4, timeout=60)
        yield writer
    finally:
        writer.stop.set()
        thread.join(120)


def test_a_helm_upgrade_refuses_no_write(ha: Ha) -> None:
    """A rolling update of every replica (a changed pod annotation) while manifests are applied."""
    before = {p["metadata"]["name"] for p in ha.pods()}
    ca = ca_bundles(ha)
    with writing(ha.jobs) as writer:
        started = time.monotonic()
        summary = ha.config.upgrade(str(CHART), RELEASE, VALUES | {"podAnnotations": {"test.kubedgx.io/revision": "2"}})
        assert summary["status"] == "deployed", summary
        wait_for(
            "the rollout to replace every replica",
            lambda: ha.rollout_done() and not before & {p["metadata"]["name"] for p in ha.pods()},
            timeout=TIMEOUT,
            interval=0.3,
            diagnose=ha.diagnose,
        )
        ended = time.monotonic()
        wait_for("writes after the rollout", lambda: writer.between(ended, time.monotonic()) >= 3, timeout=60)
    assert writer.problems() == []
    assert writer.between(started, ended) >= 6, f"only {writer.between(started, ended)} writes during the rollout"
    assert sum(1 for _, kind, _ in writer.outcomes if kind == "refused") >= 2
    assert ca_bundles(ha) == ca  # Helm's upgrade left the replicas' caBundle alone
    ha.leader_pod()


def test_a_restart_keeps_the_certificate_and_refuses_no_write(ha: Ha) -> None:
    """`kubectl rollout restart`: new pods, the same pair from the Secret, the same caBundle, so no
    request meets a certificate the apiserver does not trust."""
    data, ca = secret_data(ha), ca_bundles(ha)
    before = {p["metadata"]["name"] for p in ha.pods()}
    with writing(ha.jobs) as writer:
        ha.ops.run("rollout", "restart", f"deployment/{FULLNAME}-operator")
        wait_for(
            "the restart to replace every replica",
            lambda: ha.rollout_done() and not before & {p["metadata"]["name"] for p in ha.pods()},
            timeout=TIMEOUT,
            interval=0.3,
            diagnose=ha.diagnose,
        )
    assert writer.problems() == []
    assert secret_data(ha) == data
    assert ca_bundles(ha) == ca
    certificate = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"])).public_bytes(Encoding.DER)
    for pod in ha.ready_pods():
        assert served_certificate(dig(pod, "status", "podIP"), base64.b64decode(data["ca.crt"])) == certificate


def test_a_drain_evicts_one_replica_at_a_time(ha: Ha) -> None:
    pods = [p["metadata"]["name"] for p in ha.ready_pods()]
    assert len(pods) == 2
    answers: list[int] = []
    refusals: list[str] = []
    for name in pods:
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": NAMESPACE}}
        try:
            ha.runner.api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/eviction", eviction)
            answers.append(201)
        except ApiError as exc:
            answers.append(exc.status)
            refusals.append(str(exc))
    assert answers == [201, 429]
    assert "disruption budget" in refusals[0], refusals
    ha.jobs.apply(command_job("during-drain"))  # the other replica answers the webhook meanwhile
    ha.wait_rolled_out()
    ha.jobs.delete(JOBS, "during-drain")


def test_with_no_replica_creates_are_refused_but_deletes_and_labels_go_through(ha: Ha) -> None:
    ha.jobs.apply(command_job("kept"))
    ha.ops.run("scale", f"deployment/{FULLNAME}-operator", "--replicas=0")
    try:
        wait_for("no operator pod", lambda: not ha.ops.select("pods", SELECTOR), timeout=TIMEOUT, interval=0.3)
        refused = ha.jobs.apply(command_job("refused"), check=False)
        assert refused.returncode != 0
        assert "failed calling webhook" in refused.stderr, refused.stderr  # failurePolicy: Fail
        ha.jobs.run("label", JOBS, "kept", "team=ml")  # metadata only: never sent to the webhook
        ha.jobs.run(
            "patch",
            JOBS,
            "kept",
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"phase": "Pending"}}),
        )
        ha.jobs.run("delete", JOBS, "kept", "--wait=false")
    finally:
        ha.ops.run("scale", f"deployment/{FULLNAME}-operator", "--replicas=2")
    ha.wait_rolled_out()
    ha.leader_pod()


def test_uninstall_removes_the_configuration_the_secret_and_the_lease(ha: Ha) -> None:
    refused = ha.refused()
    assert refused == [], "the chart's RBAC refused the operator:\n" + "\n".join(refused[:20])
    ha.uninstalled = True
    answer = ha.config.uninstall(RELEASE)
    assert answer, answer
    wait_for(
        "the release's configuration and Secret to go",
        lambda: ha.admin.get("validatingwebhookconfiguration", VWC) is None and ha.ops.get("secret", SECRET) is None,
        timeout=TIMEOUT,
    )
    assert ha.ops.get("lease", LEASE) is None
    wait_for("the operator's pods to stop", lambda: not ha.ops.select("pods", SELECTOR), timeout=TIMEOUT)
    # No webhook is left behind to refuse writes to the kept CRDs.
    ha.jobs.apply(command_job("after-uninstall"))
    ha.jobs.delete(JOBS, "after-uninstall")


def test_cert_manager_mode_serves_what_cert_manager_issues(ha: Ha) -> None:
    """The chart's other mode, with the test doing cert-manager's part (its controller writes the
    Certificate's Secret; its cainjector copies the CA into the configuration named by
    ``cert-manager.io/inject-ca-from``): the replicas mount and serve that Secret, the release's
    configuration reaches them through the Service, and they write neither."""
    from dgx_operator.webhook.certificates import self_signed  # a CA and a certificate, as cert-manager's would be
    from tests.cluster.chart_helpers import stub_crd

    namespace, release = "kubedgx-cm", "cm"
    fullname = f"{release}-kubedgx"
    created = []
    for crd in (
        stub_crd("cert-manager.io", "Issuer", "issuers"),
        stub_crd("cert-manager.io", "Certificate", "certificates"),
    ):
        if ha.admin.get("customresourcedefinition", crd["metadata"]["name"]) is None:
            ha.admin.apply(crd)
            created.append(crd["metadata"]["name"])
    ha.admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    k = ha.admin.in_namespace(namespace)
    config = helm.Config(kubeconfig_path=ha.plane.kubeconfig, kube_context=CONTEXT, namespace=namespace)
    values = VALUES | {"webhook": {"certManager": {"enabled": True}}}
    try:
        wait_for(
            "the stub CRDs served",
            lambda: ha.admin.run("get", "certificates.cert-manager.io", "-A", check=False).returncode == 0,
            timeout=60,
            interval=0.5,
        )
        summary = config.install(str(CHART), release, values)
        assert summary["status"] == "deployed", summary
        certificate = k.get("certificate", f"{fullname}-webhook")
        assert certificate is not None
        secret_name = certificate["spec"]["secretName"]
        pair = self_signed(certificate["spec"]["dnsNames"])
        ca, crt, key = pair.ca, pair.certificate, pair.key
        k.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "kubernetes.io/tls",
                "metadata": {"name": secret_name},
                "data": {"ca.crt": _b64(ca), "tls.crt": _b64(crt), "tls.key": _b64(key)},
            }
        )
        vwc = ha.admin.get("validatingwebhookconfiguration", f"{fullname}-webhook")
        assert vwc is not None
        assert vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{namespace}/{fullname}-webhook"
        injected = [
            {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": _b64(ca)}
            for i in range(len(vwc["webhooks"]))
        ]
        ha.admin.run(
            "patch", "validatingwebhookconfiguration", f"{fullname}-webhook", "--type=json", "-p", json.dumps(injected)
        )
        selector = {"app.kubernetes.io/instance": release, "app.kubernetes.io/component": "operator"}
        wait_for(
            "both replicas ready",
            lambda: len([p for p in k.select("pods", selector) if _ready(p)]) == 2,
            timeout=TIMEOUT,
            interval=0.3,
            diagnose=ha.diagnose,
        )
        answer = ha.jobs.apply(unknown_instance_job("cm-bad"), check=False)
        assert "unknown instance type" in answer.stderr, answer.stderr  # served with cert-manager's certificate
        ha.jobs.apply(command_job("cm-good"))
        ha.jobs.delete(JOBS, "cm-good")
        for pod in k.select("pods", selector):
            assert served_certificate(
                dig(pod, "status", "podIP"), ca, f"{fullname}-webhook.{namespace}.svc"
            ) == x509.load_pem_x509_certificate(crt).public_bytes(Encoding.DER)
        # The replicas wrote nothing of the webhook's: the caBundle is what "cert-manager" injected.
        assert ca_bundles_of(ha, f"{fullname}-webhook") == {_b64(ca)}
        assert ha.refused(namespace) == []
    finally:
        with contextlib.suppress(Exception):
            config.uninstall(release, ignore_not_found=True)
        config.close()
        ha.admin.run("delete", "namespace", namespace, "--wait=false", "--ignore-not-found")
        for name in created:
            ha.admin.run("delete", "customresourcedefinition", name, "--wait=false", "--ignore-not-found")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def ca_bundles_of(ha: Ha, name: str) -> set[str]:
    vwc = ha.admin.get("validatingwebhookconfiguration", name)
    return {str(dig(h, "clientConfig", "caBundle", default="")) for h in (vwc or {}).get("webhooks", [])}
