"""A Flyte task template (+ the execution's metadata) -> the DGXTrainingJob and DGXDataMounts to create.

Pure: no cluster, no event loop, so the golden tests can pin every mapping. Everything it builds
goes through kubedgx's own :class:`~dgx_operator.validation.validator.Validator` (the one behind ``kubedgx
validate`` and the admission webhook) before anything is sent, so a bad config fails at ``pyflyte
run`` with the lines ``kubedgx validate`` would print for the same manifest.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from dgx_operator.api import API_VERSION
from dgx_operator.api.common import JOB_KIND, MOUNT_KIND
from dgx_operator.api.trainingjob import MAX_JOB_NAME, RESERVED_ENV_NAMES, RESERVED_ENV_PREFIXES
from dgx_operator.catalog import NAME_RE, Catalog
from dgx_operator.validation.validator import Validator, object_label, reference_problems
from flytekitplugins.dgx.config import DGXConfigError, DGXDataConfig, from_custom, input_path, output_path

#: Task types (the connector's categories): a @task function, and the built-in QLoRA fine-tune.
FUNCTION_TASK: Final = "dgx_training"
QLORA_TASK: Final = "dgx_qlora"

#: Labels and annotations the connector puts on what it creates.
MANAGED_BY: Final = "flytekitplugins-dgx"
KEY_LABEL: Final = "flyte.kubedgx.io/key"
TASK_TYPE_LABEL: Final = "flyte.kubedgx.io/task-type"
EXECUTION_ANNOTATION: Final = "flyte.kubedgx.io/task-execution"
OUTPUT_PREFIX_ANNOTATION: Final = "flyte.kubedgx.io/output-prefix"
#: The dirs of DGXDataConfig's mounts, for the function (os.pathsep-separated, in config order).
INPUT_DIRS_ENV: Final = "DGX_INPUT_DIRS"
OUTPUT_DIRS_ENV: Final = "DGX_OUTPUT_DIRS"
#: The default instance when a task names none (the connector's setting overrides it).
DEFAULT_INSTANCE: Final = "dgxa100.80g.8.norm"
#: The capacity pool (the last part of an instance name) of preemptible nodes: where interruptible tasks run.
SPOT: Final = "spot"
#: The label propeller puts on every task execution's metadata: its interruptible for this attempt,
#: "true" or "false" (flytepropeller nodes/node_exec_context.go). It is how the connector learns it.
INTERRUPTIBLE_LABEL: Final = "interruptible"

_FLYTE_GPU, _FLYTE_CPU, _FLYTE_MEMORY = 2, 1, 3  # flyteidl.core.Resources.ResourceName


@dataclass(frozen=True)
class Options:
    """The connector's own settings (its environment, see :func:`options_from_env`)."""

    namespace: str | None = None
    default_instance: str = DEFAULT_INSTANCE
    catalog: Catalog | None = None
    #: Extra environment for every worker (e.g. FLYTE_AWS_ENDPOINT for the blob store).
    env: Mapping[str, str] = field(default_factory=dict)
    #: spec.ttlSecondsAfterFinished of every job: the finished job, and with it the data mounts that
    #: only connector-made jobs own, is deleted that long after it ended. None: kept.
    job_ttl: int | None = None


class SettingError(ValueError):
    """A connector setting (its environment) that cannot be used; the message names it and the fix."""


JOB_TTL_ENV: Final = "KUBEDGX_FLYTE_JOB_TTL"
#: The shortest job TTL: a job deleted before propeller's next GetTask reads its end is reported as
#: gone (FAILED) instead of succeeded; propeller polls every webApi.caching.resyncInterval (30 s).
MIN_JOB_TTL: Final = 60


