"""``python -m tests.cluster up --real-nodes N``: the control plane with N real nodes running the
product, for people and other checks. It builds (or reuses) the images, streams them into the
nodes, installs the chart's objects and starts the operator as the chart's ServiceAccount
(tests/nodes/fixtures.py's ``trainer_cluster``, what the real-node tests use), prints
``KUBECONFIG=``, ``TRAINER_IMAGE=`` and ``OPERATOR_IMAGE=`` lines once all of it is ready, and stays
up until SIGTERM or Ctrl-C; then everything it started is stopped and undone."""

from __future__ import annotations

import contextlib
import signal
import sys
import tempfile
import threading
from pathlib import Path

from tests.nodes.fixtures import NodesBrokenError, NodesUnavailableError, trainer_cluster


def up_real_nodes(count: int, directory: Path | None) -> int:
    """0 after a clean stop; 2 where this machine cannot run real nodes; 1 where they failed."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with tempfile.TemporaryDirectory(prefix="kubedgx-nodes-", dir="/tmp") as tmp:
        root = directory or Path(tmp)
        try:
            with trainer_cluster(root, count=count) as found:
                plane = found.nodes.plane
                assert plane is not None
                print(f"real nodes up: {found.nodes.timings}; logs in {found.nodes.logs}", flush=True)
                print(f"KUBECONFIG={plane.kubeconfig}", flush=True)
                print(f"TRAINER_IMAGE={found.images.trainer}", flush=True)
                print(f"OPERATOR_IMAGE={found.images.operator}", flush=True)
                print(f"PATH={Path(plane.kubectl_binary).parent}:$PATH", flush=True)
                with contextlib.suppress(KeyboardInterrupt):
                    stop.wait()
        except NodesUnavailableError as exc:
            print(f"tests.cluster: real nodes cannot run here: {exc}", file=sys.stderr)
            return 2
        except (NodesBrokenError, AssertionError) as exc:
            print(f"tests.cluster: {exc}", file=sys.stderr)
            return 1
    return 0
