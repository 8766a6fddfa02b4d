"""DGXTrainingJob (kubedgx.io/v1alpha1): spec and status.

Defaults live here, in the models, and are applied by the operator when it builds children;
the CRD states them in descriptions but never writes them into a stored spec, so a re-applied
manifest shows no drift in Argo CD.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Final, Literal

from pydantic import Field, field_validator

from dgx_api.schema import KubeModel, cel, pattern
from dgx_api.trainer_config import AbsolutePath, TrainerConfig
from dgx_operator.api.common import (
    API_VERSION,
    DURATION_PATTERN,
    JOB_KIND,
    Condition,
    Duration,
    EnvVar,
    LocalObjectReference,
    ObjectMeta,
    ObjectName,
    Quantity,
    Toleration,
    condition_list_field,
)
from dgx_operator.api.vocabulary import PhaseName

KIND: Final = JOB_KIND

INSTANCE_PATTERN = pattern(
    r"^dgx[a-z0-9]+\.[0-9]+g\.([0-9]+|mig-[1-7]g\.[0-9]+gb(\.me)?)\.(norm|spot|debug)$",
    "must look like dgx<gpu>.<memory>g.<gpus>.<capacity>, e.g. dgxa100.80g.8.norm, or "
    "dgx<gpu>.<memory>g.mig-<profile>.<capacity> for a MIG slice, e.g. dgxa100.80g.mig-1g.10gb.debug "
    "(capacity: norm, spot or debug)",
)

#: Variables the operator sets for torchrun (Kubeflow PyTorchJob's names) or for itself.
RESERVED_ENV_NAMES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "GROUP_RANK",
    "LOCAL_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
)
RESERVED_ENV_PREFIXES = ("PET_", "TORCHELASTIC_", "KUBEDGX_")

MAX_NODES = 512
#: Worker pods are named <job>-worker-<i> and their hostnames must be DNS labels (<= 63 chars) for i < 512.
MAX_JOB_NAME = 50
JOB_NAME_PATTERN = pattern(
    r"^[a-z]([-a-z0-9]*[a-z0-9])?$",
    "must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter): it names the "
    "job's Service and its <name>-worker-<i> pods",
)
_PATTERN_TEXT = "must be a DNS-1035 label: lower-case letters, digits and '-', starting with a letter"
MAX_GPUS_PER_NODE = 64

_RESERVED_RULE = " && ".join(
    [f"!self.name.startsWith('{p}')" for p in RESERVED_ENV_PREFIXES]
    + ["!(self.name in [" + ", ".join(f"'{n}'" for n in RESERVED_ENV_NAMES) + "])"]
)


class UserEnvVar(EnvVar):
    """An environment variable for every worker. Names that configure torchrun are the operator's."""

    cel_rules = (
        cel(
            _RESERVED_RULE,
            message_expression=(
                "'is reserved: kubedgx sets ' + self.name + ' for torchrun; configure it through spec.elastic "
                "(names starting PET_, TORCHELASTIC_ or KUBEDGX_, and MASTER_ADDR, MASTER_PORT, WORLD_SIZE, "
                "RANK, ... are reserved)'"
            ),
            field_path=".name",
        ),
    )


class Resources(KubeModel):
    """Per-node (per-worker) resources. Requests equal limits, so workers get Guaranteed QoS and
    the kubelet's static CPU manager can pin them next to their GPUs."""

    gpu: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GPUS_PER_NODE,
        description=(
            "GPUs per worker, at most the instance type's. Defaults to the instance type's. CPU, memory and /dev/shm "
            "not set here scale with it (the catalog's perGpu share each), so the rest of the node stays free for "
            "other jobs. Not with a MIG instance (its worker takes its one slice)."
        ),
    )
    cpu: Quantity | None = Field(
        default=None, description="CPU per worker. Defaults to the catalog's perGpu CPU x the worker's GPUs."
    )
    memory: Quantity | None = Field(
        default=None, description="Memory per worker. Defaults to the catalog's perGpu memory x the worker's GPUs."
    )
    shm: Quantity | None = Field(
        default=None,
        description=(
            "Size of /dev/shm (NCCL and data loaders need it). Defaults to the catalog's perGpu shm x the worker's "
            "GPUs."
        ),
    )


