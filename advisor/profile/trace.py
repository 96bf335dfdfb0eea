"""Trace one training step (forward, loss, backward, optimizer step) on fake tensors.

The model is built inside torch's FakeTensorMode, so parameters and activations have shapes and
dtypes but no storage: a 7B model costs no real memory. Every aten op is recorded through a
TorchDispatchMode with its phase, module, FLOPs and bytes from the cost registry (costs.py).

Models that look at the values of their inputs (`mask.all()`, `.item()`, `nonzero`, as Hugging
Face models and detection heads do) cannot run on values-free fake tensors. For them the step is
traced again with real inputs, and every small tensor computed from inputs alone (no weights) is
also computed for real beside its fake twin; a data-dependent op then gets its real answer. Models
that branch on values computed from their weights (detection heads, Hungarian matching) run the
step for real on this CPU with freshly initialised weights (real_run.py). The trace says which way
it was taken (`values`: "fake", "fake+real-inputs" or "real"). Every trace draws its random numbers
from one seed, so a model that reads them (layerdrop, SpecAugment) traces the same step every time.
"""

from __future__ import annotations

import importlib
import itertools
import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
import torch.utils.checkpoint
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten
from torch.utils.module_tracker import ModuleTracker
from torch.utils.weak import WeakTensorKeyDictionary

from advisor.errors import UserError
from advisor.process import collector_paused, signals_deferred
from advisor.profile.choices import FILE_OPTIMIZER, OPTIMIZERS, PRECISION_TABLE, PRECISIONS, precision_of
from advisor.profile.adapters import Adaptation, adapt
from advisor.profile.attention import ATTENTION_PATHS, FusedAttentionDropout
from advisor.profile.background import CHILD_GRACE_S, ForkedCall, Served, backward_runs_here, can_fork
from advisor.profile.build import ValuesLeftUnwritten, fake_twins, weights_on_meta
from advisor.profile.cuda_autocast import cuda_autocast_policy
from advisor.profile.selective_scan import FUSED_SCAN_OPS, fused_selective_scans
from advisor.profile.costs import SDPA_KERNELS, ConvGeometry, NormGeometry, named_arguments, op_cost
from advisor.profile.dataflow import Dataflow, Flow
from advisor.profile.engine_sums import EngineSums
from advisor.profile.finite import FiniteActivations
from advisor.profile.live_memory import LiveMemory, LiveMemoryTracker
from advisor.profile.master_weights import MasterWeights
from advisor.profile.repeated import (
    MIN_SAVED_BY_A_RETRY,
    BlockClock,
    NotRepeated,
    OptimizerReplicas,
    Run,
    expand_memory,
    expand_records,
    find_runs,
    held_out_ids,
    held_out_parameters,
    locate,
    shortened,
    template_multiplicity,
    tensor_list,
)
from advisor.profile.real_run import (check_weights_fit, real_run_budget_bytes, seeded_random_numbers,
                                      too_large_during_step)
from advisor.profile.shapes import SHAPE_KERNELS
from advisor.profile.tensors import leaves
from advisor.profile.torch_patches import fake_tensor_conversions, grouped_mm_in_any_float, unpacked_fake_sequences
from advisor.profile.user_code import TorchWouldRaise, UserCodeError, user_code
from advisor.profile.watch import TraceWatch

assert ("adafactor" in OPTIMIZERS) == hasattr(torch.optim, "Adafactor"), "torch's metadata disagrees with torch"
PHASES = ("forward", "backward", "optimizer")

OUTSIDE_MODEL = {"loss": "(loss)", "optimizer": "(optimizer)"}
"""Module names of ops that run outside the model's modules."""

DATA_DEPENDENT_ERRORS = (DataDependentOutputException, DynamicOutputShapeException)
"""What fake tensors raise when an op needs the values of its inputs."""

REAL_TWIN_SHARE = 16
"""In the real-inputs fallback, an op's outputs are computed for real beside their fake twins while they
take at most 1/16 of the real run's budget (real_run.real_run_budget_bytes, a quarter of the memory available:
384 MiB of 24 GiB): Longformer's attention mask from the input's padding, batch x 4,096 x 4,096, has a twin
at batch 2 (134 MB), where an element cap of 2**24 dropped it and the model was run for real as if it
branched on its weights."""

GRAD_SCALER_INIT_SCALE = 2.0**16
"""torch.amp.GradScaler's default initial scale (amp-fp16 runs scale the loss by it)."""

SAME_DTYPE_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot"})
"""Ops whose tensor operands must share one dtype on a real device (autocast casts before they run);
their fake kernels do not check it (`nn.Linear` on an int64 input would trace)."""

SCALAR_ITEM = "_local_scalar_dense"
"""The aten op behind `.item()`."""

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""Low-precision dtype names of choices.Precision -> torch dtypes."""
PURE_LOW_PRECISION = {p.name: TORCH_DTYPES[p.cast] for p in PRECISION_TABLE if p.cast}
"""Precisions that cast the whole model and its inputs, precision -> dtype."""


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
    gemm: tuple[int, int, int, int] | None = None
    """(batch, m, n, k) of a matmul-class op (costs.OpCost.gemm)."""
    allocated: tuple[int, ...] = ()
    """Bytes of each new storage the op allocated (its outputs; none for in-place ops and views)."""
    conv: ConvGeometry | None = None
    """A convolution's geometry and layout (costs.OpCost.conv)."""
    tensors: int = 1
    """Tensors one call works on: the length of a multi-tensor (`_foreach_*`) op's first list, else 1."""
    reads: Flow = field(default=(), compare=False, repr=False)
    """(source, bytes, offset) of each value the op reads: which op made it (dataflow.py)."""
    writes: Flow = field(default=(), compare=False, repr=False)
    """(last_use, bytes) of each value the op writes: which op reads it last (dataflow.py)."""
    transposed: int = 0
    """Of a matrix product's operands, how many are not K-major (costs.transposed_operands)."""
    dropout: bool = False
    """A fused attention kernel (forward or backward) that draws a dropout mask inside it (attention.py)."""
    synchronizes: bool = False
    """A value read back from the device (`.item()`, a tensor in an `if`): on a GPU the host waits here until
    the device has run everything issued before (estimate/step.py). Step counters torch.optim keeps on the
    host read back without a wait and are not recorded."""
    norm: NormGeometry | None = None
    """A batch norm's channels and layout (costs.OpCost.norm)."""
    masked: bool = False
    """A fused attention call given an explicit mask (costs.OpCost.masked)."""
    engine_sum: bool = False
    """A gradient the autograd engine summed into a tensor's gradient buffer, outside any node (engine_sums.py)."""

    def anonymous(self) -> tuple:
        """Everything but its module and dataflow, as a tuple: what the op costs depends on, and what a
        repeated block's copy of it shares (estimate/step.py, repeated.py)."""
        return (self.phase, self.op, self.flops, self.bytes_read, self.bytes_written, self.dtypes, self.matmul,
                self.counted, self.gemm, self.allocated, self.conv, self.tensors, self.transposed, self.dropout,
                self.synchronizes, self.norm, self.masked, self.engine_sum)

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)
        del record["reads"], record["writes"]
        return record

def _tensor_count(args: tuple) -> int:
    """The length of a multi-tensor op's first argument (a list of tensors), else 1."""
    first = args[0] if args else None
    return len(first) if isinstance(first, (list, tuple)) and first and isinstance(first[0], torch.Tensor) else 1


