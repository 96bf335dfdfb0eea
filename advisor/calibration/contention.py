"""Is something else using the CPUs while we measure? (issue #20)

A 2-core VM with one busy program beside a calibration does not just run it 2x slower: a torch op
split over 2 threads waits at its barrier for the thread whose core the other program holds, up to a
scheduler time slice (about 8 ms on this VM, where a 4 MB element-wise op takes 0.05-0.3 ms). The
timings of such a run say nothing about the machine. Two detectors, cheap enough to run around every
series:

- CPU time from /proc/stat (all CPUs; user, nice, system, irq, softirq) less this process's own CPU
  time (time.process_time(), all its threads): what other programs ran; and the steal column: what
  the hypervisor gave other guests. Linux counts in clock ticks (10 ms), so figures over less than a
  second are approximate; the runner reads them around whole series.
- A reference kernel, a small fixed GEMM on the device being calibrated, timed (best of a few) before
  and after each series: slower than the run's baseline (reference_baseline) means the host slowed down
  in ways /proc/stat does not show (a noisy neighbour's memory traffic, power or thermal limits).

Seconds and CPUs (1.0 = one CPU busy for the whole interval).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from advisor.calibration.profile import Contention, Fingerprint

PROC_STAT = Path("/proc/stat")

MARGIN_CORES = 0.25
"""Other programs may use this much CPU beside torch's threads before a measurement counts as
disturbed: an idle desktop's daemons use 0.01-0.05 CPUs, one busy program a whole one."""

MAX_REFERENCE_SLOWDOWN = 1.25
"""The reference kernel may run this much slower than the run's baseline (reference_baseline) before the
series it brackets counts as disturbed."""

MAX_ATTEMPTS = 3
"""A disturbed series is measured again later in the run, at most this many times in all."""

REFERENCE_MIN_CALLS = 5
REFERENCE_MIN_S = 20e-3
REFERENCE_MAX_CALLS = 400
"""The reference kernel's time is the best of at least REFERENCE_MIN_CALLS calls and REFERENCE_MIN_S
seconds of them (at most REFERENCE_MAX_CALLS). Best of 3 calls was not enough on a quiet 2-core VM:
timed 60 times between bursts of other work, 12 of 60 best-of-3 readings of the 0.2 ms GEMM ran over
1.25x the best (a wake-up or a neighbour's burst caught in all three calls), so quick calibrations
were refused at rest; best of 20 calls (4 ms), 0 of 60 (2026-11-27). On a noisier host of the same
kind (2026-11-28, benchmarks/reference_noise.py) 4 ms readings put a median 23% of a quiet run's series
over 1.25x its fastest reading, 20 ms readings 9% (against the lower quartile, REFERENCE_BASELINE_QUANTILE:
7% each)."""

REFERENCE_BASELINE_QUANTILE = 0.25
"""The run's baseline reference time is this quantile of its series' reference times, not their
minimum: the fastest of 20-50 readings is an extreme value that falls as the suite grows, and on a
2-core VM at rest best-of-20 readings of the 0.2 ms GEMM sat a median 1.15-1.27x above the fastest of
100-4000 of them (2026-11-28), so against the minimum a quick calibration at rest found a quarter to
half its series "slowed down" and was refused (2026-11-28: gemm/fp32 1.89x in each of 3 attempts)."""


@dataclass(frozen=True)
class CPUSnapshot:
    """Cumulative counters at one instant. Seconds."""

    wall_s: float
    busy_s: float
    """CPU time of every CPU, all programs (ours included), not idle, not iowait, not steal."""
    steal_s: float
    own_s: float
    """CPU time of this process, all its threads."""


def read_proc_stat(text: str, ticks_per_s: float) -> tuple[float, float]:
    """(busy, steal) seconds from /proc/stat's first line ("cpu  user nice system idle iowait irq
    softirq steal guest guest_nice", in clock ticks). Guest time is already inside user and nice.

    # "cpu  100 0 50 800 0 0 10 40 0 0" at 100 ticks/s: busy (100 + 0 + 50 + 0 + 10) / 100 = 1.6 s,
    # steal 40 / 100 = 0.4 s
    """
    fields = text.split("\n", 1)[0].split()
    assert fields and fields[0] == "cpu", f"unexpected /proc/stat: {fields[:1]}"
    values = [float(v) for v in fields[1:]] + [0.0] * 8
    user, nice, system, _idle, _iowait, irq, softirq, steal = values[:8]
    return (user + nice + system + irq + softirq) / ticks_per_s, steal / ticks_per_s


