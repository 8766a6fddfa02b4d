"""The Helm chart (charts/kubedgx), rendered and linted with Helm's own Go code (helm-python-sdk), no
cluster: shared helpers.

``render(values)`` renders the chart as ``helm install kubedgx charts/kubedgx -n kubedgx`` would
(``lookup`` returns nothing) and returns every object it installs with the template it came from;
``render(values, hooks=True)`` adds the hooks (the ``helm test`` objects).
``SCENARIOS`` are the default values and each of charts/kubedgx/ci/*.yaml.

The integration fixtures (``emulator``, ``run_operator``, ``s3``...) are re-exported for
test_rbac.py, which runs the operator to see which API calls its RBAC must allow.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import helm_python as helm
import yaml

from tests.conftest import ROOT
from tests.integration.conftest import emulator, kubeconfig, run_operator  # noqa: F401
from tests.s3 import s3  # noqa: F401

CHART = ROOT / "charts" / "kubedgx"
CI = CHART / "ci"
RELEASE = "kubedgx"
NAMESPACE = "kubedgx"
KUBE_VERSION = "1.34"
OPERATOR_SA = "kubedgx-operator"

#: (scenario id, values): the chart's defaults and every ci/ file.
SCENARIOS: list[tuple[str, dict[str, Any]]] = [("default", {})] + [
    (path.stem, yaml.safe_load(path.read_text(encoding="utf-8")) or {}) for path in sorted(CI.glob("*.yaml"))
]


@dataclass(frozen=True)
class Rendered:
    """One object of the rendered chart and the template that produced it."""

    template: str
    obj: dict[str, Any]

    @property
    def kind(self) -> str:
        kind: str = self.obj["kind"]
        return kind

    @property
    def name(self) -> str:
        name: str = self.obj["metadata"]["name"]
        return name

    def __str__(self) -> str:
        return f"{self.kind}/{self.name} ({self.template})"


def render_raw(
    values: dict[str, Any] | None = None, *, name: str = RELEASE, namespace: str = NAMESPACE
) -> dict[str, str]:
    with helm.Chart.load(str(CHART)) as chart:
        return chart.render(values or {}, name=name, namespace=namespace, is_install=True)


def render(
    values: dict[str, Any] | None = None, *, name: str = RELEASE, namespace: str = NAMESPACE, hooks: bool = False
) -> list[Rendered]:
    """What ``helm install`` applies (a release's manifest); with ``hooks``, also the hooks (what
    ``helm template`` prints: the ``helm test`` objects, created only by ``helm test``)."""
    out = []
    for template, text in sorted(render_raw(values, name=name, namespace=namespace).items()):
        if template.endswith("NOTES.txt"):
            continue
        out.extend(Rendered(template, doc) for doc in yaml.safe_load_all(text) if doc)
    return out if hooks else [r for r in out if not is_hook(r.obj)]


def is_hook(obj: dict[str, Any]) -> bool:
    """A Helm hook (helm.sh/hook): not part of the release's manifest, created when its event comes."""
    return "helm.sh/hook" in ((obj.get("metadata") or {}).get("annotations") or {})


def notes(values: dict[str, Any] | None = None) -> str:
    return next(text for template, text in render_raw(values).items() if template.endswith("NOTES.txt"))


def find(objects: list[Rendered], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [r.obj for r in objects if r.kind == kind and (name is None or r.name == name)]


def one(objects: list[Rendered], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[r for r in objects if r.kind == kind]}"
    return found[0]


@functools.cache
def generator() -> ModuleType:
    """charts/kubedgx/hack/generate.py (a script, not a package), imported."""
    path = CHART / "hack" / "generate.py"
    spec = importlib.util.spec_from_file_location("kubedgx_chart_generate", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def chart_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    return values


def chart_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    return schema
