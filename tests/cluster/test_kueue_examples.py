"""docs/kueue.md's setup, done as an admin would do it, from the files in examples/kueue/, on the real
control plane: Kueue v0.17.0 configured as examples/kueue/kueue-config.yaml's Configuration says (its
frameworks, ``pod`` among them, and DGXTrainingJob as an external framework), running as its own
ServiceAccount with Kueue's shipped RBAC, with Kueue's pod webhooks installed (for this module's
namespaces, team-a and team-b, only: no other module's pods ever meet them).

The admin's part: the example's ClusterRole and ClusterRoleBinding (Kueue's read access to
DGXTrainingJobs), then flavors, priority classes, ClusterQueues, namespaces and LocalQueues, each
accepted by Kueue's webhooks; the four on-demand H100 nodes labelled ``kubedgx.io/capacity=norm``.
The user's part: examples/kueue/queued-job.yaml, adapted to the fake cluster as the other cluster
tests adapt jobs (a command job that idles, small resources), keeping the example's name, labels,
queue, priority class, instance and elastic counts. It gets exactly one Workload, priority 100 from
``research``, admitted on ``dgx-h100-norm``; its workers run on the norm nodes, and Kueue's pod
integration leaves them alone (no Workload of a Pod, no scheduling gate) because the job is a
registered, managed owner that Kueue may read. Deleting the job returns team-a's quota.

Quota per shape (docs/kueue.md): a 4-GPU H100 job reserves 4 nvidia.com/gpu and 4 x the catalog's
perGpu CPU and memory of dgx-h100-norm, and runs on a norm node. examples/mig-debug.yaml, queued in
team-a, reserves its one nvidia.com/mig-1g.10gb (and its slice's CPU and memory, no nvidia.com/gpu)
on dgx-a100-mig, and its worker runs on a DGX A100 sliced all-balanced under the mixed strategy in the
debug pool (one such node is added for the module and removed at its end). A MIG profile that
team-a's ClusterQueue does not cover holds its job with Kueue's "resource ... unavailable in
ClusterQueue".

Every fixed, cluster-scoped name of the examples (ClusterQueues team-a/team-b, ResourceFlavors
dgx-h100-norm/-spot, dgx-a100-mig, WorkloadPriorityClasses research/production, the ClusterRole/Binding,
the namespaces) is deleted when the module ends, and the nodes lose the capacity label.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import yaml

from dgx_operator.catalog import Catalog
from tests.cluster.controlplane import ControlPlane, dgx_node
from tests.cluster.kueue import DGX_FRAMEWORK, MUTATING, NAMESPACE, SERVICE_ACCOUNT, VALIDATING, Kueue, serving
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
from tests.e2e.jobs import EXAMPLES, command_job, live_workers, running_with, wait_job
from tests.e2e.kubectl import JOBS, Kubectl, condition, dig, wait_for

pytestmark = pytest.mark.timeout(600)

TIMEOUT = 90
KUEUE_EXAMPLES = EXAMPLES / "kueue"
#: The examples' namespaces (examples/kueue/local-queues.yaml): the only ones Kueue's pod webhooks reach.
TEAMS = ("team-a", "team-b")
NORM, SPOT, MIG = "dgx-h100-norm", "dgx-h100-spot", "dgx-a100-mig"
#: The MIG-sliced DGX A100 the example's dgx-a100-mig quota is sized from: MIG Manager's all-balanced.
ALL_BALANCED = {"1g.10gb": 16, "2g.20gb": 8, "3g.40gb": 8}
MIG_NODE = "dgxa100-80g-8-debug-mig-all-balanced-kueue-examples"
MIG_JOB = "mig-debug"
PRIORITY_CLASSES = ("research", "production")
JOB = "llama-finetune-queued"
PRODUCT = "nvidia.com/gpu.product"
KUEUE_SA = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
#: Configuration keys of the example that the harness sets for a local process (ports, certificates,
#: leader election): everything else of the example's Configuration is used as it is.
HARNESS_KEYS = ("apiVersion", "kind", "health", "metrics", "webhook", "leaderElection")


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((KUEUE_EXAMPLES / name).read_text()) if d]


def example_configuration() -> dict[str, Any]:
    """The Kueue Configuration of examples/kueue/kueue-config.yaml (its ConfigMap's key)."""
    (configmap,) = [d for d in documents("kueue-config.yaml") if d["kind"] == "ConfigMap"]
    config: dict[str, Any] = yaml.safe_load(configmap["data"]["controller_manager_config.yaml"])
    return config


def example_rbac() -> list[dict[str, Any]]:
    return [d for d in documents("kueue-config.yaml") if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]


def example_job() -> dict[str, Any]:
    """examples/kueue/queued-job.yaml on the fake cluster: its metadata (name, namespace, team,
    queue and priority-class labels), instance, elastic block, restart policy, backoff limit and
    maxDuration as they are; the trainer (image, torchrun command) replaced by the command job's
    idling shell, with small CPU and memory (tests/e2e/jobs.py command_job)."""
    (job,) = documents("queued-job.yaml")
    sleeper = command_job(job["metadata"]["name"])["spec"]
    spec = job["spec"]
    spec.pop("image", None)
    spec["command"], spec["args"], spec["resources"] = sleeper["command"], sleeper["args"], sleeper["resources"]
    return job


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kueue(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kueue]:
    """Kueue as examples/kueue/kueue-config.yaml configures it, as its own ServiceAccount, with its
    pod webhooks for the examples' namespaces (overrides conftest's ``kueue`` for this module)."""
    example = example_configuration()
    integrations = example["integrations"]
    running = Kueue(
        control_plane,
        tmp_path_factory.mktemp("kueue-examples"),
        frameworks=integrations["frameworks"],
        external_frameworks=integrations["externalFrameworks"],
        config={k: v for k, v in example.items() if k not in HARNESS_KEYS},
        service_account=True,
        pod_webhook_namespaces=TEAMS,
    )
    with serving(running):
        yield running


@pytest.fixture(scope="module")
def operator(kueue: Kueue, operator: Operator) -> Operator:
    """conftest's operator, started once this module's Kueue serves its API."""
    return operator


@pytest.fixture(scope="module")
def norm_nodes(kubectl: Kubectl, kueue: Kueue) -> Iterator[list[dict[str, Any]]]:
    """docs/kueue.md step 5: the on-demand H100 nodes labelled for the norm flavor (removed at the end)."""
    nodes = h100_norm_nodes(kubectl)
    assert len(nodes) >= 4, [n["metadata"]["name"] for n in nodes]
    for node in nodes:
        kubectl.run("label", "node", node["metadata"]["name"], f"{CAPACITY}=norm", "--overwrite")
    try:
        yield h100_norm_nodes(kubectl)
    finally:
        for node in nodes:
            kubectl.run("label", "node", node["metadata"]["name"], f"{CAPACITY}-", check=False)


@pytest.fixture(scope="module")
def mig_node(control_plane: ControlPlane, kubectl: Kubectl) -> Iterator[dict[str, Any]]:
    """One DGX A100 80GB of the debug pool, its GPUs cut all-balanced under the mixed strategy, as GPU
    Feature Discovery and the device plugin show it (tests/cluster/controlplane.py); deleted at the end."""
    inst = Catalog.load().get("dgxa100.80g.8.debug")
    control_plane.add_nodes([dgx_node(MIG_NODE, inst, mig=ALL_BALANCED, mig_config="all-balanced")])
    try:
        node = kubectl.get("node", MIG_NODE)
        assert node is not None
        yield node
    finally:
        kubectl.run("delete", "node", MIG_NODE, "--ignore-not-found", "--wait=false", check=False)


def apply_file(kubectl: Kubectl, name: str) -> None:
    """``kubectl apply -f examples/kueue/<name>``, as the docs say (raises if anything is refused)."""
    kubectl.run("apply", "-f", str(KUEUE_EXAMPLES / name))


def gone(kubectl: Kubectl, kind: str, names: tuple[str, ...]) -> bool:
    return all(kubectl.get(kind, name) is None for name in names)


@pytest.fixture(scope="module")
def examples(kubectl: Kubectl, kueue: Kueue, operator: Operator, norm_nodes: list[dict[str, Any]]) -> Iterator[None]:
    """docs/kueue.md steps 2 (the RBAC part) and 4, from the example files; all of it deleted at the
    end while the operator and Kueue still run (they release the finalizers)."""
    for team in TEAMS:
        assert kubectl.get("namespace", team) is None, f"namespace {team} exists before this module"
    try:
        kubectl.apply(*example_rbac())
        for name in ("flavors.yaml", "priority-classes.yaml", "cluster-queues.yaml", "local-queues.yaml"):
            apply_file(kubectl, name)
        yield
    finally:
        left: list[str] = []

        def delete(kind: str, names: tuple[str, ...], *, timeout: float) -> None:
            kubectl.run("delete", kind, *names, "--wait=false", "--ignore-not-found", check=False)
            try:
                wait_for(f"{kind} {', '.join(names)} deleted", lambda: gone(kubectl, kind, names), timeout=timeout)
            except AssertionError as exc:
                left.append(str(exc).splitlines()[0])

        # Every step runs whatever the previous one left; what is left is reported at the end.
        delete("namespace", TEAMS, timeout=120)  # the job's finalizer is the operator's, the queues' Kueue's
        delete("clusterqueue", TEAMS, timeout=60)
        delete("workloadpriorityclass", PRIORITY_CLASSES, timeout=60)
        # A ResourceFlavor's finalizer holds it while a ClusterQueue names it: deleted after them.
        delete("resourceflavor", (NORM, SPOT, MIG), timeout=60)
        for obj in example_rbac():
            delete(obj["kind"].lower(), (obj["metadata"]["name"],), timeout=30)
        assert left == [], left


# -- helpers -----------------------------------------------------------------------------------


def kueue_can(kubectl: Kubectl, verb: str) -> bool:
    """Whether Kueue's ServiceAccount may ``verb`` DGXTrainingJobs in every namespace."""
    proc = kubectl.run("auth", "can-i", verb, JOBS, "--all-namespaces", f"--as={KUEUE_SA}", check=False)
    return proc.stdout.strip() == "yes"


def reservation(kubectl: Kubectl, cluster_queue: str) -> dict[tuple[str, str], str]:
    """(flavor, resource) -> what ClusterQueue ``cluster_queue`` reserves, as Kueue reports it."""
    cq = kubectl.get("clusterqueue", cluster_queue) or {}
    return {
        (f["name"], r["name"]): str(r.get("total"))
        for f in dig(cq, "status", "flavorsReservation", default=[]) or []
        for r in f.get("resources") or []
    }


def free(kubectl: Kubectl, cluster_queue: str) -> bool:
    cq = kubectl.get("clusterqueue", cluster_queue) or {}
    return dig(cq, "status", "admittedWorkloads") == 0 and all(
        v in ("0", "None") for v in reservation(kubectl, cluster_queue).values()
    )


def owner_kinds(obj: Mapping[str, Any]) -> list[str]:
    return [str(o.get("kind")) for o in dig(obj, "metadata", "ownerReferences", default=[]) or []]


# -- the scenarios -----------------------------------------------------------------------------


def test_kueue_runs_with_the_examples_configuration_as_its_own_service_account(kueue: Kueue) -> None:
    written = yaml.safe_load(kueue.config_path.read_text())
    example = example_configuration()
    assert written["integrations"] == example["integrations"]
    assert "pod" in written["integrations"]["frameworks"]
    assert written["integrations"]["externalFrameworks"] == [DGX_FRAMEWORK]
    assert written["manageJobsWithoutQueueName"] is False
    assert "waitForPodsReady" not in written
    assert kueue.service_account


def test_the_examples_setup_is_accepted_and_active(
    mig_node: dict[str, Any], examples: None, kubectl: Kubectl, kueue: Kueue, norm_nodes: list[dict[str, Any]]
) -> None:
    # The example's RBAC is what lets Kueue read DGXTrainingJobs: Kueue's own grants nothing on them.
    for verb in ("get", "list", "watch"):
        assert kueue_can(kubectl, verb), f"{KUEUE_SA} may not {verb} {JOBS}"
    assert not kueue_can(kubectl, "update")
    kubectl.run("delete", "clusterrolebinding", "kueue-kubedgx-dgxtrainingjob-reader")
    try:
        assert not kueue_can(kubectl, "list"), "Kueue's shipped RBAC alone grants it access to DGXTrainingJobs"
    finally:
        kubectl.apply(*[o for o in example_rbac() if o["kind"] == "ClusterRoleBinding"])
    assert kueue_can(kubectl, "list")

    # The H100 flavors name the GPU product the (fake) H100 nodes report; the MIG flavor every label
    # of the sliced A100 node.
    products = {dig(n, "metadata", "labels", PRODUCT) for n in norm_nodes}
    flavors = {f["metadata"]["name"]: f for f in documents("flavors.yaml")}
    assert set(flavors) == {NORM, SPOT, MIG}
    for name in (NORM, SPOT):
        assert {flavors[name]["spec"]["nodeLabels"][PRODUCT]} == products, (
            f"examples/kueue/flavors.yaml's {name} names {flavors[name]['spec']['nodeLabels'][PRODUCT]}, "
            f"the H100 nodes report {products}"
        )
    mig_labels = flavors[MIG]["spec"]["nodeLabels"]
    assert mig_labels.items() <= mig_node["metadata"]["labels"].items(), (mig_labels, mig_node["metadata"]["labels"])
    assert mig_labels["nvidia.com/mig.strategy"] == "mixed"
    assert {dig(n, "metadata", "labels", CAPACITY) for n in norm_nodes} == {"norm"}

    for cq in TEAMS:
        wait_for(f"ClusterQueue {cq} Active",
                 lambda cq=cq: condition_true_of(kubectl.get("clusterqueue", cq), "Active"),  # type: ignore[misc]
                 timeout=TIMEOUT, interval=0.5, diagnose=kueue.tail)  # fmt: skip
        team = kubectl.in_namespace(cq)
        wait_for(f"LocalQueue {cq}/{cq} Active",
                 lambda team=team, cq=cq: condition_true_of(team.get("localqueue", cq), "Active"),  # type: ignore[misc]
                 timeout=TIMEOUT, interval=0.5, diagnose=kueue.tail)  # fmt: skip
        wait_for(f"the default ServiceAccount of {cq}", lambda team=team: team.get("serviceaccount", "default"),  # type: ignore[misc]
                 timeout=120, interval=0.2)  # fmt: skip
    for name in PRIORITY_CLASSES:
        assert kubectl.get("workloadpriorityclass", name) is not None
    assert dig(kubectl.get("workloadpriorityclass", "research"), "value") == 100

    # Kueue's pod webhooks reach the examples' namespaces, and only those.
    for config_kind, config_name, webhook_name in (
        ("mutatingwebhookconfiguration", MUTATING, "mpod.kb.io"),
        ("validatingwebhookconfiguration", VALIDATING, "vpod.kb.io"),
    ):
        (webhook,) = [w for w in (kubectl.get(config_kind, config_name) or {})["webhooks"] if w["name"] == webhook_name]
        assert webhook["failurePolicy"] == "Fail"
        expressions = webhook["namespaceSelector"]["matchExpressions"]
        assert {"key": "kubernetes.io/metadata.name", "operator": "In", "values": sorted(TEAMS)} in expressions
    # A plain pod naming the queue is Kueue's: the mutating webhook gates it (server-side dry run).
    container = {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "10m"}}}
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain", "labels": {QUEUE: "team-a"}},
             "spec": {"containers": [container]}}  # fmt: skip
    team_a = kubectl.in_namespace("team-a")
    out = json.loads(team_a.run("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(plain)).stdout)
    gates = [g["name"] for g in dig(out, "spec", "schedulingGates", default=[]) or []]
    assert "kueue.x-k8s.io/admission" in gates, out["spec"]
    assert dig(out, "metadata", "labels", "kueue.x-k8s.io/managed") == "true", out["metadata"]


def test_the_example_job_is_queued_once_admitted_on_norm_and_its_workers_are_left_alone(
    examples: None, kubectl: Kubectl, operator: Operator, kueue: Kueue
) -> None:
    team_a = kubectl.in_namespace("team-a")
    job = example_job()
    assert job["metadata"]["namespace"] == "team-a"
    assert job["metadata"]["labels"][QUEUE] == "team-a"
    assert job["metadata"]["labels"][PRIORITY] == "research"
    assert (job["spec"]["elastic"]["minNodes"], job["spec"]["elastic"]["maxNodes"]) == (1, 2)
    kubectl.apply(job)
    body = wait_job(team_a, JOB, "2/2 Running", running_with(2), timeout=TIMEOUT)

    # Exactly one Workload, the job's, with the research class's priority, admitted on norm.
    (wl,) = workloads_of(team_a, JOB)
    assert dig(wl, "spec", "queueName") == "team-a"
    assert dig(wl, "spec", "priority") == 100
    assert dig(wl, "spec", "priorityClassRef") == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "research",
    }
    assert (dig(wl, "spec", "podSets", 0, "count"), dig(wl, "spec", "podSets", 0, "minCount")) == (2, 1)
    assert condition_true_of(wl, "Admitted"), wl.get("status")
    assert dig(wl, "status", "admission", "clusterQueue") == "team-a"
    podset = assignment(wl)
    assert podset["count"] == 2
    assert set(podset["flavors"].values()) == {NORM}, podset
    # Kueue writes the ClusterQueue's status after the admission, on its own schedule (0 was seen
    # under load right after the workers ran).
    wait_for(
        "team-a's ClusterQueue to reserve the job's 16 norm GPUs",
        lambda: reservation(kubectl, "team-a").get((NORM, "nvidia.com/gpu")) == "16",
        timeout=TIMEOUT,
        interval=0.3,
        diagnose=lambda: str(reservation(kubectl, "team-a")),
    )

    # Kueue's pod integration did not queue the workers a second time.
    everything = team_a.select(WORKLOADS)
    assert [w["metadata"]["name"] for w in everything] == [wl["metadata"]["name"]], everything
    assert not [w for w in everything if "Pod" in owner_kinds(w)]
    pods = live_workers(team_a, JOB)
    assert len(pods) == 2
    nodes = set()
    for pod in pods:
        meta = pod["metadata"]
        (owner,) = [o for o in meta["ownerReferences"] if o.get("controller")]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("DGXTrainingJob", JOB, body["metadata"]["uid"])
        assert meta["labels"][QUEUE] == "team-a"  # the job's label, copied: Kueue's webhook saw a queued pod
        assert not dig(pod, "spec", "schedulingGates"), pod["spec"]
        assert "kueue.x-k8s.io/managed" not in meta["labels"], meta["labels"]
        assert not [f for f in meta.get("finalizers") or [] if f.startswith("kueue.x-k8s.io/")], meta
        assert dig(pod, "status", "phase") == "Running"
        # Placed by the admitted flavor's labels, on a node that carries them.
        assert dig(pod, "spec", "nodeSelector", CAPACITY) == "norm", pod["spec"]
        node = node_of(kubectl, pod)
        assert dig(node, "metadata", "labels", CAPACITY) == "norm"
        assert dig(node, "metadata", "labels", PRODUCT) == "NVIDIA-H100-80GB-HBM3"
        nodes.add(node["metadata"]["name"])
    assert len(nodes) == 2

    # Deleting the job releases its Workload and team-a's quota.
    team_a.delete(JOBS, JOB)
    gone_in = 2 * TIMEOUT  # garbage collection after the job's finalizer goes (its workers ended)
    wait_for("its Workload gone", lambda: team_a.get(WORKLOADS, wl["metadata"]["name"]) is None, timeout=gone_in)
    wait_for("team-a's quota free", lambda: free(kubectl, "team-a"), timeout=gone_in, interval=0.5,
             diagnose=lambda: json.dumps(reservation(kubectl, "team-a")))  # fmt: skip
    assert team_a.select(WORKLOADS) == []


def queued_in_team_a(job: dict[str, Any]) -> dict[str, Any]:
    """``job`` in namespace team-a, handed to its LocalQueue."""
    job["metadata"]["namespace"] = "team-a"
    job["metadata"].setdefault("labels", {})[QUEUE] = "team-a"
    return job


def trainer_requests(workload: Mapping[str, Any]) -> dict[str, str]:
    """What the Workload's pod set says the trainer container requests (what Kueue charges)."""
    (trainer,) = [
        c for c in dig(workload, "spec", "podSets", 0, "template", "spec", "containers") if c["name"] == "trainer"
    ]
    return dict(trainer["resources"]["requests"])


def reserved(kubectl: Kubectl, cluster_queue: str) -> dict[tuple[str, str], str]:
    """The ClusterQueue's reservation without the resources it reserves none of."""
    return {k: v for k, v in reservation(kubectl, cluster_queue).items() if v not in ("0", "None")}


def release(kubectl: Kubectl, team: Kubectl, job: str, workload: str) -> None:
    """Delete the job; its Workload goes and team-a's quota is free again."""
    team.delete(JOBS, job)
    gone_in = 2 * TIMEOUT
    wait_for(f"{job}'s Workload gone", lambda: team.get(WORKLOADS, workload) is None, timeout=gone_in)
    wait_for("team-a's quota free", lambda: free(kubectl, "team-a"), timeout=gone_in, interval=0.5,
             diagnose=lambda: json.dumps(reservation(kubectl, "team-a")))  # fmt: skip


def test_a_4_gpu_job_reserves_4_gpus_and_their_share_of_cpu_and_memory(
    examples: None, kubectl: Kubectl, operator: Operator, kueue: Kueue
) -> None:
    """docs/kueue.md, "Quota per shape": a sub-node worker is charged what it requests, 4 GPUs and 4 x
    the catalog's perGpu, not a node."""
    team_a = kubectl.in_namespace("team-a")
    name, instance = "four-gpus", "dgxh100.80g.4.norm"
    job = queued_in_team_a(command_job(name))
    job["spec"]["instance"] = instance
    job["spec"].pop("resources")  # the catalog's share of the node, as a user's job gets it
    kubectl.apply(job)
    wait_job(team_a, name, "1/1 Running", running_with(1), timeout=TIMEOUT)

    (wl,) = workloads_of(team_a, name)
    cpu, memory, _ = Catalog.load().get(instance).requests()
    assert (cpu, memory) == ("96", "880Gi")
    assert trainer_requests(wl) == {"cpu": cpu, "memory": memory, "nvidia.com/gpu": "4"}
    assert set(assignment(wl)["flavors"].values()) == {NORM}, assignment(wl)
    expected = {(NORM, "cpu"): cpu, (NORM, "memory"): memory, (NORM, "nvidia.com/gpu"): "4"}
    wait_for("team-a's ClusterQueue to reserve 4 norm GPUs and their share",
             lambda: reserved(kubectl, "team-a") == expected,
             timeout=TIMEOUT, interval=0.3, diagnose=lambda: str(reserved(kubectl, "team-a")))  # fmt: skip
    (pod,) = live_workers(team_a, name)
    node = node_of(kubectl, pod)
    assert dig(node, "metadata", "labels", PRODUCT) == "NVIDIA-H100-80GB-HBM3"
    assert dig(node, "metadata", "labels", CAPACITY) == "norm"

    release(kubectl, team_a, name, wl["metadata"]["name"])


def test_the_mig_example_reserves_its_slice_on_the_mig_flavor_and_runs_on_the_sliced_node(
    mig_node: dict[str, Any], examples: None, kubectl: Kubectl, operator: Operator, kueue: Kueue
) -> None:
    """examples/mig-debug.yaml as it is, queued in team-a: one nvidia.com/mig-1g.10gb of quota on
    dgx-a100-mig (and the slice's CPU and memory, no nvidia.com/gpu anywhere), and its worker on the
    all-balanced node with the flavor's labels."""
    team_a = kubectl.in_namespace("team-a")
    (job,) = [d for d in yaml.safe_load_all((EXAMPLES / "mig-debug.yaml").read_text()) if d]
    assert (job["metadata"]["name"], job["spec"]["instance"]) == (MIG_JOB, "dgxa100.80g.mig-1g.10gb.debug")
    kubectl.apply(queued_in_team_a(job))
    wait_job(team_a, MIG_JOB, "1/1 Running", running_with(1), timeout=TIMEOUT)

    (wl,) = workloads_of(team_a, MIG_JOB)
    slice_resource = "nvidia.com/mig-1g.10gb"
    assert trainer_requests(wl) == {"cpu": "4", "memory": "31Gi", slice_resource: "1"}
    assert assignment(wl)["flavors"] == {"cpu": MIG, "memory": MIG, slice_resource: MIG}, assignment(wl)
    expected = {(MIG, "cpu"): "4", (MIG, "memory"): "31Gi", (MIG, slice_resource): "1"}
    wait_for("team-a's ClusterQueue to reserve one 1g.10gb slice on dgx-a100-mig",
             lambda: reserved(kubectl, "team-a") == expected,
             timeout=TIMEOUT, interval=0.3, diagnose=lambda: str(reserved(kubectl, "team-a")))  # fmt: skip
    (pod,) = live_workers(team_a, MIG_JOB)
    assert dig(pod, "spec", "nodeName") == MIG_NODE
    selector = dig(pod, "spec", "nodeSelector")
    assert selector.items() >= {"nvidia.com/mig.strategy": "mixed", PRODUCT: "NVIDIA-A100-SXM4-80GB",
                                CAPACITY: "debug"}.items(), selector  # fmt: skip
    (trainer,) = [c for c in pod["spec"]["containers"] if c["name"] == "trainer"]
    assert trainer["resources"]["limits"][slice_resource] == "1"
    assert "nvidia.com/gpu" not in trainer["resources"]["limits"]

    release(kubectl, team_a, MIG_JOB, wl["metadata"]["name"])


def test_a_mig_profile_the_queue_does_not_cover_is_held_with_kueues_words(
    mig_node: dict[str, Any], examples: None, kubectl: Kubectl, operator: Operator, kueue: Kueue
) -> None:
    """team-a's ClusterQueue of the example without nvidia.com/mig-3g.40gb (in coveredResources and in
    every flavor; the file is applied again at the end): a 3g.40gb job is held, reserving nothing, with
    Kueue's "resource ... unavailable in ClusterQueue". Its CPU and memory find dgx-a100-mig, so that
    is the one reason Kueue can give, in whatever order it checks the job's resources."""
    team_a = kubectl.in_namespace("team-a")
    profile, name = "nvidia.com/mig-3g.40gb", "uncovered-slice"
    (cq,) = [d for d in documents("cluster-queues.yaml") if d["metadata"]["name"] == "team-a"]
    (group,) = cq["spec"]["resourceGroups"]
    group["coveredResources"].remove(profile)
    for flavor in group["flavors"]:
        flavor["resources"] = [r for r in flavor["resources"] if r["name"] != profile]

    def covered() -> bool:  # as Kueue's cache has it: the ClusterQueue's status lists what it covers
        return (MIG, profile) in reservation(kubectl, "team-a")

    try:
        kubectl.apply(cq)
        wait_for(f"Kueue to drop {profile} from team-a", lambda: not covered(), timeout=TIMEOUT, interval=0.3)
        job = queued_in_team_a(command_job(name))
        job["spec"]["instance"] = "dgxa100.80g.mig-3g.40gb.norm"
        kubectl.apply(job)
        words = f"couldn't assign flavors to pod set workers: resource {profile} unavailable in ClusterQueue"

        def held() -> dict[str, Any] | None:
            cond = condition(team_a.get(JOBS, name) or {}, "Suspended")
            return cond if cond is not None and words in str(cond.get("message")) else None

        cond = wait_for(f"{name} Suspended with {words!r}", held, timeout=TIMEOUT, interval=0.5,
                        diagnose=lambda: json.dumps(dig(team_a.get(JOBS, name), "status", default=None)))  # fmt: skip
        assert (cond["status"], cond["reason"]) == ("True", "Pending"), cond
        (wl,) = workloads_of(team_a, name)
        assert not condition_true_of(wl, "QuotaReserved"), wl.get("status")
        assert live_workers(team_a, name) == []
        assert reserved(kubectl, "team-a") == {}
        release(kubectl, team_a, name, wl["metadata"]["name"])
    finally:
        team_a.run("delete", JOBS, name, "--ignore-not-found", "--wait=false", check=False)
        apply_file(kubectl, "cluster-queues.yaml")
    wait_for(f"Kueue to cover {profile} in team-a again", covered, timeout=TIMEOUT, interval=0.3)


def test_neither_the_operator_nor_kueue_was_refused_anything(operator: Operator, kueue: Kueue) -> None:
    assert operator.forbidden() == [], operator.forbidden()
    assert kueue.forbidden() == [], kueue.forbidden()
