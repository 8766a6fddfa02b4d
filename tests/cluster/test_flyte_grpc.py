"""``pyflyte serve connector`` with the kubedgx connector, called over gRPC as Flyte's backend calls it.

Propeller's connector plugin talks to a connector deployment through ``flyteidl.service``'s
AsyncAgentService (CreateTask / GetTask / DeleteTask) and AgentMetadataService (ListAgents), after
the deployment's grpc.health.v1 check says SERVING. Here the real server runs as a subprocess
against this suite's kube-apiserver; the client sends what propeller sends: a registered task
template (``square`` from examples/flyte/workflows.py, serialized by flytekit, its args rendered
with the output prefix) and the execution's TaskExecutionMetadata. No operator runs: the test plays
the operator by writing the job's status subresource, and reads back the phases Flyte would show.
The server reads Flyte's blob store (error.pb) from moto's S3 with the keys a deployment gives it, and
leaves the deck and the QLoRA task's outputs.pb there when a job ends.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("grpc_health.v1.health_pb2_grpc", reason="flytekit[connector] is not installed")
pytest.importorskip("flytekit", reason="flytekit is not installed (pip install -e ./flyte[connector])")
pytest.importorskip("flytekitplugins.dgx", reason="flytekitplugins-dgx is not installed (pip install -e ./flyte)")

from flyteidl.admin import agent_pb2  # noqa: E402
from flyteidl.core import identifier_pb2, literals_pb2  # noqa: E402
from flyteidl.core.errors_pb2 import ContainerError, ErrorDocument  # noqa: E402
from flyteidl.core.execution_pb2 import TaskExecution  # noqa: E402
from flytekit import task  # noqa: E402
from flytekit.configuration import ImageConfig, SerializationSettings  # noqa: E402
from flytekit.core.base_task import PythonTask  # noqa: E402
from flytekit.core.context_manager import ExecutionState, FlyteContextManager  # noqa: E402
from flytekit.core.type_engine import TypeEngine  # noqa: E402
from flytekit.extend.backend.utils import render_task_template  # noqa: E402
from flytekit.models.task import TaskExecutionMetadata, TaskTemplate  # noqa: E402
from flytekit.tools.translator import get_serializable  # noqa: E402
from grpc_health.v1 import health_pb2  # noqa: E402

from dgx_operator.api.datamount import DGXDataMount  # noqa: E402
from dgx_operator.api.trainingjob import DGXTrainingJob  # noqa: E402
from dgx_operator.render.datasync import logs_uri  # noqa: E402
from dgx_operator.render.resolved import JobIdentity  # noqa: E402
from flytekitplugins.dgx import DGXConfig, DGXConfigError, DGXDataConfig, DGXQLoRATask  # noqa: E402
from flytekitplugins.dgx.connector import DGXConnector, DGXJobMetadata  # noqa: E402
from flytekitplugins.dgx.manifest import build  # noqa: E402
from flytekitplugins.dgx.phases import RAN_ANNOTATION  # noqa: E402
from tests.chart.conftest import Rendered  # noqa: E402
from tests.cluster.controlplane import CONTEXT, ControlPlane  # noqa: E402
from tests.cluster.flyte_connector_server import Connector, serve  # noqa: E402
from tests.cluster.operator import install  # noqa: E402
from tests.conftest import EXAMPLES  # noqa: E402
from tests.e2e.kubectl import JOBS, Kubectl, dig, wait_for  # noqa: E402
from tests.s3 import ACCESS_KEY, S3, SECRET_KEY, secret  # noqa: E402

#: The examples' workflows module, importable by its name as `pyflyte run examples/flyte/workflows.py` has it.
if str(EXAMPLES / "flyte") not in sys.path:
    sys.path.insert(0, str(EXAMPLES / "flyte"))
import workflows  # noqa: E402

FUNCTION_TASK = agent_pb2.TaskCategory(name="dgx_training", version=0)
#: Seconds one gRPC call may take (each CreateTask/GetTask/DeleteTask is a few apiserver calls).
RPC_TIMEOUT = 30
#: The server's own lifetime (``--timeout``): it outlives this module, and stops by itself if the finalizer never runs.
SERVER_LIFETIME = 300
PROJECT, DOMAIN = "flytesnacks", "development"
#: In a bucket moto does not have: no error.pb there (the store says not found).
OUTPUT_PREFIX = "s3://flyte-bucket/metadata/propeller/flytesnacks-development-abc123/n0/data/0"
#: The deployment's log links: one for the job (no {pod}), shown by Flyte while the task is pending too.
LOG_TEMPLATE = "https://grafana.example/d/kubedgx?ns={namespace}&job={job}"


@task(task_config=DGXConfig(instance="not-an-instance"))
def misplaced(n: int) -> int:
    """A DGX task whose instance no catalog has: the connector must refuse it before the apiserver sees it."""
    return n


# -- the server -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def crds(control_plane: ControlPlane, kubectl: Kubectl) -> list[Rendered]:
    """The chart's CRDs (and the rest of it but the Deployment); no operator: the test writes every status."""
    control_plane.slot.release()  # an earlier module's operator would reconcile these jobs
    return install(kubectl)


