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
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter  # noqa: E402

from advisor import units  # noqa: E402
from advisor.estimate.costs import SECONDS_PER_HOUR  # noqa: E402
from advisor.estimate.plan import DeviceEstimate, Estimate  # noqa: E402
from advisor.present.format import money, plan_duration  # noqa: E402

FITS, SHORT, PARETO, GREY = "#2f6db5", "#c8423b", "#e08a1e", "#b9bec7"
BUY_VS_RENT_DEVICES = 4
"""Purchasable devices drawn in the buy-versus-rent chart (the best values to buy first)."""


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


LABELLED_POINTS = 12
"""Points of the time-vs-cost chart named beside them: the Pareto front, then the fastest and the
cheapest in turn up to this many (the caption says how many more are in the table)."""

NICE_HOURS = (1 / 60, 2 / 60, 5 / 60, 10 / 60, 20 / 60, 0.5, 1, 2, 5, 10, 24, 48, 24 * 4, 24 * 7, 24 * 14, 24 * 30,
              24 * 91, 24 * 182, 24 * 365, 24 * 365 * 3, 24 * 365 * 10)
"""Tick positions of a time axis in hours: 1 min to 10 years, in the units a person plans with."""
NICE_USD = tuple(m * 10.0**e for e in range(-2, 9) for m in (1, 2, 5))
"""Tick positions of a money axis in USD: 0.01 to 500 million, 1-2-5 in each decade."""


def _ticks(nice: tuple[float, ...], low: float, high: float) -> tuple[list[float], float, float]:
    """Ticks for an axis spanning [low, high] and the axis's limits: the nice values inside, or, when
    fewer than two fall inside, the nearest one beyond each end too, with the limits widened to show them."""
    inside = [v for v in nice if low <= v <= high]
    if len(inside) >= 2:
        return inside, low, high
    below = [v for v in nice if v < low][-1:]
    above = [v for v in nice if v > high][:1]
    ticks = below + inside + above
    return ticks, min([low, *below]) / 1.15, max([high, *above]) * 1.15


def _hours_label(hours: float) -> str:
    return plan_duration(hours * SECONDS_PER_HOUR).replace(".0 ", " ")


def _named_points(estimate: Estimate) -> list[DeviceEstimate]:
    """Devices the time-vs-cost chart names: the Pareto front, then fastest and cheapest in turn."""
    named = list(estimate.pareto())
    by_time, by_cost = estimate.by_time(), estimate.by_cost()
    rented = set(r.id for r in by_cost)
    candidates = [r for pair in zip(by_time, by_cost) for r in pair if r.id in rented]
    for result in candidates:
        if len(named) >= LABELLED_POINTS:
            break
        if result not in named:
            named.append(result)
    return named


def time_cost_chart(estimate: Estimate) -> Chart | str:
    """Every rentable device the model fits on: time-to-train against the job's cost (USD), log-log, the
    Pareto front joined; named points, axes in minutes/hours/days and USD. A sentence instead when no
    rentable device fits."""
    spot = estimate.settings.spot
    rented = estimate.by_cost()
    if not rented:
        return "Time to train against cost: no device the model fits on can be rented, so there is nothing to plot."
    pareto = estimate.pareto()
    hours = {r.id: r.time_to_train_s / SECONDS_PER_HOUR for r in rented}
    usd = {r.id: r.job_cost_usd(spot) or 0.0 for r in rented}
    figure, axes = plt.subplots(figsize=(8.5, 5.0))
    _style(axes)
    axes.scatter([hours[r.id] for r in rented], [usd[r.id] for r in rented], s=22, color=FITS, alpha=0.75,
                 label="a device the model fits on")
    axes.plot([hours[r.id] for r in pareto], [usd[r.id] for r in pareto], "-o", color=PARETO, markersize=7,
              linewidth=1.6, label="Pareto front: nothing is\nboth faster and cheaper")
    named = _named_points(estimate)
    for index, result in enumerate(named):
        axes.annotate(result.id, (hours[result.id], usd[result.id]), textcoords="offset points",
                      xytext=(6, 5 if index % 2 == 0 else -10), fontsize=7.5,
                      fontweight="bold" if result in pareto else "normal")
    axes.set_xscale("log")
    axes.set_yscale("log")
    low_h, high_h = min(hours.values()), max(hours.values())
    low_c, high_c = min(usd.values()), max(usd.values())
    x_ticks, *x_limits = _ticks(NICE_HOURS, low_h / 1.4, high_h * 1.4)
    y_ticks, *y_limits = _ticks(NICE_USD, low_c / 1.4, high_c * 1.4)
    axes.set_xlim(*x_limits)
    axes.set_ylim(*y_limits)
    axes.xaxis.set_major_locator(FixedLocator(x_ticks))
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: _hours_label(value)))
    axes.yaxis.set_major_locator(FixedLocator(y_ticks))
    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: money(value)))
    for axis in (axes.xaxis, axes.yaxis):
        axis.set_minor_formatter(NullFormatter())
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)  # beside, off the data
    axes.set_xlabel("time to train (log scale)")
    axes.set_ylabel(f"job cost, {'spot' if spot else 'on demand'} (USD, log scale)")
    unnamed = len(rented) - len(named)
    caption = (f"{len(rented)} rentable devices the model fits on; the Pareto front (bold): "
               + ", ".join(r.id for r in pareto)
               + (f"; {unnamed} more, unnamed, are in the device table" if unnamed else ""))
    return Chart("time_vs_cost", "Time to train against cost", caption, _svg(figure, "time_vs_cost"))


