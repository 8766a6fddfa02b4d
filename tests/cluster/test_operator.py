"""The operator on the real control plane: authenticated as the chart's ServiceAccount (so every call
passes the chart's RBAC), its workers placed by the real scheduler on fake DGX nodes, their fates
played by kwok, the node lifecycle controller and the garbage collector doing what they do.

Each scenario asserts through what a user sees (the job's phase, conditions, restarts, its pods and
their nodes), and at the end of the module no call of the operator was refused (no 403).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from dgx_operator.catalog import Catalog
from tests.cluster.controlplane import (
    EVICT_LABEL,
    EXIT_CODE_LABEL,
    LOSSY_LABEL,
    MESSAGE_ANNOTATION,
    NODE_NOT_READY_LABEL,
    ControlPlane,
)
from tests.cluster.operator import Operator
from tests.e2e.jobs import (
    command_job,
    condition_true,
    interactive_trainer_job,
    live_workers,
    phase_is,
    running_with,
    running_workers,
    trainer_config_of,
    wait_gone,
    wait_job,
    worker_pods,
)
from tests.e2e.kubectl import JOBS, Kubectl, condition, dig, reasons, wait_for

CATALOG = Catalog.load()
TIMEOUT = 60


def label(k: Kubectl, pod: str, key: str, value: str) -> None:
    k.run("label", "pod", pod, f"{key}={value}", "--overwrite")


def exit_worker(k: Kubectl, pod: str, code: int, message: str | None = None) -> None:
    """The worker's program exits with ``code`` (and leaves ``message`` as its termination message)."""
    if message is not None:
        k.run("annotate", "pod", pod, f"{MESSAGE_ANNOTATION}={message}", "--overwrite")
    label(k, pod, EXIT_CODE_LABEL, str(code))


def pods_by_index(k: Kubectl, job: str) -> dict[str, dict[str, Any]]:
    return {dig(p, "metadata", "labels", "kubedgx.io/replica-index"): p for p in live_workers(k, job)}


def attempt(pod: dict[str, Any]) -> int:
    return int(dig(pod, "metadata", "labels", "kubedgx.io/attempt"))


def node_labels(k: Kubectl, pod: dict[str, Any]) -> dict[str, str]:
    node = k.get("node", str(dig(pod, "spec", "nodeName")))
    labels: dict[str, str] = dig(node, "metadata", "labels", default={})
    return labels


# -- placement -------------------------------------------------------------------------------


def test_an_elastic_job_runs_one_worker_per_node_of_its_instance_type(operator: Operator, namespace: Kubectl) -> None:
    namespace.apply(command_job("placed", min_nodes=2, max_nodes=3))
    wait_job(namespace, "placed", "3/3 workers Running", running_with(3), timeout=TIMEOUT)
    pods = running_workers(namespace, "placed")
    nodes = {dig(p, "spec", "nodeName") for p in pods}
    assert len(nodes) == 3, "one worker per node (each asks all 8 GPUs of one)"
    inst = CATALOG.get("dgxh100.80g.8.norm")
    for pod in pods:
        labels = node_labels(namespace, pod)
        assert labels[inst.labels.product] in inst.products
        assert labels[inst.labels.count] == str(inst.gpus)
        assert labels.get("kubedgx.io/capacity") in (None, "norm")
        assert dig(pod, "spec", "priorityClassName") == "kubedgx-normal"
        assert dig(pod, "spec", "priority") == dig(namespace.get("priorityclass", "kubedgx-normal"), "value")
        env = {e["name"]: e.get("value") for e in dig(pod, "spec", "containers", 0, "env")}
        assert env["PET_NNODES"] == "2:3"


def test_an_elastic_job_runs_on_fewer_nodes_than_max_when_no_more_fit(operator: Operator, namespace: Kubectl) -> None:
    """Four schedulable H100 nodes, maxNodes 6: Running on four, the other two Pending, unschedulable."""
    namespace.apply(command_job("wide", min_nodes=2, max_nodes=6))
    job = wait_job(namespace, "wide", "Running on 4", lambda j: dig(j, "status", "phase") == "Running"
                   and len(running_workers(namespace, "wide")) == 4, timeout=TIMEOUT)  # fmt: skip
    assert str(dig(job, "status", "nodes")).endswith("/6")
    pending = [p for p in live_workers(namespace, "wide") if dig(p, "status", "phase") == "Pending"]
    assert len(pending) == 2
    env = {
        e["name"]: e.get("value") for e in dig(running_workers(namespace, "wide")[0], "spec", "containers", 0, "env")
    }
    assert env["PET_NNODES"] == "2:6"


