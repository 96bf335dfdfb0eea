"""torch.compile against eager: the training speed-up `--compile` predicts on an A100, beside the speed-ups
PyTorch published when it introduced torch.compile (issue #28).

Published (TORCH2_LAUNCH: pytorch.org/get-started/pytorch-2.0, "Across these 163 open-source models ...
the model runs 43% faster in training on an NVIDIA A100 GPU. At Float32 precision, it runs 21% faster on
average and at AMP Precision it runs 51% faster on average"): geometric means over Hugging Face, TIMM and
TorchBench models, default Inductor mode, one A100, each suite's default batch. A geomean over other models
is what can be compared: ours runs over the vision and language models the tool builds without downloads
(the zoo's, the built-in examples, Hugging Face configs), at batches such suites use.

Also printed: nanoGPT (karpathy/nanoGPT README, Dec 2022): GPT-2 124M training "from ~250ms / iter to 135ms /
iter" on A100s (1.85x); its eager model then computed attention with a materialised causal softmax, which
our gpt2_small example (SDPA, flash attention) does not: an upper reference, not a row to meet.

Predicted: each model traced once per precision, its whole training step (AdamW) timed on the a100-sxm4-80gb
eager and with --compile (estimate/fusion.py); the speed-up is eager time / compiled time.

    python benchmarks/compile_speedup.py [--out benchmarks/results/compile_speedup.txt]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fp8_speedup import gpu_device  # noqa: E402
from printed import print_report  # noqa: E402
from zoo import ZOO, example  # noqa: E402

from advisor.estimate.step import estimate_step  # noqa: E402
from advisor.profile.hub import build_function, input_function, model_loss, resolve_config  # noqa: E402
from advisor.profile.trace import StepTrace, trace_training_step  # noqa: E402

GPU = "a100-sxm4-80gb"
PUBLISHED_GEOMEAN = {"amp-fp16": 1.51, "fp32": 1.21}
"""TORCH2_LAUNCH's training speed-ups on an A100 (AMP: fp16 autocast, the suites' --amp)."""
NANOGPT = 250 / 135
"""nanoGPT README: GPT-2 124M iteration time, eager / compiled."""

Parts = tuple[Callable[[], torch.nn.Module], Callable[[int], Any], Callable[[Any, Any], torch.Tensor] | None]


def hub_parts(spec: str, seq_len: int) -> Parts:
    """A Hugging Face config's model (no weights downloaded), its inputs at `seq_len` tokens, its own loss."""
    hub = resolve_config(spec)
    inputs = input_function(hub.config)
    return build_function(hub), lambda batch: inputs(batch, seq_len), model_loss


def zoo_model(name: str) -> Parts:
    build, make_input, loss = ZOO[name](None)
    return build, make_input, loss


MODELS: dict[str, tuple[Callable[[], Parts], int]] = {
    "resnet50 (zoo)": (lambda: zoo_model("resnet50"), 64),
    "mobilenet_v2 (zoo)": (lambda: zoo_model("mobilenet_v2"), 64),
    "efficientnet_b0 (zoo)": (lambda: zoo_model("efficientnet_b0"), 64),
    "densenet121 (zoo)": (lambda: zoo_model("densenet121"), 64),
    "vit_b16 (example)": (lambda: example("vit_b16"), 64),
    "bert_base seq 384 (zoo)": (lambda: zoo_model("bert_base"), 16),
    "gpt2_small seq 1024 (example)": (lambda: example("gpt2_small"), 8),
    "t5-small seq 512 (hf)": (lambda: hub_parts("hf:google-t5/t5-small", 512), 16),
    "phi-1_5 seq 1024 (hf)": (lambda: hub_parts("hf:microsoft/phi-1_5", 1024), 4),
}
"""Model -> (its parts, batch): vision at 64 images, language models at batches of 4-16 sequences."""


def trace(parts: Parts, batch: int, precision: str) -> StepTrace:
    build, make_input, loss = parts
    return trace_training_step(build, make_input, batch, precision, "adamw", loss, attention="cuda")


def speedup(step: StepTrace) -> tuple[float, float]:
    """(eager, compiled) seconds of the step on GPU."""
    device = gpu_device(GPU)
    return estimate_step(step, device).step_s, estimate_step(step, device, compiled=True).step_s


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    args = parser.parse_args()
    started = time.perf_counter()
    lines = [f"torch.compile / eager training speed-up on {GPU}, {time.strftime('%Y-%m-%d')}, torch {torch.__version__}",
             "ours: eager step time / --compile step time of the same traced step (AdamW); published: geometric "
             "means (TORCH2_LAUNCH)", "",
             f"{'model':<32} {'batch':>5} {'precision':<9} {'eager ms':>9} {'compiled ms':>11} {'speed-up':>8}"]
    ratios: dict[str, list[float]] = {precision: [] for precision in PUBLISHED_GEOMEAN}
    for name, (parts_of, batch) in MODELS.items():
        parts = parts_of()
        for precision in PUBLISHED_GEOMEAN:
            eager, compiled = speedup(trace(parts, batch, precision))
            ratios[precision].append(eager / compiled)
            lines.append(f"{name:<32} {batch:>5} {precision:<9} {eager * 1e3:>9.2f} {compiled * 1e3:>11.2f} "
                         f"{eager / compiled:>8.2f}")
            print(lines[-1], file=sys.stderr, flush=True)
    lines.append("")
    for precision, published in PUBLISHED_GEOMEAN.items():
        ours = geomean(ratios[precision])
        lines.append(f"geometric mean, {precision:<8}: ours {ours:.2f}x, published {published:.2f}x "
                     f"(ours / published - 1: {ours / published - 1:+.1%})")
    eager, compiled = speedup(trace(example("gpt2_small"), 12, "amp-bf16"))
    lines.append(f"gpt2_small b12 amp-bf16 (nanoGPT's shape): ours {eager / compiled:.2f}x; nanoGPT README "
                 f"{NANOGPT:.2f}x with a materialised attention softmax in eager (an upper reference)")
    lines.append(f"({time.perf_counter() - started:.0f} s)")
    print_report(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
