"""tests/cluster/flyte_admin.py's FakeAdmin, called over real gRPC as propeller's admin event sink
calls it: the event sequences of a connector task (docs/research/flyte-propeller.md §3.0) and what
flyteadmin v1.16.8 answers and stores for each (§2.5)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("flyteidl", reason="flyteidl is not installed (pip install -e ./flyte)")
pytest.importorskip("grpc_status", reason="grpcio-status is not installed (flytekit brings it: pip install -e ./flyte)")

from flyteidl.admin import event_pb2 as admin_event_pb2  # noqa: E402
from flyteidl.admin import execution_pb2 as admin_execution_pb2  # noqa: E402
from flyteidl.core import execution_pb2, identifier_pb2  # noqa: E402
from flyteidl.event import event_pb2  # noqa: E402
from flyteidl.service.admin_pb2_grpc import AdminServiceStub  # noqa: E402
from google.protobuf import struct_pb2, timestamp_pb2  # noqa: E402
from grpc_status import rpc_status  # noqa: E402

from tests.cluster.flyte_admin import FakeAdmin, StoredError  # noqa: E402
from tests.support.wait import WaitTimeoutError  # noqa: E402

TaskPhase = execution_pb2.TaskExecution
NodePhase = execution_pb2.NodeExecution
WorkflowPhase = execution_pb2.WorkflowExecution
Code = grpc.StatusCode

EXECUTION = identifier_pb2.WorkflowExecutionIdentifier(project="flytesnacks", domain="development", name="f3k2v9")
TASK = identifier_pb2.Identifier(
    resource_type=identifier_pb2.TASK,
    project="flytesnacks",
    domain="development",
    name="workflows.square",
    version="v1",
)
#: Seconds a gRPC call may take.
RPC_TIMEOUT = 10
_clock = itertools.count(1_700_000_000)


def now() -> timestamp_pb2.Timestamp:
    """Event times, one second apart."""
    return timestamp_pb2.Timestamp(seconds=next(_clock))


def link(name: str, uri: str, *, pending: bool = False, hide: bool = False) -> execution_pb2.TaskLog:
    return execution_pb2.TaskLog(name=name, uri=uri, ShowWhilePending=pending, HideOnceFinished=hide)


def task_event(
    phase: int,
    version: int = 0,
    *,
    node: str = "n0",
    attempt: int = 0,
    reason: str = "",
    logs: tuple[execution_pb2.TaskLog, ...] = (),
    custom: dict[str, Any] | None = None,
    error: execution_pb2.ExecutionError | None = None,
    output_uri: str = "",
    interruptible: bool = False,
    producer: str = "propeller",
    task: identifier_pb2.Identifier = TASK,
) -> admin_event_pb2.TaskExecutionEventRequest:
    """A TaskExecutionEvent as propeller's transformer.go builds one."""
    event = event_pb2.TaskExecutionEvent(
        task_id=task,
        parent_node_execution_id=identifier_pb2.NodeExecutionIdentifier(node_id=node, execution_id=EXECUTION),
        retry_attempt=attempt,
        phase=phase,
        phase_version=version,
        producer_id=producer,
        logs=logs,
        occurred_at=now(),
        reason=reason,
        task_type="dgx_training",
    )
    # output_uri and error are one oneof: set only the one given.
    if output_uri:
        event.output_uri = output_uri
    if error is not None:
        event.error.CopyFrom(error)
    if reason:
        event.reasons.add(reason=reason, occurred_at=event.occurred_at)
    if custom is not None:
        event.custom_info.update(custom)
    event.metadata.generated_name = f"{EXECUTION.name}-{node}-{attempt}"
    event.metadata.plugin_identifier = "connector-service"
    if interruptible:
        event.metadata.instance_class = event_pb2.TaskExecutionMetadata.INTERRUPTIBLE
    return admin_event_pb2.TaskExecutionEventRequest(event=event)


def node_event(
    phase: int, *, node: str = "n0", deck_uri: str = "", output_uri: str = ""
) -> admin_event_pb2.NodeExecutionEventRequest:
    return admin_event_pb2.NodeExecutionEventRequest(
        event=event_pb2.NodeExecutionEvent(
            id=identifier_pb2.NodeExecutionIdentifier(node_id=node, execution_id=EXECUTION),
            producer_id="propeller",
            phase=phase,
            occurred_at=now(),
            deck_uri=deck_uri,
            **({"output_uri": output_uri} if output_uri else {}),
        )
    )


