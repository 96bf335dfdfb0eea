"""Peak training memory: live storages of the traced step by hand, the allocator replay, the batch
lines and the per-device result."""

from __future__ import annotations

import pytest
import torch

from advisor.hardware.specs import MemoryOverhead
from advisor.memory.allocator import AllocatorPeaks, CachingAllocator, OutOfMemory, replay, segment_size
from advisor.memory.estimate import (BatchMemoryModel, StepMemory, cannot_hold, capped_replay, device_memory,
                                     parameter_formula_bytes)
from advisor.profile.trace import OPTIMIZERS, trace_training_step

MIB = 2**20


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def inputs(batch: int) -> torch.Tensor:
    return torch.randn(batch, 8)


def phase_peaks(precision: str, optimizer: str) -> dict[str, tuple[int, dict[str, int]]]:
    memory = trace_training_step(mlp, inputs, 2, precision, optimizer).memory
    return {phase: (peak.bytes, {k: v for k, v in peak.by_category.items() if v})
            for phase, peak in memory.phase_peaks().items()}


# The MLP Linear(8,16) -> ReLU -> Linear(16,4), batch 2, default loss (mean of the output, plus 0).
# weights: W1 16*8*4 = 512, b1 16*4 = 64, W2 4*16*4 = 256, b2 4*4 = 16 -> 848 B
# inputs: 2*8*4 = 64 B
# forward: h = addmm(b1, x, W1.t()) 2*16*4 = 128 B, r = relu(h) 128 B (relu keeps its output for
#   backward; h dies once r exists, so both live at r's allocation: 256 B); y = addmm 2*4*4 = 32,
#   mean 4, 0 + mean 4 (the loss, held to the end of the step)
# backward: ones_like seed 4 B; the gradient of y (mean's backward: 32 B), of r (mm: 128 B), W2's (256),
#   b2's (16), then threshold_backward 128 B (the gradient of h), W1's (512) and b1's (64).
#   At b1's gradient, the last allocation: gradients 256+16+512+64 = 848, seed 4 + threshold 128 = 132
#   backward temporaries, loss 4 -> 848 + 848 + 64 + 4 + 132 = 1896 B
FP32_SGD = {
    "forward": (848 + 64 + 256, {"weights": 848, "inputs": 64, "activations": 256}),
    "backward": (1896, {"weights": 848, "gradients": 848, "inputs": 64, "activations": 4,
                        "backward_temporaries": 132}),
    # SGD's _foreach_add_ works in place: weights + gradients + inputs + loss = 1764 B
    "optimizer": (1764, {"weights": 848, "gradients": 848, "inputs": 64, "activations": 4}),
}


def test_fp32_sgd_breakdown_by_hand() -> None:
    assert phase_peaks("fp32", "sgd") == FP32_SGD


# Adam keeps exp_avg and exp_avg_sq (848 B each) and a 4-byte step per parameter tensor (4 tensors):
# 848*2 + 16 = 1712 B of state, alive through the whole steady-state step (it exists before the forward).
# The foreach step makes one temporary list, sqrt(exp_avg_sq) (848 B), while weights, gradients,
# state, inputs and the loss are alive: 848 + 848 + 1712 + 64 + 4 + 848 = 4324 B, the step's peak.
ADAM_STATE = 2 * 848 + 4 * 4


def test_fp32_adam_breakdown_by_hand() -> None:
    peaks = phase_peaks("fp32", "adam")
    assert peaks["forward"] == (2880, {"weights": 848, "optimizer_state": ADAM_STATE, "inputs": 64,
                                       "activations": 256})  # 1168 + 1712
    assert peaks["backward"] == (3608, FP32_SGD["backward"][1] | {"optimizer_state": ADAM_STATE})  # 1896 + 1712
    assert peaks["optimizer"] == (4324, {"weights": 848, "gradients": 848, "optimizer_state": ADAM_STATE,
                                         "inputs": 64, "activations": 4, "optimizer_temporaries": 848})


