"""A fake of flyteadmin's event API: what propeller (``event.type: admin``) sends, and what Flyte would store.

Propeller v1.16.8 reports every workflow, node and task execution change to admin over gRPC
(``AdminService.CreateWorkflowEvent``, ``CreateNodeEvent``, ``CreateTaskEvent``). flyteadmin cannot
be built here, so ``FakeAdmin`` serves those three calls itself and applies admin's own acceptance
rules and closure updates, read from flyteadmin v1.16.8 (docs/research/flyte-propeller.md §2.5):

- ``pkg/manager/impl/task_execution_manager.go`` (``CreateTaskExecutionEvent``): the same phase with a
  phase version not above the stored one is ALREADY_EXISTS; any change of a stored terminal task
  execution (SUCCEEDED, FAILED, ABORTED; ``pkg/common/executions.go``, RETRYABLE_FAILED is not one)
  is FAILED_PRECONDITION with an ``admin.EventFailureReason{already_in_terminal_state}`` detail, whose
  ``current_phase`` is, as admin writes it, the phase of the refused event;
- ``pkg/repositories/transformers/task_execution.go``: reasons appended (``event.reasons``, or
  ``event.reason`` when it differs from the stored reason), log links merged by URI and name
  (``mergeLogs``) and filtered by the new phase (QUEUED and INITIALIZING keep only
  ``ShowWhilePending`` links, terminal phases drop ``HideOnceFinished`` ones; the first event's links
  are stored unfiltered), ``custom_info`` JSON-merge-patched (``mergeCustom``), metadata merged
  (``mergeMetadata``), the output URI or the error taken from terminal events only;
- ``pkg/manager/impl/node_execution_manager.go`` and ``transformers/node_execution.go``: a node's same
  phase again is ALREADY_EXISTS, a change after a terminal phase FAILED_PRECONDITION with the detail;
  ``deck_uri`` set by the RUNNING event and overwritten by the terminal one, even with "";
- ``pkg/manager/impl/execution_manager.go`` (``CreateWorkflowEvent``): the same phase again is
  ALREADY_EXISTS (QUEUED excepted), RUNNING to QUEUED and ABORTING to a non-terminal phase are
  FAILED_PRECONDITION, a change after a terminal phase FAILED_PRECONDITION with the detail (there the
  stored phase).

Propeller tolerates exactly these answers: ALREADY_EXISTS always, and FAILED_PRECONDITION with the
already-in-terminal-state detail when its own event is terminal
(``flytepropeller/pkg/controller/nodes/node_exec_context.go``, ``events/errors/errors.go``); without
the detail it would be a plain sink error. So the detail is attached as admin attaches it, in the
status's ``grpc-status-details-bin`` (grpcio-status).

The tests create their FlyteWorkflows directly, never through admin's ``CreateExecution``; an
execution the fake has not seen counts as created (phase UNDEFINED) when an event first names it.
A task event still needs its node's execution (admin refuses it otherwise), as does a node event
its parent node or task. See the end of this docstring for what the fake leaves out.

Use::

    with FakeAdmin() as admin:  # propeller.yaml: admin.endpoint dns:///<admin.endpoint>, insecure
        ...
        task = admin.wait(lambda a: a.stored_task("n0").phase == "SUCCEEDED" and a.stored_task("n0"),
                          timeout=60, what="n0's terminal event")

Not reproduced: the database and every read API (GetTaskExecution and the rest answer UNIMPLEMENTED,
as every RPC but the three does); inputs and outputs sent inline are kept as the event's literal
map, not offloaded to a blob; ``metadata.external_resources`` are not merged; notifications,
metrics and cloud events; the identifiers in refusal messages are written in protobuf text format,
not as Go prints them; the cluster an execution runs on is checked only when ``cluster`` is given.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import grpc
from flyteidl.admin import event_pb2 as admin_event_pb2
from flyteidl.core import execution_pb2, identifier_pb2, literals_pb2
from flyteidl.event import event_pb2
from flyteidl.service import admin_pb2_grpc
from google.protobuf import any_pb2, json_format, struct_pb2, text_format, timestamp_pb2
from google.rpc import status_pb2
from grpc_status import rpc_status

from tests.support.ports import free_port
from tests.support.wait import WaitTimeoutError

T = TypeVar("T")

TaskPhase = execution_pb2.TaskExecution
NodePhase = execution_pb2.NodeExecution
WorkflowPhase = execution_pb2.WorkflowExecution

#: flyteadmin/pkg/common/executions.go.
TERMINAL_TASK_PHASES = frozenset({TaskPhase.SUCCEEDED, TaskPhase.FAILED, TaskPhase.ABORTED})
TERMINAL_NODE_PHASES = frozenset(
    {
        NodePhase.SUCCEEDED,
        NodePhase.FAILED,
        NodePhase.TIMED_OUT,
        NodePhase.ABORTED,
        NodePhase.SKIPPED,
        NodePhase.RECOVERED,
    }
)
TERMINAL_WORKFLOW_PHASES = frozenset(
    {WorkflowPhase.SUCCEEDED, WorkflowPhase.FAILED, WorkflowPhase.TIMED_OUT, WorkflowPhase.ABORTED}
)
#: flyteadmin/pkg/common/constants.go: the producer id that never takes part in cluster checks.
DEFAULT_PRODUCER_ID = "propeller"
#: flyteadmin's remoteData.maxSizeInBytes default (pkg/runtime/application_config_provider.go).
MAX_OUTPUT_BYTES = 2 * 1024 * 1024


# --- what tests read --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredError:
    """A stored ``core.ExecutionError``: ``kind`` is UNKNOWN, USER or SYSTEM."""

    code: str
    message: str
    kind: str


@dataclass(frozen=True)
class StoredTask:
    """A task execution's closure as admin stores it (a snapshot: later events do not change it)."""

    execution: str  # project/domain/name
    node_id: str
    task: str  # project/domain/name/version
    retry_attempt: int
    phase: str
    phase_version: int
    reason: str  # the latest event reason
    reasons: list[str]
    error: StoredError | None
    logs: list[tuple[str, str]]  # (name, uri)
    custom_info: dict[str, Any]
    instance_class: str  # DEFAULT or INTERRUPTIBLE
    output_uri: str | None
    output_data: literals_pb2.LiteralMap | None
    task_type: str
    input_uri: str
    generated_name: str
    plugin_identifier: str
    created_at: datetime | None
    updated_at: datetime | None
    started_at: datetime | None
    duration: timedelta | None


