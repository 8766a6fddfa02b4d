"""The task configs users write: ``@task(task_config=DGXConfig(...))``.

Three config types because the code Flyte teams already have uses all three as a task's only
``task_config`` (flytekit allows one). Each is a frozen dataclass of JSON values, so it travels in
the task template's ``custom`` field unchanged and the connector rebuilds it on the other side
(:func:`from_custom`). What the fields mean is the DGXTrainingJob API's; they are checked by
kubedgx's Validator when the connector builds the manifest, not here, so the messages are the same
as ``kubedgx validate``'s. Only what the API cannot see (a field's Python type) is checked here.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

#: Where DGXDataConfig's mounts appear in the workers: inputs/<i> and outputs/<i> below it.
MOUNT_ROOT: Final = "/mnt/dgx"
#: The version of the ``custom`` layout, so a connector can refuse a template from a plugin it cannot read.
CUSTOM_VERSION: Final = 1


class DGXConfigError(ValueError):
    """A task config, or the manifest built from it, that kubedgx refuses. One line per problem, each
    naming the field and what to do."""

    def __init__(self, task: str, lines: Sequence[str]) -> None:
        self.task = task
        self.lines = tuple(lines)
        super().__init__(f"task {task!r} cannot run on kubedgx:\n" + "\n".join(f"  {line}" for line in self.lines))


@dataclass(frozen=True, kw_only=True)
class _Placement:
    """What every DGX task config has: where, how urgent, how long."""

    #: The DGX instance type (dgx<gpu>.<memory>g.<gpus>.<norm|spot|debug>); None: the connector's default.
    instance: str | None = None
    priority: Literal["low", "normal", "high"] = "normal"
    #: A Go duration (24h, 90m). None: the task's ``timeout``, if it has one.
    max_duration: str | None = None
    #: How long the job may wait for nodes before it fails (Go duration).
    max_pending: str | None = None
    #: ``preload``: In mounts are reused from the node's cache when their digest matches.
    data_cache: Literal["none", "preload"] = "none"
    #: Verbose NCCL / torch.distributed logging.
    debug: bool = False
    #: One worker that sleeps with the full environment, for ``kubectl exec``; never succeeds by itself.
    interactive: bool = False
    restart_policy: Literal["Never", "OnFailure", "ExitCode"] | None = None
    backoff_limit: int | None = None
    #: The namespace of the job; None: the execution's (Flyte's project-domain namespace) or the connector's.
    namespace: str | None = None


@dataclass(frozen=True, kw_only=True)
class DGXTorchElastic(_Placement):
    """A multi-node task: torch elastic between min_nodes and max_nodes, nproc_per_node processes each."""

    min_nodes: int = 1
    max_nodes: int | None = None
    #: None: one process per GPU of the node.
    nproc_per_node: int | None = None
    max_restarts: int = 3


@dataclass(frozen=True, kw_only=True)
class DGXDataConfig(_Placement):
    """Object-store data around the task: each input prefix synced to the node's NVMe before it starts,
    each output prefix a direction Out DGXDataMount (checkpoints streamed, the final model archived).

    A mount is named after what it reads (source, endpoint, region, secret), so tasks that name the
    same prefix share one DGXDataMount and its node cache instead of creating one per run."""

    input_mounts: Sequence[str] = ()
    output_mounts: Sequence[str] = ()
    #: A Secret in the job's namespace with the store's credentials (AWS_ACCESS_KEY_ID /
    #: AWS_SECRET_ACCESS_KEY for s3://, a service-account key for gs://); None: the nodes' identity.
    credentials_secret: str | None = None
    #: The key of a gs:// credentials Secret that holds the service-account JSON.
    credentials_key: str | None = None
    #: An S3-compatible endpoint (MinIO, Ceph) and region.
    endpoint: str | None = None
    region: str | None = None

    def __post_init__(self) -> None:
        # Lists become tuples: the config stays hashable and equal to its round trip through the template.
        for name in ("input_mounts", "output_mounts"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    @property
    def input_paths(self) -> list[str]:
        """Where input ``i`` appears in the workers (the function reads its data there)."""
        return [input_path(i) for i in range(len(self.input_mounts))]

    @property
    def output_paths(self) -> list[str]:
        return [output_path(i) for i in range(len(self.output_mounts))]


@dataclass(frozen=True, kw_only=True)
class DGXConfig(_Placement):
    """A DGX task: one whole node by default; ``elastic`` and ``data`` add what the other two
    configs describe, for a task that needs all of it."""

    elastic: DGXTorchElastic | None = None
    data: DGXDataConfig | None = None


def input_path(i: int) -> str:
    return posixpath.join(MOUNT_ROOT, "inputs", str(i))


def output_path(i: int) -> str:
    return posixpath.join(MOUNT_ROOT, "outputs", str(i))


TaskConfig = DGXConfig | DGXTorchElastic | DGXDataConfig

_TYPES: Final[dict[str, type[_Placement]]] = {
    "DGXConfig": DGXConfig,
    "DGXTorchElastic": DGXTorchElastic,
    "DGXDataConfig": DGXDataConfig,
}


@dataclass(frozen=True)
class Settings:
    """One task's placement, elasticity and data, whichever config type it was written with."""

    placement: _Placement
    elastic: DGXTorchElastic | None = None
    data: DGXDataConfig | None = None
    #: The built-in fine-tune's ``trainer`` section (camelCase, as in spec.trainer); None for a function task.
    trainer: Mapping[str, Any] | None = None


