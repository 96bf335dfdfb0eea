"""Accuracy of the peak-memory prediction: predicted against measured, beside the parameter-count
formula (weights + gradients + optimizer state, as `accelerate estimate-memory` and DeepSpeed's
estimators compute it) in the same run.

1. This CPU: real training steps of the examples (and options: amp, checkpointing, gradient
   accumulation). Measured = the peak of live bytes in a steady-state step (the second), from the
   allocation and free events torch's profiler records in the CPU allocator (profile_memory=True),
   counted from before the model is built. Predicted = the fake-tensor trace's peak of live
   storages (`advisor.profile.live_memory`), no allocator rounding (the CPU allocator has none
   worth counting).
2. GPU rows measured on a real GPU, from benchmarks/data/gpu_memory_*.csv when present (issue 8).
3. Published rows of ../shared/validation/published-memory.csv whose model the repository can build:
   Hugging Face's BERT-large runs (V100 16GB, nvidia-smi used after training = CUDA context +
   allocator reserve; that page measured the context itself, 1,343 MB, which is used here). The
   model is transformers' own BertForSequenceClassification with eager attention, built from its
   config (needs the `test` extra). 8-bit Adam (bitsandbytes) rows are skipped: torch has no 8-bit
   optimizer. LoRA, PEFT and unstated-configuration rows are skipped (listed with the reason).

    python benchmarks/memory_accuracy.py            # all parts, a few minutes on 2 cores
    python benchmarks/memory_accuracy.py --part cpu
"""

from __future__ import annotations

import argparse
import csv
import gc
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))

from zoo import cast_model_and_inputs, example  # noqa: E402

from advisor.hardware.loader import load_hwdb  # noqa: E402
from advisor.memory.estimate import StepMemory, capped_replay, device_memory, parameter_formula_bytes
from advisor.profile.trace import (
    call_model,
    checkpoint_blocks,
    default_loss,
    make_optimizer,
    trace_training_step,
)

REPO = Path(__file__).resolve().parents[1]
VALIDATION = REPO.parent / "shared" / "validation" / "published-memory.csv"
MIB = 2**20
WINDOW = "advisor.measured_step"


@dataclass(frozen=True)
class Case:
    label: str
    build_model: Callable[[], torch.nn.Module]
    example_input: Callable[[int], Any]
    loss_fn: Callable[[Any, Any], torch.Tensor] | None
    batch: int
    precision: str = "fp32"
    optimizer: str = "adamw"
    checkpointing: bool = False
    accumulate: bool = False


def cpu_cases() -> list[Case]:
    small_llama = dict(vocab_size=32000, width=512, layers=4, heads=8, kv_heads=4, intermediate=1376, seq_len=256)
    return [
        Case("mlp b64 fp32 adamw", *example("mlp"), 64),
        Case("mlp b64 fp32 sgd, grad accumulation", *example("mlp"), 64, optimizer="sgd", accumulate=True),
        Case("resnet50 b8 fp32 momentum", *example("resnet50"), 8, optimizer="momentum"),
        Case("resnet50 b4 amp-bf16 adamw", *example("resnet50"), 4, precision="amp-bf16"),
        Case("vit_b16 b4 fp32 adamw", *example("vit_b16"), 4),
        Case("bert_base seq128 b4 fp32 adamw", *example("bert_base", seq_len=128), 4),
        Case("gpt2_small seq256 b2 amp-bf16 adamw", *example("gpt2_small", seq_len=256), 2, precision="amp-bf16"),
        Case("gpt2_small seq256 b4 fp32 adamw, checkpointing", *example("gpt2_small", seq_len=256), 4,
             checkpointing=True),
        Case("llama 4x512 seq256 b2 fp32 adamw", *example("llama", **small_llama), 2),
        Case("llama 4x512 seq256 b2 bf16 adam", *example("llama", **small_llama), 2, precision="bf16",
             optimizer="adam"),
    ]


# ----------------------------------------------------------------------------- measuring on this CPU


