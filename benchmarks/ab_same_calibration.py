"""Two code versions' CPU predictions from ONE quick calibration, against the SAME real steps (issue #20).

calibration_robustness.py calibrates each code version on its own, so a comparison of two versions there
carries two calibrations' noise (on a 2-core VM, GEMM series that differ by 20% minutes apart). Here this
tree calibrates once; a copy of that cache goes to the other version (`--baseline`, a git revision), whose
code predicts from it (its own shape timings, where it has them); the steps of the eight models are
measured once, in this process, as calibration_robustness.measure_steps measures them.

    python benchmarks/ab_same_calibration.py [--baseline REV] [--models a,b] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import calibration_robustness as robustness  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="HEAD~1")
    parser.add_argument("--models")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    names = robustness.model_names(args.models)
    revision = subprocess.run(["git", "-C", str(robustness.REPO), "rev-parse", "--short", args.baseline],
                              check=True, capture_output=True, text=True).stdout.strip()
    head = subprocess.run(["git", "-C", str(robustness.REPO), "rev-parse", "--short", "HEAD"],
                          check=True, capture_output=True, text=True).stdout.strip()
    lines = [f"one calibration, two code versions, {dt.date.today()}, torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads; new = this tree (HEAD {head}, with any uncommitted changes), "
             f"baseline = {revision}",
             "error = predicted / measured - 1 of one training step (fp32)"]
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        baseline = robustness.export(revision, work / "baseline")
        calibration = robustness.calibrate_with("new", robustness.REPO, work / "cache")
        lines.append(f"calibration {'stored' if calibration.stored else 'REFUSED'}: {calibration.message}")
        if not calibration.stored:
            print("\n".join(lines))
            return 1
        shutil.copytree(work / "cache", work / "cache-baseline")
        measured = robustness.measure_steps(names)
        new = robustness.predictions(robustness.REPO, work / "cache", names)
        old = robustness.predictions(baseline, work / "cache-baseline", names)
    lines.append(f"  {'model':<24} {'measured ms':>11} {'new ms':>9} {'err':>7} {'baseline ms':>11} {'err':>7}")
    errors: dict[str, list[float]] = {"new": [], "baseline": []}
    for name in names:
        row = f"  {name:<24} {measured[name] * 1e3:>11.1f}"
        for label, found in (("new", new), ("baseline", old)):
            seconds = found[name]["ours"]
            errors[label].append(abs(seconds / measured[name] - 1))
            row += f" {seconds * 1e3:>{9 if label == 'new' else 11}.1f} {seconds / measured[name] - 1:>+7.1%}"
        lines.append(row)
    for label, found in errors.items():
        lines.append(f"  {label}: median |error| {statistics.median(found):.1%}, worst {max(found):.1%} over {len(found)} models")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
