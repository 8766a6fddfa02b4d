"""The Python client of kubedgx: submit a job, follow it, wait for it, fetch what it made.

For notebooks and pipelines, and the body of the CLI's user verbs (`kubedgx submit/list/describe/
logs/wait/cancel/fetch/plot/tensorboard`, cli/jobs.py), so a verb and its Python twin cannot drift::

    from dgx_operator.client import Client

    kd = Client(namespace="ml")                 # the kubeconfig and context kubectl would use
    job = kd.submit("examples/quickstart.yaml")  # -> DGXTrainingJob, as the cluster stored it
    for line in kd.logs(job.metadata.name, follow=True):
        print(line.shown)
    done = kd.wait(job.metadata.name)            # raises JobFailedError(reason, message) on failure
    kd.fetch(job.metadata.name, dest="out/")     # the adapter, from the job's Out mount

Typed with the API's own models (:class:`DGXTrainingJob`, :class:`Progress`). The cluster is read
with the user's kubeconfig through :mod:`dgx_operator.client.kubeclient` (standard library only), so
``pip install kubedgx`` is enough; the object store (``fetch``, the history behind ``plot`` and
``tensorboard`` once the pods are gone) needs ``kubedgx-datasync``, which says so when missing.
"""

from __future__ import annotations

import base64
import os
import posixpath
import queue
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from dgx_api import manifests
from dgx_api.progress import parse_event
from dgx_operator.api import API_VERSION, GROUP, VERSION
from dgx_operator.api.common import Condition
from dgx_operator.api.datamount import DGXDataMount
from dgx_operator.api.trainingjob import DGXTrainingJob, Progress
from dgx_operator.api.vocabulary import JobCondition, JobPhase, MountCondition
from dgx_operator.client import kubeclient
from dgx_operator.client.errors import (
    ClientError,
    JobFailedError,
    JobNotFoundError,
    NothingToFetchError,
    SubmitError,
    WaitTimeoutError,
)
from dgx_operator.client.lines import describe_event, parse_time
from dgx_operator.render.datasync import logs_uri
from dgx_operator.render.names import CONTAINER_NAME, DETACHED_SUFFIX, INDEX_LABEL, JOB_LABEL
from dgx_operator.render.resolved import JobIdentity

if TYPE_CHECKING:
    from dgx_api.history import Point

JOB_KIND = "DGXTrainingJob"
MOUNT_KIND = "DGXDataMount"
_PLURALS = {JOB_KIND: "dgxtrainingjobs", MOUNT_KIND: "dgxdatamounts"}
#: What `fetch` takes when no artifact is named: the adapter first (what a QLoRA run is for).
FETCH_ORDER = ("adapter", "model.tar.gz", "merged", "summary")


def _collection(kind: str, namespace: str | None) -> str:
    base = f"/apis/{GROUP}/{VERSION}"
    plural = _PLURALS[kind]
    return f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"


@dataclass(frozen=True)
class LogLine:
    """One line of a worker's output. ``text`` is the line as the program wrote it; ``event`` the
    progress-contract object when it is one (docs/trainer.md), else None; ``shown`` what
    ``kubedgx logs`` prints: the event made readable, any other line as it is."""

    pod: str
    rank: int | None
    text: str
    event: dict[str, Any] | None = None

    @property
    def shown(self) -> str:
        return describe_event(self.event) if self.event is not None else self.text


@dataclass(frozen=True)
class Worker:
    """A worker pod of the job as `describe` shows it."""

    name: str
    rank: int | None
    node: str | None
    phase: str
    ready: bool
    restarts: int
    attempt: str | None
    state: str
    uid: str | None = None
    created: str | None = None


