"""Preflight against a fake NVML layer: the node has what the job was placed for, or the job refuses
with a message an admin can act on. The fake also presents GPUs in MIG mode as a container given a
slice sees them (the parent through nvmlDeviceGetCount, its memory a permission error, the slice
through nvmlDeviceGetMigDeviceHandleByIndex) and pynvml/drivers that know nothing of MIG."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dgx_trainer import preflight
from dgx_trainer.preflight import Expectation, PreflightError
from tests.trainer.conftest import config_data

GIB = 2**30
H100 = "NVIDIA H100 80GB HBM3"  # NVML's name; GPU Feature Discovery labels it NVIDIA-H100-80GB-HBM3
H100_LABEL = "NVIDIA-H100-80GB-HBM3"


class FakeNVMLError(Exception):
    """Stands in for pynvml.NVMLError."""


class FakeLibraryNotFoundError(FakeNVMLError):
    def __str__(self) -> str:
        return "NVML Shared Library Not Found"


class FakeNotFoundError(FakeNVMLError):
    """pynvml.NVMLError_NotFound: e.g. a MIG device index with no slice for this container."""


class FakeNoPermissionError(FakeNVMLError):
    """pynvml.NVMLError_NoPermission: a MIG-mode GPU's aggregate memory, asked from a container."""


class FakeNotSupportedError(FakeNVMLError):
    """pynvml.NVMLError_NotSupported: MIG asked of a GPU without MIG (V100, T4, ...)."""


class FakeFunctionNotFoundError(FakeNVMLError):
    """pynvml.NVMLError_FunctionNotFound: a driver older than the pynvml function."""


A100 = "NVIDIA A100-SXM4-80GB"
A100_LABEL = "NVIDIA-A100-SXM4-80GB"


@dataclass
class FakeMig:
    """A MIG device handle: NVML names a slice "<parent> MIG <profile>"."""

    name: str | bytes = f"{A100} MIG 1g.10gb"
    memory_gib: float = 9.5  # a 1g.10gb slice holds a little under 10 GiB


@dataclass
class FakeGpu:
    name: str | bytes = H100
    memory_gib: int = 80
    links: list[bool] = field(default_factory=lambda: [True] * 18)  # empty: NVLink not supported
    #: None: not in MIG mode. A list: in MIG mode, one entry per MIG device index (7 on an A100),
    #: None where this container was not given a slice.
    mig: list[FakeMig | None] | None = None
    #: What nvmlDeviceGetMigMode raises (a GPU or driver without MIG); None: it answers.
    mig_error: type[Exception] | None = None
    pending_mig: bool = False  # MIG mode asked for, taking effect at the next GPU reset


def mig_gpu(*visible: FakeMig, at: int = 3, name: str = A100) -> FakeGpu:
    """A GPU in MIG mode with seven MIG device indices, ``visible`` given to this container from ``at``."""
    slots: list[FakeMig | None] = [None] * 7
    slots[at : at + len(visible)] = visible
    return FakeGpu(name=name, mig=slots)


