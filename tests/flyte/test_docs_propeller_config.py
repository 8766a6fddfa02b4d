"""docs/flyte.md's propeller block is the configuration the real-propeller tests run with.

tests/cluster/flyte_propeller.py reads the block after the ``propeller-config`` marker and puts it
into propeller's configuration, replacing only the connector's endpoint; these tests pin that the
block is there, says what an admin needs, and reaches propeller unchanged.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tests.cluster.flyte_propeller import DOCS_MARKER, docs_config, docs_rbac, propeller_config

TYPES = {"dgx_training", "dgx_qlora"}


class _S3:
    endpoint = "http://127.0.0.1:9"


def test_the_block_routes_both_task_types_to_the_connector() -> None:
    block = docs_config()
    plugins = block["tasks"]["task-plugins"]
    assert "connector-service" in plugins["enabled-plugins"]
    assert {t for t, p in plugins["default-for-task-types"].items() if p == "connector-service"} == TYPES
    connector = block["plugins"]["connector-service"]
    assert set(connector["supportedTaskTypes"]) == TYPES
    assert connector["defaultConnector"]["endpoint"].endswith(":8000")


def test_propeller_runs_with_the_block_as_written_but_the_endpoint() -> None:
    docs = docs_config()
    config = propeller_config(kubeconfig=Path("/k"), admin_endpoint="127.0.0.1:1", connector_endpoint="127.0.0.1:2",
                              s3=_S3(), bucket="b", prof_port=1)  # type: ignore[arg-type]  # fmt: skip
    assert config["tasks"] == docs["tasks"]
    expected = copy.deepcopy(docs["plugins"]["connector-service"])
    expected["defaultConnector"]["endpoint"] = "127.0.0.1:2"
    assert config["plugins"]["connector-service"] == expected


def test_a_missing_marker_is_named() -> None:
    with pytest.raises(AssertionError, match="propeller-config"):
        docs_config("# Flyte\n```yaml\ntasks: {}\n```\n")
    assert DOCS_MARKER.startswith("<!--")


def test_the_connector_s_cluster_role_grants_what_it_calls_and_no_secrets() -> None:
    """The ClusterRole the propeller tests bind the connector's ServiceAccount to (and nothing else)."""
    role = docs_rbac()
    assert role["kind"] == "ClusterRole"
    granted = {(res, verb) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]}
    for verb in ("create", "get", "delete", "patch"):
        assert ("dgxtrainingjobs", verb) in granted
    for verb in ("create", "get", "patch"):
        assert ("dgxdatamounts", verb) in granted
    assert {("pods", "list"), ("pods/log", "get")} <= granted
    assert not [g for g in granted if g[0] == "secrets"], "never all Secrets of every namespace"
