"""`advisor estimate [MODEL.py]`: the ranked table of devices (fits, memory, step time, throughput,
time-to-train, cloud cost, purchase), or the JSON of docs/json-schema.md with --json."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap

from collections.abc import Sequence
from typing import TYPE_CHECKING

from advisor.app.plan import advise, advisor_runs, plan
from advisor.app.request import PlanRequest
from advisor.cli.arguments import add_estimate_arguments, examples, note, progress, request_from_arguments
from advisor.present.format import (describe_params, duration, fits_nowhere_message, gib, mfu_cell, money,
                                    plan_duration, si, speed, throughput_cell, throughput_header,
                                    tight_fit_line)
from advisor.cli.table import FORMATS, Column, output_width, render_csv, render_markdown, render_table
from advisor.present.layout import channels_last_advice
from advisor.present.parallel import gpus_cell, parallel_line, scale_out_line
from advisor.present.pipeline import pipeline_line, supply_line
from advisor.present.notes import estimate_notes
from advisor.present.plans import plan_lines
from advisor.present.ranking import SORT_KEYS, sort_results
from advisor.errors import UserError
from advisor.hardware.specs import HardwareDB
from advisor.process import user_output_to_stderr
from advisor.profile.choices import describe_optimizer

if TYPE_CHECKING:
    from advisor.app.fit import FitPlan
    from advisor.estimate.plan import DeviceEstimate, Estimate

def add_parser(subparsers: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "estimate",
        parents=parents,
        help="training time, memory and cost of a model on every GPU (and this machine), ranked",
        **examples(("advisor estimate", "the built-in ResNet-50 example on every GPU"),
                   ("advisor estimate my_model.py --batch-size 64 --precision amp-bf16", "your model, as you train it"),
                   ("advisor estimate llama --gpu h100-sxm --gpu a100-sxm4-80gb --checkpointing", "two GPUs only"),
                   ("advisor estimate my_model.py --samples 50000 --epochs 10 --sort cost", "your job, cheapest first"),
                   ("advisor estimate my_model.py --local", "also this machine, from a measured calibration"),
                   ("advisor estimate my_model.py --format csv > plan.csv", "the device table for a spreadsheet")),
        description="Trace MODEL's training step on fake tensors, time every op on every device from its "
                    "peaks and calibration, check memory, and turn the step into time-to-train and money. "
                    "Without MODEL it runs the built-in resnet50 example.",
    )
    add_estimate_arguments(parser)
    parser.add_argument("--sort", choices=SORT_KEYS, default="time",
                        help="table order among devices that fit (default time-to-train); the rest follow")
    parser.add_argument("--top-ops", type=int, default=10, metavar="N", help="ops per device in --json (default 10)")
    parser.add_argument("--format", choices=FORMATS, default="table",
                        help="table (fitted to the terminal, or to $COLUMNS), json (the --json schema), csv (the "
                             "device table, every column) or markdown")
    parser.add_argument("--json", action="store_true", help="machine-readable output (schema: docs/json-schema.md); "
                                                            "the same as --format json")
    parser.set_defaults(run=run)


def estimate_for(request: PlanRequest, db: HardwareDB) -> Estimate:
    """advisor.app's plan of the command line's request (the part `estimate` and `report` share). The
    model file's output goes to stderr meanwhile: stdout carries our data alone."""
    from advisor.cli.calibrate import ProgressBar

    bar = ProgressBar("calibrating this machine") if request.local and sys.stderr.isatty() else None
    try:
        with user_output_to_stderr():
            return plan(request, db, progress, notify=lambda m: print(f"advisor: {m}", file=sys.stderr),
                        calibration_bar=bar)
    finally:
        if bar is not None:
            bar.close()


def run(args: argparse.Namespace, db: HardwareDB) -> int:
    if args.top_ops < 0:
        raise UserError(f"--top-ops must be 0 or more, got {args.top_ops}")
    request = request_from_arguments(args)
    estimate = estimate_for(request, db)
    with user_output_to_stderr():
        plans = advise(request, db, estimate, progress)
    output_format = "json" if args.json else args.format
    if output_format == "json":
        print(json.dumps(estimate.to_dict(args.top_ops) | {"plans": [p.to_dict() for p in plans]}, indent=2))
    else:
        print(render_estimate(estimate, args.sort, output_width(), output_format, request))
        if output_format == "table" and advisor_runs(request, estimate):
            print("\n".join(render_plans(estimate, plans)))
    if not estimate.fitting and not plans:
        raise UserError(fits_nowhere(estimate, request))
    if not estimate.fitting:
        note(f"as asked, {estimate.model.name} fits none of the {len(estimate.results)} devices; "
             "the ways to make it fit are listed")
    return 0