# amp-bf16 + AdamW: fp32 master weights and state as above; autocast casts each weight to bf16 once
# (W1 16*8*2 = 256, b1 32, W2 4*16*2 = 128, b2 8 = 424 B of weight copies, alive until backward used them).
# Forward peak, at the loss's fp32 copy of the output: x in bf16 2*8*2 = 32, r in bf16 2*16*2 = 64,
# y in bf16 2*4*2 = 16, y.float() 2*4*4 = 32, its mean 4 -> 148 B of activations;
# 848 + 424 + 1712 + 64 + 148 = 3196 B. The optimizer phase is the fp32 one: 4324 B, the peak.
def test_amp_bf16_adamw_breakdown_by_hand() -> None:
    peaks = phase_peaks("amp-bf16", "adamw")
    assert peaks["forward"] == (3196, {"weights": 848, "weight_copies": 424, "optimizer_state": ADAM_STATE,
                                       "inputs": 64, "activations": 148})
    assert peaks["optimizer"] == (4324, {"weights": 848, "gradients": 848, "optimizer_state": ADAM_STATE,
                                         "inputs": 64, "activations": 4, "optimizer_temporaries": 848})
    assert peaks["backward"][0] < peaks["optimizer"][0]


def test_allocator_rounds_to_512_bytes_per_tensor() -> None:
    # fp32 + SGD, each storage rounded up to 512 B (every one is <= 512 B here): at the peak
    # (backward) 12 storages are alive: 4 weights, 1 input, 2 gradients so far, the loss and its
    # predecessor's seed... as counted by the sweep: 12 * 512 = 6144 B
    step = StepMemory.of_trace(trace_training_step(mlp, inputs, 2, "fp32", "sgd"))
    assert step.tensor_peak == 12 * 512
    assert step.allocated == step.tensor_peak  # no block is split with a remainder too small to reuse
    assert step.reserved == 2 * MIB  # every block fits one small-pool segment of 2 MiB


def test_allocator_segments_and_reuse_by_hand() -> None:
    allocator = CachingAllocator()
    small = allocator.malloc(100)  # rounded to 512; a new 2 MiB small segment
    assert (allocator.allocated, allocator.reserved) == (512, 2 * MIB)
    large = allocator.malloc(5 * MIB)  # between 1 and 10 MiB: a 20 MiB segment, split (15 MiB left)
    assert (allocator.allocated, allocator.reserved) == (512 + 5 * MIB, 22 * MIB)
    again = allocator.malloc(12 * MIB)  # best fit: the 15 MiB remainder, no new segment
    assert allocator.reserved == 22 * MIB
    allocator.free(large)
    allocator.free(again)  # merges with the free 5 MiB before it and the 3 MiB after it: 20 MiB free
    assert allocator.malloc(20 * MIB) is not None and allocator.reserved == 22 * MIB
    allocator.free(small)
    assert allocator.peak_allocated == 512 + 20 * MIB and allocator.segments == 2
    # requests of 10 MiB and more get their own segment rounded to 2 MiB
    assert segment_size(11 * MIB + 1) == 12 * MIB and segment_size(MIB) == 2 * MIB


def test_a_capped_allocator_releases_its_whole_free_segments_before_it_runs_out_by_hand() -> None:
    # 40 MiB of segments allowed. a = 30 MiB (its own 30 MiB segment), freed: cached, wholly free.
    # b = 12 MiB: the 30 MiB block is the best fit, split (18 MiB left, above 1 MiB): no new segment.
    # c = 20 MiB: nothing cached holds it; 30 + 20 > 40, so the cache is released, but the 30 MiB segment is
    # split (b lives in it) and cannot go: still 30 + 20 > 40 -> out of memory.
    allocator = CachingAllocator(capacity=40 * MIB)
    allocator.free(allocator.malloc(30 * MIB))
    allocator.malloc(12 * MIB)
    with pytest.raises(OutOfMemory):
        allocator.malloc(20 * MIB)
    assert allocator.flushes == 1 and allocator.peak_reserved == 30 * MIB
    # b freed first (the 30 MiB segment whole and free again), then c = 32 MiB, which the cached 30 MiB
    # block cannot hold: 30 + 32 > 40, the free segment is released (30 -> 0 MiB) and c gets its own 32 MiB
    # segment: 32 MiB reserved, one flush.
    allocator = CachingAllocator(capacity=40 * MIB)
    allocator.free(allocator.malloc(30 * MIB))
    allocator.free(allocator.malloc(12 * MIB))
    allocator.malloc(32 * MIB)
    assert (allocator.reserved, allocator.peak_reserved, allocator.flushes) == (32 * MIB, 32 * MIB, 1)
    # without a capacity nothing is released: 30 + 32 = 62 MiB reserved, no flush
    allocator = CachingAllocator()
    allocator.free(allocator.malloc(30 * MIB))
    allocator.free(allocator.malloc(12 * MIB))
    allocator.malloc(32 * MIB)
    assert (allocator.reserved, allocator.flushes) == (62 * MIB, 0)


