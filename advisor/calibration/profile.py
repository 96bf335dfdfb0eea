"""A calibration profile: what a device achieved per op and dtype, fitted curves with their residuals,
per-op overheads, and the fingerprint of the machine and software it was measured on.

Measured profiles come from `advisor calibrate` (advisor.calibration.runner) and live in the user's
cache; shipped reference profiles (calibration/reference/*.yaml) are either measured on a real GPU or
documented defaults with published sources, marked `status: default`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from advisor.calibration.checked import (Fields, MalformedProfile, by_name, each, integer, number, optional_text,
                                         shown)
from advisor.calibration.curves import Fit
from advisor.calibration.peaks import DevicePeaks

STATUSES = ("measured", "default")
AXES = ("flops", "bytes")
PACKED_MIN_ROWS = 2
"""A GEMM with fewer rows (M) is a matrix-vector product, which BLAS libraries run without packing."""
REQUIRED_SERIES = ("gemm/fp32", "copy/fp32")
"""Every measured profile has these (the suite's first GEMM and copy sizes always run), and estimates
fall back to them for ops and dtypes a profile lacks."""


@dataclass(frozen=True)
class Fingerprint:
    """What a measured profile is only valid for: the device, its machine and the software stack."""

    device: str
    """"cpu" or "cuda:N"."""
    device_name: str
    cpu_model: str
    cpu_cores: int
    """Cores this process may use."""
    torch_version: str
    torch_threads: int
    cuda_version: str | None
    gpu_driver: str | None
    suite_digest: str

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: object) -> Fingerprint:
        """A fingerprint from its to_dict() form: every field, each of its type."""
        entry = Fields(data, [f.name for f in fields(cls)])
        return cls(
            device=entry.text("device"),
            device_name=entry.text("device_name"),
            cpu_model=entry.text("cpu_model"),
            cpu_cores=entry.integer("cpu_cores", minimum=1),
            torch_version=entry.text("torch_version"),
            torch_threads=entry.integer("torch_threads", minimum=1),
            cuda_version=entry.read("cuda_version", optional_text),
            gpu_driver=entry.read("gpu_driver", optional_text),
            suite_digest=entry.text("suite_digest"),
        )

    def differences(self, other: Fingerprint) -> list[str]:
        """"torch_version: 2.13.0 -> 2.14.1" for every field that differs."""
        return [
            f"{f.name}: {getattr(other, f.name)} -> {getattr(self, f.name)}"
            for f in fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]


@dataclass(frozen=True)
class Measurement:
    """One timed case: median seconds per call, and its FLOPs and bytes by the cost registry."""

    label: str
    flops: float
    bytes: int
    seconds: float
    samples: int
    spread: float
    """Interquartile range over median of the samples."""
    fraction: float
    """Achieved fraction of the series' reference: peak bandwidth for memory ops; for compute ops the
    roofline min(peak FLOP/s, intensity x sustained bandwidth)."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: object) -> Measurement:
        entry = Fields(data, [f.name for f in fields(cls)])
        return cls(entry.text("label"), entry.number("flops"), entry.integer("bytes"),
                   entry.number("seconds", positive=True), entry.integer("samples", minimum=1),
                   entry.number("spread"), entry.number("fraction"))


@dataclass(frozen=True)
class Contention:
    """What competed with a measurement (a series, or the whole run) for the device, issue #20.

    CPU time is read from /proc/stat (all CPUs) less this process's own CPU time: what other programs
    ran while we measured. A reference kernel (a fixed small GEMM) timed before each series tells a
    host slowed down by what /proc/stat does not show (a neighbour VM, thermal or power limits)."""

    seconds: float
    """Wall time the figures cover."""
    others_cores: float | None
    """CPU time other programs used, over `seconds`: 1.0 is one CPU kept busy (None: not known, no
    /proc/stat)."""
    steal_cores: float | None
    """CPU time the hypervisor gave other guests (steal), likewise."""
    reference_slowdown: float | None = None
    """The reference kernel's time around this series (the faster of before and after) over the run's
    baseline, the lower quartile of its series' reference times (1.0: as fast as the run typically was)."""
    attempts: int = 1
    """How many times the series was measured: a disturbed one is measured again later in the run."""

    @property
    def busy_cores(self) -> float | None:
        """CPUs taken from us: other programs plus steal (None when neither is known)."""
        if self.others_cores is None and self.steal_cores is None:
            return None
        return (self.others_cores or 0.0) + (self.steal_cores or 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: object) -> Contention:
        entry = Fields(data, ("seconds", "others_cores", "steal_cores"), ("reference_slowdown", "attempts"))
        return cls(entry.number("seconds"), entry.read("others_cores", _optional_number),
                   entry.read("steal_cores", _optional_number),
                   entry.optional("reference_slowdown", _optional_number, None),
                   entry.optional("attempts", lambda value: integer(value, minimum=1), 1))


def _optional_number(value: object) -> float | None:
    return None if value is None else number(value)


def _optional_positive(value: object) -> float | None:
    return None if value is None else number(value, positive=True)


@dataclass(frozen=True)
class Skipped:
    label: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: object) -> Skipped:
        entry = Fields(data, ("label", "reason"))
        return cls(entry.text("label"), entry.text("reason"))