class FakeNVML:
    """The slice of pynvml that preflight uses, reporting a configurable topology."""

    NVMLError = FakeNVMLError
    NVMLError_NotFound = FakeNotFoundError
    NVMLError_NoPermission = FakeNoPermissionError
    NVMLError_NotSupported = FakeNotSupportedError
    NVMLError_FunctionNotFound = FakeFunctionNotFoundError
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, gpus: list[FakeGpu], init_error: Exception | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.initialized = False
        self.shutdowns = 0
        self.nvlink_queries = 0
        self.memory_queries: list[FakeGpu | FakeMig] = []
        self.mig_indices_asked: list[int] = []

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

    def nvmlDeviceGetName(self, handle: FakeGpu | FakeMig) -> str | bytes:  # noqa: N802
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu | FakeMig) -> Any:  # noqa: N802
        self.memory_queries.append(handle)
        if isinstance(handle, FakeGpu) and handle.mig is not None:
            raise FakeNoPermissionError("Insufficient Permissions")  # the aggregate, asked without privileges
        return SimpleNamespace(total=handle.memory_gib * GIB, free=handle.memory_gib * GIB, used=0)

    def nvmlDeviceGetNvLinkState(self, handle: FakeGpu | FakeMig, link: int) -> int:  # noqa: N802
        self.nvlink_queries += 1
        if isinstance(handle, FakeMig) or link >= len(handle.links):
            raise FakeNotSupportedError("Not Supported")
        return 1 if handle.links[link] else 0

    def nvmlDeviceGetMigMode(self, handle: FakeGpu) -> list[int]:  # noqa: N802
        if handle.mig_error is not None:
            raise handle.mig_error("Not Supported")
        return [1 if handle.mig is not None else 0, 1 if handle.pending_mig or handle.mig is not None else 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeGpu) -> int:  # noqa: N802
        return 0 if handle.mig is None else len(handle.mig)  # "zero if MIG is not supported or enabled"

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeGpu, index: int) -> FakeMig:  # noqa: N802
        self.mig_indices_asked.append(index)
        found = None if handle.mig is None or index >= len(handle.mig) else handle.mig[index]
        if found is None:
            raise FakeNotFoundError("Not Found")
        return found


class PynvmlBeforeMig:
    """A pynvml without any MIG function (before nvidia-ml-py 11): the MIG names are AttributeErrors."""

    def __init__(self, nvml: FakeNVML) -> None:
        self._nvml = nvml

    def __getattr__(self, name: str) -> Any:
        if "Mig" in name or "MIG" in name:
            raise AttributeError(name)
        return getattr(self._nvml, name)


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


# --- MIG: a slice is the device, its parent the product ---------------------------------------

#: What the operator sets on a dgxa100.80g.mig-1g.10gb.* worker.
MIG_ENV = {
    "KUBEDGX_GPUS_PER_NODE": "1",
    "KUBEDGX_MIG_PROFILE": "1g.10gb",
    "KUBEDGX_GPU_PRODUCTS": A100_LABEL,
    "KUBEDGX_NVLINK": "false",
}
MIG_JOB = Expectation.from_env(MIG_ENV, allow_cpu=False)


def test_a_slice_given_to_the_container_is_the_one_device_with_the_slice_s_memory() -> None:
    slice_ = FakeMig()
    nvml = FakeNVML([mig_gpu(slice_)])
    report = preflight.check(MIG_JOB, nvml=nvml)
    assert report.gpus == (preflight.Gpu(0, f"{A100} MIG 1g.10gb", 9.5, 0, False, mig_profile="1g.10gb", parent=A100),)
    assert nvml.mig_indices_asked == list(range(7))  # the indices of other containers' slices are skipped
    assert nvml.memory_queries == [slice_]  # the parent's (aggregate, NoPermission here) is never asked
    assert nvml.nvlink_queries == 0
    assert report.topology() == f"GPU0 {A100} MIG 1g.10gb 10 GiB, MIG slice, no NVLink"


def test_a_mig_parent_s_memory_is_never_read_even_when_no_slice_is_expected() -> None:
    """The fake's MIG-mode parent raises NoPermission for its memory, as in a container: reading it
    would end the worker with a traceback instead of a message."""
    nvml = FakeNVML([mig_gpu(FakeMig())])
    with pytest.raises(PreflightError) as info:
        preflight.check(Expectation(gpus=1, products=(A100_LABEL,)), nvml=nvml)
    assert all(isinstance(h, FakeMig) for h in nvml.memory_queries)
    message = str(info.value)
    assert message == (
        "node dgx-07 does not match the job: expected whole GPUs, found a MIG 1g.10gb slice of "
        f"{A100}: the node's nvidia.com/mig.strategy (single hands out slices as nvidia.com/gpu) or the "
        "device plugin is not what the catalog says"
    )


