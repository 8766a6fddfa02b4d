"""`kubedgx usage` against the in-memory API server: the jobs and the budget of
tests/unit/usage_report_data.py stored as the operator would have written them (spec by a create,
status by the /status subresource), read with a kubeconfig as a user would.

The verb's client is synchronous (the standard library), and the emulator serves from this test's
event loop: the verb runs on a thread (``asyncio.to_thread``) so the loop keeps answering. The
emulator's clock stamps creationTimestamp; it is set to each job's creation in the scenario, and
the report's clock to the scenario's now. docs/cost.md shows the output of these runs
(``KUBEDGX_USAGE_DOC=path`` writes them there for copying).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
from pathlib import Path

import pytest

from dgx_operator.cli import report
from dgx_operator.cli.main import main
from tests.integration import emulator as emulator_module
from tests.integration.emulator import Emulator
from tests.unit import usage_report_data as data

pytestmark = pytest.mark.asyncio


@pytest.fixture
def scenario(emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> Emulator:
    """The two teams' namespaces, jobs (with status.usage) and team-a's budget (with its ledger)."""
    for name, labels in data.NAMESPACES.items():
        emulator.create_namespace(name, labels)
    uids = {}
    for body in data.jobs():
        meta = body["metadata"]
        created = meta["creationTimestamp"]
        monkeypatch.setattr(emulator_module, "_now", lambda plus_seconds=0, at=created: at)
        stored = emulator.create(
            "dgxtrainingjobs",
            {"apiVersion": body["apiVersion"], "kind": body["kind"], "spec": body["spec"],
             "metadata": {"name": meta["name"], "namespace": meta["namespace"], "labels": meta["labels"]}},
        )  # fmt: skip
        assert stored["metadata"]["creationTimestamp"] == created
        uids[meta["name"]] = stored["metadata"]["uid"]
        emulator.patch_status("dgxtrainingjobs", meta["namespace"], meta["name"], body["status"])
    monkeypatch.undo()
    budget = data.budget(uids)
    emulator.create("dgxbudgets", {k: v for k, v in budget.items() if k != "status"})
    emulator.patch_status("dgxbudgets", "team-a", "monthly", budget["status"])
    monkeypatch.setattr(report, "now", lambda: data.NOW)
    return emulator


async def usage(kubeconfig: Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(main, ["usage", "--kubeconfig", str(kubeconfig), *argv], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _keep(name: str, argv: tuple[str, ...], out: str, err: str) -> None:
    """With KUBEDGX_USAGE_DOC set, the run as docs/cost.md shows it."""
    target = os.environ.get("KUBEDGX_USAGE_DOC")
    if target:
        with open(target, "a", encoding="utf-8") as doc:
            doc.write(f"### {name}\n$ kubedgx usage {' '.join(argv)}\n{out}{err}\n")


async def test_a_namespace_with_a_budget_ledger(scenario: Emulator, kubeconfig: Path) -> None:
    argv = ("-n", "team-a")
    code, out, err = await usage(kubeconfig, *argv)
    assert code == 0, err
    _keep("team-a", argv, out, err)
    lines = out.splitlines()
    assert lines[3].split() == ["team-a", "52.50", "86.50", "-", "2", "DGXBudget", "monthly", "ledger"]
    assert any(line.split()[:6] == ["team-a", "llama-a", "norm", "12.50", "42.50", "0.00"] for line in lines)
    assert any(line.split()[:5] == ["team-a", "llama-b", "-", "40.00", "44.00"] for line in lines)
    assert "deleted (budget ledger)" in out
    assert "example prices" in err


async def test_the_context_namespace_is_the_default(scenario: Emulator, kubeconfig: Path) -> None:
    """The emulator's kubeconfig context names namespace ml, where nothing ran."""
    code, out, err = await usage(kubeconfig)
    assert code == 0, err
    assert out.splitlines()[3].split() == ["ml", "0.00", "0.00", "0.00", "0", "live", "jobs"]


async def test_each_team_by_its_namespace_label(scenario: Emulator, kubeconfig: Path) -> None:
    for team, expected in (
        ("a", ["team-a", "52.50", "86.50", "-", "2", "DGXBudget", "monthly", "ledger"]),
        ("b", ["team-b", "48.00", "89.60", "73.60", "2", "live", "jobs"]),
    ):
        argv = ("--team-label", f"team={team}")
        code, out, err = await usage(kubeconfig, *argv)
        assert code == 0, err
        _keep(f"team {team}", argv, out, err)
        assert out.splitlines()[3].split() == expected
        assert out.count(f"team-{'b' if team == 'a' else 'a'}") == 0
    code, out, err = await usage(kubeconfig, "--team-label", "team=b")
    assert "team-b: no DGXBudget counts the whole namespace in 2026-12" in err


async def test_all_namespaces_last_month_and_a_queue_as_json(scenario: Emulator, kubeconfig: Path) -> None:
    code, out, err = await usage(kubeconfig, "-A", "-o", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert [(n["namespace"], n["gpuHours"], n["cost"]) for n in doc["namespaces"]] == [
        ("team-a", "52.50", "86.50"),
        ("team-b", "48.00", "89.60"),
    ]
    argv = ("-n", "team-a", "--period", "last-month")
    code, out, err = await usage(kubeconfig, *argv)
    assert code == 0, err
    _keep("team-a last month", argv, out, err)
    assert out.splitlines()[3].split() == ["team-a", "100.00", "156.00", "-", "2", "DGXBudget", "monthly", "history"]
    code, out, err = await usage(kubeconfig, "-n", "team-b", "--queue", "research", "-o", "csv")
    assert code == 0, err
    assert out.splitlines()[1:] == [
        "namespace,team-b,,,32.00,35.20,73.60,USD,live jobs",
        "job,team-b,vit-b,spot,32.00,35.20,73.60,USD,Succeeded",
    ]


async def test_rbac_refusals_are_one_line(scenario: Emulator, kubeconfig: Path) -> None:
    """A user who may not list namespaces asks for a team: the apiserver's 403, said plainly."""
    scenario.fail("list", "namespaces", code=403)
    code, out, err = await usage(kubeconfig, "--team-label", "team=a")
    assert code == 2
    assert err.startswith("kubedgx usage: forbidden (403): ")
    assert len(err.splitlines()) == 1
    assert "Traceback" not in err
    assert out == ""


async def test_a_cluster_without_the_crds_says_so(scenario: Emulator, kubeconfig: Path) -> None:
    scenario.fail("list", "dgxtrainingjobs", code=404)
    code, out, err = await usage(kubeconfig, "-n", "team-a")
    assert code == 2
    assert "does not serve dgxtrainingjobs.kubedgx.io: are kubedgx's CRDs installed" in err
    assert out == ""
