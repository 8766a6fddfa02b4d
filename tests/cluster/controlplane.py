"""A real Kubernetes control plane as local processes: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, and kwok as the kubelet of fake DGX nodes.

The way controller-runtime's envtest and kwokctl's binary runtime run one, with the parts the
operator's behaviour depends on switched on: RBAC and Node authorization, the default admission
plugins (PodSecurity, Priority, ServiceAccount among them), ServiceAccount tokens, the garbage
collector, namespace, node lifecycle (short grace periods), EndpointSlice and ServiceAccount
controllers, the real scheduler. Binaries come from ``tests/cluster/build.sh`` (built from Go
modules, cached outside the work tree).

Everything listens on 127.0.0.1, on free ports; every component writes its log to
``<root>/logs/<name>.log``, which :meth:`ControlPlane.logs` prints when something fails. Nothing
here depends on pytest: ``python -m tests.cluster up`` starts the same cluster by hand.

Fake nodes are plain Node objects (``kwok.x-k8s.io/node: fake``) generated from the instance
catalog (:func:`dgx_nodes`); kwok keeps their heartbeats and plays their pods' lifecycle through
stages (``stages/kubedgx.yaml`` and kwok's own), so a test states a pod's fate with a label:
:data:`EXIT_CODE_LABEL`, :data:`EVICT_LABEL`; a node's with :data:`NODE_NOT_READY_LABEL` (its
kubelet reports NotReady), or by losing it (:meth:`ControlPlane.lose_lossy_nodes`: its kubelet
goes silent, so its pods stay Terminating, as on an unreachable node).

Lossy nodes have their own kwok process, because the node lifecycle controller evicts nothing in a
zone whose every node went silent at once (it takes that for a control-plane network problem): one
kwok for all nodes, stopped, would show no node loss at all. They carry :data:`LOSSY_TAINT`, so only
pods that tolerate it land there.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar, cast

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dgx_operator.catalog import Catalog, Instance
from tests.e2e.fakegpu import GPU_RESOURCE, node_labels, node_taints
from tests.support.ports import free_port
from tests.support.wait import wait_until as support_wait_until

T = TypeVar("T")

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
STAGES = HERE / "stages"
CONTEXT = "kubedgx-local"

#: kwok's own stages the harness loads (relative to its stage directory), then ours.
KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "node/chaos/node-not-ready.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)
#: On a Running pod: its containers exit with this code (0 -> Succeeded, else Failed).
EXIT_CODE_LABEL = "test.kubedgx.io/exit-code"
#: With EXIT_CODE_LABEL: the containers' termination message (what the trainer would write).
MESSAGE_ANNOTATION = "test.kubedgx.io/termination-message"
#: On a Running pod: evicted by the kubelet (phase Failed, reason Evicted, DisruptionTarget).
EVICT_LABEL = "test.kubedgx.io/evict"
#: On a node: kwok reports it NotReady (the node lifecycle controller then taints it).
NODE_NOT_READY_LABEL = "node-not-ready.stage.kwok.x-k8s.io"
#: The annotation kwok selects its nodes by, the value of the main kwok's nodes and of the lossy ones.
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_MANAGED = "fake"
KWOK_LOSSY = "lossy"
#: Label and NoSchedule taint of the lossy nodes (tolerate it to be placed there).
LOSSY_LABEL = "test.kubedgx.io/lossy"
LOSSY_TAINT = {"key": LOSSY_LABEL, "value": "true", "effect": "NoSchedule"}

#: How long a node may miss heartbeats before the node lifecycle controller marks it Unknown,
#: and how long pods tolerate a not-ready/unreachable node before they are evicted.
NODE_MONITOR_GRACE_SECONDS = 12
TOLERATION_SECONDS = 5


class UnavailableError(RuntimeError):
    """No control plane can be had here (no Go toolchain): the cluster tests skip with this reason."""


class StartError(RuntimeError):
    """A build or a component failed; the message carries the reason and the logs."""


# --------------------------------------------------------------------------------------------
# Binaries
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Binaries:
    """The bin dir ``build.sh`` prints: one link per binary (``kueue`` among them), ``kwok-stage``,
    ``kueue-config`` and versions.env."""

    dir: Path
    versions: Mapping[str, str]

    def __getitem__(self, name: str) -> Path:
        return self.dir / name

    @property
    def kwok_stages(self) -> Path:
        return Path(self.versions.get("KWOK_STAGE_DIR") or self.dir / "kwok-stage")

    @property
    def kubernetes_version(self) -> str:
        return self.versions["K8S_VERSION"]

    @property
    def kueue_config(self) -> Path:
        """Kueue's manifests from its module: ``crd/*.yaml``, ``webhook/manifests.yaml``, ``rbac/*.yaml``."""
        return Path(self.versions.get("KUEUE_CONFIG_DIR") or self.dir / "kueue-config")

    @property
    def kueue_version(self) -> str:
        return self.versions["KUEUE_VERSION"]