@dataclass(frozen=True)
class StepTrace:
    """All ops of one training step with the settings that produced it."""

    batch_size: int
    precision: str
    optimizer: str
    params: int
    records: tuple[OpRecord, ...] = field(repr=False)
    values: str = "fake"
    """How values were provided: "fake" (shapes only), "fake+real-inputs" (the fallback for models
    whose control flow reads their inputs) or "real" (the step run on real CPU tensors with freshly
    initialised weights, for models whose control flow reads values computed from their weights)."""
    data_dependent_ops: dict[str, int] = field(default_factory=dict)
    """Ops answered from real values in the fallback, op name -> calls."""
    params_by_module: dict[str, int] = field(default_factory=dict, repr=False)
    """Trainable parameters of each module, submodules included ("" is the model)."""
    memory: LiveMemory | None = field(default=None, repr=False)
    """Every storage of the step with its allocation and free (live_memory.py)."""
    checkpointed: tuple[str, ...] = ()
    """Modules run under activation checkpointing (their activations are recomputed in backward)."""
    accumulate_gradients: bool = False
    """Gradients of earlier micro-batches were alive through the step (gradient accumulation)."""
    construction: str = "fake"
    """How the model was built: "fake" (inside FakeTensorMode) or "meta" (its constructor computes with
    tensor values: built on real tensors with its weights on the meta device, build.py)."""
    attention: str = "cpu"
    """How the step was traced: "cpu" as a CPU runs it, or "cuda" as a GPU does: scaled_dot_product_attention
    with dropout as the fused CUDA kernels run it (attention.py), autocast with CUDA's policy (cuda_autocast.py),
    Mamba's selective scans as mamba_ssm's fused kernel (selective_scan.py)."""
    fused_attention_dropout: int = 0
    """Attention calls with dropout traced as a fused kernel (attention "cuda"); 0 on the CPU path."""
    assumed_finite: int = 0
    """Checks of activations for inf or NaN answered by assuming them finite (finite.py)."""
    optimizer_class: str = ""
    """Class of the optimizer that stepped (torch.optim's name: "AdamW", "SGD"), the model file's own for
    optimizer "file"."""
    total_params: int = 0
    """Every parameter of the model, frozen ones and quantized frozen weights (by their element count)
    included; `params` counts the trainable ones."""
    adapted: str = ""
    """What --lora/--base-weights did to the model (adapters.adapt), "" when nothing."""
    repeated: tuple[str, ...] = ()
    """Runs of repeated blocks traced once and replicated (repeated.py), one line each."""
    replicated_blocks: int = 0
    """Blocks whose ops and memory were replicated from a traced one instead of traced."""
    repeats: tuple[tuple[int, int, int], ...] = field(default=(), repr=False)
    """(start, length, copies): records[start:start + length * copies] are `copies` runs of the same ops
    in a row (a repeated block's iterations, modules aside), for estimators that time a run once."""

    def memory_only(self) -> StepTrace:
        """This step without its ops (records, repeats): its memory, parameters and settings, what a step at
        another batch is used for (the memory line against batch size, a layout's memory), and what the child
        that traced it sends (the 7B example's step unpickles in 7 ms instead of 20, Llama-3-70B's in a
        quarter of the time)."""
        return replace(self, records=(), repeats=())

    @property
    def cpu_runs_otherwise(self) -> bool:
        """Whether a CPU runs this step otherwise than it was traced: traced as a GPU runs it, with attention
        dropout's fused kernels, under autocast (whose policy differs) or with fused selective scans."""
        return self.attention == "cuda" and (self.fused_attention_dropout > 0 or
                                             precision_of(self.precision).autocast is not None or
                                             any(record.op in FUSED_SCAN_OPS for record in self.records))

    def flops(self, phase: str | None = None) -> float:
        """Total FLOPs of the step, or of one phase (summed once per trace: estimate_device asks for them per
        device)."""
        totals = self.__dict__.setdefault("_flops", {})  # a frozen dataclass: the cache beside its fields
        if phase not in totals:
            totals[phase] = sum(r.flops for r in self.records if phase is None or r.phase == phase)
        return totals[phase]

    def model_forward_flops(self) -> float:
        """FLOPs of the model's forward alone (the loss left out): what a forward profile counts."""
        return sum(r.flops for r in self.records if r.phase == "forward" and r.module not in OUTSIDE_MODEL.values())

    def bytes_moved(self, phase: str | None = None) -> int:
        return sum(r.bytes_read + r.bytes_written for r in self.records if phase is None or r.phase == phase)

    def bytes_written(self, phase: str | None = None) -> int:
        """Bytes the ops of the step (or of one phase) write: in the forward, activations and
        temporaries before any is freed."""
        return sum(r.bytes_written for r in self.records if phase is None or r.phase == phase)

    def values_note(self) -> str | None:
        """One sentence when the trace ran on real values that a trained model would not give, else None."""
        if self.values != "real":
            return None
        return ("Note: the model branches on values computed from its weights, so its step was run for real on "
                "this CPU with freshly initialised weights; what depends on those values (boxes kept, targets "
                "matched, masks drawn) is what a new model gives, a trained one may differ")

    def replication(self) -> str:
        """One clause on the blocks traced once and replicated (repeated.py), "" when none were."""
        if not self.replicated_blocks:
            return ""
        return f"{self.replicated_blocks} repeated blocks replicated, not traced: {'; '.join(self.repeated)}"

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
            "optimizer_class": self.optimizer_class,
            "params": self.params,
            "total_params": self.total_params,
            "adapted": self.adapted,
            "values": self.values,
            "construction": self.construction,
            "data_dependent_ops": dict(self.data_dependent_ops),
            "flops": {phase: self.flops(phase) for phase in PHASES} | {"total": self.flops()},
            "bytes": {phase: self.bytes_moved(phase) for phase in PHASES} | {"total": self.bytes_moved()},
            "uncounted_ops": self.uncounted(),
            "checkpointed": list(self.checkpointed),
            "repeated": list(self.repeated),
            "replicated_blocks": self.replicated_blocks,
            "accumulate_gradients": self.accumulate_gradients,
            "memory": None if self.memory is None else self.memory.to_dict(),
            "ops": [r.to_dict() for r in self.records],
        }


class _StepModuleTracker(ModuleTracker):
    """ModuleTracker that, during the backward, only follows which module runs. Activation
    checkpointing re-runs blocks' forward there; the stock tracker would hang gradient hooks on the
    recomputed tensors and keep them (and the memory the trace counts) alive until the step ends.
    The recomputed graph is never back-propagated, so those hooks have nothing to track."""

    in_backward = False

    def __init__(self) -> None:
        super().__init__()
        self.entered: dict[str, int] = {}
        """How many modules had been entered when each module of `parents` last was: in the backward,
        `parents` (a set, whose order changes with the hash seed) holds siblings of one depth at once
        (a LoRA layer's base_layer and lora_A), and the one entered last is the one running."""
        self._entries = itertools.count()

    def _get_append_fn(self, name, is_bw):
        append = super()._get_append_fn(name, is_bw)

        def fn(*args) -> None:
            self.entered[name] = next(self._entries)
            append(*args)

        return fn

    def innermost(self) -> str | None:
        """The deepest module of `parents` by attribute path, the latest entered among equals (None:
        outside every module)."""
        names = [name for name in self.parents if name != "Global"]
        if not names:
            return None
        return max(names, key=lambda n: (n.count("."), self.entered.get(n, -1)))

    def _fw_pre_hook(self, mod, input) -> None:
        if self.in_backward:
            self._get_append_fn(self._get_mod_name(mod), False)()
        else:
            super()._fw_pre_hook(mod, input)

    def _fw_post_hook(self, mod, input, output) -> None:
        if self.in_backward:
            self._get_pop_fn(self._get_mod_name(mod), False)()
        else:
            super()._fw_post_hook(mod, input, output)


class _OverBudget(UserError):
    """A step run on real tensors outgrew its memory budget (`live_bytes`); _trace_for_real says so."""

    def __init__(self, live_bytes: int) -> None:
        super().__init__(f"{live_bytes} bytes live")
        self.live_bytes = live_bytes


class _CostFormulaError(AssertionError):
    """A cost formula failed on an op: our bug, never blamed on the user's model."""


