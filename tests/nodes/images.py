"""The real nodes' small images, made here: the pause container (the sandbox every pod starts in) and
busybox (the behaviour tests' workload), each a docker-archive cached by what it is made of.

- pause: Kubernetes' own ``build/pause/linux/pause.c`` from the k8s.io/kubernetes module the control
  plane is built from, compiled ``gcc -Os -static`` as its Makefile does, run as user 65535.
- busybox: Debian's ``busybox-static`` (``/bin/busybox``), one symlink per applet, a passwd and group
  with root and nobody.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.nodes.archive import Entry, Image, write_docker_archive

PAUSE = "localhost/kubedgx/pause:3.10"
BUSYBOX = "localhost/kubedgx/busybox:1.35"
#: Bump when what goes into an image changes without its inputs changing.
RECIPE = "1"
BUSYBOX_BINARY = Path("/bin/busybox")


@dataclass(frozen=True)
class Archive:
    ref: str
    path: Path


def cache_dir() -> Path:
    base = Path(os.environ.get("KUBEDGX_NODES_CACHE") or Path.home() / ".cache" / "kubedgx" / "nodes")
    return base / "images"


def _cached(name: str, inputs: Sequence[bytes], image: Image) -> Archive:
    digest = hashlib.sha256(RECIPE.encode())
    for part in inputs:
        digest.update(hashlib.sha256(part).digest())
    path = cache_dir() / f"{name}-{digest.hexdigest()[:16]}.tar"
    if not path.exists():
        write_docker_archive(image, path)
    return Archive(image.ref, path)


def pause_source(kubernetes_module: Path) -> Path:
    """pause.c in the k8s.io/kubernetes module's directory (``go list -m -f {{.Dir}}``)."""
    source = kubernetes_module / "build" / "pause" / "linux" / "pause.c"
    if not source.is_file():
        raise FileNotFoundError(f"no {source}: is the k8s.io/kubernetes module in Go's module cache?")
    return source


def pause_image(kubernetes_module: Path, workdir: Path) -> Archive:
    source = pause_source(kubernetes_module).read_bytes()
    binary = workdir / "pause"
    workdir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["gcc", "-Os", "-Wall", "-Werror", "-static", "-DVERSION=v3.10-kubedgx", "-o", str(binary), "-x", "c", "-"],
        input=source,
        check=True,
        capture_output=True,
    )
    subprocess.run(["strip", str(binary)], check=True, capture_output=True)
    image = Image(PAUSE, [Entry("pause", binary.read_bytes(), 0o755)], entrypoint=["/pause"], user="65535:65535")
    return _cached("pause", [source], image)


def busybox_image(binary: Path = BUSYBOX_BINARY) -> Archive:
    data = binary.read_bytes()
    applets = subprocess.run([str(binary), "--list"], check=True, capture_output=True, text=True).stdout.split()
    entries = [
        Entry(d) if d != "tmp" else Entry(d, mode=0o1777) for d in ("bin", "etc", "tmp", "root", "proc", "sys", "dev")
    ]
    entries = [Entry(e.path, mode=0o755 if e.mode == 0o644 else e.mode) for e in entries]
    entries.append(Entry("bin/busybox", data, 0o755))
    entries += [Entry(f"bin/{a}", target="busybox", mode=0o777) for a in sorted(set(applets)) if a != "busybox"]
    entries.append(
        Entry("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
    )
    entries.append(Entry("etc/group", b"root:x:0:\nnogroup:x:65534:\n"))
    image = Image(BUSYBOX, entries, cmd=["/bin/sh"], env={"PATH": "/bin"})
    return _cached("busybox", [data], image)


def have_tools() -> list[str]:
    """What making these images needs and this machine lacks."""
    missing = [tool for tool in ("gcc", "strip") if shutil.which(tool) is None]
    if not BUSYBOX_BINARY.exists():
        missing.append(f"{BUSYBOX_BINARY} (apt-get install busybox-static)")
    return missing
