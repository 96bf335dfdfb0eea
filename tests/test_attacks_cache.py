"""Issue #19, the calibration cache: a damaged, hostile or unwritable cache never crashes the tool,
is reported in one sentence, is never used, and the next calibration replaces it; a cache that
cannot be written is found before measuring; interrupted writes leave nothing behind for long.

The table runs through `advisor` itself (tests/attacks.py); the cases that need a fault injected
(a full disk, a read that fails, Ctrl-C at a given moment, a writer killed mid-write) call the cache
functions directly. Calibrations run a cut-down TINY_SUITE (two series, about a second), never the
shipped suite.
"""

from __future__ import annotations

import copy
import dataclasses
import errno
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from advisor.calibration import cache as cache_module
from advisor.calibration import runner as runner_module
from advisor.calibration.cache import (
    MAX_FILE_BYTES,
    CacheError,
    check_writable,
    clean_stale_temporaries,
    load_profile,
    profile_path,
    store_profile,
)
from advisor.calibration.curves import Curve, Fit
from advisor.calibration.peaks import DevicePeaks
from advisor.calibration.profile import CalibrationProfile, Fingerprint, Measurement, SeriesProfile
from advisor.calibration.runner import cpu_target
from advisor.calibration import suite as suite_module
from advisor.calibration.suite import Suite, load_suite
from advisor.cli import calibrate as calibrate_cli
from advisor.cli.main import main
from advisor.estimate import targets as targets_module
from tests.attacks import REPO, Attack, check_attack

pytestmark = pytest.mark.slow  # seconds per test: `python -m pytest -m "not slow"` skips them
from tests.calibration_fakes import steady_cases, steady_cpu
from tests.test_calibration import TINY_SUITE

FAST_SUITE = TINY_SUITE.replace(", [1024, 1024, 1024]", "").replace("[fp32, fp16]", "[fp32]")
"""TINY_SUITE without its 1024^3 GEMM and its fp16 series: a calibration in about a second."""

CACHE_ENV = {"GPU_ADVISOR_CACHE_DIR": "{tmp}/cache"}
CPU_JSON = "cache/calibration/cpu.json"

NOT_A_PID = 4_194_305
"""One above Linux's largest possible pid_max (PID_MAX_LIMIT, 2**22): no process ever has it."""


# ---- a synthetic profile, for documents whose checksum is right and whose content is not ---------------


FINGERPRINT = Fingerprint("cpu", "Test CPU", "Test CPU", 2, "0.0.0", 2, None, None, "0" * 16)


def synthetic_profile(fingerprint: Fingerprint = FINGERPRINT) -> CalibrationProfile:
    """A small well-formed measured profile, built by hand (no measuring)."""
    gemm = SeriesProfile("gemm", "fp32", "flops", 1e11, Fit(Curve.saturating(0.8, 1e-6), (0.01, -0.01), 0.01, 2), (
        Measurement("32x32x32", 65_536.0, 12_288, 2e-6, 10, 0.01, 0.33),
        Measurement("64x64x64", 524_288.0, 49_152, 8e-6, 10, 0.02, 0.65)))
    copy_ = SeriesProfile("copy", "fp32", "bytes", 1e10, Fit(Curve.hierarchy(0.9, 0.9, 1e6, 1e-7), (0.0,), 0.0, 1), (
        Measurement("4 KiB", 0.0, 8_192, 1e-6, 10, 0.0, 0.82),))
    return CalibrationProfile("cpu", "Test CPU", "measured", "quick", "2026-01-01T00:00:00+00:00",
                              DevicePeaks({"fp32": 1e11}, None, ()), 1e10, {"dispatch": 2e-6, "autograd": 3e-6},
                              (gemm, copy_), fingerprint, 1.0, {"torch": "0.0.0", "cuda": None}, (), ())


def document(edit: Callable[[dict[str, Any]], object] | None = None) -> str:
    """The synthetic profile's cache file after `edit` changed its body, checksum recomputed: only the
    structure check can refuse it."""
    body = copy.deepcopy(synthetic_profile().to_dict())
    if edit is not None:
        edit(body)
    wrapper = {"format": cache_module.FORMAT, "schema": cache_module.SCHEMA, "sha256": cache_module._checksum(body),
               "profile": body}
    return json.dumps(wrapper, indent=1)