def test_workers_asking_part_of_a_node_run_one_per_node_and_share_with_other_jobs(
    operator: Operator, namespace: Kubectl
) -> None:
    """2 of a node's 8 GPUs per worker: four of one job would fit on one node by resources, but the
    hard hostname spread (render.pod.topology_spread) puts them on four nodes and leaves the fifth
    Pending, Unschedulable, on the four H100 nodes; another job's worker may still share a node."""
    job = command_job("parts", min_nodes=2, max_nodes=5)
    job["spec"]["resources"]["gpu"] = 2
    namespace.apply(job)
    wait_job(namespace, "parts", "Running on 4", lambda j: dig(j, "status", "phase") == "Running"
             and len(running_workers(namespace, "parts")) == 4, timeout=TIMEOUT)  # fmt: skip
    nodes = {dig(p, "spec", "nodeName") for p in running_workers(namespace, "parts")}
    assert len(nodes) == 4, "one worker of a job per node"
    pending = [p for p in live_workers(namespace, "parts") if dig(p, "status", "phase") == "Pending"]
    assert len(pending) == 1
    scheduled = condition(pending[0], "PodScheduled")
    assert scheduled is not None
    assert "topology spread" in str(scheduled.get("message")), scheduled
    other = command_job("sharer", min_nodes=1, max_nodes=1)
    other["spec"]["resources"]["gpu"] = 2
    namespace.apply(other)
    wait_job(namespace, "sharer", "1/1 workers Running", running_with(1), timeout=TIMEOUT)
    assert {dig(p, "spec", "nodeName") for p in running_workers(namespace, "sharer")} <= nodes


def test_a_spot_job_lands_on_spot_nodes_only(operator: Operator, namespace: Kubectl) -> None:
    job = command_job("spot", min_nodes=2, max_nodes=2)
    job["spec"]["instance"] = "dgxh100.80g.8.spot"
    namespace.apply(job)
    wait_job(namespace, "spot", "2/2 workers Running", running_with(2), timeout=TIMEOUT)
    spot = CATALOG.get("dgxh100.80g.8.spot")
    for pod in running_workers(namespace, "spot"):
        labels = node_labels(namespace, pod)
        assert all(labels.get(k) == v for k, v in spot.node_selector.items()), labels


def test_a_multi_node_nvlink_job_stays_in_one_nvlink_domain(operator: Operator, namespace: Kubectl) -> None:
    job = command_job("nvl", min_nodes=2, max_nodes=2)
    job["spec"]["instance"] = "dgxgb200.186g.4.norm"
    namespace.apply(job)
    wait_job(namespace, "nvl", "2/2 workers Running", running_with(2), timeout=TIMEOUT)
    gb200 = CATALOG.get("dgxgb200.186g.4.norm")
    cliques = {node_labels(namespace, p)[gb200.labels.clique] for p in running_workers(namespace, "nvl")}
    assert len(cliques) == 1, cliques


