"""Mamba's selective scan as a GPU runs it: one fused kernel forward and one backward, not a loop per token.

Hugging Face's Mamba, Falcon-Mamba, Jamba and Zamba call a module-level `mamba_selective_scan(u, dt, A, B, C,
D, z, delta_bias, delta_softplus, return_last_state)`: with `mamba_ssm` installed (how Mamba models are trained on
GPUs) it is `selective_scan_fn`, one CUDA kernel over the sequence (SelectiveScanFn); without it, a Python loop
over the tokens, about 14 ops per token and layer, each state of the recurrence (batch x dim x state, fp32)
saved for the backward. Traced as it is, a step of Mamba-130M (batch 2 x 128 tokens, amp-bf16) made 54,960 ops
and held 4,209 MiB at its peak; with the scan fused, 1,944 ops and 2,463 MiB.

Within `fused_selective_scans()` (a GPU target's trace), those modules' `mamba_selective_scan` is `scan` below: the
op `advisor::selective_scan`, whose fake kernel makes what `selective_scan_cuda.fwd` makes (the output in u's
dtype, the gated output where z is given, and the scan's intermediates: batch x dim x chunks of 2,048 tokens
x 2 x state, fp32), and whose backward `advisor::selective_scan_backward` makes the gradients
`selective_scan_cuda.bwd` does, saving what SelectiveScanFn saves (u, delta, A, B, C, D, z, delta_bias, the
intermediates, and the ungated output where z is given). On real tensors (a step run for real) they compute the
recurrence itself. Their FLOPs and bytes are costs.py's `selective_scan_flops`. A CPU target runs the loop, as
a CPU would: its trace is made outside the block.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F

CHUNK_TOKENS = 2048
"""Tokens per chunk of selective_scan_cuda's forward (kChunkSize): it keeps the state at each chunk's end."""

FUSED_SCAN_OPS = ("selective_scan", "selective_scan_backward")
"""The ops' names in a trace's records."""

MODULES = ("mamba", "falcon_mamba", "jamba", "zamba")
"""transformers.models.<name>.modeling_<name> modules whose `mamba_selective_scan` is the scan."""


def chunks(tokens: int) -> int:
    return max(1, math.ceil(tokens / CHUNK_TOKENS))


def _reference(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
               D: torch.Tensor | None, z: torch.Tensor | None, delta_bias: torch.Tensor | None,
               delta_softplus: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence on real tensors (mamba_ssm's selective_scan_ref): (ungated output, last state)."""
    delta = delta.float()
    if delta_bias is not None:
        delta = delta + delta_bias.float()[..., None]
    if delta_softplus:
        delta = F.softplus(delta)
    state = u.new_zeros((u.shape[0], A.shape[0], A.shape[1]), dtype=torch.float32)
    decay = torch.exp(delta[..., None] * A.float()[None, :, None, :])  # b d l n
    drive = delta[..., None] * B.float().transpose(1, 2)[:, None] * u.float()[..., None]
    outputs = []
    for index in range(u.shape[2]):
        state = decay[:, :, index] * state + drive[:, :, index]
        outputs.append(torch.einsum("bdn,bn->bd", state, C.float()[:, :, index]))
    out = torch.stack(outputs, dim=2)
    if D is not None:
        out = out + u.float() * D.float()[:, None]
    return out.to(u.dtype), state


