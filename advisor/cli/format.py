"""Human-readable numbers for the terminal: decimal SI prefixes, fixed significant digits."""

from __future__ import annotations

_PREFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(value: float, unit: str, digits: int = 3) -> str:
    """1.234e12, "FLOP" -> "1.23 TFLOP" (decimal prefixes, `digits` significant figures)."""
    if value == 0:
        return f"0 {unit}"
    for scale, prefix in _PREFIXES:
        if abs(value) >= scale:
            return f"{_significant(value / scale, digits)} {prefix}{unit}"
    return f"{_significant(value, digits)} {unit}"


def _significant(value: float, digits: int) -> str:
    magnitude = len(str(int(abs(value)))) if abs(value) >= 1 else 1
    decimals = max(digits - magnitude, 0)
    return f"{value:.{decimals}f}"


_COUNT_PREFIXES = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"))


def count(value: int) -> str:
    """25557032 -> "25.6 M", 6738415616 -> "6.74 B" (parameters and the like)."""
    for scale, prefix in _COUNT_PREFIXES:
        if abs(value) >= scale:
            return f"{_significant(value / scale, 3)} {prefix}"
    return str(value)


def percent(fraction: float, digits: int = 1) -> str:
    return f"{100 * fraction:.{digits}f}%"


def duration(seconds: float, digits: int = 3) -> str:
    """2.7e-06 -> "2.70 us", 0.0153 -> "15.3 ms", 12.5 -> "12.5 s" (SI prefixes below a second)."""
    for scale, prefix in ((1.0, ""), (1e-3, "m"), (1e-6, "u"), (1e-9, "n")):
        if abs(seconds) >= scale:
            return f"{_significant(seconds / scale, digits)} {prefix}s"
    return "0 s" if seconds == 0 else f"{seconds:.2g} s"


def money(value: float | None) -> str:
    """USD with the precision a budget needs: 1,234 / 12.34 / 0.012; "-" for none."""
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 0.1:
        return f"{value:.2f}"
    return f"{value:.2g}"


def plan_duration(seconds: float) -> str:
    """Time-to-train in the unit a person plans with."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
