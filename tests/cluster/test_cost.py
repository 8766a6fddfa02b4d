"""Cost control on the real control plane (issue 31): a job's usage against what its pods say, across
an operator that is killed mid-run and started again, as the chart's ServiceAccount, the workers
placed by the real scheduler (whose binding stamps PodScheduled) and ended by kwok (which stamps
finishedAt).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest

from dgx_operator.catalog import Catalog
from tests.chart.conftest import Rendered
from tests.cluster.controlplane import EXIT_CODE_LABEL, ControlPlane
from tests.cluster.operator import Operator, service_account, start_operator, token_kubeconfig
from tests.e2e.jobs import INSTANCE, command_job, phase_is, running_with, wait_job, worker_pods
from tests.e2e.kubectl import Kubectl, dig, wait_for

TIMEOUT = 90
CATALOG = Catalog.load()


class Restartable:
    """The module's operator, as the chart runs it, which a test may kill (SIGKILL: no shutdown
    handlers, as when its node dies) and start again."""

    def __init__(self, objects: list[Rendered], kubeconfig: Path, workdir: Path) -> None:
        self.objects, self.kubeconfig, self.workdir = objects, kubeconfig, workdir
        self.op: Operator | None = None

    def start(self) -> Restartable:
        self.op = start_operator(self.objects, self.kubeconfig, self.workdir)
        return self

    def kill(self) -> None:
        assert self.op is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.op.process.pid, signal.SIGKILL)
        self.op.process.wait(10)

    def stop(self) -> None:
        if self.op is not None:
            self.op.stop()

    def forbidden(self) -> list[str]:
        return self.op.forbidden() if self.op is not None else []

    def tail(self) -> str:
        return self.op.tail(80) if self.op is not None else ""

    def lines(self, *needles: str) -> str:
        """The operator's log lines that name any of ``needles`` (a namespace, a job), for a diagnosis."""
        text = self.op.tail(100_000) if self.op is not None else ""
        return "\n".join(line for line in text.splitlines() if any(n in line for n in needles))


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane, kubectl: Kubectl, chart: list[Rendered], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Restartable]:
    workdir = tmp_path_factory.mktemp("operator")
    kubeconfig = token_kubeconfig(control_plane, kubectl, workdir / "operator.kubeconfig", service_account(chart))
    owner = __name__
    running = control_plane.slot.take(owner, lambda: Restartable(chart, kubeconfig, workdir).start())
    try:
        yield running
        assert running.forbidden() == [], "the chart's RBAC refused the operator"
    finally:
        control_plane.slot.release(owner)