def test_a_job_nothing_fits_stays_pending_then_times_out(operator: Operator, namespace: Kubectl) -> None:
    job = command_job("nofit", min_nodes=1, max_nodes=1)
    job["spec"]["instance"] = "dgxh200.141g.8.norm"  # no H200 node in this cluster
    job["spec"]["maxPending"] = "30s"
    namespace.apply(job)
    wait_job(namespace, "nofit", "Pending", phase_is("Pending"), timeout=TIMEOUT)
    (pod,) = worker_pods(namespace, "nofit")
    wait_for("the scheduler to call the worker Unschedulable", lambda: any(
        c.get("reason") == "Unschedulable" for c in dig(namespace.get("pod", pod["metadata"]["name"]), "status",
        "conditions", default=[]) or []), timeout=TIMEOUT, interval=0.5)  # fmt: skip
    # Issue 13.4: the job says why, in the scheduler's own words, and `kubectl get` shows the reason.
    said = wait_for("the job's Running condition to carry the scheduler's reason", lambda: (c := condition(
        namespace.get(JOBS, "nofit"), "Running")) and c.get("reason") == "Unschedulable" and c, timeout=TIMEOUT,
        interval=0.5)  # fmt: skip
    scheduler = next(c for c in dig(namespace.get("pod", pod["metadata"]["name"]), "status", "conditions")
                     if c.get("type") == "PodScheduled")  # fmt: skip
    assert f"{pod['metadata']['name']}: Unschedulable: {scheduler['message']}" in said["message"], said
    table = namespace.run("get", JOBS, "nofit").stdout
    assert table.split()[:6] == ["NAME", "PHASE", "INSTANCE", "NODES", "RESTARTS", "REASON"], table
    assert "Unschedulable" in table.splitlines()[1], table
    failed = wait_job(namespace, "nofit", "Failed", phase_is("Failed"), timeout=TIMEOUT, fail_on=())
    assert condition_true(failed, "Failed")
    ended = condition(failed, "Failed")
    assert ended is not None
    assert ended.get("reason") == "PendingTimeout", ended
    assert "Unschedulable" in ended.get("message", ""), ended
    wait_for("its worker deleted", lambda: live_workers(namespace, "nofit") == [], timeout=TIMEOUT, interval=0.5)


def test_a_worker_the_apiserver_refuses_fails_the_job_with_its_message(operator: Operator, namespace: Kubectl) -> None:
    """Issue 13.3 on the real PodSecurity admission plugin (no webhook in this module, so the job
    itself is admitted): the worker's create is refused with 403 for good; the job fails at once
    with the apiserver's sentence, one event, no retry loop and no HTTP dump."""
    ns = str(namespace.namespace)
    namespace.run("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted", "--overwrite")
    namespace.apply(command_job("refused", min_nodes=1, max_nodes=1))
    failed = wait_job(namespace, "refused", "Failed", phase_is("Failed"), timeout=TIMEOUT, fail_on=())
    ended = condition(failed, "Failed")
    assert ended is not None
    assert ended.get("reason") == "CreateRefused", ended
    assert "the apiserver refused to create Pod refused-worker-0" in ended["message"], ended
    assert 'violates PodSecurity "restricted:latest"' in ended["message"], ended
    assert worker_pods(namespace, "refused") == []
    events = wait_for("the job's CreateRefused event", lambda: (e := namespace.events_for("DGXTrainingJob", "refused"))
                      and "CreateRefused" in reasons(e) and e, timeout=30, interval=0.5)  # fmt: skip
    assert reasons(events).count("CreateRefused") == 1, reasons(events)
    assert "CreateFailed" not in reasons(events)
    assert all("HTTP response headers" not in str(e.get("message")) for e in events)


