"""DGXLimits (kubedgx.io/v1alpha1): a namespace's guard rails for DGXTrainingJobs, as LimitRange is
for pods.

One object per namespace, named ``default`` (a CEL rule on metadata.name: LimitRange allows several
and merges them in no defined order; one object leaves nothing to guess). The chart's value
``limits`` holds the same fields for the whole cluster (:class:`LimitsSpec`, read by the operator
from the file KUBEDGX_LIMITS names). How the two combine, and the checks themselves, are in
:mod:`dgx_operator.validation.limits`; the webhook enforces them at `kubectl apply`, the planner
applies the defaults (docs/cost.md).

A CRD rather than a ConfigMap so that the namespace's users (who may edit ConfigMaps) cannot raise
their own limits: the chart aggregates read access to ``view`` only, and writing needs the
ClusterRole ``kubedgx-limits-admin``. Defaults are never written into a job's stored spec (no drift
under Argo CD): the webhook warns which one applies, and the operator pins it in
``status.limits`` at the job's first pass.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field

from dgx_api.schema import KubeModel, cel, pattern
from dgx_operator.api.common import API_VERSION, DNS_SUBDOMAIN, DURATION_PATTERN, Duration, ObjectMeta
from dgx_operator.api.trainingjob import MAX_NODES

KIND: Final = "DGXLimits"
#: The only name a DGXLimits may have: one per namespace.
LIMITS_NAME: Final = "default"
#: The label through which Kueue gives a job a WorkloadPriorityClass (reconcile.queueing reads it too).
KUEUE_PRIORITY_LABEL: Final = "kueue.x-k8s.io/priority-class"
#: spec.priority's values.
Priority = Literal["low", "normal", "high"]

INSTANCE_GLOB = pattern(
    r"^[a-z0-9.*?\[\]!-]+$",
    "must be an instance type or a glob over them, such as dgxh100.80g.*.* or dgxa100.80g.8.spot "
    "(lower-case letters, digits, '.', '-', and the glob characters * ? [ ] !)",
)
CAPACITY = pattern(r"^[a-z][a-z]*$", "must be a capacity pool of the catalog, such as norm, spot or debug")

InstanceGlob = Annotated[str, Field(min_length=1, max_length=64, pattern=INSTANCE_GLOB)]
Capacity = Annotated[str, Field(min_length=1, max_length=32, pattern=CAPACITY)]
ClassName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]


def _valid(field: str) -> str:
    """CEL: ``self.<field>`` parses as a duration. The apiserver runs CEL rules even after a pattern
    failure; without the guard a bad value would add a type-conversion error to the pattern's."""
    return f"self.{field}.matches(r'{DURATION_PATTERN}')"


class DurationLimit(KubeModel):
    """A default and a maximum of one duration field of a job."""

    cel_rules = (
        cel(
            f"!has(self.default) || !has(self.max) || !{_valid('default')} || !{_valid('max')} || "
            "duration(self.default) <= duration(self.max)",
            "must not exceed max: a job that takes the default would be refused",
            field_path=".default",
        ),
        cel(
            f"!has(self.default) || !{_valid('default')} || duration(self.default) > duration('0s')",
            "must be longer than 0s",
            field_path=".default",
        ),
        cel(
            f"!has(self.max) || !{_valid('max')} || duration(self.max) > duration('0s')",
            "must be longer than 0s",
            field_path=".max",
        ),
    )

    default: Duration | None = Field(
        default=None,
        description=(
            "What a job that leaves the field unset gets. Not written into the job: the operator pins it in the "
            "job's status.limits at its first pass, so a later edit here does not move a running job's deadline."
        ),
    )
    max: Duration | None = Field(
        default=None,
        description=(
            "The longest a job may ask for; a job that leaves the field unset is refused unless a default applies."
        ),
    )


class LimitsSpec(KubeModel):
    """Guard rails for the DGXTrainingJobs of a namespace (or, as the chart value ``limits``, of the
    whole cluster). Every field is optional; a list that is absent or empty allows everything."""

    max_duration: DurationLimit | None = Field(
        default=None, description="spec.maxDuration of jobs that are not interactive debug sessions."
    )
    max_pending: DurationLimit | None = Field(default=None, description="spec.maxPending of every job.")
    interactive: DurationLimit | None = Field(
        default=None,
        description=(
            "spec.maxDuration of interactive debug sessions (spec.debug.interactive): its default ends a session "
            "someone forgot, instead of maxDuration's."
        ),
    )
    max_nodes: int | None = Field(
        default=None,
        ge=1,
        le=MAX_NODES,
        description="The most nodes one job may ask for: spec.elastic.maxNodes (and minNodes) at most this.",
    )
    instances: list[InstanceGlob] | None = Field(
        default=None,
        max_length=64,
        description=(
            "Instance types a job may use, as globs over the catalog's names (dgxh100.80g.*.*, "
            "dgxa100.80g.8.spot). Absent or empty: every instance type."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    capacities: list[Capacity] | None = Field(
        default=None,
        max_length=16,
        description="Capacity pools a job may use (norm, spot, debug). Absent or empty: every pool.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    priorities: list[Priority] | None = Field(
        default=None,
        max_length=3,
        description=(
            "Values of spec.priority a job may have (a job without one has normal). Absent or empty: every "
            "priority. Leave high out to keep it for those an admin allows."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    kueue_priority_classes: list[ClassName] | None = Field(
        default=None,
        max_length=64,
        description=(
            f"Values of the label {KUEUE_PRIORITY_LABEL} (a Kueue WorkloadPriorityClass) a job may carry; a job "
            "without the label is not limited by this. Absent or empty: every class."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


class DGXLimits(KubeModel):
    """A DGXLimits as stored in the cluster or written in a manifest."""

    api_version: Literal["kubedgx.io/v1alpha1"] = Field(default=API_VERSION, description="API version.")
    kind: Literal["DGXLimits"] = Field(default=KIND, description="Kind.")
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    spec: LimitsSpec = Field(default_factory=LimitsSpec, description="The namespace's limits.")

    @property
    def label(self) -> str:
        """``DGXLimits <namespace>/<name>``, as messages name where a limit is set."""
        return f"{KIND} {self.metadata.namespace or 'default'}/{self.metadata.name}"
