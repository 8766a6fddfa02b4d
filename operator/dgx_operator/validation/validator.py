"""Validation of manifests, the same everywhere: `kubedgx validate`, `kubedgx render` and the
admission webhook all call :class:`Validator`.

Three layers, in the order the API server would apply them:

1. the generated CRD schema and its CEL rules (:func:`dgx_api.schema.validate`), i.e. what a
   cluster with our CRDs installed rejects by itself;
2. semantic rules that need data a CRD cannot hold: the instance catalog (which the chart lets
   admins change) and cross-document references;
3. for any other object, the official Kubernetes schemas (kubernetes-validate, strict).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import referencing
from pydantic import ValidationError

from dgx_api.schema import Problem, explain, join_path, json_type, validate
from dgx_api.stores import SyncError, check_endpoint, check_region
from dgx_api.text import printable
from dgx_operator.api import API_VERSION, GROUP, VERSION, DGXDataMount, DGXDataMountSpec, DGXTrainingJob
from dgx_operator.api.budget import DGXBudget
from dgx_operator.api.common import BUDGET_KIND, JOB_KIND, MOUNT_KIND
from dgx_operator.api.crdgen import KINDS, kind_by_name, openapi_schema
from dgx_operator.api.limits import DGXLimits
from dgx_operator.api.vocabulary import JobPhase
from dgx_operator.catalog import Catalog, UnknownInstanceError
from dgx_operator.render import BuildContext, BuildError, build_children
from dgx_operator.render.resolved import Defaults, Resolved, resolve
from dgx_operator.validation.objectmeta import (
    invalid,
    label_problems,
    label_value_errors,
    metadata_problems,
    qualified_name_errors,
)

DEFAULT_KUBE_VERSION = "1.34"
OUR_KINDS = tuple(k.kind for k in KINDS)


@functools.cache
def crd_schema(kind: str) -> dict[str, Any]:
    return openapi_schema(kind_by_name(kind))


@functools.cache
def kube_versions() -> tuple[str, ...]:
    """The Kubernetes minor versions (``1.34``) kubernetes-validate has schemas for, oldest first."""
    minors = {tuple(int(n) for n in v.split(".")[:2]) for v in kubernetes_validate.utils.all_versions()}
    return tuple(f"{major}.{minor}" for major, minor in sorted(minors))


@functools.cache
def builtin_validator(api_version: str, kind: str, kube_version: str) -> jsonschema.Validator | None:
    """The strict validator kubernetes-validate builds for a built-in kind, kept to iterate over
    every error (its own API raises the first). None if its schema layout is not the expected one."""
    utils = kubernetes_validate.utils
    try:
        version = [v for v in utils.all_versions() if utils.major_minor(v) <= utils.major_minor(kube_version)][-1]
        group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
        folder = f"kubernetes-json-schema/v{version}-local-strict"
        schema = utils.schema_contents(f"{folder}/{kind.lower()}-{group}.json", kube_version)
        definitions = utils.schema_contents(f"{folder}/_definitions.json", kube_version)
    except (OSError, IndexError, ValueError, utils.VersionNotSupportedError):
        return None
    registry: referencing.Registry[Any] = referencing.Registry()
    registry = referencing.Resource.from_contents(schema) @ (referencing.Resource.from_contents(definitions) @ registry)
    validator: jsonschema.Validator = jsonschema.Draft202012Validator(schema, registry=registry)
    return validator


def object_label(obj: Any) -> str:
    """``KIND/NAME`` for messages; tolerant of documents too broken to have either, and escaped
    (a name is whatever the manifest says until validated: it must not forge output)."""
    if not isinstance(obj, Mapping):
        return "<not an object>"
    kind = obj.get("kind") or "<no kind>"
    meta = obj.get("metadata")
    name = (meta.get("name") if isinstance(meta, Mapping) else None) or "<no name>"
    return printable(f"{_brief(kind)}/{_brief(name)}")


def _brief(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Outcome:
    """Problems make an object invalid; notes (e.g. a kind with no known schema) do not."""

    problems: tuple[Problem, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


class Validator:
    """Validates single objects; :func:`reference_problems` adds the rules across documents."""

    def __init__(
        self, catalog: Catalog, kube_version: str = DEFAULT_KUBE_VERSION, defaults: Defaults | None = None
    ) -> None:
        self.catalog = catalog
        self.kube_version = kube_version
        #: The operator's settings that shape the children (the master port): the rules of
        #: :func:`children_problems` compare the spec with them.
        self.defaults = defaults or Defaults()

    def validate(self, obj: Any, *, old: Any = None) -> Outcome:
        if not isinstance(obj, Mapping):
            return Outcome((Problem("", f"must be an object (a mapping), got {json_type(obj)}"),))
        obj = without_nulls(obj)
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        missing = [Problem(f, "Required value") for f, v in (("apiVersion", api_version), ("kind", kind)) if not v]
        if missing:
            return Outcome(tuple(missing))
        wrong = [
            Problem(f, f"must be of type string, got {json_type(v)}")
            for f, v in (("apiVersion", api_version), ("kind", kind))
            if not isinstance(v, str)
        ]
        if wrong:
            return Outcome(tuple(wrong))
        group = api_version.split("/")[0] if "/" in api_version else ""
        if group == GROUP:
            return self._validate_ours(obj, None if old is None else without_nulls(old))
        if group.lower() == GROUP or (kind in OUR_KINDS and not group and api_version.lower() == VERSION):
            # The API server knows no group "KubeDGX.io": kubectl would say "no matches for kind".
            return Outcome(
                (Problem("apiVersion", f"unknown API version {api_version!r}: did you mean {API_VERSION!r}?"),)
            )
        malformed = _malformed_type(api_version, kind)
        if malformed:
            return Outcome(malformed)
        outcome = self._validate_builtin(obj)
        meta = tuple(metadata_problems(obj.get("metadata"), types=False))
        return Outcome(tuple(sorted({*outcome.problems, *meta})), outcome.notes)

    # -- kubedgx.io kinds ---------------------------------------------------------------------

    def _validate_ours(self, obj: Mapping[str, Any], old: Any) -> Outcome:
        kind = obj["kind"]
        if kind not in OUR_KINDS:
            near = [k for k in OUR_KINDS if k.lower() == kind.lower()]
            hint = (
                f"did you mean {near[0]!r}? (kinds are case-sensitive)"
                if near
                else f"known kinds are {', '.join(OUR_KINDS)}"
            )
            return Outcome((Problem("kind", f"unknown kind {kind!r} in {GROUP}: {hint}"),))
        if obj["apiVersion"] != API_VERSION:
            return Outcome(
                (
                    Problem(
                        "apiVersion",
                        f"unsupported version {obj['apiVersion']!r}: this kubedgx serves {API_VERSION}",
                    ),
                )
            )
        problems = validate(crd_schema(kind), obj, old=old)
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping) or not meta.get("name"):
            problems.append(Problem("metadata.name", "Required value"))
        problems += metadata_problems(meta)
        if problems:
            return Outcome(tuple(sorted(set(problems))))
        if kind == BUDGET_KIND:
            # The one check a CRD cannot make: that spec.period.timeZone names a zone of the time zone
            # database (the model's validator asks zoneinfo).
            try:
                DGXBudget.model_validate(obj)
            except ValidationError as exc:
                return Outcome(tuple(_pydantic_problems(exc)))
            return Outcome()
        try:
            model: DGXTrainingJob | DGXDataMount | DGXLimits = (
                DGXTrainingJob.model_validate(obj)
                if kind == JOB_KIND
                else DGXDataMount.model_validate(obj)
                if kind == MOUNT_KIND
                else DGXLimits.model_validate(obj)
            )
        except ValidationError as exc:  # the schema accepted what the model refuses: a bug, say so
            return Outcome(tuple(_pydantic_problems(exc)))
        if isinstance(model, DGXTrainingJob):
            return Outcome(tuple(self.semantic_problems(model)))
        if isinstance(model, DGXLimits):
            return Outcome()  # the schema and its CEL rules say all (validation.limits applies it to jobs)
        return Outcome(tuple(mount_problems(model.spec)))

    def semantic_problems(self, job: DGXTrainingJob) -> list[Problem]:
        """Rules that depend on the instance catalog, which admins may change and a CRD therefore
        cannot hold: the instance type exists, NVLink-domain size, labels the instance decides.
        The admission webhook runs them at `kubectl apply` time."""
        spec = job.spec
        try:
            r = resolve(spec, self.catalog)
        except UnknownInstanceError as exc:
            return [Problem("spec.instance", exc.message)]
        problems: list[Problem] = []
        inst = r.instance
        domain = inst.family.nvlink_domain_nodes
        if inst.multi_node_nvlink and domain is not None and r.max_nodes > domain:
            problems.append(
                Problem(
                    "spec.elastic.maxNodes",
                    f"{inst.name} keeps a job inside one NVLink domain of {domain} nodes; "
                    f"maxNodes {r.max_nodes} can never be placed",
                )
            )
        # The pods' nodeSelector is a label map the API server validates when the operator creates
        # them; refused here, the job never gets that far.
        problems.extend(label_problems(spec.node_selector, "spec.nodeSelector"))
        owned = {**inst.node_selector, inst.labels.product: "", inst.labels.count: ""}
        for key, value in spec.node_selector.items():
            if key in owned and owned[key] != value:
                problems.append(
                    Problem(
                        join_path("spec.nodeSelector", key),
                        f"is decided by spec.instance ({inst.name}); change the instance type instead",
                    )
                )
        problems.extend(children_problems(job, r, self.defaults))
        return problems

    # -- everything else ----------------------------------------------------------------------

    def _validate_builtin(self, obj: Mapping[str, Any]) -> Outcome:
        try:
            kubernetes_validate.validate(dict(obj), self.kube_version, strict=True)
        except (kubernetes_validate.SchemaNotFoundError, OSError):
            note = f"no schema for {obj['apiVersion']} {obj['kind']} in Kubernetes {self.kube_version}; not checked"
            return Outcome(notes=(note,))
        except jsonschema.ValidationError as first:
            # kubernetes-validate stops at the first error; report them all, one line each.
            validator = builtin_validator(str(obj["apiVersion"]), str(obj["kind"]), self.kube_version)
            errors = list(validator.iter_errors(dict(obj))) if validator is not None else [first]
            return Outcome(tuple(sorted({p for e in errors for p in explain(e)})))
        return Outcome()


#: The largest activeDeadlineSeconds the API server takes for a pod (a Go int32 bound).
MAX_ACTIVE_DEADLINE_S = 2**31 - 1
#: The pod fields an environment variable can read through fieldRef (the API server's list for env,
#: core/validation validEnvDownwardAPIFieldPathExpressions); spec.host is its old name of
#: spec.nodeName, which it still converts.
ENV_FIELD_PATHS = (
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
)
_ENV_FIELD_ALIASES = {"spec.host": "spec.nodeName"}
#: ... and the container resources through resourceFieldRef, plus hugepages-<size> under either.
ENV_RESOURCES = (
    "limits.cpu",
    "limits.ephemeral-storage",
    "limits.memory",
    "requests.cpu",
    "requests.ephemeral-storage",
    "requests.memory",
)
_SUBSCRIPT = re.compile(r"^(?P<path>.+?)\['(?P<key>.*)'\]$")


def children_problems(job: DGXTrainingJob, r: Resolved, defaults: Defaults) -> list[Problem]:
    """What the API server would refuse in the children built from a spec that it accepts as a
    DGXTrainingJob: the spec is stored, and only the operator's create of the Service or the pods
    fails, long after `kubectl apply` said yes. Each names the spec field to change. The webhook
    also dry-runs the children (admission.py) for what only the cluster knows (PodSecurity,
    PriorityClasses); these are the rules `kubedgx validate` can apply offline."""
    spec = job.spec
    problems: list[Problem] = []
    if r.rdzv_port == defaults.master_port:
        problems.append(
            Problem(
                "spec.elastic.rendezvous.port",
                f"must differ from {defaults.master_port}, the master port kubedgx opens on every worker "
                "(MASTER_PORT): the job's Service would list that port twice, which the API server refuses; "
                "pick another port",
            )
        )
    if r.max_duration_s is not None and r.max_duration_s > MAX_ACTIVE_DEADLINE_S:
        problems.append(
            Problem(
                "spec.maxDuration",
                f"must be at most {MAX_ACTIVE_DEADLINE_S}s (about 68 years): it becomes each worker's "
                "activeDeadlineSeconds, which the API server bounds there; shorten it, or leave maxDuration out "
                "for no deadline",
            )
        )
    for i, toleration in enumerate(spec.tolerations):
        path = f"spec.tolerations[{i}]"
        if toleration.key:
            problems += [
                Problem(f"{path}.key", invalid(toleration.key, why)) for why in qualified_name_errors(toleration.key)
            ]
        elif toleration.operator != "Exists":
            problems.append(
                Problem(
                    f"{path}.operator",
                    "must be Exists when key is empty (a toleration without a key matches every taint): "
                    "set a key, or operator: Exists",
                )
            )
        if toleration.operator != "Exists" and toleration.value:
            problems += [
                Problem(f"{path}.value", invalid(toleration.value, why)) for why in label_value_errors(toleration.value)
            ]
    for i, var in enumerate(spec.env):
        source = var.value_from
        if source is None:
            continue
        if source.field_ref is not None:
            ref = source.field_ref
            problems += _field_ref_problems(f"spec.env[{i}].valueFrom.fieldRef", ref.field_path, ref.api_version)
        if source.resource_field_ref is not None:
            resource = source.resource_field_ref.resource
            hugepages = resource.startswith(("limits.hugepages-", "requests.hugepages-"))
            if resource not in ENV_RESOURCES and not hugepages:
                problems.append(
                    Problem(
                        f"spec.env[{i}].valueFrom.resourceFieldRef.resource",
                        f"{invalid(resource, 'not a container resource the API server exposes')}; supported: "
                        f"{', '.join(ENV_RESOURCES)}, limits.hugepages-<size>, requests.hugepages-<size>",
                    )
                )
    return problems


def _field_ref_problems(path: str, field_path: str, api_version: str | None) -> list[Problem]:
    """apimachinery's check of an env var's fieldRef: version v1, a supported field, or a label or
    annotation by key (``metadata.labels['team']``)."""
    if api_version not in (None, "v1"):
        return [
            Problem(f"{path}.apiVersion", f"{invalid(api_version, 'unsupported pod version')}; use v1 or leave it out")
        ]
    subscripted = _SUBSCRIPT.match(field_path)
    if subscripted:
        base, key = subscripted["path"], subscripted["key"]
        if base not in ("metadata.labels", "metadata.annotations"):
            return [
                Problem(
                    f"{path}.fieldPath",
                    invalid(
                        field_path,
                        f"{base} has no keys to select; only metadata.labels['KEY'] and metadata.annotations['KEY'] do",
                    ),
                )
            ]
        key = key.lower() if base == "metadata.annotations" else key
        return [Problem(f"{path}.fieldPath", invalid(key, why)) for why in qualified_name_errors(key)]
    if _ENV_FIELD_ALIASES.get(field_path, field_path) not in ENV_FIELD_PATHS:
        supported = ", ".join(ENV_FIELD_PATHS)
        return [
            Problem(
                f"{path}.fieldPath",
                f"{invalid(field_path, 'not a pod field an environment variable can read')}; supported: {supported}, "
                "metadata.labels['KEY'], metadata.annotations['KEY']",
            )
        ]
    return []


def mount_problems(spec: DGXDataMountSpec) -> list[Problem]:
    """What the data plane would refuse at its first request (exit 2, the job failed on its nodes):
    an endpoint URL no request can go to (a port past 65535, a user:password in it, no host) or a
    region that is no region. The CRD's pattern cannot say it all; the data plane's own checks can."""
    problems = []
    for path, value, check in (
        ("spec.endpoint", spec.endpoint, check_endpoint),
        ("spec.region", spec.region, check_region),
    ):
        if value is None:
            continue
        try:
            check(value)
        except SyncError as err:
            problems.append(Problem(path, err.message))
    return problems


def jobs_with_mounts(
    objects: Iterable[tuple[Mapping[str, Any], Any]],
) -> list[tuple[Any, DGXTrainingJob, dict[str, DGXDataMountSpec]]]:
    """(key, job, the DGXDataMounts given in its namespace by name) for each job among ``(object,
    key)`` pairs of valid objects: what the checks that need a job's mounts start from."""
    mounts: dict[tuple[str, str], DGXDataMountSpec] = {}
    jobs: list[tuple[Any, DGXTrainingJob]] = []
    for obj, key in objects:
        if obj.get("apiVersion") != API_VERSION:
            continue
        if obj.get("kind") == MOUNT_KIND:
            mount = DGXDataMount.model_validate(obj)
            mounts[(mount.metadata.namespace or "default", mount.metadata.name)] = mount.spec
        elif obj.get("kind") == JOB_KIND:
            jobs.append((key, DGXTrainingJob.model_validate(obj)))
    out = []
    for key, job in jobs:
        ns = job.metadata.namespace or "default"
        out.append((key, job, {name: spec for (mns, name), spec in mounts.items() if mns == ns}))
    return out


