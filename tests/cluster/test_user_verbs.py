"""The user's verbs (`kubedgx submit/list/describe/wait/cancel`, `kubectl dgx ...`) and the Python
client on the real control plane: the real API server and admission webhook answer them, the real
scheduler places the workers, kwok plays their exits and the operator writes what they read.

`logs`, `tensorboard`, `fetch` and `plot` need a kubelet and an object store: tests/nodes/test_training.py.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from dgx_operator.cli.main import main
from dgx_operator.client import Client, JobFailedError, JobNotFoundError, SubmitError, WaitTimeoutError, kubeclient
from tests.cluster.controlplane import EXIT_CODE_LABEL, MESSAGE_ANNOTATION, ControlPlane
from tests.cluster.operator import Operator
from tests.e2e.jobs import command_job, phase_is, running_with, wait_job, worker_pods
from tests.e2e.kubectl import JOBS, Kubectl, dig, wait_for

TIMEOUT = 60


def run(k: Kubectl, *argv: str, stdin: str = "") -> tuple[int, str, str]:
    """``kubedgx ARGV -n <the test's namespace>`` in this process, with the test's kubeconfig."""
    out, err = io.StringIO(), io.StringIO()
    assert k.kubeconfig
    assert k.namespace
    code = main(
        [*argv, "--kubeconfig", k.kubeconfig, "--context", k.context, "-n", k.namespace],
        out=out,
        err=err,
        stdin=io.StringIO(stdin),
    )
    return code, out.getvalue(), err.getvalue()


def client(k: Kubectl) -> Client:
    assert k.namespace
    return Client(k.namespace, kubeconfig=k.kubeconfig, context=k.context)


def write(tmp_path: Path, name: str, *docs: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")
    return path


def worker0(k: Kubectl, job: str) -> str:
    pods = [p for p in worker_pods(k, job) if dig(p, "metadata", "labels", "kubedgx.io/replica-index") == "0"]
    assert pods, f"no worker 0 of {job}"
    return str(pods[-1]["metadata"]["name"])


def exit_worker(k: Kubectl, pod: str, code: int, message: dict[str, Any] | str) -> None:
    text = message if isinstance(message, str) else json.dumps(message)
    k.run("annotate", "pod", pod, f"{MESSAGE_ANNOTATION}={text}", "--overwrite")
    k.run("label", "pod", pod, f"{EXIT_CODE_LABEL}={code}", "--overwrite")


def report(k: Kubectl, pod: str, progress: dict[str, Any]) -> None:
    """The trainer's live progress, as the pod annotation the operator reads while the pod runs."""
    k.run("annotate", "pod", pod, f"kubedgx.io/progress={json.dumps(progress)}", "--overwrite")


def table(text: str) -> list[dict[str, str]]:
    """A kubectl-style table as rows keyed by header (columns split on runs of 2+ spaces)."""
    import re

    lines = [line for line in text.splitlines() if line.strip()]
    head = re.split(r"\s{2,}", lines[0].strip())
    return [dict(zip(head, re.split(r"\s{2,}", line.strip()), strict=False)) for line in lines[1:]]


# -- submit ------------------------------------------------------------------------------------------


def test_submit_creates_the_job_and_says_how_to_follow_it(
    operator: Operator, namespace: Kubectl, tmp_path: Path
) -> None:
    path = write(tmp_path, "job.yaml", command_job("sub"))
    code, out, err = run(namespace, "submit", str(path))
    assert code == 0, err
    assert out.strip() == "dgxtrainingjob/sub created"
    assert "kubedgx logs -f sub" in err
    assert "kubedgx wait sub" in err
    stored = namespace.get(JOBS, "sub")
    assert stored is not None
    assert dig(stored, "spec", "instance") == command_job("sub")["spec"]["instance"]
    wait_job(namespace, "sub", "Running", running_with(1), timeout=TIMEOUT)

    # The same name again: one line naming the way out, nothing changed.
    code, out, err = run(namespace, "submit", str(path))
    assert code == 1
    assert out == ""
    assert "exists already" in err, err
    assert "generateName" in err, err
    assert "Traceback" not in err

    # generateName makes each submission a new run.
    job = command_job("ignored")
    job["metadata"] = {"generateName": "sweep-"}
    code, out, err = run(namespace, "submit", "-", stdin=yaml.safe_dump(job))
    assert code == 0, err
    created = out.strip().removeprefix("dgxtrainingjob/").removesuffix(" created")
    assert created.startswith("sweep-")
    assert namespace.get(JOBS, created) is not None


