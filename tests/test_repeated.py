"""Repeated blocks traced once and replicated (advisor/profile/repeated.py, issue #24): the same step as
tracing every block, or a full trace where that cannot be shown."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
from torch import nn

from advisor.memory.estimate import StepMemory
from advisor.profile.adapters import Adaptation
from advisor.profile.repeated import MIN_RUN, find_runs
from advisor.profile.trace import trace_training_step


class Block(nn.Module):
    """A pre-norm residual MLP block, numbered as Hugging Face numbers its layers."""

    def __init__(self, width: int, layer_idx: int, scale: float = 1.0) -> None:
        super().__init__()
        self.layer_idx = layer_idx  # differs along the run by design: not part of what must be equal
        self.scale = scale
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.scale * self.down(torch.relu(self.up(self.norm(x))))


class Stack(nn.Module):
    def __init__(self, layers: int = 8, width: int = 16, blocks: list[nn.Module] | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, width)
        self.layers = nn.ModuleList(blocks if blocks is not None else [Block(width, i) for i in range(layers)])
        self.head = nn.Linear(width, 50)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class IndexedStack(Stack):
    """Reaches its blocks by index over its configured depth: a shortened container cannot serve it."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for i in range(8):
            x = self.layers[i](x)
        return self.head(x)


class SharedInputBlock(Block):
    """A block that also takes a tensor every block shares (T5's position bias)."""

    def forward(self, x: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + shared


class SharedInputStack(Stack):
    """Its blocks all add one learned tensor: the last block's backward gives it its first gradient, every
    other block's adds to it, so the last block's backward has one op fewer than the rest."""

    def __init__(self) -> None:
        super().__init__(blocks=[SharedInputBlock(16, i) for i in range(10)])
        self.shared = nn.Parameter(torch.zeros(16))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        shared = self.shared * 2
        for layer in self.layers:
            x = layer(x, shared)
        return self.head(x)


def tokens(batch: int) -> torch.Tensor:
    return torch.randint(0, 50, (batch, 12))


def traced_both_ways(build, precision="fp32", optimizer="adamw", **options):
    return [trace_training_step(build, tokens, 4, precision, optimizer, dedupe=dedupe, **options)
            for dedupe in (False, True)]


def anonymous(trace):
    """The step's ops as a multiset, modules aside (which of two sibling modules the backward credits an
    op to may differ between blocks)."""
    return Counter(replace(r, module="") for r in trace.records)


def assert_same_step(full, deduplicated):
    assert anonymous(deduplicated) == anonymous(full)
    assert deduplicated.flops() == full.flops() and deduplicated.bytes_moved() == full.bytes_moved()
    # the same peak, when and of what: its tick may differ (the full step's optimizer asks each parameter's
    # device, ops the shortened one asks fewer times)
    peaks = [(p.bytes, p.phase, p.by_category) for p in (full.memory.peak(), deduplicated.memory.peak())]
    assert peaks[0] == peaks[1]
    one, other = StepMemory.of_trace(full), StepMemory.of_trace(deduplicated)
    assert (other.reserved, other.allocated, other.tensor_peak) == (one.reserved, one.allocated, one.tensor_peak)
    assert len(deduplicated.memory.events) == len(full.memory.events)
    # the same storages (a per-parameter optimizer loop, Adafactor's, makes the copies in another order)
    assert sorted(s.nbytes for s in deduplicated.memory.storages) == sorted(s.nbytes for s in full.memory.storages)


def test_a_run_of_eight_blocks_is_traced_as_three_and_gives_the_same_step():
    full, deduplicated = traced_both_ways(Stack)
    assert (full.replicated_blocks, deduplicated.replicated_blocks) == (0, 5)  # 8 blocks, 3 kept
    assert deduplicated.repeated == ("layers.0..7 (8 blocks, 3 traced)",)
    assert "5 repeated blocks replicated" in deduplicated.replication()
    assert_same_step(full, deduplicated)
    # the held-out blocks' ops carry their own names: up's forward mm in every block
    # addmm 4*12 x 16 @ 16 x 64: 2*48*64*16 = 98,304 FLOPs in each of the 8 blocks
    forward_up = [r for r in deduplicated.records if r.phase == "forward" and r.module.endswith(".up")]
    assert sorted(r.module for r in forward_up) == [f"layers.{i}.up" for i in range(8)]
    assert {r.flops for r in forward_up} == {2 * 48 * 64 * 16}


@pytest.mark.parametrize("options", [
    dict(precision="amp-bf16"),
    dict(precision="amp-fp16", optimizer="sgd"),
    dict(precision="bf16", optimizer="adafactor"),
    dict(precision="bf16-master"),
    dict(precision="bf16-master", optimizer="momentum", accumulate_gradients=True),
    dict(checkpointing=True),
    dict(accumulate_gradients=True, precision="amp-bf16"),
    dict(adaptation=Adaptation(lora_rank=4, lora_targets=("up", "down"))),
], ids=lambda options: ",".join(f"{k}={v}" for k, v in options.items()))
def test_the_same_step_in_every_setting(options):
    full, deduplicated = traced_both_ways(lambda: Stack(layers=10), **options)
    assert deduplicated.replicated_blocks >= 6  # LoRA's frozen embedding: the run starts at the 2nd block
    assert_same_step(full, deduplicated)


def test_a_transformers_decoder_gives_the_same_step():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                                      num_attention_heads=4, num_key_value_heads=2, use_cache=False)

    def build():
        return transformers.LlamaForCausalLM(config)

    def loss(output, inputs):
        return output.logits.float().mean()

    full, deduplicated = [trace_training_step(build, tokens, 2, "amp-bf16", "adamw", loss, dedupe=dedupe)
                          for dedupe in (False, True)]
    assert deduplicated.replicated_blocks == 5  # model.layers: 8 blocks, 3 traced
    assert_same_step(full, deduplicated)


