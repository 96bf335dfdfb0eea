"""`profile_model`: the training-step trace and fvcore's forward profile of one model file,
summarised by module and by op, with coverage."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from advisor.errors import UserError
from advisor.profile.adapters import Adaptation
from advisor.profile.coverage import coverage_of
from advisor.profile.forward import ForwardProfile, forward_profile
from advisor.profile.model_file import ModelFile
from advisor.profile.trace import OUTSIDE_MODEL, PHASES, StepTrace, trace_training_step



@dataclass(frozen=True)
class ModuleRow:
    """One module: its parameters, forward FLOPs (trace and fvcore) and train-step FLOPs, submodules included."""

    name: str
    """Attribute path from the model ("" is the whole model; "(loss)", "(optimizer)" are outside it)."""
    depth: int
    params: int
    forward_flops: float
    fvcore_forward_flops: float | None
    train_flops: float
    """Forward + backward (+ optimizer for the "(optimizer)" row) FLOPs in the traced step."""
    forward_bytes_written: int
    """Bytes of the tensors its forward ops write (activations and temporaries, before any are freed)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "depth": self.depth,
            "params": self.params,
            "forward_flops": self.forward_flops,
            "fvcore_forward_flops": self.fvcore_forward_flops,
            "train_flops": self.train_flops,
            "forward_bytes_written": self.forward_bytes_written,
        }


@dataclass(frozen=True)
class OpSummary:
    """One aten op over the whole step: calls, FLOPs, bytes and whether it can use tensor cores."""

    op: str
    calls: int
    flops: float
    bytes_moved: int
    matmul: bool
    phases: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "calls": self.calls, "flops": self.flops, "bytes": self.bytes_moved,
                "tensor_cores": self.matmul, "phases": list(self.phases)}


@dataclass(frozen=True)
class ModelProfile:
    """Everything `advisor profile` shows. FLOPs are 2 per multiply-add; bytes as ops read and write them."""

    model: ModelFile = field(repr=False)
    trace: StepTrace = field(repr=False)
    forward: ForwardProfile | None
    forward_error: str | None
    """Why fvcore's forward profile could not be made (None when it was, or was not asked for)."""
    trace_seconds: float
    forward_seconds: float | None

    @property
    def batch_size(self) -> int:
        return self.trace.batch_size

    @property
    def params(self) -> int:
        return self.trace.params

    @property
    def forward_flops(self) -> float:
        """The model's forward FLOPs at this batch size (the loss left out)."""
        return self.trace.model_forward_flops()

    @property
    def train_step_flops(self) -> float:
        return self.trace.flops()

    def fvcore_agreement(self) -> float | None:
        """fvcore's forward total over the trace's, minus 1 (0.0 = equal)."""
        if self.forward is None or not self.forward_flops:
            return None
        return self.forward.total_flops / self.forward_flops - 1.0

    def modules(self, max_depth: int = 2) -> list[ModuleRow]:
        """Modules down to `max_depth` (the model is depth 0), in the order the step first reaches
        them, then the loss and optimizer rows."""
        forward: Counter[str] = Counter()
        train: Counter[str] = Counter()
        written: Counter[str] = Counter()
        order: dict[str, None] = {"": None}
        for record in self.trace.records:
            for name in _ancestors(record.module, max_depth):
                order.setdefault(name, None)
                train[name] += record.flops
                if record.phase == "forward":
                    forward[name] += record.flops
                    written[name] += record.bytes_written
        params = self.trace.params_by_module
        fvcore = self.forward.by_module if self.forward else {}
        return [
            ModuleRow(name, _depth(name), params.get(name, 0), forward[name],
                      fvcore.get(name) if self.forward and name not in OUTSIDE_MODEL.values() else None,
                      train[name], written[name])
            for name in sorted(order, key=lambda n: n in OUTSIDE_MODEL.values())
        ]

    def ops(self) -> list[OpSummary]:
        """Every op of the step, most FLOPs first."""
        calls: Counter[str] = Counter()
        flops: Counter[str] = Counter()
        moved: Counter[str] = Counter()
        matmul: dict[str, bool] = {}
        phases: dict[str, dict[str, None]] = {}
        for r in self.trace.records:
            calls[r.op] += 1
            flops[r.op] += r.flops
            moved[r.op] += r.bytes_read + r.bytes_written
            matmul[r.op] = matmul.get(r.op, False) or r.matmul
            phases.setdefault(r.op, {})[r.phase] = None
        summaries = [OpSummary(op, calls[op], flops[op], moved[op], matmul[op], tuple(phases[op])) for op in calls]
        return sorted(summaries, key=lambda s: (-s.flops, -s.bytes_moved, s.op))

    def top_ops(self, by: str, count: int = 10) -> list[OpSummary]:
        """The `count` ops with the most FLOPs (by="flops") or bytes (by="bytes")."""
        assert by in ("flops", "bytes"), by
        key = (lambda s: (-s.flops, s.op)) if by == "flops" else (lambda s: (-s.bytes_moved, s.op))
        return sorted(self.ops(), key=key)[:count]

    def coverage(self) -> dict[str, Any]:
        """Which ops no formula counts: in the trace (whole step) and in fvcore's forward profile."""
        trace = coverage_of(self.trace)
        return {
            "trace_ops": trace.ops,
            "trace_uncounted_ops": trace.uncounted,
            "trace_counted_fraction": trace.counted_fraction,
            "fvcore_uncounted_ops": dict(self.forward.uncounted_ops) if self.forward else None,
        }

    def to_dict(self, max_depth: int = 2, top: int = 10) -> dict[str, Any]:
        return {
            "model": {"name": self.model.name, "path": str(self.model.path), "builtin": self.model.builtin,
                      "sample_unit": self.model.sample_unit, "params": self.params,
                      "forward_flops": self.forward_flops, "train_step_flops": self.train_step_flops},
            "settings": {"batch_size": self.batch_size, "precision": self.trace.precision,
                         "optimizer": self.trace.optimizer},
            "flop_convention": "2 FLOPs per multiply-add",
            "flops": {phase: self.trace.flops(phase) for phase in PHASES} | {"total": self.train_step_flops},
            "bytes": {phase: self.trace.bytes_moved(phase) for phase in PHASES} | {"total": self.trace.bytes_moved()},
            "trace": {"values": self.trace.values, "construction": self.trace.construction,
                      "assumed_finite": self.trace.assumed_finite, "data_dependent_ops": dict(self.trace.data_dependent_ops),
                      "ops": len(self.trace.records), "seconds": self.trace_seconds},
            "fvcore": (self.forward.to_dict() | {"seconds": self.forward_seconds,
                                                 "agreement_with_trace": self.fvcore_agreement()})
            if self.forward else {"error": self.forward_error},
            "modules": [row.to_dict() for row in self.modules(max_depth)],
            "top_ops_by_flops": [s.to_dict() for s in self.top_ops("flops", top)],
            "top_ops_by_bytes": [s.to_dict() for s in self.top_ops("bytes", top)],
            "coverage": self.coverage(),
        }


