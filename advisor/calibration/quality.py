"""Quality gates: is a measured calibration profile fit to predict with? (issue #20)

A calibration on a busy machine can store nonsense: a copy at 15.7 MB/s, a cache-sized copy at
78,301% of "peak", a GEMM fitted from one point with seven sizes skipped, curves 100-150% off their
own points. Every freshly measured profile is assessed here before it is stored, and a stored one
again before it is used (older files, stored before the gates, included). Per series:

- `points`: at least min(MIN_POINTS, sizes planned) measured; sizes skipped count as planned, so a
  series of 8 sizes that measured 1 fails, a suite that plans 2 sizes needs 2.
- `residual`: the fit's rms log residual at most MAX_RMS_LOG_RESIDUAL (0.4: a typical point within
  e^0.4 = 1.49x of its curve; healthy series fit within 0.02-0.2, the issue's broken ones 1.0-1.5).
- `plausible`: no rate far above what the device can do: compute ops at most MAX_OF_PEAK of the
  dtype's theoretical FLOP/s; memory ops, points whose bytes are DRAM-sized (at least
  DRAM_SIZED_OVER_CACHE x the last-level cache / L2) at most MAX_OF_PEAK of the peak bandwidth where
  one is known; every point against a cache bound (a CPU's L1 moves at most CPU_CACHE_BYTES_PER_FLOP bytes per fp32 peak
  FLOP; a GPU's L2 at most GPU_CACHE_OVER_DRAM x its DRAM bandwidth). Small arrays in cache beat DRAM
  bandwidth legitimately; they do not beat the load/store units. A CPU's DRAM-sized points are not
  held to the sustained bandwidth of the same run: a VM reports a smaller last-level cache than its
  host has (at rest on this 2-core VM a 32 MiB copy ran at 169% of the largest one).
- `monotone` (GEMM): the rate of a square GEMM never falls below MIN_RATE_KEPT of the best smaller
  square GEMM (BLAS keeps its rate as sizes grow; a steep fall is a measurement disturbed).
- `contention`: in every attempt the runner made (it measures a disturbed series again later in the
  run, advisor.calibration.contention), other programs or steal took more CPU than torch's threads
  leave free (plus a margin), or the reference kernel ran slow: a busy machine's timings.

Globally: the sustained bandwidth at least MIN_SUSTAINED_OF_PEAK of the peak bandwidth (where known)
and MIN_SUSTAINED_BYTES_PER_S absolute (any DRAM since DDR2 moves more), and the per-op overheads
within OVERHEAD_RANGE_S.

ESSENTIAL series (gemm/fp32, copy/fp32: every estimate falls back to them), the sustained bandwidth
and the dispatch overhead must pass, or the profile is refused: not stored, not used. Any other
series that fails is dropped with a note; the estimator then falls back for it (a convolution to its
GEMM, a memory op to copy, a dtype to the one the device runs it in, the autograd overhead to the
dispatch one).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, replace
from typing import Any

from advisor.calibration.contention import allowed_for, disturbance
from advisor.calibration.profile import REQUIRED_SERIES, CalibrationProfile, Contention, SeriesProfile

ESSENTIAL_SERIES = REQUIRED_SERIES
ESSENTIAL_OVERHEADS = ("dispatch",)

MIN_POINTS = 3
"""A saturating curve has 2-3 parameters: fewer points than that are no fit."""
MAX_RMS_LOG_RESIDUAL = 0.4
MAX_OF_PEAK = {"cpu": 1.5, "cuda": 1.2}
"""Achieved / theoretical peak allowed. GPU peaks are the datasheet's boost-clock figures (1.2 leaves
noise room); a CPU's clock is what the OS reports, often the base clock, and all-core turbo runs up to
about 1.4x it."""
DRAM_SIZED_OVER_CACHE = 2.0
CPU_CACHE_BYTES_PER_FLOP = 4.0
"""L1 serves at most two vector loads and one store per cycle: 3 bytes per fp32 FLOP of FMA peak
(AVX2: 96 B and 32 FLOP per cycle per core); 4 with some margin."""
GPU_CACHE_OVER_DRAM = 4.0
"""L2 bandwidth over HBM/GDDR bandwidth: about 2-3x on Ampere and Hopper."""
MIN_SUSTAINED_OF_PEAK = 0.05
MIN_SUSTAINED_BYTES_PER_S = 1e9
MIN_RATE_KEPT = 0.4
OVERHEAD_RANGE_S = (5e-8, 1e-3)
"""A torch op costs the host 1-10 us; 50 ns is below any dispatch, 1 ms is a descheduled process."""

DROPPED = "dropped "
"""How the note on a series the gates dropped begins: `dropped gemm/fp16 (reason): ...`."""

_SQUARE = re.compile(r"(\d+)x\1x\1")


@dataclass(frozen=True)
class SeriesQuality:
    """One series' verdict: what was measured and, when it failed, each gate that failed and why."""

    key: str
    """"gemm/fp32", or "overhead/dispatch" for a per-op overhead."""
    essential: bool
    points: int
    planned: int
    rms_log_residual: float | None
    spread_median: float | None
    """Median over the points of the interquartile range / median of their repeated samples."""
    best_of_peak: float | None
    failures: tuple[str, ...] = ()
    """"gate: reason" for each gate that failed; empty when the series passed."""

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "essential": self.essential, "passed": self.passed, "points": self.points,
                "planned": self.planned, "rms_log_residual": self.rms_log_residual,
                "spread_median": self.spread_median, "best_of_peak": self.best_of_peak,
                "failures": list(self.failures)}


