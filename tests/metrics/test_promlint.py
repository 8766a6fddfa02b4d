"""Prometheus' own naming conventions, checked by Prometheus' own linter: client_golang's promlint
(what `promtool check metrics` runs), built from the Go module in tests/metrics/promlint/ and fed the
operator's /metrics as a scrape gets it, every metric of ours observed at least once.

The binary is built once into a cache outside the work tree (tests/metrics/build_promlint.py, which
.ci/run runs ahead in the background). Without a Go toolchain the tests skip, saying so; a build that
fails is a failure.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import aiohttp
import pytest

from dgx_operator.controllers.metrics import serve
from tests.metrics import build_promlint
from tests.support.timeouts import timeout_paused
from tests.unit.metrics_helpers import populated


@pytest.fixture(scope="session")
def promlint() -> Path:
    go = build_promlint.go()
    if go is None:
        pytest.skip("no Go toolchain on PATH: promlint (client_golang's metric linter) cannot be built")
    try:
        with timeout_paused():  # a cold build (or waiting for .ci/run's) belongs to no test
            return build_promlint.build(go)
    except build_promlint.BuildError as exc:
        pytest.fail(str(exc), pytrace=False)


def lint(promlint: Path, exposition: bytes) -> tuple[int, list[str]]:
    """promlint's exit status and problems ("metric: text")."""
    result = subprocess.run([str(promlint)], input=exposition, capture_output=True, timeout=60)
    assert result.returncode in (0, 1), result.stderr.decode()
    return result.returncode, result.stdout.decode().splitlines()


@pytest.mark.asyncio
async def test_promlint_finds_nothing_in_what_the_operator_serves(promlint: Path) -> None:
    metrics = populated()
    runner = await serve(metrics, 0, "127.0.0.1")
    try:
        port = runner.addresses[0][1]
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as response:
            assert response.status == 200
            exposition = await response.read()
    finally:
        await runner.cleanup()
    assert b"kubedgx_jobs_finished_total" in exposition
    assert b"kubedgx_job_time_to_running_seconds_bucket" in exposition
    assert b"process_cpu_seconds_total" in exposition
    assert lint(promlint, exposition) == (0, [])


def test_promlint_finds_what_breaks_the_conventions(promlint: Path) -> None:
    bad = (
        b"# HELP kubedgx_restarts Restarts.\n# TYPE kubedgx_restarts counter\nkubedgx_restarts 1\n"
        b"# HELP kubedgx_jobs_total Jobs.\n# TYPE kubedgx_jobs_total gauge\nkubedgx_jobs_total 1\n"
        b"# HELP kubedgx_sync_milliseconds Sync time.\n# TYPE kubedgx_sync_milliseconds gauge\n"
        b"kubedgx_sync_milliseconds 1\n"
    )
    status, problems = lint(promlint, bad)
    assert status == 1
    assert {p.split(":")[0] for p in problems} == {
        "kubedgx_restarts",
        "kubedgx_jobs_total",
        "kubedgx_sync_milliseconds",
    }, problems
