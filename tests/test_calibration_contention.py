"""Contention while calibrating (issue #20): /proc/stat read by hand-computed cases, and the runner on a
simulated machine (tests/calibration_fakes.py: a ModelClock whose calls take the seconds we choose,
and /proc/stat as other programs would move it) where a burst of load is measured again and a busy
machine is refused, leaving the previous profile in place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from advisor.calibration import runner as runner_module
from advisor.calibration.cache import profile_path
from advisor.calibration.contention import (
    MAX_ATTEMPTS,
    MAX_REFERENCE_SLOWDOWN,
    REFERENCE_MAX_CALLS,
    REFERENCE_MIN_CALLS,
    CPUSnapshot,
    ReferenceKernel,
    allowed_busy_cores,
    contention_between,
    disturbance,
    read_proc_stat,
    reference_baseline,
)
from advisor.calibration.profile import CalibrationProfile, Contention
from advisor.calibration.quality import gate
from advisor.calibration.runner import calibrate
from advisor.calibration.suite import Suite
from advisor.cli.main import main
from tests.calibration_fakes import ModelClock, busy_machine
from tests.test_calibration_quality import CACHE, PEAKS, STEADY, suite  # noqa: F401 (suite: the fixture)

SERIES_ORDER = ("launch/fp32", "copy/fp32", "add/fp32", "gemm/fp32", "conv/fp32")
"""QUALITY_SUITE's series in run order: the runner reads /proc/stat before and after each."""


# ---- /proc/stat and the arithmetic --------------------------------------------------------------------------


def test_proc_stat_busy_and_steal() -> None:
    # user 100 nice 0 system 50 idle 800 iowait 0 irq 0 softirq 10 steal 40 at 100 ticks/s:
    # busy (100 + 0 + 50 + 0 + 10) / 100 = 1.6 s, steal 40 / 100 = 0.4 s
    assert read_proc_stat("cpu  100 0 50 800 0 0 10 40 0 0\ncpu0 1 2 3\n", 100.0) == (1.6, 0.4)
    # an old kernel without steal: 4 fields after "cpu"
    assert read_proc_stat("cpu  100 20 30 400\n", 100.0) == (1.5, 0.0)


def test_contention_between_two_snapshots() -> None:
    # 2 s apart, all CPUs busy 3.0 s of which ours 1.9 s, steal 0.2 s:
    # others (3.0 - 1.9) / 2 = 0.55 CPUs, steal 0.2 / 2 = 0.1 CPUs
    found = contention_between(CPUSnapshot(10.0, 5.0, 1.0, 2.0), CPUSnapshot(12.0, 8.0, 1.2, 3.9))
    assert (found.seconds, found.others_cores, found.steal_cores) == (2.0, 0.55, 0.1)
    assert found.busy_cores == pytest.approx(0.65)
    # no /proc/stat: nothing known, nothing disturbed
    unknown = contention_between(None, None)
    assert unknown.busy_cores is None and disturbance(unknown, 0.25) is None


def test_allowed_busy_cores_leaves_torch_threads_alone() -> None:
    assert allowed_busy_cores(2, 2) == 0.25  # 2 CPUs, 2 threads: 0 + 0.25
    assert allowed_busy_cores(16, 8) == 8.25  # 16 CPUs, 8 threads: 8 + 0.25
    assert disturbance(Contention(1.0, 0.2, 0.0), 0.25) is None
    assert "other programs used 1.00 CPUs" in disturbance(Contention(1.0, 1.0, 0.0), 0.25)
    assert "steal" in disturbance(Contention(1.0, 0.1, 0.5), 0.25)
    # a GPU (allowed None): only the reference kernel's slowdown counts
    assert disturbance(Contention(1.0, 1.0, 0.0), None) is None
    assert "1.50x slower" in disturbance(Contention(1.0, 0.0, 0.0, reference_slowdown=1.5), None)


# ---- the runner on a simulated machine ----------------------------------------------------------------------


def two_core_target(suite: Suite, clock: ModelClock) -> runner_module.Target:
    """This CPU with the fake peaks, a 2-core 2-thread fingerprint (0.25 CPUs allowed to others) and `clock`."""
    real = runner_module.cpu_target(suite)
    fingerprint = dataclasses.replace(real.fingerprint, cpu_cores=2, torch_threads=2)
    return dataclasses.replace(real, peaks=PEAKS, cache_bytes=float(CACHE), clock=clock, host_clock=clock,
                               fingerprint=fingerprint)


