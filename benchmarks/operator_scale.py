"""How the operator scales: N jobs of 8 workers created at once, against the in-memory API.

    python benchmarks/operator_scale.py            # N = 1, 100, 1000
    python benchmarks/operator_scale.py 1 100      # chosen sizes
    python benchmarks/operator_scale.py --cluster 100 1000   # on the real control plane (tests/cluster)
    python benchmarks/operator_scale.py --unrelated 0        # without the cluster's other pods
    python benchmarks/operator_scale.py --hold 0             # no steady-state window after start-up

For each N, two runs side by side on fresh emulators (tests/integration/emulator.py):

- baseline: a client that makes exactly the minimum writes for every job — one ConfigMap, one
  Service, 8 pods and one status write — jobs in parallel, each job's writes in sequence;
- operator: `kubedgx operator` in a subprocess (the real CLI, standalone), the N jobs created at
  once, until every job has its 8 pods and a status that says so (workers.active == 8).

Both runs start on an API server that already holds ``--unrelated`` pods (default 5,000) that are no
business of kubedgx: ordinary workload pods (three containers, env, probes, volumes, a Running
status), spread over four other namespaces and the jobs' own. The operator watches every namespace
(``-A``, the chart's default), so each of those pods is in its scope unless it filters them out
server-side; the baseline never reads them.

Reported: seconds to done for both and their ratio; the operator's peak RSS (VmHWM); seconds from
its start until its watches are open ("ready"); its write amplification = writes it made / minimum
writes (N x 11: the emulator's "done" comes before any worker runs, so no Running transition is in
it), with and without the Kubernetes Events it posts. Targets: amplification <= 1.2, time ratio <= 2,
RSS < 200 MB at N = 1000 with the 5,000 unrelated pods.

Steady state (``--hold SECONDS``, default 60; 0 skips it): once the start-up writes are counted, the
benchmark plays the kubelet and the trainer: worker 0's ``trainer`` log gets JSON progress lines
(docs/trainer.md, "Progress: the contract"), every worker pod is set Running, and once every job is
Running with 8/8 ready (and has posted that transition's Event) the operator runs on for the hold
while each worker 0's log is rewritten every second with a growing step, so each read of it
(``--progress-interval``, default 30 s, passed to the operator) finds a new report. The operator's
writes in that window are counted apart from the start-up ones: status writes of DGXTrainingJobs,
reported per job-minute next to the bound 60 / interval (at most hold / interval + 1 per job in the
hold), and every other write.

``--cluster``: the same two clients on a real Kubernetes control plane (tests/cluster/controlplane.py:
etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok), one fresh cluster per N with
N x 8 kwok nodes of the job's instance type (one worker per node), the chart's objects installed.
Four runs share that cluster, one after the other, each in its own namespace, the previous one's
namespace deleted and no pod left in the cluster before the next starts:

- (a) the baseline, authenticated as the chart's ServiceAccount;
- (d) kubedgx's workers for the scheduler alone: the baseline's objects again (each job's Service,
  ConfigMap and 8 workers from the operator's builders, so the pods carry kubedgx's exact affinity
  and a Service selects them), created while kube-scheduler is stopped;
- (c) plain pods: N x 8 pods with the workers' resource requests and limits, their tolerations (the
  kwok nodes carry the GPU pool's taint) and a nodeSelector for the GPU product and count (what any
  pod that wants such a node says), and nothing else of kubedgx's: no pod affinity, no spreading, no
  Service, no kubedgx labels; created the same way, the scheduler stopped;
- (b) the operator, run as in the cluster tests (tests/cluster/operator.py: start_operator).

Writes are counted from the apiserver's audit log (every write by that ServiceAccount in the run's
window: exact and attributed); apiserver_request_total has no label that tells clients apart, so its
deltas are only printed next to the audit counts (BENCH_DETAIL=1) as a cross-check. Two times per run:
"done" (as above: every job's 8 pods exist and its status says workers.active == 8) and "running"
(kwok ran the pods: for the operator every job Running with 8/8 ready, for the baseline all its pods
Running). The operator's writes are counted once every job is Running and has posted the Event of
that transition. The minimum there is N x 12: the issue's N x 11 writes plus one status write per job
for its Running transition (the baseline client stops at N x 11: it writes no Running status).

Scheduler throughput, for (d) and (c): every pod of the run waits in the API while kube-scheduler is
stopped; then it is started, and from its readiness to the moment the API shows every pod bound
(spec.nodeName set, polled) it only drains its queue, at its own pace, not the creating client's.
pods/s = the pods it bound, from its own metrics (a fresh process: ``scheduler_schedule_attempts_total
{result="scheduled"}``, counted after each Bind succeeded; its /metrics read with the admin's client
certificate, which it authenticates and authorizes through the apiserver) / those seconds. "sched
ratio" = the workers' pods/s / the plain pods'. BENCH_DETAIL=1 also prints, per run, the mean of
``scheduler_scheduling_attempt_duration_seconds``, ``scheduler_scheduling_algorithm_duration_seconds``,
``scheduler_framework_extension_point_duration_seconds`` by extension point and the slowest plugins of
``scheduler_plugin_execution_duration_seconds`` (sampled), the unschedulable attempts, and 1 / the
mean algorithm time (the pods/s the scheduling algorithm alone would allow).

The hold (above) comes after (b) on the cluster too, its writes from the audit log, but with no
trainer output: kwok answers ``pods/log`` with 404 NotFound, so there the operator finds no progress
to report, and the writes left are its leader-election Lease renewals (the chart runs it with leader
election; the emulator runs it ``--standalone``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import copy
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import kmock
import yaml
from kubernetes_asyncio import client, config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dgx_operator.api import DGXTrainingJob  # noqa: E402
from dgx_operator.catalog import Catalog  # noqa: E402
from dgx_operator.render import BuildContext, build_children  # noqa: E402
from tests.cluster.controlplane import CONTEXT, ControlPlane, NodePool, dgx_nodes  # noqa: E402
from tests.cluster.controlplane import build as build_control_plane  # noqa: E402
from tests.cluster.operator import install, service_account, start_operator, token_kubeconfig  # noqa: E402
from tests.e2e.kubectl import Kubectl  # noqa: E402
from tests.integration.emulator import Emulator  # noqa: E402

NAMESPACE = "bench"
#: Where the unrelated pods live: the jobs' namespace and four others, round-robin.
UNRELATED_NAMESPACES = (NAMESPACE, "team-a", "team-b", "team-c", "team-d")
DEFAULT_UNRELATED = 5000
WORKERS = 8
MIN_WRITES_PER_JOB = WORKERS + 3  # pods + Service + ConfigMap + one status write
#: On the cluster the jobs run: one more status write per job, for its Running transition.
MIN_WRITES_PER_JOB_CLUSTER = MIN_WRITES_PER_JOB + 1
TIMEOUT = 900.0
#: Seconds the operator runs on once every job is Running, its writes counted apart (--hold).
DEFAULT_HOLD = 60.0
#: The operator's own default (KUBEDGX_PROGRESS_INTERVAL), passed to it explicitly (--progress-interval).
DEFAULT_PROGRESS_INTERVAL = 30.0
#: The container whose log carries the progress lines (the worker's only container).
TRAINER = "trainer"
#: The phase event the operator posts when all of a job's workers run (planner: AllWorkersRunning).
RUNNING_REASON = "AllWorkersRunning"
#: A worker's replica index (worker 0's log carries the progress lines).
INDEX_LABEL = "kubedgx.io/replica-index"

JOB: dict[str, Any] = {
    "apiVersion": "kubedgx.io/v1alpha1",
    "kind": "DGXTrainingJob",
    "metadata": {"namespace": NAMESPACE},
    "spec": {
        "instance": "dgxh100.80g.8.norm",
        "elastic": {"minNodes": WORKERS, "maxNodes": WORKERS},
        "trainer": {"model": {"name": "org/model"}, "dataset": {"path": "/data/train.jsonl"}},
    },
}


def job_manifest(i: int, namespace: str = NAMESPACE) -> dict[str, Any]:
    job = copy.deepcopy(JOB)
    job["metadata"]["name"] = f"job-{i:04d}"
    job["metadata"]["namespace"] = namespace
    return job


def kubeconfig(api: Emulator, directory: Path) -> Path:
    path = directory / "kubeconfig.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "e", "cluster": {"server": str(api.url).rstrip("/")}}],
                "users": [{"name": "e", "user": {"token": "e"}}],
                "contexts": [{"name": "e", "context": {"cluster": "e", "user": "e", "namespace": NAMESPACE}}],
                "current-context": "e",
            }
        ),
        encoding="utf-8",
    )
    return path


def unrelated_pod(i: int, namespace: str) -> dict[str, Any]:
    """A Running pod of someone else's Deployment, as a cluster is full of: no kubedgx label, the size
    of a real workload pod (an app, a proxy sidecar and a log shipper; env, probes, a few volumes;
    once stored with the API server's defaults and a status, about 6 KB of JSON)."""
    app = f"web-{i % 50:02d}"
    env = [{"name": f"APP_SETTING_{k}", "value": f"value-{k}-{app}"} for k in range(8)] + [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    probe = {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10, "failureThreshold": 3}
    resources = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}
    mounts = [{"name": "config", "mountPath": "/etc/app"}, {"name": "tmp", "mountPath": "/tmp"}]
    containers = [
        {
            "name": "app",
            "image": f"registry.example/{app}:1.4.2",
            "ports": [{"name": "http", "containerPort": 8080}],
            "env": env,
            "resources": resources,
            "readinessProbe": probe,
            "livenessProbe": probe,
            "volumeMounts": mounts,
        },
        {
            "name": "proxy",
            "image": "registry.example/envoy:1.31.0",
            "args": ["--config-path", "/etc/envoy/envoy.yaml", "--log-level", "warn"],
            "ports": [{"name": "proxy", "containerPort": 15001}],
            "resources": resources,
            "volumeMounts": [{"name": "envoy", "mountPath": "/etc/envoy"}],
        },
        {
            "name": "logs",
            "image": "registry.example/fluent-bit:3.1.0",
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp", "readOnly": True}],
        },
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{app}-7d9f8c6b5-{i:05d}",
            "namespace": namespace,
            "labels": {"app": app, "pod-template-hash": "7d9f8c6b5", "tier": "frontend"},
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8080"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{app}-7d9f8c6b5",
                    "uid": f"00000000-0000-4000-8000-{i % 50:012d}",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "containers": containers,
            "volumes": [
                {"name": "config", "configMap": {"name": f"{app}-config"}},
                {"name": "envoy", "configMap": {"name": "envoy-config"}},
                {"name": "tmp", "emptyDir": {}},
            ],
            "nodeName": f"node-{i % 200:03d}",
        },
    }