@dataclass(frozen=True)
class StoredNode:
    """A node execution's closure as admin stores it, with the phases it accepted in order."""

    execution: str
    node_id: str
    phase: str
    phases: list[str]
    deck_uri: str
    output_uri: str | None
    output_data: literals_pb2.LiteralMap | None
    error: StoredError | None
    created_at: datetime | None
    updated_at: datetime | None
    started_at: datetime | None


@dataclass(frozen=True)
class StoredWorkflow:
    """A workflow execution's closure, with the phases it accepted in order (UNDEFINED, its phase
    when admin creates it, not among them)."""

    execution: str
    phase: str
    phases: list[str]
    error: StoredError | None
    output_uri: str | None
    output_data: literals_pb2.LiteralMap | None
    cluster: str
    started_at: datetime | None
    updated_at: datetime | None


@dataclass(frozen=True)
class Received:
    """One request as it arrived, and admin's answer: ``code`` is a ``grpc.StatusCode`` name (OK when
    the event was stored)."""

    kind: str  # workflow, node or task
    event: Any  # event_pb2.WorkflowExecutionEvent, NodeExecutionEvent or TaskExecutionEvent
    code: str
    message: str


# --- admin's refusals -------------------------------------------------------------------------------


class _AdminError(Exception):
    """A gRPC error status as flyteadmin answers it, with an optional ``EventFailureReason`` detail."""

    def __init__(
        self, code: grpc.StatusCode, message: str, detail: admin_event_pb2.EventFailureReason | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.detail = code, message, detail

    def status(self) -> grpc.Status:
        proto = status_pb2.Status(code=self.code.value[0], message=self.message)
        if self.detail is not None:
            packed = any_pb2.Any()
            packed.Pack(self.detail)
            proto.details.append(packed)
        return rpc_status.to_status(proto)


def _terminal_refusal(message: str, current_phase: str) -> _AdminError:
    """flyteadmin/pkg/errors/errors.go NewAlreadyInTerminalStateError."""
    detail = admin_event_pb2.EventFailureReason(
        already_in_terminal_state=admin_event_pb2.EventErrorAlreadyInTerminalState(current_phase=current_phase)
    )
    return _AdminError(grpc.StatusCode.FAILED_PRECONDITION, message, detail)


def _missing(field_name: str) -> _AdminError:
    """flyteadmin/pkg/manager/impl/shared/errors.go GetMissingArgumentError."""
    return _AdminError(grpc.StatusCode.INVALID_ARGUMENT, f"missing {field_name}")


def _not_found() -> _AdminError:
    """What admin's repositories answer for a row that is not there (repositories/errors/postgres.go)."""
    return _AdminError(grpc.StatusCode.NOT_FOUND, "entry not found")


# --- admin's transformations ------------------------------------------------------------------------


def _one_line(message: Any) -> str:
    return text_format.MessageToString(message, as_one_line=True)


def _time(stamp: timestamp_pb2.Timestamp) -> datetime:
    return stamp.ToDatetime(tzinfo=UTC)


def _reported_at(event: Any) -> datetime | None:
    """``reported_at`` when set and not zero, else ``occurred_at`` (the closures' UpdatedAt)."""
    if event.HasField("reported_at") and (event.reported_at.seconds or event.reported_at.nanos):
        return _time(event.reported_at)
    return _time(event.occurred_at) if event.HasField("occurred_at") else None


def _error(error: execution_pb2.ExecutionError) -> StoredError:
    return StoredError(error.code, error.message, execution_pb2.ExecutionError.ErrorKind.Name(error.kind))


def merge_logs(
    existing: list[execution_pb2.TaskLog], latest: list[execution_pb2.TaskLog]
) -> list[execution_pb2.TaskLog]:
    """transformers/task_execution.go mergeLogs: the latest links, then every existing link whose URI
    and name no latest link has (an empty name matches nothing)."""
    if not latest:
        return list(existing)
    if not existing:
        return list(latest)
    uris = {log.uri for log in latest}
    names = {log.name for log in latest if log.name}
    return list(latest) + [log for log in existing if log.uri not in uris and log.name not in names]


def filter_logs_by_phase(logs: list[execution_pb2.TaskLog], phase: int) -> list[execution_pb2.TaskLog]:
    """transformers/task_execution.go filterLogsByPhase."""
    kept = []
    for log in logs:
        if phase in TERMINAL_TASK_PHASES and log.HideOnceFinished:
            continue
        if phase in (TaskPhase.QUEUED, TaskPhase.INITIALIZING) and not log.ShowWhilePending:
            continue
        kept.append(log)
    return kept


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: what ``mergeCustom`` does (CreateMergePatch from {} to the latest
    custom_info gives the latest itself, nulls included; MergePatch applies it to the stored one)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _struct(message: struct_pb2.Struct) -> dict[str, Any]:
    return json_format.MessageToDict(message)


def _validate_output_size(output_data: literals_pb2.LiteralMap | None, limit: int) -> None:
    """validation/validation.go ValidateOutputData."""
    if output_data is None:
        return
    size = output_data.ByteSize()
    if size > limit:
        raise _AdminError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"Output data size exceeds platform configured threshold ({size} > {limit})",
        )


