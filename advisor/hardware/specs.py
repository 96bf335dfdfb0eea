"""Typed, frozen records of the hardware and price database, in SI units.

Values come from hwdb/*.yaml through `advisor.hardware.loader`; nothing here reads files.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field, replace
from typing import Any

PEAK_MODES: tuple[str, ...] = (
    "fp64",
    "fp32",
    "fp16",
    "tf32_tensor",
    "fp16_tensor",
    "fp16_tensor_fp16_acc",
    "bf16_tensor",
    "fp8_tensor",
)
"""Math modes with a peak figure. `fp64`/`fp32`/`fp16` are vector (non-tensor) units. Tensor modes
are dense (never 2:4-sparse). `fp16_tensor` and `bf16_tensor` accumulate in fp32, as autocast does;
`fp16_tensor_fp16_acc` is the fp16-accumulate rate, twice as fast on GeForce cards."""


@dataclass(frozen=True)
class PeakThroughput:
    """Peak dense throughput per math mode in FLOP/s; None where the device has no such unit."""

    fp64: float | None = None
    fp32: float | None = None
    fp16: float | None = None
    tf32_tensor: float | None = None
    fp16_tensor: float | None = None
    fp16_tensor_fp16_acc: float | None = None
    bf16_tensor: float | None = None
    fp8_tensor: float | None = None

    def get(self, mode: str) -> float | None:
        """Peak FLOP/s of `mode` (one of PEAK_MODES)."""
        assert mode in PEAK_MODES, mode
        return getattr(self, mode)

    def present(self) -> dict[str, float]:
        """The modes that have a figure, mode -> FLOP/s."""
        return {mode: value for mode in PEAK_MODES if (value := getattr(self, mode)) is not None}

    def best_low_precision_tensor(self) -> float | None:
        """The highest fp16/bf16 tensor rate with fp32 accumulation, FLOP/s (what autocast gets)."""
        rates = [r for r in (self.bf16_tensor, self.fp16_tensor) if r is not None]
        return max(rates) if rates else None

    def to_dict(self) -> dict[str, float | None]:
        return {f"{mode}_flops": getattr(self, mode) for mode in PEAK_MODES}


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model. Memory in bytes, bandwidth in bytes/s, clocks in Hz, peaks in FLOP/s."""

    id: str
    name: str
    vendor: str
    segment: str
    architecture: str | None
    chip: str | None
    compute_capability: str | None
    memory_bytes: int
    memory_type: str | None
    bandwidth_bytes_per_s: float
    sm_count: int | None
    boost_clock_hz: float | None
    sustained_clock_hz: float | None
    """The SM clock measured under load, where a source gives one: GeForce cards' GPU Boost runs above the
    boost clock their datasheet peaks assume while power and temperature allow."""
    l2_cache_bytes: int | None
    tdp_watts: float | None
    form_factor: str | None
    pcie_gen: int | None
    pcie_lanes: int | None
    nvlink_bytes_per_s: float | None
    has_nvlink: bool | None
    launch_date: dt.date | None
    launch_msrp_usd: float | None
    street_price_usd: float | None
    street_price_date: dt.date | None
    peaks: PeakThroughput
    sources: tuple[str, ...]
    derived: tuple[tuple[str, str], ...]
    unverified: tuple[str, ...]
    aliases: tuple[str, ...]
    notes: str | None
    origin: str
    """The file this entry was read from."""
    host_link: str | None = None
    """A HostLink id where the GPU reaches its host by another link than PCIe (NVLink-C2C)."""

    @property
    def clock_ratio(self) -> float:
        """The compute rate a loaded card reaches over its datasheet peaks: sustained / boost clock (1 where
        either is unknown)."""
        if not self.sustained_clock_hz or not self.boost_clock_hz:
            return 1.0
        return self.sustained_clock_hz / self.boost_clock_hz

    @property
    def purchase_usd(self) -> float | None:
        """Price to buy one card: the street price where known, else the launch MSRP."""
        return self.street_price_usd if self.street_price_usd is not None else self.launch_msrp_usd

    def is_unverified(self, figure: str) -> bool:
        """True when `figure` (a YAML key such as 'bandwidth_gbps' or 'peak_tflops.fp32') has no
        source read in this project (source grade X)."""
        return figure in self.unverified

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "vendor": self.vendor,
            "segment": self.segment,
            "architecture": self.architecture,
            "chip": self.chip,
            "compute_capability": self.compute_capability,
            "memory_bytes": self.memory_bytes,
            "memory_type": self.memory_type,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "sm_count": self.sm_count,
            "boost_clock_hz": self.boost_clock_hz,
            "sustained_clock_hz": self.sustained_clock_hz,
            "l2_cache_bytes": self.l2_cache_bytes,
            "tdp_watts": self.tdp_watts,
            "form_factor": self.form_factor,
            "pcie_gen": self.pcie_gen,
            "pcie_lanes": self.pcie_lanes,
            "host_link": self.host_link,
            "nvlink_bytes_per_s": self.nvlink_bytes_per_s,
            "has_nvlink": self.has_nvlink,
            "launch_date": self.launch_date.isoformat() if self.launch_date else None,
            "launch_msrp_usd": self.launch_msrp_usd,
            "street_price_usd": self.street_price_usd,
            "street_price_date": self.street_price_date.isoformat() if self.street_price_date else None,
            "purchase_usd": self.purchase_usd,
            "peak": self.peaks.to_dict(),
            "sources": list(self.sources),
            "derived": dict(self.derived),
            "unverified": list(self.unverified),
            "aliases": list(self.aliases),
            "notes": self.notes,
        }


