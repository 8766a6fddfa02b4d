"""The words of status: phases, condition types and reasons, each declared once.

They are public API. ``kubectl wait --for=condition=Finished`` names a condition type, Prometheus
series carry phases and reasons as labels, the Flyte plugin and Argo CD's health check branch on
them, and docs/troubleshooting.md is indexed by them. So none of them is spelled anywhere else:
the planners, the controllers, the metrics and the Flyte plugin import them from here, and the
phase and reason tables of docs/operator.md are generated from :data:`REASONS`
(``python -m dgx_operator.api.vocabulary``; a test fails when the page drifts).

Adding a reason is one line below (its name, the phase it belongs to, where it shows and what it
means) plus the decision that uses it. Phases are ``Literal`` types as well as constants because
the CRD's schema enumerates them; a test keeps the constants and the ``Literal`` in step.

The constants are plain ``str``: they go into pydantic models, JSON and YAML as they are (a
``StrEnum`` member would not survive ``yaml.safe_dump``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, get_args

from dgx_api.text import printable
from dgx_operator.api.common import BUDGET_KIND, JOB_KIND, MOUNT_KIND

__all__ = [
    "JOB_PHASES",
    "MOUNT_PHASES",
    "REASONS",
    "BudgetCondition",
    "BudgetReason",
    "JobCondition",
    "JobPhase",
    "JobReason",
    "MountCondition",
    "MountPhase",
    "MountPhaseName",
    "MountReason",
    "PhaseName",
    "Reason",
    "reasons_of",
]

#: A DGXTrainingJob's ``status.phase`` (the CRD's enum).
PhaseName = Literal["Pending", "WaitingForData", "Running", "Restarting", "Suspended", "Succeeded", "Failed"]
#: A DGXDataMount's ``status.phase`` (the CRD's enum).
MountPhaseName = Literal["Pending", "Syncing", "Ready", "Failed"]

JOB_PHASES: Final[tuple[PhaseName, ...]] = get_args(PhaseName)
MOUNT_PHASES: Final[tuple[MountPhaseName, ...]] = get_args(MountPhaseName)

JOB: Final = JOB_KIND
MOUNT: Final = MOUNT_KIND
BUDGET: Final = BUDGET_KIND


class JobPhase:
    """A DGXTrainingJob's phases, with what each means (the first column of docs/operator.md)."""

    PENDING: Final = "Pending"
    WAITING_FOR_DATA: Final = "WaitingForData"
    RUNNING: Final = "Running"
    RESTARTING: Final = "Restarting"
    SUSPENDED: Final = "Suspended"
    SUCCEEDED: Final = "Succeeded"
    FAILED: Final = "Failed"
    #: The phases a job never leaves.
    TERMINAL: Final = (SUCCEEDED, FAILED)
    MEANING: Final[dict[str, str]] = {
        WAITING_FOR_DATA: "a referenced DGXDataMount is missing or not Ready yet (only before the first start)",
        PENDING: "workers created, fewer than minNodes running yet",
        RUNNING: (
            "at least minNodes workers run (a worker whose trainer has exited while its pod's phase has not "
            "been written yet still counts: its phase decides, the message says `N exited (pod ending)`)"
        ),
        RESTARTING: "was running, now below minNodes: lost or failed workers are being recreated",
        SUSPENDED: "`spec.suspend: true`, or Kueue holds the job: no workers, the job is kept",
        SUCCEEDED: "worker 0 exited 0",
        FAILED: "see the reason",
    }


class MountPhase:
    """A DGXDataMount's phases."""

    PENDING: Final = "Pending"
    SYNCING: Final = "Syncing"
    READY: Final = "Ready"
    FAILED: Final = "Failed"
    MEANING: Final[dict[str, str]] = {
        PENDING: "not looked at yet",
        SYNCING: "the operator is listing the source (In) or checking the destination writable (Out)",
        READY: "listed (In: `status.objects`, `status.totalBytes`, `status.manifestDigest`) or writable (Out)",
        FAILED: "a permanent store error: the reason names it and the message the fix",
    }


