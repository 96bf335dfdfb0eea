"""Supply against demand: how many samples per second a host's CPUs prepare with the torch DataLoader,
against how many a GPU consumes.

One worker prepares a batch in `batch_cycle_s`: its samples and their collation on one thread (measured
here: measure.py), plus the DataLoader's own cost per batch and per byte moved through shared memory
(this machine's LoaderMechanics). Workers run side by side:
- on this machine, as measured: the scaling law fitted to its DataLoader at 1, 2, 4, ... workers
  (machine.LoaderMechanics.scaling), flat past its CPU count;
- on a cloud instance, whose vCPUs are hardware threads, two per physical core (AWS, Google Cloud and
  Azure document their GPU instances' vCPUs so): the training process keeps one vCPU busy (kernel
  launches, the pin-memory thread, receiving batches), the workers share the rest; the first thread of
  each core runs at full rate, a second thread on a core adds SMT_YIELD, and every busy thread gets its
  share of that;
  each thread at `thread_speed` of this machine's (hosts.thread_speed: the instance's CPU against this
  one by published single-thread scores; 1.0 where either is unknown).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from advisor.pipeline.machine import LoaderMechanics
from advisor.pipeline.measure import SampleTiming
from advisor.pipeline.storage import StorageRate

THREADS_PER_CORE = 2
"""vCPUs per physical core of the clouds' GPU instances (AWS EC2 "each vCPU is a thread of a CPU core";
Google Cloud and Azure likewise for their x86 machine types)."""

SMT_YIELD = 0.25
"""What a core's second hardware thread adds to its first on throughput work (Intel: Hyper-Threading
gives "up to 30%"; measured gains on decode-style integer work are 15-30%)."""

MAX_WORKERS = 64

PAGE_CACHE_SHARE = 0.5
"""Share of a host's memory the page cache may keep a dataset in across epochs: the rest goes to the
training process, its pinned batches and the workers (a dataset larger than this is read from storage
every epoch)."""


@dataclass(frozen=True)
class Host:
    """Where a GPU's batches are prepared: this machine, or a cloud instance's share per GPU."""

    name: str
    vcpus_per_gpu: float
    local: bool
    """True: the measured machine itself (its measured scaling applies)."""
    thread_speed: float = 1.0
    """One of its threads against one of this machine's (1.0: as fast, or unknown)."""
    cpu: str = ""
    """Its CPU and speed in a few words (empty: this machine)."""
    pcie_gen: int | None = None
    """The PCIe generation of its CPU's root ports (None: unknown, the GPU's own is taken)."""
    memory_bytes: float | None = None
    """Its memory (bytes), which the page cache may fill with the dataset (None: unknown)."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "vcpus_per_gpu": self.vcpus_per_gpu, "local": self.local,
                "thread_speed": self.thread_speed, "cpu": self.cpu, "pcie_gen": self.pcie_gen,
                "memory_bytes": self.memory_bytes}


@dataclass(frozen=True)
class PipelineProfile:
    """A pipeline measured on this machine, and this machine's DataLoader mechanics."""

    kind: str
    describe: str
    timing: SampleTiming
    mechanics: LoaderMechanics
    read_bytes_per_sample: float = 0.0
    """Bytes read from storage per sample (0: none, or not known)."""
    storage: StorageRate | None = None
    """This machine's storage for reads of this size (None: not measured)."""

    def batch_cycle_s(self, batch: int) -> float:
        """Seconds one worker takes to prepare and hand over a batch of `batch` samples."""
        timing, mechanics = self.timing, self.mechanics
        return batch * (timing.sample_s + timing.collate_s) + mechanics.batch_s \
            + mechanics.byte_s * batch * timing.sample_bytes

    def throughput(self, workers: int, host: Host, batch: int) -> float:
        """Samples per second `workers` DataLoader workers deliver on `host` (0: the main process alone)."""
        if workers == 0:
            return host.thread_speed / (self.timing.sample_s + self.timing.collate_s)
        return effective_workers(workers, host, self.mechanics) * host.thread_speed * batch \
            / self.batch_cycle_s(batch)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "describe": self.describe, "timing": self.timing.to_dict(),
                "mechanics": self.mechanics.to_dict(), "read_bytes_per_sample": self.read_bytes_per_sample,
                "storage": None if self.storage is None else self.storage.to_dict()}


def storage_share(samples: int | None, epochs: float | None, read_bytes_per_sample: float,
                  memory_bytes: float | None) -> float:
    """Share of a job's samples read from storage rather than the page cache: 1 / epochs when the dataset
    (`samples` x `read_bytes_per_sample`) fits in PAGE_CACHE_SHARE of the host's memory, else 1 (and 1
    where the dataset's size or the host's memory is unknown: a job given in steps).

    # 1.28 M ImageNet JPEGs of 110 KB = 141 GB, 90 epochs, on 1,152 GiB: 141 GB <= 618 GB -> 1 / 90
    """
    if samples is None or epochs is None or memory_bytes is None or read_bytes_per_sample <= 0:
        return 1.0
    fits = samples * read_bytes_per_sample <= PAGE_CACHE_SHARE * memory_bytes
    return 1.0 / epochs if fits and epochs > 1 else 1.0


def usable_workers(host: Host) -> int:
    """Workers a training run would start: every vCPU but the training process's own (this machine:
    every CPU, as its DataLoader was measured), at least one."""
    vcpus = math.floor(host.vcpus_per_gpu)
    return max(1, min(MAX_WORKERS, vcpus if host.local else vcpus - 1))


