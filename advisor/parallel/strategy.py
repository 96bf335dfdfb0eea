"""How a data-parallel training job splits over GPUs, and what each GPU then holds and sends. Bytes.

Strategies, as torch.distributed runs them:
- "ddp": DistributedDataParallel. Every rank holds the whole model, its gradients and optimizer state,
  plus the reducer's gradient buckets (a second copy of every gradient, gradient_as_bucket_view off);
  gradients are all-reduced bucket by bucket (1 MiB first, then 25 MiB) behind the backward.
- "zero1": DDP with torch's ZeroRedundancyOptimizer (DeepSpeed's stage 1): the optimizer state is
  sharded; after its step each rank broadcasts its shard of the parameters.
- "zero2": fully_shard with reshard_after_forward=False (DeepSpeed's stage 2 as FSDP2 runs it):
  parameters are gathered once per step and stay whole until the backward ends (sharded between
  steps); gradients and optimizer state are sharded.
- "fsdp": fully_shard (ZeRO-3): parameters, gradients and optimizer state sharded; each unit's
  parameters gathered before its forward and again before its backward, its gradients reduce-scattered
  after it.
- "hsdp": fsdp inside each node, the node's shards replicated across nodes (gradients all-reduced between
  nodes).

Under a master-weight precision (`bf16-master`, `fp8-master`: Megatron's and DeepSpeed's way), "ddp" and "zero1" are those
runtimes' data parallelism: the gradients live in contiguous buffers that are reduced in place, so there is
no bucket copy (per_rank_memory's `bucket_view`), and zero1's optimizer state includes the fp32 masters
(Megatron's distributed optimizer, DeepSpeed's ZeRO-1). zero1 then communicates as Megatron-Core's
distributed optimizer does in NeMo's and Megatron-Bridge's recipes (overlap_grad_reduce and
overlap_param_gather on; decision 2026-11-28): each bucket of gradients is reduce-scattered behind the
backward and each bucket of updated parameters all-gathered behind the next step's forward, so one bucket
is exposed each way (NeMo's "Communication Overlap" guide: "exposes only one DP communication chunk").
DeepSpeed's ZeRO-1 gathers after its step, as torch's zero1 does.

Only trainable parameters are updated, so zero1 sends only them after its step: a LoRA job's frozen base
(every rank holds it whole) is never broadcast or gathered.

Under autocast, fully_shard runs with MixedPrecisionPolicy(param_dtype=autocast's dtype,
reduce_dtype=float32), as torchtitan does: units are gathered in 16 bits and autocast's weight copies
vanish (per_rank_memory's mixed_precision).

FSDP units (fsdp_units): fully_shard applied to every numbered block of the model's deepest-reaching
ModuleList/Sequential level (transformer layers, ResNet bottlenecks) and to the root for the rest, all
with reshard_after_forward=True as torchtitan's recipe does: the root's parameters (embeddings, the
head) are gathered for the whole forward and again for the whole backward.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from advisor.profile.live_memory import BEFORE_STEP, CATEGORIES, LiveMemory, StorageLife

STRATEGIES = ("ddp", "zero1", "zero2", "fsdp", "hsdp")
"""Data-parallel strategies modelled (PRODUCT.md's `--parallel` values, "auto" and "tp" aside)."""

SHARDED = {
    "ddp": frozenset(),
    "zero1": frozenset({"optimizer_state", "optimizer_temporaries"}),
    "zero2": frozenset({"weights", "gradients", "optimizer_state", "optimizer_temporaries"}),
    "fsdp": frozenset({"weights", "gradients", "optimizer_state", "optimizer_temporaries"}),
    "hsdp": frozenset({"weights", "gradients", "optimizer_state", "optimizer_temporaries"}),
}
"""Memory categories (live_memory.CATEGORIES) each rank holds one shard of."""
assert set(SHARDED) == set(STRATEGIES)

WHOLE_ON_EVERY_RANK = frozenset(CATEGORIES) - frozenset().union(*SHARDED.values()) - {"weight_copies"}
"""Categories every data-parallel rank holds as one GPU does (per_rank_memory changes none of them, and only
adds storages): the micro-batch's inputs, activations and backward temporaries."""

FULLY_SHARDED = frozenset({"zero2", "fsdp", "hsdp"})
"""Strategies run by fully_shard (FSDP2): units gathered and reduce-scattered; the others run DDP."""

LOW_PRECISION_SHARE = 0.5
"""Bytes of a gradient in autocast's dtype (bf16, fp16) per byte of its fp32 gradient."""

DDP_FIRST_BUCKET_BYTES = 1024 * 1024
"""DDP's first gradient bucket (torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES)."""
DDP_BUCKET_BYTES = 25 * 1024 * 1024
"""DDP's bucket_cap_mb default, 25 MiB."""
MEGATRON_BUCKET_PARAMS = 40_000_000
MEGATRON_BUCKET_PARAMS_PER_RANK = 1_000_000
"""Megatron-Core's gradient buckets: max(40M, 1M x data-parallel ranks) parameters each
(DistributedDataParallelConfig.bucket_size's default, megatron/core/distributed)."""
MEGATRON_GRADIENT_BYTES = 2
"""Bytes per gradient in Megatron's buffers under the master-weight precisions (bf16; grad_reduce_in_fp32
off, as the DGX Cloud fine-tuning recipe sets it)."""


@dataclass(frozen=True)
class Layout:
    """`gpus` GPUs, `gpus_per_node` to an instance, in tensor-parallel groups of `tp` GPUs inside a node
    (parallel/tensor.py), the groups running the data-parallel `strategy`."""

    strategy: str
    gpus: int
    gpus_per_node: int
    tp: int = 1

    def __post_init__(self) -> None:
        assert self.strategy in STRATEGIES, self.strategy
        assert self.gpus >= 1 and self.gpus_per_node >= 1, (self.gpus, self.gpus_per_node)
        assert self.tp >= 1 and self.gpus % self.tp == 0 and self.gpus_per_node % self.tp == 0, \
            (self.gpus, self.gpus_per_node, self.tp)

    @property
    def nodes(self) -> int:
        """Instances the job spans."""
        return math.ceil(self.gpus / self.gpus_per_node)

    @property
    def dp(self) -> int:
        """Data-parallel ranks: the tensor-parallel groups, each taking its own batch."""
        return self.gpus // self.tp

    @property
    def shards(self) -> int:
        """Data-parallel ranks a sharded state is split over: every one, or those of one node for hsdp."""
        if self.strategy == "hsdp":
            return min(self.gpus, self.gpus_per_node) // self.tp
        return 1 if self.strategy == "ddp" else self.dp

    @property
    def replicas(self) -> int:
        """Copies of each shard (hsdp's nodes; 1 otherwise)."""
        return self.dp // self.shards if self.strategy == "hsdp" else 1

    @property
    def name(self) -> str:
        """The strategy as the user names it: "tp" for tensor parallelism with DDP between its groups (or
        none), "fsdp+tp" for 2-D, else the data-parallel strategy."""
        if self.tp == 1:
            return self.strategy
        return "tp" if self.strategy == "ddp" else f"{self.strategy}+tp"

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.name, "dp": self.dp, "tp": self.tp}


