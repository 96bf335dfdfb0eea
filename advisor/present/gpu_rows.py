"""The GPU database as rows: each GPU with its cheapest offers, filtered and sorted (`advisor gpus` and
the TUI's GPU list)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from advisor import units
from advisor.errors import UserError
from advisor.hardware.specs import CloudOffer, GPUSpec, HardwareDB


@dataclass(frozen=True)
class GPURow:
    """One GPU with the offers that survive the provider filter."""

    gpu: GPUSpec
    cheapest: CloudOffer | None
    cheapest_spot: CloudOffer | None
    offers: tuple[CloudOffer, ...]

    def to_dict(self) -> dict[str, Any]:
        data = self.gpu.to_dict()
        data["cloud"] = [offer.to_dict() for offer in self.offers]
        data["cheapest_usd_per_gpu_hour"] = self.cheapest.usd_per_gpu_hour if self.cheapest else None
        data["cheapest_spot_usd_per_gpu_hour"] = (
            self.cheapest_spot.spot_usd_per_gpu_hour if self.cheapest_spot else None
        )
        return data


# Sort keys: (value of a row or None, True when larger is better). Missing values sort last.
SORT_KEYS: dict[str, tuple[Callable[[GPURow], Any], bool]] = {
    "id": (lambda r: r.gpu.id, False),
    "name": (lambda r: r.gpu.name.lower(), False),
    "memory": (lambda r: r.gpu.memory_bytes, True),
    "bandwidth": (lambda r: r.gpu.bandwidth_bytes_per_s, True),
    "fp32": (lambda r: r.gpu.peaks.fp32, True),
    "bf16": (lambda r: r.gpu.peaks.bf16_tensor, True),
    "fp16": (lambda r: r.gpu.peaks.fp16_tensor, True),
    "price": (lambda r: r.cheapest.usd_per_gpu_hour if r.cheapest else None, False),
    "spot": (lambda r: r.cheapest_spot.spot_usd_per_gpu_hour if r.cheapest_spot else None, False),
    "purchase": (lambda r: r.gpu.purchase_usd, False),
}


def select_rows(db: HardwareDB, min_memory_gb: float | None, provider: str | None) -> list[GPURow]:
    """The GPUs passing the filters, each with its offers (from `provider` only, when given)."""
    if provider is not None:
        db.check_provider(provider)
    if min_memory_gb is not None and min_memory_gb < 0:
        raise UserError(f"--min-memory-gb must not be negative, got {min_memory_gb}")
    rows = []
    for gpu in db.gpus:
        if min_memory_gb is not None and gpu.memory_bytes < min_memory_gb * units.GIB:
            continue
        offers = tuple(db.offers_for(gpu.id, provider))
        if provider is not None and not offers:
            continue
        rows.append(
            GPURow(gpu, db.cheapest_offer(gpu.id, provider), db.cheapest_offer(gpu.id, provider, spot=True), offers)
        )
    return rows


def sort_rows(rows: list[GPURow], key: str, reverse: bool = False) -> list[GPURow]:
    """Rows sorted by `key`: best first (largest figure, lowest price), missing values last."""
    value_of, larger_is_better = SORT_KEYS[key]
    present = [r for r in rows if value_of(r) is not None]
    missing = [r for r in rows if value_of(r) is None]
    present.sort(key=lambda r: (value_of(r), r.gpu.id), reverse=larger_is_better != reverse)
    return present + sorted(missing, key=lambda r: r.gpu.id)
