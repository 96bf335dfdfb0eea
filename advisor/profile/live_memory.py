"""Live memory of a traced training step: every tensor storage, when it is allocated and freed.

A TorchDispatchMode sees the output of every aten op. Each new storage gets an id, its size and the
op count (the "tick") at which it appeared; a weak-reference finalizer records the tick at which it
died. Fake tensors die exactly when the real ones would (Python reference counting, autograd's saved
tensors), so the sequence of allocations and frees is the one an eager run makes, without any real
memory. Peaks, the breakdown at the peak and the allocator simulation (advisor.memory.allocator) are
computed afterwards from that sequence.

Categories of a storage (CATEGORIES): labelled by role when the trace knows it (parameters and
buffers are weights, `.grad` tensors gradients, optimizer state, inputs), else by the phase that
allocated it (forward: activations and their temporaries; backward and optimizer: temporaries).
Autocast's low-precision copies of weights are `weight_copies`.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode, _pop_mode_temporarily
from torch.utils.weak import WeakIdKeyDictionary

from advisor.profile.tensors import leaves, stored_parts

CATEGORIES = (
    "weights",
    "weight_copies",
    "gradients",
    "optimizer_state",
    "inputs",
    "activations",
    "backward_temporaries",
    "optimizer_temporaries",
)
"""Roles of a storage, in the order breakdowns list them."""

PHASE_CATEGORY = {"forward": "activations", "backward": "backward_temporaries", "optimizer": "optimizer_temporaries"}
"""Category of an unlabelled storage by the phase that allocated it."""

BEFORE_STEP = -1
"""Tick of storages that exist when the step starts (weights, optimizer state, inputs)."""
COPY = -2
"""Allocation tick of a storage made for a block the trace held out (repeated.py): where it was
allocated is where its template was, in that block's iteration."""

CAST_OPS = frozenset({"_to_copy", "to", "_to_copy.default"})


@dataclass(frozen=True)
class StorageLife:
    """One storage: its size in bytes, the tick it was allocated (BEFORE_STEP if it existed when the
    step started) and freed (None: still alive when the step ended), and its category."""

    nbytes: int
    allocated_at: int
    freed_at: int | None
    category: str
    op: str
    module: str = ""
    """The innermost module running when the storage was made ("" where none was known: before the step,
    or a tracker with no module source): parallel/tensor.py splits the activations of tensor-parallel layers
    by it."""

    def resized(self, nbytes: int) -> StorageLife:
        """This storage at `nbytes` bytes (dataclasses.replace without its per-call field inspection: the
        multi-GPU planner resizes every storage of the step for each layout)."""
        return StorageLife(nbytes, self.allocated_at, self.freed_at, self.category, self.op, self.module)


@dataclass(frozen=True)
class MemoryPeak:
    """The highest live memory of a step (or of one phase): bytes, when, and by category."""

    bytes: int
    tick: int
    phase: str
    by_category: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "tick": self.tick, "phase": self.phase, "by_category": dict(self.by_category)}


