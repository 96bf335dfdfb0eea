"""How this machine's torch DataLoader moves batches and runs workers side by side: measured once on a
synthetic pipeline of known cost, stored in the user's cache, and used for every pipeline after.

The synthetic sample does a fixed amount of CPU work (a pure-Python loop: the same instructions in every
process, slowed down by whatever else runs on the same CPU) and returns a tensor of a chosen size. Timed
one thread in this process (measure.measure_samples) and through the real DataLoader:
- with one worker and two sample sizes, the DataLoader's own cost per batch beyond the samples and
  their collation: a fixed part (index lists and the batch through the worker's queue) and a part per
  byte (the batch built in shared memory by the worker and mapped by the main process);
- with two workers, what the second adds on this host (`second_worker_yield`: 1.0 when it runs on a
  core of its own beside the first and the main process, less where they share).

A measurement is stored only when its repeated runs agree (MAX_SPREAD) and no other program took the
CPUs meanwhile (advisor.calibration.contention); otherwise it is used for this run and said to be noisy.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import resource
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from advisor.atomic import write_atomically
from advisor.calibration.contention import cpu_snapshot
from advisor.pipeline.measure import loader_throughput, measure_samples
from advisor.probe.cpu import probe_cpu

FORMAT = "gpu-advisor-loader-mechanics"
SCHEMA = 1

SAMPLE_WORK = 20_000
"""Loop iterations of one synthetic sample (about 0.5-1 ms of one thread)."""

SIZES = (1_024, 602_112)
"""Bytes of a small synthetic sample and of a large one (one 3 x 224 x 224 fp32 image)."""

BATCH = 16
BATCHES = 24
REPEATS = 3

MAX_SPREAD = 0.25
"""Largest (slowest - fastest) / median of repeated DataLoader runs for a stored measurement."""


class Synthetic(torch.utils.data.Dataset):
    """SAMPLE_WORK loop iterations, then a fresh tensor of `size` bytes."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return 1024

    def __getitem__(self, index: int) -> torch.Tensor:
        total = 0
        for step in range(SAMPLE_WORK):
            total += step ^ index
        return torch.full((self.size,), total & 0x7F, dtype=torch.uint8)


@dataclass(frozen=True)
class LoaderMechanics:
    """This host's DataLoader costs. Seconds, bytes."""

    batch_s: float
    """Seconds per batch through a worker beyond its samples and collation (queues, index lists)."""
    byte_s: float
    """Seconds per byte of a collated batch moved from a worker to the main process (shared memory)."""
    second_worker_yield: float
    """Throughput a second worker adds on this host, as a fraction of the first's (1.0: a core of its own)."""
    cpus: int
    """CPUs this process may run on."""
    stored: bool
    """Whether the measurement passed its checks (and was stored); else it serves this run only."""
    note: str
    """What was measured and how steady it was, in a few words."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def fingerprint() -> str:
    """What the mechanics depend on: the CPU, how many of them, Python and torch."""
    cpu = probe_cpu()
    text = json.dumps([cpu.model, cpu.logical_cores, usable_cpus(), platform.python_version(), torch.__version__])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _path(cache: Path) -> Path:
    return cache / "loader-mechanics.json"


def load(cache: Path) -> LoaderMechanics | None:
    """The stored mechanics of this machine, or None (none stored, another machine's, unreadable)."""
    try:
        document = json.loads(_path(cache).read_text())
        body = document["body"]
        if document.get("format") != FORMAT or document.get("schema") != SCHEMA \
                or document.get("checksum") != _checksum(body) or body.get("fingerprint") != fingerprint():
            return None
        fields = body["mechanics"]
        return LoaderMechanics(float(fields["batch_s"]), float(fields["byte_s"]), float(fields["second_worker_yield"]),
                               int(fields["cpus"]), True, str(fields["note"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _checksum(body: Any) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def store(cache: Path, mechanics: LoaderMechanics) -> None:
    body = {"fingerprint": fingerprint(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "mechanics": mechanics.to_dict()}
    cache.mkdir(parents=True, exist_ok=True)
    write_atomically(_path(cache), json.dumps({"format": FORMAT, "schema": SCHEMA, "body": body,
                                               "checksum": _checksum(body)}, indent=1))


def mechanics(cache: Path) -> LoaderMechanics:
    """This machine's mechanics: stored ones, else measured now (a few seconds) and stored if steady."""
    known = load(cache)
    if known is not None:
        return known
    measured = measure_mechanics()
    if measured.stored:
        store(cache, measured)
    return measured


def measure_mechanics() -> LoaderMechanics:
    """Time the synthetic pipeline one thread in-process and through the DataLoader (see the module)."""
    before = cpu_snapshot(), _children_cpu_s()
    cycles: dict[int, float] = {}  # sample size -> measured seconds per batch with one worker
    own: dict[int, float] = {}  # sample size -> one thread's seconds per batch (samples and collation)
    spreads = []
    for size in SIZES:
        timing = measure_samples(Synthetic(size), BATCH)
        own[size] = BATCH * (timing.sample_s + timing.collate_s)
        runs = [loader_throughput(Synthetic(size), BATCH, 1, BATCHES) for _ in range(REPEATS)]
        spreads.append(_spread(runs))
        cycles[size] = BATCH / statistics.median(runs)
    small, large = SIZES
    extra_small, extra_large = (max(0.0, cycles[s] - own[s]) for s in SIZES)
    byte_s = max(0.0, (extra_large - extra_small) / (BATCH * (large - small)))
    batch_s = max(0.0, extra_small - byte_s * BATCH * small)
    cpus = usable_cpus()
    if cpus >= 2:
        one = BATCH / cycles[small]
        runs = [loader_throughput(Synthetic(small), BATCH, 2, BATCHES) for _ in range(REPEATS)]
        spreads.append(_spread(runs))
        second = min(1.0, max(0.0, statistics.median(runs) / one - 1))
    else:
        second = 0.0
    busy = others_cores(before, (cpu_snapshot(), _children_cpu_s()))
    quiet = busy is None or busy < 0.5
    steady = max(spreads) <= MAX_SPREAD
    note = (f"DataLoader measured on a synthetic pipeline: {batch_s * 1e3:.2f} ms per batch + "
            f"{byte_s * 1e9:.2f} ns per byte; a second worker adds {second:.0%}; runs within {max(spreads):.0%}"
            + ("" if quiet else f"; other programs kept {busy:.1f} CPUs busy"))
    return LoaderMechanics(batch_s, byte_s, second, cpus, quiet and steady, note)


def _spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


def _children_cpu_s() -> float:
    """CPU seconds of this process's finished children (the DataLoader's workers, once joined)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def others_cores(before: tuple[Any, float], after: tuple[Any, float]) -> float | None:
    """CPUs that other programs (and the hypervisor's steal) took between two (cpu_snapshot(),
    _children_cpu_s()) pairs: all CPUs' busy time less ours and our workers', over the wall time.

    # 2 s apart, all CPUs busy 3.0 s, ours 0.5 s, our workers 2.3 s, steal 0.1 s:
    # (3.0 - 0.5 - 2.3 + 0.1) / 2 = 0.15 CPUs
    """
    (first, first_children), (last, last_children) = before, after
    if first is None or last is None:
        return None
    seconds = max(last.wall_s - first.wall_s, 1e-9)
    ours = (last.own_s - first.own_s) + (last_children - first_children)
    others = max(0.0, (last.busy_s - first.busy_s) - ours) + max(0.0, last.steal_s - first.steal_s)
    return others / seconds
