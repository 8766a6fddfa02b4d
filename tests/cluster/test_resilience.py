"""The operator keeps working through what a real apiserver does to its clients: a restart, a watch
that resumes from a resourceVersion etcd has compacted away (410 Gone), and 429 Too Many Requests
when the apiserver sheds load. Each time, jobs created and changed afterwards are reconciled.

The apiserver is restarted four times, with other flags for two of them, so the module runs on a
control plane of its own, stopped at its end: the session's cluster never sees those flags and is
never restored (restoring the session's apiserver and waiting for every controller to serve again
took 140 s on a loaded machine). After each restart a test waits only for what it needs: its jobs
Running again (the scheduler, kwok and the operator back on their watches), not every controller.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.chart.conftest import Rendered
from tests.cluster.controlplane import CONTEXT, ControlPlane
from tests.cluster.fixtures import started_control_plane
from tests.cluster.operator import Operator, install, run_operator, service_account, token_kubeconfig
from tests.e2e.jobs import command_job, phase_is, running_with, wait_job
from tests.e2e.kubectl import JOBS, Kubectl, dig, wait_for

TIMEOUT = 90


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """This module's own control plane (module docstring), in place of the session's."""
    yield from started_control_plane(tmp_path_factory, "control-plane-resilience")


@pytest.fixture(scope="module")
def kubectl(control_plane: ControlPlane) -> Kubectl:
    return Kubectl(CONTEXT, binary=control_plane.kubectl_binary, kubeconfig=str(control_plane.kubeconfig))


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane, kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    chart: list[Rendered] = install(kubectl)
    work = tmp_path_factory.mktemp("operator-resilience")
    kubeconfig = token_kubeconfig(control_plane, kubectl, work / "operator.kubeconfig", service_account(chart))
    with run_operator(control_plane, __name__, chart, kubeconfig, work) as op:
        yield op


def test_the_operator_carries_on_after_an_apiserver_restart(
    operator: Operator, control_plane: ControlPlane, namespace: Kubectl
) -> None:
    namespace.apply(command_job("before"))
    wait_job(namespace, "before", "Running", running_with(1), timeout=TIMEOUT)
    control_plane.restart("kube-apiserver", wait_whole=False)  # the waits below need the scheduler and kwok
    assert operator.running
    # Its watches came back: a new job is picked up, and a change to the old one too.
    namespace.apply(command_job("after"))
    wait_job(namespace, "after", "Running", running_with(1), timeout=TIMEOUT)
    namespace.patch(JOBS, "before", {"spec": {"suspend": True}})
    wait_job(namespace, "before", "Suspended", phase_is("Suspended"), timeout=TIMEOUT)


def test_a_watch_resumed_after_etcd_compaction_gets_410_and_the_operator_relists(
    operator: Operator, control_plane: ControlPlane, namespace: Kubectl
) -> None:
    """Without the watch cache the apiserver serves watches from etcd itself: once etcd has
    compacted its history, a watch resumed from an older resourceVersion is answered 410 Gone.
    kopf resumes its watches from the last resourceVersion it saw (its log shows the requests), so
    after the restart below its job watch meets exactly that; it must start over and carry on."""
    control_plane.restart("kube-apiserver", apiserver_args=["--watch-cache=false"], wait_whole=False)
    namespace.apply(command_job("early"))
    job = wait_job(namespace, "early", "Running", running_with(1), timeout=TIMEOUT)
    seen = str(dig(job, "metadata", "resourceVersion"))
    # History moves on past what the operator's job watch last saw, then etcd forgets it.
    for i in range(30):
        namespace.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"churn-{i}"}})
    compacted = control_plane.compact_etcd()
    assert compacted > int(seen)
    restarts_before = operator.log().count("Restarting the watch-stream for dgxtrainingjobs")
    control_plane.restart("kube-apiserver", wait_whole=False)  # drops every watch; the operator resumes its own
    # What the apiserver now answers a watch from that resourceVersion (the operator's, or older):
    status, answer = control_plane.request(
        "GET", f"/apis/kubedgx.io/v1alpha1/{JOBS.split('.')[0]}?watch=true&resourceVersion={seen}&timeoutSeconds=5"
    )
    first = json.loads(str(answer).splitlines()[0]) if isinstance(answer, str) else answer
    assert status == 200
    assert first["type"] == "ERROR", first
    assert first["object"]["code"] == 410, first
    restart_line = "Restarting the watch-stream for dgxtrainingjobs"
    wait_for("the operator's job watch to start over", lambda: operator.log().count(restart_line) > restarts_before,
             timeout=TIMEOUT, interval=0.5)  # fmt: skip
    namespace.apply(command_job("late"))
    wait_job(namespace, "late", "Running", running_with(1), timeout=TIMEOUT)
    namespace.patch(JOBS, "early", {"spec": {"suspend": True}})
    wait_job(namespace, "early", "Suspended", phase_is("Suspended"), timeout=TIMEOUT)


def test_the_operator_backs_off_on_429_and_gets_there(
    operator: Operator, control_plane: ControlPlane, namespace: Kubectl, kubectl: Kubectl
) -> None:
    """Without priority and fairness, a mutating request beyond --max-mutating-requests-inflight is
    refused at once with 429 and Retry-After; kwok's heartbeats keep the one slot busy."""
    control_plane.restart(
        "kube-apiserver",
        apiserver_args=["--enable-priority-and-fairness=false", "--max-requests-inflight=5",
                        "--max-mutating-requests-inflight=1"],
        wait_whole=False,  # the jobs' waits below need the scheduler and kwok, which come back by themselves
    )  # fmt: skip
    throttled_before = operator.log().count("status=429")
    jobs = [f"busy-{i}" for i in range(3)]
    namespace.apply(*(command_job(name, min_nodes=1, max_nodes=1) for name in jobs))
    for name in jobs:
        wait_job(namespace, name, "Running", running_with(1), timeout=TIMEOUT * 2)
    status, metrics = control_plane.request("GET", "/metrics")
    assert status == 200
    refused = sum(
        float(line.rsplit(" ", 1)[1])
        for line in str(metrics).splitlines()
        if line.startswith("apiserver_request_total{") and 'code="429"' in line
    )
    throttled = operator.log().count("status=429") - throttled_before
    print(f"429s: {refused:.0f} answered by the apiserver, {throttled} of them to the operator")
    assert refused > 0, "the apiserver shed no load: the test did not test 429s"
