"""Helpers for the Flyte plugin's tests: tasks serialized as Flyte would, and execution metadata."""

from __future__ import annotations

import importlib.util
import sys
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from flytekit.configuration import ImageConfig, SerializationSettings
from flytekit.core.context_manager import ExecutionState, FlyteContextManager
from flytekit.extend.backend.utils import render_task_template
from flytekit.models.core.identifier import (
    Identifier,
    NodeExecutionIdentifier,
    ResourceType,
    TaskExecutionIdentifier,
    WorkflowExecutionIdentifier,
)
from flytekit.models.task import TaskExecutionMetadata
from flytekit.tools.translator import get_serializable

from tests.conftest import EXAMPLES

WORKFLOWS = EXAMPLES / "flyte" / "workflows.py"


def workflows() -> ModuleType:
    """examples/flyte/workflows.py, imported as the module ``workflows`` (as pyflyte-execute would
    from that folder)."""
    if "workflows" in sys.modules:
        return sys.modules["workflows"]
    spec = importlib.util.spec_from_file_location("workflows", WORKFLOWS)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["workflows"] = module
    spec.loader.exec_module(module)
    return module


@contextmanager
def executing() -> Iterator[None]:
    """A flytekit context with an execution mode: serializing a task with an ImageSpec outside one
    makes flytekit build the image (with docker)."""
    ctx = FlyteContextManager.current_context()
    state = ctx.new_execution_state().with_params(mode=ExecutionState.Mode.LOCAL_TASK_EXECUTION)
    with FlyteContextManager.with_context(ctx.with_execution_state(state)):
        yield


def template(task: Any, output_prefix: str = "s3://flyte-bucket/metadata/run/n0/0") -> Any:
    """The task template propeller sends the connector: serialized, args rendered."""
    with executing():
        tt = get_serializable(OrderedDict(), SerializationSettings(ImageConfig.auto_default_image()), task).template
    return render_task_template(tt, output_prefix) if tt.container is not None else tt


def metadata(
    namespace: str = "ml-development",
    name: str = "f3a9c2b1e0d4",
    node: str = "n0",
    retry: int = 0,
    service_account: str = "",
    env: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> TaskExecutionMetadata:
    """A TaskExecutionMetadata as Flyte's backend fills it (``labels`` added to the execution's)."""
    task_id = Identifier(ResourceType.TASK, "ml", "development", "workflows.square", "v1")
    node_id = NodeExecutionIdentifier(node, WorkflowExecutionIdentifier("ml", "development", name))
    return TaskExecutionMetadata(
        task_execution_id=TaskExecutionIdentifier(task_id=task_id, node_execution_id=node_id, retry_attempt=retry),
        namespace=namespace,
        labels={"execution-id": name, **(labels or {})},
        annotations={},
        k8s_service_account=service_account,
        environment_variables=env or {},
        identity=None,
    )
