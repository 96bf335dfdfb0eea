"""The probe of this machine: /proc parsing on fixed text, NVML absence as a normal answer."""

from __future__ import annotations

import pynvml
import pytest

from advisor.hardware.loader import load_hwdb
from advisor.hardware.matching import match_gpu_name
from advisor.probe import nvml
from advisor.probe.cpu import parse_cpuinfo, parse_meminfo, probe_cpu

CPUINFO = """processor\t: 0
model name\t: Example CPU 9000
cpu MHz\t\t: 2596.140
physical id\t: 0
core id\t\t: 0
flags\t\t: fpu sse4_2 avx avx2 fma avx512f

processor\t: 1
model name\t: Example CPU 9000
physical id\t: 0
core id\t\t: 1
flags\t\t: fpu sse4_2 avx avx2 fma avx512f

processor\t: 2
model name\t: Example CPU 9000
physical id\t: 0
core id\t\t: 0
flags\t\t: fpu sse4_2 avx avx2 fma avx512f
"""


def test_parse_cpuinfo_counts_physical_cores_not_threads() -> None:
    info = parse_cpuinfo(CPUINFO)
    # three logical processors, two distinct (physical id, core id) pairs
    assert info["physical_cores"] == 2
    assert info["model"] == "Example CPU 9000"
    assert info["mhz"] == pytest.approx(2596.14)
    assert {"avx2", "avx512f", "fma"} <= info["flags"]


def test_parse_meminfo_in_bytes() -> None:
    values = parse_meminfo("MemTotal:       24684084 kB\nMemFree: 1 kB\nMemAvailable:   24407120 kB\n")
    # 24,684,084 kB * 1024 = 25,276,502,016 bytes
    assert values == {"MemTotal": 25_276_502_016, "MemAvailable": 24_407_120 * 1024}


def test_probe_cpu_on_this_machine() -> None:
    cpu = probe_cpu()
    assert cpu.logical_cores >= cpu.usable_cores >= 1
    assert cpu.vector_width_bits in (128, 256, 512)
    assert cpu.to_dict()["model"]


def test_no_driver_is_a_normal_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", fail)
    report = nvml.probe_nvidia()
    assert report.available is False and report.gpus == ()
    assert "NVML" in report.reason


def test_cuda_version_decoding() -> None:
    # NVML encodes CUDA 12.4 as 12040 and 11.8 as 11080
    assert nvml._cuda_version(12040) == "12.4"
    assert nvml._cuda_version(11080) == "11.8"


@pytest.mark.parametrize(
    ("name", "memory_mib", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", 81559, "h100-sxm"),
        ("NVIDIA H100 PCIe", 81559, "h100-pcie"),
        ("NVIDIA A100-SXM4-40GB", 40960, "a100-sxm4-40gb"),
        ("NVIDIA GeForce RTX 4090", 24564, "rtx-4090"),
        ("NVIDIA A10G", 22888, "a10g"),
        ("Tesla T4", 15360, "t4"),
        ("Quadro RTX 6000", 24576, "quadro-rtx-6000"),
        ("NVIDIA RTX 6000 Ada Generation", 49140, "rtx-6000-ada"),
        ("NVIDIA GeForce RTX 3060", 8192, None),  # the 8 GB variant is not the 12 GB card we have
        ("NVIDIA GeForce RTX 4090 D", 24564, None),  # a different card, not a packaging word
    ],
)
def test_driver_names_match_database_ids(name: str, memory_mib: int, expected: str | None) -> None:
    db = load_hwdb(include_user_layers=False)
    assert match_gpu_name(db, name, memory_mib * 2**20) == expected


def test_report_json_keeps_each_gpus_local_id() -> None:
    gpu = nvml.LocalGPU(0, "NVIDIA H100 80GB HBM3", None, 80 * 2**30, 79 * 2**30, 1.98e9, 2.6e9, 700.0, "9.0", "h100-sxm")
    report = nvml.NVMLReport(True, None, "560.35", "12.6", (gpu,))
    data = report.to_dict()
    assert data["gpus"][0]["local_id"] == "local-cuda0"
    assert data["gpus"][0]["matched_id"] == "h100-sxm"