def round_up(nbytes: int, block: int) -> int:
    """`nbytes` rounded up to a multiple of `block` bytes (an allocator's granularity)."""
    return -(-nbytes // block) * block


@dataclass(frozen=True)
class LiveMemory:
    """Allocations and frees of one training step, in the order they happened.

    `events` lists storage indices: `i` is the allocation of `storages[i]`, `~i` (negative) its free.
    Storages alive when the step started come first, as allocations, before tick 0."""

    storages: tuple[StorageLife, ...] = field(repr=False)
    events: tuple[int, ...] = field(repr=False)
    event_ticks: tuple[int, ...] = field(repr=False)
    phase_starts: dict[str, int]
    """First tick of each phase; a phase runs until the next one starts."""
    ticks: int

    def phase_of(self, tick: int) -> str:
        """The phase running at `tick` (the first phase for BEFORE_STEP)."""
        return phase_at(self.phase_starts, tick)

    def sizes(self, block: int = 1) -> list[int]:
        """Each storage's size rounded up to the allocator's `block` bytes."""
        return [-(-s.nbytes // block) * block for s in self.storages]  # round_up, inline: per layout re-played

    def peak_bytes(self, block: int = 1, categories: frozenset[str] | None = None) -> int:
        """The highest live bytes over the step, sizes rounded to `block`: peak(block).bytes without its
        breakdown (one pass, for a quick bound); with `categories`, of those categories' storages alone."""
        sizes = self.sizes(block)
        if categories is not None:
            sizes = [size if s.category in categories else 0 for size, s in zip(sizes, self.storages)]
        return max(itertools.accumulate(sizes[e] if e >= 0 else -sizes[~e] for e in self.events), default=0)

    def peak(self, block: int = 1, phase: str | None = None) -> MemoryPeak:
        """The highest live bytes over the step (or within `phase`), sizes rounded to `block`."""
        sizes = self.sizes(block)
        live = 0
        best = (-1, 0, BEFORE_STEP)  # (bytes, event position, tick)
        for position, (event, tick) in enumerate(zip(self.events, self.event_ticks)):
            live += sizes[event] if event >= 0 else -sizes[~event]
            if event >= 0 and live > best[0] and (phase is None or self.phase_of(tick) == phase):
                best = (live, position, tick)
        if best[0] < 0:  # the phase allocated nothing: its peak is what it started with
            start = self.phase_starts[phase] if phase is not None else 0
            return self._peak_at_tick(sizes, start)
        return MemoryPeak(best[0], best[2], self.phase_of(best[2]), self._breakdown(sizes, best[1]))

    def phase_peaks(self, block: int = 1, sizes: Sequence[int] | None = None) -> dict[str, MemoryPeak]:
        """The peak of each phase, phase -> MemoryPeak: what peak(block, phase) finds for each, in one pass
        over the events (the multi-GPU planner asks it of every layout it sizes, in this process and in the
        child that re-plays layouts ahead: over arrays, a quarter of the Python loop's time). `sizes`:
        self.sizes(block), where the caller has them already."""
        sizes = self.sizes(block) if sizes is None else sizes
        phases = list(self.phase_starts)
        starts = [self.phase_starts[phase] for phase in phases]
        assert starts == sorted(starts), "phases start in the order they ran"
        events, storage, deltas = self._deltas(sizes)
        live = np.cumsum(deltas)
        ticks = np.fromiter(self.event_ticks, np.int64, len(self.event_ticks))
        # as phase_at: a tick before the first start is the first phase's
        phase_index = np.maximum(np.searchsorted(np.asarray(starts, np.int64), ticks, side="right") - 1, 0)
        allocation = events >= 0
        best = []  # per phase: (bytes, event position, tick), bytes -1 where the phase allocated nothing
        for index in range(len(phases)):
            candidates = np.where(allocation & (phase_index == index), live, -1)
            position = int(np.argmax(candidates)) if len(candidates) else 0
            found = int(candidates[position]) if len(candidates) else -1  # the first position of the highest
            best.append((found, position, int(ticks[position])) if found >= 0 else (-1, 0, BEFORE_STEP))
        breakdowns = self._breakdowns(sizes, [position for found, position, _ in best if found >= 0],
                                      (storage, deltas))
        peaks = {}
        for phase, (found, position, tick) in zip(phases, best):
            if found < 0:  # the phase allocated nothing: its peak is what it started with
                peaks[phase] = self._peak_at_tick(sizes, self.phase_starts[phase])
            else:
                peaks[phase] = MemoryPeak(found, tick, self.phase_of(tick), breakdowns[position])
        return peaks

    def _deltas(self, sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The events as an array, the storage each allocates or frees, and the bytes each adds to what is live
        (a free's negative)."""
        events = np.fromiter(self.events, np.int64, len(self.events))
        storage = np.where(events >= 0, events, ~events)
        signed = np.fromiter(sizes, np.int64, len(sizes))[storage]
        return events, storage, np.where(events >= 0, signed, -signed)

    def _peak_at_tick(self, sizes: list[int], tick: int) -> MemoryPeak:
        position = max((i for i, t in enumerate(self.event_ticks) if t < tick), default=-1)
        breakdown = self._breakdown(sizes, position)
        return MemoryPeak(sum(breakdown.values()), tick, self.phase_of(tick), breakdown)

    def _breakdowns(self, sizes: Sequence[int], positions: list[int],
                    arrays: tuple[np.ndarray, np.ndarray] | None = None) -> dict[int, dict[str, int]]:
        """_breakdown at each of `positions`: live bytes by category after each, one running sum per category
        over the events (each storage is allocated once and freed at most once, after); a position before the
        first event (-1) has nothing live. `arrays`: _deltas(sizes)[1:], where the caller has them."""
        found = {position: dict.fromkeys(CATEGORIES, 0) for position in positions if position < 0}
        wanted = np.asarray(sorted({position for position in positions if position >= 0}), np.int64)
        if not len(wanted):
            return found
        storage, deltas = self._deltas(sizes)[1:] if arrays is None else arrays
        code = {category: index for index, category in enumerate(CATEGORIES)}
        category_of = np.fromiter((code[s.category] for s in self.storages), np.int64, len(self.storages))
        event_category = category_of[storage]
        sums = {category: np.cumsum(np.where(event_category == index, deltas, 0))[wanted]
                for category, index in code.items()}
        for column, position in enumerate(wanted.tolist()):
            found[position] = {category: int(sums[category][column]) for category in CATEGORIES}
        return found

    def _breakdown(self, sizes: list[int], position: int) -> dict[str, int]:
        """Live bytes by category after event `position`."""
        return self._breakdowns(sizes, [position])[position]

    def timeline(self, block: int = 1) -> list[tuple[int, int]]:
        """(tick, live bytes after the tick's last event) for every tick with an event."""
        sizes = self.sizes(block)
        points: dict[int, int] = {}
        live = 0
        for event, tick in zip(self.events, self.event_ticks):
            live += sizes[event] if event >= 0 else -sizes[~event]
            points[tick] = live
        return sorted(points.items())

    def total(self, category: str) -> int:
        """Bytes of every storage of `category` that lived during the step."""
        return sum(s.nbytes for s in self.storages if s.category == category)

    def held_at_start(self, category: str) -> int:
        """Bytes of the storages of `category` alive when the step started (the weights the model holds)."""
        return sum(s.nbytes for s in self.storages if s.category == category and s.allocated_at == BEFORE_STEP)

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak": self.peak().to_dict(),
            "phase_peaks": {phase: peak.to_dict() for phase, peak in self.phase_peaks().items()},
            "storages": len(self.storages),
            "ticks": self.ticks,
        }


class LiveMemoryTracker(TorchDispatchMode):
    """Records the life of every storage the ops under it create (see the module docstring).

    The trace calls `label` for tensors whose role it knows, `start_phase` as the step moves on,
    `open_step` when the recorded step begins and `close_step` when it ends."""

    def __init__(self) -> None:
        super().__init__()
        self._ids: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._nbytes: list[int] = []
        self._allocated: list[int] = []
        self._freed: list[int | None] = []
        self._category: list[str | None] = []
        self._op: list[str] = []
        self._module: list[str] = []
        self.module_source: Callable[[], str] | None = None
        """The innermost module running now (the trace's recorder sets it): each storage made in the step
        records it."""
        self._events: list[tuple[int, int]] = []  # (tick, index or ~index)
        self._finalizers: list[weakref.finalize] = []
        self.phase = "forward"
        self.phase_starts: dict[str, int] = {}
        self.tick = BEFORE_STEP
        self.state = "before"  # "before", "open", "closed"
        self.live_bytes = 0
        """Bytes of the registered storages alive now."""
        self._silent = False
        self._copies: dict[int, tuple[int, int]] = {}  # storage -> (template storage, iteration)
        self._kept: dict[int, int] = {}  # storage -> its index in the last close_step's LiveMemory
        self._alike: dict[int, int] = {}  # storage registered alike (register_alike) -> its template
        self._before_order: dict[int, tuple[int, int, int]] = {}  # its place among the storages before the step

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.run(func, args, kwargs or {})

    def run(self, func: Any, args: tuple, kwargs: dict, implementation: Callable[..., Any] | None = None) -> Any:
        """Run one aten op as this mode does: count its tick (within the step) and register what it makes.
        `implementation`: what computes it in `func`'s place (the same result, made another way)."""
        run = func if implementation is None else implementation
        if self._silent:
            return run(*args, **kwargs)
        if self.state == "open":
            self.tick += 1
        out = run(*args, **kwargs)
        self.observe(out, func.overloadpacket.__name__, args)
        return out

    @contextmanager
    def run_by_caller(self) -> Iterator[None]:
        """Within the block this mode is off the dispatch stack (it must be on top of it when the block
        starts): the mode entered next passes every op on through `run` instead, one Python dispatch layer
        where there were two (a pass-through mode costs a fake pass of the 7B example 16%, measured). Ops
        that mode makes itself it runs beneath this one (`with tracker:`), as it would have."""
        assert _get_current_dispatch_mode() is self, "the live-memory tracker must be the innermost mode"
        with _pop_mode_temporarily():
            yield

    @property
    def storage_count(self) -> int:
        """Storages registered so far (an index for `sizes_since`)."""
        return len(self._nbytes)

    def sizes_since(self, first: int) -> tuple[int, ...]:
        """Bytes of each storage registered after the first `first`: what the ops since allocated."""
        return tuple(self._nbytes[first:])

    def observe(self, value: Any, op: str, args: Any = ()) -> None:
        """Register the storages of the tensors in `value` that are new, as allocated by `op`."""
        for tensor in _tensors(value):
            storage = tensor.untyped_storage()
            if storage in self._ids:
                continue
            category = "weight_copies" if op in CAST_OPS and self._casts_weight(args) else None
            self._register(storage, op, category)

    def _casts_weight(self, args: Any) -> bool:
        sources = _tensors(args)
        return bool(sources) and self.category_of(sources[0]) == "weights"

    def _register(self, storage: torch.UntypedStorage, op: str, category: str | None, copy: bool = False) -> int:
        index = len(self._nbytes)
        self._ids[storage] = index
        self._nbytes.append(storage.nbytes())
        self.live_bytes += self._nbytes[-1]
        self._allocated.append(COPY if copy else self.tick if self.state == "open" else BEFORE_STEP)
        self._freed.append(None)
        self._category.append(category)
        self._op.append(op)
        self._module.append(self.module_source() if self.module_source is not None and self.state == "open" else "")
        if self.state == "open" and not copy:
            self._events.append((self.tick, index))
        self._finalizers.append(weakref.finalize(storage, self._on_free, index))
        return index

    def _on_free(self, index: int) -> None:
        self.live_bytes -= self._nbytes[index]
        if self.state == "before":
            self._freed[index] = BEFORE_STEP
        elif self.state == "open":
            self._freed[index] = self.tick
            self._events.append((self.tick, ~index))

    @contextmanager
    def silent(self) -> Iterator[None]:
        """Ops within neither tick nor register what they make (tensors registered as copies after)."""
        self._silent = True
        try:
            yield
        finally:
            self._silent = False

    def register_copy(self, tensor: torch.Tensor, template: torch.Tensor, iteration: int) -> None:
        """`tensor` (made silently) stands for `template`'s storage in the held-out block `iteration` of a
        run (repeated.py): it has no allocation in the step, and its free is the copy's."""
        template_index = self._ids.get(template.untyped_storage())
        assert template_index is not None, "the template storage was made by a traced op"
        index = self._register(tensor.untyped_storage(), "(copy of a held-out block's)", None, copy=True)
        self._copies[index] = (template_index, iteration)

    def register_alike(self, templates: Sequence[torch.Tensor], count: int) -> None:
        """`count` groups of storages like `templates`' that exist when the step starts and live through it,
        with their roles: the optimizer state (or accumulated gradients) of held-out blocks' parameters,
        whose optimizer only steps their template's (repeated.OptimizerReplicas). No tensor is made; they
        come right after the templates' last, group by group, as a step over every parameter makes them."""
        indices = [self._ids.get(t.untyped_storage()) for t in templates]
        indices = list(dict.fromkeys(i for i in indices if i is not None))
        assert self.state == "before", "made before the step"
        if not indices:
            return
        anchor = max(indices)
        for copy in range(count):
            for position, template_index in enumerate(indices):
                self._nbytes.append(self._nbytes[template_index])
                self._allocated.append(BEFORE_STEP)
                self._freed.append(None)
                self._category.append(None)
                self._op.append(self._op[template_index])
                self._module.append(self._module[template_index])
                self._alike[len(self._nbytes) - 1] = template_index
                self._before_order[len(self._nbytes) - 1] = (anchor, 1 + copy, position)

    def groups_in_result(self, groups: Sequence[tuple[tuple[int, ...], int]]) -> list[tuple[tuple[int, ...], int]]:
        """`groups` of registered storages, by their index in the last close_step's LiveMemory."""
        return [(tuple(self._kept[i] for i in members), count) for members, count in groups]

    def index_of(self, tensor: torch.Tensor) -> int | None:
        """The registered storage of `tensor`, None when the tracker has not seen it."""
        return self._ids.get(tensor.untyped_storage())

    def copies(self) -> dict[int, tuple[int, int]]:
        """Copies registered (register_copy), by their index in the last close_step's LiveMemory:
        copy -> (template, iteration)."""
        return {self._kept[copy]: (self._kept[template], iteration)
                for copy, (template, iteration) in self._copies.items()}

    def category_of(self, tensor: torch.Tensor) -> str | None:
        index = self._ids.get(tensor.untyped_storage())
        return None if index is None else self._category[index]

    def label(self, tensors: Iterable[Any], category: str) -> None:
        """Give the storages of `tensors` (any nesting) the role `category`; storages the tracker has
        not seen (tensors made outside it, such as real inputs) are registered first."""
        assert category in CATEGORIES, category
        for tensor in _tensors(list(tensors)):
            storage = tensor.untyped_storage()
            index = self._ids.get(storage)
            if index is None:
                index = self._register(storage, "(outside the trace)", None)
            self._category[index] = category

    def start_phase(self, phase: str) -> None:
        self.phase = phase
        self.phase_starts[phase] = self.tick + 1

    def open_step(self, phase: str = "forward") -> None:
        """The recorded step begins: everything alive now existed before it."""
        self.state = "open"
        self.tick = -1
        self.start_phase(phase)

    def close_step(self) -> LiveMemory:
        """The recorded step ends; frees after this are not part of it."""
        self.state = "closed"
        for finalizer in self._finalizers:
            finalizer.detach()
        return self._result()

    def _result(self) -> LiveMemory:
        alive_before = [i for i, a in enumerate(self._allocated) if a == BEFORE_STEP and self._freed[i] != BEFORE_STEP]
        alive_before.sort(key=lambda i: self._before_order.get(i, (i, 0, 0)))
        during = [i for _, i in self._events if i >= 0]
        kept = alive_before + during + list(self._copies)
        new_index = {old: new for new, old in enumerate(kept)}
        self._kept = new_index
        storages = tuple(
            StorageLife(self._nbytes[i], self._allocated[i], self._freed[i], self._final_category(i), self._op[i],
                        self._module[i])
            for i in kept
        )
        events = [new_index[i] for i in alive_before]
        ticks = [BEFORE_STEP] * len(alive_before)
        for tick, event in self._events:
            old = event if event >= 0 else ~event
            events.append(new_index[old] if event >= 0 else ~new_index[old])
            ticks.append(tick)
        return LiveMemory(storages, tuple(events), tuple(ticks), dict(self.phase_starts), self.tick + 1)

    def _final_category(self, index: int) -> str:
        if index in self._alike:
            return self._final_category(self._alike[index])
        category = self._category[index]
        if category is not None:
            return category
        if self._allocated[index] == BEFORE_STEP:
            return "weights"  # alive before the step and unlabelled: held by the model (a cache, a constant)
        return PHASE_CATEGORY[phase_at(self.phase_starts, self._allocated[index])]


def phase_at(phase_starts: dict[str, int], tick: int) -> str:
    """The phase running at `tick`, given each phase's first tick (the first phase before it starts)."""
    current = next(iter(phase_starts))
    for phase, start in phase_starts.items():
        if start <= tick:
            current = phase
    return current


def _tensors(value: Any) -> list[torch.Tensor]:
    """The strided tensors in `value` (any nesting), a sparse tensor's indices and values for it."""
    return [part for t in leaves(value) if isinstance(t, torch.Tensor) for part in stored_parts(t)]
