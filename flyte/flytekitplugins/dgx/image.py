"""``dgx_image_spec``: an ImageSpec on the kubedgx trainer image, and the check that keeps it working.

The trainer image's torch is built for its CUDA and its NCCL, and bitsandbytes, transformers and
peft are held to the ranges the trainer is tested with (trainer/pyproject.toml). A task that adds
``torch==2.1`` or ``peft==0.10`` would get an image that builds fine and then fails on the node (a
CUDA mismatch, an API the trainer's MoE patches do not know). So :class:`DGXImageSpec` refuses such
a requirement when it is written, in ``__post_init__``, which flytekit's ``with_packages`` (a
``dataclasses.replace``) runs again each time: the message names the package and the range.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from typing import Final

from flytekit.image_spec import ImageSpec
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

PLUGIN_VERSION: Final = "0.1.0"
#: The trainer image this plugin's tasks run on, unless a task names its own.
TRAINER_IMAGE: Final = os.environ.get("KUBEDGX_FLYTE_TRAINER_IMAGE", f"ghcr.io/kubedgx/trainer:{PLUGIN_VERSION}")
#: The image's Python (Dockerfile.trainer: NVIDIA's PyTorch container, no venv).
IMAGE_PYTHON: Final = "/usr/bin/python"

#: The CUDA stack: the base image's builds, made for its CUDA and NCCL. Named without a version
#: they are a no-op (pip keeps what is there); any version, range or URL could replace them.
CUDA_STACK: Final = frozenset({"torch", "torchvision", "torchaudio", "triton", "nccl"})
#: Distributions whose names start so are CUDA builds (nvidia-cublas-cu12, cupy-cuda12x, ...).
CUDA_PREFIXES: Final = ("nvidia-", "cupy-cuda", "jax-cuda", "cuda-python")
#: Compiled against a specific torch/CUDA: a version of their own would not load with the image's.
COMPILED_AGAINST_TORCH: Final = ("flash-attn", "xformers", "deepspeed", "apex", "transformer-engine")
#: The trainer's supported ranges (trainer/pyproject.toml; a test keeps the two equal).
TRAINER_RANGES: Final[dict[str, str]] = {
    "transformers": ">=5.24,<6",
    "peft": ">=0.21,<0.22",
    "trl": ">=1.16,<2",
    "accelerate": ">=1.15,<2",
    "datasets": ">=5.2,<6",
    "bitsandbytes": ">=0.50,<0.51",
}


class ImageSpecError(ValueError):
    """A package the DGX image cannot take."""


def requirement_problem(text: str) -> str | None:
    """Why ``text`` (one pip requirement) would break the trainer image, or None when it is fine."""
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        return f"{text!r} is not a pip requirement: {exc}"
    name = canonicalize_name(req.name)
    if req.url:
        if name in CUDA_STACK or name in TRAINER_RANGES or name.startswith(CUDA_PREFIXES):
            return f"{req.name}: installed from {req.url}, it would replace the trainer image's build; drop it"
        return None
    if name in CUDA_STACK:
        if not req.specifier:
            return None  # already there: pip keeps the image's build
        return (
            f"{req.name}{req.specifier}: the trainer image's {req.name} is built for its CUDA and NCCL; a pinned "
            f"{req.name} could replace that stack (the CUDA compatibility check). Drop the pin, or build on "
            f"another base image"
        )
    if name.startswith(CUDA_PREFIXES):
        return (
            f"{req.name}: CUDA libraries come with the trainer image's torch; installing {req.name} would mix two "
            f"CUDA builds (the CUDA compatibility check). Drop it"
        )
    if name in COMPILED_AGAINST_TORCH and req.specifier:
        return (
            f"{req.name}{req.specifier}: compiled against a specific torch; a pinned build may not load with the "
            f"image's torch. Drop the pin so pip picks a build that matches it"
        )
    supported = TRAINER_RANGES.get(name)
    if supported is not None and req.specifier:
        allowed = SpecifierSet(supported)
        # Every version the pin admits must lie in the supported range; a pin that only overlaps
        # (>=4) could still let pip pick a version the trainer was never tested with.
        if not _within(req.specifier, allowed):
            return (
                f"{req.name}{req.specifier}: outside the trainer's supported range {req.name}{supported}; "
                f"pin within it or drop the pin"
            )
    return None


def _within(wanted: SpecifierSet, allowed: SpecifierSet) -> bool:
    """Whether ``wanted`` admits only versions ``allowed`` admits. Exact pins are checked exactly; a
    range must be bounded on both sides by bounds that ``allowed`` admits."""
    specs = list(wanted)
    pins = [s.version for s in specs if s.operator in ("==", "===") and "*" not in s.version]
    if pins:
        return all(p in allowed for p in pins)
    lower = [s for s in specs if s.operator in (">=", ">", "~=")]
    upper = [s for s in specs if s.operator in ("<", "<=")]
    if not lower or not upper:
        return False
    return all(s.version in allowed for s in lower) and all(
        s.version in allowed or _bound_of(allowed) == s.version for s in upper
    )


def _bound_of(allowed: SpecifierSet) -> str | None:
    uppers = [s.version for s in allowed if s.operator == "<"]
    return uppers[0] if uppers else None


def problems(packages: Iterable[str] | None) -> list[str]:
    return [p for p in (requirement_problem(text) for text in (packages or ())) if p is not None]


@dataclasses.dataclass(eq=False)  # keeps ImageSpec.__hash__ (flytekit keys its build cache by it)
class DGXImageSpec(ImageSpec):  # type: ignore[misc]  # flytekit ships no type information
    """An ImageSpec that refuses packages the trainer image cannot take."""

    def __post_init__(self) -> None:
        super().__post_init__()
        found = problems(self.packages) + problems(self.runtime_packages) + problems(self.conda_packages)
        if self.requirements:
            try:
                with open(self.requirements, encoding="utf-8") as fh:
                    lines = [ln.split("#", 1)[0].strip() for ln in fh]
            except OSError as exc:
                found.append(f"requirements: cannot read {self.requirements}: {exc}")
            else:
                found += problems(ln for ln in lines if ln and not ln.startswith("-"))
        if found:
            raise ImageSpecError("dgx_image_spec: " + "; ".join(found))


#: The image for Flyte tasks on kubedgx: the trainer image plus flytekit and this plugin.
dgx_image_spec: Final = DGXImageSpec(
    name="kubedgx-flyte",
    base_image=TRAINER_IMAGE,
    python_exec=IMAGE_PYTHON,
    packages=["flytekit>=1.16,<2", f"flytekitplugins-dgx=={PLUGIN_VERSION}"],
    registry=os.environ.get("KUBEDGX_FLYTE_REGISTRY", "ghcr.io/kubedgx"),
)
