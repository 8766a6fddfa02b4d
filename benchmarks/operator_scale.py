"""How the operator scales: N jobs of 8 workers created at once, against the in-memory API.

    python benchmarks/operator_scale.py            # N = 1, 100, 1000
    python benchmarks/operator_scale.py 1 100      # chosen sizes

For each N, two runs side by side on fresh emulators (tests/integration/emulator.py):

- baseline: a client that makes exactly the minimum writes for every job — one ConfigMap, one
  Service, 8 pods and one status write — jobs in parallel, each job's writes in sequence;
- operator: `kubedgx operator` in a subprocess (the real CLI, standalone), the N jobs created at
  once, until every job has its 8 pods and a status that says so (workers.active == 8).

Reported: seconds to done for both and their ratio; the operator's peak RSS (VmHWM); its write
amplification = writes it made / minimum writes (N x 11), with and without the Kubernetes Events it
posts. Targets: amplification <= 1.2, time ratio <= 2, RSS < 250 MB at N = 1000.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import os
import socket
import subprocess
import sys
import tempfile
import time
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
from tests.integration.emulator import Emulator  # noqa: E402

NAMESPACE = "bench"
WORKERS = 8
MIN_WRITES_PER_JOB = WORKERS + 3  # pods + Service + ConfigMap + one status write
TIMEOUT = 900.0

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


def job_manifest(i: int) -> dict[str, Any]:
    job = copy.deepcopy(JOB)
    job["metadata"]["name"] = f"job-{i:04d}"
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


def reported(job: Any) -> bool:
    return bool(((job.get("status") or {}).get("workers") or {}).get("active") == WORKERS)


def done(api: Emulator, n: int) -> bool:
    """Every job has its pods and a status that says so. Re-checked after every change, so the
    cheap test (a count) goes first; the emulator holds only this run's objects."""
    return api.count("pods") >= n * WORKERS and api.count("dgxtrainingjobs", NAMESPACE, reported) >= n


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


async def baseline(n: int) -> dict[str, float]:
    catalog = Catalog.load()
    async with Emulator(keep_requests=False) as api, kmock.Server(api):
        api.install_crds(sorted((ROOT / "crds").glob("*.yaml")))
        api.create_namespace(NAMESPACE)
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
                    job = DGXTrainingJob.model_validate(body)
                    for child in build_children(job, BuildContext(catalog)):
                        create = {
                            "ConfigMap": core.create_namespaced_config_map,
                            "Service": core.create_namespaced_service,
                            "Pod": core.create_namespaced_pod,
                        }[child["kind"]]
                        await create(NAMESPACE, child)
                    await custom.patch_namespaced_custom_object_status(
                        "kubedgx.io",
                        "v1alpha1",
                        NAMESPACE,
                        "dgxtrainingjobs",
                        job.metadata.name,
                        {"status": {"phase": "Pending", "workers": {"desired": WORKERS, "active": WORKERS}}},
                        _content_type="application/merge-patch+json",
                    )

                await asyncio.gather(*(one(i) for i in range(n)))
                await api.wait_for(lambda: done(api, n), timeout=TIMEOUT)
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


async def operator(n: int) -> dict[str, float]:
    async with Emulator(keep_requests=False) as api, kmock.Server(api):
        api.install_crds(sorted((ROOT / "crds").glob("*.yaml")))
        api.create_namespace(NAMESPACE)
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "KUBECONFIG": str(kubeconfig(api, Path(tmp)))}
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dgx_operator.cli",
                    "operator",
                    "--standalone",
                    "-n",
                    NAMESPACE,
                    "--liveness",
                    f"http://127.0.0.1:{free_port()}/healthz",
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=open(Path(tmp) / "operator.log", "w"),  # noqa: SIM115
            )
            try:
                # Ready when its watches are open: kopf lists and watches both kinds of child.
                await api.wait_for(lambda: api.open_watches("dgxtrainingjobs") and api.open_watches("pods"), timeout=60)
                mark = len(api.log)
                start = time.perf_counter()
                for i in range(n):
                    api.create("dgxtrainingjobs", job_manifest(i), namespace=NAMESPACE)
                await api.wait_for(lambda: done(api, n), timeout=TIMEOUT)
                elapsed = time.perf_counter() - start
                # kopf posts Events in the background: count the writes once each job's first
                # Event (its WorkersPending transition) has arrived, so none is missed.
                await api.wait_for(lambda: api.count("events", NAMESPACE) >= n, timeout=TIMEOUT)
                total, without_events = writes(api, mark)
                rss = rss_mb(proc.pid)
                if os.environ.get("BENCH_DETAIL"):
                    print(f"  operator writes at N={n}: {breakdown(api, mark)}", flush=True)
                    print(f"  operator RSS now {rss_mb(proc.pid, 'VmRSS'):.0f} MB, peak {rss:.0f} MB", flush=True)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    return {"seconds": elapsed, "writes": total, "writes_no_events": without_events, "rss_mb": rss}


async def main(sizes: list[int]) -> None:
    print(
        f"{'N':>5} {'baseline s':>11} {'operator s':>11} {'time ratio':>10} {'writes':>7} {'minimum':>8} "
        f"{'ampl.':>6} {'ampl. w/o events':>16} {'peak RSS MB':>11}"
    )
    for n in sizes:
        base = await baseline(n)
        op = await operator(n)
        minimum = n * MIN_WRITES_PER_JOB
        print(
            f"{n:>5} {base['seconds']:>11.2f} {op['seconds']:>11.2f} {op['seconds'] / base['seconds']:>10.2f} "
            f"{op['writes']:>7.0f} {minimum:>8} {op['writes'] / minimum:>6.2f} "
            f"{op['writes_no_events'] / minimum:>16.2f} {op['rss_mb']:>11.1f}",
            flush=True,
        )


if __name__ == "__main__":
    asyncio.run(main([int(a) for a in sys.argv[1:]] or [1, 100, 1000]))