def reference_problems(catalog: Catalog, objects: Iterable[tuple[Mapping[str, Any], Any]]) -> list[tuple[Any, Problem]]:
    """Rules between documents given together (``(object, key)`` pairs of objects that passed
    :meth:`Validator.validate`): each job
    whose DGXDataMounts are all among them is built, and what the builders refuse (an output
    directory inside a read-only input mount, a mount at a path kubedgx uses) is reported. Jobs that
    reference mounts living only in the cluster are left to the operator. Returns (key, problem)."""
    out: list[tuple[Any, Problem]] = []
    for key, job, found in jobs_with_mounts(objects):
        if any(ref.name not in found for ref in job.spec.data_mounts):
            continue
        try:
            build_children(job, BuildContext(catalog=catalog, data_mounts=found))
        except BuildError as exc:
            out.append((key, Problem(exc.path, exc.message)))
    return out


#: Fields that define what a job runs: changing them under running workers would leave a
#: half-old, half-new group. Suspend the job (or create a new one) to change them.
IMMUTABLE_WHILE_RUNNING = ("instance", "trainer", "command", "args")
ACTIVE_PHASES = (JobPhase.PENDING, JobPhase.RUNNING, JobPhase.RESTARTING)


def immutable_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Problem]:
    """Changes to fields that may not change while the job has workers."""
    status = old.get("status")
    # A status of the wrong shape (only the operator writes it) cannot say the job has workers.
    if not isinstance(status, Mapping) or status.get("phase") not in ACTIVE_PHASES or not status.get("startTime"):
        return []
    old_spec, new_spec = old.get("spec"), new.get("spec")
    if not isinstance(old_spec, Mapping) or not isinstance(new_spec, Mapping):
        return []
    return [
        Problem(
            f"spec.{name}",
            f"cannot change while the job is {status['phase']}: suspend it first (spec.suspend: true) "
            "or create a new job",
        )
        for name in IMMUTABLE_WHILE_RUNNING
        if old_spec.get(name) != new_spec.get(name)
    ]