def unrelated_status(pod: dict[str, Any], i: int) -> dict[str, Any]:
    """What a kubelet reports for it: Running, every container ready."""
    started = "2025-01-01T00:00:00Z"
    conditions = [
        {"type": t, "status": "True", "lastTransitionTime": started}
        for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    statuses = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": f"{c['image'].split(':')[0]}@sha256:{i:064d}",
            "containerID": f"containerd://{i:064x}",
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": started}},
        }
        for c in pod["spec"]["containers"]
    ]
    ip = f"10.{100 + i // 65536}.{i // 256 % 256}.{i % 256}"
    return {
        "phase": "Running",
        "conditions": conditions,
        "hostIP": f"192.168.0.{i % 200}",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": started,
        "qosClass": "Burstable",
        "containerStatuses": statuses,
    }


def add_unrelated(api: Emulator, count: int) -> None:
    """``count`` unrelated pods, stored (with a status) before either run starts."""
    for name in UNRELATED_NAMESPACES:
        if api.get("namespaces", None, name) is None:
            api.create_namespace(name)
    for i in range(count):
        namespace = UNRELATED_NAMESPACES[i % len(UNRELATED_NAMESPACES)]
        pod = api.create("pods", unrelated_pod(i, namespace))
        api.patch_status("pods", namespace, pod["metadata"]["name"], unrelated_status(pod, i))


def reported(job: Any) -> bool:
    return bool(((job.get("status") or {}).get("workers") or {}).get("active") == WORKERS)


def done(api: Emulator, n: int, unrelated: int) -> bool:
    """Every job has its pods and a status that says so. Re-checked after every change, so the
    cheap test (a count) goes first; the emulator holds only this run's objects and the
    ``unrelated`` pods, which nothing deletes."""
    return api.count("pods") >= n * WORKERS + unrelated and api.count("dgxtrainingjobs", NAMESPACE, reported) >= n


def writes(api: Emulator, since: int) -> tuple[int, int]:
    """(all writes, writes other than Events) logged after index ``since``; failed writes count
    too (a 409 is a write the server had to process)."""
    calls = [c for c in api.log[since:] if c.write]
    return len(calls), sum(1 for c in calls if c.resource != "events")


def breakdown(api: Emulator, since: int) -> str:
    counts = collections.Counter(
        f"{c.verb} {c.resource}{'/' + c.subresource if c.subresource else ''} {c.status}"
        for c in api.log[since:]
        if c.write
    )
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))


def progress_log(step: int) -> str:
    """Worker 0's trainer output by ``step``: its last progress lines (docs/trainer.md, "Progress: the
    contract"), each after a line of a library's own output, as the operator tails it."""
    lines = []
    for s in range(max(1, step - 2), step + 1):
        lines.append(f"2026-12-04 10:00:00 INFO [rank 0] step {s} done\n")
        report = {"event": "progress", "step": s, "totalSteps": 1_000_000, "loss": round(4.0 / (1 + s / 100), 4)}
        lines.append(json.dumps(report) + "\n")
    return "".join(lines)


def running_status(pod: dict[str, Any]) -> dict[str, Any]:
    """A kubelet's status for a worker whose containers all run and are ready (as the integration
    tests' run_pod writes it)."""
    started = "2025-01-01T00:00:00Z"
    conditions = [
        {"type": t, "status": "True", "lastTransitionTime": started}
        for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
    ]
    statuses = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": f"{str(c['image']).split('@')[0].rsplit(':', 1)[0]}@sha256:{'0' * 64}",
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": started}},
        }
        for c in pod["spec"]["containers"]
    ]
    return {
        "phase": "Running",
        "conditions": conditions,
        "hostIP": "10.0.0.1",
        "podIP": "10.1.0.1",
        "startTime": started,
        "containerStatuses": statuses,
    }


def job_running(job: Any) -> bool:
    status = job.get("status") or {}
    return bool(status.get("phase") == "Running" and (status.get("workers") or {}).get("ready") == WORKERS)