class Rendezvous(KubeModel):
    """torchrun's c10d rendezvous, hosted by worker 0."""

    port: int = Field(default=29400, ge=1024, le=65535, description="Port of the rendezvous store on worker 0.")
    join_timeout: Duration = Field(
        default="15m",
        description="How long a starting group waits for minNodes workers (torchrun join_timeout).",
    )
    last_call_timeout: Duration = Field(
        default="30s",
        description="Grace for late workers once minNodes have joined (torchrun last_call_timeout).",
    )


class Elastic(KubeModel):
    """How many nodes, how many processes per node, and how often torchrun may restart in place."""

    cel_rules = (
        cel(
            "!has(self.maxNodes) || (has(self.minNodes) ? self.minNodes : 1) <= self.maxNodes",
            # No message expression with the two numbers: the apiserver's cost estimator takes
            # string(int) for unbounded and refuses the CRD (NO_STRING_OF_NUMBERS in crdgen).
            "must be <= spec.elastic.maxNodes",
            field_path=".minNodes",
        ),
    )

    min_nodes: int = Field(
        default=1, ge=1, le=MAX_NODES, description="Fewest nodes the job runs on; below it the job restarts."
    )
    max_nodes: int | None = Field(
        default=None,
        ge=1,
        le=MAX_NODES,
        description="Most nodes; minNodes < maxNodes makes the job elastic. Defaults to minNodes.",
    )
    nproc_per_node: int | None = Field(
        default=None, ge=1, le=MAX_GPUS_PER_NODE, description="Processes per node. Defaults to the GPUs per node."
    )
    max_restarts: int = Field(
        default=3, ge=0, le=1000, description="In-place restarts torchrun may make before the worker fails."
    )
    rendezvous: Rendezvous = Field(default_factory=Rendezvous, description="Rendezvous settings.")


class DataMountRef(KubeModel):
    """A DGXDataMount in the job's namespace and where its data appears in the workers."""

    name: ObjectName = Field(description="Name of the DGXDataMount.")
    mount_path: AbsolutePath = Field(description="Where the data appears in the training container.")


class Debug(KubeModel):
    """Diagnostics for a job that misbehaves."""

    enabled: bool = Field(
        default=False,
        description="Verbose NCCL and torch.distributed logging (NCCL_DEBUG=INFO, TORCH_DISTRIBUTED_DEBUG=INFO).",
    )
    interactive: bool = Field(
        default=False,
        description=(
            "Start one worker that sleeps instead of training, with the full environment, so you can "
            "`kubectl exec` in and run torchrun by hand. The job never succeeds by itself; maxDuration still holds."
        ),
    )


#: A MIG slice's instance name (its third part: mig-1g in dgxa100.80g.mig-1g.10gb.debug).
_IS_MIG = "self.instance.split('.')[2].startsWith('mig-')"
#: The GPUs per worker that the instance name states (its third part: 8 in dgxa100.80g.8.norm; a MIG
#: slice is one device). CEL evaluates only the branch taken, so int() never sees "mig-1g".
_INSTANCE_GPUS = f"({_IS_MIG} ? 1 : int(self.instance.split('.')[2]))"

_GPUS_FIT_INSTANCE = (
    f"{_IS_MIG} || !has(self.resources) || !has(self.resources.gpu) || "
    "self.resources.gpu <= int(self.instance.split('.')[2])"
)
#: A MIG slice runs one worker of one process (a slice has no NVLink or P2P to another) and its
#: resource is the slice, so no resources.gpu.
_MIG_ONE_WORKER = (
    f"!{_IS_MIG} || ((!has(self.resources) || !has(self.resources.gpu)) && (!has(self.elastic) || "
    "((!has(self.elastic.minNodes) || self.elastic.minNodes == 1) && "
    "(!has(self.elastic.maxNodes) || self.elastic.maxNodes == 1) && "
    "(!has(self.elastic.nprocPerNode) || self.elastic.nprocPerNode == 1))))"
)
_GPUS_PER_NODE = f"((has(self.resources) && has(self.resources.gpu)) ? self.resources.gpu : {_INSTANCE_GPUS})"
_NPROC_FITS_GPUS = (
    f"!has(self.elastic) || !has(self.elastic.nprocPerNode) || self.elastic.nprocPerNode <= {_GPUS_PER_NODE}"
)


