"""``@task(task_config=DGXConfig(...))``: a Flyte function task that runs as a DGXTrainingJob.

On the submitting side (``pyflyte run`` locally, or Flyte's backend through the connector) the task
is a template: image, ``pyflyte-execute`` args, the config in ``custom``. In each worker pod the
operator runs that command once; ``pyflyte-execute`` then calls :meth:`DGXFunctionTask.execute` in
TASK_EXECUTION mode, which runs the function, under torch elastic when the job has more than one
process. That is torchrun's own machinery (``torch.distributed.run`` calls the same
``elastic_launch``), configured by the PET_* variables the operator sets on every worker, so the
operator's resolved node counts and rendezvous win over anything the task could guess. Only the
process of global rank 0 returns the outputs; the other pods end with IgnoreOutputs (success,
no ``outputs.pb``), so one writer reaches the blob store.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any, Final, NamedTuple

import cloudpickle
from flytekit import PythonFunctionTask
from flytekit.configuration import SerializationSettings
from flytekit.core.base_task import IgnoreOutputs, TaskMetadata
from flytekit.core.context_manager import FlyteContextManager
from flytekit.extend import TaskPlugins
from flytekit.extend.backend.base_connector import AsyncConnectorExecutorMixin

from flytekitplugins.dgx.config import (
    DGXConfig,
    DGXConfigError,
    DGXDataConfig,
    DGXTorchElastic,
    TaskConfig,
    check_types,
    to_custom,
)
from flytekitplugins.dgx.image import dgx_image_spec
from flytekitplugins.dgx.manifest import FUNCTION_TASK

log = logging.getLogger(__name__)


def is_local(ctx: Any = None) -> bool:
    """Whether this process submits (pyflyte run, a local workflow) rather than runs in a pod."""
    ctx = ctx or FlyteContextManager.current_context()
    state = ctx.execution_state
    return bool(state is not None and state.is_local_execution())


def check_task_kwargs(name: str, kwargs: dict[str, Any]) -> None:
    if kwargs.get("pod_template") is not None or kwargs.get("pod_template_name"):
        raise DGXConfigError(
            name,
            [
                "pod_template: a DGX task's pods are the operator's (placement, NVLink, torchrun); set the node "
                "and process counts with DGXTorchElastic, the resources with requests=Resources(...), and env "
                "with environment={...}"
            ],
        )


def with_deck(metadata: TaskMetadata) -> TaskMetadata:
    """The task's metadata with ``generates_deck``: propeller attaches ``<output prefix>/deck.html``
    only to a task whose template says so, and flytekit serializes it false unless ``enable_deck=True``,
    which would also make the pod render flytekit's own decks. The connector writes the deck
    (results.py). A copy: the caller's TaskMetadata may be shared with other tasks."""
    return dataclasses.replace(metadata, generates_deck=True)


class DGXFunctionTask(AsyncConnectorExecutorMixin, PythonFunctionTask):  # type: ignore[misc]  # untyped flytekit
    """A @task whose body runs in the job's worker pods."""

    _TASK_TYPE = FUNCTION_TASK

    def __init__(self, task_config: TaskConfig, task_function: Callable[..., Any], **kwargs: Any) -> None:
        name = f"{task_function.__module__}.{task_function.__name__}"
        check_types(task_config, name)
        check_task_kwargs(name, kwargs)
        if kwargs.get("container_image") is None:
            kwargs["container_image"] = dgx_image_spec
        super().__init__(task_config=task_config, task_function=task_function, task_type=self._TASK_TYPE, **kwargs)
        self._metadata = with_deck(self.metadata)

    def get_custom(self, settings: SerializationSettings) -> dict[str, Any]:
        return to_custom(self.task_config)

    def execute(self, **kwargs: Any) -> Any:
        if is_local():
            return AsyncConnectorExecutorMixin.execute(self, **kwargs)  # submit a DGXTrainingJob
        return run_in_pod(self._task_function, kwargs)


for _config_type in (DGXConfig, DGXTorchElastic, DGXDataConfig):
    TaskPlugins.register_pythontask_plugin(_config_type, DGXFunctionTask)


# -- in the pod ------------------------------------------------------------------------------


