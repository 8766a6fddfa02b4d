"""The images as users build them: ``Dockerfile.trainer`` and ``Dockerfile.operator``, unchanged,
built by buildah (daemonless, from Debian) on bases made here, and cached by what makes them.

No registry is reachable, so the two ``FROM`` lines are met by local images of the same layout:

- ``localhost/kubedgx/bookworm:python3``: debootstrap's ``minbase`` of Debian bookworm with Python
  3.11, venv, pip, ``python`` and the CA certificates. Also tagged
  ``docker.io/library/python:3.11-slim-bookworm``, Dockerfile.operator's base (the same Python on the
  same Debian; the operator lives in a venv, so where the interpreter sits does not matter).
- ``nvcr.io/nvidia/pytorch:25.01-py3``: that base plus torch 2.13.0 from PyPI's wheels (the CUDA
  build, which runs on the CPU), installed system-wide as NGC's torch is, so Dockerfile.trainer's
  ``pip install`` keeps it.

Each image carries the label ``io.kubedgx.inputs``, a hash of its recipe, its base's ID and the
files it copies; an image whose label matches is reused, anything else is rebuilt and the stale
tag removed. The trainer image is ~6 GB (torch's CUDA libraries): see :func:`disk_use`.

The trainer's ``RUN pip install`` reaches PyPI through the machine's network with the machine's CA
bundle mounted read-only over Debian's (TLS may be intercepted here); nothing of it stays in the
image. Every other step runs with no network.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.nodes.images import cache_dir as images_cache_dir

PROJECT = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
#: What debootstrap adds to minbase: ``python`` (python-is-python3) is what both Dockerfiles call.
PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates")
TORCH = "2.13.0"
MINBASE = "localhost/kubedgx/bookworm:python3"
PYTHON_SLIM = "docker.io/library/python:3.11-slim-bookworm"
PYTORCH_BASE = "localhost/kubedgx/pytorch-base:" + TORCH
NGC_BASE = "nvcr.io/nvidia/pytorch:25.01-py3"
TRAINER = "localhost/kubedgx/trainer"
OPERATOR = "localhost/kubedgx/operator"
LABEL = "io.kubedgx.inputs"
#: Bump when a step below changes what it makes without its inputs changing.
RECIPE = "1"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
#: Dockerfile.trainer's and Dockerfile.operator's COPY sources (tests/images checks the Dockerfiles).
TRAINER_SOURCES = ("Dockerfile.trainer", "api", "datasync", "trainer", "examples")
OPERATOR_SOURCES = ("Dockerfile.operator", "pyproject.toml", "README.md", "api", "datasync", "operator")

PYTORCH_CONTAINERFILE = f"""\
FROM {MINBASE}
# As in NGC's image: torch system-wide, pip allowed to add to it (Debian marks its Python as
# externally managed), /workspace the working directory.
RUN rm -f /usr/lib/python3.11/EXTERNALLY-MANAGED \\
    && python -m pip install --no-cache-dir --no-index --find-links /wheels torch=={TORCH} \\
    && python -c "import torch; print('torch', torch.__version__)"
WORKDIR /workspace
"""


class BuildError(RuntimeError):
    """A step of an image's build failed; the message names it and ends with its output."""


def cache_root() -> Path:
    return images_cache_dir().parent


@dataclass(frozen=True)
class Images:
    """The two product images, as references in buildah's store."""

    trainer: str
    operator: str


@dataclass
class Buildah:
    """buildah with a store of its own under the nodes cache (the machine's is never touched)."""

    root: Path = field(default_factory=lambda: cache_root() / "buildah")
    log: Path | None = None
    #: Seconds each step took (a step skipped because cached is not listed).
    timings: dict[str, float] = field(default_factory=dict)

    def argv(self, *args: str) -> list[str]:
        return [
            "buildah",
            "--root",
            str(self.root / "storage"),
            "--runroot",
            str(self.root / "run"),
            "--storage-driver",
            "overlay",
            *args,
        ]

    def env(self) -> dict[str, str]:
        """The environment buildah runs in: a containers.conf of its own, so that its network
        backend keeps its configuration and lock under this store, not in the machine's
        /etc/cni/net.d (which it would create)."""
        conf = self.root / "containers.conf"
        if not conf.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            (self.root / "cni").mkdir(exist_ok=True)
            conf.write_text(f'[network]\nnetwork_config_dir = "{self.root / "cni"}"\n')
        return {**os.environ, "CONTAINERS_CONF": str(conf)}

    def run(self, step: str, *args: str, timeout: float = 1800) -> str:
        proc = subprocess.run(
            self.argv(*args), capture_output=True, text=True, timeout=timeout, check=False, env=self.env()
        )
        if self.log is not None:
            with self.log.open("a") as f:
                f.write(f"$ buildah {' '.join(args)}\n{proc.stdout}{proc.stderr}\n")
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise BuildError(f"{step}: buildah {args[0]} exited {proc.returncode}:\n{tail}")
        return proc.stdout

    def label(self, ref: str) -> str | None:
        """The image's inputs label ("" where it has none), or None where there is no such image."""
        template = '{{index .OCIv1.Config.Labels "' + LABEL + '"}}'
        proc = subprocess.run(
            self.argv("inspect", "--type", "image", "--format", template, ref),
            capture_output=True,
            text=True,
            check=False,
            env=self.env(),
        )
        if proc.returncode != 0:
            return None
        value = proc.stdout.strip()
        return "" if value == "<no value>" else value

    def image_id(self, ref: str) -> str:
        return self.run(f"id of {ref}", "inspect", "--type", "image", "--format", "{{.FromImageID}}", ref).strip()

    def tags(self, repository: str) -> list[str]:
        out = self.run("list images", "images", "--noheading", "--format", "{{.Name}}:{{.Tag}}")
        return [line for line in out.split() if line.rsplit(":", 1)[0] == repository]

    def drop_other_tags(self, repository: str, keep: str) -> None:
        """Stale builds of ``repository`` (their layers shared with ``keep`` stay)."""
        for ref in self.tags(repository):
            if ref != keep:
                self.run(f"remove {ref}", "rmi", ref)

    def timed(self, step: str, started: float) -> None:
        self.timings[step] = round(time.monotonic() - started, 1)


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256(RECIPE.encode())
    for part in parts:
        h.update(hashlib.sha256(part.encode() if isinstance(part, str) else part).digest())
    return h.hexdigest()[:16]