@dataclass(frozen=True)
class CloudOffer:
    """One way to rent a GPU: prices are per GPU-hour in USD."""

    gpu_id: str
    provider: str
    instance: str
    gpus_per_instance: int
    usd_per_gpu_hour: float
    spot_usd_per_gpu_hour: float | None
    region: str
    gpu_only: bool
    """True when the price covers the accelerator alone (the host VM is billed separately)."""
    source: str
    date: dt.date
    notes: str | None
    origin: str
    host_cpu: str | None = None
    """The instance's CPU (a HostCPU id), where documented."""
    vcpus: int | None = None
    """The whole instance's vCPUs (hardware threads), where the source lists them; None for a GPU sold
    alone (the host VM is chosen separately)."""
    host_memory_gb: float | None = None
    """The whole instance's host memory, GB, where listed."""
    interconnect: str | None = None
    """The Interconnect id between the instance's GPUs, where the provider documents it (else the GPU's
    own: advisor.parallel.topology)."""
    network: str | None = None
    """The Interconnect id between instances of this type (None: not known, one instance at most)."""

    @property
    def vcpus_per_gpu(self) -> float | None:
        """vCPUs per GPU of the instance (None: not listed)."""
        return None if self.vcpus is None else self.vcpus / self.gpus_per_instance

    @property
    def instance_usd_per_hour(self) -> float:
        """On-demand price of the whole instance, USD/hour."""
        return self.usd_per_gpu_hour * self.gpus_per_instance

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_id": self.gpu_id,
            "provider": self.provider,
            "instance": self.instance,
            "gpus_per_instance": self.gpus_per_instance,
            "usd_per_gpu_hour": self.usd_per_gpu_hour,
            "spot_usd_per_gpu_hour": self.spot_usd_per_gpu_hour,
            "instance_usd_per_hour": round(self.instance_usd_per_hour, 4),
            "region": self.region,
            "gpu_only": self.gpu_only,
            "source": self.source,
            "date": self.date.isoformat(),
            "notes": self.notes,
            "vcpus": self.vcpus,
            "host_memory_gb": self.host_memory_gb,
            "host_cpu": self.host_cpu,
        }


@dataclass(frozen=True)
class Source:
    """Where figures come from. Grade A (vendor) to D (low confidence); X: not read, to verify."""

    id: str
    grade: str
    title: str
    url: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Override:
    """A shipped entry replaced by a user's entry with the same key."""

    kind: str
    key: str
    replaced_origin: str
    new_origin: str

    def message(self) -> str:
        return f"{self.kind} '{self.key}' from {self.new_origin} replaces the one in {self.replaced_origin}"


@dataclass(frozen=True)
class CostDefaults:
    """Defaults of the cost model."""

    electricity_usd_per_kwh: float
    electricity_source: str


