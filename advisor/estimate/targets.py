"""The devices an estimate covers: database GPUs (reference calibration of their family) and, with
`--local`, this machine's CPU and NVIDIA GPUs (their own calibration, measured when none is cached)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from advisor.calibration.cache import CacheError, check_writable, load_profile, os_reason, store_profile
from advisor.calibration.profile import CalibrationProfile
from advisor.calibration.reference import Family, reference_profile
from advisor.calibration.runner import Target as CalibrationTarget
from advisor.calibration.runner import calibrate, cpu_target, cuda_target
from advisor.calibration.suite import Suite, load_suite
from advisor.estimate.step import DeviceModel
from advisor.hardware.specs import GPUSpec, HardwareDB, MemoryOverhead
from advisor.probe.cpu import probe_cpu

Progress = Callable[[str], None]
CalibrationProgress = Callable[[int, int, str], None]

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
    """Why the calibration is what it is, for the output (e.g. "not calibrated: run ...")."""

    @property
    def calibration(self) -> str:
        return self.device.profile.status


def database_targets(db: HardwareDB, gpus: Sequence[GPUSpec], families: tuple[Family, ...]) -> list[EstimateTarget]:
    """Each database GPU with its family's reference calibration."""
    return [
        EstimateTarget(gpu.id, gpu.name, DeviceModel(gpu.id, "gpu", reference_profile(gpu, families), gpu.sm_count),
                       gpu.memory_bytes, db.memory_overhead(gpu), gpu)
        for gpu in gpus
    ]


def _local_profile(target: CalibrationTarget, suite: Suite, progress: Progress,
                   calibration_progress: CalibrationProgress | None) -> tuple[CalibrationProfile, str | None]:
    """The cached calibration of a local device, or a quick one measured now and cached. A cache that
    cannot be written (checked before measuring, and again by the write itself) costs the cache only:
    the profile measured now is used for this run, with one warning through `progress`."""
    cached = load_profile(target.device, target.fingerprint)
    if cached.profile is not None:
        return cached.profile, None
    progress(f"no usable calibration of {target.device} ({cached.problem}): measuring a quick one "
             f"(`advisor calibrate --device {target.device}` runs the full suite)")
    try:
        check_writable(target.device)
        unstored = None
    except CacheError as exc:
        unstored = exc.reason
        progress(_not_stored_warning(target.device, exc.directory, exc.reason))
    profile = calibrate(target, suite, quick=True, progress=calibration_progress)
    if unstored is None:
        try:
            store_profile(profile)
        except OSError as exc:
            unstored = os_reason(exc)
            progress(_not_stored_warning(target.device, cached.path.parent, unstored))
    note = f"quick calibration measured now ({cached.problem} before)"
    return profile, note if unstored is None else f"{note}; not stored ({unstored})"


def _not_stored_warning(device: str, directory: Path, reason: str) -> str:
    return (f"warning: cannot store calibrations in {directory} ({reason}): the quick calibration of {device} "
            "measured now is used for this run only; set $GPU_ADVISOR_CACHE_DIR to a folder that can be written")


def local_targets(db: HardwareDB, families: tuple[Family, ...], progress: Progress,
                  calibration_progress: CalibrationProgress | None = None) -> list[EstimateTarget]:
    """This machine's CPU (`local-cpu`) and each CUDA device torch sees (`local-cudaN`)."""
    import torch

    suite = load_suite()
    cpu = cpu_target(suite)
    profile, note = _local_profile(cpu, suite, progress, calibration_progress)
    info = probe_cpu()
    memory = info.memory_total_bytes or 0
    targets = [EstimateTarget("local-cpu", f"this CPU: {cpu.name}", DeviceModel("local-cpu", "cpu", profile),
                              memory, CPU_MEMORY_OVERHEAD, None, True, note)]
    if not torch.cuda.is_available():
        return targets
    for index in range(torch.cuda.device_count()):
        target = cuda_target(index, db, suite)
        spec = db.gpu(target.gpu_id) if target.gpu_id else None
        profile, note = _local_gpu_profile(target, spec, families, suite, progress, calibration_progress)
        local_id = f"local-cuda{index}"
        overhead = db.memory_overhead(spec) if spec else db.memory_overhead_default()
        properties = torch.cuda.get_device_properties(index)
        sm_count = spec.sm_count if spec else properties.multi_processor_count
        targets.append(EstimateTarget(local_id, f"this GPU: {target.name}", DeviceModel(local_id, "gpu", profile, sm_count),
                                      properties.total_memory, overhead, spec, True, note))
    return targets


def _local_gpu_profile(target: CalibrationTarget, spec: GPUSpec | None, families: tuple[Family, ...], suite: Suite,
                       progress: Progress, calibration_progress: CalibrationProgress | None,
                       ) -> tuple[CalibrationProfile, str | None]:
    """A local GPU's cached calibration; else, for a database GPU, its family's reference (say so); else
    a quick calibration measured now."""
    if spec is None:
        return _local_profile(target, suite, progress, calibration_progress)
    cached = load_profile(target.device, target.fingerprint)
    if cached.profile is not None:
        return cached.profile, None
    return reference_profile(spec, families), (f"not calibrated ({cached.problem}): run `advisor calibrate "
                                               f"--device {target.device}` to measure it")
