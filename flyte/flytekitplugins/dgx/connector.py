"""The flytekit connector: CreateTask / GetTask / DeleteTask as DGXTrainingJobs.

It runs in two places with the same code: in ``pyflyte serve connector`` for a Flyte deployment
(propeller calls it over gRPC), and inside ``pyflyte run`` for a local run against any cluster
(flytekit's AsyncConnectorExecutorMixin calls it in-process). A fresh API client per call: locally
the calls run on flytekit's own loop but an abort (Ctrl-C) deletes through ``asyncio.run``, and a
client made on one loop cannot be used on another.

Settings (the connector's environment):

- ``KUBEDGX_FLYTE_KUBECONFIG`` / ``KUBEDGX_FLYTE_CONTEXT``: which cluster (default: in-cluster
  credentials in a pod, else ``KUBECONFIG`` and its current context);
- ``KUBEDGX_FLYTE_NAMESPACE``: the namespace of every job (default: the execution's namespace,
  which Flyte sets per project and domain, else ``default``);
- ``KUBEDGX_FLYTE_DEFAULT_INSTANCE``: the instance of tasks that name none;
- ``KUBEDGX_FLYTE_LOG_TEMPLATE``: a URL with ``{namespace}``, ``{job}``, ``{pod}`` for log links;
- ``KUBEDGX_FLYTE_WORKER_ENV_<NAME>``: ``NAME`` set in every worker (blob-store settings such as
  ``FLYTE_AWS_ENDPOINT``);
- ``KUBEDGX_FLYTE_CATALOG``: the instance catalog the cluster's operator uses, if not the default;
- ``KUBEDGX_FLYTE_JOB_TTL``: seconds a finished job is kept (``spec.ttlSecondsAfterFinished``); the
  data mounts only connector-made jobs own go with the last of them.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
from dataclasses import asdict, dataclass
from typing import Any

from flyteidl.admin.agent_pb2 import GetTaskLogsResponse, GetTaskLogsResponseBody
from flyteidl.core.execution_pb2 import TaskLog
from flytekit.extend.backend.base_connector import AsyncConnectorBase, ConnectorRegistry, Resource, ResourceMeta
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from dgx_operator.api import API_VERSION, GROUP, VERSION
from dgx_operator.api.common import JOB_KIND
from dgx_operator.api.crdgen import DATA_MOUNTS, TRAINING_JOBS
from dgx_operator.api.vocabulary import JobPhase
from dgx_operator.render.names import CONTAINER_NAME, worker_name
from flytekitplugins.dgx import results
from flytekitplugins.dgx.config import DGXConfigError
from flytekitplugins.dgx.manifest import (
    FUNCTION_TASK,
    KEY_LABEL,
    QLORA_TASK,
    Execution,
    Plan,
    build,
    digest,
    options_from_env,
)
from flytekitplugins.dgx.phases import (
    FAILED,
    JOB_LINK,
    LOG_LINES,
    RAN_ANNOTATION,
    RETRYABLE_FAILED,
    RUNNING,
    SUCCEEDED,
    failure_phase,
    has_run,
    log_tail,
    no_log,
    status_of,
)

log = logging.getLogger(__name__)

JOBS = TRAINING_JOBS.plural
MOUNTS = DATA_MOUNTS.plural
#: The QLoRA task's output: the URI of the archived adapter (status.artifacts[name=adapter]).
ADAPTER_OUTPUT = "adapter"


class DGXConnectorError(RuntimeError):
    """The cluster refused or lost what the connector asked for (the message says which object)."""


@dataclass
class DGXJobMetadata(ResourceMeta):  # type: ignore[misc]  # flytekit ships no type information
    """What Flyte keeps between calls (JSON in the task's state): enough to find the job again."""

    namespace: str
    name: str
    uid: str = ""
    task_type: str = FUNCTION_TASK
    output_prefix: str = ""
    #: A config kubedgx refused at CreateTask under Flyte's backend (the Validator's lines): no job
    #: was made, and GetTask reports the refusal as a permanent failure.
    refused: str = ""

    def encode(self) -> bytes:
        """JSON, without ``refused`` when there is none: a connector of an earlier version, which has no
        such field, still reads the metadata of every task it was not refused."""
        fields = asdict(self)
        if not self.refused:
            del fields["refused"]
        return json.dumps(fields).encode("utf-8")


async def _api() -> client.ApiClient:
    path = os.environ.get("KUBEDGX_FLYTE_KUBECONFIG") or None
    context = os.environ.get("KUBEDGX_FLYTE_CONTEXT") or None
    in_cluster = os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )
    if path is None and context is None and in_cluster:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
        return client.ApiClient()
    configuration = client.Configuration()
    path = path or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
    await config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
    return client.ApiClient(configuration)


