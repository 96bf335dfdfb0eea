"""Quantized frozen weights and 8-bit optimizer state, as bitsandbytes stores and runs them (issue #26).

bitsandbytes needs CUDA and is not a dependency; what the trace needs is its storage and its kernels' traffic,
so both are written here as torch custom ops with fake kernels (they run on fake tensors like any aten op)
and cost formulas in costs.py's registry:

- `advisor::dequantize_blockwise(packed, absmax, rows, cols, dtype)`: a frozen weight stored as 4-bit NF4
  (two codes per byte, one fp32 absmax per 64 weights; with double quantization one uint8 absmax per 64 and
  one fp32 constant per 256 of those: QLoRA, Dettmers et al. 2023, section 3) or LLM.int8 codes (one byte per
  weight, one fp32 scale per output row: Dettmers et al. 2022) made into a `dtype` matrix. bitsandbytes'
  Linear4bit dequantizes the weight in every forward and again in backward (MatMul4Bit saves the codes, not
  the matrix), then multiplies in the compute dtype; FrozenQuantizedLinear does the same.
- `advisor::adamw8bit_step_(param, grad, state1, state2, absmax1, absmax2, ...)`: bitsandbytes' blockwise
  8-bit AdamW (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization"): both moments as uint8
  codes with one fp32 absmax per 256 values (bitsandbytes' block size for optimizers); tensors under 4,096
  elements keep 32-bit state (its `min_8bit_size`). One kernel per parameter, reading and writing the
  parameter, both codes, reading the gradient.

The real kernels (for models traced on real values, real_run.py) compute the same sizes with linear blockwise
codes; only their outputs' shapes and dtypes matter to an estimate.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from advisor.profile.choices import BASE_WEIGHTS

NF4_BLOCK = 64
"""Weights per absmax in bitsandbytes' 4-bit formats (its default blocksize)."""
DOUBLE_QUANT_BLOCK = 256
"""absmax values per fp32 constant when the absmax themselves are quantized (QLoRA's double quantization)."""
OPTIMIZER_BLOCK = 256
"""Values per fp32 absmax in bitsandbytes' blockwise 8-bit optimizer state."""
MIN_8BIT_SIZE = 4096
"""bitsandbytes' optimizers keep 32-bit state for tensors with fewer elements."""

BASE_FORMATS = tuple(name for name in BASE_WEIGHTS if name != "bf16")
"""Quantized storages of frozen Linear weights: 4-bit NormalFloat, the same with double quantization, LLM.int8."""

