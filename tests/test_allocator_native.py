"""The compiled replay of the caching allocator (native/gpu_advisor_allocator.c) against the Python one
(CachingAllocator.run, the definition): the same peaks, segments, flushes and out-of-memory on event streams
made to reach every rule (both pools, splits, merges with either neighbour, whole segments released under a
capacity, running out), on traced steps, and the same errors."""

from __future__ import annotations

import random
import shutil
import sysconfig

import pytest

from advisor.memory import allocator
from advisor.memory.allocator import MIN_BLOCK, AllocatorPeaks, replay, replay_events, round_request

MIB = 2**20


@pytest.fixture(scope="module")
def native() -> object:
    """The compiled module; where it is missing, a failure on a machine with a C compiler (`pip install`
    builds it there), a skip on one without (the tool runs its Python replay)."""
    found = allocator.native_module()
    if found is None and not allocator.native_wanted():
        pytest.skip("GPU_ADVISOR_NATIVE=off")
    if found is None:
        compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
        if shutil.which(compiler):
            pytest.fail(f"gpu_advisor_allocator is not built though {compiler} is here: `pip install .` builds it "
                        "(setup.py); GPU_ADVISOR_NATIVE=off turns it off")
        pytest.skip("no C compiler: the compiled replay was not built")
    return found


def both(events: list[int], in_step: list[bool], sizes: list[int], capacity: int | None = None,
         steps: int = 2) -> AllocatorPeaks:
    """The peaks of the compiled replay, asserted equal to the Python one's."""
    python = replay_events(events, in_step, steps, sizes, capacity, native=False)
    compiled = replay_events(events, in_step, steps, sizes, capacity)
    assert compiled == python, (compiled, python)
    return compiled


def random_step(seed: int, storages: int = 400, before: int = 20) -> tuple[list[int], list[bool], list[int]]:
    """A step of `storages`: `before` of them alive from before it (allocated first, never freed), the others
    allocated in order and each freed at a random later point or held to the end; sizes from 512 bytes to
    48 MiB, some empty, rounded as the allocator rounds them."""
    rng = random.Random(seed)
    sizes = [0 if rng.random() < 0.02 else round_request(int(rng.choice((2e3, 6e4, 7e5, 3e6, 1.2e7, 5e7)) *
                                                             rng.uniform(0.2, 1.0))) for _ in range(storages)]
    events = list(range(before))
    live: list[int] = []
    for storage in range(before, storages):
        events.append(storage)
        live.append(storage)
        while live and rng.random() < 0.55:
            events.append(~live.pop(rng.randrange(len(live))))
    for storage in live[: len(live) // 2]:
        events.append(~storage)
    return events, [i >= before for i in range(storages)], sizes


@pytest.mark.parametrize("seed", range(12))
def test_the_compiled_replay_gives_the_python_replays_peaks_on_random_steps(native: object, seed: int) -> None:
    events, in_step, sizes = random_step(seed)
    free = both(events, in_step, sizes)
    assert free.reserved >= free.allocated > 0 and not free.out_of_memory and free.flushes == 0
    # capped: at the reserve it needs nothing changes; below it, segments are released (flushes) or it runs out
    assert both(events, in_step, sizes, capacity=free.reserved) == free
    for capacity in (free.allocated, (free.allocated + free.reserved) // 2, free.allocated // 3, 3 * MIB, 0):
        both(events, in_step, sizes, capacity=capacity)
    for steps in (1, 3):
        both(events, in_step, sizes, steps=steps)


def test_the_random_steps_reach_every_rule(native: object) -> None:
    # not a test that passes whatever the streams are: they must flush, run out, and use both pools
    found = []
    for seed in range(12):
        step = random_step(seed)
        free = both(*step)
        found += [free] + [both(*step, capacity=capacity) for capacity in (free.allocated, free.reserved - 1)]
    assert any(p.flushes and not p.out_of_memory for p in found)
    assert any(p.out_of_memory for p in found)
    assert any(p.segments and not p.flushes for p in found)


def test_by_hand(native: object) -> None:
    # storage 0 (512 B, from before the step), 1 (3 MiB), 2 (700 KiB), free 1, 3 (2 MiB), free 2, hold 3:
    # small pool: 0 splits a 2 MiB segment (512 B used), 2 takes 700 KiB of its remainder;
    # large pool: 1 gets a 20 MiB segment (3 MiB used, 17 MiB split off), freed (merged back: 20 MiB free),
    # 3 takes 2 MiB of it. Peak allocated: 512 + 3 MiB + 700 KiB = 3,854,848 B; reserved 22 MiB, 2 segments.
    # The second step re-uses the cached segments: no more.
    sizes = [512, 3 * MIB, 700 * 1024, 2 * MIB]
    events = [0, 1, 2, ~1, 3, ~2]
    peaks = both(events, [False, True, True, True], sizes)
    assert peaks == AllocatorPeaks(512 + 3 * MIB + 700 * 1024, 22 * MIB, 2)
    # capped at 21 MiB the 20 MiB segment does not fit beside the small one's 2 MiB: a flush releases nothing
    # whole (the small segment holds storage 0), and the step runs out
    assert both(events, [False, True, True, True], sizes, capacity=21 * MIB) == AllocatorPeaks(512, 2 * MIB, 1, 1,
                                                                                               True)


def test_traced_steps_give_the_same_peaks_both_ways(native: object) -> None:
    from advisor.memory.plan import MemorySettings, trace_for_memory
    from advisor.profile.model_file import load_model_file

    for name, batch in (("llama", 1), ("resnet50", 8)):
        memory = trace_for_memory(load_model_file(name), MemorySettings(batch, "amp-bf16", "adamw"), batch).memory
        sizes = memory.sizes(MIN_BLOCK)
        in_step = [s.allocated_at >= 0 for s in memory.storages]
        free = both(list(memory.events), in_step, sizes)
        assert replay(memory) == free
        for capacity in (free.allocated, free.allocated // 2, free.reserved):
            both(list(memory.events), in_step, sizes, capacity=capacity)


def test_the_same_errors_both_ways(native: object) -> None:
    # a free of a storage not allocated, and an event past the sizes
    for events, error in (([0, ~1], KeyError), ([0, 2], IndexError)):
        for way in (True, False):
            with pytest.raises(error):
                replay_events(events, [True, True], 2, [512, 512], native=way)


def test_off_runs_the_python_replay(native: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_ADVISOR_NATIVE", "off")
    assert allocator.native_module() is None
    monkeypatch.setenv("GPU_ADVISOR_NATIVE", "on")
    assert allocator.native_module() is native


def test_a_module_of_another_version_is_not_used(native: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "NATIVE_VERSION", allocator.NATIVE_VERSION + 1)
    assert allocator.native_module() is None