@pytest.fixture(scope="module")
def store(s3: S3) -> S3:
    """Flyte's blob store: the session's moto S3 (each test makes buckets of its own)."""
    return s3


@pytest.fixture(scope="module")
def connector(
    control_plane: ControlPlane, crds: list[Rendered], tmp_path_factory: pytest.TempPathFactory, store: S3
) -> Iterator[Connector]:
    # The connector's own access to Flyte's blob store, as a deployment sets it.
    env = {
        "FLYTE_AWS_ENDPOINT": store.endpoint,
        "FLYTE_AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "FLYTE_AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_EC2_METADATA_DISABLED": "true",
        "KUBEDGX_FLYTE_LOG_TEMPLATE": LOG_TEMPLATE,
    }
    with serve(control_plane, tmp_path_factory.mktemp("flyte-connector"), lifetime=SERVER_LIFETIME,
               env=env) as server:  # fmt: skip
        yield server


# -- what propeller sends ---------------------------------------------------------------------


def serialized(python_task: PythonTask, output_prefix: str = OUTPUT_PREFIX) -> Any:
    """The task's template as `pyflyte register` would store it, args rendered as propeller renders
    them for ``output_prefix``. Inside an execution context: otherwise flytekit would try to build the
    task's ImageSpec with docker."""
    ctx = FlyteContextManager.current_context()
    state = ctx.new_execution_state().with_params(mode=ExecutionState.Mode.LOCAL_TASK_EXECUTION)
    with FlyteContextManager.with_context(ctx.with_execution_state(state)):
        template = get_serializable(OrderedDict(), SerializationSettings(ImageConfig.auto_default_image()),
                                    python_task).template  # fmt: skip
    rendered = render_task_template(template, output_prefix) if template.container is not None else template
    proto = rendered.to_flyte_idl()
    # A registered task has its project, domain and version (serialization leaves them empty).
    proto.id.project, proto.id.domain, proto.id.version = PROJECT, DOMAIN, "v1"
    return proto


def execution_metadata(namespace: str, execution: str, *, retry_attempt: int = 0) -> agent_pb2.TaskExecutionMetadata:
    task_id = identifier_pb2.Identifier(
        resource_type=identifier_pb2.TASK, project=PROJECT, domain=DOMAIN, name="workflows.square", version="v1"
    )
    node = identifier_pb2.NodeExecutionIdentifier(
        node_id="n0",
        execution_id=identifier_pb2.WorkflowExecutionIdentifier(project=PROJECT, domain=DOMAIN, name=execution),
    )
    return agent_pb2.TaskExecutionMetadata(
        task_execution_id=identifier_pb2.TaskExecutionIdentifier(
            task_id=task_id, node_execution_id=node, retry_attempt=retry_attempt
        ),
        namespace=namespace,
        labels={"execution-id": execution, "shard-key": "7"},
        annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
        environment_variables={"FLYTE_TEST_FROM_PROPELLER": "yes"},
    )


def create_request(
    template: Any, metadata: agent_pb2.TaskExecutionMetadata, output_prefix: str = OUTPUT_PREFIX
) -> agent_pb2.CreateTaskRequest:
    n = literals_pb2.Literal(scalar=literals_pb2.Scalar(primitive=literals_pb2.Primitive(integer=4)))
    return agent_pb2.CreateTaskRequest(
        inputs=literals_pb2.LiteralMap(literals={"n": n}),
        template=template,
        output_prefix=output_prefix,
        task_execution_metadata=metadata,
    )


