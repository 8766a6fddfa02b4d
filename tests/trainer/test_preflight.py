"""Preflight against a fake NVML layer: the node has what the job was placed for, or the job refuses
with a message an admin can act on."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from dgx_trainer import preflight
from dgx_trainer.preflight import Expectation, PreflightError

GIB = 2**30
H100 = "NVIDIA H100 80GB HBM3"  # NVML's name; GPU Feature Discovery labels it NVIDIA-H100-80GB-HBM3
H100_LABEL = "NVIDIA-H100-80GB-HBM3"


class FakeNVMLError(Exception):
    """Stands in for pynvml.NVMLError."""


class FakeLibraryNotFoundError(FakeNVMLError):
    def __str__(self) -> str:
        return "NVML Shared Library Not Found"


@dataclass
class FakeGpu:
    name: str | bytes = H100
    memory_gib: int = 80
    links: list[bool] = field(default_factory=lambda: [True] * 18)  # empty: NVLink not supported


class FakeNVML:
    """The slice of pynvml that preflight uses, reporting a configurable topology."""

    NVMLError = FakeNVMLError

    def __init__(self, gpus: list[FakeGpu], init_error: Exception | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.initialized = False
        self.shutdowns = 0
        self.nvlink_queries = 0

    def nvmlInit(self) -> None:  # noqa: N802 (NVML's names)
        if self.init_error is not None:
            raise self.init_error
        self.initialized = True

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        assert self.initialized, "NVML used before nvmlInit"
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:  # noqa: N802
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str | bytes:  # noqa: N802
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> Any:  # noqa: N802
        return SimpleNamespace(total=handle.memory_gib * GIB, free=handle.memory_gib * GIB, used=0)

    def nvmlDeviceGetNvLinkState(self, handle: FakeGpu, link: int) -> int:  # noqa: N802
        self.nvlink_queries += 1
        if link >= len(handle.links):
            raise FakeNVMLError("Not Supported")
        return 1 if handle.links[link] else 0


def dgx(count: int = 8, **changes: FakeGpu) -> list[FakeGpu]:
    """``count`` healthy H100s; ``gpu3=FakeGpu(...)`` replaces one."""
    gpus = [FakeGpu() for _ in range(count)]
    for key, gpu in changes.items():
        gpus[int(key.removeprefix("gpu"))] = gpu
    return gpus


EIGHT_GPU_JOB = Expectation(gpus=8, products=(H100_LABEL,), nvlink=True, nproc=8)


@pytest.fixture(autouse=True)
def node_name(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("KUBEDGX_NODE_NAME", "dgx-07")
    return "dgx-07"


# --- no NVML -----------------------------------------------------------------------------------


def test_nvml_absent_with_allow_cpu_runs_on_the_cpu_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNVML([], init_error=FakeLibraryNotFoundError())
    with caplog.at_level(logging.WARNING, logger="dgx_trainer.preflight"):
        report = preflight.check(Expectation(gpus=1, allow_cpu=True), nvml=nvml)
    assert report.cpu_only
    assert report.gpus == ()
    assert report.topology() == "no NVIDIA GPU: running on the CPU"
    (note,) = report.notes
    assert note == (
        "no NVIDIA driver reachable (NVML: NVML Shared Library Not Found); "
        "running on the CPU because trainer.allowCpu is true"
    )
    assert [r.getMessage() for r in caplog.records if r.name == "dgx_trainer.preflight"] == [note]


def test_nvml_absent_without_allow_cpu_refuses_naming_driver_and_device_plugin() -> None:
    nvml = FakeNVML([], init_error=FakeLibraryNotFoundError())
    with pytest.raises(PreflightError) as info:
        preflight.check(Expectation(gpus=8, allow_cpu=False), nvml=nvml)
    message = str(info.value)
    assert "no NVIDIA driver reachable on this node (NVML: NVML Shared Library Not Found)" in message
    assert "The job asked for 8 GPU(s)" in message
    assert "NVIDIA driver and device plugin" in message
    assert "nvidia.com/gpu capacity" in message
    assert "trainer.allowCpu" in message


def test_nvml_init_error_without_text_is_named_by_its_type() -> None:
    class DriverNotLoadedError(FakeNVMLError):
        pass

    with pytest.raises(PreflightError, match=r"\(NVML: DriverNotLoadedError\)"):
        preflight.check(Expectation(), nvml=FakeNVML([], init_error=DriverNotLoadedError()))


def test_missing_nvidia_ml_py_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    report = preflight.check(Expectation(allow_cpu=True))
    assert report.cpu_only
    assert "nvidia-ml-py is not installed" in report.notes[0]
    with pytest.raises(PreflightError, match="nvidia-ml-py is not installed"):
        preflight.check(Expectation(allow_cpu=False))


def test_the_real_pynvml_here_reports_cpu_only() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVIDIA driver")
    report = preflight.check(Expectation(gpus=1, allow_cpu=True))
    assert report.cpu_only
    assert "no NVIDIA driver reachable" in report.notes[0]


# --- a node that does not match the job ---------------------------------------------------------


def test_four_gpus_on_an_eight_gpu_instance_refuses() -> None:
    nvml = FakeNVML(dgx(4))
    with pytest.raises(PreflightError) as info:
        preflight.check(EIGHT_GPU_JOB, nvml=nvml)
    message = str(info.value)
    assert message.startswith("node dgx-07 does not match the job: ")
    assert "4 GPU(s) visible but the job needs 8 per node" in message
    assert "Xid 79" in message
    assert nvml.shutdowns == 1


def test_fewer_gpus_than_processes_refuses() -> None:
    with pytest.raises(PreflightError, match="1 GPU\\(s\\) visible but the job needs 2 per node"):
        preflight.check(Expectation(nproc=2), nvml=FakeNVML(dgx(1)))


def test_nvlink_down_on_one_gpu_refuses_naming_it_and_the_fabric_manager() -> None:
    nvml = FakeNVML(dgx(8, gpu3=FakeGpu(links=[False] * 18)))
    with pytest.raises(PreflightError) as info:
        preflight.check(EIGHT_GPU_JOB, nvml=nvml)
    message = str(info.value)
    assert "NVLink down on GPU3:" in message
    assert "GPU0" not in message
    assert "GPU7" not in message
    assert "nvidia-fabricmanager" in message
    assert "nvidia-smi nvlink --status" in message
    assert "drain the node" in message


def test_a_gpu_without_nvlink_support_on_an_nvlink_node_refuses() -> None:
    nvml = FakeNVML(dgx(8, gpu5=FakeGpu(links=[])))
    with pytest.raises(PreflightError, match="NVLink down on GPU5:"):
        preflight.check(EIGHT_GPU_JOB, nvml=nvml)


def test_some_links_up_is_enough() -> None:
    report = preflight.check(EIGHT_GPU_JOB, nvml=FakeNVML(dgx(8, gpu2=FakeGpu(links=[True] + [False] * 17))))
    assert report.gpus[2].nvlinks_up == 1


def test_wrong_product_refuses_naming_the_label() -> None:
    nvml = FakeNVML(dgx(8, gpu0=FakeGpu(name="NVIDIA A100-SXM4-80GB")))
    with pytest.raises(PreflightError) as info:
        preflight.check(EIGHT_GPU_JOB, nvml=nvml)
    message = str(info.value)
    assert f"GPU product mismatch: found GPU0 NVIDIA-A100-SXM4-80GB, expected one of {H100_LABEL}" in message
    assert "nvidia.com/gpu.product label is wrong" in message


def test_every_problem_is_reported_at_once() -> None:
    nvml = FakeNVML([FakeGpu(name="Tesla T4", links=[]), FakeGpu(links=[False] * 4)])
    with pytest.raises(PreflightError) as info:
        preflight.check(EIGHT_GPU_JOB, nvml=nvml)
    message = str(info.value)
    assert "2 GPU(s) visible but the job needs 8" in message
    assert "found GPU0 Tesla-T4" in message
    assert "NVLink down on GPU1, GPU0" in message


# --- a node that matches ------------------------------------------------------------------------


def test_all_good_reports_the_topology(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNVML(dgx(8, gpu0=FakeGpu(name=H100.encode())))  # older pynvml returns bytes
    with caplog.at_level(logging.INFO, logger="dgx_trainer.preflight"):
        report = preflight.check(EIGHT_GPU_JOB, nvml=nvml)
    assert not report.cpu_only
    assert [g.index for g in report.gpus] == list(range(8))
    assert all(g.name == H100 and g.memory_gib == 80 and g.nvlinks_up == 18 for g in report.gpus)
    topology = report.topology()
    assert topology.split("; ")[0] == "GPU0 NVIDIA H100 80GB HBM3 80 GiB, 18 NVLink(s) up"
    assert len(topology.split("; ")) == 8
    assert nvml.shutdowns == 1
    assert f"preflight: {topology}" in caplog.text


def test_product_names_compare_in_label_form() -> None:
    job = Expectation(gpus=1, products=("NVIDIA-A100-SXM4-40GB", H100_LABEL))
    report = preflight.check(job, nvml=FakeNVML([FakeGpu(name="NVIDIA  A100-SXM4-40GB ")]))
    assert len(report.gpus) == 1
    assert preflight.label_form(" NVIDIA H100 80GB\tHBM3 ") == H100_LABEL


def test_a_single_gpu_shape_does_not_check_nvlink() -> None:
    job = Expectation(gpus=1, products=(H100_LABEL,), nvlink=True, nproc=1)
    for gpu in (FakeGpu(links=[]), FakeGpu(links=[False] * 18)):
        report = preflight.check(job, nvml=FakeNVML([gpu]))
        assert len(report.gpus) == 1
    assert "no NVLink" in preflight.check(job, nvml=FakeNVML([FakeGpu(links=[])])).topology()


def test_nvlink_not_expected_is_not_checked() -> None:
    job = Expectation(gpus=2, products=(H100_LABEL,), nvlink=False, nproc=2)
    report = preflight.check(job, nvml=FakeNVML(dgx(2, gpu1=FakeGpu(links=[False] * 18))))
    assert report.gpus[1].nvlinks_up == 0


def test_allow_cpu_does_not_waive_the_gpus_the_job_was_placed_for() -> None:
    with pytest.raises(PreflightError, match="1 GPU\\(s\\) visible but the job needs 2"):
        preflight.check(Expectation(gpus=2, allow_cpu=True), nvml=FakeNVML(dgx(1)))


def test_expectation_from_the_operator_environment() -> None:
    env = {
        "KUBEDGX_GPUS_PER_NODE": "8",
        "KUBEDGX_GPU_PRODUCTS": "NVIDIA-H100-80GB-HBM3,NVIDIA-H200",
        "KUBEDGX_NVLINK": "true",
        "LOCAL_WORLD_SIZE": "4",
    }
    assert Expectation.from_env(env, allow_cpu=False) == Expectation(
        gpus=8, products=("NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"), nvlink=True, nproc=4, allow_cpu=False
    )
    assert Expectation.from_env({}, allow_cpu=True) == Expectation(allow_cpu=True)
