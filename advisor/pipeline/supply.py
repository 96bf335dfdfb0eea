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

THREADS_PER_CORE = 2
"""vCPUs per physical core of the clouds' GPU instances (AWS EC2 "each vCPU is a thread of a CPU core";
Google Cloud and Azure likewise for their x86 machine types)."""

SMT_YIELD = 0.25
"""What a core's second hardware thread adds to its first on throughput work (Intel: Hyper-Threading
gives "up to 30%"; measured gains on decode-style integer work are 15-30%)."""

MAX_WORKERS = 64


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

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "vcpus_per_gpu": self.vcpus_per_gpu, "local": self.local,
                "thread_speed": self.thread_speed, "cpu": self.cpu}


@dataclass(frozen=True)
class PipelineProfile:
    """A pipeline measured on this machine, and this machine's DataLoader mechanics."""

    kind: str
    describe: str
    timing: SampleTiming
    mechanics: LoaderMechanics
    read_bytes_per_sample: float = 0.0

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
                "mechanics": self.mechanics.to_dict(), "read_bytes_per_sample": self.read_bytes_per_sample}


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
class InputSupply:
    """One GPU's input pipeline: what its host supplies against what it consumes. Samples per second."""

    host: Host
    workers: int
    supply_samples_per_s: float
    demand_samples_per_s: float
    workers_needed: int | None
    """The fewest workers that keep up on this host (None: not even all of its vCPUs)."""

    @property
    def stall_fraction(self) -> float:
        """Share of the step the GPU waits for input: 1 - supply / demand, 0 when the supply keeps up."""
        return max(0.0, 1.0 - self.supply_samples_per_s / self.demand_samples_per_s)

    @property
    def limits(self) -> bool:
        return self.supply_samples_per_s < self.demand_samples_per_s

    def to_dict(self) -> dict[str, Any]:
        return {"supply_samples_per_s": self.supply_samples_per_s,
                "demand_samples_per_s": self.demand_samples_per_s, "workers_needed": self.workers_needed,
                "vcpus_per_gpu": self.host.vcpus_per_gpu, "stall_fraction": self.stall_fraction,
                "workers": self.workers, "host": self.host.name, "host_cpu": self.host.cpu,
                "thread_speed": self.host.thread_speed, "limits": self.limits}


def input_supply(profile: PipelineProfile, host: Host, batch: int, demand_samples_per_s: float,
                 workers: int | None = None) -> InputSupply:
    """The pipeline on `host` with `workers` (None: usable_workers) against the GPU's demand."""
    most = usable_workers(host)
    chosen = most if workers is None else workers
    needed = next((w for w in range(1, most + 1) if profile.throughput(w, host, batch) >= demand_samples_per_s),
                  None)
    return InputSupply(host, chosen, profile.throughput(chosen, host, batch), demand_samples_per_s, needed)