def get_task(server: Connector, meta: bytes, category: agent_pb2.TaskCategory = FUNCTION_TASK) -> Any:
    request = agent_pb2.GetTaskRequest(
        task_type=category.name, task_category=category, resource_meta=meta, output_prefix=OUTPUT_PREFIX
    )
    return server.tasks.GetTask(request, timeout=RPC_TIMEOUT).resource


def delete_task(server: Connector, meta: bytes) -> agent_pb2.DeleteTaskResponse:
    request = agent_pb2.DeleteTaskRequest(task_type=FUNCTION_TASK.name, task_category=FUNCTION_TASK, resource_meta=meta)
    return server.tasks.DeleteTask(request, timeout=RPC_TIMEOUT)


def phase_name(phase: int) -> str:
    return str(TaskExecution.Phase.Name(phase))


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def set_status(k: Kubectl, name: str, status: dict[str, Any]) -> None:
    """What the operator would write: the status subresource (the spec is untouched)."""
    k.run("patch", JOBS, name, "--subresource=status", "--type=merge", "-p", json.dumps({"status": status}))


def failed_status(reason: str, message: str) -> dict[str, Any]:
    return {
        "phase": "Failed", "nodes": "0/1", "completionTime": now(),
        "conditions": [
            {"type": "Running", "status": "False", "reason": reason, "message": message, "lastTransitionTime": now()},
            {"type": "Failed", "status": "True", "reason": reason, "message": message, "lastTransitionTime": now()},
        ],
    }  # fmt: skip


def error_document(message: str, kind: int) -> bytes:
    return bytes(ErrorDocument(error=ContainerError(code="USER:Error", message=message, kind=kind)).SerializeToString())


def env_of(job: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in dig(job, "spec", "env", default=[]) or []}


# -- the tests --------------------------------------------------------------------------------


def test_lists_the_kubedgx_connector_with_both_task_categories(connector: Connector) -> None:
    agents = connector.metadata.ListAgents(agent_pb2.ListAgentsRequest(), timeout=RPC_TIMEOUT).agents
    by_name = {a.name: a for a in agents}
    assert "kubedgx" in by_name, f"ListAgents: {sorted(by_name)}"
    categories = {(c.name, c.version) for c in by_name["kubedgx"].supported_task_categories}
    assert categories == {("dgx_training", 0), ("dgx_qlora", 0)}
    assert not by_name["kubedgx"].is_sync
    # Every service the deployment serves says SERVING (propeller's health probe asks the server as a whole).
    for service in ("", "flyteidl.service.AsyncAgentService", "flyteidl.service.AgentMetadataService"):
        answer = connector.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING, service


