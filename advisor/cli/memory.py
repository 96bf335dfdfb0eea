"""`advisor memory MODEL.py`: peak training memory on every GPU, its breakdown, whether it fits and
the largest batch that does."""

from __future__ import annotations

import argparse
import json

from typing import TYPE_CHECKING

from advisor import units
from advisor.app.plan import plan_memory_only
from advisor.cli.arguments import add_memory_arguments, add_model_arguments, examples, progress, request_from_arguments
from advisor.present.format import describe_params, fits_nowhere_message, tight_fit_line
from advisor.cli.table import Column, render_table
from advisor.errors import UserError
from advisor.hardware.specs import HardwareDB
from advisor.process import user_output_to_stderr
from advisor.profile.choices import describe_optimizer
from advisor.profile.coverage import trace_notes

if TYPE_CHECKING:
    from advisor.memory.estimate import DeviceMemory
    from advisor.memory.plan import MemoryPlan


def add_parser(subparsers: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "memory",
        parents=parents,
        help="peak training memory on every GPU, its breakdown and the largest batch that fits",
        **examples(("advisor memory my_model.py --batch-size 32", "peak memory on every GPU"),
                   ("advisor memory llama --precision bf16 --gpu h100-sxm", "pure bf16 on one GPU"),
                   ("advisor memory llama --precision amp-bf16 --num-gpus 8 --gpu a100-sxm4-80gb",
                    "each GPU's memory on 8 GPUs, DDP, ZeRO-1/2 and FSDP"),
                   ("advisor memory llama --batch-size 8 --micro-batch 1 --checkpointing",
                    "gradient accumulation and checkpointing")),
        description="Trace MODEL's training step on fake tensors, follow every tensor's life, replay "
                    "PyTorch's CUDA caching allocator and add each GPU's CUDA context and cuBLAS workspace.",
    )
    add_model_arguments(parser)
    add_memory_arguments(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, db: HardwareDB) -> int:
    request = request_from_arguments(args)
    with user_output_to_stderr():
        plan = plan_memory_only(request, db, progress)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(render_memory(plan, db))
    if plan.sharded:
        if not any(result.memory.fits for result in plan.sharded):
            raise UserError(f"{plan.model_name} fits none of the GPUs asked for on {plan.sharded[0].num_gpus} of "
                            "them with any strategy asked for; more GPUs (--num-gpus), --checkpointing, "
                            "--micro-batch or a smaller --batch-size reduce each GPU's share")
        return 0
    if not any(result.fits for result in plan.results):
        raise UserError(fits_nowhere_message(plan.model_name, plan.settings, plan.results, "memory"))
    return 0


def gib(nbytes: float) -> str:
    return f"{nbytes / units.GIB:.2f}"


