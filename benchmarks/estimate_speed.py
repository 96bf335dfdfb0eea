"""Wall time and peak RSS of `advisor estimate` over the whole database, beside `advisor profile
--no-fvcore` (one traced step and nothing else) as the baseline, each in a fresh process measured
from outside (imports count). Medians of --repeats runs.

    python benchmarks/estimate_speed.py [--repeats 3] [--out benchmarks/results/estimate_speed.txt]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = [
    ("resnet50, batch 32, fp32, all GPUs", ["resnet50"], 5.0),
    ("llama 7B, batch 1, seq 2048, amp-bf16, all GPUs", ["llama", "--precision", "amp-bf16"], 15.0),
]
"""(label, model arguments, the issue's bar in seconds)."""


def run(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in GB) of `python -m advisor ARGV` in a fresh process."""
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "advisor", *argv], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    assert os.waitstatus_to_exitcode(status) == 0, process.stderr.read().decode() if process.stderr else status
    return wall, usage.ru_maxrss * 1024 / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    lines = [f"advisor estimate speed, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, medians of {args.repeats}",
             f"{'case':<50} {'estimate s':>10} {'RSS GB':>7} {'trace-only s':>12} {'ratio':>6} {'bar s':>6}"]
    for label, model, bar in CASES:
        estimate = [run(["estimate", *model, "--json"]) for _ in range(args.repeats)]
        baseline = [run(["profile", *model, "--no-fvcore", "--json"]) for _ in range(args.repeats)]
        wall = statistics.median(w for w, _ in estimate)
        base = statistics.median(w for w, _ in baseline)
        rss = max(r for _, r in estimate)
        lines.append(f"{label:<50} {wall:>10.2f} {rss:>7.2f} {base:>12.2f} {wall / base:>6.2f} {bar:>6.1f}"
                     f"  {'ok' if wall < bar else 'OVER'}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
