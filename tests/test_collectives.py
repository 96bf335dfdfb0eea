"""Collectives over the links between GPUs (issue #25): ring bytes per rank, the bandwidth curves
fitted to the published nccl-tests measurements (hwdb/interconnects.yaml), and their validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from advisor.hardware.loader import HwdbError, load_directories, load_hwdb
from advisor.hardware.specs import HardwareDB, Interconnect
from advisor.parallel.collectives import BandwidthCurve, bus_bytes, collective_s, fitted_curve
from tests.conftest import write_yaml

MIB = 2**20


@pytest.fixture(scope="module")
def db() -> HardwareDB:
    return load_hwdb(include_user_layers=False)


def test_ring_bytes_per_rank() -> None:
    # all-reduce of 1 GB over 8 ranks: 2 x 7/8 x 1e9 = 1.75e9 bytes from each rank
    assert bus_bytes("all_reduce", 1e9, 8) == pytest.approx(1.75e9)
    # all-gather and reduce-scatter of 1 GB in total: 7/8 x 1e9; over 2 ranks half of it
    assert bus_bytes("all_gather", 1e9, 8) == pytest.approx(0.875e9)
    assert bus_bytes("reduce_scatter", 1e9, 2) == pytest.approx(0.5e9)
    # one rank sends nothing and takes no time
    assert bus_bytes("all_reduce", 1e9, 1) == 0 and collective_s("all_reduce", 1e9, 1, BandwidthCurve(1e9, 1, 1)) == 0


def test_the_curve_is_latency_bound_small_and_bandwidth_bound_large() -> None:
    curve = BandwidthCurve(200e9, 16 * MIB, 1.0)
    # at the half size, half the peak; 1 GiB: 200 / (1 + 16/1024) = 196.9 GB/s
    assert curve.busbw(16 * MIB) == pytest.approx(100e9)
    assert curve.busbw(1024 * MIB) == pytest.approx(200e9 / (1 + 1 / 64))
    # k = 1 is latency + bytes / peak: an all-reduce of 16 MiB over 8 ranks, 2 x 7/8 x 16 MiB = 29.36 MB
    # at 100 GB/s: 293.6 us = (29.36 MB / 200 GB/s = 146.8 us) + 146.8 us of latency
    assert collective_s("all_reduce", 16 * MIB, 8, curve) == pytest.approx(2 * 7 / 8 * 16 * MIB / 100e9)


def test_fitted_curves_pass_through_the_published_measurements(db: HardwareDB) -> None:
    assert len(db.interconnects) >= 8
    for link in db.interconnects:
        curve = fitted_curve(link)
        for size, measured in link.busbw_points:
            assert curve.busbw(size) == pytest.approx(measured, rel=0.05), (link.id, size)
        # more bandwidth for larger messages, never above the fitted peak
        sizes = [MIB * 2**k for k in range(0, 15)]
        rates = [curve.busbw(s) for s in sizes]
        assert rates == sorted(rates) and rates[-1] < curve.peak_bytes_per_s, link.id
    # 8x A100 over NVSwitch, from vTrain's 1 MB-1 GB and nccl #1048's 4 GB: about 236 GB/s at the top,
    # half of it near 13 MiB; p5's EFA between nodes 500 GB/s, half near 96 MiB
    a100 = fitted_curve(next(link for link in db.interconnects if link.id == "nvlink3-nvswitch"))
    assert 225e9 < a100.peak_bytes_per_s < 250e9 and 8 * MIB < a100.half_bytes < 20 * MIB


def test_three_or_more_sizes_fit_as_scipys_curve_fit_does(db: HardwareDB) -> None:
    # the same least squares in log space and bounds, solved by scipy's trust-region curve_fit
    import math

    import numpy
    from scipy.optimize import curve_fit

    def log_busbw(size, log_peak, log_half, exponent):
        return log_peak - numpy.log1p(numpy.exp(exponent * (log_half - numpy.log(size))))

    fitted = [link for link in db.interconnects if link.half_bandwidth_bytes is None and len(link.busbw_points) > 2]
    assert len(fitted) >= 3  # nvlink3-nvswitch, efa-400g, efa-3200g
    for link in fitted:
        sizes = numpy.array([size for size, _ in link.busbw_points])
        measured = numpy.log([busbw for _, busbw in link.busbw_points])
        top = float(numpy.exp(measured.max()))
        start = [math.log(top * 1.05), math.log(float(numpy.median(sizes))), 1.0]
        bounds = ([math.log(top * 0.9), math.log(1e3), 0.3], [math.log(top * 3), math.log(1e12), 3.0])
        (log_peak, log_half, exponent), _ = curve_fit(log_busbw, sizes, measured, p0=start, bounds=bounds)
        curve = fitted_curve(link)
        assert curve.peak_bytes_per_s == pytest.approx(math.exp(log_peak), rel=1e-5), link.id
        assert curve.half_bytes == pytest.approx(math.exp(log_half), rel=1e-5), link.id
        assert curve.exponent == pytest.approx(exponent, rel=1e-5), link.id
        assert curve.exponent != 1.0  # a fit, not the two-point rule


def test_two_sizes_fix_latency_and_bandwidth() -> None:
    # 150 GB/s at 58 MiB and 370 GB/s at 8192 MiB with k = 1: b1 (1 + h / s1) = b2 (1 + h / s2)
    # h = (370 - 150) / (150 / 58 - 370 / 8192) MiB = 86.57 MiB; peak = 150 x (1 + 86.57 / 58) = 373.9 GB/s
    link = Interconnect("x", "x", "node", ((58 * MIB, 150e9), (8192 * MIB, 370e9)), None, ("S1",))
    curve = fitted_curve(link)
    assert curve.exponent == 1.0 and curve.half_bytes == pytest.approx(86.57 * MIB, rel=1e-3)
    assert curve.peak_bytes_per_s == pytest.approx(373.9e9, rel=1e-3)


INTERCONNECT = {"id": "bus", "name": "a bus", "scope": "node", "busbw_gbps_by_message_mib": {1024: 100},
                "half_bandwidth_mib": 13, "sources": ["S1"]}


def _error(directory: Path) -> str:
    with pytest.raises(HwdbError) as caught:
        load_directories([directory])
    return str(caught.value)


def test_interconnect_entries_are_checked(tiny_db_dir: Path) -> None:
    path = tiny_db_dir / "interconnects.yaml"
    write_yaml(path, {"interconnects": [INTERCONNECT]})
    link = load_directories([tiny_db_dir]).interconnects[0]
    # 1024 MiB -> bytes, 100 GB/s -> bytes/s
    assert link.busbw_points == ((1024 * MIB, 100e9),) and link.half_bandwidth_bytes == 13 * MIB
    # one size without the curve's shape; a scope that is neither node nor network; TB/s written as GB/s
    write_yaml(path, {"interconnects": [{**INTERCONNECT, "half_bandwidth_mib": None}]})
    assert "half_bandwidth_mib" in _error(tiny_db_dir) and "interconnects.yaml" in _error(tiny_db_dir)
    write_yaml(path, {"interconnects": [{**INTERCONNECT, "scope": "rack"}]})
    assert "'scope'" in _error(tiny_db_dir)
    write_yaml(path, {"interconnects": [{**INTERCONNECT, "busbw_gbps_by_message_mib": {1024: 1e6}}]})
    assert "plausible" in _error(tiny_db_dir)
    write_yaml(path, {"interconnects": [{**INTERCONNECT, "busbw_gbps_by_message_mib": []}]})
    assert "MiB" in _error(tiny_db_dir)
