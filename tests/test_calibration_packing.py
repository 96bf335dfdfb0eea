"""The packing term of CPU GEMMs (advisor/calibration/packing.py): recovered from synthetic timings that
follow t = FLOPs / rate + K x N x itemsize / pack bandwidth, and left out where nothing calls for it."""

from __future__ import annotations

import pytest

from advisor.calibration.packing import PACK_BANDWIDTHS_BYTES_PER_S, fit_gemm, is_thin
from advisor.calibration.profile import SeriesProfile

PEAK = 100e9
"""FLOP/s the synthetic GEMMs run at (50% of a 200 GFLOP/s peak), operands read from cache (no roofline)."""
SIZES = [(64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (1024, 1024, 64),
         (256, 3072, 768), (64, 1024, 1024), (128, 1024, 1024)]


def _timings(pack_bandwidth: float | None) -> tuple[list[float], list[float]]:
    flops = [2.0 * m * n * k for m, n, k in SIZES]
    packing = [0.0 if pack_bandwidth is None else k * n * 4 / pack_bandwidth for m, n, k in SIZES]
    return flops, [f / PEAK + p for f, p in zip(flops, packing)]


def _fit(sizes, flops, seconds):
    roofs = [2 * PEAK] * len(sizes)
    return fit_gemm(sizes, flops, seconds, roofs, flops, 2 * PEAK, 4)


def test_thin_means_few_rows_against_both_other_sides() -> None:
    assert is_thin((64, 1024, 1024))  # 64 * 8 = 512 <= 1024
    assert not is_thin((1024, 1024, 64))  # few columns of A, many rows
    assert not is_thin((64, 64, 64))


def test_the_pack_bandwidth_is_recovered_from_timings_that_pay_it() -> None:
    # 64x1024x1024: 134.2 MFLOP at 100 GFLOP/s = 1.342 ms, plus 1024*1024*4 B at 8 GB/s = 0.524 ms:
    # 39% of its time is packing, 4% of the 1024^3 GEMM's (0.524 of 21.5 ms)
    flops, seconds = _timings(8e9)
    fit, bandwidth = _fit(SIZES, flops, seconds)
    assert bandwidth == pytest.approx(8e9, rel=0.14)  # the grid's steps are 26% apart
    assert fit.rms_log_residual < 0.03
    assert fit.curve.param("e_max") == pytest.approx(0.5, rel=0.05)


def test_no_pack_term_without_a_thin_case_or_without_packing() -> None:
    flops, seconds = _timings(8e9)
    square = [i for i, size in enumerate(SIZES) if not is_thin(size)]
    fit, bandwidth = _fit([SIZES[i] for i in square], [flops[i] for i in square], [seconds[i] for i in square])
    assert bandwidth is None and fit.points == len(square)
    flops, seconds = _timings(None)
    _, bandwidth = _fit(SIZES, flops, seconds)
    assert bandwidth is None


def test_the_grid_spans_slow_and_fast_packing() -> None:
    assert PACK_BANDWIDTHS_BYTES_PER_S[0] == pytest.approx(0.5e9)
    assert PACK_BANDWIDTHS_BYTES_PER_S[-1] == pytest.approx(512e9)


def test_pack_seconds_by_hand_and_the_profile_round_trip() -> None:
    series = SeriesProfile.from_dict({**_series_dict(), "pack_bandwidth_bytes_per_s": 8e9})
    # bmm of 12 matrices 128x64x128 in bf16: 12 * 128 * 64 * 2 B = 196,608 B at 8 GB/s = 24.6 us
    assert series.pack_seconds((12, 128, 64, 128), 2) == pytest.approx(196_608 / 8e9)
    assert series.pack_seconds((1, 1, 1024, 1024), 4) == 0.0  # matrix-vector: not packed
    assert SeriesProfile.from_dict(series.to_dict()) == series
    assert SeriesProfile.from_dict(_series_dict()).pack_bandwidth_bytes_per_s is None  # stored before it existed


def _series_dict() -> dict:
    return {"op": "gemm", "dtype": "fp32", "axis": "flops", "peak": 2e11,
            "fit": {"curve": {"kind": "saturating", "e_max": 0.5, "tau_half_s": 0.0, "alpha": 1.0},
                    "residuals": [], "rms_log_residual": 0.0, "points": 0}}