def build(*, out: IO[str] | None = None) -> Binaries:
    """Build what is missing (or reuse the cache) and return the binaries.

    Raises :class:`UnavailableError` where this machine has no Go toolchain, :class:`StartError` when
    the build fails (a machine with Go that cannot build is a failure, not a skip)."""
    if shutil.which("go") is None:
        raise UnavailableError(
            "no Go toolchain on PATH: the control plane is built from Go modules (tests/cluster/README.md)"
        )
    started = time.monotonic()
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    if out is not None:
        out.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
        raise StartError(f"tests/cluster/build.sh exited {proc.returncode}:\n{tail}")
    bin_dir = Path(proc.stdout.strip().splitlines()[-1])
    versions = dict(line.split("=", 1) for line in (bin_dir / "versions.env").read_text().splitlines() if "=" in line)
    if out is not None:
        out.write(f"control plane binaries ready in {time.monotonic() - started:.1f}s: {bin_dir}\n")
    return Binaries(bin_dir, versions)


# --------------------------------------------------------------------------------------------
# Certificates
# --------------------------------------------------------------------------------------------


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _cert(
    subject: x509.Name,
    key: rsa.RSAPrivateKey,
    issuer: tuple[x509.Certificate, rsa.RSAPrivateKey] | None,
    *,
    usage: x509.ObjectIdentifier | None = None,
    sans: Sequence[str] = (),
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    issuer_name, signer = (issuer[0].subject, issuer[1]) if issuer else (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        names: list[x509.GeneralName] = []
        for san in sans:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(san)))
            except ValueError:
                names.append(x509.DNSName(san))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(signer, hashes.SHA256())


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


@dataclass(frozen=True)
class Pki:
    """The cluster's CA, the apiserver's serving certificate, an admin client certificate (group
    system:masters) and the ServiceAccount signing key pair."""

    dir: Path

    ca_crt = property(lambda self: self.dir / "ca.crt")
    ca_key = property(lambda self: self.dir / "ca.key")
    apiserver_crt = property(lambda self: self.dir / "apiserver.crt")
    apiserver_key = property(lambda self: self.dir / "apiserver.key")
    admin_crt = property(lambda self: self.dir / "admin.crt")
    admin_key = property(lambda self: self.dir / "admin.key")
    sa_key = property(lambda self: self.dir / "sa.key")
    sa_pub = property(lambda self: self.dir / "sa.pub")

    @classmethod
    def create(cls, directory: Path, apiserver_sans: Sequence[str] = ()) -> Pki:
        """A CA, the apiserver's serving pair (``apiserver_sans`` added to its names), the admin's client
        pair and the ServiceAccount signing key."""
        directory.mkdir(parents=True, exist_ok=True)
        pki = cls(directory)
        ca_key = _key()
        ca = _cert(_name("kubedgx-test-ca"), ca_key, None)
        _write_key(pki.ca_key, ca_key)
        pki.ca_crt.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        for crt, key_path, subject, usage, sans in (
            (
                pki.apiserver_crt,
                pki.apiserver_key,
                _name("kube-apiserver"),
                ExtendedKeyUsageOID.SERVER_AUTH,
                [
                    "127.0.0.1",
                    "localhost",
                    "10.96.0.1",
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    *apiserver_sans,
                ],
            ),
            (
                pki.admin_crt,
                pki.admin_key,
                _name("kubedgx-test-admin", "system:masters"),
                ExtendedKeyUsageOID.CLIENT_AUTH,
                [],
            ),
        ):
            key = _key()
            _write_key(key_path, key)
            crt.write_bytes(
                _cert(subject, key, (ca, ca_key), usage=usage, sans=sans).public_bytes(serialization.Encoding.PEM)
            )
        sa = _key()
        _write_key(pki.sa_key, sa)
        pki.sa_pub.write_bytes(
            sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        return pki

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_crt))
        ctx.load_cert_chain(str(self.admin_crt), str(self.admin_key))
        return ctx


