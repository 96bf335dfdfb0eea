"""`advisor profile MODEL.py`: params, forward and train-step FLOPs, the by-module table, top ops
by FLOPs and by bytes, and coverage (what no formula counts)."""

from __future__ import annotations

import argparse
import json

from typing import TYPE_CHECKING

from advisor.cli.arguments import add_model_arguments, examples, positive_int, progress, request_from_arguments
from advisor.present.format import count, percent, si
from advisor.cli.table import Column, render_table
from advisor.errors import UserError
from advisor.hardware.specs import HardwareDB
from advisor.process import user_output_to_stderr
from advisor.profile.choices import describe_optimizer
from advisor.app.plan import request_model

if TYPE_CHECKING:
    from advisor.profile.profiler import ModelProfile


def add_parser(subparsers: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "profile",
        parents=parents,
        help="FLOPs, params and bytes of a model's training step, by module and by op",
        **examples(("advisor profile my_model.py", "parameters, FLOPs and bytes by module and op"),
                   ("advisor profile resnet50 --depth 3 --top 20", "deeper module table, more ops"),
                   ("advisor profile my_model.py --json > profile.json", "every figure as JSON")),
        description="Trace one training step of MODEL on fake tensors (no memory for weights) and "
                    "profile its forward with fvcore. FLOPs count 2 per multiply-add.",
    )
    add_model_arguments(parser)
    parser.add_argument("--depth", type=int, default=2, metavar="D", help="module depth of the table (default 2)")
    parser.add_argument("--top", type=positive_int, default=10, metavar="N", help="ops in the top lists (default 10)")
    parser.add_argument("--no-fvcore", action="store_true", help="skip fvcore's forward profile (the trace alone)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, db: HardwareDB) -> int:
    if args.depth < 0:
        raise UserError(f"--depth must be 0 or more, got {args.depth}")
    from advisor.profile.profiler import profile_model  # torch and fvcore: only once a model is profiled

    with user_output_to_stderr():
        request = request_from_arguments(args)
        model = request_model(request)
        progress(f"tracing a training step of {model.source} on fake tensors"
                 + ("" if args.no_fvcore else ", then fvcore's forward profile"))
        precision = request.precision_for(model)
        profile = profile_model(model, args.batch_size, precision, model.resolve_optimizer(args.optimizer),
                                with_fvcore=not args.no_fvcore, timeout_s=args.trace_timeout or None,
                                progress=progress, adaptation=request.adaptation(precision))
    if args.json:
        print(json.dumps(profile.to_dict(args.depth, args.top), indent=2))
    else:
        print(render_profile(profile, args.depth, args.top))
    return 0


def render_profile(profile: ModelProfile, depth: int, top: int) -> str:
    trace = profile.trace
    unit = profile.model.sample_unit
    batch = profile.batch_size
    lines = [
        f"Model: {profile.model.source}, {count(profile.params)} trainable parameters "
        f"({profile.params:,}); batch of {batch} {_singular(unit) if batch == 1 else unit}, {trace.precision}, "
        f"{describe_optimizer(trace.optimizer, trace.optimizer_class)}",
        f"FLOPs (2 per multiply-add): forward {si(profile.forward_flops, 'FLOP')} "
        f"({si(profile.forward_flops / batch, 'FLOP')} per {_singular(unit)}), "
        f"train step {si(profile.train_step_flops, 'FLOP')} = forward+loss {si(trace.flops('forward'), 'FLOP')} "
        f"+ backward {si(trace.flops('backward'), 'FLOP')} + optimizer {si(trace.flops('optimizer'), 'FLOP')}",
        f"Bytes moved (every op reads and writes its tensors, no cache reuse): forward "
        f"{si(trace.bytes_moved('forward'), 'B')}, backward {si(trace.bytes_moved('backward'), 'B')}, "
        f"optimizer {si(trace.bytes_moved('optimizer'), 'B')}",
        _trace_line(profile),
        _fvcore_line(profile),
        "",
        _module_table(profile, depth),
        "",
        f"Top {top} ops by FLOPs",
        _op_table(profile, "flops", top),
        "",
        f"Top {top} ops by bytes moved",
        _op_table(profile, "bytes", top),
        "",
        _coverage_lines(profile),
    ]
    return "\n".join(lines)


def _op_counts(counts: dict[str, int]) -> str:
    """{"nonzero": 1, "item": 2} -> "item x2, nonzero x1" (most calls first)."""
    return ", ".join(f"{op} x{n}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _singular(unit: str) -> str:
    return unit[:-1] if unit.endswith("s") else unit


def _trace_line(profile: ModelProfile) -> str:
    trace = profile.trace
    how = "fake tensors, no memory for weights or activations"
    if trace.values == "real":
        how = ("real CPU tensors with freshly initialised weights: the model branches on values computed from its "
               "weights")
    elif trace.values != "fake":
        answered = _op_counts(trace.data_dependent_ops)
        how = ("fake tensors with real input values: the model reads its inputs' values "
               f"({answered} answered from real tensors)")
    if trace.assumed_finite:
        how += f"; {trace.assumed_finite} checks of activations for inf/NaN answered as finite"
    if trace.construction == "meta":
        how += "; built on real tensors with weights on the meta device (its constructor computes with tensor values)"
    return f"Trace: {len(trace.records)} ops in {profile.trace_seconds:.2f} s on {how}"


def _fvcore_line(profile: ModelProfile) -> str:
    if profile.forward is None:
        if profile.forward_error is None:
            return "fvcore: skipped (--no-fvcore)"
        return f"fvcore: no forward profile: {profile.forward_error.splitlines()[0]}"
    agreement = profile.fvcore_agreement()
    where = "meta device" if profile.forward.device == "meta" else "real CPU tensors"
    return (f"fvcore forward profile ({where}, {profile.forward_seconds:.2f} s): "
            f"{si(profile.forward.total_flops, 'FLOP')}, {_agreement(agreement)} the trace's forward")


def _agreement(difference: float | None) -> str:
    if difference is None:
        return "not comparable with"
    if abs(difference) < 5e-5:
        return "equal to"
    return f"{'+' if difference > 0 else ''}{percent(difference, 2)} from"


def _module_table(profile: ModelProfile, depth: int) -> str:
    rows = profile.modules(depth)
    total = profile.train_step_flops or 1.0
    columns = [Column("Module"), Column("Params", True), Column("Fwd FLOPs", True), Column("fvcore fwd", True),
               Column("Train FLOPs", True), Column("Share", True), Column("Fwd written", True)]
    cells = []
    for row in rows:
        name = "(model)" if row.name == "" else "  " * (row.depth - 1) + row.name.rsplit(".", 1)[-1]
        cells.append([
            name,
            count(row.params) if row.params else "",
            si(row.forward_flops, "FLOP"),
            "" if row.fvcore_forward_flops is None else si(row.fvcore_forward_flops, "FLOP"),
            si(row.train_flops, "FLOP"),
            percent(row.train_flops / total),
            si(row.forward_bytes_written, "B"),
        ])
    title = f"By module (depth {depth}; FLOPs include submodules; Train = forward + backward in the step)"
    return title + "\n" + render_table(columns, cells)


def _op_table(profile: ModelProfile, by: str, top: int) -> str:
    total_flops = profile.train_step_flops or 1.0
    total_bytes = profile.trace.bytes_moved() or 1
    columns = [Column("Op"), Column("Calls", True), Column("FLOPs", True), Column("Share", True),
               Column("Bytes", True), Column("Share", True), Column("Engine"), Column("Phases")]
    cells = [
        [s.op, str(s.calls), si(s.flops, "FLOP"), percent(s.flops / total_flops), si(s.bytes_moved, "B"),
         percent(s.bytes_moved / total_bytes), "tensor" if s.matmul else "vector", ",".join(s.phases)]
        for s in profile.top_ops(by, top)
    ]
    return render_table(columns, cells)


def _coverage_lines(profile: ModelProfile) -> str:
    coverage = profile.coverage()
    uncounted = coverage["trace_uncounted_ops"]
    if uncounted:
        listed = _op_counts(uncounted)
        trace_part = (f"{percent(coverage['trace_counted_fraction'])} of {coverage['trace_ops']} traced ops counted; "
                      f"no formula (counted as 0 FLOPs, bytes kept): {listed}")
    else:
        trace_part = f"all {coverage['trace_ops']} traced ops counted"
    lines = [f"Coverage: {trace_part}."]
    fvcore_uncounted = coverage["fvcore_uncounted_ops"]
    if fvcore_uncounted:
        lines.append(f"fvcore: ops not counted in the forward profile: {_op_counts(fvcore_uncounted)}.")
    elif fvcore_uncounted is not None:
        lines.append("fvcore: every forward op counted.")
    return "\n".join(lines)