def _depth(name: str) -> int:
    """0 for the model, 1 for its children and the rows outside it, +1 per level below."""
    if name == "":
        return 0
    return 1 if name in OUTSIDE_MODEL.values() else name.count(".") + 1


def _ancestors(module: str, max_depth: int) -> list[str]:
    """The module and its ancestors down to `max_depth`: "a.b.c" -> "", "a", "a.b" (depth 2)."""
    if module in OUTSIDE_MODEL.values():
        return [module]
    if module == "":
        return [""]
    parts = module.split(".")
    return [""] + [".".join(parts[:i]) for i in range(1, min(len(parts), max_depth) + 1)]


def profile_model(model: ModelFile, batch_size: int | None = None, precision: str = "fp32",
                  optimizer: str = "adamw", with_fvcore: bool = True, timeout_s: float | None = None,
                  progress: Callable[[str], None] | None = None, adaptation: Adaptation | None = None) -> ModelProfile:
    """Trace one training step of the model file and, unless `with_fvcore` is False, make
    fvcore's forward profile of the same batch. `timeout_s`, `progress` and `adaptation`:
    trace_training_step's."""
    batch = batch_size if batch_size is not None else model.default_batch_size
    started = time.perf_counter()
    trace = trace_training_step(model.build_model, model.example_input, batch, precision, optimizer,
                                model.loss_fn, model.source, timeout_s=timeout_s, progress=progress,
                                build_optimizer=model.optimizer, adaptation=adaptation)
    trace_seconds = time.perf_counter() - started
    forward = forward_error = forward_seconds = None
    if with_fvcore:
        started = time.perf_counter()
        try:
            forward = forward_profile(model.build_model, model.example_input, batch, model.source,
                                      trace.bytes_written("forward"))
        except UserError as exc:  # the trace succeeded; say why fvcore could not, keep the rest
            forward_error = str(exc)
        forward_seconds = time.perf_counter() - started
    return ModelProfile(model, trace, forward, forward_error, trace_seconds, forward_seconds)
