"""The detail panel of one device: memory as a bar, where the step's time goes, top ops, cloud offers
and what owning it costs."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from advisor.present.format import duration, mfu_cell, money, percent, plan_duration, speed, tight_fit_line
from advisor.present.layout import channels_last_advice
from advisor.present.parallel import alternatives_line, instance_label, parallel_line, scale_out_line
from advisor.present.pipeline import describe_supply
from advisor.estimate.plan import DeviceEstimate, Estimate
from advisor.tui.chart import memory_bar

TOP_OPS = 8


class DeviceDetail(VerticalScroll):
    """Everything about the selected device."""

    def compose(self) -> ComposeResult:
        yield Static("Select a device in the Devices tab (Enter).", id="detail-title")
        yield Static(id="detail-memory")
        yield Static(id="detail-time")
        yield Static(id="detail-parallel")
        yield Static(id="detail-input")
        yield Static("Top ops by time", classes="section")
        yield DataTable(id="detail-ops", cursor_type="none", zebra_stripes=True)
        yield Static("Cloud offers", classes="section")
        yield DataTable(id="detail-offers", cursor_type="none", zebra_stripes=True)
        yield Static(id="detail-owning")

    def on_mount(self) -> None:
        self.query_one("#detail-ops", DataTable).add_columns("op", "phase", "calls", "time", "share", "bound")
        self.query_one("#detail-offers", DataTable).add_columns("provider", "instance", "$/h", "spot $/h",
                                                                "job $", "spot job $")

    def show(self, estimate: Estimate, result: DeviceEstimate) -> None:
        """Fill the panel for `result`."""
        unit = estimate.model.sample_unit
        title = Text(f"{result.id}", style="bold")
        title.append(f"  {result.target.name}  ·  calibration: {result.target.calibration}", style="dim")
        if result.target.note:
            title.append(f"\n{result.target.note}", style="italic")
        self.query_one("#detail-title", Static).update(title)
        self.query_one("#detail-memory", Static).update(memory_bar(result))
        step = result.step
        if result.fits:
            parts = ", ".join(f"{bound} {percent(seconds / step.step_s)}" for bound, seconds in step.by_bound.items())
            mfu = "" if result.mfu is None else f" ({mfu_cell(result.mfu)} MFU)"
            rate = speed(result.throughput, result.throughput_tokens_per_s, unit)
            line = (f"Step {duration(step.step_s)} ({step.bound}-bound: {parts}) · {rate}"
                    f"{mfu} · {result.steps:,} steps: {plan_duration(result.time_to_train_s)}")
        else:
            line = "Does not fit: no time or cost (see the memory bar)."
        self.query_one("#detail-time", Static).update(line)
        several = [text for text in (parallel_line(result), alternatives_line(result), scale_out_line(result)) if text]
        self.query_one("#detail-parallel", Static).update("\n".join(several))
        feeding = "" if result.input_supply is None or not result.fits else \
            f"Input: {describe_supply(result, unit)}"
        advice = channels_last_advice(estimate, result)
        tip = "" if advice is None else f"Tip: channels-last tensors {advice}"
        tight = tight_fit_line([result.id] if result.fits and result.memory.allocator_flushes else [])
        self.query_one("#detail-input", Static).update("\n".join(text for text in (feeding, tip, tight) if text))
        ops = self.query_one("#detail-ops", DataTable)
        ops.clear()
        for row in step.top_ops(TOP_OPS) if result.fits else []:
            ops.add_row(row["op"], row["phase"], str(row["calls"]), duration(row["seconds"]), percent(row["share"]),
                        row["bound"])
        offers = self.query_one("#detail-offers", DataTable)
        offers.clear()
        for offer in result.cloud:  # the hourly rate of all instances rented
            spot = offer.rate(spot=True)
            offers.add_row(offer.provider, instance_label(offer), f"{offer.rate():.2f}",
                           "-" if spot is None else f"{spot:.2f}",
                           money(offer.cost_usd) if result.fits else "-",
                           money(offer.spot_cost_usd) if result.fits else "-")
        self.query_one("#detail-owning", Static).update(_owning_line(result))


def _owning_line(result: DeviceEstimate) -> str:
    owning = result.owning
    if owning is None:
        return "Buying: no purchase price in the database."
    cards = f" for {result.num_gpus} cards" if result.num_gpus > 1 else ""
    line = f"Buying: {money(owning.purchase_usd)} USD{cards}"
    if owning.electricity_usd is not None and result.fits:
        line += f" + {money(owning.electricity_usd)} USD electricity for the job"
    if owning.break_even_hours is not None:
        line += f"; pays off against renting after {owning.break_even_hours:,.0f} h of training"
    return line
