"""Megatron-style tensor parallelism of degree K inside a node: what each rank computes, holds and sends.
Bytes, FLOPs.

As Megatron-LM (Shoeybi et al., 2019) and torch.distributed.tensor.parallel run it (ColwiseParallel,
RowwiseParallel; Hugging Face's `base_model_tp_plan`, torchtitan's Llama plan):
- In each repeated block, the linear layers that read the block's normalised input are split by output
  features (colwise: q, k, v, gate, up, fc1) and those that write back to the residual by input features
  (rowwise: o, down, fc2). Everything between them (attention heads, the activation function) works on
  1/K of the features on each rank. Each rowwise layer's partial outputs are all-reduced in the forward,
  each colwise layer's partial input gradient in the backward (tensor_collectives), on the critical path
  (not overlapped: an assumption, as Megatron runs without its TP communication overlap).
- The token embedding is split by vocabulary (its output all-reduced in the forward) and the output head
  by vocabulary too, with the loss computed on the split logits (Megatron's vocab-parallel cross-entropy,
  torch's loss_parallel); the head's input gradient is all-reduced in the backward.
- Norms, residual adds and dropout outside those layers run on every rank on whole tensors (no sequence
  parallelism).

Which layers are colwise and rowwise comes from their names (COLWISE, ROWWISE, PAIRED), the names
Hugging Face's TP plans and torchtitan's use; a model with none of them cannot be split (tensor_plan says
why). Decisions, stated as approximations:
- An op is split when its module is one of those layers, lies inside the module that holds a colwise
  layer (its "region": self_attn, mlp, attention.self, intermediate), or is the vocab-split head or its
  loss; its FLOPs and bytes are divided by K (a GEMM's shape too, so its tile efficiency sees the smaller
  product). Ops in a region after its rowwise layer (GPT-2's residual dropout) are split too.
- Activations made in a split op are split, except a colwise layer's input gradient and a rowwise
  layer's output (whole hidden states on every rank). Parameters, gradients and optimizer state shrink by
  the split layers' share of the parameters (uniformly over those storages).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from advisor.parallel.strategy import Collective, fsdp_units
from advisor.profile.live_memory import LiveMemory
from advisor.profile.trace import OpRecord, StepTrace

COLWISE = frozenset({
    "q_proj", "k_proj", "v_proj", "qkv_proj", "query", "key", "value", "qkv", "c_attn", "Wqkv", "query_key_value",
    "gate_proj", "up_proj", "gate_up_proj", "fc1", "w1", "w3", "c_fc", "dense_h_to_4h", "wi", "wi_0", "wi_1",
    "lin1", "q_lin", "k_lin", "v_lin", "q", "k", "v", "in_proj",
})
"""Names of linear layers split by output features (Hugging Face's "colwise" entries: Llama, Mistral,
Qwen, Phi, GPT-2, GPT-NeoX, BERT, T5, DistilBERT; timm's and torchtitan's)."""

ROWWISE = frozenset({
    "o_proj", "out_proj", "c_proj", "down_proj", "fc2", "w2", "wo", "dense_4h_to_h", "lin2", "out_lin", "o",
    "proj",
})
"""Names of linear layers split by input features (Hugging Face's "rowwise" entries)."""

PAIRED = {("intermediate", "dense"): "colwise", ("output", "dense"): "rowwise",
          ("self_attention", "dense"): "rowwise", ("attention", "dense"): "rowwise"}
"""(parent, name) of layers whose own name ("dense") says nothing: BERT's and ViT's intermediate.dense
(colwise) and output.dense (rowwise), GPT-NeoX's attention.dense."""

MATMULS = frozenset({"mm", "addmm", "linear", "matmul", "bmm", "_scaled_mm"})
"""Ops a linear layer's forward records."""

LOSS_MODULE = "(loss)"
"""The module the trace gives the ops outside the model's forward that make the loss."""


def linear_kind(path: str) -> tuple[str, str] | None:
    """("colwise" | "rowwise", the layer's module path) of the tensor-parallel layer `path` lies in (its
    deepest named one: a LoRA adapter's "q_proj.lora_A" lies in q_proj), None when it lies in none.

    # "model.layers.0.self_attn.q_proj" -> ("colwise", "model.layers.0.self_attn.q_proj")
    # "bert.encoder.layer.3.output.dense" -> ("rowwise", "bert.encoder.layer.3.output.dense")
    """
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        name = parts[end - 1]
        parent = parts[end - 2] if end >= 2 else ""
        kind = PAIRED.get((parent, name)) or ("colwise" if name in COLWISE else "rowwise" if name in ROWWISE
                                              else None)
        if kind is not None:
            return kind, ".".join(parts[:end])
    return None


def _within(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


def _lies_in(path: str, modules: frozenset[str]) -> bool:
    """Whether `path` is one of `modules` or inside one: its ancestors looked up, not every module tried (a
    70B model has 160 regions and its step 100,000 ops).

    # "layers.0.mlp.act" lies in {"layers.0.mlp"}; "layers.0.mlp2" does not
    """
    while path:
        if path in modules:
            return True
        path = path.rpartition(".")[0]
    return False


@dataclass(frozen=True)
class TensorPlan:
    """Which modules of a traced step tensor parallelism splits (see the module)."""

    colwise: frozenset[str]
    rowwise: frozenset[str]
    regions: frozenset[str]
    """Modules that hold a colwise layer: the ops inside work on split features."""
    embedding: str | None
    """The token embedding split by vocabulary (None: none found)."""
    head: str | None
    """The output head split by vocabulary, with its loss (None: none found)."""
    split_params: int
    """Parameters the split layers hold (every rank keeps 1/K of them)."""
    total_params: int
    checkpointed: frozenset[str] = frozenset()
    """Blocks run under activation checkpointing (their rowwise layers' forwards run again)."""

    @property
    def param_share(self) -> float:
        """The split layers' share of the model's parameters."""
        return min(1.0, self.split_params / self.total_params) if self.total_params else 0.0

    def kept_share(self, tp: int) -> float:
        """Each rank's share of the parameters (and their gradients and optimizer state) at degree `tp`.

        # 90% of the parameters split over 4: 0.1 + 0.9 / 4 = 0.325
        """
        return 1.0 - self.param_share + self.param_share / tp

    def where(self, module: str) -> str | None:
        """What `module` is to the plan: "colwise", "rowwise", "region", "head", "loss", "embedding", or None."""
        found = linear_kind(module)
        if found is not None and found[1] in (self.colwise if found[0] == "colwise" else self.rowwise):
            return found[0]
        if self.head is not None:
            if _within(module, self.head):
                return "head"
            if module == LOSS_MODULE:
                return "loss"
        if self.embedding is not None and _within(module, self.embedding):
            return "embedding"
        if _lies_in(module, self.regions):
            return "region"
        return None

    def splits_op(self, record: OpRecord) -> bool:
        """Whether each rank runs 1/K of `record` (the optimizer's ops: see kept_share)."""
        where = self.where(record.module)
        if where == "embedding":
            return record.phase == "backward"  # its weight gradient; the lookup's output is whole
        return where is not None

    def splits_storage(self, module: str, phase: str, category: str) -> bool:
        """Whether each rank holds 1/K of an activation or temporary made in `module` during `phase`."""
        if category not in ("activations", "backward_temporaries"):
            return False
        where = self.where(module)
        if where in ("region", "loss"):
            return True
        if where in ("colwise", "head"):
            return phase == "forward"  # its input gradient is whole (before the all-reduce)
        if where == "rowwise":
            return phase == "backward"  # its output is whole (after the all-reduce)
        return False


def tensor_plan(trace: StepTrace) -> TensorPlan | str:
    """The tensor-parallel plan of `trace`'s model, or a sentence saying why it has none."""
    blocks = frozenset(fsdp_units(trace.params_by_module).blocks)
    forward = [r for r in trace.records if r.phase == "forward"]
    layers = {r.module for r in forward if r.op in MATMULS and r.gemm is not None}
    colwise: set[str] = set()
    rowwise: set[str] = set()
    for module in layers:
        found = linear_kind(module)
        if found is None or not _lies_in(found[1], blocks):
            continue
        (colwise if found[0] == "colwise" else rowwise).add(found[1])
    if not colwise or not rowwise:
        return ("no attention or MLP linear layers by the names tensor-parallel plans use (q_proj/o_proj, "
                "gate_proj/down_proj, fc1/fc2, c_attn/c_proj, query/output.dense) in its repeated blocks")
    regions = frozenset(path.rpartition(".")[0] for path in colwise)
    params = trace.params_by_module
    embedding, vocab_params = _embedding(forward, params)
    head = _head(forward, vocab_params, blocks)
    split = sum(params.get(path, 0) for path in colwise | rowwise)
    if embedding is not None and head is not None:
        split += params.get(embedding, 0) + (params.get(head, 0) if head != embedding else 0)
    else:
        embedding = head = None
    total = params.get("", 0) or trace.total_params or trace.params
    return TensorPlan(frozenset(colwise), frozenset(rowwise), regions, embedding, head, split, total,
                      frozenset(trace.checkpointed))


def _embedding(forward: Sequence[OpRecord], params: Mapping[str, int]) -> tuple[str | None, int]:
    """The token embedding (the embedding lookup with the most parameters) and its parameter count."""
    lookups = {r.module for r in forward if r.op == "embedding"}
    if not lookups:
        return None, 0
    best = max(sorted(lookups), key=lambda m: params.get(m, 0))
    return best, params.get(best, 0)


def _head(forward: Sequence[OpRecord], vocab_params: int, blocks: frozenset[str]) -> str | None:
    """The output head: a product outside the blocks whose weight is the embedding's shape (vocabulary x
    hidden), tied or not."""
    if not vocab_params:
        return None
    for record in forward:
        if record.op in MATMULS and record.gemm is not None and not _lies_in(record.module, blocks):
            _, _, n, k = record.gemm
            if n * k == vocab_params:
                return record.module
    return None


def _split_gemm(gemm: tuple[int, int, int, int] | None, tp: int) -> tuple[int, int, int, int] | None:
    """A product's (batch, m, n, k) on one of `tp` ranks: the first of batch (when > 1), n, m and k that
    `tp` divides is divided (heads, features or tokens; the FLOPs are the same whichever), else n rounded up."""
    if gemm is None:
        return None
    batch, m, n, k = gemm
    if batch > 1 and batch % tp == 0:
        return batch // tp, m, n, k
    for index in (2, 1, 3):
        if gemm[index] % tp == 0:
            parts = list(gemm)
            parts[index] //= tp
            return tuple(parts)  # type: ignore[return-value]
    return batch, m, math.ceil(n / tp), k


def _scaled(record: OpRecord, share: float, tp: int) -> OpRecord:
    """`record` doing `share` of its work (1/tp for a split op)."""
    def scale(n: int) -> int:
        return int(round(n * share))
    return replace(record, flops=record.flops * share, bytes_read=scale(record.bytes_read),
                   bytes_written=scale(record.bytes_written),
                   gemm=_split_gemm(record.gemm, tp) if share < 1 else record.gemm,
                   allocated=tuple(scale(n) for n in record.allocated),
                   reads=tuple((source, scale(size), offset) for source, size, offset in record.reads),
                   writes=tuple((last, scale(size)) for last, size in record.writes))


def rank_records(trace: StepTrace, plan: TensorPlan, tp: int) -> tuple[OpRecord, ...]:
    """`trace`'s ops as one of `tp` ranks runs them: split ops at 1/tp, the optimizer's at kept_share."""
    if tp == 1:
        return trace.records
    kept = plan.kept_share(tp)
    return tuple(_scaled(r, kept, tp) if r.phase == "optimizer" and kept < 1
                 else _scaled(r, 1 / tp, tp) if plan.splits_op(r) else r
                 for r in trace.records)


def rank_memory(memory: LiveMemory, plan: TensorPlan, tp: int) -> LiveMemory:
    """`memory` as one of `tp` ranks lives it: split activations at 1/tp, parameters, their gradients and
    optimizer state at kept_share."""
    if tp == 1:
        return memory
    kept = plan.kept_share(tp)
    held = ("weights", "weight_copies", "gradients", "optimizer_state", "optimizer_temporaries")
    storages = []
    for life in memory.storages:
        if life.category in held:
            storages.append(life.resized(math.ceil(life.nbytes * kept)))
        elif life.allocated_at >= 0 and plan.splits_storage(life.module, memory.phase_of(life.allocated_at),
                                                            life.category):
            storages.append(life.resized(math.ceil(life.nbytes / tp)))
        else:
            storages.append(life)
    return replace(memory, storages=tuple(storages))


def rank_trace(trace: StepTrace, plan: TensorPlan, tp: int) -> StepTrace:
    """`trace` as one rank of a tensor-parallel group of `tp` runs it: its ops and its memory."""
    if tp == 1:
        return trace
    assert trace.memory is not None, "the trace recorded no memory"
    return replace(trace, records=rank_records(trace, plan, tp), memory=rank_memory(trace.memory, plan, tp))


def tensor_collectives(trace: StepTrace, plan: TensorPlan, tp: int, micro_batches: int = 1) -> list[Collective]:
    """Each rank's all-reduces over its tensor-parallel group in one optimizer step, as torch's
    ColwiseParallel and RowwiseParallel run them: per call of a rowwise layer its output in the forward (again
    where a checkpointed block recomputes it), per call of a colwise layer its input's gradient in the
    backward (q, k and v apart: three; Phi-3's fused qkv_proj: one); the embedding's output in the forward
    and the head's input gradient in the backward. None hidden behind compute. Sizes are whole hidden states.

    # Llama, 4 layers, batch 8 x 32 tokens x 64 features in fp32: 8 * 32 * 64 * 4 = 65,536 bytes each;
    # forward 4 x (o, down) + embedding = 9, backward 4 x (q, k, v, gate, up) + head = 21 all-reduces
    """
    if tp == 1:
        return []
    sizes: dict[tuple[str, int], int] = {}  # (phase, bytes) -> calls
    for record in _calls(trace.records):
        where = plan.where(record.module)
        if where == "rowwise" and record.op in MATMULS:
            recompute = _lies_in(record.module, plan.checkpointed)
            _count(sizes, ("forward", record.bytes_written), 2 if recompute else 1)
        elif where == "colwise" and record.op in MATMULS and record.gemm is not None:
            _, _, features, hidden = record.gemm  # its input: tokens x hidden, in its output's dtype
            _count(sizes, ("backward", record.bytes_written * hidden // features), 1)
        elif where == "embedding" and record.op == "embedding":
            _count(sizes, ("forward", record.bytes_written), 1)
        elif where == "head" and record.op in MATMULS and record.gemm is not None:
            _, _, vocab, hidden = record.gemm  # the input's gradient: tokens x hidden of the logits' dtype
            _count(sizes, ("backward", record.bytes_written * hidden // vocab), 1)
    return [Collective("all_reduce", float(size), calls * micro_batches, phase, tp, "node", None)
            for (phase, size), calls in sizes.items() if size > 0]


def _count(sizes: dict, key: tuple, calls: int) -> None:
    sizes[key] = sizes.get(key, 0) + calls


def _calls(records: Sequence[OpRecord]) -> list[OpRecord]:
    """The forward's products and embedding lookups, one per layer call: a LoRA layer's base and adapter
    products (in one layer, with only its own ops between them) count once."""
    found: list[OpRecord] = []
    current: str | None = None  # the layer whose product was counted last, while its ops run
    for record in records:
        if record.phase != "forward":
            current = None
            continue
        found_kind = linear_kind(record.module)
        layer = record.module if found_kind is None else found_kind[1]
        if record.op == "embedding":
            found.append(record)
        elif record.op in MATMULS and layer != current:
            found.append(record)
        current = layer if layer == current or record.op in MATMULS else None
    return found