def render_memory(plan: MemoryPlan, db: HardwareDB) -> str:
    settings, step = plan.settings, plan.step
    batch = f"batch {settings.batch_size}"
    if settings.accumulate_gradients:
        batch += f" as {settings.accumulation_steps} micro-batches of {settings.micro_batch} (gradient accumulation)"
    options = f", activation checkpointing of {len(plan.checkpointed)} blocks" if settings.checkpointing else ""
    if plan.trace is not None and plan.trace.adapted:
        options += f", {plan.trace.adapted}"
    parts = ", ".join(f"{key} {gib(value)}" for key, value in step.by_category.items() if value)
    per_forward = "micro-batch" if settings.accumulate_gradients else "batch"
    lines = [
        f"Model: {plan.model_name}, "
        f"{describe_params(plan.trace) if plan.trace else f'{plan.params:,} trainable parameters'}; {batch}, "
        f"{settings.precision}, "
        f"{describe_optimizer(settings.optimizer, plan.trace.optimizer_class if plan.trace else '')}{options}"
        f"{'; ' + plan.trace.replication() if plan.trace is not None and plan.trace.replicated_blocks else ''}",
        f"Tensors at the peak ({step.peak_phase}): {gib(step.tensor_peak)} GiB = {parts}; "
        f"caching allocator reserve {gib(step.reserved)} GiB (max_memory_reserved, before the cuBLAS workspace)",
        f"Parameter-count formula (weights+grads+optimizer, no activations): {gib(plan.parameter_formula_bytes)} GiB",
        "Per GPU: peak = CUDA context + cuBLAS workspace + the allocator's reserve (hwdb/memory-overhead.yaml); "
        f"GiB = 2^30 bytes; Max batch: the largest {per_forward} that fits",
        "",
        _table(plan, db),
    ]
    if plan.sharded:
        count = plan.sharded[0].num_gpus
        tensor = any(s.strategy.endswith("tp") for s in plan.sharded)
        holder = "tensor-parallel group" if tensor else "GPU"
        split = ("; tp: each layer split over a tensor-parallel group (weights, their state and the activations "
                 "inside attention and MLP)" if tensor else "")
        lines += ["", f"Each GPU of {count} running the job (batch {settings.batch_size} per {holder}): ddp replicates "
                      "everything; zero1 shards the optimizer state, zero2 also the gradients, fsdp also the weights "
                      f"(hsdp: fsdp within a node){split}; NCCL's buffers are in the overhead", "",
                  _sharded_table(plan, db)]
        lines += [f"{gpu_id}: {why}" for gpu_id, why in plan.unsharded]
    tight = [r.gpu_id for r in plan.results if r.fits and r.allocator_flushes]
    tight += [f"{s.gpu_id} ({s.num_gpus} GPUs, {s.strategy})" for s in plan.sharded
              if s.memory.fits and s.memory.allocator_flushes]
    if tight:
        lines += ["", tight_fit_line(tight)]
    if plan.trace is not None:
        lines.extend(trace_notes(plan.trace))
    return "\n".join(lines)


MEMORY_COLUMNS = (Column("Mem GiB", True), Column("Peak GiB", True), Column("Fits"), Column("Weights", True),
                  Column("Grads", True), Column("Optim", True), Column("Activ", True), Column("Overhead", True),
                  Column("Max batch", True))
"""The columns of one GPU's memory, after those that say which GPU and how it is shared."""


def _memory_cells(result: DeviceMemory) -> list[str]:
    """One GPU's memory as MEMORY_COLUMNS' cells."""
    fits = "yes" if result.fits else f"no, {gib(result.missing_bytes)} short"
    memory = result.memory
    return [gib(result.capacity_bytes), gib(result.peak_bytes), fits, gib(memory["weights"]),
            gib(memory["gradients"]), gib(memory["optimizer"]), gib(memory["activations"]), gib(memory["overhead"]),
            "-" if result.max_batch_size is None else f"{result.max_batch_size:,}"]


def _table(plan: MemoryPlan, db: HardwareDB) -> str:
    rows = [[result.gpu_id, db.gpu(result.gpu_id).name, *_memory_cells(result)]
            for result in sorted(plan.results, key=lambda r: (r.capacity_bytes, r.gpu_id))]
    return render_table([Column("ID"), Column("Name"), *MEMORY_COLUMNS], rows)


def _sharded_table(plan: MemoryPlan, db: HardwareDB) -> str:
    """Each GPU's memory per strategy (advisor memory --num-gpus)."""
    rows = []
    for sharded in sorted(plan.sharded, key=lambda r: (db.gpu(r.gpu_id).memory_bytes, r.gpu_id)):
        gpus = f"{sharded.num_gpus}" + (f" ({sharded.nodes} nodes)" if sharded.nodes > 1 else "")
        rows.append([sharded.gpu_id, gpus, sharded.strategy, *_memory_cells(sharded.memory)])
    return render_table([Column("ID"), Column("GPUs", True), Column("Strategy"), *MEMORY_COLUMNS], rows)