@dataclass(frozen=True)
class MountState:
    """A data mount the job references and what it is doing."""

    name: str
    mount_path: str
    direction: str | None
    phase: str | None
    message: str | None
    source: str | None


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event about the job or one of its pods."""

    type: str
    reason: str
    object: str
    message: str
    count: int
    last: datetime | None


@dataclass
class Submitted:
    """What `submit` did with one document: ``created`` (the stored object) or ``kept`` (a data mount
    that exists already, left as it is)."""

    kind: str
    namespace: str
    name: str
    action: str
    object: dict[str, Any] = field(default_factory=dict)


def _model(body: Mapping[str, Any]) -> DGXTrainingJob:
    try:
        return DGXTrainingJob.model_validate(body)
    except ValidationError as exc:
        name = (body.get("metadata") or {}).get("name")
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ClientError(
            f"this kubedgx cannot read DGXTrainingJob {name}: {where}: {first.get('msg')} "
            "(an operator newer than this client?): upgrade kubedgx (pip install -U kubedgx)"
        ) from None


def condition(job: DGXTrainingJob, type_: str) -> Condition | None:
    for cond in job.status.conditions if job.status else []:
        if cond.type == type_:
            return cond
    return None


def finished(job: DGXTrainingJob) -> bool:
    return bool(job.status and job.status.phase in JobPhase.TERMINAL)


def ended_reason(job: DGXTrainingJob) -> tuple[str, str]:
    """(reason, message) of the condition that says how the job ended (Failed or Succeeded)."""
    phase = job.status.phase if job.status else None
    cond = condition(job, JobCondition.FAILED if phase == JobPhase.FAILED else JobCondition.SUCCEEDED)
    if cond is None:
        cond = condition(job, JobCondition.FINISHED)
    return (cond.reason or str(phase), cond.message or "") if cond else (str(phase), "")


class Client:
    """The user's view of kubedgx in one namespace (``namespace``; the context's by default).

    ``kubeconfig`` and ``context`` are found as kubectl finds them (``KUBECONFIG``, the current
    context); ``api`` is an already-loaded :class:`kubeclient.Client` (tests, in-cluster use)."""

    def __init__(
        self,
        namespace: str | None = None,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        api: kubeclient.Client | None = None,
    ) -> None:
        self.api = api or kubeclient.load(kubeconfig, context)
        self.namespace = namespace or self.api.namespace

    # -- reading ----------------------------------------------------------------------------------

    def _job_path(self, name: str, namespace: str | None = None) -> str:
        return f"{_collection(JOB_KIND, namespace or self.namespace)}/{name}"

    def get(self, name: str) -> DGXTrainingJob:
        """The job as stored now. :class:`JobNotFoundError` if there is none of that name."""
        try:
            return _model(self.api.get(self._job_path(name)))
        except kubeclient.NotFoundError:
            raise JobNotFoundError(
                f"no DGXTrainingJob {name!r} in namespace {self.namespace} (kubedgx list shows the jobs there)"
            ) from None

    def list_jobs(self, all_namespaces: bool = False) -> list[DGXTrainingJob]:
        """The jobs of the namespace (or of every namespace the user may list), oldest first."""
        try:
            items = self.api.list(_collection(JOB_KIND, None if all_namespaces else self.namespace))
        except kubeclient.NotFoundError:
            raise ClientError(
                "the cluster serves no DGXTrainingJob: kubedgx is not installed there (docs/README.md: the Helm chart)"
            ) from None
        jobs = [_model(item) for item in items]
        oldest = datetime.min.replace(tzinfo=UTC)
        return sorted(
            jobs, key=lambda j: (j.metadata.namespace or "", j.metadata.creation_timestamp or oldest, j.metadata.name)
        )

    def progress(self, name: str) -> Progress | None:
        """The trainer's last report as the operator copied it into ``status.progress``."""
        job = self.get(name)
        return job.status.progress if job.status else None

    def workers(self, name: str) -> list[Worker]:
        """The job's worker pods, by rank then age (a replaced worker's pod before its replacement)."""
        pods = self.api.list(f"/api/v1/namespaces/{self.namespace}/pods", label_selector=f"{JOB_LABEL}={name}")
        found = [_worker(p) for p in pods]
        return sorted(found, key=lambda w: (w.rank if w.rank is not None else 1 << 30, w.created or "", w.name))

    def mounts(self, job: DGXTrainingJob) -> list[MountState]:
        """The data mounts the job references, with their phase and message (or why they cannot be read)."""
        states: list[MountState] = []
        for ref in job.spec.data_mounts:
            try:
                body = self.api.get(f"{_collection(MOUNT_KIND, self.namespace)}/{ref.name}")
            except kubeclient.NotFoundError:
                states.append(MountState(ref.name, ref.mount_path, None, None, "not found: create it", None))
                continue
            except kubeclient.ForbiddenError as exc:
                states.append(MountState(ref.name, ref.mount_path, None, None, str(exc), None))
                continue
            spec, status = body.get("spec") or {}, body.get("status") or {}
            ready: dict[str, Any] = next(
                (c for c in status.get("conditions") or [] if c.get("type") == MountCondition.READY), {}
            )
            states.append(
                MountState(
                    ref.name,
                    ref.mount_path,
                    spec.get("direction"),
                    status.get("phase"),
                    ready.get("message"),
                    spec.get("source"),
                )
            )
        return states

    def events(self, name: str, limit: int = 20) -> list[Event]:
        """The newest Events about the job and its worker pods, oldest first."""
        found: list[Event] = []
        items = self.api.list(f"/api/v1/namespaces/{self.namespace}/events")
        pods = {w.name for w in self.workers(name)}
        for item in items:
            involved = item.get("involvedObject") or {}
            kind, obj = involved.get("kind"), involved.get("name")
            about_pod = kind == "Pod" and (obj in pods or str(obj).startswith(f"{name}-worker-"))
            if not ((kind == JOB_KIND and obj == name) or about_pod):
                continue
            when = (
                item.get("lastTimestamp")
                or item.get("eventTime")
                or (item.get("metadata") or {}).get("creationTimestamp")
            )
            found.append(
                Event(
                    type=str(item.get("type") or "Normal"),
                    reason=str(item.get("reason") or ""),
                    object=f"{str(kind).lower()}/{obj}",
                    message=str(item.get("message") or "").strip(),
                    count=int(item.get("count") or 1),
                    last=parse_time(when),
                )
            )
        found.sort(key=lambda e: e.last or datetime.min.replace(tzinfo=UTC))
        return found[-limit:]

    # -- submitting and cancelling -----------------------------------------------------------------

    def submit(self, job: DGXTrainingJob | Mapping[str, Any] | str | Path, *, dry_run: bool = False) -> DGXTrainingJob:
        """Create the job (a model, a manifest dict, or the path of a YAML file holding one job and
        any DGXDataMounts it needs) and return it as the cluster stored it. The cluster's webhook
        judges it with the cluster's catalog: its refusal is a :class:`SubmitError` naming the field.
        The webhook's warnings are in ``self.api.warnings``."""
        if isinstance(job, str | Path):
            documents = read_manifests(Path(job).read_text(encoding="utf-8"), str(job))
        elif isinstance(job, DGXTrainingJob):
            documents = [job.model_dump(mode="json", by_alias=True, exclude_none=True)]
        else:
            documents = [dict(job)]
        done = self.submit_all(documents, dry_run=dry_run)
        jobs = [d for d in done if d.kind == JOB_KIND]
        if len(jobs) != 1:
            raise SubmitError(f"expected one DGXTrainingJob, found {len(jobs)}: submit_all() takes several")
        return _model(jobs[0].object)

    def submit_all(self, documents: Sequence[Mapping[str, Any]], *, dry_run: bool = False) -> list[Submitted]:
        """Create every document (DGXDataMounts first, then jobs). All are first sent as a server
        dry run, so a refusal of any creates none of them; a DGXDataMount that exists is kept as it
        is (jobs share mounts), a job that exists is an error (a job is a run: give the new one
        another name, or ``metadata.generateName``)."""
        order = sorted(documents, key=lambda d: 0 if d.get("kind") == MOUNT_KIND else 1)
        for doc in order:
            kind = doc.get("kind")
            if doc.get("apiVersion") != API_VERSION or kind not in _PLURALS:
                raise SubmitError(
                    f"{kind or 'a document without kind'} ({doc.get('apiVersion')}): submit takes "
                    f"{JOB_KIND} and {MOUNT_KIND} of {API_VERSION}; apply other objects with kubectl apply"
                )
        plans: list[tuple[Mapping[str, Any], str, str, bool]] = []
        warned = len(self.api.warnings)
        for doc in order:
            kind = str(doc["kind"])
            meta = doc.get("metadata") or {}
            namespace = str(meta.get("namespace") or self.namespace)
            name = str(meta.get("name") or meta.get("generateName") or "")
            exists = False
            if kind == MOUNT_KIND and meta.get("name"):
                try:
                    self.api.get(f"{_collection(kind, namespace)}/{meta['name']}")
                    exists = True
                except kubeclient.NotFoundError:
                    exists = False
            if not exists:
                self._create(kind, namespace, doc, name, dry_run=True)
            plans.append((doc, kind, namespace, exists))
        if not dry_run:  # the creates below answer with the same warnings: show them once
            del self.api.warnings[warned:]
        done: list[Submitted] = []
        for doc, kind, namespace, exists in plans:
            meta = doc.get("metadata") or {}
            if exists:
                done.append(Submitted(kind, namespace, str(meta.get("name")), "kept"))
                continue
            stored = self._create(
                kind, namespace, doc, str(meta.get("name") or meta.get("generateName")), dry_run=dry_run
            )
            name = str((stored.get("metadata") or {}).get("name") or meta.get("name"))
            done.append(Submitted(kind, namespace, name, "checked" if dry_run else "created", stored))
        return done

    def _create(self, kind: str, namespace: str, doc: Mapping[str, Any], name: str, *, dry_run: bool) -> dict[str, Any]:
        body = {**doc, "metadata": {**(doc.get("metadata") or {}), "namespace": namespace}}
        label = f"{kind.lower()} {namespace}/{name}"
        try:
            return self.api.create(_collection(kind, namespace), body, dry_run=dry_run)
        except kubeclient.ConflictError:
            raise SubmitError(
                f"{label} exists already: a job is one run; give this one another name (or metadata.generateName), "
                f"or delete the old one first (kubedgx cancel {name})"
            ) from None
        except (kubeclient.InvalidError, kubeclient.ForbiddenError) as exc:
            # The server's own words (the webhook's refusal names the field, RBAC the verb).
            raise SubmitError(f"{label}: {str(exc).removeprefix('forbidden (403): ')}") from None
        except kubeclient.NotFoundError:
            raise SubmitError(
                f"{label}: the cluster does not serve {kind} (kubedgx's CRDs are not installed), or namespace "
                f"{namespace} does not exist"
            ) from None

    def cancel(self, name: str, *, wait: bool = False, timeout: float | None = None) -> DGXTrainingJob:
        """Delete the job: its workers get their grace period (an upload in flight finishes), its
        usage stays in its budgets' ledgers. Returns the job as it was just before. ``wait``: until
        the job is gone."""
        job = self.get(name)
        try:
            self.api.delete(self._job_path(name), propagation="Foreground")
        except kubeclient.NotFoundError:
            return job
        if wait:
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                try:
                    current = self.api.get(self._job_path(name))
                except kubeclient.NotFoundError:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    raise WaitTimeoutError(f"{name} is still being deleted after {timeout:g}s")
                version = str((current.get("metadata") or {}).get("resourceVersion") or "")
                seconds = 30 if deadline is None else max(1, int(deadline - time.monotonic()))
                query = {"fieldSelector": f"metadata.name={name}"}
                self._next_change(_collection(JOB_KIND, self.namespace), query, seconds, version)
        return job

    # -- waiting ----------------------------------------------------------------------------------

    def _next_change(self, path: str, query: Mapping[str, str], seconds: int, version: str | None = None) -> None:
        """Return at the next change of what ``query`` selects in ``path`` after ``version`` (a
        resourceVersion the caller read; None: the list's now), or after ``seconds``. A watch without
        a version opens with an ADDED event per object, which would return at once (and the callers,
        looking again, would ask the API server in a busy loop); from the caller's own version, a
        change between its read and the watch's start (the job gone meanwhile) is still seen. An
        expired version returns: the caller reads again."""
        if version is None:
            listed = self.api.get(path, {**query, "limit": "1"})
            version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
        watched = {**query, "resourceVersion": version} if version else dict(query)
        try:
            for _ in self.api.watch(path, watched, timeout_s=max(1, seconds)):
                return
        except kubeclient.ClusterError as exc:
            if "too old resource version" not in str(exc) and "Expired" not in str(exc):
                raise

    def wait(self, name: str, timeout: float | None = None) -> DGXTrainingJob:
        """Until the job ends. Succeeded: the job. Failed: :class:`JobFailedError` with its reason
        and message. Deleted meanwhile: :class:`JobNotFoundError`. ``timeout`` (seconds) passed:
        :class:`WaitTimeoutError` (the job goes on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        path = _collection(JOB_KIND, self.namespace)
        while True:
            job = self.get(name)
            version = job.metadata.resource_version or ""
            if finished(job):
                return self._ended(job)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                phase = job.status.phase if job.status else "new"
                raise WaitTimeoutError(f"{name} has not ended after {timeout:g}s: it is {phase}")
            seconds = 300 if left is None else max(1, min(300, int(left) + 1))
            query = {"fieldSelector": f"metadata.name={name}", "resourceVersion": version}
            try:
                for event in self.api.watch(path, query, timeout_s=seconds):
                    if event.get("type") == "DELETED":
                        raise JobNotFoundError(f"{name} was deleted before it ended")
                    changed = _model(event["object"])
                    if finished(changed):
                        return self._ended(changed)
            except kubeclient.ClusterError as exc:
                if "too old resource version" not in str(exc) and "Expired" not in str(exc):
                    raise

    def _ended(self, job: DGXTrainingJob) -> DGXTrainingJob:
        if job.status and job.status.phase == JobPhase.SUCCEEDED:
            return job
        reason, message = ended_reason(job)
        raise JobFailedError(job.metadata.name, reason, message, job)

    # -- logs -------------------------------------------------------------------------------------

    def logs(
        self,
        name: str,
        *,
        rank: int = 0,
        all_ranks: bool = False,
        follow: bool = False,
        container: str = CONTAINER_NAME,
        tail: int | None = None,
    ) -> Iterator[LogLine]:
        """A worker's output (rank 0 by default; every rank with ``all_ranks``), line by line.

        ``follow``: as it comes, across restarts (a replaced worker's new pod is followed from its
        first line), until the job has ended and the last followed container with it."""
        if all_ranks:
            ranks = sorted({w.rank for w in self.workers(name) if w.rank is not None})
            if not ranks:
                job = self.get(name)
                ranks = list(range((job.spec.elastic.max_nodes if job.spec.elastic else None) or 1))
            if not follow:
                for r in ranks:
                    yield from self._rank_lines(name, r, container, tail, follow=False)
                return
            yield from _merged([self._rank_lines(name, r, container, tail, follow=True) for r in ranks])
            return
        yield from self._rank_lines(name, rank, container, tail, follow=follow)

    def _current(self, name: str, rank: int) -> Worker | None:
        mine = [w for w in self.workers(name) if w.rank == rank]
        return mine[-1] if mine else None

    def _rank_lines(self, name: str, rank: int, container: str, tail: int | None, *, follow: bool) -> Iterator[LogLine]:
        base = f"/api/v1/namespaces/{self.namespace}/pods"
        if not follow:
            worker = self._current(name, rank)
            if worker is None:
                self.get(name)  # JobNotFoundError when the job itself is gone
                raise ClientError(
                    f"{name} has no worker of rank {rank} now (kubedgx describe {name} shows its workers)"
                )
            query = {"container": container, **({"tailLines": str(tail)} if tail is not None else {})}
            text = self._log_text(f"{base}/{worker.name}/log", query, worker, container)
            for line in text.splitlines():
                yield LogLine(worker.name, rank, line, parse_event(line))
            return
        seen: set[tuple[str, int]] = set()
        first = True
        while True:
            worker = self._current(name, rank)
            key = (worker.uid or worker.name, worker.restarts) if worker else None
            if worker is not None and key not in seen and _has_output(worker):
                seen.add(key)  # type: ignore[arg-type]
                query = {"container": container, "follow": "true"}
                if first and tail is not None:
                    query["tailLines"] = str(tail)
                first = False
                try:
                    for line in self.api.lines(f"{base}/{worker.name}/log", query):
                        yield LogLine(worker.name, rank, line, parse_event(line))
                except kubeclient.InvalidError:
                    seen.discard(key)  # not started after all: look again
                except kubeclient.NotFoundError:
                    pass  # the pod went away under the stream
                continue
            job = self.get(name)
            if finished(job) and (worker is None or key in seen or not _has_output(worker)):
                return
            # A pod's change, or 5 s: the job's end (the operator's, a second or two after the
            # trainer's exit) is no change of a pod, and `logs -f` should not linger after it.
            self._wait_for_pods(name, 5)

    def _log_text(self, path: str, query: Mapping[str, str], worker: Worker, container: str) -> str:
        try:
            return self.api.text(path, query)
        except kubeclient.InvalidError as exc:
            raise ClientError(f"{worker.name} has no {container} output yet ({worker.state}): {exc}") from None

    def _wait_for_pods(self, name: str, seconds: int) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        self._next_change(path, {"labelSelector": f"{JOB_LABEL}={name}"}, seconds)

    # -- history, artifacts ---------------------------------------------------------------------

    def history(self, name: str) -> list[Point]:
        """Every progress report of the run so far, oldest first: what the Out mounts keep
        (``<source>/<job>-<uid8>/logs/history/``, uploaded by the checkpoint sidecar) merged with
        rank 0's current output. :class:`NothingToFetchError` when neither has any."""
        from dgx_api.history import merge, parse_lines

        job = self.get(name)
        segments: list[list[Point]] = []
        problems: list[str] = []
        mounts = self._out_mounts(job)
        for mount in mounts:
            try:
                segments += self._remote_history(job, mount)
            except ClientError as exc:
                problems.append(str(exc))
        try:  # a reader who may read the mounts but not list pods still gets what the mounts keep
            worker = self._current(name, 0)
        except kubeclient.ClusterError as exc:
            worker = None
            problems.append(f"the pods of {name}: {exc}")
        if worker is not None and _has_output(worker):
            try:
                path = f"/api/v1/namespaces/{self.namespace}/pods/{worker.name}/log"
                text = self.api.text(path, {"container": CONTAINER_NAME})
                segments.append(parse_lines(text.splitlines()))
            except kubeclient.ClusterError as exc:
                problems.append(f"{worker.name}: {exc}")
        points = merge([s for s in segments if s])
        if not points:
            why = "; ".join(problems) if problems else "no progress reported yet"
            if not mounts:
                why += " (without a direction: Out data mount nothing keeps the history once the pods are gone)"
            raise NothingToFetchError(f"{name}: no progress history: {why}")
        return points

    def _out_mounts(self, job: DGXTrainingJob) -> list[DGXDataMount]:
        found: list[DGXDataMount] = []
        for ref in job.spec.data_mounts:
            try:
                body = self.api.get(f"{_collection(MOUNT_KIND, self.namespace)}/{ref.name}")
            except kubeclient.ClusterError:
                continue
            try:
                mount = DGXDataMount.model_validate(body)
            except ValidationError:
                continue
            if mount.spec.direction == "Out":
                found.append(mount)
        return found

    def _remote_history(self, job: DGXTrainingJob, mount: DGXDataMount) -> list[list[Point]]:
        from dgx_api.history import HISTORY_DIR, parse_lines

        store = self._store(mount)
        base = store.location(logs_uri(JobIdentity.of(job), mount.spec))
        segments: list[list[Point]] = []
        objects = store.list(base.child(HISTORY_DIR))
        for obj in sorted(objects, key=lambda o: o.key):
            if obj.key.endswith(".jsonl"):
                text = store.read_text(base.child(HISTORY_DIR, obj.key), obj)
                segments.append(parse_lines(text.splitlines()))
        return segments

    def _store(self, mount: DGXDataMount) -> _Store:
        return _Store(mount, self._credentials(mount))

    def _credentials(self, mount: DGXDataMount) -> dict[str, str] | None:
        """The store's credentials: this process's environment when it has them (as the AWS and
        gcloud CLIs would use), else the mount's Secret if the user may read it, else None (the
        ambient chain decides)."""
        s3 = mount.spec.source.startswith("s3://")
        if (s3 and os.environ.get("AWS_ACCESS_KEY_ID")) or (
            not s3 and os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        ):
            return None
        ref = mount.spec.credentials_secret_ref
        if ref is None:
            return None
        try:
            secret = self.api.get(f"/api/v1/namespaces/{self.namespace}/secrets/{ref.name}")
        except kubeclient.ClusterError:
            return None
        return {k: base64.b64decode(v).decode("utf-8", errors="replace") for k, v in (secret.get("data") or {}).items()}

    def tensorboard_logs(self, name: str, logdir: Path) -> str:
        """The run's TensorBoard event files, as the checkpoint sidecar uploaded them to its Out mounts
        (``<source>/<job>-<uid8>/logs/runs``), into ``logdir``; says from where."""
        job = self.get(name)
        mounts = self._out_mounts(job)
        if not mounts:
            raise NothingToFetchError(
                f"{name} has no direction: Out data mount, so its TensorBoard logs lived in its pods only"
            )
        problems: list[str] = []
        for mount in mounts:
            uri = posixpath.join(logs_uri(JobIdentity.of(job), mount.spec), "runs")
            try:
                self._store(mount).download(uri, logdir / "runs")
                return uri
            except ClientError as exc:
                problems.append(str(exc))
        raise NothingToFetchError(f"{name}: no TensorBoard logs in its Out mounts: {'; '.join(problems)}")

    def artifacts(self, name: str) -> list[tuple[str, str, str | None]]:
        job = self.get(name)
        return [(a.name, a.uri, a.mount) for a in (job.status.artifacts if job.status else [])]

    def fetch(self, name: str, artifact: str | None = None, dest: str | Path = ".") -> Path:
        """Download an artifact of ``status.artifacts`` (by name; the adapter by default) from its
        Out mount into ``dest`` (a directory: ``dest/<artifact>``); returns where it landed."""
        job = self.get(name)
        listed = list(job.status.artifacts if job.status else [])
        if not listed:
            phase = job.status.phase if job.status else None
            why = (
                "it has not succeeded yet"
                if phase != JobPhase.SUCCEEDED
                else "nothing was archived (see its Archived condition)"
            )
            raise NothingToFetchError(f"{name} has no artifacts: {why}")
        names = [a.name for a in listed]
        if artifact is None:
            chosen = next((a for key in FETCH_ORDER for a in listed if a.name == key), listed[0])
        else:
            match = [a for a in listed if a.name == artifact]
            if not match:
                raise NothingToFetchError(f"{name} has no artifact {artifact!r}; it has: {', '.join(names)}")
            chosen = match[0]
        mount_name = chosen.mount or next((r.name for r in job.spec.data_mounts), None)
        if mount_name is None:
            raise NothingToFetchError(f"{name}: artifact {chosen.name} names no data mount to read it from")
        try:
            body = self.api.get(f"{_collection(MOUNT_KIND, self.namespace)}/{mount_name}")
        except kubeclient.NotFoundError:
            raise NothingToFetchError(
                f"{name}: the DGXDataMount {mount_name} its artifact {chosen.name} was archived to is gone; "
                f"read {chosen.uri} with your store's own tools"
            ) from None
        mount = DGXDataMount.model_validate(body)
        target = Path(dest) / chosen.name
        self._store(mount).download(chosen.uri, target)
        return target