def _gated(out: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """`out` gated by silu(z), in out's dtype (the kernel's out_z)."""
    return (out.float() * F.silu(z.float())).to(out.dtype)


def _selective_scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                    D: torch.Tensor | None, z: torch.Tensor | None, delta_bias: torch.Tensor | None,
                    delta_softplus: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output: gated by silu(z) where z is given, in u's dtype; intermediates: b x d x chunks x 2n, fp32, the
    last chunk's state in its odd entries; the ungated output where z is given, else empty). u, delta, z:
    b x d x l; A: d x n; B, C: b x n x l; D, delta_bias: d."""
    out, state = _reference(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
    intermediates = u.new_zeros((u.shape[0], u.shape[1], chunks(u.shape[2]), 2 * A.shape[1]), dtype=torch.float32)
    intermediates[:, :, -1, 1::2] = state
    if z is None:  # selective_scan_cuda.fwd makes no gated output then
        return out, intermediates, u.new_empty(0)
    return _gated(out, z), intermediates, out


def _selective_scan_fake(u, delta, A, B, C, D, z, delta_bias, delta_softplus):
    intermediates = u.new_empty((u.shape[0], u.shape[1], chunks(u.shape[2]), 2 * A.shape[1]), dtype=torch.float32)
    return torch.empty_like(u), intermediates, torch.empty_like(u) if z is not None else u.new_empty(0)


@contextmanager
def _autograd_on() -> Iterator[None]:
    """Autograd recording within a custom op's kernel, which runs below it (the real backward differentiates the
    recurrence)."""
    with torch.enable_grad(), torch._C._SetExcludeDispatchKeyGuard(torch._C.DispatchKey.AutogradFunctionality, False), \
            torch._C._SetExcludeDispatchKeyGuard(torch._C.DispatchKey.ADInplaceOrView, False):
        yield


def _selective_scan_backward(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                             C: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None,
                             delta_bias: torch.Tensor | None, grad: torch.Tensor, intermediates: torch.Tensor,
                             out: torch.Tensor, delta_softplus: bool) -> list[torch.Tensor]:
    """The gradients of u, delta, A, B, C, D, z and delta_bias (an empty tensor for an input not given)."""
    inputs = [t.detach().requires_grad_() if t is not None else None for t in (u, delta, A, B, C, D, z, delta_bias)]
    given = [t for t in inputs if t is not None]
    with _autograd_on():
        ungated, _ = _reference(*inputs, delta_softplus)
        gated = ungated if z is None else _gated(ungated, inputs[6])
        found = iter(torch.autograd.grad(gated, given, grad, allow_unused=True))
    grads = []
    for tensor in inputs:
        if tensor is None:
            grads.append(u.new_empty(0))
            continue
        gradient = next(found)
        grads.append(torch.zeros_like(tensor) if gradient is None else gradient)
    return grads


def _selective_scan_backward_fake(u, delta, A, B, C, D, z, delta_bias, grad, intermediates, out, delta_softplus):
    return [torch.empty_like(t) if t is not None else u.new_empty(0) for t in (u, delta, A, B, C, D, z, delta_bias)]


def _setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
    u, delta, A, B, C, D, z, delta_bias, delta_softplus = inputs
    _, intermediates, out = output
    ctx.delta_softplus = delta_softplus
    # what SelectiveScanFn saves: the ungated output only where z gates it
    ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, intermediates, out if z is not None else None)


def _backward(ctx: Any, grad: torch.Tensor, *unused: Any) -> tuple:
    u, delta, A, B, C, D, z, delta_bias, intermediates, out = ctx.saved_tensors
    grads = torch.ops.advisor.selective_scan_backward(u, delta, A, B, C, D, z, delta_bias, grad.contiguous(),
                                                      intermediates, out if out is not None else u.new_empty(0),
                                                      ctx.delta_softplus)
    given = (u, delta, A, B, C, D, z, delta_bias)  # an input not given has no gradient
    return (*(gradient if tensor is not None else None for gradient, tensor in zip(grads, given)), None)


@cache
def register_ops() -> None:
    """Define the ops `advisor::selective_scan` and `advisor::selective_scan_backward` (their kernels, fake
    kernels and the forward's autograd) with torch.library, once per process: when a trace first fuses a scan
    (fused_selective_scans, scan), not at import, which every trace pays (about 7 ms)."""
    forward = torch.library.custom_op("advisor::selective_scan", mutates_args=())(_selective_scan)
    forward.register_fake(_selective_scan_fake)
    backward = torch.library.custom_op("advisor::selective_scan_backward", mutates_args=())(_selective_scan_backward)
    backward.register_fake(_selective_scan_backward_fake)
    forward.register_autograd(_backward, setup_context=_setup_context)


def scan(hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
         D: torch.Tensor | None = None, z: torch.Tensor | None = None, delta_bias: torch.Tensor | None = None,
         delta_softplus: bool = False, return_last_state: bool = False, **unused: Any) -> Any:
    """Hugging Face's `mamba_selective_scan`, as selective_scan_fn runs it."""
    register_ops()
    gated, intermediates, _ = torch.ops.advisor.selective_scan(hidden_states, dt, A, B, C, D, z, delta_bias,
                                                               delta_softplus)
    if return_last_state:
        return gated, intermediates[:, :, -1, 1::2]
    return gated


def scan_modules() -> list[Any]:
    """The loaded transformers modules whose `mamba_selective_scan` a trace replaces."""
    found = []
    for name in MODULES:
        module = sys.modules.get(f"transformers.models.{name}.modeling_{name}")
        if module is not None and callable(getattr(module, "mamba_selective_scan", None)):
            found.append(module)
    return found


_patched: dict[Any, Any] = {}
"""Each module whose `mamba_selective_scan` is `scan` now -> its own function."""
_entered = 0
"""fused_selective_scans() blocks running now (the TUI's superseded estimate may still trace beside a new one)."""
_lock = threading.Lock()


@contextmanager
def fused_selective_scans() -> Iterator[None]:
    """Within the block, the loaded Mamba-family modules scan with `scan` (the module docstring); the modules'
    own functions come back when the last block running ends."""
    global _entered
    with _lock:
        _entered += 1
        for module in scan_modules():
            register_ops()
            if module not in _patched:
                _patched[module] = module.mamba_selective_scan
                module.mamba_selective_scan = scan
    try:
        yield
    finally:
        with _lock:
            _entered -= 1
            if not _entered:
                for module, original in _patched.items():
                    module.mamba_selective_scan = original
                _patched.clear()
