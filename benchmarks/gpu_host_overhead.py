"""Host time per op of real eager training steps on a GPU, from the ground-truth runs' host-bound rows.

    python benchmarks/gpu_host_overhead.py [--out benchmarks/results/gpu_host_overhead.txt]

A GPU step whose kernels kept the device busy under half of the step (kernels.csv's device time over
steps.csv's median step) waited on its host: its step time is the host's time to issue it. For every
such row of every run under benchmarks/results/groundtruth/, the tool's own trace of the step counts its
ops (cuDNN's, convolutions and batch norms, apart from the rest), and a non-negative least-squares fit
gives seconds per step, per op and per cuDNN op. Beside the fit: each row's error, the error of each
model's rows when the fit leaves that model out, and what the loop-timed calibration overheads alone
(`autograd` per op, the estimator before STEP_HOST_RATIO) predict. The ratios of the per-op figures to
the run's calibrated `autograd` overhead are advisor/estimate/step.py's STEP_HOST_RATIO and
CONV_STEP_HOST_RATIO.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

BENCHMARKS = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCHMARKS), str(BENCHMARKS.parent)]

import gpu_groundtruth as groundtruth  # noqa: E402
from printed import print_report  # noqa: E402

from advisor.estimate.ops import CUDNN_OPS  # noqa: E402
from advisor.hardware.loader import load_hwdb  # noqa: E402
from advisor.profile.trace import OpRecord  # noqa: E402

HOST_BOUND_BUSY = 0.5
"""A row whose GPU ran kernels less than this share of the step waited on its host."""


def device_seconds(folder: Path) -> dict[tuple[str, int, str, str], float]:
    """Kernel time of each profiled row (model, batch, precision, layout), seconds."""
    busy: dict[tuple[str, int, str, str], float] = defaultdict(float)
    with (folder / "kernels.csv").open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            busy[(row["model"], int(row["batch"]), row["precision"], row["layout"])] += float(row["device_time_us"]) * 1e-6
    return busy


def host_rows(folder: Path) -> tuple[list[dict], float, dict]:
    """The run's profiled rows with their op counts and the run's calibrated autograd overhead (seconds),
    that overhead, and the run's environment.json."""
    run = groundtruth.Run(folder, False, groundtruth.REAL, groundtruth.model_specs(), None, time.perf_counter(), None)
    predictor = groundtruth.Predictor.for_run(run, load_hwdb([], include_user_layers=False))
    specs = {spec.name: spec for spec in run.specs}
    kernels = device_seconds(folder)
    profile = json.loads((folder / "calibration.json").read_text(encoding="utf-8"))["profile"]
    overhead = profile["overheads_s"]["autograd"]
    dispatch = profile["overheads_s"]["dispatch"]
    rows = []
    for row in run.steps.rows():
        key = groundtruth.RowKey.of(row)
        kernel_s = kernels.get((key.model, key.batch, key.precision, key.layout))
        if row["status"] != "ok" or kernel_s is None or key.model not in specs:
            continue
        trace = predictor.trace(specs[key.model], key)
        if isinstance(trace, str):
            continue
        counts = Counter(op_kind(r) for r in trace.records)
        step_s = float(row["step_time_median_s"])
        rows.append({"label": f"{folder.name} {key.label}", "model": key.model, "step_s": step_s,
                     "busy": kernel_s / step_s, "other": counts["other"], "cudnn": counts["cudnn"],
                     "engine": counts["engine"], "known_s": counts["engine"] * dispatch, "autograd": overhead})
    return rows, overhead, run.environment()


def op_kind(record: OpRecord) -> str:
    """"engine" for a gradient the autograd engine sums (costed at the calibrated dispatch overhead, not fitted:
    estimate/step.py host_seconds), "cudnn" for a convolution or batch norm, else "other"."""
    if record.engine_sum:
        return "engine"
    return "cudnn" if record.op in CUDNN_OPS else "other"


