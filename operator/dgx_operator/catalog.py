"""Instance types: what ``dgxa100.80g.8.norm`` means on this cluster.

The catalog is data (``catalog.yaml``, replaceable by the chart's ConfigMap) because clusters
differ in their GPU label values, spot pools and topology labels; the code only parses names
and expands families x shapes x capacities into :class:`Instance` records.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from dgx_api import manifests

NAME_RE = re.compile(
    r"^dgx(?P<family>[a-z0-9]+)\.(?P<memory>[0-9]+)g\."
    r"(?:(?P<gpus>[0-9]+)|mig-(?P<mig>[1-7]g\.[0-9]+gb(?:\.me)?))\.(?P<capacity>[a-z]+)$"
)
#: A MIG profile as the NVIDIA device plugin names its resource (mixed strategy): ``1g.10gb``,
#: ``1g.10gb.me`` for the ``+me`` variant (``nvidia.com/mig-1g.10gb.me``).
MIG_PROFILE_PATTERN = r"^[1-7]g\.[0-9]+gb(\.me)?$"
#: A GPU's compute slices: a ``<g>g`` profile has ``g`` of them.
MIG_SLICES = 7
#: The extended resource a whole GPU is (the device plugin's).
WHOLE_GPU_RESOURCE = "nvidia.com/gpu"


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class TolerationSpec(_Model):
    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None

    def manifest(self) -> dict[str, str]:
        return self.model_dump(by_alias=True, exclude_none=True)


class CapacitySpec(_Model):
    description: str = ""
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[TolerationSpec, ...] = ()


class PerGpu(_Model):
    cpu: int = Field(ge=1)
    memory_gi: int = Field(ge=1)
    shm_gi: int = Field(ge=1)


class NodeSize(_Model):
    """What the node model named in ``description`` has allocatable for pods (after the kubelet's and
    the system's reservations): a whole node's requests must fit it. ``gpus``: the GPUs of one node
    (default: the family's largest shape), what a whole-node worker asks and the share a smaller
    shape's requests are computed from."""

    cpu: int = Field(ge=1)
    memory_gi: int = Field(ge=1)
    gpus: int | None = Field(default=None, ge=1, le=64)


class MigProfile(_Model):
    """A MIG slice this cluster's nodes of the family offer (the NVIDIA GPU operator's mixed
    strategy, geometry from the node's ``nvidia.com/mig.config``): a shape of its own."""

    profile: str = Field(pattern=MIG_PROFILE_PATTERN)
    memory_gi_b: int = Field(ge=1, alias="memoryGiB")

    @property
    def slices(self) -> int:
        """Its compute slices, of :data:`MIG_SLICES` (the ``g`` of ``1g.10gb``)."""
        return int(self.profile.split("g.", 1)[0])


class GpuFamily(_Model):
    family: str = Field(pattern=r"^[a-z0-9]+$")
    memory_gi_b: int = Field(ge=1, alias="memoryGiB")
    description: str = ""
    products: tuple[str, ...] = Field(min_length=1)
    shapes: tuple[Annotated[int, Field(ge=1, le=64)], ...] = Field(min_length=1)
    per_gpu: PerGpu
    multi_node_nvlink: bool = False
    nvlink_domain_nodes: int | None = Field(default=None, ge=1)
    node: NodeSize | None = None
    #: MIG slices the family's nodes offer (mixed strategy only); none: no MIG shapes.
    mig: tuple[MigProfile, ...] = ()

    @model_validator(mode="after")
    def _fits_the_node(self) -> GpuFamily:
        """A shape whose requests exceed the node never schedules: the job would wait Pending for
        ever (the shipped GB200 tray asked for 1600Gi on a node of about 860Gi allocatable)."""
        per = self.per_gpu
        if per.shm_gi > per.memory_gi:
            raise ValueError(
                f"perGpu.shmGi {per.shm_gi} exceeds perGpu.memoryGi {per.memory_gi}: /dev/shm is memory of the "
                "worker (it counts against its limit)"
            )
        profiles = [m.profile for m in self.mig]
        twice = sorted({p for p in profiles if profiles.count(p) > 1})
        if twice:
            raise ValueError(f"{self.key}: MIG profiles listed twice: {', '.join(twice)}")
        too_big = [m.profile for m in self.mig if m.memory_gi_b > self.memory_gi_b]
        if too_big:
            raise ValueError(
                f"{self.key}: MIG profiles {', '.join(too_big)} have more memory than the GPU's {self.memory_gi_b} GiB"
            )
        if self.node is None:
            return self
        gpus = self.node_gpus
        wider = [s for s in self.shapes if s > gpus]
        if wider:
            raise ValueError(
                f"{self.key}: shapes {', '.join(map(str, wider))} have more GPUs than node.gpus {gpus}: a worker "
                "never spans nodes; drop those shapes or correct node.gpus"
            )
        for what, asked, has, key in (
            ("cpu", per.cpu * gpus, self.node.cpu, "cpu"),
            ("memory", per.memory_gi * gpus, self.node.memory_gi, "memoryGi"),
        ):
            if asked > has:
                unit = "Gi" if what == "memory" else ""
                raise ValueError(
                    f"{self.key}: the {gpus}-GPU shape asks for {asked}{unit} of {what} per node, but node has "
                    f"{has}{unit} allocatable: lower perGpu.{key} to at most {has // gpus}, or correct node.{key}"
                )
        return self

    @property
    def key(self) -> str:
        return f"{self.family}.{self.memory_gi_b}g"

    @property
    def node_gpus(self) -> int:
        """The GPUs of one node of the family: ``node.gpus``, else its largest shape."""
        if self.node is not None and self.node.gpus is not None:
            return self.node.gpus
        return max(self.shapes)

    def requests(self, gpus: int, slices: int | None = None) -> tuple[int, int, int]:
        """CPU, memory GiB and /dev/shm GiB of a worker of ``gpus`` GPUs: that many GPUs' share of the
        node (``perGpu`` each), so workers of any sizes fit a node together as their GPUs do. A MIG
        slice of ``slices`` compute slices asks that many sevenths of one GPU's share (rounded
        down, at least 1): seven 1g slices of a GPU never ask more than the GPU's share."""
        per = self.per_gpu
        if slices is None:
            return per.cpu * gpus, per.memory_gi * gpus, per.shm_gi * gpus
        return (
            max(1, per.cpu * slices // MIG_SLICES),
            max(1, per.memory_gi * slices // MIG_SLICES),
            max(1, per.shm_gi * slices // MIG_SLICES),
        )


class Labels(_Model):
    product: str = "nvidia.com/gpu.product"
    count: str = "nvidia.com/gpu.count"
    clique: str = "nvidia.com/gpu.clique"
    #: GPU Feature Discovery's MIG strategy label: MIG shapes need ``mixed``, the only strategy that
    #: advertises slices as resources of their own (``nvidia.com/mig-<profile>``).
    mig_strategy: str = "nvidia.com/mig.strategy"


#: A price per GPU-hour: a decimal (a string in the YAML, "3.90", so that no float rounds it), at
#: most 4 decimal places, never negative.
Price = Annotated[Decimal, Field(ge=0, max_digits=12, decimal_places=4)]


class Pricing(_Model):
    """What a GPU-hour costs on this cluster, as its admin prices it: all-in (the node's CPU, memory,
    NVMe and network come with its GPUs), by GPU family (``h100.80g``) and capacity, in one currency.
    Spot savings are measured against the ``reference`` capacity's price. ``examples`` marks prices
    that are not the cluster's own (the shipped ones): whatever shows a price says so while it is
    true."""

    currency: str = Field(pattern=r"^[A-Z]{3}$", description="ISO 4217 code, e.g. USD or EUR")
    examples: bool = False
    reference: str = "norm"
    per_gpu_hour: dict[str, dict[str, Price]]


class CatalogSpec(_Model):
    """The YAML file's shape; loading errors name the offending key."""

    labels: Labels = Field(default_factory=Labels)
    #: A node label whose value a job's workers prefer to share (a zone, a rail-optimised block); None:
    #: no such preference, the scheduler's cheapest placement (docs/benchmarks.md, "Placement cost").
    topology_key: str | None = None
    gpu_tolerations: tuple[TolerationSpec, ...] = ()
    capacities: dict[str, CapacitySpec]
    gpus: tuple[GpuFamily, ...] = Field(min_length=1)
    #: None: GPU-hours are counted, money is not.
    pricing: Pricing | None = None

    @model_validator(mode="after")
    def _unique_families(self) -> CatalogSpec:
        keys = [g.key for g in self.gpus]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ValueError(f"GPU families listed twice: {', '.join(dupes)}")
        bad = [c for c in self.capacities if not re.fullmatch(r"[a-z]+", c)]
        if bad:
            raise ValueError(f"capacity names must be lower-case letters: {', '.join(bad)}")
        return self

    @model_validator(mode="after")
    def _a_reference_that_exists(self) -> CatalogSpec:
        """Spot savings need the price of a capacity the catalog has. Prices for families or pools it
        does not have (a pool an admin removed, ``catalog.capacities.debug: null``, a typo) refuse
        nothing: :meth:`Catalog.pricing_notes` names them, and the operator logs them at start."""
        pricing = self.pricing
        if pricing is None:
            return self
        if pricing.reference not in self.capacities:
            raise ValueError(
                f"pricing.reference {pricing.reference!r} is not a capacity (capacities: {', '.join(self.capacities)})"
            )
        return self


@dataclass(frozen=True)
class Instance:
    """One instance type, resolved: everything a builder needs to place a worker."""

    name: str
    family: GpuFamily
    gpus: int
    capacity: str
    capacity_spec: CapacitySpec
    labels: Labels
    topology_key: str | None
    gpu_tolerations: tuple[TolerationSpec, ...] = field(default=())
    #: What one of its GPUs costs an hour, in the catalog's ``currency``; None: the catalog has no prices.
    price_per_gpu_hour: Decimal | None = None
    currency: str | None = None
    #: A MIG shape's slice (then ``gpus`` is 1: one device, one process); None: whole GPUs.
    mig: MigProfile | None = None

    @property
    def mig_profile(self) -> str | None:
        return None if self.mig is None else self.mig.profile

    @property
    def slices(self) -> int | None:
        """A MIG slice's compute slices (of :data:`MIG_SLICES`); None for whole GPUs."""
        return None if self.mig is None else self.mig.slices

    @property
    def node_gpus(self) -> int:
        return self.family.node_gpus

    @property
    def whole_node(self) -> bool:
        """Its worker takes every GPU of its node."""
        return self.mig is None and self.gpus >= self.node_gpus

    @property
    def gpu_resource(self) -> str:
        """The extended resource its worker asks: ``nvidia.com/gpu``, or the slice's own."""
        return WHOLE_GPU_RESOURCE if self.mig is None else f"nvidia.com/mig-{self.mig.profile}"

    @property
    def gpu_share(self) -> Decimal:
        """What one of its devices is of a GPU, for GPU-hours and money: 1, a slice g/7."""
        return Decimal(1) if self.mig is None else Decimal(self.mig.slices) / MIG_SLICES

    @property
    def price_per_node_hour(self) -> Decimal | None:
        """What one worker (``gpus`` GPUs of a node, or its slice) costs an hour."""
        return None if self.price_per_gpu_hour is None else self.price_per_gpu_hour * self.gpus * self.gpu_share

    @property
    def products(self) -> tuple[str, ...]:
        return self.family.products

    @property
    def gpu_memory_gib(self) -> int:
        """One device's memory: the GPU's, or the slice's."""
        return self.family.memory_gi_b if self.mig is None else self.mig.memory_gi_b

    @property
    def multi_node_nvlink(self) -> bool:
        return self.family.multi_node_nvlink

    def requests(self, gpus: int | None = None) -> tuple[str, str, str]:
        """CPU, memory and /dev/shm of a worker with ``gpus`` of its GPUs (default: the shape's), as
        quantities: the GPUs' share of the node (:meth:`GpuFamily.requests`)."""
        cpu, memory, shm = self.family.requests(self.gpus if gpus is None else gpus, self.slices)
        return str(cpu), f"{memory}Gi", f"{shm}Gi"

    @property
    def cpu(self) -> str:
        return self.requests()[0]

    @property
    def memory(self) -> str:
        return self.requests()[1]

    @property
    def shm(self) -> str:
        return self.requests()[2]

    @property
    def node_selector(self) -> dict[str, str]:
        return dict(self.capacity_spec.node_selector)

    @property
    def tolerations(self) -> list[dict[str, str]]:
        return [t.manifest() for t in (*self.gpu_tolerations, *self.capacity_spec.tolerations)]


class CatalogError(ValueError):
    """The catalog file itself is unusable."""


class UnknownInstanceError(LookupError):
    """An instance name this catalog does not define; the message lists what it does define."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name
        self.message = message

    def __str__(self) -> str:
        return self.message


class Catalog:
    """Instance types by name, from a catalog spec."""

    def __init__(self, spec: CatalogSpec) -> None:
        self.spec = spec

    @classmethod
    def from_mapping(cls, data: Any, source: str = "<catalog>") -> Catalog:
        try:
            return cls(CatalogSpec.model_validate(data))
        except ValidationError as exc:
            lines = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()
            )
            raise CatalogError(f"{source}: invalid instance catalog: {lines}") from exc

    @classmethod
    def load(cls, path: str | Path | None = None) -> Catalog:
        """The catalog at ``path``, or the default one shipped with kubedgx."""
        if path is None:
            text = resources.files("dgx_operator").joinpath("catalog.yaml").read_bytes()
            source = "default catalog"
        else:
            text = Path(path).read_bytes()
            source = str(path)
        try:
            data = manifests.load(text)
        except manifests.ManifestError as exc:
            raise CatalogError(f"{source}: {exc}") from exc
        return cls.from_mapping(data, source)

    @cached_property
    def instances(self) -> dict[str, Instance]:
        out: dict[str, Instance] = {}
        pricing = self.spec.pricing
        for fam in self.spec.gpus:
            shapes: list[tuple[str, int, MigProfile | None]] = [(str(g), g, None) for g in fam.shapes]
            shapes += [(f"mig-{m.profile}", 1, m) for m in fam.mig]
            for shape, gpus, mig in shapes:
                for capacity, cap in self.spec.capacities.items():
                    name = f"dgx{fam.key}.{shape}.{capacity}"
                    price = pricing.per_gpu_hour.get(fam.key, {}).get(capacity) if pricing is not None else None
                    out[name] = Instance(
                        name=name,
                        family=fam,
                        gpus=gpus,
                        capacity=capacity,
                        capacity_spec=cap,
                        labels=self.spec.labels,
                        topology_key=self.spec.topology_key,
                        gpu_tolerations=self.spec.gpu_tolerations,
                        price_per_gpu_hour=price,
                        currency=pricing.currency if pricing is not None else None,
                        mig=mig,
                    )
        return out

    def unpriced(self) -> list[str]:
        """``<family>.<capacity>`` pairs the catalog's prices leave out (none without prices at all:
        then no instance has a price, and nothing is counted in money)."""
        pricing = self.spec.pricing
        if pricing is None:
            return []
        table = pricing.per_gpu_hour
        return [f"{g.key}.{c}" for g in self.spec.gpus for c in self.spec.capacities if c not in table.get(g.key, {})]

    def pricing_notes(self) -> list[str]:
        """What an admin should know of the prices: the instances they leave out (no price is never a
        price of 0) and the prices that apply to nothing (a removed pool, a typo in a family's key)."""
        pricing = self.spec.pricing
        if pricing is None:
            return []
        notes = []
        unpriced = self.unpriced()
        if unpriced:
            notes.append(
                f"the catalog's prices (pricing.perGpuHour) leave out {', '.join(unpriced)}: those instances have "
                "no price, and what they run is counted in GPU-hours only"
            )
        families = {g.key for g in self.spec.gpus}
        unused = [
            f"{family}.{capacity}"
            for family, prices in pricing.per_gpu_hour.items()
            for capacity in prices
            if family not in families or capacity not in self.spec.capacities
        ]
        if unused:
            notes.append(
                f"pricing.perGpuHour prices {', '.join(unused)}, which the catalog does not have (families: "
                f"{', '.join(sorted(families))}; capacities: {', '.join(self.spec.capacities)}): ignored"
            )
        return notes

    def prices_for(self, family: str) -> dict[str, Decimal | None]:
        """Every capacity's price per GPU-hour for one GPU family (None: unpriced, or no prices)."""
        pricing = self.spec.pricing
        table = pricing.per_gpu_hour.get(family, {}) if pricing is not None else {}
        return {capacity: table.get(capacity) for capacity in self.spec.capacities}

    def capacity_of(self, node_selector: Mapping[str, str], default: str) -> str:
        """The capacity pool a pod with this ``node_selector`` runs in: the capacity whose node labels
        it requires, the most specific one when several match (a ``*.norm`` instance that Kueue
        admitted on a spot flavor requires the spot pool's label, and runs, and is paid, as spot);
        ``default`` (the instance's own) when none does."""
        best, size = default, len(self.spec.capacities[default].node_selector) if default in self.spec.capacities else 0
        for name, cap in self.spec.capacities.items():
            labels = cap.node_selector
            if len(labels) > size and all(node_selector.get(k) == v for k, v in labels.items()):
                best, size = name, len(labels)
        return best

    def known(self) -> str:
        """Every known name in a compact brace form: dgxa100.80g.{1,2,4,8}.{norm,spot,debug}, ..."""
        caps = ",".join(self.spec.capacities)
        return ", ".join(
            f"dgx{fam.key}.{{{','.join([*(str(s) for s in fam.shapes), *(f'mig-{m.profile}' for m in fam.mig)])}}}"
            f".{{{caps}}}"
            for fam in self.spec.gpus
        )

    def get(self, name: str) -> Instance:
        """The instance called ``name``; :class:`UnknownInstanceError` says why not and what exists."""
        found = self.instances.get(name)
        if found is not None:
            return found
        raise UnknownInstanceError(name, self._explain_unknown(name))

    def _explain_unknown(self, name: str) -> str:
        match = NAME_RE.match(name)
        families = {fam.key: fam for fam in self.spec.gpus}
        suggest = True
        if match is None:
            reason = (
                "expected dgx<gpu>.<memory>g.<gpus>.<capacity>, e.g. dgxa100.80g.8.norm, or "
                "dgx<gpu>.<memory>g.mig-<profile>.<capacity>, e.g. dgxa100.80g.mig-1g.10gb.debug"
            )
        else:
            key = f"{match['family']}.{match['memory']}g"
            fam = families.get(key)
            if match["capacity"] not in self.spec.capacities:
                reason = f"no capacity pool {match['capacity']!r} (pools: {', '.join(self.spec.capacities)})"
            elif fam is None:
                reason = f"no GPU family {key!r} in the catalog"
            elif match["mig"] is not None:
                offered = ", ".join(m.profile for m in fam.mig)
                reason = (
                    f"dgx{key} nodes offer MIG slices {offered}, not {match['mig']}"
                    if offered
                    else f"dgx{key} nodes offer no MIG slices in this catalog (its gpus[].mig lists none)"
                )
                suggest = False
            else:
                shapes = ", ".join(str(s) for s in fam.shapes)
                reason = f"dgx{key} nodes have {shapes} GPUs, not {match['gpus']}"
                suggest = False  # the closest name would only differ in the GPU count the user chose
        close = difflib.get_close_matches(name, list(self.instances), n=1, cutoff=0.8) if suggest else []
        hint = f" (did you mean {close[0]}?)" if close else ""
        return f"unknown instance type {name!r}: {reason}{hint}. Known: {self.known()}"
