"""``pyflyte run examples/flyte/workflows.py wf`` end to end on the real control plane.

pyflyte runs the workflow locally; its DGX task goes through the kubedgx connector in-process, which
creates a DGXTrainingJob; the operator (as the chart's ServiceAccount) creates the worker pod, the
real scheduler puts it on a fake DGX node, and kwok marks it Running. kwok runs no containers, so
:class:`Kubelet` stands in for the kubelet: it executes each Running worker pod's command with the
pod's environment as a local process (the project's folder as the image's working directory), then
reports its exit code through the pod's status (the kwok stage of tests/cluster/stages). So the task's
function body really runs under ``pyflyte-execute``, its output goes through Flyte's blob store (the
local raw-output folder pyflyte made), and the job's phases reach pyflyte through the connector's
``get`` (what the stand-in changes: tests/cluster/flyte_kubelet.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.cluster.controlplane import CONTEXT, ControlPlane
from tests.cluster.flyte_kubelet import BIN, RUN_TIMEOUT, Kubelet
from tests.cluster.operator import Operator
from tests.conftest import ROOT
from tests.e2e.kubectl import Kubectl, dig

WORKFLOWS = ROOT / "examples" / "flyte" / "workflows.py"


def pyflyte(control_plane: ControlPlane, namespace: Kubectl, *args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {
        "KUBEDGX_FLYTE_KUBECONFIG": str(control_plane.kubeconfig),
        "KUBEDGX_FLYTE_CONTEXT": CONTEXT,
        "KUBEDGX_FLYTE_NAMESPACE": str(namespace.namespace),
        "FLYTE_SDK_RICH_TRACEBACKS": "0",
        "PATH": os.pathsep.join([BIN, os.environ.get("PATH", "")]),
    }
    return subprocess.run([os.path.join(BIN, "pyflyte"), "run", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT, check=False)  # fmt: skip


def test_pyflyte_run_runs_the_dgx_task_s_body_in_the_worker_pod_and_gets_its_output(
    operator: Operator, namespace: Kubectl, control_plane: ControlPlane, tmp_path: Path
) -> None:
    with Kubelet(namespace, WORKFLOWS.parent, tmp_path) as kubelet:
        result = pyflyte(control_plane, namespace, str(WORKFLOWS), "wf", "--n", "4")
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(tmp_path.glob("*.log")))
    assert not kubelet.errors, kubelet.errors
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}\n{logs}"
    # square(4) = 16 ran in the pod, plus_one ran in pyflyte: 17 came back through Flyte.
    assert result.stdout.strip().splitlines()[-1].strip() == "17", result.stdout[-2000:]
    assert list(kubelet.ran.values()) == [0], kubelet.ran
    (job,) = namespace.get_json("get", "dgxtrainingjobs")["items"]
    assert dig(job, "status", "phase") == "Succeeded"
    assert dig(job, "spec", "command", 0) == "pyflyte-execute"
    assert "global rank 0" not in logs, "one node: rank 0 is here, its outputs are written"


def test_a_failing_task_fails_pyflyte_run_with_the_job_s_reason(
    operator: Operator, namespace: Kubectl, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """The function raises in the pod: pyflyte-execute exits 1 (FLYTE_FAIL_ON_ERROR, which the
    connector sets; without it the worker would exit 0 and the job would "succeed"), the job fails
    (restartPolicy Never), and pyflyte says why."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "failing.py").write_text(
        "from flytekit import task\nfrom flytekitplugins.dgx import DGXConfig\n\n"
        "@task(task_config=DGXConfig(instance='dgxh100.80g.8.norm', restart_policy='Never'))\n"
        "def boom(n: int) -> int:\n    if n < 0:\n        raise ValueError(f'no square for {n}')\n    return n * n\n",
        encoding="utf-8",
    )
    with Kubelet(namespace, code, tmp_path) as kubelet:
        result = pyflyte(control_plane, namespace, str(code / "failing.py"), "boom", "--n", "-1")
    assert not kubelet.errors, kubelet.errors
    output = " ".join((result.stdout + result.stderr).split())  # rich wraps lines at the terminal's width
    assert result.returncode != 0, output[-3000:]
    assert "Failed to run the task" in output, output[-3000:]
    # The job's reason right after flytekit's own words: no "failed: " of the connector's.
    assert "with error: WorkerFailed: flyte-boom-" in output, output[-3000:]
    assert "restartPolicy is Never" in output, output[-3000:]
    assert "the task raised: " in output, output[-3000:]
    assert "no square for -1" in output, "the function's own exception, from error.pb"
    assert list(kubelet.ran.values()) == [1], kubelet.ran
    (job,) = namespace.get_json("get", "dgxtrainingjobs")["items"]
    assert dig(job, "status", "phase") == "Failed"


def test_a_worker_that_dies_without_an_error_pb_fails_pyflyte_run(
    operator: Operator, namespace: Kubectl, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """A worker that dies before pyflyte-execute can write error.pb (a signal, the OOM killer; here os._exit in
    the one process of the pod, pyflyte-execute itself: with torch elastic's processes the parent would write
    error.pb for the child): the job fails with WorkerFailed, which the connector reports as RETRYABLE_FAILED
    (Flyte may retry it). flytekit's local loop stops on that phase too, and pyflyte run fails with the job's
    reason."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "dying.py").write_text(
        "import os\nfrom flytekit import task\nfrom flytekitplugins.dgx import DGXConfig\n\n"
        "@task(task_config=DGXConfig(instance='dgxh100.80g.8.norm', restart_policy='Never'))\n"
        "def dies(n: int) -> int:\n    os._exit(3)\n    return n\n",
        encoding="utf-8",
    )
    with Kubelet(namespace, code, tmp_path, env={"PET_NPROC_PER_NODE": "1"}) as kubelet:
        result = pyflyte(control_plane, namespace, str(code / "dying.py"), "dies", "--n", "1")
    assert not kubelet.errors, kubelet.errors
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0, output[-3000:]
    assert "with error: WorkerFailed: flyte-dies-" in output, output[-3000:]
    assert "exited with code 3" in output, output[-3000:]
    assert "the task raised" not in output, "no error.pb: the job's reason stands alone"
    assert "could not be read" not in output, output[-3000:]
    assert list(kubelet.ran.values()) == [3], kubelet.ran


def test_a_bad_config_fails_pyflyte_run_before_anything_is_created(
    operator: Operator, namespace: Kubectl, control_plane: ControlPlane, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from flytekit import task\nfrom flytekitplugins.dgx import DGXConfig\n\n"
        "@task(task_config=DGXConfig(instance='dgxh100.80g.8.norm', max_duration='1 day'))\n"
        "def t() -> int:\n    return 1\n",
        encoding="utf-8",
    )
    result = pyflyte(control_plane, namespace, str(bad), "t")
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0
    assert 'spec.maxDuration: invalid value "1 day": must be a Go duration' in output, output[-3000:]
    assert namespace.get_json("get", "dgxtrainingjobs")["items"] == []