# --------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------


def stop_process_group(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM to the process's group (it was started in a session of its own), SIGKILL after
    ``timeout``: whatever it started goes with it."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


@dataclass
class Component:
    """One process of the control plane, its log in a file."""

    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        log.write(f"\n===== {self.name}: {' '.join(self.argv)}\n".encode())
        log.flush()
        # Its own process group: stopping the cluster stops everything the component started.
        self.process = subprocess.Popen(
            self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        log.close()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 15) -> None:
        if self.process is not None:
            stop_process_group(self.process, timeout)

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


#: What a probe of a component still starting may raise: "not yet" (its port not listening yet, an
#: answer cut short).
NOT_YET: tuple[type[BaseException], ...] = (OSError, urllib.error.URLError, json.JSONDecodeError)


def wait_until(what: str, probe: Callable[[], T | None], *, timeout: float, interval: float = 0.25,
               diagnose: Callable[[], str] | None = None) -> T:  # fmt: skip
    """tests.support.wait.wait_until for the control plane: ``what`` first, NOT_YET errors mean
    "look again", and a timeout raises StartError."""
    return support_wait_until(probe, timeout=timeout, what=what, interval=interval, retry_on=NOT_YET,
                              diagnose=diagnose, error=StartError)  # fmt: skip


# --------------------------------------------------------------------------------------------
# Fake DGX nodes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodePool:
    """``count`` nodes passing for ``instance``; ``clique`` names their NVLink domain (multi-node
    NVLink products only; several pools of one product with different cliques make two domains)."""

    instance: str
    count: int
    clique: str | None = None
    #: Managed by the second kwok, which :meth:`ControlPlane.lose_lossy_nodes` stops.
    lossy: bool = False
    #: MIG slices per node under the ``mixed`` strategy, profile (the device plugin's spelling) -> how
    #: many: ``{"1g.10gb": 56}`` is every GPU of a DGX A100 cut in seven. None: whole GPUs only.
    mig: Mapping[str, int] | None = None
    #: The node's ``nvidia.com/mig.config`` (MIG Manager's geometry); None: ``all-<profile>`` for a
    #: single profile, ``custom`` otherwise.
    mig_config: str | None = None


#: The nodes of the default cluster: enough for one worker per node, spot and debug pools, two
#: NVLink domains of GB200 trays, and a second GPU product to miss.
DEFAULT_POOLS = (
    NodePool("dgxh100.80g.8.norm", 4),
    NodePool("dgxh100.80g.8.spot", 2),
    NodePool("dgxh100.80g.8.debug", 1),
    NodePool("dgxa100.80g.8.norm", 2),
    NodePool("dgxgb200.186g.4.norm", 2, clique="nvl72-a.0"),
    NodePool("dgxgb200.186g.4.norm", 2, clique="nvl72-b.0"),
    NodePool("dgxh100.80g.8.norm", 1, lossy=True),
)


#: A MIG profile's name, ``<g>g.<memory>gb`` (``.me`` and the like after it): g of a GPU's 7 compute slices.
MIG_PROFILE = re.compile(r"^(?P<slices>[1-7])g\.(?P<memory>[0-9]+)gb(\.[a-z]+)?$")
#: Compute slices of a GPU in MIG mode (A100, H100, H200, B200).
GPU_SLICES = 7


def mig_config_name(mig: Mapping[str, int]) -> str:
    """What MIG Manager's ``nvidia.com/mig.config`` would say for this geometry, when nobody named it."""
    return f"all-{next(iter(mig))}" if len(mig) == 1 else "custom"


def mig_gpus(mig: Mapping[str, int]) -> int:
    """How many GPUs these slices take (each GPU gives 7 compute slices; a partly cut GPU is in MIG mode
    too, so it is not advertised whole)."""
    slices = 0
    for profile, count in mig.items():
        match = MIG_PROFILE.match(profile)
        if match is None:
            raise ValueError(f"MIG profile {profile!r} is not <g>g.<memory>gb (the device plugin's spelling)")
        slices += int(match["slices"]) * count
    return -(-slices // GPU_SLICES)


def mig_memory_mb(inst: Instance, profile: str) -> int:
    """GFD's ``nvidia.com/mig-<profile>.memory`` (MB): the catalog's memoryGiB of the profile, else the
    profile's name (``1g.10gb`` -> 10 GB)."""
    for listed in inst.family.mig:
        if listed.profile == profile:
            return listed.memory_gi_b * 1024
    match = MIG_PROFILE.match(profile)
    if match is None:
        raise ValueError(f"MIG profile {profile!r} is not <g>g.<memory>gb (the device plugin's spelling)")
    return int(match["memory"]) * 1024


def dgx_node(name: str, inst: Instance, *, clique: str | None = None, lossy: bool = False,
             mig: Mapping[str, int] | None = None, mig_config: str | None = None) -> dict[str, Any]:  # fmt: skip
    """A Node that kwok manages and that passes for one node of ``inst``: GPU Feature Discovery's
    labels, the pool's taints, ``nvidia.com/gpu`` capacity; CPU and memory as the catalog says.

    With ``mig`` (profile -> slices), the node is one whose GPUs MIG Manager cut so, as GFD and the
    device plugin show it under the ``mixed`` strategy: ``nvidia.com/mig.strategy=mixed``,
    ``gpu.count`` and ``gpu.product`` still the physical GPUs', ``nvidia.com/mig-<profile>.count`` and
    ``.memory`` (MB) per profile, capacity ``nvidia.com/mig-<profile>`` per profile and
    ``nvidia.com/gpu`` only for the GPUs left whole."""
    labels = {**node_labels(inst), "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"}
    taints = node_taints(inst)
    if clique is not None:
        labels[inst.labels.clique] = clique
    if lossy:
        labels[LOSSY_LABEL] = "true"
        taints.append(dict(LOSSY_TAINT))
    node = inst.family.node  # the node model's allocatable, when the catalog gives it: the scheduler checks the fit
    capacity = {
        "cpu": str(node.cpu) if node is not None else str(max(int(inst.cpu) * 2, 16)),
        "memory": f"{node.memory_gi}Gi" if node is not None else "4Ti",
        "pods": "110",
        "ephemeral-storage": "30Ti",
        GPU_RESOURCE: str(inst.gpus),
    }
    if mig:
        in_mig_mode = mig_gpus(mig)
        if inst.gpus != inst.node_gpus or inst.mig is not None:
            raise ValueError(f"{name}: a MIG-sliced node passes for a whole-node instance, not {inst.name}")
        if in_mig_mode > inst.gpus:
            raise ValueError(f"{name}: MIG slices {dict(mig)} need {in_mig_mode} GPUs, the node has {inst.gpus}")
        labels |= {
            "nvidia.com/mig.strategy": "mixed",
            "nvidia.com/mig.config": mig_config or mig_config_name(mig),
            **{f"nvidia.com/mig-{p}.count": str(n) for p, n in mig.items()},
            **{f"nvidia.com/mig-{p}.memory": str(mig_memory_mb(inst, p)) for p in mig},
        }
        capacity |= {f"nvidia.com/mig-{p}": str(n) for p, n in mig.items()}
        capacity[GPU_RESOURCE] = str(inst.gpus - in_mig_mode)  # gpu.count stays the physical count
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_NODE_ANNOTATION: KWOK_LOSSY if lossy else KWOK_MANAGED},
        },
        "spec": {"taints": taints},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def dgx_nodes(pools: Iterable[NodePool] = DEFAULT_POOLS, catalog: Catalog | None = None) -> list[dict[str, Any]]:
    catalog = catalog or Catalog.load()
    nodes = []
    for pool in pools:
        inst = catalog.get(pool.instance)
        stem = pool.instance.replace(".", "-")
        if pool.clique:
            stem += f"-{pool.clique.replace('.', '-')}"
        if pool.lossy:
            stem += "-lossy"
        if pool.mig:
            stem += "-mig-" + (pool.mig_config or mig_config_name(pool.mig)).replace(".", "-")
        for i in range(pool.count):
            nodes.append(dgx_node(f"{stem}-{i}", inst, clique=pool.clique, lossy=pool.lossy, mig=pool.mig,
                                  mig_config=pool.mig_config))  # fmt: skip
    return nodes


