"""The local CPU: model, cores, vector extensions, clock and memory, read from the OS."""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

VECTOR_EXTENSIONS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")
"""x86 flags that matter for training math, in /proc/cpuinfo spelling."""

ARM_EXTENSIONS = ("asimd", "sve", "sve2", "bf16", "i8mm", "fphp", "asimdhp")


@dataclass(frozen=True)
class CPUInfo:
    """The local CPU. Clock in Hz, memory in bytes."""

    model: str
    architecture: str
    logical_cores: int
    physical_cores: int
    usable_cores: int
    """Cores this process may run on (affinity), which is what torch uses."""
    clock_hz: float | None
    vector_extensions: tuple[str, ...]
    memory_total_bytes: int | None
    memory_available_bytes: int | None
    vendor: str | None = None
    """"GenuineIntel", "AuthenticAMD", or None (ARM and others)."""
    family: int | None = None
    """x86 CPU family (25 = AMD Zen 3/4, 26 = Zen 5, 6 = most Intel cores)."""
    last_level_cache_bytes: int | None = None

    @property
    def vector_width_bits(self) -> int:
        """Widest SIMD register the CPU offers for fp32 math (512, 256, 128)."""
        if "avx512f" in self.vector_extensions:
            return 512
        if "avx" in self.vector_extensions or "avx2" in self.vector_extensions:
            return 256
        return 128

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "vector_width_bits": self.vector_width_bits}

def parse_cpuinfo(text: str) -> dict[str, Any]:
    """Model, physical cores, MHz and flags from the text of /proc/cpuinfo."""
    model = None
    mhz = None
    flags: set[str] = set()
    cores: set[tuple[str, str]] = set()
    physical_id = core_id = None
    vendor = family = None
    for line in text.splitlines() + [""]:
        if not line.strip():
            if core_id is not None:
                cores.add((physical_id or "0", core_id))
            physical_id = core_id = None
            continue
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in ("model name", "Model", "Processor") and model is None and value:
            model = value
        elif key == "vendor_id" and vendor is None:
            vendor = value
        elif key == "cpu family" and family is None and value.isdigit():
            family = int(value)
        elif key == "cpu MHz" and mhz is None:
            mhz = float(value)
        elif key in ("flags", "Features"):
            flags.update(value.split())
        elif key == "physical id":
            physical_id = value
        elif key == "core id":
            core_id = value
    return {
        "model": model,
        "mhz": mhz,
        "flags": flags,
        "physical_cores": len(cores) or None,
        "vendor": vendor,
        "family": family,
    }


def parse_meminfo(text: str) -> dict[str, int]:
    """MemTotal and MemAvailable in bytes from the text of /proc/meminfo."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if key in ("MemTotal", "MemAvailable") and parts:
            assert len(parts) == 1 or parts[1] == "kB", line
            values[key] = int(parts[0]) * 1024
    return values


def available_memory_bytes() -> int | None:
    """MemAvailable of this machine in bytes; None where /proc/meminfo does not say."""
    return parse_meminfo(_read("/proc/meminfo") or "").get("MemAvailable")


def _read(path: str) -> str | None:
    file = Path(path)
    return file.read_text(encoding="utf-8", errors="replace") if file.is_file() else None


def parse_cache_size(text: str) -> int | None:
    """"32768K" (sysfs cache size) -> 33554432 bytes."""
    text = text.strip()
    units = {"K": 1024, "M": 1024**2, "G": 1024**3}
    if text and text[-1] in units and text[:-1].isdigit():
        return int(text[:-1]) * units[text[-1]]
    return int(text) if text.isdigit() else None


def _last_level_cache_bytes() -> int | None:
    """Size of the highest cache level sysfs lists for cpu0 (the L3 on most machines), in bytes."""
    best: tuple[int, int] | None = None
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        level, size = _read(str(index / "level")), _read(str(index / "size"))
        if level and size and level.strip().isdigit() and (parsed := parse_cache_size(size)):
            if best is None or int(level) >= best[0]:
                best = (int(level), parsed)
    return best[1] if best else None


def _max_clock_hz() -> float | None:
    text = _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    return float(text.strip()) * 1e3 if text else None


def probe_cpu() -> CPUInfo:
    """Read the local CPU. Works on Linux fully; elsewhere with what `platform` and `os` tell."""
    cpuinfo = parse_cpuinfo(_read("/proc/cpuinfo") or "")
    meminfo = parse_meminfo(_read("/proc/meminfo") or "")
    logical = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else logical
    known = VECTOR_EXTENSIONS + ARM_EXTENSIONS
    clock = _max_clock_hz() or (cpuinfo["mhz"] * 1e6 if cpuinfo["mhz"] else None)
    return CPUInfo(
        model=cpuinfo["model"] or platform.processor() or platform.machine() or "unknown CPU",
        architecture=platform.machine(),
        logical_cores=logical,
        physical_cores=cpuinfo["physical_cores"] or logical,
        usable_cores=usable,
        clock_hz=clock,
        vector_extensions=tuple(flag for flag in known if flag in cpuinfo["flags"]),
        memory_total_bytes=meminfo.get("MemTotal"),
        memory_available_bytes=meminfo.get("MemAvailable"),
        vendor=cpuinfo["vendor"],
        family=cpuinfo["family"],
        last_level_cache_bytes=_last_level_cache_bytes(),
    )