@dataclass(frozen=True)
class Units:
    """FSDP units: the blocks fully_shard wraps (module paths, trainable parameters each) and the root's
    own parameters (everything outside the blocks)."""

    blocks: tuple[str, ...]
    block_params: tuple[int, ...]
    root_params: int

    @property
    def total_params(self) -> int:
        return sum(self.block_params) + self.root_params

    @property
    def largest_block_params(self) -> int:
        return max(self.block_params, default=0)


def fsdp_units(params_by_module: Mapping[str, int]) -> Units:
    """The units a fully_shard recipe wraps: every numbered child ("layers.3", "layer2.1") at the module
    depth whose numbered children hold the most parameters, if at least two; the root holds the rest.

    # {"": 10, "0": 4, "1": 4, "2": 2}: depth 1 holds 10 in blocks "0", "1", "2"; the root keeps 0
    """
    total = params_by_module.get("", 0)
    by_depth: dict[int, list[str]] = {}
    for path, count in params_by_module.items():
        name = path.rsplit(".", 1)[-1]
        if path and name.isdigit() and count > 0:
            by_depth.setdefault(path.count("."), []).append(path)
    if not by_depth:
        return Units((), (), total)
    depth = max(by_depth, key=lambda d: (sum(params_by_module[p] for p in by_depth[d]), -d))
    blocks = tuple(sorted(by_depth[depth], key=_natural))
    if len(blocks) < 2:
        return Units((), (), total)
    counts = tuple(params_by_module[b] for b in blocks)
    return Units(blocks, counts, total - sum(counts))