# --------------------------------------------------------------------------------------------
# The control plane
# --------------------------------------------------------------------------------------------


class Stoppable(Protocol):
    def stop(self) -> None: ...


class OperatorSlot:
    """Room for one operator: two operators reconciling the same jobs would fight, so whoever
    starts one first stops the one that holds the slot. Test modules run one after another, each
    taking the slot for its own operator (cluster-wide, namespaced, with a webhook...)."""

    def __init__(self) -> None:
        self.owner: str | None = None
        self.current: Stoppable | None = None

    def take(self, owner: str, start: Callable[[], T]) -> T:
        self.release()
        started = start()
        self.owner, self.current = owner, cast(Stoppable, started)
        return started

    def holds(self, owner: str) -> Stoppable | None:
        return self.current if self.owner == owner else None

    def release(self, owner: str | None = None) -> None:
        """Stop the operator in the slot (only ``owner``'s, when given)."""
        if self.current is not None and (owner is None or owner == self.owner):
            self.current.stop()
            self.owner, self.current = None, None


@dataclass
class Ports:
    etcd: int = field(default_factory=free_port)
    etcd_peer: int = field(default_factory=free_port)
    apiserver: int = field(default_factory=free_port)
    controller_manager: int = field(default_factory=free_port)
    scheduler: int = field(default_factory=free_port)
    kwok: int = field(default_factory=free_port)
    kwok_lossy: int = field(default_factory=free_port)