def status_write(resource: str | None, subresource: str | None) -> bool:
    """A write of a job's status (the /status subresource of a DGXTrainingJob)."""
    return resource == "dgxtrainingjobs" and subresource == "status"


def per_job_minute(count: float, jobs: int, seconds: float) -> float:
    return count / jobs / (seconds / 60) if jobs and seconds > 0 else float("nan")


def hold_bound(hold: float, interval: float) -> float:
    """The most progress status writes one job may make in a hold of ``hold`` seconds: one per read,
    one read per interval, the first at any moment of it."""
    return hold // interval + 1 if interval > 0 else 0.0


async def hold_with_progress(api: Emulator, workers0: list[str], hold: float) -> float:
    """Run ``hold`` seconds, rewriting each worker 0's trainer log every second with the next step;
    returns the seconds it ran."""
    start = time.perf_counter()
    step = 1
    while (elapsed := time.perf_counter() - start) < hold:
        step += 1
        for pod in workers0:
            api.set_log(NAMESPACE, pod, TRAINER, progress_log(step))
        await asyncio.sleep(min(1.0, hold - elapsed))
    return time.perf_counter() - start


async def minimal_writes(core: Any, custom: Any, catalog: Catalog, body: Any) -> None:
    """The minimum for one job, in sequence: its children from the operator's own builders, then
    one status write that says its workers are there."""
    job = DGXTrainingJob.model_validate(body)
    namespace = job.metadata.namespace
    for child in build_children(job, BuildContext(catalog)):
        create = {
            "ConfigMap": core.create_namespaced_config_map,
            "Service": core.create_namespaced_service,
            "Pod": core.create_namespaced_pod,
        }[child["kind"]]
        await create(namespace, child)
    await custom.patch_namespaced_custom_object_status(
        "kubedgx.io",
        "v1alpha1",
        namespace,
        "dgxtrainingjobs",
        job.metadata.name,
        {"status": {"phase": "Pending", "workers": {"desired": WORKERS, "active": WORKERS}}},
        _content_type="application/merge-patch+json",
    )


async def baseline(n: int, unrelated: int) -> dict[str, float]:
    catalog = Catalog.load()
    async with Emulator(keep_requests=False) as api, kmock.Server(api):
        api.install_crds(sorted((ROOT / "crds").glob("*.yaml")))
        api.create_namespace(NAMESPACE)
        add_unrelated(api, unrelated)
        with tempfile.TemporaryDirectory() as tmp:
            configuration = client.Configuration()
            path = str(kubeconfig(api, Path(tmp)))
            await config.load_kube_config(config_file=path, client_configuration=configuration)
            async with client.ApiClient(configuration) as http:
                core, custom = client.CoreV1Api(http), client.CustomObjectsApi(http)
                for i in range(n):
                    api.create("dgxtrainingjobs", job_manifest(i), namespace=NAMESPACE)
                mark = len(api.log)
                start = time.perf_counter()

                async def one(i: int) -> None:
                    body = api.get("dgxtrainingjobs", NAMESPACE, f"job-{i:04d}")
                    await minimal_writes(core, custom, catalog, body)

                await asyncio.gather(*(one(i) for i in range(n)))
                await api.wait_for(lambda: done(api, n, unrelated), timeout=TIMEOUT)
                elapsed = time.perf_counter() - start
                total, _ = writes(api, mark)
    return {"seconds": elapsed, "writes": total}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def rss_mb(pid: int, field: str = "VmHWM") -> float:
    """VmHWM: the peak resident set so far; VmRSS: now."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def operator(n: int, unrelated: int, hold: float, interval: float) -> dict[str, float]:
    async with Emulator(keep_requests=False) as api, kmock.Server(api):
        api.install_crds(sorted((ROOT / "crds").glob("*.yaml")))
        api.create_namespace(NAMESPACE)
        add_unrelated(api, unrelated)
        with tempfile.TemporaryDirectory() as tmp:
            # Its own metrics port: another operator (another benchmark, a test) may hold the default.
            env = {**os.environ, "KUBECONFIG": str(kubeconfig(api, Path(tmp)))}
            env["KUBEDGX_METRICS_PORT"] = str(free_port())
            log_path = Path(tmp) / "operator.log"
            launched = time.perf_counter()
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dgx_operator.cli.main",
                    "operator",
                    "--standalone",
                    "-A",
                    "--liveness",
                    f"http://127.0.0.1:{free_port()}/healthz",
                    "--progress-interval",
                    f"{interval:g}s",
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=open(log_path, "w"),  # noqa: SIM115
            )
            exited = asyncio.ensure_future(asyncio.to_thread(proc.wait))
            exited.add_done_callback(lambda _: api.notify())  # an operator that dies ends every wait

            async def until(what: str, predicate: Callable[[], object]) -> None:
                await api.wait_for(lambda: proc.poll() is not None or predicate(), timeout=TIMEOUT)
                if proc.poll() is not None:
                    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
                    raise RuntimeError(f"the operator exited {proc.returncode} before {what}:\n{tail}")

            try:
                # Ready when its watches are open: kopf lists and watches both kinds of child (all it
                # lists is handled first, so an operator that lists the cluster's pods is late here).
                await until("its watches", lambda: api.open_watches("dgxtrainingjobs") and api.open_watches("pods"))
                ready = time.perf_counter() - launched
                mark = len(api.log)
                start = time.perf_counter()
                for i in range(n):
                    api.create("dgxtrainingjobs", job_manifest(i), namespace=NAMESPACE)
                await until("done", lambda: done(api, n, unrelated))
                elapsed = time.perf_counter() - start
                # kopf posts Events in the background: count the writes once each job's first
                # Event (its WorkersPending transition) has arrived, so none is missed.
                await until("every Event", lambda: api.count("events", NAMESPACE) >= n)
                total, without_events = writes(api, mark)
                rss = rss_mb(proc.pid)
                detail = bool(os.environ.get("BENCH_DETAIL"))
                if detail:
                    print(f"  operator writes at N={n}: {breakdown(api, mark)}", flush=True)
                    print(f"  operator RSS now {rss_mb(proc.pid, 'VmRSS'):.0f} MB, peak {rss:.0f} MB", flush=True)
                result = {
                    "seconds": elapsed,
                    "writes": total,
                    "writes_no_events": without_events,
                    "rss_mb": rss,
                    "ready": ready,
                }
                if hold > 0:
                    # The kubelet's and the trainer's part: worker 0 has printed a progress line, every
                    # worker runs; then the operator's steady state, its writes counted apart.
                    workers = api.select("pods", NAMESPACE, labels={"app.kubernetes.io/component": "worker"})
                    workers0 = [p["metadata"]["name"] for p in workers if p["metadata"]["labels"][INDEX_LABEL] == "0"]
                    for name in workers0:
                        api.set_log(NAMESPACE, name, TRAINER, progress_log(1))
                    mark = len(api.log)
                    started = time.perf_counter()
                    for pod in workers:
                        api.patch_status("pods", NAMESPACE, pod["metadata"]["name"], running_status(pod))
                    await until(
                        "every job Running 8/8", lambda: api.count("dgxtrainingjobs", NAMESPACE, job_running) >= n
                    )
                    await until(
                        "every job's Running Event",
                        lambda: api.count("events", NAMESPACE, lambda e: e.get("reason") == RUNNING_REASON) >= n,
                    )
                    result["running_s"] = time.perf_counter() - started
                    if detail:
                        print(
                            f"  operator writes from the workers Running to every job Running: {breakdown(api, mark)}",
                            flush=True,
                        )
                    mark = len(api.log)
                    result["hold_s"] = await hold_with_progress(api, workers0, hold)
                    if proc.poll() is not None:
                        raise RuntimeError(f"the operator exited {proc.returncode} during the hold")
                    calls = [c for c in api.log[mark:] if c.write]
                    result["hold_status"] = sum(1 for c in calls if status_write(c.resource, c.subresource))
                    result["hold_other"] = len(calls) - result["hold_status"]
                    result["hold_reads"] = sum(
                        1 for c in api.log[mark:] if c.resource == "pods" and c.subresource == "log"
                    )
                    if detail:
                        print(
                            f"  operator writes in the {result['hold_s']:.0f}s hold: {breakdown(api, mark) or 'none'}; "
                            f"{result['hold_reads']:.0f} log reads; peak RSS {rss_mb(proc.pid):.0f} MB",
                            flush=True,
                        )
            finally:
                proc.terminate()
                await asyncio.wait_for(exited, timeout=30)
    return result


# -- on the real control plane (--cluster) ---------------------------------------------------------

GROUP, VERSION, PLURAL = "kubedgx.io", "v1alpha1", "dgxtrainingjobs"
BASELINE_NS, PLAIN_NS, OPERATOR_NS = "bench-baseline", "bench-plain", "bench-operator"
WORKERS_NS = "bench-workers"
#: The kwok processes of tests/cluster/controlplane.py (the nodes' kubelets).
KWOK = ("kwok", "kwok-lossy")
#: Verbs that write, as the audit log names them (failed writes count too, as in the emulator mode).
AUDIT_WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})
#: ... and as apiserver_request_total's ``verb`` label names them.
METRIC_WRITES = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE"})
#: kwok renews each node's Lease every quarter of its duration: the tests' 20 s would be 1,600 Lease
#: writes a second at 8,000 nodes, more than the rest of the run together. Longer leases (and a
#: node-monitor grace period to match) keep the nodes Ready at a few dozen writes a second.
LEASE_SECONDS = 600
NODE_MONITOR_GRACE = "900s"
#: Client-side rate limits of kube-controller-manager and the scheduler (defaults 20 and 50 requests a
#: second): at the defaults, untainting 8,000 new nodes takes half an hour and binding 8,000 pods
#: (a binding and an Event each) close to six minutes, for either client alike.
CLIENT_QPS = 500
#: Only ServiceAccounts outside kube-system are audited (kwok and the scheduler use the admin's
#: certificate, kube-controller-manager kube-system ServiceAccounts), only their writes, metadata only.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: None
  verbs: [get, list, watch]
- level: None
  userGroups: ["system:serviceaccounts:kube-system"]
- level: Metadata
  userGroups: ["system:serviceaccounts"]
- level: None
"""


