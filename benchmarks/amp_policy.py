"""CUDA's autocast policy against CPU's on the zoo's models: which GPU traces it changes, and by how much.

A GPU target's amp step is traced under CUDA's autocast policy (advisor/profile/cuda_autocast.py), where it was
traced under CPU autocast's op lists before. For each model of benchmarks/zoo_coverage.py's ZOO (or --models),
in its own process under a timeout, the step is traced at the zoo's batch in amp-bf16 (or --precision) as a GPU
runs it (attention "cuda") twice: with CPU autocast's lists (the policy left out: the baseline, what the tool
traced before) and with CUDA's. Printed per model: whether each traced, the tensors' peak of each (MiB) and
their ratio, the activations at that peak, and the records each made with the casts (`_to_copy`) among them.
Each model's results are also printed as they come (stderr, one JSON line each); `--from-log FILE` makes the
table again from those lines.

    python benchmarks/amp_policy.py [--models a,b] [--precision amp-bf16] [--timeout S] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

from printed import print_report

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "amp_policy.txt"
DEFAULT_TIMEOUT_S = 300.0


def one(name: str, precision: str) -> dict:
    """Both traces of zoo model `name`, as a JSON-able summary."""
    os.environ["GPU_ADVISOR_TRACE_CACHE"] = "off"
    import advisor.profile.trace as trace_module
    from zoo_coverage import ZOO

    entry = ZOO[name]
    policy = trace_module.autocast_policy
    found: dict = {}
    for variant in ("cpu lists", "cuda policy"):
        trace_module.autocast_policy = policy if variant == "cuda policy" else (lambda *args: nullcontext())
        started = time.perf_counter()
        try:
            trace = trace_module.trace_training_step(entry.build, entry.make_input, entry.batch, precision,
                                                     entry.optimizer, entry.loss_fn, source=name, attention="cuda")
        except Exception as exc:  # noqa: BLE001 -- reported, as the zoo benchmark reports a model's failure
            found[variant] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"}
            continue
        assert trace.memory is not None
        peak = trace.memory.peak()
        found[variant] = {"seconds": time.perf_counter() - started, "peak": peak.bytes, "phase": peak.phase,
                          "activations": peak.by_category.get("activations", 0), "records": len(trace.records),
                          "casts": sum(r.op == "_to_copy" for r in trace.records)}
    trace_module.autocast_policy = policy
    return found


def run(names: list[str], precision: str, timeout_s: float) -> dict[str, dict]:
    results = {}
    for name in names:
        try:
            done = subprocess.run([sys.executable, __file__, "--one", name, "--precision", precision],
                                  capture_output=True, text=True, timeout=timeout_s, cwd=HERE)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            results[name] = json.loads(lines[-1]) if lines else {"error": (done.stderr.strip().splitlines() or
                                                                           ["no output"])[-1][:160]}
        except subprocess.TimeoutExpired:
            results[name] = {"error": f"over {timeout_s:g} s"}
        print(name, json.dumps(results[name]), file=sys.stderr, flush=True)
    return results


def report(results: dict[str, dict], precision: str) -> list[str]:
    mib = 2 ** 20
    lines = [f"CUDA's autocast policy against CPU autocast's lists, GPU traces (attention cuda) in {precision}, "
             "tensors' peak (MiB)",
             f"{'model':<34} {'cpu lists':>10} {'cuda':>10} {'ratio':>7} {'act cpu':>9} {'act cuda':>9} "
             f"{'casts':>11} {'records':>13}"]
    ratios, errors = [], []
    for name, found in results.items():
        before, after = found.get("cpu lists", found), found.get("cuda policy", found)
        if "error" in before or "error" in after:
            errors.append(f"{name}: cpu lists {before.get('error', 'ok')}; cuda policy {after.get('error', 'ok')}")
            continue
        ratio = after["peak"] / before["peak"]
        ratios.append(ratio)
        lines.append(f"{name:<34} {before['peak'] / mib:>10.1f} {after['peak'] / mib:>10.1f} {ratio:>7.3f} "
                     f"{before['activations'] / mib:>9.1f} {after['activations'] / mib:>9.1f} "
                     f"{before['casts']:>5}/{after['casts']:<5} {before['records']:>6}/{after['records']}")
    changed = [r for r in ratios if abs(r - 1) > 1e-9]
    lines.append(f"traced both ways: {len(ratios)} of {len(results)}; peak changed for {len(changed)}"
                 + (f" (ratio median {statistics.median(changed):.3f}, max {max(changed):.3f})" if changed else ""))
    lines += [f"not traced: {why}" for why in errors]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated zoo names (default: all)")
    parser.add_argument("--precision", default="amp-bf16")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--from-log", type=Path, help="make the table from a run's stderr lines")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.from_log:
        found = dict(line.split(" ", 1) for line in args.from_log.read_text().splitlines() if " {" in line)
        print_report(report({name: json.loads(value) for name, value in found.items()}, args.precision), args.out)
        return 0
    if args.one:
        print(json.dumps(one(args.one, args.precision)))
        return 0
    from zoo_coverage import ZOO

    names = args.models.split(",") if args.models else list(ZOO)
    print_report(report(run(names, args.precision, args.timeout), args.precision), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
