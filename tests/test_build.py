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


def test_parameters_made_without_fake_modes_dispatch_are_the_tensors_it_makes() -> None:
    # fake_directly makes a CPU factory's tensor and Parameter's detach as FakeTensorMode does, without its
    # dispatch: the same class, shape, strides, dtype, device, storage and mode; a view shares its storage
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from advisor.profile.build import ValuesLeftUnwritten, fake_directly

    aten = torch.ops.aten

    def described(tensor: torch.Tensor) -> tuple:
        return (type(tensor), tuple(tensor.shape), tensor.stride(), tensor.dtype, tensor.device,
                tensor.untyped_storage().nbytes(), tensor.requires_grad, tensor.fake_mode)

    with FakeTensorMode() as mode:
        cases = [(aten.empty.memory_format, ([3, 4],), {"dtype": torch.bfloat16}),
                 (aten.empty.memory_format, ([2, 3, 4, 5],), {"memory_format": torch.channels_last}),
                 (aten.ones.default, ([7],), {}), (aten.zeros.default, ([2, 2],), {"device": torch.device("cpu")})]
        for func, args, kwargs in cases:
            direct = fake_directly(mode, func, args, kwargs)
            assert direct is not None, func
            assert described(direct(*args, **kwargs)) == described(func(*args, **kwargs)), func
        weight = torch.empty(5, 4)
        detach = fake_directly(mode, aten.detach.default, (weight,), {})
        assert detach is not None
        view = detach(weight)
        assert described(view) == described(aten.detach.default(weight))
        assert view.untyped_storage() is weight.untyped_storage()
        # not made directly: another device, pinned memory, another op, a tensor carrying a constant
        assert fake_directly(mode, aten.empty.memory_format, ([3],), {"device": torch.device("meta")}) is None
        assert fake_directly(mode, aten.empty.memory_format, ([3],), {"pin_memory": True}) is None
        assert fake_directly(mode, aten.add.Tensor, (weight, weight), {}) is None
        known = torch.tensor(3.0)
        assert known.constant is not None and fake_directly(mode, aten.detach.default, (known,), {}) is None
        with ValuesLeftUnwritten(fake_mode=mode):
            linear = nn.Linear(4, 5)
    assert isinstance(linear.weight, FakeTensor) and isinstance(linear.weight, nn.Parameter)
    assert linear.weight.requires_grad and linear.weight.shape == (5, 4) and linear.bias.shape == (5,)


def test_a_build_registers_the_same_storages_with_parameters_made_directly_or_dispatched() -> None:
    # the live-memory tracker sees a Llama layer's weights alike either way: sizes, order, op, category
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from advisor.profile.build import ValuesLeftUnwritten
    from advisor.profile.live_memory import LiveMemoryTracker
    from examples.llama import CONFIG, DecoderLayer

    def storages(direct: bool) -> list[tuple]:
        with FakeTensorMode() as mode, LiveMemoryTracker() as memory:
            with memory.run_by_caller(), ValuesLeftUnwritten(memory, mode if direct else None):
                layer = DecoderLayer(CONFIG)
            memory.open_step()
            found = memory.close_step()
        assert sum(p.numel() for p in layer.parameters()) == 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096
        return [(s.nbytes, s.allocated_at, s.op, s.category) for s in found.storages]

    assert storages(direct=True) == storages(direct=False)
    assert len(storages(direct=True)) == 9  # 7 projections, 2 norms: one storage each