class JobCondition:
    """A DGXTrainingJob's condition types (``kubectl wait --for=condition=<type>``)."""

    RUNNING: Final = "Running"
    RESTARTING: Final = "Restarting"
    SUSPENDED: Final = "Suspended"
    SUCCEEDED: Final = "Succeeded"
    FAILED: Final = "Failed"
    #: True once the job is Succeeded or Failed, with that condition's reason; False before, its
    #: reason the phase. Kueue's Workload says the same with its own ``Finished``.
    FINISHED: Final = "Finished"
    DATA_READY: Final = "DataReady"
    #: True while a ResourceQuota refuses workers (they cannot even be created).
    WORKERS_PENDING: Final = "WorkersPending"
    #: Whether the final model reached the job's direction: Out mounts (set when the job succeeds).
    ARCHIVED: Final = "Archived"


class MountCondition:
    """A DGXDataMount's condition types."""

    READY: Final = "Ready"


class BudgetCondition:
    """A DGXBudget's condition types."""

    #: Whether this operator counts the budget (and holds runs for it).
    READY: Final = "Ready"


@dataclass(frozen=True)
class Reason:
    """One reason the operator writes: which kind, the phase it belongs to, where it shows, and what
    it means (the docs' wording). ``phase`` is None for a reason that is not about the phase (a
    condition beside it, or an event)."""

    name: str
    kind: str
    phase: str | None
    shows: str
    meaning: str
    #: Passed on from another component (the kubelet, Kueue, the data plane), not chosen here.
    relayed: bool = False


#: Every reason, by (kind, name). Filled by the declarations below, in their order.
REASONS: dict[tuple[str, str], Reason] = {}


def _reason(kind: str, name: str, phase: str | None, shows: str, meaning: str, *, relayed: bool = False) -> str:
    if (kind, name) in REASONS:
        raise ValueError(f"{kind} reason {name!r} declared twice")
    REASONS[kind, name] = Reason(name, kind, phase, shows, meaning, relayed)
    return name


def _job(name: str, phase: str | None, shows: str, meaning: str, *, relayed: bool = False) -> str:
    return _reason(JOB, name, phase, shows, meaning, relayed=relayed)


def _mount(name: str, phase: str | None, shows: str, meaning: str, *, relayed: bool = False) -> str:
    return _reason(MOUNT, name, phase, shows, meaning, relayed=relayed)


_P = JobPhase
_RUNNING_COND = "Running"
_ENDED = "Running, Finished and the terminal condition"


