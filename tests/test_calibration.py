"""The calibration suite, timers, runner, cache and `advisor calibrate`, on this CPU with a tiny suite
(fast), plus one real quick calibration checked against an independent torch.mm and copy."""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from advisor.calibration import cache as cache_module
from advisor.calibration import runner as runner_module
from advisor.calibration.cache import load_profile, profile_path, store_profile
from advisor.calibration.profile import CalibrationProfile
from advisor.calibration.reference import ReferenceError, family_for, load_families, reference_profile
from advisor.calibration.runner import calibrate, cpu_target, run_suite
from advisor.calibration.suite import COMPUTE_OPS, Case, Suite, SuiteError, Timing, case_cost, load_suite
from advisor.calibration.timing import Clock, measure
from advisor.cli.main import main
from advisor.hardware.loader import load_hwdb
from advisor.paths import shipped_dir
from advisor.profile.costs import op_cost
from tests.calibration_fakes import steady_cases, steady_cpu

pytestmark = pytest.mark.slow  # seconds per test: `python -m pytest -m "not slow"` skips them

TINY_SUITE = """
schema: 1
timing:
  cpu:
    quick: {min_time_s: 0.002, warmup_s: 0.001, max_call_s: 0.5, min_samples: 3, min_sample_s: 0.0002}
    full: {min_time_s: 0.004, warmup_s: 0.001, max_call_s: 0.5, min_samples: 3, min_sample_s: 0.0002}
  cuda:
    quick: {min_time_s: 0.002, warmup_s: 0.001, max_call_s: 0.05, min_samples: 3, min_sample_s: 0.0002}
    full: {min_time_s: 0.004, warmup_s: 0.001, max_call_s: 0.05, min_samples: 3, min_sample_s: 0.0002}
series:
  launch:
    fit: none
    dtypes: {cpu: [fp32], cuda: [fp32]}
  copy:
    fit: hierarchy
    dtypes: {cpu: [fp32], cuda: [fp32]}
    sizes:
      cpu: {quick: [4096, 65536, 1048576], full: [16384]}
      cuda: {quick: [1048576], full: []}
  gemm:
    fit: saturating
    dtypes: {cpu: [fp32, fp16], cuda: [fp32]}
    sizes:
      cpu: {quick: [[32, 32, 32], [64, 64, 64], [1024, 1024, 1024]], full: []}
      cuda: {quick: [[256, 256, 256]], full: []}
"""


@pytest.fixture
def tiny_suite(tmp_path: Path):
    path = tmp_path / "suite.yaml"
    path.write_text(TINY_SUITE)
    return load_suite(path)


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("GPU_ADVISOR_CACHE_DIR", str(directory))
    return directory


# ---- costs of the cases, by hand ------------------------------------------------------------------------


def test_copy_reads_its_source_only_and_out_buffers_are_written() -> None:
    a, b = torch.ones(4), torch.empty(4)
    # copy_: reads 4 x 4 B of the source, writes 16 B of the destination (not 32 B read)
    cost = op_cost(torch.ops.aten.copy_.default, (b, a), {}, b)
    assert (cost.bytes_read, cost.bytes_written) == (16, 16)
    # mul.out: reads a (16 B), writes out (16 B); the out= buffer is not read
    cost = op_cost(torch.ops.aten.mul.out, (a, 3.0), {"out": b}, b)
    assert (cost.bytes_read, cost.bytes_written) == (16, 16)