def test_a_worker_a_quota_refuses_waits_with_a_condition_until_the_quota_has_room(
    operator: Operator, namespace: Kubectl
) -> None:
    """Issue 13.3: a ResourceQuota's 403 is not the job's fault. The job runs on what it has
    (minNodes 1), WorkersPending says QuotaExceeded with the quota plugin's message, and the worker
    is created once the quota is lifted, without anyone touching the job."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "one-pod"},
        "spec": {"hard": {"pods": "1"}},
    }
    namespace.apply(quota)
    wait_for("the quota controller to compute the quota's usage", lambda: dig(namespace.get("resourcequota",
             "one-pod"), "status", "hard", "pods") == "1", timeout=TIMEOUT, interval=0.5)  # fmt: skip
    namespace.apply(command_job("quota", min_nodes=1, max_nodes=2))
    wait_job(namespace, "quota", "Running on one of two workers", lambda j: dig(j, "status", "phase") == "Running"
             and dig(j, "status", "nodes") == "1/2", timeout=TIMEOUT)  # fmt: skip
    pending = wait_for("WorkersPending: QuotaExceeded", lambda: (c := condition(namespace.get(JOBS, "quota"),
                       "WorkersPending")) and c.get("status") == "True" and c, timeout=TIMEOUT,
                       interval=0.5)  # fmt: skip
    assert pending["reason"] == "QuotaExceeded", pending
    assert "exceeded quota: one-pod" in pending["message"], pending
    assert [dig(p, "metadata", "labels", "kubedgx.io/replica-index") for p in worker_pods(namespace, "quota")] == ["0"]
    namespace.run("delete", "resourcequota", "one-pod")
    wait_job(namespace, "quota", "both workers Running once the quota is gone", running_with(2), timeout=TIMEOUT)
    created = condition(namespace.get(JOBS, "quota"), "WorkersPending")
    assert created is not None
    assert (created["status"], created["reason"]) == ("False", "WorkersCreated"), created
    assert dig(namespace.get(JOBS, "quota"), "status", "restarts") in (0, None)


# -- exits and restarts ----------------------------------------------------------------------


def test_worker_zero_exiting_zero_succeeds_the_job_and_deletes_the_rest(operator: Operator, namespace: Kubectl) -> None:
    namespace.apply(command_job("done", min_nodes=2, max_nodes=2))
    wait_job(namespace, "done", "2/2 workers Running", running_with(2), timeout=TIMEOUT)
    pods = pods_by_index(namespace, "done")
    summary = {"status": "Succeeded", "progress": {"step": 7, "totalSteps": 7}}
    exit_worker(namespace, pods["0"]["metadata"]["name"], 0, json.dumps(summary))
    job = wait_job(namespace, "done", "Succeeded", phase_is("Succeeded"), timeout=TIMEOUT)
    assert condition_true(job, "Succeeded")
    assert condition_true(job, "Finished")
    assert dig(condition(job, "Finished"), "reason") == "Completed"
    assert dig(job, "status", "restarts") in (0, None)
    assert dig(job, "status", "progress", "step") == 7
    others = pods["1"]["metadata"]["name"]
    wait_for("worker 1 deleted", lambda: others not in {p["metadata"]["name"] for p in live_workers(namespace, "done")},
             timeout=TIMEOUT, interval=0.5)  # fmt: skip


def test_a_nan_in_a_progress_report_never_wedges_the_status(operator: Operator, namespace: Kubectl) -> None:
    """Issue 13.6 against the real apiserver, which refuses a body that is not JSON: a diverged
    loss (NaN) in the trainer's progress annotation is read as null, so the status patch carrying
    the step goes through, and later reports still arrive."""
    namespace.apply(command_job("nan", min_nodes=1, max_nodes=1))
    wait_job(namespace, "nan", "Running", running_with(1), timeout=TIMEOUT)
    (pod,) = live_workers(namespace, "nan")
    name = pod["metadata"]["name"]
    namespace.run("annotate", "pod", name, 'kubedgx.io/progress={"step": 5, "loss": NaN, "learningRate": Infinity}')
    job = wait_job(namespace, "nan", "step 5 reported", lambda j: dig(j, "status", "progress", "step") == 5,
                   timeout=TIMEOUT)  # fmt: skip
    assert dig(job, "status", "progress", "loss") is None
    assert dig(job, "status", "progress", "learningRate") is None
    namespace.run("annotate", "pod", name, 'kubedgx.io/progress={"step": 6, "loss": 1.25}', "--overwrite")
    job = wait_job(namespace, "nan", "step 6 reported", lambda j: dig(j, "status", "progress", "step") == 6,
                   timeout=TIMEOUT)  # fmt: skip
    assert dig(job, "status", "progress", "loss") == 1.25


def test_never_fails_the_job_on_the_first_worker_failure(operator: Operator, namespace: Kubectl) -> None:
    job = command_job("once", min_nodes=2, max_nodes=2)
    job["spec"]["restartPolicy"] = "Never"
    namespace.apply(job)
    wait_job(namespace, "once", "2/2 Running", running_with(2), timeout=TIMEOUT)
    crashed = pods_by_index(namespace, "once")["1"]["metadata"]["name"]
    exit_worker(namespace, crashed, 2)
    failed = wait_job(namespace, "once", "Failed", phase_is("Failed"), timeout=TIMEOUT, fail_on=())
    failure = [c for c in dig(failed, "status", "conditions", default=[]) if c.get("type") == "Failed"]
    assert [c.get("reason") for c in failure] == ["WorkerFailed"], failure
    assert crashed in failure[0].get("message", ""), failure
    assert dig(failed, "status", "restarts") in (0, None)
    wait_for("the other worker stopped", lambda: running_workers(namespace, "once") == [], timeout=TIMEOUT,
             interval=0.5)  # fmt: skip
    assert dig(namespace.get("pod", crashed), "status", "phase") == "Failed", "the failed worker is kept (its logs)"


def test_kubectl_wait_for_finished_returns_when_a_job_fails(operator: Operator, namespace: Kubectl) -> None:
    """Issue 17.5 with kubectl's own wait: `--for=condition=Finished` is "until it ends". It does not
    return while the job runs, returns 0 once a worker's failure ends it (where the Succeeded
    condition never comes true), and `kubectl get` then shows why in its REASON column."""
    job = command_job("ends", min_nodes=1, max_nodes=1)
    job["spec"]["restartPolicy"] = "Never"
    namespace.apply(job)
    wait_job(namespace, "ends", "Running", running_with(1), timeout=TIMEOUT)
    before = condition(namespace.get(JOBS, "ends"), "Finished")
    assert before is not None
    assert (before["status"], before["reason"]) == ("False", "Running"), before

    def wait(condition_type: str, timeout: str) -> subprocess.CompletedProcess[str]:
        return namespace.run("wait", f"{JOBS}/ends", f"--for=condition={condition_type}", f"--timeout={timeout}",
                             check=False, timeout=TIMEOUT + 30)  # fmt: skip

    running = wait("Finished", "2s")  # kubectl gives up after 2 s: the job has not ended
    assert running.returncode != 0, running
    assert "timed out" in running.stderr, running

    (pod,) = live_workers(namespace, "ends")
    exit_worker(namespace, pod["metadata"]["name"], 1)
    ended = wait("Finished", f"{TIMEOUT}s")
    assert ended.returncode == 0, ended
    assert "condition met" in ended.stdout, ended
    # Success or failure: the phase says which (docs/operator.md, README).
    phase = namespace.run("get", JOBS, "ends", "-o", "jsonpath={.status.phase}").stdout
    assert phase == "Failed", phase
    never = wait("Succeeded", "2s")
    assert never.returncode != 0, "a failed job never meets --for=condition=Succeeded"
    assert "timed out" in never.stderr, never

    failed = namespace.get(JOBS, "ends")
    finished, failure = condition(failed, "Finished"), condition(failed, "Failed")
    assert finished is not None, dig(failed, "status", "conditions")
    assert failure is not None, dig(failed, "status", "conditions")
    assert (finished["status"], finished["reason"]) == ("True", "WorkerFailed"), finished
    assert finished["message"] == failure["message"], finished
    assert pod["metadata"]["name"] in finished["message"], finished
    assert finished["observedGeneration"] == dig(failed, "metadata", "generation"), finished
    header, row = namespace.run("get", JOBS, "ends").stdout.splitlines()
    table = dict(zip(header.split(), row.split(), strict=True))
    assert (table["PHASE"], table["REASON"]) == ("Failed", "WorkerFailed"), table
    # docs/datamounts.md waits for a mount's verdict with a jsonpath on observedGeneration (no store in
    # this suite to fail a mount): that this kubectl compares an integer field so, shown on the job.
    generation = dig(failed, "status", "observedGeneration")
    same = namespace.run("wait", f"{JOBS}/ends", f"--for=jsonpath={{.status.observedGeneration}}={generation}",
                         "--timeout=10s", check=False)  # fmt: skip
    assert same.returncode == 0, same


def test_on_failure_restarts_until_the_backoff_limit(operator: Operator, namespace: Kubectl) -> None:
    job = command_job("flaky", min_nodes=1, max_nodes=1)
    job["spec"]["backoffLimit"] = 1
    namespace.apply(job)
    wait_job(namespace, "flaky", "Running", running_with(1), timeout=TIMEOUT)
    first = pods_by_index(namespace, "flaky")["0"]
    exit_worker(namespace, first["metadata"]["name"], 1)
    restarted = wait_for("a replacement worker of the next attempt Running", lambda: [p for p in
                         running_workers(namespace, "flaky") if attempt(p) > attempt(first)] or None,
                         timeout=TIMEOUT, interval=0.5)  # fmt: skip
    assert dig(namespace.get(JOBS, "flaky"), "status", "restarts") == 1
    exit_worker(namespace, restarted[0]["metadata"]["name"], 1)
    failed = wait_job(namespace, "flaky", "Failed", phase_is("Failed"), timeout=TIMEOUT, fail_on=())
    reasons = {c.get("reason") for c in dig(failed, "status", "conditions", default=[])}
    assert "BackoffLimitExceeded" in reasons, reasons


def test_the_trainers_exit_2_fails_an_on_failure_job_at_once(operator: Operator, namespace: Kubectl) -> None:
    """Issue 14.6 on the real control plane: the built-in trainer's exit 2 (its pre-launch check
    refused the config, data or model), as the kubelet reports it in the pod's status, ends an
    OnFailure job with InvalidTrainerInput and the trainer's line, backoffLimit unspent."""
    job = interactive_trainer_job("badrows")
    del job["spec"]["debug"]  # the trainer's own command (kwok runs no container either way)
    job["spec"] |= {"restartPolicy": "OnFailure", "backoffLimit": 3}
    namespace.apply(job)
    wait_job(namespace, "badrows", "Running", running_with(1), timeout=TIMEOUT)
    (pod,) = live_workers(namespace, "badrows")
    line = "dataset.outputField: train.jsonl:3: 'output' is null"
    exit_worker(namespace, pod["metadata"]["name"], 2, f"trainer.yaml: invalid trainer config: {line}")
    failed = wait_job(namespace, "badrows", "Failed", phase_is("Failed"), timeout=TIMEOUT, fail_on=())
    failure = [c for c in dig(failed, "status", "conditions", default=[]) if c.get("type") == "Failed"]
    assert [c.get("reason") for c in failure] == ["InvalidTrainerInput"], failure
    assert line in failure[0].get("message", ""), failure
    assert dig(failed, "status", "restarts") in (0, None)


