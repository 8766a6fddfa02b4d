"""Generate ``crds/*.yaml`` (and docs/api.md) from the API models: ``python -m dgx_operator.api.crdgen [OUTDIR]``.

The CRDs are build output checked into git (Helm, Argo CD and ``kubectl apply -f crds/`` need
files); ``tests/unit/test_crdgen.py`` fails when they are stale. ``--check`` does the same here.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from dgx_api.schema import cel, structural_schema
from dgx_operator.api import GROUP, VERSION, apidoc
from dgx_operator.api.budget import DGXBudgetSpec, DGXBudgetStatus
from dgx_operator.api.common import BUDGET_KIND, JOB_KIND, MOUNT_KIND
from dgx_operator.api.datamount import DGXDataMountSpec, DGXDataMountStatus
from dgx_operator.api.limits import KIND as LIMITS_KIND
from dgx_operator.api.limits import LIMITS_NAME, LimitsSpec
from dgx_operator.api.trainingjob import (
    JOB_NAME_PATTERN,
    MAX_JOB_NAME,
    DGXTrainingJobSpec,
    DGXTrainingJobStatus,
)
from dgx_operator.api.vocabulary import BudgetCondition


@dataclass(frozen=True)
class Kind:
    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    spec: type[BaseModel]
    #: None: the kind has no status (and no status subresource): nothing observes it.
    status: type[BaseModel] | None
    description: str
    columns: tuple[dict[str, Any], ...]
    #: Restrictions on metadata.name (the only metadata field a CRD schema may restrict).
    name_schema: dict[str, Any] | None = None
    #: CEL rules on the whole object (``self.metadata.name`` is the only metadata they may read).
    rules: tuple[dict[str, str], ...] = ()

    @property
    def resource(self) -> tuple[str, str, str]:
        """(group, version, plural): how kopf's decorators and the cluster client name the kind."""
        return GROUP, VERSION, self.plural


