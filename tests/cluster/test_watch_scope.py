"""What the real apiserver sends the operator: of pods, Services and ConfigMaps only kubedgx's own
(docs/operator.md, "What the operator watches").

The operator (the chart's ServiceAccount, cluster-wide as the chart installs it by default) talks to
the apiserver through a relay in this process that records every request it sends and every object
it gets back, LIST items and WATCH events alike. So the test reads the operator's requests (each
pod/Service/ConfigMap LIST and WATCH carries the labelSelector, each initial LIST a page limit) and
the apiserver's answers (not one object without our label, among them pods of other workloads in
the job's own namespace and in another one, created before the operator started and after) exactly,
as the operator received them. The relay forwards the operator's own token: the apiserver still
authenticates and authorizes the ServiceAccount, and a refusal fails the test.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import pytest
import yaml

from tests.chart.conftest import Rendered
from tests.cluster.controlplane import ControlPlane
from tests.cluster.operator import install, run_operator, service_account, token_kubeconfig
from tests.e2e.jobs import command_job, running_with, wait_gone, wait_job, worker_pods
from tests.e2e.kubectl import JOBS, Kubectl, dig, wait_for
from tests.support.ports import free_port

JOB_LABEL = "kubedgx.io/job-name"  # docs/operator.md's name, spelled out
CHILDREN = ("pods", "services", "configmaps")
PAGE = "500"  # settings.DEFAULT_LIST_CHUNK_SIZE, as the chart runs the operator
TIMEOUT = 60
#: Headers that belong to one HTTP hop, not to the request or answer relayed; the relay asks for and
#: passes on identity encoding, so that what it records is what it forwards.
HOP_HEADERS = frozenset(
    {"host", "connection", "keep-alive", "content-length", "transfer-encoding", "accept-encoding", "content-encoding"}
)


@dataclass
class Relayed:
    """One request of the operator's and the objects the apiserver answered it with."""

    method: str
    path: str
    query: dict[str, str]
    status: int | None = None
    objects: list[dict[str, Any]] = field(default_factory=list)

    @property
    def resource(self) -> str | None:
        """The plural of a core/v1 collection or object path (/api/v1/[namespaces/<ns>/]<plural>[/<name>])."""
        parts = self.path.strip("/").split("/")
        if parts[:2] != ["api", "v1"]:
            return None
        rest = parts[2:]
        if len(rest) >= 3 and rest[0] == "namespaces":
            rest = rest[2:]
        return rest[0] if rest else None

    @property
    def collection(self) -> bool:
        parts = self.path.strip("/").split("/")[2:]
        return len(parts) in (1, 3) and not (len(parts) == 1 and parts[0] == "namespaces")

    @property
    def watch(self) -> bool:
        return self.query.get("watch") in ("true", "1")

    def saw(self, obj: Any) -> None:
        """An object in an answer; not a Status, nor a bookmark (a resourceVersion, no name)."""
        if not isinstance(obj, dict) or obj.get("kind") == "Status":
            return
        meta = obj.get("metadata") or {}
        if meta.get("name"):
            self.objects.append({"name": meta["name"], "namespace": meta.get("namespace"),
                                 "labels": dict(meta.get("labels") or {})})  # fmt: skip


class Relay:
    """A plain-HTTP reverse proxy on 127.0.0.1 to the apiserver, run on its own event loop in a thread,
    recording what passes (see the module docstring)."""

    def __init__(self, upstream: str, cafile: Path) -> None:
        self.upstream = upstream.rstrip("/")
        # The CA only, no client certificate: the operator's bearer token is what authenticates it.
        self.tls = ssl.create_default_context(cafile=str(cafile))
        self.port = free_port()
        self.relayed: list[Relayed] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="relay", daemon=True)
        self._runner: aiohttp.web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Relay:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def requests(self) -> list[Relayed]:
        with self._lock:
            return list(self.relayed)

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)
        app = aiohttp.web.Application()
        app.router.add_route("*", "/{tail:.*}", self._relay)
        # A stream whose client went away ends at once, not at its next event or the shutdown timeout.
        self._runner = aiohttp.web.AppRunner(app, handler_cancellation=True, shutdown_timeout=5, access_log=None)
        await self._runner.setup()
        await aiohttp.web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _relay(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        assert self._session is not None
        record = Relayed(request.method, request.path, dict(request.query))
        with self._lock:
            self.relayed.append(record)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        # Identity, said outright: aiohttp would otherwise ask for gzip, which the apiserver uses for
        # large answers (a LIST of CRDs once Kueue's are installed), and the relay would pass on
        # compressed bytes without their Content-Encoding.
        headers["Accept-Encoding"] = "identity"
        body = await request.read()
        async with self._session.request(
            request.method,
            self.upstream + request.path_qs,
            headers=headers,
            data=body or None,
            ssl=self.tls,
            allow_redirects=False,
        ) as upstream:
            record.status = upstream.status
            response = aiohttp.web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS},
            )
            await response.prepare(request)
            if record.watch and upstream.status == 200:
                pending = b""
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)  # at once: the operator reads events as they come
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in filter(None, lines):
                        record.saw(json.loads(line).get("object"))
            else:
                data = await upstream.read()
                await response.write(data)
                document = json.loads(data) if data.startswith(b"{") else {}
                for item in document.get("items", [document]) or []:
                    record.saw(item)
            await response.write_eof()
            return response


