"""The chart as the cluster tests install it: rendered offline as ``helm install`` applies it, and
stand-ins for other projects' CRDs (cert-manager, prometheus-operator) the chart's optional objects
need (test_chart.py, test_chart_hooks.py, test_ha.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

from tests.chart.conftest import is_hook


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render(chart: Path, values: dict[str, Any] | None, *, name: str, namespace: str) -> list[dict[str, Any]]:
    """The chart rendered offline as ``helm install`` applies it (NOTES and ``helm test`` hooks left out)."""
    with helm.Chart.load(str(chart)) as loaded:
        out = loaded.render(values or {}, name=name, namespace=namespace, is_install=True)
    docs = [doc for path, text in sorted(out.items()) if not path.endswith("NOTES.txt") for doc in documents(text)]
    return [doc for doc in docs if not is_hook(doc)]


def stub_crd(group: str, kind: str, plural: str) -> dict[str, Any]:
    """A stand-in for another project's CRD (cert-manager, prometheus-operator): the kind is served,
    any content is kept, no controller acts on it."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}", "labels": {"test.kubedgx.io/stub": "true"}},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }
