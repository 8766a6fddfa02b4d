"""The instance catalog: which names exist, what they place on, and how broken catalogs fail."""

from __future__ import annotations

import copy
import re
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from dgx_operator.catalog import Catalog, CatalogError, Instance, UnknownInstanceError

# The default catalog, written out: (family key, products, GPU memory GiB, shapes, per-GPU cpu, memoryGi, shmGi).
FAMILIES: dict[str, tuple[tuple[str, ...], int, tuple[int, ...], tuple[int, int, int]]] = {
    "a100.40g": (("NVIDIA-A100-SXM4-40GB",), 40, (1, 2, 4, 8), (28, 110, 8)),
    "a100.80g": (("NVIDIA-A100-SXM4-80GB",), 80, (1, 2, 4, 8), (28, 220, 16)),
    "h100.80g": (("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB"), 80, (1, 2, 4, 8), (24, 220, 16)),
    "h200.141g": (
        ("NVIDIA-H200", "NVIDIA-H200-141GB-HBM3e", "NVIDIA-H200-SXM5-141GB"),
        141,
        (1, 2, 4, 8),
        (24, 220, 16),
    ),
    "b200.180g": (
        ("NVIDIA-B200", "NVIDIA-B200-180GB-HBM3e", "NVIDIA-B200-192GB-HBM3e"),
        180,
        (1, 2, 4, 8),
        (24, 220, 16),
    ),
    "gb200.186g": (("NVIDIA-GB200",), 186, (1, 2, 4), (32, 200, 16)),
}
SINGLE_NODE_NVLINK = ("a100.40g", "a100.80g", "h100.80g", "h200.141g", "b200.180g")
CAPACITIES = ("norm", "spot", "debug")

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

# Every family x shape x capacity the brief promises for the classic DGX products.
CLASSIC_COMBOS = [
    (key, gpus, capacity) for key in SINGLE_NODE_NVLINK for gpus in (1, 2, 4, 8) for capacity in CAPACITIES
]