def test_a_refused_document_creates_nothing_of_the_file(operator: Operator, namespace: Kubectl, tmp_path: Path) -> None:
    """The server dry run of every document comes first: the API server refuses the job (its
    message names the field) and the DGXDataMount in the same file is not created either."""
    mount = {
        "apiVersion": "kubedgx.io/v1alpha1",
        "kind": "DGXDataMount",
        "metadata": {"name": "corpus"},
        "spec": {"source": "s3://bucket/train", "direction": "In"},
    }
    bad = command_job("bad")
    bad["spec"]["restartPolicy"] = "Sometimes"
    code, out, err = run(namespace, "submit", str(write(tmp_path, "bad.yaml", mount, bad)))
    assert code == 1
    assert out == ""
    assert "spec.restartPolicy" in err, err
    assert '"Sometimes"' in err, err
    assert namespace.get("dgxdatamounts", "corpus") is None
    assert namespace.get(JOBS, "bad") is None

    # --dry-run checks and creates nothing; a good file then creates both, the mount first.
    good = command_job("good")
    good["spec"]["dataMounts"] = [{"name": "corpus", "mountPath": "/data"}]
    path = write(tmp_path, "good.yaml", good, mount)
    code, out, _ = run(namespace, "submit", "--dry-run", str(path))
    assert code == 0
    assert "(server dry run)" in out
    assert namespace.get(JOBS, "good") is None
    code, out, err = run(namespace, "submit", str(path))
    assert code == 0, err
    assert out.splitlines() == ["dgxdatamount/corpus created", "dgxtrainingjob/good created"]
    # Jobs share mounts: one that exists is kept as it is.
    again = command_job("good2")
    again["spec"]["dataMounts"] = [{"name": "corpus", "mountPath": "/data"}]
    code, out, err = run(namespace, "submit", str(write(tmp_path, "again.yaml", mount, again)))
    assert code == 0, err
    assert out.splitlines() == ["dgxdatamount/corpus kept", "dgxtrainingjob/good2 created"]


def test_submit_refuses_other_kinds_and_unreadable_files(
    operator: Operator, namespace: Kubectl, tmp_path: Path
) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    code, _, err = run(namespace, "submit", str(write(tmp_path, "cm.yaml", cm)))
    assert code == 1
    assert "ConfigMap (v1): submit takes DGXTrainingJob and DGXDataMount" in err
    code, _, err = run(namespace, "submit", str(tmp_path / "missing.yaml"))
    assert code == 1
    assert "missing.yaml: cannot read" in err
    (tmp_path / "broken.yaml").write_text("kind: [\n", encoding="utf-8")
    code, _, err = run(namespace, "submit", str(tmp_path / "broken.yaml"))
    assert code == 1
    assert "broken.yaml" in err
    assert "Traceback" not in err


# -- list, describe ----------------------------------------------------------------------------------


def test_list_and_describe_show_progress_workers_conditions_and_events(operator: Operator, namespace: Kubectl) -> None:
    namespace.apply(command_job("seen", min_nodes=2, max_nodes=2))
    wait_job(namespace, "seen", "2/2 Running", running_with(2), timeout=TIMEOUT)
    pod = worker0(namespace, "seen")
    report(namespace, pod, {"step": 40, "totalSteps": 100, "loss": 1.2345, "learningRate": 0.0002})
    wait_job(namespace, "seen", "step 40", lambda j: dig(j, "status", "progress", "step") == 40, timeout=TIMEOUT)

    code, out, err = run(namespace, "list")
    assert code == 0, err
    rows = {r["NAME"]: r for r in table(out)}
    row = rows["seen"]
    assert (row["PHASE"], row["NODES"], row["STEP"], row["LOSS"], row["RESTARTS"]) == (
        "Running",
        "2/2",
        "40/100",
        "1.2345",
        "0",
    )
    assert row["ETA"] != ""
    assert row["AGE"] != ""
    code, out, _ = run(namespace, "list", "-o", "json")
    listed = json.loads(out)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["seen"]
    assert listed["items"][0]["status"]["progress"]["loss"] == 1.2345
    code, out, _ = run(namespace, "list", "-o", "name")
    assert out.strip() == "dgxtrainingjob/seen"

    code, out, err = run(namespace, "describe", "seen")
    assert code == 0, err
    assert "Phase:       Running" in out
    assert "step 40/100 (40%)  loss 1.2345  lr 2.00e-04" in out
    workers = out.split("Workers:")[1].split("Events:")[0]
    pods = {p["metadata"]["name"]: dig(p, "spec", "nodeName") for p in worker_pods(namespace, "seen")}
    for name, node in pods.items():
        assert name in workers, workers
        assert node in workers, workers
    assert "Running" in out.split("Conditions:")[1]
    events = out.split("Events:")[1]
    assert f"pod/{pod}" in events or "dgxtrainingjob/seen" in events, out
    assert "kubedgx logs -f seen" in out
    code, out, _ = run(namespace, "describe", "seen", "-o", "json")
    body = json.loads(out)
    assert {w["name"] for w in body["workers"]} == set(pods)
    assert body["job"]["status"]["progress"]["step"] == 40

    code, _, err = run(namespace, "describe", "nosuch")
    assert code == 1
    assert "no DGXTrainingJob 'nosuch'" in err


