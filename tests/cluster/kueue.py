"""Kueue's manager (sigs.k8s.io/kueue, built from its Go module by tests/cluster/build.sh) as a local
process against the test control plane, with Kueue's own CRDs and admission webhooks installed.

What is Kueue's own, unchanged: the manager binary, its CRDs (``config/components/crd/bases``), its
webhook configurations' names, rules, failure policies and paths
(``config/components/webhook/manifests.yaml``), its internal certificate management (on, as in
Kueue's default configuration) and the conversion webhooks its kustomize config puts on five CRDs.

What the harness changes, and why:

- **clientConfig**: every webhook (admission and CRD conversion) is a ``url:
  https://127.0.0.1:<port><path>`` instead of Kueue's Service, because the manager runs on this
  machine and a Service needs a routable pod IP (as for the kubedgx webhook, tests/cluster/operator.py).
- **certificates**: the harness pre-creates the Secret Kueue's certificate rotator keeps its
  certificates in (``kueue-system/kueue-webhook-server-cert``), with a CA of its own and a
  serving certificate valid for both the Service name the rotator checks
  (``kueue-webhook-service.kueue-system.svc``) and ``127.0.0.1``, for a year (the rotator renews
  what expires within 90 days). The rotator finds them valid, keeps them, and injects that CA
  into the webhook configurations and CRDs, where the harness put the same CA already. The files
  go into the manager's ``certDir``, where a kubelet would mount the Secret.
  Why not ``internalCertManagement: {enable: false}``: Kueue 0.17's main.go then reads a metrics
  certificate from the fixed path ``/etc/kueue/metrics/certs/tls.{crt,key}`` (cert-manager
  mounts it in a real install) and exits without it; a test should not write under /etc.
- **only Kueue's own resources' webhooks** are installed: ClusterQueue, Cohort, ResourceFlavor and
  Workload (:data:`KEPT_WEBHOOKS`). The job frameworks' webhooks (batch/v1 Jobs, pods, Deployments,
  StatefulSets, JobSet, Kubeflow, Ray, ...) are left out, so no other test module's Jobs or pods
  ever meet a failurePolicy=Fail webhook. Kueue's own controllers still only act on Jobs labelled
  with a queue name (``manageJobsWithoutQueueName: false``); nothing else here labels Jobs.
  Opt-in: ``pod_webhook_namespaces`` adds Kueue's two pod webhooks (:data:`POD_WEBHOOKS`, its
  ``pod`` integration's, failurePolicy ``Fail`` as shipped), with the namespaceSelector Kueue's
  kustomize config gives them (:data:`POD_WEBHOOK_EXCLUDED`) narrowed to exactly those namespaces
  (by ``kubernetes.io/metadata.name``), so that the pods of no other namespace ever reach them.
- ports: webhook, health probe and metrics on free loopback ports, picked in :meth:`Kueue.start`
  right before the process starts (a start that loses a port race is retried with new ports);
  ``VisibilityOnDemand`` off (its API server would listen on a fixed port and write
  self-signed certificates to ``/visibility``); leader election off.

:meth:`Kueue.stop` deletes every Kueue object while the manager still runs (its controllers hold
``kueue.x-k8s.io/resource-in-use`` finalizers on them), stops the process group, deletes both
webhook configurations and turns the CRDs' conversion back to ``None``, so that nothing points at a
port nobody listens on. The CRDs themselves stay (Established, empty).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import datetime as dt
import ipaddress
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.cluster.controlplane import CONTEXT, ControlPlane, StartError, stop_process_group, wait_until
from tests.cluster.operator import token_kubeconfig
from tests.e2e.kubectl import Kubectl
from tests.support.ports import free_port

GROUP = "kueue.x-k8s.io"
#: The namespace Kueue runs in (``namespace`` in its configuration) and its defaults for the names
#: its certificate rotator derives everything from.
NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"
SECRET = "kueue-webhook-server-cert"
#: Kueue's webhook configurations, as its kustomize config names them (prefix "kueue-"); the
#: rotator injects its CA into exactly these names.
MUTATING = "kueue-mutating-webhook-configuration"
VALIDATING = "kueue-validating-webhook-configuration"
#: The webhooks kept from Kueue's manifests: those for Kueue's own resources.
KEPT_WEBHOOKS = {
    MUTATING: ("mclusterqueue.kb.io", "mresourceflavor.kb.io", "mworkload.kb.io"),
    VALIDATING: ("vclusterqueue.kb.io", "vcohort.kb.io", "vresourceflavor.kb.io", "vworkload.kb.io"),
}
#: Kueue's ``pod`` integration's webhooks (mutating: gates and queues a pod; validating: its
#: labels), installed only with :attr:`Kueue.pod_webhook_namespaces`.
POD_WEBHOOKS = {MUTATING: ("mpod.kb.io",), VALIDATING: ("vpod.kb.io",)}
#: The namespaceSelector Kueue's kustomize config (config/components/webhook/kustomization.yaml)
#: patches onto both pod webhooks.
POD_WEBHOOK_EXCLUDED = {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NAMESPACE]}
#: The CRDs Kueue's kustomize config gives a conversion webhook (config/components/crd/patches).
CONVERTED_CRDS = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")
#: The Kueue objects :meth:`Kueue.purge` deletes, namespaced ones first (workloads before the
#: queues and flavors that their admission keeps in use).
NAMESPACED_KINDS = ("workloads", "localqueues")
CLUSTER_KINDS = (
    "clusterqueues",
    "cohorts",
    "resourceflavors",
    "admissionchecks",
    "workloadpriorityclasses",
    "topologies",
    "provisioningrequestconfigs",
    "multikueueconfigs",
    "multikueueclusters",
)
#: kubedgx's kind as Kueue's ``integrations.externalFrameworks`` spells it: ``Kind.version.group``.
DGX_FRAMEWORK = "DGXTrainingJob.v1alpha1.kubedgx.io"
#: The field manager of everything the harness applies.
MANAGER = "kubedgx-cluster-tests-kueue"
#: Kueue's RBAC (config/components/rbac) for its manager's own ServiceAccount: what its kustomize
#: config installs for the manager, but leader election (off here) and cluster profiles (a
#: MultiKueue feature, off).
RBAC_FILES = (
    "service_account.yaml",
    "role.yaml",
    "role_binding.yaml",
    "manager_secrets_role.yaml",
    "manager_secrets_role_binding.yaml",
    "metrics_auth_role.yaml",
    "metrics_auth_role_binding.yaml",
)
SERVICE_ACCOUNT = "kueue-controller-manager"
#: The rotator's CA name: it checks the CA certificate against this DNS name.
_CA_NAME = "kueue-ca"


# -- certificates --------------------------------------------------------------------------------


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    # PKCS#1 ("RSA PRIVATE KEY"): the rotator parses the Secret's ca.key with x509.ParsePKCS1PrivateKey.
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class KueuePki:
    """The CA (``ca_crt``, ``ca_key``) and serving certificate (``crt``, ``key``), PEM."""

    ca_crt: bytes
    ca_key: bytes
    crt: bytes
    key: bytes

    @classmethod
    def create(cls, *, days: int = 365) -> KueuePki:
        now = dt.datetime.now(dt.UTC)
        begin, end = now - dt.timedelta(hours=1), now + dt.timedelta(days=days)
        ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        ca_name = x509.Name(
            [x509.NameAttribute(NameOID.COMMON_NAME, _CA_NAME), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kueue")]
        )
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(begin)
            .not_valid_after(end + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_encipherment=True,
                    key_cert_sign=True,
                    content_commitment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(_CA_NAME)]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        service = f"{SERVICE}.{NAMESPACE}.svc"
        crt = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, service)]))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(begin)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.SubjectAlternativeName([x509.DNSName(service), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        return cls(
            ca_crt=ca.public_bytes(serialization.Encoding.PEM),
            ca_key=_pem_key(ca_key),
            crt=crt.public_bytes(serialization.Encoding.PEM),
            key=_pem_key(key),
        )

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.ca_crt).decode("ascii")


# -- the API versions the apiserver serves ------------------------------------------------------


@dataclass(frozen=True)
class ServedVersions:
    """The versions of ``group`` that serve ``resource`` (discovery order: preferred first) and the
    group's preferred version."""

    resource: str
    versions: tuple[str, ...]
    preferred: str | None

    def __contains__(self, version: object) -> bool:
        return version in self.versions