def default_catalog_data() -> dict[str, Any]:
    """The shipped catalog as a plain mapping, to derive broken or extended variants from."""
    text = resources.files("dgx_operator").joinpath("catalog.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


def write_catalog(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def family_entry(data: dict[str, Any], key: str) -> dict[str, Any]:
    for fam in data["gpus"]:
        if f"{fam['family']}.{fam['memoryGiB']}g" == key:
            return dict(fam)
    raise AssertionError(f"no family {key} in the catalog data")


# --- the default catalog -------------------------------------------------------------------------

#: The MIG slices the shipped catalog offers per family (docs/research/sharing-nodes.md, section 2).
MIG_PROFILES = {
    "a100.40g": ("1g.5gb", "2g.10gb", "3g.20gb"),
    "a100.80g": ("1g.10gb", "2g.20gb", "3g.40gb"),
    "h100.80g": ("1g.10gb", "2g.20gb", "3g.40gb"),
    "h200.141g": ("1g.18gb", "2g.35gb", "3g.71gb"),
    "b200.180g": ("1g.23gb", "2g.45gb", "3g.90gb"),
}


def test_default_catalog_defines_exactly_the_expected_names(catalog: Catalog) -> None:
    expected = {
        f"dgx{key}.{gpus}.{capacity}"
        for key, (_, _, shapes, _) in FAMILIES.items()
        for gpus in shapes
        for capacity in CAPACITIES
    }
    assert len(expected) == 5 * 4 * 3 + 3 * 3
    mig = {
        f"dgx{key}.mig-{profile}.{capacity}"
        for key, profiles in MIG_PROFILES.items()
        for profile in profiles
        for capacity in CAPACITIES
    }
    assert len(mig) == 5 * 3 * 3  # every family but GB200 (MIG Manager's all-balanced geometry: 1g, 2g, 3g)
    assert set(catalog.instances) == expected | mig


@pytest.mark.parametrize(("key", "gpus", "capacity"), CLASSIC_COMBOS)
def test_every_classic_combination_resolves(catalog: Catalog, key: str, gpus: int, capacity: str) -> None:
    products, memory_gib, _, _ = FAMILIES[key]
    name = f"dgx{key}.{gpus}.{capacity}"
    inst = catalog.get(name)
    assert isinstance(inst, Instance)
    assert inst.name == name
    assert inst.gpus == gpus
    assert inst.capacity == capacity
    assert inst.products == products
    assert inst.gpu_memory_gib == memory_gib
    assert inst.multi_node_nvlink is False
    assert inst.family.nvlink_domain_nodes is None
    assert inst.labels.product == "nvidia.com/gpu.product"
    assert inst.labels.count == "nvidia.com/gpu.count"
    assert inst.topology_key is None  # no topology preference unless the catalog names one


@pytest.mark.parametrize("gpus", [1, 2, 4])
@pytest.mark.parametrize("capacity", CAPACITIES)
def test_gb200_is_multi_node_nvlink_with_a_domain_size(catalog: Catalog, gpus: int, capacity: str) -> None:
    inst = catalog.get(f"dgxgb200.186g.{gpus}.{capacity}")
    assert inst.gpus == gpus
    assert inst.multi_node_nvlink is True
    assert inst.family.nvlink_domain_nodes == 18
    assert inst.products == ("NVIDIA-GB200",)
    assert inst.gpu_memory_gib == 186
    assert inst.labels.clique == "nvidia.com/gpu.clique"


def test_gb200_has_no_eight_gpu_shape(catalog: Catalog) -> None:
    with pytest.raises(UnknownInstanceError):
        catalog.get("dgxgb200.186g.8.norm")


@pytest.mark.parametrize("key", sorted(FAMILIES))
@pytest.mark.parametrize("capacity", CAPACITIES)
def test_per_node_resources_scale_with_the_shape(catalog: Catalog, key: str, capacity: str) -> None:
    _, _, shapes, (cpu, memory_gi, shm_gi) = FAMILIES[key]
    for gpus in shapes:
        inst = catalog.get(f"dgx{key}.{gpus}.{capacity}")
        assert inst.cpu == str(cpu * gpus)
        assert inst.memory == f"{memory_gi * gpus}Gi"
        assert inst.shm == f"{shm_gi * gpus}Gi"


def _gi(quantity: str) -> int:
    match = re.fullmatch(r"([0-9]+)Gi", quantity)
    assert match, quantity
    return int(match[1])


@pytest.mark.parametrize("key", SINGLE_NODE_NVLINK)
def test_four_gpu_node_is_half_of_an_eight_gpu_node(catalog: Catalog, key: str) -> None:
    four = catalog.get(f"dgx{key}.4.norm")
    eight = catalog.get(f"dgx{key}.8.norm")
    assert int(four.cpu) * 2 == int(eight.cpu)
    assert _gi(four.memory) * 2 == _gi(eight.memory)
    assert _gi(four.shm) * 2 == _gi(eight.shm)


def test_a100_80g_eight_gpu_node_written_out(catalog: Catalog) -> None:
    inst = catalog.get("dgxa100.80g.8.norm")
    assert (inst.cpu, inst.memory, inst.shm) == ("224", "1760Gi", "128Gi")


@pytest.mark.parametrize("capacity", ["spot", "debug"])
def test_spot_and_debug_carry_a_node_selector_and_a_toleration(catalog: Catalog, capacity: str) -> None:
    inst = catalog.get(f"dgxh100.80g.8.{capacity}")
    assert inst.node_selector == {"kubedgx.io/capacity": capacity}
    pool_toleration = {"key": "kubedgx.io/capacity", "operator": "Equal", "value": capacity, "effect": "NoSchedule"}
    assert [t.manifest() for t in inst.capacity_spec.tolerations] == [pool_toleration]
    assert inst.tolerations == [GPU_TOLERATION, pool_toleration]


def test_norm_carries_no_node_selector_and_only_the_gpu_toleration(catalog: Catalog) -> None:
    inst = catalog.get("dgxh100.80g.8.norm")
    assert inst.node_selector == {}
    assert inst.capacity_spec.tolerations == ()
    assert inst.tolerations == [GPU_TOLERATION]


def test_node_selector_is_a_copy(catalog: Catalog) -> None:
    inst = catalog.get("dgxa100.80g.8.spot")
    inst.node_selector["mutated"] = "yes"
    assert inst.node_selector == {"kubedgx.io/capacity": "spot"}


def test_known_lists_every_family_in_brace_form(catalog: Catalog) -> None:
    assert catalog.known() == (
        "dgxa100.40g.{1,2,4,8,mig-1g.5gb,mig-2g.10gb,mig-3g.20gb}.{norm,spot,debug}, "
        "dgxa100.80g.{1,2,4,8,mig-1g.10gb,mig-2g.20gb,mig-3g.40gb}.{norm,spot,debug}, "
        "dgxh100.80g.{1,2,4,8,mig-1g.10gb,mig-2g.20gb,mig-3g.40gb}.{norm,spot,debug}, "
        "dgxh200.141g.{1,2,4,8,mig-1g.18gb,mig-2g.35gb,mig-3g.71gb}.{norm,spot,debug}, "
        "dgxb200.180g.{1,2,4,8,mig-1g.23gb,mig-2g.45gb,mig-3g.90gb}.{norm,spot,debug}, "
        "dgxgb200.186g.{1,2,4}.{norm,spot,debug}"
    )


# --- unknown instances ---------------------------------------------------------------------------

KNOWN_FRAGMENTS = (
    "dgxa100.40g.{1,2,4,8,mig-1g.5gb,mig-2g.10gb,mig-3g.20gb}.{norm,spot,debug}",
    "dgxh200.141g.{1,2,4,8,mig-1g.18gb,mig-2g.35gb,mig-3g.71gb}.{norm,spot,debug}",
    "dgxgb200.186g.{1,2,4}.{norm,spot,debug}",
)


def unknown(catalog: Catalog, name: str) -> UnknownInstanceError:
    with pytest.raises(UnknownInstanceError) as info:
        catalog.get(name)
    assert info.value.name == name
    assert isinstance(info.value, LookupError)
    assert str(info.value) == info.value.message
    assert repr(name) in str(info.value)
    return info.value


def test_wrong_shape_names_the_family_shapes(catalog: Catalog) -> None:
    msg = str(unknown(catalog, "dgxa100.80g.3.norm"))
    assert "1, 2, 4, 8 GPUs" in msg
    assert "not 3" in msg


def test_wrong_shape_for_gb200_names_its_shapes(catalog: Catalog) -> None:
    msg = str(unknown(catalog, "dgxgb200.186g.8.spot"))
    assert "1, 2, 4 GPUs" in msg
    assert "not 8" in msg


def test_wrong_shape_message_also_lists_the_known_instances(catalog: Catalog) -> None:
    msg = str(unknown(catalog, "dgxa100.80g.3.norm"))
    assert "Known:" in msg
    for fragment in KNOWN_FRAGMENTS:
        assert fragment in msg


def test_unknown_capacity_names_the_pools(catalog: Catalog) -> None:
    msg = str(unknown(catalog, "dgxa100.80g.8.preempt"))
    assert "no capacity pool 'preempt'" in msg
    assert "pools: norm, spot, debug" in msg
    assert "Known:" in msg
    for fragment in KNOWN_FRAGMENTS:
        assert fragment in msg


def test_misspelt_capacity_suggests_the_close_name(catalog: Catalog) -> None:
    msg = str(unknown(catalog, "dgxa100.80g.8.nrom"))
    assert "no capacity pool 'nrom'" in msg
    assert "did you mean dgxa100.80g.8.norm?" in msg


@pytest.mark.parametrize(("name", "key"), [("dgxv100.32g.8.norm", "v100.32g"), ("dgxa100.48g.8.norm", "a100.48g")])
def test_unknown_family_names_the_family(catalog: Catalog, name: str, key: str) -> None:
    msg = str(unknown(catalog, name))
    assert f"no GPU family {key!r}" in msg
    assert "Known:" in msg
    for fragment in KNOWN_FRAGMENTS:
        assert fragment in msg


@pytest.mark.parametrize("name", ["not-an-instance", "DGXA100.80G.8.NORM", "", "a100"])
def test_garbage_name_lists_the_known_instances(catalog: Catalog, name: str) -> None:
    msg = str(unknown(catalog, name))
    assert msg.startswith(f"unknown instance type {name!r}")
    assert "Known:" in msg
    for fragment in KNOWN_FRAGMENTS:
        assert fragment in msg


def test_garbage_name_explains_the_expected_form(catalog: Catalog) -> None:
    msg = str(unknown(catalog, "not-an-instance"))
    assert "dgx<gpu>.<memory>g.<gpus>.<capacity>" in msg


# --- custom and broken catalogs ------------------------------------------------------------------


def test_custom_catalog_adds_a_family(tmp_path: Path) -> None:
    data = default_catalog_data()
    data["topologyKey"] = "network.example.com/rail-block"
    data["gpus"].append(
        {
            "family": "l40s",
            "memoryGiB": 48,
            "products": ["NVIDIA-L40S"],
            "shapes": [2, 4],
            "perGpu": {"cpu": 16, "memoryGi": 96, "shmGi": 4},
        }
    )
    cat = Catalog.load(write_catalog(tmp_path, data))
    inst = cat.get("dgxl40s.48g.4.spot")
    assert inst.gpus == 4
    assert inst.products == ("NVIDIA-L40S",)
    assert inst.gpu_memory_gib == 48
    assert (inst.cpu, inst.memory, inst.shm) == ("64", "384Gi", "16Gi")
    assert inst.node_selector == {"kubedgx.io/capacity": "spot"}
    assert inst.topology_key == "network.example.com/rail-block"
    assert inst.multi_node_nvlink is False
    assert len(cat.instances) == 69 + 5 * 3 * 3 + 2 * 3  # the shipped shapes and MIG slices, and l40s's
    # The shipped families are still there.
    assert cat.get("dgxa100.80g.8.norm").gpus == 8
    assert "dgxl40s.48g.{2,4}.{norm,spot,debug}" in cat.known()
    with pytest.raises(UnknownInstanceError, match="have 2, 4 GPUs, not 8"):
        cat.get("dgxl40s.48g.8.norm")


def test_custom_catalog_with_its_own_capacity_pool(tmp_path: Path) -> None:
    data = {
        "capacities": {"reserved": {"nodeSelector": {"pool": "reserved"}}},
        "gpus": [
            {
                "family": "h100",
                "memoryGiB": 80,
                "products": ["NVIDIA-H100-80GB-HBM3"],
                "shapes": [8],
                "perGpu": {"cpu": 20, "memoryGi": 200, "shmGi": 10},
            }
        ],
    }
    cat = Catalog.load(write_catalog(tmp_path, data))
    assert set(cat.instances) == {"dgxh100.80g.8.reserved"}
    inst = cat.get("dgxh100.80g.8.reserved")
    assert inst.node_selector == {"pool": "reserved"}
    # No gpuTolerations and no pool tolerations in this catalog.
    assert inst.tolerations == []
    # Defaults of the optional sections.
    assert inst.labels.product == "nvidia.com/gpu.product"
    assert inst.topology_key is None  # no topology preference unless the catalog names one
    with pytest.raises(UnknownInstanceError, match="no capacity pool 'norm'"):
        cat.get("dgxh100.80g.8.norm")


def test_duplicate_family_is_a_catalog_error(tmp_path: Path) -> None:
    data = default_catalog_data()
    data["gpus"].append(family_entry(data, "h100.80g"))
    path = write_catalog(tmp_path, data)
    with pytest.raises(CatalogError) as info:
        Catalog.load(path)
    assert "GPU families listed twice: h100.80g" in str(info.value)
    assert str(path) in str(info.value)


def test_same_family_with_other_memory_is_not_a_duplicate() -> None:
    data = default_catalog_data()
    # a100 appears twice already (40g and 80g); that is two families, not one listed twice.
    assert [f["family"] for f in data["gpus"]].count("a100") == 2
    assert Catalog.from_mapping(data).get("dgxa100.40g.8.norm").gpu_memory_gib == 40


def test_missing_per_gpu_is_a_catalog_error(tmp_path: Path) -> None:
    data = default_catalog_data()
    del data["gpus"][2]["perGpu"]
    path = write_catalog(tmp_path, data)
    with pytest.raises(CatalogError) as info:
        Catalog.load(path)
    msg = str(info.value)
    assert "gpus.2.perGpu" in msg
    assert "Field required" in msg
    assert str(path) in msg


@pytest.mark.parametrize("bad", ["Spot", "on-demand", "pool1"])
def test_bad_capacity_name_is_a_catalog_error(tmp_path: Path, bad: str) -> None:
    data = default_catalog_data()
    data["capacities"][bad] = {"description": "bad name"}
    with pytest.raises(CatalogError) as info:
        Catalog.load(write_catalog(tmp_path, data))
    assert f"capacity names must be lower-case letters: {bad}" in str(info.value)


def test_invalid_yaml_is_a_catalog_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("capacities: {norm: {}\ngpus: [\n", encoding="utf-8")
    with pytest.raises(CatalogError) as info:
        Catalog.load(path)
    assert "not valid YAML" in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda d: d.pop("capacities"), "capacities: Field required"),
        (lambda d: d.update(gpus=[]), "gpus: Tuple should have at least 1 item"),
        (lambda d: d["gpus"][0].update(products=[]), "gpus.0.products"),
        (lambda d: d["gpus"][0].update(family="A100"), "gpus.0.family"),
        (lambda d: d["gpus"][0]["perGpu"].update(cpu=0), "gpus.0.perGpu.cpu"),
        (lambda d: d["gpus"][0].update(unknownKey=1), "gpus.0.unknownKey"),
    ],
    ids=["no-capacities", "no-gpus", "no-products", "upper-case-family", "zero-cpu", "unknown-key"],
)
def test_other_broken_catalogs_name_the_offending_key(mutate: Any, fragment: str) -> None:
    data = copy.deepcopy(default_catalog_data())
    mutate(data)
    with pytest.raises(CatalogError) as info:
        Catalog.from_mapping(data, "my-catalog")
    msg = str(info.value)
    assert msg.startswith("my-catalog: invalid instance catalog: ")
    assert fragment in msg


