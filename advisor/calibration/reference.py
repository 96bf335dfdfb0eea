"""Shipped reference calibration of GPU families: measured profiles of real GPUs
(calibration/reference/measured/*.json) and documented defaults with published sources
(calibration/reference/defaults.yaml), resolved for one database GPU at a time."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from advisor import pickled
from advisor.calibration.curves import Curve, Fit
from advisor.calibration.peaks import DTYPES, gpu_peaks
from advisor.calibration.profile import CalibrationProfile, SeriesProfile
from advisor.calibration.suite import HOST_MEMORY_OPS, MEMORY_OPS
from advisor.hardware.loader import HwdbError
from advisor.hardware.specs import GPUSpec, HardwareDB
from advisor.paths import file_stamp, shipped_dir

FAMILY_COMPUTE_OPS = ("gemm", "conv", "conv_backward")
"""The compute series a documented GPU family gives factors for; depthwise convolutions (conv_dw) fall
back to conv in the estimator, as on any profile without them."""

FAMILY_KEYS = {"id", "name", "applies_to", "compute", "compute_ops", "memory", "overheads_s", "sources", "assumed",
               "notes"}
APPLIES_KEYS = {"architectures", "memory", "gpu_ids"}


class ReferenceError(HwdbError):
    """A malformed reference calibration file: names the file, the entry and the key, as the hardware
    database's errors do."""


