"""Which CPU prepares a GPU's batches, and how fast one of its threads is against one of this machine's.

Cloud offers name their instance's CPU (hwdb `host_cpu`), each with a published single-thread score
(hwdb/host-cpus.yaml). This machine's CPU is found by its model name (/proc/cpuinfo, lscpu), or, where
a virtual machine hides it ("AMD EPYC"), by its CPUID vendor and family, which name its generation. A
thread of the instance then runs the measured pipeline at score(instance) / score(this machine) of the
rate measured here; where either CPU is unknown, at this machine's rate (and the output says so).
"""

from __future__ import annotations

import functools
import os

from advisor.hardware.specs import HardwareDB, HostCPU
from advisor.probe.cpu import probe_cpu


@functools.lru_cache(maxsize=1)
def _this_cpu_identity() -> tuple[str, str | None]:
    """(model name, "vendor/family") of this machine's CPU."""
    info = probe_cpu()
    family = f"{info.vendor}/{info.family}" if info.vendor and info.family is not None else None
    return info.model, family


def identify(db: HardwareDB, model: str, cpuid_family: str | None) -> tuple[HostCPU | None, bool]:
    """The database's entry for a CPU of model name `model`, and whether it was found by name (False:
    by its CPUID family alone, a stand-in for its generation). (None, False) when neither matches.

    # "Intel(R) Xeon(R) Platinum 8275CL CPU @ 3.00GHz" contains the match "8275CL": found by name
    """
    lowered = model.lower()
    by_name = [cpu for cpu in db.host_cpus if any(m.lower() in lowered for m in cpu.match)]
    if by_name:
        return max(by_name, key=lambda cpu: max(len(m) for m in cpu.match if m.lower() in lowered)), True
    by_family = [cpu for cpu in db.host_cpus if cpuid_family is not None and cpu.cpuid_family == cpuid_family]
    return (by_family[0], False) if by_family else (None, False)


def this_machine_cpu(db: HardwareDB) -> tuple[HostCPU | None, bool]:
    """This machine's CPU in the database (see identify)."""
    return identify(db, *_this_cpu_identity())


def thread_speed(db: HardwareDB, cpu_id: str | None) -> tuple[float, str]:
    """(speed of one thread of `cpu_id` relative to one of this machine's, a few words saying so).

    # an instance scoring 2,600 against this machine's 4,000: 0.65 of this machine's per-thread rate
    """
    target = db.host_cpu(cpu_id)
    if target is None:
        return 1.0, "its CPU is not in the database: taken as fast as this machine's per thread"
    local, by_name = this_machine_cpu(db)
    if local is None:
        return 1.0, f"{target.name}; this machine's CPU is not in the database: taken as fast per thread"
    ratio = target.single_thread_score / local.single_thread_score
    known = "" if by_name else f" (this machine's generation, {local.microarchitecture})"
    return ratio, f"{target.name}, {ratio:.2f}x this machine's single-thread speed{known}"


def physical_memory_bytes() -> float | None:
    """This machine's memory (bytes), None where the OS does not say."""
    try:
        return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None
