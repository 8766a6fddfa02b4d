"""`kubedgx usage` without a cluster: the period and option parsing, where each namespace's total
comes from (the budget's ledger brought to now, a closed period's history, or the live jobs), the
per-job rows, and the three formats, with the numbers of tests/unit/usage_report_data.py."""

from __future__ import annotations

import io
import json
import stat
import sys
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from dgx_operator.cli import report
from dgx_operator.cli.main import main
from dgx_operator.client import kubeclient
from tests.unit import usage_report_data as data

NAMESPACES = ("team-a", "team-b")


def build(period: str = "this-month", namespaces: tuple[str, ...] = NAMESPACES, **kwargs: Any) -> report.Report:
    jobs = kwargs.pop("jobs", data.jobs())
    budgets = kwargs.pop("budgets", [data.budget()])
    return report.build(report.resolve(report.parse_period(period), data.NOW), jobs, budgets, namespaces, data.NOW,
                        **kwargs)  # fmt: skip


def namespace(rep: report.Report, name: str) -> report.NamespaceRow:
    return next(n for n in rep.namespaces if n.namespace == name)


def jobs_of(rep: report.Report) -> dict[str, report.JobRow]:
    return {f"{j.namespace}/{j.job}": j for j in rep.jobs}


# -- the period ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "start", "end"),
    [
        ("this-month", datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)),
        ("last-month", datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)),
        ("2026-02", datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC)),
        ("7d", data.NOW - timedelta(days=7), data.NOW),
        ("2026-11-01..2026-11-15", datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 16, tzinfo=UTC)),
    ],
)
def test_a_period_resolves_to_its_instants(text: str, start: datetime, end: datetime) -> None:
    period = report.resolve(report.parse_period(text), data.NOW)
    assert (period.start, period.end) == (start, end)