class _Recorder(TorchDispatchMode):
    """Records every aten op with the current phase and innermost module.

    With `fake_mode` given (the real-inputs fallback), tensors computed from inputs alone keep a
    real twin, and an op that needs values is answered from the twins."""

    def __init__(self, tracker: _StepModuleTracker, memory: LiveMemoryTracker,
                 fake_mode: FakeTensorMode | None = None, watch: TraceWatch | None = None,
                 memory_limit: int | None = None) -> None:
        super().__init__()
        self.replicas: OptimizerReplicas | None = None
        """With repeated blocks held out: the optimizer's ops on their template's tensors, done again for them."""
        self.first_step_aliases = False
        """In the optimizer's first, unrecorded step (which only makes its state), an out-of-place
        multi-tensor op returns its first list unchanged (_aliased_in_first_step): set for the optimizers of
        FIRST_STEP_ALIASES, whose first step feeds such results only to other multi-tensor ops."""
        self.shortcut_optimizer = False
        """Answer the optimizer's in-place multi-tensor ops and `.item()`s without running them on the fake
        tensors (_answered_by_shapes): set for the optimizers of make_optimizer, whose ops are known to fit."""
        self.memory_limit = memory_limit
        """Bytes of live storages past which the op stops the step (_OverBudget): a real run's budget."""
        self.runs_memory = False
        """Set while the memory tracker is off the dispatch stack (LiveMemoryTracker.run_by_caller): this mode
        passes each op on through it."""
        self.tracker = tracker
        self.memory = memory
        self.watch = watch or TraceWatch()
        self.phase = "forward"
        self.recording = False
        self.records: list[OpRecord] = []
        self.dataflow = Dataflow(memory.index_of)
        self.ticks: list[int] = []
        """The memory tracker's tick of each record (repeated.py places blocks by them)."""
        self.fake_mode = fake_mode
        self.real: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        self.real_twin_bytes = 0 if fake_mode is None else real_run_budget_bytes() // REAL_TWIN_SHARE
        """Largest outputs of one op (bytes) computed for real beside their fake twins (REAL_TWIN_SHARE)."""
        self.data_dependent: dict[str, int] = {}
        self.attention_dropout: FusedAttentionDropout | None = None
        """The mode that takes dropout out of attention calls (GPU traces), whose kernels draw masks."""
        self.dropout_storages: set[int] = set()
        """Storages of the logsumexps of fused attention calls that draw dropout masks."""
        self.host_scalars: set[int] = set()
        """ids of the optimizer's step counters: torch.optim keeps them on the host (unless capturable or
        fused), so reading them back (Adam's bias correction) waits for nothing."""

    def module(self) -> str:
        """The innermost module by attribute path from the model ("" is the model itself, as fvcore
        names it); ops outside the model are "(loss)" or "(optimizer)"."""
        innermost = self.tracker.innermost()
        if innermost is None:
            return OUTSIDE_MODEL["optimizer" if self.phase == "optimizer" else "loss"]
        return innermost.partition(".")[2]  # ModuleTracker names the root by its class: drop it

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace != "prim":  # prim ops (device queries) run where C++ cannot pass an exception on
            self.watch.tick(self.phase, self.module)
        if func.overloadpacket.__name__ in SAME_DTYPE_OPS:
            _check_same_dtype(func.overloadpacket.__name__, args)
        first_storage = self.memory.storage_count  # the memory tracker, below this mode, registers outputs
        if self.shortcut_optimizer and self.phase == "optimizer" and _answered_by_shapes(func, args):
            out = _stand_in_scalar(args[0]) if func.overloadpacket.__name__ == SCALAR_ITEM else None
            return self._record(func, args, kwargs, out, first_storage)
        if self.first_step_aliases and not self.recording and _aliased_in_first_step(func, args):
            return next(list(a) for a in args if tensor_list(a))
        try:
            out = self.memory.run(func, args, kwargs) if self.runs_memory else func(*args, **kwargs)
        except DATA_DEPENDENT_ERRORS:
            if self.phase == "optimizer" and func.overloadpacket.__name__ == SCALAR_ITEM:
                return self._record(func, args, kwargs, _stand_in_scalar(args[0]), first_storage)
            shaped = SHAPE_KERNELS.get(func.overloadpacket)
            if shaped is not None:  # outputs from shapes alone (shapes.py); the memory tracker sees them made
                with self._beneath_memory():
                    return self._record(func, args, kwargs, shaped(args, kwargs), first_storage)
            real_arguments = None if self.fake_mode is None else self._real_arguments(args, kwargs)
            if real_arguments is None:
                raise
            with self._beneath_memory():
                out = self._answer_from_real_values(func, real_arguments)
            self.memory.observe(out, func.overloadpacket.__name__)
        else:
            self._keep_real_twin(func, args, kwargs, out)
        if self.memory_limit is not None and self.memory.live_bytes > self.memory_limit:
            raise _OverBudget(self.memory.live_bytes)
        return self._record(func, args, kwargs, out, first_storage)

    def _beneath_memory(self) -> AbstractContextManager:
        """Where this mode runs the memory tracker's work (runs_memory), the ops it makes itself in the block
        go through the tracker, as they would beneath it."""
        return self.memory if self.runs_memory else nullcontext()

    def _record(self, func: Any, args: tuple, kwargs: dict, out: Any, first_storage: int) -> Any:
        """Record one op call (while recording) and return its output."""
        if not self.recording:
            return out
        try:
            cost = op_cost(func, args, kwargs, out)
        except Exception as exc:
            raise _CostFormulaError(f"cost formula of {func} failed: {exc!r}") from exc
        synchronizes = self._reads_back(func, args)
        if cost.flops or cost.bytes_read or cost.bytes_written or not cost.counted or synchronizes:
            record = OpRecord(self.phase, self.module(), func.overloadpacket.__name__, cost.flops, cost.bytes_read,
                              cost.bytes_written, cost.dtypes, cost.matmul, cost.counted, cost.gemm,
                              self.memory.sizes_since(first_storage), cost.conv, _tensor_count(args),
                              transposed=cost.transposed, dropout=self._draws_dropout(func, args, kwargs, out),
                              synchronizes=synchronizes, norm=cost.norm, masked=cost.masked)
            records = [record]
            multi_tensor = record.tensors > 1 or record.op.startswith("_foreach_")
            self.dataflow.record(len(self.records), args, kwargs, out, func._schema.is_mutable, multi_tensor,
                                 first_storage)
            if self.replicas is not None and self.phase == "optimizer":
                records = self.replicas.expand(record, func, args, kwargs, out, op_cost, self.memory.index_of)
                self._replicated_dataflow(record, records)
            self.records.extend(records)
            self.ticks.extend([self.memory.tick] * len(records))
        return out

    def mark_engine_sums(self, sums: EngineSums) -> None:
        """Mark the records of the gradients the autograd engine summed while backward ran (engine_sums.py)."""
        for index in sums.marked([record.op for record in self.records]):
            self.records[index] = replace(self.records[index], engine_sum=True)

    def answered_read_back(self, tensor: torch.Tensor, value: bool) -> None:
        """A value check that finite.FiniteActivations answered: recorded as the read back a real step makes."""
        self._record(torch.ops.aten._local_scalar_dense.default, (tensor,), {}, value, self.memory.storage_count)

    def _reads_back(self, func: Any, args: tuple) -> bool:
        """Whether this op reads a value back to the host from the device (`.item()`, `if tensor:`), which
        makes the host wait for it: any scalar read but of the optimizer's host-side step counters."""
        return func.overloadpacket.__name__ == SCALAR_ITEM and bool(args) and id(args[0]) not in self.host_scalars

    def _draws_dropout(self, func: Any, args: tuple, kwargs: dict, out: Any) -> bool:
        """Whether this fused attention op draws a dropout mask on a GPU: a forward kernel called while
        attention.FusedAttentionDropout runs a call it took the dropout out of (its logsumexp, the second
        output, is remembered), or the backward of such a forward (it reads that logsumexp)."""
        name = func.overloadpacket.__name__
        if self.attention_dropout is None or name.removesuffix("_backward") not in SDPA_KERNELS:
            return False
        if name in SDPA_KERNELS:
            if not self.attention_dropout.active:
                return False
            index = self.memory.index_of(out[1]) if isinstance(out, (tuple, list)) and len(out) > 1 else None
            if index is not None:
                self.dropout_storages.add(index)
            return True
        logsumexp = named_arguments(func, args, kwargs or {}).get("logsumexp")
        index = self.memory.index_of(logsumexp) if isinstance(logsumexp, torch.Tensor) else None
        return index is not None and index in self.dropout_storages

    def _replicated_dataflow(self, record: OpRecord, records: list[OpRecord]) -> None:
        """The dataflow of `records`, which stand for `record` done again for blocks traced once."""
        if len(records) > 1:
            self.dataflow.repeat_last(len(records) - 1)
        elif records[0] is not record:
            before = record.bytes_read + record.bytes_written
            after = records[0].bytes_read + records[0].bytes_written
            if before:
                self.dataflow.scale_last(after / before)

    def flowing_records(self) -> list[OpRecord]:
        """The records with their dataflow (OpRecord.reads, writes)."""
        flows = self.dataflow.flows()
        assert len(flows) == len(self.records), (len(flows), len(self.records))
        return [replace(record, reads=reads, writes=writes) for record, (reads, writes) in zip(self.records, flows)]

    # ------------------------------------------------------------------ real-inputs fallback

    def _real_value(self, value: Any) -> Any:
        """The real twin of a tensor (a real tensor is its own); None when it has none."""
        return self.real.get(value) if isinstance(value, FakeTensor) else value

    def _real_arguments(self, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        flat, spec = tree_flatten((args, kwargs))
        real = [self._real_value(v) for v in flat]
        if any(r is None and isinstance(v, torch.Tensor) for r, v in zip(real, flat)):
            return None
        return tree_unflatten(real, spec)

    def _run_real(self, func, args: tuple, kwargs: dict) -> Any:
        with _disable_current_modes(), torch.no_grad(), torch.autocast("cpu", enabled=False):
            return func(*args, **kwargs)

    def _keep_real_twin(self, func, args: tuple, kwargs: dict, out: Any) -> None:
        if self.fake_mode is None or self.phase != "forward":
            return
        outputs = [t for t in leaves(out) if isinstance(t, FakeTensor)]
        if not outputs or sum(t.numel() * t.element_size() for t in outputs) > self.real_twin_bytes:
            return
        real_arguments = self._real_arguments(args, kwargs)
        if real_arguments is None:
            return
        real_out = self._run_real(func, *real_arguments)
        for fake, real in zip(leaves(out), leaves(real_out)):
            if isinstance(fake, FakeTensor) and isinstance(real, torch.Tensor):
                self.real[fake] = real

    def _answer_from_real_values(self, func, real_arguments: tuple[tuple, dict]) -> Any:
        """A data-dependent op: compute it on the real twins and give back fake tensors of the
        real result's shape (or the real Python scalar)."""
        assert self.fake_mode is not None
        real_out = self._run_real(func, *real_arguments)
        name = func.overloadpacket.__name__
        self.data_dependent[name] = self.data_dependent.get(name, 0) + 1
        fake_mode = self.fake_mode

        def to_fake(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            fake = fake_mode.from_tensor(value)
            self.real[fake] = value
            return fake

        return tree_map(to_fake, real_out)


def _answered_by_shapes(func: Any, args: tuple) -> bool:
    """Whether an optimizer op on fake tensors changes nothing the trace sees: an in-place multi-tensor op
    (`_foreach_addcdiv_`: no output, no new storage; its cost comes from its arguments' shapes), or
    `.item()` (Adam's bias correction reads each step count; any value gives the same ops). Running them
    on fake tensors took 55% of a 700-tensor AdamW step here."""
    name = func.overloadpacket.__name__
    if name == SCALAR_ITEM:
        return isinstance(args[0], FakeTensor)
    return name.startswith("_foreach_") and name.endswith("_") and not func._schema.returns and _all_fake(args)


FIRST_STEP_ALIASES = frozenset({"sgd", "momentum", "adam", "adamw"})
"""make_optimizer's foreach optimizers: in their steps, what a multi-tensor op returns goes only into other
multi-tensor ops (torch.optim's _multi_tensor_adam and _multi_tensor_sgd)."""


def _aliased_in_first_step(func: Any, args: tuple) -> bool:
    """An out-of-place multi-tensor op on fake tensors (`_foreach_sqrt`): in the unrecorded first step, whose
    temporaries nobody sees, its first list stands for its result (same shapes, no tensors made)."""
    name = func.overloadpacket.__name__
    return name.startswith("_foreach_") and not name.endswith("_") and any(tensor_list(a) for a in args) \
        and _all_fake(args)


def _all_fake(args: tuple) -> bool:
    """Whether every tensor in `args` (lists included) is a FakeTensor."""
    return all(isinstance(t, FakeTensor) for t in leaves(args) if isinstance(t, torch.Tensor))


def _check_same_dtype(op: str, args: tuple) -> None:
    """TorchWouldRaise when a matmul's tensor operands differ in dtype, as real kernels refuse them."""
    dtypes = list(dict.fromkeys(a.dtype for a in args if isinstance(a, torch.Tensor) and a.dim() > 0))
    if len(dtypes) > 1:
        names = " and ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TorchWouldRaise(f"{op} of {names} tensors: torch requires one dtype for both operands "
                              "(e.g. float inputs to a float layer; token ids go through an nn.Embedding)")


def _stand_in_scalar(tensor: torch.Tensor) -> bool | int | float:
    """What `.item()` returns inside an optimizer step on fake tensors (Adafactor reads norms this
    way): any value gives the same ops and shapes, so 1 of the tensor's kind."""
    if tensor.dtype == torch.bool:
        return True
    return 1.0 if tensor.is_floating_point() else 1


def default_loss(output: Any, inputs: Any) -> torch.Tensor:
    """A scalar reduction of the output(s): the mean of every floating-point output tensor, summed."""
    tensors = [t for t in leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not tensors:
        raise UserError("the model's output has no floating-point tensor to build a loss from; define loss_fn")
    return sum(t.float().mean() for t in tensors)


def make_optimizer(name: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer `name` as torch runs it on CUDA by default: the foreach (multi-tensor)
    implementation, which CPU tensors would not pick on their own; the `-fused` Adams as `fused=True`."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01, foreach=True)
    if name == "momentum":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=True)
    if name == "adam":
        return torch.optim.Adam(params, foreach=True)
    if name == "adamw":
        return torch.optim.AdamW(params, foreach=True)
    if name in ("adam-fused", "adamw-fused"):
        return (torch.optim.Adam if name == "adam-fused" else torch.optim.AdamW)(params, fused=True)
    if name == "adamw8bit":
        from advisor.profile.quantized import AdamW8bit  # its custom ops registered when first asked for

        return AdamW8bit(params)
    if name == "adafactor" and name in OPTIMIZERS:
        return torch.optim.Adafactor(params, foreach=True)
    raise UserError(f"unknown optimizer '{name}'; choose one of {', '.join(OPTIMIZERS)}")


def cast_inputs(inputs: Any, dtype: torch.dtype) -> Any:
    """The inputs with every floating-point tensor cast to `dtype` (pure low-precision training)."""
    return tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, inputs)


def _convert_floating_point(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast floating-point parameters and buffers to `dtype` in place, as `Module.to` does for real
    ones (it cannot swap fake parameters: they carry weak references). Each parameter keeps its
    identity, so tied weights stay tied (issue #22: a new Parameter per module gave GPT-2 small's
    tied embedding and head two copies, 163 M parameters instead of 124 M); a buffer registered in
    several modules stays one tensor."""
    for param in model.parameters():  # each shared parameter once
        if param.is_floating_point():
            param.data = param.detach().to(dtype)
    converted: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.is_floating_point():
                if id(buffer) not in converted:
                    converted[id(buffer)] = buffer.to(dtype)
                module._buffers[name] = converted[id(buffer)]


def call_model(model: torch.nn.Module, inputs: Any) -> Any:
    """model(**inputs) for a dict, model(*inputs) for a tuple or list, else model(inputs)."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


@contextmanager
def fake_tensor_log_silenced() -> Iterator[None]:
    """Fake tensors log every kernel that fails at ERROR level before raising it (torch >= 2.14);
    we report those errors ourselves, as one sentence, so the log stays quiet meanwhile."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    previous = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(previous)


@dataclass(frozen=True)
class _Setup:
    build_model: Callable[[], torch.nn.Module]
    example_input: Callable[[int], Any]
    batch_size: int
    precision: str
    optimizer: str
    loss_fn: Callable[[Any, Any], torch.Tensor]
    source: str | None
    checkpointing: bool
    accumulate_gradients: bool
    construction: str = "fake"
    """How build_model() runs: "fake" (inside FakeTensorMode) or "meta" (build.weights_on_meta)."""
    attention: str = "cpu"
    """How attention with dropout runs: "cpu" (the math path) or "cuda" (attention.FusedAttentionDropout)."""
    watch: TraceWatch = field(default_factory=TraceWatch)
    """Progress and deadline, shared by every attempt."""
    build_optimizer: Callable[[list[torch.nn.Parameter]], Any] | None = None
    """The model file's optimizer(params), for optimizer "file"."""
    adaptation: Adaptation = field(default_factory=Adaptation)
    """LoRA adapters and the frozen base's storage (adapters.py)."""
    dedupe: bool = True
    """Trace repeated blocks once and replicate them (repeated.py)."""
    sibling: Sibling | None = None
    """A second batch size to trace beside this one, from the same built model (Sibling)."""


@dataclass
class Sibling:
    """A second batch size traced beside the first (trace_training_step's `sibling`): a child forked once the
    model is built traces the step at `batch_size` from there, on the other CPU, while this process traces
    its own, and is left running when this process's step is done: collect() gives its step, or None where no
    child could run it (one CPU, other threads, a step that needed real values) or it failed: the caller then
    traces that batch itself. (The memory model needs the
    step at two batches; a child forked before the build built the model again: Llama-3-70B's 80 layers,
    a third of its trace.)"""

    batch_size: int
    trace: StepTrace | None = None
    child: ForkedCall[StepTrace] | None = None
    """The child forked to trace the step, until collect() has read its step; one that serves stays after it
    (served())."""
    grace_s: float = 0.0
    """Seconds collect() waits for the child: CHILD_GRACE_S beyond the time this process's own step took."""
    serves: bool = False
    """The child stays, once its step is sent, to run jobs on it (background.Served): `served()`."""
    sent_as: Callable[[StepTrace], StepTrace] | None = None
    """What the child sends of its step (run in the child: it may keep the whole step elsewhere first, as
    memory.plan.trace_pair stores it in the trace cache and sends StepTrace.memory_only); None: all of it."""
    made_elsewhere: bool = False
    """`child` is a serving child of an earlier step, making this one already (ForkedCall.again): no child is
    forked for it."""

    def collect(self) -> StepTrace | None:
        """The child's step, waited for where it was left running (the caller meanwhile did other work that
        needs only its own step); None where no child ran it or it failed."""
        if self.child is not None and self.child.unread:
            self.trace = self.child.result(timeout_s=self.grace_s)
            if not self.serves:  # done: its process object holds the built model
                self.child = None
        return self.trace

    def ready(self) -> bool:
        """Whether collect() would return without waiting for the child (it sent its step, or none runs)."""
        return self.child is None or self.child.ready()

    def served(self) -> Served | None:
        """The serving child's job channel (None: no child serves); jobs sent before its step is collected wait
        for it. Its caller closes it (Served.close); abandon() does too."""
        return None if self.child is None else self.child.served()

    def abandon(self) -> None:
        """Stop a child left running (a step traced again forks another)."""
        if self.child is not None:
            child, self.child = self.child, None
            child.close()

    def release(self) -> ForkedCall[StepTrace] | None:
        """The serving child, no longer this sibling's to stop (None where none serves): the caller keeps or
        closes it."""
        child, self.child = (self.child, None) if self.serves else (None, self.child)
        return child


class _ConstructorNeedsValues(Exception):
    """build_model() computed with a tensor's values inside FakeTensorMode: build it on meta weights."""


def check_step_settings(precision: str, optimizer: str, batch_size: int | None = None) -> None:
    """UserError, in one sentence, for a precision or optimizer the trace does not know or a batch
    size below 1 (None: not given yet, the model file's default will be used)."""
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision '{precision}'; choose one of {', '.join(PRECISIONS)}")
    if optimizer not in OPTIMIZERS and optimizer != FILE_OPTIMIZER:
        raise UserError(f"unknown optimizer '{optimizer}'; choose one of {', '.join(OPTIMIZERS)}")
    if batch_size is not None and batch_size < 1:
        raise UserError(f"batch size must be at least 1, got {batch_size}")


def trace_training_step(
    build_model: Callable[[], torch.nn.Module],
    example_input: Callable[[int], Any],
    batch_size: int,
    precision: str = "fp32",
    optimizer: str = "adamw",
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    source: str | None = None,
    *,
    checkpointing: bool = False,
    accumulate_gradients: bool = False,
    attention: str = "cpu",
    timeout_s: float | None = None,
    progress: Callable[[str], None] | None = None,
    build_optimizer: Callable[[list[torch.nn.Parameter]], Any] | None = None,
    adaptation: Adaptation | None = None,
    dedupe: bool = True,
    sibling: Sibling | None = None,
) -> StepTrace:
    """Build the model on fake tensors and trace one steady-state training step: the optimizer's
    state already exists (a first, unrecorded step creates it), gradients were set to None by the
    last step (or, with `accumulate_gradients`, hold earlier micro-batches' sums).

    `checkpointing` runs the model's repeated blocks under activation checkpointing
    (`checkpoint_blocks`). `attention` "cuda" traces attention with dropout as the fused CUDA kernels
    run it (attention.py; for GPU targets), "cpu" as a CPU does. `timeout_s` (None or 0: none) stops
    a trace that takes longer with a UserError; `progress` hears how far a long one got (watch.py).
    `dedupe` traces runs of repeated blocks once and replicates their ops and memory (repeated.py; the
    same trace, exactly, or a full trace where it cannot be shown to be).
    `sibling` gets the step at its batch size too, traced in a child from the same built model (Sibling).
    `source` names the model file in error messages. Models whose control flow reads input values
    are traced a second time with real inputs (see the module docstring); models whose constructor
    needs tensor values are built on meta weights (build.py)."""
    check_step_settings(precision, optimizer, batch_size)
    assert attention in ATTENTION_PATHS, attention
    setup = _Setup(build_model, example_input, batch_size, precision, optimizer, loss_fn or default_loss, source,
                   checkpointing, accumulate_gradients, attention=attention,
                   watch=TraceWatch(timeout_s, progress, source), build_optimizer=build_optimizer,
                   adaptation=adaptation or Adaptation(), dedupe=dedupe, sibling=sibling)
    if optimizer == FILE_OPTIMIZER and build_optimizer is None:
        raise UserError(f"optimizer '{FILE_OPTIMIZER}' needs the model file's optimizer(params) function")
    with signals_deferred():  # FakeTensorMode imports it on first use; native modules inside
        importlib.import_module("torch._dynamo")
    with collector_paused():
        try:
            return _trace_with_either_inputs(setup)
        except _ConstructorNeedsValues:
            return _trace_with_either_inputs(replace(setup, construction="meta"))


@contextmanager
def _as_it_runs(setup: _Setup) -> Iterator[None]:
    """The step as the device it is traced for runs it: for a GPU (attention "cuda"), autocast with CUDA's
    policy (autocast_policy) and Mamba's selective scans as one fused kernel each (selective_scan.py)."""
    scans = fused_selective_scans() if setup.attention == "cuda" else nullcontext()
    with autocast_policy(setup.attention, setup.precision), scans:
        yield


def autocast_policy(attention: str, precision: str) -> AbstractContextManager[None]:
    """Under an autocast precision, CUDA's autocast policy for a step traced as a GPU runs it (attention
    "cuda": cuda_autocast.py); else CPU autocast's own."""
    return cuda_autocast_policy() if attention == "cuda" and precision_of(precision).autocast else nullcontext()


NUMPY_OF_A_FAKE_TENSOR = ".numpy() is not supported for tensor subclasses"
"""What torch raises when a model hands a fake tensor to NumPy (`.numpy()`, `np.asarray`): a loss that
matches predictions to targets with scipy (DETR's and Mask2Former's Hungarian matcher) reads their values."""


def _reads_values_in_numpy(exc: Exception) -> bool:
    """Whether the model file failed because it handed a fake tensor to NumPy: torch's error as raised (in a
    frame of this package's torch-function modes) or as the user's code's (UserCodeError, caused by it)."""
    error = exc.__cause__ if isinstance(exc, UserCodeError) else exc
    return isinstance(error, RuntimeError) and NUMPY_OF_A_FAKE_TENSOR in str(error)


def _trace_with_either_inputs(setup: _Setup) -> StepTrace:
    """The step on fake inputs, or, when the model reads their values, on real ones; when it reads values
    computed from its weights, or hands a tensor to NumPy (which real inputs beside fake weights would not
    serve), the step run for real (real_run.py)."""
    try:
        with fake_tensor_log_silenced():
            return _trace_deduplicated(setup, "fake")
    except DATA_DEPENDENT_ERRORS:
        pass
    except (UserCodeError, RuntimeError) as exc:
        if not _reads_values_in_numpy(exc):
            raise
        return _trace_for_real(setup, "reads tensor values in NumPy (.numpy())")
    try:
        with fake_tensor_log_silenced():
            return _trace_deduplicated(setup, "fake+real-inputs")
    except DATA_DEPENDENT_ERRORS as exc:
        op = getattr(exc, "func", None)
        why = f"branches on values computed from its weights{f' ({op})' if op is not None else ''}"
    return _trace_for_real(setup, why)


def _trace_for_real(setup: _Setup, why: str) -> StepTrace:
    """The step run on real CPU tensors (real_run.py), when its weights, gradients and optimizer state
    fit in the real run's budget; `why` (the op that needed values) goes into the error otherwise."""
    source = setup.source
    setup.watch.report(f"{source or 'the model'} {why}: running its step for real on this CPU")
    model = build_on_meta_weights(setup.build_model, setup.example_input, setup.batch_size, source)
    weights = {id(t): t for t in [*model.parameters(), *model.buffers()]}.values()
    budget = check_weights_fit(sum(t.numel() * t.element_size() for t in weights), why, source)
    del model, weights
    try:
        return _trace(setup, "real", memory_limit=budget)
    except _OverBudget as exc:
        raise too_large_during_step(exc.live_bytes, budget, setup.batch_size, why, source) from None


def _trace_deduplicated(setup: _Setup, values: str) -> StepTrace:
    """The step with repeated blocks traced once (setup.dedupe), or in full where that fails (NotRepeated)."""
    trimmed: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())  # runs without first, last
    while setup.dedupe:
        try:
            return _trace(setup, values, dedupe=True, trimmed=trimmed)
        except NotRepeated as exc:
            widened = (trimmed[0] | exc.first, trimmed[1] | exc.last)
            # nothing left to try, or too little to gain: the blocks do not repeat as the shortened step shows
            if widened == trimmed or exc.saved < MIN_SAVED_BY_A_RETRY:
                logging.getLogger(__name__).debug("tracing every block: %s", exc)
                break
            trimmed = widened
    return _trace(setup, values)


def _trace(setup: _Setup, values: str, memory_limit: int | None = None, dedupe: bool = False,
           trimmed: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())) -> StepTrace:
    """One attempt at the step with its `values` ("fake", "fake+real-inputs" or "real"; StepTrace.values);
    a real run stops past `memory_limit` live bytes. Random numbers come from one seed. `dedupe`: repeated
    blocks traced once (repeated.py), the runs `trimmed` names without their first, or last, block."""
    with seeded_random_numbers():
        return _trace_seeded(setup, values, memory_limit, dedupe, trimmed)


