"""Why a worker failed, read from what the kubelet kept of it, and what to change.

A worker's failure reaches the operator as its container's exit code, the kubelet's reason
(``OOMKilled``, ``Error``) and its termination message. The built-in trainer writes the message
itself, starting with a cause it names (``LossDiverged: ...``, ``OutOfMemory: ...``,
``Interrupted: ...``); for any other program the kubelet falls back to the last 80 lines or 2 KiB
of its log (``terminationMessagePolicy: FallbackToLogsOnError``), which is where PyTorch and
torchrun print what went wrong. :func:`diagnose` turns those into a :class:`Diagnosis`: the
job's reason, a message that names the cause and the fix, and whether a restart of the same
config can cure it (the restart policy acts on that, see ``planner.restarts``).

What is recognised (docs/operator.md, "Failures, diagnosed"):

- ``OutOfMemory``: the trainer's own message, PyTorch's ``CUDA out of memory`` /
  ``torch.OutOfMemoryError`` text, or a container the kernel killed at its memory limit
  (``OOMKilled``, host memory). Permanent: the same batch on the same memory fails the same way.
- ``LossDiverged``: the trainer's own message (training.stopOnNonFiniteLoss). Permanent.
- ``NCCLTimeout``: PyTorch's collective watchdog line (``[Rank N] Watchdog caught collective
  operation timeout: WorkNCCL(...) ran for N milliseconds before timing out``). Transient: a slow
  or lost peer, a network hiccup.
- ``RendezvousTimeout``: torchrun's ``RendezvousTimeoutError`` (or the TCP store's ``Timed out
  ... waiting for clients``): not enough nodes joined in time. Transient.
- ``Interrupted``: the trainer saved a checkpoint on SIGTERM and stopped (each rank exits 143,
  torchrun then 1: only the message tells it from a crash); the cluster took the pod away. Not a
  failure of the program.
- anything else a torchrun program prints: the root-cause block of torchrun's summary (failed rank,
  exit code or signal, the error's last line) in place of torchrun's ``=====`` banner.

Pure: strings in, a value out; no client, no clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dgx_operator.api.vocabulary import JobReason

_OOM_TEXT = re.compile(r"CUDA out of memory|torch\.(?:cuda\.)?OutOfMemoryError|CUDA error: out of memory")
_WATCHDOG = re.compile(
    r"(?:\[Rank (?P<rank>\d+)\]\s*)?Watchdog caught collective operation timeout:\s*"
    r"(?:WorkNCCL\((?P<args>.*?)\)\s*)?ran for (?P<ms>\d+) milliseconds before timing out"
)
_OP_TYPE = re.compile(r"OpType=(\w+)")
_TIMEOUT_MS = re.compile(r"Timeout\(ms\)=(\d+)")
_RANK_PREFIX = re.compile(r"\[rank(\d+)\]:")
_RENDEZVOUS = re.compile(
    r"RendezvousTimeoutError|Timed out after \d+ seconds waiting for clients|"
    r"The node '[^']*' has failed to (?:join|complete) the rendezvous"
)
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):\s*\n(?P<block>.*)", re.S)
_FIELD = re.compile(r"^\s*(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s?(?P<value>.*)$")
_BANNER = re.compile(r"^[=\-]{10,}$")


@dataclass(frozen=True)
class Diagnosis:
    """A named cause: the job's reason, what happened and what to change, and whether running the
    same config again can go differently."""

    reason: str
    message: str
    #: True: a restart may well succeed (network, peers, capacity). False: the same config fails
    #: the same way, so a restart only burns GPU hours.
    transient: bool


@dataclass(frozen=True)
class Fields:
    """The job's settings a fix names, with their values (None: unknown or not set)."""

    memory: str | None = None
    per_device_batch_size: int | None = None
    max_seq_length: int | None = None
    gradient_checkpointing: bool | None = None
    collective_timeout_seconds: int | None = None
    builtin_trainer: bool = True


def diagnose(
    message: str | None, *, reason: str = "", exit_code: int | None = None, fields: Fields | None = None
) -> Diagnosis | None:
    """The cause of one worker's failure, or None when nothing here recognises it.

    ``message`` is the container's termination message, ``reason`` the kubelet's
    (``OOMKilled``...), ``exit_code`` the container's. The trainer's own first word wins over
    patterns found in log text: it knows what it raised."""
    fields = fields or Fields()
    text = message or ""
    word, _, rest = text.partition(":")
    own = word.strip()
    if own == JobReason.LOSS_DIVERGED:
        return Diagnosis(JobReason.LOSS_DIVERGED, rest.strip() or text, transient=False)
    if own == JobReason.OUT_OF_MEMORY:
        return Diagnosis(JobReason.OUT_OF_MEMORY, rest.strip() or text, transient=False)
    if own == JobReason.INTERRUPTED:
        return Diagnosis(JobReason.INTERRUPTED, rest.strip() or text, transient=True)
    if reason == "OOMKilled":
        return Diagnosis(JobReason.OUT_OF_MEMORY, _host_oom(fields, exit_code), transient=False)
    watchdog = _WATCHDOG.search(text)
    if watchdog is not None:
        return Diagnosis(JobReason.NCCL_TIMEOUT, _nccl(text, watchdog, fields), transient=True)
    if _OOM_TEXT.search(text):
        return Diagnosis(JobReason.OUT_OF_MEMORY, _cuda_oom(text, fields), transient=False)
    if _RENDEZVOUS.search(text):
        return Diagnosis(
            JobReason.RENDEZVOUS_TIMEOUT,
            "torchrun could not gather minNodes workers in its rendezvous before the join timeout "
            "(spec.elastic.rendezvous.joinTimeout): the other workers were not scheduled, not started, or "
            "cannot reach worker 0's rendezvous port; see the job's WorkersPending condition and the "
            "workers' events, or raise joinTimeout",
            transient=True,
        )
    return None


