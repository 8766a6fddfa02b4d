"""What kopf is told to ask the API server for (settings.configure): children by our label, every
initial LIST in pages. The requests themselves are checked against the emulator
(tests/integration/test_watch_scope.py) and a real apiserver (tests/cluster/test_watch_scope.py)."""

from __future__ import annotations

import kopf

from dgx_operator.runtime.settings import OperatorConfig, configure

JOB_LABEL = "kubedgx.io/job-name"  # docs/operator.md's name, spelled out


def resource(group: str, version: str, plural: str, kind: str) -> kopf.Resource:
    return kopf.Resource(group, version, plural, kind=kind, singular=kind.lower(), namespaced=True)


def configured(config: OperatorConfig | None = None) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    configure(settings, config or OperatorConfig())
    return settings


def test_core_children_are_selected_by_our_label() -> None:
    selectors = configured().watching.label_selectors
    for plural, kind in (("pods", "Pod"), ("services", "Service"), ("configmaps", "ConfigMap")):
        assert selectors.collect(resource("", "v1", plural, kind)) == [JOB_LABEL], plural


def test_no_other_resource_is_narrowed() -> None:
    """Not our own kinds, not other core kinds, and not a custom resource that shares a child's plural
    (a selector keyed by the bare name "pods" would narrow that one too)."""
    selectors = configured().watching.label_selectors
    others = [
        resource("kubedgx.io", "v1alpha1", "dgxtrainingjobs", "DGXTrainingJob"),
        resource("kubedgx.io", "v1alpha1", "dgxdatamounts", "DGXDataMount"),
        resource("", "v1", "secrets", "Secret"),
        resource("", "v1", "namespaces", "Namespace"),
        resource("example.com", "v1", "pods", "Pod"),
        resource("metrics.k8s.io", "v1beta1", "pods", "PodMetrics"),
        resource("", "v2", "services", "Service"),
    ]
    for other in others:
        assert selectors.collect(other) == [], other


def test_initial_lists_are_paged_unless_told_otherwise() -> None:
    assert configured().watching.chunk_size == 500
    assert configured(OperatorConfig(list_chunk_size=40)).watching.chunk_size == 40
    assert configured(OperatorConfig(list_chunk_size=0)).watching.chunk_size is None
