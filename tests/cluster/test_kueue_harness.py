"""The Kueue harness (tests/cluster/kueue.py): a real Kueue manager on the control plane, as later
tests of kubedgx's Kueue integration use it. Its API served as v1beta2 (v1beta1 still served,
deprecated, converted by Kueue's conversion webhook); a Workload made by hand within a
ClusterQueue's quota is admitted and names the flavor; one beyond the quota waits with Kueue's
reason, and is admitted once the first one is Finished; a Workload naming no LocalQueue is
inadmissible; the apiserver calls Kueue's webhooks (and only for Kueue's own resources); stop()
takes the webhooks away again."""

from __future__ import annotations

import datetime as dt
import json
import secrets
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.kueue import (
    CLUSTER_QUEUE_DENIED,
    GROUP,
    INVALID_CLUSTER_QUEUE,
    KEPT_WEBHOOKS,
    SERVICE_ACCOUNT,
    Kueue,
)
from tests.e2e.fakegpu import GPU_RESOURCE
from tests.e2e.kubectl import Kubectl, KubectlError, dig, wait_for

SUFFIX = secrets.token_hex(3)
FLAVOR = f"kubedgx-h100-{SUFFIX}"
CLUSTER_QUEUE = f"kubedgx-cq-{SUFFIX}"
PRIORITY_CLASS = f"kubedgx-research-{SUFFIX}"
LOW_CLASS = f"kubedgx-low-{SUFFIX}"
HIGH_CLASS = f"kubedgx-high-{SUFFIX}"
#: The WorkloadPriorityClasses and their values.
PRIORITY_VALUES = {PRIORITY_CLASS: 100, LOW_CLASS: 10, HIGH_CLASS: 1000}
LOCAL_QUEUE = "team-a"
GPUS_PER_POD = 8
PODS = 2
#: Room for exactly one Workload of PODS x GPUS_PER_POD GPUs.
GPU_QUOTA = PODS * GPUS_PER_POD
V1BETA2 = f"{GROUP}/v1beta2"
WORKLOADS = f"workloads.{GROUP}"


def conditions(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in dig(obj, "status", "conditions", default=[]) or []}


def condition_is(k: Kubectl, name: str, type_: str, status: str) -> dict[str, Any] | None:
    """The Workload, once its condition ``type_`` has ``status``."""
    obj = k.get(WORKLOADS, name)
    cond = conditions(obj).get(type_)
    return obj if cond is not None and cond["status"] == status else None


def workload(name: str, *, queue: str = LOCAL_QUEUE, priority_class: str | None = None) -> dict[str, Any]:
    """A v1beta2 Workload as an integration would make it: one podSet of PODS pods asking for
    GPUS_PER_POD GPUs each."""
    container = {
        "name": "worker",
        "image": "busybox",
        "resources": {
            "requests": {"cpu": "1", GPU_RESOURCE: str(GPUS_PER_POD)},
            "limits": {GPU_RESOURCE: str(GPUS_PER_POD)},
        },
    }
    template = {"spec": {"restartPolicy": "Never", "containers": [container]}}
    spec: dict[str, Any] = {"queueName": queue, "podSets": [{"name": "workers", "count": PODS, "template": template}]}
    if priority_class is not None:
        spec["priorityClassRef"] = {"group": GROUP, "kind": "WorkloadPriorityClass", "name": priority_class}
        spec["priority"] = PRIORITY_VALUES[priority_class]  # the integration copies the class's value
    return {"apiVersion": V1BETA2, "kind": "Workload", "metadata": {"name": name}, "spec": spec}


