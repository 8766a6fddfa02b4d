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
from typing import Any

import pydantic
import pytest
import yaml

from dgx_api.schema import validate
from dgx_operator.api import DGXDataMount, DGXTrainingJob
from dgx_operator.catalog import Catalog
from dgx_operator.cli.main import main
from dgx_operator.validation.validator import Validator
from tests.conftest import BASE_JOB, CRDS, load_yaml_docs, with_changes
from tests.unit.bad_input_rows import (
    ACCEPTED_NEAR_WEBHOOK_ROWS,
    APISERVER_ROWS,
    BASES,
    CATALOG_ROWS,
    CRD_ROWS,
    ROWS,
    WEBHOOK_ROWS,
    Aspect,
    Base,
    Row,
    manifest,
)

KIND_OF: dict[Base, str] = {"job": "DGXTrainingJob", "mount": "DGXDataMount"}
CRD_FILES: dict[Base, str] = {"job": "kubedgx.io_dgxtrainingjobs.yaml", "mount": "kubedgx.io_dgxdatamounts.yaml"}
MODELS: dict[Base, type[pydantic.BaseModel]] = {"job": DGXTrainingJob, "mount": DGXDataMount}


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