def test_exit_code_policy_retries_listed_codes_and_fails_on_others(operator: Operator, namespace: Kubectl) -> None:
    job = command_job("codes", min_nodes=1, max_nodes=1)
    job["spec"] |= {"restartPolicy": "ExitCode", "retryableExitCodes": [3], "backoffLimit": 5}
    namespace.apply(job)
    wait_job(namespace, "codes", "Running", running_with(1), timeout=TIMEOUT)
    first = pods_by_index(namespace, "codes")["0"]
    exit_worker(namespace, first["metadata"]["name"], 3)
    second = wait_for("a retry after exit code 3", lambda: [p for p in running_workers(namespace, "codes")
                      if attempt(p) > attempt(first)] or None, timeout=TIMEOUT, interval=0.5)[0]  # fmt: skip
    exit_worker(namespace, second["metadata"]["name"], 4)
    failed = wait_job(namespace, "codes", "Failed", phase_is("Failed"), timeout=TIMEOUT, fail_on=())
    reasons = {c.get("reason") for c in dig(failed, "status", "conditions", default=[])}
    assert "WorkerFailed" in reasons, reasons
    assert dig(failed, "status", "restarts") == 1


# -- disruptions -----------------------------------------------------------------------------


def test_an_eviction_is_replaced_and_not_counted(operator: Operator, namespace: Kubectl) -> None:
    namespace.apply(command_job("evicted", min_nodes=1, max_nodes=2))
    wait_job(namespace, "evicted", "2/2 workers Running", running_with(2), timeout=TIMEOUT)
    victim = pods_by_index(namespace, "evicted")["1"]
    label(namespace, victim["metadata"]["name"], EVICT_LABEL, "true")
    wait_for("a replacement of the evicted worker Running", lambda: [p for p in running_workers(namespace, "evicted")
             if dig(p, "metadata", "labels", "kubedgx.io/replica-index") == "1" and attempt(p) > attempt(victim)]
             or None, timeout=TIMEOUT, interval=0.5)  # fmt: skip
    job = wait_job(namespace, "evicted", "2/2 again", running_with(2), timeout=TIMEOUT)
    assert dig(job, "status", "restarts") in (0, None)