def workflow_event(phase: int) -> admin_event_pb2.WorkflowExecutionEventRequest:
    return admin_event_pb2.WorkflowExecutionEventRequest(
        event=event_pb2.WorkflowExecutionEvent(
            execution_id=EXECUTION, producer_id="propeller", phase=phase, occurred_at=now()
        )
    )


class Propeller:
    """Propeller's side of the sink: each call answers None when admin stored the event, else the
    RpcError admin answered."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.stub = AdminServiceStub(channel)

    def _send(self, method: Any, request: Any) -> grpc.RpcError | None:
        try:
            method(request, timeout=RPC_TIMEOUT)
        except grpc.RpcError as exc:
            return exc
        return None

    def task(self, *args: Any, **kwargs: Any) -> grpc.RpcError | None:
        return self._send(self.stub.CreateTaskEvent, task_event(*args, **kwargs))

    def node(self, *args: Any, **kwargs: Any) -> grpc.RpcError | None:
        return self._send(self.stub.CreateNodeEvent, node_event(*args, **kwargs))

    def workflow(self, phase: int) -> grpc.RpcError | None:
        return self._send(self.stub.CreateWorkflowEvent, workflow_event(phase))


def refused(answer: grpc.RpcError | None, code: grpc.StatusCode) -> grpc.RpcError:
    assert answer is not None, f"admin stored the event; expected {code.name}"
    assert answer.code() == code, f"{answer.code()}: {answer.details()}"
    return answer


def terminal_detail(answer: grpc.RpcError) -> str:
    """The EventFailureReason's already_in_terminal_state.current_phase, as propeller's
    events/errors.WrapError reads it from the status details."""
    status = rpc_status.from_call(answer)
    assert status is not None, f"no status details in {answer.code()}: {answer.details()}"
    reason = admin_event_pb2.EventFailureReason()
    assert status.details[0].Unpack(reason), status.details[0].type_url
    assert reason.WhichOneof("reason") == "already_in_terminal_state", reason
    return reason.already_in_terminal_state.current_phase


@pytest.fixture
def admin() -> Iterator[FakeAdmin]:
    with FakeAdmin() as fake:
        yield fake


@pytest.fixture
def propeller(admin: FakeAdmin) -> Iterator[Propeller]:
    channel = grpc.insecure_channel(admin.endpoint)
    try:
        yield Propeller(channel)
    finally:
        channel.close()


@pytest.fixture
def started(propeller: Propeller) -> Propeller:
    """The workflow running and node n0 queued: what propeller reports before n0's first task event."""
    assert propeller.workflow(WorkflowPhase.RUNNING) is None
    assert propeller.node(NodePhase.QUEUED) is None
    return propeller


def test_queued_v0_then_v2_stores_both_reasons_and_refuses_repeats(admin: FakeAdmin, started: Propeller) -> None:
    assert started.task(TaskPhase.QUEUED, 0, reason="Allocation token required") is None
    assert started.task(TaskPhase.QUEUED, 2, reason="launched") is None
    # The connector's QUEUED (v0, its own message) and a repeat of v2: at or below the stored version.
    refused(
        started.task(TaskPhase.QUEUED, 0, reason="pending: the operator has not placed the workers yet"),
        Code.ALREADY_EXISTS,
    )
    refused(started.task(TaskPhase.QUEUED, 2, reason="launched"), Code.ALREADY_EXISTS)

    task = admin.stored_task("n0")
    assert (task.phase, task.phase_version) == ("QUEUED", 2)
    assert task.reasons == ["Allocation token required", "launched"]
    assert task.reason == "launched"
    assert task.task == "flytesnacks/development/workflows.square/v1"
    assert task.execution == "flytesnacks/development/f3k2v9"
    # What propeller sent, refusals included, in order.
    sent = [(TaskPhase.Phase.Name(e.phase), e.phase_version) for e in admin.received_task_events()]
    assert sent == [("QUEUED", 0), ("QUEUED", 2), ("QUEUED", 0), ("QUEUED", 2)]
    assert [r.code for r in admin.received() if r.kind == "task"] == ["OK", "OK", "ALREADY_EXISTS", "ALREADY_EXISTS"]


def test_waiting_then_running_once(admin: FakeAdmin, started: Propeller) -> None:
    assert started.task(TaskPhase.QUEUED, 0, reason="Allocation token required") is None
    assert started.task(TaskPhase.WAITING_FOR_RESOURCES, 0, reason="Kueue: waiting for quota in queue gpu") is None
    assert admin.stored_task("n0").phase == "WAITING_FOR_RESOURCES"
    assert started.task(TaskPhase.RUNNING, 0) is None
    refused(started.task(TaskPhase.RUNNING, 0), Code.ALREADY_EXISTS)

    task = admin.stored_task("n0")
    assert (task.phase, task.phase_version) == ("RUNNING", 0)
    assert task.reasons == ["Allocation token required", "Kueue: waiting for quota in queue gpu"]
    assert task.started_at is not None


