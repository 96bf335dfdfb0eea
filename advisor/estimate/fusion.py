"""The step as a compiler that fuses kernels runs it: torch.compile (TorchInductor), and as a first
approximation the fused kernels of Megatron-Core/TransformerEngine and XLA.

Inductor leaves matrix products, convolutions and attention to their libraries (cuBLAS, cuDNN, flash
attention: "extern kernels") and generates kernels for the rest: it fuses each run of pointwise ops,
reductions, copies and indexing between two such library calls into as few kernels as it can
(PyTorch 2 paper, Ansel et al., ASPLOS 2024, sections 4.3-4.4: "vertical fusion" of producers into
consumers and "horizontal fusion" of ops that read the same input). A fused kernel keeps the values its
ops pass to each other in registers: it reads from memory only what was made outside it, once, and
writes only what is read after it or outlives the step (profile/dataflow.py). The optimizer's
multi-tensor ops fuse into one pass over parameters, gradients and state, as torch's fused AdamW does.
Not modelled: Inductor's `layout_optimization` (torch/_inductor/config.py), which runs convolutions on
channels-last tensors. Doing so here drops the NCHW<->NHWC transposes the eager estimate puts around every
tensor-core convolution, and predicted 1.9-2.4x for ResNet-50, DenseNet-121 and MobileNetV2 on an A100
where PyTorch's published geomean is 1.51x with AMP: newer cuDNN runs many NCHW convolutions on tensor
cores without transposes (the GeForce fp16 rows of published-throughput-newer.csv run 10-30% faster than
the eager estimate too), so the transposes' cost is the thing to settle first.

Each fused run is one record (`FUSED_OP`): the FLOPs of its ops, the bytes it must move, timed by the
memory series of a plain copy. The host issues compiled kernels without recording autograd per op
(step.host_seconds). Left as eager (assumptions): the activations saved for backward (Inductor's
min-cut partitioner recomputes some cheap ones instead of saving them: the memory estimate and the
bytes written for them are eager's, an upper bound), and one kernel per run even where Inductor splits
a run at a reduction it cannot fuse (batch norm's statistics, then its normalisation: counted as the
second read of its input).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby

from advisor.estimate.ops import BATCH_NORMS
from advisor.profile.trace import OpRecord

FUSED_OP = "fused"
"""The op name of a fused kernel's record."""

NOT_FUSED = frozenset({
    "sort", "topk", "nonzero", "unique", "_unique2", "unique_consecutive", "_local_scalar_dense", "multinomial",
    "_embedding_bag", "_embedding_bag_backward", "native_dropout", "bernoulli_",
})
"""Ops outside matrix products that Inductor runs as library calls (fallbacks), not in generated
kernels: sorts, data-dependent shapes, `.item()`. Dropout's random numbers come from CUDA's own kernel
here (eager's Philox stream; Inductor's in-kernel RNG would fuse them: an assumption on the slow side)."""


def fusible(record: OpRecord) -> bool:
    """Whether a compiler generates this op's kernel (and may fuse it): no matrix product, convolution or
    attention, and not a fallback."""
    return not record.matmul and record.conv is None and record.op not in NOT_FUSED and bool(record.reads or record.writes)


def compiled_records(records: Sequence[OpRecord]) -> list[OpRecord]:
    """`records` with each run of fusible ops of one phase replaced by the one kernel it fuses into."""
    lowered: list[OpRecord] = []
    for (fuses, _), run in groupby(range(len(records)), key=lambda i: (fusible(records[i]), records[i].phase)):
        indices = list(run)
        lowered.extend(_fused(records, indices) if fuses else (records[i] for i in indices))
    return lowered


def _fused(records: Sequence[OpRecord], run: list[int]) -> list[OpRecord]:
    """The one kernel of the run of fusible records at `run` (consecutive indices); a lone op as it is."""
    if len(run) < 2:
        return [records[i] for i in run]
    first, last = run[0], run[-1]
    read, written = _traffic(records, first, last)
    ops = [records[i] for i in run]
    dtypes = tuple(dict.fromkeys(d for op in ops for d in op.dtypes))
    return [OpRecord(ops[0].phase, ops[0].module, FUSED_OP, sum(op.flops for op in ops), read, written, dtypes,
                     matmul=False, counted=all(op.counted for op in ops),
                     allocated=tuple(size for op in ops for size in op.allocated))]


def _traffic(records: Sequence[OpRecord], first: int, last: int) -> tuple[int, int]:
    """(bytes read, bytes written) of one kernel running records[first:last + 1]: each value made before
    it read once, each value read after it (or outliving the step) written once.

    # y = gelu(x + b) fused, x and b made earlier, y read later, the sum read only by gelu:
    # reads x and b, writes y; x + b never reaches memory.
    """
    reads: dict[object, int] = {}
    writes: dict[object, int] = {}
    for index in range(first, last + 1):
        record = records[index]
        for position, (source, size, offset) in enumerate(record.reads):
            if source > 0 and index - source >= first:
                continue  # made inside the kernel
            key: object = ((index - source) if source > 0 else source if source < 0 else (index, position), offset)
            reads[key] = max(reads.get(key, 0), size)
            if record.op in BATCH_NORMS and position == 0:
                reads[(key, "second pass")] = size
        for slot, (last_use, size) in enumerate(record.writes):
            if 0 < last_use and index + last_use <= last:
                continue  # read only inside the kernel
            key = last_use if last_use < 0 else (index, slot)
            writes[key] = max(writes.get(key, 0), size)
    return sum(reads.values()), sum(writes.values())
