"""scaled_dot_product_attention as a GPU runs it, on a trace taken on CPU tensors (issue #22).

With dropout (Hugging Face GPT-2, BERT and RoBERTa keep attention dropout on while training), a CPU
runs torch's math path: it stores the s x s attention weights and the s x s dropout mask for backward.
CUDA's fused kernels (flash and memory-efficient attention: torch picks one of them for any dropout
rate) draw the dropout mask inside the kernel from a Philox seed and offset they save, and store only
the output and the logsumexp of each row; backward draws the same mask again. On GPT-2 small, batch
8 x 1024, amp-bf16, the math path's tensors made the step 26.4 GiB where the fused kernels need 12.0.

A trace for GPU targets therefore runs each attention with dropout as the CPU's fused kernel
(`_scaled_dot_product_flash_attention_for_cpu`: the same FLOPs, the same saved output and logsumexp)
and counts it; the estimator lowers that op to the CUDA kernel. The forward kernel's record and its
backward's say that they draw the mask (OpRecord.dropout): the estimator times the random numbers
(estimate/ops.py, ATTENTION_DROPOUT_INT_OPS_PER_SCORE). What the trace leaves out: the 16-byte seed and
offset.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

ATTENTION_PATHS = ("cpu", "cuda")
"""How a trace runs scaled_dot_product_attention with dropout: as a CPU does (its math path) or as the
fused CUDA kernels do (see the module docstring)."""

_DROPOUT_ARG = 4
"""Position of dropout_p in F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, ...)."""


class FusedAttentionDropout(TorchFunctionMode):
    """Within it, F.scaled_dot_product_attention with dropout runs without it on the CPU's fused kernel;
    `calls` counts those attentions."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.active = 0
        """Calls with their dropout taken out that are running now: the fused kernel the tracer records
        meanwhile draws a dropout mask on a GPU (OpRecord.dropout)."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        stripped = False
        if func is F.scaled_dot_product_attention:
            if len(args) > _DROPOUT_ARG and args[_DROPOUT_ARG]:
                args = (*args[:_DROPOUT_ARG], 0.0, *args[_DROPOUT_ARG + 1:])
                stripped = True
            elif kwargs.get("dropout_p"):
                kwargs["dropout_p"] = 0.0
                stripped = True
        if not stripped:
            return func(*args, **kwargs)
        self.calls += 1
        self.active += 1
        try:
            return func(*args, **kwargs)
        finally:
            self.active -= 1