def _has_output(worker: Worker) -> bool:
    """Whether the trainer container has started (or ended): only then has it a log to read."""
    return worker.state.startswith(("running", "terminated")) or worker.restarts > 0


def _worker(pod: Mapping[str, Any]) -> Worker:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    labels = meta.get("labels") or {}
    index = labels.get(INDEX_LABEL)
    trainer: dict[str, Any] = next(
        (c for c in status.get("containerStatuses") or [] if c.get("name") == CONTAINER_NAME), {}
    )
    state = trainer.get("state") or {}
    if "running" in state:
        shown = "running"
    elif "terminated" in state:
        done = state["terminated"]
        shown = f"terminated: {done.get('reason') or 'exit'} ({done.get('exitCode')})"
    elif "waiting" in state:
        shown = f"waiting: {state['waiting'].get('reason') or ''}".rstrip(": ")
    else:
        shown = "pending" if not spec.get("nodeName") else "starting"
    if meta.get("deletionTimestamp"):
        shown += ", terminating"
    if str(labels.get(JOB_LABEL, "")).endswith(DETACHED_SUFFIX):
        shown += ", detached"
    return Worker(
        name=str(meta.get("name")),
        rank=int(str(index)) if str(index or "").isdigit() else None,
        node=spec.get("nodeName"),
        phase=str(status.get("phase") or "Pending"),
        ready=bool(trainer.get("ready")),
        restarts=int(trainer.get("restartCount") or 0),
        attempt=labels.get("kubedgx.io/attempt"),
        state=shown,
        uid=meta.get("uid"),
        created=meta.get("creationTimestamp"),
    )