def cpu_snapshot(stat: Path = PROC_STAT) -> CPUSnapshot | None:
    """The counters now; None where the OS has no /proc/stat (macOS, Windows)."""
    try:
        text = stat.read_text()
        ticks = float(os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, AttributeError):
        return None
    busy, steal = read_proc_stat(text, ticks)
    return CPUSnapshot(time.monotonic(), busy, steal, time.process_time())


def contention_between(before: CPUSnapshot | None, after: CPUSnapshot | None,
                       reference_slowdown: float | None = None, attempts: int = 1) -> Contention:
    """Other programs' and steal CPUs between two snapshots (None each where /proc/stat is missing).

    # 2 s apart, all CPUs busy 3.0 s of which ours 1.9 s, steal 0.2 s: others (3.0 - 1.9) / 2 = 0.55
    # CPUs, steal 0.2 / 2 = 0.1 CPUs
    """
    if before is None or after is None:
        return Contention(0.0, None, None, reference_slowdown, attempts)
    seconds = max(after.wall_s - before.wall_s, 1e-9)
    others = (after.busy_s - before.busy_s) - (after.own_s - before.own_s)
    steal = after.steal_s - before.steal_s
    return Contention(round(seconds, 4), round(max(0.0, others) / seconds, 3), round(max(0.0, steal) / seconds, 3),
                      reference_slowdown, attempts)


def allowed_busy_cores(usable_cpus: int, torch_threads: int) -> float:
    """CPU time others may take without disturbing torch's threads: the CPUs torch leaves free, plus
    MARGIN_CORES.

    # 2 CPUs, 2 threads: 0 + 0.25 = 0.25; 16 CPUs, 8 threads: 8 + 0.25 = 8.25
    """
    return max(0, usable_cpus - torch_threads) + MARGIN_CORES


def allowed_for(fingerprint: Fingerprint | None, kind: str) -> float | None:
    """allowed_busy_cores() of the machine a profile was measured on: its CPU's cores and torch threads;
    None for a GPU (other CPU programs do not slow its kernels) or a profile without a fingerprint."""
    if kind != "cpu" or fingerprint is None:
        return None
    return allowed_busy_cores(fingerprint.cpu_cores, fingerprint.torch_threads)


def disturbance(contention: Contention, allowed_cores: float | None) -> str | None:
    """Why a measurement taken under `contention` is not to be trusted, or None. `allowed_cores`:
    allowed_for() the device (None on a GPU: only the reference kernel counts)."""
    busy = contention.busy_cores
    if allowed_cores is not None and busy is not None and busy > allowed_cores:
        what = [f"other programs used {contention.others_cores:.2f} CPUs"]
        if contention.steal_cores:
            what.append(f"the hypervisor took {contention.steal_cores:.2f} (steal)")
        return f"{' and '.join(what)} while it was measured (at most {allowed_cores:.2f} leave torch's threads alone)"
    if contention.reference_slowdown is not None and contention.reference_slowdown > MAX_REFERENCE_SLOWDOWN:
        return (f"the reference kernel ran {contention.reference_slowdown:.2f}x slower than the run's baseline "
                f"(limit {MAX_REFERENCE_SLOWDOWN:g}x): the device was slowed down")
    return None


def reference_baseline(seconds: Sequence[float]) -> float:
    """The run's typical fast reference time: the REFERENCE_BASELINE_QUANTILE of the series' reference
    times, by nearest rank rounding down (the minimum for fewer than 5 series). Seconds.

    # 22 series: sorted index (22 - 1) // 4 = 5, the 6th fastest; 4 series: index 0, the fastest
    """
    assert seconds, "no reference times"
    ordered = sorted(seconds)
    return ordered[int((len(ordered) - 1) * REFERENCE_BASELINE_QUANTILE)]


class ReferenceKernel:
    """A fixed small op, timed before and after each series (best of its calls over `min_s`, default
    REFERENCE_MIN_S)."""

    def __init__(self, call: Callable[[], object], clock_seconds: Callable[[Callable[[], object]], float],
                 min_s: float = REFERENCE_MIN_S) -> None:
        self._call = call
        self._time = clock_seconds
        self._min_s = min_s
        self._time(self._call)  # first call: allocation, kernel selection

    def seconds(self) -> float:
        times = [self._time(self._call) for _ in range(REFERENCE_MIN_CALLS)]
        while sum(times) < self._min_s and len(times) < REFERENCE_MAX_CALLS:
            times.append(self._time(self._call))
        return min(times)