def _memory_groups(estimate: Estimate) -> list[tuple[float, float, list[DeviceEstimate]]]:
    """Devices grouped by memory size: (capacity GiB, highest peak GiB in the group, devices), largest first."""
    groups: dict[float, list[DeviceEstimate]] = {}
    for result in estimate.results:
        groups.setdefault(round(result.memory.capacity_bytes / units.GIB, 1), []).append(result)
    return [(capacity, max(r.memory.peak_bytes for r in members) / units.GIB, sorted(members, key=lambda r: r.id))
            for capacity, members in sorted(groups.items(), reverse=True)]


MEMORY_NAMES = 3
"""Device names written beside each memory size (the rest as "+N")."""


def memory_chart(estimate: Estimate) -> Chart | str:
    """Peak training memory against device memory (GiB): one bar per memory size with the devices that
    have it, the model's peak on each; red where it does not fit."""
    if not estimate.results:
        return "Peak memory against device memory: no device was estimated."
    groups = _memory_groups(estimate)
    figure, axes = plt.subplots(figsize=(8.5, max(2.4, 0.34 * len(groups) + 1.0)))
    _style(axes)
    positions = list(range(len(groups)))
    axes.barh(positions, [capacity for capacity, _, _ in groups], color=GREY, height=0.75, label="device memory")
    fits = [all(r.fits for r in members) for _, _, members in groups]
    axes.barh(positions, [peak for _, peak, _ in groups], color=[FITS if ok else SHORT for ok in fits], height=0.4,
              label="peak training memory")
    labels = []
    for capacity, _, members in groups:
        names = ", ".join(r.id for r in members[:MEMORY_NAMES])
        more = f" +{len(members) - MEMORY_NAMES}" if len(members) > MEMORY_NAMES else ""
        labels.append(f"{capacity:g} GiB: {names}{more}")
    axes.set_yticks(positions, labels, fontsize=7.5)
    axes.invert_yaxis()
    axes.set_xlabel("GiB (2^30 bytes)")
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    short = sum(1 for r in estimate.results if not r.fits)
    needed = max(r.memory.peak_bytes for r in estimate.results) / units.GIB
    caption = (f"the model needs up to {needed:.1f} GiB; it fits on {len(estimate.results) - short} of "
               f"{len(estimate.results)} devices" + (f" (red: {short} do not)" if short else "")
               + f", grouped by their {len(groups)} memory sizes")
    return Chart("memory", "Peak memory against device memory", caption, _svg(figure, "memory"))


def buy_candidates(estimate: Estimate) -> list[DeviceEstimate]:
    """Devices that fit, can be bought and rented: best value to buy (price per sample/s) first."""
    owned = [r for r in estimate.by_value() if r.owning is not None and r.owning.break_even_hours is not None]
    return owned[:BUY_VS_RENT_DEVICES]


def buy_vs_rent_chart(estimate: Estimate) -> Chart | str:
    """Cumulative cost (USD) against training hours: renting at the cheapest on-demand rate, owning
    (purchase plus electricity); the crossing is the break-even point."""
    candidates = buy_candidates(estimate)
    if not candidates:
        return ("Buying against renting: no card the model fits on can both be bought and rented in the database, "
                "so there is no break-even to draw.")
    figure, axes = plt.subplots(figsize=(8.5, 4.4))
    _style(axes)
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
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    axes.set_xlim(0, horizon)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("training hours")
    axes.set_ylabel("cumulative cost (USD)")
    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: money(value)))
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    caption = "; ".join(f"{r.id} pays off after {r.owning.break_even_hours:,.0f} h"  # type: ignore[union-attr]
                        for r in candidates)
    return Chart("buy_vs_rent", "Buying against renting", caption, _svg(figure, "buy_vs_rent"))


def all_charts(estimate: Estimate) -> list[Chart | str]:
    """The report's charts in reading order; a sentence in place of a chart that would be empty."""
    return [time_cost_chart(estimate), memory_chart(estimate), buy_vs_rent_chart(estimate)]