def test_a_replay_under_the_reserve_it_needs_uncapped_runs_with_flushes_or_runs_out() -> None:
    # VGG-style: large blocks freed and re-requested in other sizes fragment the cache. The uncapped
    # replay's reserve is the most the step ever needs; capped there it runs as before, capped at the
    # allocated peak (rounded down to a 2 MiB segment) it either flushes or runs out, never exceeding the cap.
    from advisor.profile.model_file import load_model_file
    from advisor.memory.plan import MemorySettings, trace_for_memory

    memory = trace_for_memory(load_model_file("resnet50"), MemorySettings(8, "fp32", "sgd"), 8).memory
    free = replay(memory)
    assert replay(memory, capacity=free.reserved) == free
    for capacity in (free.allocated, (free.allocated + free.reserved) // 2):
        capped = replay(memory, capacity=capacity)
        assert capped.reserved <= capacity and capped.allocated <= free.allocated
        assert capped.out_of_memory or capped.flushes > 0 or free.reserved <= capacity


def test_a_replay_leaves_no_cycles_for_the_collector() -> None:
    # the blocks of a segment point to each other; replay unlinks them when it is done, so the collection that
    # follows an estimate has none of them to walk (and they are freed with the allocator)
    import gc

    from advisor.profile.model_file import load_model_file
    from advisor.memory.plan import MemorySettings, trace_for_memory

    memory = trace_for_memory(load_model_file("resnet50"), MemorySettings(8, "fp32", "sgd"), 8).memory
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        replay(memory)
        replay(memory, capacity=replay(memory).allocated)  # flushes, or runs out: its blocks go too
        assert gc.collect() == 0
    finally:
        if enabled:
            gc.enable()


def test_phase_peaks_and_breakdowns_over_arrays_match_the_events_walked_one_by_one() -> None:
    # phase_peaks and _breakdowns run over numpy arrays; walked here event by event: each phase's highest
    # live bytes at an allocation (the first such position), and live bytes by category after a position
    from advisor.estimate.parallel import LayoutMemory
    from advisor.memory.allocator import MIN_BLOCK
    from advisor.parallel.strategy import Layout
    from advisor.profile.live_memory import CATEGORIES
    from advisor.profile.model_file import load_model_file
    from advisor.memory.plan import MemorySettings, trace_for_memory

    trace = trace_for_memory(load_model_file("mlp"), MemorySettings(8, "amp-bf16", "adamw"), 8)
    for memory in (trace.memory, LayoutMemory(trace, None)._rank_trace(Layout("fsdp", 4, 8)).memory):
        sizes = memory.sizes(MIN_BLOCK)
        live, by_phase, after = 0, {}, []
        for position, (event, tick) in enumerate(zip(memory.events, memory.event_ticks)):
            live += sizes[event] if event >= 0 else -sizes[~event]
            phase = memory.phase_of(tick)
            if event >= 0 and live > by_phase.get(phase, (-1,))[0]:
                by_phase[phase] = (live, tick)
            held = {}
            for e in memory.events[:position + 1]:
                held.pop(~e, None) if e < 0 else held.setdefault(e, None)
            after.append({c: sum(sizes[i] for i in held if memory.storages[i].category == c) for c in CATEGORIES})
        peaks = memory.phase_peaks(MIN_BLOCK)
        assert {phase: (p.bytes, p.tick) for phase, p in peaks.items() if phase in by_phase} == by_phase
        assert all(sum(p.by_category.values()) == p.bytes for p in peaks.values())
        positions = list(range(-1, len(memory.events)))
        assert memory._breakdowns(sizes, positions) == {-1: dict.fromkeys(CATEGORIES, 0), **dict(enumerate(after))}


def _replayed_call_by_call(memory, steps: int = 2) -> tuple[int, int, int]:
    """allocator.replay's semantics with CachingAllocator's malloc and free, one call per storage (unrounded
    sizes): each step's events, then what the step still holds freed in the order it was allocated; what
    lived before the step only once."""
    allocator = CachingAllocator()
    blocks = {}
    in_step = [s.allocated_at >= 0 for s in memory.storages]
    for step in range(steps):
        for event in memory.events:
            index = event if event >= 0 else ~event
            if step > 0 and not in_step[index]:
                continue
            if event >= 0:
                blocks[index] = allocator.malloc(memory.storages[index].nbytes)
            else:
                allocator.free(blocks.pop(index))
        for index in [i for i in blocks if in_step[i]]:
            allocator.free(blocks.pop(index))
    return allocator.peak_allocated, allocator.peak_reserved, allocator.segments


def test_the_replay_matches_the_allocator_called_block_by_block() -> None:
    # replay runs each step's events as one list, what it precomputes (rounded sizes, the frees of what a step
    # holds, the steps after the first without what lived before) against malloc/free called per block: the
    # 7B example and ResNet-50, one GPU and fsdp / zero1 ranks (large and small pools, splits, merges)
    from advisor.estimate.parallel import LayoutMemory
    from advisor.parallel.strategy import Layout
    from advisor.profile.model_file import load_model_file
    from advisor.memory.plan import MemorySettings, trace_both_batches

    for name, batch in (("llama", 1), ("resnet50", 8)):
        trace, second = trace_both_batches(load_model_file(name), MemorySettings(batch, "amp-bf16", "adamw"),
                                           parallel=False)
        layouts = LayoutMemory(trace, second)
        for rank in (trace, second, layouts._rank_trace(Layout("fsdp", 4, 8)), layouts._rank_trace(Layout("zero1", 2, 8))):
            peaks = replay(rank.memory)
            assert (peaks.allocated, peaks.reserved, peaks.segments) == _replayed_call_by_call(rank.memory), name
            assert peaks.reserved >= peaks.allocated > 0


def test_memory_grows_linearly_with_batch_so_two_traces_predict_a_third() -> None:
    def wide() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))

    def step(batch: int) -> StepMemory:
        return StepMemory.of_trace(trace_training_step(wide, lambda b: torch.randn(b, 512), batch, "fp32", "adamw"))

    model = BatchMemoryModel(step(256), step(512))
    actual = step(1536)
    # the tensors' peak is exactly linear within a phase; the reserve grows by whole segments
    assert model.reserve_ratio * actual.tensor_peak == pytest.approx(model.reserved_at(1536), rel=1e-6)
    assert model.reserved_at(1536) == pytest.approx(actual.reserved, rel=0.10)
    assert model.max_batch_size(actual.reserved) in range(1382, 1690)  # 1536 within 10%
    assert model.max_batch_size(1) == 0  # not even one sample fits in a byte