KINDS: tuple[Kind, ...] = (
    Kind(
        kind=JOB_KIND,
        plural="dgxtrainingjobs",
        singular="dgxtrainingjob",
        short_names=("dgxjob",),
        spec=DGXTrainingJobSpec,
        status=DGXTrainingJobStatus,
        description=(
            "A QLoRA fine-tune or any torchrun-elastic program on whole DGX nodes, with NVLink-aware placement, "
            "elastic scaling, restart policies and honest status."
        ),
        columns=(
            {
                "name": "Phase",
                "type": "string",
                "jsonPath": ".status.phase",
                "description": "Lifecycle phase.",
            },
            {
                "name": "Instance",
                "type": "string",
                "jsonPath": ".spec.instance",
                "description": "Instance type.",
            },
            {
                "name": "Nodes",
                "type": "string",
                "jsonPath": ".status.nodes",
                "description": "Ready/desired workers.",
            },
            {
                "name": "Restarts",
                "type": "integer",
                "jsonPath": ".status.restarts",
                "description": "Restarts counted against backoffLimit.",
            },
            {
                "name": "Reason",
                "type": "string",
                "jsonPath": '.status.conditions[?(@.type=="Running")].reason',
                "description": (
                    "Why the job is in its phase: the Running condition's reason (e.g. ImagePullBackOff); on a "
                    "finished job, why it ended (Completed, WorkerFailed, ...), as the Finished condition says."
                ),
            },
            {
                "name": "Message",
                "type": "string",
                "jsonPath": '.status.conditions[?(@.type=="Running")].message',
                "priority": 1,
                "description": "The Running condition's message: which worker waits for what.",
            },
            {
                "name": "GPU-Hours",
                "type": "string",
                "jsonPath": ".status.usage.gpuHours",
                "description": "GPU-hours used so far, every attempt included.",
            },
            {
                "name": "Cost",
                "type": "string",
                "jsonPath": ".status.usage.cost",
                "description": "What they cost at the catalog's prices (see usage.currency).",
            },
            {
                "name": "Currency",
                "type": "string",
                "jsonPath": ".status.usage.currency",
                "priority": 1,
                "description": "The catalog's currency.",
            },
            {
                "name": "Step",
                "type": "integer",
                "jsonPath": ".status.progress.step",
                "priority": 1,
                "description": "Optimizer steps done.",
            },
            {
                "name": "Loss",
                "type": "number",
                "jsonPath": ".status.progress.loss",
                "priority": 1,
                "description": "Last training loss.",
            },
            {
                "name": "Priority",
                "type": "string",
                "jsonPath": ".spec.priority",
                "priority": 1,
                "description": "Scheduling priority.",
            },
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ),
        name_schema={
            "type": "string",
            "maxLength": MAX_JOB_NAME,
            "pattern": JOB_NAME_PATTERN,
            "description": f"Job name: a DNS-1035 label of at most {MAX_JOB_NAME} characters.",
        },
    ),
    Kind(
        kind=MOUNT_KIND,
        plural="dgxdatamounts",
        singular="dgxdatamount",
        short_names=("dgxmount",),
        spec=DGXDataMountSpec,
        status=DGXDataMountStatus,
        description=(
            "An s3:// or gs:// prefix synced to node-local NVMe before training (In), or the destination that "
            "checkpoints stream to and the final model is archived to (Out)."
        ),
        columns=(
            {
                "name": "Phase",
                "type": "string",
                "jsonPath": ".status.phase",
                "description": "Lifecycle phase.",
            },
            {
                "name": "Direction",
                "type": "string",
                "jsonPath": ".spec.direction",
                "description": "In or Out.",
            },
            {
                "name": "Source",
                "type": "string",
                "jsonPath": ".spec.source",
                "description": "Object-store URI.",
            },
            {
                "name": "Objects",
                "type": "integer",
                "jsonPath": ".status.objects",
                "description": "Objects listed.",
            },
            {
                "name": "Reason",
                "type": "string",
                "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
                "description": (
                    "The Ready condition's reason: Listed or Writable, Syncing, or what the store answered "
                    "(BucketNotFound, AccessDenied, Unreachable, ...)."
                ),
            },
            {
                "name": "Bytes",
                "type": "integer",
                "jsonPath": ".status.totalBytes",
                "priority": 1,
                "description": "Total size.",
            },
            {
                "name": "Message",
                "type": "string",
                "jsonPath": '.status.conditions[?(@.type=="Ready")].message',
                "priority": 1,
                "description": "The Ready condition's message: what was listed, or what went wrong.",
            },
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ),
    ),
    Kind(
        kind=LIMITS_KIND,
        plural="dgxlimits",
        singular="dgxlimits",
        short_names=("dgxlim",),
        spec=LimitsSpec,
        status=None,
        description=(
            "A namespace's guard rails for DGXTrainingJobs (as LimitRange is for pods): default and maximum "
            "maxDuration and maxPending, the end of interactive sessions, nodes per job, allowed instance types, "
            "capacities and priorities. One per namespace, named default; enforced at kubectl apply by the "
            "kubedgx webhook."
        ),
        columns=(
            {
                "name": "Max-Duration",
                "type": "string",
                "jsonPath": ".spec.maxDuration.max",
                "description": "The longest maxDuration a job may ask for.",
            },
            {
                "name": "Default-Duration",
                "type": "string",
                "jsonPath": ".spec.maxDuration.default",
                "description": "The maxDuration of a job that sets none.",
            },
            {
                "name": "Interactive",
                "type": "string",
                "jsonPath": ".spec.interactive.default",
                "description": "The maxDuration of an interactive debug session that sets none.",
            },
            {
                "name": "Max-Nodes",
                "type": "integer",
                "jsonPath": ".spec.maxNodes",
                "description": "The most nodes per job.",
            },
            {
                "name": "Priorities",
                "type": "string",
                "jsonPath": ".spec.priorities",
                "description": "Allowed values of spec.priority.",
            },
            {
                "name": "Instances",
                "type": "string",
                "jsonPath": ".spec.instances",
                "priority": 1,
                "description": "Allowed instance types (globs).",
            },
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ),
        name_schema={
            "type": "string",
            "maxLength": 253,
            "description": f"Always {LIMITS_NAME}: a namespace has one DGXLimits.",
        },
        rules=(
            cel(
                f"self.metadata.name == '{LIMITS_NAME}'",
                f"a namespace has one DGXLimits, named {LIMITS_NAME}: rename it to {LIMITS_NAME}",
                field_path=".metadata.name",
            ),
        ),
    ),
    Kind(
        kind=BUDGET_KIND,
        plural="dgxbudgets",
        singular="dgxbudget",
        short_names=("dgxb",),
        spec=DGXBudgetSpec,
        status=DGXBudgetStatus,
        description=(
            "A namespace's limit on money and GPU-hours per calendar week, month or rolling window: jobs whose worst "
            "case does not fit wait (BudgetExceeded); status is the ledger of what was spent and committed."
        ),
        columns=(
            {
                "name": "Limit",
                "type": "string",
                "jsonPath": ".spec.limits.cost",
                "description": "The cost limit per period, in status.currency.",
            },
            {
                "name": "Spent",
                "type": "string",
                "jsonPath": ".status.spent.cost",
                "description": "Money settled in this period.",
            },
            {
                "name": "Committed",
                "type": "string",
                "jsonPath": ".status.committed.cost",
                "description": "What the runs in progress may still cost.",
            },
            {
                "name": "Remaining",
                "type": "string",
                "jsonPath": ".status.remaining.cost",
                "description": "Limit minus spent minus committed.",
            },
            {
                "name": BudgetCondition.READY,
                "type": "string",
                "jsonPath": f'.status.conditions[?(@.type=="{BudgetCondition.READY}")].status',
                "description": "Whether the operator counts this budget (False: the Ready condition says why).",
            },
            {
                "name": "Period",
                "type": "string",
                "jsonPath": ".status.period.start",
                "description": "Start of the period counted now.",
            },
            {
                "name": "Currency",
                "type": "string",
                "jsonPath": ".status.currency",
                "priority": 1,
                "description": "The catalog's currency.",
            },
            {
                "name": "GPU-Hours-Limit",
                "type": "string",
                "jsonPath": ".spec.limits.gpuHours",
                "priority": 1,
                "description": "The GPU-hours limit per period.",
            },
            {
                "name": "GPU-Hours-Spent",
                "type": "string",
                "jsonPath": ".status.spent.gpuHours",
                "priority": 1,
                "description": "GPU-hours settled in this period.",
            },
            {
                "name": "GPU-Hours-Remaining",
                "type": "string",
                "jsonPath": ".status.remaining.gpuHours",
                "priority": 1,
                "description": "GPU-hours limit minus spent minus committed.",
            },
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ),
    ),
)