def test_create_get_delete_round_trip(connector: Connector, namespace: Kubectl) -> None:
    ns = namespace.namespace
    assert ns is not None
    template = serialized(workflows.square)
    request = create_request(template, execution_metadata(ns, "abc123"))

    # CreateTask: one DGXTrainingJob in the execution's namespace, running the rendered pyflyte-execute.
    first = connector.tasks.CreateTask(request, timeout=RPC_TIMEOUT)
    meta = json.loads(first.resource_meta)
    assert meta["namespace"] == ns, meta
    assert meta["task_type"] == "dgx_training", meta
    assert meta["uid"], meta
    job = namespace.get(JOBS, meta["name"])
    assert job is not None, f"CreateTask answered {meta} but no job {meta['name']} exists in {ns}"
    assert job["metadata"]["uid"] == meta["uid"]
    assert meta["name"].startswith("flyte-abc123-"), meta["name"]
    spec = job["spec"]
    assert spec["command"] == list(template.container.args)
    assert spec["command"][:3] == ["pyflyte-execute", "--inputs", f"{OUTPUT_PREFIX}/inputs.pb"]
    assert spec["command"][-4:] == ["task-module", "workflows", "task-name", "square"]
    assert "{{" not in " ".join(spec["command"]), "propeller's placeholders reached the job unrendered"
    assert spec["image"] == template.container.image
    assert spec["instance"] == "dgxh100.80g.8.norm"
    assert spec["maxDuration"] == "30m"
    env = env_of(job)
    assert env["FLYTE_INTERNAL_EXECUTION_ID"] == "abc123"
    assert env["FLYTE_INTERNAL_EXECUTION_PROJECT"] == PROJECT
    assert env["FLYTE_INTERNAL_EXECUTION_DOMAIN"] == DOMAIN
    assert env["FLYTE_INTERNAL_TASK_NAME"] == "workflows.square"
    assert env["FLYTE_INTERNAL_TASK_VERSION"] == "v1"
    assert env["FLYTE_ATTEMPT_NUMBER"] == "0"
    assert env["FLYTE_FAIL_ON_ERROR"] == "true", "a raising function must fail the worker, not exit 0"
    assert env["FLYTE_TEST_FROM_PROPELLER"] == "yes", "the execution's environment_variables were dropped"
    labels = job["metadata"].get("labels") or {}
    assert labels.get("execution-id") == "abc123"
    assert labels.get("app.kubernetes.io/managed-by") == "flytekitplugins-dgx"
    annotations = job["metadata"].get("annotations") or {}
    assert annotations.get("flyte.kubedgx.io/output-prefix") == OUTPUT_PREFIX

    # CreateTask again (propeller retries a create whose answer it lost): the same job is adopted.
    again = connector.tasks.CreateTask(request, timeout=RPC_TIMEOUT)
    meta_again = json.loads(again.resource_meta)
    assert (meta_again["name"], meta_again["uid"]) == (meta["name"], meta["uid"])
    assert [j["metadata"]["name"] for j in namespace.select(JOBS)] == [meta["name"]]

    # GetTask through the phases the operator writes.
    resource = get_task(connector, first.resource_meta)
    assert resource.phase == TaskExecution.QUEUED, phase_name(resource.phase)
    assert "pending" in resource.message
    assert resource.custom_info["job"] == f"{ns}/{meta['name']}"
    # The job's link, which Flyte's admin keeps while the task is queued or initializing.
    assert [(link.name, link.uri, link.ShowWhilePending) for link in resource.log_links] == [
        ("kubedgx job", f"https://grafana.example/d/kubedgx?ns={ns}&job={meta['name']}", True)
    ]
    assert RAN_ANNOTATION not in (dig(namespace.get(JOBS, meta["name"]), "metadata", "annotations") or {})

    set_status(namespace, meta["name"], {
        "phase": "Running", "nodes": "1/1", "startTime": now(),
        "conditions": [{"type": "Running", "status": "True", "reason": "WorkersRunning",
                        "message": "1/1 workers running", "lastTransitionTime": now()}],
    })  # fmt: skip
    resource = get_task(connector, first.resource_meta)
    assert resource.phase == TaskExecution.RUNNING, (phase_name(resource.phase), resource.message)
    assert resource.message == "running: nodes 1/1"
    assert resource.custom_info["phase"] == "Running"
    # Reported RUNNING: the job is marked, and a suspension after it (Kueue preempts it) stays RUNNING.
    assert dig(namespace.get(JOBS, meta["name"]), "metadata", "annotations", RAN_ANNOTATION)
    set_status(namespace, meta["name"], {
        "phase": "Suspended", "nodes": "0/0", "startTime": None,
        "conditions": [{"type": "Suspended", "status": "True", "reason": "Preempted",
                        "message": "Preempted to accommodate a higher priority Workload", "lastTransitionTime": now()}],
    })  # fmt: skip
    resource = get_task(connector, first.resource_meta)
    assert (phase_name(resource.phase), resource.message) == (
        "RUNNING",
        "queued by Kueue: Preempted: Preempted to accommodate a higher priority Workload",
    )

    # A worker that died without an error.pb (none under this prefix): Flyte may retry the task.
    set_status(namespace, meta["name"], failed_status("WorkerFailed", "worker 0 exited 137: killed by signal 9"))
    resource = get_task(connector, first.resource_meta)
    assert (phase_name(resource.phase), resource.message) == (
        "RETRYABLE_FAILED",
        "WorkerFailed: worker 0 exited 137: killed by signal 9",
    )

    # DeleteTask of an ended job (propeller cleans a failed attempt up before it retries): kept, it is
    # what the attempt's error names.
    assert delete_task(connector, first.resource_meta) == agent_pb2.DeleteTaskResponse()
    assert dig(namespace.get(JOBS, meta["name"]), "status", "phase") == "Failed"

    # DeleteTask of a running job (an abort): the job goes; a second DeleteTask is no error.
    set_status(namespace, meta["name"], {"phase": "Running", "nodes": "1/1"})
    assert delete_task(connector, first.resource_meta) == agent_pb2.DeleteTaskResponse()
    wait_for(f"job {meta['name']} to be deleted", lambda: namespace.get(JOBS, meta["name"]) is None, timeout=30,
             interval=0.2)  # fmt: skip
    delete_task(connector, first.resource_meta)
    assert namespace.select(JOBS) == []

    # GetTask after the job is gone: a permanent failure that says so.
    resource = get_task(connector, first.resource_meta)
    assert resource.phase == TaskExecution.FAILED, (phase_name(resource.phase), resource.message)
    assert "gone" in resource.message
    assert "deleted" in resource.message