def test_batch_model_max_batch_by_hand() -> None:
    def step(batch: int, forward: int) -> StepMemory:
        return StepMemory(batch, forward, "forward", {}, {"forward": forward, "backward": 1000, "optimizer": 4000},
                          forward, forward)

    # forward peak 1000 + 100 per sample, other phases flat at 1000 and 4000, reserve = tensors:
    # a budget of 10,000 B holds (10000 - 1000) / 100 = 90 samples; 4,000 B holds 30
    model = BatchMemoryModel(step(10, 2000), step(20, 3000))
    assert model.max_batch_size(10_000) == 90
    assert model.max_batch_size(4_050) == 30
    assert model.max_batch_size(3_999) == 0  # the optimizer's 4,000 B never fit


HAND_STEP = StepMemory(4, 6 * MIB, "backward",
                       {"weights": 2 * MIB, "weight_copies": 0, "gradients": 2 * MIB, "optimizer_state": 0,
                        "inputs": 0, "activations": 2 * MIB, "backward_temporaries": 0, "optimizer_temporaries": 0},
                       {"forward": 6 * MIB, "backward": 6 * MIB, "optimizer": 4 * MIB}, 6 * MIB, 8 * MIB)
"""A step by hand: 6 MiB of tensors at the peak (allocated), 8 MiB of segments unhindered (reserved)."""
HAND_OVERHEAD = MemoryOverhead("ampere", 400 * MIB, 8 * MIB, ("M2",))
"""400 MiB of CUDA context and 8 MiB of cuBLAS workspace, outside the allocator."""


