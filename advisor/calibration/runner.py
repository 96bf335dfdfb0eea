"""Run the suite on a device and fit what it measured into a calibration profile.

The profile is only built (and so only stored) once every case has run: an interrupted run leaves
nothing behind.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

from advisor.calibration.contention import (MAX_ATTEMPTS, ReferenceKernel, allowed_for, contention_between,
                                            cpu_snapshot, disturbance, reference_baseline)
from advisor.calibration.curves import fit_curve
from advisor.calibration.packing import fit_gemm
from advisor.calibration.peaks import DevicePeaks, cpu_peaks, gpu_peaks, roofline, roofline_work
from advisor.calibration.profile import (CalibrationProfile, Conditions, Contention, Fingerprint, Measurement,
                                         SeriesProfile,
                                         Skipped)
from advisor.calibration.suite import (COMPUTE_OPS, FOREACH_TENSORS, MEMORY_OPS, TORCH_DTYPES, Case, Suite, Timing,
                                      case_cost)
from advisor.calibration.timing import Clock, CPUClock, CUDAClock, HostClock, Sample, measure
from advisor.errors import UserError
from advisor.hardware.matching import match_gpu_name
from advisor.hardware.specs import HardwareDB
from advisor.probe.cpu import available_memory_bytes, probe_cpu
from advisor.probe.nvml import probe_nvidia

Progress = Callable[[int, int, str], None]
"""(cases done, cases in all, label of the case about to run)."""

BANDWIDTH_OPS = ("copy", "scale", "triad")
"""STREAM's kernels: the sustained bandwidth is the best of them at their largest size."""


@dataclass(frozen=True)
class Target:
    """The device to calibrate: its clocks, peaks and fingerprint."""

    device: str
    kind: str
    """"cpu" or "cuda"."""
    name: str
    peaks: DevicePeaks
    clock: Clock
    host_clock: Clock
    fingerprint: Fingerprint
    software: dict[str, str | None]
    cache_bytes: float | None
    """Last-level cache (CPU) or L2 (GPU): the first guess of where memory ops slow down."""
    gpu_id: str | None = None


def _software(driver: str | None = None) -> dict[str, str | None]:
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": driver,
        "python": platform.python_version(),
    }


def cpu_target(suite: Suite) -> Target:
    """This machine's CPU, as torch uses it (its intra-op threads)."""
    cpu = probe_cpu()
    fingerprint = Fingerprint(
        device="cpu",
        device_name=cpu.model,
        cpu_model=cpu.model,
        cpu_cores=cpu.usable_cores,
        torch_version=torch.__version__,
        torch_threads=torch.get_num_threads(),
        cuda_version=None,
        gpu_driver=None,
        suite_digest=suite.digest,
    )
    name = f"{cpu.model} ({cpu.usable_cores} cores, {torch.get_num_threads()} torch threads)"
    return Target("cpu", "cpu", name, cpu_peaks(cpu), CPUClock(), CPUClock(), fingerprint, _software(),
                  cpu.last_level_cache_bytes)