def served_versions(plane: ControlPlane, resource: str = "workloads", group: str = GROUP) -> ServedVersions:
    """Which versions of ``group`` serve ``resource``, from the apiserver's discovery documents."""
    doc = plane.get(f"/apis/{group}") or {}
    versions = [v["version"] for v in doc.get("versions", [])]

    def serves(version: str) -> bool:
        resources = (plane.get(f"/apis/{group}/{version}") or {}).get("resources", [])
        return any(r.get("name") == resource for r in resources)

    serving = tuple(v for v in versions if serves(v))
    return ServedVersions(resource, serving, (doc.get("preferredVersion") or {}).get("version"))


# -- the manager ----------------------------------------------------------------------------------


@dataclass
class KueuePorts:
    webhook: int
    health: int
    metrics: int

    @classmethod
    def pick(cls) -> KueuePorts:
        return cls(free_port(), free_port(), free_port())


def _load_yaml(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@dataclass
class Kueue:
    """Kueue's manager for one test module; its log goes to ``workdir/kueue.log``.

    ``frameworks`` and ``external_frameworks`` are Kueue's ``integrations``; ``config`` is merged
    over the generated configuration (top-level keys replace). With ``service_account`` the
    manager runs as its own ServiceAccount with exactly Kueue's RBAC (:data:`RBAC_FILES`, a
    TokenRequest token) instead of the admin; :meth:`forbidden` lists what RBAC refused it."""

    plane: ControlPlane
    workdir: Path
    frameworks: Sequence[str] = ("batch/job",)
    external_frameworks: Sequence[str] = (DGX_FRAMEWORK,)
    config: Mapping[str, Any] = field(default_factory=dict)
    #: Extra command-line flags (``--zap-log-level=5``...).
    args: Sequence[str] = ()
    service_account: bool = False
    #: Namespaces Kueue's pod webhooks (:data:`POD_WEBHOOKS`) reach; none (the default): not installed.
    pod_webhook_namespaces: Sequence[str] = ()
    ports: KueuePorts | None = None
    process: subprocess.Popen[bytes] | None = None
    #: Seconds the last start took (install, process start, until its webhooks answer).
    started_in: float = 0.0

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.binary = self.plane.bin["kueue"]
        self.manifests = self.plane.bin.kueue_config
        self.log_path = self.workdir / "kueue.log"
        self.cert_dir = self.workdir / "certs"
        self.config_path = self.workdir / "config.yaml"
        self.pki = KueuePki.create()
        self.kubectl = Kubectl(CONTEXT, binary=self.plane.kubectl_binary, kubeconfig=str(self.plane.kubeconfig))

    # -- what it runs with ----------------------------------------------------------------------

    @property
    def version(self) -> str:
        return self.plane.bin.kueue_version

    def configuration(self) -> dict[str, Any]:
        """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for the current ports."""
        assert self.ports is not None
        cfg: dict[str, Any] = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": NAMESPACE,
            "leaderElection": {"leaderElect": False},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.ports.health}"},
            "metrics": {"bindAddress": f"127.0.0.1:{self.ports.metrics}"},
            "webhook": {"port": self.ports.webhook, "host": "127.0.0.1", "certDir": str(self.cert_dir)},
            "internalCertManagement": {"enable": True, "webhookServiceName": SERVICE, "webhookSecretName": SECRET},
            "manageJobsWithoutQueueName": False,
            "integrations": {"frameworks": list(self.frameworks), "externalFrameworks": list(self.external_frameworks)},
            "featureGates": {"VisibilityOnDemand": False},
        }
        cfg.update(copy.deepcopy(dict(self.config)))
        return cfg

    def url(self, path: str) -> str:
        assert self.ports is not None
        return f"https://127.0.0.1:{self.ports.webhook}{path}"

    def crds(self) -> list[dict[str, Any]]:
        """Kueue's CRDs, the converted ones with a URL conversion webhook and the CA."""
        crds = []
        for path in sorted((self.manifests / "crd").glob("*.yaml")):
            for crd in _load_yaml(path):
                if crd["spec"]["names"]["plural"] in CONVERTED_CRDS:
                    crd["spec"]["conversion"] = {
                        "strategy": "Webhook",
                        "webhook": {
                            "clientConfig": {"url": self.url("/convert"), "caBundle": self.pki.ca_bundle},
                            "conversionReviewVersions": ["v1"],
                        },
                    }
                crds.append(crd)
        return crds

    def webhook_configurations(self) -> list[dict[str, Any]]:
        """Kueue's two webhook configurations, only the :data:`KEPT_WEBHOOKS` (and the
        :data:`POD_WEBHOOKS`, scoped to :attr:`pod_webhook_namespaces`, when there are any), with
        URL clientConfigs."""
        configs = []
        for config in _load_yaml(self.manifests / "webhook" / "manifests.yaml"):
            name = f"kueue-{config['metadata']['name']}"
            pods = POD_WEBHOOKS[name] if self.pod_webhook_namespaces else ()
            kept = (*KEPT_WEBHOOKS[name], *pods)
            config["metadata"] = {"name": name}
            config["webhooks"] = [w for w in config["webhooks"] if w["name"] in kept]
            assert sorted(w["name"] for w in config["webhooks"]) == sorted(kept), f"{name}: Kueue's manifests changed"
            for webhook in config["webhooks"]:
                path = webhook["clientConfig"]["service"]["path"]
                webhook["clientConfig"] = {"url": self.url(path), "caBundle": self.pki.ca_bundle}
                if webhook["name"] in pods:
                    only = {"key": "kubernetes.io/metadata.name", "operator": "In",
                            "values": sorted(self.pod_webhook_namespaces)}  # fmt: skip
                    webhook["namespaceSelector"] = {"matchExpressions": [copy.deepcopy(POD_WEBHOOK_EXCLUDED), only]}
            configs.append(config)
        return configs

    def rbac(self) -> list[dict[str, Any]]:
        """Kueue's RBAC for its manager as its kustomize config names it (prefix ``kueue-``,
        namespace kueue-system)."""
        objects = []
        for name in RBAC_FILES:
            for obj in _load_yaml(self.manifests / "rbac" / name):
                obj["metadata"]["name"] = f"kueue-{obj['metadata']['name']}"
                if "namespace" in obj["metadata"]:
                    obj["metadata"]["namespace"] = NAMESPACE
                if "roleRef" in obj:
                    obj["roleRef"]["name"] = f"kueue-{obj['roleRef']['name']}"
                for subject in obj.get("subjects", []):
                    subject["name"], subject["namespace"] = f"kueue-{subject['name']}", NAMESPACE
                objects.append(obj)
        return objects

    def kubeconfig(self) -> Path:
        """The admin's kubeconfig, or one with a token of Kueue's ServiceAccount."""
        if not self.service_account:
            return self.plane.kubeconfig
        path = self.workdir / "kueue.kubeconfig"
        if not path.exists():  # a 2h token, made once
            token_kubeconfig(self.plane, self.kubectl, path, (NAMESPACE, SERVICE_ACCOUNT))
        return path

    def forbidden(self) -> list[str]:
        """Log lines that report a call RBAC refused."""
        return [line for line in self.log().splitlines() if "is forbidden: User" in line]

    def secret(self) -> dict[str, Any]:
        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode("ascii")

        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": NAMESPACE},
            "type": "Opaque",
            "data": {"ca.crt": b64(self.pki.ca_crt), "ca.key": b64(self.pki.ca_key),
                     "tls.crt": b64(self.pki.crt), "tls.key": b64(self.pki.key)},
        }  # fmt: skip

    # -- lifecycle ------------------------------------------------------------------------------

    def _apply(self, objects: Sequence[Mapping[str, Any]]) -> None:
        text = json.dumps({"apiVersion": "v1", "kind": "List", "items": [dict(o) for o in objects]})
        self.kubectl.run("apply", "--server-side", "--force-conflicts", f"--field-manager={MANAGER}", "-f", "-",
                         input=text, timeout=120)  # fmt: skip

    def install(self) -> None:
        """CRDs (Established), namespace, the rotator's Secret, both webhook configurations; the
        certificate files in ``certDir``. For the current ports."""
        crds = self.crds()
        self._apply(crds)
        for crd in crds:
            name = crd["metadata"]["name"]
            wait_until(f"CRD {name} Established", lambda name=name: self._established(name), timeout=60)  # type: ignore[misc]
        self._apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
        if self.service_account:
            self._apply(self.rbac())
        self._apply([self.secret(), *self.webhook_configurations()])
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        (self.cert_dir / "tls.crt").write_bytes(self.pki.crt)
        (self.cert_dir / "tls.key").write_bytes(self.pki.key)
        (self.cert_dir / "tls.key").chmod(0o600)

    def _established(self, crd: str) -> bool:
        obj = self.plane.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}") or {}
        conditions = obj.get("status", {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, *, timeout: float = 120, attempts: int = 3) -> Kueue:
        """Install, start the manager, wait until it is ready and its webhooks answer. Retried with
        new ports when the manager lost a port to another process; stopped again on failure."""
        started = time.monotonic()
        for attempt in range(1, attempts + 1):
            try:
                self.ports = KueuePorts.pick()
                self.install()
                self.config_path.write_text(yaml.safe_dump(self.configuration(), sort_keys=False))
                self._spawn_and_wait(timeout)
            except StartError:
                in_use = "address already in use" in self.tail(40)
                self.stop(purge=False)
                if not in_use or attempt == attempts:
                    raise
            except BaseException:
                self.stop(purge=False)
                raise
            else:
                self.started_in = time.monotonic() - started
                return self
        raise AssertionError("unreachable")

    def _spawn_and_wait(self, timeout: float) -> None:
        argv = [str(self.binary), f"--config={self.config_path}", f"--kubeconfig={self.kubeconfig()}", *self.args]
        env = {**self.plane.env(), "TMPDIR": str(self.workdir)}
        # Never the in-cluster configuration of a pod this may run in.
        for var in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
            env.pop(var, None)
        with self.log_path.open("ab") as log:
            log.write(f"\n===== kueue: {' '.join(argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=env, start_new_session=True)  # fmt: skip
        wait_until("Kueue's /readyz", lambda: self._alive() and self.ready(), timeout=timeout, diagnose=self.tail)
        wait_until("Kueue's validating webhook to refuse an invalid ClusterQueue",
                   lambda: self._alive() and self.webhook_answers(), timeout=timeout, diagnose=self.tail)  # fmt: skip

    def _alive(self) -> bool:
        if not self.running:
            code = self.process.returncode if self.process is not None else None
            raise StartError(f"kueue exited with {code}:\n{self.tail(40)}")
        return True

    def ready(self) -> bool:
        assert self.ports is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports.health}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)

    def webhook_answers(self) -> bool:
        """A server-side dry-run create of an invalid ClusterQueue is refused by Kueue's webhook."""
        status, answer = self.plane.request("POST", f"/apis/{GROUP}/v1beta2/clusterqueues?dryRun=All",
                                            INVALID_CLUSTER_QUEUE)  # fmt: skip
        message = answer.get("message", "") if isinstance(answer, dict) else str(answer)
        return status == 403 and message.startswith(CLUSTER_QUEUE_DENIED)  # 403 Forbidden: a denial, not a 422

    def purge(self, *, timeout: float = 60) -> list[str]:
        """Delete every Kueue object (the manager releases its finalizers); whatever is left after
        ``timeout`` has its finalizers stripped and is returned (``kind/namespace/name``)."""
        k = self.kubectl
        k.run("delete", ",".join(NAMESPACED_KINDS), "--all", "--all-namespaces", "--wait=false", "--ignore-not-found")
        k.run("delete", ",".join(CLUSTER_KINDS), "--all", "--wait=false", "--ignore-not-found")

        def left() -> list[str]:
            out = k.get_json("get", ",".join(f"{kind}.{GROUP}" for kind in NAMESPACED_KINDS + CLUSTER_KINDS),
                             "--all-namespaces")  # fmt: skip
            return [f"{o['kind']}/{o['metadata'].get('namespace', '')}/{o['metadata']['name']}" for o in out["items"]]

        try:
            wait_until("every Kueue object deleted", lambda: not left(), timeout=timeout, interval=0.5)
            return []
        except StartError:
            remaining = left()
        for ref in remaining:
            kind, namespace, name = ref.split("/")
            strip = '{"metadata":{"finalizers":null}}'
            k.in_namespace(namespace or None).run("patch", f"{kind.lower()}.{GROUP}", name, "--type", "merge",
                                                  "-p", strip, check=False)  # fmt: skip
        return remaining

    def stop(self, *, purge: bool = True, timeout: float = 10) -> list[str]:
        """Purge (see :meth:`purge`; only while the manager runs), stop the process group (SIGKILL
        after ``timeout``: a manager stopped within seconds of its start was seen to hang in its
        shutdown), delete the webhook configurations and turn the CRDs' conversion off. Returns
        what purge had to strip."""
        stuck: list[str] = []
        if purge and self.running:
            stuck = self.purge()
        if self.process is not None:
            stop_process_group(self.process, timeout)
        k = self.kubectl
        k.run("delete", "mutatingwebhookconfiguration", MUTATING, "--ignore-not-found", check=False)
        k.run("delete", "validatingwebhookconfiguration", VALIDATING, "--ignore-not-found", check=False)
        for plural in CONVERTED_CRDS:
            k.run("patch", "customresourcedefinition", f"{plural}.{GROUP}", "--type", "merge",
                  "-p", '{"spec":{"conversion":{"strategy":"None","webhook":null}}}', check=False)  # fmt: skip
        return stuck

    def restart(self, *, timeout: float = 120) -> Kueue:
        """Stop the manager (keeping every Kueue object) and start it again on new ports."""
        self.stop(purge=False)
        return self.start(timeout=timeout)

    # -- reading --------------------------------------------------------------------------------

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:]) or "(no log)"

    def workload_versions(self) -> ServedVersions:
        return served_versions(self.plane)


#: A ClusterQueue only Kueue's webhook refuses (the CRD's schema accepts it): the quota names a
#: resource the group does not cover.
INVALID_CLUSTER_QUEUE: dict[str, Any] = {
    "apiVersion": f"{GROUP}/v1beta2",
    "kind": "ClusterQueue",
    "metadata": {"name": "kubedgx-harness-invalid"},
    "spec": {
        "resourceGroups": [
            {
                "coveredResources": ["cpu"],
                "flavors": [{"name": "default", "resources": [{"name": "memory", "nominalQuota": "1"}]}],
            }
        ]
    },
}
CLUSTER_QUEUE_DENIED = 'admission webhook "vclusterqueue.kb.io" denied the request'


@contextlib.contextmanager
def serving(kueue: Kueue) -> Iterator[Kueue]:
    """``kueue`` started (a failed start fails the test with Kueue's own words), then stopped with
    every Kueue object deleted; it fails if anything had to have its finalizers stripped."""
    try:
        kueue.start()
    except StartError as exc:
        pytest.fail(f"Kueue did not start: {exc}", pytrace=False)
    try:
        yield kueue
    finally:
        stuck = kueue.stop()
        assert stuck == [], f"Kueue objects nobody released (finalizers stripped): {stuck}"
