"""``python -m tests.cluster up --real-nodes N``: the control plane with N real nodes for people and
other checks, up until SIGTERM or Ctrl-C, then everything it started stopped and undone."""

from __future__ import annotations

import signal
import sys
import tempfile
import threading
from pathlib import Path

from tests.cluster.controlplane import Binaries, StartError, UnavailableError
from tests.nodes import host, images
from tests.nodes.build import node_binaries, small_images
from tests.nodes.cluster import RealNodes, interrupt_safe_stop


def up_real_nodes(binaries: Binaries, count: int, directory: Path | None) -> int:
    problems = host.missing() + images.have_tools()
    if problems:
        print("tests.cluster: real nodes cannot run here: " + "; ".join(problems), file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="kubedgx-nodes-") as tmp:
        root = directory or Path(tmp)
        try:
            nodes = RealNodes(root, binaries, node_binaries(), small_images(root / "images"), count=count)
        except (StartError, UnavailableError) as exc:
            print(f"tests.cluster: {exc}", file=sys.stderr)
            return 2
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            nodes.start()
            assert nodes.plane is not None
            print(f"real nodes up: {nodes.timings}; logs in {nodes.logs}", flush=True)
            print(f"KUBECONFIG={nodes.plane.kubeconfig}", flush=True)
            print(f"PATH={binaries.dir}:$PATH", flush=True)
            stop.wait()
        except StartError as exc:
            print(f"tests.cluster: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            pass
        finally:
            interrupt_safe_stop(nodes)
            left = nodes.leftovers()
            if left:
                print(f"tests.cluster: left on the machine: {left}", file=sys.stderr)
    return 0
