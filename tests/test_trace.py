"""The training-step trace on fake tensors: phases, precision policies, optimizers."""

from __future__ import annotations

import pytest
import torch

from advisor.errors import UserError
from advisor.profile.trace import OPTIMIZERS, PRECISIONS, trace_training_step


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def inputs(batch: int) -> torch.Tensor:
    return torch.randn(batch, 8)


def matmul_flops(trace, phase: str) -> float:
    return sum(r.flops for r in trace.records if r.phase == phase and r.matmul)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_mlp_step_flops_by_phase(precision: str) -> None:
    trace = trace_training_step(mlp, inputs, 32, precision, "sgd")
    # params: 8*16 + 16 + 16*4 + 4 = 212
    assert trace.params == 212
    # forward: 2*32*16*8 + 2*32*4*16 = 8192 + 4096 = 12,288
    assert matmul_flops(trace, "forward") == 12_288
    # backward: layer 2 grad_input 2*32*16*4 = 4096 and grad_weight 2*4*16*32 = 4096;
    # layer 1 grad_weight 2*16*8*32 = 8192 (its input needs no gradient): 16,384
    assert matmul_flops(trace, "backward") == 16_384
    assert trace.uncounted() == {}


def test_precision_sets_matmul_dtypes() -> None:
    expected = {"fp32": "float32", "tf32": "float32", "amp-bf16": "bfloat16", "amp-fp16": "float16",
                "bf16": "bfloat16", "fp16": "float16"}
    for precision, dtype in expected.items():
        trace = trace_training_step(mlp, inputs, 4, precision, "sgd")
        dtypes = {d for r in trace.records if r.matmul and r.phase == "forward" for d in r.dtypes}
        assert dtypes == {dtype}, precision


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_optimizer_phase_touches_every_parameter(optimizer: str) -> None:
    trace = trace_training_step(mlp, inputs, 4, "fp32", optimizer)
    # every optimizer reads and writes at least the 212 fp32 parameters and their gradients
    assert trace.bytes_moved("optimizer") >= 2 * 212 * 4
    assert trace.flops("optimizer") >= 212


def test_adam_moves_more_bytes_than_sgd() -> None:
    sgd = trace_training_step(mlp, inputs, 4, "fp32", "sgd")
    adam = trace_training_step(mlp, inputs, 4, "fp32", "adam")
    assert adam.bytes_moved("optimizer") > 2 * sgd.bytes_moved("optimizer")


def test_modules_are_attributed_in_forward_and_backward() -> None:
    trace = trace_training_step(mlp, inputs, 4, "fp32", "sgd")
    modules = {(r.phase, r.module) for r in trace.records if r.matmul}
    assert ("forward", "0") in modules and ("forward", "2") in modules
    assert ("backward", "2") in modules


def test_fake_tensors_allocate_no_weights() -> None:
    # 24 x 4096x4096 linears = 402,751,488 params, 1.6 GB in fp32: traced without that memory
    model = lambda: torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(24)])  # noqa: E731
    trace = trace_training_step(model, lambda b: torch.randn(b, 4096), 2, "amp-bf16", "adamw")
    assert trace.params == 402_751_488
    # forward: 24 layers x 2*2*4096*4096
    assert matmul_flops(trace, "forward") == 24 * 2 * 2 * 4096 * 4096


def test_bad_settings_are_user_errors() -> None:
    with pytest.raises(UserError, match="unknown precision 'fp8'"):
        trace_training_step(mlp, inputs, 4, "fp8", "sgd")
    with pytest.raises(UserError, match="unknown optimizer"):
        trace_training_step(mlp, inputs, 4, "fp32", "lion")
    with pytest.raises(UserError, match="batch size"):
        trace_training_step(mlp, inputs, 0, "fp32", "sgd")
