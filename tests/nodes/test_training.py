"""The product on real nodes: the trainer image built from Dockerfile.trainer, run by two kubelets,
watched by the operator (as the chart's ServiceAccount). Each test is a behaviour only a kubelet
running containers shows: torchrun's rendezvous across pods, the order in which a kubelet reports an
exit, the OOM killer, SIGTERM and grace periods, native sidecars, exec and logs.

The module's cluster is tests/nodes/fixtures.py's ``trainer``; ``ns`` is tests/e2e's namespace per
test (deleted after, the job's finalizer released by the operator).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.jobs import (
    QUICKSTART_STEPS,
    QUICKSTART_TIMEOUT,
    TRAINER_CPU,
    TRAINER_MEMORY,
    PhaseWatch,
    command_job,
    condition_true,
    get_job,
    interactive_trainer_job,
    phase_is,
    quickstart_job,
    running_with,
    wait_gone,
    wait_job,
    worker_pods,
)
from tests.e2e.kubectl import JOBS, Kubectl, condition, dig, wait_for
from tests.nodes.fixtures import TrainerCluster
from tests.s3 import REGION, S3, secret

pytestmark = [pytest.mark.timeout(QUICKSTART_TIMEOUT + 300)]
#: Steps of the data-mount job: long enough (seconds on a core) for the sidecar, looking every
#: second (fixtures.chart_values), to stream a checkpoint while it trains.
STREAMED_STEPS = 40


def trainer_status(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in dig(pod, "status", "containerStatuses", default=[]) if c["name"] == "trainer")


def termination_message(pod: dict[str, Any]) -> dict[str, Any]:
    text = dig(trainer_status(pod), "state", "terminated", "message", default="") or ""
    found: dict[str, Any] = json.loads(text)
    return found


def no_warnings(ns: Kubectl, job: str) -> list[tuple[str, str]]:
    return [
        (str(e.get("reason")), str(e.get("message")))
        for e in ns.events_for("DGXTrainingJob", job)
        if e.get("type") == "Warning"
    ]


def columns(ns: Kubectl, job: str, *args: str) -> dict[str, str]:
    """`kubectl get dgxjob JOB` as the user reads it: each column's value under its header (values
    such as MESSAGE hold spaces, so the header's positions cut the row, not whitespace)."""
    header, row = ns.run("get", JOBS, job, *args).stdout.splitlines()[:2]
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    ends = [*starts[1:], None]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


# -- training ----------------------------------------------------------------------------------------


def test_two_node_quickstart_meets_through_per_pod_dns_and_succeeds(ns: Kubectl, trainer: TrainerCluster) -> None:
    """torchrun's c10d rendezvous at worker 0's per-pod DNS name (the headless Service, CoreDNS),
    world size 2, one worker per node; Pending/Running/Succeeded and nothing else in between."""
    job = quickstart_job("qs2")
    job["spec"]["elastic"] = {"minNodes": 2, "maxNodes": 2, "nprocPerNode": 1}
    with PhaseWatch(ns, "qs2") as watch:
        ns.apply(job)
        wait_job(ns, "qs2", "both workers running", running_with(2), timeout=300)
        running = {dig(p, "metadata", "name"): p for p in worker_pods(ns, "qs2")}
        wait_job(ns, "qs2", "phase Succeeded", phase_is("Succeeded"), timeout=QUICKSTART_TIMEOUT, fail_on=("Failed",))
    assert [p for p in watch.phases if p not in ("Pending", "Running")] == ["Succeeded"], watch.phases
    assert no_warnings(ns, "qs2") == []

    assert sorted(running) == ["qs2-worker-0", "qs2-worker-1"], sorted(running)
    assert {dig(p, "spec", "nodeName") for p in running.values()} == {n.name for n in trainer.nodes.nodes}
    env = {e["name"]: e.get("value") for e in dig(running["qs2-worker-1"], "spec", "containers", 0, "env")}
    assert env["PET_RDZV_ENDPOINT"].startswith(f"qs2-worker-0.qs2.{ns.namespace}.svc"), env["PET_RDZV_ENDPOINT"]
    done = get_job(ns, "qs2")
    assert dig(done, "status", "progress", "step") == QUICKSTART_STEPS, done["status"]
    assert dig(done, "status", "restarts", default=0) == 0, done["status"]
    pods = {dig(p, "metadata", "name"): p for p in worker_pods(ns, "qs2")}
    # Worker 0's exit 0 ends the job (docs/operator.md): it is kept, its logs readable. Worker 1
    # is kept where it had exited too (0, as Kubeflow's default cleanPodPolicy keeps finished
    # pods), and deleted where it was still ending its torchrun agent (a loaded machine).
    assert "qs2-worker-0" in pods, sorted(pods)
    assert set(pods) <= {"qs2-worker-0", "qs2-worker-1"}, sorted(pods)
    for name, pod in pods.items():
        assert dig(trainer_status(pod), "state", "terminated", "exitCode") == 0, (name, pod["status"])
    summary = termination_message(pods["qs2-worker-0"])["summary"]
    assert summary["worldSize"] == 2, summary
    assert summary["step"] == QUICKSTART_STEPS, summary
    assert summary["adapter"], summary
    # `kubectl logs` shows the trainer's progress lines.
    log = ns.logs("qs2-worker-0", container="trainer", tail=400)
    # Rank 0 runs in worker 0: rendezvous sorts the agents by their FQDN, and rank 0 publishes its own
    # as the address the others connect to, the one name the headless Service (worker 0 alone) makes
    # resolvable (render.headless_service). With pod IPs there, rank 0 could be any worker.
    ranks = set(re.findall(r"\[rank (\d+)\] dgx_trainer", log))
    assert ranks == {"0"}, (ranks, log[-3000:])
    assert f'"step": {QUICKSTART_STEPS}' in log or f"step={QUICKSTART_STEPS}" in log, log[-3000:]