@dataclass(frozen=True)
class HostCPU:
    """A CPU that hosts GPUs (a cloud instance's, or this machine's), with its single-thread speed as a
    published score (the higher, the faster; only ratios between entries are used)."""

    id: str
    name: str
    microarchitecture: str
    single_thread_score: float
    sources: tuple[str, ...]
    match: tuple[str, ...] = ()
    """Substrings of a CPU model name (/proc/cpuinfo, lscpu) that identify this CPU on this machine."""
    cpuid_family: str | None = None
    """"vendor/family" (AuthenticAMD/26) that identifies its microarchitecture where a virtual machine
    hides the model name ("AMD EPYC"): a stand-in for that generation."""
    pcie_gen: int | None = None
    """The PCIe generation of its root ports: a GPU of a later generation copies at this one's rate."""
    notes: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class HostLink:
    """How fast one GPU alone copies a pinned batch from its host's memory: measured over a link of
    `lanes` PCIe lanes of generation `pcie_gen`, or over another link (NVLink-C2C: both None)."""

    id: str
    pcie_gen: int | None
    lanes: int | None
    host_to_device_bytes_per_s: float
    sources: tuple[str, ...]
    notes: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Interconnect:
    """A link between GPUs as NCCL's collectives use it: the all-reduce bus bandwidth measured at some
    message sizes (bytes, bytes/s), sorted by size; `half_bandwidth_bytes` fixes the curve's shape where
    too few sizes were measured (advisor.parallel.collectives)."""

    id: str
    name: str
    scope: str
    """"node": between the GPUs of one instance; "network": between instances."""
    busbw_points: tuple[tuple[float, float], ...]
    half_bandwidth_bytes: float | None
    sources: tuple[str, ...]
    notes: str | None = None
    communicator_bytes: int | None = None
    """Device memory NCCL's communicator takes on each GPU over this link (its channels' FIFO buffers,
    outside torch's allocator), where measured."""
    nccl_channels: int | None = None
    """Thread blocks (one SM each, for the collective's length) NCCL's collectives run with over this link,
    where measured (estimate.parallel.contention_share)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MemoryOverhead:
    """Device memory a training process needs beyond its tensors on one GPU architecture, bytes:
    the CUDA context (outside torch's allocator) and the cuBLAS workspace (inside it)."""

    architecture: str
    cuda_context_bytes: int
    cublas_workspace_bytes: int
    sources: tuple[str, ...]
    notes: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class HardwareDB:
    """The whole database, loaded once. Look-ups raise UserError with suggestions."""

    gpus: tuple[GPUSpec, ...]
    offers: tuple[CloudOffer, ...]
    sources: tuple[Source, ...]
    defaults: CostDefaults
    overrides: tuple[Override, ...] = ()
    directories: tuple[str, ...] = ()
    memory_overheads: tuple[MemoryOverhead, ...] = ()
    host_cpus: tuple[HostCPU, ...] = ()
    host_links: tuple[HostLink, ...] = ()
    interconnects: tuple[Interconnect, ...] = ()
    _by_id: dict[str, GPUSpec] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_id.update({gpu.id: gpu for gpu in self.gpus})
        assert len(self._by_id) == len(self.gpus), "duplicate GPU ids survived validation"

    def ids(self) -> list[str]:
        return [gpu.id for gpu in self.gpus]

    def host_cpu(self, cpu_id: str | None) -> HostCPU | None:
        """The host CPU `cpu_id` (an offer's host_cpu), or None."""
        return next((cpu for cpu in self.host_cpus if cpu.id == cpu_id), None)

    def host_cpu_named(self, cpu_id: str) -> HostCPU:
        """The host CPU `cpu_id`; a UserError with the closest ids when there is none."""
        from advisor.errors import UserError, did_you_mean

        found = self.host_cpu(cpu_id)
        if found is None:
            ids = [cpu.id for cpu in self.host_cpus]
            raise UserError(f"unknown host CPU '{cpu_id}'{did_you_mean(cpu_id, ids)}; the ids are those of "
                            "hwdb/host-cpus.yaml")
        return found

    def memory_overhead(self, gpu: GPUSpec) -> MemoryOverhead:
        """The memory overhead of `gpu`'s architecture, or the `default` entry."""
        by_architecture = {o.architecture: o for o in self.memory_overheads}
        found = by_architecture.get(gpu.architecture or "") or by_architecture.get("default")
        assert found is not None, "the database has no 'default' memory overhead (hwdb/memory-overhead.yaml)"
        return found

    def memory_overhead_default(self) -> MemoryOverhead:
        """The `default` memory overhead (a GPU of no known architecture)."""
        found = next((o for o in self.memory_overheads if o.architecture == "default"), None)
        assert found is not None, "the database has no 'default' memory overhead (hwdb/memory-overhead.yaml)"
        return found

    def has(self, gpu_id: str) -> bool:
        return gpu_id in self._by_id

    def gpu(self, gpu_id: str) -> GPUSpec:
        """The GPU with this id; UserError naming the closest ids when there is none."""
        from advisor.errors import UserError, did_you_mean

        try:
            return self._by_id[gpu_id]
        except KeyError:
            raise UserError(
                f"unknown GPU id '{gpu_id}'{did_you_mean(gpu_id, self.ids())}; `advisor gpus` lists them"
            ) from None

    def providers(self) -> list[str]:
        return sorted({offer.provider for offer in self.offers})

    def check_provider(self, provider: str) -> None:
        """UserError naming the closest providers when no offer comes from `provider`."""
        from advisor.errors import UserError, did_you_mean

        if provider not in self.providers():
            raise UserError(f"unknown provider '{provider}'{did_you_mean(provider, self.providers())}; "
                            f"known: {', '.join(self.providers())}")

    def with_offers_from(self, provider: str | None) -> HardwareDB:
        """The database with only `provider`'s cloud offers (all of them for None)."""
        if provider is None:
            return self
        self.check_provider(provider)
        return replace(self, offers=tuple(o for o in self.offers if o.provider == provider), _by_id={})

    def offers_for(self, gpu_id: str, provider: str | None = None) -> list[CloudOffer]:
        """Offers for a GPU, cheapest on-demand first, optionally from one provider."""
        found = [o for o in self.offers if o.gpu_id == gpu_id and (provider is None or o.provider == provider)]
        return sorted(found, key=lambda o: (o.usd_per_gpu_hour, o.provider))

    def cheapest_offer(self, gpu_id: str, provider: str | None = None, spot: bool = False) -> CloudOffer | None:
        """The offer with the lowest on-demand (or spot) price per GPU-hour, or None."""
        offers = self.offers_for(gpu_id, provider)
        if spot:
            offers = [o for o in offers if o.spot_usd_per_gpu_hour is not None]
            offers.sort(key=lambda o: (o.spot_usd_per_gpu_hour, o.provider))
        return offers[0] if offers else None

    def source(self, source_id: str) -> Source:
        return next(s for s in self.sources if s.id == source_id)