class ScalePlane(ControlPlane):
    """The tests' control plane with longer node leases (LEASE_SECONDS) and higher client rate limits
    for kube-controller-manager and the scheduler (CLIENT_QPS)."""

    def _argv(self) -> dict[str, list[str]]:
        argv = super()._argv()

        def swap(args: list[str], flag: str, value: str) -> list[str]:
            return [f"{flag}={value}" if a.startswith(f"{flag}=") else a for a in args]

        for name in ("kwok", "kwok-lossy"):
            argv[name] = swap(argv[name], "--node-lease-duration-seconds", str(LEASE_SECONDS))
        kcm = "kube-controller-manager"
        argv[kcm] = swap(argv[kcm], "--node-monitor-grace-period", NODE_MONITOR_GRACE)
        for name in (kcm, "kube-scheduler"):
            argv[name] += [f"--kube-api-qps={CLIENT_QPS}", f"--kube-api-burst={2 * CLIENT_QPS}"]
        return argv


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def until(what: str, probe: Callable[[], Awaitable[bool]], *, timeout: float, interval: float = 0.25) -> None:
    """Poll ``probe`` until true; ``interval`` only paces the polling."""
    deadline = time.monotonic() + timeout
    while not await probe():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


class Cluster:
    """The control plane of one N, reached as the admin from worker threads (ControlPlane.request)."""

    def __init__(self, plane: ControlPlane, audit_path: Path) -> None:
        self.plane = plane
        self.audit_path = audit_path

    async def get(self, path: str, timeout: float = 120) -> Any:
        status, body = await asyncio.to_thread(self.plane.request, "GET", path, timeout=timeout)
        if status != 200:
            raise RuntimeError(f"GET {path}: {status} {body}")
        return body

    async def count(self, path: str) -> int:
        """Objects at a collection path without selectors: one item and remainingItemCount."""
        body = await self.get(f"{path}?limit=1")
        return len(body["items"]) + int(body["metadata"].get("remainingItemCount") or 0)

    async def jobs(self, namespace: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = (await self.get(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"))[
            "items"
        ]
        return items

    async def pods_not_running(self, namespace: str) -> int:
        body = await self.get(f"/api/v1/namespaces/{namespace}/pods?fieldSelector=status.phase%21%3DRunning")
        return len(body["items"])

    async def done(self, namespace: str, n: int) -> bool:
        """The emulator mode's condition: every job's pods exist and its status says so."""
        if await self.count(f"/api/v1/namespaces/{namespace}/pods") < n * WORKERS:
            return False
        jobs = await self.jobs(namespace)
        return len(jobs) >= n and all(reported(j) for j in jobs)

    async def jobs_running(self, namespace: str, n: int) -> bool:
        jobs = await self.jobs(namespace)
        return len(jobs) >= n and all(
            (j.get("status") or {}).get("phase") == "Running"
            and ((j.get("status") or {}).get("workers") or {}).get("ready") == WORKERS
            for j in jobs
        )

    async def pods_running(self, namespace: str, n: int) -> bool:
        pods = await self.count(f"/api/v1/namespaces/{namespace}/pods")
        return pods >= n * WORKERS and await self.pods_not_running(namespace) == 0

    async def running_events(self, namespace: str) -> int:
        selector = f"involvedObject.kind=DGXTrainingJob,reason={RUNNING_REASON}"
        body = await self.get(f"/api/v1/namespaces/{namespace}/events?fieldSelector={selector}")
        return len({(e.get("involvedObject") or {}).get("name") for e in body["items"]})

    async def namespace(self, name: str) -> None:
        status, body = await asyncio.to_thread(
            self.plane.request,
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
        if status != 201:
            raise RuntimeError(f"creating namespace {name}: {status} {body}")

        async def ready() -> bool:
            status, _ = await asyncio.to_thread(
                self.plane.request, "GET", f"/api/v1/namespaces/{name}/serviceaccounts/default"
            )
            return status == 200

        await until(f"the default ServiceAccount of {name}", ready, timeout=60)

    async def delete_namespace(self, name: str, timeout: float) -> None:
        await asyncio.to_thread(self.plane.request, "DELETE", f"/api/v1/namespaces/{name}")

        async def gone() -> bool:
            status, _ = await asyncio.to_thread(self.plane.request, "GET", f"/api/v1/namespaces/{name}")
            return status == 404

        await until(f"namespace {name} (and its pods) gone", gone, timeout=timeout, interval=0.5)

    async def nodes_ready(self, count: int) -> bool:
        nodes = (await self.get("/api/v1/nodes"))["items"]

        def ready(node: dict[str, Any]) -> bool:
            conditions = (node.get("status") or {}).get("conditions") or []
            taints = (node.get("spec") or {}).get("taints") or []
            return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions) and not any(
                t.get("key", "").startswith("node.kubernetes.io/") for t in taints
            )

        return sum(1 for node in nodes if ready(node)) >= count

    async def metrics(self) -> collections.Counter[str]:
        """apiserver_request_total of the write verbs, by "verb resource[/subresource] code"."""
        text = await self.get("/metrics")
        counts: collections.Counter[str] = collections.Counter()
        for line in str(text).splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.rindex("}")]))
            if labels.get("verb") in METRIC_WRITES:
                sub = f"/{labels['subresource']}" if labels.get("subresource") else ""
                counts[f"{labels['verb']} {labels.get('resource')}{sub} {labels.get('code')}"] += int(
                    float(line.rsplit(" ", 1)[1])
                )
        return counts

    async def all_bound(self, namespace: str, count: int) -> bool:
        """``count`` pods in ``namespace``, none without a node (spec.nodeName set: bound)."""
        if await self.count(f"/api/v1/namespaces/{namespace}/pods") < count:
            return False
        unbound = await self.get(f"/api/v1/namespaces/{namespace}/pods?fieldSelector=spec.nodeName%3D&limit=1")
        return not unbound["items"]

    def _scrape_scheduler(self) -> str:
        # The scheduler serves /metrics over TLS with a self-signed certificate, and only to a client
        # the apiserver authenticates and authorizes (delegated: TokenReview, SubjectAccessReview):
        # the admin's client certificate (system:masters) is both.
        ctx = self.plane.pki.client_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        url = f"https://127.0.0.1:{self.plane.ports.scheduler}/metrics"
        with urllib.request.urlopen(url, context=ctx, timeout=60) as resp:
            return str(resp.read().decode())

    async def scheduler_metrics(self) -> dict[str, float]:
        return scheduler_sample(await asyncio.to_thread(self._scrape_scheduler))

    async def bound_after(self, namespace: str, count: int, start: float, interval: float) -> float:
        """Seconds from ``start`` (perf_counter) until the API shows ``count`` pods of ``namespace`` bound."""
        await until(
            f"{count} pods bound in {namespace}",
            lambda: self.all_bound(namespace, count),
            timeout=TIMEOUT,
            interval=interval,
        )
        return time.perf_counter() - start

    def audit_mark(self) -> int:
        return self.audit_path.stat().st_size if self.audit_path.exists() else 0

    def audit_writes(self, since: int, user: str) -> list[dict[str, Any]]:
        """Every write ``user`` made after byte ``since`` of the audit log (whole lines only)."""
        with self.audit_path.open("rb") as f:
            f.seek(since)
            data = f.read()
        events = []
        for raw in data.split(b"\n")[:-1]:  # the last piece is "" or a line still being written
            try:
                event = json.loads(raw)
            except json.JSONDecodeError:
                continue  # a mark taken mid-line
            if (
                event.get("stage") == "ResponseComplete"
                and event.get("verb") in AUDIT_WRITES
                and (event.get("user") or {}).get("username") == user
            ):
                events.append(event)
        return events


