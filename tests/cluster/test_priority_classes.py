"""The operator configured with a PriorityClass the cluster does not have (what every no-Helm install
had: the operator names kubedgx-low/normal/high, which only the chart creates), on the real apiserver
with its Priority admission plugin: the workers are created, scheduled and run by kwok, no job fails
with CreateRefused, a class that exists is still used, and the operator's log names the missing class
and the fix, once. Also: what `kubedgx manifests` prints for the no-Helm path is accepted by the apiserver.

The operator runs as the chart's ServiceAccount (the chart grants it `get` on the priorityclasses it
names, so the check is answered), configured by the chart with ``priorityClasses.create: false`` and the
normal class renamed to one that exists nowhere: the chart's own way of naming classes it does not make.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from dgx_operator.runtime.priorities import APPLY_COMMAND
from tests.chart.conftest import Rendered
from tests.cluster.controlplane import ControlPlane
from tests.cluster.operator import Operator, chart_operator, install
from tests.e2e.jobs import command_job, running_with, wait_job, worker_pods
from tests.e2e.kubectl import Kubectl, KubectlError, dig, reasons, wait_for

TIMEOUT = 60
#: The class the operator is told to use for spec.priority normal; nothing ever creates it.
MISSING = "kubedgx-test-absent-normal"
VALUES = {"priorityClasses": {"create": False, "normal": {"name": MISSING}}}


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane,
    kubectl: Kubectl,
    chart: list[Rendered],
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Operator]:
    """The chart's RBAC and objects as installed (``chart``: kubedgx-low and kubedgx-high exist), the
    operator configured from the Deployment of VALUES, logging JSON as in the chart (with each line's
    severity; the plain format is the message alone)."""
    assert kubectl.get("priorityclass", MISSING) is None, f"{MISSING} must not exist for this module"
    assert kubectl.get("priorityclass", "kubedgx-high") is not None
    objects = install(kubectl, VALUES)  # the ClusterRole's get on priorityclasses names the classes configured
    workdir = tmp_path_factory.mktemp("operator")
    json_logs = ("--log-format", "json")
    try:
        with chart_operator(control_plane, kubectl, request.module.__name__, objects, workdir, json_logs) as op:
            yield op
    finally:
        install(kubectl)  # the default RBAC again, for the modules after this one


def test_the_apiserver_refuses_a_pod_naming_the_missing_class(namespace: Kubectl) -> None:
    """The premise: a worker naming MISSING is refused by the Priority admission plugin (403)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "premise"},
        "spec": {"priorityClassName": MISSING, "containers": [{"name": "c", "image": "busybox"}]},
    }
    with pytest.raises(KubectlError) as refused:
        namespace.run("create", "--dry-run=server", "-f", "-", input=json.dumps(pod))
    assert f"no PriorityClass with name {MISSING} was found" in refused.value.stderr


def test_a_job_of_the_missing_class_runs_without_one(operator: Operator, namespace: Kubectl) -> None:
    namespace.apply(command_job("normal", min_nodes=2, max_nodes=2))  # spec.priority: normal, the default
    wait_job(namespace, "normal", "2/2 workers Running", running_with(2), timeout=TIMEOUT)
    pods = worker_pods(namespace, "normal")
    assert len(pods) == 2
    for pod in pods:
        assert "priorityClassName" not in pod["spec"], pod["spec"].get("priorityClassName")
        assert dig(pod, "spec", "nodeName"), "scheduled"
        assert dig(pod, "status", "phase") == "Running"
    assert "CreateRefused" not in reasons(namespace.events_for("DGXTrainingJob", "normal"))


def test_a_job_of_an_existing_class_still_gets_it(operator: Operator, namespace: Kubectl) -> None:
    job = command_job("high", min_nodes=1, max_nodes=1)
    job["spec"]["priority"] = "high"
    namespace.apply(job)
    wait_job(namespace, "high", "1/1 workers Running", running_with(1), timeout=TIMEOUT)
    (pod,) = worker_pods(namespace, "high")
    assert pod["spec"]["priorityClassName"] == "kubedgx-high"
    assert pod["spec"]["priority"] == dig(namespace.get("priorityclass", "kubedgx-high"), "value")


def test_the_log_names_the_missing_class_and_the_fix_once(operator: Operator) -> None:
    records = wait_for(
        "the operator's WARNING about the missing PriorityClass",
        lambda: [r for r in log_records(operator) if f"PriorityClass {MISSING} " in r["message"]],
        timeout=10,
        interval=0.2,
    )
    assert len(records) == 1, records
    (record,) = records
    assert record["severity"] == "warn", record
    line = record["message"]
    assert f"PriorityClass {MISSING} (spec.priority normal) does not exist" in line
    # Not one of ours: `kubedgx manifests` would not make it, so the fix is kubectl's.
    assert f"kubectl create priorityclass {MISSING} --value=N" in line
    assert APPLY_COMMAND not in line
    for existing in ("kubedgx-low", "kubedgx-high"):
        assert existing not in line, "the classes that exist are not named"


def log_records(op: Operator) -> list[dict[str, Any]]:
    """The operator's JSON log lines (kopf's formatter: message, timestamp, severity)."""
    out = []
    for line in op.log().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if isinstance(record, dict) and "message" in record:
                out.append(record)
    return out


def test_kubedgx_manifests_is_accepted_by_the_apiserver(kubectl: Kubectl) -> None:
    """The no-Helm path's `kubedgx manifests | kubectl apply -f -`, dry-run on the server (the CRDs and
    classes exist already: an update; the apiserver still validates every object in full)."""
    printed = subprocess.run(
        [sys.executable, "-m", "dgx_operator.cli.main", "manifests"], capture_output=True, text=True, check=True
    ).stdout
    out = kubectl.run("apply", "--dry-run=server", "-f", "-", input=printed).stdout
    assert "customresourcedefinition.apiextensions.k8s.io/dgxtrainingjobs.kubedgx.io" in out
    for name in ("kubedgx-low", "kubedgx-normal", "kubedgx-high"):
        assert f"priorityclass.scheduling.k8s.io/{name}" in out, out
