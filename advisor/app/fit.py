"""The fit advisor (issue #26): the ways to run a job that does not fit, or to run one faster or cheaper,
each traced and estimated as the same settings run directly would be, never a rule of thumb.

Changes are tried one at a time and then together, the least intrusive first: a smaller micro-batch with
gradient accumulation, activation checkpointing, 8-bit AdamW state, pure bf16 (no fp32 master weights),
then those that change what is trained (LoRA adapters, a 4-bit frozen base: QLoRA). Each candidate is one
traced step (its micro-batch, attention as GPUs run it) estimated on every requested GPU with the same
functions as `advisor estimate`; a plan names the fastest GPU it fits on. Only plans that fit are kept.
The search stops after MAX_PLAN_TRACES traces or once MAX_PLANS plans fit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from advisor.app.request import PlanRequest
from advisor.errors import UserError
from advisor.hardware.specs import HardwareDB

if TYPE_CHECKING:
    from advisor.estimate.plan import DeviceEstimate, Estimate
    from advisor.profile.model_file import ModelFile

MAX_PLAN_TRACES = 8
"""Candidates traced at most: each is one trace of the model (seconds for a 7B model)."""
MAX_PLANS = 4
"""Plans returned at most."""

ADAPTER_RANK = 16
"""The LoRA rank the advisor proposes: a common choice (peft's examples use 8-64)."""

ADAM_FAMILY = ("adam", "adamw", "adam-fused", "adamw-fused")
"""Optimizers whose state the 8-bit AdamW can replace."""


@dataclass(frozen=True)
class FitPlan:
    """One way to run the job: what changes, and the fastest GPU it fits on with its time and money."""

    changes: dict[str, Any]
    """PlanRequest options and their new values."""
    changes_what_is_trained: bool
    """Adapters or a quantized base: a different fine-tune, not the same one run differently."""
    result: DeviceEstimate
    spot: bool = False

    @property
    def flags(self) -> str:
        """The command-line flags that make the change ("--micro-batch 1 --checkpointing")."""
        return " ".join(flag_of(option, value) for option, value in self.changes.items())

    @property
    def cost_usd(self) -> float | None:
        return self.result.job_cost_usd(self.spot)

    def to_dict(self) -> dict[str, Any]:
        result = self.result
        return {"changes": dict(self.changes), "flags": self.flags, "gpu_id": result.id, "num_gpus": result.num_gpus,
                "fits": result.memory.fits, "peak_memory_bytes": result.memory.peak_bytes,
                "step_time_s": result.step.step_s, "time_to_train_s": result.time_to_train_s,
                "throughput_samples_per_s": result.throughput,
                "throughput_tokens_per_s": result.throughput_tokens_per_s, "cost_usd": self.cost_usd,
                "changes_what_is_trained": self.changes_what_is_trained}


def flag_of(option: str, value: Any) -> str:
    """The command-line flag for a PlanRequest option's value."""
    flag = "--" + option.replace("_", "-")
    if value is True:
        return flag
    return f"{flag} {','.join(value) if isinstance(value, tuple) else value}"


def largest_micro_batch(batch_size: int, fits: int | None) -> int:
    """The largest micro-batch that divides `batch_size` (gradient accumulation runs equal ones) and is at most
    `fits` samples (the largest batch the memory line says fits; None or 0: 1)."""
    return max((d for d in range(1, min(batch_size, fits or 1) + 1) if batch_size % d == 0), default=1)


def candidate_changes(request: PlanRequest, precision: str, optimizer: str, batch_size: int,
                      fits: int | None = None) -> Iterator[dict[str, Any]]:
    """Changes to try, the least intrusive first: each alone, then together; adapters last. `fits`: the largest
    batch the request's own memory line says fits on the largest GPU (the micro-batch to try)."""
    steps: list[dict[str, Any]] = []
    micro_batch = largest_micro_batch(batch_size, fits)
    if micro_batch < batch_size and request.micro_batch != micro_batch:
        steps.append({"micro_batch": micro_batch})
    if not request.checkpointing:
        steps.append({"checkpointing": True})
    if optimizer in ADAM_FAMILY:
        steps.append({"optimizer": "adamw8bit"})
    if precision not in ("bf16", "fp16"):
        steps.append({"precision": "bf16"})
    for step in steps:
        yield step
    for end in range(2, len(steps) + 1):
        yield {k: v for step in steps[:end] for k, v in step.items()}
    if request.lora is None:
        light = {k: v for step in steps if "micro_batch" in step or "checkpointing" in step for k, v in step.items()}
        yield {"lora": ADAPTER_RANK}
        yield {"lora": ADAPTER_RANK} | light
        yield {"lora": ADAPTER_RANK, "base_weights": "nf4"} | light
    elif request.base_weights not in ("nf4", "nf4-dq"):
        yield {"base_weights": "nf4"}


def fit_plans(request: PlanRequest, db: HardwareDB, estimate: Estimate, faster_too: bool = False,
              progress: Callable[[str], None] = lambda message: None) -> tuple[FitPlan, ...]:
    """Plans that fit, fastest first: when nothing fits `estimate` (the request's own), the ways to make it
    fit; with `faster_too`, also those faster or cheaper than its best device."""
    from advisor.app.plan import request_model, targets_for

    if estimate.fitting and not faster_too:
        return ()
    model = request_model(request)  # the candidates change how it is trained, not the model or its inputs
    memory = estimate.settings.memory
    targets = [t for t in targets_for(request, db) if t.device.kind == "gpu"]
    bar = _bar(estimate) if estimate.fitting else None
    plans: list[FitPlan] = []
    fits = max((r.memory.max_batch_size or 0 for r in estimate.results), default=0)
    for traced, changes in enumerate(candidate_changes(request, memory.precision, memory.optimizer,
                                                       memory.batch_size, fits)):
        if traced >= MAX_PLAN_TRACES or len(plans) >= MAX_PLANS:
            break
        progress(f"trying {' '.join(flag_of(k, v) for k, v in changes.items())}")
        best = _best_result(dataclasses.replace(request, **changes), model, db, targets)
        if best is None or (bar is not None and not _clearly_better(best, bar, request.spot)):
            continue
        if any(_same(best, plan.result) for plan in plans):
            continue
        plans.append(FitPlan(changes, "lora" in changes or "base_weights" in changes, best, request.spot))
    kept = [plan for plan in plans if not any(_adds_nothing(plan, other) for other in plans if other is not plan)]
    return tuple(sorted(kept, key=lambda p: (p.changes_what_is_trained, p.result.time_to_train_s)))


WORTHWHILE = 0.95
"""A plan that changes more than another must be this much faster (time ratio) or cheaper to be offered."""


def _adds_nothing(plan: FitPlan, other: FitPlan) -> bool:
    """`plan` makes every change `other` makes and more, without being clearly faster or cheaper."""
    superset = set(other.changes.items()) < set(plan.changes.items())
    return superset and not _clearly_better(plan.result, other.result, plan.spot)


def _bar(estimate: Estimate) -> DeviceEstimate | None:
    """The request's fastest fitting device: a plan must beat it in time or in cost."""
    by_time = estimate.by_time()
    return by_time[0] if by_time else None


def _clearly_better(result: DeviceEstimate, than: DeviceEstimate, spot: bool) -> bool:
    """`result` trains WORTHWHILE faster than `than`, or costs WORTHWHILE less (spot prices with `spot`)."""
    cost, other_cost = result.job_cost_usd(spot), than.job_cost_usd(spot)
    cheaper = cost is not None and other_cost is not None and cost < WORTHWHILE * other_cost
    return result.time_to_train_s < WORTHWHILE * than.time_to_train_s or cheaper


def _same(first: DeviceEstimate, second: DeviceEstimate) -> bool:
    """Two plans that end the same (same GPU, same peak and time): the second adds nothing."""
    return first.id == second.id and first.memory.peak_bytes == second.memory.peak_bytes and \
        abs(first.time_to_train_s - second.time_to_train_s) <= 1e-6 * first.time_to_train_s


def _best_result(request: PlanRequest, model: ModelFile, db: HardwareDB, targets: list[Any]) -> DeviceEstimate | None:
    """The request's step of `model` traced once and estimated on `targets`: its fastest fitting result (None
    when it fits none, or when the change does not apply to this model: a UserError from the trace)."""
    from advisor.estimate.packing import packed_trace
    from advisor.estimate.plan import estimate_device
    from advisor.memory.estimate import StepMemory, capped_replay, device_memory
    from advisor.memory.plan import trace_for_memory

    try:
        settings = request.settings(model)
        trace = trace_for_memory(model, settings.memory, settings.memory.traced_batch)
    except UserError:
        return None
    trace = packed_trace(trace, settings.packing, settings.seq_len)  # as the GPUs run it (--packing)
    if (settings.num_gpus or 1) > 1:  # the candidate runs on the request's GPUs, as the request would
        fitting = [r for r in _parallel_results(trace, settings, db, targets) if r.fits]
        return min(fitting, key=lambda r: (r.time_to_train_s, r.id), default=None)
    step, capped = StepMemory.of_trace(trace), capped_replay(trace.memory)
    fitting = []
    for target in targets:
        memory = device_memory(step, target, target.memory_overhead, None, settings.memory.cuda_context_bytes, 0,
                               capped)
        if memory.fits:
            fitting.append(estimate_device(trace, settings, target, memory, db))
    return min(fitting, key=lambda r: (r.time_to_train_s, r.id), default=None)


def _parallel_results(trace: Any, settings: Any, db: HardwareDB, targets: list[Any]) -> list[DeviceEstimate]:
    """`trace` on settings.num_gpus GPUs of each target's type that a machine holds."""
    from advisor.estimate.parallel import LayoutMemory
    from advisor.estimate.plan import estimate_on_gpus, spreads

    layouts = LayoutMemory(trace, None)
    found = [estimate_on_gpus(trace, settings, target, db, layouts) for target in targets if spreads(target)]
    return [result for result in found if not isinstance(result, str)]
