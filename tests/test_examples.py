"""The example models: their sizes, and three independent FLOP counts that must agree on them:
the training-step trace, fvcore's forward profile and torch's FlopCounterMode."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from advisor.profile.forward import forward_profile
from advisor.profile.model_file import ModelFile, builtin_examples, load_model_file
from advisor.profile.trace import call_model, trace_training_step

# Parameter counts of the full-size examples, as the papers and reference implementations give them.
PARAMS = {
    "mlp": 1_863_690,  # 784*1024+1024 + 1024*1024+1024 + 1024*10+10
    "resnet50": 25_557_032,  # torchvision resnet50
    "mobilenet_v2": 3_504_872,  # torchvision mobilenet_v2
    "vit_b16": 86_567_656,  # timm vit_base_patch16_224
    "bert_base": 108_893_186,  # BERT-base 109,482,240 minus the 590,592 pooler, plus the 1,538 QA head
    "gpt2_small": 124_439_808,  # Hugging Face gpt2
    "llama": 6_738_415_616,  # Llama 2 7B
}


def test_every_example_is_listed_and_has_its_parameter_count() -> None:
    assert set(builtin_examples()) == set(PARAMS)
    for name, expected in PARAMS.items():
        example = load_model_file(name)
        with torch.device("meta"):
            model = example.build_model()
        assert sum(p.numel() for p in model.parameters()) == expected, name


def small(name: str) -> tuple[ModelFile, Callable[[], torch.nn.Module], Callable[[int], Any]]:
    """The example at its tiny configuration where it has one (same code, small sizes)."""
    example = load_model_file(name)
    module_globals = example.build_model.__globals__
    configs = module_globals.get("CONFIGS")
    if configs is None:
        return example, example.build_model, example.example_input
    config = configs["tiny"]
    return example, (lambda: example.build_model(config)), (lambda b: example.example_input(b, config=config))


def flop_counter_by_op(build: Callable[[], torch.nn.Module], example_input: Callable[[int], Any], batch: int,
                       loss_fn: Callable[[Any, Any], torch.Tensor]) -> dict[str, float]:
    """torch.utils.flop_counter over forward, loss and backward on fake tensors, by op name."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = build()
        inputs = example_input(batch)
        with FlopCounterMode(display=False) as counter:
            loss_fn(call_model(model, inputs), inputs).backward()
    return {op.__name__: float(flops) for op, flops in counter.get_flop_counts()["Global"].items()}


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_trace_fvcore_and_flop_counter_agree(name: str) -> None:
    example, build, example_input = small(name)
    batch = 2
    trace = trace_training_step(build, example_input, batch, "fp32", "adamw", example.loss_fn)
    assert trace.uncounted() == {}

    fvcore = forward_profile(build, example_input, batch)
    assert fvcore.total_flops == pytest.approx(trace.model_forward_flops(), rel=0.01)
    assert fvcore.uncounted_ops == {}

    theirs = flop_counter_by_op(build, example_input, batch, example.loss_fn)
    ours: Counter[str] = Counter()
    for record in trace.records:
        if record.phase != "optimizer":
            ours[record.op] += record.flops
    assert theirs, "FlopCounterMode counted nothing"
    for op, flops in theirs.items():
        if "attention" in op and _causal(name):
            # FlopCounterMode (it counts the CPU kernels from torch 2.15) counts causal attention in
            # full; ours counts the (s+1)/(2s) computed: s = 8 -> 9/16 of it
            s = next(r.gemm[1] for r in trace.records if r.op == op)
            assert ours[op] == pytest.approx(flops * (s + 1) / (2 * s), rel=1e-9), op
            continue
        if op == "convolution_backward" and name == "mobilenet_v2":
            # FlopCounterMode's conv backward miscounts grouped (depthwise) convolutions (about 10x here);
            # ours: grad_input and grad_weight each one forward, less the stem's grad_input (the image
            # needs no gradient): 2 x forward - stem forward.
            forward = [r.flops for r in trace.records if r.op == "convolution"]
            assert ours[op] == pytest.approx(2 * sum(forward) - forward[0], rel=1e-9)
            continue
        assert ours[op] == pytest.approx(flops, rel=1e-9), op


def _causal(name: str) -> bool:
    return name in ("gpt2_small", "llama")


def test_resnet_forward_flops_by_hand() -> None:
    # ResNet-50 at 224x224: 4.09 GMAC per image for the convolutions and fc (torchvision's figure,
    # 4.1 GFLOPS in its 1-per-MAC convention) -> 8.2 GFLOP at 2 per multiply-add, per image.
    example = load_model_file("resnet50")
    trace = trace_training_step(example.build_model, example.example_input, 1, "fp32", "sgd", example.loss_fn)
    matmul = sum(r.flops for r in trace.records if r.phase == "forward" and r.matmul)
    assert matmul == pytest.approx(2 * 4.09e9, rel=0.01)


def test_llama_7b_train_step_is_about_six_flops_per_parameter_per_token() -> None:
    # Kaplan et al.: training costs ~6 N FLOPs per token (2N forward, 4N backward) plus attention.
    # 7B at sequence 2048, batch 1: 6 * 6.74e9 * 2048 = 8.28e13; attention adds a few percent.
    example = load_model_file("llama")
    trace = trace_training_step(example.build_model, example.example_input, 1, "amp-bf16", "adamw", example.loss_fn)
    fwd_bwd = trace.flops("forward") + trace.flops("backward")
    assert 6 * 6.74e9 * 2048 < fwd_bwd < 1.06 * 6 * 6.74e9 * 2048