def test_a_retry_attempt_gets_a_job_of_its_own(connector: Connector, namespace: Kubectl) -> None:
    """Flyte's retry of a node is a new attempt: a new job, the first one left alone."""
    ns = namespace.namespace
    assert ns is not None
    template = serialized(workflows.square)
    first = json.loads(connector.tasks.CreateTask(create_request(template, execution_metadata(ns, "retry1")),
                                                  timeout=RPC_TIMEOUT).resource_meta)  # fmt: skip
    second = json.loads(connector.tasks.CreateTask(
        create_request(template, execution_metadata(ns, "retry1", retry_attempt=1)), timeout=RPC_TIMEOUT
    ).resource_meta)  # fmt: skip
    assert first["name"] != second["name"]
    assert first["uid"] != second["uid"]
    assert sorted(j["metadata"]["name"] for j in namespace.select(JOBS)) == sorted([first["name"], second["name"]])
    job = namespace.get(JOBS, second["name"])
    assert env_of(job or {})["FLYTE_ATTEMPT_NUMBER"] == "1"


def test_a_bad_config_fails_the_task_for_good_with_the_validators_message(
    connector: Connector, namespace: Kubectl
) -> None:
    """An error from CreateTask is a retryable failure to propeller (it would create again, `retries` times,
    though no try can pass): the refusal is answered, and GetTask reports it FAILED, a permanent failure."""
    ns = namespace.namespace
    assert ns is not None
    request = create_request(serialized(misplaced), execution_metadata(ns, "bad1"))
    # What kubedgx's Validator says of the same template, in-process: the lines the server must pass on.
    with pytest.raises(DGXConfigError) as local:
        build(TaskTemplate.from_flyte_idl(request.template), OUTPUT_PREFIX,
              TaskExecutionMetadata.from_flyte_idl(request.task_execution_metadata))  # fmt: skip
    (line,) = local.value.lines
    assert 'spec.instance: invalid value "not-an-instance"' in line, line
    answer = connector.tasks.CreateTask(request, timeout=RPC_TIMEOUT)
    meta = json.loads(answer.resource_meta)
    assert meta["refused"] == str(local.value), meta
    resource = get_task(connector, answer.resource_meta)
    assert (phase_name(resource.phase), resource.message) == ("FAILED", str(local.value))
    assert line in resource.message
    assert delete_task(connector, answer.resource_meta) == agent_pb2.DeleteTaskResponse()
    assert namespace.select(JOBS) == [], "a refused config must create nothing"
    assert namespace.get_json("get", "dgxdatamounts")["items"] == []