#: A sample line of the Prometheus text format: name, {labels} (optional), value.
SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
#: The extension points whose mean time per call BENCH_DETAIL prints
#: (scheduler_framework_extension_point_duration_seconds).
EXTENSION_POINTS = ("PreFilter", "Filter", "PreScore", "Score", "Bind")


def scheduler_sample(text: str) -> dict[str, float]:
    """What the benchmark reads of kube-scheduler's /metrics, summed over profiles (and over results
    for the durations): ``attempts <result>`` (scheduler_schedule_attempts_total; "scheduled" counts
    a pod once its Bind succeeded), ``attempt sum|count`` (scheduler_scheduling_attempt_duration_seconds),
    ``algorithm sum|count`` (scheduler_scheduling_algorithm_duration_seconds) and ``<extension point>
    sum|count`` (scheduler_framework_extension_point_duration_seconds). A series not there yet (no pod
    scheduled so far) reads as 0."""
    out: dict[str, float] = collections.defaultdict(float)
    histograms = {
        "scheduler_scheduling_attempt_duration_seconds": "attempt",
        "scheduler_scheduling_algorithm_duration_seconds": "algorithm",
        "scheduler_framework_extension_point_duration_seconds": None,
    }
    for line in text.splitlines():
        if not line.startswith("scheduler_"):
            continue
        match = SAMPLE.match(line)
        if match is None:
            continue
        name, raw, value = match.group(1), match.group(2) or "", float(match.group(3))
        labels = dict(LABEL.findall(raw))
        if name == "scheduler_schedule_attempts_total":
            out[f"attempts {labels.get('result')}"] += value
            continue
        base, _, part = name.rpartition("_")
        if base == "scheduler_plugin_execution_duration_seconds" and part in ("sum", "count"):
            # Sampled by the scheduler (about 10% of cycles): read as means, never as totals.
            out[f"plugin {labels.get('extension_point')} {labels.get('plugin')} {part}"] += value
            continue
        if part not in ("sum", "count") or base not in histograms:
            continue
        key = histograms[base] or labels.get("extension_point")
        if key:
            out[f"{key} {part}"] += value
    return dict(out)


def metric_delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted(set(after) | set(before))}


def scheduler_detail(delta: dict[str, float]) -> str:
    """Mean milliseconds per scheduling attempt, per algorithm run and per call of the main extension
    points over a run, and its attempts by result."""

    def mean(key: str) -> str:
        count = delta.get(f"{key} count", 0.0)
        return f"{1000 * delta.get(f'{key} sum', 0.0) / count:.2f} ms" if count else "-"

    attempts = ", ".join(f"{k.split(' ', 1)[1]} {v:.0f}" for k, v in delta.items() if k.startswith("attempts ") and v)
    points = ", ".join(f"{p} {mean(p)}" for p in EXTENSION_POINTS)
    algorithm = delta.get("algorithm sum", 0.0)
    most = f" (1 / that: {delta.get('algorithm count', 0.0) / algorithm:.0f} pods/s)" if algorithm > 0 else ""
    plugins = []
    for key, count in sorted(delta.items()):
        if key.startswith("plugin ") and key.endswith(" count") and count:
            _, point, plugin, _ = key.split(" ")
            plugins.append((delta.get(f"plugin {point} {plugin} sum", 0.0), count, f"{point}/{plugin}"))
    everything = sum(total for total, _, _ in plugins) or 1.0
    slowest = ", ".join(
        f"{name} {100 * total / everything:.0f}% ({1e6 * total / count:.1f} us a call)"
        for total, count, name in sorted(plugins, reverse=True)[:8]
    )
    return (
        f"attempts: {attempts or 'none'}; mean attempt {mean('attempt')}, algorithm {mean('algorithm')}{most}; {points}"
        + (f"; plugins by share of their sampled time: {slowest}" if slowest else "")
    )


