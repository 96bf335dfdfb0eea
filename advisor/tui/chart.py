"""Text charts for the terminal: time-to-train against job cost on log axes, the Pareto front marked,
and a stacked bar of a device's memory."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text

from advisor import units
from advisor.present.format import money, plan_duration
from advisor.estimate.plan import DeviceEstimate, Estimate

DEVICE_MARK, PARETO_MARK = "·", "●"
MEMORY_PARTS = (("weights", "blue"), ("gradients", "magenta"), ("optimizer", "yellow"), ("activations", "green"),
                ("overhead", "bright_black"))


@dataclass(frozen=True)
class Point:
    label: str
    x: float
    """Seconds."""
    y: float
    """USD."""
    pareto: bool


def points_of(estimate: Estimate) -> list[Point]:
    """Rentable devices the model fits on: (time-to-train, job cost), Pareto set marked."""
    spot = estimate.settings.spot
    front = {r.id for r in estimate.pareto()}
    return [Point(r.id, r.time_to_train_s, r.job_cost_usd(spot) or 0.0, r.id in front) for r in estimate.by_cost()]


def _scale(value: float, low: float, high: float, cells: int) -> int:
    """Cell index of `value` on a log axis from `low` to `high` over `cells` cells."""
    if high <= low:
        return 0
    fraction = (math.log(value) - math.log(low)) / (math.log(high) - math.log(low))
    return min(cells - 1, max(0, round(fraction * (cells - 1))))


def scatter(points: Sequence[Point], width: int, height: int, y_label: str = "USD") -> Text:
    """A log-log scatter in `width` x `height` cells (axes and labels included): devices as dots,
    the Pareto front as discs labelled with their ids."""
    if not points:
        return Text("no rentable device fits this model", style="italic")
    plot_width, plot_height = max(width - 10, 10), max(height - 3, 4)
    xs, ys = [p.x for p in points], [p.y for p in points if p.y > 0] or [1.0]
    x_low, x_high = min(xs) / 1.1, max(xs) * 1.1
    y_low, y_high = min(ys) / 1.2, max(ys) * 1.2
    grid = [[" "] * plot_width for _ in range(plot_height)]
    styles: dict[tuple[int, int], str] = {}
    for point in sorted(points, key=lambda p: p.pareto):  # the front drawn last, on top
        column = _scale(point.x, x_low, x_high, plot_width)
        row = plot_height - 1 - _scale(max(point.y, y_low), y_low, y_high, plot_height)
        grid[row][column] = PARETO_MARK if point.pareto else DEVICE_MARK
        styles[(row, column)] = "bold dark_orange" if point.pareto else "dodger_blue2"
        if point.pareto:
            _place_label(grid, styles, row, column, f" {point.label}")
    text = Text()
    for row, cells in enumerate(grid):
        axis = money(y_high) if row == 0 else money(y_low) if row == plot_height - 1 else ""
        text.append(f"{axis:>8} │")
        for column, char in enumerate(cells):
            text.append(char, style=styles.get((row, column), ""))
        text.append("\n")
    text.append(" " * 9 + "└" + "─" * plot_width + "\n")
    left, right = plan_duration(x_low), plan_duration(x_high)
    text.append(" " * 10 + left + " " * max(plot_width - len(left) - len(right), 1) + right + "\n")
    text.append(" " * 10 + f"time to train (log) →   cost in {y_label} (log) ↑   ", style="dim")
    text.append(f"{PARETO_MARK} Pareto front", style="dark_orange")
    text.append(f"  {DEVICE_MARK} other devices", style="dodger_blue2")
    return text


def _place_label(grid: list[list[str]], styles: dict[tuple[int, int], str], row: int, column: int, label: str) -> None:
    """Write a front point's label right of its column on the nearest row (its own first, then one up,
    one down, ...) where it fits whole on blank cells: points of equal time and cost (a host-bound
    model on many GPUs) would otherwise write their labels over each other. None free: what fits on
    its own row."""
    width = len(grid[0])
    cells = range(column + 1, min(column + 1 + len(label), width))
    order = sorted(range(len(grid)), key=lambda r: (abs(r - row), r > row))
    free = next((r for r in order if len(cells) == len(label) and all(grid[r][c] == " " for c in cells)), None)
    target = row if free is None else free
    for offset, char in zip(cells, label):
        if grid[target][offset] == " ":
            grid[target][offset] = char
            styles[(target, offset)] = "dark_orange"


def memory_bar(result: DeviceEstimate, width: int = 50) -> Text:
    """The device's memory as `width` cells: each part of the peak in its colour, the free rest
    dim; a model that does not fit overflows in red."""
    memory = result.memory
    capacity = max(memory.capacity_bytes, 1)
    scale = width / max(capacity, memory.peak_bytes)
    text = Text()
    used = 0
    for part, colour in MEMORY_PARTS:
        cells = round(memory.memory.get(part, 0) * scale)
        text.append("█" * cells, style=colour)
        used += cells
    capacity_cells = round(capacity * scale)
    if used < capacity_cells:
        text.append("░" * (capacity_cells - used), style="bright_black")
    text.append(f"  {memory.peak_bytes / units.GIB:.1f} / {capacity / units.GIB:.1f} GiB",
                style="bold" if memory.fits else "bold red")
    text.append("\n")
    for part, colour in MEMORY_PARTS:
        text.append("■ ", style=colour)
        text.append(f"{part} {memory.memory.get(part, 0) / units.GIB:.2f}  ")
    if not memory.fits:
        text.append(f"\n{memory.missing_bytes / units.GIB:.1f} GiB short", style="bold red")
    return text