def _detail(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        body = {}
    return str(body.get("message") or exc.reason or exc.status)


async def _create_or_get(api: client.CustomObjectsApi, plural: str, obj: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the object, whether this call created it)."""
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    try:
        return await api.create_namespaced_custom_object(GROUP, VERSION, ns, plural, obj), True
    except ApiException as exc:
        if exc.status != 409:
            kind = obj["kind"]
            raise DGXConnectorError(f"creating {kind} {ns}/{name} was refused: {exc.status} {_detail(exc)}") from None
    found: dict[str, Any] = await api.get_namespaced_custom_object(GROUP, VERSION, ns, plural, name)
    return found, False


#: Attempts at adding an owner to a mount that others change meanwhile (409 on its resourceVersion).
OWNER_ATTEMPTS = 5


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    """The job as an owner of a mount: not its controller, and not blocking the job's deletion."""
    meta = job["metadata"]
    return {
        "apiVersion": job.get("apiVersion") or API_VERSION,
        "kind": job.get("kind") or JOB_KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "blockOwnerDeletion": False,
    }


async def add_owner(api: client.CustomObjectsApi, mount: dict[str, Any], job: dict[str, Any]) -> None:
    """Append ``job`` to the mount's ownerReferences (kept: the other owners; idempotent). Kubernetes'
    garbage collector deletes a dependent once all its owners are gone, so a mount that connector-made
    jobs share lives as long as the last of them."""
    ref = owner_reference(job)
    ns, name = mount["metadata"]["namespace"], mount["metadata"]["name"]
    gone = f"DGXDataMount {ns}/{name} was deleted as job {ref['name']} was created; create the task again"
    for _ in range(OWNER_ATTEMPTS):
        meta = mount.get("metadata") or {}
        owners = list(meta.get("ownerReferences") or [])
        if any(o.get("uid") == ref["uid"] for o in owners):
            return
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "ownerReferences": [*owners, ref]}}
        try:
            await api.patch_namespaced_custom_object(  # type: ignore[call-arg]  # its stubs lack _content_type
                GROUP, VERSION, ns, MOUNTS, name, patch, _content_type="application/merge-patch+json"
            )  # a dict body is sent as a JSON patch otherwise
            return
        except ApiException as exc:
            if exc.status == 404:
                raise DGXConnectorError(gone) from None
            if exc.status != 409:
                raise DGXConnectorError(
                    f"adding DGXTrainingJob {ref['name']} to the owners of DGXDataMount {ns}/{name} was refused: "
                    f"{exc.status} {_detail(exc)}"
                ) from None
        try:  # changed meanwhile: read it again
            mount = await api.get_namespaced_custom_object(GROUP, VERSION, ns, MOUNTS, name)
        except ApiException as exc:
            raise DGXConnectorError(gone if exc.status == 404 else f"reading DGXDataMount {ns}/{name}: "
                                    f"{exc.status} {_detail(exc)}") from None  # fmt: skip
    raise DGXConnectorError(f"DGXDataMount {ns}/{name} kept changing; its owners could not be updated")


