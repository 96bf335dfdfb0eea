"""Local NVIDIA GPUs through NVML (module `pynvml` from nvidia-ml-py).

No driver, no library or no GPU is a normal answer: `probe_nvidia()` then returns an NVMLReport
with `available=False` and the reason NVML gave, never an exception.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import pynvml


@dataclass(frozen=True)
class LocalGPU:
    """One local NVIDIA GPU as NVML sees it. Memory in bytes, clocks in Hz, power in watts."""

    index: int
    name: str
    uuid: str | None
    memory_total_bytes: int
    memory_free_bytes: int
    sm_clock_max_hz: float | None
    memory_clock_max_hz: float | None
    power_limit_watts: float | None
    compute_capability: str | None
    matched_id: str | None
    """The hwdb id this GPU matches, or None."""

    @property
    def local_id(self) -> str:
        return f"local-cuda{self.index}"

    def to_dict(self) -> dict[str, Any]:
        return {"local_id": self.local_id, **asdict(self)}

@dataclass(frozen=True)
class NVMLReport:
    """What NVML said: the GPUs, the driver and CUDA versions, or why it could not answer."""

    available: bool
    reason: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: tuple[LocalGPU, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gpus": [gpu.to_dict() for gpu in self.gpus]}

def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _optional_query(function, *args) -> Any:
    """A query some GPUs do not support (NVML_ERROR_NOT_SUPPORTED): None instead of a value."""
    try:
        return function(*args)
    except pynvml.NVMLError_NotSupported:
        return None


def _cuda_version(raw: int) -> str:
    # NVML encodes CUDA 12.4 as 12040.
    return f"{raw // 1000}.{(raw % 1000) // 10}"


def probe_nvidia(match_name=None) -> NVMLReport:
    """Query NVML. `match_name(name, memory_bytes) -> id | None` maps a GPU to a database id."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return NVMLReport(available=False, reason=f"NVML unavailable: {exc}")
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = _cuda_version(pynvml.nvmlSystemGetCudaDriverVersion())
        gpus = tuple(_probe_device(i, match_name) for i in range(pynvml.nvmlDeviceGetCount()))
    finally:
        pynvml.nvmlShutdown()
    reason = None if gpus else "the NVIDIA driver reports no GPU"
    return NVMLReport(True, reason, driver, cuda, gpus)


def _probe_device(index: int, match_name) -> LocalGPU:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    name = _text(pynvml.nvmlDeviceGetName(handle))
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    sm_clock = _optional_query(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM)
    mem_clock = _optional_query(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_MEM)
    power_mw = _optional_query(pynvml.nvmlDeviceGetPowerManagementLimit, handle)
    capability = _optional_query(pynvml.nvmlDeviceGetCudaComputeCapability, handle)
    return LocalGPU(
        index=index,
        name=name,
        uuid=_optional_query(lambda h: _text(pynvml.nvmlDeviceGetUUID(h)), handle),
        memory_total_bytes=int(memory.total),
        memory_free_bytes=int(memory.free),
        sm_clock_max_hz=sm_clock * 1e6 if sm_clock else None,
        memory_clock_max_hz=mem_clock * 1e6 if mem_clock else None,
        power_limit_watts=power_mw / 1000 if power_mw else None,
        compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
        matched_id=match_name(name, int(memory.total)) if match_name else None,
    )
