"""``python -m tests.cluster up --real-nodes 2``, as a person runs it: the lines it promises once
everything is ready, a cluster that answers with both real nodes Ready and the operator's CRDs,
and after SIGTERM a clean exit with nothing of it left on the machine (its own check, printed)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from tests.nodes.fixtures import problems
from tests.support.timeouts import timeout_paused

ROOT = Path(__file__).resolve().parents[2]
PROMISED = ("KUBECONFIG", "TRAINER_IMAGE", "OPERATOR_IMAGE", "PATH")

pytestmark = [pytest.mark.timeout(600)]


def test_up_prints_what_it_promises_and_stops_clean_on_sigterm(tmp_path: Path) -> None:
    missing = problems(product_images=True)
    if missing:
        pytest.skip("real nodes: " + "; ".join(missing))
    root = Path(f"/tmp/kdgx-up-{os.getpid()}")  # short: the kubelet's socket paths
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.cluster", "up", "--real-nodes", "2", "--dir", str(root)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("PATH="):
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        with timeout_paused():  # the images may still be building (CI builds them in the background)
            assert ready.wait(timeout=3600), "\n".join(lines[-50:])
        printed = dict(line.split("=", 1) for line in lines if re.match(r"^[A-Z_]+=", line))
        assert set(PROMISED) <= set(printed), "\n".join(lines[-50:])
        assert re.fullmatch(r"localhost/kubedgx/trainer:c-[0-9a-f]{16}", printed["TRAINER_IMAGE"]), printed
        assert re.fullmatch(r"localhost/kubedgx/operator:c-[0-9a-f]{16}", printed["OPERATOR_IMAGE"]), printed
        kubeconfig = printed["KUBECONFIG"]
        kubectl = str(Path(printed["PATH"].split(":", 1)[0]) / "kubectl")
        nodes = yaml.safe_load(
            subprocess.run(
                [kubectl, "--kubeconfig", kubeconfig, "get", "nodes", "-o", "yaml"],
                capture_output=True, text=True, check=True, timeout=60,
            ).stdout
        )  # fmt: skip
        ready_nodes = [
            n["metadata"]["name"]
            for n in nodes["items"]
            if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
        ]
        assert sorted(ready_nodes) == ["kubedgx-n1", "kubedgx-n2"], nodes
        crds = subprocess.run(
            [kubectl, "--kubeconfig", kubeconfig, "get", "crd", "-o", "name"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip
        assert "dgxtrainingjobs.kubedgx.io" in crds, crds
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            rc = proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    output = "\n".join(lines)
    assert rc == 0, output[-3000:]
    assert "left on the machine" not in output, output[-3000:]
    assert _mounted_under(root) == [], output[-3000:]
    shutil.rmtree(root, ignore_errors=True)


def _mounted_under(root: Path) -> list[str]:
    return [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4].startswith(str(root))
    ]
