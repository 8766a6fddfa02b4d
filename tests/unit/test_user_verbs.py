"""The user verbs' pure parts: progress lines made readable, the list's columns and ETA, the
kubeconfig client's Warning headers; and the verbs without a cluster or without the optional
libraries (one line naming the fix, never a traceback). The verbs against a cluster:
tests/cluster/test_user_verbs.py and tests/nodes/test_training.py."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from dgx_api.progress import HISTORY_DIR
from dgx_operator.api.trainingjob import DGXTrainingJob
from dgx_operator.cli.jobs import list_rows
from dgx_operator.cli.main import main
from dgx_operator.client import kubeclient
from dgx_operator.client.jobs import LogLine, read_manifests
from dgx_operator.client.lines import age_text, describe_event, duration_text, eta_seconds
from tests.unit.test_cli_without_daemon import BLOCKED, cli_without_daemon

T0 = datetime(2026, 12, 5, 8, 0, tzinfo=UTC)


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err, stdin=io.StringIO(""))
    return code, out.getvalue(), err.getvalue()


# -- progress lines ----------------------------------------------------------------------------------


def test_a_progress_line_reads_as_a_sentence_with_only_the_fields_it_has() -> None:
    event = {
        "event": "progress",
        "step": 40,
        "totalSteps": 100,
        "loss": 1.23456,
        "evalLoss": 1.5,
        "evalStep": 40,
        "learningRate": 0.0002,
        "tokensPerSecond": 1234.5,
        "epoch": 0.4,
    }
    assert describe_event(event) == (
        "step 40/100 (40%)  loss 1.2346  eval 1.5000 @40  lr 2.00e-04  1,234 tok/s  epoch 0.40"
    )
    assert describe_event({"event": "progress", "step": 3, "loss": None}) == "step 3"
    assert describe_event({"event": "progress", "step": 3, "totalSteps": 9, "samplesPerSecond": 2.5}) == (
        "step 3/9 (33%)  2.5 samples/s"
    )
    assert describe_event({"event": "eval", "step": 20, "evalLoss": 2.0}) == "eval at step 20: loss 2.0000"
    start = {"event": "start", "step": 0, "totalSteps": 60, "precision": "fp32", "quantization": "none (fallback)"}
    assert describe_event(start) == "training starts at step 0 of 60 (fp32, none (fallback))"
    assert describe_event({"event": "summary", "status": "Succeeded", "trainLoss": 0.5}) == (
        "finished: Succeeded, mean train loss 0.5000"
    )


def test_a_log_line_shows_other_output_as_it_is() -> None:
    plain = LogLine("p", 0, "NCCL INFO ring 0", None)
    assert plain.shown == "NCCL INFO ring 0"
    raw = json.dumps({"event": "progress", "step": 1, "totalSteps": 2, "loss": 3.0})
    assert LogLine("p", 0, raw, json.loads(raw)).shown == "step 1/2 (50%)  loss 3.0000"


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(None, "-"), (-1.0, "-"), (0.4, "0s"), (45, "45s"), (192, "3m12s"), (3720, "1h02m"), (90000, "1d01h")],
)
def test_durations_read_as_people_write_them(seconds: float | None, shown: str) -> None:
    assert duration_text(seconds) == shown


def test_eta_is_the_steps_left_at_the_runs_pace_and_none_without_one() -> None:
    assert eta_seconds(40, 100, T0, T0 + timedelta(seconds=400)) == pytest.approx(600)
    assert eta_seconds(100, 100, T0, T0 + timedelta(seconds=1)) == 0
    assert eta_seconds(0, 100, T0, T0 + timedelta(seconds=10)) is None
    assert eta_seconds(40, 100, None, T0) is None
    assert age_text(T0 - timedelta(hours=50), T0) == "2d"
    assert age_text(T0 - timedelta(seconds=30), T0) == "30s"


# -- the list's columns ------------------------------------------------------------------------


def job(name: str, status: dict[str, Any] | None) -> DGXTrainingJob:
    body: dict[str, Any] = {
        "apiVersion": "kubedgx.io/v1alpha1",
        "kind": "DGXTrainingJob",
        "metadata": {"name": name, "namespace": "ml", "creationTimestamp": "2026-12-05T07:00:00Z"},
        "spec": {"instance": "dgxa100.80g.8.norm", "command": ["true"]},
    }
    if status is not None:
        body["status"] = status
    return DGXTrainingJob.model_validate(body)


def test_list_rows_show_progress_eta_cost_and_no_eta_after_a_restart() -> None:
    running = {
        "phase": "Running",
        "nodes": "2/2",
        "startTime": "2026-12-05T07:50:00Z",
        "progress": {"step": 40, "totalSteps": 100, "loss": 1.5, "updatedAt": "2026-12-05T07:56:40Z"},
        "usage": {"gpuHours": "2.13", "cost": "6.40", "currency": "USD", "buckets": []},
    }
    restarted = {**running, "restarts": 1, "attempt": 1}
    rows = list_rows([job("a", running), job("b", restarted), job("c", None)], all_namespaces=True, wide=False, at=T0)
    head = rows[0]
    got = [dict(zip(head, r, strict=True)) for r in rows[1:]]
    assert got[0] == {
        "NAMESPACE": "ml",
        "NAME": "a",
        "PHASE": "Running",
        "NODES": "2/2",
        "STEP": "40/100",
        "LOSS": "1.5000",
        "ETA": "10m00s",
        "RESTARTS": "0",
        "GPU-HOURS": "2.13",
        "COST": "6.40 USD",
        "AGE": "60m",
    }
    assert got[1]["ETA"] == "-"
    assert got[1]["RESTARTS"] == "1"
    assert (got[2]["PHASE"], got[2]["STEP"], got[2]["LOSS"], got[2]["COST"]) == ("Pending", "-", "-", "-")


# -- the client's plumbing ---------------------------------------------------------------------


def test_the_webhooks_warnings_are_collected_as_kubectl_shows_them() -> None:
    api = kubeclient.Client(server="https://example.invalid", namespace="ml", context="c")
    headers = Message()
    headers["Warning"] = '299 - "DGXBudget ml/burst: this run\'s worst case does not fit"'
    headers["Warning"] = '299 - "spec.maxDuration: the default 24h of DGXLimits ml/default applies"'
    api._collect_warnings(headers)
    assert api.warnings == [
        "DGXBudget ml/burst: this run's worst case does not fit",
        "spec.maxDuration: the default 24h of DGXLimits ml/default applies",
    ]


def test_history_keeps_what_the_out_mounts_hold_when_the_pods_cannot_be_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader allowed the job, its mounts and their store but not the pods (the Flyte connector
    without `list pods`) still gets the history the Out mount keeps; without any, the error says why."""
    from dgx_api.history import parse_lines
    from dgx_operator.client import Client, NothingToFetchError

    job = {"apiVersion": "kubedgx.io/v1alpha1", "kind": "DGXTrainingJob",
           "metadata": {"name": "j", "namespace": "ml", "uid": "0a1b2c3d-0000-0000-0000-000000000000"},
           "spec": {"instance": "dgxh100.80g.8.norm", "command": ["python", "train.py"],
                    "dataMounts": [{"name": "out", "mountPath": "/mnt/out"}]}}  # fmt: skip
    mount = {"apiVersion": "kubedgx.io/v1alpha1", "kind": "DGXDataMount", "metadata": {"name": "out"},
             "spec": {"source": "s3://bucket/runs", "direction": "Out"}}  # fmt: skip
    api = kubeclient.Client(server="https://example.invalid", namespace="ml", context="c")
    monkeypatch.setattr(api, "get", lambda path, query=None: mount if "dgxdatamounts" in path else job)

    def forbidden(path: str, **kwargs: Any) -> list[dict[str, Any]]:
        raise kubeclient.ForbiddenError('pods is forbidden: User "flyte" cannot list resource "pods"')

    monkeypatch.setattr(api, "list", forbidden)
    kept = [parse_lines(['{"event": "progress", "step": 1, "totalSteps": 2, "loss": 1.5}'])]
    monkeypatch.setattr(Client, "_remote_history", lambda self, j, m: kept)
    client = Client(api=api)
    assert [(p.step, p.loss) for p in client.history("j")] == [(1, 1.5)]
    monkeypatch.setattr(Client, "_remote_history", lambda self, j, m: [])
    with pytest.raises(NothingToFetchError, match=r"j: no progress history: the pods of j: pods is forbidden"):
        client.history("j")