def render_plans(estimate: Estimate, plans: Sequence[FitPlan]) -> list[str]:
    """The fit advisor's section after the table (present/plans.py)."""
    return [""] + plan_lines(estimate, plans)


def fits_nowhere(estimate: Estimate, request: PlanRequest) -> str:
    """One sentence: what the model needs, the largest device, and what to change (the fit advisor ran for
    `request` and found nothing, or did not run)."""
    advisor = "none found" if advisor_runs(request, estimate) else "not run"
    return fits_nowhere_message(estimate.model.name, estimate.settings.memory, [r.memory for r in estimate.results],
                                advisor)


def columns(spot: bool, tokens: bool = False) -> list[Column]:
    """The device table's columns; with `spot` the job is priced at spot rates and the other price
    column is on demand; with `tokens` (a sequence model) throughput is in tokens/s. In a narrow
    terminal the calibration, max batch, spot cost, MFU, throughput, purchase price, bound, step time,
    cheapest offer and GPUs give way in that order; rank, device, memory, time-to-train and job cost stay (80
    columns keep the cheapest offer too). Columns added later come last (GPUs, MFU), so that CSV columns keep
    their places."""
    return [
        Column("#", True), Column("Device"), Column("Peak/Mem GiB", True), Column("Max bs", True, drop_order=2),
        Column("Step", True, drop_order=8), Column(throughput_header(tokens), True, drop_order=5),
        Column("Train", True),
        Column("Bound", drop_order=7), Column("Cheapest cloud", drop_order=9), Column("Job $", True),
        Column("On-demand $" if spot else "Spot $", True, drop_order=3), Column("Buy $", True, drop_order=6),
        Column("Calib", drop_order=1), Column("GPUs", drop_order=10), Column("MFU", True, drop_order=4),
    ]


def _row(rank: int | None, result: DeviceEstimate, spot_ranked: bool) -> list[str]:
    memory = f"{gib(result.memory.peak_bytes)}/{gib(result.memory.capacity_bytes)}"
    max_batch = "-" if result.memory.max_batch_size is None else f"{result.memory.max_batch_size:,}"
    gpu = result.target.gpu
    buy = money(gpu.purchase_usd) if gpu is not None else "-"
    calibration = result.target.calibration
    if not result.fits:  # time-to-train is never dropped: what is missing goes there
        short = f"{gib(result.memory.missing_bytes)} GiB short"
        return ["", result.id, memory, max_batch, "", "", short, "", "", "", "", buy, calibration, gpus_cell(result),
                ""]
    offer = result.cheapest(spot_ranked)  # the offer the job cost is priced on, at the rate shown
    if offer is None:
        where = result.no_offer_reason()
    else:
        where = f"{offer.provider} {offer.rate(spot_ranked):.2f}/h" + (" spot" if spot_ranked else "")
    other = result.job_cost_usd() if spot_ranked else result.spot_saving_cost_usd()
    return [
        str(rank), result.id, memory, max_batch, duration(result.step_time_s),
        throughput_cell(result.throughput, result.throughput_tokens_per_s),
        plan_duration(result.time_to_train_s), result.step.bound, where, money(result.job_cost_usd(spot_ranked)),
        money(other), buy, calibration, gpus_cell(result), mfu_cell(result.mfu),
    ]




def render_estimate(estimate: Estimate, sort: str = "time", max_width: int | None = None,
                    output_format: str = "table", request: PlanRequest | None = None) -> str:
    """The estimate as the terminal table with its header and summary lines fitted to `max_width`
    (None: every column, lines unwrapped), as CSV (the table alone) or as Markdown."""
    assert output_format in ("table", "csv", "markdown"), output_format
    ordered = sort_results(estimate, sort)
    rows = [_row(rank if result.fits else None, result, estimate.settings.spot)
            for rank, result in enumerate(ordered, 1)]
    table_columns = columns(estimate.settings.spot, estimate.settings.seq_len is not None)
    if output_format == "csv":
        return render_csv(table_columns, rows)
    header, footer = _header(estimate), _footer(estimate, request)
    if output_format == "markdown":
        return "\n\n".join([*header, render_markdown(table_columns, rows),
                             "\n".join(f"- {line}" for line in footer)])
    styles = ["red" if not r.fits else "green" if rank == 1 else None for rank, r in enumerate(ordered, 1)]
    table = render_table(table_columns, rows, max_width, styles)
    return "\n".join([*(_wrap(line, max_width) for line in header), "", table, "",
                      *(_wrap(line, max_width) for line in footer)])