def _merged(streams: Sequence[Iterator[LogLine]]) -> Iterator[LogLine]:
    """Several followed streams as one, line by line as they come (a thread per stream)."""
    lines: queue.Queue[LogLine | BaseException | None] = queue.Queue(maxsize=1000)

    def pump(stream: Iterator[LogLine]) -> None:
        try:
            for line in stream:
                lines.put(line)
        except BaseException as exc:  # surfaced in the caller's thread
            lines.put(exc)
        finally:
            lines.put(None)

    threads = [threading.Thread(target=pump, args=(s,), daemon=True) for s in streams]
    for t in threads:
        t.start()
    running = len(threads)
    while running:
        item = lines.get()
        if item is None:
            running -= 1
        elif isinstance(item, BaseException):
            raise item
        else:
            yield item


def read_manifests(text: str | bytes, source: str) -> list[dict[str, Any]]:
    """The documents of a YAML stream (a ``List``'s items flattened); empty documents dropped."""
    found: list[dict[str, Any]] = []
    try:
        for obj in manifests.iter_documents(text):
            if obj is None:
                continue
            if (
                isinstance(obj, dict)
                and str(obj.get("kind", "")).endswith("List")
                and isinstance(obj.get("items"), list)
            ):
                found += [i for i in obj["items"] if isinstance(i, dict)]
            elif isinstance(obj, dict):
                found.append(obj)
            else:
                raise SubmitError(f"{source}: a document is not a mapping (kind, apiVersion, metadata, spec)")
    except manifests.ManifestError as exc:
        raise SubmitError(f"{source}: {exc}") from None
    return found