def effective_workers(workers: int, host: Host, mechanics: LoaderMechanics) -> float:
    """Workers' combined rate in units of one worker alone on a free core.

    # this machine, 2 CPUs, contention a = 0.081 (a second worker at +85%): 3 workers -> 2 / 1.081 = 1.85
    # 12 vCPUs per GPU (6 cores), 11 workers and the training process on 12 threads:
    # (6 + 0.25 * (12 - 6)) * 11 / 12 = 6.875; 4 workers: 5 threads on 6 cores, 5 * 4 / 5 = 4
    """
    if host.local:
        return mechanics.scaling(workers)
    cores = host.vcpus_per_gpu / THREADS_PER_CORE
    running = min(workers, max(1.0, host.vcpus_per_gpu - 1))
    threads = running + 1  # the training process keeps a hardware thread busy beside them
    capacity = min(threads, cores) + SMT_YIELD * max(0.0, threads - cores)
    return capacity * running / threads


@dataclass(frozen=True)
class Feed:
    """What else a batch needs on its way to the GPU: its copy over the host link, and its samples' reads
    from storage where the storage was measured."""

    copy_s: float = 0.0
    """Seconds to copy one optimizer step's batches from pinned host memory to the GPU (0: not assessed)."""
    link: str = ""
    """The host link and its rate in a few words (empty: not assessed)."""
    storage_samples_per_s: float | None = None
    """Samples per second the storage serves (None: not measured, or the pipeline reads nothing)."""
    storage_share: float = 1.0
    """Share of the job's samples read from storage; the rest come from the page cache (a dataset that
    fits in the host's memory is read from storage in its first epoch only)."""
    read_bytes_per_sample: float = 0.0


@dataclass(frozen=True)
class InputSupply:
    """One GPU's input pipeline: what its host supplies against what it consumes. Samples per second,
    seconds."""

    host: Host
    workers: int
    cpu_samples_per_s: float
    """What the host's workers prepare (the CPU's side)."""
    gpu_step_s: float
    """The GPU's step with the batch's copy, without any wait for input."""
    batch: int
    """Samples per optimizer step."""
    workers_needed: int | None
    """The fewest workers whose CPU side keeps up on this host (None: not even all of its vCPUs)."""
    feed: Feed = Feed()

    @property
    def demand_samples_per_s(self) -> float:
        return self.batch / self.gpu_step_s

    @property
    def first_samples_per_s(self) -> float:
        """Supply while samples come from storage: the slower of the CPU side and the storage."""
        storage = self.feed.storage_samples_per_s
        return self.cpu_samples_per_s if storage is None else min(self.cpu_samples_per_s, storage)

    @property
    def wait_s(self) -> float:
        """Seconds per step the GPU waits for input, averaged over the job: while reading from storage
        (storage_share of the samples) and while the page cache serves them."""
        share = self.feed.storage_share
        return share * self._wait(self.first_samples_per_s) + (1 - share) * self._wait(self.cpu_samples_per_s)

    def _wait(self, supply: float) -> float:
        return max(0.0, self.batch / supply - self.gpu_step_s)

    @property
    def supply_samples_per_s(self) -> float:
        """Samples per second the host delivers over the job (the CPU side and the storage together)."""
        share = self.feed.storage_share
        return 1.0 / (share / self.first_samples_per_s + (1 - share) / self.cpu_samples_per_s)

    @property
    def storage_limits(self) -> bool:
        """Whether the storage, not the CPU, sets the supply while reading from it."""
        storage = self.feed.storage_samples_per_s
        return storage is not None and storage < self.cpu_samples_per_s and self._wait(storage) > 0

    @property
    def stall_fraction(self) -> float:
        """Share of the step the GPU waits for input (0 when the supply keeps up)."""
        return self.wait_s / (self.gpu_step_s + self.wait_s)

    @property
    def limits(self) -> bool:
        return self.wait_s > 0

    def to_dict(self) -> dict[str, Any]:
        feed = self.feed
        return {"supply_samples_per_s": self.supply_samples_per_s,
                "demand_samples_per_s": self.demand_samples_per_s, "workers_needed": self.workers_needed,
                "vcpus_per_gpu": self.host.vcpus_per_gpu, "stall_fraction": self.stall_fraction,
                "workers": self.workers, "host": self.host.name, "host_cpu": self.host.cpu,
                "thread_speed": self.host.thread_speed, "limits": self.limits,
                "cpu_samples_per_s": self.cpu_samples_per_s, "wait_s": self.wait_s,
                "host_to_device_s": feed.copy_s, "host_link": feed.link,
                "storage_samples_per_s": feed.storage_samples_per_s, "storage_read_share": feed.storage_share,
                "storage_limits": self.storage_limits, "read_bytes_per_sample": feed.read_bytes_per_sample}


def input_supply(profile: PipelineProfile, host: Host, loader_batch: int, step_batch: int, gpu_step_s: float,
                 workers: int | None = None, feed: Feed = Feed()) -> InputSupply:
    """The pipeline on `host` with `workers` (None: usable_workers), its DataLoader batches of
    `loader_batch` samples, against a GPU taking `gpu_step_s` per step of `step_batch` samples."""
    most = usable_workers(host)
    chosen = most if workers is None else workers
    demand = step_batch / gpu_step_s
    needed = next((w for w in range(1, most + 1) if profile.throughput(w, host, loader_batch) >= demand), None)
    return InputSupply(host, chosen, profile.throughput(chosen, host, loader_batch), gpu_step_s, step_batch,
                       needed, feed)
