"""dgx_image_spec: the trainer image plus flytekit and the plugin, and the CUDA compatibility check
that refuses, naming the package, what would replace the image's torch/CUDA stack or leave the
trainer's supported ranges; with_packages keeps the check (flytekit re-runs __post_init__)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from flytekitplugins.dgx import DGXImageSpec, ImageSpecError, dgx_image_spec
from flytekitplugins.dgx.image import TRAINER_RANGES, requirement_problem
from tests.conftest import ROOT


def test_the_supported_ranges_are_the_trainer_s_own() -> None:
    project = tomllib.loads((ROOT / "trainer" / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    trainer = {canonicalize_name(r.name): str(r.specifier) for r in map(Requirement, project["dependencies"])}
    for name, spec in TRAINER_RANGES.items():
        assert set(spec.split(",")) == set(trainer[name].split(",")), (name, spec, trainer[name])


@pytest.mark.parametrize(
    ("requirement", "words"),
    [
        ("torch==2.1.0", "torch==2.1.0: the trainer image's torch is built for its CUDA and NCCL"),
        ("Torch>=2", "Torch>=2"),
        ("torchvision==0.20", "torchvision==0.20"),
        ("nvidia-cublas-cu12", "nvidia-cublas-cu12: CUDA libraries come with the trainer image's torch"),
        ("cupy-cuda12x", "cupy-cuda12x"),
        ("flash-attn==2.5.0", "flash-attn==2.5.0: compiled against a specific torch"),
        ("peft==0.10.0", "peft==0.10.0: outside the trainer's supported range peft>=0.21,<0.22"),
        ("transformers>=4", "transformers>=4: outside the trainer's supported range"),
        ("bitsandbytes<0.51", "bitsandbytes<0.51: outside"),
        ("torch @ https://example.com/torch.whl", "torch: installed from https://example.com/torch.whl"),
        ("not a requirement!", "is not a pip requirement"),
    ],
)
def test_refused_requirements_name_the_package(requirement: str, words: str) -> None:
    problem = requirement_problem(requirement)
    assert problem is not None
    assert words in problem


@pytest.mark.parametrize(
    "requirement",
    ["torch", "transformers", "bitsandbytes", "accelerate", "peft==0.21.3", "peft>=0.21.1,<0.22",
     "transformers>=5.24,<6", "flash-attn", "scikit-learn==1.5", "wandb>=0.18"],
)  # fmt: skip
def test_allowed_requirements(requirement: str) -> None:
    assert requirement_problem(requirement) is None


def test_with_packages_keeps_the_check_and_the_type() -> None:
    image = dgx_image_spec.with_packages(["transformers", "bitsandbytes", "accelerate"])
    assert isinstance(image, DGXImageSpec)
    assert image.base_image == dgx_image_spec.base_image
    assert {"flytekit>=1.16,<2", "flytekitplugins-dgx==0.1.0", "transformers"} <= set(image.packages)
    assert image.image_name() != dgx_image_spec.image_name(), "another package list, another image"
    with pytest.raises(ImageSpecError, match=r"torch==2\.1: .*CUDA compatibility check"):
        image.with_packages("torch==2.1")
    with pytest.raises(ImageSpecError, match=r"nvidia-nccl-cu12"):
        dgx_image_spec.with_runtime_packages(["nvidia-nccl-cu12"])


def test_a_requirements_file_is_checked_too(tmp_path: Path) -> None:
    path = tmp_path / "requirements.txt"
    path.write_text("# pins\nscikit-learn\npeft==0.9  # old\n-e ./local\n", encoding="utf-8")
    with pytest.raises(ImageSpecError, match=r"peft==0\.9: outside"):
        DGXImageSpec(name="x", base_image="ghcr.io/kubedgx/trainer:0.1.0", requirements=str(path))
