"""A single-layer container image written as a docker-archive, in Python: what ``ctr images import``
reads (the format ``docker save`` and ``buildah push docker-archive:`` write).

The real nodes' small images (the pause container, busybox) are one static binary and a few files:
writing their archive directly needs no builder, no daemon and no registry, and the same files give
the same bytes (no timestamps, sorted entries, owner root), so an archive is cached by its content.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Entry:
    """One path in the image's layer: a file (``data``), a directory, or a symlink (``target``)."""

    path: str
    data: bytes | None = None
    mode: int = 0o644
    target: str | None = None

    @property
    def is_dir(self) -> bool:
        return self.data is None and self.target is None


@dataclass(frozen=True)
class Image:
    """What an image is made of: its reference, its layer's entries and its runtime config."""

    ref: str
    entries: Sequence[Entry]
    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    user: str = ""
    env: Mapping[str, str] = field(default_factory=dict)

    def layer(self) -> bytes:
        """The layer as an uncompressed tar, parents before children, byte-for-byte reproducible."""
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for entry in sorted(self.entries, key=lambda e: e.path):
                info = tarfile.TarInfo(entry.path.strip("/"))
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                info.mode = entry.mode
                if entry.target is not None:
                    info.type, info.linkname = tarfile.SYMTYPE, entry.target
                    tar.addfile(info)
                elif entry.data is None:
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                else:
                    info.size = len(entry.data)
                    tar.addfile(info, io.BytesIO(entry.data))
        return out.getvalue()

    def config(self, diff_id: str) -> bytes:
        runtime: dict[str, object] = {"Env": [f"{k}={v}" for k, v in self.env.items()]}
        if self.entrypoint:
            runtime["Entrypoint"] = list(self.entrypoint)
        if self.cmd:
            runtime["Cmd"] = list(self.cmd)
        if self.user:
            runtime["User"] = self.user
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": runtime,
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created_by": "tests/nodes/archive.py"}],
        }
        return json.dumps(config, sort_keys=True).encode()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_docker_archive(image: Image, path: Path) -> str:
    """Write ``image`` as a docker-archive at ``path``; returns its config digest (the image ID).
    Written beside and renamed, so a reader never sees half an archive."""
    layer = image.layer()
    layer_sha = _sha256(layer)
    config = image.config(f"sha256:{layer_sha}")
    config_sha = _sha256(config)
    manifest = [{"Config": f"{config_sha}.json", "RepoTags": [image.ref], "Layers": [f"{layer_sha}/layer.tar"]}]
    members = [
        (f"{config_sha}.json", config),
        (f"{layer_sha}/layer.tar", layer),
        ("manifest.json", json.dumps(manifest).encode()),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with tarfile.open(partial, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    partial.replace(path)
    return f"sha256:{config_sha}"
