"""Theoretical peaks the measured rates are fractions of: the local CPU's from its vector units, a GPU's
from the hardware database. FLOP/s and bytes/s."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from advisor.calibration.checked import Fields, by_name, number
from advisor.hardware.specs import GPUSpec
from advisor.probe.cpu import CPUInfo

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
"""Math precisions a profile may time: strict fp32, TF32 tensor math, bf16, fp16 and fp8 (e4m3/e5m2 tensor
math with fp32 accumulation; a GPU family's default gives it, the suite does not measure it yet)."""


@dataclass(frozen=True)
class DevicePeaks:
    """Peak FLOP/s per dtype and peak memory bandwidth of one device, and how they were obtained."""

    flops: dict[str, float] = field(default_factory=dict)
    """dtype -> FLOP/s; a dtype the device has no unit for is absent."""
    bandwidth_bytes_per_s: float | None = None
    """None where no theoretical figure is known (a CPU): the suite then takes its best sustained
    DRAM-sized measurement as the reference, the STREAM convention."""
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "flops": dict(self.flops),
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: object) -> DevicePeaks:
        """Peaks from their to_dict() form; MalformedProfile (a ValueError) names the wrong key."""
        entry = Fields(data, ("flops",), ("bandwidth_bytes_per_s", "notes"))
        return cls(
            entry.read("flops", lambda value: by_name(value, lambda peak: number(peak, positive=True), DTYPES)),
            entry.optional("bandwidth_bytes_per_s", lambda value: number(value, positive=True), None),
            entry.texts("notes"),
        )


def fp32_flops_per_cycle(cpu: CPUInfo) -> tuple[int, str]:
    """fp32 FLOPs one core retires per cycle at best (FMA = 2), and the assumption behind it."""
    extensions = set(cpu.vector_extensions)
    if cpu.architecture in ("x86_64", "AMD64", "i686"):
        if "avx512f" in extensions:
            if cpu.vendor == "AuthenticAMD" and (cpu.family or 0) < 26:
                return 32, "Zen 4: AVX-512 on two 256-bit FMA pipes (16 fp32 FMA/cycle)"
            return 64, "two 512-bit FMA units (32 fp32 FMA/cycle; some Intel SKUs have one)"
        if "fma" in extensions and "avx2" in extensions:
            if cpu.vendor == "AuthenticAMD" and cpu.family == 23:
                return 32, "Zen/Zen 2: two 256-bit FMA pipes (Zen 1 splits them, so half there)"
            return 32, "two 256-bit FMA units (16 fp32 FMA/cycle)"
        if "avx" in extensions:
            return 16, "AVX without FMA: one 256-bit multiply and one add per cycle"
        return 8, "SSE: one 128-bit multiply and one add per cycle"
    if cpu.architecture in ("aarch64", "arm64"):
        return 16, "two 128-bit NEON FMA pipes assumed (Neoverse N1 class; V1/V2 have more)"
    return 8, f"unknown architecture {cpu.architecture}: one 128-bit FMA per cycle assumed"


def cpu_peaks(cpu: CPUInfo) -> DevicePeaks:
    """Theoretical FLOP/s of the cores this process may use: cores x clock x FLOPs per cycle.

    bf16 doubles fp32 where the CPU has bf16 dot products (AVX512_BF16) and reaches 1024 FLOPs per
    cycle per core with AMX; fp16 doubles with AVX512_FP16. Without such units torch converts to
    fp32, so the fp32 figure stays the ceiling. TF32 does not exist on CPUs (absent).
    """
    per_cycle, assumption = fp32_flops_per_cycle(cpu)
    cores = cpu.usable_cores
    notes = [f"fp32: {cores} cores x {per_cycle} FLOP/cycle ({assumption})"]
    if cpu.clock_hz is None:
        return DevicePeaks({}, None, (*notes, "no clock readable: no theoretical peak"))
    clock_note = (
        f"clock {cpu.clock_hz / 1e9:.2f} GHz as the OS reports it; a boost clock above it makes "
        "achieved rates exceed this peak"
    )
    fp32 = cores * cpu.clock_hz * per_cycle
    extensions = set(cpu.vector_extensions)
    bf16 = fp32
    if "amx_bf16" in extensions:
        bf16 = cores * cpu.clock_hz * 1024
        notes.append("bf16: AMX tiles, 1024 FLOP/cycle per core")
    elif "avx512_bf16" in extensions:
        bf16 = 2 * fp32
        notes.append("bf16: AVX512_BF16 dot products, twice fp32")
    else:
        notes.append("bf16: no native unit, converted to fp32 (fp32 peak)")
    fp16 = 2 * fp32 if "avx512_fp16" in extensions else fp32
    notes.append("fp16: AVX512_FP16, twice fp32" if fp16 > fp32 else "fp16: no native unit (fp32 peak)")
    return DevicePeaks({"fp32": fp32, "bf16": bf16, "fp16": fp16}, None, (*notes, clock_note))


def gpu_peaks(gpu: GPUSpec) -> DevicePeaks:
    """A database GPU's peaks: fp32 on its vector units, TF32/bf16/fp16/fp8 on tensor cores with fp32
    accumulation (what cuBLAS does for torch's fp16 matmuls and autocast, and cuBLASLt's fp8 GEMMs for
    float8 training), dense, and its bandwidth."""
    peaks = gpu.peaks
    flops: dict[str, float] = {}
    for dtype, mode, fallback in (
        ("fp32", "fp32", None),
        ("tf32", "tf32_tensor", "fp32"),
        ("bf16", "bf16_tensor", None),
        ("fp16", "fp16_tensor", "fp16"),
        ("fp8", "fp8_tensor", None),
    ):
        value = peaks.get(mode)
        if value is None and fallback is not None:
            value = peaks.get(fallback)
        if value is not None:
            flops[dtype] = value
    return DevicePeaks(flops, gpu.bandwidth_bytes_per_s, (f"{gpu.name} from the hardware database ({gpu.origin})",))


def roofline(peak_flops: float, intensity: float, bandwidth: float) -> float:
    """Attainable FLOP/s at `intensity` FLOPs per byte: min(peak, intensity x bandwidth)."""
    return min(peak_flops, intensity * bandwidth)


def roofline_work(flops: float, peak_flops: float, attainable: float) -> float:
    """The FLOPs that take as long at `peak_flops` as `flops` take at the `attainable` roofline: the
    axis compute curves are fitted and read on, so that their fixed latency (tau_half) stays a time
    whether the call is compute- or bandwidth-bound."""
    return flops * peak_flops / attainable