def test_a_reason_equal_to_the_stored_one_is_not_appended_again(admin: FakeAdmin, started: Propeller) -> None:
    # Only event.reason (no reasons list): admin appends it when it differs from the stored reason.
    event = task_event(TaskPhase.WAITING_FOR_RESOURCES, 0, reason="waiting for quota")
    del event.event.reasons[:]
    started.stub.CreateTaskEvent(event, timeout=RPC_TIMEOUT)
    again = task_event(TaskPhase.WAITING_FOR_RESOURCES, 1, reason="waiting for quota")
    del again.event.reasons[:]
    started.stub.CreateTaskEvent(again, timeout=RPC_TIMEOUT)
    assert admin.stored_task("n0").reasons == ["waiting for quota"]


@pytest.mark.parametrize("terminal", ["SUCCEEDED", "FAILED", "ABORTED"])
def test_a_terminal_task_refuses_changes_with_the_detail_propeller_reads(
    admin: FakeAdmin, started: Propeller, terminal: str
) -> None:
    assert started.task(TaskPhase.RUNNING, 0) is None
    assert started.task(TaskPhase.Phase.Value(terminal), 0) is None

    answer = refused(started.task(TaskPhase.RUNNING, 1), Code.FAILED_PRECONDITION)
    assert f"invalid phase change from {terminal} to RUNNING" in answer.details()
    # Admin puts the refused event's phase in current_phase (task_execution_manager.go: curPhase).
    assert terminal_detail(answer) == "RUNNING"
    # The same terminal phase again: already recorded, checked before the terminal rule.
    refused(started.task(TaskPhase.Phase.Value(terminal), 0), Code.ALREADY_EXISTS)
    assert admin.stored_task("n0").phase == terminal


def test_retryable_failed_is_not_terminal_for_admin(admin: FakeAdmin, started: Propeller) -> None:
    assert started.task(TaskPhase.RETRYABLE_FAILED, 0) is None
    assert started.task(TaskPhase.FAILED, 0) is None
    assert admin.stored_task("n0").phase == "FAILED"


def test_the_error_and_output_come_from_terminal_events(admin: FakeAdmin, started: Propeller) -> None:
    failure = execution_pb2.ExecutionError(
        code="TaskFailedWithError",
        message="failed to run the job: Failed: OOMKilled: worker-0 ran out of memory",
        kind=execution_pb2.ExecutionError.USER,
    )
    assert started.task(TaskPhase.QUEUED, 0) is None
    assert started.task(TaskPhase.RUNNING, 0, error=failure) is None
    assert admin.stored_task("n0").error is None  # RUNNING is not terminal: its error is not stored
    assert started.task(TaskPhase.FAILED, 0, error=failure) is None
    assert admin.stored_task("n0").error == StoredError("TaskFailedWithError", failure.message, "USER")

    assert started.task(TaskPhase.SUCCEEDED, 0, attempt=1, output_uri="s3://bucket/n0/1/outputs.pb") is None
    succeeded = admin.stored_task("n0", retry_attempt=1)
    assert (succeeded.output_uri, succeeded.error) == ("s3://bucket/n0/1/outputs.pb", None)
    assert succeeded.duration is None  # never RUNNING
    assert [t.retry_attempt for t in admin.stored_tasks()] == [0, 1]


def test_custom_info_is_json_merge_patched(admin: FakeAdmin, started: Propeller) -> None:
    first = {"job": {"name": "flyte-f3k2v9-n0-0", "phase": "Running"}, "restarts": 0}
    assert started.task(TaskPhase.RUNNING, 0, custom=first) is None
    latest = {"job": {"phase": "Succeeded", "step": 120}, "restarts": None, "loss": 0.25}
    assert started.task(TaskPhase.SUCCEEDED, 0, custom=latest) is None
    assert admin.stored_task("n0").custom_info == {
        "job": {"name": "flyte-f3k2v9-n0-0", "phase": "Succeeded", "step": 120},
        "loss": 0.25,
    }


