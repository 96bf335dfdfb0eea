"""The first estimate of a fresh process after the imports torch's fake tensors need (estimate_speed.py's
"first call"), of two checkouts of the tool in turn, round by round, beside the bare FakeTensorMode +
FlopCounterMode pass of the same model: what a change did to it, on a host whose speed drifts by a third within
minutes (issue #24). Each checkout's modules are compiled to bytecode first, as `pip install` leaves them; the
trace cache and the input pipeline's timing are off, the data cache (advisor/pickled.py) as a user's later runs
find it (filled by a first run of each checkout before the rounds).

    python benchmarks/first_call_ab.py BASE_CHECKOUT NEW_CHECKOUT [--model llama] [--rounds 12] [--out FILE]
"""

from __future__ import annotations

import argparse
import compileall
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from printed import print_report

SPEED = Path(__file__).resolve().parent / "estimate_speed.py"


def first_call(checkout: Path | None, model: str, kind: str) -> float:
    """Seconds of estimate_speed.py's first call ("plan" of `checkout`'s tool, or "bare") in a fresh process."""
    env = {**os.environ, "GPU_ADVISOR_TRACE_CACHE": "off", "GPU_ADVISOR_INPUT_PIPELINE": "off"}
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    found = subprocess.run([sys.executable, str(SPEED), "--first", model, kind], capture_output=True, text=True,
                           env=env, cwd=checkout or SPEED.parent.parent, check=True)
    return float(found.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--model", default="llama")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    checkouts = {"base": args.base.resolve(), "new": args.new.resolve()}
    for checkout in checkouts.values():
        compileall.compile_dir(checkout / "advisor", quiet=1)
        first_call(checkout, args.model, "plan")  # fills the data cache of its code
    times: dict[str, list[float]] = {"base": [], "new": [], "bare": []}
    for _ in range(args.rounds):
        for name, checkout in checkouts.items():
            times[name].append(first_call(checkout, args.model, "plan"))
        times["bare"].append(first_call(None, args.model, "bare"))
    lines = [f"first estimate after the shared imports, {args.model}, {time.strftime('%Y-%m-%d %H:%M')}, "
             f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}, {args.rounds} rounds "
             f"in turn; base {checkouts['base']}, new {checkouts['new']}"]
    for name, seconds in times.items():
        lines.append(f"{name:<5} median {statistics.median(seconds):.3f} s  "
                     f"(min {min(seconds):.3f}, max {max(seconds):.3f})")
    for name in ("base", "new"):
        ratios = [a / b for a, b in zip(times[name], times["bare"])]
        of_medians = statistics.median(times[name]) / statistics.median(times["bare"])
        lines.append(f"{name} / bare: ratio of medians {of_medians:.3f}, "
                     f"median of the rounds' ratios {statistics.median(ratios):.3f} "
                     f"({', '.join(f'{r:.2f}' for r in ratios)})")
    lines.append(f"new / base, median of the rounds' ratios: "
                 f"{statistics.median(n / b for n, b in zip(times['new'], times['base'])):.3f}")
    print_report(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
