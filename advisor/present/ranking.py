"""Orders of the estimated devices, the same in every interface."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the command line's parser imports SORT_KEYS before torch is needed
    from advisor.estimate.plan import DeviceEstimate, Estimate

SORT_KEYS = ("time", "cost", "throughput", "memory", "name", "mfu")
"""Orders a user can ask for: time-to-train, job cost, throughput, device memory, name, model FLOPs utilisation
(highest first; a device without a known peak last)."""


def sort_results(estimate: Estimate, key: str) -> list[DeviceEstimate]:
    """Devices that fit in the order asked for, then the rest as ranked (closest to fitting first)."""
    fitting = estimate.fitting
    spot = estimate.settings.spot
    orders = {
        "time": lambda r: (r.time_to_train_s, r.id),
        "cost": lambda r: (r.job_cost_usd(spot) is None, r.job_cost_usd(spot) or 0.0, r.time_to_train_s),
        "throughput": lambda r: (-r.throughput, r.id),
        "memory": lambda r: (-r.memory.capacity_bytes, r.id),
        "name": lambda r: r.id,
        "mfu": lambda r: (r.mfu is None, -(r.mfu or 0.0), r.id),
    }
    return sorted(fitting, key=orders[key]) + [r for r in estimate.results if not r.fits]