def _positive_duration(name: str) -> dict[str, str]:
    """``spec.<name>`` > 0s. The guard with the field's own pattern (common.DURATION_PATTERN) keeps the
    apiserver, which runs CEL rules even after a pattern failure, from adding a CEL type-conversion
    error at ``spec`` to that failure (seen on the real apiserver, tests/cluster/test_crds.py)."""
    return cel(
        f"!has(self.{name}) || !self.{name}.matches(r'{DURATION_PATTERN}') || duration(self.{name}) > duration('0s')",
        "must be longer than 0s",
        field_path=f".{name}",
    )


_INTERACTIVE_ONE_NODE = (
    "!has(self.debug) || !has(self.debug.interactive) || !self.debug.interactive || !has(self.elastic) || "
    "((!has(self.elastic.minNodes) || self.elastic.minNodes == 1) && "
    "(!has(self.elastic.maxNodes) || self.elastic.maxNodes == 1))"
)


class DGXTrainingJobSpec(KubeModel):
    """What to train, on which nodes, and how to handle failure."""

    cel_rules = (
        cel(
            "has(self.trainer) || has(self.command)",
            "set one of spec.trainer (a QLoRA fine-tune) or spec.command (any torchrun program)",
        ),
        cel(
            "!(has(self.trainer) && has(self.command))",
            "spec.trainer and spec.command are mutually exclusive: a job runs the built-in fine-tune or your "
            "program, not both",
            field_path=".command",
        ),
        cel("!has(self.args) || has(self.command)", "args need spec.command", field_path=".args"),
        cel(
            "!has(self.retryableExitCodes) || (has(self.restartPolicy) && self.restartPolicy == 'ExitCode')",
            "retryableExitCodes applies only with restartPolicy: ExitCode",
            field_path=".retryableExitCodes",
        ),
        cel(
            _INTERACTIVE_ONE_NODE,
            "interactive debug runs exactly one worker: set spec.elastic.minNodes and maxNodes to 1 "
            "(or leave them out)",
            field_path=".debug.interactive",
        ),
        cel(
            _GPUS_FIT_INSTANCE,
            "must not exceed the GPUs per node that spec.instance names (its third part, e.g. 8 in dgxa100.80g.8.norm)",
            message_expression=(
                "'must be <= ' + self.instance.split('.')[2] + ', the GPUs per node of ' + self.instance"
            ),
            field_path=".resources.gpu",
        ),
        cel(
            _MIG_ONE_WORKER,
            "a MIG instance runs one worker with one process on its slice: leave out spec.resources.gpu and set "
            "spec.elastic.minNodes, maxNodes and nprocPerNode to 1 (or leave them out); for more, use a whole-GPU "
            "shape such as dgxa100.80g.1.norm",
            field_path=".instance",
        ),
        cel(
            _NPROC_FITS_GPUS,
            "must not exceed the GPUs per node (spec.resources.gpu, else the instance's): torchrun starts one "
            "process per GPU",
            message_expression=(
                "'must be <= ' + ((has(self.resources) && has(self.resources.gpu)) ? 'spec.resources.gpu' : "
                f"({_IS_MIG} ? '1' : self.instance.split('.')[2]) + ', the GPUs per node of ' + self.instance) + "
                "': torchrun starts one process per GPU'"
            ),
            field_path=".elastic.nprocPerNode",
        ),
        _positive_duration("maxDuration"),
        _positive_duration("maxPending"),
        _positive_duration("maxIdle"),
        cel(
            "!has(self.dataCache) || self.dataCache == 'none' || (has(self.dataMounts) && size(self.dataMounts) > 0)",
            "dataCache: preload needs at least one entry in spec.dataMounts",
            field_path=".dataCache",
        ),
        cel(
            "!has(self.dataMounts) || self.dataMounts.all(m, self.dataMounts.filter(o, o.mountPath == m.mountPath)"
            ".size() == 1)",
            "two data mounts share one mountPath",
            field_path=".dataMounts",
        ),
    )

    instance: str = Field(
        pattern=INSTANCE_PATTERN,
        max_length=64,
        description=(
            "Instance type: dgx<gpu>.<memory>g.<gpus>.<capacity>, e.g. dgxa100.80g.8.norm or dgxh100.80g.1.spot, or "
            "dgx<gpu>.<memory>g.mig-<profile>.<capacity> for one MIG slice, e.g. dgxa100.80g.mig-1g.10gb.debug. It "
            "selects the GPU product, GPUs per worker and capacity pool (norm, spot, debug). A worker of g GPUs "
            "takes g GPUs of a node of that product and g x the catalog's perGpu CPU, memory and /dev/shm; other "
            "jobs share the rest of the node, and a job never puts two of its workers on one node. "
            "`kubedgx instances` lists the known ones."
        ),
    )
    priority: Literal["low", "normal", "high"] = Field(
        default="normal", description="Scheduling priority, mapped to the chart's PriorityClasses."
    )
    max_duration: Duration | None = Field(
        default=None, description="Fail with DeadlineExceeded this long after the job started (e.g. 24h)."
    )
    max_pending: Duration | None = Field(
        default=None,
        description="Fail with PendingTimeout when workers have waited this long for nodes (e.g. 90m).",
    )
    max_idle: Duration | None = Field(
        default=None,
        description=(
            "Restart (or under restartPolicy Never, fail) the job with reason Stalled when worker 0 has reported no "
            "progress for this long while running (e.g. 30m): a hung collective or data loader otherwise holds its "
            "GPUs until maxDuration. Progress is worker 0's JSON progress lines, read from its log every "
            "progressInterval of the operator; set it well above the slowest stretch without a report (model "
            "loading, evaluation, checkpoint saves)."
        ),
    )
    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Container image. Defaults to the operator's trainer image.",
    )
    resources: Resources | None = Field(default=None, description="Per-node resources; defaults from the instance.")
    elastic: Elastic | None = Field(default=None, description="Node counts and torchrun settings; one node by default.")
    restart_policy: Literal["Never", "OnFailure", "ExitCode"] = Field(
        default="OnFailure",
        description=(
            "What a failed worker does to the job: Never fails it; OnFailure recreates the worker up to backoffLimit; "
            "ExitCode recreates it only for retryableExitCodes. Evictions, preemption, node loss and spot reclaims "
            "never count against backoffLimit."
        ),
    )
    retryable_exit_codes: list[Annotated[int, Field(ge=0, le=255)]] | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Exit codes that restart under restartPolicy ExitCode. Defaults to 129-255 (killed by a signal; "
        "128 is a container that could not start).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    backoff_limit: int = Field(
        default=3, ge=0, le=1000, description="Worker failures (restarts) allowed before the job fails."
    )
    data_mounts: list[DataMountRef] = Field(
        default_factory=list,
        max_length=16,
        description="DGXDataMounts the workers use; the job waits in WaitingForData until each is Ready.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    data_cache: Literal["none", "preload"] = Field(
        default="none",
        description="`preload` reuses a node's cached copy of an input mount with the same manifest digest.",
    )
    trainer: TrainerConfig | None = Field(
        default=None, description="The built-in QLoRA fine-tune. Exclusive with command."
    )
    command: list[Annotated[str, Field(max_length=4096)]] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description=(
            "Your program, e.g. [torchrun, /app/train.py]. torchrun reads its settings from the PET_* "
            "variables kubedgx sets. Exclusive with trainer."
        ),
    )
    args: list[Annotated[str, Field(max_length=4096)]] | None = Field(
        default=None, max_length=256, description="Arguments to command."
    )
    env: list[UserEnvVar] = Field(
        default_factory=list,
        max_length=128,
        description="Extra environment for every worker. torchrun's variables (PET_*, MASTER_ADDR, ...) are reserved.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    debug: Debug | None = Field(default=None, description="Debug logging and the interactive mode.")
    suspend: bool = Field(
        default=False,
        description=(
            "Delete the workers but keep the job; false resumes it. A job queued by Kueue also waits for its admission."
        ),
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, description="Delete the finished job this many seconds after it ended."
    )
    node_selector: dict[str, Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict,
        max_length=32,
        description="Node labels the workers require, on top of the instance type's.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Tolerations on top of the instance type's."
    )
    service_account_name: ObjectName | None = Field(
        default=None,
        description="ServiceAccount of the workers (e.g. for workload identity to object storage).",
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, max_length=16, description="Secrets for pulling a private image."
    )


class WorkerCounts(KubeModel):
    """Worker pods by state, as last observed."""

    desired: int = Field(
        default=0, ge=0, description="Workers the job wants now (maxNodes, or 0 when suspended/finished)."
    )
    active: int = Field(default=0, ge=0, description="Workers that exist and have not finished.")
    ready: int = Field(default=0, ge=0, description="Workers whose training container runs.")
    failed: int = Field(default=0, ge=0, description="Workers that failed in the current attempt.")
    succeeded: int = Field(
        default=0, ge=0, description="Workers that exited 0 and are kept (their logs stay readable)."
    )


class Progress(KubeModel):
    """The trainer's own account of how far it got (see docs/trainer.md)."""

    step: int | None = Field(default=None, ge=0, description="Optimizer steps done.")
    total_steps: int | None = Field(default=None, ge=0, description="Optimizer steps planned.")
    epoch: float | None = Field(default=None, ge=0, description="Epochs done, fractional.")
    loss: float | None = Field(default=None, description="Last logged training loss.")
    eval_loss: float | None = Field(
        default=None, description="Last evaluation loss (dataset.evalFraction or dataset.evalPath with evalSteps)."
    )
    eval_step: int | None = Field(default=None, ge=0, description="The step evalLoss was measured at.")
    aux_loss: float | None = Field(
        default=None, description="Last router load-balancing loss of a mixture-of-experts model, when it is on."
    )
    learning_rate: float | None = Field(default=None, ge=0, description="Current learning rate.")
    tokens_per_second: float | None = Field(default=None, ge=0, description="Training throughput, all workers.")
    samples_per_second: float | None = Field(default=None, ge=0, description="Training throughput, all workers.")
    gpu_utilization: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description=(
            "Percent of time a kernel ran on the GPU of the reporting process (global rank 0): NVML's samples "
            "since the previous report, averaged (its current value where the driver keeps none). Absent without "
            "a GPU."
        ),
    )
    gpu_memory_used_bytes: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Memory in use on that GPU as NVML counts it (as nvidia-smi shows it): the tensors, PyTorch's cached "
            "blocks and the CUDA context."
        ),
    )
    gpu_memory_total_bytes: int | None = Field(default=None, ge=0, description="That GPU's memory, NVML.")
    mfu: float | None = Field(
        default=None,
        ge=0,
        description=(
            "Model FLOPs utilization, 0 to 1: tokensPerSecond x the model's FLOPs per trained token (4 per frozen "
            "and 6 per trainable parameter) / the GPUs' dense bf16/fp16 peak (docs/trainer.md). Absent where the "
            "GPU's peak is not known, in fp32 and without GPUs."
        ),
    )
    precision: str | None = Field(default=None, max_length=32, description="Effective precision (bf16, fp16, fp32).")
    quantization: str | None = Field(
        default=None, max_length=64, description="Effective quantization (nf4, int8, none (fallback), ...)."
    )
    updated_at: datetime | None = Field(default=None, description="When the trainer reported this.")