def test_blocks_that_differ_or_share_are_not_a_run():
    assert [run.keys for run in find_runs(Stack())] == [tuple(str(i) for i in range(8))]
    assert find_runs(Stack(layers=MIN_RUN - 1)) == []
    shared = Block(16, 0)
    assert find_runs(Stack(blocks=[shared] * 8)) == []  # one module eight times: its gradients add up
    # a plain attribute that differs (here the fourth block's) splits the run: 3 + 1 + 4, none long enough
    assert find_runs(Stack(blocks=[Block(16, i, 0.5 if i == 3 else 1.0) for i in range(8)])) == []
    hooked = Stack()
    hooked.layers[2].register_forward_hook(lambda module, args, output: None)
    assert find_runs(hooked) == []  # 0, 1 | 2 | 3..7


def test_a_model_the_shortened_step_cannot_serve_is_traced_in_full():
    full, deduplicated = traced_both_ways(IndexedStack)
    assert deduplicated.replicated_blocks == 0
    assert_same_step(full, deduplicated)


def test_a_repeated_block_is_timed_once_with_the_same_step_time():
    """The estimator times one copy of a repeated block's ops and stands it for the rest once the host and
    device clocks repeat (step.chunks_of, _Clock.run_copies): the same step time and op table as timing
    every copy, on a host-bound and a device-bound GPU."""
    from advisor.app.plan import targets_for
    from advisor.app.request import PlanRequest
    from advisor.estimate.step import estimate_records, estimate_step
    from advisor.hardware.loader import load_hwdb

    full, deduplicated = traced_both_ways(lambda: Stack(layers=8))
    assert deduplicated.repeats  # forward and backward spans of the 5 held-out-and-template copies
    for target in targets_for(PlanRequest(gpus=("h100-sxm", "t4")), load_hwdb()):
        # without the L2 model: a block's backward reads its forward's values a different distance back in each
        # copy (profile/dataflow.py), and in this toy step all of them fit an L2, which timing every copy
        # finds and the copies cannot; on real sizes the two agree (benchmarks/dedup_equivalence.py)
        device = replace(target.device, l2_cache_bytes=None)
        every_copy = estimate_records(full.records, full.precision, device)
        once = estimate_step(deduplicated, device)
        assert once.step_s == pytest.approx(every_copy.step_s, rel=1e-12)
        assert len(once.ops) < len(every_copy.ops)
        rows = [{(row["op"], row["phase"]): row for row in step.top_ops(50)} for step in (once, every_copy)]
        assert rows[0].keys() == rows[1].keys()
        for key, row in rows[0].items():
            other = rows[1][key]
            assert (row["calls"], row["bound"], row["flops"], row["bytes"]) == \
                (other["calls"], other["bound"], other["flops"], other["bytes"])
            assert row["seconds"] == pytest.approx(other["seconds"], rel=1e-9)


