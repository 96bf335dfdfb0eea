"""The kernels a CUDA device runs where the trace (taken on a CPU) recorded a CPU decomposition.

Some aten ops are composites that lower differently per device. The trace runs on fake CPU tensors,
so it records the CPU's form; a GPU estimate must time the CUDA one.

- Dropout in training (`aten::dropout`, and the dropout inside scaled_dot_product_attention's math
  path): CUDA runs one fused `native_dropout` kernel (torch's `is_fused_kernel_acceptable`): it reads
  x once and writes y and a one-byte-per-element bool mask. A CPU runs
  `empty_like(x).bernoulli_(1 - p)`, `mask.div_(1 - p)`, `x * mask`: the mask is as wide as x and
  is written, read and rewritten, then read again, about 2.7x the traffic for fp32 x. The recorded
  pattern is the three consecutive ops bernoulli_, div_ (in place on the same mask), mul, in one
  phase and module.

Left as recorded: dropout's backward, a `mul` by the wide mask on a CPU where CUDA's
native_dropout_backward reads a bool mask (12 vs 9 bytes per fp32 element: it cannot be told apart
from any other mul), and the memory plan, which keeps the CPU's wide mask saved for backward.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from advisor.profile.trace import OpRecord


def cuda_records(records: Iterable[OpRecord]) -> list[OpRecord]:
    """`records` with every CPU dropout decomposition replaced by the one kernel CUDA runs."""
    ops = list(records)
    lowered: list[OpRecord] = []
    index = 0
    while index < len(ops):
        fused = _fused_dropout(ops[index:index + 3])
        if fused is None:
            lowered.append(ops[index])
            index += 1
        else:
            lowered.append(fused)
            index += 3
    return lowered


def _fused_dropout(window: Sequence[OpRecord]) -> OpRecord | None:
    """The native_dropout kernel for a bernoulli_, div_, mul window, None when it is not one.

    # x fp32 of 1000 elements: the CPU writes a 4000-byte mask (bernoulli_), reads and rewrites it
    # (div_), then mul reads x and the mask (8000 bytes) and writes y (4000): 20,000 bytes.
    # CUDA's native_dropout reads x (4000) and writes y (4000) and a bool mask (1000): 9000 bytes.
    """
    if len(window) < 3:
        return None
    draw, scale, apply = window
    if (draw.op, scale.op, apply.op) != ("bernoulli_", "div_", "mul"):
        return None
    if len({(r.phase, r.module) for r in window}) != 1 or len(draw.dtypes) != 1:
        return None
    mask_bytes = draw.bytes_written
    dtype = getattr(torch, draw.dtypes[0], None)  # the mask takes x's (floating) dtype on a CPU
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        return None
    if mask_bytes == 0 or scale.bytes_written != mask_bytes:
        return None
    if apply.bytes_read != 2 * mask_bytes or apply.bytes_written != mask_bytes:
        return None  # x * mask with x, mask and y of one shape and dtype (the mask is empty_like(x))
    elements = mask_bytes // dtype.itemsize
    mask = elements * torch.bool.itemsize  # native_dropout's mask
    return OpRecord(apply.phase, apply.module, "native_dropout", float(elements), mask_bytes,
                    mask_bytes + mask, apply.dtypes, matmul=False, counted=True, allocated=(mask_bytes, mask))