def test_a_one_gpu_quickstart_trains_beside_another_job_on_one_node(ns: Kubectl, trainer: TrainerCluster) -> None:
    """Issue 32 on real kubelets: the quickstart as a 1-GPU job (dgxh100.80g.1.norm) and a 4-GPU job
    share one of the fake 8-GPU DGX nodes: the kubelet admits both against the node's nvidia.com/gpu
    and CPU, and the quickstart trains to the end while its neighbour runs. Both are pinned to one node
    (the other node would do for either); each asks one of the node's two cores."""
    node = trainer.nodes.nodes[0].name
    pin = {"kubernetes.io/hostname": node}
    neighbour = command_job("neighbour")
    neighbour["spec"]["instance"] = "dgxh100.80g.4.norm"
    neighbour["spec"]["resources"] = {"cpu": "500m", "memory": "256Mi", "shm": "64Mi"}
    neighbour["spec"]["nodeSelector"] = pin
    ns.apply(neighbour)
    wait_job(ns, "neighbour", "the 4-GPU neighbour running", running_with(1), timeout=300)
    job = quickstart_job("qs1")
    job["spec"]["instance"] = "dgxh100.80g.1.norm"
    job["spec"]["resources"] = {"cpu": "1", "memory": job["spec"]["resources"]["memory"], "shm": "1Gi"}
    job["spec"]["nodeSelector"] = pin
    ns.apply(job)
    wait_job(ns, "qs1", "phase Succeeded", phase_is("Succeeded"), timeout=QUICKSTART_TIMEOUT, fail_on=("Failed",))
    (trained,) = worker_pods(ns, "qs1")
    (beside,) = worker_pods(ns, "neighbour")
    assert dig(trained, "spec", "nodeName") == dig(beside, "spec", "nodeName") == node
    limits = {p["metadata"]["name"]: dig(p, "spec", "containers", 0, "resources", "limits") for p in (trained, beside)}
    assert limits["qs1-worker-0"]["nvidia.com/gpu"] == "1", limits
    assert limits["neighbour-worker-0"]["nvidia.com/gpu"] == "4", limits
    # The neighbour ran the whole time: still the first attempt, still running.
    assert dig(beside, "status", "phase") == "Running", beside["status"]
    assert dig(get_job(ns, "neighbour"), "status", "restarts", default=0) == 0
    summary = termination_message(trained)["summary"]
    assert summary["step"] == QUICKSTART_STEPS, summary


def test_over_its_memory_limit_a_worker_is_oomkilled_and_the_job_says_out_of_memory(
    ns: Kubectl, trainer: TrainerCluster
) -> None:
    """The kernel's OOM killer, not a fake status: exit 137, reason OOMKilled. The same program on
    the same memory is killed again, so OnFailure does not retry it: the job fails at once with
    reason OutOfMemory and the field to change (docs/operator.md, "Failures, diagnosed")."""
    job = command_job("oom", script="python -c 'b = bytearray(1024 * 2**20); print(len(b))'")
    job["spec"]["resources"] = {"cpu": "500m", "memory": "192Mi", "shm": "16Mi"}
    job["spec"]["backoffLimit"] = 3
    ns.apply(job)
    failed = wait_job(ns, "oom", "phase Failed", phase_is("Failed"), timeout=300, fail_on=("Succeeded",))
    cond = condition(failed, "Failed")
    assert cond is not None, failed["status"]
    assert cond["reason"] == "OutOfMemory", failed["status"]
    assert (
        "exited with code 137 (OOMKilled): OutOfMemory: the container went over its host memory limit"
        in (cond["message"])
    ), cond
    assert "raise spec.resources.memory (now 192Mi)" in cond["message"], cond
    assert dig(failed, "status", "restarts", default=0) == 0, failed["status"]
    warnings = no_warnings(ns, "oom")
    assert [reason for reason, _ in warnings] == ["OutOfMemory"], warnings
    assert columns(ns, "oom")["REASON"] == "OutOfMemory"


#: What PyTorch's NCCL watchdog prints when a collective times out (ProcessGroupNCCL.cpp's format),
#: then what the process does: abort, SIGABRT. Under torchrun, whose summary follows in the log.
WATCHDOG_PROGRAM = r"""
cat > /tmp/hang.py <<'PY'
import os, sys
print(
    "[rank0]:[E1204 10:12:01.123456 88 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:632] [Rank 0] "
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1801, OpType=ALLREDUCE, NumelIn=8650752, "
    "NumelOut=8650752, Timeout(ms)=600000) ran for 600094 milliseconds before timing out.",
    file=sys.stderr,
    flush=True,
)
print("terminate called after throwing an instance of 'c10::DistBackendError'", file=sys.stderr, flush=True)
os.abort()
PY
exec torchrun --standalone --nnodes 1 --nproc-per-node 1 /tmp/hang.py
"""


def test_a_programs_nccl_watchdog_abort_is_named_nccl_timeout(ns: Kubectl, trainer: TrainerCluster) -> None:
    """A spec.command program under torchrun whose NCCL watchdog fires: the rank aborts (SIGABRT),
    torchrun exits 1 and prints its summary; the kubelet keeps the log's tail as the termination
    message, and the job names NCCLTimeout with the rank and the operation, not torchrun's banner."""
    job = command_job("nccl", script=WATCHDOG_PROGRAM)
    job["spec"]["restartPolicy"] = "Never"
    job["spec"]["resources"] = {"cpu": "1", "memory": "1Gi", "shm": "64Mi"}  # torchrun imports torch
    ns.apply(job)
    failed = wait_job(ns, "nccl", "phase Failed", phase_is("Failed"), timeout=300, fail_on=("Succeeded",))
    cond = condition(failed, "Failed")
    assert cond is not None, failed["status"]
    assert cond["reason"] == "NCCLTimeout", failed["status"]
    assert (
        "NCCLTimeout: rank 0: a collective ALLREDUCE did not complete in 600 s (timeout 600 s)" in (cond["message"])
    ), cond
    assert cond["message"].endswith("restartPolicy is Never"), cond