def _trace_seeded(setup: _Setup, values: str, memory_limit: int | None, dedupe: bool = False,
                  trimmed: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())) -> StepTrace:
    source, batch_size = setup.source, setup.batch_size
    real = values == "real"
    inputs = None
    if values != "fake":  # real tensors, made before fake mode starts; their fake twins are made on use
        with user_code(f"example_input({batch_size})", source):
            inputs = setup.example_input(batch_size)
    on_meta = (build_on_meta_weights(setup.build_model, setup.example_input, batch_size, source)
               if setup.construction == "meta" and not real else None)
    with ExitStack() as modes:  # left inside _step_on (the step's end), or here on an error before
        fake_mode = modes.enter_context(nullcontext() if real else FakeTensorMode(allow_non_fake_inputs=True))
        memory = modes.enter_context(LiveMemoryTracker())
        if real:
            model = _build_for_real(setup, inputs)
        else:
            model = _build_on_fake(setup, memory, fake_mode) if on_meta is None else on_meta
        if on_meta is not None:
            fake_twins(model)
        built = _Built(modes, model, memory, fake_mode, inputs)

        def step(at: _Setup) -> StepTrace:
            return _step_on(built, at, values, memory_limit, dedupe, trimmed)

        with _as_it_runs(setup), _sibling_beside(setup, values, step):  # the sibling forked within it
            return step(setup)