def test_last_month_in_january_is_the_previous_december() -> None:
    period = report.resolve(report.parse_period("last-month"), datetime(2027, 1, 10, tzinfo=UTC))
    assert (period.first, period.after) == (date(2026, 12, 1), date(2027, 1, 1))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("2026-13", "no month 13"),
        ("yesterday", "this-month, last-month, YYYY-MM"),
        ("0d", "1d to 3660d"),
        ("2026-11-15..2026-11-01", "TO is before FROM"),
        ("2026-11-01..soon", "YYYY-MM-DD..YYYY-MM-DD"),
        ("0000-01", "outside 1970 to 9998"),
        ("2026-01-01..9999-12-31", "outside 1970 to 9998"),
    ],
)
def test_a_bad_period_says_what_is_accepted(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        report.parse_period(text)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--period", "2026-13"], "argument --period: '2026-13': there is no month 13"),
        (["--team-label", "team"], "argument --team-label: 'team': give KEY=VALUE"),
        (["--team-label", "team=a b"], "is not a label value"),
        (["--queue", "no/slash"], "argument --queue: 'no/slash' is not a queue name"),
        (["-n", "team-a", "-A"], "not allowed with argument"),
        (["-o", "yaml"], "argument -o/--output: invalid choice"),
    ],
)
def test_bad_options_exit_2_naming_the_option(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["usage", *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert says in err
    assert "Traceback" not in err


def test_label_and_queue_parse() -> None:
    assert report.parse_label("example.com/team=vision") == ("example.com/team", "vision")
    assert report.parse_queue("research") == "research"


# -- where the totals come from --------------------------------------------------------------------------


def test_this_month_a_budget_for_the_whole_namespace_gives_its_total_deleted_jobs_included() -> None:
    rep = build()
    a = namespace(rep, "team-a")
    assert (report.hours(a.gpu_seconds), report.money(a.cost)) == ("52.50", "86.50")
    assert a.source == "DGXBudget monthly ledger"
    assert a.budget == "monthly"
    rows = jobs_of(rep)
    assert (report.hours(rows["team-a/llama-b"].gpu_seconds), report.money(rows["team-a/llama-b"].cost)) == (
        "40.00",
        "44.00",
    )
    assert rows["team-a/llama-b"].state == report.DELETED
    assert "team-a/bert-c" not in rows  # its row counted nothing in December and its run ended in November


def test_the_ledger_is_brought_to_now_with_the_live_jobs_usage() -> None:
    """The stored ledger was settled at 08:00 (llama-a at 36000 GPU-seconds, spent 50.00 GPU-hours);
    llama-a's usage reached 45000 by 09:55: the report counts it, as the next settle would."""
    llama = jobs_of(build())["team-a/llama-a"]
    assert (llama.gpu_seconds, report.money(llama.cost), llama.state) == (45000, "42.50", "Running")
    assert llama.savings == 0  # all of its usage is December's: its savings are the period's


def test_without_a_budget_the_total_is_the_live_jobs_and_the_note_says_what_is_missing() -> None:
    rep = build()
    b = namespace(rep, "team-b")
    assert b.source == "live jobs"
    assert b.budget is None
    assert (report.hours(b.gpu_seconds), report.money(b.cost), report.money(b.savings)) == ("48.00", "89.60", "73.60")
    note = next(n for n in rep.notes if n.startswith("team-b:"))
    assert "jobs deleted before now are not in it" in note
    assert "enforcement: Report" in note
    assert "no per-day breakdown" in note


def test_a_budget_on_some_capacities_or_some_jobs_is_not_the_namespace_total() -> None:
    for narrowing in ({"capacities": ["norm"]}, {"jobSelector": {"matchLabels": {"team": "x"}}}):
        budget = data.budget()
        budget["spec"] = {**budget["spec"], **narrowing}
        a = namespace(build(budgets=[budget]), "team-a")
        assert a.source == "live jobs", narrowing
        assert report.hours(a.gpu_seconds) == "12.50"  # llama-a only: llama-b is known to the ledger alone


def test_a_budget_that_never_counted_is_not_taken_for_a_ledger() -> None:
    """A budget without status.period (its controller never wrote it): its ledger would be made up of
    the live jobs here, with none of the deleted ones, so the live jobs' sum is said to be just that."""
    fresh = data.budget()
    del fresh["status"]
    rep = build(budgets=[fresh])
    assert namespace(rep, "team-a").source == "live jobs"
    assert any("DGXBudget team-a/monthly has not counted anything yet" in n for n in rep.notes)


def test_a_closed_month_comes_from_the_budget_history() -> None:
    rep = build("last-month")
    a = namespace(rep, "team-a")
    assert (a.source, report.hours(a.gpu_seconds), report.money(a.cost), a.jobs) == (
        "DGXBudget monthly history",
        "100.00",
        "156.00",
        2,  # the history's count: bert-c and a job deleted since
    )
    assert a.savings is None  # the deleted job's are not kept
    assert list(jobs_of(rep)) == ["team-a/bert-c"]
    assert any("jobs deleted since are in the total, not listed" in n for n in rep.notes)


def test_a_month_the_budget_does_not_know_falls_back_to_the_live_jobs() -> None:
    a = namespace(build("2026-06"), "team-a")
    assert (a.source, a.gpu_seconds, a.jobs) == ("live jobs", 0, 0)


def test_a_live_job_counts_whole_in_every_period_its_run_overlaps() -> None:
    """llama-a ran from 2 December; vit-b ran on 3 December only; vit-c started 5 December."""
    assert sorted(jobs_of(build("2026-12-01..2026-12-02"))) == ["team-a/llama-a"]
    assert sorted(jobs_of(build("2026-12-03..2026-12-03"))) == ["team-a/llama-a", "team-b/vit-b"]
    seven = jobs_of(build("7d"))
    assert sorted(seven) == ["team-a/llama-a", "team-b/vit-b", "team-b/vit-c"]
    assert seven["team-a/llama-a"].gpu_seconds == 45000  # whole, not split by day


def test_the_queue_selects_jobs_by_their_kueue_label() -> None:
    rep = build(namespaces=("team-b",), queue="research")
    assert list(jobs_of(rep)) == ["team-b/vit-b"]
    assert report.money(namespace(rep, "team-b").cost) == "35.20"


def test_a_budget_for_exactly_the_queue_is_that_queue_s_ledger() -> None:
    budget = data.budget()
    budget["spec"] = {**budget["spec"], "jobSelector": {"matchLabels": {data.QUEUE: "prod"}}}
    assert namespace(build(budgets=[budget], queue="prod"), "team-a").source == "DGXBudget monthly ledger"
    assert namespace(build(budgets=[budget]), "team-a").source == "live jobs"  # not the whole namespace


def test_an_unreadable_budget_or_usage_is_named_and_left_out() -> None:
    broken = data.budget()
    broken["spec"] = {**broken["spec"], "period": {"calendar": "Month", "timeZone": "Mars/Olympus"}}
    jobs = data.jobs()
    jobs[0]["status"]["usage"]["gpuSeconds"] = -1
    rep = build(budgets=[broken], jobs=jobs)
    assert any("DGXBudget team-a/monthly cannot be read" in n for n in rep.notes)
    assert any("team-a/llama-a: status.usage cannot be read" in n for n in rep.notes)
    assert namespace(rep, "team-a").source == "live jobs"


# -- formatting --------------------------------------------------------------------------------------------


def test_money_rounds_half_up_to_two_decimals() -> None:
    assert [report.money(Decimal(v)) for v in ("0.005", "0.004999", "42.5", "1e-9")] == ["0.01", "0.00", "42.50",
                                                                                        "0.00"]  # fmt: skip
    assert report.money(None) == "-"
    assert report.hours(45000) == "12.50"


def test_the_table_has_the_totals_then_the_jobs() -> None:
    text = report.render_table(build())
    lines = text.splitlines()
    assert lines[0].startswith("PERIOD 2026-12: 2026-12-01 00:00 to 2027-01-01 00:00 UTC (example prices)")
    assert lines[2].split() == ["NAMESPACE", "GPU-HOURS", "COST", "(USD)", "SPOT", "SAVED", "(USD)", "JOBS", "SOURCE"]
    assert lines[3].split() == ["team-a", "52.50", "86.50", "-", "2", "DGXBudget", "monthly", "ledger"]
    assert lines[4].split() == ["team-b", "48.00", "89.60", "73.60", "2", "live", "jobs"]
    assert lines[5].split() == ["TOTAL", "100.50", "176.10", "-", "4"]
    assert "team-a     llama-b  -             40.00       44.00                 -  deleted (budget ledger)" in text


def test_several_currencies_are_named_in_each_cell() -> None:
    jobs = data.jobs()
    jobs[3]["status"]["usage"]["currency"] = "EUR"
    text = report.render_table(build(namespaces=("team-b",), jobs=jobs))
    assert "54.40 EUR" in text
    assert "35.20 USD" in text
    assert "COST (" not in text


def test_json_and_csv_carry_the_same_numbers() -> None:
    rep = build()
    doc = json.loads(report.render_json(rep))
    assert doc["period"]["label"] == "2026-12"
    assert doc["examplePrices"] is True
    assert [(n["namespace"], n["gpuHours"], n["cost"]) for n in doc["namespaces"]] == [
        ("team-a", "52.50", "86.50"),
        ("team-b", "48.00", "89.60"),
    ]
    assert doc["jobs"][1] == {
        "namespace": "team-a", "job": "llama-b", "capacities": [], "gpuSeconds": 144000, "gpuHours": "40.00",
        "cost": "44.00", "spotSavings": None, "currency": "USD", "state": report.DELETED,
    }  # fmt: skip
    rows = report.render_csv(rep).splitlines()
    assert rows[0].startswith("kind,namespace,job")
    assert "job,team-b,vit-b,spot,32.00,35.20,73.60,USD,Succeeded" in rows


def test_example_prices_and_unpriced_hours_are_said() -> None:
    jobs = data.jobs()
    jobs[2]["status"]["usage"]["unpricedGpuSeconds"] = 3600
    rep = build(jobs=jobs)
    assert any(n.startswith("example prices") for n in rep.notes)
    assert any("team-b/vit-b: some GPU-hours ran on instances without a price" in n for n in rep.notes)
    for j in jobs:
        j["status"]["usage"].pop("examplePrices", None)
    assert not build(jobs=jobs).examples


# -- the kubeconfig ------------------------------------------------------------------------------------------


def kubeconfig(tmp_path: Path, user: dict[str, Any], server: str = "https://127.0.0.1:6443") -> Path:
    path = tmp_path / "config"
    path.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
                "users": [{"name": "u", "user": user}],
                "contexts": [
                    {"name": "one", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}},
                    {"name": "two", "context": {"cluster": "c", "user": "u"}},
                ],
                "current-context": "one",
            }
        ),
        encoding="utf-8",
    )
    return path