def test_log_links_are_merged_and_filtered_by_phase(admin: FakeAdmin, started: Propeller) -> None:
    job = link("job logs", "https://logs/job")
    pending = link("events", "https://logs/events", pending=True)
    live = link("live", "https://dash/live", hide=True)
    assert started.task(TaskPhase.QUEUED, 0, reason="Allocation token required") is None
    # QUEUED keeps only the links shown while pending.
    assert started.task(TaskPhase.QUEUED, 2, reason="launched", logs=(job, pending)) is None
    assert admin.stored_task("n0").logs == [("events", "https://logs/events")]
    # RUNNING: the event's links first, then the stored ones it does not replace.
    assert started.task(TaskPhase.RUNNING, 0, logs=(job, live)) is None
    assert admin.stored_task("n0").logs == [
        ("job logs", "https://logs/job"),
        ("live", "https://dash/live"),
        ("events", "https://logs/events"),
    ]
    # A link of the same name replaces the stored one; a terminal phase drops the hide-once-finished link.
    moved = link("job logs", "https://logs/job?final")
    assert started.task(TaskPhase.SUCCEEDED, 0, logs=(moved,)) is None
    assert admin.stored_task("n0").logs == [("job logs", "https://logs/job?final"), ("events", "https://logs/events")]


def test_the_first_event_is_stored_with_its_links_unfiltered(admin: FakeAdmin, started: Propeller) -> None:
    # CreateTaskExecutionModel copies the links; only updates filter them.
    assert started.task(TaskPhase.QUEUED, 0, logs=(link("job logs", "https://logs/job"),)) is None
    assert admin.stored_task("n0").logs == [("job logs", "https://logs/job")]


def test_instance_class_stays_once_interruptible(admin: FakeAdmin, started: Propeller) -> None:
    assert started.task(TaskPhase.QUEUED, 0, interruptible=True) is None
    assert started.task(TaskPhase.RUNNING, 0) is None  # DEFAULT never overwrites (mergeMetadata)
    task = admin.stored_task("n0")
    assert (task.instance_class, task.generated_name) == ("INTERRUPTIBLE", "f3k2v9-n0-0")


def test_node_deck_uri_is_overwritten_by_the_terminal_event(admin: FakeAdmin, started: Propeller) -> None:
    assert started.node(NodePhase.RUNNING, deck_uri="s3://bucket/n0/deck.html") is None
    assert admin.stored_node("n0").deck_uri == "s3://bucket/n0/deck.html"
    refused(started.node(NodePhase.RUNNING), Code.ALREADY_EXISTS)
    # A failure removes the deck in propeller; admin stores the terminal event's empty value.
    assert started.node(NodePhase.FAILED, deck_uri="") is None

    node = admin.stored_node("n0")
    assert (node.phase, node.deck_uri) == ("FAILED", "")
    assert node.phases == ["QUEUED", "RUNNING", "FAILED"]
    answer = refused(started.node(NodePhase.RUNNING), Code.FAILED_PRECONDITION)
    assert "Invalid phase change from FAILED to RUNNING for node execution" in answer.details()
    assert terminal_detail(answer) == "RUNNING"


def test_node_output_uri_from_the_succeeded_event(admin: FakeAdmin, started: Propeller) -> None:
    assert started.node(NodePhase.RUNNING) is None
    assert started.node(NodePhase.SUCCEEDED, output_uri="s3://bucket/n0/0/outputs.pb") is None
    assert admin.stored_node("n0").output_uri == "s3://bucket/n0/0/outputs.pb"


def test_workflow_phases_in_order_and_terminal(admin: FakeAdmin, propeller: Propeller) -> None:
    for phase in (WorkflowPhase.RUNNING, WorkflowPhase.SUCCEEDING, WorkflowPhase.SUCCEEDED):
        assert propeller.workflow(phase) is None
    refused(propeller.workflow(WorkflowPhase.SUCCEEDED), Code.ALREADY_EXISTS)
    answer = refused(propeller.workflow(WorkflowPhase.RUNNING), Code.FAILED_PRECONDITION)
    # Here admin names the stored phase (execution_manager.go).
    assert terminal_detail(answer) == "SUCCEEDED"
    assert admin.workflow_phases() == ["RUNNING", "SUCCEEDING", "SUCCEEDED"]


def test_workflow_cannot_go_back_to_queued(admin: FakeAdmin, propeller: Propeller) -> None:
    assert propeller.workflow(WorkflowPhase.QUEUED) is None
    assert propeller.workflow(WorkflowPhase.QUEUED) is None  # a cluster reassignment: allowed again
    assert propeller.workflow(WorkflowPhase.RUNNING) is None
    answer = refused(propeller.workflow(WorkflowPhase.QUEUED), Code.FAILED_PRECONDITION)
    assert rpc_status.from_call(answer) is None  # no detail: propeller would not tolerate it
    assert admin.workflow_phases() == ["QUEUED", "QUEUED", "RUNNING"]