def test_device_memory_adds_context_and_workspace_and_parts_sum_to_peak() -> None:
    step, overhead = HAND_STEP, HAND_OVERHEAD

    class Gpu:
        id, memory_bytes = "tiny", 416 * MIB

    result = device_memory(step, Gpu(), overhead)  # type: ignore[arg-type]
    # 400 MiB context + 8 MiB workspace + 8 MiB reserve (6 MiB tensors + 2 MiB fragmentation) = 416 MiB
    assert result.peak_bytes == 416 * MIB and result.fits and result.missing_bytes == 0
    assert result.memory == {"weights": 2 * MIB, "gradients": 2 * MIB, "optimizer": 0, "activations": 2 * MIB,
                             "overhead": 410 * MIB}
    assert sum(result.memory.values()) == result.peak_bytes
    assert result.allocated_bytes == 14 * MIB and result.reserved_bytes == 16 * MIB
    tighter = device_memory(step, type("G", (), {"id": "t", "memory_bytes": 415 * MIB})(), overhead)
    assert not tighter.fits and tighter.missing_bytes == MIB
    # the bound before a re-play: 400 + 8 MiB + 6 MiB of tensors = 414 MiB, so 413 MiB cannot hold it, 415 might
    too_small, enough = (type("G", (), {"id": "t", "memory_bytes": mib * MIB})() for mib in (413, 415))
    assert cannot_hold(step.tensor_peak, too_small, overhead) and not cannot_hold(step.tensor_peak, enough, overhead)
    assert not cannot_hold(step.tensor_peak, too_small, overhead, cuda_context_bytes=399 * MIB)


def test_a_device_between_the_allocated_peak_and_the_reserve_fits_where_the_capped_replay_does() -> None:
    # allocated 6 MiB, reserved 8 MiB unhindered; 400 MiB context + 8 MiB workspace outside the allocator
    step, overhead = HAND_STEP, HAND_OVERHEAD
    gpu = type("G", (), {"id": "t", "memory_bytes": 415 * MIB})()  # room for segments: 415 - 408 = 7 MiB
    asked: list[int] = []

    def fits_in(capacity: int) -> AllocatorPeaks:  # the capped re-play: 7 MiB of segments, two flushes
        asked.append(capacity)
        return AllocatorPeaks(6 * MIB, 7 * MIB, 3, flushes=2)

    result = device_memory(step, gpu, overhead, capped=fits_in)
    assert asked == [7 * MIB]
    # 408 MiB outside + the capped reserve 7 MiB = 415 MiB: fits, exactly full; the reserve's extra 1 MiB
    assert result.fits and result.peak_bytes == 415 * MIB and result.allocator_flushes == 2
    assert result.detail["allocator_reserve"] == MIB and sum(result.memory.values()) == result.peak_bytes
    # the re-play runs out: the unhindered reserve stands, 1 MiB short
    runs_out = device_memory(step, gpu, overhead, capped=lambda c: AllocatorPeaks(6 * MIB, 7 * MIB, 3, 1, True))
    assert not runs_out.fits and runs_out.missing_bytes == MIB and runs_out.allocator_flushes == 0
    # no re-play where the reserve fits (416 MiB) or not even the allocated peak does (413 MiB: room 5 MiB)
    for mib in (416, 413):
        device_memory(step, type("G", (), {"id": "t", "memory_bytes": mib * MIB})(), overhead, capped=fits_in)
    assert asked == [7 * MIB]


def test_vgg16_at_batch_256_in_fp32_fits_a_24_gib_card_only_with_flushes() -> None:
    # NikolasEnt (2022) trained timm's VGG-16 at batch 256 in fp32 on an RTX 3090 and 4090 (24 GiB). Its
    # 64 x 224 x 224 activations are 3.3 GB blocks at that batch; freed and re-requested in other sizes they
    # fragment the cache: unhindered the allocator takes ~30.7 GiB for a ~19.1 GiB allocated peak.
    import sys
    from pathlib import Path

    from advisor.hardware.loader import load_hwdb

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from zoo import VGG16

    trace = trace_training_step(VGG16, lambda b: torch.randn(b, 3, 224, 224), 256, "fp32", "momentum")
    step = StepMemory.of_trace(trace)
    assert step.reserved > 1.5 * step.allocated  # fragmented: ~30.7 against ~19.1 GiB
    db = load_hwdb()
    card = db.gpu("rtx-3090")
    unhindered = device_memory(step, card, db.memory_overhead(card))
    assert not unhindered.fits
    capped = device_memory(step, card, db.memory_overhead(card), capped=capped_replay(trace.memory))
    assert capped.fits and capped.allocator_flushes > 0 and capped.peak_bytes <= card.memory_bytes