def _validate_execution_id(identifier: identifier_pb2.WorkflowExecutionIdentifier) -> None:
    for name in ("project", "domain", "name"):
        if not getattr(identifier, name):
            raise _missing(name)


def _validate_task_event(event: event_pb2.TaskExecutionEvent, limit: int) -> None:
    """validation/task_execution_validator.go ValidateTaskExecutionRequest."""
    if not event.HasField("occurred_at"):
        raise _missing("occurred_at")
    _validate_output_size(event.output_data if event.HasField("output_data") else None, limit)
    if not event.HasField("parent_node_execution_id"):
        raise _missing("node_execution_id")
    node = event.parent_node_execution_id
    if not node.HasField("execution_id"):
        raise _missing("execution_id")
    if not node.node_id:
        raise _missing("node_id")
    _validate_execution_id(node.execution_id)
    if not event.HasField("task_id"):
        raise _missing("task_id")
    task = event.task_id
    if task.resource_type != identifier_pb2.TASK:
        kind = identifier_pb2.ResourceType.Name(task.resource_type).lower()
        raise _AdminError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"unexpected resource type {kind} for identifier [{_one_line(task)}], expected task instead",
        )
    for name in ("project", "domain", "name", "version"):
        if not getattr(task, name):
            raise _missing(name)


# --- the stored rows ---------------------------------------------------------------------------------


ExecutionKey = tuple[str, str, str]
NodeKey = tuple[ExecutionKey, str]
TaskKey = tuple[ExecutionKey, str, tuple[str, str, str, str], int]


@dataclass
class _Output:
    """A closure's OutputResult oneof: an output URI, an output literal map or an error."""

    uri: str | None = None
    data: literals_pb2.LiteralMap | None = None
    error: StoredError | None = None

    def take(self, event: Any) -> None:
        """addTaskTerminalState / addTerminalState / UpdateExecutionModelState: the first of output
        URI, output data and error the event carries replaces whatever was stored."""
        if event.output_uri:
            self.uri, self.data, self.error = event.output_uri, None, None
        elif event.HasField("output_data"):
            self.uri, self.data, self.error = None, copy.deepcopy(event.output_data), None
        elif event.HasField("error"):
            self.uri, self.data, self.error = None, None, _error(event.error)


@dataclass
class _Execution:
    key: ExecutionKey
    cluster: str
    phase: int = WorkflowPhase.UNDEFINED
    phases: list[int] = field(default_factory=list)
    output: _Output = field(default_factory=_Output)
    started_at: datetime | None = None
    updated_at: datetime | None = None

    def snapshot(self) -> StoredWorkflow:
        return StoredWorkflow(
            execution="/".join(self.key),
            phase=WorkflowPhase.Phase.Name(self.phase),
            phases=[WorkflowPhase.Phase.Name(p) for p in self.phases],
            error=self.output.error,
            output_uri=self.output.uri,
            output_data=copy.deepcopy(self.output.data),
            cluster=self.cluster,
            started_at=self.started_at,
            updated_at=self.updated_at,
        )