def plain_pod(worker: dict[str, Any], name: str, namespace: str) -> dict[str, Any]:
    """A pod asking what a kubedgx worker asks of a node and nothing else of kubedgx's: its
    containers' resource requests and limits, the tolerations of the GPU pool's taints, and the node
    it wants said as any pod that wants an 8-GPU H100 node says it (a nodeSelector on GPU Feature
    Discovery's product and count labels, one value each, where the worker's node affinity lists
    every product name of the family); no pod affinity, no spreading, no Service, no kubedgx label,
    no volumes."""
    spec = worker["spec"]
    containers = [
        {"name": c["name"], "image": c["image"], "resources": copy.deepcopy(c.get("resources") or {})}
        for c in spec["containers"]
    ]
    plain: dict[str, Any] = {"containers": containers, "restartPolicy": "Never"}
    if spec.get("tolerations"):
        plain["tolerations"] = copy.deepcopy(spec["tolerations"])
    selector = dict(spec.get("nodeSelector") or {})
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    for expression in terms[0]["matchExpressions"]:
        selector[expression["key"]] = expression["values"][0]
    plain["nodeSelector"] = selector
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"bench": "plain"}},
        "spec": plain,
    }


def hold_split(events: list[dict[str, Any]]) -> tuple[int, int]:
    """(status writes of DGXTrainingJobs, every other write) among audit events."""
    status = sum(
        1
        for e in events
        if status_write((e.get("objectRef") or {}).get("resource"), (e.get("objectRef") or {}).get("subresource"))
    )
    return status, len(events) - status


def audit_breakdown(events: list[dict[str, Any]]) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for e in events:
        ref = e.get("objectRef") or {}
        sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
        counts[f"{e['verb']} {ref.get('resource')}{sub} {(e.get('responseStatus') or {}).get('code')}"] += 1
    return counts


def cross_check(
    audit: collections.Counter[str], before: collections.Counter[str], after: collections.Counter[str]
) -> str:
    """The audit counts by kind next to apiserver_request_total's delta for the same kind (all clients)."""
    verbs = {"create": "POST", "update": "PUT", "patch": "PATCH", "delete": "DELETE"}
    parts = []
    for key, value in sorted(audit.items()):
        verb, rest = key.split(" ", 1)
        metric = f"{verbs.get(verb, verb.upper())} {rest}"
        parts.append(f"{key}: {value} (apiserver_request_total delta, all clients: {after[metric] - before[metric]})")
    return "; ".join(parts)


def event_writes(events: list[dict[str, Any]]) -> int:
    return sum(1 for e in events if (e.get("objectRef") or {}).get("resource") == "events")


async def create_all(
    objects: list[dict[str, Any]], create: Callable[[dict[str, Any]], Awaitable[Any]], parallel: int = 32
) -> list[Any]:
    gate = asyncio.Semaphore(parallel)

    async def one(obj: dict[str, Any]) -> Any:
        async with gate:
            return await create(obj)

    return list(await asyncio.gather(*(one(o) for o in objects)))


@contextlib.asynccontextmanager
async def api_client(kubeconfig: Path) -> Any:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    async with client.ApiClient(configuration) as http:
        yield http


