"""benchmarks/newer_rows.py and the per-family figures of benchmarks/accuracy.py (issue #28): the batch
search, the reading of a row's layout and settings, the published metrics and the family bar. No GPU, no
trace."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import newer_rows  # noqa: E402
from newer_rows import (  # noqa: E402
    PlanRun,
    VisionRun,
    family_name,
    largest_fitting_batch,
    note_int,
    run_of,
)



def test_batch_search_takes_the_largest_that_fits_going_down_by_32() -> None:
    # A card of 20,000 MB and 100 MB per image: 256 x 100 = 25,600 and 224 x 100 = 22,400 do not fit,
    # 192 x 100 = 19,200 does; the search stops there (160 and below are never asked).
    asked = []

    def fits(batch: int) -> bool:
        asked.append(batch)
        return batch * 100 <= 20_000
    assert largest_fitting_batch(fits) == 192
    assert asked == [256, 224, 192]


def test_batch_search_gives_none_when_not_even_32_fits() -> None:
    # 256, 224, 192, 160, 128, 96, 64, 32: eight tries, none fits.
    asked = []

    def fits(batch: int) -> bool:
        asked.append(batch)
        return False
    assert largest_fitting_batch(fits) is None
    assert asked == [256, 224, 192, 160, 128, 96, 64, 32]


def test_family_names() -> None:
    assert [family_name(a) for a in ("pascal", "ampere", "ada", "blackwell", "cdna3")] == \
        ["Pascal", "Ampere", "Ada", "Blackwell", "CDNA3"]


def test_notes_keys_do_not_match_inside_longer_ones() -> None:
    notes = "GBS=128; MBS=2; FSDP=8; TP=1 PP=1 CP=1 EP=1; GA=8; 'Batch Size'=512 (global)"
    assert (note_int(notes, "MBS"), note_int(notes, "GBS"), note_int(notes, "FSDP")) == (2, 128, 8)
    assert note_int(notes, "DP") is None  # not FSDP's 8
    assert note_int(notes, "'Batch Size'") == 512


def row(**changes: str) -> dict[str, str]:
    base = {"source_id": "ULT_GPU_TEST", "model": "Llama 3.1 8B (LoRA fine-tune)", "framework": "PyTorch",
            "gpu": "H100-80GB (form factor not stated)", "num_gpus": "1", "precision": "BF16 (model dtype)",
            "batch_size_per_gpu": "2", "seq_len_or_image_size": "seq8192", "metric": "train_step_time_ms_median",
            "value": "6400", "notes": "grad accumulation 32, LoRA r=8"}
    return base | changes


def test_a_lora_row_is_built_as_its_source_ran_it() -> None:
    run = run_of(row())
    assert isinstance(run, PlanRun)
    assert run == PlanRun(run.model, "bf16", "adamw", 2, None, 8192, True, 8, ("all-linear",),
                          assumption="one micro-batch per step", lora_dropout=0.05, padding_mask=True)
    assert run_of(row(), gpu_known=False) == "GPU not in hwdb"


def test_universal_llm_trainers_rows_carry_its_padding_mask() -> None:
    # its GPU test keeps the loaded sample's mask over random ids: the hf: model with --padding-mask
    run = run_of(row())
    assert isinstance(run, PlanRun) and run.model == "hf:meta-llama/Llama-3.1-8B" and run.padding_mask
    assert run.request("h100-sxm").padding_mask


def test_model_parallel_layouts_are_skipped_with_their_reason() -> None:
    megatron = dict(source_id="NV_NEMO_PERF_2407", num_gpus="8", precision="BF16", model="Llama 2 7B (SFT)")
    assert run_of(row(**megatron, notes="GBS=32; MBS=1; TP=2 PP=4")) == "pipeline parallelism (PP > 1)"
    assert run_of(row(**megatron, notes="GBS=32; MBS=1; TP=1 PP=1 CP=2")) == "context parallelism (CP > 1)"
    # 1 x 1 x 2 x 1 = 2 GPUs of layout for a row on 8 GPUs
    assert run_of(row(**megatron, notes="TP=1 PP=1 DP=2 CP=1")).startswith("layout inconsistent")
    # data parallel: GBS 32 over 8 GPUs is 4 sequences per GPU, in micro-batches of 1 (4 accumulated)
    run = run_of(row(**megatron, notes="GBS=32; MBS=1; TP=1 PP=1"))
    assert isinstance(run, PlanRun)
    assert (run.batch, run.micro_batch, run.accumulation, run.gpus, run.strategy, run.precision) == \
        (4, 1, 4, 8, "zero1", "bf16-master")  # Megatron's bf16: fp32 masters in its optimizer
    assert run.packing == newer_rows.SQUAD_DOCUMENT_TOKENS  # NeMo's SFT packs SQuAD's examples
    assert run.request("h100-sxm").packing == run.packing
    # tensor parallel in groups of 2: 8 / 2 = 4 data-parallel groups take 32 / 4 = 8 sequences each
    run = run_of(row(**megatron, notes="GBS=32; MBS=1; TP=2 PP=1"))
    assert isinstance(run, PlanRun) and (run.batch, run.tp, run.request("h100-sxm").tp) == (8, 2, 2)


def test_fp8_rows_wait_for_the_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    fp8 = row(source_id="NV_MBRIDGE_PERF", model="Llama 3 8B (pretrain)", num_gpus="8", precision="FP8-MX",
              notes="GBS=128; MBS=2; FSDP=0; TP=1 PP=1 CP=1 EP=1; GA=8")
    monkeypatch.setattr(newer_rows, "PRECISIONS", ("fp32", "bf16"))
    assert run_of(fp8) == "fp8 not known"
    monkeypatch.setattr(newer_rows, "PRECISIONS", ("fp32", "bf16", "fp8", "fp8-master"))
    run = run_of(fp8)  # Megatron's fp8: bf16 weights with fp32 masters
    assert isinstance(run, PlanRun) and (run.precision, run.batch, run.micro_batch) == ("fp8-master", 16, 2)
    assert run.packing is None  # pre-training: whole sequences


def test_automodel_rows_run_their_fused_kernels_as_compiled() -> None:
    automodel = dict(source_id="NV_AUTOMODEL_PERF", model="Llama 3 8B (LoRA fine-tune)", precision="BF16",
                     seq_len_or_image_size="seq4096", notes="GBS=32; MBS=2; GA=16; TP=1 PP=1 CP=1 FSDP=1; "
                     "kernels=TE + triton; linked config loads meta-llama/Llama-3.1-8B")
    run = run_of(row(**automodel))
    # GBS 32 on one GPU in micro-batches of 2; LoRA dim 16 on every projection; TE's kernels as --compile
    assert isinstance(run, PlanRun) and (run.batch, run.micro_batch, run.lora, run.compiled) == (32, 2, 16, True)
    assert run.assumption == newer_rows.AUTOMODEL_FUSION
    plain = run_of(row(**(automodel | {"notes": "GBS=32; MBS=2; GA=16; TP=1 PP=1 CP=1 FSDP=1"})))
    assert isinstance(plain, PlanRun) and not plain.compiled and plain.packing is None


def test_trainer_rows_whose_runtime_spans_an_evaluation_are_skipped() -> None:
    hf = row(source_id="NV_DGXC_BENCH", model="Mistral 7B (LoRA SFT, HF TRL/accelerate FSDP)", num_gpus="8",
             framework="PyTorch (NGC pytorch:24.02-py3) + transformers 4.40.0 + accelerate 0.29.0",
             notes="per_device_train_batch_size=16; grad accum=4; gradient checkpointing")
    assert run_of(hf) == newer_rows.TRAINER_RUNTIME_SPANS_EVALUATION


def test_timm_benchmark_rows() -> None:
    nikolas = dict(source_id="NIKOLASENT_2025", model="efficientvit_m4", gpu="RTX 5090", precision="FP16",
                   batch_size_per_gpu="", seq_len_or_image_size="224x224", metric="train_samples_per_s")
    assert run_of(row(**nikolas)) == VisionRun("efficientvit_m4", "fp16", None)  # batch searched
    assert run_of(row(**(nikolas | {"batch_size_per_gpu": "96", "precision": "FP32"}))) == \
        VisionRun("efficientvit_m4", "fp32", 96)


def test_torchtune_multi_gpu_rows_are_one_gpus_throughput() -> None:
    # torchtune's README logged rank zero's tokens/s (renamed tokens_per_second_per_gpu two days later)
    tune = dict(source_id="TORCHTUNE_README", model="Llama 2 7B (LoRA)", gpu="RTX 4090", precision="BF16",
                batch_size_per_gpu="4", seq_len_or_image_size="seq2048", metric="train_tokens_per_s", notes="")
    one, two = run_of(row(**tune, num_gpus="1")), run_of(row(**tune, num_gpus="2"))
    assert isinstance(one, PlanRun) and isinstance(two, PlanRun)
    assert (one.per_gpu, two.per_gpu, two.gpus, two.strategy) == (False, True, 2, "fsdp")


def test_published_metrics() -> None:
    from accuracy import published_metric

    # 8 GPUs x 16 = 128 sequences of 4,096 tokens in 2 s: 524,288 tokens / 2 s = 262,144 tokens/s over all
    # GPUs, / 8 = 32,768 per GPU, 128 / 2 = 64 sequences/s; 1e15 FLOPs per GPU in 2 s = 500 TFLOP/s per GPU.
    def measure(metric: str) -> float:
        return published_metric(metric, 2.0, samples=128, tokens=4096, gpus=8, flops=1e15)
    assert measure("train_tokens_per_s") == 262_144
    assert measure("train_tokens_per_s_per_gpu") == 32_768
    assert measure("train_sequences_per_s") == 64
    assert measure("train_tflops_per_gpu") == 500
    assert measure("train_step_time_ms_median") == 2000


def test_family_bar_and_order() -> None:
    from accuracy import Row, family_figures, family_table

    def rows(family: str, errors: list[float]) -> list[Row]:
        return [Row(f"{family} {i}", "m", "gpu", 100.0, 100.0 * (1 + e), 200.0, "samples/s", family)
                for i, e in enumerate(errors)]
    # Hopper: |errors| 0.05, 0.10, 0.12, 0.20, 0.30 -> median 0.12 <= 0.15: met (bare: all +100%);
    # Ampere: median of 0.2, 0.2, 0.3, 0.1, 0.25 is 0.2: not met; Ada: 2 rows, not judged.
    figures = family_figures(rows("Hopper", [0.05, -0.10, 0.12, 0.20, -0.30]) + rows("Ada", [0.0, 0.5])
                             + rows("Ampere", [0.2, -0.2, 0.3, 0.1, 0.25]))
    assert list(figures) == ["Ampere", "Ada", "Hopper"]  # oldest family first
    assert figures["Hopper"] == {"rows": 5, "median_abs_error": 0.12, "bare_roofline_median_abs_error": 1.0,
                                 "bar": "met"}
    assert figures["Ampere"]["bar"] == "not met"
    assert figures["Ada"]["bar"].startswith("not judged")
    lines = family_table(rows("Volta", [0.1] * 5), "by family")
    assert lines[1].strip().startswith("Volta") and lines[1].endswith("bar: met")