@dataclass
class _Node:
    key: NodeKey
    row_id: int
    phase: int
    phases: list[int] = field(default_factory=list)
    deck_uri: str = ""
    output: _Output = field(default_factory=_Output)
    created_at: datetime | None = None
    updated_at: datetime | None = None
    started_at: datetime | None = None

    def apply(self, event: event_pb2.NodeExecutionEvent) -> None:
        """The parts of CreateNodeExecutionModel / UpdateNodeExecutionModel tests read."""
        self.phase = event.phase
        self.phases.append(event.phase)
        self.updated_at = _reported_at(event)
        if event.phase == NodePhase.RUNNING:  # addNodeRunningState
            self.started_at = _time(event.occurred_at)
            self.deck_uri = event.deck_uri
        if event.phase in TERMINAL_NODE_PHASES:  # addTerminalState
            self.output.take(event)
            self.deck_uri = event.deck_uri

    def snapshot(self) -> StoredNode:
        return StoredNode(
            execution="/".join(self.key[0]),
            node_id=self.key[1],
            phase=NodePhase.Phase.Name(self.phase),
            phases=[NodePhase.Phase.Name(p) for p in self.phases],
            deck_uri=self.deck_uri,
            output_uri=self.output.uri,
            output_data=copy.deepcopy(self.output.data),
            error=self.output.error,
            created_at=self.created_at,
            updated_at=self.updated_at,
            started_at=self.started_at,
        )


@dataclass
class _Task:
    key: TaskKey
    phase: int
    phase_version: int
    task_type: str
    created_at: datetime
    reason: str = ""
    reasons: list[str] = field(default_factory=list)
    logs: list[execution_pb2.TaskLog] = field(default_factory=list)
    custom_info: dict[str, Any] | None = None
    metadata: event_pb2.TaskExecutionMetadata | None = None
    output: _Output = field(default_factory=_Output)
    input_uri: str = ""
    updated_at: datetime | None = None
    started_at: datetime | None = None
    duration: timedelta | None = None

    @classmethod
    def create(cls, key: TaskKey, event: event_pb2.TaskExecutionEvent) -> _Task:
        """transformers/task_execution.go CreateTaskExecutionModel: the first event as it is (its log
        links unfiltered)."""
        task = cls(
            key=key,
            phase=event.phase,
            phase_version=event.phase_version,
            task_type=event.task_type,
            created_at=_time(event.occurred_at),
            logs=list(copy.deepcopy(event.logs)),
            custom_info=_struct(event.custom_info) if event.HasField("custom_info") else None,
            metadata=copy.deepcopy(event.metadata) if event.HasField("metadata") else None,
            updated_at=_reported_at(event),
        )
        task._take_input(event)
        if event.reasons:
            task.reasons = [r.reason for r in event.reasons]
            task.reason = event.reasons[-1].reason
        elif event.reason:
            task.reasons, task.reason = [event.reason], event.reason
        if event.phase == TaskPhase.RUNNING:
            task.started_at = _time(event.occurred_at)
        if event.phase in TERMINAL_TASK_PHASES:
            task._terminal(event)
        return task

    def update(self, event: event_pb2.TaskExecutionEvent) -> None:
        """transformers/task_execution.go UpdateTaskExecutionModel."""
        self._take_input(event)
        previous = self.phase
        self.phase, self.phase_version = event.phase, event.phase_version
        self.updated_at = _reported_at(event)
        self.logs = filter_logs_by_phase(merge_logs(self.logs, list(copy.deepcopy(event.logs))), event.phase)
        if event.reasons:
            self.reasons.extend(r.reason for r in event.reasons)
            self.reason = event.reasons[-1].reason
        elif event.reason:
            if self.reason != event.reason:
                self.reasons.append(event.reason)
            self.reason = event.reason
        if previous != TaskPhase.RUNNING and event.phase == TaskPhase.RUNNING and self.started_at is None:
            self.started_at = _time(event.occurred_at)
        if event.phase in TERMINAL_TASK_PHASES:
            self._terminal(event)
        if event.HasField("custom_info"):
            latest = _struct(event.custom_info)
            self.custom_info = latest if self.custom_info is None else merge_patch(self.custom_info, latest)
        if event.HasField("metadata"):
            self._merge_metadata(event.metadata)

    def _take_input(self, event: event_pb2.TaskExecutionEvent) -> None:
        """handleTaskExecutionInputs: the input URI once (inline inputs are not offloaded here)."""
        if not self.input_uri and event.WhichOneof("input_value") == "input_uri":
            self.input_uri = event.input_uri

    def _terminal(self, event: event_pb2.TaskExecutionEvent) -> None:
        """addTaskTerminalState."""
        if self.started_at is not None:
            self.duration = _time(event.occurred_at) - self.started_at
        self.output.take(event)

    def _merge_metadata(self, latest: event_pb2.TaskExecutionMetadata) -> None:
        """mergeMetadata (less external_resources)."""
        if self.metadata is None:
            self.metadata = copy.deepcopy(latest)
            return
        if latest.generated_name:
            self.metadata.generated_name = latest.generated_name
        self.metadata.ClearField("resource_pool_info")
        self.metadata.resource_pool_info.extend(latest.resource_pool_info)
        if latest.plugin_identifier:
            self.metadata.plugin_identifier = latest.plugin_identifier
        if latest.instance_class != event_pb2.TaskExecutionMetadata.DEFAULT:
            self.metadata.instance_class = latest.instance_class

    def snapshot(self) -> StoredTask:
        execution, node_id, task, retry_attempt = self.key
        metadata = self.metadata or event_pb2.TaskExecutionMetadata()
        return StoredTask(
            execution="/".join(execution),
            node_id=node_id,
            task="/".join(task),
            retry_attempt=retry_attempt,
            phase=TaskPhase.Phase.Name(self.phase),
            phase_version=self.phase_version,
            reason=self.reason,
            reasons=list(self.reasons),
            error=self.output.error,
            logs=[(log.name, log.uri) for log in self.logs],
            custom_info=copy.deepcopy(self.custom_info) if self.custom_info is not None else {},
            instance_class=event_pb2.TaskExecutionMetadata.InstanceClass.Name(metadata.instance_class),
            output_uri=self.output.uri,
            output_data=copy.deepcopy(self.output.data),
            task_type=self.task_type,
            input_uri=self.input_uri,
            generated_name=metadata.generated_name,
            plugin_identifier=metadata.plugin_identifier,
            created_at=self.created_at,
            updated_at=self.updated_at,
            started_at=self.started_at,
            duration=self.duration,
        )


