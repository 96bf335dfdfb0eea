"""float8 training of Linear layers (`--precision fp8`, issue #28), the way TransformerEngine's `te.Linear`
and torchao's `Float8Linear` run it on Ada, Hopper and Blackwell, written with real torch ops so that the trace
records its kernels, their traffic and the tensors they keep:

- forward: the input and the weight are each scaled by their amax and cast to float8 e4m3, each with a
  transposed copy (TransformerEngine's fused `cast_transpose`: one kernel reads the tensor once and writes both
  codes; a Hopper fp8 GEMM takes only the "TN" layout, so the weight and input gradients need the transposes);
  the product runs as `torch._scaled_mm` (cuBLASLt's fp8 GEMM) with bf16 output and the bias in its epilogue;
- saved for backward: the input's transposed codes and the weight's (1 byte per element, where autocast
  saves a 2-byte bf16 input and a bf16 weight copy);
- backward: the output gradient cast to float8 e5m2 with its transpose (TransformerEngine's HYBRID format:
  e4m3 forward, e5m2 gradients), then two fp8 GEMMs: the input gradient in the input's dtype and the weight
  gradient in fp32 (accumulated into the fp32 master gradient), the bias gradient a reduction.

Everything else runs under bf16 autocast, weights stay fp32 masters, as `fp8` training recipes keep them
(NeMo/Megatron: bf16 params with fp32 main grads and optimizer state; torchtitan: fp32 params, bf16 FSDP
gathers). The per-tensor scales and amax histories are a few bytes per layer and are left out. The output
head (the vocabulary's logits) stays in bf16, as TransformerEngine models and torchtitan's float8 filter leave
it; so do layers whose dimensions are not multiples of 16 (what cuBLASLt's fp8 GEMM requires).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from advisor.profile.adapters import LORA_ADAPTERS, is_linear, linear_features, output_heads, replace_module

FORWARD_FP8 = torch.float8_e4m3fn
"""Codes of activations and weights (more mantissa: TransformerEngine's HYBRID recipe's forward format)."""
BACKWARD_FP8 = torch.float8_e5m2
"""Codes of gradients (more range)."""
FP8_GEMM_MULTIPLE = 16
"""cuBLASLt's fp8 GEMM needs both dimensions of each operand to be multiples of 16."""


@torch.library.custom_op("advisor::float8_cast_transpose", mutates_args=())
def float8_cast_transpose(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A 2-D tensor scaled into float8 `dtype`'s range by its amax and cast, the same codes transposed
    (contiguous), and the fp32 scale that turns codes back into values: TransformerEngine's fused
    cast_transpose kernel, one read of `x`, two 1-byte writes and the 4-byte scale."""
    amax = x.abs().amax().float().clamp_min(1e-12)
    scale = torch.finfo(dtype).max / amax
    codes = (x.float() * scale).to(dtype)
    return codes, codes.t().contiguous(), scale.reciprocal()


@float8_cast_transpose.register_fake
def _(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, cols = x.shape
    return (x.new_empty((rows, cols), dtype=dtype), x.new_empty((cols, rows), dtype=dtype),
            x.new_empty((), dtype=torch.float32))


def _scaled_mm(a: tuple[torch.Tensor, torch.Tensor], b_t: tuple[torch.Tensor, torch.Tensor],
               out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a [m, k] (row-major codes, scale) @ b_t's codes transposed ([k, n], column-major; b_t's codes are
    [n, k] row-major) in fp8, output `out_dtype`: cuBLASLt's fp8 GEMM."""
    (a_codes, a_scale), (b_codes, b_scale) = a, b_t
    return torch._scaled_mm(a_codes, b_codes.t(), a_scale, b_scale, bias=bias, out_dtype=out_dtype)


class _Float8Matmul(torch.autograd.Function):
    """y = x W^T + b (an nn.Linear's [out, in] weight) or, `transposed`, y = x W + b (transformers' Conv1D, an
    [in, out] weight), with x and W in float8 (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                out_dtype: torch.dtype, transposed: bool) -> torch.Tensor:
        x8, x8_t, x_scale = float8_cast_transpose(x, FORWARD_FP8)
        w8, w8_t, w_scale = float8_cast_transpose(weight, FORWARD_FP8)
        # rows of the [out, in] weight: w8 for a Linear, its transpose for a Conv1D
        w_out_in, w_in_out = (w8_t, w8) if transposed else (w8, w8_t)
        out = _scaled_mm((x8, x_scale), (w_out_in, w_scale), out_dtype,
                         None if bias is None else bias.to(out_dtype))
        ctx.save_for_backward(x8_t if weight.requires_grad else None, w_in_out, x_scale, w_scale)
        ctx.input_dtype, ctx.has_bias, ctx.transposed = x.dtype, bias is not None, transposed
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x8_t, w_in_out, x_scale, w_scale = ctx.saved_tensors
        g8, g8_t, g_scale = float8_cast_transpose(grad.contiguous(), BACKWARD_FP8)
        grad_input = None
        if ctx.needs_input_grad[0]:
            grad_input = _scaled_mm((g8, g_scale), (w_in_out, w_scale), ctx.input_dtype)
        grad_weight = None
        if ctx.needs_input_grad[1]:  # [out, in] = g^T x, or [in, out] = x^T g
            grad_weight = _scaled_mm((x8_t, x_scale), (g8_t, g_scale), torch.float32) if ctx.transposed else \
                _scaled_mm((g8_t, g_scale), (x8_t, x_scale), torch.float32)
        grad_bias = grad.sum(0).float() if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_input, grad_weight, grad_bias, None, None


class Float8Linear(nn.Module):
    """A Linear layer trained in float8: the same weight and bias parameters (so optimizer state and
    gradients are as before), its products in fp8 with bf16 (autocast's dtype) output."""

    def __init__(self, linear: nn.Module) -> None:
        super().__init__()
        self.in_features, self.out_features = linear_features(linear)
        self.transposed = not isinstance(linear, nn.Linear)
        self.weight = linear.weight
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else torch.bfloat16
        with torch.autocast(device, enabled=False):
            flat = x.reshape(-1, self.in_features)
            out = _Float8Matmul.apply(flat, self.weight, self.bias, dtype, self.transposed)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, float8"


def float8_eligible(module: nn.Module) -> bool:
    """A plain Linear layer whose dimensions cuBLASLt's fp8 GEMM accepts."""
    if not is_linear(module) or not isinstance(getattr(module, "weight", None), nn.Parameter):
        return False
    return all(size % FP8_GEMM_MULTIPLE == 0 for size in linear_features(module))


def convert_to_float8(model: nn.Module) -> int:
    """Replace every eligible Linear layer but the output head and LoRA's adapters (small products that stay
    in bf16, as peft leaves them beside a TransformerEngine base) with a Float8Linear; how many were replaced."""
    heads = output_heads(model)
    chosen = [(name, module) for name, module in model.named_modules()
              if name and id(module) not in heads and float8_eligible(module)
              and name.rsplit(".", 1)[-1] not in LORA_ADAPTERS]
    for name, module in chosen:
        replace_module(model, name, Float8Linear(module))
    return len(chosen)