def kind_by_name(kind: str) -> Kind:
    for k in KINDS:
        if k.kind == kind:
            return k
    raise KeyError(kind)


#: The kinds' identities, for everything that names them (kopf's handlers and webhooks, the
#: cluster client, the metrics): one source, so a rename or a new version cannot miss a place.
TRAINING_JOBS: Kind = kind_by_name(JOB_KIND)
DATA_MOUNTS: Kind = kind_by_name(MOUNT_KIND)
LIMITS: Kind = kind_by_name(LIMITS_KIND)
BUDGETS: Kind = kind_by_name(BUDGET_KIND)


def openapi_schema(kind: Kind) -> dict[str, Any]:
    """The CRD's openAPIV3Schema for ``kind``: the object with its generated spec and status."""
    schema: dict[str, Any] = {
        "description": kind.description,
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "description": "APIVersion defines the versioned schema of this representation of an object.",
                "type": "string",
            },
            "kind": {
                "description": "Kind is a string value representing the REST resource.",
                "type": "string",
            },
            "metadata": {"type": "object"},
            "spec": structural_schema(kind.spec),
        },
    }
    if kind.status is not None:
        schema["properties"]["status"] = structural_schema(kind.status)
    if kind.name_schema is not None:
        schema["properties"]["metadata"]["properties"] = {"name": dict(kind.name_schema)}
    if kind.rules:
        schema["x-kubernetes-validations"] = [dict(r) for r in kind.rules]
    return schema


def crd(kind: Kind) -> dict[str, Any]:
    """The full CustomResourceDefinition for ``kind``."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{kind.plural}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "kubedgx", "app.kubernetes.io/part-of": "kubedgx"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.singular,
                "shortNames": list(kind.short_names),
                "categories": ["dgx"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    **({"subresources": {"status": {}}} if kind.status is not None else {}),
                    "additionalPrinterColumns": [dict(c) for c in kind.columns],
                    "schema": {"openAPIV3Schema": openapi_schema(kind)},
                }
            ],
        },
    }


HEADER = "# Generated by `python -m dgx_operator.api.crdgen` from dgx_operator.api. Do not edit.\n"


def render(kind: Kind) -> str:
    return HEADER + yaml.safe_dump(crd(kind), sort_keys=False, width=100, allow_unicode=True)


def file_name(kind: Kind) -> str:
    return f"{GROUP}_{kind.plural}.yaml"


def default_outdir() -> Path:
    """The checkout's crds/ (this file is operator/dgx_operator/api/crdgen.py)."""
    return Path(__file__).resolve().parents[3] / "crds"


def outputs(outdir: Path) -> dict[Path, str]:
    """Every generated file and its content: the CRDs, and docs/api.md next to crds/."""
    files = {outdir / file_name(kind): render(kind) for kind in KINDS}
    sections = [apidoc.section(k.kind, k.plural, k.short_names[0], openapi_schema(k)) for k in KINDS]
    files[outdir.parent / "docs" / "api.md"] = apidoc.render(sections)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dgx_operator.api.crdgen", description=__doc__)
    parser.add_argument("outdir", nargs="?", type=Path, default=None, help="where to write (default: crds/)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the files on disk are stale")
    args = parser.parse_args(argv)
    outdir: Path = args.outdir or default_outdir()
    stale = []
    for path, text in outputs(outdir).items():
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    if stale:
        print("stale generated files (run `python -m dgx_operator.api.crdgen`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
