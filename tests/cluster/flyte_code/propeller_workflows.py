"""Workflows the real-propeller tests run (tests/cluster/test_flyte_propeller*.py), beside the
examples' ``wf`` (examples/flyte/workflows.py). The stand-in kubelet runs their pods with this
folder and the examples' on PYTHONPATH, so ``pyflyte-execute`` imports them by these module names.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from flytekit import task, workflow
from flytekit.exceptions.user import FlyteRecoverableException

from flytekitplugins.dgx import DGXConfig, DGXDataConfig, DGXQLoRATask, DGXTorchElastic

#: A folder the test and the pods share (the stand-in kubelet runs pods on this machine).
MARKS = "KUBEDGX_TEST_MARKS"


@task(task_config=DGXConfig(instance="dgxh100.80g.8.norm", restart_policy="Never"))
def boom(n: int) -> int:
    """Fails in the pod with the function's own error, which no retry changes."""
    if n < 0:
        raise ValueError(f"no square for {n}")
    return n * n


@workflow
def fails(n: int = -1) -> int:
    return boom(n=n)


@task(retries=1, task_config=DGXConfig(instance="dgxh100.80g.8.norm", restart_policy="Never"))
def flaky(n: int) -> int:
    """Attempt 0 raises a recoverable error (Flyte retries it: a job of its own), attempt 1 returns."""
    if os.environ.get("FLYTE_ATTEMPT_NUMBER", "0") == "0":
        raise FlyteRecoverableException(f"attempt 0 of flaky({n}) gives up: try again")
    return n + 100


@workflow
def retried(n: int = 1) -> int:
    return flaky(n=n)


@task(task_config=DGXConfig(instance="dgxh100.80g.8.norm"))
def idle() -> int:
    """Never run: the test's kubelet leaves its pod Running (a worker that never ends)."""
    return 0


@workflow
def runs_forever() -> int:
    return idle()


@task(task_config=DGXTorchElastic(instance="dgxh100.80g.8.norm", min_nodes=16, max_nodes=16))
def too_wide() -> int:
    """16 nodes of a pool the cluster has only a few of: never placed."""
    return 0


@workflow
def waits_for_nodes() -> int:
    return too_wide()


@task(interruptible=True, task_config=DGXConfig())
def on_spot() -> str:
    """Interruptible, no instance named: the connector's default instance, on its spot pool."""
    return os.environ.get("KUBEDGX_INSTANCE", "")


@workflow
def interruptible() -> str:
    return on_spot()


@task(task_config=DGXTorchElastic(instance="dgxh100.80g.8.norm", restart_policy="OnFailure", max_restarts=0))
def once_restarted(n: int) -> int:
    """Its first run dies (exit 1: a worker lost mid-run) once the test says Flyte saw it running (the
    file ``fail-now`` in the shared folder); the operator restarts the job and the second run
    returns. The mark file tells the runs apart; no in-pod restarts (torch elastic's
    max_restarts=0), so the failure ends the pod and the job restarts it."""
    marks = Path(os.environ[MARKS])
    mark = marks / f"once_restarted-{n}"
    if not mark.exists():
        mark.write_text("ran once\n")
        deadline = time.monotonic() + 120
        while not (marks / "fail-now").exists() and time.monotonic() < deadline:
            time.sleep(0.2)  # the test's word, polled: a workload waiting, not a test's synchronisation
        raise SystemExit(1)
    return n * 2


@workflow
def restarts(n: int = 21) -> int:
    return once_restarted(n=n)


#: The built-in QLoRA fine-tune (the test plays its operator: no trainer runs).
qlora = DGXQLoRATask(
    name="propeller_qlora",
    trainer={
        "model": {"name": "meta-llama/Llama-3.1-8B"},
        "dataset": {"path": "/mnt/dgx/inputs/0/train.jsonl", "template": "instruction"},
        "lora": {"r": 16, "alpha": 32},
        "training": {"epochs": 1, "learningRate": 2e-4},
    },
    task_config=DGXDataConfig(
        instance="dgxh100.80g.8.norm",
        input_mounts=["s3://kubedgx-test/legal"],
        output_mounts=["s3://kubedgx-test/adapters"],
    ),
)


@task
def adapter_name(adapter: str) -> str:
    """A plain Flyte task: proof that the adapter's URI came through Flyte."""
    return f"got {adapter}"


@workflow
def fine_tune() -> str:
    return adapter_name(adapter=qlora())
