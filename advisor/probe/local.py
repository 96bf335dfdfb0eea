"""This machine as a whole: its CPU and its NVIDIA GPUs matched to database ids."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any

from advisor.hardware.matching import match_gpu_name
from advisor.hardware.specs import HardwareDB
from advisor.probe.cpu import CPUInfo, probe_cpu
from advisor.probe.nvml import NVMLReport, probe_nvidia


@dataclass(frozen=True)
class LocalMachine:
    """The local CPU and NVIDIA GPUs, and the software that will run the model."""

    hostname: str
    os: str
    python: str
    torch: str | None
    cpu: CPUInfo
    nvidia: NVMLReport

    def to_dict(self) -> dict[str, Any]:
        return {
            "hostname": self.hostname,
            "os": self.os,
            "python": self.python,
            "torch": self.torch,
            "cpu": self.cpu.to_dict(),
            "nvidia": self.nvidia.to_dict(),
        }


def _torch_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def probe_local(db: HardwareDB) -> LocalMachine:
    """Probe the CPU and NVML; GPUs are matched to `db` ids by name and memory."""
    return LocalMachine(
        hostname=platform.node(),
        os=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        torch=_torch_version(),
        cpu=probe_cpu(),
        nvidia=probe_nvidia(lambda name, memory: match_gpu_name(db, name, memory)),
    )
