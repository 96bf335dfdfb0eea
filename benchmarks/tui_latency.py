"""How long the TUI takes to show new results after a settings change (issue #24), driven by Textual's pilot
in this process: the first estimate (trace and estimate), then a change that needs no new trace (GPUs,
provider, spot, job: the traced step is reused, PlanRequest.trace_key), then one that does (the batch).
Medians of --repeats rounds, each change timed from the form's new values to the worker's result on screen
(the fit advisor off: its search, when nothing fits, runs after the results are shown), and for the batch
change also to the worker's first progress line (the status line says "estimating" at once, synchronously).
The trace cache is off.

    python benchmarks/tui_latency.py [--model llama] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from textual.widgets import Input, Switch

from advisor.app.request import PlanRequest
from advisor.hardware.loader import load_hwdb
from advisor.tui.app import AdvisorApp


async def settled(pilot) -> None:
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


async def one_round(model: str) -> dict[str, float]:
    app = AdvisorApp(load_hwdb(), PlanRequest(model=model, plans="never"))  # the fit advisor is timed apart
    timings: dict[str, float] = {}
    async with app.run_test(size=(120, 40)) as pilot:
        started = time.perf_counter()
        await settled(pilot)
        timings["first estimate (trace)"] = time.perf_counter() - started
        screen = app.screen
        first_progress: list[float] = []
        shown = screen._progress

        def progress(message: str) -> None:
            first_progress.append(time.perf_counter())
            shown(message)

        screen._progress = progress
        for label, change in (("GPUs + spot (no trace)", lambda: _set(screen, "#gpus", "h100-sxm, a10g, t4")),
                              ("job samples (no trace)", lambda: _set(screen, "#samples", "5000")),
                              ("batch (trace again)", lambda: _set(screen, "#batch", "2"))):
            change()
            if label.startswith("GPUs"):
                screen.query_one("#spot", Switch).value = True
            first_progress.clear()
            started = time.perf_counter()
            screen.action_estimate()
            await settled(pilot)
            timings[label] = time.perf_counter() - started
            if label.startswith("batch"):
                timings["batch: first progress line"] = first_progress[0] - started
    return timings


def _set(screen, selector: str, value: str) -> None:
    screen.query_one(selector, Input).value = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ["GPU_ADVISOR_TRACE_CACHE"] = "off"  # every trace is traced: the cache would hide the batch change
    rounds = [asyncio.run(one_round(args.model)) for _ in range(args.repeats)]
    first = statistics.median(r["first estimate (trace)"] for r in rounds)
    print(f"model {args.model}, {args.repeats} rounds, medians (seconds, and as a share of the first estimate "
          "measured in the same run):")
    for label in rounds[0]:
        median = statistics.median(r[label] for r in rounds)
        print(f"  {label:26} {median:7.2f} s  {median / first:6.2f}x")


if __name__ == "__main__":
    main()