class Artifact(KubeModel):
    """A final output of the job, uploaded by the checkpoint sidecar to a direction: Out mount."""

    name: str = Field(
        max_length=253, description="adapter, merged, summary or model.tar.gz (with archive.format tar.gz)."
    )
    uri: str = Field(max_length=2048, description="Where it is: s3://bucket/prefix/... or gs://bucket/prefix/...")
    mount: str | None = Field(default=None, max_length=253, description="The DGXDataMount it was archived to.")


#: An amount of money or a price, as a decimal string ("31.20", "1.4"): never a float, which would round.
DecimalText = Annotated[str, Field(max_length=24, pattern=r"^[0-9]{1,15}(\.[0-9]{1,8})?$")]


class UsageBucket(KubeModel):
    """GPU-seconds used on one capacity at one price: the accounting's ledger, from which the totals
    are derived (a price edit starts a new bucket, it never reprices the seconds before it)."""

    capacity: str = Field(max_length=63, description="The capacity pool the workers ran in (norm, spot, ...).")
    price_per_gpu_hour: DecimalText | None = Field(
        default=None, description="What a GPU-hour cost then, in usage.currency; absent: the catalog had no price."
    )
    reference_price_per_gpu_hour: DecimalText | None = Field(
        default=None,
        description="The reference capacity's price then (pricing.reference, normally norm): what spot saved against.",
    )
    gpu_seconds: int = Field(ge=0, description="GPUs x seconds on a node.")