def measure_cpu_peak(case: Case) -> int:
    """Peak live bytes of the second of two real training steps, from the profiler's allocation events."""
    torch.manual_seed(0)
    loss_fn = case.loss_fn or default_loss
    autocast = case.precision.startswith("amp")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model, inputs = cast_model_and_inputs(case.build_model(), case.example_input(case.batch), case.precision)
        model.train()
        if case.checkpointing:
            checkpoint_blocks(model)
        opt = make_optimizer(case.optimizer, [p for p in model.parameters() if p.requires_grad])
        for step in range(2):
            with record_function(WINDOW if step == 1 else "advisor.warm_up_step"):
                if not case.accumulate:
                    opt.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    loss = loss_fn(call_model(model, inputs), inputs)
                loss.backward()
                opt.step()
                del loss
    return _window_peak(prof)


def _window_peak(prof: profile) -> int:
    events = prof.profiler.kineto_results.events()
    window = next(e for e in events if e.name() == WINDOW)
    start, end = window.start_ns(), window.start_ns() + window.duration_ns()
    memory = sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns())
    live, peak = 0, 0
    for event in memory:
        live += event.nbytes()
        if event.start_ns() > end:
            break
        if event.start_ns() >= start:
            peak = max(peak, live)
        else:
            peak = live  # what is alive when the step starts
    return peak


def predict_cpu_peak(case: Case) -> tuple[int, int]:
    """(predicted peak bytes, parameter-formula bytes)."""
    trace = trace_training_step(case.build_model, case.example_input, case.batch, case.precision, case.optimizer,
                                case.loss_fn, checkpointing=case.checkpointing,
                                accumulate_gradients=case.accumulate)
    return trace.memory.peak().bytes, parameter_formula_bytes(trace.params, case.precision, case.optimizer)


# ----------------------------------------------------------------------------- published rows


HF_VARIANTS = {
    # variant in the row's notes -> (micro-batch, precision, optimizer, checkpointing)
    'variant "vanilla"': (4, "fp32", "adamw", False),
    'variant "grad_accum=4"': (1, "fp32", "adamw", False),
    'variant "grad_accum=4 + grad_ckpt"': (1, "fp32", "adamw", True),
    'variant "fp16"': (4, "amp-fp16", "adamw", False),
    'variant "grad_accum=4 + grad_ckpt + fp16"': (1, "amp-fp16", "adamw", True),
    'variant "adafactor"': (4, "fp32", "adafactor", False),
    'variant "grad_accum=4 + grad_ckpt + fp16 + adafactor"': (1, "amp-fp16", "adafactor", True),
}
HF_CUDA_CONTEXT_MB = 1343  # measured on the same page (MiB, as nvidia-smi reports)


def hf_bert_large() -> tuple[Callable, Callable, Callable] | None:
    try:
        from transformers import BertConfig, BertForSequenceClassification
    except ImportError:
        return None
    config = BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                        num_labels=2, attn_implementation="eager")

    def build_model() -> torch.nn.Module:
        return BertForSequenceClassification(config)

    def example_input(batch: int) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.randint(0, config.vocab_size, (batch, 512)),
                "attention_mask": torch.ones(batch, 512, dtype=torch.long),
                "labels": torch.randint(0, 2, (batch,))}

    return build_model, example_input, lambda output, inputs: output.loss


SKIP_REASONS = {
    "PEFT_README": "batch size, sequence length and precision not stated",
    "LITGPT_RESOURCE_TABLES": "LoRA/adapter fine-tuning: the repository builds no LoRA model",
}


def _why_skipped(row: dict[str, str], variant: str | None, transformers_installed: bool) -> str | None:
    """Why a published row is not predicted, or None when it is."""
    if row["source_id"] in SKIP_REASONS:
        return SKIP_REASONS[row["source_id"]]
    if variant is None:
        if "8-bit" in row["notes"]:
            return "8-bit Adam is bitsandbytes; torch has no 8-bit optimizer"
        return "no model in the repository matches this row"
    if not transformers_installed:
        return "transformers not installed (pip install '.[test]')"
    return None


