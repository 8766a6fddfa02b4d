"""Invalid manifests, each rejected at the exact field path a user has to fix.

Every row is checked on up to four sides, so that the layers cannot drift apart:

* ``kubedgx validate`` (the CLI) prints ``FILE: KIND/NAME: PATH: MESSAGE`` and exits 1;
* layer ``crd``: the CRD file on disk (``crds/*.yaml``, what ``kubectl apply -f crds/`` installs) rejects
  the manifest by its schema and CEL rules alone, at the same path;
* layer ``apiserver``: the CRD file accepts it, the API server refuses it by its own checks of ``metadata``
  (ObjectMeta validation, which no CRD can express), and so does the :class:`Validator`;
* layer ``webhook``: the CRD file and the API server accept it, but what the operator would create from it
  (the pods) would be refused, so the :class:`Validator` (and with it the admission webhook) refuses it;
* layer ``catalog``: the CRD file accepts it (the rule needs the instance catalog, which admins can change),
  and only the :class:`Validator` (``kubedgx validate`` and the admission webhook) rejects it;
* the pydantic models refuse what the schema refuses per field (rule ``field``: type, enum, pattern, range,
  unknown field, required) and accept what only a rule outside the model rejects (``cel``: a CEL
  cross-field rule; ``list``: ``x-kubernetes-list-type`` uniqueness; ``catalog``: a catalog rule).
"""

from __future__ import annotations

import functools
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import pydantic
import pytest
import yaml

from dgx_api.schema import validate
from dgx_operator.api import DGXDataMount, DGXTrainingJob
from dgx_operator.catalog import Catalog
from dgx_operator.cli import main
from dgx_operator.validation import Validator
from tests.conftest import BASE_JOB, BASE_MOUNT, CRDS, DELETE, load_yaml_docs, with_changes

Base = Literal["job", "mount"]
Layer = Literal["crd", "apiserver", "webhook", "catalog"]
Rule = Literal["field", "cel", "list", "meta", "webhook", "catalog"]
#: The four checks a row goes through; a known source bug marks one of them xfail (strict).
Aspect = Literal["cli", "crd-file", "validator", "model"]


class Row(NamedTuple):
    id: str
    base: Base
    changes: dict[str, Any]
    path: str
    message: str
    layer: Layer
    rule: Rule
    #: (aspect, reason) pairs: checks that fail because of a source bug (see the reason).
    bugs: tuple[tuple[Aspect, str], ...] = ()


LONG_NAME = "a" * 51