class WorkerResult(NamedTuple):
    return_value: Any


def elastic_settings(environ: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, Any]:
    """torch elastic's LaunchConfig from the operator's PET_* variables (Kubeflow's names)."""
    nnodes = environ.get("PET_NNODES", "1")
    low, _, high = nnodes.partition(":")
    conf: dict[str, str] = {}
    for part in filter(None, environ.get("PET_RDZV_CONF", "").split(",")):
        k, _, v = part.partition("=")
        conf[k.strip()] = v.strip()
    return {
        "min_nodes": int(low),
        "max_nodes": int(high or low),
        "nproc_per_node": int(environ.get("PET_NPROC_PER_NODE", "1")),
        "run_id": environ.get("PET_RDZV_ID") or "flyte",
        "rdzv_backend": environ.get("PET_RDZV_BACKEND", "c10d"),
        "rdzv_endpoint": environ.get("PET_RDZV_ENDPOINT", "localhost:0"),
        "rdzv_configs": conf,
        "max_restarts": int(environ.get("PET_MAX_RESTARTS", "0")),
    }


def spawn_worker(fn: bytes, raw_output_prefix: str, checkpoint_dest: str | None, checkpoint_src: str | None,
                 kwargs: dict[str, Any]) -> WorkerResult:  # fmt: skip
    """One training process (module level, so torch elastic's spawn can pickle it): a Flyte
    execution context of its own, then the task function (cloudpickled: a task function is not
    picklable by name once decorated)."""
    from flytekit.bin.entrypoint import setup_execution

    with setup_execution(
        raw_output_data_prefix=raw_output_prefix, checkpoint_path=checkpoint_dest, prev_checkpoint=checkpoint_src
    ):
        return WorkerResult(cloudpickle.loads(fn)(**kwargs))


#: The exceptions a worker may raise that Flyte retries (flytekit writes them RECOVERABLE in error.pb).
RECOVERABLE_NAMES: Final = frozenset({"FlyteRecoverableException"})


def worker_failure(rank: int, message: Any) -> Exception:
    """What the pod raises for a failed worker process: the child's own ``Type: message`` (torch
    elastic's error file; without one, its hint), as a FlyteRecoverableException when the child
    raised one, so Flyte still retries what the function declared recoverable."""
    from flytekit.exceptions.user import FlyteRecoverableException

    text = str(message.get("message", message)) if isinstance(message, dict) else str(message)
    text = text.strip() or "no error recorded"
    kind = text.split(":", 1)[0].strip()
    described = f"worker process of global rank {rank} failed: {text}"
    error: Exception = FlyteRecoverableException(described) if kind in RECOVERABLE_NAMES else RuntimeError(described)
    return error


def run_in_pod(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """The function, once per process of this node; the value of global rank 0, or IgnoreOutputs."""
    settings = elastic_settings()
    if settings["max_nodes"] == 1 and settings["nproc_per_node"] == 1:
        return fn(**kwargs)  # one process: it is rank 0
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if settings["nproc_per_node"] > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does
    config = LaunchConfig(
        run_id=settings["run_id"],
        min_nodes=settings["min_nodes"],
        max_nodes=settings["max_nodes"],
        nproc_per_node=settings["nproc_per_node"],
        rdzv_backend=settings["rdzv_backend"],
        rdzv_endpoint=settings["rdzv_endpoint"],
        rdzv_configs=settings["rdzv_configs"],
        max_restarts=settings["max_restarts"],
        monitor_interval=1,
        start_method="spawn",
    )
    ctx = FlyteContextManager.current_context()
    user = ctx.user_space_params
    try:
        dest, src = user.checkpoint._checkpoint_dest, user.checkpoint._checkpoint_src
    except (AttributeError, NotImplementedError):
        dest = src = None
    args = (cloudpickle.dumps(fn), user.raw_output_prefix, dest, src, kwargs)
    try:
        results: dict[int, WorkerResult] = elastic_launch(config, spawn_worker)(*args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        raise worker_failure(rank, failure.message) from None
    if 0 in results:
        return results[0].return_value
    log.info("global rank 0 ran on another node: this pod writes no outputs")
    raise IgnoreOutputs("global rank 0 ran on another node")