def test_the_context_gives_the_namespace_as_kubectl(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path, {"token": "abc"})
    one = kubeclient.load(str(path), None, {})
    assert (one.namespace, one.context, one.headers["Authorization"]) == ("team-a", "one", "Bearer abc")
    assert kubeclient.load(str(path), "two", {}).namespace == "default"
    assert kubeclient.load(None, None, {"KUBECONFIG": str(path)}).namespace == "team-a"


def test_an_exec_plugin_gives_the_token(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "import json, os\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential',"
        " 'status': {'token': 'from-' + os.environ['WHO']}}))\n",
        encoding="utf-8",
    )
    plugin.chmod(plugin.stat().st_mode | stat.S_IEXEC)
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
                     "args": [str(plugin)], "env": [{"name": "WHO", "value": "plugin"}]}}  # fmt: skip
    assert kubeclient.load(str(kubeconfig(tmp_path, user)), None, {}).headers["Authorization"] == "Bearer from-plugin"


@pytest.mark.parametrize(
    ("argv", "user", "says"),
    [
        (["--kubeconfig", "/nonexistent/config"], None, "--kubeconfig /nonexistent/config: no such file"),
        (
            ["--context", "three"],
            {"token": "t"},
            "--context three: no such context in the kubeconfig (it has: one, two)",
        ),
        ([], {"auth-provider": {"name": "gcp"}}, "auth-provider 'gcp', which kubedgx does not run"),
        ([], {"exec": {"command": "/nonexistent/plugin"}}, "the exec plugin /nonexistent/plugin did not run"),
    ],
)
def test_a_kubeconfig_that_cannot_be_used_is_one_line_and_exit_2(
    tmp_path: Path, argv: list[str], user: dict[str, Any] | None, says: str
) -> None:
    given = argv if user is None else ["--kubeconfig", str(kubeconfig(tmp_path, user)), *argv]
    out, err = io.StringIO(), io.StringIO()
    assert main(["usage", *given], out=out, err=err) == 2
    assert says in err.getvalue()
    assert out.getvalue() == ""