#: A spec.command program that reports progress by the contract (docs/trainer.md) at its own pace
#: until the test lets it finish (a file it creates through `kubectl exec`).
REPORTER = r"""
i=0
while [ ! -e /tmp/finish ]; do
  i=$((i + 1))
  echo "{\"event\": \"progress\", \"step\": $i, \"totalSteps\": 1000, \"loss\": 2.5}"
  sleep 1
done
echo done
"""


def test_progress_shows_in_kubectl_get_while_the_job_runs(ns: Kubectl, trainer: TrainerCluster) -> None:
    """Live progress through the real apiserver and kubelet: the operator reads worker 0's log
    (pods/log, the kubelet serving it) and `kubectl get -o wide` shows the step and loss while the
    job is still Running (the chart's progressInterval is 2 s here)."""
    ns.apply(command_job("live", script=REPORTER))
    running = wait_job(
        ns,
        "live",
        "a step in status.progress while Running",
        lambda j: dig(j, "status", "phase") == "Running" and (dig(j, "status", "progress", "step") or 0) >= 2,
        timeout=300,
    )
    assert dig(running, "status", "progress", "totalSteps") == 1000, running["status"]
    assert dig(running, "status", "progress", "updatedAt"), running["status"]  # stamped when first read
    shown = columns(ns, "live", "-o", "wide")
    assert shown["PHASE"] == "Running", shown
    assert int(shown["STEP"]) >= 2, shown
    assert shown["LOSS"] == "2.5", shown
    ns.run("exec", "live-worker-0", "-c", "trainer", "--", "touch", "/tmp/finish")
    wait_job(ns, "live", "phase Succeeded", phase_is("Succeeded"), timeout=300, fail_on=("Failed",))