def published_rows() -> tuple[list[tuple[str, float, float, float]], list[str]]:
    """(label, measured MiB, predicted MiB, formula MiB) per buildable row, and the skipped rows."""
    rows, skipped = [], []
    model = hf_bert_large()
    db = load_hwdb(include_user_layers=False)
    gpu = db.gpu("v100-sxm2-16gb")
    with VALIDATION.open() as handle:
        for row in csv.DictReader(handle):
            variant = next((v for v in HF_VARIANTS if row["notes"].startswith(v + ";")), None)
            why = _why_skipped(row, variant, model is not None)
            if why is not None:
                skipped.append(f"{row['source_id']} {row['model']} {row['precision']} {row['notes'][:40]}: {why}")
                continue
            micro, precision, optimizer, checkpointing = HF_VARIANTS[variant]
            build, inputs, loss = model
            trace = trace_training_step(build, inputs, micro, precision, optimizer, loss, checkpointing=checkpointing,
                                        accumulate_gradients="grad_accum" in variant, attention="cuda")  # as a GPU runs it
            result = device_memory(StepMemory.of_trace(trace), gpu, db.memory_overhead(gpu),
                                   cuda_context_bytes=HF_CUDA_CONTEXT_MB * MIB, capped=capped_replay(trace.memory))
            formula = parameter_formula_bytes(trace.params, precision, optimizer) + HF_CUDA_CONTEXT_MB * MIB
            rows.append((f"BERT-large s512 {variant.split('variant ')[1]} mb{micro}", float(row["value"]),
                         result.peak_bytes / MIB, formula / MIB))
            gc.collect()
    return rows, skipped


def gpu_rows() -> list[tuple[str, float, float, float]]:
    """Rows measured on a real GPU (benchmarks/data/gpu_memory_*.csv, written by issue 8's runs): none yet."""
    assert not list((REPO / "benchmarks" / "data").glob("gpu_memory_*.csv")), "GPU measurements exist: read them"
    return []


# ----------------------------------------------------------------------------- report


def error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def print_table(title: str, rows: list[tuple[str, float, float, float]], unit: str) -> None:
    print(f"\n{title}")
    print(f"{'case':<58} {'measured':>10} {'ours':>10} {'err':>7} {'formula':>10} {'err':>7}   ({unit})")
    for label, measured, ours, formula in rows:
        print(f"{label:<58} {measured:>10.1f} {ours:>10.1f} {error(ours, measured):>+7.1%} "
              f"{formula:>10.1f} {error(formula, measured):>+7.1%}")
    if rows:
        ours_errors = [abs(error(o, m)) for _, m, o, _ in rows]
        formula_errors = [abs(error(f, m)) for _, m, _, f in rows]
        print(f"{'median |error|':<58} {'':>10} {'':>10} {statistics.median(ours_errors):>7.1%} "
              f"{'':>10} {statistics.median(formula_errors):>7.1%}")
        print(f"{'mean |error|':<58} {'':>10} {'':>10} {statistics.mean(ours_errors):>7.1%} "
              f"{'':>10} {statistics.mean(formula_errors):>7.1%}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("cpu", "gpu", "published", "all"), default="all")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if args.part in ("cpu", "all"):
        rows = []
        for case in cpu_cases():
            measured = measure_cpu_peak(case)
            predicted, formula = predict_cpu_peak(case)
            rows.append((case.label, measured / MIB, predicted / MIB, formula / MIB))
            print(f"advisor: ran {case.label}", file=sys.stderr, flush=True)
            gc.collect()
        print_table("1. This CPU: peak live bytes of a real training step vs the trace's prediction", rows, "MiB")
    if args.part in ("gpu", "all"):
        rows = gpu_rows()
        print_table("2. Real GPU runs (max_memory_reserved)", rows, "MiB")
        if not rows:
            print("   none measured yet: benchmarks/data/gpu_memory_*.csv is written on a lent GPU (issue 8)")
    if args.part in ("published", "all"):
        rows, skipped = published_rows()
        print_table("3. Published: nvidia-smi used after training (context + allocator reserve)", rows, "MiB")
        print(f"   skipped {len(skipped)} published rows:")
        for line in skipped:
            print(f"   - {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