@dataclass(frozen=True)
class _Built:
    """A model built for a trace, inside the modes that trace it (`modes`: fake tensors, live memory)."""

    modes: ExitStack
    model: torch.nn.Module
    memory: LiveMemoryTracker
    fake_mode: FakeTensorMode | None
    inputs: Any
    """The real inputs made before the modes (values other than "fake"), else None."""


@contextmanager
def _sibling_beside(setup: _Setup, values: str, step: Callable[[_Setup], StepTrace]) -> Iterator[None]:
    """Around this process's step on a built model: the step at setup.sibling's batch size in a child forked
    from here (background.ForkedCall), which has the model built already, left to the sibling to collect
    (Sibling.collect) once this process's own is done. Only for steps on fake values, where a child can be
    forked; a child that fails, or an error here (which kills it), leaves the sibling's trace None. A sibling
    `made_elsewhere` is being traced by a child kept from an earlier step already: nothing is forked."""
    sibling = setup.sibling
    if sibling is not None and sibling.made_elsewhere:
        started = time.perf_counter()
        yield
        sibling.grace_s = CHILD_GRACE_S + time.perf_counter() - started
        return
    if sibling is not None:
        sibling.abandon()
    if sibling is None or values != "fake" or not can_fork():
        yield
        return
    sibling.trace = None
    twin = replace(setup, batch_size=sibling.batch_size, sibling=None, watch=setup.watch.silent())
    started = time.perf_counter()
    try:
        child = ForkedCall(lambda: step(twin), serves=sibling.serves, sent_as=sibling.sent_as)
    except OSError:  # no process to spare (EAGAIN, ENOMEM): the caller traces that batch itself
        yield
        return
    with child:
        yield
    sibling.child, sibling.grace_s = child, CHILD_GRACE_S + time.perf_counter() - started