def test_manifests_are_read_with_lists_flattened_and_junk_named() -> None:
    text = "kind: List\napiVersion: v1\nitems:\n- {kind: A}\n- {kind: B}\n---\n---\nkind: C\n"
    assert [d["kind"] for d in read_manifests(text, "f.yaml")] == ["A", "B", "C"]
    from dgx_operator.client import SubmitError

    with pytest.raises(SubmitError, match=r"f\.yaml: a document is not a mapping"):
        read_manifests("- 1\n- 2\n", "f.yaml")


# -- without a cluster, without the optional libraries ---------------------------------------------


def test_a_verb_without_a_kubeconfig_says_how_to_give_one(tmp_path: Path) -> None:
    code, out, err = run("list", "--kubeconfig", str(tmp_path / "none"))
    assert code == 1
    assert out == ""
    assert err.strip() == f"kubedgx list: --kubeconfig {tmp_path / 'none'}: no such file"
    code, _, err = run("wait", "x", "--kubeconfig", str(tmp_path / "none"))
    assert code == 2, "wait: 2 means it could not be waited for"


def test_the_user_verbs_run_without_the_daemons_libraries(tmp_path: Path) -> None:
    """`kubedgx list`, and `kubedgx plot --dir` to HTML, in an interpreter where kopf, the async
    client, the store libraries and matplotlib cannot be imported."""
    missing = cli_without_daemon("list", "--kubeconfig", str(tmp_path / "none"))
    assert missing.returncode == 1, missing.stderr
    assert "no such file" in missing.stderr
    history = tmp_path / HISTORY_DIR
    history.mkdir()
    lines = [
        {"event": "progress", "step": s, "totalSteps": 4, "loss": 2.0 - s / 4, "learningRate": 1e-3}
        for s in (1, 2, 3, 4)
    ]
    (history / "20261205T080000Z-node.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    page = tmp_path / "loss.html"
    drawn = cli_without_daemon("plot", "--dir", str(tmp_path), "-o", str(page), blocked=(*BLOCKED, "matplotlib"))
    assert drawn.returncode == 0, drawn.stderr
    assert "<svg" in page.read_text(encoding="utf-8")
    without = (*BLOCKED, "matplotlib")
    png = cli_without_daemon("plot", "--dir", str(tmp_path), "-o", str(tmp_path / "l.png"), blocked=without)
    assert png.returncode == 1
    assert "pip install 'kubedgx[plot]'" in png.stderr
    assert "Traceback" not in png.stderr


def test_plot_of_a_local_run_draws_its_history_in_the_terminal(tmp_path: Path) -> None:
    history = tmp_path / HISTORY_DIR
    history.mkdir()
    rows = [{"event": "progress", "step": s, "totalSteps": 10, "loss": 5.0 - s * 0.3} for s in range(1, 11)]
    (history / "20261205T080000Z-node.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows), encoding="utf-8")
    code, out, err = run("plot", "--dir", str(tmp_path), "--width", "80")
    assert code == 0, err
    assert "loss" in out
    assert "4.7" in out, out  # the largest loss labels the top of its panel
    assert "2" in out
    code, _, err = run("plot", "--dir", str(tmp_path / "empty"))
    assert code == 1
    assert "no progress reported yet" in err
    code, _, err = run("plot")
    assert code == 2
    assert "name a job, or --dir" in err
