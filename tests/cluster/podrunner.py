"""A kubelet for the chart's own pods: the operator's Deployment (and the chart's test hook) run as
local processes, on Nodes this harness keeps alive, so that what Kubernetes does around them is
real: the Deployment controller's rolling updates, the scheduler, PodDisruptionBudgets and the
eviction API, the EndpointSlice controller, and the apiserver reaching the webhook through the
chart's Service (``--enable-aggregator-routing``: the apiserver dials a ready endpoint of the
Service, as it does on clusters where that flag is set; the ClusterIP needs a kube-proxy we do not
have) over TLS, checking the certificate against the Service's DNS name.

kwok cannot play these pods: it runs no process, and it marks every pod Ready at once, while the
tests here are about what a real kubelet does with a process:

* each pod gets its own IP (an address on ``lo``, so the apiserver reaches it; EndpointSlices refuse
  loopback addresses), and its process listens there (``KUBEDGX_BIND_ADDRESS``: what the pod's own
  network namespace gives a real pod);
* the container's command runs with the pod's environment (``value``, ``fieldRef``,
  ``configMapKeyRef``/``secretKeyRef``, ``envFrom``), its configMap, secret and emptyDir volumes
  written to a directory per pod (paths under a ``mountPath`` in the environment and arguments are
  rewritten to it: there is no mount namespace), and a ServiceAccount token bound to the pod
  (TokenRequest with a boundObjectRef, as the kubelet projects it) in a kubeconfig;
* Ready follows the container's readinessProbe (an httpGet on the pod's IP), so an endpoint is
  ready only once the process answers;
* a deleted pod's process gets SIGTERM, then SIGKILL after the grace period, and the pod is removed
  only once the process has exited (the kubelet's final delete); an exited process is restarted,
  with the container's restartCount;
* the Nodes' Leases and Ready conditions are renewed, or the node lifecycle controller would evict
  the pods.

Images: a container runs only if its image's repository is one this runner was given (the chart's
operator image, run from this checkout's ``kubedgx`` console script); any other image fails to
start with ErrImagePull, as an unpullable one would.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import logging
import os
import shutil
import signal
import ssl
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.controlplane import ControlPlane, stop_process_group

log = logging.getLogger(__name__)

#: The label the runner's Nodes carry (and nothing else in the cluster).
RUNNER_LABEL = "test.kubedgx.io/process-node"
#: The chart's ``nodeSelector`` for a module that runs it here: only the runner's nodes run pods; an
#: untainted kwok node another module added would get a replica that kwok calls Ready without running it.
NODE_SELECTOR = {RUNNER_LABEL: "true"}
#: Pod IPs: 10.250.<runner>.<n>, one address on lo per pod.
IP_PREFIX = "10.250"
#: How often the runner looks at its pods.
TICK_S = 0.2
#: Node heartbeat: Lease renewal and Ready condition.
HEARTBEAT_S = 4.0


def can_add_addresses() -> str | None:
    """Why pods cannot get addresses of their own here (None: they can): adding one to lo needs
    CAP_NET_ADMIN (root on CI)."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    # One probe address per process: under pytest-xdist every worker asks at collection, at once.
    probe = f"{IP_PREFIX}.255.{2 + os.getpid() % 250}/32"
    added = subprocess.run(["ip", "addr", "add", probe, "dev", "lo"], capture_output=True, text=True, check=False)
    if added.returncode != 0:
        if "already assigned" in added.stderr or "File exists" in added.stderr:
            return None  # another process's probe: the kernel checks the capability before that
        return f"cannot add an address to lo ({added.stderr.strip()}): needs CAP_NET_ADMIN"
    subprocess.run(["ip", "addr", "del", probe, "dev", "lo"], capture_output=True, check=False)
    return None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


