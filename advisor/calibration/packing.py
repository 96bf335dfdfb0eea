"""The packing cost of a CPU GEMM, fitted beside its efficiency curve (issue #20).

A CPU BLAS (oneDNN, MKL, OpenBLAS: GotoBLAS's design) copies the second operand, K x N, into a packed
panel layout before its micro-kernel runs, and reuses each packed element once per row of the first
operand. The copy is a serial, memory-bound phase whose cost grows with K x N alone, so a GEMM with few
rows (M: the batch of a Linear layer) runs well below a square GEMM of the same FLOPs. Measured at rest
on a 2-core EPYC VM, cold operands, 1024 x 1024 second operand, fp32 (GFLOP/s):

    M      1024  512  256  128   64   32   16    8
    rate    202  190  171  143  123   ..   ..   ..   (fast hour)
    rate    119  118  113  104   89   68   45   27   (slow hour: compute slower, packing not)

Both rows follow t = FLOPs / R + K x N x itemsize / P: the pack bandwidth P (about 8 GB/s here) stays
while R halves, so the rows at which a GEMM reaches half speed (P-independent form M_half = R x
itemsize / (2 P)) fell from 55 to 22. One efficiency curve over FLOPs cannot hold both a
64x1024x1024 and a 256x256x256 call (1.1 ms and 0.2 ms, the first slower per FLOP); the pack term can.

The fit: for each pack bandwidth on a grid, subtract the packing time from every measured call, fit
the saturating curve to what is left, and keep the pack bandwidth whose total times match best. It is
kept only where the suite measured a thin case (rows at most 1/8 of the other sides) and it lowers the
rms error clearly; otherwise the series has no pack term, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from advisor.calibration.curves import Fit, fit_curve

PACK_BANDWIDTHS_BYTES_PER_S = tuple(float(b) for b in np.geomspace(0.5e9, 512e9, 31))
"""Candidate pack bandwidths: 0.5 GB/s to 512 GB/s, 31 steps (each 26% above the last)."""
THIN_RATIO = 8
"""A GEMM is thin when its rows are at most 1/THIN_RATIO of both its other sides (64x1024x1024)."""
MIN_IMPROVEMENT = 0.75
"""The pack term is kept only if it brings the rms log error to at most this fraction of the plain fit's..."""
MIN_IMPROVEMENT_ABS = 0.01
"""...and lowers it by at least this much (0.01: about one percentage point)."""
MIN_REMAINDER = 0.2
"""A candidate may not explain more than 1 - MIN_REMAINDER of any call's time by packing."""


def is_thin(size: tuple[int, int, int]) -> bool:
    """Whether an (m, n, k) GEMM case has few rows against both its other sides."""
    m, n, k = size
    return m * THIN_RATIO <= min(n, k)


def fit_gemm(sizes: Sequence[tuple[int, int, int]], flops: Sequence[float], seconds: Sequence[float],
             roofs: Sequence[float], works: Sequence[float], peak: float,
             itemsize: int) -> tuple[Fit, float | None]:
    """(fit, pack bandwidth in bytes/s or None) of a GEMM series measured at these (m, n, k) sizes.

    `roofs` are each call's attainable FLOP/s (the roofline), `works` the axis its curve is read on
    (runner.roofline_work of its FLOPs), `peak` the series' peak FLOP/s. The fit's residuals compare
    each call's whole predicted time, packing included, with the measured one."""
    plain = _fit(flops, seconds, roofs, works, peak, [0.0] * len(sizes))
    if not any(is_thin(size) for size in sizes):
        return plain, None
    best, best_bandwidth = plain, None
    for bandwidth in PACK_BANDWIDTHS_BYTES_PER_S:
        packing = [k * n * itemsize / bandwidth if m > 1 else 0.0 for m, n, k in sizes]
        if any(pack > (1 - MIN_REMAINDER) * t for pack, t in zip(packing, seconds)):
            continue
        candidate = _fit(flops, seconds, roofs, works, peak, packing)
        if candidate.rms_log_residual < best.rms_log_residual:
            best, best_bandwidth = candidate, bandwidth
    improved = (best.rms_log_residual <= MIN_IMPROVEMENT * plain.rms_log_residual
                and plain.rms_log_residual - best.rms_log_residual >= MIN_IMPROVEMENT_ABS)
    return (best, best_bandwidth) if improved else (plain, None)


def _fit(flops: Sequence[float], seconds: Sequence[float], roofs: Sequence[float], works: Sequence[float],
         peak: float, packing: Sequence[float]) -> Fit:
    """The saturating curve fitted to each call's time less its packing; residuals of whole times."""
    rest = [t - pack for t, pack in zip(seconds, packing)]
    fit = fit_curve("saturating", works, [f / t / roof for f, t, roof in zip(flops, rest, roofs)], peak)
    predicted = np.array([f / (roof * fit.curve.efficiency(work, peak)) + pack
                          for f, roof, work, pack in zip(flops, roofs, works, packing)])
    log_ratio = np.log(predicted / np.asarray(seconds, dtype=float))
    residuals = tuple(float(r) for r in np.expm1(log_ratio))  # measured / fitted fraction - 1
    return Fit(fit.curve, residuals, float(np.sqrt(np.mean(log_ratio**2))), fit.points)