_API_VERSION = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?v[0-9]+((alpha|beta)[0-9]+)?$"
)
_KIND = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,62}$")


def _malformed_type(api_version: str, kind: str) -> tuple[Problem, ...]:
    """apiVersion and kind that no API serves (kubectl: "no matches for kind"): said so, rather than
    looked up as a file name in the schema collection."""
    problems = []
    if not _API_VERSION.match(api_version):
        problems.append(
            Problem(
                "apiVersion", f"invalid value {_brief(api_version, 60)!r}: must be v1 or GROUP/VERSION, e.g. apps/v1"
            )
        )
    if not _KIND.match(kind):
        problems.append(
            Problem("kind", f"invalid value {_brief(kind, 60)!r}: a kind is a letter and letters or digits")
        )
    return tuple(problems)


def without_nulls(value: Any) -> Any:
    """``value`` with every null field of every mapping left out, as the API server prunes them:
    a CRD field that is not nullable (none of ours is) is dropped, then defaulted, and a built-in
    kind's Go struct leaves it at its zero value. ``backoffLimit: null`` is accepted, not refused."""
    if isinstance(value, Mapping):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def _pydantic_problems(exc: ValidationError) -> list[Problem]:
    problems = []
    for err in exc.errors():
        path = ""
        for part in err["loc"]:
            path = join_path(path, part)
        problems.append(Problem(path, err["msg"].removeprefix("Value error, ")))
    return problems
