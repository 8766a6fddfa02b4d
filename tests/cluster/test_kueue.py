"""Kueue's job integration for DGXTrainingJob against a real Kueue (v0.17.0, its manager built from its
Go module and run as a local process, its webhooks called by the apiserver): the operator, as the
chart's ServiceAccount, creates each queued job's Workload and obeys Kueue's admission; kube-scheduler
places the admitted workers on kwok's fake DGX nodes (docs/kueue.md).

ResourceFlavors for the norm and spot H100 pools are shared by the module (the four norm nodes are
labelled kubedgx.io/capacity=norm for it, as docs/kueue.md asks admins to); every test makes its own
ClusterQueues (cluster-scoped, unique names) and LocalQueue in its namespace. Each scenario asserts
what a user sees (the job's phase, conditions, workers and their nodes) and what Kueue reports (the
Workload's admission, the ClusterQueue's usage).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from dgx_operator.catalog import Catalog
from tests.cluster.controlplane import EXIT_CODE_LABEL
from tests.cluster.kueue_helpers import (
    CAPACITY,
    PRIORITY,
    QUEUE,
    WORKLOADS,
    assignment,
    condition_true_of,
    h100_norm_nodes,
    node_of,
    workloads_of,
)
from tests.cluster.operator import Operator
from tests.e2e.jobs import command_job, live_workers, phase_is, running_with, wait_job
from tests.e2e.kubectl import JOBS, Kubectl, condition, dig, wait_for

pytestmark = pytest.mark.timeout(600)

TIMEOUT = 90
INSTANCE = "dgxh100.80g.8.norm"
GPUS = Catalog.load().get(INSTANCE).gpus  # 8: one worker is one node's worth
KUEUE_V1BETA2 = "kueue.x-k8s.io/v1beta2"
SUFFIX = secrets.token_hex(3)
NORM = f"dgx-h100-norm-{SUFFIX}"
SPOT = f"dgx-h100-spot-{SUFFIX}"
SPOT_TOLERATION = {"key": CAPACITY, "operator": "Equal", "value": "spot", "effect": "NoSchedule"}


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def operator(kueue: Any, operator: Operator) -> Operator:
    """conftest's operator, started once Kueue's API is served (it discovers the Workload version)."""
    return operator


@pytest.fixture(scope="module")
def flavors(kubectl: Kubectl, kueue: Any) -> Iterator[dict[str, str]]:
    """The norm and spot ResourceFlavors of the H100 pools; the norm nodes labelled for the first."""
    nodes = h100_norm_nodes(kubectl)
    assert len(nodes) >= 4, [n["metadata"]["name"] for n in nodes]
    product = nodes[0]["metadata"]["labels"]["nvidia.com/gpu.product"]
    for node in nodes:
        kubectl.run("label", "node", node["metadata"]["name"], f"{CAPACITY}=norm", "--overwrite")
    kubectl.apply(
        flavor(NORM, {"nvidia.com/gpu.product": product, CAPACITY: "norm"}),
        flavor(SPOT, {"nvidia.com/gpu.product": product, CAPACITY: "spot"}, [SPOT_TOLERATION]),
    )
    yield {"norm": NORM, "spot": SPOT, "product": product}
    for node in nodes:
        kubectl.run("label", "node", node["metadata"]["name"], f"{CAPACITY}-")
    for name in (NORM, SPOT):
        kubectl.run("delete", "resourceflavor", name, "--ignore-not-found", "--wait=false")


@pytest.fixture
def queues(kubectl: Kubectl, namespace: Kubectl, flavors: dict[str, str]) -> Iterator[ClusterQueues]:
    made = ClusterQueues(kubectl, namespace)
    yield made
    for name in made.names:
        kubectl.run("delete", "clusterqueue", name, "--ignore-not-found", "--wait=false")


def flavor(name: str, labels: Mapping[str, str], tolerations: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeLabels": dict(labels)}
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": name}, "spec": spec}


class ClusterQueues:
    """ClusterQueues for one test, each with a LocalQueue of the same name in the test's namespace."""

    def __init__(self, kubectl: Kubectl, namespace: Kubectl) -> None:
        self.kubectl = kubectl
        self.namespace = namespace
        self.names: list[str] = []

    def make(
        self,
        stem: str,
        quotas: Sequence[tuple[str, int, int | None]],
        *,
        cohort: str | None = None,
        preemption: Mapping[str, Any] | None = None,
        local: bool = True,
    ) -> str:
        """A ClusterQueue whose flavors (in order) have ``gpus`` of nominal GPU quota each (and a GPU
        borrowing limit); CPU and memory never bind. Returns the LocalQueue's name (= the CQ's)."""
        name = f"{stem}-{SUFFIX}-{len(self.names)}"
        spec: dict[str, Any] = {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": flavor_name,
                            "resources": [
                                {"name": "cpu", "nominalQuota": "1000"},
                                {"name": "memory", "nominalQuota": "100Ti"},
                                {
                                    "name": "nvidia.com/gpu",
                                    "nominalQuota": str(gpus),
                                    **({"borrowingLimit": str(limit)} if limit is not None else {}),
                                },
                            ],
                        }
                        for flavor_name, gpus, limit in quotas
                    ],
                }
            ],
        }
        if cohort is not None:
            spec["cohortName"] = cohort
        if preemption is not None:
            spec["preemption"] = dict(preemption)
        self.kubectl.apply(
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}
        )
        self.names.append(name)
        if local:
            self.namespace.apply(
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "LocalQueue",
                    "metadata": {"name": name},
                    "spec": {"clusterQueue": name},
                }
            )
            wait_for(
                f"LocalQueue {name} active",
                lambda: condition_true_of(self.namespace.get("localqueue", name), "Active"),
                timeout=TIMEOUT,
                interval=0.5,
            )
        return name

    def wait_usage(self, name: str, flavor_name: str, expected: tuple[int, int]) -> None:
        """Kueue's ClusterQueue status follows admissions asynchronously: wait for it to say ``expected``."""
        wait_for(
            f"ClusterQueue {name} to report {expected} (GPUs used, borrowed) of {flavor_name}",
            lambda: self.usage(name, flavor_name) == expected,
            timeout=TIMEOUT,
            interval=0.5,
        )

    def usage(self, name: str, flavor_name: str) -> tuple[int, int]:
        """(GPUs in use, GPUs borrowed) of ``flavor_name`` in ClusterQueue ``name``, as Kueue reports."""
        cq = self.kubectl.get("clusterqueue", name) or {}
        for f in dig(cq, "status", "flavorsReservation", default=[]) or []:
            if f.get("name") == flavor_name:
                for r in f.get("resources") or []:
                    if r.get("name") == "nvidia.com/gpu":
                        return int(r.get("total") or 0), int(r.get("borrowed") or 0)
        return 0, 0


