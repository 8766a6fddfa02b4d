"""The generated CRDs: up to date, structural, documented, and with CEL rules that work."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dgx_api.schema import KUBERNETES_CEL_FUNCTIONS, cel, to_cel, validate
from dgx_api.trainer_config import trainer_schema
from dgx_operator.api.crdgen import KINDS, Kind, crd, default_outdir, file_name, kind_by_name, outputs
from dgx_operator.api.trainingjob import INSTANCE_PATTERN
from dgx_operator.catalog import Catalog
from tests.conftest import BASE_BUDGET, BASE_JOB, BASE_MOUNT, CRDS, ROOT, example_files, load_yaml_docs

Node = Mapping[str, Any]
CHART_CRDS = CRDS.parent / "charts" / "kubedgx" / "templates" / "crds"


def on_disk(kind: Kind) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CRDS / file_name(kind)).read_text(encoding="utf-8"))
    return loaded


def openapi(kind: Kind) -> dict[str, Any]:
    schema: dict[str, Any] = on_disk(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def walk(node: Node, path: str = "") -> Iterator[tuple[str, Node]]:
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), Mapping):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), Mapping):
        yield from walk(node["additionalProperties"], f"{path}.*")


def structural_violations(root: Node) -> list[str]:
    """The rules of https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/
    #specifying-a-structural-schema, plus our own conventions (no defaults, bounded lists, descriptions)."""
    out: list[str] = []
    for path, node in walk(root):
        int_or_string = node.get("x-kubernetes-int-or-string") is True
        if "type" not in node and not int_or_string and not node.get("x-kubernetes-preserve-unknown-fields"):
            out.append(f"{path}: no type")
        for banned in ("$ref", "definitions", "$defs", "title", "default", "oneOf", "allOf", "not", "nullable"):
            if banned in node:
                out.append(f"{path}: has {banned}")
        if node.get("uniqueItems"):
            out.append(f"{path}: uniqueItems is forbidden in CRDs")
        if node.get("additionalProperties") is False:
            out.append(f"{path}: additionalProperties false is not structural")
        if "properties" in node and "additionalProperties" in node:
            out.append(f"{path}: properties and additionalProperties together")
        if "anyOf" in node and not (int_or_string and node["anyOf"] == [{"type": "integer"}, {"type": "string"}]):
            out.append(f"{path}: anyOf other than int-or-string")
        if int_or_string and "type" in node:
            out.append(f"{path}: int-or-string must not have a type")
        if node.get("type") == "array" and "maxItems" not in node:
            out.append(f"{path}: list without maxItems (CEL cost estimation needs a bound)")
        is_field = path.count(".") > 0 and path != ".metadata" and not path.endswith(("[]", ".*"))
        if is_field and not node.get("description"):
            out.append(f"{path}: no description")
        if node.get("x-kubernetes-list-type") == "map":
            keys = node.get("x-kubernetes-list-map-keys", [])
            required = set(node["items"].get("required", []))
            if not keys or not set(keys) <= required:
                out.append(f"{path}: list-map keys {keys} must be required in items")
        if path == ".metadata" and not set(node.get("properties", {})) <= {"name", "generateName"}:
            out.append(".metadata: only name and generateName may be restricted")
    return out


@pytest.mark.parametrize("path", sorted(outputs(CRDS)), ids=lambda p: p.name)
def test_generated_files_on_disk_are_up_to_date(path: Path) -> None:
    assert path.read_text(encoding="utf-8") == outputs(CRDS)[path], (
        f"{path} is stale: run `python -m dgx_operator.api.crdgen` and commit the result"
    )