async def cluster_run(
    n: int,
    root: Path,
    hold: float,
    interval: float,
    scheduler_only: bool = False,
    scheduler_runs: tuple[str, ...] = ("workers", "plain"),
) -> dict[str, float]:
    binaries = build_control_plane(out=sys.stderr)
    audit_path = root / "audit.log"
    policy = root / "audit-policy.yaml"
    root.mkdir(parents=True, exist_ok=True)
    policy.write_text(AUDIT_POLICY, encoding="utf-8")
    plane = ScalePlane(
        root,
        binaries,
        pools=(),
        apiserver_args=[
            f"--audit-policy-file={policy}",
            f"--audit-log-path={audit_path}",
            "--audit-log-format=json",
            "--audit-log-maxsize=0",
            "--audit-log-mode=blocking",
        ],
    )
    started = time.monotonic()
    plane.start()
    cluster = Cluster(plane, audit_path)
    try:
        log(f"N={n}: control plane up in {plane.started_in:.1f}s ({root})")
        kubectl = Kubectl(CONTEXT, binary=plane.kubectl_binary, kubeconfig=str(plane.kubeconfig))
        chart = install(kubectl)
        account = service_account(chart)
        user = f"system:serviceaccount:{account[0]}:{account[1]}"
        token = token_kubeconfig(plane, kubectl, root / "operator.kubeconfig", account)
        # The nodes: NodePool's, created concurrently (ControlPlane.add_nodes goes one by one and
        # then reads each node back, which takes minutes at thousands of nodes).
        nodes = dgx_nodes([NodePool(str(JOB["spec"]["instance"]), n * WORKERS)])
        async with api_client(plane.kubeconfig) as admin:
            core = client.CoreV1Api(admin)

            async def create_node(node: Any) -> Any:
                return await core.create_node(node, _preload_content=False)

            await create_all(nodes, create_node)
            await until(
                f"{len(nodes)} nodes Ready and untainted",
                lambda: cluster.nodes_ready(len(nodes)),
                timeout=TIMEOUT,
                interval=max(1.0, len(nodes) / 1000),
            )
            log(f"N={n}: {len(nodes)} nodes Ready after {time.monotonic() - started:.0f}s")
            custom = client.CustomObjectsApi(admin)

            async def create_job(job: dict[str, Any]) -> Any:
                ns = job["metadata"]["namespace"]
                return await custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, job)

            poll = 0.25 + n / 1000  # listing 1,000 jobs is a few MB: poll less often as N grows
            bind_poll = 0.2 + n / 2000  # two requests of one item each
            result: dict[str, float] = {}
            detail = bool(os.environ.get("BENCH_DETAIL"))

            async def nodes_free() -> bool:
                return await cluster.count("/api/v1/pods") == 0

            async def clear(namespace: str) -> None:
                await cluster.delete_namespace(namespace, timeout=TIMEOUT)
                await until("every node free (no pod left in the cluster)", nodes_free, timeout=60)

            async def scheduler_delta(before: dict[str, float]) -> dict[str, float]:
                """The scheduler's metrics since ``before``, once it has counted every pod the API shows
                bound: it counts a pod when the answer to its binding has come back, a little after the
                API shows the pod bound."""
                deadline = time.monotonic() + 30
                while True:
                    delta = metric_delta(await cluster.scheduler_metrics(), before)
                    if delta.get("attempts scheduled", 0.0) >= n * WORKERS or time.monotonic() >= deadline:
                        return delta
                    await asyncio.sleep(0.2)

            async def paused_scheduler(run: str, namespace: str, create: Callable[[], Awaitable[None]]) -> None:
                """A run's pods created while kube-scheduler is stopped, then the scheduler started: from
                its readiness to the last bind it only drains its queue, at its own pace (a fresh process:
                its counters start at 0). pods/s = pods it bound (scheduler_schedule_attempts_total
                {result="scheduled"}) / those seconds."""
                plane.components["kube-scheduler"].stop()
                start = time.perf_counter()
                await create()
                result[f"{run}_created_s"] = time.perf_counter() - start
                # kwok paused too (SIGSTOP: a restarted kwok would wait for its node Leases to expire),
                # until every pod is bound: running the pods as they are bound (status writes, and for
                # the workers the EndpointSlices of their Services) would take the scheduler's CPU on
                # this 2-core machine, more so for the run with Services.
                kwoks = [plane.components[name].process for name in KWOK]
                for process in kwoks:
                    if process is not None:
                        process.send_signal(signal.SIGSTOP)
                try:
                    await asyncio.to_thread(plane._start, "kube-scheduler", plane._ready("kube-scheduler"), 120)
                    ready = time.perf_counter()
                    result[f"{run}_bound_s"] = await cluster.bound_after(namespace, n * WORKERS, ready, bind_poll)
                    delta = await scheduler_delta({})
                finally:
                    for process in kwoks:
                        if process is not None:
                            process.send_signal(signal.SIGCONT)
                scheduled = delta.get("attempts scheduled", 0.0)
                result[f"{run}_pods_s"] = scheduled / result[f"{run}_bound_s"]
                if scheduled != n * WORKERS:
                    log(f"N={n}: the scheduler bound {scheduled:.0f} pods in the {run} run")
                if detail:
                    print(
                        f"  scheduler, {run} run at N={n}: {result[f'{run}_pods_s']:.1f} pods/s ({n * WORKERS} pods "
                        f"created in {result[f'{run}_created_s']:.1f}s with the scheduler stopped, all bound "
                        f"{result[f'{run}_bound_s']:.1f}s after it was ready); {scheduler_detail(delta)}",
                        flush=True,
                    )

            async def baseline_run() -> None:
                """(a) the baseline, as the chart's ServiceAccount."""
                await cluster.namespace(BASELINE_NS)
                bodies = await create_all([job_manifest(i, BASELINE_NS) for i in range(n)], create_job)
                async with api_client(token) as http:
                    sa_core, sa_custom = client.CoreV1Api(http), client.CustomObjectsApi(http)
                    mark, before = cluster.audit_mark(), await cluster.metrics()
                    start = time.perf_counter()
                    await asyncio.gather(*(minimal_writes(sa_core, sa_custom, catalog, b) for b in bodies))
                    await until("baseline done", lambda: cluster.done(BASELINE_NS, n), timeout=TIMEOUT, interval=poll)
                    result["baseline_s"] = time.perf_counter() - start
                    await until(
                        "baseline pods Running",
                        lambda: cluster.pods_running(BASELINE_NS, n),
                        timeout=TIMEOUT,
                        interval=poll,
                    )
                    result["baseline_running_s"] = time.perf_counter() - start
                events = cluster.audit_writes(mark, user)
                result["baseline_writes"] = len(events)
                if detail:
                    after = await cluster.metrics()
                    print(
                        f"  baseline writes at N={n}: {cross_check(audit_breakdown(events), before, after)}", flush=True
                    )
                log(f"N={n}: baseline {result['baseline_s']:.1f}s, Running {result['baseline_running_s']:.1f}s")
                await clear(BASELINE_NS)

            catalog = Catalog.load()
            if not scheduler_only:
                await baseline_run()

            worker_jobs = [job_manifest(i, WORKERS_NS) for i in range(n)]
            if "workers" in scheduler_runs:
                # (d) kubedgx's workers for the scheduler alone: the baseline's objects (each job's Service,
                # ConfigMap and 8 workers from the operator's builders) created with the scheduler stopped
                await cluster.namespace(WORKERS_NS)
                worker_jobs = await create_all([job_manifest(i, WORKERS_NS) for i in range(n)], create_job)
                async with api_client(token) as http:
                    w_core, w_custom = client.CoreV1Api(http), client.CustomObjectsApi(http)

                    async def create_workers() -> None:
                        await asyncio.gather(*(minimal_writes(w_core, w_custom, catalog, b) for b in worker_jobs))

                    await paused_scheduler("workers", WORKERS_NS, create_workers)
                log(f"N={n}: kubedgx workers bound {result['workers_bound_s']:.1f}s after the scheduler was ready")
                if "plain" in scheduler_runs or not scheduler_only:  # a run follows on this cluster
                    await clear(WORKERS_NS)

            if "plain" in scheduler_runs:
                # (c) plain pods: what the workers ask of a node, nothing else; same pause
                await cluster.namespace(PLAIN_NS)
                worker = next(
                    c
                    for c in build_children(DGXTrainingJob.model_validate(worker_jobs[0]), BuildContext(catalog))
                    if c["kind"] == "Pod"
                )
                groups = [[plain_pod(worker, f"plain-{i:04d}-{k}", PLAIN_NS) for k in range(WORKERS)] for i in range(n)]
                async with api_client(token) as http:
                    create_pod: Callable[..., Awaitable[Any]] = client.CoreV1Api(http).create_namespaced_pod

                    async def create_pods(pods: list[dict[str, Any]]) -> None:
                        for pod in pods:
                            await create_pod(PLAIN_NS, pod)

                    async def create_plain() -> None:
                        await asyncio.gather(*(create_pods(g) for g in groups))

                    await paused_scheduler("plain", PLAIN_NS, create_plain)
                log(f"N={n}: plain pods bound {result['plain_bound_s']:.1f}s after the scheduler was ready")
                if not scheduler_only:
                    await clear(PLAIN_NS)

            if scheduler_only:
                return result
            # (b) the operator
            await cluster.namespace(OPERATOR_NS)
            # As the chart runs it: no debug logging (which formats every response body it reads).
            op = start_operator(
                chart, token, root / "operator", extra_args=("--progress-interval", f"{interval:g}s"), verbose=False
            )
            try:
                mark, before = cluster.audit_mark(), await cluster.metrics()
                start = time.perf_counter()
                await create_all([job_manifest(i, OPERATOR_NS) for i in range(n)], create_job)
                await until("operator done", lambda: cluster.done(OPERATOR_NS, n), timeout=TIMEOUT, interval=poll)
                result["operator_s"] = time.perf_counter() - start
                await until(
                    "every job Running 8/8",
                    lambda: cluster.jobs_running(OPERATOR_NS, n),
                    timeout=TIMEOUT,
                    interval=poll,
                )
                result["operator_running_s"] = time.perf_counter() - start

                # kopf posts Events in the background: count once each job's Running Event is there.
                async def posted() -> bool:
                    return await cluster.running_events(OPERATOR_NS) >= n

                await until("every job's Running Event", posted, timeout=TIMEOUT, interval=poll)
                events = cluster.audit_writes(mark, user)
                result["rss_mb"] = rss_mb(op.process.pid)
                result["writes"] = len(events)
                result["writes_no_events"] = len(events) - event_writes(events)
                if detail:
                    after = await cluster.metrics()
                    print(
                        f"  operator writes at N={n}: {cross_check(audit_breakdown(events), before, after)}", flush=True
                    )
                    now = rss_mb(op.process.pid, "VmRSS")
                    print(f"  operator RSS now {now:.0f} MB, peak {result['rss_mb']:.0f} MB", flush=True)
                if hold > 0:
                    # The steady state: every job Running, the operator's writes counted apart.
                    mark, started = cluster.audit_mark(), time.perf_counter()
                    await asyncio.sleep(hold)
                    result["hold_s"] = time.perf_counter() - started
                    if not op.running:
                        raise RuntimeError(f"the operator exited during the hold:\n{op.tail()}")
                    events = cluster.audit_writes(mark, user)
                    status, other = hold_split(events)
                    result["hold_status"], result["hold_other"] = status, other
                    if detail:
                        counts = ", ".join(f"{k}: {v}" for k, v in sorted(audit_breakdown(events).items()))
                        print(f"  operator writes in the {result['hold_s']:.0f}s hold: {counts or 'none'}", flush=True)
                refused = op.forbidden()
                if refused:
                    log(f"N={n}: RBAC refused the operator {len(refused)} times, e.g. {refused[0]}")
            finally:
                op.stop()
            log(f"N={n}: operator {result['operator_s']:.1f}s, Running {result['operator_running_s']:.1f}s")
    except BaseException:
        log(f"N={n}: failed; the components' last log lines:\n{plane.logs(15)}")
        raise
    finally:
        plane.stop()
    return result