@torch.library.custom_op("advisor::dequantize_blockwise", mutates_args=())
def dequantize_blockwise(packed: torch.Tensor, absmax: torch.Tensor, rows: int, cols: int,
                         dtype: torch.dtype) -> torch.Tensor:
    """The [rows, cols] `dtype` matrix that `packed` codes with `absmax` scales encode (real values: linear
    codes; see the module docstring)."""
    codes = packed.to(torch.float32).flatten()
    values = codes.repeat_interleave(max(1, (rows * cols) // max(1, codes.numel())))[: rows * cols]
    values = torch.nn.functional.pad(values, (0, rows * cols - values.numel()))
    scale = absmax.to(torch.float32).flatten()[:1].abs() + 1.0
    return ((values / 127.5 - 1.0) * scale / 100.0).reshape(rows, cols).to(dtype)


@dequantize_blockwise.register_fake
def _(packed: torch.Tensor, absmax: torch.Tensor, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    return packed.new_empty((rows, cols), dtype=dtype)


@torch.library.custom_op("advisor::adamw8bit_step_",
                         mutates_args=("param", "state1", "state2", "absmax1", "absmax2"))
def adamw8bit_step_(param: torch.Tensor, grad: torch.Tensor, state1: torch.Tensor, state2: torch.Tensor,
                    absmax1: torch.Tensor, absmax2: torch.Tensor, lr: float, beta1: float, beta2: float,
                    eps: float, weight_decay: float, step: int) -> None:
    """One 8-bit AdamW update of `param` in place (real values: linear codes per block)."""
    first = _decode(state1, absmax1) * beta1 + grad.float() * (1 - beta1)
    second = _decode(state2, absmax2) * beta2 + grad.float().square() * (1 - beta2)
    param.mul_(1 - lr * weight_decay)
    update = (first / (1 - beta1**step)) / ((second / (1 - beta2**step)).sqrt() + eps)
    param.add_((-lr * update).to(param.dtype))
    _encode(first, state1, absmax1)
    _encode(second, state2, absmax2)


@adamw8bit_step_.register_fake
def _(param: torch.Tensor, grad: torch.Tensor, state1: torch.Tensor, state2: torch.Tensor, absmax1: torch.Tensor,
      absmax2: torch.Tensor, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
      step: int) -> None:
    return None


def _blocks(values: torch.Tensor) -> torch.Tensor:
    """`values` flattened and zero-padded to whole OPTIMIZER_BLOCKs, one per row."""
    flat = values.flatten()
    return torch.nn.functional.pad(flat, (0, -flat.numel() % OPTIMIZER_BLOCK)).reshape(-1, OPTIMIZER_BLOCK)


def _decode(codes: torch.Tensor, absmax: torch.Tensor) -> torch.Tensor:
    blocks = (_blocks(codes.to(torch.float32)) / 127.5 - 1.0) * absmax[:, None]
    return blocks.flatten()[: codes.numel()].reshape(codes.shape)


def _encode(values: torch.Tensor, codes: torch.Tensor, absmax: torch.Tensor) -> None:
    blocks = _blocks(values)
    absmax.copy_(blocks.abs().amax(dim=1).clamp_min(1e-12))
    scaled = ((blocks / absmax[:, None] + 1.0) * 127.5).round().clamp(0, 255)
    codes.copy_(scaled.flatten()[: codes.numel()].reshape(codes.shape).to(torch.uint8))


# --- frozen quantized Linear layers ----------------------------------------------------------------------


def storage_shapes(rows: int, cols: int, form: str) -> tuple[tuple[int, ...], tuple[int, ...], torch.dtype]:
    """Shapes of the codes and of the scales a [rows, cols] weight is stored as in `form`, and the scales'
    dtype. Double quantization's fp32 constants (one per 256 absmax) are counted into the uint8 absmax
    buffer as 4 more bytes each."""
    count = rows * cols
    if form == "int8":
        return (count,), (rows,), torch.float32
    blocks = math.ceil(count / NF4_BLOCK)
    codes = (math.ceil(count / 2),)
    if form == "nf4":
        return codes, (blocks,), torch.float32
    assert form == "nf4-dq", form
    return codes, (blocks + 4 * math.ceil(blocks / DOUBLE_QUANT_BLOCK),), torch.uint8


def weight_bytes(rows: int, cols: int, form: str) -> int:
    """Bytes a [rows, cols] frozen weight takes stored as `form` (codes and scales)."""
    codes, scales, dtype = storage_shapes(rows, cols, form)
    return math.prod(codes) + math.prod(scales) * dtype.itemsize


class _FrozenQuantizedMatmul(torch.autograd.Function):
    """y = x W^T + b with W made from its codes in forward and again in backward (only the codes are saved),
    as bitsandbytes' MatMul4Bit; the weight takes no gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, packed: torch.Tensor, absmax: torch.Tensor, bias: torch.Tensor | None,
                rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        weight = dequantize_blockwise(packed, absmax, rows, cols, dtype)
        ctx.save_for_backward(packed, absmax)
        ctx.shape, ctx.dtype, ctx.input_dtype = (rows, cols), dtype, x.dtype
        return nn.functional.linear(x.to(dtype), weight, None if bias is None else bias.to(dtype))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        packed, absmax = ctx.saved_tensors
        grad_input = None
        if ctx.needs_input_grad[0]:
            weight = dequantize_blockwise(packed, absmax, *ctx.shape, ctx.dtype)
            grad_input = (grad.to(ctx.dtype) @ weight).to(ctx.input_dtype)
        return grad_input, None, None, None, None, None, None


class FrozenQuantizedLinear(nn.Module):
    """A frozen Linear whose weight is stored as `form` codes (buffers: they take no gradient and no optimizer
    state), computing in the autocast dtype when autocast is on, else in the input's dtype (bitsandbytes'
    compute_dtype)."""

    def __init__(self, in_features: int, out_features: int, bias: torch.Tensor | None, form: str,
                 device: torch.device) -> None:
        super().__init__()
        assert form in BASE_FORMATS, form
        self.in_features, self.out_features, self.form = in_features, out_features, form
        codes, scales, scale_dtype = storage_shapes(out_features, in_features, form)
        self.register_buffer("weight_codes", torch.zeros(codes, dtype=torch.uint8, device=device))
        self.register_buffer("weight_scales", torch.ones(scales, dtype=scale_dtype, device=device))
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        with torch.autocast(device, enabled=False):
            return _FrozenQuantizedMatmul.apply(x, self.weight_codes, self.weight_scales, self.bias,
                                                self.out_features, self.in_features, dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, form={self.form}"


# --- 8-bit AdamW ---------------------------------------------------------------------------------------------


class AdamW8bit(torch.optim.Optimizer):
    """bitsandbytes' AdamW8bit (and its paged twin): blockwise 8-bit moments for tensors of at least
    MIN_8BIT_SIZE elements, 32-bit ones below, one update kernel per parameter."""

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        assert closure is None, "the trace calls step() without a closure"
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    self._init_state(param, state)
                state["step"] += 1
                if "state1" in state:
                    adamw8bit_step_(param, param.grad, state["state1"], state["state2"], state["absmax1"],
                                    state["absmax2"], group["lr"], beta1, beta2, group["eps"],
                                    group["weight_decay"], state["step"])
                else:
                    self._step_32bit(param, state, group)

    @staticmethod
    def _init_state(param: torch.Tensor, state: dict[str, Any]) -> None:
        state["step"] = 0
        if param.numel() < MIN_8BIT_SIZE:
            state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
            return
        blocks = math.ceil(param.numel() / OPTIMIZER_BLOCK)
        for index in (1, 2):
            state[f"state{index}"] = torch.zeros_like(param, dtype=torch.uint8)
            state[f"absmax{index}"] = torch.zeros(blocks, dtype=torch.float32, device=param.device)

    @staticmethod
    def _step_32bit(param: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> None:
        """The 32-bit update bitsandbytes runs for small tensors (one fused kernel there; its traffic here)."""
        beta1, beta2 = group["betas"]
        grad = param.grad.float()
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        param.mul_(1 - group["lr"] * group["weight_decay"])
        denominator = state["exp_avg_sq"].sqrt().add_(group["eps"])
        param.addcdiv_(state["exp_avg"].to(param.dtype), denominator.to(param.dtype), value=-group["lr"])


def adamw8bit_state_bytes(numel: int) -> int:
    """Bytes of AdamW8bit's state for one parameter of `numel` elements (the parameter-count formula's)."""
    if numel < MIN_8BIT_SIZE:
        return 8 * numel
    return 2 * numel + 2 * 4 * math.ceil(numel / OPTIMIZER_BLOCK)
