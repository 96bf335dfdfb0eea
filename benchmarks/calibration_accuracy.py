"""How well a calibration profile predicts ops it never measured, beside a bare roofline.

Calibrates this CPU (quick suite, or the full one with --full), then times held-out ops — shapes and
sizes that are not in calibration/suite.yaml — with plain perf_counter medians, and predicts each from
(a) the profile's fitted curves: seconds = work / (reference x fitted efficiency), the reference being
the dtype's peak (compute ops, capped by intensity x sustained bandwidth) or the bandwidth (memory
ops); (b) a bare roofline: max(FLOPs / (75% of the theoretical peak), bytes / (75% of the sustained
bandwidth)), no calibration. Prints per op and the median and mean absolute percentage errors, and the
calibration's wall time beside a baseline measured in the same process: one traced ResNet-50 training
step (batch 32, fp32, AdamW on fake tensors: the work of `advisor profile resnet50 --no-fvcore`, timed
after one untimed trace so that first-call costs count for neither).

    python benchmarks/calibration_accuracy.py [--full] [--out benchmarks/results/calibration_accuracy.txt]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from printed import print_report

from advisor.calibration.profile import CalibrationProfile
from advisor.calibration.runner import calibrate, cold_bytes, cpu_target, roofline
from advisor.calibration.suite import COMPUTE_OPS, Case, case_cost, load_suite
from advisor.calibration.timing import CPUClock, measure

BARE_EFFICIENCY = 0.75

HELD_OUT = [
    Case("gemm", "fp32", (300, 300, 300)),
    Case("gemm", "fp32", (768, 3072, 768)),
    Case("gemm", "fp32", (2000, 500, 1000)),
    Case("gemm", "fp32", (128, 4096, 512)),
    Case("gemm", "fp32", (48, 48, 48)),
    Case("gemm", "bf16", (768, 768, 768)),
    Case("gemm", "bf16", (512, 2048, 512)),
    Case("conv", "fp32", (1, 128, 128, 28, 3, 1, 1)),
    Case("conv", "fp32", (2, 64, 128, 56, 3, 2, 1)),
    Case("conv", "fp32", (1, 512, 2048, 7, 1, 1, 1)),
    Case("conv", "bf16", (2, 128, 128, 28, 3, 1, 1)),
    Case("conv_backward", "fp32", (1, 128, 128, 28, 3, 1, 1)),
    Case("copy", "fp32", (3 * 2**20,)),
    Case("copy", "fp32", (48 * 2**20,)),
    Case("copy", "fp32", (192 * 2**20,)),
    Case("triad", "fp32", (12 * 2**20,)),
    Case("reduction", "fp32", (96 * 2**20,)),
    Case("add", "fp32", (2 * 2**20,)),
    Case("add", "fp32", (96 * 2**20,)),
    Case("gelu", "fp32", (24 * 2**20,)),
    Case("layer_norm", "fp32", (12 * 2**20,)),
    Case("softmax", "bf16", (6 * 2**20,)),
]


def calibrated_seconds(profile: CalibrationProfile, case: Case, flops: float, nbytes: int) -> float:
    series = profile.get(case.op, case.dtype)
    assert series is not None, case.series
    if case.op in COMPUTE_OPS:
        roof = roofline(series.peak, flops / nbytes, profile.sustained_bandwidth_bytes_per_s)
        return flops / (roof * series.efficiency(flops))
    return nbytes / (series.peak * series.efficiency(nbytes))


def bare_seconds(profile: CalibrationProfile, case: Case, flops: float, nbytes: int) -> float:
    peak = profile.peaks.flops.get(case.dtype, profile.peaks.flops["fp32"])
    return max(flops / (BARE_EFFICIENCY * peak), nbytes / (BARE_EFFICIENCY * profile.sustained_bandwidth_bytes_per_s))


def traced_step_seconds() -> float:
    """The baseline: seconds of one traced ResNet-50 training step in this process, after an untimed one."""
    from advisor.profile.model_file import load_model_file
    from advisor.profile.trace import trace_training_step

    model = load_model_file("resnet50")
    trace_training_step(model.build_model, model.example_input, 32, "fp32", "adamw", model.loss_fn)
    started = time.perf_counter()
    trace_training_step(model.build_model, model.example_input, 32, "fp32", "adamw", model.loss_fn)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true",
                        help="calibrate with the full suite (more sizes, longer samples)")
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args()
    suite = load_suite()
    target = cpu_target(suite)
    started = time.perf_counter()
    profile = calibrate(target, suite, quick=not args.full)
    calibration_s = time.perf_counter() - started
    baseline_s = traced_step_seconds()
    timing = suite.timing_for("cpu", quick=False)
    lines = [
        f"Calibration accuracy on held-out ops, {time.strftime('%Y-%m-%d')}: {profile.device_name}, "
        f"torch {torch.__version__}",
        f"{'full' if args.full else 'quick'} calibration took {calibration_s:.1f} s, {calibration_s / baseline_s:.1f}x "
        f"the baseline in this process: one traced ResNet-50 training step (batch 32, fp32, AdamW), {baseline_s:.2f} s",
        f"each held-out op timed with perf_counter, median of >= {timing.min_samples} samples over >= "
        f"{timing.min_time_s} s, its operands out of the caches as the suite's (copies rotated over "
        f"{cold_bytes(target) / 2**20:.0f} MiB)",
        "",
        f"{'op':15s} {'dtype':5s} {'shape':28s} {'measured':>10s} {'calibrated':>10s} {'error':>7s} "
        f"{'bare roof':>10s} {'error':>7s}",
    ]
    ours, bare = [], []
    for case in HELD_OUT:
        cost = case_cost(case)
        with torch.no_grad():
            sample = measure(case.build("cpu", cold_bytes(target)), CPUClock(), timing)
        predicted = calibrated_seconds(profile, case, cost.flops, cost.bytes)
        baseline = bare_seconds(profile, case, cost.flops, cost.bytes)
        error, bare_error = predicted / sample.seconds - 1, baseline / sample.seconds - 1
        ours.append(abs(error))
        bare.append(abs(bare_error))
        lines.append(f"{case.op:15s} {case.dtype:5s} {case.label:28s} {sample.seconds * 1e6:8.1f}us "
                     f"{predicted * 1e6:8.1f}us {error:+7.1%} {baseline * 1e6:8.1f}us {bare_error:+7.1%}")
    lines += [
        "",
        f"calibrated: median |error| {statistics.median(ours):.1%}, mean {statistics.mean(ours):.1%} "
        f"over {len(ours)} held-out ops",
        f"bare roofline ({BARE_EFFICIENCY:.0%} of theoretical peak and of sustained bandwidth): median |error| "
        f"{statistics.median(bare):.1%}, mean {statistics.mean(bare):.1%}",
        f"ratio of medians (bare / calibrated): {statistics.median(bare) / statistics.median(ours):.1f}x",
    ]
    print_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
