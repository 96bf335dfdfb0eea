"""Steady-state throughput of Lambda v0's BERT SQuAD runs, read from the runs' own logs.

Lambda's published BERT figures (published-throughput.csv, LAMBDA_V0) are not steady-state rates. Its
`run_squad.sh` turned each run's tqdm progress bar into one number, three different ways over 2020-21:
the bar's last displayed rate (its exponential average, raised by the short final batch), or
(iterations - 2) x GPUs x batch over the epoch bar's averaged seconds (warm-up included), or DLE's dllogger
`training_sequences_per_second` over the first 100 steps (warm-up included). The runs were short (1,033
SQuAD features an epoch in the 20.01 fork; 100 steps in the 20.10 one), so these differ from the rate
a long job runs at by -25% to +25%. The tool predicts the steady rate, so the benchmark compares it with
the steady rate the same runs logged: the median of the progress bar's displayed rate (tqdm's moving
average, which settles on the steady rate) over the second half of the last epoch's iterations, the
final one left out.

Needs a git copy of lambdal/deeplearning-benchmark (the `fetch` tool's mirror); writes
benchmarks/data/lambda_v0_bert_steady.csv, which benchmarks/accuracy.py reads. Run:
    python benchmarks/lambda_v0_logs.py [--repo PATH]
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

COMMIT = "67a9bb5128d51299376bc72e02ec7459f82efe38"
"""The commit SOURCES.md cites for the v0 tables (2022-07-06, the last before the v1 suite)."""
DEFAULT_REPO = Path("/work/.mirror/lambdal+deeplearning-benchmark/repo")
OUT = Path(__file__).resolve().parent / "data" / "lambda_v0_bert_steady.csv"
COMPILE_SCRIPT = "pytorch/scripts/compile_results_pytorch_throughput.py"
TASKS = {
    ("bert_base", "FP32"): "PyTorch_bert_base_squad_FP32",
    ("bert_large", "FP32"): "PyTorch_bert_large_squad_FP32",
    ("bert_base", "FP16"): "PyTorch_bert_base_squad_FP16",
    ("bert_large", "FP16"): "PyTorch_bert_large_squad_FP16",
}
BAR = re.compile(r"Iteration:\s+\d+%\|[^|]*\|\s*(\d+)/(\d+) \[[^,\]]*,\s*([0-9.]+)(it/s|s/it)\]")
BATCH = re.compile(r"--train_batch_size[= ](\d+)")
PUBLISHED = (re.compile(r"training throughput: ([0-9.]+)"),
             re.compile(r"training_sequences_per_second : ([0-9.]+)"))


@dataclass(frozen=True)
class RunLog:
    """One run's log: its per-GPU batch, steady iterations per second and the figure Lambda took."""

    path: str
    batch_per_gpu: int
    steady_it_per_s: float
    bars: int
    """Progress-bar readings the steady rate is the median of."""
    published: float | None


def git_show(repo: Path, path: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "show", f"{COMMIT}:{path}"], check=True,
                          capture_output=True, text=True, errors="replace").stdout


def systems(repo: Path) -> dict[str, tuple[str, int]]:
    """Lambda's system name (as the CSV's notes give it) -> (results folder, GPUs), from the compile script."""
    entry = re.compile(r"'([^']+)': \(\[\d, (\d+)\], '([^']+)'")
    return {name: (folder, int(gpus)) for folder, gpus, name in entry.findall(git_show(repo, COMPILE_SCRIPT))}


def read_log(repo: Path, path: str) -> RunLog | None:
    """The steady rate of one log, or None when it has no progress bar (a failed run)."""
    text = git_show(repo, path).replace("\r", "\n")
    readings = [(int(n), int(total), float(rate) if unit == "it/s" else 1 / float(rate))
                for n, total, rate, unit in BAR.findall(text)]
    batch = BATCH.search(text)
    if not readings or batch is None:
        return None
    last_epoch = _last_epoch(readings)
    top = max(n for n, _, _ in last_epoch)
    steady = [rate for n, _, rate in last_epoch if top / 2 <= n < top]
    if not steady:
        return None
    published = None
    for pattern in PUBLISHED:
        found = pattern.findall(text)
        if found:
            published = float(found[-1])
    return RunLog(path, int(batch.group(1)), statistics.median(steady), len(steady), published)


def _last_epoch(readings: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
    """The readings of the last epoch: after the last drop of the count by more than half (ranks' bars
    interleave, so the count wobbles by a step or two)."""
    start = 0
    for index in range(1, len(readings)):
        if readings[index][0] < readings[index - 1][0] / 2:
            start = index
    return readings[start:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=DEFAULT_REPO, help="git copy of lambdal/deeplearning-benchmark")
    args = parser.parse_args()
    if not (args.repo / "HEAD").exists() and not (args.repo / ".git").exists():
        print(f"advisor: no git copy of lambdal/deeplearning-benchmark at {args.repo}; fetch it first", file=sys.stderr)
        return 2
    listing = subprocess.run(["git", "-C", str(args.repo), "ls-tree", "-r", "--name-only", COMMIT], check=True,
                             capture_output=True, text=True).stdout.splitlines()
    rows = []
    for name, (folder, gpus) in sorted(systems(args.repo).items()):
        for (model, precision), task in TASKS.items():
            prefix = f"pytorch/results/{folder}/{task}/"
            logs = [read_log(args.repo, path) for path in listing if path.startswith(prefix) and path.endswith(".txt")]
            logs = [log for log in logs if log is not None]
            if not logs:
                continue
            batches = {log.batch_per_gpu for log in logs}
            assert len(batches) == 1, (name, task, batches)
            batch = batches.pop()
            steady = statistics.median(log.steady_it_per_s for log in logs) * batch * gpus
            published = [log.published for log in logs if log.published is not None]
            rows.append({
                "system": name, "model": model, "precision": precision, "num_gpus": gpus,
                "batch_size_per_gpu": batch, "runs": len(logs),
                "steady_sequences_per_s": f"{steady:.4g}",
                "published_recomputed": f"{statistics.mean(published):.4g}" if published else "",
                "progress_readings": sum(log.bars for log in logs),
                "logs": " ".join(log.path for log in logs),
            })
    OUT.parent.mkdir(exist_ok=True)
    with OUT.open("w", newline="") as handle:
        handle.write(f"# Steady-state rates of Lambda v0's BERT SQuAD runs, read from their logs in lambdal/deeplearning-"
                     f"benchmark at {COMMIT} by benchmarks/lambda_v0_logs.py\n")
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} runs -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
