"""What the connector leaves at the output prefix when a job ends: a restarted run's error.pb goes
once the job succeeded (propeller reads error.pb before outputs.pb and would fail the task with it)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("flytekit", reason="flytekit is not installed")

from flytekitplugins.dgx import results


def job(phase: str, uid: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ml", "name": f"flyte-{uid}", "uid": uid}, "status": {"phase": phase}}


@pytest.fixture(autouse=True)
def no_history(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results, "history", lambda job: ([], "no history in this test"))


def left(prefix: Path, body: dict[str, Any], *, function_task: bool) -> set[str]:
    asyncio.run(results.leave(str(prefix), body, None, function_task=function_task))
    return {p.name for p in prefix.iterdir()}


def test_a_succeeded_function_task_loses_the_error_pb_of_a_run_its_job_restarted(tmp_path: Path) -> None:
    prefix = tmp_path / "n0" / "data" / "0"
    prefix.mkdir(parents=True)
    (prefix / "error.pb").write_bytes(b"an earlier run's error")
    (prefix / "outputs.pb").write_bytes(b"rank 0's outputs")
    assert left(prefix, job("Succeeded", "a1"), function_task=True) == {"outputs.pb", "deck.html"}


@pytest.mark.parametrize(("phase", "function_task"), [("Failed", True), ("Succeeded", False), ("Running", True)])
def test_the_error_pb_stays_when_the_job_failed_is_not_over_or_is_no_function_task(
    tmp_path: Path, phase: str, function_task: bool
) -> None:
    prefix = tmp_path / "p"
    prefix.mkdir()
    (prefix / "error.pb").write_bytes(b"this run's error")
    assert "error.pb" in left(prefix, job(phase, f"b-{phase}-{function_task}"), function_task=function_task)
    assert (prefix / "error.pb").read_bytes() == b"this run's error"