def _wrap(line: str, width: int | None) -> str:
    """A prose line broken at spaces to `width` (continuation lines indented by two)."""
    if width is None or len(line) <= width:
        return line
    return textwrap.fill(line, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)


def _header(estimate: Estimate) -> list[str]:
    trace, settings, model = estimate.trace, estimate.settings, estimate.model
    memory = settings.memory
    unit = model.sample_unit
    batch = f"batch {memory.batch_size}"
    if settings.seq_len is not None:
        batch += f" x {settings.seq_len:,} tokens" + (" padded (an attention mask)" if settings.padding_mask else "")
        if settings.packing is not None:
            batch += f" (documents of {settings.packing:,} packed)"
    gpus = settings.num_gpus or 1
    if gpus > 1 and settings.tensor_parallel:
        degree = f" of {settings.tp}" if settings.tp else ""
        batch += f" per tensor-parallel group{degree} on {gpus} GPUs ({settings.parallel})"
    elif gpus > 1:
        batch += f" per GPU on {gpus} GPUs ({settings.parallel})"
    if memory.accumulate_gradients:
        batch += f" ({memory.accumulation_steps} micro-batches of {memory.micro_batch})"
    options = ", activation checkpointing" if memory.checkpointing else ""
    if settings.compiled:
        options += ", torch.compile"
    if settings.sync_each_step:
        options += ", the loop reads a value back each step"
    if trace.adapted:
        options += f", {trace.adapted}"
    assumed = f" ({'; '.join(settings.assumptions)})" if settings.assumptions else ""
    return [
        f"Model: {model.name} ({model.origin or model.source}), {describe_params(trace)}, "
        f"{si(trace.flops(), 'FLOP')} per training step (2 FLOPs per multiply-add)"
        f"{'; ' + trace.replication() if trace.replicated_blocks else ''}",
        f"Settings: {batch}, {memory.precision}, {describe_optimizer(memory.optimizer, trace.optimizer_class)}{options}"
        f"{assumed}; job: {settings.job.describe(memory.batch_size * estimate.data_parallel, unit)}",
        _calibration_line(estimate),
        _legend(settings.spot, gpus),
    ]


def _legend(spot: bool, gpus: int) -> str:
    if gpus > 1:
        gpus_column = (f"GPUs: how many and the strategy (the fastest that fits with --parallel auto); Peak/Mem: "
                       "peak training memory of each GPU / its memory")
        rented = f"the cheapest instances holding exactly {gpus} GPUs, whole instances rented"
    else:
        gpus_column = ("GPUs: 1, or 'needs N strategy': the fewest that fit where one is too small (--num-gpus N "
                       "for their figures); Peak/Mem: peak training memory / device memory")
        rented = "the cheapest 1-GPU instance (8-GPU nodes are not rented for a 1-GPU job)"
    return (f"{gpus_column} (GiB = 2^30 bytes; 'GiB short' in Train: does not fit); Step: one optimizer step; "
            f"Cheapest cloud and Job $: {rented} for the job's hours, {'at spot rates' if spot else 'on demand'}, "
            f"per hour of all of it; {'On-demand $' if spot else 'Spot $: the cheapest spot price where it is lower'}; "
            "Buy $: card price")


def _footer(estimate: Estimate, request: PlanRequest | None) -> list[str]:
    goals = [] if request is None else goal_lines(estimate, request)
    feeding = [line for line in (supply_line(estimate), pipeline_line(estimate)) if line]
    return _summary(estimate) + _parallel_lines(estimate) + feeding + goals + estimate_notes(estimate)


def _parallel_lines(estimate: Estimate) -> list[str]:
    """The fastest multi-GPU job's configuration; GPUs no machine holds that many of; where nothing fits on
    one GPU, the fewest GPUs that fit of the fastest type."""
    lines = []
    by_time = estimate.by_time()
    best = by_time[0] if by_time else next(iter(estimate.results), None)
    if best is not None and best.scaling is not None:
        lines.append(f"{best.id}: {parallel_line(best)}")
    if estimate.skipped:
        lines.append(f"Left out ({len(estimate.skipped)}): " + "; ".join(
            f"{gpu_id} ({why})" for gpu_id, why in estimate.skipped[:4]) + ("; ..." if len(estimate.skipped) > 4 else ""))
    scaled = estimate.fastest_scale_out()
    if scaled is not None and scaled.scale_out is not None and not by_time:
        lines.append(f"{scaled.id}: {scale_out_line(scaled)} (--num-gpus {scaled.scale_out.num_gpus})")
    return lines