class UsageHolding(KubeModel):
    """A worker on a node when the usage was last accounted, and the price its next seconds get."""

    pod: str = Field(max_length=253, description="The worker pod's uid.")
    gpus: int = Field(ge=0, description="GPUs it holds.")
    slices: int | None = Field(
        default=None, ge=1, le=7, description="A MIG worker: its slice's compute slices (of 7); it counts as slices/7."
    )
    capacity: str = Field(max_length=63, description="The capacity pool it runs in.")
    price_per_gpu_hour: DecimalText | None = Field(default=None, description="Its price per GPU-hour.")
    reference_price_per_gpu_hour: DecimalText | None = Field(default=None, description="The reference price.")
    ends: datetime | None = Field(
        default=None, description="Being deleted: the end of its grace period, the latest it lets go of the node."
    )


class Usage(KubeModel):
    """What the job has used of the cluster's GPUs and what that cost, every attempt included: each
    worker pod counts from the moment it is bound to a node until it ends (or its grace period ends
    once deleted), times the GPUs it holds, at the catalog's price of the capacity it runs in (Kueue's
    admitted flavor's), the price taken when a worker is first accounted and moving to an edited one
    at the next pass. See docs/cost.md."""

    gpu_seconds: int = Field(default=0, ge=0, description="GPU-seconds, the authoritative total.")
    gpu_hours: DecimalText = Field(default="0.00", description="gpuSeconds / 3600, two decimals (GPU-HOURS column).")
    cost: DecimalText | None = Field(
        default=None,
        description=(
            "What those GPU-seconds cost at the prices they ran at, two decimals (COST column); absent when the "
            "catalog has no prices. Seconds on an unpriced instance are left out (see unpricedGpuSeconds)."
        ),
    )
    currency: str | None = Field(default=None, max_length=3, description="The catalog's currency (ISO 4217).")
    spot_savings: DecimalText | None = Field(
        default=None, description="What the seconds on cheaper capacity saved against the reference price."
    )
    example_prices: bool | None = Field(
        default=None, description="true: the catalog's prices are its shipped examples, not this cluster's."
    )
    unpriced_gpu_seconds: int | None = Field(
        default=None, ge=0, description="GPU-seconds on an instance the catalog has no price for (not in cost)."
    )
    accounted_until: datetime | None = Field(
        default=None, description="Every worker's time up to here is in the totals (whole seconds)."
    )
    buckets: list[UsageBucket] = Field(
        default_factory=list, max_length=256, description="GPU-seconds by capacity and price."
    )
    running: list[UsageHolding] = Field(
        default_factory=list,
        max_length=1024,
        description="Workers on a node at accountedUntil: where the next accounting goes on from.",
    )


