"""A quick CPU calibration on a quiet and on a busy machine: what it stores (or refuses), and how well the
stored profile predicts real training steps measured under the same load (issue #20).

For each load (0, 1, 2 busy processes spinning beside it; `--busy`), this run:
1. calibrates (`advisor calibrate --quick`, a fresh cache) with this tree's code and with a baseline
   revision's (`--baseline`, default the commit before issue #20's robustness work: "today's
   behaviour"), each in its own process;
2. measures real training steps of each model under the same load, in this process after warm-up: the
   median of 3 rounds interleaved over the models (MEASURE_ROUNDS), each the median of its steps;
3. predicts each model's step from each stored profile (in a process running that code's tracer and
   estimator; this tree's times the models' convolutions at their shapes as `advisor estimate --local`
   does, calibration/shapes.py), and prints the errors, their median and worst, beside the bare roofline of
   benchmarks/accuracy.py on the same trace (75% of the peaks and of the sustained bandwidth measured
   by that calibration).

Models: benchmarks/heldout.py (torchvision, timm, transformers, a wide MLP; those whose library
imports here) and the MLP example. A load's figures are comparable only within that load.

    python benchmarks/calibration_robustness.py [--busy 0,1,2] [--baseline REV] [--models a,b]
        [--out benchmarks/results/calibration_robustness.txt]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from heldout import available, model_parts  # noqa: E402

DEFAULT_BASELINE = "ecabff8"
"""The last commit before contention detection and cold operands (2026-11-23)."""


@dataclass(frozen=True)
class Calibration:
    code: str
    stored: bool
    message: str
    seconds: float
    cache: str


def model_names(requested: str | None) -> list[str]:
    names = ["mlp_example", *available()]
    return requested.split(",") if requested else names


# ---- in a subprocess: one code version's prediction --------------------------------------------------------


def predict(names: list[str], with_bare: bool) -> dict[str, dict[str, float]]:
    """Per model, the step predicted from the stored profile (GPU_ADVISOR_CACHE_DIR) and, with
    `with_bare`, the bare roofline of the same trace, seconds; run with PYTHONPATH pointing at the code
    version to judge. accuracy.py (the bare roofline) imports this tree's planning API, so only this
    tree's run computes it: an older version's advisor package lacks modules it needs."""
    from advisor.calibration.cache import load_profile
    from advisor.calibration.runner import cpu_target
    from advisor.calibration.suite import load_suite
    from advisor.estimate.step import DeviceModel, estimate_records
    from advisor.profile.trace import trace_training_step

    cached = load_profile("cpu", cpu_target(load_suite()).fingerprint)
    assert cached.profile is not None, cached.problem
    device = DeviceModel("local-cpu", "cpu", cached.profile)
    try:  # an older tree has no shape measurements
        from advisor.estimate.targets import EstimateTarget, with_measured_shapes
        from advisor.hardware.loader import load_hwdb
        overhead = load_hwdb([]).memory_overhead_default()
    except ImportError:
        with_measured_shapes = None
    peaks, bandwidth = cached.profile.peaks.flops, cached.profile.sustained_bandwidth_bytes_per_s
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        build, make_input, loss_fn, batch, optimizer = model_parts(name)
        try:
            trace = trace_training_step(build, make_input, batch, "fp32", optimizer, loss_fn)
        except Exception as exc:  # noqa: BLE001 - a code version that cannot trace a model: reported as such
            out[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
            continue
        timed = device
        if with_measured_shapes is not None:  # this tree: the model's convolutions timed as the CLI times them
            target = EstimateTarget("local-cpu", "this CPU", device, 0, overhead, local=True)
            timed = with_measured_shapes(target, trace.records, "fp32", lambda message: None).device
        out[name] = {"ours": estimate_records(trace.records, "fp32", timed).step_s}
        if with_bare:
            from accuracy import bare_roofline_seconds
            out[name]["bare"] = bare_roofline_seconds(trace.records, "fp32", peaks, bandwidth, gpu=False)
    return out


# ---- in the main process ------------------------------------------------------------------------------------


def export(revision: str, into: Path) -> Path:
    """The tree of `revision` (git archive), to run its code."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run_code(code: Path, cache: Path, args: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(code), GPU_ADVISOR_CACHE_DIR=str(cache), PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=str(code))


def calibrate_with(label: str, code: Path, cache: Path) -> Calibration:
    started = time.perf_counter()
    done = run_code(code, cache, ["-m", "advisor", "calibrate", "--quick", "--device", "cpu"])
    seconds = time.perf_counter() - started
    assert done.returncode in (0, 2), f"{label} calibrate exited {done.returncode}: {done.stderr[-2000:]}"
    lines = [line for line in done.stderr.splitlines() if line.startswith("advisor:")]
    message = next((line for line in lines if "error" in line), lines[-1] if lines else "")
    if done.returncode == 0:
        quality = next((line for line in done.stdout.splitlines() if line.startswith("quality:")), "")
        message = quality
    return Calibration(label, done.returncode == 0, message, seconds, str(cache))


def predictions(code: Path, cache: Path, names: list[str]) -> dict[str, dict[str, float]]:
    bare = ["--bare"] if code == REPO else []
    done = run_code(code, cache, [str(Path(__file__).resolve()), "--predict", *bare, "--models", ",".join(names)])
    assert done.returncode == 0, f"prediction failed: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