class JobReason:
    """A DGXTrainingJob's reasons: one line each, the phase it belongs to first."""

    # fmt: off
    # -- WaitingForData
    DATA_NOT_READY: Final = _job("DataNotReady", _P.WAITING_FOR_DATA, "Running, DataReady", "a referenced mount is missing or not Ready yet")
    # -- Pending
    WORKERS_PENDING: Final = _job("WorkersPending", _P.PENDING, _RUNNING_COND, "workers created, waiting for their turn (scheduling, image pulls, start-up)")
    UNSCHEDULABLE: Final = _job("Unschedulable", _P.PENDING, _RUNNING_COND, "the scheduler found no node; the message carries its words", relayed=True)
    QUOTA_EXCEEDED: Final = _job("QuotaExceeded", _P.PENDING, "Running, WorkersPending, event", "a ResourceQuota refused a worker; tried again every 30 s")
    IMAGE_PULL_BACK_OFF: Final = _job("ImagePullBackOff", _P.PENDING, _RUNNING_COND, "the kubelet backs off pulling an image (missing, or the registry is down): waits", relayed=True)
    ERR_IMAGE_PULL: Final = _job("ErrImagePull", _P.PENDING, _RUNNING_COND, "the kubelet's last image pull failed: waits", relayed=True)
    CREATE_CONTAINER_CONFIG_ERROR: Final = _job("CreateContainerConfigError", _P.PENDING, _RUNNING_COND, "a Secret or ConfigMap the container needs is missing: waits", relayed=True)
    CREATE_CONTAINER_ERROR: Final = _job("CreateContainerError", _P.PENDING, _RUNNING_COND, "the runtime could not create the container: waits", relayed=True)
    RUN_CONTAINER_ERROR: Final = _job("RunContainerError", _P.PENDING, _RUNNING_COND, "the runtime could not start the container: waits", relayed=True)
    CRASH_LOOP_BACK_OFF: Final = _job("CrashLoopBackOff", _P.PENDING, _RUNNING_COND, "a container the kubelet restarts (a sidecar) keeps failing: waits", relayed=True)
    # -- Running
    ALL_WORKERS_RUNNING: Final = _job("AllWorkersRunning", _P.RUNNING, _RUNNING_COND, "every desired worker runs")
    ELASTIC_MINIMUM_RUNNING: Final = _job("ElasticMinimumRunning", _P.RUNNING, _RUNNING_COND, "at least minNodes workers run, the rest are pending")
    FINISHING: Final = _job("Finishing", _P.RUNNING, _RUNNING_COND, "worker 0 completed; waiting for the workers that archive the model to end")
    # -- Restarting
    NODES_BELOW_MINIMUM: Final = _job("NodesBelowMinimum", _P.RESTARTING, "Running, Restarting", "was running, now below minNodes: workers are being recreated")
    # -- Suspended (spec.suspend, or Kueue holds the job)
    SUSPENDED: Final = _job("Suspended", _P.SUSPENDED, "Running, Suspended", "`spec.suspend: true`: workers deleted, the job is kept")
    QUEUED: Final = _job("Queued", _P.SUSPENDED, "Running, Suspended", "waiting for Kueue to admit the job's Workload (or Kueue's reason was not a valid one)")
    QUOTA_RESERVED: Final = _job("QuotaReserved", _P.SUSPENDED, "Running, Suspended", "Kueue reserved quota, its admission checks are pending")
    KUEUE_NOT_INSTALLED: Final = _job("KueueNotInstalled", _P.SUSPENDED, "Running, Suspended", "the job names a LocalQueue but the cluster serves no Kueue API")
    PRIORITY_CLASS_NOT_FOUND: Final = _job("PriorityClassNotFound", _P.SUSPENDED, "Running, Suspended", "the job's priority names a WorkloadPriorityClass or PriorityClass that does not exist")
    WORKLOAD_RECREATED: Final = _job("WorkloadRecreated", _P.SUSPENDED, "Running, Suspended", "the job's shape changed: its old Workload goes, a new one is queued")
    EVICTED: Final = _job("Evicted", _P.SUSPENDED, "Running, Suspended", "Kueue evicted the Workload (its own reason, such as Preempted, when it gives one)", relayed=True)
    FLAVOR_UNKNOWN: Final = _job("FlavorUnknown", _P.SUSPENDED, "Running, Suspended", "Kueue admitted the job on a ResourceFlavor the operator cannot see")
    DEACTIVATED: Final = _job("Deactivated", _P.SUSPENDED, "Running, Suspended", "Kueue deactivated the Workload")
    BUDGET_EXCEEDED: Final = _job("BudgetExceeded", _P.SUSPENDED, "Running, Suspended, event", "the run's worst case (nodes x GPUs x price x maxDuration) does not fit a DGXBudget of the namespace; the message names it and its numbers; starts when the budget is raised, a run ends or the period rolls (docs/cost.md)")
    # -- Succeeded
    COMPLETED: Final = _job("Completed", _P.SUCCEEDED, _ENDED, "worker 0 exited 0")
    # -- Failed
    WORKER_FAILED: Final = _job("WorkerFailed", _P.FAILED, _ENDED, "a worker failed and the restart policy does not retry it (Never, or an exit code not in retryableExitCodes)")
    BACKOFF_LIMIT_EXCEEDED: Final = _job("BackoffLimitExceeded", _P.FAILED, _ENDED, "a worker failed once more than backoffLimit allows")
    LOSS_DIVERGED: Final = _job("LossDiverged", _P.FAILED, _ENDED, "the built-in trainer stopped: its loss was NaN or infinite for training.stopOnNonFiniteLoss reports in a row; a restart would diverge again")
    OUT_OF_MEMORY: Final = _job("OutOfMemory", _P.FAILED, _ENDED, "a worker ran out of GPU memory (CUDA out of memory) or host memory (OOMKilled at its memory limit); the message names the fields to change; not restarted by default, the same config runs out again")
    NCCL_TIMEOUT: Final = _job("NCCLTimeout", _P.FAILED, _ENDED, "a collective operation timed out (PyTorch's watchdog), on the rank the message names; restarted under OnFailure and ExitCode (a slow or lost peer, the network), ends the job under Never or past backoffLimit")
    RENDEZVOUS_TIMEOUT: Final = _job("RendezvousTimeout", _P.FAILED, _ENDED, "torchrun could not gather minNodes workers before the rendezvous join timeout; restarted like NCCLTimeout")
    STALLED: Final = _job("Stalled", _P.FAILED, _ENDED, "worker 0 reported no progress for spec.maxIdle while running; restarted under OnFailure and ExitCode (counted), ends the job under Never or past backoffLimit")
    INVALID_TRAINER_INPUT: Final = _job("InvalidTrainerInput", _P.FAILED, _ENDED, "the built-in trainer exited 2: it refused its config, data or model, which no restart changes")
    DEADLINE_EXCEEDED: Final = _job("DeadlineExceeded", _P.FAILED, _ENDED, "the job ran longer than spec.maxDuration")
    PENDING_TIMEOUT: Final = _job("PendingTimeout", _P.FAILED, _ENDED, "fewer than minNodes workers ran for spec.maxPending")
    DATA_MOUNT_FAILED: Final = _job("DataMountFailed", _P.FAILED, "Running, DataReady, Finished, Failed", "a referenced DGXDataMount failed")
    FOREIGN_OBJECT: Final = _job("ForeignObject", _P.FAILED, _ENDED, "an object at one of the job's names belongs to another owner")
    INVALID_SPEC: Final = _job("InvalidSpec", _P.FAILED, _ENDED, "a spec only the cluster can check is wrong (an unknown instance, outputs into an input mount); also a Warning event on a stored spec the model refuses, and Kueue's hold of such a job")
    CREATE_REFUSED: Final = _job("CreateRefused", _P.FAILED, _ENDED, "the apiserver refused a child for good (invalid, or denied by an admission plugin)")
    INVALID_IMAGE_NAME: Final = _job("InvalidImageName", _P.FAILED, _ENDED, "the container runtime refuses the image reference", relayed=True)
    ERR_IMAGE_NEVER_PULL: Final = _job("ErrImageNeverPull", _P.FAILED, _ENDED, "`imagePullPolicy: Never` and the image is not on the node", relayed=True)
    # -- conditions beside the phase
    NOT_RESTARTING: Final = _job("NotRestarting", None, "Restarting", "the job is not restarting")
    NOT_SUSPENDED: Final = _job("NotSuspended", None, "Suspended", "the job is not suspended")
    NOT_SUCCEEDED: Final = _job("NotSucceeded", None, "Succeeded", "the job ended Failed")
    NOT_FAILED: Final = _job("NotFailed", None, "Failed", "the job ended Succeeded")
    DATA_READY: Final = _job("DataReady", None, "DataReady", "every referenced DGXDataMount is Ready")
    WORKERS_CREATED: Final = _job("WorkersCreated", None, "WorkersPending", "every worker the job needs exists again after a quota refusal")
    ARCHIVED: Final = _job("Archived", None, "Archived, event", "the final model reached the job's Out mounts (status.artifacts lists it)")
    ARCHIVE_FAILED: Final = _job("ArchiveFailed", None, "Archived, event", "no uploader reported an archive; the message says why")
    # -- events
    WORKER_RESTARTED: Final = _job("WorkerRestarted", None, "event", "a worker's program failed; replaced, counted against backoffLimit")
    WORKER_DISRUPTED: Final = _job("WorkerDisrupted", None, "event", "the cluster disrupted a worker (eviction, preemption, node shutdown); replaced, not counted")
    WORKER_REPLACED: Final = _job("WorkerReplaced", None, "event", "an interactive (debug) worker exited; replaced, not counted")
    INTERRUPTED: Final = _job("Interrupted", None, "event", "the built-in trainer saved a checkpoint on a SIGTERM the operator did not send (a node shutdown, the kubelet) and stopped, its termination message starting Interrupted; replaced, not counted")
    WORKER_LOST: Final = _job("WorkerLost", None, "event", "workers vanished without the operator deleting them (node loss, spot reclaim); replaced, not counted")
    CREATE_FAILED: Final = _job("CreateFailed", None, "event", "creating a child failed for a reason retrying may heal")
    WORKLOAD_WRITE_FAILED: Final = _job("WorkloadWriteFailed", None, "event", "a write to the job's Kueue Workload failed; retried")
    USAGE: Final = _job("Usage", None, "event", "the job ended and its last worker let go of its node: the GPU-hours, cost and spot savings of the whole job (status.usage)")

    # fmt: on

    #: Why a worker was replaced (kubedgx_worker_restarts_total's reason).
    RESTARTS: Final = (WORKER_RESTARTED, WORKER_DISRUPTED, WORKER_REPLACED, WORKER_LOST, INTERRUPTED)
    #: The kubelet's waiting reasons that waiting cannot heal: the job ends with them.
    PERMANENT_WAITING: Final = frozenset({INVALID_IMAGE_NAME, ERR_IMAGE_NEVER_PULL})
    #: The kubelet's waiting reasons worth reporting while a worker is not running yet (the others, such
    #: as ContainerCreating and PodInitializing, are the normal path).
    REPORTED_WAITING: Final = frozenset(
        {
            *PERMANENT_WAITING,
            ERR_IMAGE_PULL,
            IMAGE_PULL_BACK_OFF,
            CREATE_CONTAINER_CONFIG_ERROR,
            CREATE_CONTAINER_ERROR,
            RUN_CONTAINER_ERROR,
            CRASH_LOOP_BACK_OFF,
        }
    )


