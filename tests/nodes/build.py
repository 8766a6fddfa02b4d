"""What the real nodes run, built or reused: the kubelet and CoreDNS (tests/cluster/build.sh, cached
by version) and the small images (tests/nodes/images.py, cached by content)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.cluster.controlplane import StartError
from tests.nodes import images

CLUSTER = Path(__file__).resolve().parent.parent / "cluster"


def node_binaries() -> Path:
    """``tests/cluster/build.sh kubelet coredns``: their bin dir."""
    proc = subprocess.run(
        ["bash", str(CLUSTER / "build.sh"), "kubelet", "coredns"], capture_output=True, text=True, check=False
    )
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        raise StartError(f"build.sh kubelet coredns exited {proc.returncode}:\n{proc.stdout[-2000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def kubernetes_module() -> Path:
    """Where Go's module cache holds k8s.io/kubernetes (pause.c comes from there)."""
    env = {**os.environ, "GOFLAGS": "-mod=readonly", "GOWORK": "off", "GOTOOLCHAIN": "local"}
    proc = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes"],
        cwd=CLUSTER / "gomod" / "kubelet",
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if proc.returncode != 0:
        raise StartError(f"go list -m k8s.io/kubernetes: {proc.stderr.strip()}")
    return Path(proc.stdout.strip())


def small_images(workdir: Path) -> list[images.Archive]:
    """The pause and busybox images' archives."""
    return [images.pause_image(kubernetes_module(), workdir), images.busybox_image()]
