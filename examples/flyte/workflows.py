"""Flyte tasks on kubedgx: every config the plugin has, as an ML team would write them.

Run one locally against the cluster in your kubeconfig (the connector runs in-process, each task
becomes a DGXTrainingJob):

    pyflyte run examples/flyte/workflows.py wf --n 4

`wf` is the smallest end-to-end case: `square` runs on a DGX node and its result comes back
through Flyte's blob store to a plain Flyte task. The other tasks show each config; see
docs/flyte.md.
"""

from __future__ import annotations

import os
from pathlib import Path

from flytekit import Resources, task, workflow
from flytekit.types.directory import FlyteDirectory

from flytekitplugins.dgx import (
    DGXConfig,
    DGXDataConfig,
    DGXQLoRATask,
    DGXTorchElastic,
    dgx_image_spec,
)


@task(task_config=DGXConfig(instance="dgxa100.80g.8.norm", priority="high", max_duration="24h"))
def train_large_model(dataset: FlyteDirectory) -> FlyteDirectory:
    """Reads the dataset Flyte hands it and returns a directory Flyte uploads."""
    out = Path(os.environ.get("TMPDIR", "/tmp")) / "model"
    out.mkdir(parents=True, exist_ok=True)
    files = sorted(p.name for p in Path(dataset.download()).iterdir())
    (out / "trained-on.txt").write_text("\n".join(files) + "\n")
    return FlyteDirectory(str(out))


@task(task_config=DGXDataConfig(input_mounts=["s3://my-bucket/input"], output_mounts=["gs://my-bucket/output"]))
def process_with_dgx() -> int:
    """The input prefix is on the node's NVMe before this starts; what it writes under the output
    mount's directory follows kubedgx's Out-mount conventions (docs/datamounts.md)."""
    (inputs,) = os.environ["DGX_INPUT_DIRS"].split(os.pathsep)
    (outputs,) = os.environ["DGX_OUTPUT_DIRS"].split(os.pathsep)
    count = sum(1 for _ in Path(inputs).rglob("*") if _.is_file())
    Path(outputs, "count.txt").write_text(f"{count}\n")
    return count


mixtral_image = dgx_image_spec.with_packages(["transformers", "bitsandbytes", "accelerate"])


@task(
    task_config=DGXConfig(instance="dgxa100.80g.8.norm"),
    container_image=mixtral_image,
    requests=Resources(gpu="8", cpu="32", mem="512Gi"),
)
def fine_tune_mixtral(dataset_path: str, lr: float = 3e-5) -> str:
    """User code with the trainer image's stack (transformers, peft, bitsandbytes) importable."""
    return f"fine-tuned on {dataset_path} at lr={lr}"


@task(task_config=DGXTorchElastic(min_nodes=4, max_nodes=8, nproc_per_node=8, max_restarts=3))
def distributed_train() -> float:
    """Runs in every process of every node (torch elastic); rank 0's return value is the output."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    value = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(value)
    dist.destroy_process_group()
    return float(value.item())


@task(
    task_config=DGXConfig(
        instance="dgxa100.80g.8.spot",
        max_duration="6h",
        data_cache="preload",  # preload caches the job's input mounts on the node, so it needs one
        data=DGXDataConfig(input_mounts=["s3://my-bucket/input"]),
    )
)
def cost_effective_train() -> str:
    """On spot capacity: a reclaimed node's worker resumes on another node from the last checkpoint,
    and the cached input is reused on nodes that have it."""
    return "trained on spot capacity"


@task(task_config=DGXConfig(instance="dgxa100.80g.8.debug", debug=True, interactive=True))
def debug_training() -> None:
    """Interactive: the worker sleeps with the job's full environment for `kubectl exec`."""


#: The built-in QLoRA fine-tune, no user code: the `trainer` section of a DGXTrainingJob.
qlora_legal = DGXQLoRATask(
    name="qlora_legal",
    trainer={
        "model": {"name": "meta-llama/Llama-3.1-8B"},
        "dataset": {"path": "/mnt/dgx/inputs/0/train.jsonl", "template": "instruction"},
        "lora": {"r": 16, "alpha": 32},
        "training": {"epochs": 1, "learningRate": 2e-4},
    },
    task_config=DGXDataConfig(
        instance="dgxh100.80g.8.norm",
        input_mounts=["s3://my-bucket/legal"],
        output_mounts=["s3://my-bucket/adapters"],
    ),
)


# -- the end-to-end example ------------------------------------------------------------------


@task(task_config=DGXConfig(instance="dgxh100.80g.8.norm", max_duration="30m"))
def square(n: int) -> int:
    """Runs in the DGXTrainingJob's worker pod (pyflyte-execute), not in the submitting process."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return n * n


@task
def plus_one(x: int) -> int:
    """A plain Flyte task: proof that the DGX task's output came back through Flyte."""
    return x + 1


@workflow
def wf(n: int = 3) -> int:
    return plus_one(x=square(n=n))
