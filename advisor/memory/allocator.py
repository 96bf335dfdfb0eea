"""A replay of PyTorch's CUDA caching allocator over a traced step's allocations and frees.

`torch.cuda.max_memory_allocated` counts the allocator's blocks (requests rounded up to 512 bytes,
plus remainders too small to split off); `max_memory_reserved` counts the segments it got from
cudaMalloc, which it keeps cached. Their difference is fragmentation. The rules replayed here are
those of c10/cuda/CUDACachingAllocator.cpp with default settings (no expandable segments, no
max_split_size): two pools (requests up to 1 MiB, and larger), best fit by size then address,
segment sizes of 2 MiB for small requests, 20 MiB for requests under 10 MiB, else the request rounded
to 2 MiB; blocks split when the remainder is at least 512 bytes (small pool) or above 1 MiB (large),
and merge with free neighbours when freed. Segments stay cached until a cudaMalloc fails: on a device with
too little memory left for a new segment (`capacity`), the allocator releases every cached segment that
is wholly free (release_cached_blocks, in both pools) and tries once more; when that fails too, the step
runs out of memory (CUDACachingAllocator.cpp, DeviceCachingAllocator::malloc). Each such flush is counted:
torch.cuda.memory_stats()["num_alloc_retries"]. Without a capacity nothing is ever released.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from advisor.pickled import switched_on
from advisor.profile.live_memory import LiveMemory, round_up

MIB = 1 << 20
MIN_BLOCK = 512
SMALL_REQUEST = 1 * MIB
SMALL_SEGMENT = 2 * MIB
LARGE_SEGMENT = 20 * MIB
MIN_LARGE_ALLOC = 10 * MIB
ROUND_LARGE = 2 * MIB
ADDRESS_BITS = 56
"""A free block's place in its pool is one integer, size << ADDRESS_BITS | address: sorted by size, then
address, as the allocator's (size, address) order, and compared several times faster than a tuple."""
ADDRESS_MASK = (1 << ADDRESS_BITS) - 1


def round_request(nbytes: int) -> int:
    """A request's size as the allocator rounds it: a multiple of 512 bytes, at least 512."""
    return max(MIN_BLOCK, round_up(nbytes, MIN_BLOCK))


def segment_size(request: int) -> int:
    """Bytes of the segment cudaMalloc'ed when no cached block fits a rounded `request`."""
    if request <= SMALL_REQUEST:
        return SMALL_SEGMENT
    if request < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-request // ROUND_LARGE) * ROUND_LARGE


class _Block:
    __slots__ = ("size", "address", "small", "free", "previous", "next")

    def __init__(self, size: int, address: int, small: bool) -> None:
        self.size, self.address, self.small, self.free = size, address, small, True
        self.previous: _Block | None = None
        self.next: _Block | None = None


@dataclass(frozen=True)
class AllocatorPeaks:
    """Peaks of a replay, bytes: blocks in use (max_memory_allocated) and segments held
    (max_memory_reserved); `segments` is how many segments were created; under a capacity, `flushes` how
    often the cache was released for a new segment (num_alloc_retries) and `out_of_memory` whether a request
    found no room even then (the replay stops there)."""

    allocated: int
    reserved: int
    segments: int
    flushes: int = 0
    out_of_memory: bool = False


class OutOfMemory(Exception):
    """A capped replay's request that fits neither a cached block nor, after the cache's release, a new
    segment."""


