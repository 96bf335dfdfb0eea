"""A GPU's L2 serving values an op reads soon after another made them (issue #28: GPUs with large L2 caches,
Ada's 72-96 MB and Blackwell's, against Ampere's 6 MB): which reads hit, and what they cost. Hand-computable
sizes."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from advisor.estimate.step import L2_OVER_DRAM, DeviceModel, cached_reads, estimate_records
from advisor.profile.trace import OpRecord, trace_training_step
from tests.test_estimate import synthetic_profile

MB = 2**20


def pointwise(op: str, size: int, source: int) -> OpRecord:
    """An fp32 pointwise op reading one value of `size` bytes made `source` records before (< 0: a parameter)
    and writing one of the same size."""
    return OpRecord("forward", "act", op, float(size // 4), size, size, ("float32",), False, True,
                    reads=((source, size, 0),), writes=((0, size),))


def test_a_value_read_right_after_it_was_made_comes_from_l2_when_the_traffic_since_fits() -> None:
    relu, add = pointwise("relu", 4 * MB, -1), pointwise("add", 4 * MB, 1)
    # since relu made its output: relu's 4 MB read + 4 MB write = 8 MB of traffic
    assert cached_reads([relu, add], (), 6 * MB) == [0, 0]  # an RTX 3090's 6 MB: evicted
    assert cached_reads([relu, add], (), 8 * MB) == [0, 4 * MB]  # 8 MB fits: add's 4 MB read hits
    assert cached_reads([relu, add], (), 72 * MB) == [0, 4 * MB]  # a parameter read (relu's) is not counted


def test_the_traffic_of_every_op_in_between_counts() -> None:
    first = pointwise("relu", 4 * MB, -1)
    between = pointwise("mul", 16 * MB, -2)  # reads a parameter, 32 MB of traffic
    late = pointwise("add", 4 * MB, 2)  # reads first's output, two records back
    # 8 MB (first) + 32 MB (between) = 40 MB since the value was made
    assert cached_reads([first, between, late], (), 32 * MB)[2] == 0
    assert cached_reads([first, between, late], (), 40 * MB)[2] == 4 * MB


def test_a_source_in_the_ops_just_before_counts_and_one_further_back_misses() -> None:
    made, read = pointwise("relu", 4 * MB, -1), pointwise("add", 4 * MB, 1)
    assert cached_reads([read], [made], 72 * MB) == [4 * MB]
    assert cached_reads([pointwise("add", 4 * MB, 5)], [made], 72 * MB) == [0]


def test_a_batch_norm_makes_its_second_pass_over_an_input_that_fits_from_l2() -> None:
    elements = MB  # fp32: 4 MB of input, 4 MB of output (weight and statistics left out)
    norm = OpRecord("forward", "bn", "native_batch_norm", 5.0 * elements, 4 * elements, 4 * elements,
                    ("float32",), False, True, reads=((-1, 4 * elements, 0),), writes=((0, 4 * elements),))
    assert cached_reads([norm], (), 6 * MB) == [4 * MB]
    assert cached_reads([norm], (), 2 * MB) == [0]


def test_reads_from_l2_take_their_bytes_at_l2_over_dram_times_the_bandwidth() -> None:
    relu, add = pointwise("relu", 4 * MB, -1), pointwise("add", 4 * MB, 1)
    plain = DeviceModel("gpu", "gpu", synthetic_profile(dispatch_s=0.0))
    large = dataclasses.replace(plain, l2_cache_bytes=72 * MB)
    without, with_l2 = (estimate_records([relu, add], "fp32", d).ops for d in (plain, large))
    assert with_l2[0].memory_s == without[0].memory_s
    # add: 4 MB read from L2 of its 8 MB: 0.5 + 0.5 / 2.5 = 0.7 of its DRAM time
    assert L2_OVER_DRAM == 2.5
    assert abs(with_l2[1].memory_s / without[1].memory_s - 0.7) < 1e-6  # the curve's fixed time, rounding
    # a CPU has no such model (its calibration's curves hold its caches), a GPU without an L2 size neither
    cpu = dataclasses.replace(large, kind="cpu")
    assert estimate_records([relu, add], "fp32", cpu).ops[1].memory_s == \
        estimate_records([relu, add], "fp32", dataclasses.replace(plain, kind="cpu")).ops[1].memory_s


def test_a_traced_step_is_faster_with_a_larger_l2_and_the_same_with_none() -> None:
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                          nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    trace = trace_training_step(lambda: model, lambda b: torch.randn(b, 3, 32, 32), 64, "fp32", "sgd")
    plain = DeviceModel("gpu", "gpu", synthetic_profile(dispatch_s=0.0))
    steps = [estimate_records(trace.records, "fp32", dataclasses.replace(plain, l2_cache_bytes=size)).step_s
             for size in (None, 1, 6 * MB, 72 * MB)]
    # [64, 16, 32, 32] fp32 activations are 4 MB: a 6 MB L2 holds some values from one op to the next
    assert steps[0] == steps[1] > steps[2] > steps[3]


def test_chunk_facts_give_one_kind_per_distinct_op_and_each_chunks_hits_per_l2_size() -> None:
    from advisor.estimate.step import ChunkFacts

    relu, add = pointwise("relu", 4 * MB, -1), pointwise("add", 4 * MB, 1)
    block = [relu, add]  # a block of 2 ops repeated 3 times after a chunk of its own relu
    facts = ChunkFacts([([relu], 1), (block, 3)])
    assert facts.kinds == [[0], [0, 1]]  # relu twice: one kind; add: another (a module name would not count)
    # after [relu] (8 MB of traffic): the block's relu reads a parameter, add reads relu's 4 MB output, 8 MB back
    assert facts.hits(8 * MB) == [([0], None), ([0, 4 * MB], [0, 4 * MB])]
    assert facts.hits(6 * MB) == [([0], None), ([0, 0], [0, 0])]
    assert facts.hits(8 * MB) is facts.hits(8 * MB)  # made once per L2 size


def test_a_step_timed_with_its_chunk_facts_kept_equals_one_timed_afresh() -> None:
    from advisor.estimate.step import estimate_chunks

    relu, add = pointwise("relu", 4 * MB, -1), pointwise("add", 4 * MB, 1)
    device = dataclasses.replace(DeviceModel("gpu", "gpu", synthetic_profile(dispatch_s=0.0)), l2_cache_bytes=8 * MB)
    chunks = [([relu], 1), ([relu, add], 5)]
    kept = [estimate_chunks(chunks, "fp32", device) for _ in range(2)]  # the second with the first's facts
    fresh = estimate_chunks([(list(records), copies) for records, copies in chunks], "fp32", device)
    assert kept[0] == kept[1] == fresh