# fmt: off
ROWS: tuple[Row, ...] = (
    # -- DGXTrainingJob: types, patterns, enums, ranges, unknown and missing fields -----------
    Row("min-nodes-not-int", "job", {"spec.elastic.minNodes": "two"}, "spec.elastic.minNodes",
        "must be of type integer", "crd", "field"),
    Row("instance-malformed", "job", {"spec.instance": "a100-8"}, "spec.instance", 'invalid value "a100-8"',
        "crd", "field"),
    Row("max-duration-not-duration", "job", {"spec.maxDuration": "1 day"}, "spec.maxDuration",
        "must be a Go duration", "crd", "field"),
    Row("max-pending-bare-number", "job", {"spec.maxPending": "90"}, "spec.maxPending", 'invalid value "90"',
        "crd", "field"),
    Row("backoff-limit-negative", "job", {"spec.backoffLimit": -1}, "spec.backoffLimit",
        "should be greater than or equal to 0", "crd", "field"),
    Row("retryable-exit-code-300", "job", {"spec.restartPolicy": "ExitCode", "spec.retryableExitCodes": [300]},
        "spec.retryableExitCodes[0]", "should be less than or equal to 255", "crd", "field"),
    Row("elastic-unknown-field", "job", {"spec.elastic.minNode": 2}, "spec.elastic.minNode",
        "did you mean 'minNodes'", "crd", "field"),
    Row("restart-policy-enum", "job", {"spec.restartPolicy": "Sometimes"}, "spec.restartPolicy",
        'Unsupported value: "Sometimes": supported values: "Never", "OnFailure", "ExitCode"', "crd", "field"),
    Row("priority-enum", "job", {"spec.priority": "urgent"}, "spec.priority",
        'Unsupported value: "urgent": supported values: "low", "normal", "high"', "crd", "field"),
    Row("memory-not-quantity", "job", {"spec.resources.memory": "lots"}, "spec.resources.memory",
        "must be a Kubernetes quantity", "crd", "field"),
    Row("max-seq-length-zero", "job", {"spec.trainer.training.maxSeqLength": 0},
        "spec.trainer.training.maxSeqLength", "should be greater than or equal to 1", "crd", "field"),
    Row("dataset-missing", "job", {"spec.trainer.dataset": DELETE}, "spec.trainer.dataset", "Required value",
        "crd", "field"),
    Row("mount-path-relative", "job", {"spec.dataMounts": [{"name": "corpus", "mountPath": "data"}]},
        "spec.dataMounts[0].mountPath", "must be an absolute path", "crd", "field"),
    Row("name-upper-case", "job", {"metadata.name": "MyJob"}, "metadata.name", "DNS-1035 label", "crd", "field"),
    Row("name-too-long", "job", {"metadata.name": LONG_NAME}, "metadata.name", "at most 50 characters",
        "crd", "field"),
    Row("memory-negative", "job", {"spec.resources.memory": "-1Gi"}, "spec.resources.memory",
        "must be a Kubernetes quantity of at least 0", "crd", "field"),
    Row("cpu-negative-integer", "job", {"spec.resources.cpu": -2}, "spec.resources.cpu",
        "should be greater than or equal to 0", "crd", "field"),
    # -- metadata: the API server's own ObjectMeta checks, which a CRD cannot express ----------------
    Row("label-key-with-space", "job", {"metadata.labels": {"team name": "ml"}}, "metadata.labels",
        'Invalid value: "team name": name part must consist of alphanumeric characters', "apiserver", "meta"),
    Row("label-value-with-slash", "job", {"metadata.labels": {"team": "ml/nlp"}}, "metadata.labels",
        'Invalid value: "ml/nlp": a valid label must be an empty string', "apiserver", "meta"),
    Row("label-key-prefix-upper-case", "job", {"metadata.labels": {"Example.com/team": "ml"}}, "metadata.labels",
        'Invalid value: "Example.com/team": prefix part a lowercase RFC 1123 subdomain', "apiserver", "meta"),
    Row("annotation-key-invalid", "mount", {"metadata.annotations": {"note!": "x"}}, "metadata.annotations",
        'Invalid value: "note!": name part must consist of alphanumeric characters', "apiserver", "meta"),
    Row("finalizer-invalid", "job", {"metadata.finalizers": ["not a finalizer"]}, "metadata.finalizers",
        'Invalid value: "not a finalizer"', "apiserver", "meta"),
    Row("metadata-unknown-field", "job", {"metadata.bogus": 1}, "metadata.bogus", "unknown field",
        "apiserver", "meta"),
    # -- what the pods would get: the API server refuses it only when the operator creates them ------
    Row("node-selector-key-with-space", "job", {"spec.nodeSelector": {"gpu type": "h100"}}, "spec.nodeSelector",
        'Invalid value: "gpu type": name part must consist', "webhook", "webhook"),
    Row("node-selector-value-invalid", "job", {"spec.nodeSelector": {"example.com/gpu": "h100 sxm"}},
        "spec.nodeSelector", 'Invalid value: "h100 sxm": a valid label must be an empty string', "webhook",
        "webhook"),
    # The Service would list the master port twice (422 Duplicate value) and no worker would be made.
    Row("rendezvous-port-is-the-master-port", "job", {"spec.elastic.rendezvous.port": 23456},
        "spec.elastic.rendezvous.port", "must differ from 23456, the master port kubedgx opens", "webhook",
        "webhook"),
    # 999999h (the schema's largest part) is 3.6e9 s: past the int32 of a pod's activeDeadlineSeconds.
    Row("max-duration-past-the-pod-deadline", "job", {"spec.maxDuration": "999999h"}, "spec.maxDuration",
        "must be at most 2147483647s", "webhook", "webhook"),
    Row("toleration-key-with-space", "job", {"spec.tolerations": [{"key": "gpu type", "operator": "Exists"}]},
        "spec.tolerations[0].key", 'Invalid value: "gpu type": name part must consist', "webhook", "webhook"),
    Row("toleration-without-key-not-exists", "job", {"spec.tolerations": [{"value": "x", "effect": "NoSchedule"}]},
        "spec.tolerations[0].operator", "must be Exists when key is empty", "webhook", "webhook"),
    Row("toleration-value-invalid", "job", {"spec.tolerations": [{"key": "team", "value": "ml team"}]},
        "spec.tolerations[0].value", 'Invalid value: "ml team": a valid label must be', "webhook", "webhook"),
    Row("env-field-ref-unsupported", "job",
        {"spec.env": [{"name": "PHASE", "valueFrom": {"fieldRef": {"fieldPath": "status.phase"}}}]},
        "spec.env[0].valueFrom.fieldRef.fieldPath", 'Invalid value: "status.phase": not a pod field', "webhook",
        "webhook"),
    Row("env-field-ref-bad-label-key", "job",
        {"spec.env": [{"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['a b']"}}}]},
        "spec.env[0].valueFrom.fieldRef.fieldPath", 'Invalid value: "a b": name part must consist', "webhook",
        "webhook"),
    Row("env-resource-field-ref-unsupported", "job",
        {"spec.env": [{"name": "GPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.nvidia.com/gpu"}}}]},
        "spec.env[0].valueFrom.resourceFieldRef.resource", "not a container resource the API server exposes",
        "webhook", "webhook"),
    # -- DGXTrainingJob: CEL cross-field rules ---------------------------------------------------
    Row("min-nodes-above-max", "job", {"spec.elastic": {"minNodes": 3, "maxNodes": 2}}, "spec.elastic.minNodes",
        "must be <= spec.elastic.maxNodes", "crd", "cel"),
    Row("trainer-and-command", "job", {"spec.command": ["torchrun", "/app/train.py"]}, "spec.command",
        "mutually exclusive", "crd", "cel"),
    Row("neither-trainer-nor-command", "job", {"spec.trainer": DELETE}, "spec",
        "set one of spec.trainer", "crd", "cel"),
    Row("max-duration-zero", "job", {"spec.maxDuration": "0s"}, "spec.maxDuration", "must be longer than 0s",
        "crd", "cel"),
    Row("env-reserved-prefix", "job", {"spec.env": [{"name": "PET_NNODES", "value": "2"}]}, "spec.env[0].name",
        "is reserved", "crd", "cel"),
    Row("env-reserved-name-second", "job",
        {"spec.env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "MASTER_ADDR", "value": "10.0.0.1"}]},
        "spec.env[1].name", "kubedgx sets MASTER_ADDR", "crd", "cel"),
    Row("env-value-and-value-from", "job",
        {"spec.env": [{"name": "TOKEN", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
        "spec.env[0].valueFrom", "set value or valueFrom, not both", "crd", "cel"),
    Row("env-value-from-empty", "job", {"spec.env": [{"name": "TOKEN", "valueFrom": {}}]}, "spec.env[0].valueFrom",
        "set exactly one of secretKeyRef", "crd", "cel"),
    Row("retryable-codes-on-failure", "job", {"spec.restartPolicy": "OnFailure", "spec.retryableExitCodes": [137]},
        "spec.retryableExitCodes", "only with restartPolicy: ExitCode", "crd", "cel"),
    Row("interactive-two-nodes", "job", {"spec.debug.interactive": True, "spec.elastic.maxNodes": 2},
        "spec.debug.interactive", "exactly one worker", "crd", "cel"),
    Row("gpu-above-instance", "job", {"spec.resources.gpu": 9}, "spec.resources.gpu",
        "must be <= 8, the GPUs per node of dgxa100.80g.8.norm", "crd", "cel"),
    Row("nproc-above-instance", "job", {"spec.instance": "dgxa100.80g.4.norm", "spec.elastic.nprocPerNode": 5},
        "spec.elastic.nprocPerNode",
        "must be <= 4, the GPUs per node of dgxa100.80g.4.norm: torchrun starts one process per GPU", "crd", "cel"),
    Row("quantization-4-and-8-bit", "job",
        {"spec.trainer.quantization": {"loadIn4bit": True, "loadIn8bit": True}},
        "spec.trainer.quantization.loadIn8bit", "mutually exclusive", "crd", "cel"),
    Row("eval-steps-without-eval-data", "job", {"spec.trainer.training.evalSteps": 50},
        "spec.trainer.training.evalSteps", "evalFraction > 0", "crd", "cel"),
    Row("lora-all-linear-not-alone", "job", {"spec.trainer.lora.targetModules": ["all-linear", "q_proj"]},
        "spec.trainer.lora.targetModules", "list it alone", "crd", "cel"),
    Row("mounts-share-mount-path", "job",
        {"spec.dataMounts": [{"name": "a", "mountPath": "/data"}, {"name": "b", "mountPath": "/data"}]},
        "spec.dataMounts", "share one mountPath", "crd", "cel"),
    Row("preload-without-mounts", "job", {"spec.dataCache": "preload"}, "spec.dataCache",
        "needs at least one entry in spec.dataMounts", "crd", "cel"),
    Row("args-without-command", "job", {"spec.args": ["--epochs", "3"]}, "spec.args", "args need spec.command",
        "crd", "cel"),
    Row("toleration-exists-with-value", "job",
        {"spec.tolerations": [{"key": "team", "operator": "Exists", "value": "ml"}]},
        "spec.tolerations[0].value", "leave value empty", "crd", "cel"),
    Row("toleration-seconds-without-no-execute", "job",
        {"spec.tolerations": [{"key": "team", "effect": "NoSchedule", "tolerationSeconds": 60}]},
        "spec.tolerations[0].tolerationSeconds", "only to effect NoExecute", "crd", "cel"),
    # -- DGXTrainingJob: list-type uniqueness ----------------------------------------------------
    Row("env-duplicate-names", "job",
        {"spec.env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "NCCL_DEBUG", "value": "WARN"}]},
        "spec.env[1]", 'Duplicate value: {"name":"NCCL_DEBUG"}', "crd", "list"),
    # -- DGXTrainingJob: rules that need the instance catalog -----------------------------------
    Row("instance-unknown-shape", "job", {"spec.instance": "dgxa100.80g.16.norm"}, "spec.instance",
        "unknown instance type 'dgxa100.80g.16.norm'", "catalog", "catalog"),
    Row("node-selector-overrides-capacity", "job",
        {"spec.instance": "dgxh100.80g.8.spot", "spec.nodeSelector": {"kubedgx.io/capacity": "norm"}},
        'spec.nodeSelector["kubedgx.io/capacity"]', "is decided by spec.instance", "catalog", "catalog"),
    Row("gb200-beyond-nvlink-domain", "job", {"spec.instance": "dgxgb200.186g.4.norm", "spec.elastic.maxNodes": 20},
        "spec.elastic.maxNodes", "NVLink domain of 18 nodes", "catalog", "catalog"),
    # -- DGXDataMount ------------------------------------------------------------------------------
    Row("mount-source-http", "mount", {"spec.source": "http://bucket/x"}, "spec.source",
        "must be an object-store URI", "crd", "field"),
    Row("mount-source-upper-case-bucket", "mount", {"spec.source": "s3://B"}, "spec.source", 'invalid value "s3://B"',
        "crd", "field"),
    Row("mount-direction-enum", "mount", {"spec.direction": "Both"}, "spec.direction",
        'Unsupported value: "Both": supported values: "In", "Out"', "crd", "field"),
    Row("mount-endpoint-port-out-of-range", "mount", {"spec.endpoint": "https://minio.storage.svc:99999"},
        "spec.endpoint", "invalid endpoint URL", "webhook", "webhook"),
    Row("mount-endpoint-with-credentials", "mount", {"spec.endpoint": "https://user:secret@minio:9000"},
        "spec.endpoint", "credentials do not belong in it", "webhook", "webhook"),
    Row("mount-region-with-spaces", "mount", {"spec.region": "us east 1"}, "spec.region", "invalid region",
        "webhook", "webhook"),
    Row("mount-source-missing", "mount", {"spec.source": DELETE}, "spec.source", "Required value", "crd", "field"),
    Row("mount-endpoint-with-gs-port-out-of-range", "mount",
        {"spec.source": "gs://bucket/prefix", "spec.endpoint": "https://storage-psc.p.googleapis.com:99999"},
        "spec.endpoint", "invalid endpoint URL", "webhook", "webhook"),
    Row("mount-region-with-gs", "mount", {"spec.source": "gs://bucket/prefix", "spec.region": "us-east-1"},
        "spec.region", "only to s3:// sources", "crd", "cel"),
    Row("mount-archive-direction-in", "mount", {"spec.direction": "In", "spec.archive": {"prefix": "final"}},
        "spec.archive", "only to direction: Out", "crd", "cel"),
    Row("mount-pvc-without-size", "mount", {"spec.cache": {"type": "pvc"}}, "spec.cache.size",
        "a pvc cache needs a size", "crd", "cel"),
    Row("mount-credentials-key-with-s3", "mount", {"spec.credentialsSecretRef": {"name": "aws", "key": "creds"}},
        "spec.credentialsSecretRef.key", "credentialsSecretRef.key is for gs://", "crd", "cel"),
)
# fmt: on

BASES: dict[Base, dict[str, Any]] = {"job": BASE_JOB, "mount": BASE_MOUNT}
KIND_OF: dict[Base, str] = {"job": "DGXTrainingJob", "mount": "DGXDataMount"}
CRD_FILES: dict[Base, str] = {"job": "kubedgx.io_dgxtrainingjobs.yaml", "mount": "kubedgx.io_dgxdatamounts.yaml"}
MODELS: dict[Base, type[pydantic.BaseModel]] = {"job": DGXTrainingJob, "mount": DGXDataMount}


def manifest(row: Row) -> dict[str, Any]:
    return with_changes(BASES[row.base], row.changes)


@functools.cache
def crd_file_schema(base: Base) -> dict[str, Any]:
    """The openAPIV3Schema exactly as the CRD file on disk carries it (not regenerated)."""
    docs = load_yaml_docs(CRDS / CRD_FILES[base])
    assert len(docs) == 1, f"{CRD_FILES[base]}: expected one document"
    assert docs[0]["spec"]["names"]["kind"] == KIND_OF[base]
    schema: dict[str, Any] = docs[0]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def cases(aspect: Aspect, rows: Sequence[Row]) -> list[Any]:
    """pytest params for one aspect; a row's known bug in that aspect becomes a strict xfail."""
    out = []
    for row in rows:
        reasons = [reason for where, reason in row.bugs if where == aspect]
        marks = [pytest.mark.xfail(strict=True, reason=reasons[0])] if reasons else []
        out.append(pytest.param(row, id=row.id, marks=marks))
    return out


CRD_ROWS = [r for r in ROWS if r.layer == "crd"]
APISERVER_ROWS = [r for r in ROWS if r.layer == "apiserver"]
WEBHOOK_ROWS = [r for r in ROWS if r.layer == "webhook"]
CATALOG_ROWS = [r for r in ROWS if r.layer == "catalog"]
#: Rows the CRD file alone accepts and only the Validator (with the API server's own checks) refuses.
VALIDATOR_ROWS = APISERVER_ROWS + WEBHOOK_ROWS + CATALOG_ROWS


# -- the table itself -----------------------------------------------------------------------------


def test_table_is_large_and_mostly_crd() -> None:
    assert len(ROWS) >= 30
    assert len({r.id for r in ROWS}) == len(ROWS), "row ids must be unique"
    assert len(CATALOG_ROWS) <= 4
    assert len(CRD_ROWS) > len(ROWS) / 2
    # The layer and the rule kind must agree: catalog rules are exactly the catalog layer.
    assert all((r.layer == "catalog") == (r.rule == "catalog") for r in ROWS)
    assert {r.base for r in ROWS} == {"job", "mount"}


@pytest.mark.parametrize("base", ["job", "mount"])
def test_bases_are_valid_everywhere(base: Base, tmp_path: Path, catalog: Catalog) -> None:
    """The control: without the row's change, every layer accepts, so each rejection below is the change's."""
    doc = BASES[base]
    assert validate(crd_file_schema(base), doc) == []
    assert Validator(catalog).validate(doc).ok
    MODELS[base].model_validate(doc)
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    assert main(["validate", str(path)], out=out, err=err) == 0, out.getvalue() + err.getvalue()
    assert out.getvalue() == ""


# -- a) the CLI ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("row", cases("cli", ROWS))
def test_cli_reports_exact_path(row: Row, tmp_path: Path) -> None:
    doc = manifest(row)
    path = tmp_path / f"{row.id}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()

    code = main(["validate", str(path)], out=out, err=err)

    lines = out.getvalue().splitlines()
    prefix = f"{path}: {doc['kind']}/{doc['metadata']['name']}: {row.path}: "
    assert code == 1, f"exit {code}; stdout={lines}; stderr={err.getvalue()!r}"
    assert all(line.startswith(f"{path}: ") for line in lines), lines
    matching = [line for line in lines if line.startswith(prefix)]
    assert matching, f"no line starts with {prefix!r}: {lines}"
    assert any(row.message in line[len(prefix) :] for line in matching), f"{row.message!r} not in {matching}"


# -- b) and c) the CRD file on disk, and the catalog layer -----------------------------------------


@pytest.mark.parametrize("row", cases("crd-file", CRD_ROWS))
def test_crd_file_rejects_crd_rows(row: Row) -> None:
    problems = validate(crd_file_schema(row.base), manifest(row))
    at_path = [p for p in problems if p.path == row.path]
    assert at_path, f"the installed CRD does not reject {row.path}; it reports {[str(p) for p in problems]}"
    assert any(row.message in p.message for p in at_path), [str(p) for p in at_path]


@pytest.mark.parametrize("row", cases("crd-file", VALIDATOR_ROWS))
def test_crd_file_accepts_validator_rows(row: Row) -> None:
    assert validate(crd_file_schema(row.base), manifest(row)) == []


@pytest.mark.parametrize("row", cases("validator", VALIDATOR_ROWS))
def test_validator_rejects_validator_rows(row: Row, catalog: Catalog) -> None:
    outcome = Validator(catalog).validate(manifest(row))
    assert not outcome.ok
    at_path = [p for p in outcome.problems if p.path == row.path]
    assert at_path, f"expected a problem at {row.path}, got {[str(p) for p in outcome.problems]}"
    assert any(row.message in p.message for p in at_path)


#: Next to each webhook row, what the API server takes in the same field: the rules must not refuse it.
ACCEPTED_NEAR_WEBHOOK_ROWS: dict[str, dict[str, Any]] = {
    "rendezvous-port-next-to-the-master-port": {"spec.elastic.rendezvous.port": 23457},
    "max-duration-at-the-pod-deadline": {"spec.maxDuration": "596523h14m7s"},
    "toleration-of-every-taint": {"spec.tolerations": [{"operator": "Exists"}]},
    "toleration-equal-empty-value": {"spec.tolerations": [{"key": "example.com/team", "effect": "NoSchedule"}]},
    "env-field-refs": {
        "spec.env": [
            {"name": f"F{i}", "valueFrom": {"fieldRef": {"fieldPath": path, **extra}}}
            for i, (path, extra) in enumerate(
                [
                    ("status.podIP", {}),
                    ("spec.host", {}),  # the old name of spec.nodeName, which the API server still converts
                    ("metadata.labels['example.com/team']", {"apiVersion": "v1"}),
                    ("metadata.annotations['Example.com/Note']", {}),  # annotation keys are compared lower-cased
                ]
            )
        ]
    },
    "env-resource-field-refs": {
        "spec.env": [
            {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}},
            {"name": "HUGE", "valueFrom": {"resourceFieldRef": {"resource": "requests.hugepages-2Mi"}}},
        ]
    },
}


@pytest.mark.parametrize("changes", ACCEPTED_NEAR_WEBHOOK_ROWS.values(), ids=ACCEPTED_NEAR_WEBHOOK_ROWS)
def test_validator_accepts_what_the_pods_take(changes: dict[str, Any], catalog: Catalog) -> None:
    outcome = Validator(catalog).validate(with_changes(BASE_JOB, changes))
    assert outcome.ok, [str(p) for p in outcome.problems]


def test_catalog_rules_follow_the_catalog(tmp_path: Path, catalog: Catalog) -> None:
    """A catalog row is a catalog rule, not a hidden schema rule: with a catalog that defines the
    16-GPU shape, the same manifest is valid."""
    row = next(r for r in CATALOG_ROWS if r.id == "instance-unknown-shape")
    data = catalog.spec.model_dump(by_alias=True, mode="json")
    for family in data["gpus"]:
        if family["family"] == "a100" and family["memoryGiB"] == 80:
            family["shapes"] = [*family["shapes"], 16]
            family.pop("node", None)  # a 16-GPU node is another node model than the 8-GPU DGX named
    wider = Catalog.from_mapping(data)
    assert not Validator(catalog).validate(manifest(row)).ok
    assert Validator(wider).validate(manifest(row)).ok


# -- d) the pydantic models agree with the schema -----------------------------------------------------


@pytest.mark.parametrize("row", cases("model", ROWS))
def test_model_agrees_with_schema(row: Row) -> None:
    model = MODELS[row.base]
    doc = manifest(row)
    if row.rule == "field":
        with pytest.raises(pydantic.ValidationError):
            model.model_validate(doc)
    else:
        model.model_validate(doc)  # only a CEL, list-type or catalog rule rejects it, not the model


def _loc_path(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        out = f"{out}[{part}]" if isinstance(part, int) else (f"{out}.{part}" if out else str(part))
    return out


@pytest.mark.parametrize("row", cases("model", [r for r in ROWS if r.rule == "field"]))
def test_model_error_names_the_same_field(row: Row) -> None:
    """The model's error is about the row's field: at its path, below it (a branch of a union such as
    int-or-string), or at an enclosing object whose validator names the field in its message."""
    with pytest.raises(pydantic.ValidationError) as info:
        MODELS[row.base].model_validate(manifest(row))
    errors: Sequence[Mapping[str, Any]] = info.value.errors()

    def about_the_field(err: Mapping[str, Any]) -> bool:
        loc = _loc_path(err["loc"])
        if loc == row.path or loc.startswith((row.path + ".", row.path + "[")):
            return True
        return row.path.startswith(loc + ".") and row.path in str(err["msg"])

    assert any(about_the_field(err) for err in errors), [(err["loc"], err["msg"]) for err in errors]
