"""Human-readable numbers for the terminal: decimal SI prefixes, fixed significant digits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from advisor import units

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


def count(value: float) -> str:
    """25557032 -> "25.6 M", 6738415616 -> "6.74 B" (parameters and the like)."""
    for scale, prefix in _COUNT_PREFIXES:
        if abs(value) >= scale:
            return f"{_significant(value / scale, 3)} {prefix}"
    return str(value)


def percent(fraction: float, digits: int = 1) -> str:
    return f"{100 * fraction:.{digits}f}%"


def throughput_cell(samples_per_s: float, tokens_per_s: float | None) -> str:
    """A device's throughput as the tables show it: tokens/s (whole) for a sequence model, else samples/s
    to a tenth: (12.5, None) -> "12.5", (12.5, 25600.0) -> "25,600"."""
    return f"{samples_per_s:,.1f}" if tokens_per_s is None else f"{tokens_per_s:,.0f}"


def throughput_header(sequence_model: bool) -> str:
    """The throughput column's header: "Tokens/s" for a sequence model, else "Samples/s"."""
    return "Tokens/s" if sequence_model else "Samples/s"


def speed(samples_per_s: float, tokens_per_s: float | None, sample_unit: str) -> str:
    """Throughput with its unit: "913 tokens/s" for a sequence model, else "12.5 images/s"."""
    return f"{throughput_cell(samples_per_s, tokens_per_s)} {sample_unit if tokens_per_s is None else 'tokens'}/s"


def mfu_cell(mfu: float | None) -> str:
    """Model FLOPs utilisation as a table shows it: 0.412 -> "41%", 0.0123 -> "1.2%", None -> "-"."""
    if mfu is None:
        return "-"
    return f"{100 * mfu:.0f}%" if mfu >= 0.095 else f"{100 * mfu:.1f}%"


def duration(seconds: float, digits: int = 3) -> str:
    """2.7e-06 -> "2.70 us", 0.0153 -> "15.3 ms", 12.5 -> "12.5 s" (SI prefixes below a second)."""
    for scale, prefix in ((1.0, ""), (1e-3, "m"), (1e-6, "u"), (1e-9, "n")):
        if abs(seconds) >= scale:
            return f"{_significant(seconds / scale, digits)} {prefix}s"
    return "0 s" if seconds == 0 else f"{seconds:.2g} s"


SMALLEST_MONEY = 0.01
"""A cent: smaller amounts show as "<0.01" (nobody budgets in millionths of a dollar; 9.8e-05 read as
a typo)."""


def money(value: float | None) -> str:
    """USD as people write it: 1,234 / 12.34 / 0.57 / <0.01; "-" for none; past a billion 3.46 B."""
    if value is None:
        return "-"
    if value >= 1e9:  # absurd jobs stay readable: 3.46 T or 1.2e+18, not a row of digits
        return count(value) if value < 1e15 else f"{value:.3g}"
    if value >= 100:
        return f"{value:,.0f}"
    if value == 0:
        return "0"
    if value < SMALLEST_MONEY:
        return f"<{SMALLEST_MONEY:.2f}"
    return f"{value:.2f}"


SECONDS_PER_YEAR = 365.25 * 86400


def plan_duration(seconds: float) -> str:
    """Time-to-train in the unit a person plans with."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds < SECONDS_PER_YEAR:
        return f"{seconds / 86400:.1f} d"
    years = seconds / SECONDS_PER_YEAR
    return f"{years:,.1f} years" if years < 1e6 else f"{years:.3g} years"


def gib(nbytes: float) -> str:
    """Bytes as GiB (2^30) with one decimal: 12884901888 -> "12.0"."""
    return f"{nbytes / units.GIB:.1f}"


ADVICE_WITHOUT_SEARCH = {
    "not run": "`--plans auto` traces the settings that would fit",
    "memory": "`advisor estimate` with the same flags traces the settings that would fit",
    "none found": "none of the fit advisor's settings (micro-batching, checkpointing, 8-bit AdamW, pure bf16, "
                  "LoRA, a 4-bit base) fits either: it needs a GPU with more memory, or several",
}
"""What the sentence suggests when the batch is not the problem, by what the fit advisor did."""


def fits_nowhere_message(model_name: str, settings: Any, devices: Sequence[Any], advisor: str = "not run") -> str:
    """One sentence when a model fits no device: what it needs, the largest device, what to change.
    `settings` is a MemorySettings, `devices` DeviceMemory records (advisor.memory); `advisor` what the fit
    advisor did (a key of ADVICE_WITHOUT_SEARCH)."""
    biggest = max(devices, key=lambda d: d.capacity_bytes)
    fix = ADVICE_WITHOUT_SEARCH[advisor]
    if biggest.max_batch_size:
        fix = (f"--batch-size {biggest.max_batch_size} or less (on {biggest.gpu_id}), or keep the batch with "
               f"--micro-batch (gradient accumulation)")
    return (f"{model_name} does not fit on any of the {len(devices)} devices at batch {settings.batch_size} "
            f"({settings.precision}, {settings.optimizer}): it needs {gib(biggest.peak_bytes)} GiB, the "
            f"largest ({biggest.gpu_id}) has {gib(biggest.capacity_bytes)} GiB; {'try ' if biggest.max_batch_size else ''}{fix}")


def describe_params(trace: Any) -> str:
    """"124 M parameters", or "8.03 G parameters, 3.41 M trainable" when part of the model is frozen."""
    total = trace.total_params or trace.params
    if total == trace.params:
        return f"{count(total)} parameters"
    return f"{count(total)} parameters, {count(trace.params)} trainable"



TIGHT_FIT = ("holds the step only because PyTorch's caching allocator releases its cached blocks when memory runs "
             "out (flushes that synchronize the GPU in the first steps); "
             "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True fragments less")
"""Said of a device whose memory result fits with allocator flushes (DeviceMemory.allocator_flushes)."""


def tight_fit_line(device_ids: Sequence[str]) -> str:
    """"Tight fit: rtx-3090, rtx-4090 hold the step only because ..." (empty without devices)."""
    if not device_ids:
        return ""
    verb = TIGHT_FIT if len(device_ids) == 1 else TIGHT_FIT.replace("holds", "hold", 1)
    return f"Tight fit: {', '.join(device_ids)} {verb}"