@dataclass(frozen=True)
class SeriesProfile:
    """One op in one dtype: the fitted efficiency curve against its reference peak."""

    op: str
    dtype: str
    axis: str
    """"flops" (compute ops: work is FLOPs, peak is FLOP/s) or "bytes" (memory ops)."""
    peak: float
    """The reference the fractions are of: FLOP/s or bytes/s."""
    fit: Fit
    measurements: tuple[Measurement, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    sources: tuple[str, ...] = ()
    """For a documented default: where its figures come from (hwdb/sources.yaml ids)."""
    contention: Contention | None = None
    """What competed for the device while this series was measured (None: not recorded)."""
    pack_bandwidth_bytes_per_s: float | None = None
    """GEMM series on a CPU (issue #20): the rate at which the BLAS copies each matrix's second operand
    (K x N) into its packed layout before multiplying, a serial cost every call pays once and only a
    call with many rows (M) amortises: at rest on a 2-core EPYC VM a 64x1024x1024 GEMM ran at 123
    GFLOP/s where 1024x1024x1024 ran at 202. Fitted from the suite's thin cases (packing.py); None: no
    such term (GPUs, profiles measured without thin cases, or a fit it did not improve)."""

    def __post_init__(self) -> None:
        assert self.axis in AXES, self.axis
        assert self.pack_bandwidth_bytes_per_s is None or self.pack_bandwidth_bytes_per_s > 0, self

    @property
    def key(self) -> str:
        return f"{self.op}/{self.dtype}"

    def efficiency(self, work: float) -> float:
        """Fitted fraction of the reference for one call of `work` FLOPs or bytes."""
        return self.fit.curve.efficiency(work, self.peak)

    def pack_seconds(self, gemm: tuple[int, int, int, int], itemsize: int) -> float:
        """Seconds of packing the second operands of a (batch, m, n, k) GEMM of `itemsize`-byte elements:
        batch x k x n elements at the fitted pack bandwidth; 0 without one, and for a matrix-vector
        product (m = 1), which BLAS runs unpacked."""
        batch, m, n, k = gemm
        if self.pack_bandwidth_bytes_per_s is None or m < PACKED_MIN_ROWS:
            return 0.0
        return batch * k * n * itemsize / self.pack_bandwidth_bytes_per_s

    def measured(self, label: str) -> Measurement | None:
        """The measurement of the case with this label ("1024x1024x1024", "256 MiB")."""
        return next((m for m in self.measurements if m.label == label), None)

    def rate(self, measurement: Measurement) -> float:
        """Achieved FLOP/s or bytes/s of one of this series' measurements."""
        return (measurement.flops if self.axis == "flops" else measurement.bytes) / measurement.seconds

    def best_rate(self) -> float | None:
        """Highest achieved FLOP/s or bytes/s among the measurements."""
        return max((self.rate(m) for m in self.measurements), default=None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "dtype": self.dtype,
            "axis": self.axis,
            "peak": self.peak,
            "fit": self.fit.to_dict(),
            "measurements": [m.to_dict() for m in self.measurements],
            "skipped": [s.to_dict() for s in self.skipped],
            "sources": list(self.sources),
            "contention": None if self.contention is None else self.contention.to_dict(),
            "pack_bandwidth_bytes_per_s": self.pack_bandwidth_bytes_per_s,
        }

    @classmethod
    def from_dict(cls, data: object) -> SeriesProfile:
        entry = Fields(data, ("op", "dtype", "axis", "peak", "fit"), ("measurements", "skipped", "sources",
                                                                    "contention", "pack_bandwidth_bytes_per_s"))
        axis = entry.text("axis")
        if axis not in AXES:
            raise MalformedProfile("axis", f"{shown(axis)} is not one of {', '.join(AXES)}")
        return cls(
            entry.text("op"),
            entry.text("dtype"),
            axis,
            entry.number("peak", positive=True),
            entry.read("fit", Fit.from_dict),
            entry.optional("measurements", lambda value: each(value, Measurement.from_dict), ()),
            entry.optional("skipped", lambda value: each(value, Skipped.from_dict), ()),
            entry.texts("sources"),
            entry.optional("contention", Contention.from_dict, None),
            entry.optional("pack_bandwidth_bytes_per_s", _optional_positive, None),
        )


@dataclass(frozen=True)
class Conditions:
    """What the machine was doing while a profile was measured, and what its quality gates need.

    Profiles stored before the gates existed have none (`CalibrationProfile.conditions` is None): they
    load, and are assessed when used, from their measurements alone."""

    load_before: tuple[float, float, float] | None
    """os.getloadavg() (1, 5 and 15 minutes) just before the first case; None where the OS has none."""
    load_after: tuple[float, float, float] | None
    """os.getloadavg() just after the last case."""
    logical_cpus: int
    """os.cpu_count(): a load average above it means runnable processes waited for a CPU."""
    cache_bytes: float | None
    """Last-level cache (CPU) or L2 (GPU) the runner assumed: points within it may exceed DRAM bandwidth."""
    contention: Contention | None = None
    """Other programs and steal over the whole run (None: not recorded, an older profile)."""

    def to_dict(self) -> dict[str, Any]:
        return {"load_before": None if self.load_before is None else list(self.load_before),
                "load_after": None if self.load_after is None else list(self.load_after),
                "logical_cpus": self.logical_cpus, "cache_bytes": self.cache_bytes,
                "contention": None if self.contention is None else self.contention.to_dict()}

    @classmethod
    def from_dict(cls, data: object) -> Conditions:
        entry = Fields(data, ("logical_cpus",), ("load_before", "load_after", "cache_bytes", "contention"))
        return cls(entry.optional("load_before", _load, None), entry.optional("load_after", _load, None),
                   entry.integer("logical_cpus", minimum=1),
                   entry.optional("cache_bytes", lambda value: number(value, positive=True), None),
                   entry.optional("contention", Contention.from_dict, None))

    @property
    def max_load(self) -> float | None:
        """The higher 1-minute load average of before and after."""
        loads = [load[0] for load in (self.load_before, self.load_after) if load is not None]
        return max(loads) if loads else None


def _load(value: object) -> tuple[float, float, float]:
    values = each(value, number)
    if len(values) != 3:
        raise MalformedProfile("", f"expected 3 load averages (1, 5, 15 minutes), got {len(values)}")
    return (values[0], values[1], values[2])


@dataclass(frozen=True)
class CalibrationProfile:
    """Efficiencies of one device (or one GPU family, for a reference profile)."""

    device: str
    """"cpu", "cuda:0", or the reference profile's id ("hopper")."""
    device_name: str
    status: str
    """"measured" on real hardware, or "default": documented published figures, no measurement."""
    mode: str
    """"quick", "full" or "reference"."""
    created: str
    """ISO 8601 date (and time, UTC, for local measurements)."""
    peaks: DevicePeaks
    sustained_bandwidth_bytes_per_s: float
    """Large-copy bandwidth: the memory side of the compute ops' roofline."""
    overheads_s: dict[str, float]
    """Per-op host overhead, seconds: "dispatch" (a tiny op), "autograd" (a tiny op recorded for backward),
    "foreach" (per tensor of a multi-tensor op's list; profiles before it have none)."""
    series: tuple[SeriesProfile, ...]
    fingerprint: Fingerprint | None = None
    duration_s: float | None = None
    software: dict[str, str | None] = field(default_factory=dict)
    """torch, CUDA, driver, python versions of a measured profile."""
    sources: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    conditions: Conditions | None = None
    """Load averages while measured and the cache size assumed; None in profiles stored before the
    quality gates (advisor.calibration.quality) existed, and in reference profiles."""

    def __post_init__(self) -> None:
        assert self.status in STATUSES, self.status

    @property
    def is_default(self) -> bool:
        return self.status == "default"

    def get(self, op: str, dtype: str) -> SeriesProfile | None:
        for series in self.series:
            if series.op == op and series.dtype == dtype:
                return series
        return None

    def achieved_rate(self, op: str, dtype: str, work: float) -> float:
        """Fitted FLOP/s (compute ops) or bytes/s (memory ops) of one call of `work`; compute ops at an
        intensity high enough that the roofline is the peak."""
        series = self.get(op, dtype)
        assert series is not None, f"{op}/{dtype} not in the profile of {self.device}"
        return series.peak * series.efficiency(work)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "device_name": self.device_name,
            "status": self.status,
            "mode": self.mode,
            "created": self.created,
            "duration_s": self.duration_s,
            "fingerprint": self.fingerprint.to_dict() if self.fingerprint else None,
            "software": dict(self.software),
            "peaks": self.peaks.to_dict(),
            "sustained_bandwidth_bytes_per_s": self.sustained_bandwidth_bytes_per_s,
            "overheads_s": dict(self.overheads_s),
            "series": [s.to_dict() for s in self.series],
            "sources": list(self.sources),
            "notes": list(self.notes),
            "conditions": None if self.conditions is None else self.conditions.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: object) -> CalibrationProfile:
        """A profile from its to_dict() form, every value checked: MalformedProfile (a ValueError)
        names the first wrong key (`series[3].fit.curve.e_max`)."""
        entry = Fields(data, ("device", "device_name", "status", "mode", "created", "peaks",
                              "sustained_bandwidth_bytes_per_s", "overheads_s", "series"),
                       ("fingerprint", "duration_s", "software", "sources", "notes", "conditions"))
        status = entry.text("status")
        if status not in STATUSES:
            raise MalformedProfile("status", f"{shown(status)} is not one of {', '.join(STATUSES)}")
        series = entry.read("series", lambda value: each(value, SeriesProfile.from_dict))
        keys = [s.key for s in series]
        for index, key in enumerate(keys):
            if key in keys[:index]:
                raise MalformedProfile(f"series[{index}]", f"a second {shown(key)} series")
        for key in REQUIRED_SERIES:
            if key not in keys:
                raise MalformedProfile("series", f"no {key} series (estimates fall back to it)")
        return cls(
            device=entry.text("device"),
            device_name=entry.text("device_name"),
            status=status,
            mode=entry.text("mode"),
            created=entry.text("created"),
            peaks=entry.read("peaks", DevicePeaks.from_dict),
            sustained_bandwidth_bytes_per_s=entry.number("sustained_bandwidth_bytes_per_s", positive=True),
            overheads_s=entry.read("overheads_s", lambda value: by_name(value, number)),
            series=series,
            fingerprint=entry.optional("fingerprint", Fingerprint.from_dict, None),
            duration_s=entry.optional("duration_s", number, None),
            software=entry.optional("software", lambda value: by_name(value, optional_text), {}),
            sources=entry.texts("sources"),
            notes=entry.texts("notes"),
            conditions=entry.optional("conditions", Conditions.from_dict, None),
        )
