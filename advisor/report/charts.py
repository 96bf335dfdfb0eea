"""The report's charts, drawn with matplotlib into SVG text: time-to-train against cost with the Pareto
front, peak memory against each device's capacity, and buying against renting over training hours.

Deterministic output (fixed hash salt, no dates in the metadata), so the same estimate gives the same
SVG; text stays text (searchable, crisp at any zoom)."""

from __future__ import annotations

import io
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")  # no display: the report is written to files

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from advisor import units  # noqa: E402
from advisor.estimate.costs import SECONDS_PER_HOUR  # noqa: E402
from advisor.estimate.plan import DeviceEstimate, Estimate  # noqa: E402

FITS, SHORT, PARETO, GREY = "#2f6db5", "#c8423b", "#e08a1e", "#b9bec7"
BUY_VS_RENT_DEVICES = 4
"""Purchasable devices drawn in the buy-versus-rent chart (the best values to buy first)."""


def _plain(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:g}"


PLAIN = FuncFormatter(lambda value, _: _plain(value))
PLAIN_MINOR = FuncFormatter(lambda value, _: _plain(value) if f"{value:.1g}"[0] in "25" else "")
"""Log-axis labels as plain numbers; minor ticks labelled at 2 and 5 of each decade only."""


@dataclass(frozen=True)
class Chart:
    """One chart: a file-name stem, a title, a one-line caption and the SVG document."""

    name: str
    title: str
    caption: str
    svg: str


def _svg(figure: Figure, name: str) -> str:
    buffer = io.StringIO()
    with plt.rc_context({"svg.hashsalt": name, "svg.fonttype": "none"}):
        figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg"):]  # inline-able: no XML declaration or DOCTYPE


def _style(axes: plt.Axes) -> None:
    axes.grid(True, which="major", color="#e3e6ea", linewidth=0.8)
    axes.set_axisbelow(True)
    for side in ("top", "right"):
        axes.spines[side].set_visible(False)


def time_cost_chart(estimate: Estimate) -> Chart:
    """Every rentable device the model fits on: time-to-train (h) against the job's cost (USD), log-log,
    the Pareto front joined and labelled."""
    spot = estimate.settings.spot
    rented = estimate.by_cost()
    pareto = estimate.pareto()
    figure, axes = plt.subplots(figsize=(7.5, 4.6))
    _style(axes)
    if rented:
        axes.scatter([r.time_to_train_s / SECONDS_PER_HOUR for r in rented],
                     [r.job_cost_usd(spot) for r in rented], s=22, color=FITS, alpha=0.75, label="device")
        axes.plot([r.time_to_train_s / SECONDS_PER_HOUR for r in pareto], [r.job_cost_usd(spot) for r in pareto],
                  "-o", color=PARETO, markersize=7, linewidth=1.6, label="Pareto front (nothing is faster and cheaper)")
        for result in pareto:
            axes.annotate(result.id, (result.time_to_train_s / SECONDS_PER_HOUR, result.job_cost_usd(spot)),
                          textcoords="offset points", xytext=(6, 4), fontsize=8)
        axes.set_xscale("log")
        axes.set_yscale("log")
        for axis in (axes.xaxis, axes.yaxis):  # 0.5, 2, 300 rather than 5 x 10^-1
            axis.set_major_formatter(PLAIN)
            axis.set_minor_formatter(PLAIN_MINOR)
        axes.legend(loc="upper right", fontsize=8, frameon=False)
    else:
        axes.text(0.5, 0.5, "no rentable device fits this model", ha="center", va="center", transform=axes.transAxes)
    axes.set_xlabel("time to train (hours, log scale)")
    axes.set_ylabel(f"job cost, {'spot' if spot else 'on demand'} (USD, log scale)")
    caption = (f"{len(rented)} rentable devices that fit; the Pareto front: "
               + (", ".join(r.id for r in pareto) or "none"))
    return Chart("time_vs_cost", "Time to train against cost", caption, _svg(figure, "time_vs_cost"))