def test_empty_catalog_file_is_a_catalog_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("", encoding="utf-8")
    with pytest.raises(CatalogError, match="invalid instance catalog"):
        Catalog.load(path)


@pytest.mark.parametrize("shape", [0, -1, 65])
def test_out_of_range_shape_is_a_catalog_error(shape: int) -> None:
    data = default_catalog_data()
    data["gpus"][0]["shapes"] = [shape, 8]
    with pytest.raises(CatalogError) as info:
        Catalog.from_mapping(data)
    assert "gpus.0.shapes.0" in str(info.value)


# -- the catalog fits real nodes (issue 13, item 9) -----------------------------------------------


def test_every_shipped_family_names_its_node_and_every_shape_fits_it(catalog: Catalog) -> None:
    for family in catalog.spec.gpus:
        assert family.node is not None, f"{family.key}: no node size"
        for inst in (i for i in catalog.instances.values() if i.family is family):
            assert int(inst.cpu) <= family.node.cpu, inst.name
            assert _gi(inst.memory) <= family.node.memory_gi, inst.name
            assert _gi(inst.shm) <= _gi(inst.memory), inst.name


def test_gb200_tray_fits_its_960_gb_node(catalog: Catalog) -> None:
    """The shipped GB200 tray asked for 4 x 400Gi = 1600Gi of memory on a node of 960 GB."""
    inst = catalog.get("dgxgb200.186g.4.norm")
    assert _gi(inst.memory) <= 860
    assert int(inst.cpu) <= 144


