"""What the planning report says, built once from an Estimate and rendered to HTML or Markdown by the
templates: recommendations with their reason, the model, where the time goes, the charts, the device
table, the cloud offers with their price dates and sources, the assumptions and the accuracy figures.

Every figure is formatted here, so both renderings say exactly the same thing and no template ever
prints a raw float, None or nan."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import yaml

from advisor import __version__, units
from advisor.present.format import (describe_params, duration, mfu_cell, money, percent, plan_duration, si, speed,
                                    throughput_cell, throughput_header)
from advisor.present.layout import channels_last_advice
from advisor.present.parallel import gpus_cell, instance_label, parallel_line, scale_out_line
from advisor.present.pipeline import input_bound, pipeline_line, supply_line
from advisor.present.notes import estimate_notes
from advisor.present.plans import SEARCHED, plan_line, plan_outcome, plans_title
from advisor.estimate.plan import DeviceEstimate, Estimate
from advisor.hardware.specs import HardwareDB, Source
from advisor.paths import shipped_dir
from advisor.report.charts import Chart, all_charts

if TYPE_CHECKING:
    from advisor.app.fit import FitPlan

MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "overhead")
TOP_OPS = 8


@dataclass(frozen=True)
class Recommendation:
    title: str
    device: str
    reason: str


@dataclass(frozen=True)
class DeviceRow:
    rank: str
    device: str
    name: str
    memory: str
    max_batch: str
    step: str
    throughput: str
    train: str
    bound: str
    cloud: str
    job_usd: str
    spot_usd: str
    buy_usd: str
    calibration: str
    fits: bool
    gpus: str = "1"
    """present.parallel.gpus_cell: how many GPUs and the strategy, or the fewest that fit."""
    mfu: str = "-"
    """Model FLOPs utilisation (present.format.mfu_cell)."""


@dataclass(frozen=True)
class OfferRow:
    device: str
    provider: str
    instance: str
    region: str
    usd_per_hour: str
    spot_usd_per_hour: str
    job_usd: str
    spot_job_usd: str
    price_date: str
    source: str


@dataclass(frozen=True)
class Report:
    """The report's content, formatted. Charts hold SVG text."""

    title: str
    created: str
    generator: str
    model_lines: tuple[tuple[str, str], ...]
    settings_lines: tuple[tuple[str, str], ...]
    recommendations: tuple[Recommendation, ...]
    lead_device: str
    """The device the model's memory and time sections describe: the fastest that fits."""
    memory_parts: tuple[tuple[str, str, str], ...]
    """(part, GiB, share of the peak)."""
    time_bounds: tuple[tuple[str, str, str], ...]
    """(compute/memory/overhead, time, share)."""
    top_ops: tuple[tuple[str, ...], ...]
    """(op, phase, calls, time, share, bound) per row, formatted."""
    charts: tuple[Chart, ...]
    omitted_charts: tuple[str, ...]
    """One sentence for each chart left out because it would be empty."""
    devices: tuple[DeviceRow, ...]
    throughput_unit: str
    """What the devices' throughput counts: "tokens/s" for a sequence model, else "samples/s"."""
    offers: tuple[OfferRow, ...]
    sources: tuple[Source, ...]
    """The price sources the offers cite."""
    assumptions: tuple[str, ...]
    accuracy: tuple[str, ...]
    plans_title: str = ""
    """"Ways to make it fit" or "Cheaper or faster" when the fit advisor ran, else ""."""
    plans: tuple[str, ...] = ()
    """One line per plan (present/plans.py), or one that says none was found."""
    notes: tuple[str, ...] = ()
    """What the figures rest on that the reader should know (present/notes.py): shown after the summary."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_report(estimate: Estimate, db: HardwareDB, budget_usd: float | None = None, deadline_s: float | None = None,
                 accuracy_file: Path | None = None, now: dt.datetime | None = None,
                 max_price_usd: float | None = None, plans: Sequence[FitPlan] | None = None) -> Report:
    """The report for `estimate` (made with `db`, whose sources the offers cite); `budget_usd`,
    `deadline_s` and `max_price_usd` (a card's purchase budget) add the best choice under them; `plans`
    (the fit advisor's, None when it did not run) a section of their own."""
    offers = tuple(_offers(estimate))
    model, trace, settings = estimate.model, estimate.trace, estimate.settings
    memory = settings.memory
    lead = (estimate.by_time() or list(estimate.results))[0]
    created = (now or dt.datetime.now(dt.timezone.utc)).replace(microsecond=0)
    charts = all_charts(estimate)
    return Report(
        title=f"Training plan for {model.name}",
        created=created.isoformat(),
        generator=f"gpu-advisor {__version__}",
        model_lines=(
            ("Model", f"{model.name} ({model.origin or model.source})"),
            ("Parameters", describe_params(trace).removesuffix(" parameters").replace(" parameters, ", ", ")),
            ("Forward pass", f"{si(trace.model_forward_flops(), 'FLOP')} at batch {memory.traced_batch}"),
            ("Training step", f"{si(trace.flops(), 'FLOP')}, {si(trace.bytes_moved(), 'B')} moved "
                              f"(batch {memory.traced_batch}; 2 FLOPs per multiply-add)"
                              f"{'; ' + trace.replication() if trace.replicated_blocks else ''}"),
        ),
        settings_lines=_settings_lines(estimate),
        recommendations=tuple(recommendations(estimate, budget_usd, deadline_s, max_price_usd, plans or ())),
        lead_device=lead.id,
        memory_parts=_memory_parts(lead),
        time_bounds=_time_bounds(lead),
        top_ops=_top_ops(lead),
        charts=tuple(c for c in charts if isinstance(c, Chart)),
        omitted_charts=tuple(c for c in charts if isinstance(c, str)),
        devices=tuple(_device_row(i, r, settings.spot) for i, r in enumerate(_table_order(estimate), 1)),
        throughput_unit=throughput_header(settings.seq_len is not None).lower(),
        offers=offers,
        sources=tuple(db.source(key) for key in sorted({o.source for o in offers})),
        assumptions=tuple(_assumptions(estimate)),
        accuracy=tuple(accuracy_lines(accuracy_file)),
        plans_title="" if plans is None else plans_title(estimate),
        plans=() if plans is None else (tuple(plan_line(estimate, plan) for plan in plans)
                                        or (f"None found among {SEARCHED}.",)),
        notes=tuple(estimate_notes(estimate)),
    )


def recommendations(estimate: Estimate, budget_usd: float | None, deadline_s: float | None,
                    max_price_usd: float | None = None, plans: Sequence[FitPlan] = ()) -> list[Recommendation]:
    """Fastest, cheapest to rent, best value to buy, and the best under the budget or deadline given,
    each with its reason in one line; the devices are the estimator's own ranking. When nothing fits, the
    fit advisor's first plan (`plans`), if any."""
    spot = estimate.settings.spot
    kind = "spot" if spot else "on demand"
    unit = estimate.model.sample_unit
    found: list[Recommendation] = []
    by_time, by_cost = estimate.by_time(), estimate.by_cost()
    if by_time:
        best = by_time[0]
        runner_up = f"; next: {by_time[1].id} at {plan_duration(by_time[1].time_to_train_s)}" if len(by_time) > 1 else ""
        rate = speed(best.throughput, best.throughput_tokens_per_s, unit)
        found.append(Recommendation("Fastest", best.id, f"trains in {plan_duration(best.time_to_train_s)} "
                                    f"({rate}, {best.step.bound}-bound"
                                    f"{'' if best.mfu is None else f', {mfu_cell(best.mfu)} MFU'}){runner_up}"))
    if by_cost:
        best = by_cost[0]
        offer = best.cheapest(spot)
        assert offer is not None
        found.append(Recommendation(f"Cheapest to rent ({kind})", best.id,
                                    f"{money(best.job_cost_usd(spot))} USD for the job on {offer.provider} "
                                    f"{offer.instance} at {offer.rate(spot):.2f} "
                                    f"USD per hour ({kind}, {offer.gpus} GPUs), "
                                    f"{plan_duration(best.time_to_train_s)}"))
    value = estimate.best_value_to_buy()
    if value is not None and value.owning is not None:
        owning = value.owning
        pays = (f"; pays off against renting after {owning.break_even_hours:,.0f} h of training"
                if owning.break_even_hours is not None else "")
        found.append(Recommendation("Best value to buy", value.id,
                                    f"{money(owning.purchase_usd)} USD for "
                                    f"{speed(value.throughput, value.throughput_tokens_per_s, unit)}, "
                                    f"the lowest price per throughput{pays}"))
    if budget_usd is not None:
        best = estimate.fastest_within_budget(budget_usd)
        title = f"Fastest within {money(budget_usd)} USD"
        found.append(Recommendation(title, best.id, f"{plan_duration(best.time_to_train_s)} for "
                                    f"{money(best.job_cost_usd(spot))} USD ({kind})") if best is not None
                     else Recommendation(title, "no device", "no rentable device trains the job within the budget"))
    if max_price_usd is not None:
        best = estimate.fastest_to_buy_within(max_price_usd)
        title = f"Fastest card within {money(max_price_usd)} USD"
        found.append(Recommendation(title, best.id, f"{money(best.owning.purchase_usd)} USD for "
                                    f"{speed(best.throughput, best.throughput_tokens_per_s, unit)}, "
                                    f"trains in {plan_duration(best.time_to_train_s)}")
                     if best is not None and best.owning is not None
                     else Recommendation(title, "no device", "no card the model fits on costs that little"))
    if deadline_s is not None:
        best = estimate.cheapest_within_deadline(deadline_s)
        title = f"Cheapest within {plan_duration(deadline_s)}"
        found.append(Recommendation(title, best.id, f"{money(best.job_cost_usd(spot))} USD ({kind}), done in "
                                    f"{plan_duration(best.time_to_train_s)}") if best is not None
                     else Recommendation(title, "no device", "no rentable device finishes the job by the deadline"))
    advice = channels_last_advice(estimate, by_time[0]) if by_time else None
    if advice:
        found.append(Recommendation("Channels-last tensors", by_time[0].id, advice))
    limited = input_bound(estimate)
    if limited:
        found.append(Recommendation("Input pipeline limits", f"{len(limited)} GPUs", supply_line(estimate) or ""))
    if by_time and by_time[0].scaling is not None:
        found.append(Recommendation("How it runs", by_time[0].id, parallel_line(by_time[0]) or ""))
    scaled = estimate.fastest_scale_out()
    if scaled is not None and not by_time:
        found.append(Recommendation("Fits on several GPUs", scaled.id, scale_out_line(scaled) or ""))
    if not estimate.fitting and plans:
        first = plans[0]
        found.append(Recommendation("Does not fit as asked; fits with", first.result.id,
                                    f"{first.flags} ({plan_outcome(estimate, first)}); "
                                    "see Ways to make it fit"))
    elif not estimate.fitting:
        found.append(Recommendation("Does not fit", "no device",
                                    "the model fits on none of the devices at these settings; see the memory chart"))
    return found


def _settings_lines(estimate: Estimate) -> tuple[tuple[str, str], ...]:
    settings = estimate.settings
    memory = settings.memory
    batch = f"{memory.batch_size}"
    if memory.accumulate_gradients:
        batch += f" ({memory.accumulation_steps} micro-batches of {memory.micro_batch})"
    gpus = settings.num_gpus or 1
    several = (f"{gpus}, {settings.parallel} (the batch size is each GPU's)" if gpus > 1 else
               "1 (where one is too small, the fewest that fit are named)")
    return (
        ("Batch size", batch),
        ("GPUs per job", several),
        ("Precision", memory.precision),
        ("Optimizer", memory.optimizer),
        ("Activation checkpointing", "yes" if memory.checkpointing else "no"),
        ("torch.compile", "yes: pointwise ops fused between library kernels" if settings.compiled else "no (eager)"),
        ("Training loop", "reads a value back every step: the host waits for the GPU" if settings.sync_each_step
         else "reads nothing back: the host issues the next step while the GPU runs this one"),
        *((("Sequence length", f"{settings.seq_len:,} tokens"
            + (", padded batches: attention runs masked over every position" if settings.padding_mask else "")
            + (f", packed from documents of {settings.packing:,} tokens: attention runs within each"
               if settings.packing is not None else "")),)
          if settings.seq_len is not None else ()),
        *((("Fine-tuning", estimate.trace.adapted),) if estimate.trace.adapted else ()),
        *((("Assumed", "; ".join(settings.assumptions)),) if settings.assumptions else ()),
        ("Job", settings.job.describe(memory.batch_size * estimate.data_parallel, estimate.model.sample_unit)),
        ("Cloud prices ranked", "spot" if settings.spot else "on demand"),
    )


def _memory_parts(result: DeviceEstimate) -> tuple[tuple[str, str, str], ...]:
    peak = result.memory.peak_bytes or 1
    parts = [(part, f"{result.memory.memory.get(part, 0) / units.GIB:.2f}",
              percent(result.memory.memory.get(part, 0) / peak)) for part in MEMORY_PARTS]
    return (*parts, ("peak", f"{result.memory.peak_bytes / units.GIB:.2f}", "100%"))


def _time_bounds(result: DeviceEstimate) -> tuple[tuple[str, str, str], ...]:
    step = result.step
    total = step.step_s or 1.0
    return tuple((bound, duration(seconds), percent(seconds / total)) for bound, seconds in step.by_bound.items())


def _top_ops(result: DeviceEstimate) -> tuple[tuple[str, ...], ...]:
    return tuple((row["op"], row["phase"], str(row["calls"]), duration(row["seconds"]), percent(row["share"]),
                  row["bound"]) for row in result.step.top_ops(TOP_OPS))


def _table_order(estimate: Estimate) -> list[DeviceEstimate]:
    return estimate.by_time() + [r for r in estimate.results if not r.fits]


def _device_row(rank: int, result: DeviceEstimate, spot: bool) -> DeviceRow:
    memory = f"{result.memory.peak_bytes / units.GIB:.1f} / {result.memory.capacity_bytes / units.GIB:.1f}"
    max_batch = "-" if result.memory.max_batch_size is None else f"{result.memory.max_batch_size:,}"
    gpu = result.target.gpu
    buy = money(gpu.purchase_usd) if gpu is not None and gpu.purchase_usd is not None else "-"
    if not result.fits:
        short = f"{result.memory.missing_bytes / units.GIB:.1f} GiB short"
        return DeviceRow("-", result.id, result.target.name, memory, max_batch, "does not fit", short, "-", "-", "-",
                         "-", "-", buy, result.target.calibration, False, gpus_cell(result))
    offer = result.cheapest(spot)  # the instance's name is in the cloud offers table
    cloud = result.no_offer_reason() if offer is None else f"{offer.provider} {offer.rate(spot):.2f}/h"
    return DeviceRow(str(rank), result.id, result.target.name, memory, max_batch, duration(result.step_time_s),
                     throughput_cell(result.throughput, result.throughput_tokens_per_s),
                     plan_duration(result.time_to_train_s), result.step.bound, cloud,
                     money(result.job_cost_usd()), money(result.spot_saving_cost_usd()), buy,
                     result.target.calibration, True, gpus_cell(result), mfu_cell(result.mfu))


def _offers(estimate: Estimate) -> list[OfferRow]:
    rows = []
    for result in estimate.by_cost():
        for offer in result.cloud:
            rows.append(OfferRow(result.id, offer.provider, instance_label(offer), offer.region,
                                 f"{offer.usd_per_gpu_hour:.2f}",
                                 "-" if offer.spot_usd_per_gpu_hour is None else f"{offer.spot_usd_per_gpu_hour:.2f}",
                                 money(offer.cost_usd), money(offer.spot_cost_usd), offer.price_date, offer.source))
    return rows


def _assumptions(estimate: Estimate) -> list[str]:
    settings = estimate.settings
    memory = settings.memory
    measured = [r.id for r in estimate.results if r.target.calibration == "measured"]
    defaults = sum(1 for r in estimate.results if r.target.calibration == "default")
    lines = [
        f"One training step was traced on fake tensors (no weights, no data) at batch {memory.traced_batch} "
        f"in {memory.precision} with {memory.optimizer}; every op is timed on every device from its peaks and "
        "calibrated efficiency curves (compute-, memory- or overhead-bound).",
        f"The job is {settings.job.describe(memory.batch_size, estimate.model.sample_unit)}.",
        "Cloud cost is the job's hours on the cheapest instances holding exactly its GPUs, whole instances rented "
        "(larger instances are listed at what renting them costs, not used); buying is the cards' price plus electricity "
        "at its board power "
        f"({estimate.electricity_usd_per_kwh:.2f} USD/kWh).",
    ]
    if defaults:
        lines.append(f"{defaults} {'device uses' if defaults == 1 else 'devices use'} the documented default "
                     "calibration of their GPU family (no "
                     "measurement of that GPU): expect larger errors there.")
    if measured:
        lines.append(f"Measured calibration: {', '.join(measured)}.")
    lines += [f"{r.id}: {r.target.note}" for r in estimate.results if r.target.note]
    lines += [line for line in (pipeline_line(estimate), supply_line(estimate)) if line]
    return lines


def accuracy_lines(path: Path | None = None) -> list[str]:
    """The accuracy figures benchmarks/accuracy.py measured last (calibration/accuracy.yaml)."""
    path = path or shipped_dir("calibration", "suite.yaml") / "accuracy.yaml"
    if not path.is_file():
        return [f"No accuracy figures found ({path.name} is missing)."]
    document = yaml.safe_load(path.read_text())
    lines = []
    published, cpu = document.get("published"), document.get("cpu")
    if published:
        lines.append(f"Against {published['rows']} published training runs on single GPUs (vendors' and labs' "
                     f"benchmark pages), the predicted training speed was typically within "
                     f"{percent(published['median_abs_error'], 0)} of what was measured: half of the runs were "
                     f"closer, half further (average {percent(published['mean_abs_error'], 0)}). A simple estimate "
                     f"from the GPU's peak figures alone is off by {percent(published['bare_roofline_median_abs_error'], 0)} "
                     "typically.")
    multi, efficiency = document.get("multi_gpu"), document.get("scaling_efficiency")
    if multi and efficiency:
        lines.append(f"Against {multi['rows']} published runs on 2, 4 and 8 GPUs of one machine, the share of N times "
                     f"one GPU's speed that the job keeps was typically within {percent(efficiency['median_abs_error'], 0)} "
                     f"of what was measured, and the training speed within {percent(multi['median_abs_error'], 0)} "
                     "(most of that is the one-GPU prediction's error).")
    if cpu:
        lines.append(f"On a computer's own processor, measured and then predicted, step times were typically within "
                     f"{percent(cpu['median_abs_error'], 0)} ({cpu['rows']} training steps).")
    lines.append(f"Treat the times and costs above as estimates with that margin; GPUs without a measurement of "
                 f"their own (see the assumptions) may be further off. Checked on {document['date']}.")
    return lines
