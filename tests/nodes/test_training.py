"""The product on real nodes: the trainer image built from Dockerfile.trainer, run by two kubelets,
watched by the operator (as the chart's ServiceAccount). Each test is a behaviour only a kubelet
running containers shows: torchrun's rendezvous across pods, the order in which a kubelet reports an
exit, the OOM killer, SIGTERM and grace periods, native sidecars, exec and logs.

The module's cluster is tests/nodes/fixtures.py's ``trainer``; ``ns`` is tests/e2e's namespace per
test (deleted after, the job's finalizer released by the operator).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

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
