"""Outputs, by shape alone, of ops whose fake kernels need values (issue #22).

CTC loss has no fake kernel that works from shapes: its alpha table is B x T x (2S + 1), S the longest
target, which torch reads from the target lengths' values. The tracer makes such outputs here,
empty tensors of the right shapes (inside fake mode: no storage), so the step traces without the real
values the weight-dependent log-probabilities cannot have. S is the padded targets' width (B x S
targets), or all targets together (1-D concatenated targets: an upper bound).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten


def _longest_target(targets: torch.Tensor, batch: int) -> int:
    return int(targets.shape[-1]) if targets.dim() == 2 else int(targets.numel())


def ctc_loss_outputs(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(negative log likelihood per sample, alpha table) of aten._ctc_loss(log_probs [T, B, C] or
    [T, C], targets, input_lengths, target_lengths, blank, zero_infinity)."""
    log_probs, targets = args[0], args[1]
    steps = int(log_probs.shape[0])
    batch = int(log_probs.shape[1]) if log_probs.dim() == 3 else 1
    width = 2 * _longest_target(targets, batch) + 1
    options = {"dtype": log_probs.dtype, "device": log_probs.device}
    return torch.empty(batch, **options), torch.empty(batch, steps, width, **options)


def ctc_loss_backward_output(args: tuple, kwargs: dict) -> torch.Tensor:
    """The gradient of the log-probabilities: aten._ctc_loss_backward(grad, log_probs, ...)."""
    return torch.empty_like(args[1])


SHAPE_KERNELS: dict[Any, Callable[[tuple, dict], Any]] = {
    aten._ctc_loss: ctc_loss_outputs,
    aten._ctc_loss_backward: ctc_loss_backward_output,
}
"""Op packet -> the outputs it returns, made from its arguments' shapes."""