def test_a_shape_that_cannot_fit_its_node_is_refused(tmp_path: Path) -> None:
    data = default_catalog_data()
    family_entry(data, "gb200.186g")["perGpu"]["memoryGi"] = 400  # the old value
    with pytest.raises(CatalogError) as info:
        Catalog.load(write_catalog(tmp_path, data))
    message = str(info.value)
    assert "gb200.186g: the 4-GPU shape asks for 1600Gi of memory per node, but node has 860Gi allocatable" in message
    assert "lower perGpu.memoryGi to at most 215, or correct node.memoryGi" in message


def test_cpu_beyond_the_node_and_shm_beyond_memory_are_refused(tmp_path: Path) -> None:
    data = default_catalog_data()
    family_entry(data, "h100.80g")["perGpu"]["cpu"] = 30  # 240 > 224
    with pytest.raises(CatalogError, match=r"asks for 240 of cpu per node, but node has 224 allocatable"):
        Catalog.load(write_catalog(tmp_path, data))
    data = default_catalog_data()
    family_entry(data, "h100.80g")["perGpu"]["shmGi"] = 300
    with pytest.raises(CatalogError, match=r"perGpu.shmGi 300 exceeds perGpu.memoryGi 220"):
        Catalog.load(write_catalog(tmp_path, data))