def _natural(path: str) -> tuple:
    return tuple(int(part) if part.isdigit() else part for part in path.split("."))


@dataclass(frozen=True)
class Collective:
    """`count` collectives of one kind and message size in one phase of the step; `message_bytes` is the
    tensor a rank hands the library (all-reduce's buffer, all-gather's gathered output, reduce-scatter's
    input). `ranks` take part over the `scope` link ("node" or "network")."""

    kind: str
    message_bytes: float
    count: int
    phase: str
    ranks: int
    scope: str
    hidden_behind: str | None
    """The compute phase it can overlap ("forward", "backward"), None when it cannot (after the optimizer)."""

    @property
    def total_bytes(self) -> float:
        return self.message_bytes * self.count


def ddp_buckets(gradient_bytes: float) -> list[float]:
    """DDP's bucket sizes for `gradient_bytes` of gradients: 1 MiB first, then 25 MiB ones, the rest last.

    # 60 MiB: 1 + 25 + 25 + 9 MiB
    """
    if gradient_bytes <= 0:
        return []
    first = min(gradient_bytes, DDP_FIRST_BUCKET_BYTES)
    rest = gradient_bytes - first
    full, last = divmod(rest, DDP_BUCKET_BYTES)
    return [first] + [float(DDP_BUCKET_BYTES)] * int(full) + ([last] if last > 0 else [])


def megatron_buckets(gradient_bytes: float, dp: int) -> list[float]:
    """Megatron-Core's gradient buckets for `gradient_bytes` of bf16 gradients over `dp` ranks, in bytes.

    # 200 M bf16 gradients (400 MB) on 8 ranks: buckets of max(40 M, 8 M) = 40 M params (80 MB): 5 of them
    """
    if gradient_bytes <= 0:
        return []
    size = max(MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_RANK * dp) * MEGATRON_GRADIENT_BYTES
    full, last = divmod(gradient_bytes, size)
    return [float(size)] * int(full) + ([last] if last > 0 else [])