def _step_on(built: _Built, setup: _Setup, values: str, memory_limit: int | None, dedupe: bool,
             trimmed: tuple[frozenset[str], frozenset[str]]) -> StepTrace:
    """The traced step of `built`'s model at setup.batch_size (see _trace_seeded); leaves the modes."""
    source, batch_size = setup.source, setup.batch_size
    real = values == "real"
    model, memory, fake_mode, inputs = built.model, built.memory, built.fake_mode, built.inputs
    with built.modes:
        if values == "fake":
            with user_code(f"example_input({batch_size})", source):
                inputs = setup.example_input(batch_size)
        _check_inputs(inputs, batch_size, source)
        dtype = PURE_LOW_PRECISION.get(setup.precision)
        if dtype is not None:
            _convert_floating_point(model, dtype)
            inputs = cast_inputs(inputs, dtype)
        adapted = _adapt(model, setup)
        if precision_of(setup.precision).float8:
            from advisor.profile.float8 import convert_to_float8  # its custom op registered when first asked for

            adapted = "; ".join(filter(None, (adapted, f"float8: {convert_to_float8(model)} Linear layers")))
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise UserError(f"{source or 'the model'} has no trainable parameters")
        checkpointed = checkpoint_blocks(model, source) if setup.checkpointing else ()
        runs = find_runs(model, *trimmed) if dedupe else []
        # make_optimizer's optimizers step only the kept blocks' parameters; OptimizerReplicas does the
        # held-out blocks' share again from their template's (a model file's own optimizer steps them all)
        replicate_optimizer = bool(runs) and setup.optimizer != FILE_OPTIMIZER
        held_out = held_out_ids(runs) if replicate_optimizer else set()
        stepped = [p for p in params if id(p) not in held_out]
        opt = _optimizer(setup, stepped)
        scaler = _GradScalerOps() if precision_of(setup.precision).grad_scaler else None
        tracker = _StepModuleTracker()
        recorder = _Recorder(tracker, memory, fake_mode if values == "fake+real-inputs" else None, setup.watch,
                             memory_limit)
        memory.module_source = recorder.module
        recorder.shortcut_optimizer = setup.optimizer != FILE_OPTIMIZER and not real
        recorder.first_step_aliases = setup.optimizer in FIRST_STEP_ALIASES and not real
        with tracker, memory.run_by_caller(), recorder, unpacked_fake_sequences(), grouped_mm_in_any_float():
            recorder.runs_memory = True
            recorder.phase = "optimizer"
            with _optimizer_code(setup, "the optimizer's first step"), nullcontext() if real else FiniteActivations():
                _create_optimizer_state(opt, stepped, keep_gradients=setup.accumulate_gradients, fake=not real)
            recorder.first_step_aliases = False
            recorder.host_scalars = _step_counters(opt)
            if replicate_optimizer:
                _state_alike(runs, opt, memory, setup.accumulate_gradients)
            _label_step_state(memory, model, opt, inputs, stepped, setup.accumulate_gradients)
            before = _template_gradients(runs, memory) if setup.accumulate_gradients else {}
            memory.open_step("forward")
            recorder.phase, recorder.recording = "forward", True
            fused = FusedAttentionDropout() if setup.attention == "cuda" else None
            recorder.attention_dropout = fused
            finite = FiniteActivations(recorder.answered_read_back)
            clock = BlockClock(runs, lambda: memory.tick, lambda: tracker.in_backward,
                               lambda: (0 if fused is None else fused.calls, finite.answered))
            # through backward too (checkpointed blocks run forward there); real values answer for themselves
            with _shortened_step(runs, setup.watch), clock, fused or nullcontext(), \
                    nullcontext() if real else finite:
                loss = _forward(model, inputs, setup)
                fused_calls = 0 if fused is None else fused.calls
                memory.start_phase("backward")
                recorder.phase, tracker.in_backward = "backward", True
                backward_runs_here()  # a child forked from now on could not trace (background.can_fork)
                with user_code("backward through the loss", source, DATA_DEPENDENT_ERRORS):
                    root = loss if scaler is None else scaler.scale(loss)
                    with EngineSums(root, lambda: len(recorder.records)) as sums:
                        root.backward()
                    del root
                recorder.mark_engine_sums(sums)
            if before:
                _check_accumulated_in_place(before, memory)
            elif runs and not replicate_optimizer:
                _copy_gradients(runs, memory, recorder)
            if replicate_optimizer:
                recorder.replicas = _optimizer_replicas(runs, opt)
            memory.label([p.grad for p in params if p.grad is not None], "gradients")
            _check_sparse_gradients(params, setup)
            memory.start_phase("optimizer")
            recorder.phase = "optimizer"
            if scaler is not None:
                scaler.unscale(params)
                scaler.check()
            with _optimizer_code(setup, "the optimizer's step"), nullcontext() if real else finite:
                opt.step()
            if scaler is not None:
                scaler.update()
            if not setup.accumulate_gradients:
                opt.zero_grad(set_to_none=True)
            del loss
            live_memory = memory.close_step()
    answered = finite.answered
    records: list[OpRecord] | tuple[OpRecord, ...] = recorder.flowing_records()
    repeats: tuple[tuple[int, int, int], ...] = ()
    if runs:
        located = locate(clock)
        records, repeats = expand_records(records, recorder.ticks, located)
        live_memory = expand_memory(live_memory, located, memory.copies(),
                                    memory.groups_in_result(recorder.replicas.groups) if recorder.replicas else ())
        fused_calls += clock.added(0)
        answered += clock.added(1)
    return StepTrace(batch_size, setup.precision, setup.optimizer, sum(p.numel() for p in params),
                     tuple(records), values,
                     dict(recorder.data_dependent), _params_by_module(model), live_memory, checkpointed,
                     setup.accumulate_gradients, setup.construction, setup.attention, fused_calls,
                     answered, type(opt.inner if isinstance(opt, MasterWeights) else opt).__name__,
                     _total_params(model),
                     adapted, tuple(run.describe() for run in runs), sum(len(run.held_out) for run in runs),
                     repeats)


