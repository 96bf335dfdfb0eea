"""Ops and modules that need more than a FLOP formula (issue #22): lazy modules, sparse gradients,
CTC loss (outputs from shapes alone, advisor/profile/shapes.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from advisor.errors import UserError
from advisor.profile.trace import trace_training_step


def test_lazy_modules_take_their_shapes_from_the_first_input() -> None:
    def build() -> nn.Module:
        return nn.Sequential(nn.LazyLinear(64), nn.ReLU(), nn.Linear(64, 10))

    trace = trace_training_step(build, lambda b: torch.randn(b, 32), 4)
    # LazyLinear(32 -> 64): 32 * 64 + 64 = 2,112; Linear(64, 10): 650 -> 2,762
    assert trace.params == 2762 and trace.construction == "meta"
    # forward addmm 4x32 @ 32x64: 2 * 4 * 64 * 32 = 16,384 FLOPs
    assert [r.flops for r in trace.records if r.phase == "forward" and r.matmul][0] == 16_384


class Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(100, 8, mode="sum", sparse=True)
        self.fc = nn.Linear(8, 1)

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        return self.fc(self.bag(indices))


def _indices(batch: int) -> torch.Tensor:
    return torch.zeros(batch, 5, dtype=torch.long)


def test_sparse_gradients_are_traced_with_sgd() -> None:
    trace = trace_training_step(Bag, _indices, 2, "fp32", "sgd", lambda out, _: out.sum())
    (bag,) = [r for r in trace.records if r.op == "_embedding_bag"]
    assert bag.flops == 2 * 5 * 8  # 10 gathered rows of 8, one add per element
    assert trace.uncounted() == {}


def test_sparse_gradients_with_adam_are_one_sentence() -> None:
    with pytest.raises(UserError, match="makes sparse gradients .* adamw does not accept; use --optimizer sgd"):
        trace_training_step(Bag, _indices, 2, "fp32", "adamw", lambda out, _: out.sum())


class Recognizer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(40, 29)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.fc(frames).log_softmax(-1)


def _frames(batch: int) -> torch.Tensor:
    return torch.randn(50, batch, 40)


def _ctc(log_probs: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
    batch = log_probs.shape[1]
    targets = torch.ones(batch, 10, dtype=torch.long)
    lengths = torch.full((batch,), 50, dtype=torch.long), torch.full((batch,), 10, dtype=torch.long)
    return F.ctc_loss(log_probs, targets, *lengths)


def test_ctc_loss_is_traced_from_shapes() -> None:
    trace = trace_training_step(Recognizer, _frames, 2, "fp32", "sgd", _ctc)
    assert trace.values == "fake"  # not mistaken for weight-dependent control flow
    (forward,) = [r for r in trace.records if r.op == "_ctc_loss"]
    (backward,) = [r for r in trace.records if r.op == "_ctc_loss_backward"]
    # alpha table 2 x 50 x (2 * 10 + 1) = 2,100 cells, 10 FLOPs each
    assert forward.flops == 21_000
    assert 2 * 50 * 21 * 4 in forward.allocated  # the alpha table, fp32
    # beta and the gradient: 2 * 21,000 + 2 * (50 * 2 * 29 = 2,900 log-probabilities) = 47,800
    assert backward.flops == 47_800


class SelfChecking(nn.Module):
    """DETR's and T5's checks of their own activations."""

    def __init__(self, weight_branch: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.weight_branch = weight_branch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if not torch.isfinite(h).all():
            raise ValueError("non-finite activations")
        if torch.isinf(h).any():
            h = h.clamp(-1e4, 1e4)
        if self.weight_branch and h.sum() > 0:  # a real value of the weights: still refused
            h = h * 2
        return h


def test_checks_for_inf_and_nan_are_answered_as_finite() -> None:
    trace = trace_training_step(SelfChecking, lambda b: torch.randn(b, 8), 2)
    assert trace.assumed_finite == 2 and trace.values == "fake"
    # each answer is a value a real step reads back to the host (it waits for the device there)
    assert [(r.phase, r.op) for r in trace.records if r.synchronizes] == [("forward", "_local_scalar_dense")] * 2
    assert not any(r.op == "clamp" for r in trace.records)  # isinf(...).any() is False: no clamp
    real = trace_training_step(lambda: SelfChecking(weight_branch=True), lambda b: torch.randn(b, 8), 2)
    assert real.values == "real" and real.assumed_finite == 0  # run for real: real values answer every check
