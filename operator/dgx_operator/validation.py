"""Validation of manifests, the same everywhere: `kubedgx validate`, `kubedgx render` and the
admission webhook all call :class:`Validator`.

Three layers, in the order the API server would apply them:

1. the generated CRD schema and its CEL rules (:func:`dgx_trainer.schema.validate`), i.e. what a
   cluster with our CRDs installed rejects by itself;
2. semantic rules that need data a CRD cannot hold: the instance catalog (which the chart lets
   admins change) and cross-document references;
3. for any other object, the official Kubernetes schemas (kubernetes-validate, strict).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
import kubernetes_validate
from pydantic import ValidationError

from dgx_operator.api import API_VERSION, GROUP, DGXDataMount, DGXTrainingJob
from dgx_operator.build.resolved import resolve
from dgx_operator.catalog import Catalog, UnknownInstanceError
from dgx_operator.crdgen import KINDS, kind_by_name, openapi_schema
from dgx_trainer.schema import Problem, explain, join_path, validate

DEFAULT_KUBE_VERSION = "1.34"
OUR_KINDS = tuple(k.kind for k in KINDS)


@functools.cache
def crd_schema(kind: str) -> dict[str, Any]:
    return openapi_schema(kind_by_name(kind))


def object_label(obj: Any) -> str:
    """``KIND/NAME`` for messages; tolerant of documents too broken to have either."""
    if not isinstance(obj, Mapping):
        return "<not an object>"
    kind = obj.get("kind") or "<no kind>"
    meta = obj.get("metadata")
    name = (meta.get("name") if isinstance(meta, Mapping) else None) or "<no name>"
    return f"{kind}/{name}"


@dataclass(frozen=True)
class Outcome:
    """Problems make an object invalid; notes (e.g. a kind with no known schema) do not."""

    problems: tuple[Problem, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


class Validator:
    """Validates single objects; :meth:`check_references` adds the cross-document rules."""

    def __init__(self, catalog: Catalog, kube_version: str = DEFAULT_KUBE_VERSION) -> None:
        self.catalog = catalog
        self.kube_version = kube_version

    def validate(self, obj: Any, *, old: Any = None) -> Outcome:
        if not isinstance(obj, Mapping):
            return Outcome((Problem("", f"must be an object (a mapping), got {type(obj).__name__}"),))
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        missing = [Problem(f, "Required value") for f, v in (("apiVersion", api_version), ("kind", kind)) if not v]
        if missing:
            return Outcome(tuple(missing))
        if isinstance(api_version, str) and api_version.split("/")[0] == GROUP:
            return self._validate_ours(obj, old)
        return self._validate_builtin(obj)

    # -- kubedgx.io kinds ---------------------------------------------------------------------

    def _validate_ours(self, obj: Mapping[str, Any], old: Any) -> Outcome:
        kind = obj["kind"]
        if kind not in OUR_KINDS:
            return Outcome(
                (Problem("kind", f"unknown kind {kind!r} in {GROUP}: known kinds are {', '.join(OUR_KINDS)}"),)
            )
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
        if problems:
            return Outcome(tuple(sorted(set(problems))))
        try:
            model: DGXTrainingJob | DGXDataMount = (
                DGXTrainingJob.model_validate(obj) if kind == "DGXTrainingJob" else DGXDataMount.model_validate(obj)
            )
        except ValidationError as exc:  # the schema accepted what the model refuses: a bug, say so
            return Outcome(tuple(_pydantic_problems(exc)))
        if isinstance(model, DGXTrainingJob):
            return Outcome(tuple(self.semantic_problems(model)))
        return Outcome()

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
        owned = {**inst.node_selector, inst.labels.product: "", inst.labels.count: ""}
        for key, value in spec.node_selector.items():
            if key in owned and owned[key] != value:
                problems.append(
                    Problem(
                        f"spec.nodeSelector[{key!r}]",
                        f"is decided by spec.instance ({inst.name}); change the instance type instead",
                    )
                )
        return problems

    # -- everything else ----------------------------------------------------------------------

    def _validate_builtin(self, obj: Mapping[str, Any]) -> Outcome:
        try:
            kubernetes_validate.validate(dict(obj), self.kube_version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            return Outcome(
                notes=(
                    f"no schema for {obj['apiVersion']} {obj['kind']} in Kubernetes {self.kube_version}; not checked",
                )
            )
        except jsonschema.ValidationError as exc:
            return Outcome(tuple(explain(exc)))
        return Outcome()


def reference_problems(objects: Iterable[tuple[Mapping[str, Any], Any]]) -> list[tuple[Any, Problem]]:
    """Rules between documents given together (``(object, key)`` pairs): a trainer that writes
    its output into an input mount, which workers see read-only. Returns (key, problem) pairs."""
    mounts: dict[tuple[str, str], Mapping[str, Any]] = {}
    jobs: list[tuple[Any, Mapping[str, Any]]] = []
    for obj, key in objects:
        if obj.get("apiVersion") != API_VERSION:
            continue
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace") or "default"
        if obj.get("kind") == "DGXDataMount":
            mounts[(ns, meta.get("name", ""))] = obj
        elif obj.get("kind") == "DGXTrainingJob":
            jobs.append((key, obj))
    out: list[tuple[Any, Problem]] = []
    for key, job in jobs:
        ns = (job.get("metadata") or {}).get("namespace") or "default"
        spec = job.get("spec") or {}
        trainer = spec.get("trainer") or {}
        output_dir = (trainer.get("output") or {}).get("dir")
        for i, ref in enumerate(spec.get("dataMounts") or []):
            mount = mounts.get((ns, ref.get("name", "")))
            if mount is None:
                continue
            direction = (mount.get("spec") or {}).get("direction", "In")
            mount_path = str(ref.get("mountPath", "")).rstrip("/")
            if (
                direction == "In"
                and output_dir
                and (output_dir == mount_path or output_dir.startswith(mount_path + "/"))
            ):
                out.append(
                    (
                        key,
                        Problem(
                            "spec.trainer.output.dir",
                            f"is inside spec.dataMounts[{i}] ({ref.get('name')}), an input mount that "
                            "workers see read-only; use a direction: Out mount for outputs",
                        ),
                    )
                )
    return out


def _pydantic_problems(exc: ValidationError) -> list[Problem]:
    problems = []
    for err in exc.errors():
        path = ""
        for part in err["loc"]:
            path = join_path(path, part)
        problems.append(Problem(path, err["msg"]))
    return problems