class PinnedLimits(KubeModel):
    """The defaults of the namespace's limits (DGXLimits, the chart's limits) this job took for the
    fields its spec leaves unset, fixed at its first pass: a later edit of the limits does not move
    a running job's deadline. The spec, when it sets a field, always wins."""

    max_duration: Duration | None = Field(
        default=None, description="The maxDuration the job runs under (its spec sets none)."
    )
    max_pending: Duration | None = Field(
        default=None, description="The maxPending the job runs under (its spec sets none)."
    )
    source: str = Field(
        default="",
        max_length=1024,
        description=(
            "Where the defaults are set, e.g. DGXLimits team-a/default or the chart value limits.maxDuration.default."
        ),
    )


class DGXTrainingJobStatus(KubeModel):
    """What the operator observed, never what it hopes: written only by the operator."""

    phase: PhaseName | None = Field(default=None, description="Lifecycle phase.")
    conditions: list[Condition] = condition_list_field(
        "Latest observations, one per condition type. Running, Restarting, Suspended and Finished are always "
        "present (Finished is True once the job has succeeded or failed, with the reason it ended: wait for it "
        "with kubectl wait --for=condition=Finished); Succeeded and Failed appear when it ends; DataReady, "
        "WorkersPending and Archived when they apply."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation this status describes."
    )
    workers: WorkerCounts | None = Field(default=None, description="Worker pods by state.")
    nodes: str | None = Field(
        default=None, max_length=32, description="Ready/desired workers, e.g. 3/4 (for kubectl get)."
    )
    restarts: int = Field(default=0, ge=0, description="Worker restarts counted against backoffLimit.")
    attempt: int = Field(
        default=0,
        ge=0,
        description=(
            "Worker generation, bumped by every restart, disruption or lost worker; pods created for it carry it "
            "in the kubedgx.io/attempt label. Failures of pods from an older attempt belong to a restart already "
            "made and are not counted again."
        ),
    )
    last_restart_time: datetime | None = Field(
        default=None,
        description=(
            "When the operator last replaced workers (a counted restart, a disruption or a lost worker). A worker "
            "of an older attempt whose container ends more than 60s after it is a new incident, judged by the "
            "restart policy; one ending earlier cascades from that restart."
        ),
    )
    start_time: datetime | None = Field(
        default=None, description="When the current run started (maxDuration counts from here)."
    )
    limits: PinnedLimits | None = Field(
        default=None,
        description=(
            "The defaults of the namespace's guard rails (DGXLimits) this job runs under, pinned at its first pass."
        ),
    )
    completion_time: datetime | None = Field(default=None, description="When the job succeeded or failed.")
    progress: Progress | None = Field(default=None, description="Training progress reported by the trainer.")
    artifacts: list[Artifact] = Field(
        default_factory=list,
        max_length=32,
        description=(
            "Final outputs archived to direction: Out mounts when the job succeeded, as reported by the uploader "
            "that wrote them (empty when nothing was archived; see the Archived condition)."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["uri"]},
    )
    usage: Usage | None = Field(
        default=None,
        description=(
            "GPU-hours and cost so far, every attempt included (docs/cost.md); absent until a worker was placed."
        ),
    )


class DGXTrainingJob(KubeModel):
    """A DGXTrainingJob as stored in the cluster or written in a manifest."""

    api_version: Literal["kubedgx.io/v1alpha1"] = Field(default=API_VERSION, description="API version.")
    kind: Literal["DGXTrainingJob"] = Field(default=KIND, description="Kind.")
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    spec: DGXTrainingJobSpec = Field(description="Desired state.")
    status: DGXTrainingJobStatus | None = Field(default=None, description="Observed state.")

    @field_validator("metadata")
    @classmethod
    def _job_name(cls, meta: ObjectMeta) -> ObjectMeta:
        """The same restriction the CRD puts on metadata.name (see crdgen)."""
        if len(meta.name) > MAX_JOB_NAME or not re.fullmatch(JOB_NAME_PATTERN, meta.name):
            raise ValueError(f"metadata.name {meta.name!r} {_PATTERN_TEXT} (at most {MAX_JOB_NAME} characters)")
        return meta