def job_ttl_of(value: str | None) -> int | None:
    """KUBEDGX_FLYTE_JOB_TTL: whole seconds, at least MIN_JOB_TTL; unset or empty: None."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if not re.fullmatch(r"[0-9]{1,9}", text) or int(text) < MIN_JOB_TTL:
        raise SettingError(
            f"{JOB_TTL_ENV}={value!r}: must be a whole number of seconds, at least {MIN_JOB_TTL} (a job deleted "
            "before propeller reads its end is reported as gone): e.g. 86400 to delete finished jobs after a day, "
            "or unset it to keep them"
        )
    return int(text)


def options_from_env(environ: Mapping[str, str] = os.environ) -> Options:
    catalog = Catalog.load(environ["KUBEDGX_FLYTE_CATALOG"]) if environ.get("KUBEDGX_FLYTE_CATALOG") else None
    prefix = "KUBEDGX_FLYTE_WORKER_ENV_"
    return Options(
        namespace=environ.get("KUBEDGX_FLYTE_NAMESPACE") or None,
        default_instance=environ.get("KUBEDGX_FLYTE_DEFAULT_INSTANCE") or DEFAULT_INSTANCE,
        catalog=catalog,
        env={k.removeprefix(prefix): v for k, v in environ.items() if k.startswith(prefix) and k != prefix},
        job_ttl=job_ttl_of(environ.get(JOB_TTL_ENV)),
    )


@dataclass(frozen=True)
class Execution:
    """What Flyte's backend says about the execution (TaskExecutionMetadata); empty for a local run."""

    project: str = ""
    domain: str = ""
    name: str = ""
    node_id: str = ""
    retry_attempt: int = 0
    task_project: str = ""
    task_domain: str = ""
    task_name: str = ""
    task_version: str = ""
    namespace: str = ""
    service_account: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    environment: Mapping[str, str] = field(default_factory=dict)
    #: Propeller's interruptible for this attempt (the task's, a workflow's or node's override, and the
    #: interruptible failure threshold, resolved); None when not sent. Propeller sends it as the label
    #: ``interruptible``; it leaves TaskExecutionMetadata's own field unset, and flytekit 1.x's model of
    #: it, what the connector is handed, has no such field (its from_flyte_idl drops admin's).
    interruptible: bool | None = None

    @classmethod
    def from_metadata(cls, meta: Any) -> Execution:
        """From flytekit's TaskExecutionMetadata model (None: a local run)."""
        if meta is None:
            return cls()
        interruptible = getattr(meta, "interruptible", None)
        label = str((meta.labels or {}).get(INTERRUPTIBLE_LABEL, "")).lower()
        if label in ("true", "false"):  # propeller's own resolution: it wins
            interruptible = label == "true"
        tei = meta.task_execution_id
        node = tei.node_execution_id
        ex = node.execution_id
        task = tei.task_id
        return cls(
            project=ex.project or "",
            domain=ex.domain or "",
            name=ex.name or "",
            node_id=node.node_id or "",
            retry_attempt=int(tei.retry_attempt or 0),
            task_project=task.project or "",
            task_domain=task.domain or "",
            task_name=task.name or "",
            task_version=task.version or "",
            namespace=meta.namespace or "",
            service_account=meta.k8s_service_account or "",
            labels=dict(meta.labels or {}),
            annotations=dict(meta.annotations or {}),
            environment=dict(meta.environment_variables or {}),
            interruptible=interruptible if isinstance(interruptible, bool) else None,
        )

    @property
    def remote(self) -> bool:
        return bool(self.name)

    def key(self, output_prefix: str) -> str:
        """What identifies one attempt of one node: a repeated CreateTask has the same key (and
        adopts the job); a Flyte retry has the next retry_attempt (and gets a job of its own). A local
        run has no execution id; its output prefix is unique to it."""
        if self.remote:
            return f"{self.project}/{self.domain}/{self.name}/{self.node_id}/{self.retry_attempt}"
        return f"local/{output_prefix}"

    def flyte_env(self) -> dict[str, str]:
        """The variables pyflyte-execute reads to know which execution it runs in (entrypoint.py)."""
        if not self.remote:
            return {}
        return {
            "FLYTE_INTERNAL_EXECUTION_PROJECT": self.project,
            "FLYTE_INTERNAL_EXECUTION_DOMAIN": self.domain,
            "FLYTE_INTERNAL_EXECUTION_ID": self.name,
            "FLYTE_INTERNAL_TASK_PROJECT": self.task_project,
            "FLYTE_INTERNAL_TASK_DOMAIN": self.task_domain,
            "FLYTE_INTERNAL_TASK_NAME": self.task_name,
            "FLYTE_INTERNAL_TASK_VERSION": self.task_version,
            "FLYTE_ATTEMPT_NUMBER": str(self.retry_attempt),
        }


@dataclass(frozen=True)
class Plan:
    """What to create, in order: the mounts (create or reuse), then the job."""

    namespace: str
    name: str
    key: str
    task_type: str
    mounts: tuple[dict[str, Any], ...]
    job: dict[str, Any]
    #: Resources or fields of the template that a DGXTrainingJob has no place for (said, not dropped silently).
    notes: tuple[str, ...] = ()
    #: Where the task's outputs.pb (or error.pb) is written.
    output_prefix: str = ""


def _slug(text: str, limit: int) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s[:limit].strip("-")


