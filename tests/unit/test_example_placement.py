"""The sharing examples' headers say what their worker takes of a DGX node, as the quickstart's does
(tests/unit/test_quickstart_placement.py): examples/one-gpu-qlora.yaml (one GPU of a DGX H100, beside
other jobs) and examples/mig-debug.yaml (one MIG slice on a debug node sliced with the mixed strategy).
Each header's table is checked against the worker ``kubedgx render`` prints with the built-in catalog,
so a change of the catalog or the builders that moves the placement fails here until the words follow.
Validation and rendering only: no model named in them is ever downloaded."""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from dgx_operator.catalog import Catalog
from dgx_operator.cli.main import main
from dgx_operator.render.quantity import value as quantity
from tests.conftest import EXAMPLES

ONE_GPU = EXAMPLES / "one-gpu-qlora.yaml"
MIG_DEBUG = EXAMPLES / "mig-debug.yaml"
SHARING_EXAMPLES = [ONE_GPU, MIG_DEBUG]
IDS = [p.stem for p in SHARING_EXAMPLES]


def header(path: Path) -> dict[str, str]:
    """The header's table: ``#   <key>  <text>`` rows keyed by their first words (``node labels``...),
    a row's ``#                 <more>`` continuation lines joined to it."""
    rows: dict[str, str] = {}
    last = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        match = re.match(r"#   ([a-z][a-z ]*?)  +(\S.*)$", line)
        more = re.match(r"# {10,}(\S.*)$", line)
        if match:
            last = match[1]
            rows[last] = match[2]
        elif more and last is not None:
            rows[last] += " " + more[1]
        else:
            last = None
    return rows