def collectives(layout: Layout, units: Units, weight_bytes: float, gradient_bytes: float,
                micro_batches: int = 1, buffer_bytes: float = 0.0,
                distributed_optimizer: bool = False) -> list[Collective]:
    """Each rank's collectives in one optimizer step. `weight_bytes`: every parameter as gathered (their
    stored dtype); `gradient_bytes`: the trainable parameters' gradients, the same bytes as those parameters
    (what zero1 sends after its step); `buffer_bytes`: the model's buffers (BatchNorm's running statistics),
    which DDP broadcasts from rank 0 before each forward; with `micro_batches` > 1 (gradient accumulation)
    DDP syncs the last micro-batch only (no_sync) and FSDP gathers every micro-batch's parameters but
    reduce-scatters once. `distributed_optimizer`: zero1 runs as Megatron's (see the module's docstring)."""
    strategy, ranks = layout.strategy, layout.shards
    scope = "network" if layout.nodes > 1 and strategy != "hsdp" else "node"
    if layout.dp == 1:
        return []
    if strategy == "zero1" and distributed_optimizer:
        buckets = megatron_buckets(gradient_bytes, layout.dp)
        return _merged([Collective("reduce_scatter", size, 1, "backward", layout.dp, scope, "backward")
                        for size in buckets] +
                       [Collective("all_gather", size, 1, "forward", layout.dp, scope, "forward")
                        for size in buckets])
    if strategy not in FULLY_SHARDED:
        found = [Collective("all_reduce", size, 1, "backward", layout.dp, scope, "backward")
                 for size in ddp_buckets(gradient_bytes)]
        if buffer_bytes > 0:
            found.append(Collective("broadcast", buffer_bytes, micro_batches, "forward", layout.dp, scope, None))
        if strategy == "zero1":  # each rank broadcasts its shard of the updated (trainable) parameters
            found.append(Collective("broadcast", gradient_bytes, 1, "optimizer", layout.dp, scope, None))
        return _merged(found)
    if units.total_params == 0:
        return []
    share = [(p / units.total_params) for p in units.block_params]
    root = units.root_params / units.total_params
    found = []
    gathers_forward = micro_batches
    gathers_backward = micro_batches if strategy != "zero2" else 0
    for fraction in share:
        found.append(Collective("all_gather", weight_bytes * fraction, gathers_forward, "forward", ranks, scope,
                                "forward"))
        if gathers_backward:
            found.append(Collective("all_gather", weight_bytes * fraction, gathers_backward, "backward", ranks,
                                    scope, "backward"))
        found.append(Collective("reduce_scatter", gradient_bytes * fraction, 1, "backward", ranks, scope,
                                "backward"))
    if root > 0:
        found.append(Collective("all_gather", weight_bytes * root, micro_batches, "forward", ranks, scope, None))
        if gathers_backward:
            found.append(Collective("all_gather", weight_bytes * root, gathers_backward, "backward", ranks, scope,
                                    None))
        found.append(Collective("reduce_scatter", gradient_bytes * root, 1, "backward", ranks, scope, None))
    if strategy == "hsdp" and layout.replicas > 1:
        for fraction in share + ([root] if root > 0 else []):
            found.append(Collective("all_reduce", gradient_bytes * fraction / ranks, 1, "backward",
                                    layout.replicas, "network", "backward"))
    return _merged(found)


def _merged(found: Sequence[Collective]) -> list[Collective]:
    """Collectives of the same kind, size, phase and link counted together."""
    first: dict[tuple, Collective] = {}
    counts: dict[tuple, int] = {}
    for c in found:
        key = (c.kind, round(c.message_bytes), c.phase, c.ranks, c.scope, c.hidden_behind)
        first.setdefault(key, c)
        counts[key] = counts.get(key, 0) + c.count
    return [c if c.count == counts[key] else replace(c, count=counts[key]) for key, c in first.items()]