async def cluster_main(
    sizes: list[int],
    keep: Path | None,
    hold: float,
    interval: float,
    scheduler_only: bool = False,
    scheduler_runs: tuple[str, ...] = ("workers", "plain"),
) -> None:
    if scheduler_only:
        print(f"{'N':>5} {'nodes':>6} {'workers pods/s':>14} {'plain pods/s':>12} {'sched ratio':>11}", flush=True)
        for n in sizes:
            with tempfile.TemporaryDirectory(prefix=f"kubedgx-bench-{n}-") as tmp:
                root = (keep / f"n{n}") if keep else Path(tmp)
                r = await cluster_run(n, root, 0, interval, scheduler_only=True, scheduler_runs=scheduler_runs)
            workers, plain = r.get("workers_pods_s"), r.get("plain_pods_s")
            ratio = f"{workers / plain:>11.2f}" if workers and plain else f"{'-':>11}"
            print(
                f"{n:>5} {n * WORKERS:>6} {workers or 0:>14.1f} {plain or 0:>12.1f} {ratio}",
                flush=True,
            )
        return
    if hold > 0:
        print(
            f"hold {hold:g}s, progress interval {interval:g}s: at most {hold_bound(hold, interval):.0f} status "
            f"writes per job in the hold",
            flush=True,
        )
    print(
        f"{'N':>5} {'baseline s':>11} {'operator s':>11} {'ratio':>6} {'base Running s':>14} "
        f"{'op Running s':>12} {'ratio':>6} {'workers pods/s':>14} {'plain pods/s':>12} {'sched ratio':>11} "
        f"{'base writes':>11} {'op writes':>9} {'minimum':>8} {'ampl.':>6} {'w/o events':>10} {'peak RSS MB':>11} "
        f"{HOLD_HEADER}",
        flush=True,
    )
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix=f"kubedgx-bench-{n}-") as tmp:
            r = await cluster_run(n, (keep / f"n{n}") if keep else Path(tmp), hold, interval)
        minimum = n * MIN_WRITES_PER_JOB_CLUSTER
        print(
            f"{n:>5} {r['baseline_s']:>11.2f} {r['operator_s']:>11.2f} {r['operator_s'] / r['baseline_s']:>6.2f} "
            f"{r['baseline_running_s']:>14.2f} {r['operator_running_s']:>12.2f} "
            f"{r['operator_running_s'] / r['baseline_running_s']:>6.2f} {r['workers_pods_s']:>14.1f} "
            f"{r['plain_pods_s']:>12.1f} {r['workers_pods_s'] / r['plain_pods_s']:>11.2f} "
            f"{r['baseline_writes']:>11.0f} {r['writes']:>9.0f} {minimum:>8} {r['writes'] / minimum:>6.2f} "
            f"{r['writes_no_events'] / minimum:>10.2f} {r['rss_mb']:>11.1f} {hold_columns(r, n, hold, interval)}",
            flush=True,
        )


#: Steady state: status writes per job-minute in the hold, the bound 60 / interval, other writes.
HOLD_HEADER = f"{'hold status/job-min':>19} {'bound':>6} {'hold other':>10}"


def hold_columns(r: dict[str, float], n: int, hold: float, interval: float) -> str:
    """The hold's cells of a results row (dashes without a hold)."""
    if hold <= 0 or "hold_s" not in r:
        return f"{'-':>19} {'-':>6} {'-':>10}"
    bound = 60 / interval if interval > 0 else 0.0
    return f"{per_job_minute(r['hold_status'], n, r['hold_s']):>19.2f} {bound:>6.2f} {r['hold_other']:>10.0f}"


async def main(sizes: list[int], unrelated: int, hold: float, interval: float) -> None:
    print(f"{unrelated} unrelated pods in {len(UNRELATED_NAMESPACES)} namespaces, the jobs' included", flush=True)
    if hold > 0:
        print(
            f"hold {hold:g}s, progress interval {interval:g}s: at most {hold_bound(hold, interval):.0f} status "
            f"writes per job in the hold",
            flush=True,
        )
    print(
        f"{'N':>5} {'baseline s':>11} {'operator s':>11} {'time ratio':>10} {'writes':>7} {'minimum':>8} "
        f"{'ampl.':>6} {'ampl. w/o events':>16} {'peak RSS MB':>11} {'ready s':>7} {HOLD_HEADER}"
    )
    for n in sizes:
        base = await baseline(n, unrelated)
        op = await operator(n, unrelated, hold, interval)
        minimum = n * MIN_WRITES_PER_JOB
        print(
            f"{n:>5} {base['seconds']:>11.2f} {op['seconds']:>11.2f} {op['seconds'] / base['seconds']:>10.2f} "
            f"{op['writes']:>7.0f} {minimum:>8} {op['writes'] / minimum:>6.2f} "
            f"{op['writes_no_events'] / minimum:>16.2f} {op['rss_mb']:>11.1f} {op['ready']:>7.1f} "
            f"{hold_columns(op, n, hold, interval)}",
            flush=True,
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sizes", nargs="*", type=int, help="values of N (default 1 100 1000; --cluster: 100 1000)")
    parser.add_argument("--cluster", action="store_true", help="on the real control plane of tests/cluster")
    parser.add_argument("--keep", type=Path, help="--cluster: keep each cluster's files (logs, audit log) here")
    parser.add_argument(
        "--unrelated",
        type=int,
        metavar="N",
        help=f"pods without kubedgx labels stored before the runs (default {DEFAULT_UNRELATED}; not with --cluster)",
    )
    parser.add_argument(
        "--hold",
        type=float,
        default=DEFAULT_HOLD,
        metavar="SECONDS",
        help=f"once every job runs, count the operator's writes this long (default {DEFAULT_HOLD:g}; 0: no hold)",
    )
    parser.add_argument(
        "--progress-interval",
        type=float,
        default=DEFAULT_PROGRESS_INTERVAL,
        metavar="SECONDS",
        help=f"the operator's --progress-interval (default {DEFAULT_PROGRESS_INTERVAL:g}, its own default)",
    )
    parser.add_argument(
        "--scheduler-only",
        action="store_true",
        help="--cluster: only the scheduler's two runs (kubedgx's workers, plain pods), not the baseline and operator",
    )
    parser.add_argument(
        "--scheduler-runs",
        default="workers,plain",
        metavar="RUNS",
        help="--scheduler-only: which of its runs, comma-separated (workers,plain)",
    )
    args = parser.parse_args()
    runs = tuple(r for r in args.scheduler_runs.split(",") if r)
    if not runs or set(runs) - {"workers", "plain"}:
        parser.error("--scheduler-runs: workers, plain or both, comma-separated")
    if args.scheduler_only and not args.cluster:
        parser.error("--scheduler-only is for --cluster runs")
    if args.unrelated is not None and args.unrelated < 0:
        parser.error("--unrelated: a number of pods, 0 or more")
    if args.hold < 0 or args.progress_interval < 0:
        parser.error("--hold and --progress-interval: seconds, 0 or more")
    if args.cluster:
        if args.unrelated:
            parser.error("--unrelated is for the emulator runs only")
        asyncio.run(
            cluster_main(
                args.sizes or [100, 1000], args.keep, args.hold, args.progress_interval, args.scheduler_only, runs
            )
        )
    else:
        unrelated = DEFAULT_UNRELATED if args.unrelated is None else args.unrelated
        asyncio.run(main(args.sizes or [1, 100, 1000], unrelated, args.hold, args.progress_interval))