@dataclass(frozen=True)
class ProfileQuality:
    """The verdict on a whole profile: per series, the global checks, and the load while measuring."""

    device: str
    series: tuple[SeriesQuality, ...]
    global_failures: tuple[str, ...]
    """Failures of the sustained bandwidth: they refuse the profile."""
    load_before: float | None
    """1-minute load average before and after the run (None: not recorded, an older profile)."""
    load_after: float | None
    logical_cpus: int | None
    warnings: tuple[str, ...] = ()
    dropped_before: tuple[str, ...] = ()
    """Series the gates dropped when this profile was stored (from its notes): no longer in it."""
    contention: Contention | None = None
    """Other programs and steal over the whole run (None: not recorded)."""

    @property
    def refused_by(self) -> tuple[str, ...]:
        """Why the profile is refused: the global failures and each essential series' failures."""
        return self.global_failures + tuple(f"{s.key} {failure}" for s in self.series if s.essential
                                            for failure in s.failures)

    @property
    def accepted(self) -> bool:
        return not self.refused_by

    @property
    def dropped(self) -> tuple[SeriesQuality, ...]:
        """Optional series that failed: removed from the profile, the estimator falls back."""
        return tuple(s for s in self.series if not s.essential and not s.passed)

    def summary(self) -> str:
        """One line for an estimate's note: points, fit error, spread, load."""
        fitted = [s for s in self.series if s.passed and s.rms_log_residual is not None]
        parts = [f"{len(fitted)} series passed the quality gates"]
        if fitted:
            worst = max(fitted, key=lambda s: s.rms_log_residual or 0.0)
            points = sum(s.points for s in fitted)
            median = statistics.median(s.rms_log_residual or 0.0 for s in fitted)
            parts.append(f"{points} points, median rms error {_pct(median)} "
                         f"(worst {worst.key} {_pct(worst.rms_log_residual or 0.0)})")
            spreads = [s.spread_median for s in fitted if s.spread_median is not None]
            if spreads:
                parts.append(f"repeat spread {_pct(statistics.median(spreads))}")
        dropped = [*self.dropped_before, *(s.key for s in self.dropped)]
        if dropped:
            parts.append(f"dropped {', '.join(dropped)}")
        parts.append(self.load_text())
        if not self.accepted:
            parts.insert(0, "REFUSED: " + "; ".join(self.refused_by))
        return "; ".join(parts)

    def load_text(self) -> str:
        if self.load_before is None and self.load_after is None:
            return "load while measured not recorded (profile from an older version)"
        cpus = f" on {self.logical_cpus} CPUs" if self.logical_cpus else ""
        text = f"load {_load(self.load_before)} before, {_load(self.load_after)} after{cpus}"
        if self.contention is not None and self.contention.others_cores is not None:
            text += f"; other programs used {self.contention.others_cores:.2f} CPUs"
            if self.contention.steal_cores:
                text += f", steal {self.contention.steal_cores:.2f}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "accepted": self.accepted, "refused_by": list(self.refused_by),
                "dropped": [s.key for s in self.dropped], "dropped_before": list(self.dropped_before),
                "global_failures": list(self.global_failures),
                "load_before": self.load_before, "load_after": self.load_after, "logical_cpus": self.logical_cpus,
                "contention": None if self.contention is None else self.contention.to_dict(),
                "warnings": list(self.warnings), "series": [s.to_dict() for s in self.series]}


def _pct(value: float) -> str:
    return f"{value * 100:.0f}%"