def _execution_key(identifier: identifier_pb2.WorkflowExecutionIdentifier) -> ExecutionKey:
    return (identifier.project, identifier.domain, identifier.name)


def _task_key(event: event_pb2.TaskExecutionEvent) -> TaskKey:
    node, task = event.parent_node_execution_id, event.task_id
    return (
        _execution_key(node.execution_id),
        node.node_id,
        (task.project, task.domain, task.name, task.version),
        event.retry_attempt,
    )


# --- the server --------------------------------------------------------------------------------------


class FakeAdmin(admin_pb2_grpc.AdminServiceServicer):
    """flyteadmin's three event calls on ``127.0.0.1:<port>`` (module docstring). Thread-safe: every
    request is handled, recorded and answered under one lock, and wakes ``wait``.

    ``cluster``: the cluster admin would have recorded for each execution at CreateExecution; when
    given, an event from another producer (other than "" and "propeller") is refused as admin refuses
    it (FAILED_PRECONDITION, ``incompatible_cluster``). ``max_output_bytes``: admin's
    ``remoteData.maxSizeInBytes`` for inline outputs.
    """

    def __init__(self, *, cluster: str | None = None, max_output_bytes: int = MAX_OUTPUT_BYTES) -> None:
        self.cluster = cluster
        self.max_output_bytes = max_output_bytes
        self._changed = threading.Condition(threading.RLock())
        self._received: list[Received] = []
        self._executions: dict[ExecutionKey, _Execution] = {}
        self._nodes: dict[NodeKey, _Node] = {}
        self._tasks: dict[TaskKey, _Task] = {}
        self._server: grpc.Server | None = None
        self.port: int | None = None

    # --- lifecycle

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT`` (propeller's ``admin.endpoint`` is ``dns:///`` and this)."""
        if self.port is None:
            raise RuntimeError("FakeAdmin is not started")
        return f"127.0.0.1:{self.port}"

    def start(self) -> FakeAdmin:
        # No SO_REUSEPORT: a second server on a port already served must fail to bind, not share it.
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[("grpc.so_reuseport", 0)])
        admin_pb2_grpc.add_AdminServiceServicer_to_server(self, server)
        for _ in range(5):
            port = free_port()
            try:
                bound = server.add_insecure_port(f"127.0.0.1:{port}")
            except RuntimeError:
                continue  # taken since free_port looked
            if bound == port:
                break
        else:
            raise RuntimeError("FakeAdmin found no free port to listen on")
        server.start()
        self._server, self.port = server, port
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    def __enter__(self) -> FakeAdmin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the RPCs

    def CreateWorkflowEvent(  # noqa: N802 (the servicer's method names)
        self, request: admin_event_pb2.WorkflowExecutionEventRequest, context: grpc.ServicerContext
    ) -> admin_event_pb2.WorkflowExecutionEventResponse:
        self._handle("workflow", request, context, self._workflow_event)
        return admin_event_pb2.WorkflowExecutionEventResponse()

    def CreateNodeEvent(  # noqa: N802
        self, request: admin_event_pb2.NodeExecutionEventRequest, context: grpc.ServicerContext
    ) -> admin_event_pb2.NodeExecutionEventResponse:
        self._handle("node", request, context, self._node_event)
        return admin_event_pb2.NodeExecutionEventResponse()

    def CreateTaskEvent(  # noqa: N802
        self, request: admin_event_pb2.TaskExecutionEventRequest, context: grpc.ServicerContext
    ) -> admin_event_pb2.TaskExecutionEventResponse:
        self._handle("task", request, context, self._task_event)
        return admin_event_pb2.TaskExecutionEventResponse()

    def _handle(self, kind: str, request: Any, context: grpc.ServicerContext, apply: Callable[[Any], None]) -> None:
        refusal: _AdminError | None = None
        with self._changed:
            try:
                apply(request)
            except _AdminError as exc:
                refusal = exc
            self._received.append(
                Received(
                    kind=kind,
                    event=copy.deepcopy(request.event),
                    code=refusal.code.name if refusal else "OK",
                    message=refusal.message if refusal else "",
                )
            )
            self._changed.notify_all()
        if refusal is None:
            return
        if refusal.detail is None:  # grpc-go sends grpc-status-details-bin only with details
            context.abort(refusal.code, refusal.message)
        context.abort_with_status(refusal.status())

    def _execution(self, identifier: identifier_pb2.WorkflowExecutionIdentifier) -> _Execution:
        """The execution an event names, created (UNDEFINED) the first time, as admin's
        CreateExecution would have; an incomplete identifier names none."""
        if not (identifier.project and identifier.domain and identifier.name):
            raise _not_found()
        key = _execution_key(identifier)
        if key not in self._executions:
            self._executions[key] = _Execution(key=key, cluster=self.cluster or "")
        return self._executions[key]

    def _check_cluster(self, execution: _Execution, producer: str) -> None:
        """validation/shared_execution.go ValidateCluster."""
        if self.cluster is None or producer in ("", DEFAULT_PRODUCER_ID) or producer == execution.cluster:
            return
        detail = admin_event_pb2.EventFailureReason(
            incompatible_cluster=admin_event_pb2.EventErrorIncompatibleCluster(cluster=producer)
        )
        raise _AdminError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"Cluster/producer from event [{producer}] does not match existing workflow execution clusterInDB: "
            f"[{execution.cluster}]",
            detail,
        )

    def _workflow_event(self, request: admin_event_pb2.WorkflowExecutionEventRequest) -> None:
        """execution_manager.go CreateWorkflowEvent."""
        if not request.HasField("event"):
            raise _AdminError(grpc.StatusCode.INVALID_ARGUMENT, "Workflow event handler was called without event")
        event = request.event
        if not event.HasField("execution_id"):
            raise _AdminError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Workflow event handler request event doesn't have an execution id - {_one_line(event)}",
            )
        _validate_output_size(event.output_data if event.HasField("output_data") else None, self.max_output_bytes)
        execution = self._execution(event.execution_id)
        stored, phase = execution.phase, event.phase
        name = WorkflowPhase.Phase.Name
        if phase != WorkflowPhase.QUEUED:  # later QUEUED events announce a cluster reassignment
            if stored == phase:
                raise _AdminError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"This phase {name(stored)} was already recorded for workflow execution "
                    f"{_one_line(event.execution_id)}",
                )
            self._check_cluster(execution, event.producer_id)
        if stored in TERMINAL_WORKFLOW_PHASES:
            raise _terminal_refusal(
                f"Invalid phase change from {name(stored)} to {name(phase)} for workflow execution "
                f"{_one_line(event.execution_id)}",
                name(stored),
            )
        if stored == WorkflowPhase.RUNNING and phase == WorkflowPhase.QUEUED:
            raise _AdminError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"Cannot go from {name(stored)} to {name(phase)} for workflow execution "
                f"{_one_line(event.execution_id)}",
            )
        if stored == WorkflowPhase.ABORTING and phase not in TERMINAL_WORKFLOW_PHASES:
            raise _AdminError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"Invalid phase change from aborting to {name(phase)} for workflow execution "
                f"{_one_line(event.execution_id)}",
            )
        if not event.HasField("occurred_at"):
            raise _AdminError(grpc.StatusCode.INTERNAL, "Failed to parse OccurredAt: timestamp: nil Timestamp")
        # UpdateExecutionModelState
        producer = event.producer_id
        if self.cluster is not None and producer not in ("", DEFAULT_PRODUCER_ID):
            if phase in (WorkflowPhase.UNDEFINED, WorkflowPhase.QUEUED):
                execution.cluster = producer  # reassignCluster
            elif producer != execution.cluster:
                raise _AdminError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"Cannot accept events for running/terminated execution [{_one_line(event.execution_id)}] "
                    f"from cluster [{producer}],expected events to originate from [{execution.cluster}]",
                    admin_event_pb2.EventFailureReason(
                        incompatible_cluster=admin_event_pb2.EventErrorIncompatibleCluster(cluster=execution.cluster)
                    ),
                )
        execution.phase = phase
        execution.phases.append(phase)
        execution.updated_at = _time(event.occurred_at)
        if phase == WorkflowPhase.RUNNING:
            execution.started_at = execution.updated_at
        execution.output.take(event)

    def _node_event(self, request: admin_event_pb2.NodeExecutionEventRequest) -> None:
        """node_execution_manager.go CreateNodeEvent (its request validation only logs; so here)."""
        event = request.event
        execution = self._execution(event.id.execution_id)
        self._check_cluster(execution, event.producer_id)
        if not event.HasField("occurred_at"):
            raise _AdminError(grpc.StatusCode.INTERNAL, "failed to unmarshal occurredAt with error: nil Timestamp")
        key: NodeKey = (execution.key, event.id.node_id)
        node = self._nodes.get(key)
        if node is None:  # createNodeExecutionWithEvent: the parent task or node must be there
            if event.HasField("parent_task_metadata") and self._task_row(event.parent_task_metadata.id) is None:
                raise _not_found()
            if event.HasField("parent_node_metadata") and (
                (execution.key, event.parent_node_metadata.node_id) not in self._nodes
            ):
                raise _not_found()
            node = _Node(key=key, row_id=len(self._nodes) + 1, phase=event.phase, created_at=_time(event.occurred_at))
            node.apply(event)
            self._nodes[key] = node
            return
        name = NodePhase.Phase.Name
        if node.phase == event.phase:  # updateNodeExecutionWithEvent
            raise _AdminError(
                grpc.StatusCode.ALREADY_EXISTS,
                f"This phase was already recorded {name(node.phase)} for {_one_line(event.id)}",
            )
        if node.phase in TERMINAL_NODE_PHASES:
            raise _terminal_refusal(
                f"Invalid phase change from {name(node.phase)} to {name(event.phase)} for node execution {node.row_id}",
                name(event.phase),
            )
        node.apply(event)

    def _task_row(self, identifier: identifier_pb2.TaskExecutionIdentifier) -> _Task | None:
        node, task = identifier.node_execution_id, identifier.task_id
        key: TaskKey = (
            _execution_key(node.execution_id),
            node.node_id,
            (task.project, task.domain, task.name, task.version),
            identifier.retry_attempt,
        )
        return self._tasks.get(key)

    def _task_event(self, request: admin_event_pb2.TaskExecutionEventRequest) -> None:
        """task_execution_manager.go CreateTaskExecutionEvent."""
        if not request.HasField("event"):
            raise _missing("event")
        event = request.event
        _validate_task_event(event, self.max_output_bytes)
        execution = self._execution(event.parent_node_execution_id.execution_id)
        self._check_cluster(execution, event.producer_id)
        key = _task_key(event)
        task = self._tasks.get(key)
        if task is None:  # createTaskExecution: the node execution must be there
            if (execution.key, event.parent_node_execution_id.node_id) not in self._nodes:
                raise _AdminError(
                    grpc.StatusCode.UNKNOWN,
                    f"failed to get existing node execution id: [{_one_line(event.parent_node_execution_id)}]",
                )
            self._tasks[key] = _Task.create(key, event)
            return
        name = TaskPhase.Phase.Name
        identifier = identifier_pb2.TaskExecutionIdentifier(
            task_id=event.task_id, node_execution_id=event.parent_node_execution_id, retry_attempt=event.retry_attempt
        )
        if task.phase == event.phase and task.phase_version >= event.phase_version:
            raise _AdminError(
                grpc.StatusCode.ALREADY_EXISTS,
                f"have already recorded task execution phase {name(event.phase)} (version: {event.phase_version}) "
                f"for {_one_line(identifier)}",
            )
        if task.phase in TERMINAL_TASK_PHASES:
            raise _terminal_refusal(
                f"invalid phase change from {name(task.phase)} to {name(event.phase)} for task execution "
                f"{_one_line(identifier)}",
                name(event.phase),
            )
        task.update(event)

    # --- what propeller sent

    def received(self) -> list[Received]:
        """Every request in arrival order, with admin's answer."""
        with self._changed:
            return list(self._received)

    def received_task_events(self) -> list[event_pb2.TaskExecutionEvent]:
        return [r.event for r in self.received() if r.kind == "task"]

    def received_node_events(self) -> list[event_pb2.NodeExecutionEvent]:
        return [r.event for r in self.received() if r.kind == "node"]

    def received_workflow_events(self) -> list[event_pb2.WorkflowExecutionEvent]:
        return [r.event for r in self.received() if r.kind == "workflow"]

    # --- what admin stored

    @staticmethod
    def _one(rows: list[T], what: str) -> T:
        if not rows:
            raise LookupError(f"admin stored no {what}")
        if len(rows) > 1:
            raise ValueError(f"admin stored {len(rows)} of {what}: name the execution")
        return rows[0]

    def stored_task(self, node_id: str, retry_attempt: int = 0, *, execution: str | None = None) -> StoredTask:
        """The task execution of ``node_id``'s attempt ``retry_attempt`` (in the one execution that
        has it, or the execution named ``execution``). LookupError while admin has none."""
        with self._changed:
            rows = [
                t.snapshot()
                for (ex, node, _, attempt), t in self._tasks.items()
                if node == node_id and attempt == retry_attempt and execution in (None, ex[2])
            ]
        return self._one(rows, f"task execution of node {node_id!r} attempt {retry_attempt}")

    def stored_tasks(self) -> list[StoredTask]:
        """Every stored task execution, in the order admin created them."""
        with self._changed:
            return [t.snapshot() for t in self._tasks.values()]

    def stored_node(self, node_id: str, *, execution: str | None = None) -> StoredNode:
        with self._changed:
            rows = [
                n.snapshot() for (ex, node), n in self._nodes.items() if node == node_id and execution in (None, ex[2])
            ]
        return self._one(rows, f"node execution {node_id!r}")

    def stored_nodes(self) -> list[StoredNode]:
        with self._changed:
            return [n.snapshot() for n in self._nodes.values()]

    def stored_workflow(self, execution: str | None = None) -> StoredWorkflow:
        """The workflow execution (named ``execution``, or the only one admin knows)."""
        with self._changed:
            rows = [e.snapshot() for key, e in self._executions.items() if execution in (None, key[2])]
        return self._one(rows, "workflow execution" if execution is None else f"workflow execution {execution!r}")

    def workflow_phases(self, execution: str | None = None) -> list[str]:
        """The phases the workflow execution accepted, in order."""
        return self.stored_workflow(execution).phases

    # --- waiting and reporting

    def wait(self, predicate: Callable[[FakeAdmin], T], *, timeout: float, what: str = "the condition") -> T:
        """Block until ``predicate(self)`` is truthy (checked now and after every request) and return
        its value. A LookupError from it (``stored_task`` before admin has the row) means "not yet".
        On timeout a WaitTimeoutError (an AssertionError) with ``dump()``."""
        with self._changed:
            value: T | None = None

            def ready() -> bool:
                nonlocal value
                try:
                    value = predicate(self)
                except LookupError:
                    return False
                return bool(value)

            if not self._changed.wait_for(ready, timeout=timeout):
                raise WaitTimeoutError(f"timed out after {timeout:g}s waiting for {what}\n\n{self.dump()}")
            return value  # type: ignore[return-value]

    def dump(self) -> str:
        """Every request with admin's answer, then what admin stored: for assertion messages."""
        with self._changed:
            lines = ["received (in order):"]
            lines += [f"  #{i} {_describe(r)}" for i, r in enumerate(self._received, 1)] or ["  nothing"]
            lines.append("stored:")
            lines += [f"  {_describe_workflow(e.snapshot())}" for e in self._executions.values()]
            lines += [f"  {_describe_node(n.snapshot())}" for n in self._nodes.values()]
            lines += [f"  {_describe_task(t.snapshot())}" for t in self._tasks.values()]
        return "\n".join(lines)