class MountReason:
    """A DGXDataMount's reasons. Its failures are the data plane's (dgx_datasync.errors.Reason),
    relayed as they are; a test keeps the two lists equal."""

    # fmt: off
    SYNCING: Final = _mount("Syncing", MountPhase.SYNCING, "Ready", "listing the source (In) or checking the destination (Out); a transient store error keeps it here and retries")
    LISTED: Final = _mount("Listed", MountPhase.READY, "Ready", "an In mount's source was listed")
    WRITABLE: Final = _mount("Writable", MountPhase.READY, "Ready", "an Out mount's destination is writable")
    READY: Final = _mount("Ready", None, "event", "the mount became Ready, or its listing changed")
    IN_USE: Final = _mount("InUse", None, "event", "deleting the mount waits for the running jobs that use it")
    INVALID_SPEC: Final = _mount("InvalidSpec", None, "event", "the stored spec is one the model refuses")
    # -- Failed: the data plane's reasons
    INVALID_URI: Final = _mount("InvalidURI", MountPhase.FAILED, "Ready", "the source or destination is not an s3:// or gs:// URI the data plane takes", relayed=True)
    CREDENTIALS_MISSING: Final = _mount("CredentialsMissing", MountPhase.FAILED, "Ready", "the credentials Secret or its keys are missing", relayed=True)
    CREDENTIALS_INVALID: Final = _mount("CredentialsInvalid", MountPhase.FAILED, "Ready", "the store refused the credentials", relayed=True)
    ACCESS_DENIED: Final = _mount("AccessDenied", MountPhase.FAILED, "Ready", "the credentials may not read (In) or write (Out) there", relayed=True)
    BUCKET_NOT_FOUND: Final = _mount("BucketNotFound", MountPhase.FAILED, "Ready", "the bucket does not exist", relayed=True)
    UNREACHABLE: Final = _mount("Unreachable", MountPhase.SYNCING, "Ready", "the store could not be reached (network, 5xx); retried with backoff", relayed=True)
    CERTIFICATE_UNTRUSTED: Final = _mount("CertificateUntrusted", MountPhase.FAILED, "Ready", "the store's TLS certificate is not trusted: set the CA bundle", relayed=True)
    SOURCE_CHANGED: Final = _mount("SourceChanged", MountPhase.FAILED, "Ready", "an object changed while it was copied", relayed=True)
    LOCAL_ERROR: Final = _mount("LocalError", MountPhase.FAILED, "Ready", "a local file system error", relayed=True)
    # fmt: on