def _load(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


def assess(profile: CalibrationProfile, kind: str, cache_bytes: float | None = None) -> ProfileQuality:
    """Apply every gate to a measured profile. `kind`: "cpu" or "cuda"; `cache_bytes`: the last-level
    cache / L2 (the profile's own record of it wins)."""
    assert kind in MAX_OF_PEAK, kind
    conditions = profile.conditions
    if conditions is not None and conditions.cache_bytes is not None:
        cache_bytes = conditions.cache_bytes
    series = [_assess_series(s, profile, kind, cache_bytes) for s in profile.series]
    series += [_assess_overhead(name, seconds) for name, seconds in profile.overheads_s.items()]
    series += [SeriesQuality(f"overhead/{name}", True, 0, 1, None, None, None, ("points: not measured",))
               for name in ESSENTIAL_OVERHEADS if name not in profile.overheads_s]
    for key in ESSENTIAL_SERIES:
        if profile.get(*key.split("/")) is None:
            series.append(SeriesQuality(key, True, 0, 1, None, None, None, ("points: not measured",)))
    warnings = []
    load_before = conditions.load_before[0] if conditions and conditions.load_before else None
    load_after = conditions.load_after[0] if conditions and conditions.load_after else None
    cpus = conditions.logical_cpus if conditions else None
    if conditions and cpus and (conditions.max_load or 0.0) > cpus:
        warnings.append(f"measured while the load average ({conditions.max_load:.2f}) exceeded the {cpus} CPUs: "
                        "other programs competed for the cores")
    if not profile.peaks.flops:
        warnings.append("no theoretical peak FLOP/s known: compute rates were not checked against one")
    dropped_before = tuple(note.split(" ", 2)[1] for note in profile.notes if note.startswith(DROPPED))
    return ProfileQuality(profile.device, tuple(series), _sustained_failures(profile, kind), load_before, load_after,
                          cpus, tuple(warnings), dropped_before, conditions.contention if conditions else None)


def _sustained_failures(profile: CalibrationProfile, kind: str) -> tuple[str, ...]:
    sustained = profile.sustained_bandwidth_bytes_per_s
    peak = profile.peaks.bandwidth_bytes_per_s
    failures = []
    if sustained < MIN_SUSTAINED_BYTES_PER_S:
        failures.append(f"sustained bandwidth {_gbs(sustained)} is below {_gbs(MIN_SUSTAINED_BYTES_PER_S)}, "
                        "less than any memory system moves")
    if peak is not None and sustained < MIN_SUSTAINED_OF_PEAK * peak:
        failures.append(f"sustained bandwidth {_gbs(sustained)} is {_pct(sustained / peak)} of the peak "
                        f"{_gbs(peak)} (at least {_pct(MIN_SUSTAINED_OF_PEAK)} expected)")
    if peak is not None and sustained > MAX_OF_PEAK[kind] * peak:
        failures.append(f"sustained bandwidth {_gbs(sustained)} is {_pct(sustained / peak)} of the peak {_gbs(peak)}")
    return tuple(failures)


def _gbs(value: float) -> str:
    return f"{value / 1e9:.3g} GB/s"


def _assess_overhead(name: str, seconds: float) -> SeriesQuality:
    low, high = OVERHEAD_RANGE_S
    failures = () if low <= seconds <= high else (
        f"plausible: {seconds * 1e6:.3g} us per op is outside {low * 1e6:g}-{high * 1e6:g} us",)
    return SeriesQuality(f"overhead/{name}", name in ESSENTIAL_OVERHEADS, 1, 1, None, None, None, failures)


def _assess_series(series: SeriesProfile, profile: CalibrationProfile, kind: str,
                   cache_bytes: float | None) -> SeriesQuality:
    points = len(series.measurements)
    planned = points + len(series.skipped)
    failures: list[str] = []
    needed = min(MIN_POINTS, planned)
    if points < needed:
        failures.append(f"points: {points} measured of {planned} planned ({len(series.skipped)} skipped), "
                        f"a fit needs {needed}")
    rms = series.fit.rms_log_residual
    if points > 1 and rms > MAX_RMS_LOG_RESIDUAL:
        failures.append(f"residual: rms error {_pct(rms)} (limit {_pct(MAX_RMS_LOG_RESIDUAL)}): the points "
                        "scatter around the fitted curve")
    failures += _implausible(series, profile, kind, cache_bytes)
    failures += _contended(series, profile, kind)
    if series.op == "gemm":
        failures += _falls(series)
    spreads = [m.spread for m in series.measurements]
    best = series.best_rate()
    return SeriesQuality(series.key, series.key in ESSENTIAL_SERIES, points, planned, rms if points else None,
                         statistics.median(spreads) if spreads else None,
                         None if best is None else best / series.peak, tuple(failures))


def _contended(series: SeriesProfile, profile: CalibrationProfile, kind: str) -> list[str]:
    """The series was measured while other programs (or steal) took the CPUs torch's threads need, or
    while the reference kernel ran slow, in every attempt the runner made."""
    if series.contention is None:
        return []
    reason = disturbance(series.contention, allowed_for(profile.fingerprint, kind))
    if reason is None:
        return []
    tries = series.contention.attempts
    return [f"contention: {reason}{f' (in each of {tries} attempts)' if tries > 1 else ''}"]


def _implausible(series: SeriesProfile, profile: CalibrationProfile, kind: str,
                 cache_bytes: float | None) -> list[str]:
    limit = MAX_OF_PEAK[kind]
    if series.axis == "flops":
        peak = profile.peaks.flops.get(series.dtype)
        if peak is None:
            return []
        worst = max(series.measurements, key=series.rate, default=None)
        if worst is not None and series.rate(worst) > limit * peak:
            return [f"plausible: {worst.label} ran at {series.rate(worst) / 1e9:.3g} GFLOP/s, "
                    f"{_pct(series.rate(worst) / peak)} of the {series.dtype} peak {peak / 1e9:.3g} GFLOP/s "
                    f"(limit {_pct(limit)})"]
        return []
    dram_peak = profile.peaks.bandwidth_bytes_per_s
    if kind == "cpu":
        fp32 = profile.peaks.flops.get("fp32")
        cache_bound = None if fp32 is None else CPU_CACHE_BYTES_PER_FLOP * fp32
    else:
        cache_bound = None if dram_peak is None else GPU_CACHE_OVER_DRAM * dram_peak
    failures = []
    for m in series.measurements:
        rate = series.rate(m)
        dram_sized = cache_bytes is not None and m.bytes >= DRAM_SIZED_OVER_CACHE * cache_bytes
        if dram_sized and dram_peak is not None and rate > limit * dram_peak:
            failures.append(f"plausible: {m.label} (beyond the cache) moved {_gbs(rate)}, {_pct(rate / dram_peak)} "
                            f"of the peak bandwidth {_gbs(dram_peak)} (limit {_pct(limit)})")
        elif cache_bound is not None and rate > cache_bound:
            failures.append(f"plausible: {m.label} moved {_gbs(rate)}, above what the caches can serve "
                            f"({_gbs(cache_bound)})")
    return failures[:1]


def _falls(series: SeriesProfile) -> list[str]:
    square = sorted((m for m in series.measurements if _SQUARE.fullmatch(m.label)), key=lambda m: m.flops)
    best = None
    for m in square:
        rate = series.rate(m)
        if best is not None and rate < MIN_RATE_KEPT * series.rate(best):
            return [f"monotone: {m.label} ran at {rate / 1e9:.3g} GFLOP/s, {_pct(rate / series.rate(best))} of the "
                    f"smaller {best.label} ({series.rate(best) / 1e9:.3g} GFLOP/s; at least "
                    f"{_pct(MIN_RATE_KEPT)} expected)"]
        if best is None or rate > series.rate(best):
            best = m
    return []


@dataclass(frozen=True)
class GateResult:
    """A profile after the gates: `profile` without the dropped series (None when refused)."""

    quality: ProfileQuality
    profile: CalibrationProfile | None


def gate(profile: CalibrationProfile, kind: str, cache_bytes: float | None = None) -> GateResult:
    """Assess `profile`; drop the optional series and overheads that failed (with a note each), or
    refuse it whole when an essential check failed."""
    quality = assess(profile, kind, cache_bytes)
    if not quality.accepted:
        return GateResult(quality, None)
    dropped = {s.key: s for s in quality.dropped}
    if not dropped:
        return GateResult(quality, profile)
    notes = [f"{DROPPED}{key} ({'; '.join(s.failures)}): estimates fall back for it" for key, s in dropped.items()]
    kept = replace(
        profile,
        series=tuple(s for s in profile.series if s.key not in dropped),
        overheads_s={name: value for name, value in profile.overheads_s.items() if f"overhead/{name}" not in dropped},
        notes=profile.notes + tuple(notes),
    )
    return GateResult(quality, kept)


def refusal_message(quality: ProfileQuality, quick: bool) -> str:
    """One sentence for `advisor calibrate`: what failed, and what to do."""
    advice = "close other programs and run it again" + ("" if not quick else
                                                        ", or run `advisor calibrate` without --quick for more points")
    return (f"the calibration of {quality.device} failed its quality gates and was not stored "
            f"({'; '.join(quality.refused_by)}; {quality.load_text()}): {advice}")
