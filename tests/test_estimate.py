"""The estimator: per-op time by hand on synthetic calibrations, tile waves, the money arithmetic
(hours, spot, electricity, break-even), ranking and the Pareto set, and `advisor estimate` end to end
with its errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from advisor.calibration.curves import Curve, Fit
from advisor.calibration.peaks import DevicePeaks
from advisor.calibration.profile import CalibrationProfile, SeriesProfile
from advisor.calibration.reference import load_families
from advisor.cli.main import main
from advisor.estimate.costs import Job, cloud_costs, electricity_usd, ownership, pareto_front
from advisor.estimate.ops import OpClass, classify, moved_bytes, wave_efficiency
from advisor.estimate.plan import EstimateSettings, estimate_model, step_time
from advisor.estimate.step import DeviceModel, estimate_records
from advisor.estimate.targets import database_targets
from advisor.hardware.loader import load_hwdb
from advisor.memory.plan import MemorySettings
from advisor.profile.model_file import load_model_file
from advisor.profile.trace import OpRecord
from tests.calibration_fakes import steady_local_cpu
from tests.test_calibration import TINY_SUITE

FLAT = Fit(Curve.saturating(0.5, 1e-15), (), 0.0, 0)
"""A curve at 50% of its reference for any call that is not vanishingly small."""


def synthetic_profile(dispatch_s: float = 1e-5) -> CalibrationProfile:
    """1 TFLOP/s fp32 and 4 TFLOP/s bf16 GEMMs, 100 GB/s copies and sustained bandwidth, all at 50%."""
    series = (
        SeriesProfile("gemm", "fp32", "flops", 1e12, FLAT),
        SeriesProfile("gemm", "bf16", "flops", 4e12, FLAT),
        SeriesProfile("copy", "fp32", "bytes", 1e11, FLAT),
    )
    return CalibrationProfile("test", "test device", "measured", "quick", "2026-11-22",
                              DevicePeaks({"fp32": 1e12, "bf16": 4e12}, 1e11), 1e11,
                              {"dispatch": dispatch_s, "autograd": dispatch_s}, series)


def mm(m: int, n: int, k: int, phase: str = "forward", dtype: str = "float32") -> OpRecord:
    size = 2 if dtype == "bfloat16" else 4
    return OpRecord(phase, "fc", "mm", 2.0 * m * n * k, (m * k + k * n) * size, m * n * size, (dtype,), True, True,
                    (1, m, n, k))


def add(elements: int, phase: str = "forward") -> OpRecord:
    return OpRecord(phase, "act", "add", float(elements), 8 * elements, 4 * elements, ("float32",), False, True)


# ----------------------------------------------------------------------------- per-op time by hand


def test_compute_and_memory_ops_by_hand_on_a_cpu() -> None:
    device = DeviceModel("cpu", "cpu", synthetic_profile())
    # mm 1000x1000x1000: 2e9 FLOPs; 12 MB -> intensity 167 FLOP/B x 1e11 B/s > 1e12: compute-bound at
    # 1e12 x 50% = 5e11 FLOP/s -> 4 ms. add of 1M floats: 12 MB at 1e11 x 50% -> 0.24 ms.
    # A CPU runs the host's work per op in line: a forward op of a real step costs CPU_STEP_HOST_RATIO (15) x
    # the 10 us autograd overhead = 150 us: 4 ms + 0.24 ms + 2 x 150 us = 4.54 ms.
    step = estimate_records([mm(1000, 1000, 1000), add(1_000_000)], "fp32", device)
    assert step.ops[0].kernel_s == pytest.approx(4e-3)
    assert step.ops[1].kernel_s == pytest.approx(0.24e-3)
    assert step.step_s == pytest.approx(4.54e-3)
    assert [op.bound for op in step.ops] == ["compute", "memory"]
    assert step.by_bound == pytest.approx({"compute": 4e-3, "memory": 0.24e-3, "overhead": 3e-4})
    assert step.bound == "compute"


def test_a_cpu_gemm_pays_the_packing_of_its_second_operand() -> None:
    profile = synthetic_profile()
    packed = SeriesProfile("gemm", "fp32", "flops", 1e12, FLAT, pack_bandwidth_bytes_per_s=8e9)
    device = DeviceModel("cpu", "cpu", dataclasses.replace(profile, series=(packed, *profile.series[1:])))
    # mm 64x1024x1024: 2*64*1024*1024 = 134,217,728 FLOPs at 5e11 FLOP/s = 268.4 us, plus the 1024x1024
    # fp32 operand packed at 8 GB/s: 1024*1024*4 / 8e9 = 524.3 us -> 792.7 us
    thin, vector = estimate_records([mm(64, 1024, 1024), mm(1, 1024, 1024)], "fp32", device).ops
    assert thin.kernel_s == pytest.approx(268.435456e-6 + 524.288e-6)
    # a matrix-vector product (m = 1) is not packed: 2*1024*1024 FLOPs over (1024*1024 + 2*1024)*4 B is
    # 0.5 FLOP/B, a roofline of 0.5 x 1e11 B/s, at 50%: the bytes at 5e10 B/s = 84.05 us
    assert vector.kernel_s == pytest.approx((1024 * 1024 + 1024 + 1024) * 4 / 5e10)


def test_gpu_queues_kernels_behind_the_host() -> None:
    device = DeviceModel("gpu", "gpu", synthetic_profile(dispatch_s=1e-5), sm_count=None)
    # An op of a real step costs the host 4.1 x the 10 us autograd overhead (STEP_HOST_RATIO) = 41 us. In a
    # training loop the host issues the next step while the device runs this one: a step that reads
    # nothing back takes max(host, kernels). mm (4 ms) + add (0.24 ms) against 82 us of host: 4.24 ms.
    step = estimate_records([mm(1000, 1000, 1000), add(1_000_000)], "fp32", device)
    assert step.step_s == pytest.approx(4e-3 + 0.24e-3)
    assert [op.wait_s for op in step.ops] == [0.0, 0.0] and step.by_bound["overhead"] == 0.0
    # 100 tiny adds (1,000 floats: 12 kB / 5e10 B/s = 0.24 us each) against 41 us of host each: the
    # host's 4.1 ms, of which the device waits 4.1 ms - 24 us.
    tiny = estimate_records([add(1000)] * 100, "fp32", device)
    assert tiny.step_s == pytest.approx(100 * 4.1e-5)
    assert tiny.by_bound["overhead"] == pytest.approx(100 * 4.1e-5 - 100 * 0.24e-6)
    assert tiny.bound == "overhead"
    assert all(op.bound == "overhead" for op in tiny.ops)


def test_a_gradient_the_engine_sums_costs_the_host_a_plain_dispatch() -> None:
    device = DeviceModel("gpu", "gpu", synthetic_profile(dispatch_s=1e-5), sm_count=None)
    # 100 tiny backward adds: as ops of the step, 4.1 x the 10 us autograd overhead each (STEP_HOST_RATIO) = 4.1 ms;
    # summed by the autograd engine in C++ (OpRecord.engine_sum), the 10 us dispatch each = 1 ms
    summed = dataclasses.replace(add(1000, phase="backward"), engine_sum=True)
    assert estimate_records([add(1000, phase="backward")] * 100, "fp32", device).step_s == pytest.approx(100 * 4.1e-5)
    assert estimate_records([summed] * 100, "fp32", device).step_s == pytest.approx(100 * 1e-5)
    # so on a CPU: the dispatch, not CPU_STEP_HOST_RATIO x the autograd overhead; plus its 0.24 us of kernel
    cpu = DeviceModel("cpu", "cpu", synthetic_profile(dispatch_s=1e-5))
    assert estimate_records([summed], "fp32", cpu).step_s == pytest.approx(1e-5 + 0.24e-6)


def test_a_value_read_back_makes_the_host_wait_for_the_device() -> None:
    device = DeviceModel("gpu", "gpu", synthetic_profile(dispatch_s=1e-5), sm_count=None)
    read = OpRecord("optimizer", "(optimizer)", "_local_scalar_dense", 0.0, 0, 0, ("float32",), False, True,
                    synchronizes=True)
    update = add(1000, phase="optimizer")  # 12 kB at 5e10 B/s: 0.24 us of kernel
    # Without the read the host runs ahead into the next step: max(host 41 + 10 us, kernels 4 ms + 0.24 us).
    queued = estimate_records([mm(1000, 1000, 1000), update], "fp32", device)
    assert queued.step_s == pytest.approx(4e-3 + 0.24e-6)
    # With it, every step the host waits until mm is done, spends 10 us on the read and 10 us on the add
    # (the optimizer's one-tensor ops cost the 10 us dispatch), then 41 us on the next step's mm, all of
    # which the device waits for: 41 us + 4 ms + 20 us a step (the add's 0.24 us hides in the next mm's wait).
    synced = estimate_records([mm(1000, 1000, 1000), read, update], "fp32", device)
    assert synced.step_s == pytest.approx(4.1e-5 + 4e-3 + 2e-5)
    assert [op.wait_s for op in synced.ops] == pytest.approx([4.1e-5 - 0.24e-6, 1e-5, 1e-5])
    # On a CPU the host runs every op anyway: a read costs its dispatch, nothing more (10 us each).
    cpu = DeviceModel("cpu", "cpu", synthetic_profile(dispatch_s=1e-5))
    assert estimate_records([read], "fp32", cpu).step_s == pytest.approx(1e-5)


def test_a_multi_tensor_op_costs_the_cpu_host_one_dispatch_per_tensor() -> None:
    # _foreach_mul_ over 100 tensors of 1,000 floats: 800 kB moved at 1e11 x 50% = 16 us of kernel.
    # A CPU runs it tensor by tensor: a profile without a foreach overhead counts 100 x 10 us of host
    # = 1 ms; with foreach 1 us: 10 us + 99 x 1 us = 109 us. A GPU fuses the list (one launch: 4.1 x 10 us,
    # STEP_HOST_RATIO), which takes longer than its kernel: the step is the host's 41 us.
    record = OpRecord("optimizer", "(optimizer)", "_foreach_mul_", 1e5, 400_000, 400_000, ("float32",), False, True,
                      tensors=100)
    cpu = estimate_records([record], "fp32", DeviceModel("cpu", "cpu", synthetic_profile()))
    assert cpu.ops[0].host_s == pytest.approx(100 * 1e-5) and cpu.step_s == pytest.approx(1e-3 + 16e-6)
    profile = synthetic_profile()
    profile = dataclasses.replace(profile, overheads_s={**profile.overheads_s, "foreach": 1e-6})
    measured = estimate_records([record], "fp32", DeviceModel("cpu", "cpu", profile))
    assert measured.ops[0].host_s == pytest.approx(1e-5 + 99 * 1e-6)
    gpu = estimate_records([record], "fp32", DeviceModel("gpu", "gpu", synthetic_profile(), sm_count=None))
    assert gpu.ops[0].host_s == pytest.approx(4.1e-5) and gpu.step_s == pytest.approx(4.1e-5)


def test_a_depthwise_convolution_is_timed_by_its_own_series_or_falls_back_to_the_dense_one() -> None:
    # depthwise 3x3 over x [1, 96, 56, 56]: 96 groups of (3136 x 1 x 9): 2*96*3136*9 = 5,419,008 FLOPs
    flops = 2.0 * 96 * 3136 * 9
    record = OpRecord("forward", "dw", "convolution", flops, 4 * (96 * 3136 + 96 * 9), 4 * 96 * 3136, ("float32",),
                      True, True, (96, 3136, 1, 9))
    backward = dataclasses.replace(record, op="convolution_backward", phase="backward")
    assert classify(record, "fp32") == OpClass("conv_dw", "fp32", compute=True, vector=True)
    assert classify(backward, "fp32").series == "conv_dw_backward"
    base = synthetic_profile(dispatch_s=0.0)
    slow = SeriesProfile("conv_dw", "fp32", "flops", 1e12, Fit(Curve.saturating(0.05, 1e-15), (), 0.0, 0))
    with_dw = dataclasses.replace(base, series=(*base.series, slow))
    device, dw_device = DeviceModel("cpu", "cpu", base), DeviceModel("cpu", "cpu", with_dw)
    # 5,419,008 FLOPs over 4 x (301,056 + 864) + 4 x 301,056 = 2,411,904 B: intensity 2.2468 FLOP/B x 1e11
    # B/s = 2.2468e11 FLOP/s roofline (below the 1e12 peak). Its own series at 5%: 482.4 us; without it
    # the dense conv's fallback, gemm at 50%: 48.24 us
    roof = flops / 2_411_904 * 1e11
    assert estimate_records([record], "fp32", dw_device).ops[0].compute_s == pytest.approx(flops / (roof * 0.05))
    assert estimate_records([record], "fp32", device).ops[0].compute_s == pytest.approx(flops / (roof * 0.5))
    assert flops / (roof * 0.05) == pytest.approx(482.4e-6, rel=1e-3)


def test_memory_bound_matmul_follows_the_roofline() -> None:
    device = DeviceModel("cpu", "cpu", synthetic_profile(dispatch_s=0.0))
    # mm 4096x1x4096 (a matrix-vector product): 2*4096*4096 = 33.6 MFLOP over (16.8M + 4096 + 4096) x 4 B
    # = 67.1 MB: intensity 0.5 FLOP/B x 1e11 B/s = 5e10 FLOP/s roofline, x 50% -> 1.34 ms.
    record = mm(4096, 1, 4096)
    intensity = record.flops / (record.bytes_read + record.bytes_written)
    expected = record.flops / (intensity * 1e11 * 0.5)
    assert estimate_records([record], "fp32", device).step_s == pytest.approx(expected)


def test_the_fixed_latency_of_a_call_stays_a_time_on_a_bandwidth_bound_gemm() -> None:
    # A curve at e_max 50% with tau_half = 2 us: t = (ideal + 2 us) / 0.5, ideal = FLOPs / roofline.
    latency = Fit(Curve.saturating(0.5, 2e-6), (), 0.0, 0)
    profile = synthetic_profile(dispatch_s=0.0)
    profile = dataclasses.replace(profile, series=(SeriesProfile("gemm", "fp32", "flops", 1e12, latency),
                                                   *profile.series[1:]))
    device = DeviceModel("cpu", "cpu", profile)
    # mm 4096x1x4096: 33.6 MFLOP, 67.1 MB, roofline 0.5 FLOP/B x 1e11 B/s = 5e10 FLOP/s: ideal 671 us;
    # t = (671 us + 2 us) / 0.5 = 1.346 ms. (Read at the FLOPs themselves, the latency would have been
    # multiplied by peak / roofline = 20: (671 + 40) / 0.5 = 1.42 ms.)
    record = mm(4096, 1, 4096)
    ideal = record.flops / (record.flops / (record.bytes_read + record.bytes_written) * 1e11)
    assert estimate_records([record], "fp32", device).step_s == pytest.approx((ideal + 2e-6) / 0.5)
    # compute-bound (roofline = peak): mm 1000^3, 2e9 FLOPs at 1e12: t = (2 ms + 2 us) / 0.5
    assert estimate_records([mm(1000, 1000, 1000)], "fp32", device).step_s == pytest.approx((2e-3 + 2e-6) / 0.5)


def test_large_fresh_outputs_fault_their_pages_in_on_a_cpu_only() -> None:
    # fresh_pages measured at 5e9 B/s (allocate and write); sustained bandwidth 1e11 B/s. A 64 MiB
    # output costs 64 MiB / 5e9 - 64 MiB / 1e11 = 13.42 ms - 0.67 ms = 12.75 ms more, added after the
    # op's own time; a 16 MiB one (below glibc's 32 MiB mmap threshold) and an `add` (whose
    # calibration allocates fresh outputs already) cost nothing more.
    flat = Fit(Curve.hierarchy(0.05, 0.05, 1.0, 1e-15), (), 0.0, 0)
    profile = synthetic_profile(dispatch_s=0.0)
    profile = dataclasses.replace(profile, series=(*profile.series, SeriesProfile("fresh_pages", "fp32", "bytes",
                                                                                 1e11, flat)))
    size = 64 * 2**20
    big = dataclasses.replace(mm(1000, 1000, 1000), allocated=(size,))
    small = dataclasses.replace(mm(1000, 1000, 1000), allocated=(16 * 2**20,))
    fresh_add = dataclasses.replace(add(1_000_000), allocated=(size,))
    cpu = DeviceModel("cpu", "cpu", profile)
    faults = size / 5e9 - size / 1e11
    assert estimate_records([big], "fp32", cpu).step_s == pytest.approx(4e-3 + faults)
    assert estimate_records([big], "fp32", cpu).ops[0].bound == "memory"  # 12.75 ms of faults > 4 ms of math
    assert estimate_records([small], "fp32", cpu).step_s == pytest.approx(4e-3)
    assert estimate_records([fresh_add], "fp32", cpu).step_s == pytest.approx(0.24e-3)
    gpu = DeviceModel("gpu", "gpu", profile)  # PyTorch's caching allocator keeps GPU memory
    assert estimate_records([big], "fp32", gpu).step_s == pytest.approx(4e-3)


def test_dropout_masks_are_timed_by_the_random_series_or_copy_without_one() -> None:
    record = OpRecord("forward", "drop", "bernoulli_", 0.0, 4_000_000, 4_000_000, ("float32",), False, True)
    assert classify(record, "fp32").series == "random"
    # no `random` series in the synthetic profile: copy's 1e11 x 50% -> 8 MB / 5e10 = 0.16 ms
    assert estimate_records([record], "fp32", DeviceModel("cpu", "cpu", synthetic_profile(0.0))).step_s == \
        pytest.approx(0.16e-3)


def test_amp_matmuls_run_in_16_bits_on_a_gpu_only() -> None:
    record = mm(1000, 1000, 1000)  # recorded in fp32, as CPU autocast leaves attention
    gpu_kind, cpu_kind = classify(record, "amp-bf16", cuda=True), classify(record, "amp-bf16")
    assert (gpu_kind.dtype, cpu_kind.dtype) == ("bf16", "fp32")
    assert moved_bytes(record, gpu_kind) == (record.bytes_read + record.bytes_written) // 2
    # on the GPU: 2e9 FLOPs at 4e12 x 50% = 1 ms (its 4.1 x 10 us of host, STEP_HOST_RATIO, hide behind it)
    step = estimate_records([record], "amp-bf16", DeviceModel("gpu", "gpu", synthetic_profile()))
    assert step.step_s == pytest.approx(1e-3)


def test_fused_attention_in_fp32_stays_fp32_under_tf32_on_a_gpu() -> None:
    # memory-efficient attention's fp32 kernels run on CUDA cores: tf32 leaves them as fp32 does,
    # where a plain matmul of the same step moves to tensor cores
    attention = dataclasses.replace(mm(1000, 1000, 1000), op="_scaled_dot_product_efficient_attention")
    backward = dataclasses.replace(attention, op="_scaled_dot_product_efficient_attention_backward", phase="backward")
    assert classify(attention, "tf32", cuda=True).dtype == "fp32"
    assert classify(backward, "tf32", cuda=True).dtype == "fp32"
    assert classify(mm(1000, 1000, 1000), "tf32", cuda=True).dtype == "tf32"
    assert classify(attention, "amp-bf16", cuda=True).dtype == "bf16"  # autocast casts attention to 16 bits


def test_a_misaligned_tensor_core_gemm_runs_at_most_1_9x_the_fp32_peak() -> None:
    # bf16 at 4 TFLOP/s x 50% = 2 TFLOP/s; n = 1001 is no multiple of 8 bf16 elements (16 bytes): capped at
    # 1.9 x the 1 TFLOP/s fp32 peak. Aligned: 2e9 FLOPs / 2e12 = 1 ms; misaligned 2*1000*1001*1000 /
    # 1.9e12 = 1.0537 ms. The host's 4.1 x 10 us (STEP_HOST_RATIO) hide behind the kernels.
    gpu = DeviceModel("gpu", "gpu", synthetic_profile(), sm_count=None)
    aligned = estimate_records([mm(1000, 1000, 1000, dtype="bfloat16")], "amp-bf16", gpu)
    misaligned = estimate_records([mm(1000, 1001, 1000, dtype="bfloat16")], "amp-bf16", gpu)
    assert aligned.ops[0].kernel_s == pytest.approx(1e-3)
    assert misaligned.ops[0].kernel_s == pytest.approx(2.002e9 / 1.9e12)
    assert misaligned.step_s == pytest.approx(2.002e9 / 1.9e12)
    cpu = DeviceModel("cpu", "cpu", synthetic_profile())  # the cap is a GPU kernel library's
    assert estimate_records([mm(1000, 1001, 1000, dtype="bfloat16")], "amp-bf16", cpu).ops[0].kernel_s == \
        pytest.approx(2.002e9 / 2e12)


def test_tf32_falls_back_to_fp32_where_the_device_has_no_tf32_series() -> None:
    step = estimate_records([mm(1000, 1000, 1000)], "tf32", DeviceModel("cpu", "cpu", synthetic_profile(0.0)))
    assert step.ops[0].dtype == "tf32" and step.step_s == pytest.approx(4e-3)


def test_batch_norm_moves_its_input_twice() -> None:
    record = OpRecord("forward", "bn", "native_batch_norm", 5e6, 4_000_000, 4_000_000, ("float32",), False, True)
    assert moved_bytes(record, classify(record, "fp32")) == 12_000_000


def test_wave_efficiency_by_hand() -> None:
    # 4096 x 4096 on 108 SMs with 128x128 tiles: 32*32 = 1024 tiles in ceil(1024/108) = 10 waves -> 1024/1080
    assert wave_efficiency((1, 4096, 4096, 4096), 108) == pytest.approx(1024 / 1080)
    # 128 x 128 x 4096: one 128x128 tile; 64x32 tiles give 2*4 = 8 tiles, split-K by min(108 // 8, 4096 // 512)
    # = 8 -> 64 blocks in one wave of 108, at the small tile's 0.75: 64/108 * 0.75 = 0.444
    assert wave_efficiency((1, 128, 128, 4096), 108) == pytest.approx(64 / 108 * 0.75)
    # m = n = 192 on 4 SMs. 128x128: 4 tiles in 1 wave, half-empty edges 192*192/(4*128*128) = 0.5625;
    # 64x64: 9 full tiles in 3 waves of 4, 9/12 * 0.85 = 0.6375; 64x32: 18 full tiles in 5 waves,
    # 18/20 * 0.75 = 0.675 -> the best
    assert wave_efficiency((1, 192, 192, 64), 4) == pytest.approx(18 / 20 * 0.75)


# ----------------------------------------------------------------------------- money by hand


def test_job_steps_by_hand() -> None:
    assert Job(samples=1000, epochs=2).steps_for(64) == 32  # ceil(2000 / 64)
    assert Job(samples=1000, epochs=0.5).steps_for(100) == 5
    assert Job(steps=123).steps_for(7) == 123


def test_cloud_costs_on_demand_and_spot_by_hand() -> None:
    costs = cloud_costs(load_hwdb([]).offers_for("rtx-3090"), 10.0)
    # runpod 1x RTX 3090: 0.43 USD/GPU-hour x 10 h = 4.30 USD; no spot price
    assert costs[0].cost_usd == pytest.approx(4.3) and costs[0].spot_cost_usd is None
    a100 = cloud_costs(load_hwdb([]).offers_for("a100-pcie-80gb"), 10.0)
    azure = next(c for c in a100 if c.provider == "azure")
    # azure NC24ads A100 v4: 3.673 x 10 = 36.73 on demand, 0.404 x 10 = 4.04 spot
    assert (azure.cost_usd, azure.spot_cost_usd) == (pytest.approx(36.73), pytest.approx(4.04))


def test_electricity_and_break_even_by_hand() -> None:
    # 450 W for 10 h at 0.17 USD/kWh: 0.45 x 10 x 0.17 = 0.765 USD
    assert electricity_usd(450, 10, 0.17) == pytest.approx(0.765)
    gpu = load_hwdb([]).gpu("rtx-3090")  # 1,499 USD, 350 W
    owning = ownership(gpu, 10.0, 0.17, cheapest_rent_usd_per_hour=0.43)
    assert owning is not None
    # electricity 0.35 kW x 10 h x 0.17 = 0.595 USD; total 1,499.595
    assert owning.electricity_usd == pytest.approx(0.595)
    assert owning.total_usd == pytest.approx(1499.595)
    # break-even: 1499 / (0.43 - 0.35 x 0.17) = 1499 / 0.3705 = 4045.9 h = 404.6 jobs of 10 h
    assert owning.break_even_hours == pytest.approx(1499 / 0.3705)
    assert owning.break_even_jobs == pytest.approx(1499 / 0.3705 / 10)
    # renting cheaper than the electricity: never pays off
    assert ownership(gpu, 10.0, 0.17, cheapest_rent_usd_per_hour=0.05).break_even_hours is None
    assert ownership(load_hwdb([]).gpu("h100-sxm"), 10.0, 0.17, 2.0) is None  # no purchase price


def test_pareto_front_by_hand() -> None:
    # c (3 h, 6 $) is beaten by b (2 h, 5 $) on both; a, b, d each win somewhere
    points = [("a", 1.0, 9.0), ("b", 2.0, 5.0), ("c", 3.0, 6.0), ("d", 4.0, 1.0)]
    assert pareto_front(points) == ["a", "b", "d"]
    assert pareto_front([("x", 1.0, 1.0), ("y", 1.0, 1.0)]) == ["x", "y"]  # ties dominate neither


# ----------------------------------------------------------------------------- the plan on a real model


@pytest.fixture(scope="module")
def mlp_estimate():
    db = load_hwdb([])
    gpus = [db.gpu(i) for i in ("rtx-3090", "h100-sxm", "t4", "a100-sxm4-80gb", "rtx-5090")]
    model = load_model_file("mlp")
    settings = EstimateSettings(MemorySettings(64, "amp-bf16", "adamw"), Job(samples=60_000, epochs=3))
    return estimate_model(model, db, database_targets(db, gpus, load_families(db)), settings)


def test_plan_arithmetic_and_ranking(mlp_estimate) -> None:
    estimate = mlp_estimate
    for result in estimate.results:
        assert result.steps == 2813  # ceil(180,000 / 64)
        assert result.time_to_train_s == pytest.approx(2813 * result.step_time_s)
        assert result.throughput == pytest.approx(64 / result.step_time_s)
        for cost in result.cloud:  # the whole instance is rented: an 8-GPU node costs 8 GPU-hours per hour
            assert cost.usd_per_hour == pytest.approx(cost.usd_per_gpu_hour * cost.gpus_per_instance)
            assert cost.instances == 1 and cost.cost_usd == pytest.approx(result.time_to_train_s / 3600
                                                                          * cost.usd_per_hour)
        cheapest = result.cheapest()  # only instances of the job's size (one GPU) are rented for it
        assert cheapest is None or (cheapest.gpus_per_instance == 1 and cheapest.cost_usd == min(
            c.cost_usd for c in result.cloud if c.gpus_per_instance == 1))
    times = [r.time_to_train_s for r in estimate.by_time()]
    assert times == sorted(times) and len(times) == 5
    costs = [r.job_cost_usd() for r in estimate.by_cost()]
    assert costs == sorted(costs) and {r.id for r in estimate.by_cost()} == {"rtx-3090", "h100-sxm", "t4",
                                                                               "a100-sxm4-80gb"}
    front = estimate.pareto()
    assert front[0].id == estimate.by_cost()[0].id or front[0].time_to_train_s < estimate.by_cost()[0].time_to_train_s
    for r in estimate.by_cost():  # everything off the front is beaten on both by something on it
        if r not in front:
            assert any(f.time_to_train_s <= r.time_to_train_s and f.job_cost_usd() <= r.job_cost_usd() for f in front)
    assert estimate.results[0].id == estimate.by_time()[0].id


def test_gradient_accumulation_repeats_forward_and_backward(mlp_estimate) -> None:
    target = mlp_estimate.results[0].target
    trace = mlp_estimate.trace
    plain = step_time(trace, EstimateSettings(MemorySettings(64, "amp-bf16", "adamw"), Job(steps=1)), target)
    accumulated = step_time(trace, EstimateSettings(MemorySettings(256, "amp-bf16", "adamw", micro_batch=64),
                                                    Job(steps=1)), target)
    optimizer = sum(o.kernel_s + o.wait_s for o in plain.ops if o.phase == "optimizer")
    assert accumulated.step_s == pytest.approx(4 * (plain.step_s - optimizer) + optimizer, rel=0.02)


def test_json_has_the_product_schema(mlp_estimate) -> None:
    document = json.loads(json.dumps(mlp_estimate.to_dict()))
    assert set(document["model"]) >= {"name", "params", "forward_flops", "train_step_flops", "sample_unit"}
    assert set(document["settings"]) >= {"batch_size", "precision", "optimizer", "samples", "epochs"}
    result = document["results"][0]
    assert set(result) >= {"gpu_id", "gpu_name", "fits", "peak_memory_bytes", "memory", "max_batch_size",
                           "step_time_s", "throughput_samples_per_s", "time_to_train_s", "bound", "cloud",
                           "purchase_usd"}
    assert set(result["memory"]) == {"weights", "gradients", "optimizer", "activations", "overhead"}
    assert sum(result["memory"].values()) == result["peak_memory_bytes"]
    for offer in document["results"][1]["cloud"]:
        assert set(offer) >= {"provider", "instance", "usd_per_hour", "spot_usd_per_hour", "cost_usd"}
    # mlp 784-1024-1024-10 at batch 64: 2 x 64 x (784*1024 + 1024*1024 + 1024*10) = 238,288,896 for the
    # products (bias adds inside addmm are not counted) + 1 FLOP per element of the two ReLUs, 64 x 2048
    assert document["model"]["params"] == 1_863_690
    assert document["model"]["forward_flops"] == 2 * 64 * (784 * 1024 + 1024 * 1024 + 1024 * 10) + 64 * 2048


# ----------------------------------------------------------------------------- the command line


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_table_and_json(capsys) -> None:
    code, out, err = run_cli(capsys, "estimate", "mlp", "--gpu", "rtx-3090", "--gpu", "t4", "--steps", "1000")
    assert code == 0, err
    assert "job: 1,000 steps of 64 images (command line)" in out
    assert "rtx-3090" in out and "Fastest: rtx-3090" in out and "default" in out
    code, out, _ = run_cli(capsys, "estimate", "mlp", "--gpu", "t4", "--samples", "6400", "--epochs", "2", "--json")
    document = json.loads(out)
    assert code == 0 and document["settings"]["samples"] == 6400 and document["settings"]["epochs"] == 2
    assert document["results"][0]["steps"] == 200  # 12,800 / 64


def test_cli_default_job_comes_from_the_model_file(capsys) -> None:
    code, out, _ = run_cli(capsys, "estimate", "mlp", "--gpu", "t4")
    assert code == 0
    assert "60,000 images x 1 epoch = 938 steps of 64 (model file's TRAIN_SAMPLES)" in out


def test_cli_unknown_gpu_suggests_close_ids(capsys) -> None:
    code, _, err = run_cli(capsys, "estimate", "mlp", "--gpu", "rtx3090")
    assert code == 2
    assert "unknown GPU id 'rtx3090'" in err and "rtx-3090" in err
    assert len(err.strip().splitlines()) == 1


def test_cli_unknown_provider_suggests(capsys) -> None:
    code, _, err = run_cli(capsys, "estimate", "mlp", "--provider", "runpd")
    assert code == 2 and "unknown provider 'runpd'" in err and "runpod" in err


def test_cli_bad_precision_is_a_usage_error(capsys) -> None:
    assert main(["estimate", "mlp", "--precision", "fp4"]) == 2
    assert "invalid choice: 'fp4'" in capsys.readouterr().err


def test_cli_steps_and_samples_conflict(capsys) -> None:
    code, _, err = run_cli(capsys, "estimate", "mlp", "--steps", "10", "--samples", "100")
    assert code == 2 and "either --steps or --samples" in err


def test_cli_model_that_fits_nowhere(capsys) -> None:
    # 2^20 MNIST images of 784 fp32 values: the input alone is 3.3 GB, with the activations 19.5 GiB
    code, out, err = run_cli(capsys, "estimate", "mlp", "--batch-size", "1048576", "--gpu", "rtx-3060",
                             "--gpu", "t4", "--plans", "never")
    assert code == 2
    assert "does not fit on any of the 2 devices at batch 1048576" in err
    assert "--batch-size" in err and "(on t4)" in err
    assert len(err.strip().splitlines()) == 1
    assert "Does not fit: 2 of 2 devices" in out and "GiB short" in out  # the table still shows what is missing


def test_cli_local_cpu_calibrates_once_then_reuses(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steady_local_cpu(monkeypatch, tmp_path, TINY_SUITE)
    code, out, err = run_cli(capsys, "estimate", "mlp", "--local", "--gpu", "t4", "--json")
    assert code == 0, err
    assert "no usable calibration of cpu (none stored): measuring a quick one" in err
    local = json.loads(out)["results"]
    cpu = next(r for r in local if r["gpu_id"] == "local-cpu")
    assert cpu["calibration"] == "measured" and cpu["step_time_s"] > 0
    assert cpu["memory"]["overhead"] == 0  # no CUDA context, workspace or caching allocator on a CPU
    code, out, err = run_cli(capsys, "estimate", "mlp", "--local", "--gpu", "t4", "--json")
    assert code == 0 and "measuring" not in err
    again = next(r for r in json.loads(out)["results"] if r["gpu_id"] == "local-cpu")
    assert again["step_time_s"] == cpu["step_time_s"]  # the same stored profile, the same trace


def test_a_one_gpu_job_is_not_priced_on_a_share_of_a_multi_gpu_node(mlp_estimate) -> None:
    # h100-sxm: lambda rents 8x nodes at 2.99 USD/GPU-hour, runpod 1x at 2.99: the job is priced on the 1x
    h100 = mlp_estimate.result("h100-sxm")
    assert h100.cheapest().gpus_per_instance == 1
    hours = h100.time_to_train_s / 3600
    eight = next(c for c in h100.cloud if c.gpus_per_instance == 8 and c.provider == "lambda")
    assert eight.cost_usd == pytest.approx(hours * 2.99 * 8)  # listed as what renting the node costs
    assert h100.job_cost_usd() == pytest.approx(hours * 2.99)


def test_a_gpu_offered_only_in_larger_instances_says_so() -> None:
    db = load_hwdb([])
    model = load_model_file("mlp")
    settings = EstimateSettings(MemorySettings(64, "fp32", "adamw"), Job(samples=60_000, epochs=1))
    estimate = estimate_model(model, db, database_targets(db, [db.gpu("rtx-4090")], load_families(db)), settings)
    result = estimate.result("rtx-4090")  # the database holds RunPod's 8x RTX 4090 row only
    assert result.cloud and result.cheapest() is None and result.job_cost_usd() is None
    assert result.no_offer_reason() == "no 1-GPU offer" and estimate.by_cost() == []


def test_spot_is_shown_only_where_it_saves(mlp_estimate) -> None:
    for result in mlp_estimate.fitting:
        saving, on_demand = result.spot_saving_cost_usd(), result.job_cost_usd()
        assert saving is None or on_demand is None or saving < on_demand


def test_a_purchase_budget_names_the_fastest_card_it_buys(mlp_estimate) -> None:
    # rtx-3090 (1,499 USD) and rtx-5090 (1,999 USD) are for sale among the five; the best value may be
    # either, but within 2,000 USD the faster of the two is named, within 1,500 USD only the 3090 is left
    within_2000 = mlp_estimate.fastest_to_buy_within(2000)
    buyable = [r for r in mlp_estimate.fitting if r.owning is not None and r.owning.purchase_usd <= 2000]
    assert within_2000 is min(buyable, key=lambda r: r.time_to_train_s)
    assert mlp_estimate.fastest_to_buy_within(1500).id == "rtx-3090"
    assert mlp_estimate.fastest_to_buy_within(10) is None


def test_goals_are_summary_lines(capsys) -> None:
    code, out, err = run_cli(capsys, "estimate", "mlp", "--gpu", "rtx-3090", "--gpu", "t4", "--budget-usd", "5",
                             "--deadline-hours", "1", "--max-price-usd", "1000")
    assert code == 0, err
    assert "Fastest within 5.00 USD: " in out and "Cheapest done within 1.0 h: " in out
    assert "Fastest card within 1,000 USD: no card the model fits on costs that little" in out


def test_many_micro_batches_are_timed_as_the_op_by_op_sum() -> None:
    """estimate_accumulated times 4 micro-batches op by op and lets the last stand for the rest: the same
    step time, to rounding, as timing all 12 in order (and a step of 2^20 micro-batches costs no more)."""
    from advisor.calibration.reference import load_families
    from advisor.estimate.step import estimate_accumulated, estimate_records
    from advisor.estimate.targets import database_targets
    from advisor.profile.model_file import load_model_file
    from advisor.profile.trace import trace_training_step

    db = load_hwdb()
    model = load_model_file("mlp")
    trace = trace_training_step(model.build_model, model.example_input, 4, "fp32", "adamw", accumulate_gradients=True)
    micro = [r for r in trace.records if r.phase != "optimizer"]
    optimizer = [r for r in trace.records if r.phase == "optimizer"]
    target = database_targets(db, [db.gpu("t4")], load_families(db))[0]
    full = estimate_records(tuple(micro) * 12 + tuple(optimizer), "fp32", target.device)
    fast = estimate_accumulated(micro, optimizer, 12, "fp32", target.device)
    assert fast.step_s == pytest.approx(full.step_s, rel=1e-9)
    assert fast.by_bound == pytest.approx(full.by_bound, rel=1e-9)
    assert sum(op.flops for op in fast.ops) == pytest.approx(sum(op.flops for op in full.ops), rel=1e-12)
    huge = estimate_accumulated(micro, optimizer, 2**20, "fp32", target.device)
    assert len(huge.ops) == len(fast.ops)


VGG16_FILE = '''
import sys
from pathlib import Path

import torch

sys.path.insert(0, {benchmarks!r})
from zoo import VGG16


def build_model():
    return VGG16()


def example_input(batch_size):
    return torch.randn(batch_size, 3, 224, 224)
'''


def test_cli_says_which_gpus_hold_the_step_only_with_allocator_flushes(capsys, tmp_path) -> None:
    # VGG-16 at batch 256 in fp32 (NikolasEnt 2022 trained it so on 24 GB cards): its reserve unhindered is
    # ~30.7 GiB for ~19.1 GiB allocated; on the RTX 3090 it fits with cache flushes, on the 40 GB A100 without
    from pathlib import Path

    model = tmp_path / "vgg16.py"
    model.write_text(VGG16_FILE.format(benchmarks=str(Path(__file__).resolve().parents[1] / "benchmarks")))
    argv = ("estimate", str(model), "--gpu", "rtx-3090", "--gpu", "a100-sxm4-40gb", "--batch-size", "256",
            "--precision", "fp32", "--optimizer", "momentum", "--plans", "never", "--no-input-pipeline")
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    results = {r["gpu_id"]: r for r in json.loads(out)["results"]}
    assert results["rtx-3090"]["fits"] and results["rtx-3090"]["allocator_flushes"] > 0
    assert results["rtx-3090"]["peak_memory_bytes"] <= results["rtx-3090"]["memory_capacity_bytes"]
    assert results["a100-sxm4-40gb"]["fits"] and results["a100-sxm4-40gb"]["allocator_flushes"] == 0
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0 and "Tight fit: rtx-3090 holds the step only because PyTorch's caching allocator" in out
    assert "a100-sxm4-40gb holds" not in out
    from advisor.present.format import tight_fit_line
    assert tight_fit_line(["rtx-3090", "rtx-4090"]).startswith("Tight fit: rtx-3090, rtx-4090 hold the step only")
    assert tight_fit_line([]) == ""
