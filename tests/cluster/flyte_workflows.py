"""Workflows for the real propeller, built from flytekit's own serialization, submitted as
FlyteWorkflow objects (what flyteadmin would create for ``pyflyte run --remote``; admin cannot be
built here, so the tests create the object themselves).

``closure`` serializes a ``@workflow`` with flytekit's ``get_serializable`` (as ``pyflyte register``
does) into a ``core.WorkflowClosure`` (the workflow and its tasks); ``submit`` hands it to
``kubectl-flyte create --dry-run``, propeller's own compiler, which prints the FlyteWorkflow object;
the test adds labels (a Kueue queue, say: ``create`` has no flag for them) and creates it.
"""

from __future__ import annotations

import json
import subprocess
from collections import OrderedDict
from pathlib import Path
from typing import Any

import yaml
from flyteidl.core import literals_pb2, workflow_closure_pb2
from flytekit.configuration import ImageConfig, SerializationSettings
from flytekit.core.context_manager import FlyteContextManager
from flytekit.core.type_engine import TypeEngine
from flytekit.models import task as task_models
from flytekit.tools.translator import get_serializable

from tests.e2e.kubectl import Kubectl
from tests.flyte.flyte import executing

PROJECT, DOMAIN = "flytesnacks", "development"
#: The line kubectl-flyte prints before the object in --dry-run mode.
DRY_RUN_BANNER = "Dry Run mode enabled. Printing the compiled workflow."


def closure(workflow: Any, *, version: str = "v1") -> workflow_closure_pb2.WorkflowClosure:
    """The workflow and every task it calls, as ``pyflyte register`` would store them. Inside an
    execution context: serializing a task with an ImageSpec outside one makes flytekit build it."""
    settings = SerializationSettings(
        image_config=ImageConfig.auto_default_image(), project=PROJECT, domain=DOMAIN, version=version
    )
    entities: OrderedDict[Any, Any] = OrderedDict()
    with executing():
        spec = get_serializable(entities, settings, workflow)
    out = workflow_closure_pb2.WorkflowClosure(workflow=spec.template.to_flyte_idl())
    out.tasks.extend(e.template.to_flyte_idl() for e in entities.values() if isinstance(e, task_models.TaskSpec))
    return out


def inputs(workflow: Any, **values: Any) -> literals_pb2.LiteralMap:
    """The workflow's inputs as Flyte literals (flytekit's type engine, as ``pyflyte run`` makes them)."""
    ctx = FlyteContextManager.current_context()
    hints = workflow.python_interface.inputs
    literal_map = TypeEngine.dict_to_literal_map(ctx, values, type_hints={k: hints[k] for k in values})
    return literal_map.to_flyte_idl()


def parse_dry_run(output: str) -> dict[str, Any]:
    """The FlyteWorkflow object ``kubectl-flyte create --dry-run`` printed after its banner."""
    if DRY_RUN_BANNER not in output:
        raise AssertionError(f"kubectl-flyte printed no {DRY_RUN_BANNER!r}:\n{output[-3000:]}")
    obj = yaml.safe_load(output.split(DRY_RUN_BANNER, 1)[1])
    if not isinstance(obj, dict) or str(obj.get("kind", "")).lower() != "flyteworkflow":
        raise AssertionError(f"kubectl-flyte's dry run is not a FlyteWorkflow:\n{output[-3000:]}")
    obj["kind"] = "FlyteWorkflow"  # it prints the kind lower-cased; the apiserver wants the CRD's
    return obj


def compile_workflow(
    kubectl_flyte: Path,
    k: Kubectl,
    workdir: Path,
    wf_closure: workflow_closure_pb2.WorkflowClosure,
    wf_inputs: literals_pb2.LiteralMap,
    execution_id: str,
) -> dict[str, Any]:
    """Propeller's compiler on the closure: the FlyteWorkflow object for ``execution_id`` in ``k``'s namespace."""
    closure_pb, inputs_pb = workdir / f"{execution_id}-closure.pb", workdir / f"{execution_id}-inputs.pb"
    closure_pb.write_bytes(wf_closure.SerializeToString())
    inputs_pb.write_bytes(wf_inputs.SerializeToString())
    argv = [str(kubectl_flyte), "--kubeconfig", str(k.kubeconfig), "--context", k.context, "-n", str(k.namespace),
            "create", "-p", str(closure_pb), "-i", str(inputs_pb), "--execution-id", execution_id,
            "--dry-run"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise AssertionError(f"kubectl-flyte create --dry-run exited {done.returncode}:\n{done.stderr[-3000:]}")
    return parse_dry_run(done.stdout)


def submit(
    kubectl_flyte: Path,
    k: Kubectl,
    workdir: Path,
    workflow: Any,
    execution_id: str,
    *,
    labels: dict[str, str] | None = None,
    version: str = "v1",
    **values: Any,
) -> dict[str, Any]:
    """Compile ``workflow`` with ``values`` as its inputs and create the FlyteWorkflow; returns the object sent."""
    obj = compile_workflow(kubectl_flyte, k, workdir, closure(workflow, version=version), inputs(workflow, **values),
                           execution_id)  # fmt: skip
    obj["metadata"]["namespace"] = str(k.namespace)
    obj["metadata"].setdefault("labels", {}).update(labels or {})
    k.run("create", "-f", "-", input=json.dumps(obj))
    return obj