def test_a_whole_gpu_where_a_slice_was_expected_refuses_naming_both() -> None:
    nvml = FakeNVML([FakeGpu(name=A100)])
    with pytest.raises(PreflightError) as info:
        preflight.check(MIG_JOB, nvml=nvml)
    assert str(info.value) == (
        f"node dgx-07 does not match the job: expected a MIG 1g.10gb slice, found a whole {A100}: "
        "the node's nvidia.com/mig.strategy or the device plugin is not what the catalog says"
    )


def test_a_slice_of_another_profile_refuses_naming_both() -> None:
    nvml = FakeNVML([mig_gpu(FakeMig(f"{A100} MIG 2g.20gb", 19.5))])
    with pytest.raises(PreflightError) as info:
        preflight.check(MIG_JOB, nvml=nvml)
    message = str(info.value)
    assert f"expected a MIG 1g.10gb slice, found a MIG 2g.20gb slice of {A100}: " in message
    assert "nvidia.com/mig-1g.10gb" in message
    assert "GPU(s) visible" not in message  # the slice stands for the GPU count


def test_no_slice_visible_refuses_naming_the_mig_resource(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="dgx_trainer.preflight"), pytest.raises(PreflightError) as info:
        preflight.check(MIG_JOB, nvml=FakeNVML([mig_gpu()]))
    message = str(info.value)
    assert "no MIG 1g.10gb slice visible: the device plugin handed out none" in message
    assert "nvidia.com/mig-1g.10gb capacity" in message
    assert f"GPU {A100} is in MIG mode, but none of its MIG devices is visible to this container" in caplog.text


def test_two_slices_where_one_was_expected_refuses() -> None:
    nvml = FakeNVML([mig_gpu(FakeMig(), FakeMig())])
    with pytest.raises(PreflightError, match=r"2 MIG 1g\.10gb slices visible but the job runs on one"):
        preflight.check(MIG_JOB, nvml=nvml)


def test_a_slice_is_checked_against_its_parent_s_product() -> None:
    """GPU Feature Discovery labels a mixed-strategy node with the physical product, not the slice."""
    h100_slice = mig_gpu(FakeMig(f"{H100} MIG 1g.10gb", 9.5), name=H100)
    with pytest.raises(PreflightError) as info:
        preflight.check(MIG_JOB, nvml=FakeNVML([h100_slice]))
    message = str(info.value)
    assert f"GPU product mismatch: found GPU0 {H100_LABEL}, expected one of {A100_LABEL}" in message
    assert "expected a MIG" not in message  # the profile matched


def test_a_slice_s_profile_is_read_from_bytes_names_too() -> None:
    report = preflight.check(MIG_JOB, nvml=FakeNVML([mig_gpu(FakeMig(f"{A100} MIG 1g.10gb".encode()))]))
    assert report.gpus[0].mig_profile == "1g.10gb"


def test_a_slice_whose_name_carries_no_profile_refuses_naming_the_nvml_name() -> None:
    with pytest.raises(PreflightError) as info:
        preflight.check(MIG_JOB, nvml=FakeNVML([mig_gpu(FakeMig("NVIDIA MIG device"))]))
    assert (
        f"expected a MIG 1g.10gb slice, found a MIG slice of {A100} whose NVML name (NVIDIA MIG device) "
        "carries no profile"
    ) in str(info.value)


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        (f"{A100} MIG 1g.10gb", "1g.10gb"),
        ("A100-SXM4-40GB MIG 1g.5gb", "1g.5gb"),  # drivers before the NVIDIA prefix
        (f"{H100} MIG 1c.3g.40gb", "1c.3g.40gb"),  # a compute instance smaller than its GPU instance
        (f"{A100} MIG 1g.10gb+me", "1g.10gb+me"),
        ("NVIDIA H200 MIG 1G.18GB", "1g.18gb"),
        (A100, None),
        (H100, None),
        ("NVIDIA B200", None),
    ],
)
def test_mig_profile_from_the_nvml_name(name: str, profile: str | None) -> None:
    assert preflight.mig_profile(name) == profile


