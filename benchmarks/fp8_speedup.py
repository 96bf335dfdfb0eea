"""fp8 against amp-bf16: the speed-up `--precision fp8` predicts beside the speed-ups published for the same
model, GPU and per-GPU shape (issue #28), and the example the issue names (gpt2_small on an H100).

Published ratios (fp8 throughput / bf16 throughput, same source, same configuration otherwise):
- NV_DGXC_BENCH (../shared/validation/published-throughput-newer.csv): NeMo on 8 H100s, Megatron-Core with
  TransformerEngine fp8 (delayed scaling): Llama 3.1 8B pre-training at 8,192 tokens with context parallelism
  2 (4,096 tokens per GPU, micro-batch 1) in two releases; Llama 3 8B SFT and LoRA at 4,096 tokens.
- TORCHAO_FLOAT8: torchao's float8 README (pytorch/ao torchao/float8/README.md), torchtitan Llama3-8B on 8
  H100s and on 8 B200s, batch 1, 8,192 tokens, torch.compile, FSDP2, tensorwise scaling with fp8 all-gather.

Predicted: the same model built from its Hugging Face config, one GPU's micro-batch traced under amp-bf16 and
under fp8, timed on that GPU; the ratio of forward + backward times. The optimizer step is left out of both:
it is the same work in either precision and these runs spread it over 8 GPUs (distributed optimizer, FSDP)
and, for pre-training, over 32 micro-batches of gradient accumulation.

Both publishers run fused kernels around the GEMMs (TransformerEngine's fused LayerNorm/cast kernels, or
torch.compile): the ratios are predicted for the eager Hugging Face model the tool traces, whose
memory-bound elementwise ops do not shrink with fp8, and for the same step compiled (--compile,
estimate/fusion.py), the nearest the tool comes to those fused runs.

    python benchmarks/fp8_speedup.py [--out benchmarks/results/fp8_speedup.txt]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from printed import print_report  # noqa: E402
from zoo import example  # noqa: E402

from advisor.calibration.reference import load_families  # noqa: E402
from advisor.estimate.step import DeviceModel, estimate_records  # noqa: E402
from advisor.estimate.targets import database_targets  # noqa: E402
from advisor.hardware.loader import load_hwdb  # noqa: E402
from advisor.profile.adapters import Adaptation  # noqa: E402
from advisor.profile.hub import build_function, input_function, model_loss, resolve_config  # noqa: E402
from advisor.profile.trace import StepTrace, trace_training_step  # noqa: E402


@dataclass(frozen=True)
class PublishedRatio:
    """One published fp8/bf16 pair and the shape one GPU ran."""

    source: str
    what: str
    model: str
    """hf: spec of the model's config."""
    gpu: str
    seq_len: int
    """Tokens per sequence on one GPU (the published length over the context-parallel degree)."""
    batch: int
    bf16: float
    fp8: float
    lora_rank: int | None = None

    @property
    def measured(self) -> float:
        return self.fp8 / self.bf16


PUBLISHED = (
    PublishedRatio("NV_DGXC_BENCH", "Llama 3.1 8B pretrain, NeMo 24.09, seq 8192 CP2", "hf:meta-llama/Llama-3.1-8B",
                   "h100-sxm", 4096, 1, 81222, 108436),
    PublishedRatio("NV_DGXC_BENCH", "Llama 3.1 8B pretrain, NeMo 25.02, seq 8192 CP2", "hf:meta-llama/Llama-3.1-8B",
                   "h100-sxm", 4096, 1, 85459, 112388),
    PublishedRatio("NV_DGXC_BENCH", "Llama 3 8B SFT, NeMo 24.12, seq 4096", "hf:meta-llama/Meta-Llama-3-8B",
                   "h100-sxm", 4096, 1, 99296, 137970),
    PublishedRatio("NV_DGXC_BENCH", "Llama 3 8B LoRA, NeMo 24.12, seq 4096", "hf:meta-llama/Meta-Llama-3-8B",
                   "h100-sxm", 4096, 1, 142469, 192752, lora_rank=8),
    PublishedRatio("TORCHAO_FLOAT8", "Llama3-8B torchtitan, seq 8192, tensorwise", "hf:meta-llama/Meta-Llama-3-8B",
                   "h100-sxm", 8192, 1, 6150, 7689.5),
    PublishedRatio("TORCHAO_FLOAT8", "Llama3-8B torchtitan, seq 8192, tensorwise", "hf:meta-llama/Meta-Llama-3-8B",
                   "b200", 8192, 1, 8307.5, 10417.0),
)


