"""No cluster needed: the e2e harness checked where it can be, so a cluster run fails only for
reasons a cluster can show.

- The manifests the e2e tests apply pass ``kubedgx validate`` (schema, CEL, catalog); the bad ones
  fail on the field the tests name, in the layer the tests claim: the node bounds in the CRD itself
  (the API server refuses them), the instance type only in the catalog (only the webhook can).
- Every pod the operator would render for them fits a node that run.sh fakes from the same
  catalog: required node affinity met by the labels, taints tolerated, GPUs within the capacity,
  one node per worker, small CPU and memory.
- The gate's context rule, namespace names and run.sh's syntax.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from dgx_api.schema import validate as schema_validate
from dgx_operator.api import DGXTrainingJob
from dgx_operator.catalog import Catalog
from dgx_operator.render import BuildContext, build_children
from dgx_operator.validation.validator import Validator, crd_schema
from tests.e2e import cluster as gate
from tests.e2e import fakegpu
from tests.e2e.jobs import (
    INSTANCE,
    QUICKSTART_STEPS,
    bad_bounds_job,
    command_job,
    interactive_trainer_job,
    quickstart_job,
    unknown_instance_job,
)

HERE = Path(__file__).resolve().parent


def kind_workers() -> int:
    config = yaml.safe_load((HERE / "kind-config.yaml").read_text())
    return sum(1 for node in config["nodes"] if node.get("role") == "worker")


def good_jobs() -> dict[str, dict[str, Any]]:
    nodes = min(4, kind_workers())
    return {
        "quickstart": quickstart_job("quickstart"),
        "elastic": command_job("elastic", min_nodes=min(2, nodes - 1), max_nodes=nodes),
        "suspend": command_job("pausable", min_nodes=2, max_nodes=2),
        "cleanup": interactive_trainer_job("doomed"),
        "admission": command_job("steady"),
    }


@pytest.fixture(scope="module")
def validator() -> Validator:
    return Validator(Catalog.load())


@pytest.mark.parametrize("name", sorted(good_jobs()))
def test_applied_jobs_are_valid(validator: Validator, name: str) -> None:
    outcome = validator.validate(good_jobs()[name])
    assert outcome.ok, [str(p) for p in outcome.problems]


def test_quickstart_is_the_example_adapted() -> None:
    job = quickstart_job("quickstart")
    example = yaml.safe_load((HERE.parents[1] / "examples" / "quickstart.yaml").read_text())
    assert job["spec"]["trainer"]["model"] == example["spec"]["trainer"]["model"]
    assert job["spec"]["trainer"]["dataset"] == example["spec"]["trainer"]["dataset"]
    assert job["spec"]["trainer"]["allowCpu"] is True
    assert job["spec"]["trainer"]["training"]["maxSteps"] == QUICKSTART_STEPS
    assert job["spec"]["instance"] == INSTANCE
    assert job["spec"]["elastic"] == {"nprocPerNode": 1}  # one CPU process, not one per fake GPU


def test_min_above_max_is_refused_by_the_crd_itself(validator: Validator) -> None:
    job = bad_bounds_job()
    schema_problems = schema_validate(crd_schema("DGXTrainingJob"), job)
    assert [p.path for p in schema_problems] == ["spec.elastic.minNodes"], schema_problems
    assert "must be <= spec.elastic.maxNodes" in schema_problems[0].message


def test_unknown_instance_passes_the_crd_and_only_the_catalog_refuses_it(validator: Validator) -> None:
    job = unknown_instance_job()
    assert schema_validate(crd_schema("DGXTrainingJob"), job) == []
    outcome = validator.validate(job)
    assert [p.path for p in outcome.problems] == ["spec.instance"]
    assert f"unknown instance type {job['spec']['instance']!r}" in outcome.problems[0].message


# -- the rendered pods fit the faked nodes -------------------------------------------------------


def expression_holds(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {op} not handled by this test")


def tolerates(tolerations: list[Mapping[str, Any]], taint: Mapping[str, str]) -> bool:
    for tol in tolerations:
        key_ok = tol.get("key") == taint["key"] or (not tol.get("key") and tol.get("operator") == "Exists")
        value_ok = tol.get("operator") == "Exists" or tol.get("value", "") == taint["value"]
        effect_ok = not tol.get("effect") or tol["effect"] == taint["effect"]
        if key_ok and value_ok and effect_ok:
            return True
    return False


def cpu_millis(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


@pytest.mark.parametrize("name", sorted(good_jobs()))
def test_rendered_workers_fit_the_faked_nodes(name: str) -> None:
    inst = fakegpu.instance(INSTANCE)
    labels, taints = fakegpu.node_labels(inst), fakegpu.node_taints(inst)
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in taints
    job = DGXTrainingJob.model_validate(good_jobs()[name])
    children = build_children(job, BuildContext(catalog=Catalog.load()), namespace="e2e")
    pods = [c for c in children if c["kind"] == "Pod"]
    assert 1 <= len(pods) <= kind_workers(), "one worker per node: more workers than kind worker nodes"
    for pod in pods:
        spec = pod["spec"]
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert any(all(expression_holds(e, labels) for e in t["matchExpressions"]) for t in terms), (terms, labels)
        assert all(labels.get(k) == v for k, v in (spec.get("nodeSelector") or {}).items())
        for taint in taints:
            assert tolerates(spec["tolerations"], taint), (taint, spec["tolerations"])
        resources = spec["containers"][0]["resources"]
        assert resources["requests"] == resources["limits"]
        assert int(resources["limits"]["nvidia.com/gpu"]) <= inst.gpus
        assert cpu_millis(resources["limits"]["cpu"]) <= 2000, resources  # a kind node shares the host's CPUs


def test_interactive_trainer_job_has_every_kind_of_child() -> None:
    """What the cleanup test expects to see and then to see go."""
    job = DGXTrainingJob.model_validate(interactive_trainer_job("doomed"))
    children = build_children(job, BuildContext(catalog=Catalog.load()), namespace="e2e")
    config = next(c["metadata"]["name"] for c in children if c["kind"] == "ConfigMap")
    assert config.startswith("doomed-trainer-")
    assert sorted((c["kind"], c["metadata"]["name"]) for c in children) == [
        ("ConfigMap", config),
        ("Pod", "doomed-worker-0"),
        ("Service", "doomed"),
    ]


# -- the harness itself ------------------------------------------------------------------------


def test_only_kind_or_listed_contexts_are_test_contexts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gate.CONTEXTS_ENV, raising=False)
    assert gate.is_test_context("kind-kubedgx-e2e")
    assert not gate.is_test_context("prod-eu-west")
    assert not gate.is_test_context("gke_project_zone_kind-lookalike")
    monkeypatch.setenv(gate.CONTEXTS_ENV, "minikube, k3d-ci")
    assert gate.is_test_context("minikube")
    assert gate.is_test_context("k3d-ci")
    assert not gate.is_test_context("prod-eu-west")


def test_namespace_names_are_dns_labels() -> None:
    name = gate.namespace_name("test_" + "Very_Long[param-ünïcode]" * 5)
    assert len(name) <= 63
    assert name.startswith("e2e-")
    assert all(c.isascii() and (c.isalnum() or c == "-") for c in name)
    assert name == name.lower()
    assert not name.endswith("-")


def test_fakegpu_prints_what_run_sh_applies(capsys: pytest.CaptureFixture[str]) -> None:
    assert fakegpu.main(["labels", INSTANCE]) == 0
    lines = capsys.readouterr().out.splitlines()
    inst = fakegpu.instance(INSTANCE)
    assert f"{inst.labels.product}={inst.products[0]}" in lines
    assert f"{inst.labels.count}={inst.gpus}" in lines
    assert fakegpu.main(["taints", INSTANCE]) == 0
    assert "nvidia.com/gpu=present:NoSchedule" in capsys.readouterr().out.splitlines()
    assert fakegpu.main(["gpus", INSTANCE]) == 0
    assert capsys.readouterr().out.strip() == str(inst.gpus)


def merged(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's merge of values: maps merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merged(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
    return out


def test_e2e_values_pass_the_charts_schema() -> None:
    """values-e2e.yaml plus what run.sh sets, against the chart's values.schema.json (which rejects
    unknown keys), with the trainer image key run.sh picks the same way."""
    chart = HERE.parents[1] / "charts" / "kubedgx"
    if not (chart / "values.schema.json").is_file():
        pytest.skip("no charts/kubedgx/values.schema.json yet")
    values = yaml.safe_load((chart / "values.yaml").read_text()) or {}
    trainer_key = "trainer.image" if isinstance((values.get("trainer") or {}).get("image"), dict) else "trainerImage"
    images: dict[str, Any] = {"image": {"repository": "kubedgx/operator", "tag": "e2e"}}
    head, _, tail = trainer_key.partition(".")
    trainer = {"repository": "kubedgx/trainer", "tag": "e2e"}
    images[head] = {tail: trainer} if tail else trainer
    values = merged(merged(values, yaml.safe_load((HERE / "values-e2e.yaml").read_text())), images)
    jsonschema.validate(values, json.loads((chart / "values.schema.json").read_text()))
    assert values["webhook"]["enabled"] is True
    assert values["watchNamespaces"] == []


def test_run_script_parses() -> None:
    script = HERE / "run.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    if shutil.which("shellcheck"):
        proc = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout
