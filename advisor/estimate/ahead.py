"""Layouts' memory re-played ahead in the child that traced the second batch (issue #24).

Sizing a job on several GPUs re-plays the caching allocator over one rank's step once per layout (ZeRO-1,
ZeRO-2, FSDP, DDP at each GPU count a GPU type needs) and over the step at twice the batch for the layout
chosen: a third of estimating the 7B example over every GPU, in this process, while the child that traced
the second batch sits idle once its trace is sent. That child stays (memory.plan.trace_pair's `serve`) and
is sent this process's step and the layouts likely asked for, in the order they are likely asked; it
re-plays them in turn (layouts_job) and sends each as it is done. Here a layout asked for is taken from what
it sent; the one it is on is waited for, meanwhile doing the next one it has not started here (it is told
to skip it); one it has not reached is done here (it skips it too). Both re-play the same steps with the
same code, so the figures are the same wherever they were made; where the child is gone, fails or is
slow, everything is done here, as without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence

from advisor.estimate.parallel import LayoutMemory
from advisor.memory.estimate import StepMemory
from advisor.parallel.strategy import Layout
from advisor.profile.background import CHILD_GRACE_S, JobChannel, Served
from advisor.profile.trace import StepTrace

Item = tuple[str, tuple[str, bool, int, int]]
"""("step" | "line", LayoutMemory's key of the layout): a rank's memory at the traced batch, or its line
against the batch (the step at twice the batch re-played too)."""


def item_of(kind: str, layout: Layout) -> Item:
    return kind, LayoutMemory.key(layout)


def layouts_job(second: StepTrace, first: StepTrace | None, wanted: Sequence[tuple[str, Layout]],
                made: dict[tuple[str, bool, int, int], StepMemory], channel: JobChannel) -> None:
    """In the serving child, which traced `second`: each of `wanted` in turn, as LayoutMemory of `first` and
    `second` makes it, sent to the parent; those the parent did itself are skipped. `made`: the steps the
    parent re-played already (LayoutMemory.made_steps), not re-played here; a line whose step the parent is making
    waits for that step, the other items done first. `first` is None where no item needs it (needs_first): then
    `second` stands in for it, and only its own memory is read."""
    assert first is not None or not needs_first(wanted, made), "an item needs the first step"
    memory = LayoutMemory(second if first is None else first, second, {"steps": made})
    deferred: list[Layout] = []  # lines whose step the parent is making: done last, with its step
    for kind, layout in wanted:
        _absorb_given(memory, channel)
        item = item_of(kind, layout)
        if channel.skipped(item):
            continue
        if kind == "line" and _step_made_there(memory, channel, layout):
            deferred.append(layout)
            continue
        channel.starting(item)
        channel.emit(item, memory.step(layout) if kind == "step" else memory.batch_model(layout))
    for layout in deferred:
        item = item_of("line", layout)
        deadline = time.perf_counter() + STEP_WAIT_S
        while not channel.skipped(item) and _step_made_there(memory, channel, layout) \
                and time.perf_counter() < deadline:
            channel.wait(deadline - time.perf_counter())
            _absorb_given(memory, channel)
        if not channel.skipped(item):  # else the parent made the line too (or needs no more of this job)
            channel.starting(item)
            channel.emit(item, memory.batch_model(layout))


STEP_WAIT_S = 2.0
"""Seconds the child waits for a step the parent is making, once nothing else is left to do, before it makes
the step itself (the 7B example's steps take 20-40 ms)."""


def _absorb_given(memory: LayoutMemory, channel: JobChannel) -> None:
    """The steps the parent made and shared since: a line here needs its step."""
    for given, value in channel.given():
        memory.absorb(given, value)  # type: ignore[arg-type]


def _step_made_there(memory: LayoutMemory, channel: JobChannel, layout: Layout) -> bool:
    """Whether the parent took the layout's step (it is making it, and shares it once made) and it has not come:
    a line here would re-play the same step again (two of the 7B example's 20 re-plays did)."""
    step = item_of("step", layout)
    return not memory.has(step) and channel.skipped(step)


def needs_first(wanted: Sequence[tuple[str, Layout]], made: Collection[tuple[str, bool, int, int]]) -> bool:
    """Whether re-playing `wanted` reads the first step: a layout's step does, and a line whose step is not
    among `made` or whose tensor-parallel plan is the first step's (tp > 1); a line of a step made needs only
    the second. (Llama-3-70B over every GPU asks the child for one GPU's line alone: its 2.4 MB first step
    was sent for nothing, and its one-GPU step re-played there a second time.)"""
    return any(kind == "step" or layout.tp > 1 or LayoutMemory.key(layout) not in made for kind, layout in wanted)


def memory_of(trace: StepTrace, wanted: Sequence[tuple[str, Layout]]) -> StepTrace:
    """What the child needs of the first step for `wanted`: its memory and parameters, without its ops where no
    item is tensor-parallel (whose plan reads the ops: parallel/tensor.py). The 7B example's step pickles in
    5 ms instead of 14 without its 4,200 ops, and unpickles in as much less."""
    return trace if any(layout.tp > 1 for _, layout in wanted) else trace.memory_only()


class LayoutsAhead:
    """This process's side: what the child sent goes into `memory`'s own tables as it arrives."""

    def __init__(self, served: Served, memory: LayoutMemory, wanted: Sequence[tuple[str, Layout]]) -> None:
        """`wanted`: the layouts to re-play, in the order they are likely asked for."""
        self._served = served
        self._memory = memory
        self._wanted = [(item_of(kind, layout), kind, layout) for kind, layout in wanted]
        self._order = {item: index for index, (item, _, _) in enumerate(self._wanted)}
        self._position = -1  # the index of the item the child works on, or did last
        self._current: Item | None = None
        self._taken: set[Item] = set()  # done here: the child was told to skip them
        self.sent = 0  # items the child's re-plays gave this process

    @classmethod
    def start(cls, served: Served, memory: LayoutMemory, trace: StepTrace,
              wanted: Sequence[tuple[str, Layout]]) -> LayoutsAhead | None:
        """Send the child `wanted`, the steps `memory` re-played already, and `trace` (the step the layouts are
        of) where an item needs it; None where it cannot take them."""
        made = memory.made_steps()
        first = memory_of(trace, wanted) if needs_first(wanted, made) else None
        if not wanted or not served.submit(layouts_job, first, list(wanted), made):
            return None
        return cls(served, memory, wanted)

    def drain(self, timeout_s: float = 0.0) -> None:
        """Take in what the child sent (waiting up to `timeout_s` for a first message)."""
        for kind, item, value in self._served.poll(timeout_s):
            if kind == "starting":
                self._current = item
                self._position = self._order.get(item, self._position)
            elif kind == "item":
                self._current = None
                self.sent += 1
                self._memory.absorb(item, value)
            else:  # done, or failed: nothing more comes
                self._current = None
                self._served.alive = False

    def await_item(self, item: Item) -> None:
        """Before `item` is made here: take it from the child, waiting where the child is on it (doing the next
        item it has not started meanwhile); else tell the child to skip it (the caller makes it)."""
        deadline = time.perf_counter() + CHILD_GRACE_S
        while True:
            self.drain()
            if self._memory.has(item):
                return
            if not self._served.alive or self._current != item:
                self._take(item)
                return
            stolen = self._next_unstarted(item)
            if stolen is not None:
                self._take(stolen[0])
                self._memory.make(stolen[1], stolen[2])
                continue
            left = deadline - time.perf_counter()
            if left <= 0:  # the child is too slow: done here
                self._take(item)
                return
            self.drain(min(left, 1.0))

    def steps_while(self, waiting: Callable[[], bool]) -> int:
        """While `waiting()` (the child still traces the second batch, which every line needs), make here the
        wanted steps it has not started, in its order (it is told to skip them and is given each: its lines
        need them); the number made. A step is made whole once begun: the second trace waits at most one."""
        made = 0
        while waiting():
            self.drain()
            step = self._next_unstarted(lines=False)
            if step is None:
                break
            self._take(step[0])
            self._memory.make(step[1], step[2])
            made += 1
        return made

    def share(self, item: Item, value: StepMemory) -> None:
        """Give the child a step made here: a line it makes needs its step, which it made again (two or three
        of the 7B example's 16 layouts, each re-played in both processes)."""
        if self._served.alive:
            self._served.share(item, value)

    def _take(self, item: Item) -> None:
        """Make `item` here, the child told to skip it: one it has not reached, and one it went past, which it may
        still make (a line whose step this process was making, done last: layouts_job; the 7B example's ZeRO-2
        line on two GPUs was made in both processes). Never the one it is on (the callers' condition)."""
        if item not in self._taken:
            self._taken.add(item)
            if self._served.alive:
                self._served.skip(item)

    def _next_unstarted(self, waiting_for: Item | None = None, lines: bool = True) -> tuple[Item, str, Layout] | None:
        """The first wanted item after the child's but `waiting_for` that neither side has started and this process
        can make on its own (a line's step made already); steps alone without `lines`."""
        for item, kind, layout in self._wanted[self._position + 1:]:
            if item == waiting_for or item in self._taken or self._memory.has(item):
                continue
            if kind == "line" and not (lines and self._memory.has(("step", item[1]))):
                continue
            return item, kind, layout
        return None