class ControlPlane:
    """The processes, their certificates and kubeconfig, under ``root``."""

    def __init__(
        self,
        root: Path,
        binaries: Binaries,
        *,
        pools: Sequence[NodePool] = DEFAULT_POOLS,
        apiserver_args: Sequence[str] = (),
        sans: Sequence[str] = (),
        scheduler_config: Mapping[str, Any] | None = None,
    ) -> None:
        """``sans``: more names of the apiserver's serving certificate (an address on which a
        forwarder makes it reachable, tests/nodes: the pods' bridge). ``scheduler_config``: a
        KubeSchedulerConfiguration (profiles, plugin arguments) kube-scheduler runs with (``--config``);
        None: its defaults, as in most clusters."""
        self.root = root
        self.bin = binaries
        self.pools = tuple(pools)
        self.ports = Ports()
        self.extra_apiserver_args = list(apiserver_args)
        self.logs_dir = root / "logs"
        self.pki = Pki.create(root / "pki", sans)
        self.kubeconfig = root / "admin.kubeconfig"
        self._write_kubeconfig()
        self.scheduler_config: Path | None = None
        if scheduler_config is not None:
            self.scheduler_config = root / "kube-scheduler.yaml"
            self._write_scheduler_config(scheduler_config)
        self.components: dict[str, Component] = {}
        #: The one kubedgx operator running against this cluster at a time (tests/cluster/operator.py).
        self.slot = OperatorSlot()

    # -- configuration ------------------------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def kubectl_binary(self) -> str:
        return str(self.bin["kubectl"])

    def _write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": CONTEXT, "cluster": {"server": self.server, "certificate-authority": str(self.pki.ca_crt)}}
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {"client-certificate": str(self.pki.admin_crt), "client-key": str(self.pki.admin_key)},
                }
            ],
            "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": "admin"}}],
            "current-context": CONTEXT,
        }
        self.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))

    def _write_scheduler_config(self, config: Mapping[str, Any]) -> None:
        """The configuration file: with ``--config``, kube-scheduler ignores its deprecated flags
        (``--kubeconfig`` among them: the client connection comes from the file) and honours only the
        leader election ones, so both are written here."""
        assert self.scheduler_config is not None
        written = dict(config)
        written["clientConnection"] = {**(config.get("clientConnection") or {}), "kubeconfig": str(self.kubeconfig)}
        written["leaderElection"] = {**(config.get("leaderElection") or {}), "leaderElect": False}
        self.scheduler_config.write_text(yaml.safe_dump(written, sort_keys=False))

    def env(self) -> dict[str, str]:
        """The environment for a process that should talk to this cluster (kubectl first on PATH)."""
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bin.dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def _argv(self) -> dict[str, list[str]]:
        p, pki, kc = self.ports, self.pki, str(self.kubeconfig)
        kube_flags = [f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}"]
        # With --config, kube-scheduler takes its client connection from the file (_write_scheduler_config).
        scheduler_flags = (
            [f"--config={self.scheduler_config}", *kube_flags[1:]] if self.scheduler_config else kube_flags
        )
        return {
            "etcd": [
                str(self.bin["etcd"]),
                "--name=n0",
                f"--data-dir={self.root / 'etcd'}",
                "--unsafe-no-fsync=true",
                f"--listen-client-urls=http://127.0.0.1:{p.etcd}",
                f"--advertise-client-urls=http://127.0.0.1:{p.etcd}",
                f"--listen-peer-urls=http://127.0.0.1:{p.etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{p.etcd_peer}",
                f"--initial-cluster=n0=http://127.0.0.1:{p.etcd_peer}",
                "--listen-metrics-urls=",
                "--log-level=warn",
            ],
            "kube-apiserver": [
                str(self.bin["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{p.etcd}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={p.apiserver}",
                f"--cert-dir={self.root / 'apiserver-certs'}",
                f"--tls-cert-file={pki.apiserver_crt}",
                f"--tls-private-key-file={pki.apiserver_key}",
                f"--client-ca-file={pki.ca_crt}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                # A loopback advertise address would make the `kubernetes` Endpoints invalid.
                "--endpoint-reconciler-type=none",
                # Webhooks (and aggregated APIs) behind a Service are reached at a ready endpoint of it,
                # not at its ClusterIP, which needs a kube-proxy this cluster has not: the chart's
                # webhook, served by pods tests/cluster/podrunner.py runs (test_ha.py).
                "--enable-aggregator-routing=true",
                f"--default-not-ready-toleration-seconds={TOLERATION_SECONDS}",
                f"--default-unreachable-toleration-seconds={TOLERATION_SECONDS}",
                *self.extra_apiserver_args,
            ],
            "kube-controller-manager": [
                str(self.bin["kube-controller-manager"]),
                *kube_flags,
                "--bind-address=127.0.0.1",
                f"--secure-port={p.controller_manager}",
                "--leader-elect=false",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca_crt}",
                "--use-service-account-credentials=true",
                f"--cluster-signing-cert-file={pki.ca_crt}",
                f"--cluster-signing-key-file={pki.ca_key}",
                f"--node-monitor-grace-period={NODE_MONITOR_GRACE_SECONDS}s",
                "--node-monitor-period=2s",
                "--concurrent-gc-syncs=5",
            ],
            "kube-scheduler": [
                str(self.bin["kube-scheduler"]),
                *scheduler_flags,
                "--bind-address=127.0.0.1",
                f"--secure-port={p.scheduler}",
                "--leader-elect=false",
            ],
            "kwok": self._kwok_argv(KWOK_MANAGED, p.kwok),
            "kwok-lossy": self._kwok_argv(KWOK_LOSSY, p.kwok_lossy),
        }

    def _kwok_argv(self, managed: str, port: int) -> list[str]:
        stages = [self.bin.kwok_stages / s for s in KWOK_STAGES] + sorted(STAGES.glob("*.yaml"))
        return [
            str(self.bin["kwok"]),
            f"--kubeconfig={self.kubeconfig}",
            *[f"--config={s}" for s in stages],
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={managed}",
            "--manage-nodes-with-label-selector=",
            "--manage-single-node=",
            "--cidr=10.244.0.0/16",
            "--node-ip=10.0.0.1",
            "--node-lease-duration-seconds=20",
            f"--server-address=127.0.0.1:{port}",
        ]

    def _ready(self, name: str) -> Callable[[], bool]:
        p = self.ports
        return {
            "etcd": lambda: self._http_ok(f"http://127.0.0.1:{p.etcd}/health"),
            "kube-apiserver": lambda: self._api_ok("/readyz"),
            "kube-controller-manager": lambda: self._insecure_ok(p.controller_manager),
            "kube-scheduler": lambda: self._insecure_ok(p.scheduler),
            "kwok": lambda: self._http_ok(f"http://127.0.0.1:{p.kwok}/healthz"),
            "kwok-lossy": lambda: self._http_ok(f"http://127.0.0.1:{p.kwok_lossy}/healthz"),
        }[name]

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, *, timeout: float = 120) -> None:
        """Start every component in order, each waited for, then the fake nodes; on any failure
        stop what runs and raise with the logs."""
        started = time.monotonic()
        try:
            for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kwok-lossy"):
                self._start(name, self._ready(name), timeout)
            # The ServiceAccount controller works (pods need the default ServiceAccount to be admitted).
            wait_until(
                "the default ServiceAccount (kube-controller-manager's ServiceAccount controller)",
                lambda: self.get("/api/v1/namespaces/default/serviceaccounts/default"),
                timeout=timeout,
                diagnose=self.logs,
            )
            self.add_nodes(dgx_nodes(self.pools))
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - started

    def _start(self, name: str, ready: Callable[[], bool], timeout: float) -> None:
        component = Component(name, self._argv()[name], self.logs_dir / f"{name}.log")
        self.components[name] = component
        component.start()

        def probe() -> bool:
            if not component.running:
                raise StartError(f"{name} exited with {component.process and component.process.returncode}:\n"
                                 f"{component.tail(40)}")  # fmt: skip
            return ready()

        wait_until(f"{name} to be ready", probe, timeout=timeout, diagnose=lambda: component.tail(40))

    def stop(self) -> None:
        for name in reversed(list(self.components)):
            self.components[name].stop()

    def restart(self, name: str, *, timeout: float = 120, apiserver_args: Sequence[str] | None = None,
                wait_whole: bool = True) -> None:  # fmt: skip
        """Stop one component and start it again (an apiserver restart, say); for the apiserver,
        ``apiserver_args`` replaces the extra flags it runs with from then on (None: keep them), and
        with ``wait_whole`` the restart returns once the controllers serve again. A test whose own
        waits need only some of them (a job's pods scheduled and Running: the scheduler and kwok)
        passes False: kube-controller-manager's watches can take a minute or more to come back on a
        loaded machine, and with throttling flags much longer."""
        if apiserver_args is not None:
            self.extra_apiserver_args = list(apiserver_args)
        self.components[name].stop()
        self._start(name, self._ready(name), timeout)
        if name == "kube-apiserver" and wait_whole:
            self.wait_whole(timeout=timeout)

    def wait_whole(self, *, timeout: float = 120) -> None:
        """Until the controllers work again after an apiserver restart (their watches come back at
        their own pace): a fresh namespace gets its default ServiceAccount, then goes."""
        probe = f"kubedgx-probe-{secrets.token_hex(3)}"
        status, answer = self.request("POST", "/api/v1/namespaces", {"metadata": {"name": probe}})
        if status != 201:
            raise StartError(f"creating namespace {probe}: {status} {answer}")
        wait_until("kube-controller-manager to serve a new namespace again",
                   lambda: self.get(f"/api/v1/namespaces/{probe}/serviceaccounts/default"), timeout=timeout,
                   diagnose=self.logs)  # fmt: skip
        self.request("DELETE", f"/api/v1/namespaces/{probe}")

    def etcd(self, method: str, body: Mapping[str, Any]) -> Any:
        """One call to etcd's JSON gateway (``/v3/kv/range``, ``/v3/kv/compaction``...)."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.ports.etcd}/v3/{method}", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (physically): a watch that resumes from
        an older resourceVersion then gets 410 Gone. Returns the revision."""
        revision = int(self.etcd("kv/range", {"key": "AA=="})["header"]["revision"])
        self.etcd("kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def logs(self, lines: int = 30) -> str:
        """The last lines of every component's log, for a failure report."""
        return "\n".join(f"----- {c.name} ({'running' if c.running else 'stopped'}) -----\n{c.tail(lines)}"
                         for c in self.components.values())  # fmt: skip

    # -- the API, as the admin ----------------------------------------------------------

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None, *,
                content_type: str = "application/json", timeout: float = 10) -> tuple[int, Any]:  # fmt: skip
        """(status, decoded JSON) of one request as the admin; never raises for an HTTP error."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.pki.client_context(), timeout=timeout) as resp:
                raw = resp.read()
                status = resp.status
        except urllib.error.HTTPError as exc:
            raw, status = exc.read(), exc.code
        try:
            return status, json.loads(raw) if raw else None
        except json.JSONDecodeError:
            return status, raw.decode(errors="replace")

    def get(self, path: str) -> Any:
        status, obj = self.request("GET", path)
        return obj if status == 200 else None

    def add_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        for node in nodes:
            status, answer = self.request("POST", "/api/v1/nodes", node)
            if status not in (201, 409):
                raise StartError(f"creating node {node['metadata']['name']}: {status} {answer}")
        names = [n["metadata"]["name"] for n in nodes]
        wait_until(f"nodes {names} Ready (kwok)", lambda: all(self.node_ready(n) for n in names), timeout=60,
                   diagnose=self.logs)  # fmt: skip

    def node_ready(self, name: str) -> bool:
        node = self.get(f"/api/v1/nodes/{name}")
        for cond in (node or {}).get("status", {}).get("conditions") or []:
            if cond.get("type") == "Ready":
                return bool(cond.get("status") == "True")
        return False

    def lossy_nodes(self) -> list[str]:
        status, answer = self.request("GET", f"/api/v1/nodes?labelSelector={LOSSY_LABEL}%3Dtrue")
        return sorted(n["metadata"]["name"] for n in answer["items"]) if status == 200 else []

    def lose_lossy_nodes(self) -> None:
        """The lossy nodes' kubelet goes silent: no heartbeats, no lease renewals, and their pods
        never confirm a deletion (unreachable nodes). The node lifecycle controller marks them
        Unknown after NODE_MONITOR_GRACE_SECONDS and taints them unreachable."""
        self.components["kwok-lossy"].stop()

    def recover_lossy_nodes(self, *, timeout: float = 60) -> None:
        """Their kubelet is back: heartbeats resume, Terminating pods there finish deleting."""
        self._start("kwok-lossy", self._ready("kwok-lossy"), timeout)
        names = self.lossy_nodes()
        wait_until(f"nodes {names} Ready again", lambda: all(self.node_ready(n) for n in names), timeout=timeout,
                   diagnose=self.logs)  # fmt: skip

    # -- readiness probes ---------------------------------------------------------------

    @staticmethod
    def _http_ok(url: str) -> bool:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)

    def _api_ok(self, path: str) -> bool:
        status, _ = self.request("GET", path, timeout=3)
        return status == 200

    @staticmethod
    def _insecure_ok(port: int) -> bool:
        """kcm and the scheduler serve /healthz over TLS with a self-signed certificate."""
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=ctx, timeout=2) as resp:
            return bool(resp.status == 200)
