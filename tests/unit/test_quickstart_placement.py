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
    """``a=b c=d (remarks)`` -> {a: b, c: d}: the key=value words before any parenthesis."""
    return dict(word.split("=", 1) for word in text.split("(")[0].split() if "=" in word)


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
        assert expr["operator"] == "In"
        (value,) = expr["values"]  # one value each: a label the comment can name as key=value
        out[expr["key"]] = value
    return out


def test_the_header_names_the_workers_node_labels() -> None:
    assert pairs(header()["node labels"]) == required_node_labels(worker())


def test_the_header_names_the_resources_the_worker_asks_for() -> None:
    pod = worker()
    (container,) = pod["spec"]["containers"]
    requests = container["resources"]["requests"]
    assert container["resources"]["limits"] == requests, "the header says requests = limits"
    assert pairs(header()["free"]) == {k: str(v) for k, v in requests.items()}
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


def test_the_header_names_the_instance_type_and_its_dgx_sibling() -> None:
    text = QUICKSTART.read_text(encoding="utf-8")
    job = yaml.safe_load(text)
    named = re.search(r"the instance type below, (\S+),", text)
    assert named is not None
    assert named[1] == job["spec"]["instance"]
    sibling = re.search(r"nvidia\.com/gpu\.count=(\d+): set spec\.instance to (\S+) there", text)
    assert sibling is not None
    alt = Catalog.load().get(sibling[2])
    ours = Catalog.load().get(job["spec"]["instance"])
    assert alt.gpus == int(sibling[1])
    assert (alt.products, alt.capacity) == (ours.products, ours.capacity), "the same GPU, only more of them"


def test_the_readme_names_the_same_node() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Install on a cluster", 1)[1].split("\n## ", 1)[0]
    rows = header()
    for word in pairs(rows["node labels"]).items():
        assert f"`{'='.join(word)}`" in section, word
    free = pairs(rows["free"])
    sentence = re.search(r"The quickstart's worker needs .*?\.(?=\s)", section.replace("\n", " "))
    assert sentence is not None, "README.md: the sentence saying what node the quickstart needs"
    assert f"`nvidia.com/gpu` {free['nvidia.com/gpu']}" in sentence[0]
    assert f"{free['cpu']} CPUs" in sentence[0]
    assert f"{free['memory']} of memory" in sentence[0]
