"""Real timers for the micro-benchmarks: `time.perf_counter` on CPUs, CUDA events on GPUs, both after a
warm-up, with medians over repeated samples. Seconds throughout."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch

from advisor.calibration.suite import Call, Timing


@dataclass(frozen=True)
class Sample:
    """Timing of one case: median seconds per call over `samples` samples of `inner` calls each."""

    seconds: float
    samples: int
    inner: int
    spread: float
    """Interquartile range of the samples over their median (0.02: the middle half lie within 2%)."""


class Clock:
    """Times `inner` back-to-back calls; subclasses say how."""

    device: str = "cpu"

    def time_calls(self, call: Call, inner: int) -> float:
        """Seconds for `inner` calls in a row, all finished."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for queued work (nothing on a CPU)."""

    def pause(self, seconds: float) -> None:
        """Let `seconds` pass without measuring (a burst of load passes)."""
        time.sleep(seconds)


class CPUClock(Clock):
    def time_calls(self, call: Call, inner: int) -> float:
        start = time.perf_counter()
        for _ in range(inner):
            call()
        return time.perf_counter() - start


class CUDAClock(Clock):
    """CUDA events around the calls on the current stream; the host waits for the end event."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._device = torch.device(device)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self._device)

    def time_calls(self, call: Call, inner: int) -> float:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3


class HostClock(CUDAClock):
    """Wall clock around calls on a GPU, then a synchronisation: the host's issue rate (per-op dispatch
    and launch overhead), which CUDA events, timing only the device, would not see."""

    def time_calls(self, call: Call, inner: int) -> float:
        self.synchronize()
        start = time.perf_counter()
        for _ in range(inner):
            call()
        self.synchronize()
        return time.perf_counter() - start


def measure(call: Call, clock: Clock, timing: Timing) -> Sample:
    """Median seconds of one call of `call`: warm up for `timing.warmup_s`, pick how many calls one
    sample holds so that it lasts `min_sample_s`, then take samples until `min_time_s` has passed and
    at least `min_samples` were taken."""
    first = clock.time_calls(call, 1)  # first call: lazy initialisation, allocation, kernel selection
    warm = clock.time_calls(call, 1)
    spent = first + warm
    while spent < timing.warmup_s:
        warm = clock.time_calls(call, 1)
        spent += warm
    per_call = max(warm, 1e-9)
    inner = max(1, math.ceil(timing.min_sample_s / per_call))
    samples: list[float] = []
    total = 0.0
    while len(samples) < timing.min_samples or total < timing.min_time_s:
        elapsed = clock.time_calls(call, inner)
        samples.append(elapsed / inner)
        total += elapsed
        if len(samples) >= 10_000:
            break
    median = statistics.median(samples)
    quartiles = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [median, median, median]
    return Sample(median, len(samples), inner, (quartiles[2] - quartiles[0]) / median if median > 0 else 0.0)
