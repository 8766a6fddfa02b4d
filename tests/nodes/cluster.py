"""Real nodes beside tests/cluster's control plane: each a kubelet with a containerd of its own, pods
on a bridge through CNI, CoreDNS for cluster DNS, all on this machine and all undone at the end.

What it changes while it runs, and takes back: one bridge (``kdgx<id>``) with a private /16 that no
route of the machine overlaps, a cgroup root per node in every v1 hierarchy, the bind mounts the
kubelets need under this cluster's own directory, containerd's shim sockets under /run/containerd.
What it never changes: sysctls (the kubelet's six are faked inside its own mount namespace),
iptables (``makeIPTablesUtilChains: false``, no kube-proxy), routes out of the machine, ip_forward
(CNI ``isGateway: false``, no NAT: pods reach each other, the host's bridge addresses and nothing
else). :meth:`RealNodes.leftovers` says what of it remains; the tests assert it is nothing.

The facts behind each setting were measured in ``../shared/REAL-NODE-NOTES.md``.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from tests.cluster.controlplane import (
    CONTEXT,
    Binaries,
    ControlPlane,
    StartError,
    _cert,
    _key,
    _name,
    _write_key,
    stop_process_group,
    wait_until,
)
from tests.e2e import fakegpu
from tests.nodes.host import CGROUP_V1, CNI_DIR
from tests.nodes.images import Archive
from tests.support.ports import free_port

#: The kubelet insists on these machine-wide values; inside its mount namespace they read as set.
#: Run first in each kubelet's mount namespace: what it mounts there (the sysctl files, the device
#: plugins' directory) must not propagate to the machine, even where its mounts are shared (systemd
#: makes / shared). Only these mounts themselves, not recursively: the kubelet's root stays shared
#: with containerd's namespace.
PRIVATE_MOUNTS = (
    "mount --make-private /proc",
    'mount --make-private "$(findmnt -n -o TARGET --target /var/lib)"',
)
#: The kubelet's device manager listens on /var/lib/kubelet/device-plugins/kubelet.sock whatever
#: its --root-dir: two kubelets on one machine race for it (the loser exits: "address already in
#: use") and the first leaves the directory behind. Each gets an empty tmpfs of its own there, in
#: its namespace (over /var/lib where the machine has no /var/lib/kubelet to mount on).
DEVICE_PLUGINS = (
    "if [ -d /var/lib/kubelet ]; then d=/var/lib/kubelet; else d=/var/lib; fi; "
    'mount -t tmpfs -o size=4m,mode=0755 kubedgx-node "$d"; mkdir -p /var/lib/kubelet/device-plugins'
)
#: Where a kubelet or containerd writes by default: none may appear on the machine.
DEFAULT_PATHS = (
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/run/containerd",
    "/var/log/pods",
    "/var/log/containers",
    "/etc/kubernetes",
    "/etc/cni/net.d",
    "/var/lib/cni",
)
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}


def _run(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=timeout)


# -- the network -----------------------------------------------------------------------------------


def host_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 destination the machine routes (including its own addresses' subnets)."""
    out = _run("ip", "-4", "-o", "route", "show", "table", "all").stdout
    nets = []
    for line in out.splitlines():
        dest = line.split()[0] if line.split() else ""
        if dest in ("default", "broadcast", "local", "unreachable", "prohibit", "blackhole"):
            dest = line.split()[1] if dest != "default" else "0.0.0.0/0"
        with contextlib.suppress(ValueError):
            net = ipaddress.ip_network(dest, strict=False)
            if isinstance(net, ipaddress.IPv4Network) and net.prefixlen > 0:
                nets.append(net)
    return nets