@pytest.fixture(scope="module")
def queues(kueue: Kueue, kubectl: Kubectl) -> Iterator[str]:
    """A ResourceFlavor, a ClusterQueue for all namespaces with quota for one Workload (cpu and
    GPUs) that preempts lower priorities, the WorkloadPriorityClasses. Yields the ClusterQueue's name."""
    kubectl.apply(
        {"apiVersion": V1BETA2, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}, "spec": {}},
        *[
            {"apiVersion": V1BETA2, "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value}
            for name, value in PRIORITY_VALUES.items()
        ],
        {
            "apiVersion": V1BETA2,
            "kind": "ClusterQueue",
            "metadata": {"name": CLUSTER_QUEUE},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", GPU_RESOURCE],
                        "flavors": [
                            {
                                "name": FLAVOR,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "100"},
                                    {"name": GPU_RESOURCE, "nominalQuota": str(GPU_QUOTA)},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    )
    wait_for(
        f"ClusterQueue {CLUSTER_QUEUE} Active",
        lambda: (
            conditions(kubectl.get(f"clusterqueues.{GROUP}", CLUSTER_QUEUE)).get("Active", {}).get("status") == "True"
        ),
        timeout=60,
        interval=0.3,
        diagnose=kueue.tail,
    )
    yield CLUSTER_QUEUE
    kubectl.run("delete", f"clusterqueues.{GROUP}", CLUSTER_QUEUE, "--ignore-not-found", "--wait=false")
    kubectl.run("delete", f"resourceflavors.{GROUP}", FLAVOR, "--ignore-not-found", "--wait=false")
    kubectl.run("delete", f"workloadpriorityclasses.{GROUP}", *PRIORITY_VALUES, "--ignore-not-found", "--wait=false")


@pytest.fixture
def local_queue(namespace: Kubectl, queues: str, kueue: Kueue) -> Kubectl:
    """The LocalQueue LOCAL_QUEUE of the test's namespace, pointing at the ClusterQueue."""
    namespace.apply(
        {
            "apiVersion": V1BETA2,
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE},
            "spec": {"clusterQueue": queues},
        }
    )
    wait_for(
        f"LocalQueue {LOCAL_QUEUE} Active",
        lambda: (
            conditions(namespace.get(f"localqueues.{GROUP}", LOCAL_QUEUE)).get("Active", {}).get("status") == "True"
        ),
        timeout=60,
        interval=0.3,
        diagnose=kueue.tail,
    )
    return namespace


def test_kueue_serves_its_api_as_v1beta2_and_still_v1beta1(kueue: Kueue) -> None:
    served = kueue.workload_versions()
    assert served.preferred == "v1beta2"
    # v1beta1 is still served in 0.17 (deprecated: "This version is deprecated. Use v1beta2 instead.").
    assert served.versions == ("v1beta2", "v1beta1")
    assert {r["name"] for r in kueue.plane.get(f"/apis/{GROUP}/v1beta2")["resources"]} >= {
        "clusterqueues", "localqueues", "resourceflavors", "workloadpriorityclasses", "workloads", "workloads/status",
    }  # fmt: skip


def test_a_v1beta2_workload_reads_as_v1beta1_through_kueues_conversion_webhook(
    local_queue: Kubectl, kueue: Kueue
) -> None:
    """priorityClassRef (v1beta2) is priorityClassName + priorityClassSource in v1beta1: the
    apiserver asks Kueue's /convert for that, so a right answer proves the conversion webhook."""
    local_queue.apply(workload("converted", priority_class=PRIORITY_CLASS))
    old = local_queue.get_json("get", f"workloads.v1beta1.{GROUP}", "converted")
    assert old["apiVersion"] == f"{GROUP}/v1beta1"
    assert old["spec"]["priorityClassName"] == PRIORITY_CLASS
    assert old["spec"]["priorityClassSource"] == "kueue.x-k8s.io/workloadpriorityclass"
    assert "priorityClassRef" not in old["spec"]
    assert old["spec"]["podSets"][0]["count"] == PODS


def test_a_workload_within_quota_is_admitted_and_one_beyond_waits_until_the_first_finishes(
    local_queue: Kubectl, kueue: Kueue, queues: str
) -> None:
    k = local_queue
    k.apply(workload("first"))
    first = wait_for("the first Workload Admitted", lambda: condition_is(k, "first", "Admitted", "True"),
                     timeout=60, interval=0.3, diagnose=kueue.tail)  # fmt: skip
    conds = conditions(first)
    assert conds["QuotaReserved"]["status"] == "True"
    assert conds["QuotaReserved"]["reason"] == "QuotaReserved"
    assert conds["QuotaReserved"]["message"] == f"Quota reserved in ClusterQueue {queues}"
    assert conds["Admitted"]["reason"] == "Admitted"
    assert conds["Admitted"]["message"] == "The workload is admitted"
    admission = first["status"]["admission"]
    assert admission["clusterQueue"] == queues
    (assignment,) = admission["podSetAssignments"]
    assert assignment["name"] == "workers"
    assert assignment["count"] == PODS
    assert assignment["flavors"] == {"cpu": FLAVOR, GPU_RESOURCE: FLAVOR}
    assert assignment["resourceUsage"] == {"cpu": str(PODS), GPU_RESOURCE: str(GPU_QUOTA)}
    print("first Workload's status:", json.dumps(first["status"], indent=1))

    k.apply(workload("second"))
    second = wait_for("the second Workload without quota", lambda: condition_is(k, "second", "QuotaReserved", "False"),
                      timeout=60, interval=0.3, diagnose=kueue.tail)  # fmt: skip
    pending = conditions(second)["QuotaReserved"]
    print("second Workload's status:", json.dumps(second["status"], indent=1))
    assert pending["reason"] == "Pending"
    assert pending["message"] == (
        f"couldn't assign flavors to pod set workers: insufficient unused quota for {GPU_RESOURCE} in flavor "
        f"{FLAVOR}, {GPU_QUOTA} more needed"
    )
    assert "admission" not in second["status"]
    assert "Admitted" not in conditions(second)

    # What an integration does when its job ends: Finished=True on the Workload releases the quota.
    finished = {"type": "Finished", "status": "True", "reason": "Succeeded", "message": "done",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    patch = {"status": {"conditions": [*first["status"]["conditions"], finished]}}
    k.run("patch", WORKLOADS, "first", "--subresource=status", "--type=merge", "-p", json.dumps(patch))
    wait_for("the second Workload Admitted once the first finished",
             lambda: condition_is(k, "second", "Admitted", "True"), timeout=60, interval=0.3,
             diagnose=kueue.tail)  # fmt: skip
    print("first Workload's status once Finished:", json.dumps(k.get(WORKLOADS, "first")["status"], indent=1))  # type: ignore[index]


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_higher_priority_workload_preempts_and_is_admitted_once_the_integration_releases_the_quota(
    local_queue: Kubectl, kueue: Kueue
) -> None:
    """Kueue only marks the victim Evicted; releasing its quota is the integration's part (what
    Kueue's jobframework does for its own jobs once their pods are gone): QuotaReserved=False
    "Pending", Requeued=True "Preempted", no admission."""
    k = local_queue
    k.apply(workload("low", priority_class=LOW_CLASS))
    wait_for("the low Workload Admitted", lambda: condition_is(k, "low", "Admitted", "True"),
             timeout=60, interval=0.3, diagnose=kueue.tail)  # fmt: skip
    high = workload("high", priority_class=HIGH_CLASS)
    # The preemptor's job-uid label is what Kueue names in the victim's message.
    high["metadata"]["labels"] = {"kueue.x-k8s.io/job-uid": "uid-of-the-high-job"}
    k.apply(high)
    low = wait_for("the low Workload Evicted", lambda: condition_is(k, "low", "Evicted", "True"),
                   timeout=60, interval=0.3, diagnose=kueue.tail)  # fmt: skip
    print("low Workload's status once evicted:", json.dumps(low["status"], indent=1))
    print("high Workload's status meanwhile:", json.dumps(k.get(WORKLOADS, "high")["status"], indent=1))  # type: ignore[index]
    conds = conditions(low)
    assert conds["Evicted"]["reason"] == "Preempted"
    assert conds["Preempted"]["status"] == "True"
    assert conds["Preempted"]["reason"] == "InClusterQueue"
    assert conds["QuotaReserved"]["status"] == "True"  # still: nobody released it yet
    message = conds["Evicted"]["message"]
    uid = k.get(WORKLOADS, "high")["metadata"]["uid"]  # type: ignore[index]
    assert message == (
        f"Preempted to accommodate a workload (UID: {uid}, JobUID: uid-of-the-high-job) due to prioritization in "
        f"the ClusterQueue; preemptor path: /{CLUSTER_QUEUE}; preemptee path: /{CLUSTER_QUEUE}"
    )
    assert conds["Preempted"]["message"] == message

    def condition(type_: str, status: str, reason: str, text: str) -> dict[str, str]:
        return {"type": type_, "status": status, "reason": reason, "message": text, "lastTransitionTime": now()}

    released = [c for c in low["status"]["conditions"] if c["type"] not in ("QuotaReserved", "Admitted", "Requeued")]
    released += [
        condition("QuotaReserved", "False", "Pending", message),
        condition("Admitted", "False", "NoReservation", "The workload has no reservation"),
        condition("Requeued", "True", "Preempted", message),
    ]
    patch = {"status": {"conditions": released, "admission": None}}
    k.run("patch", WORKLOADS, "low", "--subresource=status", "--type=merge", "-p", json.dumps(patch))
    high = wait_for("the high Workload Admitted", lambda: condition_is(k, "high", "Admitted", "True"),
                    timeout=60, interval=0.3, diagnose=kueue.tail)  # fmt: skip
    print("high Workload's status once admitted:", json.dumps(high["status"], indent=1))
    low = wait_for("the low Workload pending again", lambda: condition_is(k, "low", "QuotaReserved", "False"),
                   timeout=60, interval=0.3, diagnose=kueue.tail)  # fmt: skip
    print("low Workload's status once requeued:", json.dumps(k.get(WORKLOADS, "low")["status"], indent=1))  # type: ignore[index]


def test_kueue_releases_its_finalizer_only_from_a_workload_without_owners(namespace: Kubectl, kueue: Kueue) -> None:
    """Kueue's own integrations create their Workloads with the kueue.x-k8s.io/resource-in-use
    finalizer and remove it themselves; Kueue's workload controller removes it only from a
    Workload that has no ownerReferences. So an external integration that sets the finalizer on
    a Workload it owns must remove it itself."""
    k = namespace
    k.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}})
    owner = k.get("configmap", "owner")
    assert owner is not None
    orphan, owned = workload("orphan", queue="absent"), workload("owned", queue="absent")
    for wl in (orphan, owned):
        wl["metadata"]["finalizers"] = ["kueue.x-k8s.io/resource-in-use"]
    owned["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                                             "uid": owner["metadata"]["uid"], "controller": True}]  # fmt: skip
    k.apply(orphan, owned)
    k.run("delete", WORKLOADS, "orphan", "owned", "--wait=false")
    wait_for("Kueue to release the orphan Workload", lambda: k.get(WORKLOADS, "orphan") is None,
             timeout=60, interval=0.3, diagnose=kueue.tail)  # fmt: skip
    left = k.get(WORKLOADS, "owned")
    assert left is not None
    assert left["metadata"]["deletionTimestamp"]
    assert left["metadata"]["finalizers"] == ["kueue.x-k8s.io/resource-in-use"]
    k.run("patch", WORKLOADS, "owned", "--type=merge", "-p", '{"metadata":{"finalizers":null}}')


def test_a_workload_naming_a_missing_local_queue_is_inadmissible(namespace: Kubectl, kueue: Kueue) -> None:
    namespace.apply(workload("lost", queue="absent"))
    lost = wait_for("the Workload inadmissible", lambda: condition_is(namespace, "lost", "QuotaReserved", "False"),
                    timeout=60, interval=0.3, diagnose=kueue.tail)  # fmt: skip
    cond = conditions(lost)["QuotaReserved"]
    print("lost Workload's status:", json.dumps(lost["status"], indent=1))
    assert (cond["reason"], cond["message"]) == ("Inadmissible", "LocalQueue absent doesn't exist")


def test_the_apiserver_calls_kueues_webhooks_for_kueues_resources_only(namespace: Kubectl, kueue: Kueue) -> None:
    k = namespace
    # Validating: refused with Kueue's message.
    with pytest.raises(KubectlError) as refused:
        k.run("create", "--dry-run=server", "-f", "-", input=json.dumps(INVALID_CLUSTER_QUEUE))
    assert CLUSTER_QUEUE_DENIED in refused.value.stderr
    assert "must match the name in coveredResources" in refused.value.stderr
    bad = workload("bad")
    bad["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]["requests"]["pods"] = "1"
    with pytest.raises(KubectlError) as refused:
        k.run("create", "--dry-run=server", "-f", "-", input=json.dumps(bad))
    assert 'admission webhook "vworkload.kb.io" denied the request' in refused.value.stderr
    assert "the key is reserved for internal kueue use" in refused.value.stderr
    # Mutating: Kueue's webhook adds its finalizer to a ClusterQueue.
    valid = {"apiVersion": V1BETA2, "kind": "ClusterQueue", "metadata": {"name": f"dry-{SUFFIX}"}, "spec": {}}
    created = json.loads(k.run("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(valid)).stdout)
    assert created["metadata"]["finalizers"] == ["kueue.x-k8s.io/resource-in-use"]
    # Exactly the kept webhooks, URL clientConfigs with the harness's CA (the rotator kept it).
    for kind, name in (("validatingwebhookconfiguration", "kueue-validating-webhook-configuration"),
                       ("mutatingwebhookconfiguration", "kueue-mutating-webhook-configuration")):  # fmt: skip
        config = k.get(kind, name)
        assert config is not None
        assert sorted(w["name"] for w in config["webhooks"]) == sorted(KEPT_WEBHOOKS[name])
        for webhook in config["webhooks"]:
            assert webhook["clientConfig"]["url"].startswith(kueue.url("/"))
            assert webhook["clientConfig"]["caBundle"] == kueue.pki.ca_bundle
            assert {g for r in webhook["rules"] for g in r["apiGroups"]} == {GROUP}
    # A plain batch Job (even one naming a queue) meets no Kueue webhook: not suspended.
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "plain", "labels": {"kueue.x-k8s.io/queue-name": LOCAL_QUEUE}},
           "spec": {"template": {"spec": {"restartPolicy": "Never",
                                          "containers": [{"name": "c", "image": "busybox"}]}}}}  # fmt: skip
    out = json.loads(k.run("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(job)).stdout)
    assert out["spec"]["suspend"] is False


def test_kueue_runs_as_its_own_service_account_with_its_own_rbac(
    local_queue: Kubectl, kueue: Kueue, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Kueue's shipped RBAC is all it needs here, DGXTrainingJob registered as an external
    framework included: it never calls the apiserver about DGXTrainingJobs by itself."""
    kueue.stop(purge=False)
    own = Kueue(kueue.plane, tmp_path_factory.mktemp("kueue-rbac"), service_account=True)
    try:
        own.start()
        local_queue.apply(workload("rbac"))
        wait_for("the Workload Admitted by Kueue as its ServiceAccount",
                 lambda: condition_is(local_queue, "rbac", "Admitted", "True"), timeout=60, interval=0.3,
                 diagnose=own.tail)  # fmt: skip
        whoami = subprocess.run([kueue.plane.kubectl_binary, "--kubeconfig", str(own.kubeconfig()), "auth", "whoami",
                                 "-o", "json"], capture_output=True, text=True, check=True)  # fmt: skip
        assert json.loads(whoami.stdout)["status"]["userInfo"]["username"] == (
            f"system:serviceaccount:kueue-system:{SERVICE_ACCOUNT}"
        )
        assert own.forbidden() == []
    finally:
        own.stop(purge=False)
        kueue.start()


def test_stop_takes_the_webhooks_away_and_start_brings_them_back(kueue: Kueue, kubectl: Kubectl) -> None:
    kueue.stop(purge=False)
    assert kubectl.get("validatingwebhookconfiguration", "kueue-validating-webhook-configuration") is None
    assert kubectl.get("mutatingwebhookconfiguration", "kueue-mutating-webhook-configuration") is None
    crd = kubectl.get("customresourcedefinition", WORKLOADS)
    assert crd is not None
    assert crd["spec"]["conversion"] == {"strategy": "None"}
    # Nothing calls the stopped manager: the apiserver alone accepts what only Kueue's webhook refuses.
    kubectl.run("create", "--dry-run=server", "-f", "-", input=json.dumps(INVALID_CLUSTER_QUEUE))
    kueue.start()
    assert kueue.webhook_answers()
