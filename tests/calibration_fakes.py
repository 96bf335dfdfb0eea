"""A machine that does not exist, for calibration tests: a clock that times no real work but a model of
a steady device, and targets (a CPU, a CUDA GPU) that use it.

Tests about the cache, the CLI and the quality gates must not depend on this 2-core VM's weather (a
neighbour's load stalls a call by a scheduler slice, and the quality gates rightly refuse what that
measures). `steady_cases(monkeypatch)` makes every case's `build` return a tagged no-op, so the runner
builds no tensors (a CUDA case runs without a GPU) and `ModelClock` knows which case it times.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from advisor.calibration import runner as runner_module
from advisor.calibration.contention import CPUSnapshot
from advisor.calibration.peaks import DevicePeaks
from advisor.calibration.runner import Target
from advisor.calibration.suite import COMPUTE_OPS, FOREACH_TENSORS, Case, case_cost, load_suite
from advisor.calibration.timing import Clock


@dataclass(frozen=True)
class TaggedCall:
    """What a case builds under `steady_cases`: nothing to run, only which case it is."""

    case: Case

    def __call__(self) -> None:
        return None


def steady_cases(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cases build `TaggedCall`s (no tensors), no device memory is asked for, and /proc/stat reads as
    absent (this VM's real neighbours must not decide a test): `busy_machine` simulates one."""
    real_build = Case.build  # meta tensors (the cost registry's) stay real: they cost nothing

    def build(self: Case, device: str, cold_bytes: float = 0.0):
        return real_build(self, device) if device == "meta" else TaggedCall(self)

    monkeypatch.setattr(Case, "build", build)
    monkeypatch.setattr(runner_module, "_free_bytes", lambda target: None)
    monkeypatch.setattr(runner_module, "cpu_snapshot", lambda: None)


class ModelClock(Clock):
    """Every call of a case takes `seconds(case)`; the samples of a case agree exactly (spread 0).
    `elapsed`: the simulated seconds of every call timed so far (a busy_machine's wall clock)."""

    def __init__(self, seconds: Callable[[Case], float]) -> None:
        self.seconds = seconds
        self.elapsed = 0.0

    def time_calls(self, call: TaggedCall, inner: int) -> float:  # type: ignore[override]
        assert isinstance(call, TaggedCall), "use steady_cases(monkeypatch) with a ModelClock"
        seconds = self.seconds(call.case) * inner
        self.elapsed += seconds
        return seconds

    def pause(self, seconds: float) -> None:
        self.elapsed += seconds


def busy_machine(monkeypatch: pytest.MonkeyPatch, clock: ModelClock, others: Callable[[float], float],
                 slowdown: float = 1.0) -> None:
    """/proc/stat of a machine where other programs use `others(t)` CPUs at simulated second t of
    `clock`, and every call of the clock runs `slowdown` times slower while they use any: a burst of
    load (others non-zero for an interval) or a busy machine (always)."""
    state = {"busy": 0.0, "last": 0.0}

    def snapshot() -> CPUSnapshot:
        now = clock.elapsed
        state["busy"] += others(state["last"]) * (now - state["last"])  # the rate since the last snapshot
        state["last"] = now
        return CPUSnapshot(now, state["busy"], 0.0, 0.0)

    steady = clock.seconds
    clock.seconds = lambda case: steady(case) * (slowdown if others(clock.elapsed) > 0 else 1.0)
    monkeypatch.setattr(runner_module, "cpu_snapshot", snapshot)


def steady_seconds(flops_per_s: dict[str, float], bytes_per_s: float, latency_s: float = 5e-6,
                   dispatch_s: float = 2e-6) -> Callable[[Case], float]:
    """A steady device: a compute call takes latency + FLOPs / its dtype's rate, a memory call
    latency / 5 + bytes / bandwidth (no cache step), a tiny op `dispatch_s` (1.5x that with autograd,
    half of it per tensor of a multi-tensor op).
    Exactly the saturating curve with alpha = 1, so every fit is near-exact."""

    def seconds(case: Case) -> float:
        if case.op == "launch":
            if case.variant == "foreach":  # half a dispatch per tensor of the list
                return dispatch_s / 2 * FOREACH_TENSORS
            return dispatch_s * (1.5 if case.variant == "autograd" else 1.0)
        cost = case_cost(case)
        if case.op in COMPUTE_OPS:
            return latency_s + cost.flops / flops_per_s.get(case.dtype, flops_per_s["fp32"])
        return latency_s / 5 + cost.bytes / bytes_per_s

    return seconds


def with_clock(target: Target, seconds: Callable[[Case], float]) -> Target:
    """`target` timed by a ModelClock (device and host clock alike)."""
    clock = ModelClock(seconds)
    return dataclasses.replace(target, clock=clock, host_clock=clock)


def steady_cpu(target: Target) -> Target:
    """This CPU as a steady machine: compute at 30% of its fp32 peak (or 20 GFLOP/s without one),
    memory at 20 GB/s."""
    fp32 = target.peaks.flops.get("fp32")
    rate = 0.3 * fp32 if fp32 else 20e9
    return with_clock(target, steady_seconds({"fp32": rate}, 20e9))


def fake_cuda_target(cpu: Target, peaks: DevicePeaks, seconds: Callable[[Case], float],
                     cache_bytes: float = 50 * 2**20) -> Target:
    """A CUDA GPU that is not there: `cuda:0` with these peaks (a database GPU's), timed by a ModelClock;
    its fingerprint is the CPU's with the device changed."""
    fingerprint = dataclasses.replace(cpu.fingerprint, device="cuda:0", device_name="Fake GPU", cuda_version="12.4",
                                      gpu_driver="550.0")
    clock = ModelClock(seconds)
    return Target("cuda:0", "cuda", "Fake GPU", peaks, clock, clock, fingerprint,
                  {"torch": "test", "cuda": "12.4", "driver": "550.0", "python": "3"}, cache_bytes, "h100-sxm")


def steady_local_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, suite_text: str) -> None:
    """`--local` measures this CPU as a steady model of it (a real run on a loaded VM may rightly be
    refused by the quality gates) with the suite `suite_text`, and caches its profile under `tmp_path`."""
    from advisor.estimate import targets as targets_module

    monkeypatch.setenv("GPU_ADVISOR_CACHE_DIR", str(tmp_path / "cache"))
    suite_path = tmp_path / "suite.yaml"
    suite_path.write_text(suite_text)
    monkeypatch.setattr(targets_module, "load_suite", lambda: load_suite(suite_path))
    steady_cases(monkeypatch)
    real_target = targets_module.cpu_target
    monkeypatch.setattr(targets_module, "cpu_target", lambda suite: steady_cpu(real_target(suite)))
