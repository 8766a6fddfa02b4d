"""The cluster suite's control plane, by hand.

python -m tests.cluster build     # build (or reuse) the binaries; print the bin dir
python -m tests.cluster up        # start a control plane with fake DGX nodes and wait;
                                  # prints the KUBECONFIG to export; Ctrl-C stops it
python -m tests.cluster up --dir /tmp/kubedgx-cluster   # keep its files (logs, certs) there
python -m tests.cluster up --real-nodes 2   # no fake nodes: two real ones (kubelet + containerd,
                                            # tests/nodes), CoreDNS, GPU labels, the trainer and
                                            # operator images built and loaded, the operator
                                            # running; prints KUBECONFIG=, TRAINER_IMAGE=,
                                            # OPERATOR_IMAGE= lines; as root
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path

from tests.cluster.controlplane import CONTEXT, ControlPlane, StartError, UnavailableError, build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build or reuse the control-plane binaries")
    up = sub.add_parser("up", help="start a control plane and wait until interrupted")
    up.add_argument("--dir", type=Path, help="where its files go (default: a temporary directory, removed after)")
    up.add_argument(
        "--real-nodes",
        type=int,
        default=0,
        metavar="N",
        help="real nodes (kubelet + containerd) instead of the fake DGX nodes (tests/nodes)",
    )
    args = parser.parse_args(argv)
    if args.command == "up" and args.real_nodes:
        from tests.nodes.up import up_real_nodes

        return up_real_nodes(args.real_nodes, args.dir)
    try:
        binaries = build(out=sys.stderr)
    except (UnavailableError, StartError) as exc:
        print(f"tests.cluster: {exc}", file=sys.stderr)
        return 2
    if args.command == "build":
        print(binaries.dir)
        return 0
    with tempfile.TemporaryDirectory(prefix="kubedgx-cluster-") as tmp:
        root = args.dir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        plane = ControlPlane(root, binaries)
        try:
            plane.start()
        except StartError as exc:
            print(f"tests.cluster: {exc}", file=sys.stderr)
            return 1
        print(f"control plane up in {plane.started_in:.1f}s (Kubernetes {binaries.kubernetes_version}); logs in "
              f"{plane.logs_dir}\n\n  export KUBECONFIG={plane.kubeconfig} PATH={binaries.dir}:$PATH\n"
              f"  kubectl --context {CONTEXT} get nodes\n\nCtrl-C stops it.", flush=True)  # fmt: skip
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
        finally:
            plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
