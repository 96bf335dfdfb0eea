"""How often a quiet CPU's reference kernel reads "slowed down" (issue #20): against the run's fastest
reading and against its lower quartile, for two reading lengths.

A calibration times its reference kernel (calibration/runner.py REFERENCE_CASE, the 256^3 fp32 GEMM)
before and after each series and keeps the faster; a series whose reading is over MAX_REFERENCE_SLOWDOWN
x the run's baseline is measured again, and refused after MAX_ATTEMPTS. This run imitates quick
calibrations on this machine as it is (run it with nothing else running): per simulated run, `--series`
series, each a reading, `--work-s` of real work (GEMMs and 64 MB copies, as the suite's series do) and a
reading; the reading lengths alternate run by run, so both meet the same host. Per reading length it
prints the share of series over the limit against the run's fastest reading (the old baseline) and
against reference_baseline() (the lower quartile), and the readings' spread.

    python benchmarks/reference_noise.py [--runs 4] [--series 22] [--work-s 0.5] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from advisor.calibration.contention import MAX_REFERENCE_SLOWDOWN, ReferenceKernel, reference_baseline
from advisor.calibration.runner import REFERENCE_CASE
from advisor.calibration.timing import CPUClock

READING_S = (4e-3, 20e-3)
"""The reading lengths compared: 4 ms (REFERENCE_MIN_S until 2026-11-28) and 20 ms (since)."""


def busy_work(seconds: float) -> None:
    """About `seconds` of the suite's kind of work: 512^3 GEMMs and 64 MB copies, alternating."""
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    src, dst = torch.randn(16 * 2**20), torch.empty(16 * 2**20)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        torch.mm(a, b)
        dst.copy_(src)


def one_run(kernel: ReferenceKernel, series: int, work_s: float) -> list[float]:
    """Per simulated series, the faster of its two readings. Seconds."""
    times = []
    for _ in range(series):
        before = kernel.seconds()
        busy_work(work_s)
        times.append(min(before, kernel.seconds()))
    return times


def over_limit(times: list[float], baseline: float) -> float:
    """Share of `times` over MAX_REFERENCE_SLOWDOWN x `baseline`."""
    return sum(t / baseline > MAX_REFERENCE_SLOWDOWN for t in times) / len(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=4, help="simulated calibrations per reading length")
    parser.add_argument("--series", type=int, default=22, help="series per calibration (a quick CPU run: 22)")
    parser.add_argument("--work-s", type=float, default=0.5, help="seconds of work per series")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    clock = CPUClock()
    with torch.no_grad():
        call = REFERENCE_CASE.build("cpu")
    kernels = {s: ReferenceKernel(call, lambda work: clock.time_calls(work, 1), min_s=s) for s in READING_S}
    runs: dict[float, list[list[float]]] = {s: [] for s in READING_S}
    for index in range(args.runs):
        for reading_s in READING_S:
            runs[reading_s].append(one_run(kernels[reading_s], args.series, args.work_s))
            print(f"run {index + 1}/{args.runs}, {reading_s * 1e3:g} ms readings done", flush=True)
    lines = [f"# benchmarks/reference_noise.py --runs {args.runs} --series {args.series} --work-s {args.work_s}",
             f"# {dt.date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
             f"{torch.get_num_threads()} torch threads, torch {torch.__version__}, load {os.getloadavg()[0]:.2f}",
             f"# share of series whose reading is over {MAX_REFERENCE_SLOWDOWN:g}x the run's baseline "
             "(median over runs, and each run's)",
             f"{'reading':>8}  {'best ms':>8}  {'vs fastest (old)':>24}  {'vs lower quartile (new)':>28}  "
             f"{'p50/p90/max of readings vs fastest':>34}"]
    for reading_s, per_run in runs.items():
        old = [over_limit(times, min(times)) for times in per_run]
        new = [over_limit(times, reference_baseline(times)) for times in per_run]
        ratios = sorted(t / min(times) for times in per_run for t in times)
        spread = f"{ratios[len(ratios) // 2]:.2f} / {ratios[int(len(ratios) * 0.9)]:.2f} / {ratios[-1]:.2f}"
        lines.append(f"{reading_s * 1e3:>6g}ms  {min(min(t) for t in per_run) * 1e3:>8.3f}  "
                     f"{statistics.median(old):>6.0%} ({' '.join(f'{x:.0%}' for x in old)}){'':>2}  "
                     f"{statistics.median(new):>6.0%} ({' '.join(f'{x:.0%}' for x in new)}){'':>6}  {spread:>34}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
