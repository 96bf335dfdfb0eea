"""Optimizers that published runs' scripts built, written out as those scripts ran them, for the accuracy
rows that trace a step "as its source ran it" (benchmarks/accuracy.py). The tool traces them like a model
file's own `optimizer(params)`: every tensor op they issue is timed, and every value they read back to the
host makes the host wait for the GPU (OpRecord.synchronizes).

DLE_BERT_ADAM: NVIDIA DeepLearningExamples' BERT SQuAD fine-tuning without --fp16 (run_squad.py, the copy in
the NGC pytorch:20.01 and 20.10 containers that Lambda v0 ran: its logs warn from
/workspace/examples/bert/optimization.py:150, `next_m.mul_(beta1).add_(1 - beta1, grad)`):
- run_squad.py's GradientClipper before each step: apex's multi_tensor_l2norm over all gradients, the norm
  read back with `.item()`, the gradients scaled by multi_tensor_scale when it is above 1;
- optimization.py's BertAdam: a Python loop over the parameters; each one's gradient first clipped alone by
  torch.nn.utils.clip_grad_norm_(p, 1.0), which in torch 1.4-1.9 computed the norm on the GPU and tested
  `if clip_coef < 1:` (a read back); then Adam without bias correction in plain tensor ops (next_m, next_v,
  update = next_m / (sqrt(next_v) + eps), + weight decay x p, x lr, p -= ...), each a kernel of its own.
With --fp16 the script builds apex's FusedAdam instead (multi-tensor kernels: accuracy.py times those runs
with torch's foreach AdamW, which runs alike).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

MAX_GRAD_NORM = 1.0
"""run_squad.py's GradientClipper(max_grad_norm=1.0) and BertAdam's default max_grad_norm."""


class DLEBertAdam(torch.optim.Optimizer):
    """run_squad.py's GradientClipper, then optimization.py's BertAdam (see the module docstring). Parameters
    with one dimension (biases, LayerNorm weights) take no weight decay, as run_squad.py groups them."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float = 0.0, b1: float = 0.9, b2: float = 0.999,
                 e: float = 1e-6, weight_decay: float = 0.01, max_grad_norm: float = MAX_GRAD_NORM) -> None:
        decay = [p for p in params if p.dim() > 1]
        no_decay = [p for p in params if p.dim() <= 1]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        super().__init__([g for g in groups if g["params"]],
                         dict(lr=lr, b1=b1, b2=b2, e=e, weight_decay=weight_decay, max_grad_norm=max_grad_norm))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:
        self._clip_all()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["next_m"] = torch.zeros_like(p)
                    state["next_v"] = torch.zeros_like(p)
                next_m, next_v = state["next_m"], state["next_v"]
                if group["max_grad_norm"] > 0:
                    self._clip_one(p, group["max_grad_norm"])
                grad = p.grad
                next_m.mul_(group["b1"]).add_(grad, alpha=1 - group["b1"])
                next_v.mul_(group["b2"]).addcmul_(grad, grad, value=1 - group["b2"])
                update = next_m / (next_v.sqrt() + group["e"])
                if group["weight_decay"] > 0.0:
                    update += group["weight_decay"] * p
                update_with_lr = group["lr"] * update
                p.add_(-update_with_lr)
                state["step"] += 1

    def _clip_all(self) -> None:
        """run_squad.py's GradientClipper.step: one L2 norm over every gradient, read back; a scale if above."""
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        total_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        clip_coef = MAX_GRAD_NORM / (total_norm.item() + 1e-6)
        if clip_coef < 1:
            torch._foreach_mul_(grads, clip_coef)

    @staticmethod
    def _clip_one(p: torch.nn.Parameter, max_norm: float) -> None:
        """torch 1.4-1.9's clip_grad_norm_(p, max_norm) for one parameter: norms stacked and normed on the
        GPU, `if clip_coef < 1:` read back (after the global clip a parameter's norm is at most 1: no scale)."""
        total_norm = torch.norm(torch.stack([torch.norm(p.grad.detach(), 2)]), 2)
        clip_coef = max_norm / (total_norm + 1e-6)
        if clip_coef.item() < 1:
            p.grad.detach().mul_(clip_coef)


PUBLISHED_OPTIMIZERS: dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]] = {
    "dle-bertadam": DLEBertAdam,
}
"""Name (accuracy.py's Case.optimizer) -> the optimizer built from the step's parameters."""
