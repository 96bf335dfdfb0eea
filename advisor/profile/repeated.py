"""Repeated blocks traced once (issue #24): a 32-layer decoder costs three layers' trace, not 32.

A run is a stretch of MIN_RUN (8) or more consecutive children of an `nn.ModuleList` or `nn.Sequential` that
are the same class with the same configuration: the same parameter and buffer shapes and dtypes in every
submodule, the same plain attributes (a layer's own index aside), no hooks, nothing shared. The trace
keeps three blocks of each run (the first, the second and the last) and runs the step through them;
the other blocks are held out of the container for the forward and backward, so their ops are never
dispatched, and the optimizer steps only the kept blocks' parameters (OptimizerReplicas does the held-out
blocks' share of each of its ops again from their template's; their optimizer state is registered alike
before the step). A model file's own optimizer(params) steps every parameter instead, with the held-out
blocks' gradients made as copies of their template's (trace._copy_gradients).

The second block is the template of every held-out one. The ops (OpRecord) and the storage lives
(LiveMemory) that the second block's iteration makes, forward and backward, are replicated once per
held-out block, with module names and ticks moved along (`expand_records`, `expand_memory`): a storage
freed one block later (a block's output, which the next one saves) is freed one block later in every
copy, a storage freed after the run (autocast's weight copies, gradients) is freed there, once per copy.

Nothing is taken on trust. Before anything is replicated the first block's iteration must equal the
second's and the last block's backward the second's, op for op (names aside) and allocation for
allocation; any difference, any storage whose life the pattern cannot place, or any error in the
shortened step, and the step is traced in full (the trace's caller does that on `NotRepeated`).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch

from advisor.profile.tensors import leaves

MIN_SAVED_BY_A_RETRY = 6
"""Blocks a second attempt must still replicate to be made; else the step is traced in full at once."""

MIN_RUN = 8
"""Blocks in a run before it is shortened: three are kept, and a run whose first or last block differs costs
a second attempt, or a full trace after a failed one: BART-base's 6-layer stacks took 1.9-2.5x their full
trace that way, while a 6-block run that works saves a third at most."""

POSITION_ATTRIBUTE = re.compile(r"^(layer|block|stage)?_?(idx|index|id|number|num)$")
"""Integer attributes that number a block (Hugging Face's `layer_idx`): they differ along a run by design."""

PLAIN_TYPES = (bool, int, float, str, type(None), torch.dtype)


class NotRepeated(Exception):
    """The shortened step does not show the repetition it assumed: trace the step in full, or (`first`,
    `last` name runs) again with those runs' first or last block left out of them."""

    def __init__(self, message: str, first: frozenset[str] = frozenset(), last: frozenset[str] = frozenset(),
                 saved: int = 0) -> None:
        super().__init__(message)
        self.first = first
        self.last = last
        self.saved = saved
        """Blocks the runs left after those trims would still replicate."""


@dataclass(frozen=True)
class Run:
    """Blocks `keys` (their names in `container`, in order) of one container at `path` in the model."""

    container: torch.nn.Module
    path: str
    keys: tuple[str, ...]

    @property
    def kept(self) -> tuple[str, str, str]:
        """The blocks traced: the first, the template (second) and the last."""
        return self.keys[0], self.keys[1], self.keys[-1]

    @property
    def held_out(self) -> tuple[str, ...]:
        return self.keys[2:-1]

    def block_name(self, key: str) -> str:
        """The module name of block `key` as the trace names modules (the model is "")."""
        return f"{self.path}.{key}" if self.path else key

    def describe(self) -> str:
        return f"{self.block_name(self.keys[0])}..{self.keys[-1]} ({len(self.keys)} blocks, 3 traced)"


def find_runs(model: torch.nn.Module, without_first: frozenset[str] = frozenset(),
              without_last: frozenset[str] = frozenset()) -> list[Run]:
    """The runs of repeated blocks in `model`, outermost first (none inside a run's blocks). Runs whose
    path is in `without_first` start one block later (their first block sees other inputs: a decoder's
    first layer gets the embeddings in their dtype, the others the residual stream in fp32); those in
    `without_last` end one block earlier (the last block's backward is the first to give a gradient to
    something every block uses, T5's shared position bias, and the others add theirs to it)."""
    owners = _parameter_owners(model)
    runs: list[Run] = []
    _collect_runs(model, "", owners, runs)
    runs = [replace(run, keys=run.keys[1 if run.path in without_first else 0:
                                       -1 if run.path in without_last else None]) for run in runs]
    return [run for run in runs if len(run.keys) >= MIN_RUN]


def _parameter_owners(model: torch.nn.Module) -> dict[int, int]:
    """id(parameter or buffer) -> how many places in the model hold it."""
    counts: dict[int, int] = {}
    for module in model.modules():
        for tensor in [*module._parameters.values(), *module._buffers.values()]:
            if tensor is not None:
                counts[id(tensor)] = counts.get(id(tensor), 0) + 1
    return counts


def _collect_runs(module: torch.nn.Module, path: str, owners: dict[int, int], runs: list[Run]) -> None:
    in_run: set[str] = set()
    if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
        for keys in _runs_of(module, owners):
            runs.append(Run(module, path, keys))
            in_run.update(keys)
    for name, child in module.named_children():
        if name not in in_run and child is not None:
            _collect_runs(child, f"{path}.{name}" if path else name, owners, runs)


def _runs_of(container: torch.nn.Module, owners: dict[int, int]) -> list[tuple[str, ...]]:
    """Maximal stretches of at least MIN_RUN consecutive children with one signature."""
    found: list[tuple[str, ...]] = []
    current: list[str] = []
    previous: Any = None
    for key, child in container._modules.items():
        signature = _signature(child, owners) if child is not None else None
        if signature is not None and signature == previous and child not in (container._modules[k] for k in current):
            current.append(key)
        else:
            if len(current) >= MIN_RUN:
                found.append(tuple(current))
            current = [key] if signature is not None else []
        previous = signature
    if len(current) >= MIN_RUN:
        found.append(tuple(current))
    return found


def _signature(block: torch.nn.Module, owners: dict[int, int]) -> tuple | None:
    """What must be equal for two blocks to run the same ops; None when the block cannot be replicated
    (hooks, or a parameter or buffer it shares with another place)."""
    parts = []
    for name, module in block.named_modules(remove_duplicate=False):
        if module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or \
                module._backward_pre_hooks:
            return None
        tensors = []
        for kind, table in (("p", module._parameters), ("b", module._buffers)):
            for tensor_name, tensor in table.items():
                if tensor is None:
                    tensors.append((kind, tensor_name, None))
                    continue
                if owners.get(id(tensor), 0) > 1:
                    return None
                tensors.append((kind, tensor_name, tuple(tensor.shape), tensor.dtype, tensor.requires_grad,
                                tensor.layout))
        attributes = tuple(sorted((key, _plain(value)) for key, value in vars(module).items()
                                  if not key.startswith("_") and _is_plain(value)
                                  and not (POSITION_ATTRIBUTE.match(key) and isinstance(value, int))))
        parts.append((name, type(module), tuple(tensors), attributes, module.training))
    return tuple(parts)


def _is_plain(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_is_plain(v) for v in value)
    return isinstance(value, PLAIN_TYPES)


def _plain(value: Any) -> Any:
    return tuple(_plain(v) for v in value) if isinstance(value, (tuple, list)) else value


@contextmanager
def shortened(runs: Sequence[Run]) -> Iterator[None]:
    """The runs' held-out blocks out of their containers, put back (in order) on leaving."""
    saved = [(run.container, dict(run.container._modules)) for run in runs]
    for run in runs:
        for key in run.held_out:
            del run.container._modules[key]
    try:
        yield
    finally:
        for container, modules in saved:
            container._modules.clear()
            container._modules.update(modules)


def held_out_parameters(run: Run) -> list[tuple[torch.nn.Parameter, torch.nn.Parameter, int]]:
    """(held-out parameter, the template block's parameter in its place, iteration) for every held-out
    block of `run`; iteration i is the block `run.keys[i]`."""
    template = dict(run.container._modules[run.keys[1]].named_parameters())
    pairs = []
    for iteration, key in enumerate(run.keys):
        if key not in run.held_out:
            continue
        for name, param in run.container._modules[key].named_parameters():
            pairs.append((param, template[name], iteration))
    return pairs


# --------------------------------------------------------------------------- where each block ran


@dataclass(frozen=True)
class Segment:
    """Ticks [start, end) of one block's iteration in one phase of the shortened step. `template` is
    0 (the first block), 1 (the second: replicated) or 2 (the last); `iterations` the blocks of the
    whole model it stands for, in the order they run."""

    run: int
    phase: str
    template: int
    start: int
    end: int
    iterations: tuple[int, ...]

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class RunTicks:
    """Where each run's kept blocks ran in the shortened step: its segments, in tick order."""

    run: Run
    forward: tuple[Segment, Segment, Segment]
    backward: tuple[Segment, Segment, Segment]
    """(last, template, first): the order the backward runs them."""


class BlockClock:
    """The ticks at which each run's kept blocks start and end, forward and backward, from module hooks
    (the first tick inside, the first tick after): forward pre- and post-hooks, and gradient hooks on a
    block's outputs (its backward starts when their first gradient is ready) and its first input that
    requires grad, the hidden state (it ends when that one's is). `counters()` is sampled as each kept block's forward starts."""

    def __init__(self, runs: Sequence[Run], tick: Callable[[], int], in_backward: Callable[[], bool],
                 counters: Callable[[], tuple[int, ...]] = tuple) -> None:
        self.runs, self.tick, self.in_backward, self.counters = runs, tick, in_backward, counters
        self.forward_start: dict[tuple[int, str], int] = {}
        self.forward_end: dict[tuple[int, str], int] = {}
        self.backward_start: dict[tuple[int, str], int] = {}
        self.backward_end: dict[tuple[int, str], int] = {}
        self.counted: dict[tuple[int, str], tuple[int, ...]] = {}
        self._handles: list[Any] = []

    def __enter__(self) -> BlockClock:
        for index, run in enumerate(self.runs):
            for key in run.kept:
                block = run.container._modules[key]
                self._handles.append(block.register_forward_pre_hook(self._pre_hook((index, key)), with_kwargs=True))
                self._handles.append(block.register_forward_hook(self._post_hook((index, key)), with_kwargs=True))
        return self

    def __exit__(self, *exc_info: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _pre_hook(self, where: tuple[int, str]) -> Callable[..., None]:
        def hook(module: Any, args: Any, kwargs: Any) -> None:
            if self.in_backward() or where in self.forward_start:  # activation checkpointing's recompute
                return
            self.forward_start[where] = self.tick() + 1
            self.counted[where] = self.counters()
            inputs = _grad_tensors((args, kwargs))[:1]  # the hidden state; others (T5's position bias) may
            if inputs:                                   # get their gradient only when every block is done
                self._handles.append(torch.autograd.graph.register_multi_grad_hook(
                    inputs, lambda grads: self.backward_end.setdefault(where, self.tick() + 1), mode="any"))
        return hook

    def _post_hook(self, where: tuple[int, str]) -> Callable[..., None]:
        def hook(module: Any, args: Any, kwargs: Any, output: Any) -> None:
            if self.in_backward() or where in self.forward_end:
                return
            self.forward_end[where] = self.tick() + 1
            outputs = _grad_tensors(output)
            if outputs:
                self._handles.append(torch.autograd.graph.register_multi_grad_hook(
                    outputs, lambda grad: self.backward_start.setdefault(where, self.tick() + 1), mode="any"))
        return hook

    def ticks(self, table: dict[tuple[int, str], int], where: tuple[int, str], what: str) -> int:
        if where not in table:
            raise NotRepeated(f"no {what} was seen for {self.runs[where[0]].block_name(where[1])}")
        return table[where]

    def added(self, counter: int) -> int:
        """What one template iteration adds to counter `counter`, times the held-out blocks, over all runs."""
        total = 0
        for index, run in enumerate(self.runs):
            template, last = self.counted.get((index, run.kept[1])), self.counted.get((index, run.kept[2]))
            if template is None or last is None:
                raise NotRepeated(f"the kept blocks of {run.path} did not run")
            total += (last[counter] - template[counter]) * len(run.held_out)
        return total


def _grad_tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in leaves(value) if isinstance(t, torch.Tensor) and t.requires_grad]


def locate(clock: BlockClock) -> list[RunTicks]:
    """Each run's segments from the clock; NotRepeated when the kept blocks did not run one after
    another, forward and backward, with iterations of one length."""
    located = []
    first_differs: set[str] = set()
    last_differs: set[str] = set()
    for index, run in enumerate(clock.runs):
        n = len(run.keys)
        first, template, last = ((index, key) for key in run.kept)
        f0, f1, f2 = (clock.ticks(clock.forward_start, w, "forward") for w in (first, template, last))
        f0_end, f1_end, f2_end = (clock.ticks(clock.forward_end, w, "forward end") for w in (first, template, last))
        b2, b1, b0 = (clock.ticks(clock.backward_start, w, "backward") for w in (last, template, first))
        b1_end = clock.ticks(clock.backward_end, template, "backward end")
        if not (f0 < f0_end <= f1 < f1_end <= f2 < f2_end <= b2 < b1 < b1_end <= b0):
            raise NotRepeated(f"the blocks of {run.path} did not run one after another")
        if f1 - f0 != f2 - f1:
            first_differs.add(run.path)
        if f2_end - f2 != f1_end - f1 or b1 - b2 != b0 - b1:
            last_differs.add(run.path)
        middle = tuple(range(1, n - 1))
        forward = (Segment(index, "forward", 0, f0, f1, (0,)), Segment(index, "forward", 1, f1, f2, middle),
                   Segment(index, "forward", 2, f2, f2_end, (n - 1,)))
        backward = (Segment(index, "backward", 2, b2, b1, (n - 1,)),
                    Segment(index, "backward", 1, b1, b0, middle[::-1]),
                    Segment(index, "backward", 0, b0, b0 + b1_end - b1, (0,)))
        located.append(RunTicks(run, forward, backward))
    if first_differs or last_differs:  # every run's at once: one more attempt, not one per run and end
        raise NotRepeated(f"the first block of {sorted(first_differs)} or the last of {sorted(last_differs)} ran "
                          "a different iteration", frozenset(first_differs), frozenset(last_differs),
                          _saved_after(clock.runs, first_differs, last_differs))
    segments = segments_of(located)
    if any(a.end > b.start for a, b in zip(segments, segments[1:])):
        raise NotRepeated("the runs' iterations overlap")
    return located


def _saved_after(runs: Sequence[Run], first: set[str] | frozenset[str], last: set[str] | frozenset[str]) -> int:
    """Blocks the runs would still replicate once those in `first` and `last` lose that block."""
    saved = 0
    for run in runs:
        length = len(run.keys) - (run.path in first) - (run.path in last)
        saved += length - 3 if length >= MIN_RUN else 0
    return saved


def segments_of(located: Sequence[RunTicks]) -> list[Segment]:
    return sorted((s for r in located for s in (*r.forward, *r.backward)), key=lambda s: s.start)


class _Ticks:
    """Ticks of the shortened step -> ticks of the whole step, segment copy by copy."""

    def __init__(self, segments: Sequence[Segment]) -> None:
        self.segments = sorted(segments, key=lambda s: s.start)
        self.ends = [s.end for s in self.segments]
        self.added_by = [0]  # ticks the copies of the first i segments add
        for segment in self.segments:
            self.added_by.append(self.added_by[-1] + (len(segment.iterations) - 1) * segment.length)

    def inserted_before(self, tick: int) -> int:
        """Ticks the copies add before `tick` (a tick outside every segment, or a segment's start)."""
        return self.added_by[bisect.bisect_right(self.ends, tick)]

    def outside(self, tick: int) -> int:
        return tick + self.inserted_before(tick) if tick >= 0 else tick

    def in_copy(self, segment: Segment, copy: int, tick: int) -> int:
        """Tick `tick` of `segment` in its `copy`-th emission (0: the first)."""
        return self.outside(segment.start) + copy * segment.length + tick - segment.start

    @property
    def added(self) -> int:
        return self.added_by[-1]


class _Where:
    """Which segment (of segments sorted by start, disjoint) holds a tick."""

    def __init__(self, segments: Sequence[Segment]) -> None:
        self.segments = list(segments)
        self.starts = [s.start for s in self.segments]

    def __call__(self, tick: int) -> Segment | None:
        index = bisect.bisect_right(self.starts, tick) - 1
        if index >= 0 and tick < self.segments[index].end:
            return self.segments[index]
        return None


# --------------------------------------------------------------------------- ops


def _renamed(module: str, run: Run, template_key: str, key: str) -> str:
    old = run.block_name(template_key)
    if module == old or module.startswith(old + "."):
        return run.block_name(key) + module[len(old):]
    return module


def _coarse(records: Sequence[Any], run: Run, key: str) -> list[Any]:
    """The records with every module inside block `key` named "(block)": which submodule of a block an
    op is credited to in the backward may differ between blocks (ModuleTracker credits an op that two
    sibling modules' gradients meet at to either), the ops may not."""
    block = run.block_name(key)
    return [replace(r, module="(block)") if r.module == block or r.module.startswith(block + ".") else r
            for r in records]


def expand_records(records: Sequence[Any], ticks: Sequence[int],
                   located: Sequence[RunTicks]) -> tuple[list[Any], tuple[tuple[int, int, int], ...]]:
    """The whole step's ops: the shortened step's, with each template iteration's ops once per block it
    stands for (module names moved to that block), and where those copies lie (StepTrace.repeats).
    NotRepeated when the first block's iteration differs from the template's, or the last block's
    (forward and backward)."""
    segments = segments_of(located)
    segment_at = _Where(segments)
    by_segment: dict[tuple[int, str, int], list[Any]] = {(s.run, s.phase, s.template): [] for s in segments}
    order: list[tuple[str, Any]] = []
    for record, tick in zip(records, ticks):
        segment = segment_at(tick)
        if segment is None:
            order.append(("record", record))
        else:
            key = (segment.run, segment.phase, segment.template)
            if not by_segment[key]:
                order.append(("segment", key))
            by_segment[key].append(record)
    differs = [_ends_that_differ(r, by_segment) for r in located]
    first = frozenset(r.run.path for r, (f, _) in zip(located, differs) if f)
    last = frozenset(r.run.path for r, (_, l) in zip(located, differs) if l)
    if first or last:
        raise NotRepeated(f"the ops of the first block of {sorted(first)} or the last of {sorted(last)} differ "
                          "from the template's", first, last, _saved_after([r.run for r in located], first, last))
    expanded: list[Any] = []
    repeats: list[tuple[int, int, int]] = []
    for kind, item in order:
        if kind == "record":
            expanded.append(item)
            continue
        run_index, phase, template = item
        run = located[run_index].run
        segment = next(s for s in (located[run_index].forward if phase == "forward" else located[run_index].backward)
                       if s.template == template)
        if len(segment.iterations) > 1 and by_segment[item]:
            repeats.append((len(expanded), len(by_segment[item]), len(segment.iterations)))
        for iteration in segment.iterations:
            key = run.keys[iteration]
            source_key = run.keys[1] if template == 1 else key
            if key == source_key:
                expanded.extend(by_segment[item])
                continue
            names: dict[str, str] = {}
            for rec in by_segment[item]:
                name = names.get(rec.module)
                if name is None:
                    name = names[rec.module] = _renamed(rec.module, run, source_key, key)
                expanded.append(rec if name == rec.module else _moved(rec, name))
    return expanded, tuple(repeats)


def _moved(record: Any, module: str) -> Any:
    """`record` (a frozen dataclass without __post_init__) with its module renamed: dataclasses.replace without
    re-running __init__ over every field. Llama-3-70B's 77 held-out blocks make 18,000 such copies, which
    replace() made in a tenth of its trace."""
    copy = object.__new__(type(record))
    copy.__dict__.update(record.__dict__, module=module)
    return copy


def _ends_that_differ(located: RunTicks, by_segment: dict[tuple[int, str, int], list[Any]]) -> tuple[bool, bool]:
    """Whether the first block's iteration (forward, backward) and the last block's differ from the
    template's, op for op: forward modules named within the block, backward ones ignored (ModuleTracker
    credits a backward op that two sibling modules' gradients meet at to either)."""
    run = located.run
    index = located.forward[0].run
    first, template, last = run.kept
    f0, f1, f2 = (by_segment[(index, "forward", t)] for t in (0, 1, 2))
    b2, b1, b0 = (by_segment[(index, "backward", t)] for t in (2, 1, 0))
    f1 = _coarse(f1, run, template)
    b1 = _anonymous(b1)
    first_differs = _coarse(f0, run, first) != f1 or _anonymous(b0) != b1[:len(b0)]
    last_differs = _coarse(f2, run, last) != f1[:len(f2)] or _anonymous(b2) != b1
    return first_differs, last_differs


def _anonymous(records: Sequence[Any]) -> list[tuple]:
    """The records as tuples of everything but their module (OpRecord.anonymous)."""
    return [r.anonymous() for r in records]


# --------------------------------------------------------------------------- memory


def expand_memory(memory: Any, located: Sequence[RunTicks], copies: dict[int, tuple[int, int]],
                  groups: Sequence[tuple[tuple[int, ...], int]] = ()) -> Any:
    """The whole step's storage lives (live_memory.LiveMemory) from the shortened step's: every storage
    the template iterations allocate once per block they stand for, freed where the pattern puts it
    (see the module docstring). `copies`: storages made outside the ops for held-out blocks (their
    gradients), storage -> (the template storage it copies, iteration); `groups`: storages made outside the
    runs that stand for several (OptimizerReplicas.groups): their copies are made after the group's last
    and freed after its last, block by block. NotRepeated when a storage's life does not fit the pattern."""
    group_of = {index: group for group in groups for index in group[0]}
    alive_in_group = {group: len(group[0]) for group in groups}
    from advisor.profile.live_memory import LiveMemory, StorageLife

    segments = segments_of(located)
    ticks = _Ticks(segments)
    segment_at = _Where(segments)
    storages = memory.storages
    where: dict[int, Segment | None] = {}
    by_segment: dict[Segment, list[tuple[int, int]]] = {s: [] for s in segments}  # (event, tick)
    order: list[tuple[str, Any]] = []
    seen: set[Segment] = set()
    for event, tick in zip(memory.events, memory.event_ticks):
        segment = segment_at(tick) if tick >= 0 else None
        if event >= 0:
            where[event] = segment
        if segment is None:
            order.append(("event", (event, tick)))
        else:
            if segment not in seen:
                seen.add(segment)
                order.append(("segment", segment))
            by_segment[segment].append((event, tick))
    for segment in segments:  # a segment without events still takes its ticks
        if segment not in seen:
            order.append(("segment", segment))
    correspond = _correspondence(located, by_segment, storages)
    copied_templates = {template for template, _ in copies.values()}
    for template, _ in copies.values():
        segment = where.get(template)
        if segment is None or segment.template != 1:
            raise NotRepeated("a held-out block's gradient has no template in the template block")

    new_storages: list[StorageLife] = []
    new_events: list[int] = []
    new_ticks: list[int] = []
    instance: dict[tuple[int, int | None], int] = {}

    def allocate(old: int, key: tuple[int, int | None], tick: int) -> None:
        life = storages[old]
        instance[key] = len(new_storages)
        new_storages.append(life)  # ticks are filled in at the end
        new_events.append(instance[key])
        new_ticks.append(tick)

    def free(key: tuple[int, int | None], tick: int) -> None:
        index = instance.pop(key, None)
        if index is None:
            raise NotRepeated("a storage was freed before it was allocated, or twice, in the replicated step")
        new_events.append(~index)
        new_ticks.append(tick)

    def instance_of(old: int, segment: Segment, iteration: int) -> tuple[int, int | None]:
        """The key of the storage `old` freed in `segment`'s emission for `iteration`."""
        allocated_in = where.get(old)
        if allocated_in is None or allocated_in.run != segment.run:
            if segment.template == 1 or (allocated_in is not None and allocated_in.template == 1):
                raise NotRepeated("a storage from outside a run is freed inside its replicated iteration")
            return (old, allocated_in.iterations[0] if allocated_in is not None else None)
        if allocated_in.template != 1 and segment.template != 1:  # the first or last block's, freed in either:
            return (old, allocated_in.iterations[0])          # one storage, whatever lies between
        distance = segment.template - allocated_in.template  # blocks 0, 1 (template) and 2 (last) of the run
        if abs(distance) > 1:
            raise NotRepeated("a storage lives across more blocks than three show")
        owner = iteration - distance
        n = len(located[segment.run].run.keys)
        if 1 <= owner <= n - 2:
            return (old if allocated_in.template == 1 else correspond[old], owner)
        if owner not in allocated_in.iterations:
            raise NotRepeated("a storage's life does not follow its block")
        return (old, owner)

    for kind, item in order:
        if kind == "event":
            event, tick = item
            new_tick = ticks.outside(tick)
            old = event if event >= 0 else ~event
            if event >= 0:
                allocate(old, (old, None), new_tick)
                group = group_of.get(old)
                if group is not None and old == group[0][-1]:
                    for copy in range(group[1]):
                        for member in group[0]:
                            allocate(member, (member, -1 - copy), new_tick)
            elif old in group_of and where.get(old) is None:
                group = group_of[old]
                members, count = group
                if alive_in_group[group] == len(members) and old == members[-1]:
                    # freed last to first (CPython frees a list's items from its end): the held-out blocks'
                    # copies, which follow the template's in the list, go first
                    for copy in reversed(range(count)):
                        for member in reversed(members):
                            free((member, -1 - copy), new_tick)
                    alive_in_group[group] = -len(members)  # copies freed
                free((old, None), new_tick)
                alive_in_group[group] += 1 if alive_in_group[group] < 0 else -1
                if alive_in_group[group] == 0 and count and (members[0], -1) in instance:
                    for copy in range(count):
                        for member in members:
                            free((member, -1 - copy), new_tick)
            elif old in copies:
                template, iteration = copies[old]
                free((template, iteration), new_tick)
            else:
                segment = where.get(old)
                if segment is None:
                    free((old, None), new_tick)
                elif segment.template != 1:
                    free((old, segment.iterations[0]), new_tick)
                elif old in copied_templates:
                    free((old, 1), new_tick)
                else:  # every copy the pattern has not freed yet (the last block's input is freed after it)
                    remaining = [i for i in segment.iterations if (old, i) in instance]
                    if not remaining:
                        raise NotRepeated("a storage was freed twice in the replicated step")
                    for iteration in remaining:
                        free((old, iteration), new_tick)
            continue
        segment = item
        emitted = by_segment[segment]
        first_tick = ticks.in_copy(segment, 0, 0)  # a copy's ticks: tick + first_tick + copy x segment.length
        for copy, iteration in enumerate(segment.iterations):
            offset = first_tick + copy * segment.length
            for event, tick in emitted:
                if event >= 0:
                    allocate(event, (event, iteration), tick + offset)
                else:
                    free(instance_of(~event, segment, iteration), tick + offset)
    for (old, _), index in instance.items():  # still alive: so must the storage it copies have been
        if storages[old].freed_at is not None and old not in copies:
            raise NotRepeated("a replicated storage is never freed where its template is")
    allocated_at: dict[int, int] = {}
    freed_at: dict[int, int] = {}
    for event, tick in zip(new_events, new_ticks):
        if event >= 0:
            allocated_at[event] = tick
        else:
            freed_at[~event] = tick
    lives = tuple(StorageLife(life.nbytes, allocated_at[i], freed_at.get(i), life.category, life.op, life.module)
                  for i, life in enumerate(new_storages))  # not dataclasses.replace: 4x slower, per storage
    phase_starts = {phase: ticks.outside(start) for phase, start in memory.phase_starts.items()}
    return LiveMemory(lives, tuple(new_events), tuple(new_ticks), phase_starts, memory.ticks + ticks.added)


def _correspondence(located: Sequence[RunTicks], by_segment: dict[Segment, list[tuple[int, int]]],
                    storages: Sequence[Any]) -> dict[int, int]:
    """Storage allocated by the first or last block's iteration -> the template iteration's storage
    allocated at the same place; NotRepeated when their allocations differ."""
    correspond: dict[int, int] = {}
    for r in located:
        pairs = ((r.forward[0], r.forward[1], False), (r.forward[2], r.forward[1], True),
                 (r.backward[2], r.backward[1], False), (r.backward[0], r.backward[1], True))
        for other, template, prefix in pairs:
            mine = [(tick - other.start, e) for e, tick in by_segment[other] if e >= 0]
            theirs = [(tick - template.start, e) for e, tick in by_segment[template] if e >= 0]
            if prefix:
                theirs = [(offset, e) for offset, e in theirs if offset < other.length]
            if len(mine) != len(theirs):
                raise NotRepeated("blocks of one run allocated differently")
            for (offset, e), (their_offset, t) in zip(mine, theirs):
                if offset != their_offset or storages[e].nbytes != storages[t].nbytes:
                    raise NotRepeated("blocks of one run allocated differently")
                correspond[e] = t
    return correspond


# --------------------------------------------------------------------------- the optimizer


def held_out_ids(runs: Sequence[Run]) -> set[int]:
    """id() of every parameter of the runs' held-out blocks."""
    return {id(param) for run in runs for param, _, _ in held_out_parameters(run)}


Source = tuple[int, int]
"""(run, held-out blocks): whose template a tensor of the optimizer's step belongs to, and its copies."""


def template_multiplicity(runs: Sequence[Run]) -> list[tuple[torch.nn.Parameter, Source]]:
    """(template block's trainable parameter, (its run's index, how many held-out blocks stand behind it))."""
    found = []
    for index, run in enumerate(runs):
        for _, param in run.container._modules[run.keys[1]].named_parameters():
            if param.requires_grad:
                found.append((param, (index, len(run.held_out))))
    return found


def tensor_list(value: Any) -> bool:
    """Whether `value` is a non-empty list or tuple of tensors (a multi-tensor op's argument)."""
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(t, torch.Tensor) for t in value)