def test_describe_shows_the_diagnosis_of_a_failed_job(operator: Operator, namespace: Kubectl) -> None:
    job = command_job("oom")
    job["spec"]["restartPolicy"] = "Never"
    namespace.apply(job)
    wait_job(namespace, "oom", "Running", running_with(1), timeout=TIMEOUT)
    exit_worker(namespace, worker0(namespace, "oom"), 137, "OOMKilled")
    wait_job(namespace, "oom", "Failed", phase_is("Failed"), timeout=TIMEOUT, fail_on=())
    code, out, _ = run(namespace, "describe", "oom")
    assert code == 0
    failed = [line for line in out.split("Conditions:")[1].splitlines() if line.strip().startswith("Failed")]
    stored = next(c for c in dig(namespace.get(JOBS, "oom"), "status", "conditions") if c["type"] == "Failed")
    assert failed, out
    assert stored["reason"] in failed[0], (failed, stored)
    assert stored["message"][:60] in failed[0], (failed, stored)


# -- wait ------------------------------------------------------------------------------------------------


def _waiting(k: Kubectl, *argv: str) -> tuple[threading.Thread, list[tuple[int, str, str]]]:
    result: list[tuple[int, str, str]] = []
    thread = threading.Thread(target=lambda: result.append(run(k, *argv)), daemon=True)
    thread.start()
    return thread, result


def test_wait_exits_0_on_success_1_with_the_reason_on_failure_3_on_timeout(
    operator: Operator, namespace: Kubectl
) -> None:
    namespace.apply(command_job("ok"))
    failing = command_job("ko")
    failing["spec"]["restartPolicy"] = "Never"
    namespace.apply(failing)
    wait_job(namespace, "ok", "Running", running_with(1), timeout=TIMEOUT)
    wait_job(namespace, "ko", "Running", running_with(1), timeout=TIMEOUT)

    code, _, err = run(namespace, "wait", "ok", "--timeout", "1")
    assert code == 3
    assert "has not ended after 1s" in err

    ok, ok_result = _waiting(namespace, "wait", "ok")
    ko, ko_result = _waiting(namespace, "wait", "ko")
    exit_worker(
        namespace, worker0(namespace, "ok"), 0, {"status": "Succeeded", "progress": {"step": 7, "totalSteps": 7}}
    )
    exit_worker(namespace, worker0(namespace, "ko"), 3, "boom: the program gave up")
    ok.join(TIMEOUT)
    ko.join(TIMEOUT)
    assert ok_result, "wait did not return once the job succeeded"
    assert ko_result, "wait did not return once the job failed"
    code, out, err = ok_result[0]
    assert code == 0, (out, err)
    assert out.startswith("ok: Succeeded"), (out, err)
    code, out, err = ko_result[0]
    stored = next(c for c in dig(namespace.get(JOBS, "ko"), "status", "conditions") if c["type"] == "Failed")
    assert code == 1, (out, err)
    assert err.strip() == f"ko: Failed ({stored['reason']}): {stored['message']}"

    code, _, err = run(namespace, "wait", "nosuch")
    assert code == 2
    assert "no DGXTrainingJob 'nosuch'" in err


# -- cancel ----------------------------------------------------------------------------------------------


def test_cancel_deletes_the_job_and_its_workers(operator: Operator, namespace: Kubectl) -> None:
    namespace.apply(command_job("bye", min_nodes=2, max_nodes=2))
    wait_job(namespace, "bye", "2/2 Running", running_with(2), timeout=TIMEOUT)
    code, out, err = run(namespace, "cancel", "bye", "--wait", "--timeout", str(TIMEOUT))
    assert code == 0, err
    assert out.strip() == "dgxtrainingjob/bye cancelled (it was Running)"
    assert "grace period" in err
    assert namespace.get(JOBS, "bye") is None
    wait_for("workers gone", lambda: not worker_pods(namespace, "bye"), timeout=TIMEOUT, interval=0.5)
    code, _, err = run(namespace, "cancel", "bye")
    assert code == 1
    assert "no DGXTrainingJob 'bye'" in err


# -- the Python client -----------------------------------------------------------------------------------