def test_the_function_s_error_pb_decides_whether_flyte_may_retry(
    connector: Connector,
    namespace: Kubectl,
    s3: S3,
) -> None:
    """As propeller decides for its own container tasks: RECOVERABLE (FlyteRecoverableException) may be retried,
    NON_RECOVERABLE (any other exception) may not; its message joins the job's reason."""
    ns = namespace.namespace
    assert ns is not None
    bucket = s3.bucket("flyte")
    prefix = f"s3://{bucket}/metadata/propeller/flytesnacks-development-err1/n0/data/0"
    request = create_request(serialized(workflows.square, prefix), execution_metadata(ns, "err1"), prefix)
    answer = connector.tasks.CreateTask(request, timeout=RPC_TIMEOUT)
    name = json.loads(answer.resource_meta)["name"]
    set_status(namespace, name, failed_status("WorkerFailed", f"{name}-worker-0 exited with code 1"))
    key = prefix.removeprefix(f"s3://{bucket}/") + "/error.pb"

    s3.client.put_object(Bucket=bucket, Key=key, Body=error_document("ValueError: no square for -1",
                                                                     ContainerError.NON_RECOVERABLE))  # fmt: skip
    plain = get_task(connector, answer.resource_meta)
    assert (phase_name(plain.phase), plain.message) == (
        "FAILED",
        f"WorkerFailed: {name}-worker-0 exited with code 1; the task raised: ValueError: no square for -1",
    )
    s3.client.put_object(Bucket=bucket, Key=key, Body=error_document("FlyteRecoverableException: try again",
                                                                     ContainerError.RECOVERABLE))  # fmt: skip
    recoverable = get_task(connector, answer.resource_meta)
    assert (phase_name(recoverable.phase), recoverable.message) == (
        "RETRYABLE_FAILED",
        f"WorkerFailed: {name}-worker-0 exited with code 1; the task raised: FlyteRecoverableException: try again",
    )


