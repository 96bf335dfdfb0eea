"""The forward FLOP profile by module and by operator, from fvcore, on the cost registry.

fvcore traces the model's forward with the TorchScript tracer (here on the meta device, so a 7B
model needs no memory) and counts each graph node with a handle. We keep fvcore's own handles for
matrix products and convolutions (fvcore counts one multiply-add as one flop: we multiply by 2)
and give every other aten op a handle backed by the cost registry (costs.py): the op is run on
fake tensors of the node's shapes and the registry's FLOPs are summed over what it dispatches to.
So attention, normalisations, softmax and elementwise ops count here exactly as in the training
trace, and fvcore's matmul/conv formulas stay an independent check of ours.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

with warnings.catch_warnings():  # fvcore calls torch.jit.script at import, which torch deprecates: not the user's concern
    warnings.filterwarnings("ignore", message="`torch.jit.script` is deprecated")
    from fvcore.nn import FlopCountAnalysis
    from fvcore.nn.flop_count import _DEFAULT_SUPPORTED_OPS
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from advisor.errors import UserError
from advisor.profile.costs import op_cost
from advisor.profile.real_run import REAL_RUN_MEMORY_SHARE, gib, real_run_budget_bytes
from advisor.profile.trace import build_on_meta_weights, call_model, fake_tensor_log_silenced
from advisor.profile.torch_patches import grouped_mm_in_any_float
from advisor.profile.user_code import UserCodeError, user_code

FVCORE_MAC_HANDLES = ("aten::addmm", "aten::bmm", "aten::_convolution", "aten::einsum", "aten::matmul", "aten::mm",
                      "aten::linear")
"""fvcore's own handles we keep; they count multiply-adds, converted to FLOPs (x2)."""

FLOPS_PER_MAC = 2

@dataclass(frozen=True)
class ForwardProfile:
    """fvcore's forward profile in FLOPs (2 per multiply-add) with its coverage."""

    total_flops: float
    by_module: dict[str, float]
    """Module path ("" = the whole model) -> FLOPs of its forward, submodules included."""
    by_operator: dict[str, float]
    uncounted_ops: dict[str, int]
    """Ops in the forward that no formula counts, op -> calls (fvcore's unsupported ops and ours)."""
    device: str
    """Where fvcore's trace ran: "meta" (no memory) or "cpu" (real tensors, where meta cannot run)."""
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "total_flops": self.total_flops,
            "by_module": dict(self.by_module),
            "by_operator": dict(self.by_operator),
            "uncounted_ops": dict(self.uncounted_ops),
            "device": self.device,
            "notes": list(self.notes),
        }