def trace_hub(spec: str, seq_len: int, batch: int, precision: str, lora_rank: int | None) -> StepTrace:
    """One micro-batch of the hf: model traced for a GPU (LoRA adapters on the attention defaults, base in
    bf16, as the request layer sets them up for --lora under amp-bf16 or fp8)."""
    hub = resolve_config(spec)
    inputs = input_function(hub.config)
    adaptation = Adaptation(lora_rank, (), "bf16") if lora_rank is not None else None
    return trace_training_step(build_function(hub), lambda b: inputs(b, seq_len), batch, precision, "adamw",
                               model_loss, attention="cuda", adaptation=adaptation)


@lru_cache(maxsize=None)
def gpu_device(gpu: str) -> DeviceModel:
    """The database GPU `gpu` as the estimator times it (its family's calibration), loaded once per GPU."""
    db = load_hwdb([])
    return database_targets(db, [db.gpu(gpu)], load_families(db))[0].device


def step_s(trace: StepTrace, gpu: str, optimizer: bool = True, compiled: bool = False) -> float:
    """Seconds of the trace's step on `gpu`; without `optimizer`, of its forward and backward only;
    `compiled`: as torch.compile runs it."""
    records = [r for r in trace.records if optimizer or r.phase != "optimizer"]
    return estimate_records(records, trace.precision, gpu_device(gpu), compiled).step_s


def predicted_ratios(spec: str, seq_len: int, batch: int, gpu: str, lora_rank: int | None = None) -> tuple[float, float]:
    """amp-bf16 time / fp8 time of one micro-batch's forward and backward (fp8 throughput over bf16's), eager
    and compiled."""
    traces = {precision: trace_hub(spec, seq_len, batch, precision, lora_rank) for precision in ("amp-bf16", "fp8")}
    eager, compiled = ({precision: step_s(trace, gpu, optimizer=False, compiled=fused)
                        for precision, trace in traces.items()} for fused in (False, True))
    return eager["amp-bf16"] / eager["fp8"], compiled["amp-bf16"] / compiled["fp8"]


def example_ratio(name: str, gpu: str, batch: int) -> tuple[float, float, float]:
    """(amp-bf16 step, fp8 step, ratio) of a built-in example's whole training step on `gpu`, seconds."""
    build, make_input, loss = example(name)
    steps = {precision: step_s(trace_training_step(build, make_input, batch, precision, "adamw", loss,
                                                   attention="cuda"), gpu)
             for precision in ("amp-bf16", "fp8")}
    return steps["amp-bf16"], steps["fp8"], steps["amp-bf16"] / steps["fp8"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    args = parser.parse_args()
    started = time.perf_counter()
    lines = [f"fp8 / amp-bf16 throughput ratios, {time.strftime('%Y-%m-%d')}, torch {torch.__version__}",
             "published: the source's fp8 over its bf16 throughput; ours: amp-bf16 over fp8 forward+backward time "
             "of one GPU's micro-batch (optimizer step excluded: see the docstring)", "",
             f"{'source':<15} {'run':<48} {'gpu':<9} {'published':>9} {'eager':>6} {'err':>7} {'compiled':>8} "
             f"{'err':>7}"]
    errors: tuple[list[float], list[float]] = ([], [])
    for row in PUBLISHED:
        eager, compiled = predicted_ratios(row.model, row.seq_len, row.batch, row.gpu, row.lora_rank)
        errors[0].append(eager / row.measured - 1)
        errors[1].append(compiled / row.measured - 1)
        lines.append(f"{row.source:<15} {row.what:<48} {row.gpu:<9} {row.measured:>9.3f} {eager:>6.3f} "
                     f"{eager / row.measured - 1:>+7.1%} {compiled:>8.3f} {compiled / row.measured - 1:>+7.1%}")
        print(lines[-1], file=sys.stderr, flush=True)
    lines += ["", f"median (ours / published - 1): eager {statistics.median(errors[0]):+.1%}, compiled "
                  f"{statistics.median(errors[1]):+.1%}; median published speed-up "
                  f"{statistics.median(r.measured for r in PUBLISHED):.3f}"]
    bf16, fp8, ratio = example_ratio("gpt2_small", "h100-sxm", 8)
    lines += ["", f"gpt2_small (batch 8 x 1,024 tokens, whole step) on h100-sxm: amp-bf16 {bf16 * 1e3:.1f} ms, "
                  f"fp8 {fp8 * 1e3:.1f} ms: fp8 {ratio:.3f}x the throughput",
              f"\n({time.perf_counter() - started:.0f} s)"]
    print_report(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