def test_a_tensor_every_block_shares_gives_the_same_step():
    """Its gradient is made by the last block's backward and added to by every other: the pattern the
    three kept blocks show is not the held-out ones', so the step is traced in full."""
    full, deduplicated = traced_both_ways(SharedInputStack)
    assert_same_step(full, deduplicated)


def test_t5_whose_last_block_starts_the_position_bias_gradient_replicates_the_others():
    """T5's blocks share the first block's position bias; the last block's backward gives it its first
    gradient: the run ends one block earlier and the rest replicate (exactly)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=12, num_decoder_layers=12,
                                   num_heads=4, use_cache=False, decoder_start_token_id=0, pad_token_id=0)

    def build():
        return transformers.T5ForConditionalGeneration(config)

    def inputs(batch):
        return {"input_ids": torch.randint(0, 64, (batch, 10)), "labels": torch.randint(0, 64, (batch, 6))}

    def loss(output, batch):
        return output.loss

    full, deduplicated = [trace_training_step(build, inputs, 2, "fp32", "adamw", loss, dedupe=dedupe)
                          for dedupe in (False, True)]
    # encoder and decoder: blocks 1..10 of 0..11 (block 0 holds the bias, block 11 starts its gradient), 3 kept
    assert deduplicated.replicated_blocks == 14
    assert_same_step(full, deduplicated)


def test_a_compiled_step_fuses_across_blocks_as_the_full_trace_does():
    """--compile fuses runs of pointwise ops that cross from one block into the next (the residual add and
    the next block's norm); timing one copy of a block must fuse them too (step._aligned_for_fusion)."""
    from advisor.app.plan import targets_for
    from advisor.app.request import PlanRequest
    from advisor.estimate.step import estimate_records, estimate_step
    from advisor.hardware.loader import load_hwdb

    full, deduplicated = traced_both_ways(lambda: Stack(layers=8))
    assert deduplicated.repeats
    for target in targets_for(PlanRequest(gpus=("h100-sxm", "t4")), load_hwdb()):
        every_copy = estimate_records(full.records, full.precision, target.device, compiled=True)
        once = estimate_step(deduplicated, target.device, compiled=True)
        assert once.step_s == pytest.approx(every_copy.step_s, rel=1e-9)
        assert sum(op.calls for op in once.ops) == len(every_copy.ops)  # the same kernels
        assert once.step_s < estimate_step(deduplicated, target.device).step_s


def test_a_moved_record_equals_dataclasses_replace() -> None:
    from dataclasses import fields, replace

    from advisor.profile.repeated import _moved
    from advisor.profile.trace import OpRecord

    record = OpRecord("forward", "layers.1.mlp", "aten.mm.default", 240.0, 80, 96, ("fp32",), True, True, (1, 4, 6, 5))
    moved = _moved(record, "layers.7.mlp")
    assert moved == replace(record, module="layers.7.mlp") and moved is not record
    assert all(getattr(moved, f.name) == getattr(record, f.name) for f in fields(record) if f.name != "module")
    assert record.module == "layers.1.mlp"  # the template's record is left as it was
