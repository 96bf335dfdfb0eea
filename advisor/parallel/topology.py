"""Which interconnect class (hwdb/interconnects.yaml) links the GPUs of one machine, and the machines.

An offer that names its `interconnect` or `network` is taken at its word. Otherwise, decisions from
how such machines are built:
- SXM modules sit on NVIDIA's HGX boards: V100 SXM2 in the hybrid cube mesh (NVLink 2), A100 behind
  NVSwitch (NVLink 3), H100/H200 behind NVSwitch (NVLink 4); B200 (NVLink 5) has no published ring
  bandwidth here and takes NVLink 4's curve, a lower bound.
- Two H100 PCIe/NVL cards are paired by their NVLink bridge; more go over PCIe.
- Other PCIe cards talk over PCIe: GeForce cards without peer-to-peer (NVIDIA's driver disables it),
  through the host; datacenter and workstation cards on PCIe 4.0 peer to peer; PCIe 5.0 and 3.0
  through the host (the only measured classes of those generations).
- Laptop GPUs, superchips (GH200) and other vendors' GPUs have no multi-GPU class: one GPU per machine.
"""

from __future__ import annotations

from advisor.hardware.specs import CloudOffer, GPUSpec

SXM_LINKS = {"volta": "nvlink2-hybrid-mesh", "ampere": "nvlink3-nvswitch", "hopper": "nvlink4-nvswitch",
             "blackwell": "nvlink4-nvswitch"}
NVLINK_BRIDGED = frozenset({"h100-pcie", "h100-nvl"})
HOST_PCIE = {3: "pcie3-host", 4: "pcie4-host", 5: "pcie5-host", 6: "pcie5-host"}


def node_link(gpu: GPUSpec, gpus: int, offer: CloudOffer | None = None) -> str | None:
    """The interconnect id between `gpus` of `gpu` in one machine (None: no multi-GPU machine known)."""
    if offer is not None and offer.interconnect is not None:
        return offer.interconnect
    if gpu.vendor != "nvidia" or gpu.form_factor in ("laptop", "superchip") or gpu.segment == "laptop":
        return None
    if gpu.form_factor == "sxm":
        return SXM_LINKS.get(gpu.architecture or "")
    if gpu.id in NVLINK_BRIDGED and gpus == 2:
        return "nvlink-bridge-h100-pcie"
    generation = gpu.pcie_gen or 4
    if generation == 4 and gpu.segment != "geforce":
        return "pcie4-p2p"
    return HOST_PCIE.get(generation)