def memory_chart(estimate: Estimate) -> Chart:
    """Peak training memory against each device's memory (GiB), one bar per device, largest first."""
    results = sorted(estimate.results, key=lambda r: (r.memory.capacity_bytes, r.id))
    height = max(2.5, 0.17 * len(results) + 1.0)
    figure, axes = plt.subplots(figsize=(7.5, height))
    _style(axes)
    positions = range(len(results))
    capacity = [r.memory.capacity_bytes / units.GIB for r in results]
    peak = [r.memory.peak_bytes / units.GIB for r in results]
    axes.barh(positions, capacity, color=GREY, height=0.8, label="device memory")
    axes.barh(positions, peak, color=[FITS if r.fits else SHORT for r in results], height=0.45,
              label="peak training memory")
    axes.set_yticks(list(positions), [r.id for r in results], fontsize=7)
    axes.set_ylim(-0.7, len(results) - 0.3)
    axes.set_xlabel("GiB (2^30 bytes)")
    axes.legend(loc="lower right", fontsize=8, frameon=False)
    short = sum(1 for r in results if not r.fits)
    needed = max(r.memory.peak_bytes for r in results) / units.GIB if results else 0.0
    caption = (f"peak up to {needed:.1f} GiB; fits on {len(results) - short} of {len(results)} devices"
               + (f" (red: {short} do not)" if short else ""))
    return Chart("memory", "Peak memory against device memory", caption, _svg(figure, "memory"))


def buy_candidates(estimate: Estimate) -> list[DeviceEstimate]:
    """Devices that fit, can be bought and rented: best value to buy (price per sample/s) first."""
    owned = [r for r in estimate.by_value() if r.owning is not None and r.owning.break_even_hours is not None]
    return owned[:BUY_VS_RENT_DEVICES]


def buy_vs_rent_chart(estimate: Estimate) -> Chart:
    """Cumulative cost (USD) against training hours: renting at the cheapest on-demand rate, owning
    (purchase plus electricity); the crossing is the break-even point."""
    figure, axes = plt.subplots(figsize=(7.5, 4.2))
    _style(axes)
    candidates = buy_candidates(estimate)
    horizon = max((r.owning.break_even_hours or 0.0 for r in candidates), default=0.0) * 1.6  # type: ignore[union-attr]
    horizon = max(horizon, 1.0)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for colour, result in zip(colours, candidates):
        owning = result.owning
        offer = result.cheapest()
        assert owning is not None and offer is not None and owning.break_even_hours is not None
        electricity_per_hour = (owning.power_watts or 0.0) / 1000 * owning.electricity_usd_per_kwh
        axes.plot([0, horizon], [0, offer.usd_per_hour * horizon], "--", color=colour, linewidth=1.2)
        axes.plot([0, horizon], [owning.purchase_usd, owning.purchase_usd + electricity_per_hour * horizon], "-",
                  color=colour, linewidth=1.6, label=f"{result.id}: buy (solid) / rent (dashed)")
        even = owning.break_even_hours
        axes.plot([even], [offer.usd_per_hour * even], "o", color=colour, markersize=6)
        axes.annotate(f"{even:,.0f} h", (even, offer.usd_per_hour * even), textcoords="offset points",
                      xytext=(5, -12), fontsize=8, color=colour)
    if not candidates:
        axes.text(0.5, 0.5, "no device that fits can be both bought and rented", ha="center", va="center",
                  transform=axes.transAxes)
    else:
        axes.legend(loc="upper left", fontsize=8, frameon=False)
    axes.set_xlim(0, horizon)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("training hours")
    axes.set_ylabel("cumulative cost (USD)")
    caption = "; ".join(f"{r.id} pays off after {r.owning.break_even_hours:,.0f} h"  # type: ignore[union-attr]
                        for r in candidates) or "no device to compare"
    return Chart("buy_vs_rent", "Buying against renting", caption, _svg(figure, "buy_vs_rent"))


def all_charts(estimate: Estimate) -> list[Chart]:
    """The report's charts in reading order."""
    return [time_cost_chart(estimate), memory_chart(estimate), buy_vs_rent_chart(estimate)]