def test_case_costs_by_hand() -> None:
    # mm 64x64 @ 64x64: 2 * 64 * 64 * 64 = 524,288 FLOPs; reads 2 * 64*64*4 B, writes 64*64*4 B = 49,152 B
    gemm = case_cost(Case("gemm", "fp32", (64, 64, 64)))
    assert (gemm.flops, gemm.bytes, gemm.ops) == (524_288, 49_152, 1)
    # copy of a 64 KiB array: 64 KiB read + 64 KiB written
    assert case_cost(Case("copy", "fp32", (65536,))).bytes == 131_072
    # triad a = b + 3 c: two arrays read, one written
    assert case_cost(Case("triad", "fp32", (65536,))).bytes == 3 * 65_536
    # reduction: 16,384 fp32 elements read, one 4-byte sum written; 16,384 adds
    reduction = case_cost(Case("reduction", "fp32", (65536,)))
    assert (reduction.flops, reduction.bytes) == (16_384, 65_540)
    # conv 1x8x16x16 -> 4 channels, 3x3, stride 1, padding 1: output 1x4x16x16 = 1,024 positions,
    # each 8 * 3 * 3 = 72 multiply-adds: 2 * 1,024 * 72 = 147,456 FLOPs;
    # bytes: input 8*16*16*4 = 8,192 + weight 4*8*3*3*4 = 1,152 + output 4*16*16*4 = 4,096 = 13,440
    conv = case_cost(Case("conv", "fp32", (1, 8, 4, 16, 3, 1, 1)))
    assert (conv.flops, conv.bytes) == (147_456, 13_440)
    # its backward: grad of input and of weight, one forward's FLOPs each
    assert case_cost(Case("conv_backward", "fp32", (1, 8, 4, 16, 3, 1, 1))).flops == 2 * 147_456


def test_shipped_suite_orders_cases_launch_memory_compute() -> None:
    suite = load_suite()
    cases = suite.cases("cpu", quick=True)
    ops = [case.op for case in cases]
    assert ops[:2] == ["launch", "launch"]
    assert ops.index("copy") < ops.index("gemm") and ops.index("layer_norm") < ops.index("conv")
    assert "tf32" not in {case.dtype for case in cases}  # no TF32 on CPUs
    assert len(suite.cases("cpu", quick=False)) > len(cases)
    gemm = [case_cost(c).flops for c in cases if c.series == "gemm/fp32"]
    assert gemm == sorted(gemm)  # sizes run smallest first, so a slow dtype is skipped before it is slow


