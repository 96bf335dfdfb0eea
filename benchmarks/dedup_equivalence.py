"""Repeated blocks traced once against every block traced (issue #24): the same FLOPs, bytes, step times and
peak memory? Every example, the accuracy zoo (benchmarks/zoo.py) and the coverage zoo's models
(benchmarks/zoo_coverage.py: transformers, timm, torchvision, diffusers, peft; those whose library is
installed) are traced both ways at the same settings, and the largest relative difference of each figure
is printed with the blocks replicated and the time of each trace.

Step times are those of three GPUs of the database (one per family: Ampere, Ada, Hopper), eager and as
--compile fuses the step (its dataflow is copied with the blocks); memory is the step's allocator peak
(reserved) and its tensors' peak. The bar is 0.1% on every figure.

    python benchmarks/dedup_equivalence.py [--only NAME ...] [--out benchmarks/results/dedup_equivalence.txt]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

BAR = 1e-3
"""Largest relative difference allowed on any figure."""
GPUS = ("a100-sxm4-80gb", "rtx-4090", "h100-sxm")
EXAMPLES = ("mlp", "resnet50", "mobilenet_v2", "vit_b16", "bert_base", "gpt2_small", "llama")


def cases(only: set[str]) -> list[tuple[str, Callable[[], Any], Callable[[int], Any], Any, int, str, str]]:
    """(name, build, example_input, loss_fn, batch, precision, optimizer) of every model to compare."""
    from advisor.profile.model_file import load_model_file

    found = []
    for name in EXAMPLES:
        model = load_model_file(name)
        precision = "amp-bf16" if model.seq_len else "fp32"
        found.append((name, model.build_model, model.example_input, model.loss_fn, model.default_batch_size,
                      precision, "adamw"))
    import zoo
    for name, parts in zoo.ZOO.items():
        build, make_input, loss = parts(None)
        found.append((f"zoo:{name}", build, make_input, loss, 8, "fp32", "adamw"))
    import zoo_coverage
    for name, entry in zoo_coverage.ZOO.items():
        if not _installed(entry.library):
            continue
        found.append((f"coverage:{name}", entry.build, entry.make_input, entry.loss_fn, entry.batch, "fp32",
                      entry.optimizer))
    return [case for case in found if not only or case[0] in only]


def _installed(library: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(library) is not None


def figures(trace: Any, targets: list[Any]) -> dict[str, float]:
    """The figures compared: FLOPs and bytes by phase, step time per GPU, allocator and tensor peaks."""
    from advisor.estimate.step import estimate_step
    from advisor.memory.estimate import StepMemory

    memory = StepMemory.of_trace(trace)
    found = {f"flops {phase}": trace.flops(phase) for phase in ("forward", "backward", "optimizer")}
    found |= {f"bytes {phase}": trace.bytes_moved(phase) for phase in ("forward", "backward", "optimizer")}
    found |= {f"step s {t.id}": estimate_step(trace, t.device).step_s for t in targets}  # repeated runs timed once
    found |= {f"compiled step s {t.id}": estimate_step(trace, t.device, compiled=True).step_s for t in targets}
    found |= {"reserved": memory.reserved, "allocated": memory.allocated, "tensor peak": memory.tensor_peak}
    return found


def compare(case: tuple, targets: list[Any]) -> dict[str, Any]:
    from advisor.profile.trace import trace_training_step

    name, build, make_input, loss, batch, precision, optimizer = case
    # a first, untimed trace: some models' first step differs from the next (an LSTM flattens its weights
    # once), and the first trace of a kind pays for lazy imports and caches
    trace_training_step(build, make_input, batch, precision, optimizer, loss)
    traces, seconds = [], []
    for dedupe in (False, True):
        started = time.perf_counter()
        traces.append(trace_training_step(build, make_input, batch, precision, optimizer, loss, dedupe=dedupe))
        seconds.append(time.perf_counter() - started)
    full, deduplicated = (figures(t, targets) for t in traces)
    worst = max(((abs(deduplicated[k] - v) / v if v else float(deduplicated[k] != 0)), k) for k, v in full.items())
    return {"name": name, "replicated": traces[1].replicated_blocks, "runs": traces[1].repeated,
            "full_s": seconds[0], "dedup_s": seconds[1], "worst": worst[0], "worst_figure": worst[1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch

    from advisor.app.plan import targets_for
    from advisor.app.request import PlanRequest
    from advisor.hardware.loader import load_hwdb

    targets = targets_for(PlanRequest(gpus=GPUS), load_hwdb())
    lines = [f"repeated blocks traced once vs every block traced, {time.strftime('%Y-%m-%d')}, torch "
             f"{torch.__version__}, {os.cpu_count()} CPUs; worst relative difference over FLOPs and bytes by "
             f"phase, step time (eager and compiled) on {', '.join(GPUS)}, allocator and tensor peaks (bar {BAR:.1%})",
             f"{'model':<42} {'replicated':>10} {'full s':>7} {'dedup s':>7} {'ratio':>6} {'worst diff':>10}  figure"]
    print("\n".join(lines), flush=True)
    ratios, failed, errors = [], [], []
    for case in cases(set(args.only)):
        try:
            row = compare(case, targets)
        except Exception as exc:  # noqa: BLE001 - a model the tracer refuses either way is listed, not compared
            errors.append(f"{case[0]}: {type(exc).__name__}: {str(exc)[:150]}")
            continue
        ratio = row["dedup_s"] / row["full_s"]
        if row["replicated"]:
            ratios.append(ratio)
        if row["worst"] > BAR:
            failed.append(row["name"])
        line = (f"{row['name']:<42} {row['replicated']:>10} {row['full_s']:>7.2f} {row['dedup_s']:>7.2f} "
                f"{ratio:>6.2f} {row['worst']:>10.2e}  {row['worst_figure']}")
        lines.append(line)
        print(line, flush=True)
    summary = [f"models compared: {len(lines) - 2}, with blocks replicated: {len(ratios)}, over the bar: "
               f"{len(failed)} {failed if failed else ''}",
               f"trace time with blocks replicated / every block traced, median over models that replicate: "
               f"{statistics.median(ratios):.2f}" if ratios else "no model replicated blocks",
               *(f"not traced either way: {e}" for e in errors)]
    lines += summary
    print("\n".join(summary))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
