"""Trace one training step (forward, loss, backward, optimizer step) on fake tensors.

The model is built inside torch's FakeTensorMode, so parameters and activations have shapes and
dtypes but no storage: a 7B model costs no real memory. Every aten op is recorded through a
TorchDispatchMode with its phase, module, FLOPs and bytes from the cost registry (costs.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.module_tracker import ModuleTracker

from advisor.errors import UserError
from advisor.profile.costs import op_cost

PRECISIONS = ("fp32", "tf32", "amp-fp16", "amp-bf16", "bf16", "fp16")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
PHASES = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class OpRecord:
    """One aten op of the step. FLOPs count 2 per multiply-add; bytes as read and written."""

    phase: str
    module: str
    op: str
    flops: float
    bytes_read: int
    bytes_written: int
    dtypes: tuple[str, ...]
    matmul: bool
    counted: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

@dataclass(frozen=True)
class StepTrace:
    """All ops of one training step with the settings that produced it."""

    batch_size: int
    precision: str
    optimizer: str
    params: int
    records: tuple[OpRecord, ...] = field(repr=False)

    def flops(self, phase: str | None = None) -> float:
        """Total FLOPs of the step, or of one phase."""
        return sum(r.flops for r in self.records if phase is None or r.phase == phase)

    def bytes_moved(self, phase: str | None = None) -> int:
        return sum(r.bytes_read + r.bytes_written for r in self.records if phase is None or r.phase == phase)

    def uncounted(self) -> dict[str, int]:
        """Ops with no FLOP formula, op name -> calls."""
        counts: dict[str, int] = {}
        for record in self.records:
            if not record.counted:
                counts[record.op] = counts.get(record.op, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "precision": self.precision,
            "optimizer": self.optimizer,
            "params": self.params,
            "flops": {phase: self.flops(phase) for phase in PHASES} | {"total": self.flops()},
            "bytes": {phase: self.bytes_moved(phase) for phase in PHASES} | {"total": self.bytes_moved()},
            "uncounted_ops": self.uncounted(),
            "ops": [r.to_dict() for r in self.records],
        }


class _Recorder(TorchDispatchMode):
    """Records every aten op with the current phase and innermost module."""

    def __init__(self, tracker: ModuleTracker) -> None:
        super().__init__()
        self.tracker = tracker
        self.phase = "forward"
        self.records: list[OpRecord] = []

    def _module(self) -> str:
        names = [name for name in self.tracker.parents if name != "Global"]
        return max(names, key=lambda n: n.count("."), default="")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        cost = op_cost(func, args, kwargs, out)
        if cost.flops or cost.bytes_read or cost.bytes_written or not cost.counted:
            dtypes = tuple(
                sorted({str(t.dtype).removeprefix("torch.") for t in tree_flatten((args, kwargs))[0]
                        if isinstance(t, torch.Tensor)})
            )
            self.records.append(
                OpRecord(self.phase, self._module(), func.overloadpacket.__name__, cost.flops, cost.bytes_read,
                         cost.bytes_written, dtypes, cost.matmul, cost.counted)
            )
        return out


def default_loss(output: Any, inputs: Any) -> torch.Tensor:
    """A scalar reduction of the output(s): the mean of every floating-point output tensor, summed."""
    tensors = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not tensors:
        raise UserError("the model's output has no floating-point tensor to build a loss from; define loss_fn")
    return sum(t.float().mean() for t in tensors)


def make_optimizer(name: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer `name` with torch's default implementation for its settings."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01)
    if name == "momentum":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params)
    if name == "adamw":
        return torch.optim.AdamW(params)
    raise UserError(f"unknown optimizer '{name}'; choose one of {', '.join(OPTIMIZERS)}")


def _cast_inputs(inputs: Any, dtype: torch.dtype) -> Any:
    return tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, inputs)


def _convert_floating_point(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast floating-point parameters and buffers to `dtype` in place. (`Module.to` cannot swap
    fake parameters: they carry weak references.)"""
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None and param.is_floating_point():
                module._parameters[name] = torch.nn.Parameter(param.detach().to(dtype), param.requires_grad)
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.is_floating_point():
                module._buffers[name] = buffer.to(dtype)


def _call(model: torch.nn.Module, inputs: Any) -> Any:
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def trace_training_step(
    build_model: Callable[[], torch.nn.Module],
    example_input: Callable[[int], Any],
    batch_size: int,
    precision: str = "fp32",
    optimizer: str = "adamw",
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
) -> StepTrace:
    """Build the model on fake tensors and trace one full training step."""
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision '{precision}'; choose one of {', '.join(PRECISIONS)}")
    if batch_size < 1:
        raise UserError(f"batch size must be at least 1, got {batch_size}")
    loss_fn = loss_fn or default_loss
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = build_model()
        inputs = example_input(batch_size)
        if precision in ("bf16", "fp16"):
            dtype = torch.bfloat16 if precision == "bf16" else torch.float16
            _convert_floating_point(model, dtype)
            inputs = _cast_inputs(inputs, dtype)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = make_optimizer(optimizer, params)
        tracker = ModuleTracker()
        recorder = _Recorder(tracker)
        autocast_dtype = {"amp-fp16": torch.float16, "amp-bf16": torch.bfloat16}.get(precision)
        with tracker, recorder:
            with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
                loss = loss_fn(_call(model, inputs), inputs)
            recorder.phase = "backward"
            loss.backward()
            recorder.phase = "optimizer"
            opt.step()
            opt.zero_grad(set_to_none=True)
    return StepTrace(batch_size, precision, optimizer, sum(p.numel() for p in params), tuple(recorder.records))
