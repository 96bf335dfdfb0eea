"""Time of one training step on one device, op by op, from the trace and the device's calibration.

Per op (seconds):
- a compute op (GEMM, convolution, attention): FLOPs / (roofline x efficiency), where the roofline is
  min(peak FLOP/s of its dtype, arithmetic intensity x sustained bandwidth), the efficiency the
  calibrated curve of its series at its size, times (on a GPU) how well its tiles fill the SMs;
- a memory op: bytes / (bandwidth x calibrated efficiency at its size); its FLOPs at the fp32 peak
  bound it from below;
- on a GPU, the values an op reads soon after another op made them (while the traffic since fits the
  GPU's L2: cached_reads) at L2_OVER_DRAM times the bandwidth (Ada's and Blackwell's 64-128 MB L2 hold a
  step's mid-sized activations from one op to the next; Ampere's 6 MB almost none);
- the host's time to issue it (dispatch, plus autograd recording in forward and backward; on a GPU,
  what an op costs the host inside a real eager step: STEP_HOST_RATIO);
- on a GPU, dropout as CUDA's one fused kernel where the CPU trace recorded three (lowering.py);
- on a GPU, a convolution by the fastest algorithm cuDNN's autotuner can choose: Winograd for fp32
  3x3 stride-1 convolutions; tensor-core implicit GEMM, plus the transposes to NHWC and back that
  channels-first (NCHW) tensors need; fp32 CUDA cores where TF32 tensor cores gain nothing;
- on a CPU, the page faults of large new outputs (calibrated `fresh_pages`), added to the kernel:
  glibc hands such blocks back to the kernel on free, so every step faults them in again.

On a CPU the host runs the op, so the step is the sum of host and kernel times. On a GPU the host
queues kernels ahead of the device: the device starts an op when the previous one is done and the
host has issued it, so a step of many small ops waits on the host (overhead-bound). In a training loop
the host goes on to the next step while the device runs this one: a step that reads nothing back takes
max(host, kernels). A value read back to the host (OpRecord.synchronizes: `.item()`, a tensor in an
`if`) stops the host until the device has run its queue; the device then waits for the host to issue
what follows, and such a step is timed as the second of two in a row.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from advisor.calibration.peaks import roofline, roofline_work
from advisor.calibration.profile import CalibrationProfile, SeriesProfile
from advisor.calibration.shapes import call_key
from advisor.calibration.suite import TORCH_DTYPES
from advisor.estimate.fusion import compiled_records, fusible
from advisor.estimate.lowering import cuda_records
from advisor.estimate.ops import (
    BATCH_NORM_CHANNEL_PASSES,
    BATCH_NORMS,
    CUDNN_OPS,
    DTYPE_FALLBACK,
    FRESH_OUTPUT_SERIES,
    FRESH_PAGES_MIN_BYTES,
    FUSED_ATTENTION,
    HALF_DTYPES,
    TENSOR_CORE_DTYPES,
    TF32_TRANSPOSED_OPERAND_EFFICIENCY,
    WINOGRAD_MULTIPLY_SAVING,
    MISALIGNED_GEMM_FP32_MULTIPLE,
    OpClass,
    attention_dropout_seconds,
    channel_block_seconds,
    classify,
    fused_attention_efficiency,
    layout_transposes,
    max_threads_per_sm,
    misaligned_gemm,
    moved_bytes,
    pointwise_product,
    pointwise_tf32_efficiency,
    wave_efficiency,
    winograd_eligible,
)
from advisor.hardware.specs import GPUSpec
from advisor.profile.trace import OpRecord, StepTrace

BOUNDS = ("compute", "memory", "overhead")
INPUT_BOUND = "input"
"""The fourth part of a step: the batch's copy to the GPU and the GPU waiting for the input pipeline
(advisor.pipeline.supply)."""

LOOP_READ_BACK = OpRecord("optimizer", "(loop)", "_local_scalar_dense", 0.0, 0, 0, ("float32",), False, True,
                          synchronizes=True)
"""A value the training loop reads back at the end of every step (`loss.item()` for a log or a progress bar,
Hugging Face Trainer's NaN check of the loss): no kernel; the host waits there for the device's queue, so it
cannot run ahead into the next step (--sync-each-step)."""


@dataclass(frozen=True)
class DeviceModel:
    """What the time model needs of a device: its calibration and, for a GPU, its SM count."""

    id: str
    kind: str
    """"gpu" or "cpu"."""
    profile: CalibrationProfile
    sm_count: int | None = None
    architecture: str | None = None
    """A GPU's architecture in the hardware database ("hopper"): which fused attention kernels it runs."""
    clock_hz: float | None = None
    """A GPU's boost clock (its integer instruction rate, with sm_count)."""
    threads_per_sm: int = 2048
    """A GPU's resident threads per SM (ops.max_threads_per_sm of its compute capability)."""
    channels_last: bool = False
    """Time the step as if its tensors were channels-last: no op pays for channels-first layouts
    (OpTime.layout_s), what the channels-last tip compares against."""
    measured_s: Mapping[tuple, float] | None = field(default=None, compare=False, hash=False)
    """Seconds of one call of ops timed on this device at their exact shapes (a local CPU's convolutions and
    batch norms: calibration/shapes.py), by shapes.call_key; they replace the calibrated curves for those calls."""
    l2_cache_bytes: int | None = None
    """A GPU's L2 cache (bytes): values an op reads soon after another made them come from it (cached_reads)."""
    compute_capability: str | None = None
    """A GPU's CUDA compute capability ("9.0"): which fused attention kernels PyTorch runs on it."""

    def __post_init__(self) -> None:
        assert self.kind in ("gpu", "cpu"), self.kind

    @classmethod
    def of_gpu(cls, device_id: str, profile: CalibrationProfile, spec: GPUSpec | None,
               sm_count: int | None = None, compute_capability: str | None = None,
               l2_cache_bytes: int | None = None) -> DeviceModel:
        """A GPU timed with `profile`: its database entry's SM count, compute capability and L2 size (else
        `sm_count`, `compute_capability` and `l2_cache_bytes`, what torch.cuda reports of a local GPU the
        database lacks), architecture and boost clock (None where the GPU is not in the database)."""
        capability = spec.compute_capability if spec and spec.compute_capability else compute_capability
        return cls(device_id, "gpu", profile, spec.sm_count if spec else sm_count,
                   spec.architecture if spec else None, spec.boost_clock_hz if spec else None,
                   max_threads_per_sm(capability),
                   l2_cache_bytes=spec.l2_cache_bytes if spec and spec.l2_cache_bytes else l2_cache_bytes,
                   compute_capability=capability)


@dataclass(slots=True)
class OpTime:
    """One op of the step on one device. Seconds. (Not frozen: a step makes one per op and device, 220,000
    for the 7B example over the database, and a frozen dataclass takes 7x longer to make; treat as read-only.)"""

    phase: str
    module: str
    op: str
    series: str
    dtype: str
    flops: float
    bytes: int
    compute_s: float
    """FLOPs at the calibrated compute rate (0 for a memory op with no FLOPs)."""
    memory_s: float
    """Bytes at the calibrated bandwidth (for a compute op, included in its roofline), plus page faults
    of fresh outputs on a CPU."""
    kernel_s: float
    """Device time of the op: the longer of compute and memory traffic, plus page faults (which stop
    both)."""
    host_s: float
    """Host time to issue it."""
    wait_s: float
    """Time the device sat idle before it, waiting for the host (0 on a CPU)."""
    bound: str
    layout_s: float = 0.0
    """Of memory_s, what the op's channels-first (NCHW) tensors cost over channels-last ones: a tensor-core
    convolution's transposes to NHWC and back, a batch norm's wait on its one-block-per-channel passes
    (ops.channel_block_seconds); 0 for any other op."""
    calls: int = 1
    """Calls this entry stands for (a repeated block's op, or a micro-batch's, times its repeats): its
    flops, bytes and seconds are the total over them."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase, "module": self.module, "op": self.op, "series": self.series, "dtype": self.dtype,
            "flops": self.flops, "bytes": self.bytes, "compute_s": self.compute_s, "memory_s": self.memory_s,
            "kernel_s": self.kernel_s, "host_s": self.host_s, "wait_s": self.wait_s, "bound": self.bound,
            "layout_s": self.layout_s,
        }


@dataclass(frozen=True)
class StepTime:
    """A training step on one device. Seconds."""

    device_id: str
    step_s: float
    by_bound: dict[str, float]
    """Seconds of the step spent in compute-bound ops, memory-bound ops, and waiting on the host
    (GPU) or in the host's per-op work (CPU); they add up to step_s."""
    calibration: str
    """"measured" or "default" (a documented reference profile, no measurement of this device)."""
    calibration_source: str
    ops: tuple[OpTime, ...] = field(repr=False)

    @property
    def bound(self) -> str:
        """What limits the step: the largest part of by_bound ("input" when the GPU waits for its batches
        more than for anything else)."""
        return max(self.by_bound, key=lambda b: self.by_bound[b])

    def with_input(self, input_s: float) -> StepTime:
        """The step when the GPU also spends `input_s` seconds on its input (by_bound["input"]): the
        batch's copy from the host and any wait for the input pipeline."""
        assert input_s >= 0, input_s
        return replace(self, step_s=self.step_s + input_s, by_bound={**self.by_bound, INPUT_BOUND: input_s})

    @property
    def layout_s(self) -> float:
        """Seconds of the step spent transposing channels-first tensors to NHWC and back for
        tensor-core convolutions (part of channels_first_s)."""
        return sum(op.layout_s for op in self.ops if op.op not in BATCH_NORM_CHANNEL_PASSES)

    @property
    def channels_first_s(self) -> float:
        """Seconds the step's channels-first (NCHW) tensors cost over channels-last ones: the convolutions'
        transposes (layout_s) and batch norms' waits on their per-channel blocks: what channels-last tensors
        would save."""
        return sum(op.layout_s for op in self.ops)

    def top_ops(self, count: int = 10) -> list[dict[str, Any]]:
        """The ops (by aten name and phase) that take the most time, with their share and bound."""
        groups: dict[tuple[str, str], list[OpTime]] = {}
        for op in self.ops:
            groups.setdefault((op.op, op.phase), []).append(op)
        rows = []
        for (name, phase), ops in groups.items():
            seconds = sum(o.kernel_s + o.wait_s for o in ops)
            by_bound = dict.fromkeys(BOUNDS, 0.0)
            for o in ops:
                by_bound[o.bound] += o.kernel_s + o.wait_s
            rows.append({"op": name, "phase": phase, "calls": sum(o.calls for o in ops), "seconds": seconds,
                         "share": seconds / self.step_s if self.step_s else 0.0,
                         "flops": sum(o.flops for o in ops), "bytes": sum(o.bytes for o in ops),
                         "bound": max(BOUNDS, key=lambda b: by_bound[b])})
        rows.sort(key=lambda row: -row["seconds"])
        return rows[:count]

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        return {"device_id": self.device_id, "step_time_s": self.step_s, "bound": self.bound,
                "by_bound_s": dict(self.by_bound), "layout_transposes_s": self.layout_s,
                "channels_first_s": self.channels_first_s,
                "calibration": self.calibration,
                "calibration_source": self.calibration_source, "top_ops": self.top_ops(top)}


SERIES_FALLBACK = {
    "gemm": ("gemm",),
    "conv": ("conv", "gemm"),
    "conv_backward": ("conv_backward", "gemm"),
    "conv_dw": ("conv_dw", "conv", "gemm"),
    "conv_dw_backward": ("conv_dw_backward", "conv_backward", "gemm"),
}
"""The series that time an op when its own is missing from a profile, in order (memory ops: copy)."""


def _series(profile: CalibrationProfile, name: str, dtype: str) -> SeriesProfile:
    """The calibrated series for (name, dtype), falling back to the dtype the device runs it in, and
    by SERIES_FALLBACK (a depthwise convolution to a dense one, a convolution to its GEMM)."""
    names = SERIES_FALLBACK.get(name, (name, "copy"))
    for candidate in names:
        current: str | None = dtype
        while current is not None:
            series = profile.get(candidate, current)
            if series is not None:
                return series
            current = DTYPE_FALLBACK.get(current)
    raise AssertionError(f"calibration of {profile.device} has no series for {name}/{dtype} nor a fallback")


class _OpTimer:
    """Kernel time of ops on one device, memoised: a step repeats the same op shapes many times."""

    def __init__(self, device: DeviceModel, precision: str) -> None:
        self.device = device
        self.precision = precision
        self.profile = device.profile
        self.fp32_peak = device.profile.peaks.flops.get("fp32") or _series(device.profile, "gemm", "fp32").peak
        self.bandwidth = device.profile.sustained_bandwidth_bytes_per_s
        self._memo: dict[tuple, tuple[OpClass, float, float, float, float]] = {}
        self.fresh_pages = device.profile.get("fresh_pages", "fp32") if device.kind == "cpu" else None

    def kernel(self, record: OpRecord, cached: int = 0) -> tuple[OpClass, float, float, float, float]:
        """(class, compute, memory, page faults, layout transposes) of one op, in seconds: the device
        overlaps compute and memory traffic; page faults and layout transposes stop both. `cached`: bytes of
        its traffic the GPU's L2 serves (cached_reads)."""
        key = (record.op, record.flops, record.bytes_read, record.bytes_written, record.dtypes, record.matmul,
               record.gemm, record.allocated, record.conv, record.transposed, record.dropout, record.norm, cached)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._kernel(record, cached)
        return found

    def _kernel(self, record: OpRecord, cached: int) -> tuple[OpClass, float, float, float, float]:
        kind, compute, memory, layout = self._device_time(record, cached)
        return kind, compute, memory, self._first_touch_seconds(record, kind), 0.0 if self.device.channels_last \
            else layout

    def _first_touch_seconds(self, record: OpRecord, kind: OpClass) -> float:
        """On a CPU, the page faults of the op's large new outputs (FRESH_PAGES_MIN_BYTES and up):
        their bytes at the calibrated fresh-pages rate, less the plain write that rate includes.
        Zero on a GPU (caching allocator), without a fresh_pages series, and for series whose
        calibration allocated fresh outputs already."""
        if self.fresh_pages is None or kind.series in FRESH_OUTPUT_SERIES:
            return 0.0
        seconds = 0.0
        for size in record.allocated:
            if size >= FRESH_PAGES_MIN_BYTES:
                rate = self.fresh_pages.peak * self.fresh_pages.efficiency(size)
                seconds += max(0.0, size / rate - size / self.bandwidth)
        return seconds

    def _device_time(self, record: OpRecord, cached: int = 0) -> tuple[OpClass, float, float, float]:
        """(class, compute, memory, layout transposes) seconds of one op on the device; `cached` bytes of its
        traffic come from L2 (L2_OVER_DRAM): its bytes count as the DRAM bytes that take as long."""
        kind = classify(record, self.precision, cuda=self.device.kind == "gpu")
        moved = moved_bytes(record, kind)
        if cached and moved:  # a compute op's `moved` may be a share of its recorded bytes (ops.moved_bytes)
            moved = round(moved * _cached_scale(cached, moved if not kind.compute else
                                                record.bytes_read + record.bytes_written))
        if kind.compute and self.device.kind == "gpu" and record.op in FUSED_ATTENTION and record.gemm:
            return kind, self._fused_attention_seconds(record, kind), moved / self.bandwidth, 0.0
        measured = self._measured_seconds(record)
        if measured is not None:
            return kind, measured, min(moved / self.bandwidth, measured), 0.0
        if kind.compute:
            compute, memory = self._compute_seconds(record, kind, record.flops, moved)
            if self.device.kind == "gpu" and record.conv is not None:
                return self._gpu_convolution(record, kind, moved, compute, memory)
            return kind, compute, memory, 0.0
        memory = self._memory_seconds(kind.series, kind.dtype, moved)
        layout = 0.0
        if record.norm is not None and self.device.kind == "gpu" and self.device.sm_count:
            layout = self._channel_block_wait(record, moved, memory)
        compute = record.flops / self.fp32_peak if record.flops else 0.0
        return kind, compute, memory, layout

    def _channel_block_wait(self, record: OpRecord, moved: int, memory: float) -> float:
        """Seconds a channels-first batch norm waits on its one-block-per-channel passes
        (ops.channel_block_seconds) beyond the time their share of its bytes takes at the bandwidth (`memory`:
        the whole op's bytes at the bandwidth)."""
        assert record.norm is not None and self.device.sm_count
        blocked = channel_block_seconds(record.norm, record.op, self.device.sm_count, self.device.threads_per_sm)
        if not blocked or not moved:
            return 0.0
        passes = BATCH_NORM_CHANNEL_PASSES[record.op]
        itemsize = 2 if any(name in record.dtypes for name in HALF_DTYPES) else 4
        share = min(1.0, passes * record.norm.elements * itemsize / moved)  # of the op's bytes
        return max(0.0, blocked - memory * share)

    def _measured_seconds(self, record: OpRecord) -> float | None:
        """The op's time measured on this device at its exact shapes (DeviceModel.measured_s), if it was."""
        if not self.device.measured_s:
            return None
        key = call_key(record.op, record.dtypes, record.conv, record.norm)
        return None if key is None else self.device.measured_s.get(key)

    def _fused_attention_seconds(self, record: OpRecord, kind: OpClass) -> float:
        """A GPU's fused attention kernel: its FLOPs at the share of its math dtype's peak that such
        kernels reach (ops.fused_attention_efficiency), not at a GEMM's, plus the dropout mask it draws
        (ops.attention_dropout_seconds) and the GEMM series' fixed per-call time (its tau_half_s)."""
        dtype = kind.dtype if self._on_tensor_cores(kind) else "fp32"
        series = _series(self.profile, "gemm", dtype)
        peak = self.fp32_peak if dtype == "fp32" else series.peak
        rate = peak * fused_attention_efficiency(record, dtype, self.device.compute_capability,
                                                 self.device.architecture)
        dropout = attention_dropout_seconds(record, self.device.sm_count, self.device.clock_hz, self.fp32_peak)
        return record.flops / rate + dropout + series.fit.curve.param("tau_half_s")

    def _compute_seconds(self, record: OpRecord, kind: OpClass, flops: float, moved: int) -> tuple[float, float]:
        """(compute, memory) seconds of a compute op doing `flops` the way `kind` says."""
        series = _series(self.profile, kind.series, kind.dtype)
        peak = self.fp32_peak if kind.vector else series.peak
        intensity = flops / moved if moved else float("inf")
        waves = 1.0
        if self.device.sm_count and record.gemm is not None and not kind.vector:
            waves = wave_efficiency(record.gemm, self.device.sm_count)
        # Idle SMs stretch the work, not the fixed latency of a call; a roofline below the peak
        # (a small or thin GEMM, bandwidth-bound) stretches it too, not the latency either. The curve
        # is read at the work that takes as long at the series' peak: t = (ideal / waves + tau_half) / e_max
        # with ideal = FLOPs / roofline. (Reading it at the FLOPs themselves multiplied tau_half by
        # peak / roofline: 34x for a 64x10x1024 bf16 GEMM on an H100, 300 us instead of 8.)
        filled = flops / waves
        attainable = roofline(peak, intensity, self.bandwidth)
        compute = filled / (attainable * series.efficiency(roofline_work(filled, peak, attainable)))
        if record.gemm is not None and record.conv is None and not kind.vector:
            itemsize = TORCH_DTYPES[kind.dtype].itemsize
            if (record.transposed and kind.dtype == "tf32" and self.device.kind == "gpu"
                    and self._on_tensor_cores(kind)):
                compute /= TF32_TRANSPOSED_OPERAND_EFFICIENCY ** record.transposed
            if (self.device.kind == "gpu" and kind.dtype in TENSOR_CORE_DTYPES
                    and misaligned_gemm(record.gemm, itemsize)):
                compute = max(compute, flops / (MISALIGNED_GEMM_FP32_MULTIPLE * self.fp32_peak))
            compute += series.pack_seconds(record.gemm, itemsize)
        memory = moved / self.bandwidth
        if kind.vector:
            memory = self._memory_seconds("add", "fp32", moved)
        return compute, memory

    def _gpu_convolution(self, record: OpRecord, kind: OpClass, moved: int, compute: float,
                         memory: float) -> tuple[OpClass, float, float, float]:
        """The fastest of the algorithms cuDNN's autotuner (torch.backends.cudnn.benchmark) chooses
        between:
        - implicit GEMM in the op's math dtype; on tensor cores, channels-first tensors are first
          transposed to NHWC and back (serial memory-bound kernels, ops.layout_transposes);
        - where TF32 is allowed, not required: fp32 implicit GEMM on CUDA cores, in any layout;
        - for a 3x3 stride-1 convolution whose math runs on CUDA cores (fp32, or a dtype with no tensor
          cores here): Winograd, WINOGRAD_MULTIPLY_SAVING fewer multiplies. Not where TF32 units take an
          fp32 convolution (ops.WINOGRAD_MULTIPLY_SAVING says why)."""
        conv = record.conv
        assert conv is not None
        tensor_cores = self._on_tensor_cores(kind)
        if kind.dtype == "tf32" and not tensor_cores:  # no TF32 units: cuDNN runs it in fp32
            kind = OpClass(kind.series, "fp32", compute=True)
        layout = 0.0
        if tensor_cores and not conv.channels_last:
            element = TORCH_DTYPES[kind.dtype].itemsize  # TF32 math transposes fp32 tensors
            copy_dtype = "fp32" if kind.dtype == "tf32" else kind.dtype
            layout = sum(self._memory_seconds("copy", copy_dtype, 2 * size * element)
                         for size in layout_transposes(conv))
            if kind.dtype == "tf32" and pointwise_product(conv):
                compute /= pointwise_tf32_efficiency(conv)
        options = [(kind, compute, memory, layout)]
        fp32 = OpClass(kind.series, "fp32", compute=True)
        if kind.dtype == "tf32":
            options.append((fp32, *self._compute_seconds(record, fp32, record.flops, moved), 0.0))
        if winograd_eligible(conv) and not tensor_cores:
            saved = record.flops / WINOGRAD_MULTIPLY_SAVING
            options.append((fp32, *self._compute_seconds(record, fp32, saved, moved), 0.0))
        return min(options, key=lambda option: max(option[1], option[2]) + option[3])

    def _on_tensor_cores(self, kind: OpClass) -> bool:
        """Whether the device runs this compute op's math on tensor cores: a tensor-core dtype the
        device has units for (a calibrated series of its own, no fp32 fallback)."""
        if kind.vector or kind.dtype not in TENSOR_CORE_DTYPES:
            return False
        return self.profile.get(kind.series, kind.dtype) is not None or self.profile.get("gemm", kind.dtype) is not None

    def _memory_seconds(self, name: str, dtype: str, moved: int) -> float:
        if not moved:
            return 0.0
        series = _series(self.profile, name, dtype)
        return moved / (series.peak * series.efficiency(moved))


STEP_HOST_RATIO = 4.1
"""Host time per traced op of a real eager training step on a GPU, over the calibrated `autograd` overhead
(one tiny op with autograd recording, issued in a tight loop). A step spends more per op than that loop:
nn.Module calls, the autograd engine running each backward node, the optimizer's Python, cuBLAS and cuDNN
calls that launch several kernels. Measured on an H100's host (benchmarks/results/gpu_host_overhead.txt,
2026-11-27 run): 59.7 us per op where the loop took 14.5 us, fitted over the 12 steps that kept the GPU busy
under half the time (the device waited on the host), across BERT, an MLP, MobileNetV2 and ResNet-50, with
the gradients the autograd engine sums costed apart at the dispatch overhead (host_seconds); 57.5 us (4.0x)
when they counted as ops of the step."""


CONV_STEP_HOST_RATIO = 7.4
"""The same for a convolution or batch norm (cuDNN's calls: its plan cache and heuristics run on the host
every call): 106.7 us per op on that host, 7.4 x its autograd overhead."""


CPU_STEP_HOST_RATIO = 15.0
"""Host time per traced op of the forward and backward of a real eager training step on a CPU, over the
calibrated `autograd` overhead: the op's own dispatch and autograd recording (inside the op, what the
calibration's loop times) and what runs between ops, which the profiler puts outside any op (module
calls, the model's Python, the autograd engine running each backward node). Measured with torch.profiler
on the examples (issue #20; benchmarks/op_breakdown.py's measure; 2-core EPYC VM, torch 2.14, 2026-11-28):
outside any op 27.5-61.4 us per traced op of the forward and backward (MLP 38.5, ResNet-50 48.4,
MobileNetV2 27.5, ViT-B/16 60.3, BERT-base 61.4; median 48.4) where the calibrated autograd overhead was
3.5 us: (3.5 + 48.4) / 3.5 = 14.8. Held-out models measured the same way: 31-67 us (ResNet-18,
MobileNetV3-small, ConvNeXt-atto, BERT-mini, ViT-tiny). The GPU's figure is STEP_HOST_RATIO."""


def host_seconds(record: OpRecord, overheads: dict[str, float], cpu: bool = False, compiled: bool = False) -> float:
    """Host time to issue one op: autograd recording in forward and backward, plain dispatch in the
    optimizer (which runs under no_grad) and for every kernel of a `compiled` step (its graphs record
    autograd once per graph, not per op). On a CPU a multi-tensor op (`_foreach_*`) runs once per
    tensor of its list (no fused CPU kernel): each tensor after the first costs the calibrated
    `foreach` overhead (issue #20: 100 one-element tensors took 136 us in `_foreach_mul_` here, 1.36 us
    each, where one `mul_` took 1.8 us; profiles without it count a dispatch). A GPU's
    multi_tensor_apply fuses the list into a few launches. On a CPU an op of the forward and backward costs
    CPU_STEP_HOST_RATIO times the autograd overhead. On a GPU an eager step's op costs the host
    STEP_HOST_RATIO (cuDNN's: CONV_STEP_HOST_RATIO) times the calibrated autograd overhead, whatever its
    phase, but for an optimizer's op on one tensor: an optimizer that loops over its parameters in Python
    (DeepLearningExamples' BertAdam, a model file's own) issues plain ops under no_grad one after the
    other, as the calibration's dispatch loop does, with no module call, autograd node or library call of
    the step's ratio: the calibrated dispatch overhead. So does a gradient the autograd engine sums in C++
    (OpRecord.engine_sum: DenseNet-121's 535), on a GPU and a CPU alike."""
    if record.engine_sum:
        return overheads.get("dispatch", 0.0)
    if not cpu and not compiled:
        if record.phase == "optimizer" and record.tensors <= 1 and not record.op.startswith("_foreach_"):
            return overheads.get("dispatch", 0.0)
        base = overheads.get("autograd", overheads.get("dispatch", 0.0))
        return base * (CONV_STEP_HOST_RATIO if record.op in CUDNN_OPS else STEP_HOST_RATIO)
    key = "dispatch" if record.phase == "optimizer" or compiled else "autograd"
    per_op = overheads.get(key, overheads.get("dispatch", 0.0))
    if cpu and key == "autograd":
        per_op *= CPU_STEP_HOST_RATIO
    if not cpu or record.tensors <= 1:
        return per_op
    return per_op + (record.tensors - 1) * overheads.get("foreach", overheads.get("dispatch", 0.0))


def kernel_seconds(records: Iterable[OpRecord], precision: str, device: DeviceModel) -> list[float]:
    """Device seconds of each op alone (no host overhead, no page faults), as the time model puts them."""
    timer = _OpTimer(device, precision)
    found = []
    for record in records:
        _, compute, memory, _, layout = timer.kernel(record)
        found.append(max(compute, memory) + layout)
    return found


def estimate_step(trace: StepTrace, device: DeviceModel, compiled: bool = False) -> StepTime:
    """Time of `trace`'s step on `device`; `compiled`: as torch.compile runs it (fusion.py)."""
    chunks = chunks_of(trace.records, trace.repeats, device.kind == "gpu", compiled)
    return estimate_chunks(chunks, trace.precision, device, compiled)


def estimate_records(records: Iterable[OpRecord], precision: str, device: DeviceModel,
                     compiled: bool = False) -> StepTime:
    """Time of these ops, in order, on `device` (see the module's docstring). On a GPU, the CPU
    decompositions the trace recorded are first replaced by the kernels CUDA runs (lowering.py);
    `compiled`: fused as torch.compile fuses them (fusion.py)."""
    return estimate_chunks([(_lowered(list(records), device.kind == "gpu", compiled), 1)], precision, device, compiled)


def _lowered(records: list[OpRecord], gpu: bool, compiled: bool) -> list[OpRecord]:
    """`records` as the device runs them: CUDA's kernels on a `gpu`, fused where `compiled`."""
    records = cuda_records(records) if gpu else records
    return compiled_records(records) if compiled else records


Chunks = Sequence[tuple[Sequence[OpRecord], int]]
"""A step's ops as runs of (ops, copies): `copies` repetitions of the ops in a row (a repeated block's)."""


def chunks_of(records: Sequence[OpRecord], repeats: Sequence[tuple[int, int, int]], gpu: bool,
              compiled: bool = False) -> list[tuple[list[OpRecord], int]]:
    """`records` as chunks (see Chunks), from StepTrace.repeats' (start, length, copies) spans; each chunk as
    CUDA runs it on a `gpu` (lowering.py), fused where `compiled` (fusion.py), chunk by chunk: no kernel a
    lowering fuses spans two blocks."""
    chunks: list[tuple[list[OpRecord], int]] = []
    position = 0
    for start, length, copies in sorted(repeats):
        assert start >= position and length > 0, "repeated spans are ordered and disjoint"
        if start > position:
            chunks.append((list(records[position:start]), 1))
        chunks.append((list(records[start:start + length]), copies))
        position = start + length * copies
    if position < len(records):
        chunks.append((list(records[position:]), 1))
    if compiled:
        chunks = _aligned_for_fusion(chunks)
    return [(_lowered(chunk, gpu, compiled), copies) for chunk, copies in chunks]


def _aligned_for_fusion(chunks: list[tuple[list[OpRecord], int]]) -> list[tuple[list[OpRecord], int]]:
    """The same ops with every chunk boundary at an op a compiler does not fuse (fusion.fusible), so that
    fusing chunk by chunk fuses what fusing the whole step would: a run of pointwise ops that crosses from
    one block into the next (a residual add, then the next block's norm) stays one kernel. A block of
    `copies` whose first unfused op is at r runs as its first r ops (joined to the chunk before), then
    copies - 1 blocks rotated to start at r, then its ops from r (joined to the chunk after); a block of
    fused ops only is written out in full.

    # block [norm, mm, add] x 3 after [embed]: [embed, norm], [mm, add, norm] x 2, [mm, add]
    """
    aligned: list[tuple[list[OpRecord], int]] = []

    def single(ops: list[OpRecord]) -> None:
        if aligned and aligned[-1][1] == 1:
            aligned[-1][0].extend(ops)
        elif ops:
            aligned.append((list(ops), 1))

    for ops, copies in chunks:
        first = next((i for i, record in enumerate(ops) if not fusible(record)), None)
        if copies == 1 or first is None:
            single(ops * copies)
            continue
        single(ops[:first])
        aligned.append((ops[first:] + ops[:first], copies - 1))
        single(ops[first:])
    return aligned


L2_OVER_DRAM = 2.5
"""Bandwidth of reads a GPU's L2 serves over its DRAM's (HBM or GDDR). An assumption, the middle of the 2-3x
that calibration/quality.py takes for Ampere and Hopper (its gate allows up to GPU_CACHE_OVER_DRAM); the
ground truth's `probes` part (benchmarks/gpu_probes.py) measures it on a lent GPU: hot / cold of a read right
after the value was made against one from DRAM, 0.5 + 0.5 / L2_OVER_DRAM where it fits."""


def _cached_scale(cached: int, traffic: int) -> float:
    """Time of an op's traffic over its time from DRAM when `cached` of its `traffic` bytes come from L2.

    # half of it from L2: 0.5 + 0.5 / 2.5 = 0.7
    """
    share = min(cached, traffic) / traffic
    return 1.0 - share + share / L2_OVER_DRAM


def cached_reads(records: Sequence[OpRecord], before: Sequence[OpRecord], capacity: int) -> list[int]:
    """Per record, the bytes of its traffic a GPU's L2 of `capacity` bytes serves instead of its DRAM: each
    value it reads that an op made so recently that all the traffic since (the maker's included, an upper bound
    of the distinct bytes: a least-recently-used cache of `capacity` bytes still holds it) fits in L2, and a
    batch norm's second pass over an input that fits. `before`: the ops run just before these (the reads'
    sources may be among them); a source further back counts as a miss. Writes go to DRAM as L2 evicts them.

    # y = relu(x), then z = y + 1, x and y 4 MB: relu's 4 MB read and 4 MB write since y was made (8 MB):
    # a 6 MB L2 (RTX 3090) has evicted y, a 72 MB L2 (RTX 4090) serves z's 4 MB read of it
    """
    ops = [*before, *records]
    traffic = [0]
    for record in ops:
        traffic.append(traffic[-1] + record.bytes_read + record.bytes_written)
    found = []
    for index in range(len(before), len(ops)):
        record = ops[index]
        hit = 0
        for source, size, _ in record.reads:
            if 0 < source <= index and traffic[index] - traffic[index - source] <= capacity:
                hit += size
        hit = min(hit, record.bytes_read)
        if record.op in BATCH_NORMS and record.bytes_read <= capacity:
            hit += record.bytes_read  # its second pass over the input (ops.moved_bytes)
        found.append(hit)
    return found


class ChunkFacts:
    """What timing a step's chunks needs that is the same on every GPU: each record's kind (an int per distinct
    OpRecord.anonymous() among the chunks: records of one kind cost the same) and, per L2 size, the bytes of
    each record's reads L2 serves (cached_reads: a chunk's first copy after the chunk before, its other copies
    after a copy). An estimate times one step's chunks on every GPU of the database, 20 distinct L2 sizes among
    55 GPUs; making an anonymous() tuple and hashing it for each op of each GPU was a sixth of the timing."""

    def __init__(self, chunks: Chunks) -> None:
        self.chunks = chunks
        kind_of: dict[tuple, int] = {}
        self.kinds = [[kind_of.setdefault(record.anonymous(), len(kind_of)) for record in records]
                      for records, _ in chunks]
        self._hits: dict[int, list[tuple[list[int], list[int] | None]]] = {}

    def hits(self, capacity: int) -> list[tuple[list[int], list[int] | None]]:
        """Per chunk, (cached_reads of its first copy, of its other copies: None for a chunk of one) on a GPU
        whose L2 holds `capacity` bytes."""
        found = self._hits.get(capacity)
        if found is None:
            found, before = [], ()
            for records, copies in self.chunks:
                found.append((cached_reads(records, before, capacity),
                              cached_reads(records, records, capacity) if copies > 1 else None))
                before = records
            self._hits[capacity] = found
        return found


class _ChunkFactsMemo:
    """The ChunkFacts of the last MAX_KEPT chunk sequences timed, by the identity of their record lists (each
    kept alive here, so that an id names one list; a sequence's lists are not changed once lowered)."""

    MAX_KEPT = 8

    def __init__(self) -> None:
        self._kept: OrderedDict[tuple[int, ...], ChunkFacts] = OrderedDict()
        self._lock = threading.Lock()

    def of(self, chunks: Chunks) -> ChunkFacts:
        key = tuple(id(records) for records, _ in chunks) + tuple(copies for _, copies in chunks)
        with self._lock:
            facts = self._kept.get(key)
            if facts is not None:
                self._kept.move_to_end(key)
                return facts
        facts = ChunkFacts([(records, copies) for records, copies in chunks])
        with self._lock:
            self._kept[key] = facts
            while len(self._kept) > self.MAX_KEPT:
                self._kept.popitem(last=False)
        return facts


_CHUNK_FACTS = _ChunkFactsMemo()


STEADY_TOLERANCE = 1e-12
"""Relative difference below which two copies of a repeated block leave the host and device clocks in the
same relation (floating-point rounding)."""


class _Clock:
    """The host and the device issuing and running ops one after the other (see estimate_chunks)."""

    def __init__(self, device: DeviceModel, precision: str, compiled: bool = False) -> None:
        self.timer = _OpTimer(device, precision)
        self.compiled = compiled
        self.overheads = device.profile.overheads_s
        self.queued = device.kind == "gpu"
        self.host = self.device = 0.0
        self.by_bound = dict.fromkeys(BOUNDS, 0.0)
        self.ops: list[OpTime] = []
        self.kernels: dict[tuple, tuple[OpClass, float, float, float, float, str, float]] = {}
        """_timed's figures by (kind, L2 hit): each kind of op is timed once per device."""
        self.read_back = False
        """Whether a queued op read a value back (OpRecord.synchronizes): the host waited for the device."""

    def run_step(self, chunks: Chunks) -> tuple[float, dict[str, float], int]:
        """Run one step's chunks; returns the device clock, the bounds and the op count it found."""
        found = self.device, dict(self.by_bound), len(self.ops)
        facts = _CHUNK_FACTS.of(chunks)
        capacity = self.timer.device.l2_cache_bytes
        hits = facts.hits(capacity) if self.queued and not self.compiled and capacity else None
        for index, (records, copies) in enumerate(chunks):
            kinds = facts.kinds[index]
            cached, cached_after = hits[index] if hits else (None, None)
            if copies == 1:
                self.run(records, kinds, cached)
            else:
                self.run_copies(records, kinds, copies, cached, cached_after)
        return found

    def run(self, records: Sequence[OpRecord], kinds: Sequence[int], cached: Sequence[int] | None) -> None:
        """Run `records` in order; `kinds`: each one's kind (ChunkFacts.kinds); `cached`: the bytes of each one's
        traffic L2 serves (cached_reads), None where none is."""
        queued, ops, kernels = self.queued, self.ops, self.kernels
        host_clock, device_clock = self.host, self.device
        by_bound = self.by_bound
        overhead_s, compute_s, memory_s = by_bound["overhead"], by_bound["compute"], by_bound["memory"]
        for index, record in enumerate(records):
            hit = cached[index] if cached else 0
            key = (kinds[index], hit)  # what a kernel's time depends on: the record but its module
            timed = kernels.get(key)
            if timed is None:  # a block's ops repeat once per block: each kind of op is timed once
                timed = kernels[key] = self._timed(record, hit)
            kind, compute, memory, kernel, host, kernel_bound, layout = timed
            if queued:
                if record.synchronizes:  # the host reads a value back: it waits for the device's queue
                    host_clock = max(host_clock, device_clock)
                    self.read_back = True
                host_clock += host
                wait = host_clock - device_clock
                if wait < 0.0:
                    wait = 0.0
                device_clock += wait + kernel
            else:
                wait = host
                device_clock += host + kernel
            overhead_s += wait
            if kernel_bound == "compute":
                compute_s += kernel
            else:
                memory_s += kernel
            ops.append(OpTime(record.phase, record.module, record.op, kind.series, kind.dtype, record.flops,
                              record.bytes_read + record.bytes_written, compute, memory, kernel, host, wait,
                              "overhead" if wait > kernel else kernel_bound, layout))
        self.host, self.device = host_clock, device_clock
        by_bound["overhead"], by_bound["compute"], by_bound["memory"] = overhead_s, compute_s, memory_s

    def _timed(self, record: OpRecord, hit: int) -> tuple[OpClass, float, float, float, float, str, float]:
        """(class, compute, memory, kernel, host, the kernel's bound, layout transposes) of `record` with `hit`
        bytes of its reads from L2: memory time includes page faults and layout transposes, which stop compute
        too (kernel = the longer of compute and traffic, plus them)."""
        kind, compute, traffic, faults, layout = self.timer.kernel(record, hit)
        kernel = max(compute, traffic) + faults + layout
        memory = traffic + faults + layout
        host = host_seconds(record, self.overheads, cpu=not self.queued, compiled=self.compiled)
        return kind, compute, memory, kernel, host, "compute" if compute >= memory else "memory", layout

    def run_copies(self, records: Sequence[OpRecord], kinds: Sequence[int], copies: int,
                   cached: Sequence[int] | None, cached_after: Sequence[int] | None) -> None:
        """`copies` runs of `records` in a row. Once a copy leaves the clocks as it found them (the device
        as far behind the host, or further behind with no wait in the copy: the next copy then runs the
        same), the rest are that copy again: its ops stand for them (OpTime.calls) and the clocks and
        bounds advance by its amounts. Exact but for rounding (STEADY_TOLERANCE). `cached`: the first copy's
        reads from L2 (cached_reads after the chunk before), `cached_after`: the other copies' (after a copy);
        a first copy whose differ does not stand for the others."""
        done = 0
        while done < copies:
            host, device, by_bound, first = self.host, self.device, dict(self.by_bound), len(self.ops)
            self.run(records, kinds, cached if done == 0 else cached_after)
            done += 1
            left = copies - done
            if not left or not self._steady(device - host, first) or (done == 1 and cached != cached_after):
                continue
            self.host += left * (self.host - host)
            self.device += left * (self.device - device)
            for bound in BOUNDS:
                self.by_bound[bound] += left * (self.by_bound[bound] - by_bound[bound])
            self.ops[first:] = [_times(op, 1 + left) for op in self.ops[first:]]
            return

    def _steady(self, lag_before: float, first: int) -> bool:
        """Whether the copy that started `first` with the device `lag_before` seconds behind the host
        will run the same next time."""
        if not self.queued:
            return True
        lag = self.device - self.host
        scale = max(1.0, abs(self.device))
        if abs(lag - lag_before) <= STEADY_TOLERANCE * scale:
            return True
        return lag > lag_before and all(op.wait_s == 0.0 for op in self.ops[first:])


def estimate_chunks(chunks: Chunks, precision: str, device: DeviceModel, compiled: bool = False) -> StepTime:
    """Time of these chunks of ops (already lowered for a GPU, and fused where `compiled`), in order, on
    `device`: on a GPU the host issues each op (its overhead) into a queue the device runs; on a CPU they
    take turns."""
    clock = _Clock(device, precision, compiled)
    device_before, by_bound_before, first = clock.run_step(chunks)
    if clock.read_back:  # a step that reads back: the second of two in a row
        device_before, by_bound_before, first = clock.run_step(chunks)
    profile = device.profile
    step_s = clock.device - device_before
    by_bound = {bound: seconds - by_bound_before[bound] for bound, seconds in clock.by_bound.items()}
    ops = clock.ops[first:]
    if clock.queued and not clock.read_back:
        step_s = _host_ahead(ops, by_bound)
    total = sum(by_bound.values())
    assert abs(total - step_s) <= 1e-9 * max(1.0, total), (total, step_s)
    return StepTime(device.id, step_s, by_bound, profile.status, profile.device_name, tuple(ops))


def _host_ahead(ops: list[OpTime], by_bound: dict[str, float]) -> float:
    """The steady step of a training loop whose step reads nothing back, on a GPU: the host issues the next
    step while the device still runs this one, so the device waits for the host only when the host's whole
    step takes longer than the device's: max(host, kernels). The waits the clock found, timed from a
    standing start, are scaled to that idle time (ops and `by_bound` in place). Returns the step's seconds.

    # host 30 ms, kernels 40 ms: 40 ms, no wait; host 50 ms, kernels 40 ms: 50 ms, 10 ms of waits
    """
    host = sum(op.host_s for op in ops)
    kernels = sum(op.kernel_s for op in ops)
    waited = sum(op.wait_s for op in ops)
    idle = max(0.0, host - kernels)
    scale = idle / waited if waited > 0 else 0.0
    for op in ops:
        if op.wait_s:
            op.wait_s *= scale
            if op.bound == "overhead" and op.wait_s <= op.kernel_s:
                op.bound = "compute" if op.compute_s >= op.memory_s else "memory"
    by_bound["overhead"] = idle if waited > 0 else 0.0
    return sum(by_bound.values())


SIMULATED_REPEATS = 4
"""Micro-batches of a gradient-accumulation step timed op by op; the host and device clocks are in their
steady state by the last of them, so each further micro-batch takes as long as it."""


def estimate_accumulated(micro: Sequence[OpRecord], optimizer: Sequence[OpRecord], repeats: int, precision: str,
                         device: DeviceModel, compiled: bool = False) -> StepTime:
    """Time of `repeats` forward/backward passes (`micro`'s ops) then one optimizer step: the first
    min(repeats, SIMULATED_REPEATS) timed in order, the last of them standing for every further one (its ops'
    times multiplied), so a step of 2^20 micro-batches costs what one of 4 does."""
    simulated = min(repeats, SIMULATED_REPEATS)
    step = estimate_records(tuple(micro) * simulated + tuple(optimizer), precision, device, compiled)
    extra = repeats - simulated
    if extra == 0:
        return step
    optimizer_ops = sum(1 for op in step.ops if op.phase == "optimizer")
    body = len(step.ops) - optimizer_ops
    assert optimizer_ops == 0 or all(op.phase == "optimizer" for op in step.ops[body:]), "optimizer ops come last"
    per_repeat = body // simulated
    assert per_repeat * simulated == body, "every micro-batch lowers to the same kernels"
    last = range(body - per_repeat, body)
    by_bound = dict(step.by_bound)
    ops = list(step.ops)
    for index in last:
        op = ops[index]
        by_bound["overhead"] += extra * op.wait_s
        by_bound["compute" if op.compute_s >= op.memory_s else "memory"] += extra * op.kernel_s
        ops[index] = _times(op, 1 + extra)
    step_s = sum(by_bound.values())
    return StepTime(step.device_id, step_s, by_bound, step.calibration, step.calibration_source, tuple(ops))


def _times(op: OpTime, factor: int) -> OpTime:
    """`op` standing for `factor` calls of itself."""
    return OpTime(op.phase, op.module, op.op, op.series, op.dtype, op.flops * factor, op.bytes * factor,
                  op.compute_s * factor, op.memory_s * factor, op.kernel_s * factor, op.host_s * factor,
                  op.wait_s * factor, op.bound, op.layout_s * factor, op.calls * factor)  # not replace(): 5x faster

