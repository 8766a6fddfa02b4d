"""A stand-in kubelet for the Flyte tests: it runs pods' commands as local processes.

kwok runs no containers. :class:`Kubelet` executes each Running pod it is given (kubedgx's worker
pods, and with ``propeller=True`` the pods Flyte's propeller makes for plain ``@task``s) with the
pod's environment as a local process (a folder of the test's as the image's working directory), then
reports its exit code through the pod's status (the kwok stage of tests/cluster/stages matches the
exit-code label). What the stand-in changes, and why: the rendezvous address (the pod's DNS name is
the headless Service's, which this machine cannot resolve) and PET_NPROC_PER_NODE (2 CPU processes
instead of the node's 8 GPUs, so torch elastic's multi-process path and rank 0's outputs run).

Pods are keyed by uid, not name: a replacement pod of the same name (a restart, a Flyte retry) runs
too. A command that outlives its time-out is killed and reported as exit 124, the thread goes on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.cluster.controlplane import EXIT_CODE_LABEL, MESSAGE_ANNOTATION
from tests.e2e.kubectl import Kubectl, dig
from tests.support.ports import free_port

#: Seconds one pod's command may run.
RUN_TIMEOUT = 300
BIN = str(Path(sys.executable).parent)
#: kubedgx's worker pods.
WORKER_SELECTOR = {"app.kubernetes.io/managed-by": "kubedgx"}


class Kubelet:
    """Runs the namespace's Running pods as local processes and reports how they ended.

    ``ran`` maps each pod's name to its last exit code, ``runs`` lists (name, uid, exit code) in
    the order they ended; ``hold`` picks pods left Running and never executed, as a worker that never
    exits."""

    def __init__(
        self,
        k: Kubectl,
        workdir: Path,
        logs: Path,
        *,
        propeller: bool = False,
        env: dict[str, str] | None = None,
        hold: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        self.k, self.workdir, self.logs = k, workdir, logs
        self.propeller, self.extra_env, self.hold = propeller, dict(env or {}), hold
        self.ran: dict[str, int] = {}
        self.runs: list[tuple[str, str, int]] = []
        self.errors: list[BaseException] = []
        self._seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)

    def __enter__(self) -> Kubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _pods(self) -> list[dict[str, Any]]:
        def ours(pod: dict[str, Any]) -> bool:
            labels = pod["metadata"].get("labels") or {}
            if all(labels.get(k) == v for k, v in WORKER_SELECTOR.items()):
                return True
            return self.propeller and "execution-id" in labels  # propeller's own pods carry the execution's labels

        return [p for p in self.k.select("pods") if ours(p)]

    def _loop(self) -> None:
        while not self._stop.wait(0.5):  # the pace of the polling, not a synchronisation
            try:
                for pod in self._pods():
                    name, uid = pod["metadata"]["name"], pod["metadata"].get("uid", "")
                    if uid in self._seen or dig(pod, "status", "phase") != "Running":
                        continue
                    if self.hold is not None and self.hold(pod):
                        continue
                    self._seen.add(uid)
                    rc = self.run(pod)
                    self.ran[name] = rc
                    self.runs.append((name, uid, rc))
            except Exception as exc:  # surfaced by the test; the loop goes on
                self.errors.append(exc)

    def run(self, pod: dict[str, Any]) -> int:
        containers = pod["spec"]["containers"]
        (container,) = [c for c in containers if c["name"] == "trainer"] or containers[:1]
        env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        env |= {
            "PET_RDZV_ENDPOINT": f"127.0.0.1:{free_port()}",
            "MASTER_ADDR": "127.0.0.1",
            "PET_NPROC_PER_NODE": "2",
            "PATH": os.pathsep.join([BIN, os.environ.get("PATH", "")]),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(self.workdir), os.environ.get("PYTHONPATH", "")])),
            "FLYTE_SDK_RICH_TRACEBACKS": "0",
            "HOME": os.environ.get("HOME", "/root"),
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        env |= self.extra_env
        command = [*container.get("command", []), *container.get("args", [])]
        name = pod["metadata"]["name"]
        log = self.logs / f"{name}-{pod['metadata'].get('uid', '')[:8]}.log"
        with log.open("w") as out:
            try:
                rc = subprocess.run(command, env=env, cwd=self.workdir, stdout=out, stderr=subprocess.STDOUT,
                                    timeout=RUN_TIMEOUT, check=False).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                out.write(f"\nkubelet stand-in: killed after {RUN_TIMEOUT}s\n")
                rc = 124
        if rc:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
            self.k.run("annotate", "pod", name, f"{MESSAGE_ANNOTATION}={tail[0][:900]}", "--overwrite")
        self.k.run("label", "pod", name, f"{EXIT_CODE_LABEL}={rc}", "--overwrite")
        return rc

    def logs_text(self, limit: int = 3000) -> str:
        """Every pod's log, the tail of each, for a failing assertion's message."""
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-limit:]}" for p in sorted(self.logs.glob("*.log"))
        )
