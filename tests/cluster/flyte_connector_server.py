"""``pyflyte serve connector`` with the kubedgx connector, as a Flyte deployment runs it: a process
of its own against the tests' control plane, reached over gRPC (what propeller's connector plugin
calls: AsyncAgentService, AgentMetadataService, grpc.health.v1).

Used by tests/cluster/test_flyte_grpc.py (the test sends what propeller sends) and by the real
propeller's modules (tests/cluster/flyte_propeller.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
from flyteidl.service.agent_pb2_grpc import AgentMetadataServiceStub, AsyncAgentServiceStub
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.cluster.controlplane import CONTEXT, ControlPlane, stop_process_group
from tests.e2e.kubectl import wait_for
from tests.support.ports import free_port

PYFLYTE = shutil.which("pyflyte", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


class Connector:
    """The ``pyflyte serve connector`` process and a channel to it."""

    def __init__(self, process: subprocess.Popen[bytes], log_path: Path, port: int) -> None:
        self.port = port
        self.process = process
        self.log_path = log_path
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.tasks = AsyncAgentServiceStub(self.channel)
        self.metadata = AgentMetadataServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def serving(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"pyflyte serve connector exited {self.process.returncode}:\n{self.tail()}")
        try:
            answer = self.health.Check(
                health_pb2.HealthCheckRequest(service="flyteidl.service.AsyncAgentService"), timeout=2
            )
        except grpc.RpcError:
            return False  # not listening yet
        return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)

    def stop(self) -> None:
        self.channel.close()
        stop_process_group(self.process, timeout=10)


@contextmanager
def serve(
    control_plane: ControlPlane, workdir: Path, *, lifetime: int, env: dict[str, str] | None = None
) -> Iterator[Connector]:
    """Start the server (cwd ``workdir``, its log ``workdir/connector.log``), wait until it is
    SERVING, stop it after. ``env`` adds to (or overrides) the connector's environment; the caller's
    own KUBEDGX_FLYTE_* and KUBECONFIG are not passed on. ``lifetime``: the server's ``--timeout``,
    so it stops by itself if the caller never does."""
    assert PYFLYTE is not None, "the pyflyte console script is not installed next to this interpreter"
    port, prometheus_port = free_port(), free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("KUBEDGX_FLYTE_") and k != "KUBECONFIG"}
    base |= {
        "KUBEDGX_FLYTE_KUBECONFIG": str(control_plane.kubeconfig),
        "KUBEDGX_FLYTE_CONTEXT": CONTEXT,
        "FLYTE_SDK_RICH_TRACEBACKS": "0",
        "PYTHONUNBUFFERED": "1",
    }
    base |= env or {}
    argv = [PYFLYTE, "serve", "connector", "--port", str(port), "--prometheus_port", str(prometheus_port),
            "--modules", "flytekitplugins.dgx", "--timeout", str(lifetime)]  # fmt: skip
    log_path = workdir / "connector.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=base,
                                   cwd=workdir, start_new_session=True)  # fmt: skip
    server = Connector(process, log_path, port)
    try:
        wait_for("pyflyte serve connector to report SERVING", server.serving, timeout=90, interval=0.3,
                 diagnose=server.tail)  # fmt: skip
        yield server
    finally:
        server.stop()