def test_a_family_without_a_node_size_is_not_checked_against_one(tmp_path: Path) -> None:
    """Admins' own catalogs from before `node` existed still load."""
    data = default_catalog_data()
    del family_entry(data, "h100.80g")["node"]
    assert Catalog.load(write_catalog(tmp_path, data)).spec.gpus


# --- prices ----------------------------------------------------------------------------------------------


def test_every_shipped_instance_has_a_price_and_the_prices_say_they_are_examples(catalog: Catalog) -> None:
    pricing = catalog.spec.pricing
    assert pricing is not None
    assert (pricing.currency, pricing.examples, pricing.reference) == ("USD", True, "norm")
    for inst in catalog.instances.values():
        assert inst.currency == "USD"
        assert inst.price_per_gpu_hour is not None
        assert inst.price_per_gpu_hour > 0
        if inst.mig is None:
            assert inst.price_per_node_hour == inst.price_per_gpu_hour * inst.gpus
        else:  # a slice of g compute slices is g/7 of a GPU
            assert round(inst.price_per_node_hour or 0, 10) == round(inst.price_per_gpu_hour * inst.mig.slices / 7, 10)
        norm = catalog.get(inst.name.rsplit(".", 1)[0] + ".norm").price_per_gpu_hour
        assert norm is not None
        if inst.capacity == "spot":
            assert inst.price_per_gpu_hour < norm  # what spot saves
    assert catalog.get("dgxh100.80g.8.norm").price_per_node_hour == Decimal("24.00")
    assert round(catalog.get("dgxh100.80g.mig-2g.20gb.norm").price_per_node_hour or 0, 4) == Decimal("0.8571")