def fit(rows: list[dict]) -> np.ndarray:
    """Seconds per step, per op and per cuDNN op, non-negative least squares, over each step less its engine
    sums' known dispatch cost."""
    matrix = np.array([[1.0, r["other"], r["cudnn"]] for r in rows])
    solution, _ = nnls(matrix, np.array([r["step_s"] - r["known_s"] for r in rows]))
    return solution


def predicted(row: dict, solution: np.ndarray) -> float:
    return float(solution[0] + solution[1] * row["other"] + solution[2] * row["cudnn"] + row["known_s"])


def report(folders: list[Path]) -> list[str]:
    lines = ["Host time of real eager GPU training steps, from the ground truth's host-bound rows "
             f"(GPU busy < {HOST_BOUND_BUSY:.0%} of the step)"]
    bound: list[dict] = []
    autograd: list[float] = []
    for folder in folders:
        rows, overhead, environment = host_rows(folder)
        autograd.append(overhead)
        chosen = [r for r in rows if r["busy"] < HOST_BOUND_BUSY]
        lines.append(f"{folder.name}: {environment['gpu_name']}, host {environment['cpu']} x{environment['cpu_cores']}, "
                     f"torch {environment['torch']}; calibrated autograd overhead {overhead * 1e6:.1f} us; "
                     f"{len(chosen)} of {len(rows)} profiled rows host-bound")
        bound += chosen
    if len(bound) < 3:
        return lines + ["too few host-bound rows to fit"]
    solution = fit(bound)
    base = statistics.median(autograd)
    lines += ["", f"fit: {solution[0] * 1e3:.3f} ms per step + {solution[1] * 1e6:.1f} us per op + "
                  f"{solution[2] * 1e6:.1f} us per cuDNN op (convolution, batch norm)",
              f"over the calibrated autograd overhead ({base * 1e6:.1f} us): per op {solution[1] / base:.2f}x, "
              f"per cuDNN op {solution[2] / base:.2f}x",
              "engine sums (gradients summed where a tensor fed several ops) at the calibrated dispatch overhead, "
              "not fitted",
              "", f"{'row':<58} {'ops':>5} {'cuDNN':>5} {'sums':>5} {'busy':>5} {'step ms':>8} {'fit':>7} {'err':>7} "
                  f"{'loop':>7} {'err':>7}"]
    errors, loop_errors = [], []
    for r in bound:
        fitted = predicted(r, solution)
        loop = r["autograd"] * (r["other"] + r["cudnn"] + r["engine"])
        errors.append(fitted / r["step_s"] - 1)
        loop_errors.append(loop / r["step_s"] - 1)
        lines.append(f"{r['label']:<58} {r['other']:>5} {r['cudnn']:>5} {r['engine']:>5} {r['busy']:>5.0%} "
                     f"{r['step_s'] * 1e3:>8.2f} {fitted * 1e3:>7.2f} {errors[-1]:>+7.1%} {loop * 1e3:>7.2f} {loop_errors[-1]:>+7.1%}")
    lines.append(f"median |error|: fit {statistics.median(abs(e) for e in errors):.1%}, "
                 f"loop-timed overhead per op {statistics.median(abs(e) for e in loop_errors):.1%} (n={len(bound)})")
    lines += ["", "leave one model out (the fit without that model's rows, on its rows):"]
    held: list[float] = []
    for model in sorted({r["model"] for r in bound}):
        train = [r for r in bound if r["model"] != model]
        if len(train) < 3:
            continue
        solution_out = fit(train)
        model_errors = [predicted(r, solution_out) / r["step_s"] - 1 for r in bound if r["model"] == model]
        held += model_errors
        lines.append(f"  {model:<14} {', '.join(f'{e:+.1%}' for e in model_errors)}  "
                     f"(fit {solution_out[1] * 1e6:.1f} us/op, {solution_out[2] * 1e6:.1f} us/cuDNN op)")
    if held:
        lines.append(f"  median |error| held out: {statistics.median(abs(e) for e in held):.1%} (n={len(held)})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    folders = sorted(p for p in groundtruth.RESULTS.glob("*") if (p / "kernels.csv").is_file()
                     and (p / "calibration.json").is_file())
    print_report(report(folders), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
