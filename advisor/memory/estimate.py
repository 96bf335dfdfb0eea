"""Peak training memory on a device, its breakdown, whether it fits and the largest batch that does.

From a traced step (advisor.profile.trace) the live storages give the tensors' peak and what is
live at it; a replay of the CUDA caching allocator (allocator.py) adds its rounding and
fragmentation; the device's architecture adds the CUDA context and the cuBLAS workspace
(hwdb/memory-overhead.yaml). Memory grows linearly with the batch within each phase of the step
(forward, backward, optimizer), so two traces, at the batch and at twice it, give every phase's
line, and the largest batch that fits a device follows without tracing each batch size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from advisor.hardware.specs import MemoryOverhead
from advisor.memory.allocator import MIN_BLOCK, AllocatorPeaks, replay
from advisor.profile.choices import precision_of
from advisor.profile.live_memory import CATEGORIES, LiveMemory
from advisor.profile.trace import StepTrace

BREAKDOWN_KEYS = ("weights", "gradients", "optimizer", "activations", "overhead")
"""The `memory` object of `advisor estimate --json` (PRODUCT.md); its values sum to the peak."""

BREAKDOWN_OF_CATEGORY = {
    "weights": "weights",
    "weight_copies": "weights",
    "gradients": "gradients",
    "optimizer_state": "optimizer",
    "optimizer_temporaries": "optimizer",
    "inputs": "activations",
    "activations": "activations",
    "backward_temporaries": "activations",
}
assert set(BREAKDOWN_OF_CATEGORY) == set(CATEGORIES)


@dataclass(frozen=True)
class StepMemory:
    """Device-independent memory of one traced step under torch's CUDA caching allocator, bytes.

    `tensor_peak` is the highest sum of live tensors (each rounded to the allocator's 512 bytes),
    `by_category` what was live then; `allocated`/`reserved` are the replayed allocator's peaks
    (what max_memory_allocated/max_memory_reserved report, without the cuBLAS workspace)."""

    batch_size: int
    tensor_peak: int
    peak_phase: str
    by_category: dict[str, int]
    phase_peaks: dict[str, int]
    allocated: int
    reserved: int

    @classmethod
    def of_trace(cls, trace: StepTrace) -> StepMemory:
        assert trace.memory is not None, "the trace recorded no memory"
        sizes = trace.memory.sizes(MIN_BLOCK)
        phase_peaks = trace.memory.phase_peaks(MIN_BLOCK, sizes)
        peak = max(phase_peaks.values(), key=lambda p: p.bytes)  # the first phase to reach it, as peak() finds
        allocator = replay(trace.memory, sizes=sizes)
        return cls(trace.batch_size, peak.bytes, peak.phase, dict(peak.by_category),
                   {phase: p.bytes for phase, p in phase_peaks.items()}, allocator.allocated, allocator.reserved)

    @property
    def fragmentation(self) -> int:
        """Bytes the allocator holds beyond the tensors' peak (rounding remainders, cached blocks)."""
        return self.reserved - self.tensor_peak

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"fragmentation": self.fragmentation}