def test_a_worker_on_a_not_ready_node_is_evicted_and_replaced_elsewhere(
    operator: Operator, kubectl: Kubectl, namespace: Kubectl
) -> None:
    """The node lifecycle controller taints the node NoExecute, the taint manager deletes the worker
    (a DisruptionTarget), the operator replaces it on another node without counting a restart."""
    namespace.apply(command_job("notready", min_nodes=1, max_nodes=1))
    wait_job(namespace, "notready", "Running", running_with(1), timeout=TIMEOUT)
    first = pods_by_index(namespace, "notready")["0"]
    node = str(dig(first, "spec", "nodeName"))
    kubectl.run("label", "node", node, f"{NODE_NOT_READY_LABEL}=true")
    try:
        replaced = wait_for("the worker replaced on another node", lambda: [p for p in
                            running_workers(namespace, "notready") if attempt(p) > attempt(first)] or None,
                            timeout=TIMEOUT * 2, interval=0.5)[0]  # fmt: skip
    finally:
        kubectl.run("label", "node", node, f"{NODE_NOT_READY_LABEL}-")
    assert dig(replaced, "spec", "nodeName") != node
    job = wait_job(namespace, "notready", "Running", running_with(1), timeout=TIMEOUT)
    assert dig(job, "status", "restarts") in (0, None)