def setting(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    """An edit that sets the value at a dotted path ("series.0.fit.curve.e_max")."""
    *parents, last = path.split(".")

    def edit(body: dict[str, Any]) -> None:
        node: Any = body
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[int(last) if isinstance(node, list) else last] = value
    return edit


def deleting(path: str) -> Callable[[dict[str, Any]], None]:
    *parents, last = path.split(".")

    def edit(body: dict[str, Any]) -> None:
        node: Any = body
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        del node[last]
    return edit


# ---- fault set-ups for the table -------------------------------------------------------------------------


def _folder_at_profile(tmp: Path) -> None:
    (tmp / CPU_JSON).mkdir(parents=True)


def _full_folder_at_profile(tmp: Path) -> None:
    (tmp / CPU_JSON).mkdir(parents=True)
    (tmp / CPU_JSON / "keep.txt").write_text("someone's file")


def _symlink_loop(tmp: Path) -> None:
    (tmp / CPU_JSON).parent.mkdir(parents=True)
    (tmp / CPU_JSON).symlink_to("cpu.json")  # reading it fails with ELOOP, even as root


def _sparse_gigabyte(tmp: Path) -> None:
    (tmp / CPU_JSON).parent.mkdir(parents=True)
    with open(tmp / CPU_JSON, "wb") as file:
        file.truncate(2**30)  # sparse: no disk used, and reading it whole would take 1 GB of memory


def _fifo(tmp: Path) -> None:
    (tmp / CPU_JSON).parent.mkdir(parents=True)
    os.mkfifo(tmp / CPU_JSON)  # opening it to read would block for ever


def _read_only_cache(tmp: Path) -> None:
    (tmp / "cache" / "calibration").mkdir(parents=True)
    (tmp / "cache" / "calibration").chmod(0o555)


def _unreadable_profile(tmp: Path) -> None:
    (tmp / CPU_JSON).chmod(0)


def _permission_bits_ignored() -> bool:
    """Whether this process reads a file whose mode is 000 (root, or CAP_DAC_OVERRIDE)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "locked"
        path.write_text("x")
        path.chmod(0)
        try:
            path.read_text()
        except PermissionError:
            return False
        return True


PERMISSION_BITS_IGNORED = _permission_bits_ignored()
"""Root reads and writes whatever the permission bits say: the rows that rely on them are skipped, and
the same faults are injected by the unit tests below."""

MALFORMED = (r"cpu\.json is malformed \(key {key}: {problem}.*\): it is not used; `advisor calibrate --device cpu` "
             "replaces it")

ATTACKS = [
    # finding 1: 100,000 nested lists made json raise RecursionError, in --show and in calibrate itself
    Attack("nested-show", ("calibrate", "--show"), files={CPU_JSON: "[" * 100_000}, env=CACHE_ENV,
           stderr=r"cpu\.json is corrupt: not JSON \(nested too deeply\): it is not used; `advisor calibrate "
                  r"--device cpu` replaces it", max_stderr_lines=1),
    Attack("nested-calibrate-replaces", ("calibrate", "--quick", "--json"), exit_code=0,
           files={CPU_JSON: '{"a": ' * 50_000}, env=CACHE_ENV, json_stdout=True,
           stderr=r"replaced the cached profile, which was corrupt: not JSON \(nested too deeply\)"),
    Attack("huge-integer", ("calibrate", "--show"), files={CPU_JSON: '{"format": ' + "9" * 5000 + "}"},
           env=CACHE_ENV, stderr=r"is corrupt: not JSON \(Exceeds the limit", max_stderr_lines=1),
    # finding 2: what stands at the profile's path is not a readable file
    Attack("folder-show", ("calibrate", "--show"), setup=_folder_at_profile, env=CACHE_ENV,
           stderr=r"cpu\.json is corrupt: a folder, not a file: it is not used", max_stderr_lines=1),
    Attack("empty-folder-calibrate-replaces", ("calibrate", "--quick"), exit_code=0, setup=_folder_at_profile,
           env=CACHE_ENV, stderr=r"replaced the cached profile, which was corrupt: a folder, not a file"),
    Attack("full-folder-calibrate-refuses", ("calibrate", "--quick"), setup=_full_folder_at_profile, env=CACHE_ENV,
           stderr=r"cannot store the calibration of cpu: .*cpu\.json is a folder, not a profile; remove it, or set "
                  r"\$GPU_ADVISOR_CACHE_DIR", max_stderr_lines=1),
    Attack("symlink-loop-show", ("calibrate", "--show"), setup=_symlink_loop, env=CACHE_ENV,
           stderr=r"cpu\.json is unreadable \(Too many levels of symbolic links\): it is not used",
           max_stderr_lines=1),
    Attack("symlink-loop-calibrate-replaces", ("calibrate", "--quick"), exit_code=0, setup=_symlink_loop,
           env=CACHE_ENV, stderr=r"replaced the cached profile, which was unreadable"),
    Attack("fifo-show", ("calibrate", "--show"), setup=_fifo, env=CACHE_ENV,
           stderr=r"cpu\.json is corrupt: not a regular file", max_stderr_lines=1, timeout_s=20),
    Attack("unreadable-show", ("calibrate", "--show"), files={CPU_JSON: document()}, setup=_unreadable_profile,
           env=CACHE_ENV, stderr=r"cpu\.json is unreadable \(Permission denied\)", max_stderr_lines=1),
    # finding 2: checksum-valid documents whose structure is wrong
    Attack("list-for-mapping", ("calibrate", "--show"), files={CPU_JSON: document(setting("peaks", []))},
           env=CACHE_ENV, stderr=MALFORMED.format(key="peaks", problem="expected a mapping, got a list"),
           max_stderr_lines=1),
    Attack("zero-bandwidth", ("calibrate", "--show"),
           files={CPU_JSON: document(setting("sustained_bandwidth_bytes_per_s", 0))}, env=CACHE_ENV,
           stderr=MALFORMED.format(key="sustained_bandwidth_bytes_per_s",
                                   problem="must be a finite number above zero, got 0"), max_stderr_lines=1),
    Attack("negative-peak-bandwidth", ("calibrate", "--show"),
           files={CPU_JSON: document(setting("peaks.bandwidth_bytes_per_s", -5e9))}, env=CACHE_ENV,
           stderr=MALFORMED.format(key=r"peaks\.bandwidth_bytes_per_s", problem="must be a finite number above zero"),
           max_stderr_lines=1),
    Attack("missing-key", ("calibrate", "--show"), files={CPU_JSON: document(deleting("overheads_s"))},
           env=CACHE_ENV, stderr=MALFORMED.format(key="overheads_s", problem="is missing"), max_stderr_lines=1),
    Attack("nan-peak", ("calibrate", "--show"), files={CPU_JSON: document(setting("series.0.peak", math.nan))},
           env=CACHE_ENV, stderr=MALFORMED.format(key=r"series\[0\]\.peak", problem="must be a finite number above "
                                                                                    "zero, got nan"),
           max_stderr_lines=1),
    Attack("nan-curve", ("calibrate", "--show"),
           files={CPU_JSON: document(setting("series.1.fit.curve.e_far", math.nan))}, env=CACHE_ENV,
           stderr=MALFORMED.format(key=r"series\[1\]\.fit\.curve\.e_far", problem="hierarchy curve parameters must "
                                                                                  "be finite and not negative"),
           max_stderr_lines=1),
    Attack("zero-seconds", ("calibrate", "--show"),
           files={CPU_JSON: document(setting("series.0.measurements.1.seconds", 0))}, env=CACHE_ENV,
           stderr=MALFORMED.format(key=r"series\[0\]\.measurements\[1\]\.seconds", problem="must be a finite number "
                                                                                           "above zero"),
           max_stderr_lines=1),
    Attack("text-for-number", ("calibrate", "--show"),
           files={CPU_JSON: document(setting("overheads_s.dispatch", "2us"))}, env=CACHE_ENV,
           stderr=MALFORMED.format(key=r"overheads_s\.dispatch", problem="expected a number, got a string"),
           max_stderr_lines=1),
    Attack("fingerprint-wrong-type", ("calibrate", "--show"),
           files={CPU_JSON: document(setting("fingerprint.cpu_cores", "2"))}, env=CACHE_ENV,
           stderr=MALFORMED.format(key=r"fingerprint\.cpu_cores", problem="expected a whole number, got a string"),
           max_stderr_lines=1),
    Attack("no-gemm-series", ("calibrate", "--show"),
           files={CPU_JSON: document(lambda body: body["series"].pop(0))}, env=CACHE_ENV,
           stderr=MALFORMED.format(key="series", problem=r"no gemm/fp32 series"), max_stderr_lines=1),
    Attack("unknown-key", ("calibrate", "--show"), files={CPU_JSON: document(setting("speedup", 10))},
           env=CACHE_ENV, stderr=MALFORMED.format(key="speedup", problem="unknown key"), max_stderr_lines=1),
    Attack("malformed-calibrate-replaces", ("calibrate", "--quick"), exit_code=0,
           files={CPU_JSON: document(setting("series", {}))}, env=CACHE_ENV,
           stderr=r"replaced the cached profile, which was malformed \(key series: expected a list, got a mapping\)"),
    # finding 4: a 1 GB file is refused by its size, unread
    Attack("gigabyte-show", ("calibrate", "--show"), setup=_sparse_gigabyte, env=CACHE_ENV,
           stderr=r"cpu\.json is corrupt: over 16 MiB, far more than any profile: it is not used", max_stderr_lines=1),
    # finding 3: a cache that cannot be written fails `advisor calibrate` before it measures
    Attack("cache-is-a-file", ("calibrate", "--quick"), files={"blocker": "a file"},
           env={"GPU_ADVISOR_CACHE_DIR": "{tmp}/blocker"},
           stderr=r"cannot store calibrations in .*blocker/calibration \(part of that path is a file, not a folder\); "
                  r"make it writable or set \$GPU_ADVISOR_CACHE_DIR to a folder that can be written",
           max_stderr_lines=1),
    Attack("read-only-cache", ("calibrate", "--quick"), setup=_read_only_cache, env=CACHE_ENV,
           stderr=r"cannot store calibrations in .*cache/calibration \(Permission denied\)", max_stderr_lines=1),
    Attack("cache-is-a-file-show", ("calibrate", "--show"), files={"blocker": "a file"},
           env={"GPU_ADVISOR_CACHE_DIR": "{tmp}/blocker"},
           stderr=r"no calibration of cpu is stored in .*blocker/calibration/cpu\.json; run `advisor calibrate",
           max_stderr_lines=1),
    # finding 3: `estimate --local` keeps the profile it measured, with one warning
    Attack("estimate-local-unwritable", ("estimate", str(REPO / "examples" / "mlp.py"), "--local", "--gpu",
                                         "h100-sxm", "--json"), exit_code=0, files={"blocker": "a file"},
           env={"GPU_ADVISOR_CACHE_DIR": "{tmp}/blocker"}, json_stdout=True, stdout=r'"gpu_id": "local-cpu"',
           stderr=r"advisor: warning: cannot store calibrations in .*blocker/calibration \(part of that path is a "
                  r"file, not a folder\): the quick calibration of cpu measured now is used for this run only"),
]

NEEDS_PERMISSIONS = {"read-only-cache", "unreadable-show"}


def replace_everywhere(monkeypatch: pytest.MonkeyPatch, name: str, value: object, *modules: ModuleType) -> None:
    """Set `name` in each module that has it: where it is defined (found there by a call-time import,
    as a CLI module that imports torch lazily does) and where it was imported by name."""
    for module in modules:
        if hasattr(module, name):
            monkeypatch.setattr(module, name, value)


@pytest.fixture
def fast_suite(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Suite:
    """FAST_SUITE in place of the shipped suite, for `advisor calibrate` and `estimate --local`."""
    path = tmp_path_factory.mktemp("suite") / "suite.yaml"
    path.write_text(FAST_SUITE)
    suite = load_suite(path)
    replace_everywhere(monkeypatch, "load_suite", lambda: suite, suite_module, calibrate_cli, targets_module)
    # a steady model of this CPU (tests/calibration_fakes.py): a real run on a loaded VM may rightly be
    # refused by the quality gates, and these tests are about the cache
    steady_cases(monkeypatch)
    real_target = runner_module.cpu_target
    replace_everywhere(monkeypatch, "cpu_target", lambda suite: steady_cpu(real_target(suite)), runner_module,
                       targets_module, sys.modules[__name__])
    return suite


@pytest.mark.parametrize("attack", [
    pytest.param(a, id=a.name, marks=pytest.mark.skipif(PERMISSION_BITS_IGNORED and a.name in NEEDS_PERMISSIONS,
                                                        reason="root ignores permission bits"))
    for a in ATTACKS
])
def test_cache_attack(attack: Attack, tmp_path: Path, capfd: pytest.CaptureFixture[str],
                      monkeypatch: pytest.MonkeyPatch, fast_suite: Suite) -> None:
    try:
        outcome = check_attack(attack, tmp_path, capfd, monkeypatch)
    finally:
        if attack.name == "read-only-cache":
            (tmp_path / "cache" / "calibration").chmod(0o755)
    assert outcome.stderr.count("advisor: warning") <= 1
    if attack.name.endswith("-replaces"):  # ... and what the calibration stored is used from now on
        cached = load_profile("cpu", cpu_target(fast_suite).fingerprint)
        assert cached.usable, cached.problem
        assert not [p.name for p in cached.path.parent.iterdir() if p.name != "cpu.json"]
    if attack.name == "full-folder-calibrate-refuses":  # nothing lost
        assert (tmp_path / CPU_JSON / "keep.txt").read_text() == "someone's file"


# ---- finding 2: unreadable files, and every structural check, on the loader itself ----------------------


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("GPU_ADVISOR_CACHE_DIR", str(directory))
    return directory


def write_profile_file(text: str) -> Path:
    path = profile_path("cpu")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_synthetic_profile_is_well_formed(cache_dir: Path) -> None:
    store_profile(synthetic_profile())
    cached = load_profile("cpu", FINGERPRINT)
    assert cached.usable and cached.profile == synthetic_profile()


def test_a_read_that_fails_is_reported_not_raised(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_profile_file(document())
    real_open = Path.open

    def denied(self: Path, *args: Any, **kwargs: Any):
        if self.name == "cpu.json":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", denied)
    cached = load_profile("cpu", FINGERPRINT)
    assert not cached.usable and cached.problem == "unreadable (Permission denied)"
    assert cached.why_unusable("cpu") == (f"{cached.path} is unreadable (Permission denied): it is not used; "
                                          "`advisor calibrate --device cpu` replaces it")


@pytest.mark.parametrize("edit, key", [
    (setting("series.0.measurements", [[1, 2]]), "series[0].measurements[0]: expected a mapping, got a list"),
    (setting("series.0.fit.points", 1.5), "series[0].fit.points: expected a whole number, got a number"),
    (setting("series.0.fit.points", 3), "series[0].fit.residuals: 2 residuals for 3 points"),
    (setting("series.0.fit.curve.e_max", 0), "series[0].fit.curve.e_max: must be above zero, got 0"),
    (setting("series.0.fit.curve.kind", "cubic"), "series[0].fit.curve.kind: unknown curve kind 'cubic'"),
    (setting("series.0.axis", "time"), "series[0].axis: 'time' is not one of flops, bytes"),
    (setting("series.0.measurements.0.samples", 0), "series[0].measurements[0].samples: must be at least 1"),
    (setting("series.0.measurements.0.bytes", True), "series[0].measurements[0].bytes: expected a whole number, "
                                                     "got true/false"),
    (setting("series.0.fit.residuals.0", math.inf), "series[0].fit.residuals[0]: must be a finite number, got inf"),
    (setting("series.0.peak", 10**400), "series[0].peak: must be a finite number above zero, got 1000000000"),
    (setting("series.0.fit.curve.alpha", -(10**400)), "series[0].fit.curve.alpha: saturating curve parameters must "
                                                      "be finite and not negative, got -100000000"),
    (setting("series.1.op", "gemm"), "series[1]: a second 'gemm/fp32' series"),
    (setting("peaks.flops.fp64", 1e12), "peaks.flops.fp64: unknown name (expected one of fp32, tf32, bf16, fp16, fp8)"),
    (setting("peaks.flops.fp32", -1e11), "peaks.flops.fp32: must be a finite number above zero"),
    (setting("status", "guessed"), "status: 'guessed' is not one of measured, default"),
    (setting("software", ["torch"]), "software: expected a mapping, got a list"),
    (setting("notes", "one note"), "notes: expected a list, got a string"),
    (setting("duration_s", -1), "duration_s: must be a finite number not below zero"),
    (deleting("fingerprint.suite_digest"), "fingerprint.suite_digest: is missing"),
    (setting("series.0.skipped", [{"label": "x"}]), "series[0].skipped[0].reason: is missing"),
    (setting("x" * 500, 1), "x" * 40 + ": unknown key"),
])
def test_malformed_profiles_name_the_key(cache_dir: Path, edit, key: str) -> None:
    write_profile_file(document(edit))
    cached = load_profile("cpu", FINGERPRINT)
    assert not cached.usable and cached.problem.startswith(f"malformed (key {key}"), cached.problem
    assert len(cached.problem) < 300


def test_a_document_that_is_not_a_mapping(cache_dir: Path) -> None:
    write_profile_file(json.dumps({"format": cache_module.FORMAT, "schema": 1, "sha256": "0", "profile": [1]}))
    assert load_profile("cpu", FINGERPRINT).problem == "corrupt: checksum does not match the content"
    write_profile_file(json.dumps({"format": cache_module.FORMAT, "schema": [1] * 10_000}))
    assert load_profile("cpu", FINGERPRINT).problem == "stale: schema list, this version reads 1"


# ---- finding 4: the size is checked before anything is read ----------------------------------------------


def test_an_oversized_file_is_refused_unread(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_profile_file(document())
    with open(path, "ab") as file:
        file.truncate(MAX_FILE_BYTES + 1)

    def no_reading(*args: Any, **kwargs: Any):
        raise AssertionError("the file was opened")

    monkeypatch.setattr(Path, "open", no_reading)
    cached = load_profile("cpu", FINGERPRINT)
    assert cached.problem == "corrupt: over 16 MiB, far more than any profile"


def test_the_cap_is_far_above_a_real_profile(cache_dir: Path, fast_suite: Suite) -> None:
    # a real quick profile of the shipped suite is about 45 KB (131 cases on this CPU); the fast suite's
    # 7 cases give a few KB: the cap leaves room for a suite hundreds of times larger
    path = store_profile(runner_module.calibrate(cpu_target(fast_suite), fast_suite, quick=True))
    assert path.stat().st_size < MAX_FILE_BYTES / 1000


# ---- finding 3: a cache that cannot be written, found before measuring -----------------------------------


def test_calibrate_fails_before_measuring(cache_dir: Path, fast_suite: Suite, capfd,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(*args: Any, **kwargs: Any):
        raise OSError(errno.ENOSPC, "No space left on device")

    def never(*args: Any, **kwargs: Any):
        raise AssertionError("measured although the result could not be stored")

    monkeypatch.setattr(cache_module.os, "fsync", full_disk)
    monkeypatch.setattr("advisor.calibration.runner.calibrate", never)  # imported on use
    assert main(["calibrate", "--quick"]) == 2
    out, err = capfd.readouterr()
    assert out == "" and err == (f"advisor: error: cannot store calibrations in {cache_dir / 'calibration'} "
                                 "(No space left on device); make it writable or set $GPU_ADVISOR_CACHE_DIR to a "
                                 "folder that can be written\n")
    assert list((cache_dir / "calibration").iterdir()) == []  # the write check left nothing


def test_calibrate_shows_what_it_measured_when_the_final_write_fails(cache_dir: Path, fast_suite: Suite, capfd,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    store_profile(synthetic_profile(cpu_target(fast_suite).fingerprint))
    before = profile_path("cpu").read_bytes()

    real_replace = os.replace

    def full_disk(source: str, destination: Any) -> None:  # the check passes; the profile's write fails
        if str(destination).endswith("cpu.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(source, destination)

    monkeypatch.setattr(cache_module.os, "replace", full_disk)
    assert main(["calibrate", "--quick", "--json"]) == 2
    out, err = capfd.readouterr()
    assert json.loads(out)["path"] is None and json.loads(out)["status"] == "measured"
    assert err.count("\n") == 1 and "the calibration above was measured but cannot be stored in" in err
    assert "(No space left on device)" in err
    assert profile_path("cpu").read_bytes() == before
    assert [p.name for p in profile_path("cpu").parent.iterdir()] == ["cpu.json"]


def _local_cpu(progress: Callable[[str], None]) -> Any:
    """The `local-cpu` target of `advisor estimate --local`."""
    from advisor.calibration.reference import load_families
    from advisor.hardware.loader import load_hwdb

    db = load_hwdb([])
    return targets_module.local_targets(db, load_families(db), progress)[0]


def test_estimate_local_keeps_the_profile_when_the_final_write_fails(cache_dir: Path, fast_suite: Suite,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    real_replace = os.replace

    def full_disk(source: str, destination: Any) -> None:
        if str(destination).endswith("cpu.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(source, destination)

    monkeypatch.setattr(cache_module.os, "replace", full_disk)
    messages: list[str] = []
    target = _local_cpu(messages.append)
    assert target.id == "local-cpu" and target.calibration == "measured"
    assert target.note.endswith("; not stored (No space left on device)")
    warnings = [m for m in messages if m.startswith("warning:")]
    assert warnings == [f"warning: cannot store calibrations in {cache_dir / 'calibration'} (No space left on "
                        "device): the quick calibration of cpu measured now is used for this run only; set "
                        "$GPU_ADVISOR_CACHE_DIR to a folder that can be written"]
    assert list(profile_path("cpu").parent.iterdir()) == []


def test_estimate_local_warns_before_measuring_when_the_check_fails(cache_dir: Path, fast_suite: Suite,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    real_calibrate = targets_module.calibrate

    def read_only(*args: Any, **kwargs: Any):
        raise OSError(errno.EROFS, "Read-only file system")

    def calibrate(*args: Any, **kwargs: Any):
        events.append("measured")
        return real_calibrate(*args, **kwargs)

    def never_stored(*args: Any, **kwargs: Any):
        raise AssertionError("stored after the check failed")

    monkeypatch.setattr(cache_module, "_temporary", read_only)
    monkeypatch.setattr(targets_module, "calibrate", calibrate)
    monkeypatch.setattr(targets_module, "store_profile", never_stored)
    target = _local_cpu(events.append)
    warnings = [i for i, e in enumerate(events) if e.startswith("warning:")]
    assert len(warnings) == 1 and events.index("measured") > warnings[0]
    assert "(Read-only file system): the quick calibration of cpu measured now is used" in events[warnings[0]]
    assert target.calibration == "measured" and "not stored (Read-only file system)" in target.note


def test_the_write_check_removes_an_empty_folder_in_the_profiles_place(cache_dir: Path) -> None:
    profile_path("cpu").mkdir(parents=True)
    assert check_writable("cpu") == profile_path("cpu") and not profile_path("cpu").exists()


# ---- finding 5: temporaries of interrupted writes are recognised and cleaned -----------------------------


def _aged(path: Path, seconds: float) -> Path:
    path.write_text("half a profile")
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def test_stale_temporaries_are_removed_on_the_next_read(cache_dir: Path) -> None:
    folder = cache_dir / "calibration"
    folder.mkdir(parents=True)
    dead_old = _aged(folder / f".cpu.json.{NOT_A_PID}.abcd1234.tmp", 120)  # writer gone, past the grace
    dead_fresh = _aged(folder / f".cuda0.json.{NOT_A_PID}.abcd1234.tmp", 5)  # writer gone, maybe elsewhere
    alive = _aged(folder / f".cpu.json.{os.getppid()}.k2j3h4g5.tmp", 300)  # a live process, recently
    alive_ancient = _aged(folder / f".cpu.json.{os.getppid()}.zzzz9999.tmp", 3600)  # nothing writes for an hour
    legacy = _aged(folder / ".cpu.json.q1w2e3r4.tmp", 3600)  # tempfile's name before pids were in it
    check = _aged(folder / f".write-check.{NOT_A_PID}.abcdefgh.tmp", 120)
    others = [_aged(folder / name, 3600) for name in ("notes.tmp", ".cpu.json.tmp", "cpu.json.bak", ".x.tmp")]

    assert load_profile("cpu", FINGERPRINT).problem == "none stored"
    left = set(folder.iterdir())
    assert left == {dead_fresh, alive, *others}
    assert not {dead_old, alive_ancient, legacy, check} & left


def test_a_killed_writer_leaves_a_temporary_the_next_write_removes(cache_dir: Path) -> None:
    # a child process stores a profile and dies half-way through writing it (SIGKILL, a power cut)
    profile_file = cache_dir.parent / "profile.json"
    profile_file.write_text(json.dumps(synthetic_profile().to_dict()))
    child = f"""
import json, os, sys
from advisor.calibration import cache
from advisor.calibration.profile import CalibrationProfile
def dies(descriptor):  # the profile is written, not yet synced nor renamed
    os._exit(9)
os.fsync = dies
cache.store_profile(CalibrationProfile.from_dict(json.load(open(sys.argv[1]))))
"""
    result = subprocess.run([sys.executable, "-c", child, str(profile_file)], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert result.returncode == 9, result.stderr
    folder = cache_dir / "calibration"
    (temporary,) = folder.iterdir()
    assert temporary.name.startswith(".cpu.json.") and temporary.name.endswith(".tmp")
    store_profile(synthetic_profile())  # within the grace: the dead writer's file stays a minute
    assert temporary.exists()
    then = time.time() - 120
    os.utime(temporary, (then, then))
    store_profile(synthetic_profile())
    assert [p.name for p in folder.iterdir()] == ["cpu.json"]


def test_cleaning_never_fails(tmp_path: Path) -> None:
    assert clean_stale_temporaries(tmp_path / "missing") == []
    (tmp_path / "file").write_text("x")
    assert clean_stale_temporaries(tmp_path / "file") == []


# ---- finding 6: Ctrl-C stores nothing and leaves no temporary --------------------------------------------


def test_ctrl_c_while_measuring_stores_nothing(cache_dir: Path, fast_suite: Suite, capfd,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"n": 0}
    real_measure = runner_module.measure

    def interrupted(*args: Any, **kwargs: Any):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_measure(*args, **kwargs)

    monkeypatch.setattr(runner_module, "measure", interrupted)
    assert main(["calibrate", "--quick"]) == 130
    out, err = capfd.readouterr()
    assert out == "" and "nothing was stored" in err and "none was stored before" in err
    assert list((cache_dir / "calibration").iterdir()) == []  # the write check's file is gone too


@pytest.mark.parametrize("where", ["json.dumps", "os.open", "os.fsync", "os.chmod", "os.replace"])
def test_ctrl_c_while_writing_keeps_the_old_profile(cache_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                   where: str) -> None:
    path = store_profile(synthetic_profile())
    before = path.read_bytes()
    module, name = where.split(".")

    def interrupt(*args: Any, **kwargs: Any):
        raise KeyboardInterrupt

    monkeypatch.setattr(getattr(cache_module, module), name, interrupt)
    with pytest.raises(KeyboardInterrupt):
        store_profile(dataclasses.replace(synthetic_profile(), mode="full"))
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == ["cpu.json"]


def test_ctrl_c_during_the_write_check_leaves_nothing(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupt(*args: Any, **kwargs: Any):
        raise KeyboardInterrupt

    monkeypatch.setattr(cache_module.os, "fsync", interrupt)
    with pytest.raises(KeyboardInterrupt):
        check_writable("cpu")
    assert list((cache_dir / "calibration").iterdir()) == []


def test_cache_error_is_a_user_error() -> None:
    error = CacheError(Path("/x"), "Read-only file system")
    assert error.exit_code == 2 and "set $GPU_ADVISOR_CACHE_DIR" in str(error)