@contextmanager
def _shortened_step(runs: list[Run], watch: TraceWatch) -> Iterator[None]:
    """The step through the runs' kept blocks only (repeated.shortened); any failure there but a
    deadline or a value the fake tensors cannot give is NotRepeated: the step is then traced in full,
    which raises the error again if it is the model's."""
    if not runs:
        yield
        return
    try:
        with shortened(runs):
            yield
    except (NotRepeated, *DATA_DEPENDENT_ERRORS):
        raise
    except Exception as exc:
        if watch.expired:
            raise
        raise NotRepeated(f"the step through the kept blocks failed: {exc!r}") from exc


def _state_alike(runs: list[Run], opt: torch.optim.Optimizer, memory: LiveMemoryTracker,
                 accumulate: bool) -> None:
    """The optimizer state (and, accumulating, the gradients) of the held-out blocks' parameters, which the
    optimizer does not step: storages alike their template's, alive through the step."""
    for run in runs:  # each run's copies after its own template's
        gradients: list[torch.Tensor] = []
        state: list[torch.Tensor] = []
        for template, _ in template_multiplicity([run]):
            state += _state_tensors(opt, template)
            if accumulate and template.grad is not None:
                gradients.append(template.grad)
        memory.register_alike(gradients, len(run.held_out))
        memory.register_alike(state, len(run.held_out))


def _optimizer_replicas(runs: list[Run], opt: torch.optim.Optimizer) -> OptimizerReplicas:
    """What the optimizer's step does to the template blocks' tensors is done again per held-out block."""
    seeds: list[tuple[torch.Tensor, tuple[int, int]]] = []
    for template, source in template_multiplicity(runs):
        seeds.append((template, source))
        if template.grad is not None:
            seeds.append((template.grad, source))
        seeds += [(t, source) for t in _state_tensors(opt, template)]
    return OptimizerReplicas(seeds)


def _state_tensors(opt: torch.optim.Optimizer, param: torch.nn.Parameter) -> list[torch.Tensor]:
    """The tensors of `param`'s optimizer state (moments, step counts), in the order the optimizer made them."""
    return [t for t in opt.state.get(param, {}).values() if isinstance(t, torch.Tensor)]


def _template_gradients(runs: list[Run], memory: LiveMemoryTracker) -> dict[torch.nn.Parameter, int | None]:
    """With gradient accumulation: each template parameter -> the storage of its gradient before the step."""
    return {template: memory.index_of(template.grad) if template.grad is not None else None
            for template, _ in template_multiplicity(runs)}


def _check_accumulated_in_place(before: dict[torch.nn.Parameter, int | None], memory: LiveMemoryTracker) -> None:
    """With gradient accumulation the held-out blocks keep the gradients they had (alike or their own):
    NotRepeated unless the template's backward added to its gradients in place, as theirs would have."""
    for template, storage in before.items():
        if template.grad is not None and memory.index_of(template.grad) != storage:
            raise NotRepeated("a gradient was replaced, not accumulated in place")


def _copy_gradients(runs: list[Run], memory: LiveMemoryTracker, recorder: _Recorder) -> None:
    """Gradients for the held-out blocks' parameters, as copies of their template's (registered with the
    memory tracker as such, outside the recorded ops), for an optimizer that steps every parameter."""
    recording, recorder.recording = recorder.recording, False
    try:
        for run in runs:
            for param, template, iteration in held_out_parameters(run):
                if template.grad is None:
                    continue
                with memory.silent():
                    param.grad = torch.empty_like(template.grad)
                memory.register_copy(param.grad, template.grad, iteration)
    finally:
        recorder.recording = recording


def _adapt(model: torch.nn.Module, setup: _Setup) -> str:
    """The setup's LoRA adapters and frozen-base storage applied to `model` (adapters.adapt): adapters in
    the pure precision's dtype, else fp32."""
    if not setup.adaptation.active:
        return ""
    dtype = PURE_LOW_PRECISION.get(setup.precision, torch.float32)
    return adapt(model, setup.adaptation, dtype, frozen_dtype(setup.precision), setup.source)


def frozen_dtype(precision: str) -> torch.dtype | None:
    """The dtype the rest of a quantized frozen base is kept in: the precision's 16-bit dtype (autocast's or
    the cast's), None (as built) for fp32 and tf32."""
    meaning = precision_of(precision)
    low = meaning.cast or meaning.autocast
    return None if low is None else TORCH_DTYPES[low]


def _total_params(model: torch.nn.Module) -> int:
    """Every parameter's elements, and those of quantized frozen weights (quantized.FrozenQuantizedLinear: none
    where that module was never imported)."""
    module = sys.modules.get("advisor.profile.quantized")
    frozen = () if module is None else [m for m in model.modules() if isinstance(m, module.FrozenQuantizedLinear)]
    quantized = sum(m.in_features * m.out_features for m in frozen)
    return sum(p.numel() for p in model.parameters()) + quantized


def _build_on_fake(setup: _Setup, memory: LiveMemoryTracker, fake_mode: FakeTensorMode) -> torch.nn.Module:
    """build_model() inside the current FakeTensorMode, `memory` registering the weights (run by
    ValuesLeftUnwritten: one dispatch layer for both); _ConstructorNeedsValues when it fails there:
    it computes with a tensor's values, or makes tensors fake mode cannot (`nn.LazyLinear`'s
    uninitialised parameters). The build on meta weights then runs it on real tensors, and reports
    the user's error if there is one."""
    try:
        with user_code("build_model()", setup.source, DATA_DEPENDENT_ERRORS), fake_tensor_conversions(), \
                memory.run_by_caller(), ValuesLeftUnwritten(memory, fake_mode):
            model = setup.build_model()
    except (*DATA_DEPENDENT_ERRORS, UserCodeError) as exc:
        raise _ConstructorNeedsValues from exc
    return _checked_model(model, setup.source)


