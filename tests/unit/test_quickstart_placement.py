"""examples/quickstart.yaml's header says what node its worker needs on a cluster, and README.md's cluster
section repeats the node's labels and free resources. Both are prose a newcomer acts on (label a node, size
a node pool), so they are checked against what the operator actually creates: the worker `kubedgx render`
prints for the example with the built-in catalog. A change of the catalog or the builders that moves
the placement fails here until the words follow."""

from __future__ import annotations

import io
import re
from typing import Any

import yaml

from dgx_operator.catalog import Catalog
from dgx_operator.cli.main import main
from tests.conftest import EXAMPLES, ROOT

QUICKSTART = EXAMPLES / "quickstart.yaml"


def header() -> dict[str, str]:
    """The header's table: ``#   <key>  <text>`` lines keyed by their first words (``node labels``...)."""
    rows: dict[str, str] = {}
    for line in QUICKSTART.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        match = re.match(r"#   ([a-z][a-z ]*?)  +(\S.*)$", line)
        if match:
            rows[match[1]] = match[2]
    return rows


def pairs(text: str) -> dict[str, str]:
    """``a=b c>0 (remarks)`` -> {a: "=b", c: ">0"}: the key=value and key>value words before any
    parenthesis (a value kept with its operator: "at least one GPU" is not "exactly one")."""
    out = {}
    for word in text.split("(")[0].split():
        match = re.fullmatch(r"([^=>]+)([=>])(.*)", word)
        if match:
            out[match[1]] = match[2] + match[3]
    return out


def rendered(path: str = str(QUICKSTART), *extra: str) -> list[dict[str, Any]]:
    out, err = io.StringIO(), io.StringIO()
    assert main(["render", path, *extra], out=out, err=err) == 0, err.getvalue()
    return [d for d in yaml.safe_load_all(out.getvalue()) if d]


def worker() -> dict[str, Any]:
    (pod,) = [d for d in rendered() if d["kind"] == "Pod"]
    return pod


def required_node_labels(pod: dict[str, Any]) -> dict[str, str]:
    (term,) = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    out = {}
    for expr in term["matchExpressions"]:
        (value,) = expr["values"]  # one value each: a label the comment can name as key=value or key>value
        assert expr["operator"] in ("In", "Gt")
        out[expr["key"]] = ("=" if expr["operator"] == "In" else ">") + value
    return out


def test_the_header_names_the_workers_node_labels() -> None:
    assert pairs(header()["node labels"]) == required_node_labels(worker())


def test_the_header_names_the_resources_the_worker_asks_for() -> None:
    pod = worker()
    (container,) = pod["spec"]["containers"]
    requests = container["resources"]["requests"]
    assert container["resources"]["limits"] == requests, "the header says requests = limits"
    assert pairs(header()["free"]) == {k: f"={v}" for k, v in requests.items()}
    (shm,) = [v["emptyDir"]["sizeLimit"] for v in pod["spec"]["volumes"] if v["name"] == "dshm"]
    assert f"/dev/shm, {shm}," in header()["free"]


def test_the_header_names_the_tolerations_the_capacity_and_the_priority_class() -> None:
    pod = worker()
    rows = header()
    tolerated = re.findall(r"(\S+):(\w+) is tolerated", rows["taints"])
    assert tolerated == [(t["key"], t["effect"]) for t in pod["spec"]["tolerations"]]
    assert all(t["operator"] == "Exists" for t in pod["spec"]["tolerations"]), "any value of the taint"
    capacity = re.search(r"capacity (\w+) needs no (\S+) label", rows["taints"])
    assert capacity is not None
    instance = Catalog.load().get(pod["metadata"]["annotations"]["kubedgx.io/instance"])
    assert capacity[1] == instance.capacity
    assert "nodeSelector" not in pod["spec"], "no capacity label (or any other) is required"
    assert re.findall(r"PriorityClass (\S+)", rows["priority"]) == [pod["spec"]["priorityClassName"]]


def test_the_header_names_the_instance_type_and_its_share_of_a_dgx() -> None:
    text = QUICKSTART.read_text(encoding="utf-8")
    job = yaml.safe_load(text)
    named = re.search(r"the instance type below, (\S+),", text)
    assert named is not None
    assert named[1] == job["spec"]["instance"]
    share = re.search(r"On a DGX A100 \((\d+) such GPUs\) it takes an (\w+) of the node", text.replace("\n# ", " "))
    assert share is not None
    ours = Catalog.load().get(job["spec"]["instance"])
    assert ours.node_gpus == int(share[1])
    assert {1: "whole", 2: "half", 4: "quarter", 8: "eighth"}[ours.node_gpus // ours.gpus] == share[2]


def test_the_readme_names_the_same_node() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Install on a cluster", 1)[1].split("\n## ", 1)[0]
    rows = header()
    for key, value in pairs(rows["node labels"]).items():
        assert f"`{key}{value}`" in section, (key, value)
    free = {k: v.lstrip("=") for k, v in pairs(rows["free"]).items()}
    sentence = re.search(r"The quickstart's worker needs .*?\.(?=\s)", section.replace("\n", " "))
    assert sentence is not None, "README.md: the sentence saying what node the quickstart needs"
    assert f"`nvidia.com/gpu` {free['nvidia.com/gpu']}" in sentence[0]
    assert f"{free['cpu']} CPUs" in sentence[0]
    assert f"{free['memory']} of memory" in sentence[0]