def free_subnet(taken: Iterable[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """A /16 in 10.200.0.0-10.249.255.255 that overlaps nothing the machine routes (the Service
    range 10.96.0.0/12 is below it)."""
    used = list(taken)
    for second in range(200, 250):  # 10.250 is tests/cluster/podrunner.py's
        net = ipaddress.IPv4Network(f"10.{second}.0.0/16")
        if not any(net.overlaps(u) for u in used):
            return net
    raise StartError("no free /16 in 10.200.0.0/16-10.249.0.0/16 for the pod network")


@dataclass
class Network:
    """One bridge: the gateway and DNS address (.0.1), one address per node (.0.10+i), and each
    node's pods in their own third octet (.i.2-.i.254)."""

    bridge: str
    subnet: ipaddress.IPv4Network

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    def node_ip(self, index: int) -> str:
        return str(self.subnet.network_address + 10 + index)

    def pod_range(self, index: int) -> tuple[str, str]:
        base = self.subnet.network_address + 256 * index
        return str(base + 2), str(base + 254)

    def up(self, nodes: int) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        for address in [self.gateway, *(self.node_ip(i) for i in range(1, nodes + 1))]:
            _run("ip", "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")

    def exists(self) -> bool:
        return _run("ip", "link", "show", self.bridge, check=False).returncode == 0

    def down(self) -> None:
        if self.exists():
            # A pod's veth whose sandbox was never torn down (its netns pinned by a killed
            # containerd) stays after its bridge: delete the host ends first (the pair goes too).
            listed = _run("ip", "-o", "link", "show", "master", self.bridge, check=False).stdout
            for line in listed.splitlines():
                name = line.split(":")[1].strip().split("@")[0]
                _run("ip", "link", "del", name, check=False)
            _run("ip", "link", "del", self.bridge)


class Forwarder:
    """TCP from ``listen`` to ``target``, byte for byte (TLS passes through untouched), in threads
    of this process: a listening socket on one address of the machine, closed by :meth:`stop`."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.listen = listen
        self.target = target
        self._server: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(self.listen)
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, name=f"forward {self.listen}", daemon=True).start()

    def _accept(self) -> None:
        server = self._server
        assert server is not None
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return  # stopped
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            # One direction ended: end the other (a half-open watch would hang its client).
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
                with self._lock:
                    self._open.discard(s)

    def stop(self) -> None:
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None
        with self._lock:
            for s in list(self._open):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._open.clear()


# -- one node --------------------------------------------------------------------------------------


@dataclass
class RealNode:
    """A kubelet and its containerd, their files under ``dir``."""

    index: int
    dir: Path
    cluster_id: str
    network: Network
    kubelet_binary: Path
    logs: Path
    #: containerd's root (its images and snapshots) where it outlives the cluster (a node slot's
    #: store: the trainer image is unpacked once, not at every start); else under ``dir``.
    store: Path | None = None
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"kubedgx-n{self.index}"

    @property
    def cgroup_root(self) -> str:
        return f"kubedgx-{self.cluster_id}-n{self.index}"

    @property
    def socket(self) -> Path:
        return self.dir / "containerd" / "containerd.sock"

    def ctr(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return _run("ctr", "-a", str(self.socket), "-n", "k8s.io", *args, timeout=timeout)

    # containerd

    def containerd_config(self) -> str:
        d = self.dir
        return f"""version = 2
root = "{self.store or d / "containerd" / "root"}"
state = "{d}/containerd/state"
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/kubedgx/pause:3.10"
  netns_mounts_under_state_dir = true
  # no CAP_SYS_RESOURCE here even as root: oom_score_adj below containerd's own is refused
  restrict_oom_score_adj = true
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "runc"
        Root = "{d}/containerd/state/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_DIR}"
    conf_dir = "{d}/cni/net.d"
    max_conf_num = 1
"""

    def start_containerd(self) -> None:
        for sub in ("containerd/root", "containerd/state", "containerd/opt", "cni/net.d", "cni/ipam"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        config = self.dir / "containerd" / "config.toml"
        config.write_text(self.containerd_config())
        self.processes["containerd"] = _spawn(
            ["containerd", "--config", str(config)], self.logs / f"containerd-n{self.index}.log"
        )
        wait_until(
            f"containerd of {self.name}",
            lambda: _run("ctr", "-a", str(self.socket), "version", check=False, timeout=10).returncode == 0,
            timeout=30,
            diagnose=lambda: _tail(self.logs / f"containerd-n{self.index}.log"),
        )

    def load(self, archive: Archive) -> None:
        self.ctr("images", "import", str(archive.path))

    def image_refs(self) -> set[str]:
        return set(self.ctr("images", "ls", "-q", timeout=60).stdout.split())

    def forget_containers(self) -> None:
        """A kept store's containers of an earlier cluster (their tasks died with its state dir):
        removed before the kubelet starts, so their snapshots are collected."""
        for container in self.ctr("containers", "ls", "-q", timeout=60).stdout.split():
            self.ctr("containers", "rm", container, timeout=60)

    def stream(self, buildah: Sequence[str], ref: str, env: Mapping[str, str] | None = None) -> float:
        """Put ``ref`` from buildah's store into this containerd, through a FIFO (no multi-GB
        archive on disk); then drop its layer blobs (the CRI runs from the unpacked snapshots, as
        containerd's discard_unpacked_layers does for pulls) and every other tag of its repository.
        Returns the seconds it took (0 where the image was there already)."""
        if ref in self.image_refs():
            return 0.0
        t0 = time.monotonic()
        fifo = self.dir / f"image-{abs(hash(ref)) % 10**8}.fifo"
        fifo.unlink(missing_ok=True)
        os.mkfifo(fifo)
        log = self.logs / f"import-n{self.index}.log"
        with log.open("ab") as out:
            importer = subprocess.Popen(
                ["ctr", "-a", str(self.socket), "-n", "k8s.io", "images", "import", str(fifo)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
            try:
                push = subprocess.run(
                    [*buildah, "push", "-q", ref, f"docker-archive:{fifo}:{ref}"],
                    capture_output=True,
                    text=True,
                    timeout=1800,
                    check=False,
                    env=env,
                )
                if push.returncode != 0:
                    # It may never have opened the FIFO (the ref gone: another tree's build dropped
                    # it), and then the importer waits for a writer for ever.
                    importer.kill()
                rc = importer.wait(timeout=1800)
            finally:
                if importer.poll() is None:
                    importer.kill()
                fifo.unlink(missing_ok=True)
        if push.returncode != 0 or rc != 0:
            raise StartError(
                f"{ref} into {self.name}: push {push.returncode} {push.stderr[-1000:]}; import {rc}: {_tail(log)}"
            )
        listed = self.ctr("images", "ls").stdout.splitlines()
        digest = next(line.split()[2] for line in listed if line.split()[:1] == [ref])
        manifest = json.loads(self.ctr("content", "get", digest).stdout)
        for layer in manifest.get("layers", []):
            self.ctr("content", "rm", layer["digest"], timeout=120)
        repository = ref.rsplit(":", 1)[0]
        for other in self.image_refs():
            if other != ref and other.rsplit(":", 1)[0] == repository:
                self.ctr("images", "rm", other, timeout=120)
        return time.monotonic() - t0

    # kubelet

    def configure(self, plane: ControlPlane) -> None:
        pki = self.dir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        ca_crt = x509.load_pem_x509_certificate(plane.pki.ca_crt.read_bytes())
        ca_key = serialization.load_pem_private_key(plane.pki.ca_key.read_bytes(), password=None)
        key = _key()
        _write_key(pki / "kubelet-client.key", key)
        crt = _cert(
            _name(f"system:node:{self.name}", "system:nodes"),
            key,
            (ca_crt, ca_key),  # type: ignore[arg-type]
            usage=ExtendedKeyUsageOID.CLIENT_AUTH,
            sans=[],
        )
        (pki / "kubelet-client.crt").write_bytes(crt.public_bytes(serialization.Encoding.PEM))
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": CONTEXT, "cluster": {"server": plane.server, "certificate-authority": str(plane.pki.ca_crt)}}
            ],
            "users": [
                {
                    "name": self.name,
                    "user": {
                        "client-certificate": str(pki / "kubelet-client.crt"),
                        "client-key": str(pki / "kubelet-client.key"),
                    },
                }
            ],
            "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": self.name}}],
            "current-context": CONTEXT,
        }
        (self.dir / "kubelet.kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        (self.dir / "kubelet.yaml").write_text(yaml.safe_dump(self.kubelet_config(plane)))
        first, last = self.network.pod_range(self.index)
        conflist = {
            "cniVersion": "1.0.0",
            "name": "kubedgx",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.network.bridge,
                    # true would turn on net.ipv4.ip_forward for the whole machine
                    "isGateway": False,
                    "isDefaultGateway": False,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.dir / "cni" / "ipam"),
                        "ranges": [[{"subnet": str(self.network.subnet), "rangeStart": first, "rangeEnd": last}]],
                    },
                },
                {"type": "loopback"},
            ],
        }
        (self.dir / "cni" / "net.d" / "10-kubedgx.conflist").write_text(json.dumps(conflist, indent=1))
        # In every v1 hierarchy (the kubelet checks each one it knows), not in the v2 one.
        for hierarchy in v1_hierarchies():
            (hierarchy / self.cgroup_root).mkdir(exist_ok=True)
        cpuset = CGROUP_V1 / "cpuset"
        for name in ("cpuset.cpus", "cpuset.mems"):
            (cpuset / self.cgroup_root / name).write_text((cpuset / name).read_text())

    def kubelet_config(self, plane: ControlPlane) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.network.node_ip(self.index),
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            # tests/cluster's apiserver has no kubelet client certificate: let it in for logs/exec
            "authentication": {
                "anonymous": {"enabled": True},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(plane.pki.ca_crt)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "imageServiceEndpoint": f"unix://{self.socket}",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup_root}",
            "cgroupsPerQOS": True,
            "enforceNodeAllocatable": ["pods"],
            "failCgroupV1": False,
            "podLogsDir": str(self.dir / "pod-logs"),
            "clusterDomain": "cluster.local",
            "clusterDNS": [self.network.gateway],
            "resolvConf": str(self.dir.parent / "resolv.conf"),
            "hairpinMode": "hairpin-veth",
            "maxPods": 30,
            "serializeImagePulls": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "200Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            # no CPU kept back: a worker of the e2e jobs asks for 2 CPUs, all a 2-core machine has
            "systemReserved": {"memory": "256Mi"},
            "nodeStatusReportFrequency": "10s",
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "shutdownGracePeriod": "0s",
            # no KUBE-FIREWALL or canary chains in the machine's iptables (no kube-proxy here)
            "makeIPTablesUtilChains": False,
        }

    def start_kubelet(self) -> None:
        root = self.dir / "kubelet"
        root.mkdir(parents=True, exist_ok=True)
        (self.dir / "pod-logs").mkdir(exist_ok=True)
        # A shared bind mount: the tmpfs volumes the kubelet mounts under it (tokens, memory-backed
        # emptyDirs) must reach containerd and runc, and mount propagation is private here.
        if not _is_mountpoint(root):
            _run("mount", "--bind", str(root), str(root))
            _run("mount", "--make-shared", str(root))
        fake = self.dir / "sysctl"
        fake.mkdir(exist_ok=True)
        binds = []
        for key, value in KUBELET_SYSCTLS.items():
            (fake / key.replace("/", ".")).write_text(value + "\n")
            binds.append(f"mount --bind -o ro {fake / key.replace('/', '.')} /proc/sys/{key}")
        script = "set -e; " + "; ".join([*PRIVATE_MOUNTS, *binds, DEVICE_PLUGINS]) + '; exec "$@"'
        argv = [
            "unshare",
            "-m",
            "--propagation",
            "unchanged",
            "sh",
            "-c",
            script,
            "kubelet",
            str(self.kubelet_binary),
            f"--config={self.dir / 'kubelet.yaml'}",
            f"--kubeconfig={self.dir / 'kubelet.kubeconfig'}",
            f"--root-dir={root}",
            f"--cert-dir={self.dir / 'pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.network.node_ip(self.index)}",
            "-v=2",
        ]
        self.processes["kubelet"] = _spawn(argv, self.logs / f"kubelet-n{self.index}.log")

    def stop(self) -> None:
        """The kubelet first (it would restart what is killed under it), then every container
        containerd still runs, then containerd; then the mounts and the cgroups."""
        kubelet = self.processes.pop("kubelet", None)
        if kubelet is not None:
            stop_process_group(kubelet, timeout=15)
        if "containerd" in self.processes:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                for task in self.ctr("tasks", "ls", "-q", timeout=30).stdout.split():
                    self.ctr("tasks", "kill", "-s", "KILL", task, timeout=30)
                    wait_until(f"task {task} to die", partial(_task_gone, self, task), timeout=30)
                    self.ctr("tasks", "rm", task, timeout=30)
            stop_process_group(self.processes.pop("containerd"), timeout=15)
        # A shim outlives its containerd by design, and so do its containers: whatever a stop
        # in the middle of a pod's start left (a container created after the listing above) is
        # killed here, shims by their containerd's socket, containers by the node's cgroups.
        _kill_matching(f"-address {self.socket}")
        kill_cgroup_tree(self.cgroup_root)
        for mount in sorted(_mounts_under(self.dir), reverse=True):
            _run("umount", "-l", mount, check=False)
        remove_cgroup_tree(self.cgroup_root)


def _task_gone(node: RealNode, task: str) -> bool:
    listed = node.ctr("tasks", "ls", timeout=30).stdout
    return all(not line.startswith(task) or "STOPPED" in line for line in listed.splitlines())


# -- processes and the machine -----------------------------------------------------------------------


def _spawn(argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """In a session of its own (stopped with its children), niced: the tests running beside it
    come first."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            ["nice", "-n", "10", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


#: A kept containerd store larger than this holds more than the two images a slot needs (their
#: unpacked snapshots are about 6 GiB): snapshots of earlier image versions that containerd's
#: collector did not take (seen: 17 GiB per slot after a few weeks of builds, until the disk was full
#: and an import failed). The store is a cache: it is emptied, and the images are streamed in again.
STORE_LIMIT_BYTES = 12 * 2**30


def _bounded(store: Path) -> None:
    if not store.is_dir():
        return
    proc = subprocess.run(["du", "-sb", str(store)], capture_output=True, text=True, check=False)
    size = int(proc.stdout.split()[0]) if proc.returncode == 0 and proc.stdout else 0
    if size > STORE_LIMIT_BYTES:
        print(f"containerd store {store} holds {size / 2**30:.1f} GiB: emptied (the images are streamed in again)",
              file=sys.stderr)  # fmt: skip
        shutil.rmtree(store, ignore_errors=True)


def _tail(path: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return f"(no {path})"


def _mounts_under(directory: Path) -> list[str]:
    prefix = str(directory.resolve())
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4].replace("\\040", " ")
        if target == prefix or target.startswith(prefix + "/"):
            out.append(target)
    return out


def _is_mountpoint(path: Path) -> bool:
    return str(path.resolve()) in _mounts_under(path)


def v1_hierarchies() -> list[Path]:
    return [h for h in sorted(CGROUP_V1.iterdir()) if (h / "tasks").exists()]


def _kill_matching(pattern: str) -> None:
    """SIGKILL every process whose command line contains ``pattern``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if pattern in cmdline:
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)


def kill_cgroup_tree(name: str) -> None:
    """SIGKILL every process in ``name``'s cgroups (any v1 hierarchy) and wait until they are gone,
    so that :func:`remove_cgroup_tree` can remove them."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        pids: set[int] = set()
        for hierarchy in CGROUP_V1.iterdir():
            top = hierarchy / name
            if not top.is_dir():
                continue
            for dirpath, _dirs, files in os.walk(top):
                if "cgroup.procs" in files:
                    with contextlib.suppress(OSError):
                        pids.update(int(x) for x in (Path(dirpath) / "cgroup.procs").read_text().split())
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def remove_cgroup_tree(name: str) -> None:
    """``name`` in every v1 hierarchy, its children first (rmdir is how a cgroup is removed)."""
    for hierarchy in CGROUP_V1.iterdir():
        top = hierarchy / name
        if not top.is_dir():
            continue
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)


def cgroups_named(name: str) -> list[str]:
    return [str(h / name) for h in CGROUP_V1.iterdir() if (h / name).is_dir()]


# -- the machine, before and after ---------------------------------------------------------------------


@dataclass(frozen=True)
class MachineState:
    """What the layer could leave behind on the machine: network links, mounts, top-level cgroups,
    the sysctls the kubelet wants and ip_forward. Taken before the start and after the stop; the two
    must be equal."""

    links: frozenset[str]
    mounts: frozenset[str]
    cgroups: frozenset[str]
    sysctls: tuple[tuple[str, str], ...]
    paths: frozenset[str]

    @classmethod
    def capture(cls) -> MachineState:
        links = frozenset(
            line.split(":")[1].strip().split("@")[0] for line in _run("ip", "-o", "link").stdout.splitlines()
        )
        mounts = frozenset(line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())
        cgroups = frozenset(str(c) for h in v1_hierarchies() for c in h.iterdir() if c.is_dir())
        keys = [*KUBELET_SYSCTLS, "net/ipv4/ip_forward"]
        sysctls = tuple((k, (Path("/proc/sys") / k).read_text().strip()) for k in keys)
        paths = frozenset(p for p in DEFAULT_PATHS if os.path.lexists(p))
        return cls(links, mounts, cgroups, sysctls, paths)

    def changes_since(self, before: MachineState) -> list[str]:
        out = [f"link {x}" for x in sorted(self.links - before.links)]
        out += [f"mount {x}" for x in sorted(self.mounts - before.mounts)]
        out += [f"cgroup {x}" for x in sorted(self.cgroups - before.cgroups)]
        out += [f"path {x}" for x in sorted(self.paths - before.paths)]
        out += [
            f"sysctl {k}: {v0} -> {v1}"
            for (k, v0), (_, v1) in zip(before.sysctls, self.sysctls, strict=True)
            if v0 != v1
        ]
        return out


# -- the cluster --------------------------------------------------------------------------------------


@dataclass
class RealNodes:
    """A control plane with ``count`` real nodes, CoreDNS and GPU labels, under ``root``."""

    root: Path
    binaries: Binaries
    node_bins: Path
    images: Sequence[Archive]
    count: int = 2
    instance: str = fakegpu.DEFAULT_INSTANCE
    plane: ControlPlane | None = None
    network: Network | None = None
    nodes: list[RealNode] = field(default_factory=list)
    dns: subprocess.Popen[bytes] | None = None
    #: Seconds each start step took (control plane, network, nodes, dns, ready).
    timings: dict[str, float] = field(default_factory=dict)
    #: The machine before the start (see :meth:`leftovers`).
    before: MachineState | None = None
    #: Images in buildah's store (tests/nodes/buildah.py) each node gets, streamed once into a
    #: containerd store kept between clusters (one set of node slots per machine, taken in turn).
    big_images: Sequence[str] = ()
    #: Seconds each node took to take in ``big_images`` (0: it had them).
    loads: dict[str, float] = field(default_factory=dict)
    _slots: Any = None
    apiserver_forwarder: Forwarder | None = None

    @property
    def id(self) -> str:
        return f"{os.getpid() % 100000}"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def _timed(self, name: str, step: Callable[[], None]) -> None:
        t0 = time.monotonic()
        step()
        self.timings[name] = round(time.monotonic() - t0, 1)

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._take_machine()
        self.before = MachineState.capture()
        try:
            self._timed("control plane", self._start_plane)
            self._timed("network", self._start_network)
            self._timed("nodes", self._start_nodes)
            self._timed("dns", self._start_dns)
            self._timed("ready", self._ready)
        except BaseException:
            self.stop()
            raise

    def _start_plane(self) -> None:
        # The pods' network is chosen first: the apiserver's certificate names its gateway, where
        # the pods reach the apiserver (:meth:`_start_network`).
        self.network = Network(f"kdgx{self.id}", free_subnet(host_networks()))
        self.plane = ControlPlane(
            self.root / "cp",
            self.binaries,
            pools=(),
            apiserver_args=["--kubelet-preferred-address-types=InternalIP,Hostname"],
            sans=[self.network.gateway],
        )
        self.plane.start()

    def _start_network(self) -> None:
        assert self.network is not None
        assert self.plane is not None
        self.network.up(self.count)
        (self.root / "resolv.conf").write_text(f"nameserver {self.network.gateway}\n")
        # The apiserver listens on loopback only; pods reach it at the bridge's gateway, through a
        # forwarder bound to that address alone (the machine's other interfaces see nothing).
        self.apiserver_forwarder = Forwarder(
            (self.network.gateway, self.plane.ports.apiserver), ("127.0.0.1", self.plane.ports.apiserver)
        )
        self.apiserver_forwarder.start()

    @property
    def apiserver_for_pods(self) -> tuple[str, int]:
        """(host, port) at which a pod reaches the apiserver: what a pod's KUBERNETES_SERVICE_HOST
        and KUBERNETES_SERVICE_PORT must say here, where no kube-proxy makes the ``kubernetes``
        Service's ClusterIP work (it would write the machine's iptables)."""
        assert self.apiserver_forwarder is not None
        return self.apiserver_forwarder.listen

    def _start_nodes(self) -> None:
        assert self.plane is not None
        assert self.network is not None
        stores: list[Path | None] = [None] * self.count
        if self.big_images:
            from tests.nodes.buildah import cache_root

            stores = [cache_root() / "containerd" / f"n{i}" for i in range(1, self.count + 1)]
            for store in stores:
                if store is not None:
                    _bounded(store)
        for i in range(1, self.count + 1):
            node = RealNode(
                i, self.root / f"n{i}", self.id, self.network, self.node_bins / "kubelet", self.logs,
                store=stores[i - 1],
            )  # fmt: skip
            self.nodes.append(node)
            node.start_containerd()
            if node.store is not None:
                node.forget_containers()
            for archive in self.images:
                node.load(archive)
        if self.big_images:
            self._stream_big_images()
        for node in self.nodes:
            node.configure(self.plane)
            node.start_kubelet()

    def _take_machine(self) -> None:
        """One real-node cluster on the machine at a time (a second one waits here, before it
        looks at the machine): they would share what a containerd or kubelet writes outside its
        configured directories (see :meth:`stop`), the kept node stores (~6 GB each: room for one
        set) and, on a 2-core machine, the CPUs a training worker asks for."""
        from tests.nodes.buildah import cache_root

        base = cache_root() / "containerd"
        base.mkdir(parents=True, exist_ok=True)
        self._slots = (base / "slots.lock").open("a")
        fcntl.flock(self._slots, fcntl.LOCK_EX)

    def _stream_big_images(self) -> None:
        from tests.nodes.buildah import Buildah, build_images, locked

        builder = Buildah()
        argv, env = builder.argv(), builder.env()

        def load(node: RealNode) -> dict[str, float]:
            # One image after another: images share layers, and a finished import drops its blobs.
            return {f"{ref} -> {node.name}": round(node.stream(argv, ref, env), 1) for ref in self.big_images}

        # Under the builders' lock: another tree's build (its own images) drops this one's tags.
        # One dropped since this cluster's build (waiting here for the machine) is built again.
        with locked("buildah"):
            if any(builder.label(ref) is None for ref in self.big_images):
                built, _ = build_images(self.root / "buildah.log")
                assert set(self.big_images) <= {built.trainer, built.operator}, (self.big_images, built)
            with ThreadPoolExecutor(max_workers=len(self.nodes)) as pool:
                for loaded in pool.map(load, self.nodes):
                    self.loads.update(loaded)

    def _start_dns(self) -> None:
        assert self.plane is not None
        assert self.network is not None
        ready = free_port()
        corefile = self.root / "Corefile"
        corefile.write_text(
            f"""cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {self.network.gateway}
    errors
    ready 127.0.0.1:{ready}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {self.plane.kubeconfig}
        pods insecure
        ttl 5
    }}
    cache 5
}}
.:53 {{
    bind {self.network.gateway}
    errors
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""
        )
        self.dns = _spawn([str(self.node_bins / "coredns"), "-conf", str(corefile)], self.logs / "coredns.log")
        wait_until(
            "CoreDNS ready",
            lambda: _http_ok(f"http://127.0.0.1:{ready}/ready"),
            timeout=60,
            diagnose=lambda: _tail(self.logs / "coredns.log"),
        )

    def _ready(self) -> None:
        plane = self.plane
        assert plane is not None
        names = [n.name for n in self.nodes]
        wait_until(
            f"nodes {names} Ready",
            lambda: all(plane.node_ready(n) for n in names),
            timeout=120,
            diagnose=lambda: "\n".join(_tail(self.logs / f"kubelet-n{n.index}.log") for n in self.nodes),
        )
        inst = fakegpu.instance(self.instance)
        for name in names:
            labels = fakegpu.node_labels(inst)
            taints = fakegpu.node_taints(inst)
            plane.request(
                "PATCH",
                f"/api/v1/nodes/{name}",
                {"metadata": {"labels": labels}, "spec": {"taints": taints}},
                content_type="application/merge-patch+json",
            )
            plane.request(
                "PATCH",
                f"/api/v1/nodes/{name}/status",
                {"status": {"capacity": {fakegpu.GPU_RESOURCE: str(inst.gpus)}}},
                content_type="application/merge-patch+json",
            )

        def gpus_allocatable() -> bool:
            for name in names:
                node = plane.get(f"/api/v1/nodes/{name}") or {}
                if (node.get("status", {}).get("allocatable") or {}).get(fakegpu.GPU_RESOURCE) != str(inst.gpus):
                    return False
            return True

        wait_until("nvidia.com/gpu allocatable on every node", gpus_allocatable, timeout=60)

    def stop(self) -> None:
        """Pods first (their kubelets tear down sandboxes, volumes and CNI attachments), then each
        node, CoreDNS, the control plane and the bridge."""
        if self.plane is not None and self.nodes:
            # No controller may recreate what is deleted now (a Deployment's ReplicaSet would start
            # new pods while the kubelets stop, and their containers would outlive them).
            manager = self.plane.components.get("kube-controller-manager")
            if manager is not None:
                manager.stop()
            with contextlib.suppress(OSError, StartError):
                _delete_all_pods(self.plane)
        for node in reversed(self.nodes):
            node.stop()
        if self.dns is not None:
            stop_process_group(self.dns, timeout=10)
            self.dns = None
        if self.plane is not None:
            self.plane.stop()
        if self.apiserver_forwarder is not None:
            self.apiserver_forwarder.stop()
            self.apiserver_forwarder = None
        if self.network is not None and self.network.exists():
            self.network.down()
        if self.before is not None:
            # Written by a containerd or kubelet whatever their configuration says (the shims'
            # sockets, libcni's cache, the kubelet's log symlinks); created by this cluster (absent
            # before), and no other cluster of the layer runs meanwhile: it holds every slot.
            for path in DEFAULT_PATHS:
                if path not in self.before.paths and os.path.lexists(path):
                    shutil.rmtree(path, ignore_errors=True)
        if self._slots is not None:
            self._slots.close()
            self._slots = None

    def leftovers(self) -> list[str]:
        """What of this cluster is still on the machine (after :meth:`stop`: nothing): its mounts,
        cgroups and processes, and anything else the machine has now and had not before the start."""
        out = [f"mount {m}" for m in _mounts_under(self.root)]
        if self.before is not None:
            out += MachineState.capture().changes_since(self.before)
        for node in self.nodes:
            out += [f"cgroup {c}" for c in cgroups_named(node.cgroup_root)]
            out += [f"process {name}" for name, p in node.processes.items() if p.poll() is None]
        if self.network is not None and self.network.exists():
            out.append(f"bridge {self.network.bridge}")
        if self.dns is not None and self.dns.poll() is None:
            out.append("process coredns")
        return out


def _delete_all_pods(plane: ControlPlane) -> None:
    status, listed = plane.request("GET", "/api/v1/pods")
    if status != 200:
        return
    for pod in listed.get("items", []):
        meta = pod["metadata"]
        plane.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}?gracePeriodSeconds=2")
    with contextlib.suppress(StartError):
        wait_until("every pod gone", lambda: not (plane.get("/api/v1/pods") or {}).get("items"), timeout=60)


def _http_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def interrupt_safe_stop(nodes: RealNodes) -> None:
    """Stop even when a Ctrl-C or SIGTERM arrives meanwhile (a half-stopped cluster leaves mounts)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        nodes.stop()
    finally:
        signal.signal(signal.SIGINT, previous)