MEASURE_ROUNDS = 3
"""Rounds of step timing over the models, interleaved: a host that slows down for seconds (this VM's
neighbours) slows one round of a model, not all of them."""


def measure_steps(names: list[str], rounds: int = MEASURE_ROUNDS, warm_s: float = 0.5,
                  timed_s: float = 0.6) -> dict[str, float]:
    """Per model, the median over `rounds` interleaved rounds of the median seconds of its real training
    steps in the round: at least 3 warm-up steps and `warm_s` before the first round (allocator, thread
    pools and caches settle), then each round at least 3 timed steps and `timed_s`."""
    from accuracy import timed_step

    steps = {}
    for name in names:
        build, make_input, loss_fn, batch, optimizer = model_parts(name)
        step = steps[name] = timed_step((build, make_input, loss_fn), batch, "fp32", optimizer)
        warm = [step() for _ in range(3)]
        while sum(warm) < warm_s:
            warm.append(step())
    medians: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for name, step in steps.items():
            times = [step() for _ in range(3)]
            while sum(times) < timed_s and len(times) < 100:
                times.append(step())
            medians[name].append(statistics.median(times))
    return {name: statistics.median(found) for name, found in medians.items()}


def spinners(count: int) -> list[subprocess.Popen]:
    """`count` processes that each keep one CPU busy."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def one_load(busy: int, codes: dict[str, Path], names: list[str], work: Path) -> list[str]:
    lines = [f"\n== {busy} busy process(es) beside the run; load average {os.getloadavg()[0]:.2f} at start"]
    procs = spinners(busy)
    try:
        time.sleep(3 if busy else 0)
        calibrations = {label: calibrate_with(label, code, work / f"cache-{busy}-{label}")
                        for label, code in codes.items()}
        measured = measure_steps(names)
        for name in names:
            print(f"  {busy} busy: {name} measured {measured[name] * 1e3:.1f} ms", file=sys.stderr, flush=True)
        predicted = {label: predictions(codes[label], Path(c.cache), names) if c.stored else None
                     for label, c in calibrations.items()}
        lines.append(f"load average at the end {os.getloadavg()[0]:.2f}")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    for label, calibration in calibrations.items():
        verdict = "stored" if calibration.stored else "REFUSED"
        lines.append(f"{label:>9}: calibration {verdict} in {calibration.seconds:.0f} s: {calibration.message}")
    header = f"  {'model':<24} {'measured ms':>11}"
    for label in codes:
        header += f" {label + ' ms':>13} {'err':>7}"
    header += f" {'bare ms':>9} {'err':>7}"
    lines.append(header)
    errors: dict[str, list[float]] = {label: [] for label in codes}
    bare_errors: list[float] = []
    failures: dict[str, list[str]] = {label: [] for label in codes}
    for name in names:
        row = f"  {name:<24} {measured[name] * 1e3:>11.1f}"
        for label in codes:
            found = predicted[label]
            if found is None:
                row += f" {'refused':>13} {'':>7}"
                continue
            if "error" in found[name]:
                failures[label].append(f"{name} ({found[name]['error'][:120]})")
                row += f" {'no trace':>13} {'':>7}"
                continue
            error = found[name]["ours"] / measured[name] - 1
            errors[label].append(error)
            row += f" {found[name]['ours'] * 1e3:>13.1f} {error:>+7.1%}"
        reference = next((p for p in predicted.values() if p is not None and "bare" in p[name]), None)
        if reference is not None:
            bare = reference[name]["bare"] / measured[name] - 1
            bare_errors.append(bare)
            row += f" {reference[name]['bare'] * 1e3:>9.1f} {bare:>+7.1%}"
        lines.append(row)
    for label, found in errors.items():
        if found:
            absolute = [abs(e) for e in found]
            lines.append(f"  {label}: median |error| {statistics.median(absolute):.1%}, worst {max(absolute):.1%} "
                         f"over {len(found)} models")
        else:
            lines.append(f"  {label}: no profile stored, no prediction")
        if failures[label]:
            lines.append(f"  {label}: could not trace {len(failures[label])}: {'; '.join(failures[label])}")
    if bare_errors:
        absolute = [abs(e) for e in bare_errors]
        lines.append(f"  bare roofline: median |error| {statistics.median(absolute):.1%}, worst {max(absolute):.1%}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--busy", default="0,1,2")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE)
    parser.add_argument("--models")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--predict", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = model_names(args.models)
    if args.predict:
        print(json.dumps(predict(names, args.bare)))
        return 0
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(temporary)
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        codes = {"new": REPO, "baseline": export(args.baseline, work / "baseline")}
        lines = [f"calibration robustness, {dt.date.today()}, torch {torch.__version__}, {torch.get_num_threads()} "
                 f"threads, {os.cpu_count()} CPUs; new = this tree (HEAD {head}, with any uncommitted changes), "
                 f"baseline = {args.baseline}",
                 "error = predicted / measured - 1 of one training step (fp32); steps measured under the same load",
                 f"models: {', '.join(names)}"]
        print("\n".join(lines), flush=True)
        for busy in (int(b) for b in args.busy.split(",")):
            block = one_load(busy, codes, names, work)
            print("\n".join(block), flush=True)
            lines += block
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