@dataclass(frozen=True)
class BatchMemoryModel:
    """Peak memory against batch size: each phase's tensor peak is a line through two traced
    batches and the step's peak the highest of them. The allocator's reserve grows in whole
    segments, so it is taken as the tensors' peak times the reserve ratio of the larger trace.
    `first` is the step at the settings' batch; `second` at another (twice it, or half where a step run
    for real at twice it outgrew this machine: memory.plan.trace_pair)."""

    first: StepMemory
    second: StepMemory

    def __post_init__(self) -> None:
        assert self.first.batch_size != self.second.batch_size, "two different batch sizes"

    def lines(self) -> dict[str, tuple[float, float]]:
        """Per phase: (intercept bytes, bytes per sample) of the tensors' peak."""
        span = self.second.batch_size - self.first.batch_size
        lines = {}
        for phase, at_first in self.first.phase_peaks.items():
            slope = (self.second.phase_peaks[phase] - at_first) / span
            lines[phase] = (at_first - slope * self.first.batch_size, slope)
        return lines

    @property
    def reserve_ratio(self) -> float:
        """The allocator's reserve over the tensors' peak, at the larger traced batch (>= 1)."""
        larger = max(self.first, self.second, key=lambda step: step.batch_size)
        return max(larger.reserved / larger.tensor_peak, 1.0)

    def reserved_at(self, batch_size: int) -> float:
        """Predicted allocator reserve (bytes) at `batch_size`."""
        return self.reserve_ratio * max(a + b * batch_size for a, b in self.lines().values())

    def max_batch_size(self, budget_bytes: float) -> int | None:
        """The largest batch whose reserve fits in `budget_bytes`: 0 when not even one sample fits,
        None when memory does not grow with the batch."""
        tensors_budget = budget_bytes / self.reserve_ratio
        lines = self.lines().values()
        limits = [math.floor((tensors_budget - intercept) / slope) for intercept, slope in lines if slope > 0]
        if not limits:
            return None
        if any(intercept > tensors_budget for intercept, slope in lines if slope <= 0):
            return 0
        return max(min(limits), 0)