class BudgetReason:
    """A DGXBudget's reasons (its Ready condition's)."""

    # fmt: off
    COUNTING: Final = _reason(BUDGET, "Counting", None, "Ready", "the operator counts the budget: settles its jobs' usage, rolls its period and (Hold) keeps runs that do not fit waiting")
    INVALID_SPEC: Final = _reason(BUDGET, "InvalidSpec", None, "Ready", "the stored spec is one this operator cannot read (a time zone its zone database lacks, a newer version's field): the budget counts and holds nothing; the message names the field and the fix")
    UNREADABLE_STATUS: Final = _reason(BUDGET, "UnreadableStatus", None, "Ready", "the stored ledger is one this operator cannot read (written by a newer kubedgx): the budget counts and holds nothing, and the ledger is left as it is; upgrade the operator")
    # fmt: on


def reasons_of(kind: str, phase: str | None = None) -> tuple[str, ...]:
    """The reasons of ``kind`` (the ones that belong to ``phase`` when given), in declaration order."""
    return tuple(r.name for r in REASONS.values() if r.kind == kind and (phase is None or r.phase == phase))


# -- docs/operator.md's tables -------------------------------------------------------------------

BEGIN = "<!-- BEGIN generated by python -m dgx_operator.api.vocabulary: {} -->"
END = "<!-- END generated: {} -->"