def summary(message: str | None) -> str:
    """One line that says how a worker ended, from its termination message: torchrun's root-cause
    block when there is one (``rank 1 (local_rank 0) exited with code 1: ValueError: boom``), else
    the last line that is not a banner. torchrun's summary ends in a line of ``=`` signs, which is
    all a naive last-line reader showed."""
    text = (message or "").strip()
    if not text:
        return ""
    root = root_cause(text)
    if root is not None:
        return root
    lines = [line.strip() for line in text.splitlines() if line.strip() and not _BANNER.match(line.strip())]
    return lines[-1][:300] if lines else ""


def root_cause(text: str) -> str | None:
    """torchrun's "Root Cause (first observed failure)" block as one line; None without one."""
    found = _ROOT_CAUSE.search(text)
    if found is None:
        return None
    values: dict[str, str] = {}
    traceback: list[str] = []
    in_traceback = False
    for line in found.group("block").splitlines():
        if _BANNER.match(line.strip()):
            break
        field = _FIELD.match(line)
        if field is not None and not in_traceback:
            values[field["key"]] = field["value"].strip()
            in_traceback = field["key"] == "traceback"
            if in_traceback and values["traceback"]:
                traceback.append(values["traceback"])
        elif in_traceback and line.strip():
            traceback.append(line.strip())
    rank = values.get("rank", "?").replace("(local_rank: ", "(local_rank ")
    exitcode = values.get("exitcode", "")
    code, _, rest = exitcode.partition(" (pid")
    signal = re.search(r"\)\s*\((SIG\w+)\)", exitcode) or re.search(r"\b(SIG[A-Z]+)\b", rest)
    text_out = f"rank {rank} exited with code {code.strip() or '?'}"
    if signal is not None:
        text_out += f" ({signal.group(1)})"
    if "host" in values:
        text_out += f" on {values['host']}"
    error = _last_error(traceback)
    if error:
        text_out += f": {error}"
    return text_out[:400]


def _last_error(traceback: list[str]) -> str:
    """The error line of a traceback (its last line); torchrun's placeholder when the program did
    not record one says where to look instead."""
    if not traceback:
        return ""
    last = traceback[-1]
    if last.startswith("To enable traceback"):
        return (
            "no Python traceback recorded (see the worker's log, or decorate the program's main with "
            "torch.distributed.elastic.multiprocessing.errors.record)"
        )
    return last[:300]


def _host_oom(fields: Fields, exit_code: int | None) -> str:
    memory = f" (now {fields.memory})" if fields.memory else ""
    tuning = (
        "lower training.dataloaderWorkers or dataset.tokenizationProcesses, or training.perDeviceBatchSize"
        if fields.builtin_trainer
        else "make the program use less host memory (fewer data-loader workers, smaller prefetch)"
    )
    code = f" (exit code {exit_code})" if exit_code is not None else ""
    return (
        f"the container went over its host memory limit and the kernel killed it{code}; "
        f"raise spec.resources.memory{memory} or {tuning}"
    )


def _cuda_oom(text: str, fields: Fields) -> str:
    line = next((ln.strip() for ln in reversed(text.splitlines()) if _OOM_TEXT.search(ln)), "CUDA out of memory")
    rank = _RANK_PREFIX.search(text)
    where = f"rank {rank.group(1)}: " if rank else ""
    if fields.builtin_trainer:
        fix = (
            f"lower training.perDeviceBatchSize{_now(fields.per_device_batch_size)} or "
            f"training.maxSeqLength{_now(fields.max_seq_length)}, or turn on training.gradientCheckpointing"
            f"{_now(fields.gradient_checkpointing)}"
        )
    else:
        fix = "lower the per-device batch size or sequence length, or turn on gradient checkpointing, in the program"
    return f"{where}GPU out of memory ({line[:200]}); {fix}"


def _nccl(text: str, found: re.Match[str], fields: Fields) -> str:
    rank = found["rank"]
    if rank is None:
        prefix = _RANK_PREFIX.search(text[: found.start()][-300:])
        rank = prefix.group(1) if prefix else None
    args = found["args"] or ""
    op = _OP_TYPE.search(args)
    timeout = _TIMEOUT_MS.search(args)
    ran = int(found["ms"]) / 1000
    what = f"a collective {op.group(1)}" if op else "a collective operation"
    who = f"rank {rank}: " if rank is not None else ""
    limit = f" (timeout {int(timeout.group(1)) // 1000} s)" if timeout else ""
    if fields.builtin_trainer:
        knob = f"raise training.collectiveTimeoutSeconds{_now(fields.collective_timeout_seconds)}"
    else:
        knob = "raise the program's collective timeout (init_process_group(timeout=...))"
    return (
        f"{who}{what} did not complete in {ran:.0f} s{limit}: a peer was slow, stuck or gone, or the network "
        f"between nodes failed. Restarted; if it recurs, {knob} when a step legitimately takes that long "
        "(a slow first load, a long evaluation on one rank), or check the nodes' network with spec.debug.enabled "
        "(NCCL_DEBUG=INFO)"
    )


def _now(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return f" (now {'on' if value else 'off'})"
    return f" (now {value})"