def _take(value: Any, positions: Sequence[int], length: int) -> Any:
    """`value`'s elements at `positions` when it is a list of `length` (tensors or scalars), else `value`."""
    if isinstance(value, (list, tuple)) and len(value) == length:
        return [value[p] for p in positions]
    return value


class OptimizerReplicas:
    """The optimizer's step over the kept parameters, made the step over every parameter: the held-out
    blocks' parameters are those of their template, so every op of the step that touches a template's
    tensor (its parameter, gradient, state, or a temporary made from them) is done again for each held-out
    block. A multi-tensor op (`_foreach_lerp_`) takes the template's share of its lists (their positions)
    once more per held-out block, in its cost and its tensor count; any other op is repeated whole. The
    storages such ops make are repeated too (`groups`), made and freed with them: in the order a full step
    makes them for multi-tensor ops; a per-parameter loop (Adafactor's) makes each op's copies right after
    it, where the full step makes them one parameter later (the same storages, sizes and lives)."""

    def __init__(self, seeds: Sequence[tuple[torch.Tensor, Source]]) -> None:
        from torch.utils.weak import WeakTensorKeyDictionary

        self.sources: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        for tensor, source in seeds:
            self.sources[tensor] = source
        self.groups: list[tuple[tuple[int, ...], int]] = []
        """Storages one op made for template tensors, in order, and the copies each stands for: the copies
        are made after the group's last, block by block, as the step over every parameter makes them."""

    def expand(self, record: Any, func: Any, args: tuple, kwargs: dict, out: Any,
               cost_of: Callable[..., Any], storage_of: Callable[[torch.Tensor], int | None]) -> list[Any]:
        """The records that stand for `record` (an op of the step over the kept parameters)."""
        lists = [a for a in args if tensor_list(a)]
        if lists:
            return [self._expand_lists(record, func, args, kwargs, out, lists, cost_of, storage_of)]
        flat = [t for t in leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        sources = [self.sources[t] for t in flat if t in self.sources]
        if not sources:
            return [record]
        source = max(sources, key=lambda s: s[1])
        self._mark([t for t in leaves(out) if isinstance(t, torch.Tensor)], source, storage_of,
                   record.allocated)
        return [record] * (source[1] + 1)

    def _mark(self, tensors: Sequence[torch.Tensor], source: Source, storage_of: Callable[[torch.Tensor], int | None],
              made: Sequence[int]) -> None:
        """Tensors made from a template's tensors belong to it too; those whose storage the op made (`made`
        is not empty) form a group of storages to copy."""
        indices = []
        for tensor in tensors:
            self.sources[tensor] = source
            index = storage_of(tensor)
            if index is not None and made and index not in indices:
                indices.append(index)
        if indices:
            self.groups.append((tuple(indices), source[1]))

    def _expand_lists(self, record: Any, func: Any, args: tuple, kwargs: dict, out: Any, lists: list[Any],
                      cost_of: Callable[..., Any], storage_of: Callable[[torch.Tensor], int | None]) -> Any:
        length = len(lists[0])
        by_source: dict[Source, list[int]] = {}
        for position in range(length):
            source = next((self.sources[a[position]] for a in lists
                           if len(a) == length and a[position] in self.sources), None)
            if source is not None:
                by_source.setdefault(source, []).append(position)
        if not by_source:
            return record
        outputs = list(out) if tensor_list(out) and len(out) == length else None
        flops, read, written = record.flops, record.bytes_read, record.bytes_written
        tensors, allocated = record.tensors, list(record.allocated)
        # tensors outside the lists (a step count's increment, found_inf) are read once, whatever the lists
        shared = sum(t.untyped_storage().nbytes() for t in leaves(
            [a for a in args if not isinstance(a, (list, tuple))] + list(kwargs.values()))
            if isinstance(t, torch.Tensor))
        # last run first: inserting a run's copies leaves the positions before it where they were
        for source, positions in sorted(by_source.items(), key=lambda item: -item[1][-1]):
            count = source[1]
            share_args = tuple(_take(a, positions, length) for a in args)
            share_kwargs = {name: _take(v, positions, length) for name, v in kwargs.items()}
            share_out = None if outputs is None else [outputs[p] for p in positions]
            cost = cost_of(func, share_args, share_kwargs, share_out)
            flops += count * cost.flops
            read += count * (cost.bytes_read - shared)
            written += count * cost.bytes_written
            tensors += count * len(positions)
            if share_out:
                self._mark(share_out, source, storage_of, record.allocated)
                if len(allocated) >= length:  # one new storage per output: the copies go after the template's
                    sizes = [allocated[p] for p in positions]
                    allocated[positions[-1] + 1:positions[-1] + 1] = sizes * count
        return replace(record, flops=flops, bytes_read=read, bytes_written=written, tensors=tensors,
                       allocated=tuple(allocated))