def test_the_python_client_submits_follows_and_raises_the_jobs_reason(operator: Operator, namespace: Kubectl) -> None:
    kd = client(namespace)
    manifest = command_job("nb")
    manifest["spec"]["restartPolicy"] = "Never"
    job = kd.submit(manifest)
    assert job.metadata.name == "nb"
    assert job.metadata.uid
    assert job.spec.instance == command_job("nb")["spec"]["instance"]
    with pytest.raises(SubmitError, match="exists already"):
        kd.submit(command_job("nb"))
    wait_job(namespace, "nb", "Running", running_with(1), timeout=TIMEOUT)
    report(namespace, worker0(namespace, "nb"), {"step": 3, "totalSteps": 9, "loss": 2.5})
    wait_for("progress", lambda: (p := kd.progress("nb")) is not None and p.step == 3, timeout=TIMEOUT, interval=0.5)
    progress = kd.progress("nb")
    assert progress is not None
    assert (progress.total_steps, progress.loss) == (9, 2.5)
    assert [j.metadata.name for j in kd.list_jobs()] == ["nb"]
    assert [w.rank for w in kd.workers("nb")] == [0]
    with pytest.raises(WaitTimeoutError):
        kd.wait("nb", timeout=1)

    done: list[Any] = []

    def waiter() -> None:
        try:
            kd.wait("nb", timeout=TIMEOUT)
        except JobFailedError as exc:
            done.append(exc)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    exit_worker(namespace, worker0(namespace, "nb"), 2, "bad input: the data is empty")
    thread.join(TIMEOUT)
    assert done, "wait() did not raise once the job failed"
    failure = done[0]
    stored = next(c for c in dig(namespace.get(JOBS, "nb"), "status", "conditions") if c["type"] == "Failed")
    assert (failure.reason, failure.message) == (stored["reason"], stored["message"])
    assert failure.job is not None
    assert failure.job.status.phase == "Failed"

    kd.cancel("nb", wait=True, timeout=TIMEOUT)
    with pytest.raises(JobNotFoundError):
        kd.get("nb")


def test_the_client_reads_the_kubeconfig_as_kubectl_does(
    control_plane: ControlPlane, namespace: Kubectl, tmp_path: Path
) -> None:
    """KUBECONFIG and the context's namespace, as kubectl: no flag needed."""
    assert namespace.kubeconfig
    assert namespace.namespace
    config = yaml.safe_load(Path(namespace.kubeconfig).read_text(encoding="utf-8"))
    for ctx in config["contexts"]:
        if ctx["name"] == namespace.context:
            ctx["context"]["namespace"] = namespace.namespace
    config["current-context"] = namespace.context
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    api = kubeclient.load(None, None, {"KUBECONFIG": str(path)})
    assert api.namespace == namespace.namespace
    assert Client(api=api).list_jobs() == []


# -- kubectl dgx -------------------------------------------------------------------------------------


@pytest.fixture
def plugin_path(control_plane: ControlPlane, tmp_path: Path) -> str:
    """A PATH holding the real kubectl and the ``kubectl-dgx`` executable pip installed (the console
    script of pyproject.toml); without it installed, a shim running the same entry point."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").symlink_to(control_plane.kubectl_binary)
    installed = shutil.which("kubectl-dgx")
    if installed is not None:
        (bin_dir / "kubectl-dgx").symlink_to(installed)
    else:
        shim = bin_dir / "kubectl-dgx"
        entry = "from dgx_operator.cli.main import kubectl_main\nraise SystemExit(kubectl_main())\n"
        shim.write_text(f"#!{sys.executable}\n{entry}")
        shim.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def test_kubectl_finds_the_dgx_plugin_and_runs_its_verbs(
    operator: Operator, namespace: Kubectl, plugin_path: str
) -> None:
    assert namespace.kubeconfig
    assert namespace.namespace
    env = {**os.environ, "PATH": plugin_path, "KUBECONFIG": namespace.kubeconfig}
    listed = subprocess.run(["kubectl", "plugin", "list"], env=env, capture_output=True, text=True, check=False)
    assert "kubectl-dgx" in listed.stdout, listed.stdout + listed.stderr
    namespace.apply(command_job("plug"))
    wait_job(namespace, "plug", "Running", running_with(1), timeout=TIMEOUT)
    args = ["kubectl", "dgx", "list", "--context", namespace.context, "-n", namespace.namespace]
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [r["NAME"] for r in table(done.stdout)] == ["plug"]
    helped = subprocess.run(["kubectl", "dgx", "--help"], env=env, capture_output=True, text=True, check=False)
    assert helped.stdout.startswith("usage: kubectl dgx"), helped.stdout