def goal_lines(estimate: Estimate, request: PlanRequest) -> list[str]:
    """One line per goal the request sets: budget, deadline, a card's purchase price."""
    spot = estimate.settings.spot
    lines = []
    if request.budget_usd is not None:
        best = estimate.fastest_within_budget(request.budget_usd)
        lines.append(f"Fastest within {money(request.budget_usd)} USD: " + (
            f"{best.id}, {plan_duration(best.time_to_train_s)} for {money(best.job_cost_usd(spot))} USD"
            if best else "no rentable device trains the job within the budget"))
    if request.deadline_s is not None:
        best = estimate.cheapest_within_deadline(request.deadline_s)
        lines.append(f"Cheapest done within {plan_duration(request.deadline_s)}: " + (
            f"{best.id}, {money(best.job_cost_usd(spot))} USD in {plan_duration(best.time_to_train_s)}"
            if best else "no rentable device finishes the job by then"))
    if request.max_price_usd is not None:
        best = estimate.fastest_to_buy_within(request.max_price_usd)
        lines.append(f"Fastest card within {money(request.max_price_usd)} USD: " + (
            f"{best.id}, {money(best.owning.purchase_usd)} USD for "
            f"{speed(best.throughput, best.throughput_tokens_per_s, estimate.model.sample_unit)}"
            if best and best.owning else "no card the model fits on costs that little"))
    return lines


def _calibration_line(estimate: Estimate) -> str:
    defaults = sum(1 for r in estimate.results if r.target.calibration == "default")
    measured = [r.id for r in estimate.results if r.target.calibration == "measured"]
    parts = []
    if defaults:
        parts.append(f"{defaults} {'device uses' if defaults == 1 else 'devices use'} the documented default "
                     "calibration of their GPU family "
                     "(`advisor calibrate --references`; no measurement of that GPU)")
    if measured:
        parts.append(f"measured: {', '.join(measured)}")
    notes = [f"{r.id}: {r.target.note}" for r in estimate.results if r.target.note]
    return "Calibration: " + "; ".join(parts + notes)


def _summary(estimate: Estimate) -> list[str]:
    spot = estimate.settings.spot
    lines = []
    by_time, by_cost, pareto = estimate.by_time(), estimate.by_cost(), estimate.pareto()
    if by_time:
        best = by_time[0]
        tokens = best.throughput_tokens_per_s
        rate = "" if tokens is None else f"{speed(best.throughput, tokens, estimate.model.sample_unit)}, "
        mfu = "" if best.mfu is None else f", {best.mfu:.0%} MFU"
        lines.append(f"Fastest: {best.id}, {plan_duration(best.time_to_train_s)} ({rate}{best.step.bound}-bound{mfu})")
        advice = channels_last_advice(estimate, best)
        if advice:
            lines.append(f"Tip: on {best.id}, channels-last tensors {advice}")
    if by_cost:
        best = by_cost[0]
        offer = best.cheapest(spot)
        assert offer is not None
        kind = "spot" if spot else "on demand"
        lines.append(f"Cheapest to rent ({kind}): {best.id} on {offer.provider} {offer.instance}, "
                     f"{money(best.job_cost_usd(spot))} USD in {plan_duration(best.time_to_train_s)}")
    if pareto:
        lines.append("Best time/cost trade-offs (Pareto): " + ", ".join(
            f"{r.id} ({plan_duration(r.time_to_train_s)}, {money(r.job_cost_usd(spot))} USD)" for r in pareto))
    best = estimate.best_value_to_buy()
    if best is not None:
        owning = best.owning
        assert owning is not None
        line = (f"Best value to buy: {best.id}, {money(owning.purchase_usd)} USD for "
                f"{speed(best.throughput, best.throughput_tokens_per_s, estimate.model.sample_unit)}")
        if owning.break_even_hours is not None:
            line += (f"; pays off against renting it after {owning.break_even_hours:,.0f} h of training "
                     f"({owning.break_even_jobs:,.1f} such jobs)")
        lines.append(line)
    tight = tight_fit_line([r.id for r in estimate.results if r.fits and r.memory.allocator_flushes])
    if tight:
        lines.append(tight)
    short = [r for r in estimate.results if not r.fits]
    if short:
        lines.append(f"Does not fit: {len(short)} of {len(estimate.results)} devices (missing memory in the table)")
    return lines
