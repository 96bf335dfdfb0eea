"""How fast a batch crosses from the host's memory to the GPU (hwdb/host-links.yaml): one GPU alone, from
pinned memory by the copy engine, at the measured rate of its link. A PCIe link runs at the lower
generation of the GPU's and of its host CPU's root ports, over the GPU's lanes (x16 unless `pcie_lanes`
says otherwise); a GPU joined to its CPU by another link (NVLink-C2C) names it (`host_link`)."""

from __future__ import annotations

from dataclasses import dataclass

from advisor.hardware.specs import GPUSpec, HardwareDB, HostLink

DEFAULT_LANES = 16
"""Lanes of a GPU entry without `pcie_lanes`: every card in the database but the x8 RTX 4060 Ti is x16."""


@dataclass(frozen=True)
class LinkRate:
    """A GPU's host link. Bytes per second."""

    host_to_device_bytes_per_s: float
    describe: str

    def copy_s(self, batch_bytes: float) -> float:
        """Seconds to copy `batch_bytes` to the GPU."""
        return batch_bytes / self.host_to_device_bytes_per_s


def host_link_rate(db: HardwareDB, gpu: GPUSpec, host_pcie_gen: int | None) -> LinkRate | None:
    """`gpu`'s host-to-device rate behind a CPU whose root ports are PCIe `host_pcie_gen` (None: unknown,
    the GPU's own generation); None where the GPU's link is unknown.

    # A100 (PCIe 4.0 x16) behind a Cascade Lake Xeon (PCIe 3.0): the 3.0 x16 rate, 12.4 GB/s
    # RTX 4060 Ti (PCIe 4.0 x8): 25.9 GB/s x 8 / 16 = 12.95 GB/s
    """
    if gpu.host_link is not None:
        named = next(link for link in db.host_links if link.id == gpu.host_link)
        return LinkRate(named.host_to_device_bytes_per_s,
                        f"{named.id} {named.host_to_device_bytes_per_s / 1e9:,.0f} GB/s")
    if gpu.pcie_gen is None:
        return None
    generation = gpu.pcie_gen if host_pcie_gen is None else min(gpu.pcie_gen, host_pcie_gen)
    measured = [link for link in db.host_links if link.pcie_gen is not None and link.pcie_gen <= generation]
    if not measured:
        return None
    link: HostLink = max(measured, key=lambda known: known.pcie_gen or 0)
    assert link.lanes, link
    lanes = gpu.pcie_lanes or DEFAULT_LANES
    rate = link.host_to_device_bytes_per_s * lanes / link.lanes
    why = ""
    if host_pcie_gen is not None and host_pcie_gen < gpu.pcie_gen:
        why = f", the host CPU's generation (the GPU has {gpu.pcie_gen}.0)"
    elif link.pcie_gen != generation:
        why = f", the fastest measured (no measured {generation}.0 link)"
    return LinkRate(rate, f"PCIe {link.pcie_gen}.0 x{lanes}{why}: {rate / 1e9:,.1f} GB/s")
