"""What the real-node layer needs from the machine, and the reason it skips where that is missing.

The kubelets and containerds run as root on this machine (no Docker, no systemd), with cgroup v1
hierarchies (kubelet v1.34 is the last release that runs on v1 by default). Their packages come from
Debian (``apt-get install`` of :data:`APT_PACKAGES`, as ``.ci/run`` does); the kubelet and CoreDNS are
built from Go modules by ``tests/cluster/build.sh kubelet coredns``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

#: Debian packages the layer runs: containerd and runc (the runtime), the CNI plugins (bridge,
#: host-local, loopback), busybox-static (the busybox image), iproute2 and util-linux (the bridge,
#: unshare, mount, findmnt); buildah and debootstrap build the product's images (buildah.py).
APT_PACKAGES = (
    "containerd",
    "runc",
    "containernetworking-plugins",
    "busybox-static",
    "iproute2",
    "util-linux",
    "buildah",
    "debootstrap",
)
CNI_DIR = Path("/usr/lib/cni")
CGROUP_V1 = Path("/sys/fs/cgroup")
#: The v1 hierarchies a kubelet with the cgroupfs driver needs.
HIERARCHIES = ("cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer", "blkio")


def missing() -> list[str]:
    """Each thing the layer needs that this machine does not have, as the reason to skip."""
    problems: list[str] = []
    if os.geteuid() != 0:
        problems.append("not root (kubelets and containerd need it)")
    absent = [h for h in HIERARCHIES if not (CGROUP_V1 / h / "tasks").exists()]
    if absent:
        problems.append(f"no cgroup v1 hierarchy for {', '.join(absent)} under {CGROUP_V1}")
    for tool in ("containerd", "ctr", "runc", "ip", "unshare", "mount", "umount", "gcc", "go"):
        if shutil.which(tool) is None:
            problems.append(f"no {tool} on PATH")
    for plugin in ("bridge", "host-local", "loopback"):
        if not (CNI_DIR / plugin).exists():
            problems.append(f"no CNI plugin {CNI_DIR / plugin}")
    if problems and any("PATH" in p or "CNI" in p for p in problems):
        problems.append(f"(apt-get install --no-install-recommends {' '.join(APT_PACKAGES)})")
    return problems
