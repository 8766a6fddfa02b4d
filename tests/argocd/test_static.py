"""What needs no operator: the health checks on hand-made objects (cases the operator's statuses do not reach), the
sandbox they run in, and the CRDs' lack of schema defaults (which an API server would write into stored specs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.argocd.health import CUSTOMIZATIONS, RUNTIMES, SCRIPTS, Health, evaluate, health
from tests.conftest import CRDS

LUA = sorted(CUSTOMIZATIONS.glob("**/*.lua"))

# --------------------------------------------------------------------------------------------
# The scripts on their own
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(SCRIPTS))
def test_a_fresh_object_waits_for_the_operator(kind: str) -> None:
    assert health({"kind": kind, "metadata": {"name": "x", "generation": 1}}) == Health(
        "Progressing", "waiting for the operator"
    )
    assert health({"kind": kind, "metadata": {"name": "x"}, "status": {}}) == Health(
        "Progressing", "waiting for the operator"
    )


def test_the_sandbox_bites() -> None:
    """A script calling the string library, or a string method, fails in the imitated sandbox."""
    with pytest.raises(Exception, match="string"):
        evaluate(RUNTIMES[0], "return {status = string.lower('Healthy'), message = ''}", {"kind": "DGXTrainingJob"})
    with pytest.raises(Exception, match="string value"):
        evaluate(RUNTIMES[0], "return {status = ('Healthy'):lower(), message = ''}", {"kind": "DGXTrainingJob"})


@pytest.mark.parametrize("path", LUA, ids=lambda p: str(p.relative_to(CUSTOMIZATIONS)))
def test_the_scripts_use_no_library_argo_cd_leaves_out(path: Path) -> None:
    """Health checks and actions alike: argocd-cm runs them without the open libraries."""
    code = "\n".join(line.split("--", 1)[0] for line in path.read_text(encoding="utf-8").splitlines())
    for library in ("string.", "math.", "os.", "io.", ":sub(", ":find(", ":match(", ":format(", ":gsub("):
        assert library not in code, f"{path.name} uses {library}"


def test_a_phase_a_newer_operator_adds_is_progressing() -> None:
    obj = {
        "kind": "DGXTrainingJob",
        "metadata": {"generation": 1},
        "status": {"phase": "Draining", "observedGeneration": 1, "conditions": []},
    }
    assert health(obj) == Health("Progressing", "Draining")


@pytest.mark.parametrize(
    ("kind", "phase", "expected"),
    [
        ("DGXTrainingJob", "Failed", Health("Degraded", "the job failed")),
        ("DGXTrainingJob", "Succeeded", Health("Healthy", "training completed")),
        ("DGXTrainingJob", "Suspended", Health("Suspended", "spec.suspend is true")),
        ("DGXTrainingJob", "Running", Health("Progressing", "Running")),
        ("DGXDataMount", "Failed", Health("Degraded", "the mount failed")),
        ("DGXDataMount", "Ready", Health("Healthy", "Ready")),
        ("DGXDataMount", "Syncing", Health("Progressing", "Syncing")),
    ],
)
def test_a_status_without_conditions_still_gets_a_message(kind: str, phase: str, expected: Health) -> None:
    obj = {"kind": kind, "metadata": {"generation": 3}, "status": {"phase": phase, "observedGeneration": 3}}
    assert health(obj) == expected


def walk(node: object) -> list[object]:
    out: list[object] = [node]
    if isinstance(node, dict):
        out += [x for v in node.values() for x in walk(v)]
    elif isinstance(node, list):
        out += [x for v in node for x in walk(v)]
    return out


def test_the_crds_default_nothing_into_a_stored_spec() -> None:
    """A schema default is written into the stored object by the API server: Argo CD would see every field a
    manifest leaves out as drift."""
    crds = sorted(CRDS.glob("*.yaml"))
    assert len(crds) == 4
    for path in crds:
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        for version in crd["spec"]["versions"]:
            # A schema node with a default (a node that says its type); not a `properties` map that has
            # a field named default (DGXLimits' maxDuration.default).
            schemas = [n for n in walk(version["schema"]) if isinstance(n, dict) and "default" in n and "type" in n]
            assert schemas == [], f"{path.name} {version['name']}: defaults {schemas[:3]}"
            if "status" in version["schema"]["openAPIV3Schema"]["properties"]:
                assert version["subresources"]["status"] == {}, "status is written through its own subresource"