def test_a_worker_on_a_lost_node_is_replaced_and_the_job_can_be_deleted(
    operator: Operator, control_plane: ControlPlane, kubectl: Kubectl, namespace: Kubectl
) -> None:
    """Issue 13.2 on the real node lifecycle controller and taint manager: the lossy node's kubelet
    goes silent, the taint manager marks its pod DisruptionTarget and deletes it, and the pod stays
    Terminating for as long as the node is lost. The operator replaces it at once under another name
    (same hostname), lets it go so that the EndpointSlice controller drops it from the job's Service,
    counts nothing, and `kubectl delete` of the job finishes while the node is still lost."""
    (node,) = control_plane.lossy_nodes()
    job = command_job("lost", min_nodes=1, max_nodes=1)
    job["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    job["spec"]["tolerations"] = [{"key": LOSSY_LABEL, "operator": "Exists", "effect": "NoSchedule"}]
    namespace.apply(job)
    wait_job(namespace, "lost", "Running on the lossy node", running_with(1), timeout=TIMEOUT)
    first = pods_by_index(namespace, "lost")["0"]
    name = first["metadata"]["name"]
    wait_for("the Service's EndpointSlice to list the worker", lambda: name in endpoint_pods(namespace, "lost"),
             timeout=TIMEOUT, interval=0.5)  # fmt: skip
    control_plane.lose_lossy_nodes()
    try:
        stuck = wait_for("the worker marked for deletion (taint manager)",
                         lambda: (p := namespace.get("pod", name)) and dig(p, "metadata", "deletionTimestamp") and p,
                         timeout=TIMEOUT, interval=0.5)  # fmt: skip
        assert dig(condition(stuck, "DisruptionTarget"), "status") == "True", dig(stuck, "status")
        newer = wait_for("a replacement worker of the next attempt", lambda: [p for p in worker_pods(namespace,
                         "lost") if attempt(p) > attempt(first)] or None, timeout=30, interval=0.5)  # fmt: skip
        replacement = newer[0]
        assert replacement["metadata"]["name"] != name
        assert dig(replacement, "spec", "hostname") == name  # the rendezvous address stays
        assert dig(replacement, "metadata", "labels", "kubedgx.io/replica-index") == "0"
        let_go = wait_for("the stuck pod let go of", lambda: dig(namespace.get("pod", name), "metadata", "labels",
                          "kubedgx.io/job-name") == "lost.detached", timeout=30, interval=0.5)  # fmt: skip
        assert let_go
        wait_for("the EndpointSlice to drop the stuck pod", lambda: name not in endpoint_pods(namespace, "lost"),
                 timeout=TIMEOUT, interval=0.5)  # fmt: skip
        status = dig(namespace.get(JOBS, "lost"), "status")
        assert status.get("restarts") in (0, None), status
        wait_for("the WorkerLost event (kopf posts events in the background)", lambda: "WorkerLost" in reasons(
                 namespace.events_for("DGXTrainingJob", "lost")), timeout=30, interval=0.5)  # fmt: skip
        # Deleting the job finishes although the lost node never confirms its pod's deletion.
        namespace.delete(JOBS, "lost")
        wait_gone(namespace, JOBS, "lost", timeout=TIMEOUT)
        assert dig(namespace.get("pod", name), "metadata", "deletionTimestamp")  # still stuck: the node is lost
    finally:
        control_plane.recover_lossy_nodes()
    wait_gone(namespace, "pod", name, timeout=TIMEOUT)  # the kubelet is back and finishes the deletion


def endpoint_pods(k: Kubectl, service: str) -> set[str]:
    """Names of the pods the Service's EndpointSlices list (what cluster DNS serves)."""
    slices = k.select("endpointslices", {"kubernetes.io/service-name": service})
    return {
        str(dig(e, "targetRef", "name"))
        for s in slices
        for e in s.get("endpoints") or []
        if dig(e, "targetRef", "kind") == "Pod"
    }


# -- lifecycle -------------------------------------------------------------------------------


def test_suspend_deletes_the_workers_and_resume_brings_them_back(operator: Operator, namespace: Kubectl) -> None:
    namespace.apply(command_job("pause", min_nodes=2, max_nodes=2))
    wait_job(namespace, "pause", "2/2 Running", running_with(2), timeout=TIMEOUT)
    namespace.patch(JOBS, "pause", {"spec": {"suspend": True}})
    wait_job(namespace, "pause", "Suspended", phase_is("Suspended"), timeout=TIMEOUT)
    wait_for("no workers", lambda: live_workers(namespace, "pause") == [], timeout=TIMEOUT, interval=0.5)
    namespace.patch(JOBS, "pause", {"spec": {"suspend": False}})
    job = wait_job(namespace, "pause", "2/2 Running again", running_with(2), timeout=TIMEOUT)
    assert dig(job, "status", "restarts") in (0, None)


def test_a_trainer_edit_while_suspended_reaches_the_resumed_worker(operator: Operator, namespace: Kubectl) -> None:
    """Issue 13.7: spec.trainer may change while the job is suspended; the resumed worker mounts a
    ConfigMap with the edit (named by content), and the superseded one is deleted."""
    namespace.apply(interactive_trainer_job("edit"))
    wait_job(namespace, "edit", "Running", running_with(1), timeout=TIMEOUT)
    (pod,) = live_workers(namespace, "edit")
    before = trainer_config_of(pod)
    assert namespace.get("configmap", before) is not None
    namespace.patch(JOBS, "edit", {"spec": {"suspend": True}})
    wait_job(namespace, "edit", "Suspended", phase_is("Suspended"), timeout=TIMEOUT)
    wait_for("no workers", lambda: live_workers(namespace, "edit") == [], timeout=TIMEOUT, interval=0.5)
    namespace.patch(JOBS, "edit", {"spec": {"trainer": {"training": {"learningRate": 0.00042}}}})
    namespace.patch(JOBS, "edit", {"spec": {"suspend": False}})
    wait_job(namespace, "edit", "Running again", running_with(1), timeout=TIMEOUT)
    (resumed,) = live_workers(namespace, "edit")
    after = trainer_config_of(resumed)
    assert after != before
    config = namespace.get("configmap", after)
    assert config is not None
    assert "learningRate: 0.00042" in config["data"]["trainer.yaml"]
    wait_gone(namespace, "configmap", before, timeout=TIMEOUT)


def test_max_duration_ends_the_job_with_deadline_exceeded(operator: Operator, namespace: Kubectl) -> None:
    job = command_job("deadline", min_nodes=1, max_nodes=1)
    job["spec"]["maxDuration"] = "20s"
    namespace.apply(job)
    wait_job(namespace, "deadline", "Running", running_with(1), timeout=TIMEOUT)
    (pod,) = live_workers(namespace, "deadline")
    assert 0 < int(dig(pod, "spec", "activeDeadlineSeconds")) <= 20
    failed = wait_job(namespace, "deadline", "Failed", phase_is("Failed"), timeout=TIMEOUT, fail_on=())
    reasons = {c.get("reason") for c in dig(failed, "status", "conditions", default=[])}
    assert "DeadlineExceeded" in reasons, reasons
    wait_for("its worker deleted", lambda: live_workers(namespace, "deadline") == [], timeout=TIMEOUT, interval=0.5)


def test_deleting_a_job_releases_it_and_its_children_are_collected(operator: Operator, namespace: Kubectl) -> None:
    namespace.apply(command_job("gone", min_nodes=2, max_nodes=2))
    wait_job(namespace, "gone", "2/2 Running", running_with(2), timeout=TIMEOUT)
    assert namespace.get("service", "gone") is not None
    namespace.delete(JOBS, "gone")
    wait_gone(namespace, JOBS, "gone", timeout=TIMEOUT)
    wait_for("its pods and Service gone", lambda: worker_pods(namespace, "gone") == [] and namespace.get(
        "service", "gone") is None, timeout=TIMEOUT, interval=0.5)  # fmt: skip
