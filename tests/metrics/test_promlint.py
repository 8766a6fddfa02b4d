"""Prometheus' own naming conventions, checked by Prometheus' own linter: client_golang's promlint
(what `promtool check metrics` runs), built from the Go module in tests/metrics/promlint/ and fed the
operator's /metrics as a scrape gets it, every metric of ours observed at least once.

The binary is built once into a cache outside the work tree (``$KUBEDGX_PROMLINT_CACHE``, by default
``~/.cache/kubedgx/promlint/<key>/promlint``), keyed by the module's go.mod, go.sum and main.go and the
Go version, so a change to any of them builds afresh. Without a Go toolchain the tests skip, saying so;
a build that fails is a failure.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import aiohttp
import pytest

from dgx_operator.metrics import serve
from tests.unit.metrics_helpers import populated

MODULE = Path(__file__).resolve().parent / "promlint"
#: The first build compiles client_golang and its dependencies (about two minutes on two cores).
BUILD_TIMEOUT = 280


def cache_root() -> Path:
    configured = os.environ.get("KUBEDGX_PROMLINT_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "kubedgx" / "promlint"


def go_env() -> dict[str, str]:
    """Reproducible: the committed go.sum pins every module, nothing is edited, no other toolchain."""
    return {
        **os.environ,
        "GOTOOLCHAIN": "local",
        "GOWORK": "off",
        "CGO_ENABLED": "0",
        "GOFLAGS": "-buildvcs=false -mod=readonly",
    }


@pytest.fixture(scope="session")
def promlint() -> Path:
    go = shutil.which("go")
    if go is None:
        pytest.skip("no Go toolchain on PATH: promlint (client_golang's metric linter) cannot be built")
    version = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True, env=go_env())
    digest = hashlib.sha256(version.stdout.encode())
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((MODULE / name).read_bytes())
    binary = cache_root() / digest.hexdigest()[:16] / "promlint"
    if binary.exists():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    # Built beside its final name and renamed: a concurrent run never executes half a binary.
    with tempfile.TemporaryDirectory(dir=binary.parent) as scratch:
        built = Path(scratch) / "promlint"
        result = subprocess.run(
            [go, "build", "-o", str(built), "."],
            cwd=MODULE,
            env=go_env(),
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
        )
        assert result.returncode == 0, f"go build of {MODULE} failed:\n{result.stdout}{result.stderr}"
        built.replace(binary)
    return binary


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
