"""The DGXTrainingJobs the e2e tests apply, the waits on them, and what to print when one fails.

Every job asks for the instance type the kind nodes were faked as (``KUBEDGX_E2E_INSTANCE``), so
its workers request all of a node's (fake) GPUs, get one node each and tolerate the GPU taint, as
on a real cluster; only CPU and memory are turned down to what a kind node has.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.fakegpu import DEFAULT_INSTANCE
from tests.e2e.kubectl import JOBS, Kubectl, KubectlError, condition, dig, sorted_events, wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _seconds(name: str, default: float) -> float:
    return float(os.environ.get(name) or default)


INSTANCE = os.environ.get("KUBEDGX_E2E_INSTANCE") or DEFAULT_INSTANCE
#: Namespace of the operator the chart installed (for its logs in failure reports).
OPERATOR_NAMESPACE = os.environ.get("KUBEDGX_E2E_OPERATOR_NAMESPACE") or "kubedgx"
#: A job's workers up and Running (scheduling, image already on the node, container start).
RUNNING_TIMEOUT = _seconds("KUBEDGX_E2E_TIMEOUT", 300)
#: The quickstart fine-tune, start to Succeeded, on a kind node's CPU (torch imports included).
QUICKSTART_TIMEOUT = _seconds("KUBEDGX_E2E_QUICKSTART_TIMEOUT", 1200)
QUICKSTART_STEPS = int(os.environ.get("KUBEDGX_E2E_QUICKSTART_STEPS") or 20)
#: CPU and memory of the quickstart's worker (requests == limits: Guaranteed QoS).
TRAINER_CPU = os.environ.get("KUBEDGX_E2E_TRAINER_CPU") or "2"
TRAINER_MEMORY = os.environ.get("KUBEDGX_E2E_TRAINER_MEMORY") or "4Gi"
#: Deleting a test namespace: the operator must release its finalizer and the pods must stop.
NAMESPACE_TIMEOUT = _seconds("KUBEDGX_E2E_NAMESPACE_TIMEOUT", 240)

#: A worker that idles until deleted and stops at once on SIGTERM, exiting as a program killed by
#: it would (143). Without the trap, /bin/sh as PID 1 ignores SIGTERM and every deletion would
#: take the whole terminationGracePeriodSeconds (120 s).
SLEEPER = (
    "trap 'echo kubedgx-e2e: SIGTERM; exit 143' TERM; "
    'echo "kubedgx-e2e: worker $KUBEDGX_REPLICA_INDEX of $KUBEDGX_JOB_NAME, attempt $KUBEDGX_ATTEMPT"; '
    "sleep 3600 & wait"
)
SMALL = {"cpu": "100m", "memory": "128Mi", "shm": "64Mi"}
TERMINAL = ("Succeeded", "Failed")


def command_job(
    name: str, *, min_nodes: int = 1, max_nodes: int | None = None, script: str = SLEEPER
) -> dict[str, Any]:
    """Any-program job (spec.command) in the trainer image the chart configured: a shell that idles."""
    elastic: dict[str, Any] = {"minNodes": min_nodes, "nprocPerNode": 1}
    if max_nodes is not None:
        elastic["maxNodes"] = max_nodes
    return {
        "apiVersion": "kubedgx.io/v1alpha1",
        "kind": "DGXTrainingJob",
        "metadata": {"name": name, "labels": {"kubedgx.io/e2e": "true"}},
        "spec": {
            "instance": INSTANCE,
            "command": ["/bin/sh", "-c"],
            "args": [script],
            "resources": dict(SMALL),
            "elastic": elastic,
            "restartPolicy": "OnFailure",
            "backoffLimit": 3,
            "maxDuration": "30m",
        },
    }


def quickstart_job(name: str = "quickstart", *, steps: int = QUICKSTART_STEPS) -> dict[str, Any]:
    """examples/quickstart.yaml on the faked nodes: the e2e instance type instead of the example's,
    CPU and memory a kind node has, one process (not one per fake GPU), fewer steps. The dataset's
    relative path resolves in the trainer image's working directory (/opt/kubedgx/examples)."""
    job: dict[str, Any] = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    job["metadata"] = {"name": name, "labels": {"kubedgx.io/e2e": "true"}}
    spec = job["spec"]
    spec["instance"] = INSTANCE
    spec["maxDuration"] = f"{int(QUICKSTART_TIMEOUT) + 600}s"  # never the reason a slow CPU run fails
    spec["resources"] = {"cpu": TRAINER_CPU, "memory": TRAINER_MEMORY, "shm": "1Gi"}
    spec["elastic"] = {"nprocPerNode": 1}
    training = spec["trainer"]["training"]
    training["maxSteps"] = steps
    training["loggingSteps"] = max(1, min(int(training.get("loggingSteps", 10)), steps // 4 or 1))
    training["saveSteps"] = max(1, steps // 2)
    assert spec["trainer"].get("allowCpu") is True, "the quickstart must allow a CPU run: kind has no GPUs"
    return job


def interactive_trainer_job(name: str) -> dict[str, Any]:
    """The quickstart in interactive debug mode: all of a trainer job's children (worker, headless
    Service, trainer ConfigMap), with a worker that idles instead of training."""
    job = quickstart_job(name)
    job["spec"]["debug"] = {"interactive": True}
    job["spec"]["resources"] = dict(SMALL)
    return job


def bad_bounds_job(name: str = "bad-bounds") -> dict[str, Any]:
    """minNodes above maxNodes: a CEL rule of the CRD, so the API server itself refuses it."""
    return command_job(name, min_nodes=3, max_nodes=2)


def unknown_instance_job(name: str = "bad-instance") -> dict[str, Any]:
    """A well-formed instance name whose shape (3 GPUs per node) no catalog family has: the CRD
    accepts it, only the catalog knows better, so only the admission webhook can refuse it."""
    job = command_job(name)
    parts = INSTANCE.split(".")
    parts[2] = "3"
    job["spec"]["instance"] = ".".join(parts)
    return job


# -- observing ---------------------------------------------------------------------------------


def worker_pods(k: Kubectl, job: str) -> list[dict[str, Any]]:
    return k.select("pods", {"kubedgx.io/job-name": job})


def live_workers(k: Kubectl, job: str) -> list[dict[str, Any]]:
    return [p for p in worker_pods(k, job) if not dig(p, "metadata", "deletionTimestamp")]


def running_workers(k: Kubectl, job: str) -> list[dict[str, Any]]:
    return [p for p in live_workers(k, job) if dig(p, "status", "phase") == "Running"]


def describe(k: Kubectl, job: str | None = None) -> str:
    """What a person debugging a failed wait wants first: the jobs' status, the pods, the events,
    the workers' and the operator's last log lines. Best effort: never raises."""
    parts: list[str] = []

    def section(title: str, produce: Callable[[], str]) -> None:
        try:
            body = produce()
        except Exception as exc:
            body = f"<{type(exc).__name__}: {exc}>"
        parts.append(f"--- {title}\n{body.rstrip()}")

    section(
        f"dgxtrainingjobs in {k.namespace}",
        lambda: yaml.safe_dump(
            [
                {
                    "name": dig(j, "metadata", "name"),
                    "finalizers": dig(j, "metadata", "finalizers"),
                    "spec": j.get("spec"),
                    "status": j.get("status"),
                }
                for j in k.select(JOBS)
            ],
            sort_keys=False,
        ),
    )
    section(f"pods in {k.namespace}", lambda: k.run("get", "pods", "-o", "wide", "--show-labels").stdout)
    section(
        f"events in {k.namespace}",
        lambda: "\n".join(
            f"{e.get('type')} {e.get('reason')} {dig(e, 'involvedObject', 'kind')}/{dig(e, 'involvedObject', 'name')}: "
            f"{e.get('message')}"
            for e in sorted_events(k.select("events"))[-40:]
        ),
    )

    def logs(of: Kubectl, pod: str, tail: int) -> Callable[[], str]:
        return lambda: of.logs(pod, tail=tail)

    selector = {"kubedgx.io/job-name": job} if job else None
    try:
        pods = [str(dig(p, "metadata", "name")) for p in k.select("pods", selector)]
    except Exception:
        pods = []
    for name in pods[:4]:
        section(f"logs of {name}", logs(k, name, 30))
    op = k.in_namespace(OPERATOR_NAMESPACE)
    try:
        operators = [str(dig(p, "metadata", "name")) for p in op.select("pods")]
    except Exception:
        operators = []
    for name in operators[:2]:
        section(f"operator logs ({OPERATOR_NAMESPACE}/{name})", logs(op, name, 60))
    return "\n".join(parts)


def get_job(k: Kubectl, name: str) -> dict[str, Any]:
    job = k.get(JOBS, name)
    assert job is not None, f"DGXTrainingJob {k.namespace}/{name} does not exist"
    return job


def wait_job(
    k: Kubectl,
    name: str,
    what: str,
    predicate: Callable[[dict[str, Any]], bool],
    *,
    timeout: float = RUNNING_TIMEOUT,
    fail_on: Collection[str] = TERMINAL,
    seen: list[str] | None = None,
) -> dict[str, Any]:
    """Poll the job until ``predicate(job)``; a phase in ``fail_on`` ends the wait at once, with the
    job's conditions and the cluster's account. ``seen`` collects every phase observed."""

    def probe() -> dict[str, Any] | None:
        job = get_job(k, name)
        phase = dig(job, "status", "phase")
        if seen is not None and phase and (not seen or seen[-1] != phase):
            seen.append(phase)
        if predicate(job):
            return job
        if phase in fail_on:
            raise AssertionError(
                f"DGXTrainingJob {k.namespace}/{name} went {phase} while waiting for {what}: "
                f"{yaml.safe_dump(dig(job, 'status', 'conditions'), sort_keys=False)}\n{describe(k, name)}"
            )
        return None

    return wait_for(f"{name}: {what}", probe, timeout=timeout, diagnose=lambda: describe(k, name))


def phase_is(*phases: str) -> Callable[[dict[str, Any]], bool]:
    return lambda job: dig(job, "status", "phase") in phases


def running_with(nodes: int) -> Callable[[dict[str, Any]], bool]:
    """Running with ``nodes`` ready workers out of ``nodes`` desired (``status.nodes``), as
    ``kubectl get dgxjob`` shows it."""
    return lambda job: dig(job, "status", "phase") == "Running" and dig(job, "status", "nodes") == f"{nodes}/{nodes}"


def wait_gone(k: Kubectl, kind: str, name: str, *, timeout: float = NAMESPACE_TIMEOUT) -> None:
    def probe() -> bool:
        try:
            return k.get(kind, name) is None
        except KubectlError:
            return False

    wait_for(f"{kind} {k.namespace}/{name} to be gone", probe, timeout=timeout, diagnose=lambda: describe(k))


def owned_by(obj: Mapping[str, Any], job: Mapping[str, Any]) -> bool:
    """Whether the job is the object's controller (ownerReferences with controller: true)."""
    uid = dig(job, "metadata", "uid")
    return any(
        ref.get("uid") == uid and ref.get("controller") is True and ref.get("kind") == "DGXTrainingJob"
        for ref in dig(obj, "metadata", "ownerReferences", default=[]) or []
    )


def condition_true(job: Mapping[str, Any], type_: str) -> bool:
    cond = condition(job, type_)
    return cond is not None and cond.get("status") == "True"


def trainer_config_of(pod: Mapping[str, Any] | None) -> str:
    """The trainer ConfigMap a worker mounts (its name is keyed by content)."""
    volumes = dig(pod, "spec", "volumes", default=[]) or []
    names = [v["configMap"]["name"] for v in volumes if v.get("name") == "trainer-config" and "configMap" in v]
    assert names, f"the worker mounts no trainer ConfigMap: {volumes}"
    return str(names[0])


class PhaseWatch:
    """Every phase a job's status goes through, from a watch (``kubectl get -w``): a poll misses a
    phase that lasts a second or two, such as the Restarting flash a real kubelet's order of writes
    once caused (a container terminated about a second before its pod's phase)."""

    def __init__(self, k: Kubectl, name: str) -> None:
        watcher = Kubectl(k.context, k.namespace, k.binary, "0", k.kubeconfig)
        self._proc = subprocess.Popen(
            # a list's watch (by field selector): the job may not exist yet
            [
                *watcher.base_args(),
                "get",
                JOBS,
                f"--field-selector=metadata.name={name}",
                "--watch",
                "-o",
                'jsonpath={.status.phase}{"\\n"}',
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._seen: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            phase = line.strip()
            with self._lock:
                if phase and (not self._seen or self._seen[-1] != phase):
                    self._seen.append(phase)

    @property
    def phases(self) -> list[str]:
        """The phases seen so far, each change once, in order."""
        with self._lock:
            return list(self._seen)

    def stop(self) -> list[str]:
        self._proc.terminate()
        self._proc.wait(timeout=10)
        self._reader.join(timeout=10)
        return self.phases

    def __enter__(self) -> PhaseWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