async def apply_plan(plan: Plan) -> DGXJobMetadata:
    """Create the mounts (an existing one is reused: its name is a hash of what it reads) and the
    job; an existing job with this execution's key is adopted, one with another key is refused.
    Then the job becomes an owner of each mount, so the last job's deletion deletes the mount."""
    api_client = await _api()
    try:
        api = client.CustomObjectsApi(api_client)
        mounts: dict[str, dict[str, Any]] = {}
        for mount in plan.mounts:
            found, created = await _create_or_get(api, MOUNTS, mount)
            name = mount["metadata"]["name"]
            if found.get("metadata", {}).get("deletionTimestamp"):
                # Its last owner went (or someone deleted it): a job naming it would wait for a mount that goes.
                raise DGXConnectorError(
                    f"DGXDataMount {plan.namespace}/{name} is being deleted; create the task again once it is gone"
                )
            mounts[name] = found
            log.info("DGXDataMount %s/%s %s", plan.namespace, name, "created" if created else "reused")
        job, created = await _create_or_get(api, JOBS, plan.job)
        if job.get("metadata", {}).get("deletionTimestamp"):
            # This execution's job, still going (an abort, then a retried create): adopting it would
            # report a job that is about to vanish. Flyte retries a failed create.
            raise DGXConnectorError(
                f"DGXTrainingJob {plan.namespace}/{plan.name} is being deleted; create the task again once it is gone"
            )
        labels = job.get("metadata", {}).get("labels") or {}
        if not created and labels.get(KEY_LABEL) != digest(plan.key, 32):
            raise DGXConnectorError(
                f"DGXTrainingJob {plan.namespace}/{plan.name} exists and was not created for this task execution "
                f"({plan.key}); delete it or run the task under another execution name"
            )
        log.info("DGXTrainingJob %s/%s %s", plan.namespace, plan.name, "created" if created else "adopted")
        for mount in mounts.values():
            await add_owner(api, mount, job)
        uid = str(job["metadata"].get("uid", ""))
        return DGXJobMetadata(plan.namespace, plan.name, uid, plan.task_type, plan.output_prefix)
    finally:
        await api_client.close()