def test_the_default_output_is_the_checkouts_crds() -> None:
    """`python -m dgx_operator.api.crdgen --check` with no directory (what CI runs) checks crds/."""
    assert default_outdir() == CRDS
    check = subprocess.run([sys.executable, "-m", "dgx_operator.api.crdgen", "--check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_api_reference_lists_every_field_with_its_description() -> None:
    text = outputs(CRDS)[CRDS.parent / "docs" / "api.md"]
    assert "| `spec.elastic.minNodes` | integer (>= 1, <= 512) | Fewest nodes" in text
    assert "| `spec.env[].name` | string |" in text
    assert "- `spec.elastic.minNodes`: must be <= spec.elastic.maxNodes" in text
    assert "- `spec.resources.gpu`: must not exceed the GPUs per node" in text


def test_crdgen_check_mode_detects_staleness(tmp_path: Path) -> None:
    tmp_path = tmp_path / "crds"  # docs/api.md goes next to it, inside the temporary directory
    gen = [sys.executable, "-m", "dgx_operator.api.crdgen"]
    assert subprocess.run([*gen, str(tmp_path)], capture_output=True, check=False).returncode == 0
    assert subprocess.run([*gen, "--check", str(tmp_path)], capture_output=True, check=False).returncode == 0
    victim = tmp_path / file_name(KINDS[0])
    victim.write_text(victim.read_text(encoding="utf-8").replace("dgxjob", "dgxjb"), encoding="utf-8")
    stale = subprocess.run([*gen, "--check", str(tmp_path)], capture_output=True, text=True, check=False)
    assert stale.returncode == 1
    assert "stale" in stale.stderr
    assert victim.name in stale.stderr


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_schemas_are_structural(kind: Kind) -> None:
    assert structural_violations(openapi(kind)) == []


def test_the_structural_checker_catches_violations() -> None:
    bad = {
        "type": "object",
        "properties": {
            "a": {"description": "no type"},
            "b": {"type": "array", "description": "unbounded", "items": {"type": "string"}},
            "c": {"type": "string", "default": "x", "description": "defaulted"},
            "d": {"type": "integer"},
        },
    }
    problems = structural_violations(bad)
    assert ".a: no type" in problems
    assert ".b: list without maxItems (CEL cost estimation needs a bound)" in problems
    assert ".c: has default" in problems
    assert ".d: no description" in problems


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_crd_shape(kind: Kind) -> None:
    doc = on_disk(kind)
    assert doc["apiVersion"] == "apiextensions.k8s.io/v1"
    spec = doc["spec"]
    assert doc["metadata"]["name"] == f"{spec['names']['plural']}.kubedgx.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["categories"] == ["dgx"]
    assert spec["names"]["shortNames"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1"
    assert version["served"]
    assert version["storage"]
    # A kind nothing observes (DGXLimits) has no status, and so no status subresource.
    observed = kind.status is not None
    assert version.get("subresources") == ({"status": {}} if observed else None)
    assert set(version["schema"]["openAPIV3Schema"]["properties"]) == {
        "apiVersion",
        "kind",
        "metadata",
        "spec",
        *(["status"] if observed else []),
    }


def schema_at(root: Node, json_path: str) -> Node | None:
    """The schema node a printer column's JSONPath reads; a filter (``[?(@.type=="Running")]``) on
    a list selects items, so it is checked against the items' properties and then dropped."""
    node: Node | None = root
    for filtered in re.findall(r"\[\?\(@\.(\w+)==", json_path):
        if schema_at(root, re.sub(r"\[\?.*", "", json_path) + "." + filtered) is None:
            return None
    for part in re.sub(r"\[\?\([^]]*\)\]", "", json_path).strip(".").split("."):
        if node is None:
            return None
        while node.get("type") == "array":
            node = node["items"]
        node = node.get("properties", {}).get(part)
    return node


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_printer_columns_point_at_typed_fields(kind: Kind) -> None:
    root = openapi(kind)
    columns = on_disk(kind)["spec"]["versions"][0]["additionalPrinterColumns"]
    for col in columns:
        if col["jsonPath"] == ".metadata.creationTimestamp":
            assert col["type"] == "date"
            continue
        node = schema_at(root, col["jsonPath"])
        assert node is not None, f"{col['name']}: {col['jsonPath']} is not in the schema"
        # A list has no column type of its own: kubectl prints it as JSON, a string.
        assert node["type"] == col["type"] or (node["type"], col["type"]) == ("array", "string"), col


def test_job_columns_show_phase_instance_nodes_restarts_reason_usage_age() -> None:
    job = next(k for k in KINDS if k.kind == "DGXTrainingJob")
    names = [c["name"] for c in crd(job)["spec"]["versions"][0]["additionalPrinterColumns"] if "priority" not in c]
    assert names == ["Phase", "Instance", "Nodes", "Restarts", "Reason", "GPU-Hours", "Cost", "Age"]


def test_mount_columns_show_phase_direction_source_objects_reason_age() -> None:
    mount = kind_by_name("DGXDataMount")
    columns = crd(mount)["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in columns if "priority" not in c] == [
        "Phase",
        "Direction",
        "Source",
        "Objects",
        "Reason",
        "Age",
    ]
    by_name = {c["name"]: c["jsonPath"] for c in columns}
    assert by_name["Reason"] == '.status.conditions[?(@.type=="Ready")].reason'
    assert by_name["Message"] == '.status.conditions[?(@.type=="Ready")].message'


def test_the_job_reason_column_reads_the_running_condition() -> None:
    """The planner writes the reason a job ended onto Running as well as Finished
    (tests/unit/test_planner_finished.py evaluates this column on every terminal path)."""
    (reason,) = [c for c in kind_by_name("DGXTrainingJob").columns if c["name"] == "Reason"]
    assert reason["jsonPath"] == '.status.conditions[?(@.type=="Running")].reason'


def generated_schemas() -> Iterator[tuple[str, Node]]:
    """Every schema a user reads descriptions of: the CRDs in crds/ and in the chart, and the
    trainer config's (which spec.trainer embeds, and `kubedgx` documents)."""
    for path in [*sorted(CRDS.glob("*.yaml")), *sorted(CHART_CRDS.glob("*.yaml"))]:
        text = path.read_text(encoding="utf-8")
        if path.parent == CHART_CRDS:  # a Helm template: its Go-template lines are not YAML
            text = "\n".join(line for line in text.splitlines() if "{{" not in line)
        crd_doc = yaml.safe_load(text)
        for version in crd_doc["spec"]["versions"]:
            yield f"{path.name}", version["schema"]["openAPIV3Schema"]
    yield "trainer_schema()", trainer_schema()


def test_no_description_says_defaults_to_nothing() -> None:
    """`kubectl explain` once read "Human-readable details. Defaults to ." for condition messages."""
    found = [
        f"{where}{path}: {node['description']!r}"
        for where, root in generated_schemas()
        for path, node in walk(root)
        if re.search(r"Defaults to\s*(\.|\"\"\.)?\s*$", str(node.get("description", "")))
    ]
    assert found == []
    api_md = (CRDS.parent / "docs" / "api.md").read_text(encoding="utf-8")
    assert not re.search(r"Defaults to\s*\.?\s*\|", api_md)


def test_the_check_for_empty_defaults_can_fail() -> None:
    assert re.search(r"Defaults to\s*(\.|\"\"\.)?\s*$", "Human-readable details. Defaults to .")
    assert re.search(r"Defaults to\s*\.?\s*\|", "| `x` | string | Human-readable details. Defaults to . |")


def all_rules(root: Node) -> Iterator[tuple[str, dict[str, str]]]:
    for path, node in walk(root):
        for rule in node.get("x-kubernetes-validations", []):
            yield path, rule


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_every_cel_rule_compiles_and_its_field_path_exists(kind: Kind) -> None:
    env = celpy.Environment()
    root = openapi(kind)
    rules = list(all_rules(root))
    assert rules, "expected cross-field rules"
    for path, rule in rules:
        env.compile(rule["rule"])
        if "messageExpression" in rule:
            env.compile(rule["messageExpression"])
        assert rule.get("message") or rule.get("messageExpression"), rule
        if "fieldPath" in rule:
            target = schema_at(root, (path + rule["fieldPath"]).replace("[]", ""))
            assert target is not None, f"{path}: fieldPath {rule['fieldPath']} does not exist"


#: The smallest valid DGXLimits (no limits at all); examples/limits/ holds a full one.
BASE_LIMITS = {"apiVersion": "kubedgx.io/v1alpha1", "kind": "DGXLimits", "metadata": {"name": "default"}, "spec": {}}


#: Budgets beyond the minimal one (no example file has any): every optional field set, and a rolling window.
FULL_BUDGETS: list[dict[str, Any]] = [
    {
        **BASE_BUDGET,
        "spec": {
            "limits": {"cost": "10000", "gpuHours": "4000.5"},
            "period": {"calendar": "Week", "timeZone": "Europe/Berlin", "weekStart": "Sunday"},
            "capacities": ["norm", "debug"],
            "jobSelector": {
                "matchLabels": {"team": "a"},
                "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["x"]},
                    {"key": "q", "operator": "Exists"},
                ],
            },
            "enforcement": "Report",
        },
    },
    {**BASE_BUDGET, "spec": {"limits": {"gpuHours": "100"}, "period": {"rolling": "168h"}}},
]


def valid_objects(kind: str) -> list[dict[str, Any]]:
    files = [*example_files(), *sorted((ROOT / "examples" / "limits").glob("*.yaml"))]
    docs = [d for f in files for d in load_yaml_docs(f) if d.get("kind") == kind]
    base = {
        "DGXTrainingJob": [BASE_JOB],
        "DGXDataMount": [BASE_MOUNT],
        "DGXLimits": [BASE_LIMITS],
        "DGXBudget": [BASE_BUDGET, *FULL_BUDGETS],
    }
    return [*base[kind], *docs]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_rules_never_fail_to_evaluate_on_valid_objects(kind: Kind) -> None:
    """The CRD has no defaults, so a rule that reads an unset field without has() errors in a
    cluster; every rule must evaluate cleanly on minimal and on full objects."""
    objects = valid_objects(kind.kind)
    assert len(objects) >= 2
    for obj in objects:
        assert validate(openapi(kind), obj) == [], obj["metadata"]["name"]


def test_the_trainer_section_is_the_trainer_schema() -> None:
    """Operator and trainer share one contract: spec.trainer is exactly TrainerConfig's schema."""
    job = next(k for k in KINDS if k.kind == "DGXTrainingJob")
    embedded = dict(openapi(job)["properties"]["spec"]["properties"]["trainer"])
    own = trainer_schema()
    assert embedded.pop("description")
    assert own.pop("description")
    assert embedded == own


def test_messages_from_expressions_use_the_values() -> None:
    job = next(k for k in KINDS if k.kind == "DGXTrainingJob")
    spec = openapi(job)["properties"]["spec"]
    (rule,) = [r for r in spec["x-kubernetes-validations"] if r.get("fieldPath") == ".resources.gpu"]
    env = celpy.Environment()
    program = env.program(env.compile(rule["messageExpression"]), functions=KUBERNETES_CEL_FUNCTIONS)
    value = to_cel({"instance": "dgxa100.80g.4.norm", "resources": {"gpu": 9}}, spec)
    message = program.evaluate({"self": value})
    assert message == "must be <= 4, the GPUs per node of dgxa100.80g.4.norm"


# -- the instance rules: MIG slices, and no evaluation error on any name ---------------------------

JOB_KIND = kind_by_name("DGXTrainingJob")
#: Every MIG profile of the shipped catalog once, in its debug pool (dgxa100.80g.mig-1g.10gb.debug, ...).
MIG_INSTANCES = sorted(
    n for n, inst in Catalog.load().instances.items() if inst.mig is not None and inst.capacity == "debug"
)
#: What a spec may say beside its instance that the instance rules read (resources.gpu, the elastic counts).
BESIDE_THE_INSTANCE: list[dict[str, Any]] = [
    {},
    {"resources": {"gpu": 1}},
    {"resources": {"gpu": 64}},
    {"elastic": {"nprocPerNode": 2}},
    {"elastic": {"minNodes": 2, "maxNodes": 3, "nprocPerNode": 64}},
    {"resources": {"gpu": 2}, "elastic": {"maxNodes": 2, "nprocPerNode": 3}},
]
#: Names the pattern refuses; the apiserver still runs the CEL rules on them (tests/cluster/test_crds.py).
MALFORMED_INSTANCES = [
    "a100-8",
    "",
    "dgx",
    "dgxa100.80g",
    "dgxa100.80g.8",
    "dgxa100.80g.0.norm",
    "dgxa100.80g.100.norm",
    "dgxa.1g.99999999999999999999.norm",
    "dgxa100.80g.mig-1g.norm",
    "dgxa100.80g.mig-.norm",
    "x.y.mig-1g.10gb.norm",
    "dgxa100.80g.8.weird",
]


@functools.cache
def spec_rules() -> tuple[dict[str, Any], list[dict[str, str]]]:
    spec = openapi(JOB_KIND)["properties"]["spec"]
    return spec, list(spec["x-kubernetes-validations"])


def job_spec(instance: str, beside: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {**BASE_JOB["spec"], "instance": instance, **(beside or {})}


@functools.cache
def compiled(expression: str) -> celpy.Runner:
    env = celpy.Environment()
    return env.program(env.compile(expression), functions=KUBERNETES_CEL_FUNCTIONS)


def evaluation_errors(spec_value: Mapping[str, Any], rules: list[dict[str, str]] | None = None) -> list[str]:
    """The spec-level rules that read spec.instance (and the message expressions of those that fail)
    that raise an error on ``spec_value`` instead of answering: what the apiserver would report as a
    second, confusing cause."""
    schema, found = spec_rules()
    value = to_cel(dict(spec_value), schema)
    errors = []
    for rule in [r for r in found if "self.instance" in r["rule"]] if rules is None else rules:
        for expression in (rule["rule"], rule.get("messageExpression")):
            if expression is None:
                continue
            try:
                result = compiled(expression).evaluate({"self": value})
            except celpy.CELEvalError as exc:
                result = exc
            if isinstance(result, celpy.CELEvalError):
                errors.append(f"{expression}: {result}")
            elif expression == rule["rule"] and bool(result):
                break  # the rule holds: its message expression is never evaluated
    return errors


def test_every_mig_instance_of_the_catalog_is_accepted() -> None:
    assert MIG_INSTANCES, "the shipped catalog lists MIG profiles"
    assert "dgxa100.80g.mig-1g.10gb.debug" in MIG_INSTANCES
    for name in MIG_INSTANCES:
        for beside in ({}, {"elastic": {"minNodes": 1, "maxNodes": 1, "nprocPerNode": 1}}):
            job = {**BASE_JOB, "spec": job_spec(name, beside)}
            assert validate(openapi(JOB_KIND), job) == [], (name, beside)


@pytest.mark.parametrize(
    "beside",
    [
        {"resources": {"gpu": 1}},
        {"elastic": {"maxNodes": 2}},
        {"elastic": {"minNodes": 2, "maxNodes": 2}},
        {"elastic": {"nprocPerNode": 2}},
        {"resources": {"gpu": 1}, "elastic": {"minNodes": 2, "maxNodes": 4, "nprocPerNode": 2}},
    ],
    ids=["resources.gpu", "maxNodes", "minNodes", "nprocPerNode", "all"],
)
def test_a_mig_instance_refuses_more_than_one_worker_of_one_process(beside: dict[str, Any]) -> None:
    """One problem, the MIG rule's, at spec.instance: the whole-GPU rules (resources.gpu and
    nprocPerNode against the name's GPUs) leave a MIG name to it, so one mistake gets one message."""
    (rule,) = [r for r in spec_rules()[1] if r.get("fieldPath") == ".instance"]
    assert rule["message"].startswith("a MIG instance runs one worker with one process on its slice")
    for name in MIG_INSTANCES:
        job = {**BASE_JOB, "spec": job_spec(name, beside)}
        assert [(p.path, p.message) for p in validate(openapi(JOB_KIND), job)] == [("spec.instance", rule["message"])]
    # On a whole-GPU instance the MIG rule says nothing (the GPU rules judge the same spec there).
    whole = validate(openapi(JOB_KIND), {**BASE_JOB, "spec": job_spec("dgxa100.80g.1.norm", beside)})
    assert rule["message"] not in [p.message for p in whole]


@given(
    name=st.from_regex(INSTANCE_PATTERN, fullmatch=True).filter(lambda n: len(n) <= 64),
    beside=st.sampled_from(BESIDE_THE_INSTANCE),
)
@settings(max_examples=60, deadline=None)
def test_no_instance_rule_fails_to_evaluate_on_a_name_the_pattern_takes(name: str, beside: dict[str, Any]) -> None:
    assert evaluation_errors(job_spec(name, beside)) == []


@pytest.mark.parametrize("name", [*MIG_INSTANCES, *sorted(Catalog.load().instances)[:12], *MALFORMED_INSTANCES])
def test_no_instance_rule_fails_to_evaluate_on_catalog_or_malformed_names(name: str) -> None:
    """The apiserver runs the CEL rules even on a name its pattern refused: a rule must then hold
    (the pattern's error says what is wrong), not fail with an index or conversion error."""
    for beside in BESIDE_THE_INSTANCE:
        assert evaluation_errors(job_spec(name, beside)) == [], beside


def test_the_evaluation_error_check_can_fail() -> None:
    """The control: an unguarded rule (the shape of the GPU rule before the pattern guard) errors on
    a malformed name, and on a pattern-valid name that overflows an int."""
    unguarded = {"rule": "!has(self.resources) || self.resources.gpu <= int(self.instance.split('.')[2])"}
    assert evaluation_errors(job_spec("a100-8", {"resources": {"gpu": 1}}), [unguarded])
    assert evaluation_errors(job_spec("dgxa.1g.99999999999999999999.norm", {"resources": {"gpu": 1}}), [unguarded])
    assert not evaluation_errors(job_spec("dgxa100.80g.8.norm", {"resources": {"gpu": 1}}), [unguarded])


def _message_expressions(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [r["messageExpression"] for r in node.get("x-kubernetes-validations", []) if "messageExpression" in r]
        return found + [e for v in node.values() for e in _message_expressions(v)]
    if isinstance(node, list):
        return [e for v in node for e in _message_expressions(v)]
    return []


def test_no_message_expression_converts_with_string() -> None:
    """kube-apiserver 1.34 refuses a CRD whose messageExpression calls string() on a number: its cost
    estimator takes the result for unbounded (tests/cluster found it; cel-python estimates nothing)."""
    expressions = [e for k in KINDS for e in _message_expressions(openapi(k))]
    assert expressions, "the CRDs have message expressions"
    assert [e for e in expressions if "string(" in e] == []
    with pytest.raises(ValueError, match="no string"):
        cel("true", message_expression="'got ' + string(self.x)")
