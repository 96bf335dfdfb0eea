"""Attention with dropout traced as GPUs run it (advisor/profile/attention.py, issue #22): no s x s
tensors for GPU targets, the CPU's math path kept for CPU targets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from advisor.cli.main import main
from advisor.profile.attention import FusedAttentionDropout
from advisor.profile.trace import trace_training_step
from tests.calibration_fakes import steady_local_cpu
from tests.test_calibration import TINY_SUITE

BATCH, HEADS, SEQ, DIM = 2, 4, 256, 16


class SelfAttention(nn.Module):
    def __init__(self, dropout: float = 0.1, positional: bool = False) -> None:
        super().__init__()
        self.qkv = nn.Linear(HEADS * DIM, 3 * HEADS * DIM)
        self.dropout, self.positional = dropout, positional

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(BATCH, SEQ, 3, HEADS, DIM).permute(2, 0, 3, 1, 4)
        if self.positional:
            return F.scaled_dot_product_attention(q, k, v, None, self.dropout, True)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout, is_causal=True)


def _inputs(batch: int) -> torch.Tensor:
    return torch.randn(BATCH, SEQ, HEADS * DIM)


SCORES_BYTES = BATCH * HEADS * SEQ * SEQ * 4
"""One s x s fp32 tensor of scores: 2 * 4 * 256 * 256 * 4 = 2 MiB."""


def _largest_allocation(trace) -> int:
    return max(size for r in trace.records for size in r.allocated)


@pytest.mark.parametrize("positional", [False, True])
def test_attention_dropout_runs_as_the_fused_kernel_for_gpus(positional: bool) -> None:
    def build() -> nn.Module:
        return SelfAttention(0.1, positional)

    cpu = trace_training_step(build, _inputs, BATCH, attention="cpu")
    gpu = trace_training_step(build, _inputs, BATCH, attention="cuda")
    assert cpu.fused_attention_dropout == 0 and gpu.fused_attention_dropout == 1
    assert _largest_allocation(cpu) >= SCORES_BYTES  # the math path stores the s x s scores and mask
    # the fused kernel stores its output (2 * 4 * 256 * 16 * 4 = 128 KiB) and a logsumexp per row; the
    # largest tensor is the qkv projection's output, 2 * 256 * 192 * 4 = 384 KiB
    assert _largest_allocation(gpu) == 2 * SEQ * 3 * HEADS * DIM * 4
    assert gpu.memory.peak().bytes < cpu.memory.peak().bytes - SCORES_BYTES
    assert any(r.op == "_scaled_dot_product_flash_attention_for_cpu" for r in gpu.records)


def test_attention_without_dropout_is_left_alone() -> None:
    mode = FusedAttentionDropout()
    q = torch.randn(1, 1, 4, 2)
    with mode:
        F.scaled_dot_product_attention(q, q, q)
        F.scaled_dot_product_attention(q, q, q, dropout_p=0.0)
    assert mode.calls == 0


def test_estimate_times_a_cpu_on_its_math_path(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_file = tmp_path / "attention.py"
    model_file.write_text(
        "import torch\nfrom tests.test_attention import SelfAttention, _inputs\n"
        "def build_model():\n    return SelfAttention(0.1)\n"
        "def example_input(batch_size):\n    return _inputs(batch_size)\n"
    )
    steady_local_cpu(monkeypatch, tmp_path, TINY_SUITE)
    code = main(["estimate", str(model_file), "--batch-size", str(BATCH), "--local", "--gpu", "a100-sxm4-80gb",
                 "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    results = {r["gpu_id"]: r for r in json.loads(out)["results"]}
    cpu, gpu = results["local-cpu"], results["a100-sxm4-80gb"]
    # the CPU's tensors include the s x s scores and dropout mask the GPU's fused kernel never stores
    assert cpu["memory"]["activations"] >= gpu["memory"]["activations"] + SCORES_BYTES
