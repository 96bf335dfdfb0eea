"""Peak memory of published fine-tuning runs (issue #26), each built as its source ran it through `hf:`
configs and the LoRA / base-weights flags, beside the parameter-count formula in the same run.

Rows: ../shared/validation/published-memory.csv, sources LITGPT_RESOURCE_TABLES (LoRA, one GPU) and
PEFT_README (full fine-tuning and LoRA without DeepSpeed offload). Skipped, with the reason printed:
LLaMA-Adapter rows (not LoRA: not expressible), multi-GPU (FSDP) rows, DeepSpeed CPU-offload rows, OOM.

How each source ran (decisions, from the sources' scripts; SOURCES.md says what is not stated):
- LitGPT (lit-gpt 8641822, Oct 2023, `finetune/lora.py`): bf16-true (pure bf16, adapters too), LoRA r=8 on the
  query and value projections, AdamW, micro-batch 1/2/4 of a 128 batch. Measured: the largest Alpaca sample
  (the peak happens there): 1,304 tokens with Llama 2's SentencePiece tokenizer, 1,044 with the GPT-NeoX/CodeGen
  BPE of StableLM and phi-1.5 (SOURCES.md: 1,044-1,304, model-dependent; which is which is our reading).
  Metric: torch.cuda.max_memory_allocated() / 1e9, compared with the trace's allocated peak (allocator-rounded,
  no CUDA context). `nf4-dq` rows use --base-weights nf4-dq.
- PEFT README (examples `peft_lora_seq2seq_accelerate_ds_zero3_offload.py`, `peft_lora_clm_...`): fp32, batch 8,
  inputs padded to max_length 64 (twitter_complaints); the seq2seq models' targets are the class names, 3 tokens
  ("no complaint</s>"); LoRA r=8 on peft's default targets. The README (Feb 2023) predates torch 2.0, whose
  AdamW took the foreach form on CUDA: torch 1.13's per-parameter AdamW made no full-size temporaries, so it is
  traced as `adamw-fused` (the same state, no list-wide temporaries). The README does not state its method; its
  scripts' TorchTracemalloc reads max_memory_allocated: compared the same way, GB = 1e9 bytes.
- LoRA dropout (`--lora-dropout`, 2026-11-28): the PEFT examples' 0.1; LitGPT's 0.05 is not expressible as it
  ran it (LITGPT_LORA_DROPOUT).

    python benchmarks/finetune_memory.py        # ~2 minutes on 2 cores
"""

from __future__ import annotations

import csv
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import dataclasses

import torch

from advisor.app.plan import request_gpus, request_model
from advisor.app.request import PlanRequest
from advisor.hardware.loader import load_hwdb
from advisor.memory.plan import MemoryPlan, plan_memory

REPO = Path(__file__).resolve().parents[1]
VALIDATION = REPO.parent / "shared" / "validation" / "published-memory.csv"
GB = 1e9

MODELS = {
    "phi-1.5 (1.3B)": ("hf:microsoft/phi-1_5", 1044, ("q_proj", "v_proj")),
    "StableLM Alpha 3B": ("hf:stabilityai/stablelm-base-alpha-3b", 1044, ("query_key_value",)),
    "Llama 2 7B": ("hf:meta-llama/Llama-2-7b-hf", 1304, ("q_proj", "v_proj")),
    "Llama 2 13B": ("hf:meta-llama/Llama-2-13b-hf", 1304, ("q_proj", "v_proj")),
    "bigscience/T0_3B (3B)": ("hf:bigscience/T0_3B", 64, ()),
    "bigscience/mt0-xxl (12B)": ("hf:bigscience/mt0-xxl", 64, ()),
    "bigscience/bloomz-7b1 (7B)": ("hf:bigscience/bloomz-7b1", 64, ()),
}
"""Published model name -> (our model, sequence length, LoRA targets; () for peft's defaults)."""

GPU = {"A100-SXM4-40GB": "a100-sxm4-40gb", "A100-80GB (form factor not stated)": "a100-sxm4-80gb"}


@dataclass(frozen=True)
class Row:
    source: str
    model: str
    gpu: str
    precision: str
    micro_batch: int
    published_gb: float
    notes: str