def test_interactive_worker_takes_exec_and_trains_by_hand(ns: Kubectl, trainer: TrainerCluster) -> None:
    """debug.interactive: the worker idles with the job's environment; `kubectl exec` runs the
    trainer's own launch in it, and `kubectl logs` shows the idle line."""
    job = interactive_trainer_job("debug")
    job["spec"]["resources"] = {"cpu": TRAINER_CPU, "memory": TRAINER_MEMORY, "shm": "1Gi"}
    job["spec"]["trainer"]["training"]["maxSteps"] = 4
    ns.apply(job)
    wait_job(ns, "debug", "one worker running", running_with(1), timeout=300)
    pod = "debug-worker-0"
    wait_for(
        "the idle worker's log line",
        lambda: "interactive debug worker, idle" in ns.logs(pod, container="trainer"),
        timeout=60,
    )
    ran = ns.run(
        "exec", pod, "-c", "trainer", "--", "python", "-m", "dgx_trainer", "launch", "--config",
        "/etc/kubedgx/trainer.yaml", timeout=600, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, _failure(ran.stdout + ran.stderr)
    assert '"status": "Succeeded"' in ran.stdout + ran.stderr, (ran.stdout + ran.stderr)[-4000:]
    still = get_job(ns, "debug")
    assert dig(still, "status", "phase") == "Running", still["status"]


def _failure(output: str) -> str:
    """Where a trainer's output says why it died (a crash's first lines, a traceback), and its end."""
    for marker in ("Fatal Python error", "Traceback (most recent call last)"):
        at = output.find(marker)
        if at >= 0:
            return output[at : at + 4000] + "\n...\n" + output[-1500:]
    return output[-4000:]


# -- data mounts -------------------------------------------------------------------------------------


class GatedMoto:
    """WSGI middleware in front of moto: holds the PUTs whose path contains ``pattern`` until
    :meth:`release` (an upload kept in flight on purpose); ``held`` is set once one waits.
    ``puts`` records (path, wall-clock time answered) of every PUT."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.pattern: str | None = None
        self.held = threading.Event()
        self._open = threading.Event()
        self.puts: list[tuple[str, float]] = []

    def gate(self, pattern: str) -> None:
        self.pattern = pattern
        self.held.clear()
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if self.pattern and environ["REQUEST_METHOD"] == "PUT" and self.pattern in environ.get("PATH_INFO", ""):
            self.held.set()
            self._open.wait(timeout=600)
        answer = self.app(environ, start_response)
        if environ["REQUEST_METHOD"] == "PUT":
            self.puts.append((environ.get("PATH_INFO", ""), time.time()))
        return answer


@pytest.fixture(scope="module")
def store(trainer: TrainerCluster) -> Iterator[S3]:
    """moto's S3 on the pods' bridge (its gateway address): the sync containers reach it there."""
    network = trainer.nodes.network
    assert network is not None
    server = S3(wrap=GatedMoto, host=network.gateway)
    try:
        yield server
    finally:
        server.app.release()
        server.stop()


def mounts(ns: Kubectl, s3: S3, *, data: dict[str, bytes] | None) -> tuple[str, str]:
    """An Out mount (checkpoints streamed, the model archived) and, with ``data``, an In mount of
    those objects, both on ``s3``, with the Secret they name; returns (in bucket, out bucket)."""
    ns.apply(secret("store", namespace=str(ns.namespace)))
    out_bucket = s3.bucket("out")
    manifests: list[dict[str, Any]] = [
        mount("outputs", f"s3://{out_bucket}/runs", "Out", s3, syncCheckpoints=True, archive={"prefix": "final"})
    ]
    in_bucket = ""
    if data is not None:
        in_bucket = s3.bucket("in", data)
        manifests.append(mount("corpus", f"s3://{in_bucket}/train", "In", s3))
    ns.apply(*manifests)
    for m in manifests:
        name = m["metadata"]["name"]
        wait_for(
            f"DGXDataMount {name} Ready",
            lambda name=name: dig(ns.get("dgxdatamount", name), "status", "phase") == "Ready",
            timeout=120,
        )
    return in_bucket, out_bucket


def mount(name: str, source: str, direction: str, s3: S3, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubedgx.io/v1alpha1",
        "kind": "DGXDataMount",
        "metadata": {"name": name},
        "spec": {
            "source": source,
            "direction": direction,
            "endpoint": s3.endpoint,
            "region": REGION,
            "credentialsSecretRef": {"name": "store"},
            **extra,
        },
    }


def test_data_in_and_out_through_the_sync_containers(ns: Kubectl, trainer: TrainerCluster, store: S3) -> None:
    """The In mount pulled by the init container into the node's cache (the dataset the trainer
    reads, written as the trainer's user), checkpoints streamed out by the sidecar while training
    runs, the adapter archived after, and status.artifacts naming what landed."""
    data = (Path(__file__).resolve().parents[2] / "examples" / "data" / "instructions.jsonl").read_bytes()
    _, out_bucket = mounts(ns, store, data={"train/instructions.jsonl": data})
    job = quickstart_job("mounted", steps=STREAMED_STEPS)
    spec = job["spec"]
    spec["dataMounts"] = [{"name": "corpus", "mountPath": "/data/corpus"}, {"name": "outputs", "mountPath": "/output"}]
    spec["trainer"]["dataset"]["path"] = "/data/corpus/instructions.jsonl"
    spec["trainer"]["training"]["saveSteps"] = STREAMED_STEPS // 4
    spec["trainer"]["output"] = {"dir": "/output/run"}
    # The checkpoint sidecar's 1 CPU runs beside the trainer: 1 + 1 is all a node of 2 cores has.
    spec["resources"]["cpu"] = "1"
    ns.apply(job)
    uid8 = dig(get_job(ns, "mounted"), "metadata", "uid")[:8]
    prefix = f"runs/mounted-{uid8}/checkpoints"
    done = wait_job(ns, "mounted", "phase Succeeded", phase_is("Succeeded"), timeout=QUICKSTART_TIMEOUT)
    done = wait_job(
        ns, "mounted", "status.artifacts", lambda j: bool(dig(j, "status", "artifacts")), timeout=300, fail_on=()
    )
    assert condition_true(done, "Archived"), done["status"]
    keys = store.keys(out_bucket)
    streamed = [k for k in keys if k.startswith(prefix) and k.endswith("/kubedgx-complete.json")]
    assert streamed, keys
    # Streamed while training ran: the first marker was stored before the second in which the
    # trainer exited (the kubelet's finishedAt, whole seconds: compared with its second).
    gate: GatedMoto = store.app
    landed = min(t for path, t in gate.puts if f"{prefix}/" in path and path.endswith("/kubedgx-complete.json"))
    (worker,) = worker_pods(ns, "mounted")
    finished = dig(trainer_status(worker), "state", "terminated", "finishedAt")
    finished_at = datetime.fromisoformat(finished.replace("Z", "+00:00")).timestamp()
    assert landed < finished_at, (landed, finished, sorted(gate.puts))
    assert f"runs/final/mounted-{uid8}/adapter/adapter_config.json" in keys, keys
    assert f"runs/final/mounted-{uid8}/summary.json" in keys, keys
    uris = {a["uri"] for a in done["status"]["artifacts"]}
    assert any(u.startswith(f"s3://{out_bucket}/runs/final/mounted-{uid8}/adapter") for u in uris), uris
    assert no_warnings(ns, "mounted") == []


#: Steps of the reclaimed job: far more than it trains before the test ends it (it is deleted once
#: the replacement has resumed), so the SIGTERM always lands mid-run.
RECLAIM_STEPS = 100000


def test_a_reclaimed_worker_checkpoints_on_sigterm_and_resumes_on_the_other_node(
    ns: Kubectl, trainer: TrainerCluster, store: S3
) -> None:
    """A spot reclaim as the kubelet carries it out: the worker's pod is deleted (SIGTERM, its grace
    period) while the trainer is between two saves. The trainer saves a checkpoint at the step it
    is on and exits; the checkpoint sidecar, stopped after it, uploads that checkpoint; the operator
    replaces the lost worker (not counted) on the other node (this one is cordoned, as a reclaimed
    node goes away), whose Out mount restores the upload, and training resumes from that step."""
    data = (Path(__file__).resolve().parents[2] / "examples" / "data" / "instructions.jsonl").read_bytes()
    _, out_bucket = mounts(ns, store, data={"train/instructions.jsonl": data})
    job = quickstart_job("reclaim", steps=RECLAIM_STEPS)
    spec = job["spec"]
    spec["dataMounts"] = [{"name": "corpus", "mountPath": "/data/corpus"}, {"name": "outputs", "mountPath": "/output"}]
    spec["trainer"]["dataset"]["path"] = "/data/corpus/instructions.jsonl"
    spec["trainer"]["training"]["saveSteps"] = RECLAIM_STEPS  # no regular save before the reclaim
    spec["trainer"]["training"]["loggingSteps"] = 2
    spec["trainer"]["output"] = {"dir": "/output/run"}
    spec["resources"]["cpu"] = "1"  # the checkpoint sidecar's 1 CPU beside it: all a node of 2 cores has
    ns.apply(job)
    uid8 = dig(get_job(ns, "reclaim"), "metadata", "uid")[:8]
    prefix = f"runs/reclaim-{uid8}/checkpoints"
    wait_job(
        ns,
        "reclaim",
        "step 4 in status.progress",
        lambda j: dig(j, "status", "phase") == "Running" and (dig(j, "status", "progress", "step") or 0) >= 4,
        timeout=QUICKSTART_TIMEOUT,
    )
    (first,) = worker_pods(ns, "reclaim")
    node = dig(first, "spec", "nodeName")
    ns.run("cordon", node)
    try:
        ns.run("delete", "pod", "reclaim-worker-0", "--wait=false")
        wait_for(
            "the replacement worker running on the other node",
            lambda: any(
                dig(p, "spec", "nodeName") not in (None, node) and dig(p, "status", "phase") == "Running"
                for p in worker_pods(ns, "reclaim")
            ),
            timeout=600,
        )
        markers = [k for k in store.keys(out_bucket) if k.startswith(prefix) and k.endswith("/kubedgx-complete.json")]
        assert len(markers) == 1, markers  # the SIGTERM checkpoint, and only it
        step = int(markers[0].split("/checkpoint-")[1].split("/")[0])
        assert 4 <= step < RECLAIM_STEPS, markers
        (replacement,) = [p for p in worker_pods(ns, "reclaim") if dig(p, "spec", "nodeName") != node]
        name = dig(replacement, "metadata", "name")
        wait_for(
            f"{name} resuming at step {step}",
            lambda: f"resume at step {step}," in ns.logs(name, container="trainer", tail=400),
            timeout=QUICKSTART_TIMEOUT,
        )
        wait_job(
            ns,
            "reclaim",
            f"progress beyond step {step} after the resume",
            lambda j: (dig(j, "status", "progress", "step") or 0) > step,
            timeout=QUICKSTART_TIMEOUT,
        )
    finally:
        ns.run("uncordon", node)
    still = get_job(ns, "reclaim")
    assert dig(still, "status", "restarts", default=0) == 0, still["status"]
    reasons = [e.get("reason") for e in ns.events_for("DGXTrainingJob", "reclaim")]
    assert "WorkerLost" in reasons, reasons
    ns.delete(JOBS, "reclaim")


CHECKPOINTS = r"""
set -e
out=/output
write() {
  mkdir -p "$out/checkpoint-$1"
  head -c "$2" /dev/zero > "$out/checkpoint-$1/weights.bin"
  echo '{}' > "$out/checkpoint-$1/kubedgx-complete.json"
}
write 1 1024
write 2 8388608
trap 'touch "$out/sigterm-received"; exit 0' TERM
echo ready
while true; do sleep 1; done
"""


def test_deleting_a_running_job_lets_the_upload_in_flight_finish(
    ns: Kubectl, trainer: TrainerCluster, store: S3
) -> None:
    """`kubectl delete` of a running job: the trainer gets SIGTERM (and exits in its grace period),
    then the checkpoint sidecar does; the upload it had in flight finishes, marker included; the
    finalizer goes, and no pod or container of the job is left on the nodes."""
    _, out_bucket = mounts(ns, store, data=None)
    gate: GatedMoto = store.app
    gate.gate("/checkpoint-2/weights.bin")
    job = command_job("deleted", script=CHECKPOINTS)
    job["spec"]["dataMounts"] = [{"name": "outputs", "mountPath": "/output"}]
    try:
        ns.apply(job)
        wait_job(ns, "deleted", "one worker running", running_with(1), timeout=300)
        assert gate.held.wait(timeout=120), "the sidecar never started uploading checkpoint-2"
        uid8 = dig(get_job(ns, "deleted"), "metadata", "uid")[:8]
        prefix = f"runs/deleted-{uid8}/checkpoints"
        assert f"{prefix}/checkpoint-1/kubedgx-complete.json" in store.keys(out_bucket)
        ns.run("delete", JOBS, "deleted", "--wait=false")
        wait_for(
            "the checkpoint sidecar to get SIGTERM",
            lambda: "SIGTERM: finishing the upload in flight" in ns.logs("deleted-worker-0", container="checkpoints-0"),
            timeout=120,
        )
    finally:
        gate.release()
    wait_gone(ns, JOBS, "deleted", timeout=300)
    wait_gone(ns, "pod", "deleted-worker-0", timeout=300)
    assert f"{prefix}/checkpoint-2/kubedgx-complete.json" in store.keys(out_bucket)
    assert f"{prefix}/checkpoint-2/weights.bin" in store.keys(out_bucket)
    # The trainer's trap ran: SIGTERM, not SIGKILL, within its grace period.
    assert (trainer.cache_root / str(ns.namespace) / "outputs" / f"deleted-{uid8}" / "sigterm-received").exists()
    for node in trainer.nodes.nodes:
        wait_for(
            f"no container of {ns.namespace} on {node.name}",
            lambda node=node: ns.namespace not in _pod_namespaces(node),
            timeout=120,
        )


def _pod_namespaces(node: Any) -> list[str]:
    """The pod namespace label of every container containerd still has."""
    out = []
    for container in node.ctr("containers", "ls", "-q").stdout.split():
        try:
            info = json.loads(node.ctr("containers", "info", container).stdout or "{}")
        except subprocess.CalledProcessError:
            continue  # removed since the listing
        out.append(str((info.get("Labels") or {}).get("io.kubernetes.pod.namespace", "")))
    return out


# -- the user's verbs (issue 33) ---------------------------------------------------------------------


def kubedgx(k: Kubectl, *argv: str) -> tuple[int, str, str]:
    """``kubedgx ARGV`` in this process, with the test's kubeconfig, context and namespace."""
    from dgx_operator.cli.main import main

    assert k.kubeconfig
    assert k.namespace
    out, err = io.StringIO(), io.StringIO()
    code = main([*argv, "--kubeconfig", k.kubeconfig, "--context", k.context, "-n", k.namespace], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


class Following:
    """``kubedgx logs -f ARGV`` in a thread, started before the job's pods exist."""

    def __init__(self, k: Kubectl, *argv: str) -> None:
        self.result: list[tuple[int, str, str]] = []
        self.thread = threading.Thread(target=lambda: self.result.append(kubedgx(k, "logs", "-f", *argv)), daemon=True)
        self.thread.start()

    def done(self, timeout: float = 180) -> tuple[int, str, str]:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"kubedgx logs -f did not end {timeout:g} s after the job"
        return self.result[0]


def submit(k: Kubectl, tmp_path: Path, job: dict[str, Any]) -> None:
    path = tmp_path / f"{job['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False), encoding="utf-8")
    code, out, err = kubedgx(k, "submit", str(path))
    assert code == 0, err
    assert out.strip() == f"dgxtrainingjob/{job['metadata']['name']} created", out


def scalars(logdir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of ``tag`` in every TensorBoard event file under ``logdir``, read by TensorBoard."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: list[tuple[int, float]] = []
    for events in sorted(logdir.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events))
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            found += [(s.step, s.value) for s in acc.Scalars(tag)]
    return sorted(found)


def on_path(k: Kubectl) -> str:
    """PATH with the control plane's kubectl first (`kubedgx tensorboard` runs `kubectl exec`)."""
    return f"{Path(k.binary).parent}{os.pathsep}{os.environ.get('PATH', '')}"


#: A two-worker spec.command job: rank 0 reports progress by the contract and writes TensorBoard
#: event files where a trainer writes them (<output.dir>/runs), every second, until the test lets it
#: finish (a file it creates through `kubectl exec`); then one last report (loss 0.5) and a line.
#: Rank 1 says who it is and idles.
LIVE = r"""
if [ "$KUBEDGX_REPLICA_INDEX" != 0 ]; then
  echo "live: rank $KUBEDGX_REPLICA_INDEX idles"
  trap 'exit 0' TERM
  sleep 3600 & wait
  exit 0
fi
exec python - <<'PY'
import json, os, time
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

writer = EventFileWriter("/workspace/output/runs/live")


def report(step, loss):
    print(json.dumps({"event": "progress", "step": step, "totalSteps": 1000, "loss": loss}), flush=True)
    value = summary_pb2.Summary.Value(tag="train/loss", simple_value=loss)
    writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=[value])))
    writer.flush()


print("live: rank 0 starts", flush=True)
step = 0
while not os.path.exists("/tmp/finish"):
    step += 1
    report(step, round(3 - step / 100, 4))
    time.sleep(1)
report(step + 1, 0.5)
print("live: done", flush=True)
PY
"""


def test_logs_and_tensorboard_follow_a_running_job(
    ns: Kubectl, trainer: TrainerCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kubedgx logs` on a running two-worker job through the kubelets' pods/log: worker 0's output
    with its progress lines made readable, `--raw` as written, `--all` each line with its rank;
    `-f`, started right after `kubedgx submit`, follows until the job ends and has the last report.
    `kubedgx tensorboard --no-serve` copies the running worker's event files out (kubectl exec tar)."""
    job = command_job("live", min_nodes=2, max_nodes=2, script=LIVE)
    job["spec"]["resources"] = {"cpu": "250m", "memory": "512Mi", "shm": "64Mi"}  # python and tensorboard
    submit(ns, tmp_path, job)
    following = Following(ns, "live")
    wait_job(
        ns,
        "live",
        "two workers running and step 3 in status.progress",
        lambda j: running_with(2)(j) and (dig(j, "status", "progress", "step") or 0) >= 3,
        timeout=300,
    )

    code, out, err = kubedgx(ns, "logs", "live")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "live: rank 0 starts", lines
    assert lines[1:4] == [
        "step 1/1000 (0%)  loss 2.9900",
        "step 2/1000 (0%)  loss 2.9800",
        "step 3/1000 (0%)  loss 2.9700",
    ]
    assert not [line for line in lines if line.startswith("{")], lines
    code, out, err = kubedgx(ns, "logs", "live", "--raw")
    assert code == 0, err
    raw = out.splitlines()
    assert raw[1] == '{"event": "progress", "step": 1, "totalSteps": 1000, "loss": 2.99}', raw
    code, out, err = kubedgx(ns, "logs", "live", "--all")
    assert code == 0, err
    ranked = out.splitlines()
    assert "[rank 0] live: rank 0 starts" in ranked, ranked
    assert "[rank 0] step 1/1000 (0%)  loss 2.9900" in ranked, ranked
    assert "[rank 1] live: rank 1 idles" in ranked, ranked
    assert all(line.startswith(("[rank 0] ", "[rank 1] ")) for line in ranked), ranked
    code, out, err = kubedgx(ns, "logs", "live", "--rank", "1")
    assert (code, out) == (0, "live: rank 1 idles\n"), (code, out, err)

    # TensorBoard's event files, copied out of the running worker 0.
    monkeypatch.setenv("PATH", on_path(ns))
    logdir = tmp_path / "tb-live"
    code, out, err = kubedgx(ns, "tensorboard", "live", "--no-serve", "--logdir", str(logdir))
    assert code == 0, err
    assert out.strip() == str(logdir)
    assert f"live's TensorBoard logs from pod live-worker-0 in {logdir}" in err, err
    copied = scalars(logdir / "runs", "train/loss")
    assert len(copied) >= 3, copied
    assert [(step, round(value, 4)) for step, value in copied[:3]] == [(1, 2.99), (2, 2.98), (3, 2.97)], copied

    ns.run("exec", "live-worker-0", "-c", "trainer", "--", "touch", "/tmp/finish")
    wait_job(ns, "live", "phase Succeeded", phase_is("Succeeded"), timeout=300, fail_on=("Failed",))
    code, out, err = following.done()
    assert code == 0, err
    followed = out.splitlines()
    assert followed[0] == "live: rank 0 starts", followed
    assert followed[-1] == "live: done", followed
    last = followed[-2]
    assert re.fullmatch(r"step \d+/1000 \(\d+%\)  loss 0\.5000", last), followed[-5:]
    steps = [int(m.group(1)) for line in followed if (m := re.match(r"step (\d+)/", line))]
    assert steps == list(range(1, len(steps) + 1)), steps  # every report, in order, none twice
    assert "live: Succeeded" in err, err


#: Steps of the verbs' job, a report every LOGGED steps (a curve of several points).
VERBS_STEPS, VERBS_LOGGED = 20, 2


def test_the_user_verbs_on_a_finished_run_read_its_out_mount(
    ns: Kubectl, trainer: TrainerCluster, store: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One quickstart run (TensorBoard on, output.dir in an Out mount) and the verbs after it:
    `logs -f` from its submission to its end, `describe`; `fetch` of the adapter from the mount,
    byte for byte (the store's credentials from the mount's Secret: this shell has none); `plot`'s
    points are the history the sidecar uploaded, which are the progress lines of the log, and still
    are once the pod is gone; `tensorboard` copies the uploaded event files and serves them."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    _, out_bucket = mounts(ns, store, data=None)
    job = quickstart_job("verbs", steps=VERBS_STEPS)
    spec = job["spec"]
    spec["dataMounts"] = [{"name": "outputs", "mountPath": "/output"}]
    spec["trainer"]["training"]["loggingSteps"] = VERBS_LOGGED
    spec["trainer"]["training"]["reportTo"] = ["tensorboard"]
    spec["trainer"]["output"] = {"dir": "/output/run"}
    spec["resources"]["cpu"] = "1"  # the checkpoint sidecar's 1 CPU beside it: all a node of 2 cores has
    submit(ns, tmp_path, job)
    following = Following(ns, "verbs")
    uid8 = dig(get_job(ns, "verbs"), "metadata", "uid")[:8]
    wait_job(ns, "verbs", "phase Succeeded", phase_is("Succeeded"), timeout=QUICKSTART_TIMEOUT, fail_on=("Failed",))
    done = wait_job(
        ns, "verbs", "status.artifacts", lambda j: bool(dig(j, "status", "artifacts")), timeout=300, fail_on=()
    )

    # logs: -f from the submission to the end, the same lines as the log read after.
    code, followed, err = following.done()
    assert code == 0, err
    assert "verbs: Succeeded" in err, err
    code, shown, err = kubedgx(ns, "logs", "verbs")
    assert code == 0, err
    assert followed == shown
    code, raw, err = kubedgx(ns, "logs", "verbs", "--raw")
    assert code == 0, err
    from dgx_api.history import merge, parse_lines

    logged = parse_lines(raw.splitlines())
    assert [p.step for p in logged] == list(range(VERBS_LOGGED, VERBS_STEPS + 1, VERBS_LOGGED)), logged
    readable = [line for line in shown.splitlines() if line.startswith("step ")]
    assert [line.split("  ")[:2] for line in readable] == [
        [f"step {p.step}/{VERBS_STEPS} ({100 * p.step // VERBS_STEPS}%)", f"loss {p.loss:.4f}"] for p in logged
    ], readable
    assert not [line for line in shown.splitlines() if line.startswith('{"event"')], shown
    code, described, err = kubedgx(ns, "describe", "verbs")
    assert code == 0, err
    assert "Phase:       Succeeded" in described, described
    head = "".join(shown.splitlines(True)[:40])
    print(f"\n$ kubedgx logs verbs | head -40\n{head}\n$ kubedgx describe verbs\n{described}")

    # fetch: status.artifacts listed; the adapter byte for byte as the store holds it.
    code, listed, err = kubedgx(ns, "fetch", "verbs", "--list")
    assert code == 0, err
    artifacts = {a["name"]: a["uri"] for a in done["status"]["artifacts"]}
    rows = [line.split() for line in listed.splitlines()]
    assert rows[0] == ["NAME", "URI", "MOUNT"], listed
    assert {r[0]: r[1] for r in rows[1:]} == artifacts, listed
    adapter = f"runs/final/verbs-{uid8}/adapter"
    assert artifacts["adapter"] == f"s3://{out_bucket}/{adapter}/", artifacts
    dest = tmp_path / "fetched"
    code, fetched, err = kubedgx(ns, "fetch", "verbs", "-d", str(dest))
    assert code == 0, err
    assert fetched.strip() == str(dest / "adapter"), fetched
    stored = {k.removeprefix(f"{adapter}/"): k for k in store.keys(out_bucket, f"{adapter}/")}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(stored), stored
    got = {str(p.relative_to(dest / "adapter")): p for p in (dest / "adapter").rglob("*") if p.is_file()}
    assert sorted(got) == sorted(stored), (sorted(got), sorted(stored))
    for rel, key in stored.items():
        body = store.client.get_object(Bucket=out_bucket, Key=key)["Body"].read()
        assert got[rel].read_bytes() == body, rel
    code, out, err = kubedgx(ns, "fetch", "verbs", "nosuch")
    assert code == 1
    assert f"verbs has no artifact 'nosuch'; it has: {', '.join(artifacts)}" in err, err
    print(f"$ kubedgx fetch verbs --list\n{listed}$ kubedgx fetch verbs -d {dest}\n{fetched}")

    # The history the sidecar uploaded is the log's progress lines.
    history = f"runs/verbs-{uid8}/logs/history/"

    def segments() -> list[list[Any]]:
        return [
            parse_lines(store.client.get_object(Bucket=out_bucket, Key=key)["Body"].read().decode().splitlines())
            for key in store.keys(out_bucket, history)
            if key.endswith(".jsonl")
        ]

    # The sidecar's last pass uploads the history after the archive: looked at until it is whole.
    wait_for("the whole history in the Out mount", lambda: merge(segments()) == logged or None, timeout=60)
    assert len(segments()) == 1, store.keys(out_bucket, history)
    uploaded = merge(segments())
    check_plots(ns, tmp_path / "with-pod", uploaded)

    # The pod gone, the history and the event files come from the Out mount alone.
    ns.run("delete", "pod", "verbs-worker-0")
    wait_gone(ns, "pod", "verbs-worker-0", timeout=120)
    from dgx_operator.client import Client

    assert Client(ns.namespace, kubeconfig=ns.kubeconfig, context=ns.context).history("verbs") == uploaded
    text = check_plots(ns, tmp_path / "without-pod", uploaded)
    print(f"$ kubedgx plot verbs\n{text}")

    logdir = tmp_path / "tb"
    code, out, err = kubedgx(ns, "tensorboard", "verbs", "--no-serve", "--logdir", str(logdir))
    assert (code, out) == (0, f"{logdir}\n"), err
    runs = f"runs/verbs-{uid8}/logs/runs/"
    assert f"from s3://{out_bucket}/{runs.rstrip('/')} in {logdir}" in err, err
    events = [k for k in store.keys(out_bucket, runs) if "events.out.tfevents." in k]
    assert events, store.keys(out_bucket, runs)
    for key in events:
        body = store.client.get_object(Bucket=out_bucket, Key=key)["Body"].read()
        assert (logdir / "runs" / key.removeprefix(runs)).read_bytes() == body, key
    assert [s for s, _ in scalars(logdir, "train/loss")] == [p.step for p in uploaded]
    served = serve_tensorboard(ns, store, tmp_path / "tb-served")
    assert "train/loss" in served, served


def check_plots(k: Kubectl, where: Path, points: list[Any]) -> str:
    """`kubedgx plot` as PNG, HTML and text: each one's loss curve is ``points``; returns the text."""
    from dgx_operator.client import plot
    from tests.unit.test_plot import numbers, page_xml, png_texts

    where.mkdir()
    losses = [(p.step, p.loss) for p in points]
    code, out, err = kubedgx(k, "plot", "verbs", "-o", str(where / "loss.png"))
    assert (code, out) == (0, f"{where / 'loss.png'}\n"), err
    layout = json.loads(png_texts(where / "loss.png")[plot.LAYOUT_KEY])
    series = {s["name"]: s["data"] for panel in layout["panels"] for s in panel["series"]}
    assert [tuple(d) for d in series["loss"]] == losses, series
    assert layout["title"]["text"] == f"{k.namespace}/verbs", layout["title"]
    code, out, err = kubedgx(k, "plot", "verbs", "-o", str(where / "loss.html"))
    assert (code, out) == (0, f"{where / 'loss.html'}\n"), err
    page = page_xml((where / "loss.html").read_text(encoding="utf-8"))
    (panel,) = [p for p in page.findall("body/svg") if p.get("data-panel") == "loss"]
    area = panel.find("rect[@class='plot-area']")
    assert area is not None
    x, y, w, h = (float(area.get(key) or "nan") for key in ("x", "y", "width", "height"))
    xlo, xhi = numbers(panel.get("data-xlim") or "")
    ylo, yhi = numbers(panel.get("data-ylim") or "")
    (line,) = panel.findall("polyline[@data-series='loss']")
    drawn = [tuple(map(float, pair.split(","))) for pair in (line.get("points") or "").split()]
    read = [(xlo + (px - x) / w * (xhi - xlo), ylo + (y + h - py) / h * (yhi - ylo)) for px, py in drawn]
    assert [(round(s), pytest.approx(v, rel=1e-3)) for s, v in read] == losses, read
    code, text, err = kubedgx(k, "plot", "verbs", "--width", "80")
    assert code == 0, err
    head = text.splitlines()[0]
    last = points[-1]
    assert head.startswith(f"step {last.step}/{last.total_steps}  loss {plot.compact(last.loss)}"), text
    chart = text.split("\nloss: * loss\n")[1].splitlines()
    top, bottom = max(v for _, v in losses), min(v for _, v in losses)
    assert chart[0].split("|")[0].strip() == plot.compact(top), chart
    assert chart[11].split("|")[0].strip() == plot.compact(bottom), chart
    assert chart[13].split() == [str(points[0].step), "step", str(last.step)], chart
    return text


def serve_tensorboard(k: Kubectl, s3: S3, logdir: Path) -> dict[str, Any]:
    """`kubedgx tensorboard verbs --port P` as a user starts it (a process of its own, the store's
    keys in its environment): the tags TensorBoard serves once it lists a scalar; then Ctrl-C."""
    import signal
    import socket
    import sys
    import urllib.error
    import urllib.request

    from tests.s3 import ACCESS_KEY, SECRET_KEY

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert k.kubeconfig
    assert k.namespace
    argv = [sys.executable, "-m", "dgx_operator.cli.main", "tensorboard", "verbs", "--port", str(port)]
    argv += ["--logdir", str(logdir), "--kubeconfig", k.kubeconfig, "--context", k.context, "-n", k.namespace]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    server = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:

        def tags() -> dict[str, Any] | None:
            assert server.poll() is None, server.communicate()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5) as r:
                    found: dict[str, Any] = json.loads(r.read())
            except OSError:
                return None
            return {tag: run for run, by_tag in found.items() for tag in by_tag} or None

        served = wait_for("TensorBoard serving the run's scalars", tags, timeout=180)
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=60)
        assert server.returncode == 0, (server.returncode, err)
        assert f"serving on http://127.0.0.1:{port}/" in out, out
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=5)
        return served
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
