"""How this machine's torch DataLoader moves batches and runs workers side by side: measured once on a
synthetic pipeline of known cost, stored in the user's cache, and used for every pipeline after.

The synthetic sample does a fixed amount of CPU work (a pure-Python loop: the same instructions in every
process, slowed down by whatever else runs on the same CPU) and returns a tensor of a chosen size. Timed
one thread in this process (measure.measure_samples) and through the real DataLoader:
- with one worker and three sample sizes, the DataLoader's own cost per batch beyond the samples and
  their collation: a fixed part (index lists and the batch through the worker's queue) and a part per
  byte (the batch built in shared memory by the worker and mapped by the main process), fitted by
  non-negative least squares (scipy.optimize.nnls) over the sizes' fastest runs;
- with 1, 2, 4, ... workers up to the CPUs this process may use (at most MAX_MEASURED_WORKERS), how
  throughput scales: the Universal Scalability Law X(N) = X(1) N / (1 + a (N - 1) + b N (N - 1)),
  contention a and coherency b fitted by scipy.optimize.curve_fit (b only from three or more worker
  counts; with two, a alone: the second worker's yield). a = b = 0 is linear scaling.

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
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy
import torch

from advisor.calibration.contention import cpu_snapshot
from advisor.pipeline.measure import loader_throughput, measure_samples, spread
from advisor.pipeline.stored import read_document, write_document
from advisor.probe.cpu import probe_cpu

FORMAT = "gpu-advisor-loader-mechanics"
SCHEMA = 2

SAMPLE_WORK = 20_000
"""Loop iterations of one synthetic sample (about 0.5-1 ms of one thread)."""

SIZES = (1_024, 150_528, 602_112)
"""Bytes of a small synthetic sample, of one 3 x 224 x 224 uint8 image and of one fp32 image."""

MAX_MEASURED_WORKERS = 8
"""Most workers the scaling is measured at (1, 2, 4, 8, and the CPU count when between)."""

BATCH = 16
BATCHES = 24
REPEATS = 3

MAX_SPREAD = 0.25
"""Largest (slowest - fastest) / median of repeated DataLoader runs, the median over the sizes and worker
counts measured, for a stored measurement (and twice it for the worst of them)."""


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
    contention: float
    """The scaling law's a: the serial share of the workers' time (0: none)."""
    coherency: float
    """The scaling law's b: cost growing with pairs of workers (0: none, or fewer than 3 worker counts)."""
    cpus: int
    """CPUs this process may run on."""
    measured_workers: tuple[int, ...]
    """The worker counts the scaling was measured at."""
    stored: bool
    """Whether the measurement passed its checks (and was stored); else it serves this run only."""
    note: str
    """What was measured and how steady it was, in a few words."""

    def scaling(self, workers: float) -> float:
        """Throughput of `workers` workers in units of one worker's (the fitted law; flat past the CPUs).

        # a = 0.1, b = 0, 4 workers: 4 / (1 + 0.1 * 3) = 3.08
        """
        n = max(1.0, min(workers, float(self.cpus)))
        return usl(n, self.contention, self.coherency)

    @property
    def second_worker_yield(self) -> float:
        """What a second worker adds, as a fraction of the first's rate (1.0: a core of its own)."""
        return self.scaling(2) - 1.0 if self.cpus >= 2 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "measured_workers": list(self.measured_workers),
                "second_worker_yield": self.second_worker_yield}


def usl(workers: Any, contention: float, coherency: float) -> Any:
    """The Universal Scalability Law's relative throughput N / (1 + a (N - 1) + b N (N - 1))."""
    return workers / (1.0 + contention * (workers - 1.0) + coherency * workers * (workers - 1.0))


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
    body = read_document(_path(cache), FORMAT, SCHEMA)
    if body is None or body.get("fingerprint") != fingerprint():
        return None
    try:
        fields = body["mechanics"]
        return LoaderMechanics(float(fields["batch_s"]), float(fields["byte_s"]), float(fields["contention"]),
                               float(fields["coherency"]), int(fields["cpus"]),
                               tuple(int(n) for n in fields["measured_workers"]), True, str(fields["note"]))
    except (ValueError, KeyError, TypeError):
        return None