def test_parameter_formula_baseline() -> None:
    # 1000 params, AdamW: fp32 4+4+8 = 16 B each; amp adds the 2-byte copy: 18; pure bf16 2+2+4 = 8
    assert parameter_formula_bytes(1000, "fp32", "adamw") == 16_000
    assert parameter_formula_bytes(1000, "amp-bf16", "adamw") == 18_000
    assert parameter_formula_bytes(1000, "bf16", "adam") == 8_000
    assert parameter_formula_bytes(1000, "fp32", "sgd") == 8_000


class Blocks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x)
        return x


def test_checkpointing_trades_activation_memory_for_recompute() -> None:
    plain = trace_training_step(Blocks, lambda b: torch.randn(b, 64), 512, "fp32", "sgd")
    checkpointed = trace_training_step(Blocks, lambda b: torch.randn(b, 64), 512, "fp32", "sgd", checkpointing=True)
    assert checkpointed.checkpointed == ("layers.0", "layers.1", "layers.2", "layers.3")
    # per block the forward keeps its input and output (2 x 512*64*4 = 256 KiB) instead of also the
    # 2 x 512*256*4 = 1 MiB inside it; at the forward's peak one block's 1 MiB is live as temporaries
    forward_activations = [t.memory.peak(phase="forward").by_category["activations"] for t in (plain, checkpointed)]
    assert forward_activations[1] < 0.35 * forward_activations[0]
    assert checkpointed.memory.peak().bytes < 0.7 * plain.memory.peak().bytes
    # each block's forward runs again in backward, up to the last tensor its backward needs (torch's
    # non-reentrant checkpoint stops early): Linear(64,256) 2*512*64*256 = 16,777,216 and GELU
    # 512*256 = 131,072 FLOPs; the second Linear keeps only its input, so it is not recomputed
    recomputed = 4 * (16_777_216 + 131_072)
    assert checkpointed.flops("backward") - plain.flops("backward") == recomputed


def test_gradient_accumulation_keeps_gradients_through_the_forward() -> None:
    trace = trace_training_step(mlp, inputs, 2, "fp32", "sgd", accumulate_gradients=True)
    forward = trace.memory.peak(phase="forward")
    assert forward.by_category["gradients"] == 848  # every parameter's gradient, from earlier micro-batches


@pytest.mark.skipif("adafactor" not in OPTIMIZERS, reason="torch.optim.Adafactor needs torch >= 2.5")
def test_adafactor_state_is_far_smaller_than_adams() -> None:
    def wide() -> torch.nn.Module:
        return torch.nn.Linear(512, 512, bias=False)

    def state(optimizer: str) -> int:
        trace = trace_training_step(wide, lambda b: torch.randn(b, 512), 2, "fp32", optimizer)
        return trace.memory.total("optimizer_state")

    # Adam: 2 * 512*512*4 = 2 MiB (+ the step); Adafactor: row and column factors 2 * 512 * 4 = 4 KiB (+ step)
    assert state("adam") == 2 * 512 * 512 * 4 + 4
    assert state("adafactor") < 8 * 1024


def test_the_live_memory_tracker_run_by_its_caller_registers_what_it_did_as_a_mode() -> None:
    """One mode on the stack, or taken off it and called by the mode above (run_by_caller): the same storages."""
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

    from advisor.profile.live_memory import LiveMemoryTracker

    class Caller(TorchDispatchMode):
        def __init__(self, tracker: LiveMemoryTracker) -> None:
            super().__init__()
            self.tracker = tracker

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return self.tracker.run(func, args, kwargs or {})

    def step(tracker: LiveMemoryTracker) -> tuple[int, ...]:
        x = torch.ones(4, 5)  # 4 x 5 fp32: 80 bytes
        tracker.open_step()
        y = x.relu()  # 80 bytes
        z = torch.cat([x, y])  # 8 x 5 fp32: 160 bytes
        del y, z
        return tuple(s.nbytes for s in tracker.close_step().storages)

    with LiveMemoryTracker() as as_mode:
        on_stack = step(as_mode)
    with LiveMemoryTracker() as tracker:
        with tracker.run_by_caller():
            assert _get_current_dispatch_mode() is None
            with Caller(tracker):
                by_caller = step(tracker)
        assert _get_current_dispatch_mode() is tracker
    assert on_stack == by_caller == (80, 80, 160)