def test_a_server_that_does_not_answer_is_named(tmp_path: Path, unused_port: int) -> None:
    path = kubeconfig(tmp_path, {"token": "t"}, server=f"http://127.0.0.1:{unused_port}")
    err = io.StringIO()
    assert main(["usage", "--kubeconfig", str(path)], out=io.StringIO(), err=err) == 2
    assert f"cannot reach the API server at http://127.0.0.1:{unused_port} (context 'one')" in err.getvalue()


@pytest.fixture
def unused_port() -> int:
    """A loopback port nothing listens on (bound, then closed: connecting is refused)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_a_rolling_budget_of_the_report_s_length_gives_the_window_s_total() -> None:
    """A 168h window holding llama-b's 40 deleted spot hours; llama-a has no row yet and is settled
    into it from its creation: 40 + 12.50 GPU-hours. A 30-day report does not match the 7-day window."""
    budget = data.budget()
    budget["spec"] = {**budget["spec"], "period": {"rolling": "168h"}}
    budget["status"] = {
        "currency": "USD",
        "period": {"start": "2026-11-28T09:00:00Z", "end": "2026-12-05T09:00:00Z", "rolling": "168h"},
        "ledger": [
            {"job": "llama-b", "uid": "uid-llama-b", "seenGpuSeconds": 144000, "seenCost": "44",
             "seenUntil": "2026-12-04T12:00:00Z", "gpuSeconds": 144000, "cost": "44"},
        ],
        "buckets": [{"start": "2026-12-04T11:00:00Z", "gpuSeconds": 144000, "cost": "44"}],
    }  # fmt: skip
    a = namespace(build("7d", budgets=[budget]), "team-a")
    assert a.source == "DGXBudget monthly rolling window"
    assert (report.hours(a.gpu_seconds), report.money(a.cost)) == ("52.50", "86.50")
    assert namespace(build("30d", budgets=[budget]), "team-a").source == "live jobs"
