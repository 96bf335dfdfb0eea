"""Build a user's model without storage for its weights, even when its constructor computes with tensors.

The tracer builds models inside FakeTensorMode: parameters get shapes and no storage. Constructors that
compute a small value for real fail there: timm's `torch.linspace(0, rate, depth).tolist()` (drop-path
rates of ViT, ConvNeXt, Swin), RegNet's `torch.unique`, `trunc_normal_` on torch 2.15 (HF ViT,
torchvision Inception), all of which need values a fake tensor does not have (issue #22).

Such a model is built the way accelerate's `init_empty_weights(include_buffers=True)` and torch's meta
device build large models: the constructor runs on real CPU tensors, so its small computations have
values, while every parameter and buffer moves to the meta device the moment it is registered (no
storage; initialisers such as `normal_` cost nothing there), and factory calls of training size
(LARGE_FACTORY_ELEMENTS and up) are made on the meta device directly. The tracer then gives each meta
parameter and buffer a fake twin (`fake_twins`), keeping tied weights tied.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, in_kernel_invocation_manager
from torch.nn.parameter import UninitializedTensorMixin
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

if TYPE_CHECKING:
    from advisor.profile.live_memory import LiveMemoryTracker

from advisor.profile.torch_patches import registration_hooks

LARGE_FACTORY_ELEMENTS = 1 << 24
"""A tensor factory call (`torch.zeros`, `randn`, ...) of at least this many elements (64 MiB of fp32)
is made on the meta device even outside a parameter: a constructor's own computations are small."""

_FACTORIES = frozenset({torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.randint})


def _requested_elements(func: Callable, args: tuple, kwargs: dict) -> int:
    """Elements a factory call asks for: its size, given as ints or as one sequence (randint's size
    comes after its bounds; `full` has a fill value after it)."""
    size = kwargs.get("size")
    if size is None:
        if func is torch.randint:
            size = next((a for a in args if isinstance(a, (tuple, list, torch.Size))), None)
        elif args and isinstance(args[0], (tuple, list, torch.Size)):
            size = args[0]
        else:
            size = [a for a in args if isinstance(a, int) and not isinstance(a, bool)] if func is not torch.full else ()
    try:
        return math.prod(int(s) for s in size) if size is not None else 0
    except (TypeError, ValueError):
        return 0


