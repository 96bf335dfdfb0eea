"""Which op of the step made each value another op reads, and which op reads a value last.

A compiler that fuses kernels (torch.compile's Inductor, XLA, TransformerEngine's fused modules) keeps
a value in registers when every op that reads it runs in the same kernel as the op that made it; it
reads from memory only the values made outside the kernel and writes only those read after it
(estimate/fusion.py). The trace records, per op:

- `reads`: one (source, bytes, offset) per value read. A value is a tensor argument, or a whole list of
  them (a multi-tensor op's argument): its bytes are the tensors' sizes as viewed, its offset the first
  tensor's in its storage (bytes; views of one storage, such as q, k and v split from one projection,
  are different values). `source` > 0: the value's storage was last written by the op `source` records
  earlier; < 0: -(1 + index) of a storage no recorded op wrote in this step (parameters, inputs,
  optimizer state); 0: a storage the memory tracker does not know.
- `writes`: one (last_use, bytes) per value written (outputs, and the argument an in-place op
  changes): the op that reads it last is `last_use` records later; 0 when no recorded op of the step
  reads it; < 0: -(1 + index) of a storage made before the step, which outlives it (parameters,
  gradients accumulated over micro-batches, optimizer state).

Distances rather than positions keep these right where a repeated block's records are copied for the
blocks traced once (repeated.py): inside a block, and from one block to the next, they are the same for
every copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from advisor.profile.repeated import tensor_list
from advisor.profile.tensors import leaves

Flow = tuple[tuple[int, ...], ...]
"""(source, bytes, offset) per value an op reads, (last_use, bytes) per value it writes (see the module
docstring)."""


def _values(tree: Any, lists_whole: bool) -> list[list[torch.Tensor]]:
    """The values in `tree` (an op's arguments, or its results in a tuple): each tensor, and with
    `lists_whole` (a multi-tensor op) each list of tensors as one."""
    values: list[list[torch.Tensor]] = []
    for item in leaves(tree, is_leaf=lambda x: lists_whole and tensor_list(x)):
        if isinstance(item, torch.Tensor):
            values.append([item])
        elif lists_whole and tensor_list(item):
            values.append(list(item))
    return values


def _nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class Dataflow:
    """Follows values through the recorded ops by storage (`storage_of`: the memory tracker's index)."""

    def __init__(self, storage_of: Callable[[torch.Tensor], int | None]) -> None:
        self.storage_of = storage_of
        self.writer: dict[int, tuple[int, int]] = {}
        """Storage -> (record, slot of its writes) that wrote it last."""
        self.reads: list[Flow] = []
        self.written: list[list[int]] = []
        """Per record, the bytes of each value it wrote."""
        self.last_use: list[list[int]] = []
        """Per record, the last record that read each value it wrote (its own index: none)."""
        self.kept: dict[tuple[int, int], int] = {}
        """(record, slot) -> storage of values written to storages made before the step: they outlive it."""
        self.first_of_step: int | None = None
        """The first storage made in the step (the first record's outputs and after)."""

    def record(self, index: int, args: tuple, kwargs: dict, out: Any, in_place: bool, multi_tensor: bool,
               first_storage: int) -> None:
        """The values record `index` reads (`args`, `kwargs`) and writes (`out`; for an in-place op, the
        argument it changes, which `out` returns). A `multi_tensor` op's lists are one value each;
        `first_storage`: the first storage the op may have made."""
        assert index == len(self.reads), "records come in order"
        if self.first_of_step is None:
            self.first_of_step = first_storage
        inputs, changed = _values((args, kwargs), multi_tensor), _values(out, multi_tensor)
        if not changed and in_place and args:  # in-place multi-tensor ops return nothing
            changed = _values(args[:1], multi_tensor)
        if any(t.layout != torch.strided for tensors in inputs + changed for t in tensors):
            self.reads.append(())  # sparse tensors have no storage to follow: the op is left unfused
            self.written.append([])
            self.last_use.append([])
            return
        reads: list[tuple[int, ...]] = []
        for tensors in inputs:
            storages = [self.storage_of(t) for t in tensors]
            for storage in storages:
                writer = None if storage is None else self.writer.get(storage)
                if writer is not None:
                    self.last_use[writer[0]][writer[1]] = index
            writer = None if storages[0] is None else self.writer.get(storages[0])
            if writer is not None:
                source = index - writer[0]
            else:
                source = 0 if storages[0] is None else -(1 + storages[0])
            offset = tensors[0].storage_offset() * tensors[0].element_size()
            reads.append((source, _nbytes(tensors), offset))
        written: list[int] = []
        for slot, tensors in enumerate(changed):
            written.append(_nbytes(tensors))
            for tensor in tensors:
                storage = self.storage_of(tensor)
                if storage is not None:
                    self.writer[storage] = (index, slot)
                    if storage < self.first_of_step and (index, slot) not in self.kept:
                        self.kept[(index, slot)] = storage
        self.reads.append(tuple(reads))
        self.written.append(written)
        self.last_use.append([index] * len(written))

    def repeat_last(self, copies: int) -> None:
        """The last record stands for `copies` records in a row (an optimizer op done again for blocks
        traced once): the copies read and write what it does."""
        for _ in range(copies):
            index = len(self.reads)
            self.reads.append(tuple((source + 1 if source > 0 else source, size, offset)
                                    for source, size, offset in self.reads[-1]))
            self.written.append(list(self.written[-1]))
            self.last_use.append([index] * len(self.written[-1]))
            self.kept.update({(index, slot): self.kept[(index - 1, slot)] for slot in range(len(self.written[-1]))
                              if (index - 1, slot) in self.kept})

    def scale_last(self, factor: float) -> None:
        """The last record's values stand for `factor` times their bytes (a multi-tensor op's lists
        lengthened for blocks traced once)."""
        self.reads[-1] = tuple((source, round(size * factor), offset) for source, size, offset in self.reads[-1])
        self.written[-1] = [round(size * factor) for size in self.written[-1]]

    def flows(self) -> list[tuple[Flow, Flow]]:
        """(reads, writes) of every record so far (see the module docstring)."""
        return [(reads, tuple((self._last_use(index, slot, last), size) for slot, (last, size) in enumerate(zip(uses, sizes))))
                for index, (reads, uses, sizes) in enumerate(zip(self.reads, self.last_use, self.written))]

    def _last_use(self, index: int, slot: int, last: int) -> int:
        kept = self.kept.get((index, slot))
        if kept is not None:
            return -(1 + kept)
        return last - index if last > index else 0