def store(cache: Path, mechanics: LoaderMechanics) -> None:
    body = {"fingerprint": fingerprint(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "mechanics": mechanics.to_dict()}
    write_document(_path(cache), FORMAT, SCHEMA, body)


def mechanics(cache: Path, progress: Callable[[str], None] = lambda message: None) -> LoaderMechanics:
    """This machine's mechanics: stored ones, else measured now (a few seconds; `progress` hears it) and
    stored if steady."""
    known = load(cache)
    if known is not None:
        return known
    progress("timing this machine's DataLoader on a synthetic pipeline (once: it is stored)")
    measured = measure_mechanics()
    if measured.stored:
        store(cache, measured)
    return measured


def measure_mechanics() -> LoaderMechanics:
    """Time the synthetic pipeline one thread in-process and through the DataLoader (see the module)."""
    before = cpu_snapshot(), _children_cpu_s()
    spreads: list[float] = []
    batch_s, byte_s = _fit_costs(spreads)
    cpus = usable_cpus()
    counts = worker_counts(cpus)
    rates = {}
    for workers in counts:
        runs = [loader_throughput(Synthetic(SIZES[0]), BATCH, workers, BATCHES) for _ in range(REPEATS)]
        spreads.append(spread(runs))
        rates[workers] = statistics.median(runs)
    contention, coherency = fit_scaling({n: rate / rates[1] for n, rate in rates.items()})
    busy = others_cores(before, (cpu_snapshot(), _children_cpu_s()))
    quiet = busy is None or busy < 0.5
    steady = statistics.median(spreads) <= MAX_SPREAD and max(spreads) <= 2 * MAX_SPREAD
    measured = LoaderMechanics(batch_s, byte_s, contention, coherency, cpus, counts, quiet and steady, "")
    scaling = ", ".join(f"{n} workers {measured.scaling(n):.2f}x" for n in counts[1:]) or "one CPU"
    note = (f"DataLoader measured on a synthetic pipeline: {batch_s * 1e3:.2f} ms per batch + "
            f"{byte_s * 1e9:.2f} ns per byte; {scaling} of one; repeated runs within {statistics.median(spreads):.0%} (median; worst {max(spreads):.0%})"
            + ("" if quiet else f"; other programs kept {busy:.1f} CPUs busy"))
    return replace(measured, note=note)


def worker_counts(cpus: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to the CPUs (at most MAX_MEASURED_WORKERS), and the CPU count itself.

    # 6 CPUs: (1, 2, 4, 6); 2 CPUs: (1, 2); 32 CPUs: (1, 2, 4, 8)
    """
    top = max(1, min(cpus, MAX_MEASURED_WORKERS))
    counts = {1, top} | {2**k for k in range(1, 4) if 2**k <= top}
    return tuple(sorted(counts))


def _fit_costs(spreads: list[float]) -> tuple[float, float]:
    """(seconds per batch, seconds per byte) beyond one thread's samples and collation, by non-negative
    least squares over the fastest one-worker run at each sample size less the fastest round of the
    samples on one thread (what other programs add is noise, never a cost of the mechanism)."""
    rows, extras = [], []
    for size in SIZES:
        timing = measure_samples(Synthetic(size), BATCH)
        own = BATCH * (min(timing.rounds_s) + timing.collate_s)
        runs = [loader_throughput(Synthetic(size), BATCH, 1, BATCHES) for _ in range(REPEATS)]
        spreads.append(spread(runs))
        rows.append([1.0, BATCH * size])
        extras.append(BATCH / max(runs) - own)
    from scipy.optimize import nnls  # here: estimates import this module and fit nothing (0.3 s of scipy)
    (batch_s, byte_s), _ = nnls(numpy.array(rows), numpy.array(extras))
    return float(batch_s), float(byte_s)


def fit_scaling(relative: dict[int, float]) -> tuple[float, float]:
    """(contention a, coherency b) of the scaling law through `relative` (workers -> throughput in units
    of one worker's), both within [0, 1]; b is 0 with fewer than three worker counts.

    # two workers at 1.8x: 2 / (1 + a) = 1.8 -> a = 0.111
    """
    counts = sorted(relative)
    assert counts and counts[0] == 1, counts
    if len(counts) == 1:
        return 0.0, 0.0
    from scipy.optimize import curve_fit  # here: estimates import this module and fit nothing
    x = numpy.array(counts, dtype=float)
    y = numpy.array([relative[n] for n in counts])
    if len(counts) == 2:
        (a,), _ = curve_fit(lambda n, a: usl(n, a, 0.0), x, y, p0=[0.05], bounds=([0.0], [1.0]))
        return float(a), 0.0
    (a, b), _ = curve_fit(usl, x, y, p0=[0.05, 0.0], bounds=([0.0, 0.0], [1.0, 1.0]))
    return float(a), float(b)


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
