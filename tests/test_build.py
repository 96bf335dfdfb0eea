"""Models whose constructors compute with tensor values (issue #22): built on real tensors with their
weights on the meta device, then traced on fake twins, ties kept (advisor/profile/build.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from advisor.errors import UserError
from advisor.profile.build import LARGE_FACTORY_ELEMENTS, fake_twins, weights_on_meta
from advisor.profile.forward import forward_profile
from advisor.profile.trace import trace_training_step


class DropPathStack(nn.Module):
    """timm's way: per-block drop-path rates from torch.linspace(...).tolist(), widths from torch.unique
    (RegNet), a tied output layer, and a buffer computed from values."""

    def __init__(self, depth: int = 4, width: int = 16, vocab: int = 10) -> None:
        super().__init__()
        self.rates = torch.linspace(0, 0.1, depth).tolist()  # needs values: fails on fake tensors
        widths = torch.unique(torch.tensor([width, width, width]))  # dynamic output shape
        hidden = int(widths[0])
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(depth))
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("position", torch.arange(hidden).float() / hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position
        for block, rate in zip(self.blocks, self.rates):
            x = x + torch.relu(block(x)) * (1 - rate)
        return self.head(x)


def tokens(batch: int) -> torch.Tensor:
    return torch.zeros(batch, 8, dtype=torch.long)


# embed 10x16 = 160 (the head shares it) + 4 Linear(16, 16) = 4 * (256 + 16) = 1,088 -> 1,248
PARAMS = 160 + 4 * (16 * 16 + 16)


def test_a_constructor_that_computes_with_values_is_traced_on_meta_weights() -> None:
    trace = trace_training_step(DropPathStack, tokens, 2, "fp32", "adamw", lambda out, _: out.sum())
    assert trace.construction == "meta"
    assert trace.params == PARAMS  # the tie survives: 1,248, not 1,408
    # forward: 4 blocks' addmm of 16 rows (2 x 8 tokens): 2 * 16 * 16 * 16 = 8,192 FLOPs each, and
    # the head 2 * 16 * 10 * 16 = 5,120 -> 37,888 FLOPs of matmuls
    matmuls = sum(r.flops for r in trace.records if r.phase == "forward" and r.matmul)
    assert matmuls == 4 * 8192 + 5120


def test_models_that_build_on_fake_tensors_still_do() -> None:
    trace = trace_training_step(lambda: nn.Linear(4, 4), lambda b: torch.ones(b, 4), 2)
    assert trace.construction == "fake"


def test_weights_go_to_meta_as_they_are_registered_and_small_work_stays_real() -> None:
    with weights_on_meta():
        model = DropPathStack()
        plain = torch.zeros(LARGE_FACTORY_ELEMENTS)  # training size: made on meta, no 64 MiB of zeros
        small = torch.ones(3)
    assert model.rates == pytest.approx([0.0, 0.1 / 3, 0.2 / 3, 0.1])
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert model.position.device.type == "meta"
    assert model.head.weight is model.embed.weight
    assert plain.device.type == "meta" and small.device.type == "cpu"
    assert nn.Module.register_parameter.__name__ == "register_parameter"  # restored on exit


def test_fake_twins_keep_shapes_classes_and_ties() -> None:
    with weights_on_meta():
        model = DropPathStack()
    model.blocks[0].weight.custom_flag = True  # attributes libraries hang on parameters survive
    fake_twins(model, device="cpu")
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert model.head.weight is model.embed.weight
    assert all(isinstance(p, nn.Parameter) for p in model.parameters())
    assert model.blocks[0].weight.custom_flag is True
    assert model.position.shape == (16,)
    assert sum(p.numel() for p in model.parameters()) == PARAMS


def test_a_constructor_that_fails_for_real_blames_the_users_code() -> None:
    def broken() -> nn.Module:
        torch.linspace(0, 1, 3).tolist()
        raise ValueError("depth must be even")

    with pytest.raises(UserError, match=r"build_model\(\) raised ValueError: depth must be even"):
        trace_training_step(broken, tokens, 2)


def test_fvcore_profiles_such_a_model_too() -> None:
    profile = forward_profile(DropPathStack, tokens, 2)
    assert profile.device == "meta"
    # the same matmuls as the trace's forward: 37,888 FLOPs
    assert profile.by_operator["linear"] == 37_888


@pytest.mark.parametrize("precision, convert", [("bf16", False), ("fp16", False), ("fp32", True)])
def test_pure_low_precision_keeps_tied_weights_tied(precision: str, convert: bool) -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 16)
            self.head = nn.Linear(16, 10, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(tokens))

    build = (lambda: Tied().half()) if convert else Tied  # .half() in the model file, or --precision
    trace = trace_training_step(build, tokens, 2, precision, "adamw", lambda out, _: out.float().sum())
    assert trace.params == 10 * 16  # one 10x16 matrix, not two
    # weights: the one matrix in 2-byte floats, 160 * 2 = 320 bytes
    assert trace.memory.total("weights") == 320


def test_initialisers_write_no_values_into_fake_tensors() -> None:
    # nn.Linear(4, 5) runs kaiming_uniform_ and uniform_ (aten.uniform_ twice); nn.LayerNorm ones_/zeros_
    # (aten.fill_); under ValuesLeftUnwritten none of them reaches the modes below it, the allocations do
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from advisor.profile.build import ValuesLeftUnwritten

    class Seen(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    with FakeTensorMode(), Seen() as seen:
        nn.Linear(4, 5), nn.LayerNorm(5)
        assert {"uniform_.default", "fill_.Scalar"} <= set(seen.names)
        seen.names.clear()
        with ValuesLeftUnwritten():
            linear = nn.Linear(4, 5)
            nn.LayerNorm(5)
            known = torch.tensor(3.0)  # a fake tensor with a constant: its write is known, so it is made
            known.fill_(5.0)
    assert "uniform_.default" not in seen.names and seen.names.count("fill_.Scalar") == 1
    assert seen.names.count("empty.memory_format") == 4 and linear.weight.shape == (5, 4)
    assert known.constant is not None and known.constant.item() == 5.0
