"""Where does a CPU training step's time go, op by op, against what the estimator predicts? (issue #20)

For each model: trace the step (fake tensors), predict every op with the local calibration (its
convolutions timed at their shapes, as `advisor estimate --local` does), then run
real steps under torch.profiler and sum, per aten op name and phase, the measured time of the
outermost profiler events whose name is an op the trace recorded (their children, such as a GEMM's
transposes, included). What no such event covers is "outside": Python, module calls, the autograd
engine, views and composite wrappers the trace does not record. Both sides print beside each other,
sorted by the measured time, so the mechanisms the time model misses show up by name.

    python benchmarks/op_breakdown.py [--models mlp,tv_resnet18,...] [--top 12] [--steps 5]

Models: the examples' zoo entries, and off-the-shelf ones where their libraries install
(torchvision, timm, transformers), all built from code and configs (no downloads).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))

from heldout import available, model_parts  # noqa: E402

from advisor.calibration.reference import load_families  # noqa: E402
from advisor.estimate.step import StepTime, estimate_records  # noqa: E402
from advisor.estimate.targets import local_targets, with_measured_shapes  # noqa: E402
from advisor.hardware.loader import load_hwdb  # noqa: E402
from advisor.profile.trace import call_model, default_loss, make_optimizer, trace_training_step  # noqa: E402

PHASES = ("forward", "backward", "optimizer")


@dataclass
class Measured:
    step_s: float
    by_op: dict[tuple[str, str], float]
    calls: dict[tuple[str, str], int]
    outside_s: dict[str, float]
    """Per phase, wall time of the phase less the op events inside it."""
    phase_s: dict[str, float]


def _phase_ranges(events: list) -> list[tuple[str, float, float]]:
    return [(e.name, e.time_range.start, e.time_range.end) for e in events if e.name in PHASES]


def _phase_of(start: float, ranges: list[tuple[str, float, float]]) -> str | None:
    for name, low, high in ranges:
        if low <= start <= high:
            return name
    return None


def measure(parts: tuple, batch: int, optimizer_name: str, op_names: set[str], steps: int) -> Measured:
    """Real steps: the median step time untraced, then one profiled step's per-op times."""
    build, make_input, loss_fn = parts
    torch.manual_seed(0)
    model, inputs = build(), make_input(batch)
    model.train()
    optimizer = make_optimizer(optimizer_name, [p for p in model.parameters() if p.requires_grad])
    loss_fn = loss_fn or default_loss

    def step(marked: bool) -> None:
        optimizer.zero_grad(set_to_none=True)
        with record_function("forward") if marked else nullcontext():
            loss = loss_fn(call_model(model, inputs), inputs)
        with record_function("backward") if marked else nullcontext():
            loss.backward()
        with record_function("optimizer") if marked else nullcontext():
            optimizer.step()

    for _ in range(2):
        step(False)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        step(False)
        times.append(time.perf_counter() - started)
    by_op: dict[tuple[str, str], float] = defaultdict(float)
    calls: dict[tuple[str, str], int] = defaultdict(int)
    inside: dict[str, float] = defaultdict(float)
    phase_s: dict[str, float] = defaultdict(float)
    profiled = 3
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(profiled):
            step(True)
    events = list(prof.events())
    ranges = _phase_ranges(events)
    for name, low, high in ranges:
        phase_s[name] += (high - low) / 1e6 / profiled
    for event in events:
        name = event.name.removeprefix("aten::")
        if name not in op_names or not event.name.startswith("aten::"):
            continue
        parent = event.cpu_parent
        nested = False
        while parent is not None:
            if parent.name.removeprefix("aten::") in op_names and parent.name.startswith("aten::"):
                nested = True
                break
            parent = parent.cpu_parent
        if nested:
            continue
        phase = _phase_of(event.time_range.start, ranges) or "?"
        seconds = (event.time_range.end - event.time_range.start) / 1e6 / profiled
        by_op[(phase, name)] += seconds
        calls[(phase, name)] += 1
        inside[phase] += seconds
    outside = {phase: phase_s[phase] - inside[phase] for phase in PHASES}
    return Measured(statistics.median(times), dict(by_op), {k: v // profiled for k, v in calls.items()}, outside,
                    dict(phase_s))


def predicted_by_op(step: StepTime) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """(kernel seconds, host seconds) per (phase, op)."""
    kernel: dict[tuple[str, str], float] = defaultdict(float)
    host: dict[tuple[str, str], float] = defaultdict(float)
    for op in step.ops:
        kernel[(op.phase, op.op)] += op.kernel_s
        host[(op.phase, op.op)] += op.wait_s
    return dict(kernel), dict(host)


def report(name: str, measured: Measured, step: StepTime, top: int, count: dict[tuple[str, str], int]) -> list[str]:
    kernel, host = predicted_by_op(step)
    keys = sorted(set(kernel) | set(measured.by_op), key=lambda k: -max(measured.by_op.get(k, 0.0),
                                                                          kernel.get(k, 0.0)))
    lines = [f"\n{name}: measured {measured.step_s * 1e3:.2f} ms/step (median), predicted {step.step_s * 1e3:.2f} ms "
             f"({step.step_s / measured.step_s - 1:+.1%}); profiled phases "
             + ", ".join(f"{p} {measured.phase_s.get(p, 0) * 1e3:.2f} ms" for p in PHASES)]
    lines.append(f"  {'phase':<9} {'op':<34} {'calls':>5} {'measured ms':>11} {'pred kernel':>11} "
                 f"{'pred host':>9} {'ratio':>6}")
    for key in keys[:top]:
        got = measured.by_op.get(key, 0.0)
        predicted = kernel.get(key, 0.0) + host.get(key, 0.0)
        ratio = f"{predicted / got:6.2f}" if got > 0 else "     -"
        lines.append(f"  {key[0]:<9} {key[1]:<34} {count.get(key, 0):>5} {got * 1e3:>11.3f} "
                     f"{kernel.get(key, 0.0) * 1e3:>11.3f} {host.get(key, 0.0) * 1e3:>9.3f} {ratio}")
    for phase in PHASES:
        ops = sum(v for k, v in measured.by_op.items() if k[0] == phase)
        pred = sum(kernel.get(k, 0) + host.get(k, 0) for k in kernel if k[0] == phase)
        outside = measured.outside_s[phase]
        lines.append(f"  {phase:<9} ops measured {ops * 1e3:9.3f} ms, outside ops {outside * 1e3:8.3f} ms"
                     f" | predicted {pred * 1e3:9.3f} ms")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(["mlp_example", *available()]))
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    db = load_hwdb([])
    with tempfile.TemporaryDirectory() as cache, mock.patch.dict(os.environ, {"GPU_ADVISOR_CACHE_DIR": cache}):
        cpu = local_targets(db, load_families(db), lambda m: print(f"advisor: {m}", file=sys.stderr))[0]
    print(f"op breakdown, torch {torch.__version__}, {torch.get_num_threads()} threads; {cpu.name}; "
          f"calibration {cpu.device.profile.mode} {cpu.device.profile.created}")
    print(f"overheads: {cpu.device.profile.overheads_s}")
    for name in args.models.split(","):
        build, make_input, loss_fn, batch, optimizer = model_parts(name)
        parts = (build, make_input, loss_fn)
        trace = trace_training_step(build, make_input, batch, "fp32", optimizer, loss_fn)
        timed = with_measured_shapes(cpu, trace.records, "fp32", lambda m: print(f"advisor: {m}", file=sys.stderr))
        step = estimate_records(trace.records, "fp32", timed.device)
        count: dict[tuple[str, str], int] = defaultdict(int)
        for record in trace.records:
            count[(record.phase, record.op)] += 1
        measured = measure(parts, batch, optimizer, {r.op for r in trace.records}, args.steps)
        print("\n".join(report(f"{name} b{batch} {optimizer}", measured, step, args.top, count)),
              flush=True)
        gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