def settings_of(config: _Placement, trainer: Mapping[str, Any] | None = None) -> Settings:
    if isinstance(config, DGXConfig):
        return Settings(config, config.elastic, config.data, trainer)
    if isinstance(config, DGXTorchElastic):
        return Settings(config, config, None, trainer)
    if isinstance(config, DGXDataConfig):
        return Settings(config, None, config, trainer)
    raise TypeError(f"task_config must be DGXConfig, DGXTorchElastic or DGXDataConfig, got {type(config).__name__}")


def _plain(config: _Placement) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(config).__name__}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, _Placement):
            value = _plain(value)
        elif isinstance(value, tuple | list):
            value = list(value)
        if value is not None:
            out[f.name] = value
    return out


def to_custom(config: _Placement, trainer: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The template's ``custom``: JSON only (it travels as a protobuf Struct)."""
    out: dict[str, Any] = {"version": CUSTOM_VERSION, "config": _plain(config)}
    if trainer is not None:
        out["trainer"] = dict(trainer)
    return out


def _config(data: Mapping[str, Any], where: str) -> _Placement:
    kind = data.get("type")
    cls = _TYPES.get(str(kind))
    if cls is None:
        raise DGXConfigError("?", [f"{where}.type: unknown task config {kind!r}; expected one of {sorted(_TYPES)}"])
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key == "type":
            continue
        if key not in names:
            raise DGXConfigError("?", [f"{where}.{key}: unknown field of {cls.__name__}"])
        if isinstance(value, Mapping) and key in ("elastic", "data"):
            value = _config(value, f"{where}.{key}")
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[key] = _number(value)
    return cls(**kwargs)


def _number(value: Any) -> Any:
    """A protobuf Struct holds every number as a double: 4 comes back as 4.0."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def from_custom(custom: Mapping[str, Any] | None, task: str) -> Settings:
    """The connector's side of :func:`to_custom`."""
    if not custom or "config" not in custom:
        raise DGXConfigError(task, ["custom: the task template carries no kubedgx config (not a DGX task?)"])
    version = _number(custom.get("version"))
    if version != CUSTOM_VERSION:
        raise DGXConfigError(
            task, [f"custom.version: {version!r} is not {CUSTOM_VERSION}: register the task with this plugin's version"]
        )
    try:
        config = _config(custom["config"], "custom.config")
    except DGXConfigError as exc:
        raise DGXConfigError(task, exc.lines) from None
    trainer = custom.get("trainer")
    return settings_of(config, _numbers(trainer) if isinstance(trainer, Mapping) else None)


def _numbers(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return _number(value)


def check_types(config: Any, task: str) -> None:
    """The Python types the API cannot see once the config is JSON (a str where a list belongs would
    be read as one mount per character)."""
    if not isinstance(config, _Placement):
        raise DGXConfigError(
            task, [f"task_config: must be DGXConfig, DGXTorchElastic or DGXDataConfig, got {type(config).__name__}"]
        )
    lines: list[str] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in ("input_mounts", "output_mounts"):
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                lines.append(f"{type(config).__name__}.{f.name}: must be a list of s3:// or gs:// URIs, got {value!r}")
        elif f.name in ("min_nodes", "max_nodes", "nproc_per_node", "max_restarts", "backoff_limit"):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                lines.append(f"{type(config).__name__}.{f.name}: must be an integer, got {value!r}")
        elif f.name in ("elastic", "data") and value is not None:
            expected = DGXTorchElastic if f.name == "elastic" else DGXDataConfig
            if not isinstance(value, expected):
                lines.append(f"DGXConfig.{f.name}: must be a {expected.__name__}, got {type(value).__name__}")
            else:
                try:
                    check_types(value, task)
                except DGXConfigError as exc:
                    lines.extend(exc.lines)
    if lines:
        raise DGXConfigError(task, lines)