class CachingAllocator:
    """The caching allocator's bookkeeping, without memory. Blocks are named by the caller's ids: `run` takes
    events as LiveMemory writes them (i: allocate id i, ~i: free it); `malloc` and `free` are one event each.
    (The multi-GPU planner re-plays a step once per layout it sizes, 20 re-plays of 10,000 events for the 7B
    example over every GPU: `run` keeps the pools in local variables through a whole list of events.)"""

    def __init__(self, capacity: int | None = None) -> None:
        """`capacity`: bytes the allocator may hold in segments (the device's memory less what lies outside
        it); None: unlimited, nothing released."""
        self.capacity = capacity
        self.flushes = 0
        self.small_pool: list[int] = []  # free blocks of the small pool, as sorted keys (ADDRESS_BITS)
        self.large_pool: list[int] = []
        self.free_blocks: dict[int, _Block] = {}  # free blocks by address
        self.blocks: dict[int, _Block | None] = {}  # blocks in use by id (None: an empty request's)
        self.next_address = self._next_id = 0
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = self.segments = 0

    def malloc(self, nbytes: int) -> int | None:
        """Allocate `nbytes`; the block's id, None for an empty request (CUDA returns no block for it)."""
        if nbytes == 0:
            return None
        handle = self._next_id = self._next_id + 1
        self.run((handle,), {handle: round_request(nbytes)})
        return handle

    def free(self, handle: int | None) -> None:
        if handle is not None:
            self.run((~handle,), {})

    def peaks(self, out_of_memory: bool = False) -> AllocatorPeaks:
        return AllocatorPeaks(self.peak_allocated, self.peak_reserved, self.segments, self.flushes, out_of_memory)

    def unlink(self) -> None:
        """Break the links between neighbouring blocks, once the replay is done: a segment's blocks point to each
        other, cycles that only Python's cyclic collector would free (7,000 blocks in a 7B estimate's
        re-plays, each walked by the collection that follows), while unlinked ones go as soon as the
        allocator does."""
        for block in (*self.free_blocks.values(), *self.blocks.values()):
            if block is not None:
                block.previous = block.next = None

    def release_cached(self) -> int:
        """Release every cached segment that is wholly free (a free block with no neighbour), from both
        pools; the bytes released."""
        whole = [block for block in self.free_blocks.values() if block.previous is None and block.next is None]
        for block in whole:
            pool = self.small_pool if block.small else self.large_pool
            del pool[bisect.bisect_left(pool, block.size << ADDRESS_BITS | block.address)]
            del self.free_blocks[block.address]
        return sum(block.size for block in whole)

    def run(self, events: Iterable[int], sizes: Sequence[int] | Mapping[int, int]) -> None:
        """Allocate (event i >= 0: sizes[i] bytes, already rounded by round_request; 0: no block) and free
        (~i) in order: best fit by size then address in the request's pool, a new segment where none fits,
        the remainder split off where large enough, a freed block merged with free neighbours."""
        small_pool, large_pool, free_blocks, blocks = self.small_pool, self.large_pool, self.free_blocks, self.blocks
        capacity, out_of_memory = self.capacity, True
        bisect_left, insort = bisect.bisect_left, bisect.insort
        next_address, allocated, reserved = self.next_address, self.allocated, self.reserved
        peak_allocated, peak_reserved, segments = self.peak_allocated, self.peak_reserved, self.segments
        for event in events:
            if event >= 0:  # malloc
                size = sizes[event]
                if not size:
                    blocks[event] = None
                    continue
                small = size <= SMALL_REQUEST
                pool = small_pool if small else large_pool
                position = bisect_left(pool, size << ADDRESS_BITS)
                if position < len(pool):  # the best fit: the smallest free block that holds it, the lowest address
                    block = free_blocks.pop(pool.pop(position) & ADDRESS_MASK)
                else:
                    nbytes = segment_size(size)
                    if capacity is not None and reserved + nbytes > capacity:  # cudaMalloc fails
                        self.flushes += 1
                        reserved -= self.release_cached()
                        if reserved + nbytes > capacity:
                            break  # out of memory: raised below, once the state is written back
                    block = _Block(nbytes, next_address, small)
                    next_address += nbytes
                    reserved += nbytes
                    segments += 1
                    if reserved > peak_reserved:
                        peak_reserved = reserved
                remaining = block.size - size
                if remaining >= MIN_BLOCK if small else remaining > SMALL_REQUEST:
                    rest = _Block(remaining, block.address + size, small)
                    following = block.next
                    rest.previous, rest.next = block, following
                    if following is not None:
                        following.previous = rest
                    block.next, block.size = rest, size
                    insort(pool, remaining << ADDRESS_BITS | rest.address)
                    free_blocks[rest.address] = rest
                block.free = False
                allocated += block.size
                if allocated > peak_allocated:
                    peak_allocated = allocated
                blocks[event] = block
                continue
            block = blocks.pop(~event)  # free
            if block is None:
                continue
            assert not block.free, "block freed twice"
            allocated -= block.size
            block.free = True
            previous, following = block.previous, block.next
            if previous is not None and previous.free:  # merged into the free block before it
                pool = small_pool if previous.small else large_pool
                del pool[bisect_left(pool, previous.size << ADDRESS_BITS | previous.address)]
                del free_blocks[previous.address]
                previous.size += block.size
                previous.next = following
                if following is not None:
                    following.previous = previous
                block = previous
            if following is not None and following.free:  # and the free block after it into it
                pool = small_pool if following.small else large_pool
                del pool[bisect_left(pool, following.size << ADDRESS_BITS | following.address)]
                del free_blocks[following.address]
                block.size += following.size
                block.next = following.next
                if following.next is not None:
                    following.next.previous = block
            insort(small_pool if block.small else large_pool, block.size << ADDRESS_BITS | block.address)
            free_blocks[block.address] = block
        else:  # every event ran
            out_of_memory = False
        assert next_address <= ADDRESS_MASK, "more memory than a pool key's address holds"
        self.next_address, self.allocated, self.reserved = next_address, allocated, reserved
        self.peak_allocated, self.peak_reserved, self.segments = peak_allocated, peak_reserved, segments
        if out_of_memory:
            raise OutOfMemory()


