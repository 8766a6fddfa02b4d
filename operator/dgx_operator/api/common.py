"""Types shared by both kinds: Kubernetes-style conditions, durations, quantities and the few
core/v1 shapes (env, tolerations, references) that a spec embeds."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from dgx_api.schema import KubeModel, cel, pattern

GROUP: Final = "kubedgx.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = "kubedgx.io/v1alpha1"
#: The kinds (dgx_operator.api.crdgen.KINDS describes them whole: plural, short names, schema).
JOB_KIND: Final = "DGXTrainingJob"
MOUNT_KIND: Final = "DGXDataMount"
BUDGET_KIND: Final = "DGXBudget"

# At most 6 digits per part and 20 characters in all keep every accepted value below Go's
# time.Duration limit (~2562047h), so CEL's duration() in the API server never overflows.
DURATION_PATTERN = pattern(
    r"^([0-9]{1,6}(\.[0-9]{1,9})?(ns|us|ms|s|m|h))+$",
    "must be a Go duration such as 90m, 24h or 1h30m (units: h, m, s, ms, us, ns; at most 6 digits per part)",
)
Duration = Annotated[str, Field(pattern=DURATION_PATTERN, max_length=20)]

_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> timedelta:
    """Go's time.ParseDuration for the subset the schema admits (no sign, no bare numbers)."""
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"invalid duration {text!r}: must look like 90m, 24h or 1h30m")
    seconds = sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _DURATION_PART.findall(text))
    return timedelta(seconds=seconds)


QUANTITY_PATTERN = pattern(
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
    "must be a Kubernetes quantity of at least 0, such as 96, 500m, 1Ti or 900Gi",
)
#: Every quantity in the API is a size or an amount (CPU, memory, /dev/shm, a PVC, a divisor): the
#: API server refuses negative ones in the pods and PVCs the operator creates, so the job is
#: refused first.
Quantity = Annotated[Annotated[int, Field(ge=0)] | Annotated[str, Field(pattern=QUANTITY_PATTERN)], Field()]

DNS_LABEL = pattern(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    "must be a DNS label: lower-case letters, digits and '-', starting and ending with a letter or digit",
)
DNS_SUBDOMAIN = pattern(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    "must be a DNS subdomain: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit",
)
ObjectName = Annotated[str, Field(pattern=DNS_SUBDOMAIN, min_length=1, max_length=253)]

ENV_NAME = pattern(
    r"^[-._a-zA-Z][-._a-zA-Z0-9]*$",
    "must be an environment variable name: letters, digits, '_', '-' or '.', not starting with a digit",
)


class Condition(KubeModel):
    """A Kubernetes-style condition (metav1.Condition), as `kubectl wait --for=condition=...` reads it."""

    type: str = Field(max_length=316, description="Condition type, CamelCase (e.g. Running, Succeeded).")
    status: Literal["True", "False", "Unknown"] = Field(description="Whether the condition holds.")
    reason: str = Field(
        max_length=1024,
        pattern=pattern(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", "must be a CamelCase reason"),
        description="Machine-readable CamelCase reason for the last transition.",
    )
    message: str = Field(default="", max_length=32768, description="Human-readable details.")
    last_transition_time: datetime = Field(description="When status last changed.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed from."
    )


class KeySelector(KubeModel):
    """A key of a Secret or ConfigMap."""

    name: ObjectName = Field(description="Name of the Secret or ConfigMap, in the job's namespace.")
    key: str = Field(min_length=1, max_length=253, description="The key to read.")
    optional: bool | None = Field(default=None, description="Allow the object or key to be missing.")


class FieldSelector(KubeModel):
    """A field of the pod (downward API)."""

    field_path: str = Field(min_length=1, max_length=256, description="e.g. metadata.name or status.podIP.")
    api_version: str | None = Field(default=None, description="Schema version of fieldPath; defaults to v1.")


class ResourceFieldSelector(KubeModel):
    """A container resource (downward API)."""

    resource: str = Field(min_length=1, description="e.g. limits.cpu or requests.memory.")
    container_name: str | None = Field(default=None, description="Container to read; defaults to this one.")
    divisor: Quantity | None = Field(default=None, description="Unit to express the value in.")


class EnvVarSource(KubeModel):
    """Where a variable's value comes from; exactly one source."""

    cel_rules = (
        cel(
            "[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef), "
            "has(self.resourceFieldRef)].filter(x, x).size() == 1",
            "set exactly one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef",
        ),
    )

    secret_key_ref: KeySelector | None = Field(default=None, description="A key of a Secret.")
    config_map_key_ref: KeySelector | None = Field(default=None, description="A key of a ConfigMap.")
    field_ref: FieldSelector | None = Field(default=None, description="A field of the pod.")
    resource_field_ref: ResourceFieldSelector | None = Field(default=None, description="A container resource.")


class EnvVar(KubeModel):
    """An environment variable for the training container (core/v1 EnvVar)."""

    cel_rules = (
        cel(
            "!(has(self.value) && has(self.valueFrom))",
            "set value or valueFrom, not both",
            field_path=".valueFrom",
        ),
    )

    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME, description="Variable name.")
    value: str | None = Field(default=None, max_length=131072, description="Literal value.")
    value_from: EnvVarSource | None = Field(default=None, description="Value read from the cluster.")


class Toleration(KubeModel):
    """A core/v1 Toleration, added to the ones the instance type implies."""

    cel_rules = (
        cel(
            "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
            "a toleration with operator Exists matches any value: leave value empty",
            field_path=".value",
        ),
        cel(
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "tolerationSeconds applies only to effect NoExecute",
            field_path=".tolerationSeconds",
        ),
    )

    key: str | None = Field(default=None, max_length=316, description="Taint key; empty with Exists matches all.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Defaults to Equal.")
    value: str | None = Field(default=None, max_length=63, description="Taint value for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all."
    )
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated before eviction."
    )


class LocalObjectReference(KubeModel):
    """A reference to an object in the same namespace."""

    name: ObjectName = Field(description="Name of the object.")


class ObjectMeta(BaseModel):
    """The parts of metav1.ObjectMeta that kubedgx reads; everything else passes through."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")

    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


def condition_list_field(description: str) -> Any:
    """Conditions are a map keyed by type (one entry per type), as `kubectl wait` expects."""
    return Field(
        default_factory=list,
        max_length=32,
        description=description,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