def _optimizer(setup: _Setup, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The step's optimizer (_plain_optimizer), stepping fp32 masters of the parameters under a precision with
    master weights (master_weights.MasterWeights)."""
    if precision_of(setup.precision).master:
        return MasterWeights(params, lambda masters: _plain_optimizer(setup, masters))
    return _plain_optimizer(setup, params)


def _plain_optimizer(setup: _Setup, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """make_optimizer's, or the model file's optimizer(params) run as CUDA would run
    it: param groups that leave `foreach` unset get the multi-tensor form, torch's default for CUDA
    tensors (on the trace's CPU tensors torch would pick the per-parameter loop)."""
    if setup.optimizer != FILE_OPTIMIZER:
        return make_optimizer(setup.optimizer, params)
    assert setup.build_optimizer is not None, "trace_training_step checks it"
    with user_code("optimizer(params)", setup.source):
        opt = setup.build_optimizer(params)
    if not isinstance(opt, torch.optim.Optimizer):
        raise UserError(f"{setup.source or 'the model file'}: optimizer(params) returned {type(opt).__name__}, "
                        "not a torch.optim.Optimizer")
    for group in opt.param_groups:
        if group.get("foreach", False) is None and not group.get("fused"):
            group["foreach"] = True
    return opt


def _optimizer_code(setup: _Setup, what: str) -> Any:
    """The model file's optimizer runs as the user's code (its failures are theirs); ours does not."""
    return user_code(what, setup.source) if setup.optimizer == FILE_OPTIMIZER else nullcontext()


def _build_for_real(setup: _Setup, inputs: Any) -> torch.nn.Module:
    """build_model() on real CPU tensors, its weights initialised as its constructor does; lazy modules
    take their shapes from one forward on `inputs` without autograd, as a training script's first
    forward gives them."""
    with user_code("build_model()", setup.source):
        model = _checked_model(setup.build_model(), setup.source)
    _materialize_lazy_modules(model, lambda: inputs, setup.source)
    return model


def build_on_meta_weights(build_model: Callable[[], torch.nn.Module], example_input: Callable[[int], Any],
                          batch_size: int, source: str | None) -> torch.nn.Module:
    """build_model() on real tensors with its weights on the meta device (build.weights_on_meta), the
    way the trace and fvcore's forward profile build a model whose constructor needs tensor values.
    Lazy modules (`nn.LazyLinear`, `LazyConv2d`) then get their parameters' shapes from their first
    input, as a training script's first forward gives them: one forward on meta inputs, without
    autograd (their uninitialised parameters are on the meta device)."""
    with user_code("build_model()", source), weights_on_meta():
        model = _checked_model(build_model(), source)

    def meta_inputs() -> Any:
        with user_code(f"example_input({batch_size})", source), torch.device("meta"):
            return example_input(batch_size)

    _materialize_lazy_modules(model, meta_inputs, source)
    return model


def _materialize_lazy_modules(model: torch.nn.Module, inputs: Callable[[], Any], source: str | None) -> None:
    """Lazy modules (`nn.LazyLinear`) take their parameters' shapes from one forward on `inputs()`
    without autograd, as a training script's first forward gives them; nothing when there are none."""
    if any(isinstance(p, torch.nn.parameter.UninitializedParameter) for p in model.parameters()):
        batch = inputs()
        with torch.no_grad(), user_code("the model's first forward (its lazy modules take their shapes)", source):
            call_model(model, batch)


def _checked_model(model: object, source: str | None) -> torch.nn.Module:
    if not isinstance(model, torch.nn.Module):
        raise UserError(f"{source or 'the model file'}: build_model() returned {type(model).__name__}, "
                        "not a torch.nn.Module")
    return model


def _forward(model: torch.nn.Module, inputs: Any, setup: _Setup) -> torch.Tensor:
    """The model's forward and the loss, under autocast for the amp precisions."""
    autocast = precision_of(setup.precision).autocast
    autocast_dtype = None if autocast is None else TORCH_DTYPES[autocast]
    batch_size, source = setup.batch_size, setup.source
    with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
        with user_code(f"the model's forward on example_input({batch_size})", source, DATA_DEPENDENT_ERRORS):
            output = call_model(model, inputs)
        with user_code("loss_fn(output, inputs)", source, DATA_DEPENDENT_ERRORS):
            loss = setup.loss_fn(output, inputs)
    _check_loss(loss, source)
    return loss


SPARSE_GRADIENT_OPTIMIZERS = ("sgd", "momentum")
"""The optimizers here that accept sparse gradients (torch's SGD; its Adams raise)."""


def _check_sparse_gradients(params: list[torch.nn.Parameter], setup: _Setup) -> None:
    """A UserError when the model makes sparse gradients (`Embedding(sparse=True)`, `EmbeddingBag(
    sparse=True)`) and the optimizer cannot take them, as torch would say at the first real step."""
    sparse = any(p.grad is not None and p.grad.layout != torch.strided for p in params)
    if sparse and setup.optimizer not in (*SPARSE_GRADIENT_OPTIMIZERS, FILE_OPTIMIZER):  # torch judges the file's
        raise UserError(f"{setup.source or 'the model'} makes sparse gradients (an Embedding or EmbeddingBag with "
                        f"sparse=True), which {setup.optimizer} does not accept; use --optimizer "
                        f"{' or '.join(SPARSE_GRADIENT_OPTIMIZERS)}, or sparse=False")


def _create_optimizer_state(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter],
                            keep_gradients: bool, fake: bool = False) -> None:
    """One step on zero gradients: the optimizer creates its state (zeros, copies), as the first
    real step does. Gradients are then set to None, as `zero_grad()` leaves them between steps,
    unless earlier micro-batches' gradients are to be kept (gradient accumulation). On `fake` tensors,
    whose values nobody reads, a gradient that is not kept is the parameter itself, detached: no
    tensor to make for each parameter (a quarter of this step's time for the 7B example)."""
    for param in params:
        param.grad = param.detach() if fake and not keep_gradients else torch.zeros_like(param)
    opt.step()
    if not keep_gradients:
        opt.zero_grad(set_to_none=True)


def _step_counters(opt: torch.optim.Optimizer) -> set[int]:
    """ids of the optimizer's step counters: the 0-dim `step` tensors of torch.optim's state, which it keeps
    on the host (a capturable or fused optimizer keeps them on the device, but reads none back)."""
    return {id(state["step"]) for state in opt.state.values()
            if isinstance(state.get("step"), torch.Tensor) and state["step"].dim() == 0}


def _label_step_state(memory: LiveMemoryTracker, model: torch.nn.Module, opt: torch.optim.Optimizer,
                      inputs: Any, params: list[torch.nn.Parameter], keep_gradients: bool) -> None:
    """Tell the memory tracker the role of what exists when the step starts."""
    memory.label(list(model.parameters()) + list(model.buffers()), "weights")
    memory.label(list(opt.state.values()), "optimizer_state")
    memory.label([inputs], "inputs")
    if keep_gradients:
        memory.label([p.grad for p in params], "gradients")


class _GradScalerOps:
    """The ops torch.amp.GradScaler runs in an amp-fp16 step: scale the loss, unscale the gradients
    and check them for inf/NaN in one foreach kernel, read the check back to the host (GradScaler.step
    skips the optimizer's step on inf: `found_inf.item()`, a wait for the device), update the scale. Fake
    tensors cannot answer the check: the optimizer steps, as it does on every step without inf."""

    def __init__(self) -> None:
        self.scale_tensor = torch.full((), GRAD_SCALER_INIT_SCALE, dtype=torch.float32)
        self.growth_tracker = torch.zeros((), dtype=torch.int32)
        self.found_inf = torch.zeros(1, dtype=torch.float32)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_tensor

    def unscale(self, params: list[torch.nn.Parameter]) -> None:
        inverse = self.scale_tensor.double().reciprocal().float()
        grads = [p.grad for p in params if p.grad is not None]
        for dtype in {g.dtype for g in grads}:
            torch._amp_foreach_non_finite_check_and_unscale_([g for g in grads if g.dtype == dtype],
                                                             self.found_inf, inverse)

    def check(self) -> None:
        """GradScaler.step's read of the inf check before it lets the optimizer step."""
        self.found_inf.item()

    def update(self) -> None:
        torch._amp_update_scale_(self.scale_tensor, self.growth_tracker, self.found_inf, 2.0, 0.5, 2000)


def checkpoint_blocks(model: torch.nn.Module, source: str | None = None) -> tuple[str, ...]:
    """Run the model's repeated blocks under activation checkpointing, as Hugging Face's
    `gradient_checkpointing_enable()` does per layer: every module that sits in a ModuleList or
    Sequential beside another of its class and has parameters (the outermost such ones). Without
    any, each top-level child with parameters. Returns the checkpointed modules' names. A Hugging Face
    model's key-value cache is turned off (`config.use_cache`), as transformers turns it off under gradient
    checkpointing: a recomputed layer would append its keys and values to the cache a second time (twice
    the keys to attend to, and with an attention mask, shapes that no longer match)."""
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", False) is True:
        config.use_cache = False
    chosen = _repeated_blocks(model, "")
    if not chosen:
        chosen = [(name, child) for name, child in model.named_children() if _has_parameters(child)]
    if not chosen:
        raise UserError(f"{source or 'the model'} has no submodule with parameters to checkpoint; "
                        "drop --checkpointing")
    for _, module in chosen:
        _run_checkpointed(module)
    return tuple(name for name, _ in chosen)


def _repeated_blocks(module: torch.nn.Module, prefix: str) -> list[tuple[str, torch.nn.Module]]:
    container = isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential))
    classes = [type(child) for child in module.children()]
    found: list[tuple[str, torch.nn.Module]] = []
    for name, child in module.named_children():
        path = f"{prefix}.{name}" if prefix else name
        if container and classes.count(type(child)) > 1 and _has_parameters(child):
            found.append((path, child))
        else:
            found.extend(_repeated_blocks(child, path))
    return found


def _has_parameters(module: torch.nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _run_checkpointed(module: torch.nn.Module) -> None:
    forward = module.forward

    def checkpointed_forward(*args: Any, **kwargs: Any) -> Any:
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)

    module.forward = checkpointed_forward


def _params_by_module(model: torch.nn.Module) -> dict[str, int]:
    """Trainable parameters (elements) under each module, by its name in named_modules(). Summed from the
    leaves up, each module's own and its children's (one walk: asking each module for its parameters walks
    its subtree again, Llama-3-70B's 80 layers at every level); where a module or parameter is registered
    twice (tied weights) each module's own subtree is asked, which counts a shared parameter once."""
    modules = list(model.named_modules())
    if len(modules) != sum(1 for _ in model.named_modules(remove_duplicate=False)) or \
            sum(1 for _ in model.parameters()) != sum(1 for _ in model.named_parameters(remove_duplicate=False)):
        return {name: sum(p.numel() for p in module.parameters() if p.requires_grad) for name, module in modules}
    totals: dict[int, int] = {}
    for _, module in reversed(modules):  # children after their parents in named_modules(): leaves first
        totals[id(module)] = sum(p.numel() for p in module._parameters.values() if p is not None and p.requires_grad) \
            + sum(totals[id(child)] for child in module._modules.values() if child is not None)
    return {name: totals[id(module)] for name, module in modules}


def _check_inputs(inputs: Any, batch_size: int, source: str | None) -> None:
    tensors = [t for t in leaves(inputs) if isinstance(t, torch.Tensor)]
    if not tensors:
        raise UserError(f"{source or 'the model file'}: example_input({batch_size}) returned no tensor "
                        f"(got {type(inputs).__name__}); return a Tensor, a tuple or a dict of Tensors")


def _check_loss(loss: Any, source: str | None) -> None:
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
        what = type(loss).__name__ if not isinstance(loss, torch.Tensor) else f"a tensor of shape {tuple(loss.shape)}"
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            what = "a scalar that does not require grad"
        raise UserError(f"{source or 'the model file'}: the loss must be a scalar tensor that requires grad, "
                        f"got {what}")