class _Store:
    """A mount's object store, through kubedgx-datasync (imported here: the rest of the client
    needs no store library)."""

    def __init__(self, mount: DGXDataMount, env: Mapping[str, str] | None) -> None:
        try:
            from dgx_datasync import store as datasync_store
        except ImportError:
            raise ClientError(
                "reading the job's data mount needs kubedgx-datasync: pip install 'kubedgx[client]'"
            ) from None
        self._mod = datasync_store
        self.mount = mount
        merged = {**os.environ, **env} if env is not None else None
        self.options = datasync_store.StoreOptions(
            endpoint_url=mount.spec.endpoint, region=mount.spec.region, env=merged
        )

    def location(self, uri: str) -> Any:
        return self._mod.parse_uri(uri)

    def list(self, loc: Any) -> list[Any]:
        from dgx_datasync.errors import SyncError

        try:
            return list(self._mod.Store(loc, self.options).list(loc))
        except SyncError as exc:
            raise ClientError(f"{loc.uri}: {exc}") from None

    def read_text(self, loc: Any, obj: Any) -> str:
        import tempfile

        from dgx_datasync.errors import SyncError

        with tempfile.TemporaryFile() as tmp:
            try:
                self._mod.Store(loc, self.options).download(loc, obj, tmp.fileno())
            except SyncError as exc:
                raise ClientError(f"{loc.uri}: {exc}") from None
            tmp.seek(0)
            return tmp.read().decode("utf-8", errors="replace")

    def download(self, uri: str, target: Path) -> None:
        """``uri`` (one object, or a prefix: every object under it) into ``target`` (a file, or a
        directory of the same layout). Written beside and renamed, so a broken download leaves no
        half file under the final name."""
        from dgx_datasync.errors import SyncError

        loc = self.location(uri)
        store = self._mod.Store(loc, self.options)
        try:
            single = store.head(loc)
            objects = [] if single is not None else store.list(loc)
        except SyncError as exc:
            raise ClientError(f"{uri}: {exc}") from None
        if single is None and not objects:
            raise NothingToFetchError(f"{uri}: nothing there (was it deleted from the store?)")
        if single is not None:
            todo = [(loc, single, target)]
        else:
            todo = [(loc.child(o.key), o, target.joinpath(*o.key.split("/"))) for o in objects]
        for where, obj, path in todo:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.partial")
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                store.download(where, obj, fd)
            except SyncError as exc:
                raise ClientError(f"{where.uri}: {exc}") from None
            finally:
                os.close(fd)
            os.replace(partial, path)


__all__ = [
    "Client",
    "Event",
    "LogLine",
    "MountState",
    "Submitted",
    "Worker",
    "condition",
    "ended_reason",
    "finished",
    "read_manifests",
]