@dataclass(frozen=True)
class DeviceMemory:
    """Training memory of the model on one device, bytes. `peak_bytes` is what the device must hold
    (CUDA context + the allocator's reserve, cuBLAS workspace included) and `memory` splits it into
    PRODUCT.md's five parts; `detail` splits it finer."""

    gpu_id: str
    capacity_bytes: int
    peak_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    memory: dict[str, int]
    detail: dict[str, int]
    fits: bool
    missing_bytes: int
    max_batch_size: int | None
    overhead_sources: tuple[str, ...]
    allocator_flushes: int = 0
    """How often, in the two steps re-played, the caching allocator found no room for a new segment and
    released its cached free segments to fit (torch.cuda.memory_stats()["num_alloc_retries"]): the step fits
    only below the reserve it would take on a larger device, and each flush synchronizes the device."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class MemoryDevice(Protocol):
    """What the memory model needs of a device: its id and capacity (a GPUSpec, or a local device)."""

    @property
    def id(self) -> str: ...

    @property
    def memory_bytes(self) -> int: ...


CappedReplay = Callable[[int], AllocatorPeaks]
"""The step's allocator re-played with at most the given bytes for its segments (allocator.replay's
`capacity`)."""


def capped_replay(memory: LiveMemory) -> CappedReplay:
    """allocator.replay of `memory` under a capacity, each capacity re-played once (nothing is done until a
    device asks: most ask for none)."""
    done: dict[int, AllocatorPeaks] = {}

    def replayed(capacity: int) -> AllocatorPeaks:
        if capacity not in done:
            done[capacity] = replay(memory, capacity=capacity)
        return done[capacity]

    return replayed


def device_memory(
    step: StepMemory,
    gpu: MemoryDevice,
    overhead: MemoryOverhead,
    batch_model: BatchMemoryModel | None = None,
    cuda_context_bytes: int | None = None,
    communicator_bytes: int = 0,
    capped: CappedReplay | None = None,
) -> DeviceMemory:
    """Memory of the traced step on `gpu`. `cuda_context_bytes` overrides the architecture's figure
    (an eager-loading stack, or one measured on the user's machine); `communicator_bytes`: NCCL's
    buffers of a multi-GPU job (outside torch's allocator, like the context). `capped`: the step's
    allocator re-played under a capacity, asked where the device holds the step's allocated peak but not
    the reserve it takes unhindered: there torch releases its cached segments when cudaMalloc fails, and
    the step fits if that re-play does not run out (its reserve, at most the device's room, is the peak)."""
    context = context_bytes(overhead, cuda_context_bytes)
    workspace = overhead.cublas_workspace_bytes
    outside = context + communicator_bytes
    room = gpu.memory_bytes - outside - workspace  # what the allocator's segments may take
    allocated, reserved, flushes = step.allocated, step.reserved, 0
    if capped is not None and allocated <= room < reserved:
        within = capped(room)
        if not within.out_of_memory:
            assert within.reserved <= room, "a capped re-play reserved more than its capacity"
            allocated, reserved, flushes = within.allocated, within.reserved, within.flushes
    detail = {category: step.by_category.get(category, 0) for category in CATEGORIES}
    detail |= {"allocator_reserve": reserved - step.tensor_peak, "cublas_workspace": workspace,
               "cuda_context": context}
    if communicator_bytes:
        detail["communicator"] = communicator_bytes
    memory = dict.fromkeys(BREAKDOWN_KEYS, 0)
    for category, key in BREAKDOWN_OF_CATEGORY.items():
        memory[key] += detail[category]
    memory["overhead"] = detail["allocator_reserve"] + workspace + outside
    peak = sum(memory.values())
    assert peak == outside + workspace + reserved, "the breakdown must add up to the peak"
    max_batch = None if batch_model is None else batch_model.max_batch_size(room)
    if flushes and max_batch is not None:  # the line's reserve is the unhindered one: at least this batch fits
        max_batch = max(max_batch, step.batch_size)
    return DeviceMemory(
        gpu_id=gpu.id,
        capacity_bytes=gpu.memory_bytes,
        peak_bytes=peak,
        allocated_bytes=allocated + workspace,
        reserved_bytes=reserved + workspace,
        memory=memory,
        detail=detail,
        fits=peak <= gpu.memory_bytes,
        missing_bytes=max(peak - gpu.memory_bytes, 0),
        max_batch_size=max_batch,
        overhead_sources=overhead.sources,
        allocator_flushes=flushes,
    )


def context_bytes(overhead: MemoryOverhead, cuda_context_bytes: int | None = None) -> int:
    """The CUDA context's bytes: `cuda_context_bytes` where given, else the architecture's figure."""
    return overhead.cuda_context_bytes if cuda_context_bytes is None else cuda_context_bytes


def cannot_hold(tensor_peak: int, gpu: MemoryDevice, overhead: MemoryOverhead, cuda_context_bytes: int | None = None,
                communicator_bytes: int = 0) -> bool:
    """Whether a step whose tensors peak at `tensor_peak` bytes surely does not fit on `gpu`, before its
    allocator is re-played: the allocator reserves at least the tensors' peak, so device_memory's peak
    (with the same arguments) is at least this sum."""
    fixed = context_bytes(overhead, cuda_context_bytes) + communicator_bytes + overhead.cublas_workspace_bytes
    return fixed + tensor_peak > gpu.memory_bytes


def parameter_formula_bytes(params: int, precision: str, optimizer: str, frozen_bytes: int = 0) -> int:
    """The parameter-count baseline (as `accelerate estimate-memory` and DeepSpeed's estimators
    compute it): weights + gradients + optimizer state per trainable parameter, no activations, no
    overhead, plus `frozen_bytes` of frozen weights (LoRA's base).
    fp32: 4 + 4 + state; amp: + a 2-byte low-precision copy; pure bf16/fp16: 2 + 2 + state at 2;
    bf16-master: 2 + 2 + a 4-byte master and its 4-byte gradient + state at 4.
    State per parameter: Adam(W) 2 values (fused or not), momentum 1, SGD and Adafactor (factored) ~0;
    adamw8bit 2 bytes."""
    meaning = precision_of(precision)
    stored = meaning.weight_bytes  # weights and gradients in the stored dtype
    master = 8 if meaning.master else 0  # the fp32 master and its fp32 gradient
    extra = master + meaning.low_precision_copy_bytes
    if optimizer == "adamw8bit":
        return params * (stored * 2 + 2 + extra) + frozen_bytes
    state_values = {"adam": 2, "adamw": 2, "momentum": 1}.get(optimizer.removesuffix("-fused"), 0)
    return params * (stored * 2 + meaning.state_bytes * state_values + extra) + frozen_bytes