def mig_less(nvml: FakeNVML, kind: str) -> Any:
    """The same node behind a pynvml or driver that knows nothing of MIG."""
    if kind == "AttributeError":
        return PynvmlBeforeMig(nvml)
    error = {"NotSupported": FakeNotSupportedError, "FunctionNotFound": FakeFunctionNotFoundError}[kind]
    for gpu in nvml.gpus:
        gpu.mig_error = error
    return nvml


@pytest.mark.parametrize("kind", ["AttributeError", "NotSupported", "FunctionNotFound"])
def test_without_mig_in_pynvml_or_the_driver_whole_gpus_are_probed_as_before(kind: str) -> None:
    plain = preflight.check(EIGHT_GPU_JOB, nvml=FakeNVML(dgx(8)))
    nvml = FakeNVML(dgx(8))
    report = preflight.check(EIGHT_GPU_JOB, nvml=mig_less(nvml, kind))
    assert report == plain
    assert all(not g.is_slice and g.memory_gib == 80 and g.nvlinks_up == 18 for g in report.gpus)
    assert len(nvml.memory_queries) == 8
    assert nvml.mig_indices_asked == []
    with pytest.raises(PreflightError, match="NVLink down on GPU3:"):
        preflight.check(EIGHT_GPU_JOB, nvml=mig_less(FakeNVML(dgx(8, gpu3=FakeGpu(links=[False] * 18))), kind))


def test_a_pending_mig_mode_is_not_mig_yet() -> None:
    """MIG mode set but not yet applied (the GPU was not reset): the GPU is still whole."""
    nvml = FakeNVML([FakeGpu(name=A100, pending_mig=True)])
    report = preflight.check(Expectation(gpus=1, products=(A100_LABEL,)), nvml=nvml)
    assert report.gpus[0].memory_gib == 80
    assert not report.gpus[0].is_slice


def test_a_mig_expectation_from_the_operator_environment() -> None:
    expected = Expectation(gpus=1, products=(A100_LABEL,), nvlink=False, mig_profile="1g.10gb")
    assert Expectation.from_env(MIG_ENV, allow_cpu=False) == expected
    assert Expectation.from_env({**MIG_ENV, "KUBEDGX_MIG_PROFILE": " 1G.10GB "}, allow_cpu=False) == expected
    assert Expectation.from_env({"KUBEDGX_MIG_PROFILE": ""}, allow_cpu=False).mig_profile is None


# --- MIG: the memory estimate compares with the slice ------------------------------------------

#: Llama-2-7B's config.json (the fields the estimate reads).
LLAMA_7B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
}


def test_a_7b_bf16_lora_is_refused_on_a_1g_10gb_slice_and_fits_the_whole_gpu(tmp_path: Path) -> None:
    """The memory check takes the probed devices' GiB: a slice's ~10, not its parent's 80. 7B in
    bf16 is ~12.6 GiB of weights alone."""
    from dgx_api.trainer_config import parse_config
    from dgx_trainer import launch

    cfg = parse_config(config_data(tmp_path, {"training.precision": "bf16", "training.gradientCheckpointing": True}))
    on_slice = preflight.check(MIG_JOB, nvml=FakeNVML([mig_gpu(FakeMig())]))
    assert launch.gpu_memory(on_slice, {}) == [(f"{A100} MIG 1g.10gb", 9.5)]
    [problem] = launch.check_memory(cfg, LLAMA_7B, on_slice, MIG_ENV)
    assert problem.path == "memoryCheck"
    assert problem.message.startswith("needs ~")
    assert f"but GPU0 {A100} MIG 1g.10gb has 9.5 GiB" in problem.message
    assert "set quantization.loadIn4bit: true" in problem.message
    assert problem.message.endswith("or set memoryCheck: warn")
    whole = preflight.check(Expectation(gpus=1, products=(A100_LABEL,)), nvml=FakeNVML([FakeGpu(name=A100)]))
    assert launch.check_memory(cfg, LLAMA_7B, whole, {"KUBEDGX_GPUS_PER_NODE": "1"}) == []