def context_files(sources: Sequence[str], root: Path = PROJECT) -> list[Path]:
    """The files ``sources`` bring into a build: git's tracked and untracked-but-not-ignored files
    (.dockerignore leaves out only what .gitignore does too: caches, egg-info, build outputs)."""
    proc = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", *sources],
        cwd=root,
        capture_output=True,
        check=True,
    )
    names = sorted({n for n in proc.stdout.decode().split("\0") if n})
    return [root / n for n in names if (root / n).is_file()]


def content_hash(sources: Sequence[str], *extra: str, root: Path = PROJECT) -> str:
    parts: list[bytes | str] = list(extra)
    for path in context_files(sources, root):
        parts += [str(path.relative_to(root)), path.read_bytes()]
    return _digest(*parts)


#: The locks this process holds (name -> depth): taken again inside, a lock is already ours.
_HELD: dict[str, int] = {}


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """One builder at a time per machine (xdist workers, ``up``), waiting for the other.
    Reentrant in a process (the nodes' stream holds it and may build again inside)."""
    if _HELD.get(name):
        _HELD[name] += 1
        try:
            yield
        finally:
            _HELD[name] -= 1
        return
    path = cache_root() / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        _HELD[name] = 1
        try:
            yield
        finally:
            _HELD[name] = 0
            fcntl.flock(f, fcntl.LOCK_UN)


def debian_mirror() -> str:
    """The machine's own Debian mirror (apt's deb822 sources), else deb.debian.org."""
    for source in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for line in source.read_text().splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    return "http://deb.debian.org/debian"


def missing() -> list[str]:
    """What this machine lacks to build the images (the reason to skip)."""
    problems = [f"no {tool} on PATH" for tool in ("buildah", "debootstrap", "runc") if shutil.which(tool) is None]
    if problems:
        problems.append("(apt-get install --no-install-recommends buildah debootstrap)")
    return problems


# -- the bases ----------------------------------------------------------------------------------


def minbase(b: Buildah) -> str:
    inputs = _digest(SUITE, *PACKAGES)
    if b.label(MINBASE) == inputs:
        return MINBASE
    t0 = time.monotonic()
    rootfs = cache_root() / "rootfs" / f"{SUITE}-{inputs}"
    shutil.rmtree(rootfs, ignore_errors=True)
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(rootfs), debian_mirror()],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if proc.returncode != 0:
        raise BuildError(f"debootstrap {SUITE} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}")
    try:
        container = b.run("minbase", "from", "scratch").strip()
        mount = Path(b.run("minbase", "mount", container).strip())
        subprocess.run(["cp", "-a", f"{rootfs}/.", f"{mount}/"], check=True)
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (mount / junk).glob("*"):
                if item.is_file():
                    item.unlink()
        b.run("minbase", "umount", container)
        b.run(
            "minbase",
            "config",
            "--cmd",
            '["/bin/bash"]',
            "--env",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--label",
            f"{LABEL}={inputs}",
            container,
        )
        b.run("minbase", "commit", "-q", "--rm", container, MINBASE)
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
    b.timed("base: debootstrap", t0)
    return MINBASE


