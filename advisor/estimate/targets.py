"""The devices an estimate covers: database GPUs (reference calibration of their family) and, with
`--local`, this machine's CPU and NVIDIA GPUs (their own calibration, measured when none is cached)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from advisor.calibration.cache import CachedProfile, CacheError, check_writable, load_profile, os_reason, store_profile
from advisor.calibration.profile import CalibrationProfile
from advisor.calibration.quality import GateResult, ProfileQuality, gate
from advisor.calibration.reference import Family, reference_profile
from advisor.calibration.suite import Suite, load_suite
from advisor.calibration.shapes import call_key, measure_shapes
from advisor.estimate.step import DeviceModel, kernel_seconds
from advisor.hardware.specs import GPUSpec, HardwareDB, MemoryOverhead
from advisor.probe.cpu import probe_cpu
from advisor.profile.trace import OpRecord

if TYPE_CHECKING:
    from advisor.calibration.runner import Target as CalibrationTarget

Progress = Callable[[str], None]
CalibrationProgress = Callable[[int, int, str], None]


def cpu_target(suite: Suite) -> CalibrationTarget:
    """calibration.runner.cpu_target, the benchmark runner imported when --local asks for it (not by every
    estimate: about 10 ms with the probes it imports)."""
    from advisor.calibration.runner import cpu_target as target

    return target(suite)


def cuda_target(index: int, db: HardwareDB, suite: Suite) -> CalibrationTarget:
    """calibration.runner.cuda_target (imported as cpu_target says)."""
    from advisor.calibration.runner import cuda_target as target

    return target(index, db, suite)


def calibrate(target: CalibrationTarget, suite: Suite, quick: bool,
              progress: CalibrationProgress | None) -> CalibrationProfile:
    """calibration.runner.calibrate (imported as cpu_target says)."""
    from advisor.calibration.runner import calibrate as measure

    return measure(target, suite, quick=quick, progress=progress)


CPU_MEMORY_OVERHEAD = MemoryOverhead("cpu", 0, 0, ())
"""A CPU has no CUDA context or cuBLAS workspace."""


@dataclass(frozen=True)
class EstimateTarget:
    """One device to estimate on. `memory_bytes` is its capacity (GPU memory, or the CPU's RAM)."""

    id: str
    name: str
    device: DeviceModel
    memory_bytes: int
    memory_overhead: MemoryOverhead
    gpu: GPUSpec | None = None
    """The database entry (a local GPU's matched entry), for prices and power."""
    local: bool = False
    note: str | None = None
    """Why the calibration is what it is, for the output (e.g. "not calibrated: run ..."), and the
    quality of a measured one (points, rms error, load while measured)."""
    quality: ProfileQuality | None = None
    """The quality gates' verdict on a local measured profile; None for a reference profile."""

    @property
    def calibration(self) -> str:
        return self.device.profile.status


def database_targets(db: HardwareDB, gpus: Sequence[GPUSpec], families: tuple[Family, ...]) -> list[EstimateTarget]:
    """Each database GPU with its family's reference calibration."""
    return [
        EstimateTarget(gpu.id, gpu.name, DeviceModel.of_gpu(gpu.id, reference_profile(gpu, families), gpu),
                       gpu.memory_bytes, db.memory_overhead(gpu), gpu)
        for gpu in gpus
    ]


@dataclass(frozen=True)
class LocalProfile:
    """What a local device is estimated from: a profile that passed the quality gates (or a GPU family's
    reference), the note for the output, and the verdict of the gates (None for a reference)."""

    profile: CalibrationProfile | None
    """None: no usable calibration (a fresh one was refused); the device is left out."""
    note: str | None
    quality: ProfileQuality | None = None


def _stored(target: CalibrationTarget) -> tuple[CachedProfile, GateResult | None]:
    """The cached profile of a local device and, when one loads, the quality gates' verdict on it
    (profiles stored before the gates existed are assessed here too)."""
    cached = load_profile(target.device, target.fingerprint)
    return cached, None if cached.profile is None else gate(cached.profile, target.kind, target.cache_bytes)


def _unusable(cached: CachedProfile, verdict: GateResult | None) -> str:
    if verdict is not None:
        return f"stored profile refused by the quality gates: {'; '.join(verdict.quality.refused_by)}"
    assert cached.problem is not None
    return cached.problem


def _local_profile(target: CalibrationTarget, suite: Suite, progress: Progress,
                   calibration_progress: CalibrationProgress | None) -> LocalProfile:
    """The cached calibration of a local device if it passes the quality gates, or a quick one measured
    now, gated, and cached. A cache that cannot be written (checked before measuring, and again by the
    write itself) costs the cache only: the profile measured now is used for this run, with one warning
    through `progress`. A quick profile the gates refuse is neither stored nor used: one warning, and
    the device is left out (`LocalProfile.profile` None)."""
    cached, verdict = _stored(target)
    if verdict is not None and verdict.profile is not None:
        return LocalProfile(verdict.profile, f"calibration quality: {verdict.quality.summary()}", verdict.quality)
    problem = _unusable(cached, verdict)
    progress(f"no usable calibration of {target.device} ({problem}): measuring a quick one "
             f"(`advisor calibrate --device {target.device}` runs the full suite)")
    try:
        check_writable(target.device)
        unstored = None
    except CacheError as exc:
        unstored = exc.reason
        progress(_not_stored_warning(target.device, exc.directory, exc.reason))
    fresh = gate(calibrate(target, suite, quick=True, progress=calibration_progress), target.kind,
                 target.cache_bytes)
    if fresh.profile is None:
        progress(f"warning: the quick calibration of {target.device} measured now failed its quality gates "
                 f"({'; '.join(fresh.quality.refused_by)}; {fresh.quality.load_text()}): it is not used and "
                 f"{target.device} is left out; close other programs and run `advisor calibrate --device "
                 f"{target.device}`")
        return LocalProfile(None, f"left out: its calibration failed the quality gates ({problem} before)",
                            fresh.quality)
    if unstored is None:
        try:
            store_profile(fresh.profile)
        except OSError as exc:
            unstored = os_reason(exc)
            progress(_not_stored_warning(target.device, cached.path.parent, unstored))
    note = f"quick calibration measured now ({problem} before); quality: {fresh.quality.summary()}"
    return LocalProfile(fresh.profile, note if unstored is None else f"{note}; not stored ({unstored})",
                        fresh.quality)


def _not_stored_warning(device: str, directory: Path, reason: str) -> str:
    return (f"warning: cannot store calibrations in {directory} ({reason}): the quick calibration of {device} "
            "measured now is used for this run only; set $GPU_ADVISOR_CACHE_DIR to a folder that can be written")


def local_targets(db: HardwareDB, families: tuple[Family, ...], progress: Progress,
                  calibration_progress: CalibrationProgress | None = None) -> list[EstimateTarget]:
    """This machine's CPU (`local-cpu`) and each CUDA device torch sees (`local-cudaN`)."""
    import torch

    suite = load_suite()
    cpu = cpu_target(suite)
    local = _local_profile(cpu, suite, progress, calibration_progress)
    info = probe_cpu()
    memory = info.memory_total_bytes or 0
    targets = []
    if local.profile is not None:
        targets.append(EstimateTarget("local-cpu", f"this CPU: {cpu.name}",
                                      DeviceModel("local-cpu", "cpu", local.profile), memory, CPU_MEMORY_OVERHEAD,
                                      None, True, local.note, local.quality))
    if not torch.cuda.is_available():
        return targets
    for index in range(torch.cuda.device_count()):
        target = cuda_target(index, db, suite)
        spec = db.gpu(target.gpu_id) if target.gpu_id else None
        local = _local_gpu_profile(target, spec, families, suite, progress, calibration_progress)
        if local.profile is None:
            continue
        local_id = f"local-cuda{index}"
        overhead = db.memory_overhead(spec) if spec else db.memory_overhead_default()
        properties = torch.cuda.get_device_properties(index)
        device = DeviceModel.of_gpu(local_id, local.profile, spec, properties.multi_processor_count,
                                    f"{properties.major}.{properties.minor}",
                                    getattr(properties, "L2_cache_size", None) or None)
        targets.append(EstimateTarget(local_id, f"this GPU: {target.name}", device,
                                      properties.total_memory, overhead, spec, True, local.note, local.quality))
    return targets


def _local_gpu_profile(target: CalibrationTarget, spec: GPUSpec | None, families: tuple[Family, ...], suite: Suite,
                       progress: Progress, calibration_progress: CalibrationProgress | None,
                       ) -> LocalProfile:
    """A local GPU's cached calibration if it passes the quality gates; else, for a database GPU, its
    family's reference (say so); else a quick calibration measured now (gated)."""
    if spec is None:
        return _local_profile(target, suite, progress, calibration_progress)
    cached, verdict = _stored(target)
    if verdict is not None and verdict.profile is not None:
        return LocalProfile(verdict.profile, f"calibration quality: {verdict.quality.summary()}", verdict.quality)
    return LocalProfile(reference_profile(spec, families), f"not calibrated ({_unusable(cached, verdict)}): run "
                        f"`advisor calibrate --device {target.device}` to measure it")


def with_measured_shapes(target: EstimateTarget, records: Sequence[OpRecord], precision: str,
                         progress: Progress) -> EstimateTarget:
    """A local CPU target whose model times the step's convolutions and batch norms as measured at their
    exact shapes (calibration/shapes.py: stored ones reused, the rest timed now within a budget); other
    targets as they are. Its note says how many shapes were timed."""
    device = target.device
    if device.kind != "cpu" or device.profile.status != "measured" or not target.local:
        return target
    keyed = [(key, r) for r in records if (key := call_key(r.op, r.dtypes, r.conv, r.norm)) is not None]
    if not keyed:
        return target
    wanted: dict[tuple, float] = {}
    for (key, _), seconds in zip(keyed, kernel_seconds([r for _, r in keyed], precision, device), strict=True):
        wanted[key] = max(seconds, wanted.get(key, 0.0))
    measured = measure_shapes(wanted.items(), device.profile.created, progress)
    timed = f"{len(measured.seconds)} of {len(wanted)} convolution and batch-norm shapes timed on this CPU"
    if measured.measured_now:
        timed += f" ({measured.measured_now} now, {measured.measuring_s:.1f} s)"
    if measured.left_out:
        timed += f"; {measured.left_out} left to the calibrated curves (time budget, size)"
    note = f"{target.note}; {timed}" if target.note else timed
    return replace(target, device=replace(device, measured_s=measured.seconds), note=note)