async def read_job(meta: DGXJobMetadata) -> dict[str, Any] | None:
    api_client = await _api()
    try:
        api = client.CustomObjectsApi(api_client)
        try:
            job: dict[str, Any] = await api.get_namespaced_custom_object(
                GROUP, VERSION, meta.namespace, JOBS, meta.name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise DGXConnectorError(
                f"reading DGXTrainingJob {meta.namespace}/{meta.name}: {exc.status} {_detail(exc)}"
            ) from None
        if meta.uid and job.get("metadata", {}).get("uid") != meta.uid:
            return None  # a new job of the same name: ours is gone
        return job
    finally:
        await api_client.close()


async def delete_job(meta: DGXJobMetadata) -> bool:
    """Delete the job (its workers go with it, by owner reference); False when it was gone already."""
    api_client = await _api()
    try:
        api = client.CustomObjectsApi(api_client)
        body = client.V1DeleteOptions(propagation_policy="Background")
        if meta.uid:
            body.preconditions = client.V1Preconditions(uid=meta.uid)
        try:
            await api.delete_namespaced_custom_object(GROUP, VERSION, meta.namespace, JOBS, meta.name, body=body)
        except ApiException as exc:
            if exc.status in (404, 409):  # gone, or a different job of that name now (uid precondition)
                return False
            raise DGXConnectorError(
                f"deleting DGXTrainingJob {meta.namespace}/{meta.name}: {exc.status} {_detail(exc)}"
            ) from None
        return True
    finally:
        await api_client.close()


#: The jobs :func:`mark_ran` could not annotate and said so (by uid): one warning per job, not one per GetTask.
_UNMARKED: set[str] = set()


async def mark_ran(meta: DGXJobMetadata) -> None:
    """Annotate the job as reported RUNNING (phases.RAN_ANNOTATION), once: from then on a return to
    waiting is shown as RUNNING. A refusal (no ``patch`` on dgxtrainingjobs) is logged, not raised:
    GetTask still answers, and such a job is shown waiting again when it waits."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    # A JSON patch: the test of the uid keeps a newer job of the same name unmarked.
    body = [{"op": "add", "path": "/metadata/annotations/" + RAN_ANNOTATION.replace("/", "~1"), "value": now}]
    if meta.uid:
        body.insert(0, {"op": "test", "path": "/metadata/uid", "value": meta.uid})
    api_client = await _api()
    try:
        api = client.CustomObjectsApi(api_client)
        await api.patch_namespaced_custom_object(GROUP, VERSION, meta.namespace, JOBS, meta.name, body)
    except ApiException as exc:
        if meta.uid in _UNMARKED:
            return  # said once for this job; tried again at the next answer
        _UNMARKED.add(meta.uid)
        fix = "; give the connector patch on dgxtrainingjobs" if exc.status == 403 else ""
        log.warning(
            "could not annotate DGXTrainingJob %s/%s with %s (%s %s)%s: if it waits again after it ran, Flyte shows "
            "it waiting until it ends",
            meta.namespace, meta.name, RAN_ANNOTATION, exc.status, _detail(exc), fix,
        )  # fmt: skip
    finally:
        await api_client.close()


async def read_log(meta: DGXJobMetadata, lines: int) -> list[str]:
    """The last ``lines`` lines of rank 0's trainer container; one line saying why when there is no log."""
    pod = worker_name(meta.name, 0)
    api_client = await _api()
    try:
        core = client.CoreV1Api(api_client)
        try:
            text = await core.read_namespaced_pod_log(pod, meta.namespace, container=CONTAINER_NAME, tail_lines=lines)
        except ApiException as exc:
            try:
                kind = str((json.loads(exc.body or "{}").get("details") or {}).get("kind") or "")
            except ValueError:
                kind = ""
            return [no_log(meta.namespace, pod, CONTAINER_NAME, kind, f"{exc.status} {_detail(exc)}")]
        return log_tail(str(text or ""), lines)
    finally:
        await api_client.close()


@dataclass(frozen=True)
class TaskError:
    """What error.pb says, or why it could not be read."""

    #: What the job's message gains, after "; ".
    message: str
    #: The error's ContainerError.Kind; None when error.pb could not be read.
    kind: int | None


#: Where docs/flyte.md says how to give the connector the blob store.
BLOB_STORE_HINT = 'give the connector read access to Flyte\'s blob store (docs/flyte.md, "Deploying the connector")'


def task_error(output_prefix: str) -> TaskError | None:
    """The error.pb pyflyte-execute wrote for the function's exception: its message (what the user
    needs; the worker's exit code and last log line are only the symptom) and its kind (whether Flyte
    may retry). None when there is none. One that cannot be read says so, and how to fix it: a
    connector without the blob store's credentials would otherwise lose the error silently."""
    if not output_prefix:
        return None
    from flyteidl.core.errors_pb2 import ErrorDocument
    from flytekit.core.context_manager import FlyteContextManager
    from flytekit.exceptions.system import FlyteDownloadDataException
    from flytekit.exceptions.user import FlyteDataNotFoundException
    from google.protobuf.message import DecodeError

    uri = f"{output_prefix.rstrip('/')}/error.pb"
    ctx = FlyteContextManager.current_context()
    local = ctx.file_access.get_random_local_path()
    try:
        ctx.file_access.get_data(uri, local)
        with open(local, "rb") as fh:
            doc = ErrorDocument.FromString(fh.read())
    except FlyteDataNotFoundException:
        return None  # the function raised nothing (the worker died): the job's reason stands alone
    except DecodeError as exc:
        return TaskError(f"error.pb at {uri} is not an ErrorDocument ({_first_line(exc)})", None)
    except Exception as exc:
        # flytekit wraps the store's error (no credentials, access denied, no route) in its own.
        cause = (exc.__cause__ or exc.__context__) if isinstance(exc, FlyteDownloadDataException) else None
        return TaskError(f"error.pb at {uri} could not be read ({_first_line(cause or exc)}): {BLOB_STORE_HINT}", None)
    message = " ".join(_raised(doc.error.message).split())[:1000]
    return TaskError(f"the task raised: {message or '(an error without a message)'}", int(doc.error.kind))


def _raised(message: str) -> str:
    """flytekit's user-error text is ``Trace: <traceback> Message: <Type: text>``: the part after
    ``Message:`` is what the function raised; the traceback is in the worker's log."""
    _, sep, tail = message.partition("\nMessage:\n")
    return tail.strip() if sep and tail.strip() else message


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _adapter(job: dict[str, Any]) -> str | None:
    for artifact in (job.get("status") or {}).get("artifacts") or []:
        if artifact.get("name") == "adapter" and artifact.get("uri"):
            return str(artifact["uri"])
    return None


class DGXConnector(AsyncConnectorBase):  # type: ignore[misc]  # flytekit ships no type information
    """One connector, ``kubedgx``, registered for both task types."""

    name = "kubedgx"

    def __init__(self, task_type: str = FUNCTION_TASK) -> None:
        super().__init__(task_type_name=task_type, metadata_type=DGXJobMetadata)

    async def create(
        self,
        task_template: Any,
        output_prefix: str,
        inputs: Any = None,
        task_execution_metadata: Any = None,
        **kwargs: Any,
    ) -> DGXJobMetadata:
        try:
            plan = build(task_template, output_prefix, task_execution_metadata, options_from_env())
        except DGXConfigError as exc:
            if not Execution.from_metadata(task_execution_metadata).remote:
                raise  # a local run: pyflyte run fails before anything is made
            # Under Flyte's backend an error here would be a retryable failure (propeller retries a
            # failed CreateTask), though no retry can pass: answer, and let GetTask fail it for good.
            log.warning("refused: %s", exc)
            return DGXJobMetadata("", "", task_type=str(task_template.type), output_prefix=output_prefix,
                                  refused=str(exc))  # fmt: skip
        for note in plan.notes:
            log.warning("%s: %s", plan.name, note)
        return await apply_plan(plan)

    async def get(self, resource_meta: DGXJobMetadata, **kwargs: Any) -> Resource:
        if resource_meta.refused:
            return Resource(phase=FAILED, message=resource_meta.refused)
        job = await read_job(resource_meta)
        st = status_of(job, os.environ.get("KUBEDGX_FLYTE_LOG_TEMPLATE") or None)
        if st.phase == RUNNING and job is not None and not has_run(job):
            await mark_ran(resource_meta)
        # The protobuf TaskLog: Resource.to_flyte_idl() (what `pyflyte serve connector` answers
        # with) puts the links into the protobuf Resource as they are; flytekit's model class fails there.
        # The job's own link is kept by Flyte's admin while the task is queued or initializing too.
        links = [TaskLog(uri=uri, name=name, ShowWhilePending=name == JOB_LINK) for name, uri in st.log_links]
        outputs = None
        phase, message = st.phase, st.message
        if phase == SUCCEEDED and resource_meta.task_type == QLORA_TASK and job is not None:
            uri = _adapter(job)
            if uri is None:
                phase, message = FAILED, f"{message}; but no adapter was archived (status.artifacts has none)"
            else:
                outputs = {ADAPTER_OUTPUT: uri}
        if phase in (FAILED, RETRYABLE_FAILED) and resource_meta.task_type == FUNCTION_TASK and job is not None:
            error = await asyncio.to_thread(task_error, resource_meta.output_prefix)
            if error is not None:
                message = f"{message}; {error.message}"
                phase = failure_phase(st.reason, error.kind)
        # Before answering: propeller looks for the deck in the round it sees SUCCEEDED (results.py).
        outputs = await results.leave(
            resource_meta.output_prefix, job, outputs, function_task=resource_meta.task_type == FUNCTION_TASK
        )
        return Resource(phase=phase, message=message, log_links=links, outputs=outputs, custom_info=st.custom_info)

    async def delete(self, resource_meta: DGXJobMetadata, **kwargs: Any) -> None:
        """Abort: a job still going is deleted (its workers with it). A job that already ended is
        kept: propeller also calls this for a failed attempt before it retries, and that job is what
        the attempt's error names, for ``kubedgx describe|logs``; it holds no nodes any more, and
        ``KUBEDGX_FLYTE_JOB_TTL`` (or ``kubectl delete``) removes it."""
        if resource_meta.refused:
            return  # nothing was made
        job = await read_job(resource_meta)
        if job is None:
            return
        phase = (job.get("status") or {}).get("phase")
        if phase in JobPhase.TERMINAL:
            log.info("DGXTrainingJob %s/%s kept: it ended %s", resource_meta.namespace, resource_meta.name, phase)
            return
        await delete_job(resource_meta)

    async def get_logs(self, resource_meta: DGXJobMetadata, **kwargs: Any) -> GetTaskLogsResponse:
        """The last lines (``lines``, else 100) of the worker of global rank 0 (pod <job>-worker-0,
        container trainer). Needs ``get`` on ``pods/log``. No Flyte component calls it (propeller
        v1.16.8 does not), and flytekit's servicer sends nothing back over gRPC for this streaming
        call: it serves callers in-process."""
        if resource_meta.refused:
            results = ["no log: no job was made, kubedgx refused the task's config (the task's error has its lines)"]
        else:
            results = await read_log(resource_meta, int(kwargs.get("lines") or LOG_LINES))
        return GetTaskLogsResponse(body=GetTaskLogsResponseBody(results=results))


def register() -> None:
    """Idempotent: importing the package twice (the entry point, then ``--modules``) registers once."""
    for task_type in (FUNCTION_TASK, QLORA_TASK):
        ConnectorRegistry.register(DGXConnector(task_type), override=True)
