"""Map a device name as a driver reports it ("NVIDIA GeForce RTX 4090") to a database id."""

from __future__ import annotations

import re

from advisor.hardware.specs import GPUSpec, HardwareDB

_NOISE_TOKENS = {"nvidia", "geforce", "tesla", "amd", "instinct"}
_HARMLESS_EXTRA = re.compile(r"^(\d+gb|hbm\d?e?|pcie|sxm\d?|gddr\d+x?)$")
_MEMORY_TOLERANCE = (0.85, 1.05)
"""A driver reports a little less memory than marketed (ECC, reserved): an A10G shows 22,888 MiB
of 24 GiB (0.93). Outside this range the card is another variant (a 3060 with 8 GB is not ours)."""


def _tokens(name: str) -> tuple[str, ...]:
    words = re.sub(r"[^a-z0-9]+", " ", name.lower()).split()
    return tuple(w for w in words if w not in _NOISE_TOKENS)


def _names(gpu: GPUSpec) -> list[tuple[str, ...]]:
    return [_tokens(n) for n in (gpu.name, gpu.id.replace("-", " "), *gpu.aliases)]


def _memory_fits(gpu: GPUSpec, memory_bytes: int | None) -> bool:
    if memory_bytes is None:
        return True
    low, high = _MEMORY_TOLERANCE
    return low * gpu.memory_bytes <= memory_bytes <= high * gpu.memory_bytes


def match_gpu_name(db: HardwareDB, name: str, memory_bytes: int | None = None) -> str | None:
    """The id whose name or alias equals `name` (case, punctuation and vendor words ignored), or
    whose name is all of `name` but for size/packaging words ("80GB", "HBM3", "PCIe"); memory must
    agree within the driver's usual shortfall. None when nothing fits."""
    device = _tokens(name)
    exact = [g for g in db.gpus if device in _names(g) and _memory_fits(g, memory_bytes)]
    if exact:
        return exact[0].id
    best: tuple[int, str] | None = None
    for gpu in db.gpus:
        if not _memory_fits(gpu, memory_bytes):
            continue
        for candidate in _names(gpu):
            extra = [t for t in device if t not in candidate]
            if candidate and set(candidate) <= set(device) and all(_HARMLESS_EXTRA.match(t) for t in extra):
                if best is None or len(candidate) > best[0]:
                    best = (len(candidate), gpu.id)
    return best[1] if best else None
