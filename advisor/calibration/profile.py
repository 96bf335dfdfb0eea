"""A calibration profile: what a device achieved per op and dtype, fitted curves with their residuals,
per-op overheads, and the fingerprint of the machine and software it was measured on.

Measured profiles come from `advisor calibrate` (advisor.calibration.runner) and live in the user's
cache; shipped reference profiles (calibration/reference/*.yaml) are either measured on a real GPU or
documented defaults with published sources, marked `status: default`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from advisor.calibration.curves import Fit
from advisor.calibration.peaks import DevicePeaks

STATUSES = ("measured", "default")
AXES = ("flops", "bytes")


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
    def from_dict(cls, data: dict[str, Any]) -> Fingerprint:
        names = {f.name for f in fields(cls)}
        if set(data) != names:
            raise ValueError(f"fingerprint keys {sorted(data)} are not {sorted(names)}")
        return cls(**data)

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
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        return cls(str(data["label"]), float(data["flops"]), int(data["bytes"]), float(data["seconds"]),
                   int(data["samples"]), float(data["spread"]), float(data["fraction"]))


@dataclass(frozen=True)
class Skipped:
    label: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "reason": self.reason}


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

    def __post_init__(self) -> None:
        assert self.axis in AXES, self.axis

    @property
    def key(self) -> str:
        return f"{self.op}/{self.dtype}"

    def efficiency(self, work: float) -> float:
        """Fitted fraction of the reference for one call of `work` FLOPs or bytes."""
        return self.fit.curve.efficiency(work, self.peak)

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
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SeriesProfile:
        if data["axis"] not in AXES:
            raise ValueError(f"series axis {data['axis']!r} is not one of {', '.join(AXES)}")
        return cls(
            str(data["op"]),
            str(data["dtype"]),
            str(data["axis"]),
            float(data["peak"]),
            Fit.from_dict(data["fit"]),
            tuple(Measurement.from_dict(m) for m in data.get("measurements", ())),
            tuple(Skipped(str(s["label"]), str(s["reason"])) for s in data.get("skipped", ())),
            tuple(str(s) for s in data.get("sources", ())),
        )


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
    """Per-op host overhead, seconds: "dispatch" (a tiny op), "autograd" (a tiny op recorded for backward)."""
    series: tuple[SeriesProfile, ...]
    fingerprint: Fingerprint | None = None
    duration_s: float | None = None
    software: dict[str, str | None] = field(default_factory=dict)
    """torch, CUDA, driver, python versions of a measured profile."""
    sources: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

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
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CalibrationProfile:
        fingerprint = data.get("fingerprint")
        duration = data.get("duration_s")
        if data["status"] not in STATUSES:
            raise ValueError(f"status {data['status']!r} is not one of {', '.join(STATUSES)}")
        return cls(
            device=str(data["device"]),
            device_name=str(data["device_name"]),
            status=str(data["status"]),
            mode=str(data["mode"]),
            created=str(data["created"]),
            peaks=DevicePeaks.from_dict(data["peaks"]),
            sustained_bandwidth_bytes_per_s=float(data["sustained_bandwidth_bytes_per_s"]),
            overheads_s={str(k): float(v) for k, v in data["overheads_s"].items()},
            series=tuple(SeriesProfile.from_dict(s) for s in data["series"]),
            fingerprint=Fingerprint.from_dict(fingerprint) if fingerprint else None,
            duration_s=None if duration is None else float(duration),
            software={str(k): (None if v is None else str(v)) for k, v in data.get("software", {}).items()},
            sources=tuple(str(s) for s in data.get("sources", ())),
            notes=tuple(str(n) for n in data.get("notes", ())),
        )