@pytest.mark.parametrize("edit, message", [
    (("fit: saturating", "fit: cubic"), "series.gemm.fit: expected one of"),
    (("[32, 32, 32]", "[32, 32]"), "series.gemm.sizes.cpu.quick: [32, 32] is not 3 positive integers"),
    (("  gemm:", "  matmul:"), "series.matmul: unknown op"),
    (("min_samples: 3", "min_samples: 0"), "timing.cpu.quick: needs positive"),
])
def test_malformed_suite_names_file_and_key(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    path = tmp_path / "suite.yaml"
    path.write_text(TINY_SUITE.replace(*edit, 1))
    with pytest.raises(SuiteError, match=str(path)) as error:
        load_suite(path)
    assert message in str(error.value)


# ---- the timer ------------------------------------------------------------------------------------------


class FakeClock(Clock):
    """Every call takes `per_call` seconds; counts calls."""

    def __init__(self, per_call: float) -> None:
        self.per_call = per_call
        self.calls = 0

    def time_calls(self, call, inner: int) -> float:
        self.calls += inner
        return self.per_call * inner


def test_measure_batches_tiny_calls_and_takes_the_median() -> None:
    clock = FakeClock(1e-4)
    timing = Timing(min_time_s=0.01, warmup_s=0.0, max_call_s=1.0, min_samples=5, min_sample_s=5e-4)
    sample = measure(lambda: None, clock, timing)
    # 5e-4 s per sample / 1e-4 s per call = 5 calls per sample; 0.01 s / 5e-4 s = 20 samples
    assert (sample.inner, sample.samples, sample.seconds, sample.spread) == (5, 20, pytest.approx(1e-4), 0.0)
    assert clock.calls == 2 + 20 * 5  # two warm-up calls, then the samples


def test_measure_times_real_work_with_perf_counter() -> None:
    timing = Timing(min_time_s=0.02, warmup_s=0.001, max_call_s=1.0, min_samples=3, min_sample_s=0.001)
    sample = measure(lambda: time.sleep(0.002), runner_module.CPUClock(), timing)
    assert 0.0019 < sample.seconds < 0.01


# ---- the runner -----------------------------------------------------------------------------------------


def test_tiny_calibration_fits_and_skips_what_is_too_slow(tiny_suite) -> None:
    target = cpu_target(tiny_suite)
    seen: list[tuple[int, int, str]] = []
    profile = calibrate(target, tiny_suite, quick=True, progress=lambda *a: seen.append(a))
    cases = len(tiny_suite.cases("cpu", True, set(target.peaks.flops) | {"fp32"}))
    assert seen[0] == (0, cases, "launch/fp32 dispatch") and seen[-1] == (len(seen) - 1, len(seen) - 1, "fitting")
    # a series disturbed by other programs is measured again: the total grows by its cases, never below done
    assert all(done <= total for done, total, _ in seen) and [d for d, _, _ in seen] == list(range(len(seen)))
    assert set(profile.overheads_s) == {"dispatch", "autograd", "foreach"}
    assert 1e-8 < profile.overheads_s["dispatch"] < 1e-3
    # per tensor of a multi-tensor op's list: no more than one whole dispatch (it skips Python)
    assert 1e-9 < profile.overheads_s["foreach"] < 2 * profile.overheads_s["dispatch"]
    copy = profile.get("copy", "fp32")
    assert copy.axis == "bytes" and len(copy.measurements) == 3 and copy.fit.points == 3
    gemm = profile.get("gemm", "fp32")
    labels = [m.label for m in gemm.measurements]
    assert labels in (["32x32x32", "64x64x64", "1024x1024x1024"], ["32x32x32", "64x64x64"])
    if len(labels) == 2:  # a loaded machine: 32^3 and 64^3 both below 4.3 GFLOP/s: 1024^3 predicted over 0.5 s
        assert gemm.skipped[0].label == "1024x1024x1024" and "limit 0.5 s" in gemm.skipped[0].reason
    for m in gemm.measurements:  # the fraction is of the roofline: min(peak, intensity x sustained bandwidth)
        roof = min(gemm.peak, m.flops / m.bytes * profile.sustained_bandwidth_bytes_per_s)
        assert m.fraction == pytest.approx(m.flops / m.seconds / roof)
    # fp16 GEMM on a CPU without fp16 units (~4 GFLOP/s here): 1024^3 predicted from the 64^3 rate at
    # over 0.5 s, skipped with the reason. (fp32 1024^3 is skipped only if 64^3 ran below 4.3 GFLOP/s:
    # 2 * 1024^3 / 0.5 s; a 0.05 s limit made that a coin toss on a loaded 2-core VM.)
    fp16 = profile.get("gemm", "fp16")
    if fp16.skipped:
        assert fp16.skipped[0].label == "1024x1024x1024" and "limit 0.5 s" in fp16.skipped[0].reason
    assert profile.fingerprint == target.fingerprint and profile.status == "measured" and profile.mode == "quick"
    assert CalibrationProfile.from_dict(json.loads(json.dumps(profile.to_dict()))) == profile


# ---- the cache ------------------------------------------------------------------------------------------


@pytest.fixture
def stored(tiny_suite, cache_dir: Path) -> tuple[CalibrationProfile, Path]:
    profile = calibrate(cpu_target(tiny_suite), tiny_suite, quick=True)
    return profile, store_profile(profile)


def test_cache_round_trip_and_atomic_write(stored) -> None:
    profile, path = stored
    assert path == profile_path("cpu") and path.parent.name == "calibration"
    cached = load_profile("cpu", profile.fingerprint)
    assert cached.usable and cached.profile == profile and cached.problem is None
    assert [p.name for p in path.parent.iterdir()] == ["cpu.json"]  # no temporary left behind


def test_fingerprint_change_makes_the_cache_foreign(stored) -> None:
    profile, _ = stored
    newer = dataclasses.replace(profile.fingerprint, torch_version="9.9.9")
    cached = load_profile("cpu", newer)
    assert not cached.usable
    assert cached.problem.startswith("foreign") and f"torch_version: {profile.fingerprint.torch_version} -> 9.9.9" \
        in cached.problem
    other_suite = dataclasses.replace(profile.fingerprint, suite_digest="0" * 16)
    assert "suite_digest" in load_profile("cpu", other_suite).problem


@pytest.mark.parametrize("damage, problem", [
    (lambda text: text[: len(text) // 2], "corrupt: not JSON"),
    (lambda text: text.replace('"format": "gpu-advisor-calibration"', '"format": "other"'), "corrupt: not a"),
    (lambda text: text.replace('"mode": "quick"', '"mode": "full"'), "corrupt: checksum"),
    (lambda text: text.replace('"schema": 1', '"schema": 99'), "stale: schema 99"),
    (lambda text: "\udcff", "corrupt"),
])
def test_corrupt_cache_is_detected_never_trusted(stored, damage, problem: str) -> None:
    profile, path = stored
    path.write_text(damage(path.read_text()), errors="surrogateescape")
    cached = load_profile("cpu", profile.fingerprint)
    assert not cached.usable and cached.problem.startswith(problem), cached.problem


def test_failed_write_leaves_the_old_profile_and_no_temporary(stored, monkeypatch: pytest.MonkeyPatch) -> None:
    profile, path = stored
    before = path.read_bytes()

    def broken_fsync(*args, **kwargs):  # the temporary is written, not yet synced nor renamed
        raise OSError("disk full")

    monkeypatch.setattr(cache_module.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        store_profile(dataclasses.replace(profile, mode="full"))
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == ["cpu.json"]


# ---- `advisor calibrate` --------------------------------------------------------------------------------


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def cli_tiny_suite(tiny_suite, monkeypatch: pytest.MonkeyPatch):
    """The tiny suite for `advisor calibrate`, on a steady model of this CPU (tests/calibration_fakes.py):
    these tests are about the CLI and the cache, and a real run on a loaded VM may rightly be refused
    by the quality gates."""
    monkeypatch.setattr("advisor.calibration.suite.load_suite", lambda: tiny_suite)  # calibrate imports it on use
    steady_cases(monkeypatch)
    real_target = runner_module.cpu_target
    monkeypatch.setattr(runner_module, "cpu_target", lambda suite: steady_cpu(real_target(suite)))
    return tiny_suite


def test_cli_calibrates_stores_and_shows(capsys, cache_dir: Path, cli_tiny_suite) -> None:
    code, out, err = run_cli(capsys, "calibrate", "--quick", "--device", "cpu")
    assert code == 0 and "advisor: stored" in err
    assert "Calibration of cpu" in out and "gemm" in out and "per-op host overhead" in out
    code, shown, _ = run_cli(capsys, "calibrate", "--show")
    assert code == 0 and "quick run" in shown
    code, as_json, _ = run_cli(capsys, "calibrate", "--show", "--json")
    data = json.loads(as_json)
    assert data["path"] == str(profile_path("cpu")) and data["status"] == "measured"
    assert {s["op"] for s in data["series"]} == {"copy", "gemm"}


def test_cli_replaces_a_corrupt_cache_and_says_so(capsys, cache_dir: Path, cli_tiny_suite) -> None:
    path = profile_path("cpu")
    path.parent.mkdir(parents=True)
    path.write_text("{ torn")
    code, _, err = run_cli(capsys, "calibrate", "--show")
    assert code == 2 and "corrupt: not JSON" in err and err.count("\n") == 1
    code, _, err = run_cli(capsys, "calibrate", "--quick")
    assert code == 0 and "replaced the cached profile, which was corrupt" in err
    assert load_profile("cpu", cpu_target(cli_tiny_suite).fingerprint).usable


def test_interrupted_run_stores_nothing(capsys, cache_dir: Path, cli_tiny_suite, monkeypatch) -> None:
    run_cli(capsys, "calibrate", "--quick")
    path = profile_path("cpu")
    before = path.read_bytes()
    calls = {"n": 0}
    real_measure = runner_module.measure

    def interrupted_measure(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:  # Ctrl-C in the middle of the suite
            raise KeyboardInterrupt
        return real_measure(*args, **kwargs)

    monkeypatch.setattr(runner_module, "measure", interrupted_measure)
    code, out, err = run_cli(capsys, "calibrate", "--quick")
    assert code == 130 and out == ""
    assert "interrupted; nothing was stored" in err and "left unchanged" in err
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == ["cpu.json"]


@pytest.mark.parametrize("argv, message", [
    (["--device", "gpu"], "argument --device: expected cpu or cuda:N"),
    (["--device", "cuda:x"], "argument --device: expected cpu or cuda:N"),
])
def test_cli_bad_device_is_a_usage_error(capsys, argv: list[str], message: str) -> None:
    assert main(["calibrate", *argv]) == 2 and message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cli_cuda_without_a_gpu_is_one_sentence(capsys, cache_dir: Path) -> None:
    code, out, err = run_cli(capsys, "calibrate", "--device", "cuda:0", "--quick")
    assert code == 2 and out == "" and "sees no CUDA device" in err and err.count("\n") == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tiny_calibration_on_a_gpu(tiny_suite, cache_dir: Path) -> None:
    target = runner_module.cuda_target(0, load_hwdb([]), tiny_suite)
    profile = calibrate(target, tiny_suite, quick=True)
    assert profile.get("gemm", "fp32").measurements and profile.fingerprint.gpu_driver


# ---- reference profiles ---------------------------------------------------------------------------------


def test_every_database_gpu_has_a_reference_profile_marked_default() -> None:
    db = load_hwdb([])
    families = load_families(db)
    assert family_for(db.gpu("h100-sxm"), families).id == "hopper"
    assert family_for(db.gpu("a100-sxm4-80gb"), families).id == "ampere-hbm"
    assert family_for(db.gpu("rtx-3090"), families).id == "ampere-gddr"
    for gpu in db.gpus:
        profile = reference_profile(gpu, families)
        assert profile.status == "default" and profile.sources
        gemm = profile.get("gemm", "fp32")
        assert gemm.peak == pytest.approx(gpu.peaks.fp32 * gpu.clock_ratio)  # at the clock a loaded card holds
        assert profile.peaks.flops["fp32"] == gpu.peaks.fp32  # MFU's denominator: the datasheet's
        copy = profile.get("copy", "fp32")
        assert copy.peak == gpu.bandwidth_bytes_per_s


def test_a_gpus_reference_profile_is_made_once_per_entry_and_family_list(tmp_path: Path) -> None:
    # every estimate over the database asks for each GPU's profile: the same entry and families give the same
    # object; other families (an edited defaults.yaml) give a profile of their own
    db = load_hwdb([])
    gpu, families = db.gpu("h100-sxm"), load_families(db)
    assert reference_profile(gpu, families) is reference_profile(gpu, families)
    shipped = shipped_dir("calibration", "suite.yaml") / "reference" / "defaults.yaml"
    (tmp_path / "defaults.yaml").write_text(shipped.read_text().replace("e_max: 0.80", "e_max: 0.70", 1))
    edited = reference_profile(gpu, load_families(db, tmp_path))
    assert edited is not reference_profile(gpu, families) and edited != reference_profile(gpu, families)


def test_h100_default_by_hand() -> None:
    db = load_hwdb([])
    gpu = db.gpu("h100-sxm")
    profile = reference_profile(gpu, load_families(db))
    # bf16 GEMM of 8192^3: 2 * 8192^3 = 1.0995e12 FLOPs; tau = work / peak; f = 0.80 / (1 + 6 us / tau)
    work = 2 * 8192**3
    tau = work / gpu.peaks.bf16_tensor
    assert profile.get("gemm", "bf16").efficiency(work) == pytest.approx(0.80 / (1 + 6e-6 / tau))
    # convolutions run at 0.8 of GEMM's asymptote in the defaults
    assert profile.get("conv", "bf16").fit.curve.param("e_max") == pytest.approx(0.80 * 0.8)
    assert profile.sustained_bandwidth_bytes_per_s == pytest.approx(0.85 * gpu.bandwidth_bytes_per_s)


def test_a_measured_reference_wins_over_the_default(tmp_path: Path, tiny_suite) -> None:
    db = load_hwdb([])
    reference = tmp_path / "reference"
    (reference / "measured").mkdir(parents=True)
    shipped = shipped_dir("calibration", "suite.yaml") / "reference" / "defaults.yaml"
    (reference / "defaults.yaml").write_text(shipped.read_text())
    measured = calibrate(cpu_target(tiny_suite), tiny_suite, quick=True)
    document = {"applies_to": {"gpu_ids": ["h100-sxm"]}, "profile": measured.to_dict()}
    (reference / "measured" / "h100-sxm.json").write_text(json.dumps(document))
    families = load_families(db, reference)
    gpu = db.gpu("h100-sxm")
    assert family_for(gpu, families).id == "h100-sxm"
    assert family_for(db.gpu("h200-sxm"), families).id == "hopper"
    profile = reference_profile(gpu, families)
    assert profile.status == "measured" and profile.get("gemm", "fp32").peak == gpu.peaks.fp32


def test_reference_with_an_unknown_source_names_file_entry_key(tmp_path: Path) -> None:
    db = load_hwdb([])
    shipped = shipped_dir("calibration", "suite.yaml") / "reference" / "defaults.yaml"
    (tmp_path / "defaults.yaml").write_text(shipped.read_text().replace("sources: [E1, E4, E5, E6, E7, GT1]", "sources: [E1, E99]", 1))
    with pytest.raises(ReferenceError, match=r"defaults.yaml: entry hopper, key 'sources': unknown source 'E99'"):
        load_families(db, tmp_path)



def test_reference_families_are_read_once_until_a_file_changes(tmp_path: Path) -> None:
    db = load_hwdb([])
    shipped = shipped_dir("calibration", "suite.yaml") / "reference" / "defaults.yaml"
    (tmp_path / "defaults.yaml").write_text(shipped.read_text())
    first = load_families(db, tmp_path)
    assert load_families(db, tmp_path) is first  # the same files: not parsed again
    # an edited defaults.yaml (another size) is read again, and an error in it is reported
    (tmp_path / "defaults.yaml").write_text(shipped.read_text().replace("sources: [E1, E4, E5, E6, E7, GT1]",
                                                                        "sources: [E1, E99]", 1))
    with pytest.raises(ReferenceError, match="unknown source 'E99'"):
        load_families(db, tmp_path)

# ---- the done-when check: a real quick calibration against an independent measurement ---------------------


def _independent_seconds(call, repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@pytest.fixture(scope="module")
def quick_cpu_profile(tmp_path_factory: pytest.TempPathFactory) -> CalibrationProfile:
    """The runner's own quick profile, stored and read back, before the quality gates: what is checked
    is the measurement (on a loaded VM the gates may rightly refuse a run; tests/test_calibration_quality.py
    covers them)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GPU_ADVISOR_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        suite = load_suite()
        store_profile(calibrate(cpu_target(suite), suite, quick=True))
        cached = load_profile("cpu", cpu_target(suite).fingerprint)
    assert cached.usable
    return cached.profile


def _reported_rate(profile: CalibrationProfile, op: str, label: str) -> float:
    series = profile.get(op, "fp32")
    measurement = series.measured(label)
    assert measurement is not None, f"{op} {label} not in the profile"
    return series.rate(measurement)


def _one_case_suite(op: str, label: str) -> Suite:
    """The shipped suite narrowed to one fp32 case of `op` (the one with `label`), quick sizes on a CPU."""
    suite = load_suite()
    series = next(s for s in suite.series if s.op == op)
    size = next(case.size for case in suite.cases("cpu", quick=True)
                if case.op == op and case.dtype == "fp32" and case.label == label)
    narrowed = dataclasses.replace(series, dtypes={"cpu": ("fp32",)}, sizes={"cpu": {"quick": (size,), "full": ()}})
    return dataclasses.replace(suite, series=(narrowed,))


def _suite_rate(op: str, label: str) -> float:
    """The achieved rate of one case timed again by the suite's own runner (run_suite and its measure)."""
    (result,), _, _ = run_suite(cpu_target(load_suite()), _one_case_suite(op, label), quick=True)
    work = result.flops if op in COMPUTE_OPS else result.bytes
    return work / result.sample.seconds


AGREEMENT = 0.25
"""How close the suite's rate and an independent timing of the same op must be: work counted or timed wrong by
2x fails. Each pair is measured in a fresh process (_in_a_fresh_process): there they agree within 3% (the 256
MiB copy: 33.5 against 32.9 GB/s, five rounds on 2026-11-27), while inside this test process, after the rest of
this file or of the suite, the best of six interleaved rounds stayed 16-36% apart either way round on this
2-core VM (copy 52.7 against 45.3 GB/s, then 34.5 against 44.5 and 40.1 against 29.6; the 1024^3 GEMM 178.6
against 151.9 and 185.4 against 135.9 GFLOP/s), which no busy process beside it reproduced; huge pages are
off. The cause is not found."""

INDEPENDENT = {
    # mm 1024x1024 @ 1024x1024: 2 * 1024^3 FLOPs
    ("gemm", "1024x1024x1024"): "a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)\n"
                                "rate = lambda: 2 * 1024**3 / _independent_seconds(lambda: torch.mm(a, b), 15)",
    # 256 MiB of fp32, far beyond any CPU cache; STREAM copy: one read and one write of the array
    ("copy", "256 MiB"): "source, target = torch.ones(64 * 2**20), torch.empty(64 * 2**20)\n"
                         "rate = lambda: 2 * 64 * 2**20 * 4 / _independent_seconds(lambda: target.copy_(source), 9)",
}

FRESH_PROCESS = """
import json, sys
sys.path.insert(0, {root!r})
import torch
from tests.test_calibration import _agrees, _independent_seconds, _suite_rate
{independent}
print(json.dumps(_agrees(_suite_rate({op!r}, {label!r}), {op!r}, {label!r}, rate)))
"""


def _in_a_fresh_process(op: str, label: str) -> tuple[float, float]:
    """(the suite's rate, an independent timing's) of one case, by _agrees in a new Python process."""
    script = FRESH_PROCESS.format(root=str(Path(__file__).resolve().parents[1]), op=op, label=label,
                                  independent=INDEPENDENT[op, label])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=600)
    reported, measured = json.loads(done.stdout.strip().splitlines()[-1])
    return reported, measured


def _agrees(reported: float, op: str, label: str, independent, attempts: int = 6) -> tuple[float, float]:
    """The suite's achieved rate for one case (`reported`) beside an independent timing of the same op. This
    VM's memory bandwidth and clocks drift by tens of percent over seconds (neighbours), so when the two
    disagree, the suite's runner times that one case again right after a new independent measurement, up to
    `attempts` times, and each side keeps its best rate so far (noise only ever slows a timing down, so the
    best of several converges on what the machine can do): what is checked is the suite's measurement, not
    the weather."""
    measured = independent()
    for _ in range(attempts - 1):
        if abs(reported / measured - 1) <= AGREEMENT:
            break
        measured = max(measured, independent())
        reported = max(reported, _suite_rate(op, label))
    return reported, measured


def test_quick_profile_matches_an_independent_torch_mm(quick_cpu_profile: CalibrationProfile) -> None:
    n = 1024
    flops = 2 * n**3  # mm 1024x1024 @ 1024x1024: 2 * 1024^3 FLOPs
    reported, measured = _in_a_fresh_process("gemm", "1024x1024x1024")
    assert reported == pytest.approx(measured, rel=AGREEMENT)  # a FLOP count off by 2x (MACs) fails
    # the fitted curve, with the packing of the 1024x1024 fp32 operand it fitted, speaks for that size
    # too, within the fit's own residual there
    series = quick_cpu_profile.get("gemm", "fp32")
    fitted = flops / (flops / quick_cpu_profile.achieved_rate("gemm", "fp32", flops)
                      + series.pack_seconds((1, n, n, n), 4))
    residual = series.fit.residuals[[m.label for m in series.measurements].index("1024x1024x1024")]
    assert fitted * (1 + residual) == pytest.approx(_reported_rate(quick_cpu_profile, "gemm", "1024x1024x1024"))


def test_quick_profile_matches_an_independent_copy() -> None:
    reported, measured = _in_a_fresh_process("copy", "256 MiB")
    assert reported == pytest.approx(measured, rel=AGREEMENT)  # a byte count or a timer off by 2x fails