def queued_job(name: str, queue: str, *, min_nodes: int, max_nodes: int, priority: str | None = None) -> dict[str, Any]:
    job = command_job(name, min_nodes=min_nodes, max_nodes=max_nodes)
    job["spec"]["instance"] = INSTANCE
    job["metadata"]["labels"][QUEUE] = queue
    if priority is not None:
        job["metadata"]["labels"][PRIORITY] = priority
    return job


def admitted(k: Kubectl, job: str) -> dict[str, Any] | None:
    found = [w for w in workloads_of(k, job) if condition_true_of(w, "Admitted")]
    return found[0] if found else None


def suspended_by_kueue(job: Mapping[str, Any]) -> bool:
    cond = condition(job, "Suspended")
    return dig(job, "status", "phase") == "Suspended" and cond is not None and cond.get("status") == "True"


def held_in_kueues_words(k: Kubectl, job: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Wait until the job is held with its Workload's QuotaReserved reason and message in its Suspended
    condition (the job's status follows the Workload's events: the first "Queued" pass comes before
    Kueue's word); returns (job, its Suspended condition, the Workload's QuotaReserved condition)."""

    def probe() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]] | None:
        body = k.get("dgxtrainingjob", job) or {}
        held = condition(body, "Suspended")
        found = workloads_of(k, job)
        reserved = condition(found[0], "QuotaReserved") if len(found) == 1 else None
        if not suspended_by_kueue(body) or held is None or reserved is None or reserved.get("status") != "False":
            return None
        if held.get("reason") != reserved.get("reason") or reserved.get("message", "") not in held.get("message", ""):
            return None
        return body, held, reserved

    return wait_for(f"{job} held with Kueue's reason and message", probe, timeout=TIMEOUT, interval=0.5)


def succeed(k: Kubectl, job: str) -> None:
    """Worker 0 exits 0: the job succeeds (and its Workload is declared Finished)."""
    (pod,) = [p for p in live_workers(k, job) if dig(p, "metadata", "labels", "kubedgx.io/replica-index") == "0"]
    k.run("label", "pod", pod["metadata"]["name"], f"{EXIT_CODE_LABEL}=0", "--overwrite")
    wait_job(k, job, "Succeeded", phase_is("Succeeded"), timeout=TIMEOUT, fail_on=("Failed",))


# -- the scenarios -----------------------------------------------------------------------------


def test_a_job_over_the_quota_waits_suspended_with_kueues_reason_and_starts_when_quota_frees(
    operator: Operator, namespace: Kubectl, queues: ClusterQueues, flavors: dict[str, str]
) -> None:
    queue = queues.make("quota", [(flavors["norm"], 2 * GPUS, None)])
    namespace.apply(queued_job("first", queue, min_nodes=2, max_nodes=2))
    wait_job(namespace, "first", "2/2 Running", running_with(2), timeout=TIMEOUT)
    (wl,) = workloads_of(namespace, "first")
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert wl["metadata"]["name"].startswith("dgxtrainingjob-first-")
    assert dig(wl, "spec", "podSets", 0, "count") == 2
    queues.wait_usage(queue, flavors["norm"], (2 * GPUS, 0))

    namespace.apply(queued_job("second", queue, min_nodes=1, max_nodes=1))
    # Kueue's own words: the Workload's QuotaReserved reason and message, in the job's condition.
    _, cond, reserved = held_in_kueues_words(namespace, "second")
    assert cond["reason"] == "Pending", cond
    assert "insufficient" in reserved["message"], reserved
    (pending,) = workloads_of(namespace, "second")
    assert live_workers(namespace, "second") == []

    # A spec change while queued recreates the Workload (a new uid, the new shape).
    old_uid = pending["metadata"]["uid"]
    namespace.patch(JOBS, "second", {"spec": {"resources": {"cpu": "200m"}}})

    def recreated() -> dict[str, Any] | None:
        found = workloads_of(namespace, "second")
        return found[0] if len(found) == 1 and found[0]["metadata"]["uid"] != old_uid else None

    new = wait_for("the Workload recreated", recreated, timeout=TIMEOUT, interval=0.5)
    requests = dig(new, "spec", "podSets", 0, "template", "spec", "containers", 0, "resources", "requests")
    assert requests["cpu"] == "200m", requests

    # The first job ends: its Workload is Finished, the quota returns, the second one starts.
    succeed(namespace, "first")
    wait_for(
        "the first Workload Finished",
        lambda: all(condition_true_of(w, "Finished") for w in workloads_of(namespace, "first")),
        timeout=TIMEOUT,
        interval=0.5,
    )
    wait_job(namespace, "second", "1/1 Running", running_with(1), timeout=TIMEOUT)
    assert admitted(namespace, "second") is not None


def test_a_higher_priority_job_preempts_a_lower_one_which_resumes_later_without_a_restart(
    operator: Operator, kubectl: Kubectl, namespace: Kubectl, queues: ClusterQueues, flavors: dict[str, str]
) -> None:
    low, high = f"low-{SUFFIX}", f"high-{SUFFIX}"
    kubectl.apply(
        *(
            {"apiVersion": KUEUE_V1BETA2, "kind": "WorkloadPriorityClass", "metadata": {"name": n}, "value": v}
            for n, v in ((low, 100), (high, 1000))
        )
    )
    try:
        queue = queues.make(
            "prio", [(flavors["norm"], 2 * GPUS, None)], preemption={"withinClusterQueue": "LowerPriority"}
        )
        namespace.apply(queued_job("research", queue, min_nodes=2, max_nodes=2, priority=low))
        wait_job(namespace, "research", "2/2 Running", running_with(2), timeout=TIMEOUT)
        before = {p["metadata"]["uid"] for p in live_workers(namespace, "research")}
        (wl,) = workloads_of(namespace, "research")
        assert dig(wl, "spec", "priorityClassRef") == {
            "group": "kueue.x-k8s.io",
            "kind": "WorkloadPriorityClass",
            "name": low,
        }
        assert dig(wl, "spec", "priority") == 100

        namespace.apply(queued_job("production", queue, min_nodes=2, max_nodes=2, priority=high))
        job = wait_job(namespace, "research", "preempted", suspended_by_kueue, timeout=TIMEOUT)
        cond = condition(job, "Suspended")
        assert cond is not None
        assert cond["reason"] == "Preempted", cond
        wait_for("no workers", lambda: live_workers(namespace, "research") == [], timeout=TIMEOUT, interval=0.5)
        wait_job(namespace, "production", "2/2 Running", running_with(2), timeout=TIMEOUT)
        job = namespace.get(JOBS, "research") or {}
        assert dig(job, "status", "restarts") in (0, None), dig(job, "status")
        # Requeued by the integration once its workers were gone: QuotaReserved False, Requeued True.
        (wl,) = workloads_of(namespace, "research")
        requeued = condition(wl, "Requeued")
        assert requeued is not None
        assert requeued["status"] == "True", wl.get("status")
        assert dig(wl, "status", "admission") is None

        # The high-priority job leaves: the preempted one is admitted again and resumes, not restarted.
        namespace.delete(JOBS, "production")
        resumed = wait_job(namespace, "research", "2/2 Running again", running_with(2), timeout=TIMEOUT)
        assert dig(resumed, "status", "restarts") in (0, None), dig(resumed, "status")
        after = {p["metadata"]["uid"] for p in live_workers(namespace, "research")}
        assert after
        assert not after & before
    finally:
        for name in (low, high):
            kubectl.run("delete", "workloadpriorityclass", name, "--ignore-not-found", "--wait=false")


def test_an_elastic_job_is_admitted_on_what_the_quota_allows_and_runs_on_that_many_nodes(
    operator: Operator, namespace: Kubectl, queues: ClusterQueues, flavors: dict[str, str]
) -> None:
    queue = queues.make("elastic", [(flavors["norm"], 3 * GPUS, None)])
    namespace.apply(queued_job("elastic", queue, min_nodes=2, max_nodes=8))
    job = wait_job(namespace, "elastic", "3/3 Running", running_with(3), timeout=TIMEOUT)
    wl = admitted(namespace, "elastic")
    assert wl is not None
    assert dig(wl, "spec", "podSets", 0, "count") == 8
    assert dig(wl, "spec", "podSets", 0, "minCount") == 2
    assert assignment(wl)["count"] == 3
    assert dig(job, "status", "workers", "desired") == 3
    pods = live_workers(namespace, "elastic")
    assert len({dig(p, "spec", "nodeName") for p in pods}) == 3
    env = {e["name"]: e.get("value") for e in dig(pods[0], "spec", "containers", 0, "env")}
    assert env["PET_NNODES"] == "2:8"


def test_borrowing_in_a_cohort_goes_up_to_the_borrowing_limit_and_no_further(
    operator: Operator, namespace: Kubectl, queues: ClusterQueues, flavors: dict[str, str]
) -> None:
    """Reserved plus a bounded burst: team A owns one node, may borrow one more from team B."""
    cohort = f"dgx-{SUFFIX}"
    team_a = queues.make("team-a", [(flavors["norm"], GPUS, GPUS)], cohort=cohort)
    team_b = queues.make("team-b", [(flavors["norm"], 2 * GPUS, None)], cohort=cohort, local=False)
    namespace.apply(queued_job("reserved", team_a, min_nodes=1, max_nodes=1))
    wait_job(namespace, "reserved", "Running", running_with(1), timeout=TIMEOUT)
    namespace.apply(queued_job("burst", team_a, min_nodes=1, max_nodes=1))
    wait_job(namespace, "burst", "Running on borrowed quota", running_with(1), timeout=TIMEOUT)
    queues.wait_usage(team_a, flavors["norm"], (2 * GPUS, GPUS))
    namespace.apply(queued_job("beyond", team_a, min_nodes=1, max_nodes=1))
    _, cond, reserved = held_in_kueues_words(namespace, "beyond")
    assert "insufficient" in reserved["message"], reserved
    assert cond["reason"] == reserved["reason"]
    assert live_workers(namespace, "beyond") == []
    queues.wait_usage(team_b, flavors["norm"], (0, 0))
    queues.wait_usage(team_a, flavors["norm"], (2 * GPUS, GPUS))


def test_a_job_that_does_not_fit_the_norm_flavor_runs_on_spot_with_its_selector_and_toleration(
    operator: Operator, kubectl: Kubectl, namespace: Kubectl, queues: ClusterQueues, flavors: dict[str, str]
) -> None:
    queue = queues.make("spot", [(flavors["norm"], GPUS, None), (flavors["spot"], 2 * GPUS, None)])
    namespace.apply(queued_job("on-norm", queue, min_nodes=1, max_nodes=1))
    wait_job(namespace, "on-norm", "Running", running_with(1), timeout=TIMEOUT)
    namespace.apply(queued_job("on-spot", queue, min_nodes=2, max_nodes=2))
    wait_job(namespace, "on-spot", "2/2 Running", running_with(2), timeout=TIMEOUT)
    wl = admitted(namespace, "on-spot")
    assert wl is not None
    assert set(assignment(wl)["flavors"].values()) == {flavors["spot"]}
    for pod in live_workers(namespace, "on-spot"):
        assert dig(pod, "spec", "nodeSelector", CAPACITY) == "spot", dig(pod, "spec")
        assert SPOT_TOLERATION in dig(pod, "spec", "tolerations"), dig(pod, "spec", "tolerations")
        assert dig(node_of(kubectl, pod), "metadata", "labels", CAPACITY) == "spot"
    (norm_pod,) = live_workers(namespace, "on-norm")
    assert dig(norm_pod, "spec", "nodeSelector", CAPACITY) == "norm"
    assert dig(node_of(kubectl, norm_pod), "metadata", "labels", CAPACITY) == "norm"


def test_deleting_a_job_releases_its_workload_and_the_quota_shows_free_again(
    operator: Operator, namespace: Kubectl, queues: ClusterQueues, flavors: dict[str, str]
) -> None:
    queue = queues.make("delete", [(flavors["norm"], 2 * GPUS, None)])
    namespace.apply(queued_job("leaving", queue, min_nodes=2, max_nodes=2))
    wait_job(namespace, "leaving", "2/2 Running", running_with(2), timeout=TIMEOUT)
    (wl,) = workloads_of(namespace, "leaving")
    queues.wait_usage(queue, flavors["norm"], (2 * GPUS, 0))
    namespace.delete(JOBS, "leaving")
    # Garbage collection after the job's finalizer goes (its workers ended): slower on a loaded machine.
    gone = 2 * TIMEOUT
    wait_for("its Workload gone", lambda: namespace.get(WORKLOADS, wl["metadata"]["name"]) is None, timeout=gone)

    def free() -> bool:
        cq = namespace.get("clusterqueue", queue) or {}
        return queues.usage(queue, flavors["norm"]) == (0, 0) and dig(cq, "status", "admittedWorkloads") == 0

    wait_for("the quota free, no Workload admitted", free, timeout=gone, interval=0.5)


def test_no_call_of_the_operator_was_refused(operator: Operator) -> None:
    """Every call the integration made passed the chart's RBAC (kueue.enabled's rules)."""
    assert operator.forbidden() == [], operator.forbidden()