@dataclass(frozen=True)
class AppliesTo:
    """Which database GPUs a reference profile speaks for."""

    architectures: tuple[str, ...] = ()
    memory: str | None = None
    """Prefix of the memory type ("HBM", "GDDR"), or None for any."""
    gpu_ids: tuple[str, ...] = ()

    def specificity(self, gpu: GPUSpec) -> int | None:
        """How closely this matches `gpu` (higher wins), None when it does not apply."""
        if gpu.id in self.gpu_ids:
            return 3
        if self.gpu_ids or (self.architectures and gpu.architecture not in self.architectures):
            return None
        if self.memory is not None:
            if not (gpu.memory_type or "").upper().startswith(self.memory.upper()):
                return None
            return 2
        return 1 if self.architectures else 0

    def to_dict(self) -> dict[str, Any]:
        return {"architectures": list(self.architectures), "memory": self.memory, "gpu_ids": list(self.gpu_ids)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AppliesTo:
        return cls(tuple(data.get("architectures") or ()), data.get("memory"), tuple(data.get("gpu_ids") or ()))


@dataclass(frozen=True)
class Family:
    """One documented default (or one measured profile) and the GPUs it applies to."""

    id: str
    name: str
    applies_to: AppliesTo
    origin: str
    compute: dict[str, Curve]
    compute_ops: dict[str, float]
    memory: Curve | None
    overheads_s: dict[str, float]
    sources: tuple[str, ...]
    assumed: tuple[str, ...]
    notes: str | None
    created: str
    """Date of the figures (defaults) or of the measurement."""
    measured: CalibrationProfile | None = None
    """The measured profile itself, for a family read from calibration/reference/measured/."""


def _reference_dir() -> Path:
    return shipped_dir("calibration", "suite.yaml") / "reference"


_loaded: dict[tuple[Any, ...], tuple[Family, ...]] = {}
"""load_families()'s results by folder, source ids and the files' names and file_stamp(): parsing
defaults.yaml took about 30 ms of every plan() call (2026-11-28), and a planning loop in one process asks for the
same families at each call. A new process reads them back from the cache (pickled.loaded: 0.2 ms)."""


def load_families(db: HardwareDB, directory: Path | None = None) -> tuple[Family, ...]:
    """Every reference profile shipped (measured first, then the defaults), validated; source ids
    must exist in the hardware database's sources. Read once per process while the files stay as they are."""
    directory = directory or _reference_dir()
    source_ids = {source.id for source in db.sources}
    measured = sorted((directory / "measured").glob("*.json"))
    key = (str(directory), frozenset(source_ids),
           tuple((str(path), file_stamp(path)) for path in [*measured, directory / "defaults.yaml"]))
    if key not in _loaded:
        if len(_loaded) >= 8:
            _loaded.clear()
        defaults = directory / "defaults.yaml"
        files = [(path, path.read_bytes()) for path in [*measured, defaults]]
        sources = [*((str(path), data) for path, data in files), ("source ids", "\n".join(sorted(source_ids)).encode())]
        _loaded[key] = pickled.loaded("reference", sources, ("calibration",), tuple,
                                      lambda: _read_families(directory, files, source_ids))
    return _loaded[key]


def _read_families(directory: Path, files: list[tuple[Path, bytes]], source_ids: set[str]) -> tuple[Family, ...]:
    """The families of the measured profiles and of defaults.yaml (the last of `files`: path and bytes)."""
    *measured, (defaults, text) = files
    families = [_measured_family(path, data) for path, data in measured]
    families.extend(_default_families(defaults, text, source_ids))
    ids = [family.id for family in families]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ReferenceError(directory, f"duplicate reference profile id {duplicates[0]!r}")
    if not any(f.id == "default" for f in families):
        raise ReferenceError(directory / "defaults.yaml", "needs a family with id 'default'")
    return tuple(families)


def _number(path: Path, entry: str, key: str, value: Any, *, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and value <= 0):
        raise ReferenceError(path, f"must be a positive number, got {value!r}", entry, key)
    return float(value)


def _default_families(path: Path, text: bytes, source_ids: set[str]) -> list[Family]:
    import yaml

    data = yaml.safe_load(text.decode("utf-8"))
    if not isinstance(data, dict) or data.get("schema") != 1:
        raise ReferenceError(path, "expected a mapping with schema: 1")
    unknown = sorted(set(data) - {"schema", "created", "families", "common"})
    if unknown:
        raise ReferenceError(path, f"unknown key {unknown[0]!r}")
    common = data.get("common") or {}
    created = str(data.get("created", ""))
    return [_default_family(path, raw, common, source_ids, created) for raw in data["families"]]


def _default_family(path: Path, raw: dict[str, Any], common: dict[str, Any], source_ids: set[str],
                    created: str) -> Family:
    entry = str(raw.get("id", "?"))
    unknown = sorted(set(raw) - FAMILY_KEYS)
    if unknown:
        raise ReferenceError(path, f"unknown key (expected {', '.join(sorted(FAMILY_KEYS))})", entry, unknown[0])
    for key in ("id", "name", "applies_to", "compute", "memory", "sources"):
        if key not in raw:
            raise ReferenceError(path, "is required", entry, key)
    applies = raw["applies_to"]
    if set(applies) - APPLIES_KEYS:
        raise ReferenceError(path, f"keys are {', '.join(sorted(APPLIES_KEYS))}", entry, "applies_to")
    compute: dict[str, Curve] = {}
    for dtype, curve in raw["compute"].items():
        if dtype not in DTYPES:
            raise ReferenceError(path, f"unknown dtype (expected {', '.join(DTYPES)})", entry, f"compute.{dtype}")
        compute[dtype] = Curve.saturating(
            _number(path, entry, f"compute.{dtype}.e_max", curve.get("e_max")),
            _number(path, entry, f"compute.{dtype}.tau_half_s", curve.get("tau_half_s")),
        )
    memory = raw["memory"]
    memory_curve = Curve.saturating(
        _number(path, entry, "memory.e_far", memory.get("e_far")),
        _number(path, entry, "memory.tau_half_s", memory.get("tau_half_s")),
    )
    for source in raw["sources"]:
        if source not in source_ids:
            raise ReferenceError(path, f"unknown source {source!r} (hwdb/sources.yaml)", entry, "sources")
    compute_ops = {op: _number(path, entry, f"compute_ops.{op}", v)
                   for op, v in (raw.get("compute_ops") or common.get("compute_ops") or {}).items()}
    overheads = {name: _number(path, entry, f"overheads_s.{name}", v)
                 for name, v in (raw.get("overheads_s") or common.get("overheads_s") or {}).items()}
    if set(compute_ops) != set(FAMILY_COMPUTE_OPS):
        raise ReferenceError(path, f"needs a factor for each of {', '.join(FAMILY_COMPUTE_OPS)}", entry,
                             "compute_ops")
    return Family(
        id=entry,
        name=str(raw["name"]),
        applies_to=AppliesTo.from_dict(applies),
        origin=str(path),
        compute=compute,
        compute_ops=compute_ops,
        memory=memory_curve,
        overheads_s=overheads,
        sources=tuple(raw["sources"]),
        assumed=tuple(raw.get("assumed") or ()),
        notes=raw.get("notes"),
        created=created,
    )


def _measured_family(path: Path, text: bytes) -> Family:
    """A profile measured by `advisor calibrate` on a real GPU (`path`, its bytes `text`), shipped with its
    `applies_to`."""
    data = json.loads(text.decode("utf-8"))
    try:
        profile = CalibrationProfile.from_dict(data["profile"])
        applies = data["applies_to"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ReferenceError(path, f"not a measured calibration profile ({type(exc).__name__}: {exc})") from exc
    return Family(
        id=path.stem,
        name=profile.device_name,
        applies_to=AppliesTo.from_dict(applies),
        origin=str(path),
        compute={},
        compute_ops={},
        memory=None,
        overheads_s=dict(profile.overheads_s),
        sources=(),
        assumed=(),
        notes=f"measured {profile.created} on {profile.device_name}, torch {profile.software.get('torch')}, "
        f"driver {profile.software.get('driver')}",
        created=profile.created,
        measured=profile,
    )


def family_for(gpu: GPUSpec, families: tuple[Family, ...]) -> Family:
    """The most specific family that applies to `gpu` (a measured one wins a tie)."""
    ranked = [(score, family.measured is not None, -index, family) for index, family in enumerate(families)
              if (score := family.applies_to.specificity(gpu)) is not None]
    assert ranked, f"no reference profile applies to {gpu.id}, not even 'default'"
    return max(ranked, key=lambda item: item[:3])[3]


def reference_profile(gpu: GPUSpec, families: tuple[Family, ...]) -> CalibrationProfile:
    """The calibration an estimate for `gpu` uses: its family's curves against this GPU's own peaks. A
    documented family's compute peaks are at the clock a loaded card holds (GPUSpec.clock_ratio); a measured
    family's fractions carry over as measured, its card's clock already in them (_rescaled). Made once per
    GPU entry and family list (both loaded once per process): every estimate over the database asked for 55,
    2,250 series objects and a fiftieth of the 7B example's estimate."""
    key = (id(gpu), id(families))
    made = _PROFILES.get(key)
    if made is not None and made[0] is gpu and made[1] is families:
        return made[2]
    profile = _reference_profile(gpu, families)
    if len(_PROFILES) >= MAX_PROFILES_KEPT:
        _PROFILES.clear()
    _PROFILES[key] = (gpu, families, profile)  # kept alive with its profile: their ids name no other object
    return profile


MAX_PROFILES_KEPT = 1024
_PROFILES: dict[tuple[int, int], tuple[GPUSpec, tuple[Family, ...], CalibrationProfile]] = {}


def _reference_profile(gpu: GPUSpec, families: tuple[Family, ...]) -> CalibrationProfile:
    family = family_for(gpu, families)
    peaks = gpu_peaks(gpu)
    if family.measured is not None:
        return _rescaled(family.measured, gpu, peaks)
    series: list[SeriesProfile] = []
    for dtype, curve in family.compute.items():
        if dtype not in peaks.flops:
            continue
        for op in FAMILY_COMPUTE_OPS:
            scaled = Curve.saturating(curve.param("e_max") * family.compute_ops[op], curve.param("tau_half_s"), 1.0)
            series.append(SeriesProfile(op, dtype, "flops", peaks.flops[dtype] * gpu.clock_ratio,
                                        Fit(scaled, (), 0.0, 0), sources=family.sources))
    assert family.memory is not None
    e_far, tau_half = family.memory.param("e_max"), family.memory.param("tau_half_s")
    memory = Curve.hierarchy(e_far, e_far, float(gpu.l2_cache_bytes or 1), tau_half)
    for op in (op for op in MEMORY_OPS if op not in HOST_MEMORY_OPS):
        for dtype in ("fp32", "bf16", "fp16"):
            series.append(SeriesProfile(op, dtype, "bytes", gpu.bandwidth_bytes_per_s, Fit(memory, (), 0.0, 0),
                                        sources=family.sources))
    assumed = f"; assumed, no source: {', '.join(family.assumed)}" if family.assumed else ""
    return CalibrationProfile(
        device=family.id,
        device_name=f"{gpu.name} ({family.name} default)",
        status="default",
        mode="reference",
        created=family.created,
        peaks=peaks,
        sustained_bandwidth_bytes_per_s=gpu.bandwidth_bytes_per_s * e_far,
        overheads_s=dict(family.overheads_s),
        series=tuple(series),
        sources=family.sources,
        notes=tuple(n for n in (family.notes, f"documented default from {family.origin}{assumed}") if n),
    )


def _rescaled(profile: CalibrationProfile, gpu: GPUSpec, peaks: Any) -> CalibrationProfile:
    """A GPU's measured profile applied to another GPU of its family: the fractions carry over, the
    peaks are the target's."""
    series = []
    for s in profile.series:
        peak = peaks.flops.get(s.dtype) if s.axis == "flops" else gpu.bandwidth_bytes_per_s
        if peak is not None:
            series.append(replace(s, peak=peak))
    ratio = gpu.bandwidth_bytes_per_s / (profile.peaks.bandwidth_bytes_per_s or gpu.bandwidth_bytes_per_s)
    return replace(
        profile,
        device_name=f"{gpu.name} (measured on {profile.device_name})",
        peaks=peaks,
        sustained_bandwidth_bytes_per_s=profile.sustained_bandwidth_bytes_per_s * ratio,
        series=tuple(series),
        fingerprint=None,
    )