def relayed_kubeconfig(token_config: Path, relay: Relay, path: Path) -> Path:
    """The operator's token kubeconfig, pointed at the relay."""
    config = yaml.safe_load(token_config.read_text())
    config["clusters"][0]["cluster"] = {"server": relay.url}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def bystander(name: str, app: str) -> dict[str, Any]:
    """Someone else's pod: no kubedgx label; a scheduling gate keeps it off the fake nodes."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {
            "schedulingGates": [{"name": "test.kubedgx.io/never"}],
            "containers": [{"name": "web", "image": "registry.example/web:1.0", "env": [{"name": "A", "value": "b"}]}],
        },
    }


@pytest.fixture
def other_namespace(kubectl: Kubectl) -> Iterator[Kubectl]:
    name = f"t-bystanders-{secrets.token_hex(3)}"
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    account = lambda: kubectl.in_namespace(name).get("serviceaccount", "default")  # noqa: E731
    wait_for(f"the default ServiceAccount of {name}", account, timeout=120, interval=0.2)
    yield kubectl.in_namespace(name)
    kubectl.run("delete", "namespace", name, "--wait=false", "--ignore-not-found")


@pytest.fixture(scope="module")
def chart(kubectl: Kubectl) -> list[Rendered]:
    return install(kubectl)


def test_the_apiserver_sends_the_operator_its_children_and_nothing_else(
    control_plane: ControlPlane,
    kubectl: Kubectl,
    chart: list[Rendered],
    namespace: Kubectl,
    other_namespace: Kubectl,
    tmp_path: Path,
) -> None:
    # Other workloads' pods, a Service and a ConfigMap before the operator starts (its initial LISTs).
    for k in (namespace, other_namespace):
        k.apply(
            bystander("web-before", "web"),
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "web"}, "data": {"a": "b"}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
             "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}},
        )  # fmt: skip
    token = token_kubeconfig(control_plane, kubectl, tmp_path / "token.kubeconfig", service_account(chart))
    with Relay(control_plane.server, control_plane.pki.ca_crt) as relay:
        kubeconfig = relayed_kubeconfig(token, relay, tmp_path / "relayed.kubeconfig")
        with run_operator(control_plane, __name__, chart, kubeconfig, tmp_path / "operator") as op:
            wait_for("the operator's watches of its children",
                     lambda: all(any(r.watch and r.resource == c and r.status == 200 for r in relay.requests())
                                 for c in CHILDREN), timeout=TIMEOUT, interval=0.3)  # fmt: skip
            # ... and after: created, then changed, while the operator watches.
            for k in (namespace, other_namespace):
                k.apply(bystander("web-after", "web"))
                k.run("label", "pod", "web-after", "tier=frontend")
            # A job's events come after the bystanders' on the same streams (watches are ordered by
            # resourceVersion): once its worker has reached the operator, so would have they.
            namespace.apply(command_job("scoped"))
            wait_job(namespace, "scoped", "Running 1/1", running_with(1), timeout=TIMEOUT)
            (worker,) = (dig(p, "metadata", "name") for p in worker_pods(namespace, "scoped"))

            def worker_relayed() -> bool:
                return any(
                    r.watch and r.resource == "pods" and any(o["name"] == worker for o in r.objects)
                    for r in relay.requests()
                )

            wait_for(f"{worker}'s events on the operator's pod watch", worker_relayed, timeout=TIMEOUT, interval=0.3)
            requests = relay.requests()
            namespace.delete(JOBS, "scoped")  # while the operator runs: it releases the job's finalizer
            wait_gone(namespace, JOBS, "scoped", timeout=TIMEOUT)
            refused = op.forbidden()
            log = op.log()
    assert refused == [], "the chart's RBAC refused the operator:\n" + "\n".join(refused[:20])
    assert "Starting the watch-stream for pods.v1 cluster-wide" in log, "the operator watched pods cluster-wide"

    reads = [r for r in requests if r.method == "GET" and r.resource in CHILDREN and r.collection]
    for resource in CHILDREN:
        lists = [r for r in reads if r.resource == resource and not r.watch]
        watches = [r for r in reads if r.resource == resource and r.watch]
        assert lists, f"no LIST of {resource}"
        assert watches, f"no WATCH of {resource}"
        for r in lists + watches:
            assert r.path == f"/api/v1/{resource}", r.path  # cluster-wide
            assert r.query.get("labelSelector") == JOB_LABEL, (r.path, r.query)
        for r in lists:
            assert r.query.get("limit") == PAGE, (r.path, r.query)
    # What came back: our own objects only, the job's included; no bystander, before or after.
    answered = [(r.resource, o) for r in requests if r.resource in CHILDREN for o in r.objects]
    foreign = [(resource, o) for resource, o in answered if JOB_LABEL not in o["labels"]]
    assert foreign == [], f"the apiserver sent the operator objects without {JOB_LABEL}: {foreign[:10]}"
    names = {(resource, o["namespace"], o["name"]) for resource, o in answered}
    assert ("pods", namespace.namespace, worker) in names
    for k in (namespace, other_namespace):
        for pod in ("web-before", "web-after"):
            assert ("pods", k.namespace, pod) not in names
