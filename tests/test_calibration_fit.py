"""Efficiency curves and the CPU's theoretical peak: synthetic data with known parameters, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from advisor.calibration.curves import Curve, fit_curve
from advisor.calibration.peaks import cpu_peaks
from advisor.probe.cpu import CPUInfo, parse_cache_size, parse_cpuinfo


def test_saturating_curve_by_hand() -> None:
    curve = Curve.saturating(e_max=0.5, tau_half_s=1e-3, alpha=1.0)
    # work 1e9 FLOPs at peak 1e12 FLOP/s: tau = 1 ms; f = 0.5 / (1 + 1 ms / 1 ms) = 0.25
    assert curve.efficiency(1e9, 1e12) == pytest.approx(0.25)
    # seconds = work / (peak f) = 1e9 / 2.5e11 = 4 ms = (tau + tau_half) / e_max
    assert curve.seconds(1e9, 1e12) == pytest.approx(4e-3)


def test_hierarchy_curve_by_hand() -> None:
    curve = Curve.hierarchy(e_far=0.8, e_near=3.0, capacity_bytes=32e6, tau_half_s=0.0, sharpness=2.0)
    # at the capacity the level is halfway: 0.8 + (3.0 - 0.8) / (1 + 1) = 1.9
    assert curve.efficiency(32e6, 40e9) == pytest.approx(1.9)
    # 320 MB: 0.8 + 2.2 / (1 + 100) = 0.82178...
    assert curve.efficiency(320e6, 40e9) == pytest.approx(0.8 + 2.2 / 101)


def test_fit_recovers_known_saturating_parameters() -> None:
    peak = 200e9
    truth = Curve.saturating(0.8, 20e-6, 1.3)
    work = np.geomspace(1e5, 2e10, 12)
    fit = fit_curve("saturating", work, [truth.efficiency(w, peak) for w in work], peak)
    assert fit.curve.param("e_max") == pytest.approx(0.8, rel=1e-4)
    assert fit.curve.param("tau_half_s") == pytest.approx(20e-6, rel=1e-3)
    assert fit.curve.param("alpha") == pytest.approx(1.3, rel=1e-3)
    assert fit.rms_log_residual < 1e-6 and fit.points == 12


def test_fit_with_noise_keeps_residuals_of_the_noise() -> None:
    peak = 200e9
    truth = Curve.saturating(0.8, 20e-6, 1.3)
    work = np.geomspace(1e5, 2e10, 16)
    noise = np.exp(np.random.default_rng(0).normal(0.0, 0.03, len(work)))  # 3% log-normal, seeded
    measured = [truth.efficiency(w, peak) * n for w, n in zip(work, noise)]
    fit = fit_curve("saturating", work, measured, peak)
    assert fit.curve.param("e_max") == pytest.approx(0.8, rel=0.03)
    assert fit.curve.param("tau_half_s") == pytest.approx(20e-6, rel=0.15)
    assert 0.01 < fit.rms_log_residual < 0.05
    # residuals are measured / fitted - 1, in the caller's order
    for w, m, r in zip(work, measured, fit.residuals):
        assert m / fit.curve.efficiency(w, peak) - 1 == pytest.approx(r, abs=1e-9)


def test_fit_recovers_known_cache_step() -> None:
    bandwidth = 40e9
    truth = Curve.hierarchy(0.9, 3.0, 32e6, 1e-6, sharpness=3.0)
    work = np.geomspace(6e4, 1e9, 14)
    fit = fit_curve("hierarchy", work, [truth.efficiency(w, bandwidth) for w in work], bandwidth, capacity_guess=16e6)
    for name, value in truth.params:
        assert fit.curve.param(name) == pytest.approx(value, rel=1e-3), name


def test_two_points_fix_alpha_to_one_by_hand() -> None:
    # peak 1e11 FLOP/s, e_max 0.8, tau_half 10 us: 1e6 FLOPs (tau 10 us) run at 0.8 / 2 = 0.4,
    # 1e7 FLOPs (tau 100 us) at 0.8 / 1.1 = 0.72727...
    fit = fit_curve("saturating", [1e6, 1e7], [0.4, 0.8 / 1.1], 1e11)
    assert fit.curve.param("alpha") == 1.0
    assert fit.curve.param("e_max") == pytest.approx(0.8, rel=1e-6)
    assert fit.curve.param("tau_half_s") == pytest.approx(1e-5, rel=1e-6)


def test_one_point_is_a_flat_curve() -> None:
    fit = fit_curve("saturating", [1e9], [0.6], 1e12)
    assert fit.curve.efficiency(1e3, 1e12) == fit.curve.efficiency(1e15, 1e12) == pytest.approx(0.6)


def test_asymptote_stays_near_the_best_point() -> None:
    # convolutions of one size but different shapes: the size says nothing about the asymptote
    fit = fit_curve("saturating", [2.0e8, 2.1e8, 2.2e8, 2.3e8, 2.4e8], [0.5, 0.9, 0.6, 0.8, 0.7], 1e11)
    assert fit.curve.param("e_max") <= 0.9 * 1.15 + 1e-9


@pytest.mark.parametrize("data, message", [
    ({"kind": "cubic"}, "unknown curve kind"),
    ({"kind": "saturating", "e_max": 0.8, "tau_half_s": 1e-6}, "needs alpha"),
    ({"kind": "saturating", "e_max": -1, "tau_half_s": 1e-6, "alpha": 1}, "not negative"),
    ({"kind": "saturating", "e_max": 1, "tau_half_s": 1e-6, "alpha": 1, "beta": 2}, "unknown key 'beta'"),
])
def test_curve_from_dict_rejects_bad_data(data: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Curve.from_dict(data)


def test_curve_round_trips_through_dict() -> None:
    curve = Curve.hierarchy(0.9, 3.0, 32e6, 1e-6, sharpness=2.5)
    assert Curve.from_dict(curve.to_dict()) == curve


def _cpu(extensions: tuple[str, ...], cores: int, clock_hz: float, vendor: str, family: int) -> CPUInfo:
    return CPUInfo("test CPU", "x86_64", cores, cores, cores, clock_hz, extensions, None, None, vendor, family)


def test_zen4_peak_by_hand() -> None:
    # Zen 4: AVX-512 on two 256-bit FMA pipes = 2 x 8 lanes x 2 FLOPs = 32 FLOP/cycle per core
    peaks = cpu_peaks(_cpu(("avx", "avx2", "fma", "avx512f", "avx512_bf16"), 2, 2.6e9, "AuthenticAMD", 25))
    assert peaks.flops["fp32"] == pytest.approx(2 * 2.6e9 * 32)  # 166.4 GFLOP/s
    assert peaks.flops["bf16"] == pytest.approx(2 * 2 * 2.6e9 * 32)  # AVX512_BF16 dot products: twice
    assert peaks.flops["fp16"] == peaks.flops["fp32"]  # no AVX512_FP16
    assert "tf32" not in peaks.flops and peaks.bandwidth_bytes_per_s is None


def test_intel_avx512_and_amx_peaks_by_hand() -> None:
    # two 512-bit FMA units: 2 x 16 lanes x 2 = 64 FLOP/cycle; AMX bf16: 1024 FLOP/cycle per core
    peaks = cpu_peaks(_cpu(("avx2", "fma", "avx512f", "amx_bf16", "avx512_fp16"), 4, 3.0e9, "GenuineIntel", 6))
    assert peaks.flops["fp32"] == pytest.approx(4 * 3.0e9 * 64)
    assert peaks.flops["bf16"] == pytest.approx(4 * 3.0e9 * 1024)
    assert peaks.flops["fp16"] == pytest.approx(2 * 4 * 3.0e9 * 64)


def test_avx2_peak_by_hand() -> None:
    # two 256-bit FMA units: 2 x 8 x 2 = 32 FLOP/cycle; no bf16 unit: fp32's rate
    peaks = cpu_peaks(_cpu(("avx", "avx2", "fma"), 8, 3.5e9, "GenuineIntel", 6))
    assert peaks.flops["fp32"] == pytest.approx(8 * 3.5e9 * 32)
    assert peaks.flops["bf16"] == peaks.flops["fp32"]


def test_cpuinfo_vendor_family_and_cache_size() -> None:
    info = parse_cpuinfo("vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel name\t: AMD EPYC\n")
    assert (info["vendor"], info["family"]) == ("AuthenticAMD", 25)
    assert parse_cache_size("32768K\n") == 32 * 1024 * 1024
    assert parse_cache_size("1M") == 1024 * 1024
    assert parse_cache_size("big") is None
