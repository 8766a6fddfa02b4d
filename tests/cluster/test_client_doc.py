"""docs/client.md runs as written: its cells, in the page's order, against the real control plane.

A cell is a ```python block after a ``<!-- kubedgx:client-example NAME (...) -->`` comment. Those
marked ``(run by tests/cluster/test_client_doc.py)`` are executed here, one namespace of globals for
all (a notebook's kernel), with only the ``NAMESPACE = ...`` line replaced by the test's namespace
and ``KUBECONFIG`` pointing at the test's cluster; kwok plays the worker's progress and exit between
them. The others (``logs``, ``history``, ``fetch``) need a kubelet that runs the trainer and an
object store: they are compiled here and proven on real nodes by tests/nodes/test_training.py.
"""

from __future__ import annotations

import io
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dgx_operator.client import Client, JobFailedError
from tests.cluster.operator import Operator
from tests.cluster.test_user_verbs import exit_worker, report, worker0
from tests.conftest import ROOT
from tests.e2e.jobs import running_with, wait_job
from tests.e2e.kubectl import JOBS, Kubectl, dig, wait_for

TIMEOUT = 60
DOC = ROOT / "docs" / "client.md"
MARKER = "<!-- kubedgx:client-example"
RUN = "(run by tests/cluster/test_client_doc.py)"
CELL = re.compile(
    re.escape(MARKER) + r" (?P<name>[\w-]+) (?P<note>\([^)]*\)) -->\n```python\n(?P<source>.*?)^```",
    re.MULTILINE | re.DOTALL,
)
NAMESPACE_LINE = re.compile(r"^NAMESPACE = .*$", re.MULTILINE)
#: The cells the test runs, in the page's order: a new one must be given its place here.
RUN_ORDER = ["connect", "submit", "progress", "list", "wait", "cancel"]


@dataclass(frozen=True)
class Cell:
    name: str
    run: bool
    source: str


def cells(text: str | None = None) -> list[Cell]:
    page = DOC.read_text(encoding="utf-8") if text is None else text
    return [Cell(m["name"], m["note"] == RUN, m["source"]) for m in CELL.finditer(page)]


def test_every_python_block_of_the_page_is_a_marked_cell_that_compiles() -> None:
    page = DOC.read_text(encoding="utf-8")
    found = cells(page)
    assert len(found) == page.count("```python"), "a ```python block of docs/client.md has no client-example marker"
    assert len({c.name for c in found}) == len(found)
    assert [c.name for c in found if c.run] == RUN_ORDER
    for cell in found:
        compile(cell.source, f"docs/client.md:{cell.name}", "exec")
        assert cell.run or "tests/nodes/test_training.py" in page.split(f"{MARKER} {cell.name} ")[1].split("\n")[0]
    assert len(NAMESPACE_LINE.findall(page)) == 1


class Notebook:
    """The page's cells run in one namespace of globals, each one's printed output returned."""

    def __init__(self, namespace: str) -> None:
        self.cells = {c.name: c for c in cells() if c.run}
        self.globals: dict[str, Any] = {"__name__": "client_doc"}
        self.namespace = namespace

    def run(self, name: str, out: io.StringIO | None = None) -> str:
        out = io.StringIO() if out is None else out
        source = self.cells[name].source
        if name == "connect":
            source, replaced = NAMESPACE_LINE.subn(f"NAMESPACE = {self.namespace!r}", source)
            assert replaced == 1
        self.globals["print"] = lambda *args, **kw: print(*args, **{**kw, "file": out})
        exec(compile(source, f"docs/client.md:{name}", "exec"), self.globals)
        return out.getvalue()

    def run_while(self, name: str, meanwhile: Callable[[], None]) -> tuple[str, BaseException | None]:
        """Run a cell that blocks (``wait``) in a thread while ``meanwhile`` plays the cluster's part."""
        result: list[tuple[str, BaseException | None]] = []
        out = io.StringIO()

        def cell() -> None:
            try:
                result.append((self.run(name, out), None))
            except BaseException as exc:  # what the cell printed before it raised, and what it raised
                result.append((out.getvalue(), exc))

        thread = threading.Thread(target=cell, daemon=True)
        thread.start()
        meanwhile()
        thread.join(TIMEOUT)
        assert result, f"the {name} cell did not return"
        return result[0]


def _kubeconfig(k: Kubectl, path: Path) -> Path:
    """The test's kubeconfig with its context current: what the page's reader has."""
    assert k.kubeconfig
    config = yaml.safe_load(Path(k.kubeconfig).read_text(encoding="utf-8"))
    config["current-context"] = k.context
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def _failed(k: Kubectl, name: str) -> dict[str, Any]:
    return next(c for c in dig(k.get(JOBS, name), "status", "conditions") if c["type"] == "Failed")


def test_the_client_doc_runs_as_written(
    operator: Operator, namespace: Kubectl, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert namespace.namespace
    monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(namespace, tmp_path / "kubeconfig")))
    monkeypatch.chdir(tmp_path)
    nb = Notebook(namespace.namespace)
    kd = Client(namespace.namespace)

    assert nb.run("connect").strip() == namespace.namespace

    out = nb.run("submit")
    first = nb.globals["name"]
    assert first.startswith("notebook-")
    assert out.split() == [first, dig(namespace.get(JOBS, first), "metadata", "uid")]
    wait_job(namespace, first, "Running", running_with(1), timeout=TIMEOUT)
    pod = worker0(namespace, first)
    report(namespace, pod, {"step": 40, "totalSteps": 150, "loss": 5.4121, "learningRate": 0.005})
    wait_for("progress", lambda: (p := kd.progress(first)) is not None and p.step == 40, timeout=TIMEOUT, interval=0.5)

    out = nb.run("progress")
    assert out.startswith("step 40/150, loss 5.4121, reported at "), out
    assert out.splitlines()[-1] == "Running"

    out = nb.run("list")
    node = dig(namespace.get("pods", pod), "spec", "nodeName")
    assert out.splitlines() == [f"{first} Running 40", f"0 {pod} {node} running"], out

    # wait returns once the worker exits 0; the job has no Out mount, so no artifacts.
    succeed = {"status": "Succeeded", "progress": {"step": 150, "totalSteps": 150}}
    out, error = nb.run_while("wait", lambda: exit_worker(namespace, pod, 0, succeed))
    assert error is None, error
    assert out.strip() == f"{first} Succeeded []"

    # The same cells for a second run that fails: wait prints the job's reason and message and raises.
    nb.run("submit")
    second = nb.globals["name"]
    assert second != first
    wait_job(namespace, second, "Running", running_with(1), timeout=TIMEOUT)
    out, error = nb.run_while(
        "wait", lambda: exit_worker(namespace, worker0(namespace, second), 2, "bad input: the data is empty")
    )
    assert isinstance(error, JobFailedError), error
    stored = _failed(namespace, second)
    assert (error.reason, error.message) == (stored["reason"], stored["message"])
    assert out.strip() == f"{second} failed: {stored['reason']}: {stored['message']}"

    out = nb.run("cancel")
    assert out.strip() == str([first])
    assert namespace.get(JOBS, second) is None