def snapshot_times(suite: Suite, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Simulated seconds at each /proc/stat read of a quiet run: before and after each series in turn."""
    clock = ModelClock(STEADY)
    times: list[float] = []

    def snapshot() -> CPUSnapshot:
        times.append(clock.elapsed)
        return CPUSnapshot(clock.elapsed, 0.0, 0.0, 0.0)

    monkeypatch.setattr(runner_module, "cpu_snapshot", snapshot)
    runner_module.run_suite(two_core_target(suite, clock), suite, quick=True)
    return times


class PausedClock(ModelClock):
    """A ModelClock that notes each pause the runner makes."""

    def __init__(self, seconds) -> None:
        super().__init__(seconds)
        self.pauses: list[float] = []

    def pause(self, seconds: float) -> None:
        self.pauses.append(seconds)
        super().pause(seconds)


def test_a_quiet_run_never_pauses(suite: Suite, monkeypatch) -> None:
    clock = PausedClock(STEADY)
    monkeypatch.setattr(runner_module, "cpu_snapshot", lambda: None)  # not this machine's /proc/stat
    calibrate(two_core_target(suite, clock), suite, quick=True)
    assert clock.pauses == []


def test_a_burst_of_load_is_measured_again_and_leaves_no_trace(suite: Suite, monkeypatch) -> None:
    quiet_clock = ModelClock(STEADY)
    quiet = calibrate(two_core_target(suite, quiet_clock), suite, quick=True)
    times = snapshot_times(suite, monkeypatch)
    gemm = SERIES_ORDER.index("gemm/fp32")
    start, end = times[2 * gemm], times[2 * gemm + 1]  # the gemm series of the first pass
    clock = PausedClock(STEADY)
    # one other program takes a whole CPU while gemm/fp32 runs, and each call then takes 3x as long
    busy_machine(monkeypatch, clock, lambda t: 1.0 if start <= t <= end else 0.0, slowdown=3.0)
    profile = calibrate(two_core_target(suite, clock), suite, quick=True)
    # before measuring it again the run let RETRY_PAUSE_S pass (a burst of seconds passes), once
    assert clock.pauses == [runner_module.RETRY_PAUSE_S]
    series = profile.get("gemm", "fp32")
    # measured again later in the run, quiet then: the fastest sample of each case is the quiet one
    assert series.contention.attempts == 2 and series.contention.others_cores == 0.0
    assert [m.seconds for m in series.measurements] == [m.seconds for m in quiet.get("gemm", "fp32").measurements]
    assert series.fit == quiet.get("gemm", "fp32").fit
    # the other series were not disturbed: measured once
    assert {s.key: s.contention.attempts for s in profile.series if s.key != "gemm/fp32"} == {
        "copy/fp32": 1, "add/fp32": 1, "conv/fp32": 1}
    result = gate(profile, "cpu", CACHE)
    assert result.quality.accepted and not result.quality.dropped



def busy_profile(suite: Suite, monkeypatch: pytest.MonkeyPatch, others: float) -> CalibrationProfile:
    clock = ModelClock(STEADY)
    busy_machine(monkeypatch, clock, lambda t: others, slowdown=3.0)
    return calibrate(two_core_target(suite, clock), suite, quick=True)


def test_a_busy_machine_is_refused_after_every_attempt(suite: Suite, monkeypatch) -> None:
    profile = busy_profile(suite, monkeypatch, 1.0)
    assert {s.contention.attempts for s in profile.series} == {MAX_ATTEMPTS}
    assert profile.conditions.contention.others_cores == pytest.approx(1.0)
    result = gate(profile, "cpu", CACHE)
    assert not result.quality.accepted and result.profile is None
    assert ("gemm/fp32 contention: other programs used 1.00 CPUs while it was measured (at most 0.25 leave "
            f"torch's threads alone) (in each of {MAX_ATTEMPTS} attempts)") in result.quality.refused_by
    assert "other programs used 1.00 CPUs" in result.quality.load_text()


def test_light_background_work_is_not_contention(suite: Suite, monkeypatch) -> None:
    # daemons at 0.1 CPUs (below 0.25): measured once, accepted
    profile = busy_profile(suite, monkeypatch, 0.1)
    assert {s.contention.attempts for s in profile.series} == {1}
    assert gate(profile, "cpu", CACHE).quality.accepted


def test_the_reference_kernel_is_the_best_of_enough_calls_to_ride_out_a_burst() -> None:
    # a 0.2 ms kernel whose first 6 timed calls each caught a wake-up or a burst (0.35 ms): best of 3
    # would read 1.75x its real time; it is timed until 20 ms of calls: 6 x 0.35 + 89 x 0.2 = 19.9 ms, one
    # more makes 20.1 ms: 6 + 90 = 96 calls
    seconds = iter([1e-3] + [3.5e-4] * 6 + [2e-4] * 200)  # the first: the untimed warm-up call
    calls = []
    kernel = ReferenceKernel(lambda: None, lambda call: calls.append(call) or next(seconds))
    assert kernel.seconds() == pytest.approx(2e-4)
    assert len(calls) == 1 + 96
    # a GPU-fast kernel (10 us) stops at REFERENCE_MAX_CALLS; a slow one (10 ms) at REFERENCE_MIN_CALLS
    assert len(_calls_to_time(1e-5)) == REFERENCE_MAX_CALLS and len(_calls_to_time(1e-2)) == REFERENCE_MIN_CALLS


def test_the_run_baseline_is_the_lower_quartile_of_the_reference_times_not_the_fastest() -> None:
    # 9 series: sorted index (9 - 1) // 4 = 2, the third fastest: 1.0 ms; one lucky 0.6 ms reading does not
    # make the run's typical 1.0-1.1 ms readings look 1.7-1.8x slowed down
    times = [1.1e-3, 0.6e-3, 1.0e-3, 1.05e-3, 0.95e-3, 1.1e-3, 1.0e-3, 2.0e-3, 1.08e-3]
    assert reference_baseline(times) == pytest.approx(1.0e-3)
    # a series at 2.0 ms is still 2.0 / 1.0 = 2x: slowed down
    assert 2.0e-3 / reference_baseline(times) > MAX_REFERENCE_SLOWDOWN
    # up to 4 series: index (4 - 1) // 4 = 0, the fastest
    assert reference_baseline([3.0, 1.0, 2.0, 4.0]) == 1.0


def _calls_to_time(call_s: float) -> list[float]:
    timed: list[float] = []
    kernel = ReferenceKernel(lambda: None, lambda call: call_s)
    kernel._time = lambda call: timed.append(call_s) or call_s
    kernel.seconds()
    return timed


def _slowed_while(suite: Suite, monkeypatch, window: Callable[[float, float, float], tuple[float, float]]):
    """A calibration on a host that runs everything 2x slower within window(start, timed, end) of the
    simulated clock: in the quiet run, copy/fp32's reference kernel runs from `start` to `timed` (the
    /proc/stat read before its cases), its cases and the reference kernel after them until `end`."""
    times = snapshot_times(suite, monkeypatch)
    copy = SERIES_ORDER.index("copy/fp32")
    low, high = window(times[2 * copy - 1], times[2 * copy], times[2 * copy + 1])
    clock = ModelClock(STEADY)
    slow = clock.seconds
    clock.seconds = lambda case: slow(case) * (2.0 if low <= clock.elapsed <= high else 1.0)
    monkeypatch.setattr(runner_module, "cpu_snapshot", lambda: None)
    return calibrate(two_core_target(suite, clock), suite, quick=True)


def test_a_slowed_reference_kernel_measures_the_series_again(suite: Suite, monkeypatch) -> None:
    # no other program in /proc/stat, but the host runs everything 2x slower while copy/fp32 is first
    # measured (a neighbour VM's memory traffic): the reference GEMM before and after it tell. At half speed
    # the series and its two reference kernels take twice as long: the window ends at start + 2 x (end - start)
    profile = _slowed_while(suite, monkeypatch, lambda start, timed, end: (start, start + 2 * (end - start)))
    copy_series = profile.get("copy", "fp32")
    assert copy_series.contention.attempts == 2 and copy_series.contention.reference_slowdown == 1.0
    assert gate(profile, "cpu", CACHE).quality.accepted


def test_a_stall_before_a_series_alone_does_not_measure_it_again(suite: Suite, monkeypatch) -> None:
    # slow only while the reference kernel before copy/fp32 runs (at half speed, twice its quiet span): the
    # one after the series ran at full speed, so the series was not slowed down
    profile = _slowed_while(suite, monkeypatch, lambda start, timed, end: (start, start + 2 * (timed - start)))
    copy_series = profile.get("copy", "fp32")
    assert copy_series.contention.attempts == 1 and copy_series.contention.reference_slowdown == 1.0


def test_cli_refuses_a_busy_machine_and_keeps_the_previous_profile(capsys, suite: Suite, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_ADVISOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("advisor.calibration.suite.load_suite", lambda: suite)
    real = runner_module.cpu_target
    clocks: list[ModelClock] = []

    def target(s: Suite) -> runner_module.Target:
        clock = clocks[-1]
        fake = dataclasses.replace(real(s), peaks=PEAKS, cache_bytes=float(CACHE), clock=clock, host_clock=clock)
        return dataclasses.replace(fake, fingerprint=dataclasses.replace(fake.fingerprint, cpu_cores=2,
                                                                         torch_threads=2))

    monkeypatch.setattr(runner_module, "cpu_target", target)
    # a quiet run, with one burst of load while copy/fp32 was first measured: stored, the burst shown
    clocks.append(ModelClock(STEADY))
    times = snapshot_times(suite, monkeypatch)
    copy = SERIES_ORDER.index("copy/fp32")
    busy_machine(monkeypatch, clocks[-1], lambda t: 1.0 if times[2 * copy] <= t <= times[2 * copy + 1] else 0.0)
    assert main(["calibrate", "--quick"]) == 0
    out = capsys.readouterr().out
    copy_row = next(line for line in out.splitlines() if line.startswith("copy "))
    add_row = next(line for line in out.splitlines() if line.startswith("add "))
    # the busy column: other programs' CPUs in the least disturbed attempt, and how many attempts
    assert "0.00 x2  pass" in copy_row and "0.00  pass" in add_row
    path = profile_path("cpu")
    before = path.read_bytes()
    clocks.append(ModelClock(STEADY))
    busy_machine(monkeypatch, clocks[-1], lambda t: 1.0, slowdown=3.0)
    assert main(["calibrate", "--quick"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "failed its quality gates and was not stored" in err and "contention: other programs used 1.00 CPUs" in err
    assert "close other programs and run it again" in err and f"({path} is left as it was)" in err
    assert path.read_bytes() == before