def digest(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def job_name(key: str, hint: str) -> str:
    """A DNS-1035 label of at most MAX_JOB_NAME characters: readable part + key hash."""
    readable = _slug(hint, MAX_JOB_NAME - len("flyte--") - 10)
    name = f"flyte-{readable}-{digest(key, 10)}" if readable else f"flyte-{digest(key, 10)}"
    return name[:MAX_JOB_NAME]


def _quantity_gpu(value: str) -> int | str:
    try:
        return int(value)
    except ValueError:
        return value  # left for the Validator to name


def _resources(template: Any, notes: list[str]) -> dict[str, Any]:
    """Flyte ``Resources`` (requests, then limits) onto the job's per-node resources."""
    res = getattr(getattr(template, "container", None), "resources", None)
    if res is None:
        return {}
    out: dict[str, Any] = {}
    for entries in (res.limits or [], res.requests or []):  # requests win
        for e in entries:
            if e.name == _FLYTE_GPU:
                out["gpu"] = _quantity_gpu(str(e.value))
            elif e.name == _FLYTE_CPU:
                out["cpu"] = str(e.value)
            elif e.name == _FLYTE_MEMORY:
                out["memory"] = str(e.value)
            else:
                notes.append(f"Resources: {e.value} of resource {e.name} has no DGXTrainingJob field; ignored")
    return out


def _duration(delta: datetime.timedelta | float | None) -> str | None:
    """The task's ``timeout`` (a timedelta; 0 or None when unset) as a Go duration."""
    seconds = delta.total_seconds() if isinstance(delta, datetime.timedelta) else float(delta or 0)
    return f"{int(seconds)}s" if seconds > 0 else None


def interruptible_of(template: Any, execution: Execution) -> tuple[bool | None, str]:
    """(whether the task may run on preemptible nodes, where that was said): the execution's value when
    Flyte sent one, it being propeller's resolution of the task's with the workflow's and the failure
    threshold; else the task's own ``interruptible`` (TaskTemplate.metadata.interruptible; None when unset)."""
    if execution.interruptible is not None:
        return execution.interruptible, "the execution's interruptible (Flyte's, for this attempt)"
    value = getattr(getattr(template, "metadata", None), "interruptible", None)
    return (value if isinstance(value, bool) else None), "interruptible=True (the task's metadata)"


def spot_variant(instance: str) -> str | None:
    """``dgxa100.80g.8.norm`` -> ``dgxa100.80g.8.spot``: the same GPUs and shape on the spot pool (the
    catalog names every instance family x shape x capacity). None for a name of another form."""
    match = NAME_RE.match(instance)
    if match is None:
        return None
    return f"dgx{match['family']}.{match['memory']}g.{match['gpus']}.{SPOT}"


def placed_instance(
    named: str | None, config: str, default: str, interruptible: bool | None, said: str, catalog: Catalog
) -> tuple[str, list[str]]:
    """(spec.instance, problems). Not interruptible (False or unset): the config's instance, else the
    connector's default, as before. Interruptible: a task that names no instance gets the spot variant of
    the default (Flyte's interruptible=True trades preemption for cheaper nodes, which is kubedgx's spot
    pool, whose reclaimed workers are replaced uncounted); one that names a spot instance keeps it; one that
    names another pool contradicts itself, and which the user meant cannot be told, so it is refused,
    naming both fields and both fixes."""
    if not interruptible:
        return named or default, []
    if named is not None:
        spot = spot_variant(named)
        if spot is None or spot == named:  # spot already, or malformed: the Validator names that
            return named, []
        capacity = named.rsplit(".", 1)[-1]
        return named, [
            f"{config}.instance: {named!r} is {capacity} capacity, but {said} asks for spot: name {spot!r} to run "
            f"on spot, or drop interruptible (interruptible=False) to run on {capacity}"
        ]
    spot = spot_variant(default)
    if spot is None or spot == default:
        return default, []
    if spot not in catalog.instances and default in catalog.instances:
        pools = ", ".join(catalog.spec.capacities)
        return default, [
            f"{config}.instance: {said} asks for the spot variant of the connector's default instance {default}, but "
            f"this cluster's catalog has no {spot} (capacity pools: {pools}): name an instance in the task config, "
            "or drop interruptible"
        ]
    return spot, []


def _output_in_a_mount(trainer: dict[str, Any], data: DGXDataConfig) -> list[str]:
    """The QLoRA task's output.dir: the first output mount unless the trainer section names a directory
    inside one (then that). An output mount's sidecar uploads checkpoints and archives the adapter (the
    task's one output) only from the directory it holds; the trainer's own default, /workspace/output, is
    in no mount, so the adapter was never archived and every run ended "succeeded without an archived
    adapter", and a replacement worker found no checkpoint to resume from."""
    output = dict(trainer.get("output") or {})
    out_dir = output.get("dir")
    if out_dir is None:
        trainer["output"] = {**output, "dir": output_path(0)}
        return []
    if isinstance(out_dir, str) and any(out_dir == p or out_dir.startswith(p + "/") for p in data.output_paths):
        return []
    return [
        f"trainer.output.dir: {out_dir!r} is outside the task's output mounts ({', '.join(data.output_paths)}), "
        "the only place its checkpoints are uploaded from and its adapter is archived from: leave output.dir out "
        f"(it is then {output_path(0)}) or set it inside one of them"
    ]


def _reserved(name: str) -> bool:
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)