class _CostSum(TorchDispatchMode):
    """Sums registry FLOPs of every aten op dispatched under it; remembers ops it cannot count."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0.0
        self.uncounted: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        cost = op_cost(func, args, kwargs, out)
        self.flops += cost.flops
        if not cost.counted:
            self.uncounted.append(func.overloadpacket.__name__)
        return out


class _Unresolved(Exception):
    """A graph value whose content the handle cannot rebuild from the trace."""


def _jit_dtype(value: torch._C.Value) -> torch.dtype:
    dtype = value.type().dtype()
    if dtype is None:
        raise _Unresolved(f"no dtype for {value.debugName()}")
    return dtype


SCALAR_CONVERSIONS = frozenset({"aten::Int", "aten::ScalarImplicit", "aten::Float", "prim::NumToTensor"})
"""Graph nodes that only convert a Python number to or from a 0-d tensor: free, and see-through."""

FREE_KINDS = SCALAR_CONVERSIONS | {"aten::size", "aten::dim", "aten::numel"}

_SCALAR_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "aten::floor_divide": lambda a, b: a // b,
    "aten::mul": lambda a, b: a * b,
    "aten::add": lambda a, b: a + b,
    "aten::sub": lambda a, b: a - b,
    "aten::div": lambda a, b: a / b,
    "aten::remainder": lambda a, b: a % b,
}


def _scalar(value: torch._C.Value) -> Any:
    """The Python number a graph value holds when it is computed from shapes and constants only
    (the tracer records `x.size(0) // heads` as size, NumToTensor, floor_divide, Int)."""
    node = value.node()
    kind = node.kind()
    inputs = list(node.inputs())
    if kind == "prim::Constant":
        return value.toIValue()
    if kind == "aten::size":
        sizes = inputs[0].type().sizes()
        if sizes is None:
            raise _Unresolved("size of an unknown shape")
        return sizes[_scalar(inputs[1])]
    if kind in SCALAR_CONVERSIONS:
        return _scalar(inputs[0])
    if kind in _SCALAR_ARITHMETIC:
        return _SCALAR_ARITHMETIC[kind](_scalar(inputs[0]), _scalar(inputs[1]))
    raise _Unresolved(f"{kind} is not a shape computation")


def _is_shape_arithmetic(value: torch._C.Value) -> bool:
    if value.node().kind() not in _SCALAR_ARITHMETIC:
        return False
    try:
        _scalar(value)
    except _Unresolved:
        return False
    return True


def _rebuild(value: torch._C.Value, fake_mode: FakeTensorMode) -> Any:
    """A graph value as an argument: the number a shape computation gives, a fake CPU tensor of
    its traced shape, or the constant it holds."""
    node = value.node()
    kind = node.kind()
    value_type = value.type()
    if kind in FREE_KINDS or kind in _SCALAR_ARITHMETIC:
        try:
            return _scalar(value)
        except _Unresolved:
            if not isinstance(value_type, torch._C.TensorType):
                raise
    if isinstance(value_type, torch._C.TensorType):
        sizes = value_type.sizes()
        if sizes is None:
            raise _Unresolved(f"no shape for {value.debugName()}")
        with fake_mode:
            return torch.empty(sizes, dtype=_jit_dtype(value))
    if kind == "prim::Constant":
        return value.toIValue()
    if kind == "prim::ListConstruct":
        return [_rebuild(v, fake_mode) for v in node.inputs()]
    raise _Unresolved(f"{kind} value")


def _call_arguments(node: torch._C.Node, fake_mode: FakeTensorMode) -> tuple[Any, tuple, dict]:
    """The aten overload of a graph node and its arguments, keyword-only ones by name."""
    schema_text = node.schema()
    if schema_text == "(no schema)":
        raise _Unresolved(f"{node.kind()} has no schema")
    schema = torch._C.parse_schema(schema_text)
    packet = getattr(torch.ops.aten, schema.name.removeprefix("aten::"))
    overload = getattr(packet, schema.overload_name or "default")
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for argument, value in zip(schema.arguments, node.inputs()):
        rebuilt = _rebuild(value, fake_mode)
        if argument.kwarg_only:
            kwargs[argument.name] = rebuilt
        else:
            args.append(rebuilt)
    return overload, tuple(args), kwargs


class _RegistryHandles:
    """An fvcore handle for any aten op: the registry's FLOPs of the op on fake tensors of the
    traced shapes. Keeps what it could not count, by op."""

    def __init__(self) -> None:
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        self.uncounted: Counter[str] = Counter()

    def __call__(self, inputs: list[torch._C.Value], outputs: list[torch._C.Value]) -> float:
        if not outputs:
            return 0.0
        node = outputs[0].node()
        if node.kind() in FREE_KINDS or _is_shape_arithmetic(outputs[0]):
            return 0.0
        counter = _CostSum()
        try:
            overload, args, kwargs = _call_arguments(node, self.fake_mode)
            with self.fake_mode, counter:
                overload(*args, **kwargs)
        except (_Unresolved, RuntimeError, TypeError, ValueError):  # cannot replay: report it, never guess
            self.uncounted[node.kind().removeprefix("aten::")] += 1
            return 0.0
        for name in counter.uncounted:
            self.uncounted[name] += 1
        return counter.flops


def _mac_handle(fvcore_handle: Callable[..., Any]) -> Callable[..., Any]:
    def handle(inputs: list[torch._C.Value], outputs: list[torch._C.Value]) -> Any:
        count = fvcore_handle(inputs, outputs)
        if isinstance(count, Counter):
            return Counter({k: FLOPS_PER_MAC * v for k, v in count.items()})
        return FLOPS_PER_MAC * count
    return handle


def _all_aten_op_names() -> set[str]:
    return {schema.name for schema in torch._C._jit_get_all_schemas() if schema.name.startswith("aten::")}


class _PositionalCall(torch.nn.Module):
    """Takes the example's tensors as positional arguments (what the TorchScript tracer passes),
    rebuilds the example's structure, calls the model as the trace does, and returns its output
    tensors as a tuple (what the tracer accepts)."""

    def __init__(self, model: torch.nn.Module, rebuild: Callable[[tuple], Any]) -> None:
        super().__init__()
        self.model = model
        self.rebuild = rebuild

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        output = call_model(self.model, self.rebuild(tensors))
        return tuple(t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor))


def _positional(model: torch.nn.Module, inputs: Any) -> tuple[_PositionalCall, tuple[torch.Tensor, ...]]:
    """The wrapper and the tensors to trace it with; non-tensor leaves of the example stay constants."""
    leaves, spec = tree_flatten(inputs)
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    def rebuild(tensors: tuple) -> Any:
        filled = list(leaves)
        for position, tensor in zip(positions, tensors):
            filled[position] = tensor
        return tree_unflatten(filled, spec)

    return _PositionalCall(model, rebuild), tuple(leaves[i] for i in positions)


def _unwrap(name: str) -> str | None:
    """fvcore's module names under the wrapper -> the model's own ("" is the model)."""
    if name == "":
        return None
    if name == "model":
        return ""
    return name.removeprefix("model.")


def _analyse(model: torch.nn.Module, inputs: Any, device: str, source: str | None) -> ForwardProfile:
    wrapper, tensors = _positional(model, inputs)
    analysis = FlopCountAnalysis(wrapper, tensors)
    registry = _RegistryHandles()
    handles: dict[str, Any] = {name: registry for name in _all_aten_op_names()}
    handles.update({name: _mac_handle(_DEFAULT_SUPPORTED_OPS[name]) for name in FVCORE_MAC_HANDLES})
    analysis.set_op_handle(**handles)
    analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    with user_code("the model's forward (fvcore trace)", source), warnings.catch_warnings(), \
            fake_tensor_log_silenced(), grouped_mm_in_any_float():
        warnings.simplefilter("ignore")
        with contextlib.redirect_stdout(io.StringIO()):
            by_module_raw = analysis.by_module()
    by_module = {name: float(v) for k, v in by_module_raw.items() if (name := _unwrap(k)) is not None}
    uncounted = Counter(registry.uncounted)
    for op, calls in analysis.unsupported_ops().items():
        uncounted[op] += calls
    return ForwardProfile(
        total_flops=float(analysis.total()),
        by_module=by_module,
        by_operator={k: float(v) for k, v in analysis.by_operator().items()},
        uncounted_ops=dict(uncounted),
        device=device,
    )


def _build(build_model: Callable[[], torch.nn.Module], example_input: Callable[[int], Any], batch_size: int,
           source: str | None) -> tuple[torch.nn.Module, Any]:
    """The user's model in training mode and its example input, on the current default device."""
    with user_code("build_model()", source):
        model = build_model()
    with user_code(f"example_input({batch_size})", source):
        inputs = example_input(batch_size)
    model.train()
    return model, inputs