def test_a_task_event_needs_its_node_execution(admin: FakeAdmin, propeller: Propeller) -> None:
    answer = refused(propeller.task(TaskPhase.QUEUED, 0), Code.UNKNOWN)
    assert "failed to get existing node execution id" in answer.details()
    with pytest.raises(LookupError):
        admin.stored_task("n0")
    assert admin.received()[0].code == "UNKNOWN"


def test_a_task_id_must_name_a_task(propeller: Propeller) -> None:
    assert propeller.node(NodePhase.QUEUED) is None
    not_a_task = identifier_pb2.Identifier(
        resource_type=identifier_pb2.WORKFLOW, project="flytesnacks", domain="development", name="wf", version="v1"
    )
    answer = refused(propeller.task(TaskPhase.QUEUED, 0, task=not_a_task), Code.INVALID_ARGUMENT)
    assert "unexpected resource type workflow" in answer.details()


def test_another_cluster_is_refused_when_the_cluster_is_known() -> None:
    with FakeAdmin(cluster="dgx-east") as admin, grpc.insecure_channel(admin.endpoint) as channel:
        propeller = Propeller(channel)
        assert propeller.node(NodePhase.QUEUED) is None
        assert propeller.task(TaskPhase.QUEUED, 0, producer="dgx-east") is None
        answer = refused(propeller.task(TaskPhase.RUNNING, 0, producer="dgx-west"), Code.FAILED_PRECONDITION)
        reason = admin_event_pb2.EventFailureReason()
        assert rpc_status.from_call(answer).details[0].Unpack(reason)
        assert reason.incompatible_cluster.cluster == "dgx-west"


def test_other_rpcs_are_unimplemented(propeller: Propeller) -> None:
    request = admin_execution_pb2.WorkflowExecutionGetRequest(id=EXECUTION)
    refused(propeller._send(propeller.stub.GetExecution, request), Code.UNIMPLEMENTED)


def test_wait_returns_once_the_terminal_event_arrives(admin: FakeAdmin, started: Propeller) -> None:
    assert started.task(TaskPhase.RUNNING, 0) is None
    sender = threading.Thread(target=started.task, args=(TaskPhase.SUCCEEDED, 0))
    sender.start()
    try:
        task = admin.wait(
            lambda a: a.stored_task("n0").phase == "SUCCEEDED" and a.stored_task("n0"), timeout=RPC_TIMEOUT
        )
    finally:
        sender.join(RPC_TIMEOUT)
    assert task.phase == "SUCCEEDED"


def test_wait_times_out_with_what_admin_received(admin: FakeAdmin, started: Propeller) -> None:
    assert started.task(TaskPhase.RUNNING, 0) is None
    refused(started.task(TaskPhase.RUNNING, 0), Code.ALREADY_EXISTS)
    with pytest.raises(WaitTimeoutError) as caught:
        admin.wait(lambda a: a.stored_task("n1"), timeout=0.2, what="n1's task")
    message = str(caught.value)
    assert "waiting for n1's task" in message
    assert "task f3k2v9/n0#0 workflows.square RUNNING v0 -> ALREADY_EXISTS: have already recorded" in message
    assert "node f3k2v9/n0 QUEUED -> OK" in message
    assert "stored:" in message


def test_stored_values_are_snapshots(admin: FakeAdmin, started: Propeller) -> None:
    assert started.task(TaskPhase.RUNNING, 0, custom={"step": 1}) is None
    before = admin.stored_task("n0")
    before.custom_info["step"] = 99
    assert started.task(TaskPhase.SUCCEEDED, 0) is None
    assert (before.phase, admin.stored_task("n0").custom_info) == ("RUNNING", {"step": 1})


def test_received_events_are_the_protobuf_events(admin: FakeAdmin, started: Propeller) -> None:
    assert started.task(TaskPhase.RUNNING, 0, custom={"a": [1, "x"]}) is None
    event = admin.received_task_events()[0]
    assert isinstance(event, event_pb2.TaskExecutionEvent)
    assert event.custom_info == struct_pb2.Struct(fields={"a": struct_pb2.Value(list_value=_list(1, "x"))})
    assert admin.received_node_events()[0].phase == NodePhase.QUEUED
    assert admin.received_workflow_events()[0].phase == WorkflowPhase.RUNNING


def _list(*values: Any) -> struct_pb2.ListValue:
    out = struct_pb2.ListValue()
    out.extend(values)
    return out