def _describe_event_error(event: Any) -> Iterator[str]:
    if event.output_uri:
        yield f"output_uri={event.output_uri}"
    if event.HasField("output_data"):
        yield "output_data=<inline>"
    if event.HasField("error"):
        yield f"error={_error(event.error)}"


def _describe(received: Received) -> str:
    event = received.event
    parts: list[str]
    if received.kind == "task":
        node = event.parent_node_execution_id
        parts = [
            f"task {node.execution_id.name}/{node.node_id}#{event.retry_attempt} {event.task_id.name}",
            f"{TaskPhase.Phase.Name(event.phase)} v{event.phase_version}",
        ]
        if event.reason:
            parts.append(f"reason={event.reason!r}")
        if event.reasons:
            parts.append(f"reasons={[r.reason for r in event.reasons]!r}")
        if event.logs:
            parts.append(f"logs={[(log.name, log.uri) for log in event.logs]!r}")
        if event.HasField("custom_info"):
            parts.append(f"custom_info={_struct(event.custom_info)!r}")
    elif received.kind == "node":
        parts = [f"node {event.id.execution_id.name}/{event.id.node_id}", NodePhase.Phase.Name(event.phase)]
        if event.deck_uri:
            parts.append(f"deck_uri={event.deck_uri}")
    else:
        parts = [f"workflow {event.execution_id.name}", WorkflowPhase.Phase.Name(event.phase)]
    parts += _describe_event_error(event)
    answer = received.code if not received.message else f"{received.code}: {received.message}"
    return " ".join(parts) + f" -> {answer}"


def _describe_workflow(w: StoredWorkflow) -> str:
    return f"workflow {w.execution} {w.phase} phases={w.phases} error={w.error} output_uri={w.output_uri}"


def _describe_node(n: StoredNode) -> str:
    return (
        f"node {n.execution}/{n.node_id} {n.phase} phases={n.phases} deck_uri={n.deck_uri!r} "
        f"output_uri={n.output_uri} error={n.error}"
    )


def _describe_task(t: StoredTask) -> str:
    return (
        f"task {t.execution}/{t.node_id}#{t.retry_attempt} {t.task} {t.phase} v{t.phase_version} "
        f"reasons={t.reasons!r} logs={t.logs!r} custom_info={t.custom_info!r} instance_class={t.instance_class} "
        f"output_uri={t.output_uri} error={t.error}"
    )
