"""Timing an input pipeline on this machine: one thread per sample, and the real torch DataLoader.

`measure_samples` times `dataset[i]` and `default_collate` on one thread in this process, in interleaved
rounds (the median of the rounds is kept, their spread is the measurement's quality): what one
DataLoader worker does per sample, since torch gives each worker one intra-op thread.
`loader_throughput` runs the real `torch.utils.data.DataLoader` with worker processes and counts samples
per second after its first batches (worker start-up excluded, as in a long epoch).
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, default_collate

ROUNDS = 5
"""Interleaved rounds of sample timing; the median round is kept."""

ROUND_S = 0.08
"""Target length of one round (seconds): enough samples that the timer's resolution does not matter."""

MAX_SAMPLES_PER_ROUND = 64


@dataclass(frozen=True)
class SampleTiming:
    """One thread's cost per sample of a pipeline. Seconds and bytes."""

    sample_s: float
    """dataset[i] on one thread (median of the rounds)."""
    collate_s: float
    """default_collate's share per sample, at `batch` samples per batch."""
    batch: int
    sample_bytes: float
    """Bytes of one sample's tensors once collated (what a worker hands to the main process)."""
    rounds_s: tuple[float, ...]
    """Each round's seconds per sample: their spread says how steady the measurement was."""
    read_bytes: float = 0.0
    """Bytes dataset[i] read through read() calls per sample (the kernel's count, /proc/self/io rchar;
    0 where the OS does not count, or for data mapped into memory)."""

    @property
    def spread(self) -> float:
        """How much the rounds differ (see spread())."""
        return spread(self.rounds_s)

    def to_dict(self) -> dict[str, Any]:
        return {"sample_s": self.sample_s, "collate_s": self.collate_s, "batch": self.batch,
                "sample_bytes": self.sample_bytes, "rounds_s": list(self.rounds_s), "read_bytes": self.read_bytes}


def spread(values: Sequence[float]) -> float:
    """(slowest - fastest) / median of repeated measurements of one thing."""
    return (max(values) - min(values)) / statistics.median(values)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads at one inside, as in a DataLoader worker."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def measure_samples(dataset: Any, batch: int, seed: int = 0) -> SampleTiming:
    """Seconds per sample of `dataset[i]` (random indices) and of collating `batch` samples, on one
    thread. Random numbers (the augmentations') are seeded."""
    random.seed(seed)
    torch.manual_seed(seed)
    length = len(dataset)
    with one_thread():
        for index in range(min(2, length)):  # first touches: lazy opens, caches
            dataset[index]
        per_round = _samples_per_round(dataset, length)
        rounds = []
        read_before = bytes_read()
        for _ in range(ROUNDS):
            indices = [random.randrange(length) for _ in range(per_round)]
            started = time.perf_counter()
            for index in indices:
                dataset[index]
            rounds.append((time.perf_counter() - started) / per_round)
        read_after = bytes_read()
        samples = [dataset[random.randrange(length)] for _ in range(batch)]
        collates = []
        for _ in range(3):
            started = time.perf_counter()
            collated = default_collate(samples)
            collates.append((time.perf_counter() - started) / batch)
    read = 0.0 if read_before is None or read_after is None else (read_after - read_before) / (ROUNDS * per_round)
    return SampleTiming(statistics.median(rounds), min(collates), batch, _tensor_bytes(collated) / batch,
                        tuple(rounds), read)


def bytes_read() -> int | None:
    """Bytes this process has read through read() calls so far (Linux /proc/self/io rchar), else None."""
    try:
        with open("/proc/self/io") as counters:
            for line in counters:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _samples_per_round(dataset: Any, length: int) -> int:
    started = time.perf_counter()
    dataset[random.randrange(length)]
    one = max(time.perf_counter() - started, 1e-6)
    return max(4, min(MAX_SAMPLES_PER_ROUND, round(ROUND_S / one)))


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def loader_throughput(dataset: Any, batch: int, workers: int, batches: int, warmup: int = 2,
                      seed: int = 0) -> float:
    """Samples per second the real DataLoader delivers with `workers` worker processes (0: the main
    process prepares every batch), over `batches` batches after `warmup` ones."""
    generator = torch.Generator().manual_seed(seed)
    sampler = torch.utils.data.RandomSampler(dataset, replacement=True, num_samples=(batches + warmup) * batch,
                                             generator=generator)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=workers,
                        prefetch_factor=2 if workers else None, persistent_workers=False)
    context = one_thread() if workers == 0 else contextlib.nullcontext()
    with context:
        iterator = iter(loader)
        for _ in range(warmup):
            next(iterator)
        started = time.perf_counter()
        for _ in range(batches):
            next(iterator)
        elapsed = time.perf_counter() - started
        del iterator
    return batches * batch / elapsed
