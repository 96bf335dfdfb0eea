"""Batch norm on a GPU: PyTorch's kernels reduce channels-first tensors with one thread block per channel,
so few channels leave SMs idle; channels-last tensors split over a 2-D grid. By hand."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from advisor.estimate.ops import BATCH_NORM_BLOCK_ELEMENTS_PER_S, channel_block_seconds, max_threads_per_sm
from advisor.estimate.step import DeviceModel, estimate_records
from advisor.profile.costs import NormGeometry
from advisor.profile.trace import OpRecord, trace_training_step
from tests.test_estimate import synthetic_profile


def batch_norm(channels: int, channels_last: bool = False, op: str = "native_batch_norm") -> OpRecord:
    """A batch norm over x [64, channels, 56, 56] in fp32: reads x once, writes y (its traced bytes)."""
    elements = 64 * channels * 56 * 56
    return OpRecord("forward" if op == "native_batch_norm" else "backward", "bn", op, 5.0 * elements,
                    elements * 4, elements * 4, ("float32",), False, True,
                    norm=NormGeometry(channels, elements, channels_last))


def test_one_block_per_channel_on_few_channels() -> None:
    # x [64, 64, 56, 56] on 132 SMs of 2,048 threads: 64 channels < 132 x 4 blocks of 512 threads, so 64
    # blocks; the forward's statistics pass: 12,845,056 / (64 x 2.6e9 /s) = 77.19 us
    geometry = NormGeometry(64, 64 * 64 * 56 * 56, False)
    assert BATCH_NORM_BLOCK_ELEMENTS_PER_S == 2.6e9
    assert channel_block_seconds(geometry, "native_batch_norm", 132, 2048) == pytest.approx(77.19e-6, rel=1e-4)
    # the backward's fused kernel makes all five passes in those blocks: 5 x 77.19 us
    assert channel_block_seconds(geometry, "native_batch_norm_backward", 132, 2048) == \
        pytest.approx(5 * 77.19e-6, rel=1e-4)
    # 2,048 channels: only 132 x 4 = 528 blocks at once; 411,041,792 / (528 x 2.6e9) = 299.42 us
    wide = NormGeometry(2048, 64 * 2048 * 56 * 56, False)
    assert channel_block_seconds(wide, "native_batch_norm", 132, 2048) == pytest.approx(299.42e-6, rel=1e-4)
    # 1,536 threads (an Ada SM) hold 3 such blocks: 128 SMs x 3 = 384
    assert channel_block_seconds(wide, "native_batch_norm", 128, 1536) == \
        pytest.approx(411_041_792 / (384 * 2.6e9), rel=1e-6)
    assert channel_block_seconds(dataclasses.replace(geometry, channels_last=True), "native_batch_norm", 132,
                                 2048) == 0.0
    assert channel_block_seconds(geometry, "native_layer_norm", 132, 2048) == 0.0


def test_resident_threads_by_compute_capability() -> None:
    assert [max_threads_per_sm(c) for c in ("7.0", "7.5", "8.0", "8.6", "8.9", "9.0", "12.0", None)] == \
        [2048, 1024, 2048, 1536, 1536, 2048, 1536, 2048]


def test_a_local_gpu_the_database_lacks_takes_its_threads_from_the_capability_torch_reports() -> None:
    profile = synthetic_profile(0.0)
    # an Ada card the database does not list, as targets.local_targets passes torch.cuda's properties
    assert DeviceModel.of_gpu("local-cuda0", profile, None, 76, "8.9").threads_per_sm == 1536
    assert DeviceModel.of_gpu("local-cuda0", profile, None, 76).threads_per_sm == 2048  # unknown: the most


def test_a_channels_first_batch_norm_waits_on_its_blocks_on_a_gpu_only() -> None:
    # 64 channels on a 4-SM GPU: 4 x 4 = 16 blocks at once, 41.6e9 elements/s: the statistics pass over
    # 12,845,056 elements takes 308.78 us. The op moves 3 x 51,380,224 B (it reads x twice) = 154,140,672 B
    # at 1e11 x 50% = 3,082.81 us, of which the statistics pass (a third) is 1,027.60 us, longer than its
    # blocks take: the bandwidth limits, nothing added. On 1 SM: 4 blocks, 1,235.12 us > 1,027.60 us.
    record = batch_norm(64)
    four, one = (DeviceModel("gpu", "gpu", synthetic_profile(0.0), sm_count=n) for n in (4, 1))
    assert estimate_records([record], "fp32", four).step_s == pytest.approx(3082.81e-6, rel=1e-4)
    assert estimate_records([record], "fp32", one).step_s == pytest.approx(3082.81e-6 - 1027.60e-6 + 1235.12e-6,
                                                                         rel=1e-4)
    channels_last = dataclasses.replace(record, norm=dataclasses.replace(record.norm, channels_last=True))
    assert estimate_records([channels_last], "fp32", one).step_s == pytest.approx(3082.81e-6, rel=1e-4)
    cpu = DeviceModel("cpu", "cpu", synthetic_profile(0.0))
    assert estimate_records([record], "fp32", cpu).step_s == estimate_records([channels_last], "fp32", cpu).step_s


def test_what_nchw_costs_a_batch_norm_is_its_channels_first_time_not_a_transpose() -> None:
    # the 1-SM case above: the blocks' 1,235.12 us beyond the statistics pass's 1,027.60 us at the bandwidth
    # is what channels-first costs (207.52 us); no convolution, so no transposes
    one = DeviceModel("gpu", "gpu", synthetic_profile(0.0), sm_count=1)
    step = estimate_records([batch_norm(64)], "fp32", one)
    assert step.channels_first_s == pytest.approx(1235.12e-6 - 1027.60e-6, rel=1e-3)
    assert step.layout_s == 0.0
    assert step.to_dict()["channels_first_s"] == step.channels_first_s
    # timed as if channels-last, the op pays nothing for it: the bandwidth's 3,082.81 us
    as_channels_last = dataclasses.replace(one, channels_last=True)
    assert estimate_records([batch_norm(64)], "fp32", as_channels_last).step_s == pytest.approx(3082.81e-6, rel=1e-4)
    # a host that takes 10 ms to issue the op hides the device's time: channels-last would save nothing
    slow_host = dataclasses.replace(one, profile=synthetic_profile(10e-3))
    assert estimate_records([batch_norm(64)], "fp32", slow_host).step_s == \
        estimate_records([batch_norm(64)], "fp32", dataclasses.replace(slow_host, channels_last=True)).step_s


def test_the_trace_records_each_batch_norm_channels_and_layout() -> None:
    def build() -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.Flatten(), nn.Linear(16 * 64, 2))

    for channels_last in (False, True):
        def make_input(batch: int, channels_last: bool = channels_last) -> torch.Tensor:
            x = torch.randn(batch, 3, 8, 8)
            return x.contiguous(memory_format=torch.channels_last) if channels_last else x

        def built(channels_last: bool = channels_last) -> nn.Module:
            model = build()
            return model.to(memory_format=torch.channels_last) if channels_last else model

        trace = trace_training_step(built, make_input, 4, "fp32", "sgd")
        norms = {r.op: r.norm for r in trace.records if r.norm is not None}
        # x [4, 16, 8, 8]: 4 x 16 x 64 = 4,096 elements in 16 channels, forward and backward alike, both
        # normalising by the batch's statistics (training)
        assert set(norms) == {"native_batch_norm", "native_batch_norm_backward"}
        assert set(norms.values()) == {NormGeometry(16, 4096, channels_last, (4, 16, 8, 8), True)}