class Api:
    """Just enough of a Kubernetes client, as the cluster's admin (the kubelet's Node identity would
    need the NodeRestriction dance; what is exercised here is the pods, not the kubelet's RBAC)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.host, self.port = "127.0.0.1", plane.ports.apiserver
        self.context: ssl.SSLContext = plane.pki.client_context()
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPSConnection:
        conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=10)
            self._local.conn = conn
        return conn

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        for attempt in (1, 2):
            conn = self._conn()
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                text = response.read().decode()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
                continue
            if response.status >= 300:
                raise ApiError(response.status, text)
            return json.loads(text) if text else None
        raise AssertionError("unreachable")

    def get(self, path: str) -> Any:
        try:
            return self.call("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise


@dataclass
class Container:
    """One running container: its process and the files it was given."""

    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    restarts: int = 0
    started_at: str | None = None
    ready: bool = False
    last_probe: float = 0.0
    last_exit: dict[str, Any] | None = None
    waiting: tuple[str, str] | None = None
    backoff_until: float = 0.0


@dataclass
class RunningPod:
    uid: str
    namespace: str
    name: str
    ip: str
    directory: Path
    container: Container = field(default_factory=Container)
    terminating_since: float | None = None
    kill_at: float | None = None
    status_sent: str = ""


class PodRunner:
    """Runs the pods scheduled onto its Nodes until :meth:`stop`; ``executables`` maps an image
    repository to what its ``command[0]`` names locally (``{"ghcr.io/kubedgx/operator": {"kubedgx":
    "/path/to/kubedgx"}}``)."""

    def __init__(
        self,
        plane: ControlPlane,
        workdir: Path,
        executables: Mapping[str, Mapping[str, str]],
        *,
        nodes: int = 3,
        index: int = 1,
    ) -> None:
        self.plane = plane
        self.api = Api(plane)
        self.workdir = workdir
        self.executables = {k: dict(v) for k, v in executables.items()}
        self.nodes = [f"process-node-{index}-{i}" for i in range(nodes)]
        self.index = index
        self.pods: dict[str, RunningPod] = {}
        self.free_ips = [f"{IP_PREFIX}.{index}.{n}" for n in range(2, 250)]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beats: threading.Thread | None = None
        self.errors: list[str] = []
        self._lock = threading.Lock()
        #: Every process this runner started: (pod name, pid) in order, for the tests' accounts.
        self.started: list[tuple[str, int]] = []

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> PodRunner:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for name in self.nodes:
            self._ensure_node(name)
        self._heartbeat()
        self._thread = threading.Thread(target=self._loop, name="pod runner", daemon=True)
        self._thread.start()
        # The node's heartbeats never wait for its pods (a slow probe must not make the node NotReady,
        # whose taint would evict them), as the kubelet's node status loop is its own.
        self._beats = threading.Thread(target=self._beat, name="node heartbeats", daemon=True)
        self._beats.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self._beats is not None:
            self._beats.join(30)
        for pod in list(self.pods.values()):
            self._kill(pod, 10)
            self._release(pod)
            with contextlib.suppress(ApiError, OSError):
                self._final_delete(pod)
        for name in self.nodes:
            with contextlib.suppress(ApiError, OSError):
                self.api.call("DELETE", f"/api/v1/nodes/{name}")
            with contextlib.suppress(ApiError, OSError):
                self.api.call("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}")

    # -- nodes ----------------------------------------------------------------------------------

    def _ensure_node(self, name: str) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    RUNNER_LABEL: "true",
                },
            },
            "spec": {},
        }
        with contextlib.suppress(ApiError):
            self.api.call("POST", "/api/v1/nodes", node)
        capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi"}
        self.api.call(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            {"status": {"capacity": capacity, "allocatable": capacity, "nodeInfo": {"kubeletVersion": "v1.34.12"}}},
            "application/merge-patch+json",
        )

    def _heartbeat(self) -> None:
        now, micro = _now(), _micro_now()
        for name in self.nodes:
            condition = {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "the kubedgx test pod runner runs this node's pods as local processes",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
            self.api.call(
                "PATCH",
                f"/api/v1/nodes/{name}/status",
                {"status": {"conditions": [condition], "addresses": [{"type": "Hostname", "address": name}]}},
                "application/strategic-merge-patch+json",
            )
            path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
            spec = {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": micro}
            if self.api.get(path) is None:
                lease = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": name, "namespace": "kube-node-lease"},
                    "spec": spec,
                }
                with contextlib.suppress(ApiError):
                    self.api.call("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", lease)
            else:
                self.api.call("PATCH", path, {"spec": spec}, "application/merge-patch+json")

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._heartbeat()
            except Exception as exc:  # report, and try again at the next beat
                self.errors.append(f"heartbeat: {type(exc).__name__}: {exc}")

    # -- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:  # the runner must outlive any one bad answer, and report it
                self.errors.append(f"{type(exc).__name__}: {exc}")
                log.exception("pod runner")
            self._stop.wait(TICK_S)

    def _tick(self) -> None:
        seen: set[str] = set()
        for node in self.nodes:
            selector = urllib.parse.quote(f"spec.nodeName={node}")
            pods = self.api.call("GET", f"/api/v1/pods?fieldSelector={selector}")["items"]
            for pod in pods:
                uid = pod["metadata"]["uid"]
                seen.add(uid)
                with self._lock:
                    self._sync(pod)
        with self._lock:
            for uid in [u for u in self.pods if u not in seen]:  # force-deleted under us
                gone = self.pods.pop(uid)
                self._kill(gone, 0)
                self._release(gone)

    def _sync(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") and uid not in self.pods:
            return
        running = self.pods.get(uid)
        if running is None:
            if meta.get("deletionTimestamp"):
                self._final_delete_of(meta)
                return
            running = self._admit(pod)
        if meta.get("deletionTimestamp"):
            self._terminate(running, pod)
            return
        container = running.container
        process = container.process
        if process is not None and process.poll() is not None:
            code = process.returncode if process.returncode >= 0 else 128 - process.returncode  # 137: SIGKILL
            container.last_exit = {
                "terminated": {
                    "exitCode": code,
                    "reason": "Error" if code else "Completed",
                    "startedAt": container.started_at,
                    "finishedAt": _now(),
                }
            }
            container.process, container.ready = None, False
            if spec.get("restartPolicy", "Always") == "Never" or (
                spec.get("restartPolicy") == "OnFailure" and process.returncode == 0
            ):
                self._finish(running, pod, process.returncode)
                return
            container.restarts += 1
            container.backoff_until = time.monotonic() + min(10.0 * 2 ** (container.restarts - 1), 60.0) / 10
        if container.process is None and time.monotonic() >= container.backoff_until:
            self._run(running, pod)  # (again, after a waiting reason: a Secret created later is mounted then)
        self._probe(running, pod)
        self._send_status(running, pod)

    # -- starting -------------------------------------------------------------------------------

    def _admit(self, pod: dict[str, Any]) -> RunningPod:
        meta = pod["metadata"]
        if not self.free_ips:
            raise RuntimeError("the pod runner ran out of addresses")
        ip = self.free_ips.pop(0)
        subprocess.run(["ip", "addr", "add", f"{ip}/32", "dev", "lo"], capture_output=True, check=False)
        directory = self.workdir / f"{meta['namespace']}.{meta['name']}.{meta['uid'][:8]}"
        directory.mkdir(parents=True, exist_ok=True)
        running = RunningPod(meta["uid"], meta["namespace"], meta["name"], ip, directory)
        self.pods[meta["uid"]] = running
        return running

    def _run(self, running: RunningPod, pod: dict[str, Any]) -> None:
        spec = pod["spec"]
        container = spec["containers"][0]
        image = str(container.get("image", ""))
        repository = image.split("@")[0].rsplit(":", 1)[0] if ":" in image.split("/")[-1] else image.split("@")[0]
        commands = self.executables.get(repository)
        if commands is None:
            self._wait(running, "ErrImagePull", f"the test pod runner runs no image {image}")
            return
        try:
            mounts = self._volumes(running, pod)
            env = self._environment(running, pod, container, mounts)
        except (ApiError, KeyError, ValueError) as exc:
            self._wait(running, "CreateContainerConfigError", str(exc))
            return
        argv = [*container.get("command", []), *container.get("args", [])]
        if not argv or argv[0] not in commands:
            self._wait(running, "RunContainerError", f"no local executable for {argv[:1]} of {image}")
            return
        argv = [commands[argv[0]], *(_rewrite(a, mounts) for a in argv[1:])]
        log_path = running.directory / f"{container['name']}.log"
        with log_path.open("ab") as out:
            out.write(f"\n===== {_now()} start #{running.container.restarts}: {' '.join(argv)}\n".encode())
            out.flush()
            process = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=str(running.directory),
                start_new_session=True,
            )
        running.container.process = process
        running.container.waiting = None
        running.container.log_path = log_path
        running.container.started_at = _now()
        running.container.ready = False
        self.started.append((running.name, process.pid))

    @staticmethod
    def _wait(running: RunningPod, reason: str, message: str) -> None:
        """The container cannot start yet: say why, and try again in a second (the kubelet backs off too)."""
        running.container.waiting = (reason, message)
        running.container.backoff_until = time.monotonic() + 1.0

    def _volumes(self, running: RunningPod, pod: dict[str, Any]) -> list[tuple[str, Path]]:
        """(mountPath, local directory) of the container's volume mounts, longest path first."""
        namespace = pod["metadata"]["namespace"]
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        out: list[tuple[str, Path]] = []
        for mount in pod["spec"]["containers"][0].get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            local = running.directory / "volumes" / mount["name"]
            if "configMap" in volume:
                found = self.api.get(f"/api/v1/namespaces/{namespace}/configmaps/{volume['configMap']['name']}")
                if found is None:
                    raise ValueError(f"configmap {volume['configMap']['name']} not found")
                files = {k: v.encode() for k, v in (found.get("data") or {}).items()}
            elif "secret" in volume:
                found = self.api.get(f"/api/v1/namespaces/{namespace}/secrets/{volume['secret']['secretName']}")
                if found is None:
                    raise ValueError(f"secret {volume['secret']['secretName']} not found")
                files = {k: base64.b64decode(v) for k, v in (found.get("data") or {}).items()}
            elif "emptyDir" in volume:
                files = {}
            elif "projected" in volume:  # the ServiceAccount admission plugin's kube-api-access-*
                files = self._projected(running, pod, volume["projected"])
            else:
                raise ValueError(f"volume {mount['name']}: only configMap, secret, projected and emptyDir are run here")
            local.mkdir(parents=True, exist_ok=True)
            for key, data in files.items():
                (local / key).write_bytes(data)
            path = local / mount["subPath"] if mount.get("subPath") else local
            out.append((mount["mountPath"].rstrip("/"), path))
        return sorted(out, key=lambda m: -len(m[0]))

    def _projected(self, running: RunningPod, pod: dict[str, Any], projected: dict[str, Any]) -> dict[str, bytes]:
        """What the kubelet projects: a token bound to the pod, ConfigMap keys, downward API fields."""
        namespace = pod["metadata"]["namespace"]
        files: dict[str, bytes] = {}
        for source in projected.get("sources") or []:
            if "serviceAccountToken" in source:
                files[source["serviceAccountToken"]["path"]] = self._token(pod).encode()
            elif "configMap" in source:
                found = self.api.get(f"/api/v1/namespaces/{namespace}/configmaps/{source['configMap']['name']}")
                data = (found or {}).get("data") or {}
                for item in source["configMap"].get("items") or [{"key": k, "path": k} for k in data]:
                    files[item["path"]] = str(data.get(item["key"], "")).encode()
            elif "downwardAPI" in source:
                for item in source["downwardAPI"].get("items") or []:
                    path = item.get("fieldRef", {}).get("fieldPath")
                    files[item["path"]] = str(namespace if path == "metadata.namespace" else "").encode()
        return files

    def _token(self, pod: dict[str, Any]) -> str:
        """A token of the pod's ServiceAccount bound to the pod (it dies with the pod), as the kubelet
        projects one into /var/run/secrets/kubernetes.io/serviceaccount."""
        meta = pod["metadata"]
        account = pod["spec"].get("serviceAccountName", "default")
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [],
                "expirationSeconds": 7200,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]},
            },
        }
        answer = self.api.call(
            "POST", f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token", request
        )
        return str(answer["status"]["token"])

    def _environment(
        self, running: RunningPod, pod: dict[str, Any], container: dict[str, Any], mounts: Sequence[tuple[str, Path]]
    ) -> dict[str, str]:
        meta, spec = pod["metadata"], pod["spec"]
        namespace = meta["namespace"]
        fields = {
            "metadata.name": meta["name"],
            "metadata.namespace": namespace,
            "metadata.uid": meta["uid"],
            "spec.nodeName": spec.get("nodeName", ""),
            "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
            "status.podIP": running.ip,
            "status.hostIP": running.ip,
        }
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                found = self.api.get(f"/api/v1/namespaces/{namespace}/configmaps/{source['configMapRef']['name']}")
                data = dict((found or {}).get("data") or {})
            else:
                found = self.api.get(f"/api/v1/namespaces/{namespace}/secrets/{source['secretRef']['name']}")
                data = {k: base64.b64decode(v).decode() for k, v in ((found or {}).get("data") or {}).items()}
            env.update({prefix + k: v for k, v in data.items()})
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = str(item["value"])
            elif "valueFrom" in item:
                source = item["valueFrom"]
                if "fieldRef" in source:
                    env[item["name"]] = fields[source["fieldRef"]["fieldPath"]]
                elif "configMapKeyRef" in source or "secretKeyRef" in source:
                    ref = source.get("configMapKeyRef") or source["secretKeyRef"]
                    kind = "configmaps" if "configMapKeyRef" in source else "secrets"
                    found = self.api.get(f"/api/v1/namespaces/{namespace}/{kind}/{ref['name']}")
                    value = ((found or {}).get("data") or {}).get(ref["key"])
                    if value is None:
                        raise ValueError(f"{kind} {ref['name']} has no key {ref['key']}")
                    env[item["name"]] = base64.b64decode(value).decode() if kind == "secrets" else value
            else:
                env[item["name"]] = ""
        env = {k: _rewrite(v, mounts) for k, v in env.items()}
        base = {k: v for k, v in os.environ.items() if not k.startswith("KUBEDGX_") and k != "KUBECONFIG"}
        tmp = next((str(local) for path, local in mounts if path == "/tmp"), None)
        extra = {
            "KUBECONFIG": str(self._kubeconfig(running, pod)),
            "HOSTNAME": meta["name"],
            "PYTHONUNBUFFERED": "1",
            # What the pod's own network namespace gives a real pod: its servers on its own address.
            "KUBEDGX_BIND_ADDRESS": running.ip,
        }
        if tmp is not None:
            extra["TMPDIR"] = tmp
        return base | env | extra

    def _kubeconfig(self, running: RunningPod, pod: dict[str, Any]) -> Path:
        """The pod's ServiceAccount token as a kubeconfig: a process outside a pod finds no
        /var/run/secrets/kubernetes.io/serviceaccount, and the operator falls back to KUBECONFIG."""
        account = pod["spec"].get("serviceAccountName", "default")
        token = self._token(pod)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "cluster",
                    "cluster": {"server": self.plane.server, "certificate-authority": str(self.plane.pki.ca_crt)},
                }
            ],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": "pod", "context": {"cluster": "cluster", "user": account}}],
            "current-context": "pod",
        }
        path = running.directory / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    # -- readiness ------------------------------------------------------------------------------

    def _probe(self, running: RunningPod, pod: dict[str, Any]) -> None:
        container = running.container
        if container.process is None:
            container.ready = False
            return
        probe = pod["spec"]["containers"][0].get("readinessProbe")
        if probe is None:
            container.ready = True
            return
        period = float(probe.get("periodSeconds", 10))
        if time.monotonic() - container.last_probe < min(period, 1.0):
            return
        container.last_probe = time.monotonic()
        get = probe.get("httpGet") or {}
        port = _port(pod["spec"]["containers"][0], get.get("port"))
        try:
            conn = http.client.HTTPConnection(running.ip, port, timeout=float(probe.get("timeoutSeconds", 1)))
            conn.request("GET", get.get("path", "/"))
            ok = 200 <= conn.getresponse().status < 400
            conn.close()
        except OSError:
            ok = False
        container.ready = ok

    # -- status ---------------------------------------------------------------------------------

    def _send_status(self, running: RunningPod, pod: dict[str, Any]) -> None:
        c = running.container
        spec_container = pod["spec"]["containers"][0]
        if c.waiting is not None:
            state: dict[str, Any] = {"waiting": {"reason": c.waiting[0], "message": c.waiting[1]}}
        elif c.process is not None:
            state = {"running": {"startedAt": c.started_at}}
        else:
            state = {"waiting": {"reason": "CrashLoopBackOff", "message": "restarting"}}
        ready = "True" if c.ready and running.terminating_since is None else "False"
        key = json.dumps([state, ready, c.restarts, running.ip])
        if key == running.status_sent:
            return
        now = _now()
        status = {
            "phase": "Running",
            "hostIP": running.ip,
            "hostIPs": [{"ip": running.ip}],
            "podIP": running.ip,
            "podIPs": [{"ip": running.ip}],
            "startTime": pod.get("status", {}).get("startTime") or now,
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": ready, "lastTransitionTime": now},
                {"type": "Ready", "status": ready, "lastTransitionTime": now},
            ],
            "containerStatuses": [
                {
                    "name": spec_container["name"],
                    "image": spec_container.get("image", ""),
                    "imageID": "",
                    "containerID": f"process://{c.process.pid}" if c.process is not None else "",
                    "ready": ready == "True",
                    "started": c.process is not None,
                    "restartCount": c.restarts,
                    "state": state,
                    **({"lastState": c.last_exit} if c.last_exit else {}),
                }
            ],
        }
        meta = pod["metadata"]
        try:
            self.api.call(
                "PATCH",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                {"status": status},
                "application/strategic-merge-patch+json",
            )
        except ApiError as exc:
            if exc.status != 404:
                raise
        running.status_sent = key

    # -- stopping -------------------------------------------------------------------------------

    def _terminate(self, running: RunningPod, pod: dict[str, Any]) -> None:
        c = running.container
        if running.terminating_since is None:
            running.terminating_since = time.monotonic()
            grace = pod["metadata"].get("deletionGracePeriodSeconds")
            grace = float(grace if grace is not None else pod["spec"].get("terminationGracePeriodSeconds", 30))
            running.kill_at = time.monotonic() + grace
            if c.process is not None and c.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(c.process.pid, signal.SIGTERM)
            self._send_status(running, pod)
        exited = c.process is None or c.process.poll() is not None
        if not exited and running.kill_at is not None and time.monotonic() >= running.kill_at:
            self._kill(running, 0)
            exited = True
        if exited:
            self._release(running)
            self._final_delete(running)
            self.pods.pop(running.uid, None)

    def _finish(self, running: RunningPod, pod: dict[str, Any], code: int) -> None:
        meta = pod["metadata"]
        name = pod["spec"]["containers"][0]["name"]
        status = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": _now()}],
            "containerStatuses": [
                {
                    "name": name,
                    "ready": False,
                    "restartCount": running.container.restarts,
                    "image": pod["spec"]["containers"][0].get("image", ""),
                    "imageID": "",
                    "state": running.container.last_exit,
                }
            ],
        }
        with contextlib.suppress(ApiError):
            self.api.call(
                "PATCH",
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                {"status": status},
                "application/strategic-merge-patch+json",
            )
        self._release(running)
        self.pods.pop(running.uid, None)

    def _kill(self, running: RunningPod, grace: float) -> None:
        process = running.container.process
        if process is not None:
            stop_process_group(process, grace)
        running.container.process = None

    def _release(self, running: RunningPod) -> None:
        if running.ip and running.ip not in self.free_ips:
            subprocess.run(["ip", "addr", "del", f"{running.ip}/32", "dev", "lo"], capture_output=True, check=False)
            self.free_ips.append(running.ip)
        running.ip = ""

    def _final_delete(self, running: RunningPod) -> None:
        self._final_delete_of({"namespace": running.namespace, "name": running.name, "uid": running.uid})

    def _final_delete_of(self, meta: Mapping[str, Any]) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": meta["uid"]},
        }
        with contextlib.suppress(ApiError):
            self.api.call("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body)

    # -- what tests use -------------------------------------------------------------------------

    def pod(self, name: str) -> RunningPod | None:
        with self._lock:
            return next((p for p in self.pods.values() if p.name == name), None)

    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL) -> int:
        """Send ``sig`` to a pod's process (a crash, as seen from the kubelet: it restarts it); its pid."""
        with self._lock:
            running = next(p for p in self.pods.values() if p.name == name)
            process = running.container.process
            assert process is not None, f"{name} runs no process"
            os.killpg(process.pid, sig)
            return process.pid

    def log(self, name: str) -> str:
        running = self.pod(name)
        if running is None or running.container.log_path is None:
            return ""
        return running.container.log_path.read_text(errors="replace")

    def logs(self) -> Iterator[tuple[str, str]]:
        """(pod directory, log text) of every container this runner ran, for failure reports."""
        for path in sorted(self.workdir.glob("*/*.log")):
            yield path.parent.name, path.read_text(errors="replace")


def _port(container: Mapping[str, Any], port: Any) -> int:
    if isinstance(port, int):
        return port
    for item in container.get("ports") or []:
        if item.get("name") == port:
            return int(item["containerPort"])
    raise ValueError(f"no container port named {port!r}")


def _rewrite(value: str, mounts: Sequence[tuple[str, Path]]) -> str:
    """A path under a volume's mountPath, pointed at the volume's local directory."""
    for mount_path, local in mounts:
        if value == mount_path or value.startswith(mount_path + "/"):
            return str(local) + value[len(mount_path) :]
    return value


def operator_executables(repository: str) -> dict[str, dict[str, str]]:
    """The chart's operator image, run from this checkout's console script."""
    import sys

    found = shutil.which("kubedgx", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    assert found is not None, "the kubedgx console script is not installed (pip install -e .)"
    return {repository: {"kubedgx": found}}


Waiter = Callable[[], bool]