def rows() -> tuple[list[Row], list[str]]:
    """The rows this benchmark can build, and a reason for each it cannot."""
    kept, skipped = [], []
    with VALIDATION.open() as handle:
        for raw in csv.DictReader(handle):
            if raw["source_id"] not in ("LITGPT_RESOURCE_TABLES", "PEFT_README"):
                continue
            label = f"{raw['source_id']} {raw['model']} {raw['precision']} b{raw['batch_size_per_gpu']}: "
            notes = raw["notes"]
            if raw["value"] == "OOM":
                skipped.append(label + "published as OOM")
            elif raw["num_gpus"] != "1":
                skipped.append(label + f"{raw['num_gpus']} GPUs (FSDP): multi-GPU is issue #25")
            elif "Adapter" in notes:
                skipped.append(label + "LLaMA-Adapter, not LoRA")
            elif "DeepSpeed" in notes:
                skipped.append(label + "DeepSpeed ZeRO-3 CPU offload")
            else:
                batch = int(raw["batch_size_per_gpu"]) if raw["batch_size_per_gpu"].isdigit() else 8
                kept.append(Row(raw["source_id"], raw["model"], raw["gpu"], raw["precision"], batch,
                                float(raw["value"]), notes))
    return kept, skipped


def request_for(row: Row) -> PlanRequest:
    model, seq_len, targets = MODELS[row.model]
    lora = "LoRA" in row.notes
    if row.source == "LITGPT_RESOURCE_TABLES":
        base = "nf4-dq" if "nf4-dq" in row.precision else "nf4" if "nf4" in row.precision else None
        return PlanRequest(model=model, batch_size=128, micro_batch=row.micro_batch, precision="bf16",
                           optimizer="adamw", seq_len=seq_len, lora=8, lora_targets=targets, base_weights=base,
                           gpus=(GPU[row.gpu],), trace_timeout_s=0)  # no --lora-dropout: LITGPT_LORA_DROPOUT
    return PlanRequest(model=model, batch_size=row.micro_batch, precision="fp32", optimizer="adamw-fused",
                       seq_len=seq_len, lora=8 if lora else None, lora_targets=targets, gpus=(GPU[row.gpu],),
                       trace_timeout_s=0, lora_dropout=PEFT_EXAMPLES_LORA_DROPOUT if lora else None)


LITGPT_LORA_DROPOUT = 0.05
"""lit-gpt's finetune/lora.py `lora_dropout = 0.05`, not given to its rows: its one dropout per layer sits on
its fused QKV layer's input, where the hf: model's separate q_proj and v_proj would drop it twice (two masks
and dropped inputs where lit-gpt keeps one); 0 keeps one too few, 0.05 one too many, and measured both ways
(2026-11-28) LitGPT's rows went 17.9% -> 19.7% with it (Llama 2 closer, phi-1.5 further over): left at 0."""
PEFT_EXAMPLES_LORA_DROPOUT = 0.1
"""The PEFT README's example scripts' LoraConfig(r=8, lora_alpha=32, lora_dropout=0.1)."""


TARGET_TOKENS = 3
"""Target length of the PEFT seq2seq rows: the class names of twitter_complaints ("no complaint</s>")."""


def planned(request: PlanRequest, db) -> MemoryPlan:
    """The request's memory plan; seq2seq models (T0, mT0) with TARGET_TOKENS-long targets."""
    model = request_model(request)
    if "t0" in (request.model or "").lower():
        inputs = model.example_input

        def example_input(batch_size: int) -> dict[str, torch.Tensor]:
            made = inputs(batch_size)
            return made | {"labels": made["labels"][:, :TARGET_TOKENS].contiguous()}
        model = dataclasses.replace(model, example_input=example_input)
    return plan_memory(model, db, request_gpus(request, db), request.memory_settings(model))


def main() -> int:
    db = load_hwdb()
    kept, skipped = rows()
    ours, formula = [], []
    print(f"{'row':74} {'published':>9} {'ours':>7} {'err':>7} {'formula':>8} {'err':>7}")
    started = time.perf_counter()
    for row in kept:
        request = request_for(row)
        plan = planned(request, db)
        predicted = plan.step.allocated / GB
        baseline = plan.parameter_formula_bytes / GB
        ours.append(predicted / row.published_gb - 1)
        formula.append(baseline / row.published_gb - 1)
        flags = f"lora={request.lora} base={request.base_weights} {request.precision} mb{row.micro_batch}"
        label = f"{row.source[:6]} {row.model[:24]:24} {flags}"
        print(f"{label:74} {row.published_gb:9.2f} {predicted:7.2f} {ours[-1]:+7.1%} {baseline:8.2f} {formula[-1]:+7.1%}",
              flush=True)
    print(f"\n{len(kept)} rows in {time.perf_counter() - started:.0f} s; median |error|: ours "
          f"{statistics.median(abs(e) for e in ours):.1%}, parameter-count formula "
          f"{statistics.median(abs(e) for e in formula):.1%}")
    by_source = {}
    for row, error in zip(kept, ours):
        by_source.setdefault(row.source, []).append(abs(error))
    for source, errors in by_source.items():
        print(f"  {source}: {len(errors)} rows, median |error| {statistics.median(errors):.1%}, worst {max(errors):.1%}")
    print("\nskipped:")
    for reason in skipped:
        print(f"  {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
