"""Collectives over the links between GPUs, as NCCL's ring algorithms run them. Bytes, seconds.

In a ring of p ranks, all-reduce of S bytes sends 2 (p - 1) / p x S bytes from each rank (a
reduce-scatter, then an all-gather); all-gather and reduce-scatter of S bytes in total (the gathered
tensor, the scattered input) send (p - 1) / p x S. nccl-tests' bus bandwidth is exactly those bytes over
the time, so a collective takes bus_bytes / busbw(S) with busbw the link's measured curve
(hwdb/interconnects.yaml):

    busbw(S) = peak / (1 + (half / S)^k)

latency-bound for small messages, reaching `peak` for large ones; k = 1 is latency + bytes / bandwidth.
peak, half and k are fitted (least squares in log space: relative errors; Levenberg-Marquardt within bounds,
as scipy's curve_fit finds them, without importing scipy.optimize: 0.3 s of every multi-GPU estimate) to the
class's measured sizes; with two, k = 1 through both; with one (or where the entry gives half_bandwidth_mib), k = 1 and that
`half`.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy

from advisor.hardware.specs import Interconnect

BUS_SHARE: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda ranks: 2.0 * (ranks - 1) / ranks,
    "all_gather": lambda ranks: (ranks - 1) / ranks,
    "reduce_scatter": lambda ranks: (ranks - 1) / ranks,
    "broadcast": lambda ranks: 1.0 if ranks > 1 else 0.0,  # nccl-tests: broadcast's busbw is its algbw
}
"""Bus bytes each rank sends per byte of message, over `ranks` ranks."""


@dataclass(frozen=True)
class BandwidthCurve:
    """busbw(S) = peak / (1 + (half / S)^exponent). Bytes per second, bytes."""

    peak_bytes_per_s: float
    half_bytes: float
    exponent: float

    def busbw(self, message_bytes: float) -> float:
        """Bus bandwidth (bytes/s) for a message of `message_bytes`.

        # peak 200 GB/s, half 16 MiB, k = 1: a 16 MiB message gets 100 GB/s, 1 GiB 200 / (1 + 1/64) = 196.9
        """
        assert message_bytes > 0, message_bytes
        return self.peak_bytes_per_s / (1.0 + (self.half_bytes / message_bytes) ** self.exponent)

    def to_dict(self) -> dict[str, Any]:
        return {"peak_bytes_per_s": self.peak_bytes_per_s, "half_bytes": self.half_bytes, "exponent": self.exponent}


def bus_bytes(kind: str, message_bytes: float, ranks: int) -> float:
    """Bytes each rank sends in a ring `kind` of a `message_bytes` message over `ranks` ranks.

    # all-reduce of 1 GB over 8 ranks: 2 x 7/8 x 1 GB = 1.75 GB; all-gather of 1 GB: 7/8 GB; broadcast: 1 GB
    """
    assert kind in BUS_SHARE, kind
    assert ranks >= 1, ranks
    return BUS_SHARE[kind](ranks) * message_bytes


def collective_s(kind: str, message_bytes: float, ranks: int, curve: BandwidthCurve) -> float:
    """Seconds of one `kind` collective of `message_bytes` over `ranks` ranks on a link with `curve`
    (0 for one rank or an empty message)."""
    if ranks == 1 or message_bytes <= 0:
        return 0.0
    return bus_bytes(kind, message_bytes, ranks) / curve.busbw(message_bytes)


FIT_ITERATIONS = 200
"""Most Levenberg-Marquardt steps of a curve's fit (the database's links converge in under 20)."""


@functools.lru_cache(maxsize=None)
def fitted_curve(link: Interconnect) -> BandwidthCurve:
    """`link`'s bandwidth curve through its measured sizes (see the module)."""
    sizes = numpy.array([size for size, _ in link.busbw_points])
    measured = numpy.log([busbw for _, busbw in link.busbw_points])
    top = float(numpy.exp(measured.max()))
    if link.half_bandwidth_bytes is not None:
        half = link.half_bandwidth_bytes
        # k = 1: each point says peak = busbw x (1 + half / S); their geometric mean in log space
        peak = float(numpy.exp(numpy.mean(measured + numpy.log1p(half / sizes))))
        return BandwidthCurve(peak, half, 1.0)
    if len(sizes) == 2:
        # k = 1 through both: b1 (1 + h / s1) = b2 (1 + h / s2)
        (s1, b1), (s2, b2) = link.busbw_points
        half = max((b2 - b1) / (b1 / s1 - b2 / s2), 0.0)
        return BandwidthCurve(b1 * (1 + half / s1), half, 1.0)

    start = numpy.array([math.log(top * 1.05), math.log(statistics.median(size for size, _ in link.busbw_points)), 1.0])
    lower = numpy.array([math.log(top * 0.9), math.log(1e3), 0.3])
    upper = numpy.array([math.log(top * 3), math.log(1e12), 3.0])
    log_peak, log_half, exponent = _fit_in_box(numpy.log(sizes), measured, start, lower, upper)
    return BandwidthCurve(math.exp(log_peak), math.exp(log_half), float(exponent))


def _log_busbw(log_size: numpy.ndarray, p: numpy.ndarray) -> numpy.ndarray:
    """log busbw at each log size for p = (log peak, log half, exponent): log peak - log(1 + (half / S)^k)."""
    return p[0] - numpy.logaddexp(0.0, p[2] * (p[1] - log_size))


def _jacobian(log_size: numpy.ndarray, p: numpy.ndarray) -> numpy.ndarray:
    """d _log_busbw / d p, one row per size."""
    share = 1.0 / (1.0 + numpy.exp(-p[2] * (p[1] - log_size)))  # d log(1 + e^z) / dz
    return numpy.stack([numpy.ones_like(log_size), -share * p[2], -share * (p[1] - log_size)], axis=1)


def _fit_in_box(log_size: numpy.ndarray, measured: numpy.ndarray, start: numpy.ndarray, lower: numpy.ndarray,
                upper: numpy.ndarray) -> numpy.ndarray:
    """The parameters within [lower, upper] that minimise the squared residuals of _log_busbw against
    `measured`: Levenberg-Marquardt steps (Marquardt's diagonal scaling), each clipped to the bounds and
    taken only where it lowers the residuals. On the database's links it lands within 1e-6 (relative)
    of scipy.optimize.curve_fit's trust-region fit."""
    p = numpy.clip(start, lower, upper)
    residuals = measured - _log_busbw(log_size, p)
    cost, damping = float(residuals @ residuals), 1e-3
    for _ in range(FIT_ITERATIONS):
        jacobian = _jacobian(log_size, p)
        normal, gradient = jacobian.T @ jacobian, jacobian.T @ residuals
        while True:
            step = numpy.linalg.solve(normal + damping * numpy.diag(numpy.diag(normal) + 1e-12), gradient)
            trial = numpy.clip(p + step, lower, upper)
            trial_residuals = measured - _log_busbw(log_size, trial)
            trial_cost = float(trial_residuals @ trial_residuals)
            if trial_cost < cost:
                damping = max(damping / 3, 1e-12)
                break
            damping *= 4
            if damping > 1e12:  # no step lowers the residuals: a minimum
                return p
        converged = cost - trial_cost <= 1e-15 * cost or float(numpy.max(numpy.abs(trial - p))) < 1e-12
        p, residuals, cost = trial, trial_residuals, trial_cost
        if converged:
            break
    return p
