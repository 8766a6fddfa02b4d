"""Shared fixtures. Tests never touch the network: hub lookups are forced offline."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# flytekit installs a rich traceback hook at import unless told not to: keep pytest's plain tracebacks.
os.environ.setdefault("FLYTE_SDK_RICH_TRACEBACKS", "0")
# An operator a test starts from the environment serves no metrics or health endpoint unless the test
# names a port: the defaults (8080 and 8081 on every address) would collide between pytest-xdist
# workers, and with whatever else on the machine listens there.
os.environ.setdefault("KUBEDGX_METRICS_PORT", "0")
os.environ.setdefault("KUBEDGX_HEALTH_PORT", "0")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CRDS = ROOT / "crds"


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def catalog() -> Any:
    from dgx_operator.catalog import Catalog

    return Catalog.load()


BASE_JOB: dict[str, Any] = {
    "apiVersion": "kubedgx.io/v1alpha1",
    "kind": "DGXTrainingJob",
    "metadata": {"name": "job", "namespace": "ml"},
    "spec": {
        "instance": "dgxa100.80g.8.norm",
        "trainer": {"model": {"name": "org/model"}, "dataset": {"path": "/data/train.jsonl"}},
    },
}

BASE_MOUNT: dict[str, Any] = {
    "apiVersion": "kubedgx.io/v1alpha1",
    "kind": "DGXDataMount",
    "metadata": {"name": "data", "namespace": "ml"},
    "spec": {"source": "s3://bucket/prefix"},
}

BASE_BUDGET: dict[str, Any] = {
    "apiVersion": "kubedgx.io/v1alpha1",
    "kind": "DGXBudget",
    "metadata": {"name": "burst", "namespace": "ml"},
    "spec": {"limits": {"cost": "10000"}, "period": {"calendar": "Month"}},
}


def with_changes(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of ``base`` with dotted-path changes applied; a value of ``DELETE`` removes the key.

    ``{"spec.elastic.minNodes": 3}`` creates ``spec.elastic`` as needed.
    """
    out = copy.deepcopy(base)
    for dotted, value in changes.items():
        node = out
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = copy.deepcopy(value)
    return out


DELETE = object()


@pytest.fixture
def job_with() -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda changes: with_changes(BASE_JOB, changes)


@pytest.fixture
def mount_with() -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda changes: with_changes(BASE_MOUNT, changes)


def example_files() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))


def load_yaml_docs(path: Path) -> list[Any]:
    """The documents of a manifest as kubectl reads them (YAML 1.2 numbers such as 2e-3 included),
    through kubedgx's own loader: PyYAML alone would read ``2e-3`` as a string."""
    from dgx_api import manifests

    return [d for d in manifests.load_documents(path.read_bytes()) if d is not None]


# The session's control plane (tests/cluster), for the cluster suite and the e2e suite alike; under
# pytest-xdist one per worker that runs a test needing it.
from tests.cluster.fixtures import admin_kubectl, control_plane, pytest_runtest_protocol  # noqa: E402, F401

# The time per test folder at the end of a run (tests/support/report.py) and the order tests are
# handed to pytest-xdist's workers in (tests/support/schedule.py).
from tests.support.report import pytest_addoption, pytest_terminal_summary  # noqa: E402, F401

with contextlib.suppress(ImportError):  # no pytest-xdist: tests run in one process, in collection order
    from tests.support.schedule import pytest_xdist_make_scheduler  # noqa: F401


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``slow`` tier (tests/support/tiers.py): left out of the inner loop, ``-m "not cluster and not slow"``."""
    from tests.support.tiers import mark_slow

    mark_slow(items, ROOT)
