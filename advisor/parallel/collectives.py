"""Collectives over the links between GPUs, as NCCL's ring algorithms run them. Bytes, seconds.

In a ring of p ranks, all-reduce of S bytes sends 2 (p - 1) / p x S bytes from each rank (a
reduce-scatter, then an all-gather); all-gather and reduce-scatter of S bytes in total (the gathered
tensor, the scattered input) send (p - 1) / p x S. nccl-tests' bus bandwidth is exactly those bytes over
the time, so a collective takes bus_bytes / busbw(S) with busbw the link's measured curve
(hwdb/interconnects.yaml):

    busbw(S) = peak / (1 + (half / S)^k)

latency-bound for small messages, reaching `peak` for large ones; k = 1 is latency + bytes / bandwidth.
peak, half and k are fitted (scipy.optimize.curve_fit, relative errors) to the class's measured sizes;
with two, k = 1 through both; with one (or where the entry gives half_bandwidth_mib), k = 1 and that
`half`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy
from scipy.optimize import curve_fit

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

    def log_busbw(size: Any, log_peak: float, log_half: float, exponent: float) -> Any:
        return log_peak - numpy.log1p(numpy.exp(exponent * (log_half - numpy.log(size))))

    start = [math.log(top * 1.05), math.log(float(numpy.median(sizes))), 1.0]
    bounds = ([math.log(top * 0.9), math.log(1e3), 0.3], [math.log(top * 3), math.log(1e12), 3.0])
    (log_peak, log_half, exponent), _ = curve_fit(log_busbw, sizes, measured, p0=start, bounds=bounds)
    return BandwidthCurve(math.exp(log_peak), math.exp(log_half), float(exponent))