def cuda_target(index: int, db: HardwareDB, suite: Suite) -> Target:
    """Local GPU `index` as torch numbers them; UserError when torch has no such device."""
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise UserError(f"--device cuda:{index}: torch {torch.__version__} ({build}) sees no CUDA device; "
                        "calibrate the CPU with --device cpu")
    count = torch.cuda.device_count()
    if index >= count:
        raise UserError(f"--device cuda:{index}: torch sees {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    properties = torch.cuda.get_device_properties(index)
    name = torch.cuda.get_device_name(index)
    gpu_id = match_gpu_name(db, name, properties.total_memory)
    nvml = probe_nvidia()
    cpu = probe_cpu()
    if gpu_id is not None:
        spec = db.gpu(gpu_id)
        peaks = gpu_peaks(spec)
        cache = spec.l2_cache_bytes
    else:
        peaks = DevicePeaks({}, None, (f"{name} is not in the hardware database: fractions are of the best rate "
                                       "measured per series",))
        cache = getattr(properties, "L2_cache_size", None)
    device = f"cuda:{index}"
    fingerprint = Fingerprint(
        device=device,
        device_name=name,
        cpu_model=cpu.model,
        cpu_cores=cpu.usable_cores,
        torch_version=torch.__version__,
        torch_threads=torch.get_num_threads(),
        cuda_version=torch.version.cuda,
        gpu_driver=nvml.driver_version,
        suite_digest=suite.digest,
    )
    return Target(device, "cuda", name, peaks, CUDAClock(device), HostClock(device), fingerprint,
                  _software(nvml.driver_version), float(cache) if cache else None, gpu_id)


@contextlib.contextmanager
def _math_mode(dtype: str) -> Iterator[None]:
    """TF32 tensor math on for tf32 cases and off for strict fp32 ones; restored afterwards."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = dtype == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def _free_bytes(target: Target) -> int | None:
    if target.kind == "cuda":
        return torch.cuda.mem_get_info(torch.device(target.device))[0]
    return available_memory_bytes()


@dataclass(frozen=True)
class _Result:
    case: Case
    flops: float
    bytes: int
    sample: Sample


def _rate_for_skipping(case: Case, measured: float, before: float | None) -> float:
    """The rate that predicts the next, larger call of the series. Compute ops: the best so far (a
    compute kernel runs at least as fast on a larger problem; one slow sample of a loaded machine must
    not skip the large sizes, issue #20). Memory ops: the last (larger arrays leave the caches)."""
    if case.op in COMPUTE_OPS and before is not None:
        return max(measured, before)
    return measured


@dataclass
class _SeriesRun:
    """One series over its attempts: per case the fastest sample of any attempt (noise only ever
    slows a call down), the cases no attempt measured, and the contention of the attempt measured
    under the least of it."""

    results: dict[str, _Result]
    skipped: dict[str, tuple[Case, str]]
    contention: Contention
    reference_s: float | None
    attempts: int = 1

    def merge(self, other: _SeriesRun) -> None:
        for label, result in other.results.items():
            if label not in self.results or result.sample.seconds < self.results[label].sample.seconds:
                self.results[label] = result
            self.skipped.pop(label, None)
        for label, skip in other.skipped.items():
            if label not in self.results:
                self.skipped[label] = skip
        if other.disturbance_key() <= self.disturbance_key():
            self.contention, self.reference_s = other.contention, other.reference_s
        self.attempts += 1

    def disturbance_key(self) -> tuple[float, float]:
        """Orders attempts from the least disturbed: CPUs others took, then the reference kernel's time."""
        return (self.contention.busy_cores or 0.0, self.reference_s or 0.0)


REFERENCE_CASE = Case("gemm", "fp32", (256, 256, 256))
"""The reference kernel: 33.6 MFLOP, 0.1-1 ms on a CPU, tens of microseconds on a GPU."""


def _reference_kernel(target: Target) -> ReferenceKernel:
    """REFERENCE_CASE on the target's clock."""
    with torch.no_grad():
        call = REFERENCE_CASE.build(target.device)
    return ReferenceKernel(call, lambda work: target.clock.time_calls(work, 1))


def _measure_series(target: Target, cases: list[Case], timing: Timing, reference: ReferenceKernel,
                    tick: Callable[[Case], None]) -> _SeriesRun:
    """One attempt at a series: the reference kernel, then its cases from the smallest, skipping those
    predicted to take longer than timing.max_call_s or not to fit in memory, then the reference kernel
    again; /proc/stat around it all. The series' reference time is the faster of the two: a host slowed
    down while the series ran is slow at both ends, a moment's stall before it (a process's first seconds:
    the launch series' reference ran 1.9x its best, then 1.0x; 2026-11-27) only at one."""
    reference_before = reference.seconds()
    before = cpu_snapshot()
    results: dict[str, _Result] = {}
    skipped: dict[str, tuple[Case, str]] = {}
    rate: float | None = None
    for case in cases:
        tick(case)
        cost = case_cost(case)
        work = cost.flops if case.op in COMPUTE_OPS else cost.bytes
        if rate is not None and work / rate > timing.max_call_s:
            skipped[case.label] = (case, f"one call would take about {work / rate:.3g} s "
                                         f"(limit {timing.max_call_s:g} s)")
            continue
        free = _free_bytes(target)
        if free is not None and cost.bytes > 0.6 * free:
            skipped[case.label] = (case, f"needs {cost.bytes / 2**30:.2f} GiB, {free / 2**30:.2f} GiB free")
            continue
        clock = target.host_clock if case.op == "launch" else target.clock
        with _math_mode(case.dtype), torch.no_grad() if case.variant != "autograd" else contextlib.nullcontext():
            call = case.build(target.device, cold_bytes(target))
            sample = measure(call, clock, timing)
            del call
        results[case.label] = _Result(case, cost.flops, cost.bytes, sample)
        rate = _rate_for_skipping(case, work / sample.seconds, rate)
    reference_s = min(reference_before, reference.seconds())
    return _SeriesRun(results, skipped, contention_between(before, cpu_snapshot()), reference_s)


COLD_OVER_CACHE = 2.0
"""A case's operands rotate through copies filling this many times the last-level cache / L2."""


def cold_bytes(target: Target) -> float:
    """Bytes of operand copies a case rotates through to keep them out of the caches (0: cache unknown)."""
    return COLD_OVER_CACHE * target.cache_bytes if target.cache_bytes else 0.0


def _baseline_reference_s(runs: dict[str, _SeriesRun]) -> float | None:
    """reference_baseline() of the series' reference times (None when none was timed)."""
    times = [run.reference_s for run in runs.values() if run.reference_s is not None]
    return reference_baseline(times) if times else None


def _disturbed(run: _SeriesRun, baseline_s: float | None, allowed: float | None) -> str | None:
    slowdown = None if run.reference_s is None or not baseline_s else run.reference_s / baseline_s
    return disturbance(replace(run.contention, reference_slowdown=slowdown), allowed)


RETRY_PAUSE_S = 3.0
"""Seconds left to pass before each round of measuring disturbed series again: the series disturbed at
the end of a run are measured again right after it, and a host slowed down for seconds (this VM's
neighbours: the reference kernel 1.9x its best before and after copy/fp32, at rest) slowed all three
attempts of the first series without a pause (2026-11-27)."""


def run_suite(target: Target, suite: Suite, quick: bool, progress: Progress | None = None) -> tuple[
        list[_Result], list[tuple[Case, str]], dict[str, Contention]]:
    """Time every case of the suite on `target`, series by series; then measure again, up to
    MAX_ATTEMPTS in all, each series that other programs, steal or a slowed-down reference kernel
    disturbed (interleaved with the rest of the run, so a burst of load hits one attempt, not all).
    Returns the fastest sample of each case, the cases skipped with the reason, and per series the
    contention of its least disturbed attempt (its reference slowdown against the run's baseline,
    reference_baseline())."""
    timing = suite.timing_for(target.kind, quick)
    dtypes = set(target.peaks.flops) | {"fp32"} if target.peaks.flops else None
    cases = suite.cases(target.kind, quick, dtypes)
    groups: dict[str, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.series, []).append(case)
    allowed = allowed_for(target.fingerprint, target.kind)
    reference = _reference_kernel(target)
    counter = {"done": 0, "total": len(cases)}

    def tick(case: Case, note: str = "") -> None:
        if progress:
            progress(counter["done"], counter["total"], f"{case.series} {case.label}{note}")
        counter["done"] += 1

    runs = {key: _measure_series(target, group, timing, reference, tick) for key, group in groups.items()}
    for attempt in range(2, MAX_ATTEMPTS + 1):
        baseline = _baseline_reference_s(runs)
        again = [key for key, run in runs.items() if _disturbed(run, baseline, allowed)]
        if not again:
            break
        target.clock.pause(RETRY_PAUSE_S)
        counter["total"] += sum(len(groups[key]) for key in again)
        note = f" (again, {attempt} of {MAX_ATTEMPTS}: disturbed)"
        for key in again:
            runs[key].merge(_measure_series(target, groups[key], timing, reference, lambda case: tick(case, note)))
    if progress:
        progress(counter["total"], counter["total"], "fitting")
    baseline = _baseline_reference_s(runs)
    results = [run.results[case.label] for key, run in runs.items() for case in groups[key]
               if case.label in run.results]
    skipped = [run.skipped[case.label] for key, run in runs.items() for case in groups[key]
               if case.label in run.skipped]
    contention = {key: replace(run.contention, attempts=run.attempts,
                               reference_slowdown=None if run.reference_s is None or not baseline
                               else round(run.reference_s / baseline, 3))
                  for key, run in runs.items()}
    return results, skipped, contention


def calibrate(target: Target, suite: Suite, quick: bool, progress: Progress | None = None) -> CalibrationProfile:
    """Measure `target` with the suite and fit its profile."""
    started = time.perf_counter()
    load_before = load_average()
    before = cpu_snapshot()
    results, skipped, contention = run_suite(target, suite, quick, progress)
    profile = build_profile(target, results, skipped, quick, (load_before, load_average()), contention,
                            contention_between(before, cpu_snapshot()))
    return replace(profile, duration_s=round(time.perf_counter() - started, 2))


def load_average() -> tuple[float, float, float] | None:
    """os.getloadavg() rounded to 0.01 (1, 5 and 15 minutes); None where the OS keeps none (Windows)."""
    try:
        one, five, fifteen = os.getloadavg()
    except (AttributeError, OSError):
        return None
    return (round(one, 2), round(five, 2), round(fifteen, 2))


def sustained_bandwidth(results: list[_Result]) -> float:
    """Bytes/s of the best STREAM kernel (copy, scale, triad) at its largest size."""
    best = 0.0
    for op in BANDWIDTH_OPS:
        points = [r for r in results if r.case.op == op]
        if points:
            largest = max(points, key=lambda r: r.bytes)
            best = max(best, largest.bytes / largest.sample.seconds)
    assert best > 0, "the suite measured no copy, scale or triad"
    return best


def build_profile(target: Target, results: list[_Result], skipped: list[tuple[Case, str]], quick: bool,
                  loads: tuple[tuple[float, float, float] | None, tuple[float, float, float] | None] = (None, None),
                  contention: dict[str, Contention] | None = None, run_contention: Contention | None = None,
                  ) -> CalibrationProfile:
    """Fit every series and assemble the profile; `loads`: the load averages before and after the run;
    `contention`: per series key, what disturbed it; `run_contention`: over the whole run."""
    contention = contention or {}
    sustained = sustained_bandwidth(results)
    bandwidth_peak = target.peaks.bandwidth_bytes_per_s or sustained
    notes = list(target.peaks.notes)
    if target.peaks.bandwidth_bytes_per_s is None:
        notes.append(f"memory ops are fractions of the sustained bandwidth measured here, "
                     f"{sustained / 1e9:.1f} GB/s (no theoretical figure known)")
    overheads = {r.case.variant: r.sample.seconds / (FOREACH_TENSORS if r.case.variant == "foreach" else 1)
                 for r in results if r.case.op == "launch"}
    series: list[SeriesProfile] = []
    for key in dict.fromkeys(r.case.series for r in results if r.case.op != "launch"):  # in run order
        points = [r for r in results if r.case.series == key]
        op, dtype = points[0].case.op, points[0].case.dtype
        reasons = tuple(Skipped(case.label, reason) for case, reason in skipped if case.series == key)
        if op in MEMORY_OPS:
            fitted = _memory_series(op, dtype, points, bandwidth_peak, target.cache_bytes, reasons)
        else:
            peak = target.peaks.flops.get(dtype) or max(r.flops / r.sample.seconds for r in points)
            fitted = _compute_series(op, dtype, points, peak, sustained, reasons)
        series.append(replace(fitted, contention=contention.get(key)))
    return CalibrationProfile(
        device=target.device,
        device_name=target.name,
        status="measured",
        mode="quick" if quick else "full",
        created=dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
        peaks=target.peaks,
        sustained_bandwidth_bytes_per_s=sustained,
        overheads_s=overheads,
        series=tuple(series),
        fingerprint=target.fingerprint,
        software=target.software,
        notes=tuple(notes),
        conditions=Conditions(loads[0], loads[1], os.cpu_count() or 1, target.cache_bytes, run_contention),
    )


def _measurement(result: _Result, fraction: float) -> Measurement:
    sample = result.sample
    return Measurement(result.case.label, result.flops, result.bytes, sample.seconds, sample.samples,
                       round(sample.spread, 4), fraction)


def _memory_series(op: str, dtype: str, points: list[_Result], peak: float, cache: float | None,
                   skipped: tuple[Skipped, ...]) -> SeriesProfile:
    fractions = [r.bytes / r.sample.seconds / peak for r in points]
    fit = fit_curve("hierarchy", [r.bytes for r in points], fractions, peak, capacity_guess=cache)
    measurements = tuple(_measurement(r, f) for r, f in zip(points, fractions))
    return SeriesProfile(op, dtype, "bytes", peak, fit, measurements, skipped)


def _compute_series(op: str, dtype: str, points: list[_Result], peak: float, bandwidth: float,
                    skipped: tuple[Skipped, ...]) -> SeriesProfile:
    roofs = [roofline(peak, r.flops / r.bytes, bandwidth) for r in points]
    fractions = [r.flops / r.sample.seconds / roof for r, roof in zip(points, roofs)]
    works = [roofline_work(r.flops, peak, roof) for r, roof in zip(points, roofs)]
    pack_bandwidth = None
    if op == "gemm":
        fit, pack_bandwidth = fit_gemm([r.case.size for r in points], [r.flops for r in points],
                                       [r.sample.seconds for r in points], roofs, works, peak,
                                       TORCH_DTYPES[dtype].itemsize)
    else:
        fit = fit_curve("saturating", works, fractions, peak)
    measurements = tuple(_measurement(r, f) for r, f in zip(points, fractions))
    return SeriesProfile(op, dtype, "flops", peak, fit, measurements, skipped,
                         pack_bandwidth_bytes_per_s=pack_bandwidth)