def test_prices_are_decimals_whatever_the_yaml_wrote(tmp_path: Path) -> None:
    data = default_catalog_data()
    data["pricing"]["perGpuHour"]["h100.80g"] = {"norm": 3.1, "spot": "1.2345", "debug": 3}
    catalog = Catalog.load(write_catalog(tmp_path, data))
    assert catalog.get("dgxh100.80g.2.norm").price_per_gpu_hour == Decimal("3.1")
    assert catalog.get("dgxh100.80g.2.spot").price_per_node_hour == Decimal("2.4690")
    assert catalog.get("dgxh100.80g.1.debug").price_per_gpu_hour == Decimal("3")


def test_a_family_or_pool_left_unpriced_has_no_price_and_is_listed(tmp_path: Path) -> None:
    """A family added with the chart's catalogExtraGpus, or a pool, before anyone priced it: no price
    (never 0), and the catalog says which."""
    data = default_catalog_data()
    data["pricing"]["perGpuHour"]["h100.80g"].pop("spot")
    data["pricing"]["perGpuHour"].pop("b200.180g")
    catalog = Catalog.load(write_catalog(tmp_path, data))
    assert catalog.unpriced() == ["h100.80g.spot", "b200.180g.norm", "b200.180g.spot", "b200.180g.debug"]
    assert catalog.get("dgxh100.80g.8.spot").price_per_gpu_hour is None
    assert catalog.get("dgxh100.80g.8.norm").price_per_gpu_hour == Decimal("3.00")
    assert catalog.get("dgxb200.180g.4.debug").price_per_node_hour is None
    assert Catalog.load().unpriced() == []
    assert Catalog.load().pricing_notes() == []


