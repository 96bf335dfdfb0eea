"""The caching allocator's replay compiled (native/gpu_advisor_allocator.c) against the Python one
(CachingAllocator.run), on the layouts an estimate over every GPU re-plays (issue #24): the 7B example's step and
the ZeRO-1, ZeRO-2 and FSDP ranks at 2, 4 and 8 GPUs, and DDP's, each re-played uncapped and capped at its
allocated peak (the capped replay of a GPU between the allocated peak and the reserve). Both replays of a layout
are timed in turn, round by round; the figures are medians, and their peaks are checked equal.

    python benchmarks/allocator_replay.py [--model llama] [--rounds 7] [--out FILE]

With --parity MODEL..., instead: each model's step and twice its batch, and its ZeRO-1, ZeRO-2, FSDP and DDP ranks
at 2 and 8 GPUs, re-played both ways uncapped and under four capacities (half the allocated peak, the allocated
peak, between it and the reserve, the reserve): the peaks must be equal.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("GPU_ADVISOR_TRACE_CACHE", "off")

from printed import print_report  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--parity", nargs="+", metavar="MODEL")
    args = parser.parse_args()
    if args.parity:
        print_report(parity(args.parity), args.out)
        return 0

    from advisor.memory import allocator
    from advisor.memory.allocator import replay_events
    from advisor.parallel.strategy import Layout

    assert allocator.native_module() is not None, "the compiled replay is not built: `pip install .` (a C compiler)"
    trace, _, layouts = traced_layouts(args.model)
    ranks = [trace] + [layouts._rank_trace(Layout(strategy, gpus, gpus)) for gpus in (2, 4, 8)
                       for strategy in ("zero1", "zero2", "fsdp")] + [layouts._rank_trace(Layout("ddp", 2, 2))]
    cases = []
    for rank in ranks:
        events, in_step, sizes = replay_inputs(rank)
        free = replay_events(events, in_step, 2, sizes, native=False)
        cases += [(events, in_step, sizes, None), (events, in_step, sizes, free.allocated)]
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.rounds):
        found: dict[bool, list] = {}
        for native in (False, True):
            started = time.perf_counter()
            found[native] = [replay_events(events, in_step, 2, sizes, capacity, native=native)
                             for events, in_step, sizes, capacity in cases]
            times[native].append(time.perf_counter() - started)
        assert found[True] == found[False], "the compiled replay's peaks differ from the Python one's"
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


def traced_layouts(name: str) -> tuple[Any, Any, Any]:
    """Model `name`'s step at its default batch and at twice it (amp-bf16, AdamW), and their LayoutMemory."""
    from advisor.estimate.parallel import LayoutMemory
    from advisor.memory.plan import MemorySettings, trace_both_batches
    from advisor.profile.model_file import load_model_file

    model = load_model_file(name)
    trace, second = trace_both_batches(model, MemorySettings(model.default_batch_size, "amp-bf16", "adamw"),
                                       parallel=False)
    return trace, second, LayoutMemory(trace, second)


def replay_inputs(rank: Any) -> tuple[Any, list[bool], list[int]]:
    """(events, in_step, sizes) of a traced step's memory, as allocator.replay hands them to replay_events."""
    from advisor.memory.allocator import MIN_BLOCK

    memory = rank.memory
    assert memory is not None
    return memory.events, [s.allocated_at >= 0 for s in memory.storages], memory.sizes(MIN_BLOCK)


def parity(models: list[str]) -> list[str]:
    """Per model, its replays both ways (see the module docstring), asserted equal; the report's lines."""
    from advisor.memory.allocator import native_module, replay_events
    from advisor.parallel.strategy import Layout

    assert native_module() is not None, "the compiled replay is not built: `pip install .` (a C compiler)"
    lines = [f"allocator replay, compiled against Python, {time.strftime('%Y-%m-%d %H:%M')}: each model's step at its "
             "default batch and at twice it, and its ZeRO-1, ZeRO-2, FSDP and DDP ranks at 2 and 8 GPUs (amp-bf16, "
             "AdamW), uncapped and capped at half the allocated peak, the allocated peak, between it and the reserve, "
             "and the reserve"]
    total = 0
    for name in models:
        trace, second, layouts = traced_layouts(name)
        ranks = [trace, second] + [layouts._rank_trace(Layout(strategy, gpus, gpus)) for gpus in (2, 8)
                                   for strategy in ("zero1", "zero2", "fsdp", "ddp")]
        replays = flushed = ran_out = events = 0
        for rank in ranks:
            step_events, in_step, sizes = replay_inputs(rank)
            free = replay_events(step_events, in_step, 2, sizes, native=False)
            for capacity in (None, free.allocated // 2, free.allocated, (free.allocated + free.reserved) // 2,
                             free.reserved):
                python = replay_events(step_events, in_step, 2, sizes, capacity, native=False)
                compiled = replay_events(step_events, in_step, 2, sizes, capacity)
                assert compiled == python, (name, capacity, compiled, python)
                replays += 1
                flushed += python.flushes > 0 and not python.out_of_memory
                ran_out += python.out_of_memory
            events += len(step_events)
        total += replays
        lines.append(f"{name:<18} {replays} replays equal ({events:,} events; {flushed} flushed and held, "
                     f"{ran_out} ran out)")
    lines.append(f"all {total} replays: the same peaks, segments, flushes and out-of-memory")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