def test_gettasklogs_sends_nothing_over_the_wire(
    connector: Connector, namespace: Kubectl, control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GetTaskLogs is server-streaming; flytekit's servicer is a coroutine that returns the connector's one
    response, which grpc.aio drops: the stream ends at once, with status OK. The same call in-process (what
    flytekit's servicer gets from the connector) has the answer."""
    ns = namespace.namespace
    assert ns is not None
    answer = connector.tasks.CreateTask(create_request(serialized(workflows.square), execution_metadata(ns, "logs1")),
                                        timeout=RPC_TIMEOUT)  # fmt: skip
    request = agent_pb2.GetTaskLogsRequest(task_type=FUNCTION_TASK.name, task_category=FUNCTION_TASK,
                                           resource_meta=answer.resource_meta, lines=10)  # fmt: skip
    call = connector.tasks.GetTaskLogs(request, timeout=RPC_TIMEOUT)
    assert (list(call), call.code()) == ([], grpc.StatusCode.OK)
    monkeypatch.setenv("KUBEDGX_FLYTE_KUBECONFIG", str(control_plane.kubeconfig))
    monkeypatch.setenv("KUBEDGX_FLYTE_CONTEXT", CONTEXT)
    meta = DGXJobMetadata.decode(answer.resource_meta)
    in_process = asyncio.run(DGXConnector().get_logs(resource_meta=meta))
    assert list(in_process.body.results) == [
        f"no log: pod {ns}/{meta.name}-worker-0 does not exist (its job has not created it yet, or the job ended or "
        "was deleted and its workers with it)"
    ]


def test_an_unknown_task_category_is_not_found(connector: Connector) -> None:
    category = agent_pb2.TaskCategory(name="no_such_task", version=0)
    meta = json.dumps({"namespace": "default", "name": "flyte-x", "uid": "", "task_type": "dgx_training"}).encode()
    with pytest.raises(grpc.RpcError) as refused:
        get_task(connector, meta, category)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND, refused.value.details()
    assert "no_such_task" in (refused.value.details() or "")


QLORA_TASK = agent_pb2.TaskCategory(name="dgx_qlora", version=0)


def s3_object(store: S3, uri: str) -> Any:
    """The object at ``s3://bucket/key`` on moto (boto3's get_object answer), None when there is none."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    try:
        return store.client.get_object(Bucket=bucket, Key=key)
    except store.client.exceptions.NoSuchKey:
        return None


def deck_page(store: S3, prefix: str) -> str | None:
    found = s3_object(store, f"{prefix}/deck.html")
    return None if found is None else str(found["Body"].read().decode("utf-8"))


def qlora_on(store: S3, bucket: str) -> DGXQLoRATask:
    """examples/flyte/workflows.py's qlora_legal, its mounts on moto (the Secret ``moto`` holds the keys)."""
    return DGXQLoRATask(
        name="qlora_on_moto",
        trainer=workflows.qlora_legal.trainer,
        task_config=DGXDataConfig(
            instance="dgxh100.80g.8.norm",
            input_mounts=[f"s3://{bucket}/legal"],
            output_mounts=[f"s3://{bucket}/adapters"],
            endpoint=store.endpoint,
            credentials_secret="moto",
        ),
    )


def test_the_qlora_task_writes_the_adapter_s_uri_to_outputs_pb_and_a_deck_with_the_loss_curve(
    connector: Connector, namespace: Kubectl, store: S3
) -> None:
    """The built-in fine-tune: no container in the template, spec.trainer from the task. On Succeeded
    its one output, status.artifacts' adapter URI, goes to ``<output prefix>/outputs.pb`` as flytekit
    encodes a str, and the answer carries none: propeller reads outputs.pb, and only then finds the
    deck, written before the answer, with the loss curve of the history in the Out mount. A success
    without an archived adapter is a failure."""
    ns = namespace.namespace
    assert ns is not None
    bucket = store.bucket("flyte")
    namespace.apply(secret("moto", ns))
    template = serialized(qlora_on(store, bucket))
    assert not template.HasField("container")
    assert template.metadata.generates_deck.value is True
    prefix = f"s3://{bucket}/metadata/propeller/qlora1/n0/data/0"
    request = agent_pb2.CreateTaskRequest(template=template, output_prefix=prefix,
                                          task_execution_metadata=execution_metadata(ns, "qlora1"))  # fmt: skip
    meta = connector.tasks.CreateTask(request, timeout=RPC_TIMEOUT).resource_meta
    name = json.loads(meta)["name"]
    job = namespace.get(JOBS, name)
    assert job is not None
    assert job["spec"]["trainer"]["lora"] == {"r": 16, "alpha": 32}
    assert "command" not in job["spec"]
    mounts = namespace.get_json("get", "dgxdatamounts")["items"]
    assert sorted(m["spec"]["direction"] for m in mounts) == ["In", "Out"]
    (out,) = (m for m in mounts if m["spec"]["direction"] == "Out")

    # The trainer's history, as the checkpoint sidecar uploads it: <source>/<job>-<uid8>/logs/history/.
    logs = logs_uri(JobIdentity.of(DGXTrainingJob.model_validate(job)), DGXDataMount.model_validate(out).spec)
    losses = [2.4, 1.9, 1.5, 1.2, 1.05, 0.97]
    lines = [json.dumps({"event": "start", "step": 0, "totalSteps": 6})]
    lines += [json.dumps({"event": "progress", "step": i + 1, "totalSteps": 6, "loss": loss, "learningRate": 2e-4})
              for i, loss in enumerate(losses)]  # fmt: skip
    key = logs.removeprefix(f"s3://{bucket}/") + "/history/20250601T120000Z-worker-0.jsonl"
    store.client.put_object(Bucket=bucket, Key=key, Body="\n".join(lines).encode())

    uri = f"s3://{bucket}/adapters/final/{name}-0a1b2c3d/adapter/"
    set_status(namespace, name, {
        "phase": "Succeeded", "nodes": "0/1", "startTime": "2025-06-01T12:00:00Z",
        "completionTime": "2025-06-01T12:40:00Z",
        "conditions": [{"type": "Succeeded", "status": "True", "reason": "Completed", "message": "trained",
                        "lastTransitionTime": now()}],
        "usage": {"gpuSeconds": 19200, "gpuHours": "5.33", "cost": "10.40", "currency": "USD"},
        "artifacts": [{"name": "adapter", "uri": uri, "mount": out["metadata"]["name"]}],
    })  # fmt: skip
    done = get_task(connector, meta, QLORA_TASK)
    assert phase_name(done.phase) == "SUCCEEDED", done
    assert not done.HasField("outputs"), "the outputs are in outputs.pb, where propeller reads them"
    written = s3_object(store, f"{prefix}/outputs.pb")
    assert written is not None, "outputs.pb was not written before SUCCEEDED was answered"
    outputs = literals_pb2.LiteralMap.FromString(written["Body"].read())
    ctx = FlyteContextManager.current_context()
    assert outputs == TypeEngine.dict_to_literal_map(ctx, {"adapter": uri}, {"adapter": str}).to_flyte_idl()

    page = deck_page(store, prefix)
    assert page is not None, "deck.html was not written before SUCCEEDED was answered"
    assert s3_object(store, f"{prefix}/deck.html")["ContentType"] == "text/html"
    assert f"{ns}/{name}" in page
    assert "Completed" in page
    assert "40m00s" in page
    assert "5.33" in page
    assert "10.40 USD" in page
    assert uri in page
    (loss_line,) = re.findall(r'<polyline class="series" data-series="loss" points="([^"]*)"', page)
    assert len(loss_line.split()) == len(losses), "one point of the curve per reported step"

    # Succeeded without an archived adapter: a failure (another execution, its own job).
    other = agent_pb2.CreateTaskRequest(template=template, output_prefix=f"{prefix}-2",
                                        task_execution_metadata=execution_metadata(ns, "qlora2"))  # fmt: skip
    meta2 = connector.tasks.CreateTask(other, timeout=RPC_TIMEOUT).resource_meta
    set_status(namespace, json.loads(meta2)["name"], {"phase": "Succeeded", "conditions": [
        {"type": "Succeeded", "status": "True", "reason": "Completed", "message": "trained",
         "lastTransitionTime": now()}]})  # fmt: skip
    no_adapter = get_task(connector, meta2, QLORA_TASK)
    assert phase_name(no_adapter.phase) == "FAILED", no_adapter
    assert "no adapter was archived" in no_adapter.message
    assert s3_object(store, f"{prefix}-2/outputs.pb") is None


def test_an_ended_task_leaves_a_deck_at_its_output_prefix_unless_it_wrote_one(
    connector: Connector, namespace: Kubectl, store: S3
) -> None:
    """Succeeded: the deck with the summary is there when SUCCEEDED is answered (propeller looks in
    that round), saying why it has no loss curve. Failed: written too. A deck that is there already
    (the task's own, enable_deck=True) is kept."""
    ns = namespace.namespace
    assert ns is not None
    bucket = store.bucket("flyte")
    template = serialized(workflows.square)
    assert template.metadata.generates_deck.value is True
    ended = {
        "Succeeded": {"phase": "Succeeded", "nodes": "0/1", "restarts": 2, "startTime": "2025-06-01T12:00:00Z",
                      "completionTime": "2025-06-01T12:03:30Z",
                      "conditions": [{"type": "Succeeded", "status": "True", "reason": "Completed",
                                      "message": "all workers exited 0", "lastTransitionTime": now()}],
                      "usage": {"gpuSeconds": 1680, "gpuHours": "0.47", "cost": "0.91", "currency": "EUR",
                                "spotSavings": "0.00"}},
        "Failed": {"phase": "Failed", "completionTime": now(),
                   "conditions": [{"type": "Failed", "status": "True", "reason": "WorkerFailed",
                                   "message": "worker 0 exited 1", "lastTransitionTime": now()}]},
    }  # fmt: skip
    prefixes = {}
    for execution, phase in (("deck1", "Succeeded"), ("deck2", "Failed"), ("deck3", "Succeeded")):
        prefix = prefixes[execution] = f"s3://{bucket}/metadata/propeller/{execution}/n0/data/0"
        if execution == "deck3":
            store.client.put_object(Bucket=bucket, Key=prefix.removeprefix(f"s3://{bucket}/") + "/deck.html",
                                 Body=b"<p>the task's own deck</p>")  # fmt: skip
        request = create_request(template, execution_metadata(ns, execution), prefix)
        meta = connector.tasks.CreateTask(request, timeout=RPC_TIMEOUT).resource_meta
        set_status(namespace, json.loads(meta)["name"], ended[phase])
        answer = get_task(connector, meta)
        # a worker that exited 1 without an error.pb: Flyte may retry it
        assert phase_name(answer.phase) == {"Failed": "RETRYABLE_FAILED"}.get(phase, phase.upper()), answer
        assert not answer.HasField("outputs")
        page = deck_page(store, prefix)
        assert page is not None, f"{execution}: no deck.html when {phase} was answered"
        if execution == "deck3":
            assert page == "<p>the task's own deck</p>"
            continue
        assert f"{ns}/{json.loads(meta)['name']}" in page
        assert "kubedgx describe" in page
        if phase == "Succeeded":
            for shown in ("all workers exited 0", "3m30s", "0.47", "0.91 EUR", "0.00 EUR", "dgxh100.80g.8.norm"):
                assert shown in page, shown
            assert "<polyline" not in page
            assert "No loss curve:" in page
            assert "no progress history" in page
            assert "Out data mount" in page, "why there is no history: no Out mount keeps it"
        else:
            assert "WorkerFailed" in page
            assert "worker 0 exited 1" in page