def _cell(text: str) -> str:
    return printable(text).replace("|", "\\|")


def phase_table() -> str:
    """The job's phases, what each means and the reasons its ``Running`` condition carries."""
    rows = ["| Phase | Meaning | Reasons |", "|---|---|---|"]
    order = ("WaitingForData", "Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed")
    for phase in order:
        names = ", ".join(f"`{n}`" for n in reasons_of(JOB, phase))
        rows.append(f"| `{phase}` | {_cell(JobPhase.MEANING[phase])} | {names} |")
    return "\n".join(rows)


def reason_table(kind: str) -> str:
    """Every reason of ``kind``: the phase it belongs to, where it shows, what it means."""
    rows = ["| Reason | Phase | Shows on | Meaning |", "|---|---|---|---|"]
    for r in REASONS.values():
        if r.kind != kind:
            continue
        phase = f"`{r.phase}`" if r.phase else "(beside the phase)"
        relayed = " (relayed as the component gave it)" if r.relayed else ""
        rows.append(f"| `{r.name}` | {phase} | {r.shows} | {_cell(r.meaning)}{relayed} |")
    return "\n".join(rows)


def mount_phase_table() -> str:
    rows = ["| Phase | Meaning | Reasons |", "|---|---|---|"]
    for phase in MOUNT_PHASES:
        names = ", ".join(f"`{n}`" for n in reasons_of(MOUNT, phase))
        rows.append(f"| `{phase}` | {_cell(MountPhase.MEANING[phase])} | {names} |")
    return "\n".join(rows)


#: The generated blocks of docs/operator.md, by name.
TABLES: Final[dict[str, Callable[[], str]]] = {
    "job phases": phase_table,
    "job reasons": lambda: reason_table(JOB),
    "mount phases": mount_phase_table,
    "mount reasons": lambda: reason_table(MOUNT),
    "budget reasons": lambda: reason_table(BUDGET),
}


def regenerate(text: str) -> str:
    """``text`` (docs/operator.md) with each generated block replaced by its current table.
    Raises ValueError when a block's markers are missing, so a page cannot lose a table silently."""
    for name, table in TABLES.items():
        begin, end = BEGIN.format(name), END.format(name)
        start, stop = text.find(begin), text.find(end)
        if start < 0 or stop < start:
            raise ValueError(f"docs/operator.md has no block {begin!r} ... {end!r}")
        text = text[: start + len(begin)] + "\n" + table() + "\n" + text[stop:]
    return text


def main(argv: list[str]) -> int:
    """``python -m dgx_operator.api.vocabulary [docs/operator.md]``: rewrite the page's tables."""
    from pathlib import Path

    path = Path(argv[0] if argv else "docs/operator.md")
    path.write_text(regenerate(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
