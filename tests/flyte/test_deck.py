"""The Flyte Deck of a DGX task and what the connector leaves at the output prefix when a job ends.

- Both DGX task classes serialize ``metadata.generates_deck = True`` (propeller attaches a deck only
  then); a plain @task keeps flytekit's false.
- :func:`flytekitplugins.dgx.deck.render`: a fixed job and history -> the summary's values, the loss
  curve's SVG with the history's points where the data puts them, user text escaped; without
  history the page says so and why.
- :mod:`flytekitplugins.dgx.results` against a local output prefix: the QLoRA task's outputs.pb is
  what flytekit's TypeEngine writes, a deck that is there already is kept, each file is written once
  per job, a write that fails or hangs leaves the outputs in memory and the phase alone.
- A local run of the QLoRA task (flytekit's AsyncConnectorExecutorMixin, as ``pyflyte run`` does it)
  gets the adapter from outputs.pb when the connector answers without outputs.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from flyteidl.core import literals_pb2
from flytekit import task
from flytekit.core.context_manager import FlyteContextManager
from flytekit.core.type_engine import TypeEngine
from flytekit.extend.backend.base_connector import Resource

from dgx_api.history import Point
from flytekitplugins.dgx import connector as connector_module
from flytekitplugins.dgx import deck, results
from flytekitplugins.dgx.connector import DGXConnector, DGXJobMetadata
from flytekitplugins.dgx.phases import SUCCEEDED
from tests.flyte.flyte import template, workflows

ADAPTER = "s3://my-bucket/adapters/flyte-qlora-legal-0a1b2c3d/adapter/"
MESSAGE = 'worker 0 exited 0 <script>alert("x")</script> & done'


@task
def plain() -> int:
    return 1


def job(uid: str | None = None, **status: Any) -> dict[str, Any]:
    """A finished job as the API server returns it."""
    return {
        "apiVersion": "kubedgx.io/v1alpha1",
        "kind": "DGXTrainingJob",
        "metadata": {"namespace": "ml-dev", "name": "flyte-abc123-0a1b2c3d4e", "uid": uid or str(uuid.uuid4())},
        "spec": {"instance": "dgxh100.80g.8.spot", "dataMounts": [{"name": "flyte-out-1", "mountPath": "/mnt/o"}]},
        "status": {
            "phase": "Succeeded",
            "nodes": "0/2",
            "restarts": 1,
            "startTime": "2025-06-01T12:00:00Z",
            "completionTime": "2025-06-01T13:02:05Z",
            "conditions": [
                {"type": "Running", "status": "False", "reason": "WorkersSucceeded", "message": "all exited 0"},
                {"type": "Succeeded", "status": "True", "reason": "Completed", "message": MESSAGE},
                {"type": "Finished", "status": "True", "reason": "Completed", "message": "ended"},
            ],
            "progress": {"step": 10, "totalSteps": 10, "loss": 0.91, "updatedAt": "2025-06-01T13:02:00Z"},
            "usage": {
                "gpuSeconds": 58608,
                "gpuHours": "16.28",
                "cost": "31.20",
                "currency": "USD",
                "spotSavings": "4.10",
                "examplePrices": True,
            },
            "artifacts": [{"name": "adapter", "uri": ADAPTER + "?a=1&b=<2>", "mount": "flyte-out-1"}],
            **status,
        },
    }


def history() -> list[Point]:
    """Ten steps of loss and learning rate, an evaluation at steps 5 and 10."""
    return [
        Point(
            step,
            10,
            loss=2.5 - 0.16 * step,
            learning_rate=2e-4 * step / 10,
            eval_loss=(2.6 - 0.15 * step) if step % 5 == 0 else None,
        )
        for step in range(1, 11)
    ]


def page_xml(page: str) -> ET.Element:
    """The page as XML (it is well-formed after its doctype line, like plot.html's)."""
    first, _, rest = page.partition("\n")
    assert first == "<!DOCTYPE html>"
    return ET.fromstring(rest)


def summary_of(root: ET.Element) -> dict[str, str]:
    table = root.find(".//table[@class='summary']")
    assert table is not None
    return {str(tr.findtext("th")): str(tr.findtext("td")) for tr in table.iter("tr")}


# -- generates_deck -----------------------------------------------------------------------------


def test_both_dgx_task_classes_serialize_generates_deck_and_a_plain_task_does_not() -> None:
    wf = workflows()
    for dgx_task in (wf.square, wf.qlora_legal):
        serialized = template(dgx_task)
        assert serialized.metadata.generates_deck is True, dgx_task.name
        assert serialized.to_flyte_idl().metadata.generates_deck.value is True, dgx_task.name
        assert not dgx_task.enable_deck, "the pod must not render flytekit's own decks"
    assert template(plain).metadata.generates_deck is False


# -- the page -----------------------------------------------------------------------------------


def test_the_page_sums_the_job_up_and_draws_the_history_s_points() -> None:
    points = history()
    finished = job()
    page = deck.render(finished, points)
    root = page_xml(page)
    assert root.findtext("head/title") == "DGXTrainingJob ml-dev/flyte-abc123-0a1b2c3d4e: Succeeded"
    rows = summary_of(root)
    assert rows["job"] == "ml-dev/flyte-abc123-0a1b2c3d4e"
    assert rows["phase"] == "Succeeded"
    assert rows["reason"] == "Completed"
    assert rows["message"] == MESSAGE  # escaped in the page, the same text read back
    assert rows["instance"] == "dgxh100.80g.8.spot"
    assert rows["nodes"] == "0/2"
    assert rows["restarts"] == "1"
    assert rows["duration"] == "1h02m"
    assert rows["GPU-hours"] == "16.28"
    assert rows["cost"] == "31.20 USD (the catalog's example prices)"
    assert rows["spot savings"] == "4.10 USD"
    assert rows["last report"].startswith("step 10/10")
    artifact = root.find(".//table[@class='artifacts']/tr/td/code")
    assert artifact is not None
    assert artifact.text == ADAPTER + "?a=1&b=<2>"
    assert "<script>" not in page
    assert "&lt;script&gt;" in page
    assert "b=&lt;2&gt;" in page
    commands = root.findtext(".//pre") or ""
    for verb in ("describe", "logs", "plot"):
        assert f"kubedgx {verb} flyte-abc123-0a1b2c3d4e -n ml-dev" in commands, commands

    panels = root.findall("body/svg")
    assert [p.get("data-panel") for p in panels] == ["loss", "learning rate"]
    loss_panel = panels[0]
    area = loss_panel.find("rect[@class='plot-area']")
    assert area is not None
    x, y, w, h = (float(area.get(k) or "nan") for k in ("x", "y", "width", "height"))
    xlo, xhi = map(float, (loss_panel.get("data-xlim") or "").split())
    ylo, yhi = map(float, (loss_panel.get("data-ylim") or "").split())
    line = loss_panel.find("polyline[@data-series='loss']")
    assert line is not None
    drawn = [tuple(map(float, pair.split(","))) for pair in (line.get("points") or "").split()]
    expected = [(p.step, p.loss) for p in points if p.loss is not None]
    assert len(drawn) == len(expected) == 10
    for (step, value), (px, py) in zip(expected, drawn, strict=True):
        assert px == pytest.approx(x + (step - xlo) / (xhi - xlo) * w, abs=0.006), step
        assert py == pytest.approx(y + h - (value - ylo) / (yhi - ylo) * h, abs=0.006), step
    markers = loss_panel.findall("circle[@class='marker']")
    assert len(markers) == 2, "an eval loss marker at steps 5 and 10"
    last = {str(tr.findtext("th")): str(tr.findtext("td")) for tr in root.iter("tr") if tr.find("td[@class='value']")
            is not None}  # fmt: skip
    assert last["step"] == "10/10"
    assert last["loss"] == "0.9"


def test_without_history_the_page_says_so_and_why() -> None:
    root = page_xml(deck.render(job(), [], history_note="flyte-x: no progress history: no progress reported yet"))
    assert root.findall("body/svg") == []
    notes = [p.text or "" for p in root.iter("p")]
    assert "No loss curve: flyte-x: no progress history: no progress reported yet." in notes
    plain_page = page_xml(deck.render(job(), []))
    assert any("the task reported no progress" in (p.text or "") and "Out data mount" in (p.text or "")
               for p in plain_page.iter("p"))  # fmt: skip


def test_a_failed_job_s_page_carries_the_failed_condition() -> None:
    failed = job(
        phase="Failed",
        conditions=[{"type": "Failed", "status": "True", "reason": "WorkerFailed", "message": "exit 1 & <oops>"}],
        usage={},
        artifacts=[],
    )
    page = deck.render(failed, [])
    rows = summary_of(page_xml(page))
    assert (rows["phase"], rows["reason"], rows["message"]) == ("Failed", "WorkerFailed", "exit 1 & <oops>")
    assert "GPU-hours" not in rows
    assert "Artifacts" not in page


def test_a_sample_page_renders(tmp_path: Path) -> None:
    """The page a person opens: written where a test run leaves it, and it holds a picture."""
    out = tmp_path / "deck.html"
    out.write_text(deck.render(job(), history()), encoding="utf-8")
    assert out.stat().st_size > 5000
    assert out.read_text(encoding="utf-8").count("<svg") == 2


# -- results: outputs.pb and deck.html at the output prefix -------------------------------------


def test_outputs_pb_is_what_flytekit_writes_for_a_str_output() -> None:
    ctx = FlyteContextManager.current_context()
    flytekit_s = TypeEngine.dict_to_literal_map(ctx, {"adapter": ADAPTER}, {"adapter": str}).to_flyte_idl()
    ours = literals_pb2.LiteralMap.FromString(results.literal_map({"adapter": ADAPTER}))
    assert ours == flytekit_s
    assert ours.literals["adapter"].scalar.primitive.string_value == ADAPTER


def test_leave_writes_outputs_pb_and_the_deck_once_and_keeps_a_deck_that_is_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(results, "history", lambda j: (history(), None))
    finished = job()
    assert asyncio.run(results.leave(str(tmp_path), finished, {"adapter": ADAPTER})) is None
    outputs = literals_pb2.LiteralMap.FromString((tmp_path / "outputs.pb").read_bytes())
    assert outputs.literals["adapter"].scalar.primitive.string_value == ADAPTER
    page = (tmp_path / "deck.html").read_text(encoding="utf-8")
    assert "<polyline" in page
    assert "16.28" in page

    # Polled again (GetTask is): nothing is written again.
    written: list[str] = []
    monkeypatch.setattr(results, "put", lambda uri, data, content_type=None: written.append(uri))
    assert asyncio.run(results.leave(str(tmp_path), finished, {"adapter": ADAPTER})) is None
    assert written == []

    # A deck the task wrote itself is kept.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "deck.html").write_text("<p>the task's own deck</p>", encoding="utf-8")
    assert asyncio.run(results.write_deck(str(mine), job())) == "kept: one is there already (the task's own)"
    assert written == []
    assert (mine / "deck.html").read_text(encoding="utf-8") == "<p>the task's own deck</p>"


def test_nothing_is_left_before_the_job_ends(tmp_path: Path) -> None:
    running = job(phase="Running")
    assert asyncio.run(results.leave(str(tmp_path), running, {"adapter": ADAPTER})) == {"adapter": ADAPTER}
    assert list(tmp_path.iterdir()) == []


def test_a_store_that_refuses_leaves_the_outputs_in_memory_and_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(uri: str, data: bytes, content_type: str | None = None) -> None:
        try:
            raise PermissionError(f"Access Denied: {uri}")
        except PermissionError as exc:  # as flytekit wraps the store's error
            raise RuntimeError(f"Failed to put data to {uri}\n\nOriginal exception: {exc}") from exc

    monkeypatch.setattr(results, "put", refuse)
    monkeypatch.setattr(results, "history", lambda j: ([], "none"))
    with caplog.at_level(logging.WARNING, logger=results.__name__):
        assert asyncio.run(results.leave(str(tmp_path), job(), {"adapter": ADAPTER})) == {"adapter": ADAPTER}
    warnings = [r.getMessage() for r in caplog.records]
    assert any("outputs.pb failed (PermissionError: Access Denied" in w and "in the answer" in w for w in warnings)
    assert any("writing the deck to" in w and "PermissionError" in w for w in warnings)


def test_a_store_that_hangs_is_given_up_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def hang(uri: str, data: bytes, content_type: str | None = None) -> None:
        release.wait(30)

    monkeypatch.setattr(results, "put", hang)
    monkeypatch.setattr(results, "history", lambda j: ([], "none"))
    monkeypatch.setattr(results, "WRITE_TIMEOUT_S", 0.2)

    async def both() -> tuple[Any, Any]:
        try:
            return await results.leave(str(tmp_path), job(), {"adapter": ADAPTER}), await results.write_deck(
                str(tmp_path), job()
            )
        finally:
            release.set()  # the threads end (asyncio.run waits for them)

    assert asyncio.run(both()) == ({"adapter": ADAPTER}, None)


def test_all_steps_together_keep_within_propeller_s_wait_and_a_slow_history_leaves_a_page_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each step alone may take up to its own limit; together they stop at BUDGET_S (propeller's
    GetTask waits 30 s), the history giving way to the page's own write."""
    release = threading.Event()

    def hang(*args: Any, **kwargs: Any) -> Any:
        release.wait(30)
        return [], "late"

    for step in ("WRITE_TIMEOUT_S", "HISTORY_TIMEOUT_S"):
        monkeypatch.setattr(results, step, 60.0)
    monkeypatch.setattr(results, "BUDGET_S", 3.5)  # the history gets 0.5 s of it (3 s stay for the write)
    monkeypatch.setattr(results, "history", hang)

    async def leave() -> tuple[Any, float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            return await results.leave(str(tmp_path), job(), {"adapter": ADAPTER}), loop.time() - start
        finally:
            release.set()

    outputs, took = asyncio.run(leave())
    assert outputs is None, "outputs.pb was written (the local store answers at once)"
    assert took < 3.5
    page = (tmp_path / "deck.html").read_text(encoding="utf-8")
    assert "No loss curve: the history was not read in time" in page

    monkeypatch.setattr(results, "put", hang)  # now the store hangs too: the budget ends it all
    monkeypatch.setattr(results, "BUDGET_S", 0.5)
    release.clear()
    outputs, took = asyncio.run(leave())
    assert outputs == {"adapter": ADAPTER}
    assert took < 2


# -- a local run: flytekit's mixin reads outputs.pb ---------------------------------------------


def test_a_local_run_of_the_qlora_task_gets_the_adapter_from_outputs_pb(monkeypatch: pytest.MonkeyPatch) -> None:
    uid = str(uuid.uuid4())
    seen: list[tuple[str, Resource]] = []

    async def apply_plan(plan: Any) -> DGXJobMetadata:
        return DGXJobMetadata(plan.namespace, plan.name, uid, plan.task_type, plan.output_prefix)

    async def read_job(meta: DGXJobMetadata) -> dict[str, Any]:
        found = job(uid)
        found["metadata"] |= {"namespace": meta.namespace, "name": meta.name}
        found["status"]["artifacts"] = [{"name": "adapter", "uri": ADAPTER}]
        return found

    real_get = DGXConnector.get

    async def get(self: DGXConnector, resource_meta: DGXJobMetadata, **kwargs: Any) -> Resource:
        resource = await real_get(self, resource_meta, **kwargs)
        seen.append((resource_meta.output_prefix, resource))
        return resource

    monkeypatch.setattr(connector_module, "apply_plan", apply_plan)
    monkeypatch.setattr(connector_module, "read_job", read_job)
    monkeypatch.setattr(DGXConnector, "get", get)
    monkeypatch.setattr(results, "history", lambda j: ([], "no cluster in this test"))

    assert workflows().qlora_legal() == ADAPTER  # flytekit's local execution: the mixin's execute

    ((prefix, resource),) = seen
    assert resource.phase == SUCCEEDED
    assert resource.outputs is None, "the adapter went to outputs.pb, and the mixin read it from there"
    written = literals_pb2.LiteralMap.FromString(Path(prefix, "outputs.pb").read_bytes())
    assert written.literals["adapter"].scalar.primitive.string_value == ADAPTER
    assert "no cluster in this test" in Path(prefix, "deck.html").read_text(encoding="utf-8")
