"""The fit advisor's plans (app/fit.py) as lines, the same in every interface."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from advisor.present.format import gib, money, plan_duration, speed

if TYPE_CHECKING:
    from advisor.app.fit import FitPlan
    from advisor.estimate.plan import Estimate

SEARCHED = "micro-batching, checkpointing, 8-bit AdamW, pure bf16 and LoRA"
"""What the advisor tries, for the line that says it found nothing."""


def plans_title(estimate: Estimate) -> str:
    """"Ways to make it fit" when nothing fits, else "Cheaper or faster"."""
    return "Cheaper or faster" if estimate.fitting else "Ways to make it fit"


def plan_line(estimate: Estimate, plan: FitPlan) -> str:
    """"--micro-batch 1 --checkpointing: a10g, 19.9 GiB of 24.0, 913 tokens/s, 3.0 h, 3.06 USD"."""
    return f"{plan.flags}: {plan_outcome(estimate, plan)}"


def plan_outcome(estimate: Estimate, plan: FitPlan) -> str:
    """"a10g, 19.9 GiB of 24.0, 913 tokens/s, 3.0 h, 3.06 USD": where the plan fits and what it gives (with
    several GPUs "h100-sxm x 8 (fsdp), 56.1 GiB of 80.0" per GPU, throughput and cost the whole job's)."""
    result = plan.result
    cost = plan.cost_usd
    money_part = f", {money(cost)} USD{' spot' if plan.spot else ''}" if cost is not None else ""
    trained = " [changes what is trained]" if plan.changes_what_is_trained else ""
    several = "" if result.scaling is None else f" x {result.num_gpus} ({result.scaling.layout.name})"
    return (f"{result.id}{several}, {gib(result.memory.peak_bytes)} GiB of {gib(result.memory.capacity_bytes)}, "
            f"{speed(result.throughput, result.throughput_tokens_per_s, estimate.model.sample_unit)}, "
            f"{plan_duration(result.time_to_train_s)}{money_part}{trained}")


def plan_lines(estimate: Estimate, plans: Sequence[FitPlan]) -> list[str]:
    """The section: a title line, then one numbered line per plan (or one that says none was found)."""
    title = plans_title(estimate)
    if not plans:
        return [f"{title}: none found among {SEARCHED}"]
    return [f"{title} (each traced and estimated; the fastest GPU it fits on):"] + [
        f"{number}. {plan_line(estimate, plan)}" for number, plan in enumerate(plans, 1)]
