"""Memory of a model file's training step on many devices: trace twice, then one result per device."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from advisor.errors import UserError
from advisor.hardware.specs import GPUSpec, HardwareDB
from advisor.memory.estimate import (BatchMemoryModel, DeviceMemory, StepMemory, capped_replay, device_memory,
                                     parameter_formula_bytes)
from advisor.profile.background import ForkedCall, Served, can_fork
from advisor.profile.adapters import Adaptation
from advisor.profile.choices import FILE_OPTIMIZER, precision_of
from advisor.profile import trace_cache
from advisor.profile.coverage import coverage_of, trace_summary
from advisor.profile.model_file import ModelFile
from advisor.profile.real_run import REAL_RUN_MEMORY_SHARE, RealRunTooLarge
from advisor.profile.trace import Sibling, StepTrace, trace_training_step


def uneven_micro_batches(batch_size: int, micro_batch: int) -> str:
    """The sentence for a batch that is not a whole number of micro-batches, with the nearest that are
    (gradient accumulation runs batch / micro-batch equal micro-batches, as training loops do)."""
    lower = batch_size // micro_batch * micro_batch
    divisors = [d for d in range(micro_batch - 1, 0, -1) if batch_size % d == 0][:1] + \
               [d for d in range(micro_batch + 1, batch_size + 1) if batch_size % d == 0][:1]
    options = [f"--batch-size {lower}", f"--batch-size {lower + micro_batch}"] + [f"--micro-batch {d}" for d in divisors]
    return (f"--batch-size {batch_size} is not a multiple of --micro-batch {micro_batch} (gradient accumulation runs "
            f"equal micro-batches); try {', '.join(options[:-1])} or {options[-1]}")


@dataclass(frozen=True)
class MemorySettings:
    """How the step is run. `micro_batch` < `batch_size` means gradient accumulation over
    ceil(batch_size / micro_batch) micro-batches; `cuda_context_bytes` overrides the database's
    context figure."""

    batch_size: int
    precision: str = "fp32"
    optimizer: str = "adamw"
    checkpointing: bool = False
    micro_batch: int | None = None
    cuda_context_bytes: int | None = None
    trace_timeout_s: float | None = None
    """Stop a trace that takes longer (None or 0: no limit; profile/watch.py)."""
    adaptation: Adaptation = Adaptation()
    """LoRA adapters and the frozen base's storage (--lora, --lora-targets, --base-weights)."""

    def __post_init__(self) -> None:
        if self.micro_batch is not None and self.micro_batch > self.batch_size:
            raise UserError(f"--micro-batch {self.micro_batch} is larger than the batch size {self.batch_size}; "
                            "a micro-batch is a part of the batch")
        if self.micro_batch is not None and self.batch_size % self.micro_batch:
            raise UserError(uneven_micro_batches(self.batch_size, self.micro_batch))

    @property
    def traced_batch(self) -> int:
        """Samples in one forward/backward: the micro-batch when accumulating, else the batch."""
        return self.micro_batch or self.batch_size

    @property
    def accumulate_gradients(self) -> bool:
        return self.traced_batch < self.batch_size

    @property
    def accumulation_steps(self) -> int:
        return -(-self.batch_size // self.traced_batch)

    def to_dict(self) -> dict[str, Any]:
        settings = {k: v for k, v in asdict(self).items() if k != "adaptation"}
        return settings | {"accumulation_steps": self.accumulation_steps, "lora": self.adaptation.lora_rank,
                           "lora_targets": list(self.adaptation.lora_targets),
                           "lora_dropout": self.adaptation.lora_dropout,
                           "base_weights": self.adaptation.base_weights}


FROZEN_BYTES_PER_WEIGHT = {"bf16": 2.0, "int8": 1.0, "nf4": 0.5, "nf4-dq": 0.5}
"""What the parameter-count formula counts per frozen weight (codes only, as such formulas do)."""


def formula_bytes(trace: StepTrace, settings: MemorySettings) -> int:
    """The parameter-count baseline of `trace` (memory/estimate.parameter_formula_bytes), the frozen base
    counted at its storage's bytes per weight."""
    base = settings.adaptation.base_weights
    per_frozen = FROZEN_BYTES_PER_WEIGHT[base] if base else precision_of(settings.precision).weight_bytes
    frozen = max(0, trace.total_params - trace.params)
    return parameter_formula_bytes(trace.params, settings.precision, formula_optimizer(trace), int(frozen * per_frozen))


@dataclass(frozen=True)
class ShardedMemory:
    """One GPU's memory when `num_gpus` GPUs of its type share the job with `strategy` (advisor memory
    --num-gpus): each rank's trace re-played (estimate/parallel.py), NCCL's buffers in the overhead."""

    gpu_id: str
    num_gpus: int
    nodes: int
    strategy: str
    memory: DeviceMemory

    def to_dict(self) -> dict[str, Any]:
        return {"gpu_id": self.gpu_id, "num_gpus": self.num_gpus, "nodes": self.nodes, "strategy": self.strategy,
                **{k: v for k, v in self.memory.to_dict().items() if k != "gpu_id"}}


@dataclass(frozen=True)
class MemoryPlan:
    """Training memory of one model on every requested device."""

    model_name: str
    params: int
    settings: MemorySettings
    step: StepMemory
    batch_model: BatchMemoryModel
    results: tuple[DeviceMemory, ...]
    parameter_formula_bytes: int
    checkpointed: tuple[str, ...] = ()
    trace: StepTrace | None = field(default=None, repr=False, compare=False)
    second: StepTrace | None = field(default=None, repr=False, compare=False)
    """The step traced at twice the batch (the batch line's second point)."""
    sharded: tuple[ShardedMemory, ...] = ()
    """With --num-gpus: each GPU's memory per strategy."""
    unsharded: tuple[tuple[str, str], ...] = ()
    """With --num-gpus: (GPU id, why) for GPUs no machine holds that many of."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": {"name": self.model_name, "params": self.params},
            "settings": self.settings.to_dict(),
            "step": self.step.to_dict(),
            "batch_lines": {name: {"intercept_bytes": a, "bytes_per_sample": b}
                            for name, (a, b) in self.batch_model.lines().items()},
            "checkpointed": list(self.checkpointed),
            "parameter_formula_bytes": self.parameter_formula_bytes,
            "results": [r.to_dict() for r in self.results],
            "sharded": [r.to_dict() for r in self.sharded],
            "skipped": [{"gpu_id": gpu_id, "reason": why} for gpu_id, why in self.unsharded],
            "coverage": None if self.trace is None else coverage_of(self.trace).to_dict(),
            "trace": None if self.trace is None else trace_summary(self.trace),
        }


def trace_for_memory(model: ModelFile, settings: MemorySettings, batch_size: int,
                     attention: str = "cuda", progress: Callable[[str], None] | None = None,
                     sibling: Sibling | None = None) -> StepTrace:
    """One traced step of `model` at `batch_size` samples per forward, with the settings' options;
    attention with dropout as GPUs run it, unless `attention` is "cpu" (profile/attention.py).
    `progress` hears how far a long trace got. A step traced before with the same model and settings
    comes from the trace cache (trace_cache.py) and is stored there when traced (the step at `sibling`'s
    batch, profile.trace.Sibling, when the caller collects it: trace_pair)."""
    key = _cache_key(model, settings, batch_size, attention)
    cached = trace_cache.load(key)
    if cached is not None:
        return cached
    trace = trace_training_step(model.build_model, model.example_input, batch_size, settings.precision,
                                settings.optimizer, model.loss_fn, model.source,
                                checkpointing=settings.checkpointing,
                                accumulate_gradients=settings.accumulate_gradients, attention=attention,
                                timeout_s=settings.trace_timeout_s, progress=progress,
                                build_optimizer=model.optimizer, adaptation=settings.adaptation, sibling=sibling)
    trace_cache.store(key, trace)
    return trace


def _cache_key(model: ModelFile, settings: MemorySettings, batch_size: int, attention: str) -> str | None:
    """The trace cache's key of this step (None: not cached)."""
    return trace_cache.trace_key(model.fingerprint, batch_size=batch_size, seq_len=model.seq_len,
                                 precision=settings.precision, optimizer=settings.optimizer,
                                 checkpointing=settings.checkpointing,
                                 accumulate_gradients=settings.accumulate_gradients, attention=attention,
                                 adaptation=settings.adaptation)


def layouts_cache_key(model: ModelFile, settings: MemorySettings, attention: str = "cuda") -> str | None:
    """The trace cache's key of the layouts re-played from this step's trace pair (trace_both_batches):
    both traces' settings and the source of the code that sizes layouts (None: not cached)."""
    return trace_cache.trace_key(model.fingerprint, kind="layouts", batch_size=settings.traced_batch,
                                 seq_len=model.seq_len, precision=settings.precision, optimizer=settings.optimizer,
                                 checkpointing=settings.checkpointing,
                                 accumulate_gradients=settings.accumulate_gradients, attention=attention,
                                 adaptation=settings.adaptation,
                                 sizing=trace_cache.source_fingerprint("memory", "parallel", "estimate"))


class SecondTrace:
    """The step at twice the batch, as trace_pair leaves it: `get()` waits for the child tracing it (or traces
    it here where the child could not), once; the caller does what needs only the first step meanwhile, and
    `abandon()`s it where that raised (the child is stopped)."""

    def __init__(self, produce: Callable[[], StepTrace], abandon: Callable[[], None] = lambda: None,
                 served: Callable[[], Served | None] = lambda: None,
                 arrived: Callable[[], bool] = lambda: True, keep: Callable[[], None] | None = None) -> None:
        """`arrived`: whether `produce` would return without waiting for a child (one tracing the step sent it,
        or none traces it); `keep`: keep the serving child for the next estimate of the model (else abandon)."""
        self._produce: Callable[[], StepTrace] | None = produce
        self._abandon = abandon
        self._served = served
        self._arrived = arrived
        self._keep = keep or abandon
        self._trace: StepTrace | None = None

    @classmethod
    def ready(cls, trace: StepTrace) -> SecondTrace:
        return cls(lambda: trace)

    def get(self) -> StepTrace:
        if self._produce is not None:
            produce, self._produce = self._produce, None
            self._trace = produce()
        assert self._trace is not None
        return self._trace

    def waits(self) -> bool:
        """Whether get() would wait for the child still tracing it (False once it sent, or where get() traces it
        here: waiting for nothing else)."""
        return self._produce is not None and not self._arrived()

    def abandon(self) -> None:
        """Stop the child where it still runs (nothing once get() returned and no child serves)."""
        self._produce = None
        self._abandon()

    def done(self) -> None:
        """The estimate is made: a child that serves is kept for the next estimate of the same model (it traces
        that one's larger batch without a fork: keep_worker), where get() read its step; else stopped."""
        if self._produce is not None:  # never read: of no use
            self.abandon()
        else:
            self._keep()

    def served(self) -> Served | None:
        """The child tracing it, which stays to serve jobs on it where trace_pair was asked to (`serve`): a job
        sent before get() runs once the trace is sent. The caller closes it. None where none serves."""
        return self._served()


def trace_both_batches(model: ModelFile, settings: MemorySettings, trace: StepTrace | None = None,
                       progress: Callable[[str], None] = lambda message: None,
                       parallel: bool = True, attention: str = "cuda") -> tuple[StepTrace, StepTrace]:
    """The step traced at the settings' batch (or `trace`, reused) and at twice it (trace_pair), both done."""
    first, second = trace_pair(model, settings, trace, progress, parallel, attention)
    return first, second.get()


def trace_pair(model: ModelFile, settings: MemorySettings, trace: StepTrace | None = None,
               progress: Callable[[str], None] = lambda message: None,
               parallel: bool = True, attention: str = "cuda", serve: bool = False) -> tuple[StepTrace, SecondTrace]:
    """The step traced at the settings' batch (or `trace`, reused) and at twice it, for the memory
    line against batch size, with attention traced the `attention` way (trace_for_memory); at half it where
    the step runs for real (it branches on its weights' values) and twice the batch outgrows this machine's
    share for a real run (real_run.py), and a batch of 1 has no half. With
    `parallel` and a second CPU, the larger trace runs in a child forked once the model is built, while
    this process traces the first (profile.trace.Sibling), and is still running when this returns:
    SecondTrace.get() waits for it. The traces are the same either way, but that the child sends the second's
    memory alone (StepTrace.memory_only: all the memory line and the layouts read of it), having stored the
    whole step in the trace cache itself. With `serve`, that child then stays
    to run jobs on its trace (SecondTrace.served), until the caller closes it or abandon()s the pair; once the
    caller is done (SecondTrace.done) it is kept (keep_worker), and the next pair of the same model is traced
    by it, not by a child forked anew: no copy-on-write faults, torch's fake-tensor cache filled (methods.md)."""
    batch = settings.traced_batch
    assert trace is None or trace.batch_size == batch, "the trace must be of the settings' batch"
    if trace is None:  # the trace cache's, when a run before traced it; the second step's with it
        trace = trace_cache.load(_cache_key(model, settings, batch, attention))
        second = trace_cache.load(_cache_key(model, settings, 2 * batch, attention)) if trace else None
        if trace is not None and second is None and batch >= 2:  # where twice the batch outgrew a real run
            second = trace_cache.load(_cache_key(model, settings, batch // 2, attention))
        if second is not None:
            progress(f"using the steps of {model.source} traced at batches {batch} and {second.batch_size} before "
                     "(the trace cache)")
            return trace, SecondTrace.ready(second)

    def traced_here() -> StepTrace:
        progress(f"tracing again at batch {2 * batch} for the largest batch that fits")
        try:
            return trace_for_memory(model, settings, 2 * batch, attention)
        except RealRunTooLarge as exc:  # run for real (values from its weights), twice the batch outgrew this machine
            if batch < 2:
                raise RealRunTooLarge(
                    f"{model.source}: its step at batch 1 runs for real on this CPU, but the memory line against "
                    "batch size needs a second step, at batch 2, which outgrew this machine's share for a real run "
                    f"(1/{REAL_RUN_MEMORY_SHARE} of the available memory); plan on a "
                    "machine with more memory") from exc
        progress(f"tracing again at batch {batch // 2} instead: at batch {2 * batch} its step run for real "
                 "outgrew this machine")
        return trace_for_memory(model, settings, batch // 2, attention)  # which stores it in the trace cache

    worker = _kept_worker(model, settings, 2 * batch, attention) if serve and parallel and trace is None else None
    if worker is None and (trace is not None or not (parallel and can_fork())):
        if trace is None:
            progress(f"tracing a training step of {model.source} at batch {batch}")
            trace = trace_for_memory(model, settings, batch, attention, progress)
        return trace, SecondTrace(traced_here)
    progress(f"tracing a training step of {model.source} at batches {batch} and {2 * batch} (two processes)")
    second_key = _cache_key(model, settings, 2 * batch, attention)

    def kept_and_sent(found: StepTrace) -> StepTrace:  # in the child: the whole step cached, its memory sent
        trace_cache.store(second_key, found)
        return found.memory_only()

    if worker is not None:  # the child kept from the estimate before: it traces twice the batch from now
        sibling = Sibling(2 * batch, serves=True, child=worker, made_elsewhere=True)
    else:  # a child forked once the model is built
        sibling = Sibling(2 * batch, serves=serve, sent_as=kept_and_sent)
        if serve:
            _worker_model[:] = [model]  # the child's, to trace again
    try:
        trace = trace_for_memory(model, settings, batch, attention, progress, sibling)
    except BaseException:  # a step that failed once the child was forked: the child is of no use
        sibling.abandon()
        raise

    def collected() -> StepTrace:
        found = sibling.collect()
        return traced_here() if found is None else found

    def keep() -> None:
        child = sibling.release()
        if child is not None:
            keep_worker(worker_key(model), child)

    return trace, SecondTrace(collected, sibling.abandon, sibling.served, sibling.ready, keep if serve else None)


WORKER_IDLE_S = 0.5
"""Seconds an estimate's end waits for its serving child to drop the jobs left (its current re-play ends), before
it stops the child instead of keeping it."""

KEPT_WORKERS = 2
"""Serving children kept at most, the last estimates' of different models (two: a comparison of two models
alternates between them)."""

_kept: list[tuple[tuple[str, int | None, bool], ForkedCall[StepTrace]]] = []
"""The serving children kept from the last estimates, the latest last, with worker_key of their model."""

_worker_model: list[ModelFile] = []
"""The model of the last serving child forked: in that child, the model it traces again (_trace_again)."""


def worker_key(model: ModelFile) -> tuple[str, int | None, bool]:
    """What a kept child's model must share with the next estimate's to trace it: the trace cache's identity of a
    model file (its fingerprint: the file and its neighbours, or a named model's config) and its inputs'
    length and padding."""
    return model.fingerprint, model.seq_len, model.padded


def keep_worker(key: tuple[str, int | None, bool], child: ForkedCall[StepTrace]) -> None:
    """Keep `child` (which served this estimate) for the next estimate of the model of `key`, in place of any
    kept for it, the oldest stopped beyond KEPT_WORKERS; stopped instead where it does not drop its jobs within
    WORKER_IDLE_S, or the model has no fingerprint."""
    _close_kept(lambda kept: kept == key)
    if key[0] and child.idle(WORKER_IDLE_S):
        _kept.append((key, child))
    else:
        child.close()
    while len(_kept) > KEPT_WORKERS:
        _kept.pop(0)[1].close()


def close_kept_worker() -> None:
    """Stop every kept child."""
    _close_kept(lambda key: True)


def _close_kept(which: Callable[[tuple[str, int | None, bool]], bool]) -> None:
    for key, child in [(key, child) for key, child in _kept if which(key)]:
        _kept.remove((key, child))
        child.close()


def _kept_worker(model: ModelFile, settings: MemorySettings, batch_size: int,
                 attention: str) -> ForkedCall[StepTrace] | None:
    """The child kept for `model`, set tracing its step at `batch_size` (its memory sent; the whole step in the
    trace cache); None where none was kept for it or it does not take the job (it is stopped)."""
    found = [(key, child) for key, child in _kept if key == worker_key(model)]
    if not found:
        return None
    _kept.remove(found[0])
    child = found[0][1]
    if child.again(_trace_again, settings, batch_size, attention):
        return child
    child.close()
    return None


def _trace_again(settings: MemorySettings, batch_size: int, attention: str) -> tuple[StepTrace, StepTrace]:
    """In a kept child: its model's step at `batch_size` (trace_for_memory, which stores it in the trace cache),
    and its memory, as the child sends it."""
    assert _worker_model, "a kept child knows its model"
    found = trace_for_memory(_worker_model[0], settings, batch_size, attention)
    return found, found.memory_only()


def step_memory(trace: StepTrace, second: StepTrace) -> tuple[StepMemory, BatchMemoryModel]:
    """The step's device-independent memory from `trace`, and its line against batch size through
    `second`, a trace at a larger batch."""
    step = StepMemory.of_trace(trace)
    return step, BatchMemoryModel(step, StepMemory.of_trace(second))


def formula_optimizer(trace: StepTrace) -> str:
    """The optimizer name the parameter-count formula knows: the trace's, or for the model file's own
    its class ("AdamW" -> "adamw"; an SGD's momentum is not known there, so it counts none)."""
    return trace.optimizer_class.lower() if trace.optimizer == FILE_OPTIMIZER else trace.optimizer


def plan_memory(
    model: ModelFile,
    db: HardwareDB,
    gpus: Sequence[GPUSpec],
    settings: MemorySettings,
    trace: StepTrace | None = None,
    progress: Callable[[str], None] = lambda message: None,
) -> MemoryPlan:
    """Trace the step at the settings' batch (or reuse `trace`) and at twice it, then the memory
    on each of `gpus`."""
    trace, second = trace_both_batches(model, settings, trace, progress)
    step, batch_model = step_memory(trace, second)
    capped = capped_replay(trace.memory)
    results = tuple(device_memory(step, gpu, db.memory_overhead(gpu), batch_model, settings.cuda_context_bytes, 0,
                                  capped) for gpu in gpus)
    return MemoryPlan(model.name, trace.params, settings, step, batch_model, results,
                      formula_bytes(trace, settings),
                      trace.checkpointed, trace, second)