def stamp(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def scheduled_at(pod: dict[str, Any]) -> str:
    """When the scheduler bound ``pod`` (its PodScheduled condition's transition)."""
    return str(next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")["lastTransitionTime"])


def used_by_pods(pods: list[dict[str, Any]]) -> int:
    """GPU-seconds from what the pods themselves say: each one's GPUs times the span from its
    binding (PodScheduled True) to its last container's end."""
    total = 0
    for pod in pods:
        scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
        ends = [dig(c, "state", "terminated", "finishedAt") for c in pod["status"]["containerStatuses"]]
        gpus = int(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        total += gpus * int((max(stamp(e) for e in ends) - stamp(scheduled["lastTransitionTime"])).total_seconds())
    return total


def usage_of(k: Kubectl, job: str) -> dict[str, Any]:
    found: dict[str, Any] = dig(k.get("dgxjob", job), "status", "usage", default={}) or {}
    return found


def test_usage_equals_the_pods_spans_across_an_operator_killed_mid_run(
    operator: Restartable, namespace: Kubectl
) -> None:
    namespace.apply(command_job("usage", min_nodes=2, max_nodes=2))
    wait_job(namespace, "usage", "2/2 workers Running", running_with(2), timeout=TIMEOUT)
    # The Running transition carries the usage so far.
    first = wait_for("the usage written with Running", lambda: usage_of(namespace, "usage").get("accountedUntil"),
                     timeout=TIMEOUT)  # fmt: skip
    operator.kill()  # the workers run on while no operator counts, until the new one has started
    operator.start()
    # A fresh process does not know when the status was last written: its first pass writes.
    wait_for(
        "the restarted operator to carry the usage on",
        lambda: (usage_of(namespace, "usage").get("accountedUntil") or "") > first,
        timeout=TIMEOUT,
    )
    # Worker 1 first (worker 0's success ends the job, and its other workers are deleted then).
    namespace.run("label", "pod", "usage-worker-1", f"{EXIT_CODE_LABEL}=0", "--overwrite")
    wait_for(
        "worker 1 to finish its share",
        lambda: dig(namespace.get("pod", "usage-worker-1"), "status", "phase") == "Succeeded",
        timeout=TIMEOUT,
    )
    namespace.run("label", "pod", "usage-worker-0", f"{EXIT_CODE_LABEL}=0", "--overwrite")
    wait_job(namespace, "usage", "Succeeded", phase_is("Succeeded"), timeout=TIMEOUT)
    usage = wait_for(
        "the final usage (no worker on a node)",
        lambda: (u := usage_of(namespace, "usage")) and u.get("running") in (None, []) and u,
        timeout=TIMEOUT,
        diagnose=lambda: (
            f"usage {usage_of(namespace, 'usage')}; pods {[p.get('status') for p in worker_pods(namespace, 'usage')]}"
        ),
    )
    pods = worker_pods(namespace, "usage")
    assert len(pods) == 2
    expected = used_by_pods(pods)
    assert usage["gpuSeconds"] == expected, f"pods say {expected} GPU-seconds, the status {usage}"
    price = CATALOG.get(INSTANCE).price_per_gpu_hour
    assert price is not None
    cost = (Decimal(expected) * price / 3600).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    assert usage["cost"] == str(cost)
    assert usage["currency"] == "USD"
    hours = (Decimal(expected) / 3600).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    event = wait_for(
        "the job's Usage event",
        lambda: [e for e in namespace.select("events") if e.get("reason") == "Usage"],
        timeout=TIMEOUT,
    )
    assert f"used {hours} GPU-hours on norm, {cost} USD" in event[0]["message"]
    columns = namespace.run("get", "dgxjob", "usage", "--no-headers").stdout.split()
    assert str(hours) in columns
    assert str(cost) in columns


def test_kubectl_get_shows_gpu_hours_and_cost_columns(operator: Restartable, namespace: Kubectl) -> None:
    namespace.apply(command_job("columns"))
    wait_job(namespace, "columns", "Running", running_with(1), timeout=TIMEOUT)
    header, row = namespace.run("get", "dgxjob", "columns").stdout.splitlines()[:2]
    names = header.split()
    assert names[:8] == ["NAME", "PHASE", "INSTANCE", "NODES", "RESTARTS", "REASON", "GPU-HOURS", "COST"]
    usage = usage_of(namespace, "columns")
    assert row.split()[6:8] == [usage["gpuHours"], usage["cost"]]


def dgx_budget(name: str, cost: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubedgx.io/v1alpha1",
        "kind": "DGXBudget",
        "metadata": {"name": name},
        "spec": {"limits": {"cost": cost}, "period": {"calendar": "Month"}, **spec},
    }


def suspended_reason(k: Kubectl, job: str) -> tuple[str, str] | None:
    found = k.get("dgxjob", job)
    cond = next((c for c in dig(found, "status", "conditions", default=[]) or [] if c["type"] == "Suspended"), None)
    return None if cond is None else (cond["reason"], cond.get("message", ""))


def test_a_second_job_waits_for_the_budget_and_starts_when_it_is_raised(
    operator: Restartable, namespace: Kubectl
) -> None:
    """One run's worst case (8 GPUs x 3.00 USD/GPU-h x 30m = 12.00 USD) fits a 20 USD budget; a
    second one's does not while the first runs (its committed 12.00 + 12.00 > 20)."""
    namespace.apply(dgx_budget("team", "20"))
    namespace.apply(command_job("first"))
    wait_job(namespace, "first", "Running", running_with(1), timeout=TIMEOUT)
    namespace.apply(command_job("second"))
    held = wait_for(
        "the second job held by the budget",
        lambda: (s := suspended_reason(namespace, "second")) and s[0] == "BudgetExceeded" and s,
        timeout=TIMEOUT,
    )
    assert f"DGXBudget {namespace.namespace}/team" in held[1]
    assert "of 20.00 USD" in held[1]
    assert worker_pods(namespace, "second") == []
    budget = wait_for(
        "the budget's numbers",
        lambda: dig(namespace.get("dgxbudget", "team"), "status", "committed", "cost"),
        timeout=TIMEOUT,
    )
    assert Decimal(budget) > 0
    namespace.run("patch", "dgxbudget", "team", "--type", "merge", "-p", '{"spec": {"limits": {"cost": "40"}}}')
    wait_job(namespace, "second", "Running once the budget was raised", running_with(1), timeout=TIMEOUT)


def test_a_finished_job_deleted_by_its_ttl_is_still_counted(operator: Restartable, namespace: Kubectl) -> None:
    namespace.apply(dgx_budget("ledger", "1000", enforcement="Report"))
    job = command_job("brief")
    job["spec"]["ttlSecondsAfterFinished"] = 20
    namespace.apply(job)
    wait_job(namespace, "brief", "Running", running_with(1), timeout=TIMEOUT)
    uid = namespace.get("dgxjob", "brief")["metadata"]["uid"]
    # Usage is whole seconds from binding to the end: a worker told to exit in the second it was
    # bound used nothing, and a job that used nothing has no row to keep (what made this test fail
    # in some orders, where the label came within a second of the binding). So it holds its node
    # for two whole seconds on the clock the apiserver shares with this machine first.
    bound = stamp(scheduled_at(namespace.get("pod", "brief-worker-0")))
    wait_for(
        "the worker to hold its node for two whole seconds",
        lambda: datetime.now(UTC).replace(microsecond=0) >= bound + timedelta(seconds=2),
        timeout=TIMEOUT,
    )
    namespace.run("label", "pod", "brief-worker-0", f"{EXIT_CODE_LABEL}=0", "--overwrite")
    final = wait_for(
        "the job's final usage",
        lambda: (
            (j := namespace.get("dgxjob", "brief"))
            and dig(j, "status", "phase") == "Succeeded"
            and (u := dig(j, "status", "usage", default={}) or {})
            and u.get("running") in (None, [])
            and u
        ),
        timeout=TIMEOUT,
    )
    wait_for("the job deleted by its TTL", lambda: namespace.get("dgxjob", "brief") is None, timeout=TIMEOUT)

    def ledger_row() -> dict[str, Any] | None:
        rows = dig(namespace.get("dgxbudget", "ledger"), "status", "ledger", default=[]) or []
        return next((r for r in rows if r["uid"] == uid), None)

    row = wait_for(
        "the job's row in the ledger",
        ledger_row,
        timeout=TIMEOUT,
        diagnose=lambda: (
            f"budget {namespace.get('dgxbudget', 'ledger')}; the operator's log of the namespace:\n"
            f"{operator.lines(namespace.namespace)}"
        ),
    )
    assert row["gpuSeconds"] == final["gpuSeconds"] > 0
    spent = dig(namespace.get("dgxbudget", "ledger"), "status", "spent", "cost")
    assert Decimal(spent) == Decimal(final["cost"])


def test_a_budget_in_a_time_zone_the_operator_lacks_is_not_ready_and_says_why(
    operator: Restartable, namespace: Kubectl
) -> None:
    """The CRD checks a zone's shape only; the operator's zone database decides, and the budget's
    Ready condition (and READY column) carries its answer, field and fix."""
    namespace.apply(dgx_budget("zone", "1", period={"calendar": "Month", "timeZone": "Mars/Olympus"}))
    ready = wait_for(
        "the budget's Ready condition",
        lambda: next(
            (c for c in dig(namespace.get("dgxbudget", "zone"), "status", "conditions", default=[]) or []
             if c["type"] == "Ready"),
            None,
        ),
        timeout=TIMEOUT,
    )  # fmt: skip
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.period.timeZone" in ready["message"]
    header, row = namespace.run("get", "dgxbudget", "zone").stdout.splitlines()[:2]
    assert row[header.index("READY") :].split()[0] == "False", f"{header}\n{row}"