def test_prices_for_what_the_catalog_lacks_are_ignored_and_named(tmp_path: Path) -> None:
    """A pool an admin removed (the chart's catalog.capacities.debug: null) keeps the shipped prices
    loadable; a typo in a family's key leaves that family unpriced, and both are said."""
    data = default_catalog_data()
    del data["capacities"]["debug"]
    data["pricing"]["perGpuHour"]["h100.80gb"] = data["pricing"]["perGpuHour"].pop("h100.80g")
    catalog = Catalog.load(write_catalog(tmp_path, data))
    assert catalog.get("dgxh100.80g.8.norm").price_per_gpu_hour is None
    assert catalog.get("dgxa100.80g.8.norm").price_per_gpu_hour == Decimal("1.80")
    unpriced, unused = catalog.pricing_notes()
    assert unpriced.startswith("the catalog's prices (pricing.perGpuHour) leave out h100.80g.norm, h100.80g.spot:")
    assert unused.startswith("pricing.perGpuHour prices a100.40g.debug, a100.80g.debug, h200.141g.debug,")
    assert "h100.80gb.norm, h100.80gb.spot, h100.80gb.debug" in unused
    assert unused.endswith(
        "which the catalog does not have (families: a100.40g, a100.80g, b200.180g, gb200.186g, "
        "h100.80g, h200.141g; capacities: norm, spot): ignored"
    )


def test_a_catalog_without_prices_counts_no_money(tmp_path: Path) -> None:
    data = default_catalog_data()
    del data["pricing"]
    inst = Catalog.load(write_catalog(tmp_path, data)).get("dgxa100.80g.8.spot")
    assert (inst.price_per_gpu_hour, inst.price_per_node_hour, inst.currency) == (None, None, None)
    assert Catalog.load(write_catalog(tmp_path, data)).unpriced() == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p.update({"reference": "ondemand"}), "pricing.reference 'ondemand' is not a capacity"),
        (lambda p: p.update({"currency": "usd"}), "pricing.currency: String should match pattern"),
        (lambda p: p["perGpuHour"]["a100.40g"].update({"norm": "-1"}), "greater than or equal to 0"),
        (lambda p: p["perGpuHour"]["a100.40g"].update({"norm": "1.23456"}), "no more than 4 decimal places"),
        (lambda p: p["perGpuHour"]["a100.40g"].update({"norm": "cheap"}), "Input should be a valid decimal"),
    ],
)
def test_a_pricing_mistake_is_refused_naming_the_key(tmp_path: Path, change: Any, message: str) -> None:
    data = default_catalog_data()
    change(data["pricing"])
    with pytest.raises(CatalogError) as caught:
        Catalog.load(write_catalog(tmp_path, data))
    assert message in str(caught.value)


def test_the_capacity_a_pod_runs_in_is_the_pool_its_node_selector_requires(catalog: Catalog) -> None:
    """A norm instance Kueue admitted on a spot flavor requires the spot pool's label: it runs, and
    is paid, as spot; nothing more specific required: the instance's own capacity."""
    assert catalog.capacity_of({}, "norm") == "norm"
    assert catalog.capacity_of({"kubedgx.io/capacity": "spot"}, "norm") == "spot"
    assert catalog.capacity_of({"kubedgx.io/capacity": "spot", "zone": "a"}, "spot") == "spot"
    assert catalog.capacity_of({"kubedgx.io/capacity": "other"}, "debug") == "debug"
    assert catalog.prices_for("a100.80g") == {
        "norm": Decimal("1.80"),
        "spot": Decimal("0.70"),
        "debug": Decimal("1.80"),
    }
    assert catalog.prices_for("no.such") == {"norm": None, "spot": None, "debug": None}
