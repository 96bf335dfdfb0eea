"""CUDA's autocast policy on CPU traces (advisor/profile/cuda_autocast.py): the ops CUDA's autocast runs in fp32
run in fp32, its lists are torch's own, and a GPU trace's memory holds what a GPU's step holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from advisor.profile.cuda_autocast import (
    FP32,
    FP32_APPEND_DTYPE,
    FP32_SET_OPT_DTYPE,
    PROMOTE,
    cuda_autocast_policy,
    overload,
    policy_kernels,
)


def dtypes_under_autocast() -> dict[str, torch.dtype]:
    x = torch.randn(4, 8)
    weight = torch.randn(8, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = x @ weight
        found = {"matmul": h, "softmax": F.softmax(h, -1), "layer_norm": F.layer_norm(h, (8,)), "sum": h.sum(),
                 "exp": h.exp(), "cumsum": h.cumsum(0), "norm": h.norm(), "addcmul": torch.addcmul(h, h, x),
                 "int sum": torch.ones(3, dtype=torch.int64).sum()}
    return {name: tensor.dtype for name, tensor in found.items()}


def test_under_cudas_policy_the_ops_it_lists_run_in_fp32_and_the_cpus_own_return_after() -> None:
    bf16, fp32 = torch.bfloat16, torch.float32
    cpu = dtypes_under_autocast()
    assert cpu == {"matmul": bf16, "softmax": bf16, "layer_norm": bf16, "sum": bf16, "exp": bf16, "cumsum": bf16,
                   "norm": bf16, "addcmul": fp32, "int sum": torch.int64}  # addcmul: fp32 x promotes as usual
    with cuda_autocast_policy():
        cuda = dtypes_under_autocast()
    # matmul stays bf16 (lower precision on both); an integer sum is not autocast's (not floating)
    assert cuda == {"matmul": bf16, "softmax": fp32, "layer_norm": fp32, "sum": fp32, "exp": fp32, "cumsum": fp32,
                    "norm": fp32, "addcmul": fp32, "int sum": torch.int64}
    assert dtypes_under_autocast() == cpu  # the kernels are removed on exit


def test_a_dtype_given_positionally_or_by_keyword_is_kept_and_a_missing_one_is_fp32() -> None:
    # softmax's and log_softmax's dtype is positional in their schemas, sum's and cumsum's keyword-only: Hugging
    # Face's eager attention calls softmax(x, dim=-1, dtype=torch.float32)
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    with cuda_autocast_policy(), torch.autocast("cpu", dtype=bf16):
        h = torch.randn(4, 8) @ torch.randn(8, 8)
        assert [F.softmax(h, -1).dtype, F.softmax(h, -1, dtype=fp32).dtype, F.softmax(h, -1, dtype=bf16).dtype] == \
            [fp32, fp32, bf16]
        assert [torch.log_softmax(h, -1, fp16).dtype, torch.log_softmax(h, -1).dtype] == [fp16, fp32]
        assert [h.sum(dtype=bf16).dtype, h.sum(0).dtype, h.cumsum(0, dtype=fp16).dtype, h.cumsum(0).dtype] == \
            [bf16, fp32, fp16, fp32]


def test_a_backward_runs_through_the_policys_kernels() -> None:
    weight = torch.randn(8, 8, requires_grad=True)
    with cuda_autocast_policy():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = torch.randn(4, 8) @ weight
            loss = F.layer_norm(F.softmax(h, -1), (8,)).sum() + F.cross_entropy(h, torch.tensor([1, 2, 3, 4]))
        loss.backward()
    assert loss.dtype == torch.float32 and weight.grad is not None and weight.grad.dtype == torch.float32


AUTOCAST_HEADER = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"


def header_list(macro: str) -> set[str]:
    """The operator.overload names of one AT_FORALL_* list of the installed torch's autocast_mode.h."""
    text = AUTOCAST_HEADER.read_text()
    body = re.search(rf"#define {macro}\(_\)(.*?)(?:\n\n|#define|#else)", text, re.S)
    assert body is not None, macro
    names = set()
    for op, variant in re.findall(r"_\((\w+)(?:,\s*(\w+))?\)", body.group(1)):
        names.add(f"{op}.{variant}" if variant else op)
    return names


@pytest.mark.skipif(not AUTOCAST_HEADER.exists(), reason="this torch ships no C++ headers")
def test_the_lists_are_those_the_installed_torch_registers_its_cuda_autocast_kernels_with() -> None:
    assert set(FP32) == header_list("AT_FORALL_FP32")
    assert set(FP32_SET_OPT_DTYPE) == header_list("AT_FORALL_FP32_SET_OPT_DTYPE")
    assert set(PROMOTE) == header_list("AT_FORALL_PROMOTE")
    redispatched = re.findall(r'"(norm\.\w+)"', AUTOCAST_HEADER.read_text().split("AT_FORALL_DIFFERENT_REDISPATCH")[1])
    assert set(FP32_APPEND_DTYPE) <= set(redispatched)


def test_every_operator_given_a_kernel_has_one_under_cudas_autocast_key() -> None:
    # the dispatcher's table of this torch (the CPU build registers AutocastCUDA's kernels too)
    kernels = policy_kernels()
    assert len(kernels) >= 80
    for op in kernels:
        assert "AutocastCUDA" in torch._C._dispatch_dump(op.name()), op.name()
    assert overload("no_such_operator") is None and overload("softmax.no_such_overload") is None


def test_a_gpu_trace_holds_the_attention_probabilities_in_fp32_as_a_gpus_autocast_makes_them() -> None:
    # scores = q @ k^T under bf16 autocast, softmax in fp32 on CUDA: its output (saved for its backward) is
    # batch 2 x 64 x 64 x 4 bytes = 32,768, where CPU autocast keeps it bf16 (16,384); the trace "cuda" holds it
    # so, and the step it records casts the scores to fp32 first (an op CPU autocast does not make)
    from advisor.profile.trace import trace_training_step

    class Scores(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.query = nn.Linear(16, 16)
            self.out = nn.Linear(64, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q = self.query(x)
            probabilities = torch.softmax(q @ x.transpose(1, 2), dim=-1)
            return self.out(probabilities).mean(dim=1)

    def traced(attention: str):
        return trace_training_step(Scores, lambda b: torch.randn(b, 64, 16), 2, "amp-bf16", attention=attention,
                                   loss_fn=lambda out, x: out.float().pow(2).mean())

    cpu, cuda = traced("cpu"), traced("cuda")
    softmax = [[r for r in trace.records if r.op == "_softmax" and r.phase == "forward"] for trace in (cpu, cuda)]
    assert [r.bytes_written for r in softmax[0]] == [2 * 64 * 64 * 2]
    assert [r.bytes_written for r in softmax[1]] == [2 * 64 * 64 * 4]
    assert cuda.memory is not None and cpu.memory is not None
    assert cuda.memory.peak().bytes > cpu.memory.peak().bytes
    assert cuda.cpu_runs_otherwise and not cpu.cpu_runs_otherwise
    assert dtypes_under_autocast()["softmax"] == torch.bfloat16  # nothing left registered