def prose(path: Path) -> str:
    """The header's comment as one line of text."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def labels(text: str) -> dict[str, str]:
    """``a=b c>0 d in (x,y) (remarks)`` -> {a: "=b", c: ">0", d: " in (x,y)"}: the words before any
    remark in parentheses, each value kept with its operator ("at least one GPU" is not "exactly one")."""
    text = re.sub(r"(\S+) in \(([^)]*)\)", r"\1~in~\2", text)
    out = {}
    for word in text.split("(")[0].split():
        match = re.fullmatch(r"([^=>~]+)(=|>|~in~)(.*)", word)
        if match:
            op = " in " if match[2] == "~in~" else match[2]
            out[match[1]] = op + (f"({match[3]})" if op == " in " else match[3])
    return out


def rendered(path: Path) -> list[dict[str, Any]]:
    out, err = io.StringIO(), io.StringIO()
    assert main(["render", str(path)], out=out, err=err) == 0, err.getvalue()
    return [d for d in yaml.safe_load_all(out.getvalue()) if d]


def worker(path: Path) -> dict[str, Any]:
    (pod,) = [d for d in rendered(path) if d["kind"] == "Pod"]
    return pod


def job_of(path: Path) -> dict[str, Any]:
    (job,) = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d and d["kind"] == "DGXTrainingJob"]
    return job


def required_node_labels(pod: Mapping[str, Any]) -> dict[str, str]:
    """What a node must carry for the worker: its required node affinity and its nodeSelector."""
    (term,) = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    out = {}
    for expr in term["matchExpressions"]:
        values = expr["values"]
        if expr["operator"] == "Gt":
            (value,) = values
            out[expr["key"]] = f">{value}"
        else:
            assert expr["operator"] == "In", expr
            out[expr["key"]] = f"={values[0]}" if len(values) == 1 else f" in ({','.join(values)})"
    for key, value in (pod["spec"].get("nodeSelector") or {}).items():
        out[key] = f"={value}"
    return out


def pod_requests(pod: Mapping[str, Any]) -> dict[str, str]:
    """What the scheduler counts for the pod: the containers and the sidecars (init containers that
    keep running) summed, the largest of the other init containers where it is larger."""
    spec = pod["spec"]
    inits = spec.get("initContainers") or []
    running = [*spec["containers"], *[c for c in inits if c.get("restartPolicy") == "Always"]]
    total: dict[str, Decimal] = {}
    for c in running:
        assert c["resources"]["limits"] == c["resources"]["requests"], c["name"]
        for key, value in c["resources"]["requests"].items():
            total[key] = total.get(key, Decimal(0)) + quantity(value)
    for c in inits:
        if c.get("restartPolicy") != "Always":
            for key, value in c["resources"]["requests"].items():
                assert quantity(value) <= total.get(key, Decimal(0)), (c["name"], key)
    return {k: quantity_text(v) for k, v in total.items()}


def quantity_text(amount: Decimal) -> str:
    """A sum as the header writes it: whole GiB as ``<n>Gi``, anything else as a plain number."""
    gib = 2**30
    return f"{int(amount // gib)}Gi" if amount >= gib and amount % gib == 0 else f"{amount.normalize():f}"


# -- the table ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", SHARING_EXAMPLES, ids=IDS)
def test_the_header_names_the_workers_node_labels(path: Path) -> None:
    assert labels(header(path)["node labels"]) == required_node_labels(worker(path))


@pytest.mark.parametrize("path", SHARING_EXAMPLES, ids=IDS)
def test_the_header_names_what_the_worker_takes(path: Path) -> None:
    pod = worker(path)
    free = header(path)["free"]
    assert labels(free) == {k: f"={v}" for k, v in pod_requests(pod).items()}
    (shm,) = [v["emptyDir"]["sizeLimit"] for v in pod["spec"]["volumes"] if v["name"] == "dshm"]
    assert re.search(rf"/dev/shm(, |'s ){shm}", free), (shm, free)
    (trainer,) = [c for c in pod["spec"]["containers"] if c["name"] == "trainer"]
    if trainer["resources"]["requests"] != pod_requests(pod):  # a sidecar: the trainer's own share is named
        cpu, memory = trainer["resources"]["requests"]["cpu"], trainer["resources"]["requests"]["memory"]
        assert f"the trainer's {cpu} CPUs and {memory}" in free, free


@pytest.mark.parametrize("path", SHARING_EXAMPLES, ids=IDS)
def test_the_header_names_the_tolerations(path: Path) -> None:
    pod = worker(path)
    tolerated = re.findall(r"(\S+?)(?:=(\S+))?:(\w+)(?: and| is| are)", header(path)["taints"].split(";")[0])
    assert [(k, v or None, e) for k, v, e in tolerated] == [
        (t["key"], t.get("value"), t["effect"]) for t in pod["spec"]["tolerations"]
    ]


@pytest.mark.parametrize("path", SHARING_EXAMPLES, ids=IDS)
def test_the_header_names_the_instance_type(path: Path) -> None:
    named = re.search(r"the instance type below, (\S+) ", prose(path))
    assert named is not None
    assert named[1] == job_of(path)["spec"]["instance"]
    assert worker(path)["metadata"]["annotations"]["kubedgx.io/instance"] == named[1]


# -- one GPU beside other jobs ----------------------------------------------------------------------


def test_the_one_gpu_example_takes_an_eighth_of_a_dgx_and_eight_fit_a_node() -> None:
    """The header's share, and its claim that seven more such workers fit beside it: eight of the
    rendered pod's requests within the node the catalog describes (allocatable CPU and memory)."""
    job = job_of(ONE_GPU)
    inst = Catalog.load().get(job["spec"]["instance"])
    assert (inst.gpus, inst.capacity, inst.mig) == (1, "norm", None)
    share = re.search(r"On a DGX H100 \((\d+) GPUs\) it takes an (\w+) of the node", prose(ONE_GPU))
    assert share is not None
    assert inst.node_gpus == int(share[1])
    assert {1: "whole", 2: "half", 4: "quarter", 8: "eighth"}[inst.node_gpus // inst.gpus] == share[2]
    more = {1: "one", 3: "three", 7: "seven"}[inst.node_gpus - 1]
    assert f"so {more} more such workers fit beside it" in prose(ONE_GPU)
    requests = pod_requests(worker(ONE_GPU))
    node = inst.family.node
    assert node is not None
    assert inst.node_gpus * quantity(requests["cpu"]) <= node.cpu
    assert inst.node_gpus * quantity(requests["memory"]) <= node.memory_gi * 2**30
    # It shares: nodes with at least one GPU, not only nodes with exactly eight (a whole-node term).
    assert required_node_labels(worker(ONE_GPU))["nvidia.com/gpu.count"] == ">0"


def test_the_one_gpu_example_is_a_4_bit_qlora_of_a_7b_model_with_a_deadline() -> None:
    spec = job_of(ONE_GPU)["spec"]
    trainer = spec["trainer"]
    assert re.search(r"7B$", trainer["model"]["name"])
    assert trainer["quantization"]["loadIn4bit"] is True
    assert spec["maxDuration"]
    assert "resources" not in spec, "the catalog's per-GPU share, as the header says"


# -- one MIG slice ------------------------------------------------------------------------------------


def test_the_mig_example_asks_one_slice_and_no_whole_gpu() -> None:
    pod = worker(MIG_DEBUG)
    spec = job_of(MIG_DEBUG)["spec"]
    inst = Catalog.load().get(spec["instance"])
    assert inst.mig_profile == "1g.10gb"
    (trainer,) = [c for c in pod["spec"]["containers"] if c["name"] == "trainer"]
    assert trainer["resources"]["requests"][f"nvidia.com/mig-{inst.mig_profile}"] == "1"
    assert "nvidia.com/gpu" not in trainer["resources"]["requests"]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["KUBEDGX_MIG_PROFILE"] == inst.mig_profile
    assert f"KUBEDGX_MIG_PROFILE={inst.mig_profile}" in prose(MIG_DEBUG)
    assert f"a {inst.mig_profile} slice of an A100 80GB" in prose(MIG_DEBUG)
    # The header's mixed-strategy requirement is the worker's own node term.
    assert required_node_labels(pod)["nvidia.com/mig.strategy"] == "=mixed"
    assert "The debug pool's nodes must be sliced with the mixed MIG strategy" in prose(MIG_DEBUG)


def test_the_mig_example_is_an_interactive_debug_session_that_fits_its_slice() -> None:
    spec = job_of(MIG_DEBUG)["spec"]
    assert spec["debug"] == {"enabled": True, "interactive": True}
    assert spec["instance"] == "dgxa100.80g.mig-1g.10gb.debug"
    assert spec["maxDuration"] == "4h"
    assert spec["trainer"]["model"]["name"] == "builtin:tiny-llama"
    assert "elastic" not in spec, "one worker of one process"
    assert "resources" not in spec, "the slice's share, as the header says"
    assert (EXAMPLES / spec["trainer"]["dataset"]["path"]).is_file()
