"""GPU kernel mechanisms the time model applies beyond a GEMM's curve, by hand: TF32 products with
operands that are not K-major (the trace records which), and fused attention's own rates (SIMT in
fp32; by head dimension, keys per query, causal mask and direction in 16 bits)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from advisor.estimate.ops import (
    ATTENTION_BACKWARD_RATE,
    ATTENTION_CAUSAL_RATE,
    FUSED_ATTENTION_FP32_EFFICIENCY,
    MEMORY_EFFICIENT_OVER_FLASH,
    TF32_TRANSPOSED_OPERAND_EFFICIENCY,
    attention_kernels,
    fused_attention_efficiency,
)
from advisor.estimate.step import DeviceModel, estimate_records
from advisor.profile.costs import attention_flops, transposed_operands
from advisor.profile.trace import OpRecord, trace_training_step
from tests.test_conv_algorithms import profile
from tests.test_estimate import mm


def test_transposed_operands_of_a_linear_layers_three_products() -> None:
    x, w, dy = torch.empty(6, 5), torch.empty(3, 5), torch.empty(6, 3)
    assert transposed_operands(x, w.t()) == 0  # forward x @ W.t(): both K-major ("TN")
    assert transposed_operands(dy, w) == 1  # input gradient dy @ W: W's rows run along n
    assert transposed_operands(dy.t(), x) == 2  # weight gradient dy.t() @ x: neither
    assert transposed_operands(torch.empty(1, 5), torch.empty(5, 1)) == 0  # size-1 dimensions: any stride


def test_the_trace_records_which_operands_are_transposed() -> None:
    trace = trace_training_step(lambda: nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4)),
                                lambda batch: torch.randn(batch, 16), 32, "fp32", "sgd")
    products = [(r.phase, r.gemm, r.transposed) for r in trace.records if r.gemm is not None]
    # forward: addmm(b, x [32, 16], W1.t()) and addmm(b, h [32, 8], W2.t()), K-major both
    assert ("forward", (1, 32, 8, 16), 0) in products and ("forward", (1, 32, 4, 8), 0) in products
    # backward of the second layer: dh = dy [32, 4] @ W2 [4, 8] (1), dW2 = dy.t() [4, 32] @ h [32, 8] (2)
    assert ("backward", (1, 32, 8, 4), 1) in products
    assert ("backward", (1, 4, 8, 32), 2) in products


def test_tf32_products_slow_down_per_transposed_operand_on_tensor_cores_only() -> None:
    # 2*1000^3 = 2e9 FLOPs at the 8 TFLOP/s TF32 peak x 50% = 0.5 ms K-major; with both operands
    # transposed 0.5 ms / 0.8^2 = 0.78125 ms, one 0.625 ms
    def kernel_s(transposed: int, precision: str = "tf32", tf32_flops: float | None = 8e12, kind: str = "gpu") -> float:
        record = dataclasses.replace(mm(1000, 1000, 1000), transposed=transposed)
        return estimate_records([record], precision, DeviceModel(kind, kind, profile(tf32_flops))).ops[0].kernel_s
    assert kernel_s(0) == pytest.approx(0.5e-3)
    assert kernel_s(1) == pytest.approx(0.5e-3 / TF32_TRANSPOSED_OPERAND_EFFICIENCY)
    assert kernel_s(2) == pytest.approx(0.5e-3 / TF32_TRANSPOSED_OPERAND_EFFICIENCY ** 2) == pytest.approx(0.78125e-3)
    assert kernel_s(2, precision="fp32") == pytest.approx(4e-3)  # CUDA cores: 2e9 / (1e12 x 50%)
    assert kernel_s(2, tf32_flops=None) == pytest.approx(4e-3)  # no TF32 units: fp32 as well
    assert kernel_s(2, kind="cpu") == pytest.approx(0.5e-3)  # a CPU's BLAS packs either layout


def attention(heads: int, queries: int, keys: int, head_dim: int, causal: bool = False, backward: bool = False,
              dtype: str = "bfloat16") -> OpRecord:
    flops = attention_flops((heads, queries, head_dim), (heads, keys, head_dim), (heads, keys, head_dim), causal)
    op = "_scaled_dot_product_flash_attention" + ("_backward" if backward else "")
    return OpRecord("backward" if backward else "forward", "attn", op, flops * (2.5 if backward else 1.0),
                    0, 0, (dtype,), True, True, (heads, queries, keys, head_dim))


def test_fused_attention_rates_by_hand() -> None:
    bert = attention(192, 384, 384, 64)  # BERT-base at batch 16: 16 x 12 heads, 384 tokens, head dim 64
    # cuDNN (Hopper, compute capability 9.0) at head dim 64: 0.42 x 384 / (384 + 120) = 0.32
    assert fused_attention_efficiency(bert, "bf16", "9.0") == pytest.approx(0.42 * 384 / 504)
    # FlashAttention-2 elsewhere (an A100, 8.0): 0.50 x 384 / 504
    assert fused_attention_efficiency(bert, "bf16", "8.0") == pytest.approx(0.50 * 384 / 504)
    # head dim 90 lies between 64 and 128: log2 90 = 6.4919, so 0.42 + 0.4919 x 0.20 = 0.5184
    assert fused_attention_efficiency(attention(8, 8192, 8192, 90), "bf16", "9.0") == \
        pytest.approx(0.5184 * 8192 / (8192 + 120), rel=1e-3)
    # GPT-2's causal 1,024 tokens keep (1024 + 1) / 2048 of the keys: 512.5 per query, at 0.9 of the rate
    gpt2 = attention(96, 1024, 1024, 64, causal=True)
    expected = 0.42 * ATTENTION_CAUSAL_RATE * 512.5 / (512.5 + 120)
    assert fused_attention_efficiency(gpt2, "bf16", "9.0") == pytest.approx(expected)
    backward = attention(96, 1024, 1024, 64, causal=True, backward=True)
    assert fused_attention_efficiency(backward, "bf16", "9.0") == pytest.approx(expected * ATTENTION_BACKWARD_RATE)
    assert fused_attention_efficiency(bert, "fp32", "9.0") == FUSED_ATTENTION_FP32_EFFICIENCY  # SIMT kernels


def test_pytorch_picks_the_attention_kernels_by_compute_capability_and_mask() -> None:
    # cuDNN's where PyTorch prefers it (sm90, sm100), mask or not
    assert [attention_kernels(cc, None, masked) for cc in ("9.0", "10.0") for masked in (False, True)] == ["cudnn"] * 4
    # flash attention on Ampere, Ada and GeForce Blackwell (12.0), the memory-efficient kernels with a mask
    assert [attention_kernels(cc, None, False) for cc in ("8.0", "8.6", "8.9", "12.0")] == ["flash2"] * 4
    assert [attention_kernels(cc, None, True) for cc in ("8.0", "8.6", "8.9", "12.0")] == ["efficient"] * 4
    # Volta and Turing run the memory-efficient kernels either way, at the rate assumed for them
    assert attention_kernels("7.0", None, True) == attention_kernels("7.5", None, False) == "flash2"
    # no compute capability: by architecture
    assert attention_kernels(None, "hopper", True) == "cudnn"
    assert attention_kernels(None, "ampere", True) == "efficient"


def test_a_masked_attention_runs_the_memory_efficient_kernels_off_hopper() -> None:
    # Llama at 8,192 tokens, head dim 128, with a padding mask on an A100: all 8192 keys per query at
    # 0.70 x 0.45 = 0.315 of the peak, x 8192 / (8192 + 120); on an H100 cuDNN's 0.62
    padded = dataclasses.replace(attention(64, 8192, 8192, 128), masked=True)
    assert fused_attention_efficiency(padded, "bf16", "8.0") == \
        pytest.approx(0.70 * MEMORY_EFFICIENT_OVER_FLASH * 8192 / 8312)
    assert fused_attention_efficiency(padded, "bf16", "8.0") == pytest.approx(0.315 * 8192 / 8312)
    assert fused_attention_efficiency(padded, "bf16", "9.0") == pytest.approx(0.62 * 8192 / 8312)
    assert fused_attention_efficiency(padded, "fp32", "8.0") == FUSED_ATTENTION_FP32_EFFICIENCY


class PaddedAttention(nn.Module):
    """q, k, v from one projection, 4 heads of 8, with an explicit mask of the keys (a padding mask)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(32, 96)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.unflatten(-1, (4, 8)).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        keep = torch.ones(x.shape[0], 1, 1, x.shape[1], dtype=torch.bool)
        keep[..., x.shape[1] // 2:] = False
        out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return out.transpose(1, 2).flatten(2)


def test_fused_attention_records_say_whether_they_were_given_a_mask() -> None:
    for module, masked in ((PaddedAttention(), True), (SelfAttention(0.0), False)):
        trace = trace_training_step(lambda m=module: m, lambda batch: torch.randn(batch, 16, 32), 2, "fp32", "sgd",
                                    attention="cuda")
        kernels = [(r.phase, r.masked) for r in trace.records if "attention" in r.op]
        assert kernels == [("forward", masked), ("backward", masked)]


def test_fused_attention_takes_its_own_rate_not_a_gemms_on_a_gpu() -> None:
    # fp32 under tf32: 4*192*384*384*64 = 7,247,757,312 FLOPs at the 1 TFLOP/s fp32 peak x 0.38 = 19.07 ms
    # (the GEMM curve would give 50%: 14.5 ms); fp16 under amp: 4 TFLOP/s x 0.50 x 384/504 (flash2) = 4.756 ms
    record = attention(192, 384, 384, 64, dtype="float32")
    gpu = DeviceModel("gpu", "gpu", profile(), architecture="ampere", compute_capability="8.6")
    assert estimate_records([record], "tf32", gpu).ops[0].kernel_s == \
        pytest.approx(7_247_757_312 / (1e12 * FUSED_ATTENTION_FP32_EFFICIENCY), rel=1e-6)
    half = dataclasses.replace(record, dtypes=("float16",))
    assert estimate_records([half], "fp16", gpu).ops[0].kernel_s == \
        pytest.approx(7_247_757_312 / (4e12 * 0.50 * 384 / 504), rel=1e-6)
    cpu = DeviceModel("cpu", "cpu", profile())  # a CPU's attention stays on its GEMM curve: 50% of 1 TFLOP/s
    assert estimate_records([record], "fp32", cpu).ops[0].kernel_s == pytest.approx(7_247_757_312 / 0.5e12)


class SelfAttention(nn.Module):
    """q, k, v from one projection, 4 heads of 8, attention dropout `p` while training."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.qkv, self.p = nn.Linear(32, 96), p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.unflatten(-1, (4, 8)).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        out = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0)
        return out.transpose(1, 2).flatten(2)


@pytest.mark.parametrize("p", [0.1, 0.0])
def test_fused_attention_records_say_whether_they_draw_dropout(p: float) -> None:
    trace = trace_training_step(lambda: SelfAttention(p), lambda batch: torch.randn(batch, 16, 32), 2, "fp32", "sgd",
                                attention="cuda")
    kernels = [(r.phase, r.dropout) for r in trace.records if "attention" in r.op]
    assert kernels == [("forward", p > 0), ("backward", p > 0)]


def test_attention_dropout_costs_integer_work_per_score_by_hand() -> None:
    from advisor.estimate.ops import attention_dropout_seconds
    bert = dataclasses.replace(attention(192, 384, 384, 64), dropout=True)
    # 192 x 384 x 384 = 28,311,552 scores x 28 instructions / (132 SMs x 64 lanes x 1.98 GHz) = 47.4 us
    assert attention_dropout_seconds(bert, 132, 1.98e9, 66.9e12) == pytest.approx(28_311_552 * 28 / (132 * 64 * 1.98e9))
    assert attention_dropout_seconds(bert, 132, 1.98e9, 66.9e12) == pytest.approx(47.4e-6, rel=1e-3)
    # no SM count or clock: a quarter of the fp32 FLOP/s; a causal mask draws for the half it keeps
    assert attention_dropout_seconds(bert, None, None, 4e12) == pytest.approx(28_311_552 * 28 / 1e12)
    causal = dataclasses.replace(attention(96, 1024, 1024, 64, causal=True), dropout=True)
    assert attention_dropout_seconds(causal, None, None, 4e12) == pytest.approx(96 * 1024 * 1025 / 2 * 28 / 1e12)
    assert attention_dropout_seconds(attention(192, 384, 384, 64), 132, 1.98e9, 66.9e12) == 0.0  # no dropout
