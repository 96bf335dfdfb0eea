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
    for line in text.splitlines() + [""]:
        if not line.strip():
            if core_id is not None:
                cores.add((physical_id or "0", core_id))
            physical_id = core_id = None
            continue
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in ("model name", "Model", "Processor") and model is None and value:
            model = value
        elif key == "cpu MHz" and mhz is None:
            mhz = float(value)
        elif key in ("flags", "Features"):
            flags.update(value.split())
        elif key == "physical id":
            physical_id = value
        elif key == "core id":
            core_id = value
    return {"model": model, "mhz": mhz, "flags": flags, "physical_cores": len(cores) or None}


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
    )
