"""How much of a CPU training step is glibc's malloc giving memory back and faulting it in again (issue #20).

Each model's real training steps run in fresh processes (a user's `python train.py`), twice per repeat:
- "glibc": the default malloc settings. glibc serves a request at or above its mmap threshold (128 KiB at
  start, raised to the size of each mmapped block freed, at most 32 MiB) with fresh pages, and gives the top
  of its heap back to the kernel whenever more than its trim threshold (twice the mmap threshold) is free
  there; a training step frees its activations in the backward, so the next forward faults them in again;
- "settled": the same steps with glibc told to keep freed memory in its heap (no mmapped blocks, no trimming
  below 2 GiB free: SETTLED), as a caching allocator such as jemalloc or tcmalloc, or a process whose heap a
  larger model settled before, keeps it.
The tool's CPU model counts the page faults of outputs above 32 MiB (glibc maps those afresh every step,
whatever the history), not the heap trimming below that, whose amount the process's history decides.
It prints the median step time and the minor page faults per step (getrusage) of both, and the tool's
prediction from a quick calibration measured at the start of this run, as error against each.

    python benchmarks/cpu_allocator.py [--models mlp_example,tv_resnet18,...] [--repeats 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from accuracy import timed_step  # noqa: E402
from heldout import available, model_parts  # noqa: E402
from printed import print_report  # noqa: E402

SETTLED = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}
"""glibc's environment variables (mallopt(3)) for a heap that keeps what is freed: no mmapped blocks, no
trimming."""

WARM_STEPS = 3
TIMED_STEPS = 8


def child(name: str) -> dict[str, float]:
    """In a fresh process: the median seconds and minor page faults of TIMED_STEPS steps after WARM_STEPS."""
    build, make_input, loss_fn, batch, optimizer = model_parts(name)
    step = timed_step((build, make_input, loss_fn), batch, "fp32", optimizer)
    for _ in range(WARM_STEPS):
        step()
    seconds, faults = [], []
    for _ in range(TIMED_STEPS):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        seconds.append(step())
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return {"step_s": statistics.median(seconds), "faults": statistics.median(faults)}


def run_child(name: str, settled: bool) -> dict[str, float]:
    env = {**os.environ, **(SETTLED if settled else {})}
    if not settled:
        for key in SETTLED:
            env.pop(key, None)
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", name], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def predictions(names: list[str]) -> tuple[dict[str, float], str]:
    """Each model's predicted step seconds from a quick calibration of this CPU measured now, in a cache of
    its own, and a line on that calibration."""
    from advisor.calibration.reference import load_families
    from advisor.estimate.step import estimate_records
    from advisor.estimate.targets import local_targets
    from advisor.hardware.loader import load_hwdb
    from advisor.profile.trace import trace_training_step

    db = load_hwdb([])
    with tempfile.TemporaryDirectory() as cache, mock.patch.dict(os.environ, {"GPU_ADVISOR_CACHE_DIR": cache}):
        targets = local_targets(db, load_families(db), lambda m: print(f"advisor: {m}", file=sys.stderr))
    assert targets, "the quick calibration of this CPU was refused (see above): run this on a quiet machine"
    cpu = targets[0]
    predicted = {}
    for name in names:
        build, make_input, loss_fn, batch, optimizer = model_parts(name)
        trace = trace_training_step(build, make_input, batch, "fp32", optimizer, loss_fn)
        predicted[name] = estimate_records(trace.records, "fp32", cpu.device).step_s
    return predicted, f"{cpu.name}; quick calibration {cpu.device.profile.created}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(["mlp_example", *available()]))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)))
        return 0
    names = args.models.split(",")
    predicted, calibration = predictions(names)
    lines = [f"CPU steps under glibc's malloc, {dt.date.today()}, torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads; {calibration}",
             f"each model in fresh processes, {args.repeats} repeats (medians of {TIMED_STEPS} steps after "
             f"{WARM_STEPS}); settled = {' '.join(f'{k}={v}' for k, v in SETTLED.items())}",
             f"{'model':<24} {'glibc ms':>9} {'faults MiB':>10} {'settled ms':>10} {'faults MiB':>10} "
             f"{'glibc/settled':>13} {'ours ms':>8} {'err glibc':>9} {'err settled':>11}"]
    ratios, against_glibc, against_settled = [], [], []
    started = time.perf_counter()
    for name in names:
        runs = {mode: [run_child(name, mode == "settled") for _ in range(args.repeats)]
                for mode in ("glibc", "settled")}
        step = {mode: statistics.median(r["step_s"] for r in rs) for mode, rs in runs.items()}
        faults = {mode: statistics.median(r["faults"] for r in rs) * resource.getpagesize() / 2**20
                  for mode, rs in runs.items()}
        ours = predicted[name]
        ratios.append(step["glibc"] / step["settled"])
        against_glibc.append(ours / step["glibc"] - 1)
        against_settled.append(ours / step["settled"] - 1)
        lines.append(f"{name:<24} {step['glibc'] * 1e3:>9.1f} {faults['glibc']:>10.1f} "
                     f"{step['settled'] * 1e3:>10.1f} {faults['settled']:>10.1f} {ratios[-1]:>13.2f} "
                     f"{ours * 1e3:>8.1f} {against_glibc[-1]:>+9.1%} {against_settled[-1]:>+11.1%}")
        print(lines[-1], file=sys.stderr, flush=True)
    lines += [f"glibc / settled step time: median {statistics.median(ratios):.2f}, range {min(ratios):.2f}-"
              f"{max(ratios):.2f}",
              f"ours against glibc's steps: median |error| {statistics.median(abs(e) for e in against_glibc):.1%}; "
              f"against settled steps: {statistics.median(abs(e) for e in against_settled):.1%}",
              f"({time.perf_counter() - started:.0f} s)"]
    print_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