NATIVE_VERSION = 1
"""The version of native/gpu_advisor_allocator.c this file's rules match: an installed module of another
version (left by an older install) is not used."""


def native_wanted() -> bool:
    """Whether the compiled replay may be used: not where GPU_ADVISOR_NATIVE is off (or 0, no, false)."""
    return switched_on("GPU_ADVISOR_NATIVE")


def native_module() -> Any:
    """The compiled replay (native/gpu_advisor_allocator.c, setup.py's optional extension), or None where it
    was not built (no C compiler when the tool was installed), is of another version, or
    GPU_ADVISOR_NATIVE=off: `replay` then runs CachingAllocator.run, whose rules it repeats."""
    if not native_wanted():
        return None
    try:
        import gpu_advisor_allocator
    except ModuleNotFoundError as exc:
        if exc.name != "gpu_advisor_allocator":
            raise
        return None
    return gpu_advisor_allocator if getattr(gpu_advisor_allocator, "VERSION", None) == NATIVE_VERSION else None


def replay(memory: LiveMemory, steps: int = 2, sizes: Sequence[int] | None = None,
           capacity: int | None = None) -> AllocatorPeaks:
    """Replay the step's allocations and frees `steps` times in a row, as a training loop runs them:
    what the step allocated and still held at its end is freed before the next one (the next step
    replaces it), in the order it was allocated. Storages alive before the step are allocated first, in
    creation order, once. `sizes`: memory.sizes(MIN_BLOCK), where the caller has them already;
    `capacity`: the bytes its segments may take (CachingAllocator), None for no limit."""
    if sizes is None:
        sizes = memory.sizes(MIN_BLOCK)  # round_request of each storage (0 for an empty one: no block)
    return replay_events(memory.events, [s.allocated_at >= 0 for s in memory.storages], steps, sizes, capacity)


def replay_events(events: Sequence[int], in_step: Sequence[bool], steps: int, sizes: Sequence[int],
                  capacity: int | None = None, native: bool = True) -> AllocatorPeaks:
    """replay of LiveMemory `events` (i: allocate storage i, ~i: free it) whose storages `in_step` the step
    allocates (the others live from before it: allocated once), `sizes` bytes each. Compiled
    (native/gpu_advisor_allocator.c) where it was built and `native`, else CachingAllocator.run: the same
    peaks (tests/test_allocator_native.py), in a twelfth of the time (benchmarks/allocator_replay.py)."""
    compiled = native_module() if native else None
    if compiled is not None:
        allocated, reserved, segments, flushes, out_of_memory = compiled.replay(events, in_step, steps, sizes,
                                                                                capacity)
        return AllocatorPeaks(allocated, reserved, segments, flushes, out_of_memory)
    alive: dict[int, None] = {}  # the step's storages allocated and not yet freed, in allocation order
    for event in events:
        if event >= 0:
            if in_step[event]:
                alive[event] = None
        else:
            alive.pop(~event, None)
    held = [~e for e in alive]  # freed before the next step
    first = [*events, *held]
    later = [e for e in events if in_step[e if e >= 0 else ~e]] + held
    allocator = CachingAllocator(capacity)
    try:
        for step in range(steps):
            allocator.run(first if step == 0 else later, sizes)
    except OutOfMemory:
        return allocator.peaks(out_of_memory=True)
    finally:
        allocator.unlink()
    return allocator.peaks()