def _build_on_meta(build_model: Callable[[], torch.nn.Module], example_input: Callable[[int], Any],
                   batch_size: int, source: str | None) -> tuple[torch.nn.Module, Any]:
    """The model and its input on the meta device: built under torch.device("meta"), or, when its
    constructor computes with tensor values there (timm's drop-path rates), on real tensors with its
    weights moved to the meta device as they are registered (trace.build_on_meta_weights, as the trace
    builds it; lazy modules take their shapes there)."""
    try:
        with torch.device("meta"):
            return _build(build_model, example_input, batch_size, source)
    except UserCodeError:
        model = build_on_meta_weights(build_model, example_input, batch_size, source)
        with user_code(f"example_input({batch_size})", source), torch.device("meta"):
            inputs = example_input(batch_size)
        model.train()
        return model, inputs


def forward_profile(build_model: Callable[[], torch.nn.Module], example_input: Callable[[int], Any],
                    batch_size: int, source: str | None = None,
                    forward_bytes: int | None = None) -> ForwardProfile:
    """fvcore's forward profile of the model at this batch size, in training mode.

    Runs on the meta device. Where that fails (torch's meta convolution cannot run under the
    TorchScript tracer; models that read their input values) it runs on real CPU tensors without
    autograd, if the weights and `forward_bytes` (what the forward writes, from the trace) fit in
    real_run.py's share of the available memory; otherwise it raises a UserError that says so."""
    model, inputs = _build_on_meta(build_model, example_input, batch_size, source)
    try:
        return _analyse(model, inputs, "meta", source)
    except UserError as meta_error:
        reason = meta_error.sentence if isinstance(meta_error, UserCodeError) else str(meta_error)
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    needed = parameter_bytes + (forward_bytes or 0)
    budget = real_run_budget_bytes()
    if needed > budget:
        raise UserError(
            f"fvcore could not trace the model on the meta device ({reason}) and real tensors would need "
            f"about {gib(needed)}, over 1/{REAL_RUN_MEMORY_SHARE} of the available memory ({gib(budget)})"
        )
    model, inputs = _build(build_model, example_input, batch_size, source)
    with torch.no_grad():
        profile = _analyse(model, inputs, "cpu", source)
    return dataclasses.replace(profile, notes=(f"traced on real CPU tensors: on the meta device, {reason}",))
