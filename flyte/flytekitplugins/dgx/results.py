"""What the connector leaves at a task's output prefix when its job has ended, before it answers.

Propeller (v1.16.8) shows a task's deck only when the task succeeds and ``<output prefix>/deck.html``
exists in the round it sees SUCCEEDED, and only for outputs it reads from the output prefix: for
outputs a connector returns in memory it never finds a deck (docs/research/flyte-propeller.md, 4.3).
So, once the job has succeeded or failed, and before ``get`` answers:

- the QLoRA task's outputs go to ``<output prefix>/outputs.pb`` (a LiteralMap, as flytekit's
  TypeEngine encodes them) and ``get`` answers without outputs, as for a function task, whose
  rank 0 wrote its outputs.pb. flytekit's local loop (``AsyncConnectorExecutorMixin.execute``,
  ``pyflyte run``) reads ``outputs.pb`` from the output prefix when the answer has none, so a
  local run gets the adapter the same way;
- ``<output prefix>/deck.html`` (:mod:`flytekitplugins.dgx.deck`), unless one is there already:
  a deck the task wrote itself (``enable_deck=True``, rank 0's pyflyte-execute) wins.

Both through flytekit's FileAccessProvider, with the connector's own blob-store access
(``FLYTE_AWS_*`` and the like). The deck's loss curve is the job's progress history as
``kubedgx plot`` reads it (:meth:`dgx_operator.client.Client.history`: the Out mounts'
``logs/history/*.jsonl`` through kubedgx-datasync, and rank 0's log), with the connector's cluster
credentials (``KUBEDGX_FLYTE_KUBECONFIG``/``KUBEDGX_FLYTE_CONTEXT``, else in-cluster, else
``KUBECONFIG``).

Nothing here changes a task's phase: a write that fails or takes too long is a warning in the
connector's log. Then the QLoRA task's outputs stay in memory (Flyte gets the adapter, and shows no
deck), and the task has no deck. Each file is written once per job and process (GetTask is polled).
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from dgx_api.history import Point
from dgx_operator.api.vocabulary import JobPhase
from dgx_operator.client import Client, ClientError, NothingToFetchError, kubeclient
from flytekitplugins.dgx.deck import render

log = logging.getLogger(__name__)

DECK_FILE: Final = "deck.html"
OUTPUTS_FILE: Final = "outputs.pb"
ERROR_FILE: Final = "error.pb"
#: Seconds each step may take (a blob-store call, the history read), and all of them together:
#: propeller waits 30 s for GetTask (connector-service defaultTimeout).
WRITE_TIMEOUT_S: Final = 8.0
HISTORY_TIMEOUT_S: Final = 10.0
BUDGET_S: Final = 20.0
#: How many (job, file) pairs the process remembers as written.
REMEMBERED: Final = 4096

_written: dict[tuple[str, str, str, str], None] = {}  # insertion-ordered: the oldest are forgotten first

T = TypeVar("T")


def finished(job: Mapping[str, Any] | None) -> bool:
    return job is not None and (job.get("status") or {}).get("phase") in JobPhase.TERMINAL


def uri_of(prefix: str, file: str) -> str:
    return f"{prefix.rstrip('/')}/{file}"


def _key(job: Mapping[str, Any], file: str) -> tuple[str, str, str, str]:
    meta = job.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or ""), file)


def _remember(key: tuple[str, str, str, str]) -> None:
    _written[key] = None
    while len(_written) > REMEMBERED:
        del _written[next(iter(_written))]


# -- the cluster: the job's history -----------------------------------------------------------------


def cluster() -> kubeclient.Client:
    """The cluster the connector creates jobs in, chosen as ``connector._api`` chooses it."""
    path = os.environ.get("KUBEDGX_FLYTE_KUBECONFIG") or None
    context = os.environ.get("KUBEDGX_FLYTE_CONTEXT") or None
    if path is None and context is None:
        pod = kubeclient.in_cluster()
        if pod is not None:
            return pod
    return kubeclient.load(path, context)


def history(job: Mapping[str, Any]) -> tuple[list[Point], str | None]:
    """(the job's progress history, why it is empty when it is): ``kubedgx plot``'s reading of it."""
    meta = job.get("metadata") or {}
    name = str(meta.get("name") or "")
    try:
        return Client(namespace=str(meta.get("namespace") or ""), api=cluster()).history(name), None
    except NothingToFetchError as exc:
        return [], str(exc)
    except ClientError as exc:
        return [], f"the history could not be read: {exc}"
    except Exception as exc:  # a store library's own error: the page says it, the task goes on
        log.warning("%s: reading the progress history failed", name, exc_info=True)
        return [], f"the history could not be read ({type(exc).__name__}: {exc})"


# -- the blob store, through flytekit ----------------------------------------------------------------


def _file_access() -> Any:
    from flytekit.core.context_manager import FlyteContextManager

    return FlyteContextManager.current_context().file_access


def exists(uri: str) -> bool:
    return bool(_file_access().exists(uri))


def put(uri: str, data: bytes, content_type: str | None = None) -> None:
    """``data`` to ``uri`` (any store flytekit reaches: s3://, gs://, abfs://, a local path)."""
    access = _file_access()
    kwargs: dict[str, str] = {}
    if content_type and uri.startswith("s3://"):
        kwargs["ContentType"] = content_type  # as flytekit's own deck upload sets it
    elif content_type and uri.startswith("gs://"):
        kwargs["content_type"] = content_type
    with tempfile.TemporaryDirectory(prefix="kubedgx-flyte-") as folder:
        local = os.path.join(folder, uri.rsplit("/", 1)[-1] or "data")
        with open(local, "wb") as fh:
            fh.write(data)
        access.put_data(local, uri, **kwargs)


def literal_map(values: Mapping[str, str]) -> bytes:
    """``values`` (name -> a ``str`` output) as the LiteralMap bytes flytekit writes to outputs.pb."""
    from flytekit.core.context_manager import FlyteContextManager
    from flytekit.core.type_engine import TypeEngine

    ctx = FlyteContextManager.current_context()
    model = TypeEngine.dict_to_literal_map(ctx, dict(values), dict.fromkeys(values, str))
    data: bytes = model.to_flyte_idl().SerializeToString()
    return data


async def _bounded(seconds: float, deadline: float | None, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a thread (flytekit's file access and the history read block), for at most
    ``seconds`` and not past ``deadline`` (the loop's time): TimeoutError after that (the thread
    finishes by itself)."""
    if deadline is not None:
        seconds = min(seconds, deadline - asyncio.get_running_loop().time())
        if seconds <= 0:
            raise TimeoutError
    return await asyncio.wait_for(asyncio.to_thread(fn, *args), seconds)


def _why(exc: BaseException) -> str:
    """The root cause, in a line: flytekit wraps the store's error in its own (FlyteUploadDataException)."""
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    while exc.__cause__ is not None:
        exc = exc.__cause__
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


# -- what get calls ---------------------------------------------------------------------------------


async def write_outputs(
    prefix: str, job: Mapping[str, Any], values: Mapping[str, str], deadline: float | None = None
) -> bool:
    """``values`` to ``<prefix>/outputs.pb``; whether they are there (else: answer with them in memory)."""
    key = _key(job, OUTPUTS_FILE)
    if key in _written:
        return True
    uri = uri_of(prefix, OUTPUTS_FILE)
    try:
        await _bounded(WRITE_TIMEOUT_S, deadline, put, uri, literal_map(values))
    except Exception as exc:
        log.warning(
            "%s: writing %s failed (%s): the outputs go to Flyte in the answer instead, and Flyte shows no deck "
            "for the task; give the connector write access to Flyte's blob store",
            key[1], uri, _why(exc),
        )  # fmt: skip
        return False
    _remember(key)
    return True


async def write_deck(prefix: str, job: Mapping[str, Any], deadline: float | None = None) -> str | None:
    """The job's deck to ``<prefix>/deck.html`` unless one is there; what became of it (None: it failed)."""
    key = _key(job, DECK_FILE)
    if key in _written:
        return "written before"
    uri = uri_of(prefix, DECK_FILE)
    try:
        if await _bounded(WRITE_TIMEOUT_S, deadline, exists, uri):
            _remember(key)
            return "kept: one is there already (the task's own)"
        try:
            # What is left for the page's own write stays free of it.
            points, note = await _bounded(HISTORY_TIMEOUT_S, None if deadline is None else deadline - 3, history, job)
        except TimeoutError:
            points, note = [], "the history was not read in time (the Out mount's store or the cluster did not answer)"
        page = render(job, points, history_note=note).encode()
        await _bounded(WRITE_TIMEOUT_S, deadline, put, uri, page, "text/html")
    except Exception as exc:
        log.warning("%s: writing the deck to %s failed (%s); the task goes on without it", key[1], uri, _why(exc))
        return None
    _remember(key)
    log.info("%s: deck written to %s (%d points of history)", key[1], uri, len(points))
    return "written"


def remove(uri: str) -> bool:
    """Delete ``uri`` if it is there; whether it was."""
    fs = _file_access().get_filesystem_for_path(uri)
    if not fs.exists(uri):
        return False
    fs.rm(uri)
    return True


async def clear_stale_error(prefix: str, job: Mapping[str, Any], deadline: float | None = None) -> None:
    """A succeeded function task's ``error.pb`` is an earlier run's: a worker that failed, then the
    job restarted it (its restart policy) and the next run succeeded. Propeller reads error.pb
    before outputs.pb and would fail the task with the old error, so it goes."""
    key = _key(job, ERROR_FILE)
    if key in _written:
        return
    uri = uri_of(prefix, ERROR_FILE)
    try:
        if await _bounded(WRITE_TIMEOUT_S, deadline, remove, uri):
            log.info("%s: removed %s, left by a run the job restarted: the job succeeded", key[1], uri)
    except Exception as exc:
        log.warning(
            "%s: removing %s, left by a run the job restarted, failed (%s): Flyte will report the succeeded task "
            "failed with that run's error; give the connector write access to Flyte's blob store",
            key[1], uri, _why(exc),
        )  # fmt: skip
        return
    _remember(key)


async def leave(
    prefix: str, job: Mapping[str, Any] | None, outputs: Mapping[str, str] | None, *, function_task: bool = False
) -> Any:
    """What ``get`` does once the job has ended: a restarted run's error.pb removed (a succeeded
    function task), the outputs to outputs.pb and the deck, in that order. Returns the outputs to
    answer with: None once outputs.pb holds them."""
    if not prefix or job is None or not finished(job):
        return outputs
    deadline = asyncio.get_running_loop().time() + BUDGET_S
    if function_task and (job.get("status") or {}).get("phase") == JobPhase.SUCCEEDED:
        await clear_stale_error(prefix, job, deadline)
    if outputs and await write_outputs(prefix, job, outputs, deadline):
        outputs = None
    await write_deck(prefix, job, deadline)
    return outputs
