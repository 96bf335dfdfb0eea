"""The caching allocator's replay compiled (native/gpu_advisor_allocator.c) against the Python one
(CachingAllocator.run), on the layouts an estimate over every GPU re-plays (issue #24): the 7B example's step and
the ZeRO-1, ZeRO-2 and FSDP ranks at 2, 4 and 8 GPUs, and DDP's, each re-played uncapped and capped at its
allocated peak (the capped replay of a GPU between the allocated peak and the reserve). Both replays of a layout
are timed in turn, round by round; the figures are medians, and their peaks are checked equal.

    python benchmarks/allocator_replay.py [--model llama] [--rounds 7] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("GPU_ADVISOR_TRACE_CACHE", "off")

from printed import print_report  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from advisor.estimate.parallel import LayoutMemory
    from advisor.memory import allocator
    from advisor.memory.allocator import MIN_BLOCK, replay_events
    from advisor.memory.plan import MemorySettings, trace_both_batches
    from advisor.parallel.strategy import Layout
    from advisor.profile.model_file import load_model_file

    assert allocator.native_module() is not None, "the compiled replay is not built: `pip install .` (a C compiler)"
    model = load_model_file(args.model)
    trace, second = trace_both_batches(model, MemorySettings(model.default_batch_size, "amp-bf16", "adamw"),
                                       parallel=False)
    layouts = LayoutMemory(trace, second)
    ranks = [trace] + [layouts._rank_trace(Layout(strategy, gpus, gpus)) for gpus in (2, 4, 8)
                       for strategy in ("zero1", "zero2", "fsdp")] + [layouts._rank_trace(Layout("ddp", 2, 2))]
    cases = []
    for rank in ranks:
        memory = rank.memory
        assert memory is not None
        sizes = memory.sizes(MIN_BLOCK)
        in_step = [s.allocated_at >= 0 for s in memory.storages]
        free = replay_events(memory.events, in_step, 2, sizes, native=False)
        cases += [(memory.events, in_step, sizes, None), (memory.events, in_step, sizes, free.allocated)]
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.rounds):
        for native in (False, True):
            started = time.perf_counter()
            found = [replay_events(events, in_step, 2, sizes, capacity, native=native)
                     for events, in_step, sizes, capacity in cases]
            times[native].append(time.perf_counter() - started)
            if native:
                assert found == expected, "the compiled replay's peaks differ from the Python one's"
            else:
                expected = found
    python, compiled = (statistics.median(times[native]) for native in (False, True))
    events = sum(len(events) for events, *_ in cases)
    lines = [f"allocator replay, {args.model}, {len(cases)} replays ({len(ranks)} layouts, uncapped and capped at "
             f"the allocated peak; {events:,} events, each re-played for two steps), {time.strftime('%Y-%m-%d %H:%M')}, "
             f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}, medians of "
             f"{args.rounds} rounds in turn",
             f"Python replay   {python * 1e3:8.1f} ms",
             f"compiled replay {compiled * 1e3:8.1f} ms  (the same peaks)",
             f"compiled / Python: {compiled / python:.3f} (median of the rounds' ratios "
             f"{statistics.median(c / p for c, p in zip(times[True], times[False])):.3f})"]
    print_report(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