def _mount(source: str, direction: str, data: DGXDataConfig, namespace: str) -> dict[str, Any]:
    identity = "|".join(
        [
            source,
            direction,
            data.endpoint or "",
            data.region or "",
            data.credentials_secret or "",
            data.credentials_key or "",
        ]
    )
    spec: dict[str, Any] = {"source": source, "direction": direction}
    if data.endpoint:
        spec["endpoint"] = data.endpoint
    if data.region:
        spec["region"] = data.region
    if data.credentials_secret:
        spec["credentialsSecretRef"] = {"name": data.credentials_secret} | (
            {"key": data.credentials_key} if data.credentials_key else {}
        )
    return {
        "apiVersion": API_VERSION,
        "kind": MOUNT_KIND,
        "metadata": {
            "name": f"flyte-{direction.lower()}-{digest(identity, 12)}",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": MANAGED_BY},
            "annotations": {"flyte.kubedgx.io/source": source[:1024]},
        },
        "spec": spec,
    }


def build(
    template: Any,
    output_prefix: str,
    metadata: Any = None,
    options: Options | None = None,
) -> Plan:
    """The plan for one CreateTask. Raises :class:`DGXConfigError` with every problem found."""
    options = options or Options()
    execution = Execution.from_metadata(metadata)
    task = str(getattr(getattr(template, "id", None), "name", "") or "task")
    task_type = str(template.type)
    custom = _custom(template)
    settings = from_custom(custom, task)
    place, elastic, data = settings.placement, settings.elastic, settings.data
    notes: list[str] = []
    lines: list[str] = []

    namespace = place.namespace or options.namespace or execution.namespace or "default"
    key = execution.key(output_prefix)
    hint = execution.name if execution.remote else task.rsplit(".", 1)[-1]
    name = job_name(key, hint)

    catalog = options.catalog or Catalog.load()
    interruptible, said = interruptible_of(template, execution)
    instance, wrong = placed_instance(
        place.instance, type(place).__name__, options.default_instance, interruptible, said, catalog
    )
    lines += wrong
    spec: dict[str, Any] = {"instance": instance, "priority": place.priority}
    max_duration = place.max_duration or _duration(getattr(getattr(template, "metadata", None), "timeout", None))
    for field_name, value in (("maxDuration", max_duration), ("maxPending", place.max_pending)):
        if value:
            spec[field_name] = value
    if place.data_cache != "none":
        spec["dataCache"] = place.data_cache
    if place.debug or place.interactive:
        spec["debug"] = {"enabled": bool(place.debug), "interactive": bool(place.interactive)}
    if place.restart_policy:
        spec["restartPolicy"] = place.restart_policy
    if place.backoff_limit is not None:
        spec["backoffLimit"] = place.backoff_limit
    if options.job_ttl is not None:
        spec["ttlSecondsAfterFinished"] = options.job_ttl
    if elastic is not None:
        spec["elastic"] = {
            k: v
            for k, v in (
                ("minNodes", elastic.min_nodes),
                ("maxNodes", elastic.max_nodes),
                ("nprocPerNode", elastic.nproc_per_node),
                ("maxRestarts", elastic.max_restarts),
            )
            if v is not None
        }
    resources = _resources(template, notes)
    if resources:
        spec["resources"] = resources
    if execution.service_account:
        spec["serviceAccountName"] = execution.service_account

    container = getattr(template, "container", None)
    image = getattr(container, "image", None) or (custom or {}).get("image") or None
    if image:
        spec["image"] = image

    env: dict[str, str] = {}
    for source, values in (("environment", dict(getattr(container, "env", None) or {})),
                           ("the execution's environment", execution.environment)):  # fmt: skip
        for k, v in values.items():
            if _reserved(k):
                lines.append(
                    f"{source}.{k}: is reserved: kubedgx sets {k} for torchrun (names starting PET_, TORCHELASTIC_ "
                    f"or KUBEDGX_, and MASTER_ADDR, WORLD_SIZE, RANK, ...); configure the nodes and processes with "
                    f"DGXTorchElastic instead"
                )
            else:
                env[k] = str(v)
    env |= execution.flyte_env() | dict(options.env)

    mounts: list[dict[str, Any]] = []
    refs: list[dict[str, str]] = []
    if data is not None:
        for i, source in enumerate(data.input_mounts):
            mounts.append(_mount(source, "In", data, namespace))
            refs.append({"name": mounts[-1]["metadata"]["name"], "mountPath": input_path(i)})
        for i, source in enumerate(data.output_mounts):
            mounts.append(_mount(source, "Out", data, namespace))
            refs.append({"name": mounts[-1]["metadata"]["name"], "mountPath": output_path(i)})
        if data.input_mounts:
            env[INPUT_DIRS_ENV] = os.pathsep.join(data.input_paths)
        if data.output_mounts:
            env[OUTPUT_DIRS_ENV] = os.pathsep.join(data.output_paths)
    if refs:
        spec["dataMounts"] = refs

    if task_type == QLORA_TASK:
        if settings.trainer is None:
            lines.append("trainer: the QLoRA task needs its trainer section (DGXQLoRATask(trainer=...))")
        else:
            spec["trainer"] = dict(settings.trainer)
        if data is None or not data.output_mounts:
            lines.append(
                "DGXDataConfig.output_mounts: the QLoRA task returns the URI of its archived adapter, which needs "
                "an output mount to archive to; add output_mounts=['s3://bucket/prefix']"
            )
        elif "trainer" in spec:
            lines += _output_in_a_mount(spec["trainer"], data)
    else:
        command = [*(getattr(container, "command", None) or []), *(getattr(container, "args", None) or [])]
        if not command:
            lines.append("container: the task template has no command; was it built by this plugin's DGX task?")
        spec["command"] = command
        if elastic is None:
            # The function raising is the attempt failing: Flyte's retries= and the job's restart_policy
            # decide what runs again. torch elastic's in-place restarts (the job's default, 3) would run a
            # deterministic error four times before the pod failed; flytekit's own PyTorch plugin makes
            # none either. DGXTorchElastic(max_restarts=...) says otherwise where a user wants them.
            spec["elastic"] = {"maxRestarts": 0}
        # pyflyte-execute catches the function's exception, writes error.pb and exits 0 unless told
        # otherwise: the worker must exit non-zero so the job's restart policy and Failed reason apply.
        env.setdefault("FLYTE_FAIL_ON_ERROR", "true")
    if env:
        spec["env"] = [{"name": k, "value": v} for k, v in sorted(env.items())]

    labels = dict(execution.labels.items()) | {
        "app.kubernetes.io/managed-by": MANAGED_BY,
        KEY_LABEL: digest(key, 32),
        TASK_TYPE_LABEL: task_type.replace("_", "-"),
    }
    annotations = dict(execution.annotations) | {
        EXECUTION_ANNOTATION: key[:4096],
        OUTPUT_PREFIX_ANNOTATION: output_prefix[:4096],
    }
    job = {
        "apiVersion": API_VERSION,
        "kind": JOB_KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations},
        "spec": spec,
    }
    lines += validate([*mounts, job], catalog)
    if lines:
        raise DGXConfigError(task, lines)
    return Plan(namespace, name, key, task_type, tuple(mounts), job, tuple(notes), output_prefix)


def validate(objects: Sequence[Mapping[str, Any]], catalog: Catalog) -> list[str]:
    """``kubedgx validate``'s lines for these objects (its Validator, then the rules across them)."""
    validator = Validator(catalog)
    lines: list[str] = []
    valid: list[tuple[Mapping[str, Any], str]] = []
    for obj in objects:
        outcome = validator.validate(obj)
        label = object_label(obj)
        lines += [f"{label}: {p}" for p in outcome.problems]
        if outcome.ok:
            valid.append((obj, label))
    lines += [f"{label}: {p}" for label, p in reference_problems(catalog, valid)]
    return lines


def _custom(template: Any) -> Mapping[str, Any] | None:
    custom = getattr(template, "custom", None)
    if custom is None:
        return None
    if isinstance(custom, Mapping):
        return custom
    from google.protobuf import json_format  # a Struct straight from the wire

    out: dict[str, Any] = json_format.MessageToDict(custom)
    return out