class _LargeFactoriesOnMeta(TorchFunctionMode):
    """Factory calls of LARGE_FACTORY_ELEMENTS or more without a device are made on the meta device."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func in _FACTORIES and kwargs.get("device") is None and _requested_elements(func, args, kwargs) >= LARGE_FACTORY_ELEMENTS:
            kwargs["device"] = "meta"
        return func(*args, **kwargs)


def _to_meta_parameter(param: torch.nn.Parameter) -> torch.nn.Parameter:
    """`param` on the meta device, of its own class and attributes; a parameter already there is kept
    as it is (the same object: `decoder.weight = embed.weight` ties stay ties). A lazy module's
    uninitialised parameter is made again on the meta device, where its first forward will give it
    a shape."""
    if param.device.type == "meta":
        return param
    if isinstance(param, UninitializedTensorMixin):
        return type(param)(requires_grad=param.requires_grad, device="meta", dtype=param.dtype)
    attributes = dict(param.__dict__)
    moved = type(param)(param.detach().to("meta"), requires_grad=param.requires_grad)
    moved.__dict__.update(attributes)
    return moved


@contextmanager
def weights_on_meta() -> Iterator[None]:
    """Every parameter and buffer registered meanwhile moves to the meta device as it is registered;
    large factory calls are made there too (see the module docstring)."""
    def parameter_to_meta(module: torch.nn.Module, name: str) -> None:
        module._parameters[name] = _to_meta_parameter(module._parameters[name])

    def buffer_to_meta(module: torch.nn.Module, name: str) -> None:
        tensor = module._buffers[name]
        assert tensor is not None
        if isinstance(tensor, UninitializedTensorMixin):
            module._buffers[name] = type(tensor)(requires_grad=False, device="meta", dtype=tensor.dtype)
        else:
            module._buffers[name] = tensor.to("meta")

    with registration_hooks(parameter_to_meta, buffer_to_meta), _LargeFactoriesOnMeta():
        yield


VALUE_ONLY_WRITES = frozenset({
    torch.ops.aten.normal_.default, torch.ops.aten.uniform_.default, torch.ops.aten.fill_.Scalar,
    torch.ops.aten.zero_.default, torch.ops.aten.random_.default, getattr(torch.ops.aten.random_, "from"),
    torch.ops.aten.random_.to, torch.ops.aten.exponential_.default, torch.ops.aten.log_normal_.default,
    torch.ops.aten.cauchy_.default, torch.ops.aten.geometric_.default, torch.ops.aten.bernoulli_.float,
})
"""In-place ops that write values and nothing else: no shape, no storage, no dtype changes."""


class ValuesLeftUnwritten(TorchDispatchMode):
    """Within it, initialisers' writes of values into fake tensors (`normal_`, `uniform_`, `fill_`,
    `zero_`: what nn.init and Hugging Face's _init_weights run on every parameter) return the tensor
    untouched: a fake tensor has no values to write, and the fake-tensor and memory modes below would
    each handle the call for nothing (a fifth of building Llama-3-70B's 80 layers). A fake tensor that
    carries a constant (made from a Python number) is written as usual: its value is known. With `memory`
    (a LiveMemoryTracker taken off the dispatch stack: run_by_caller), the other ops go on through it.

    With `fake_mode` (the FakeTensorMode beneath), the ops that make a model's parameters (`empty`, `ones`,
    `zeros` on the CPU, and Parameter's `detach`) are made as that mode makes them (fake_directly), without
    its general dispatch: a third of the time it took for each (Llama-3-70B's build makes 1,450 of them)."""

    def __init__(self, memory: LiveMemoryTracker | None = None, fake_mode: FakeTensorMode | None = None) -> None:
        super().__init__()
        self.memory = memory
        self.fake_mode = fake_mode

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func in VALUE_ONLY_WRITES and isinstance(args[0], FakeTensor) and args[0].constant is None:
            return args[0]
        kwargs = kwargs or {}
        direct = None if self.fake_mode is None else fake_directly(self.fake_mode, func, args, kwargs)
        if self.memory is not None:
            return self.memory.run(func, args, kwargs, direct)
        return (direct or func)(*args, **kwargs)


CPU_FACTORIES = frozenset({torch.ops.aten.empty.memory_format, torch.ops.aten.ones.default,
                           torch.ops.aten.zeros.default})
"""Factories fake_directly makes: a parameter's storage (`empty`), a norm's weight (`ones`), a bias (`zeros`)."""


def fake_directly(fake_mode: FakeTensorMode, func: Any, args: tuple, kwargs: dict) -> Callable[..., Any] | None:
    """What makes `func(*args, **kwargs)` the way `fake_mode` does it, for a CPU factory of CPU_FACTORIES or the
    `detach` of one of its tensors, without its dispatch (its constructors' and view ops' path: the op run on
    the meta device in its kernel invocation, the result wrapped in a FakeTensor of the op's device); None for
    every other op (the mode dispatches it)."""
    if func in CPU_FACTORIES:
        device = kwargs.get("device")
        if (device is not None and torch.device(device).type != "cpu") or kwargs.get("pin_memory") or \
                kwargs.get("layout") not in (None, torch.strided):
            return None
        return lambda *args, **kwargs: _fake_factory(fake_mode, func, args, kwargs)
    if func is torch.ops.aten.detach.default and type(args[0]) is FakeTensor and args[0].fake_mode is fake_mode \
            and args[0].constant is None:
        return lambda tensor: _fake_view(fake_mode, func, tensor)
    return None


def _fake_factory(fake_mode: FakeTensorMode, func: Any, args: tuple, kwargs: dict) -> FakeTensor:
    with in_kernel_invocation_manager(fake_mode):
        made = func(*args, **(kwargs | {"device": torch.device("meta")}))
    return FakeTensor(fake_mode, made, torch.device("cpu"))


def _fake_view(fake_mode: FakeTensorMode, func: Any, tensor: FakeTensor) -> FakeTensor:
    with in_kernel_invocation_manager(fake_mode):
        viewed = func(tensor)
    return FakeTensor(fake_mode, viewed, tensor.fake_device)


def fake_twins(model: torch.nn.Module, device: str = "cpu") -> None:
    """Replace every parameter and buffer of `model` by a tensor of the same shape, strides, dtype and
    class made on `device` (call it inside FakeTensorMode: a fake tensor). A tensor registered in several
    modules gets one twin, registered in all of them. (Lazy modules' parameters must have their shapes
    by now: the tracer runs their first forward on meta inputs before.)"""
    twins: dict[int, torch.Tensor] = {}

    def twin(tensor: torch.Tensor) -> torch.Tensor:
        found = twins.get(id(tensor))
        if found is None:
            data = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device=device)
            if isinstance(tensor, torch.nn.Parameter):
                found = type(tensor)(data, requires_grad=tensor.requires_grad)
                found.__dict__.update(tensor.__dict__)
            else:
                found = data
            twins[id(tensor)] = found
        return found

    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None and not isinstance(param, UninitializedTensorMixin):
                module._parameters[name] = twin(param)
        for name, buffer in module._buffers.items():
            if buffer is not None and not isinstance(buffer, UninitializedTensorMixin):
                module._buffers[name] = twin(buffer)
