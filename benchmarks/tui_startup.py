"""Time from launching `gpu-advisor` in a real terminal (tmux) until the ranked table is on screen, at
120x40 and 80x24, and whether `q` then quits with status 0; beside it, `advisor estimate` for the same
model (the baseline: the same work without a UI). Medians of --repeats runs.

    python benchmarks/tui_startup.py [--model resnet50] [--repeats 3] [--out benchmarks/results/tui_startup.txt]

Needs tmux (`apt install tmux`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from estimate_speed import fresh  # (wall seconds, peak RSS) of `python ARGV` in a fresh process
from printed import print_report

SIZES = ((120, 40), (80, 24))
READY = "sorted by time"
"""The status line's words once the ranked table is shown."""
TIMEOUT_S = 60.0


def tmux(*arguments: str) -> str:
    return subprocess.run(["tmux", *arguments], check=True, capture_output=True, text=True).stdout


def launch_once(model: str, width: int, height: int) -> tuple[float, int | None]:
    """(seconds until the ranked table shows, exit status after `q`) of one run in a fresh tmux session."""
    session = f"gpu-advisor-bench-{os.getpid()}"
    with tempfile.TemporaryDirectory() as scratch:
        status_file = Path(scratch) / "status"
        bin_dir = Path(sys.executable).parent
        command = (f"{shlex.quote(str(bin_dir / 'gpu-advisor'))} {shlex.quote(model)}; "
                   f"echo $? > {shlex.quote(str(status_file))}; sleep 30")
        started = time.perf_counter()
        tmux("new-session", "-d", "-s", session, "-x", str(width), "-y", str(height), command)
        try:
            while READY not in tmux("capture-pane", "-p", "-t", session):
                if time.perf_counter() - started > TIMEOUT_S:
                    raise SystemExit(f"gpu-advisor showed no ranked table within {TIMEOUT_S:.0f} s")
                time.sleep(0.1)
            shown = time.perf_counter() - started
            tmux("send-keys", "-t", session, "q")
            deadline = time.perf_counter() + 10
            while not status_file.exists() and time.perf_counter() < deadline:
                time.sleep(0.1)
            status = int(status_file.read_text()) if status_file.exists() else None
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    return shown, status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        print("tui_startup: needs tmux (apt install tmux)", file=sys.stderr)
        return 2
    lines = [f"gpu-advisor start-up, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, model {args.model}, "
             f"medians of {args.repeats}",
             f"{'terminal':<10} {'table shown s':>14} {'exit statuses':>14}"]
    for width, height in SIZES:
        runs = [launch_once(args.model, width, height) for _ in range(args.repeats)]
        lines.append(f"{f'{width}x{height}':<10} {statistics.median(r[0] for r in runs):>14.2f} "
                     f"{','.join(str(r[1]) for r in runs):>14}")
    baseline = statistics.median(fresh(['-m', 'advisor', 'estimate', args.model], dict(os.environ))[0]
                                 for _ in range(args.repeats))
    lines.append(f"baseline: `advisor estimate {args.model}` (same work, no UI): {baseline:.2f} s")
    print_report(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