def per_rank_memory(memory: LiveMemory, layout: Layout, units: Units,
                    parameter_bytes: float | None = None, mixed_precision: bool = False,
                    bucket_view: bool = False) -> LiveMemory:
    """`memory` (one GPU's step) as each rank of `layout` lives it: its sharded categories split over
    the shard ranks, plus DDP's gradient buckets or FSDP's gathered units and unsharded gradients.
    `parameter_bytes`: what FSDP gathers, the parameters as gathered (None: every weight the model
    holds, buffers included). `mixed_precision`: the step runs under autocast, so fully_shard gathers
    the parameters in autocast's dtype (MixedPrecisionPolicy) and autocast's own weight copies vanish
    (casting a bfloat16 parameter to bfloat16 returns it). `bucket_view`: the gradients are DDP's buckets
    (gradient_as_bucket_view; Megatron's and DeepSpeed's contiguous gradient buffers): no copy of them."""
    if layout.dp == 1:
        return memory
    strategy, shards = layout.strategy, layout.shards
    sharded = SHARDED[strategy]
    no_copies = mixed_precision and strategy in FULLY_SHARDED
    storages = [s.resized(0) if no_copies and s.category == "weight_copies"
                else s.resized(math.ceil(s.nbytes / shards)) if s.category in sharded else s
                for s in memory.storages]
    gradient_bytes = memory.total("gradients")
    gathered = memory.held_at_start("weights") if parameter_bytes is None else parameter_bytes
    forward = memory.phase_starts.get("forward", 0)
    backward = memory.phase_starts.get("backward", memory.ticks)
    optimizer = memory.phase_starts.get("optimizer", memory.ticks)
    extra: list[StorageLife] = []
    if strategy not in FULLY_SHARDED:
        if not bucket_view:
            extra.append(StorageLife(gradient_bytes, BEFORE_STEP, None, "gradients", "(DDP gradient buckets)"))
    else:
        total = max(units.total_params, 1)
        root = units.root_params / total
        block = units.largest_block_params / total
        if strategy == "zero2":
            extra.append(StorageLife(round(gathered), forward, optimizer, "weight_copies", "(gathered parameters)"))
        else:
            held = root + min(2, len(units.blocks)) * block  # the root, the unit computed and the one prefetched
            extra.append(StorageLife(round(gathered * held), forward, optimizer, "weight_copies",
                                     "(gathered units)"))
        # unsharded gradients exist from the first one the backward computes (the loss's backward before it
        # holds none), not from the backward's start, where the step's activations peak
        if mixed_precision:  # the root's and a unit's in the gathered dtype, the reduce-scatter's input in fp32
            unsharded_grads = gradient_bytes * ((root + block) * LOW_PRECISION_SHARE + block)
        else:  # the root's, a unit's and its reduce-scatter input
            unsharded_grads = gradient_bytes * (root + 2 * block)
        first_gradient = min((s.allocated_at for s in memory.storages
                              if s.category == "gradients" and s.allocated_at >= backward), default=backward)
        extra.append(StorageLife(round(unsharded_grads), first_gradient, optimizer, "gradients",
                                 "(unsharded gradients)"))
    return with_storages(memory, storages, extra)


def with_storages(memory: LiveMemory, storages: Sequence[StorageLife], extra: Sequence[StorageLife]) -> LiveMemory:
    """`memory` with its storages replaced by `storages` (same order, new sizes) and `extra` storages
    added: allocated before the first event at or after their allocation tick (BEFORE_STEP: among the
    storages alive when the step starts) and freed likewise (None: alive at the end)."""
    assert len(storages) == len(memory.storages)
    events, ticks = list(memory.events), list(memory.event_ticks)
    assert not ticks or (ticks[0] >= BEFORE_STEP and all(map(operator.le, ticks, itertools.islice(ticks, 1, None)))), \
        "events in the order of their ticks"
    for offset, life in enumerate(extra):
        index = len(storages) + offset
        _insert(events, ticks, life.allocated_at, index)
        if life.freed_at is not None:
            _insert(events, ticks, life.freed_at, ~index)
    return LiveMemory(tuple(storages) + tuple(extra), tuple(events), tuple(ticks), dict(memory.phase_starts),
                      memory.ticks)


def _insert(events: list[int], ticks: list[int], tick: int, event: int) -> None:
    """Put `event` at `tick` before every event of that tick or later (after those before the step, at
    BEFORE_STEP); `ticks`, each event's, in order, is kept so."""
    position = bisect.bisect_right(ticks, BEFORE_STEP) if tick == BEFORE_STEP else bisect.bisect_left(ticks, tick)
    events.insert(position, event)
    ticks.insert(position, tick)