def torch_wheels() -> Path:
    """torch and its dependencies as PyPI's wheels for this Python (3.11, as bookworm's), downloaded
    once (~2.6 GB, the CUDA build) and kept until the base is built."""
    wheels = cache_root() / "wheels" / f"torch-{TORCH}"
    if wheels.is_dir() and any(wheels.glob("torch-*.whl")):
        return wheels
    partial = wheels.with_name(wheels.name + ".partial")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--only-binary=:all:",
            f"torch=={TORCH}",
            "-d",
            str(partial),
        ],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if proc.returncode != 0:
        raise BuildError(f"pip download torch=={TORCH} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    partial.rename(wheels)
    return wheels


def pytorch_base(b: Buildah) -> str:
    base_id = b.image_id(minbase(b))
    inputs = _digest(base_id, PYTORCH_CONTAINERFILE)
    if b.label(PYTORCH_BASE) != inputs:
        t0 = time.monotonic()
        wheels = torch_wheels()
        context = cache_root() / "build" / "pytorch-base"
        context.mkdir(parents=True, exist_ok=True)
        (context / "Containerfile").write_text(PYTORCH_CONTAINERFILE)
        b.run(
            "the torch base",
            "bud",
            "--isolation", "oci",
            # crun refuses this machine's hybrid cgroup layout; runc runs in it
            "--runtime", "runc",
            "--network", "none",
            "--pull=never",
            "--layers=false",
            "--volume", f"{wheels}:/wheels:ro",
            "--label", f"{LABEL}={inputs}",
            "-t", PYTORCH_BASE,
            "-f", str(context / "Containerfile"),
            str(context),
        )  # fmt: skip
        shutil.rmtree(wheels, ignore_errors=True)
        b.timed("base: torch", t0)
    if b.image_id(PYTORCH_BASE) != _id_or_none(b, NGC_BASE):
        b.run("tag the torch base", "tag", PYTORCH_BASE, NGC_BASE)
    return NGC_BASE


def python_slim(b: Buildah) -> str:
    base = minbase(b)
    if b.image_id(base) != _id_or_none(b, PYTHON_SLIM):
        b.run("tag the Python base", "tag", base, PYTHON_SLIM)
    return PYTHON_SLIM


def _id_or_none(b: Buildah, ref: str) -> str | None:
    try:
        return b.image_id(ref)
    except BuildError:
        return None


# -- the product's images -----------------------------------------------------------------------


def _dockerfile(b: Buildah, step: str, repository: str, dockerfile: str, sources: Sequence[str],
                base: str, network: Iterable[str]) -> str:  # fmt: skip
    inputs = content_hash(sources, b.image_id(base))
    ref = f"{repository}:c-{inputs}"
    if b.label(ref) != inputs:
        t0 = time.monotonic()
        b.run(
            step,
            "bud",
            "--isolation", "oci",
            # crun refuses this machine's hybrid cgroup layout; runc runs in it
            "--runtime", "runc",
            *network,
            "--pull=never",
            "--layers=false",
            "--label", f"{LABEL}={inputs}",
            "-t", ref,
            "-f", str(PROJECT / dockerfile),
            str(PROJECT),
        )  # fmt: skip
        b.timed(step, t0)
    b.drop_other_tags(repository, ref)
    return ref


def trainer_image(b: Buildah) -> str:
    base = pytorch_base(b)
    # pip reaches PyPI for the trainer's dependencies; the machine's CA bundle, read-only, for TLS.
    network = ["--network", "host", "--volume", f"{HOST_CA}:/etc/ssl/certs/ca-certificates.crt:ro"]
    return _dockerfile(b, "Dockerfile.trainer", TRAINER, "Dockerfile.trainer", TRAINER_SOURCES, base, network)


def operator_image(b: Buildah) -> str:
    base = python_slim(b)
    network = ["--network", "host", "--volume", f"{HOST_CA}:/etc/ssl/certs/ca-certificates.crt:ro"]
    return _dockerfile(b, "Dockerfile.operator", OPERATOR, "Dockerfile.operator", OPERATOR_SOURCES, base, network)


def build_images(log: Path | None = None) -> tuple[Images, dict[str, float]]:
    """Both images, built or reused (one builder per machine at a time); with each step's seconds."""
    with locked("buildah"):
        b = Buildah(log=log)
        images = Images(trainer=trainer_image(b), operator=operator_image(b))
        return images, b.timings


def disk_use() -> dict[str, int]:
    """Bytes under the nodes cache: buildah's store, each node slot's containerd, the rest."""
    root = cache_root()
    out: dict[str, int] = {}
    if root.is_dir():
        for child in sorted(root.iterdir()):
            proc = subprocess.run(["du", "-sb", str(child)], capture_output=True, text=True, check=False)
            if proc.returncode == 0 and proc.stdout:
                out[child.name] = int(proc.stdout.split()[0])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.nodes.buildah``: build (or reuse) both images; print their references,
    each step's seconds and the cache's disk use."""
    del argv
    problems = missing()
    if problems:
        print("cannot build the images here: " + "; ".join(problems), file=sys.stderr)
        return 2
    t0 = time.monotonic()
    images, timings = build_images()
    print(f"TRAINER_IMAGE={images.trainer}")
    print(f"OPERATOR_IMAGE={images.operator}")
    print(f"steps: {timings}; total {time.monotonic() - t0:.0f}s")
    print("disk: " + ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in disk_use().items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
