"""GPU ground truth in one command: the GPU tests, a full calibration, real training steps, kernel names,
and the tool's predictions beside them, resumable part by part on a machine that allows 10-minute commands.

On a CUDA machine, from the repository root:

    python benchmarks/gpu_groundtruth.py [--budget-s 420] [--export DIR]

does the next unfinished parts, in order, within the budget, and says what is left:
  tests        pytest on the tests that need CUDA (tests/*.py whose decorators mention cuda)
  calibration  the full suite through advisor.calibration.runner on cuda:0 (as `advisor calibrate --device
               cuda:0`), written as a reference profile calibration/reference/measured/ can load
  steps        real training steps (forward, loss, backward, optimizer step) of every example and of the
               models in MODELS, two batch sizes, fp32/tf32/amp-bf16/amp-fp16, NCHW and channels-last for
               CNNs: median of warm steps timed with CUDA events, max_memory_allocated/reserved, an
               out-of-memory recorded as such; one profiled step per model/precision/layout keeps the
               kernel names and their CUDA times (convolution, attention, matmul, RNN; the rest as one total)
  compare      the tool's own prediction for that GPU with the shipped calibration (not this run's), beside
               the bare roofline of benchmarks/accuracy.py and the prediction from this run's calibration
  probes       kernels timed alone (benchmarks/gpu_probes.py): what the L2 does for a step's ops (a value read
               right after it was made against one evicted; channels-first batch norms hot and cold, at sizes
               across the L2) and thin GEMMs (LoRA adapters' shapes) beside the time model's prediction
Results go to benchmarks/results/groundtruth/<date>-<gpu>/ (or --out): environment.json, progress.json,
tests.txt, calibration.json, steps.csv, kernels.csv, comparison.csv, probes.csv, report.txt. A part or row already
there is skipped, so the same command run again goes on where the last one stopped. Exit code 0 when
every part is done, 10 when parts remain, 2 on bad usage or a missing dependency.

    python benchmarks/gpu_groundtruth.py --dry-run [--out DIR] [--models mlp,resnet50]

runs the same code on this CPU with tiny models and batches, a tiny suite, host timers and a stand-in
device name, into a temporary folder unless --out is given (never into the repository's results).

    python benchmarks/gpu_groundtruth.py --part compare --out benchmarks/results/groundtruth/<folder>
    python benchmarks/gpu_groundtruth.py --install-profile benchmarks/results/groundtruth/<folder>
    python benchmarks/gpu_groundtruth.py --bundle-deps       # copy fvcore & co. into .deps/ for a GPU machine
"""

from __future__ import annotations

import argparse
import ast
import csv
import dataclasses
import datetime as dt
import gc
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
DEPS = REPO / ".deps"
"""Pure-Python dependencies carried to a machine that lacks them (--bundle-deps); ignored by git."""
RESULTS = BENCHMARKS / "results" / "groundtruth"
MEASURED = REPO / "calibration" / "reference" / "measured"
PROG = "gpu_groundtruth"

for _path in (BENCHMARKS, REPO, DEPS):
    if _path.is_dir() and str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

NEEDED = {"torch": "torch", "numpy": "numpy", "yaml": "pyyaml", "scipy": "scipy", "pynvml": "nvidia-ml-py"}
"""Modules every part needs (import name -> distribution)."""
FOR_TESTS = {"pytest": "pytest", "fvcore": "fvcore", "iopath": "iopath", "yacs": "yacs", "termcolor": "termcolor",
             "tabulate": "tabulate", "portalocker": "portalocker", "matplotlib": "matplotlib", "jinja2": "jinja2"}
"""What the test files import besides NEEDED (advisor.cli imports fvcore, the report matplotlib and jinja2)."""
BUNDLE = ("fvcore", "iopath", "yacs", "termcolor")
"""The pure-Python distributions the lent GPU machines lack (/work/.library/device/KINDS.md's package list)."""


def missing(modules: dict[str, str]) -> list[str]:
    """Distributions whose module this Python cannot import."""
    return [dist for module, dist in modules.items() if importlib.util.find_spec(module) is None]


def missing_sentence(what: str, names: list[str]) -> str:
    return (f"{PROG}: {what} needs {', '.join(names)}, which {sys.executable} cannot import; on a machine that has "
            f"them run `python benchmarks/gpu_groundtruth.py --bundle-deps` and carry .deps/ with the working tree "
            f"(docs/gpu-ground-truth.md)")


if __name__ == "__main__" and "--bundle-deps" not in sys.argv and missing(NEEDED):
    print(missing_sentence("this script", missing(NEEDED)), file=sys.stderr)
    raise SystemExit(2)

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402

from accuracy import bare_roofline_seconds  # noqa: E402
from gpu_probes import PROBE_COLUMNS, l2_bytes_of, measure_probes  # noqa: E402
from gpu_probes import summary as probe_summary  # noqa: E402
from groundtruth_models import (  # noqa: E402
    EXAMPLES,  # noqa: F401 - the examples' specs, for tests
    ModelSpec,
    Unavailable,
    model_specs,
    with_layout,
)

from advisor.atomic import write_atomically  # noqa: E402
from advisor.calibration.cache import FORMAT, SCHEMA  # noqa: E402
from advisor.calibration.peaks import gpu_peaks  # noqa: E402
from advisor.calibration.profile import CalibrationProfile  # noqa: E402
from advisor.calibration.reference import Family, family_for, load_families, reference_profile  # noqa: E402
from advisor.calibration.runner import calibrate, cpu_target, cuda_target  # noqa: E402
from advisor.calibration.suite import load_suite  # noqa: E402
from advisor.estimate.step import DeviceModel, estimate_records  # noqa: E402
from advisor.estimate.targets import database_targets  # noqa: E402
from advisor.hardware.loader import load_hwdb  # noqa: E402
from advisor.hardware.matching import match_gpu_name  # noqa: E402
from advisor.hardware.specs import GPUSpec, HardwareDB  # noqa: E402
from advisor.memory.estimate import StepMemory, capped_replay, device_memory  # noqa: E402
from advisor.paths import shipped_dir  # noqa: E402
from advisor.probe.cpu import probe_cpu  # noqa: E402
from advisor.profile.trace import (  # noqa: E402
    PURE_LOW_PRECISION, StepTrace, call_model, cast_inputs, checkpoint_blocks, default_loss, make_optimizer,
    trace_training_step,
)

PRECISIONS = ("fp32", "tf32", "amp-bf16", "amp-fp16")
"""As advisor/profile/trace.py defines them, run as torch runs them on a GPU: fp32 = torch's defaults
(matmuls in fp32, convolutions TF32: cudnn.allow_tf32 is on by default), tf32 = TF32 for both, amp-* =
autocast to bf16/fp16 with fp32 master weights (GradScaler for fp16), math flags at torch's defaults."""
PRECISION_NOTES = {
    "fp32": "torch defaults: matmul allow_tf32 off, cudnn allow_tf32 on",
    "tf32": "matmul allow_tf32 on, cudnn allow_tf32 on",
    "amp-bf16": "torch.autocast(bfloat16), fp32 weights, torch defaults for fp32 math",
    "amp-fp16": "torch.autocast(float16), fp32 weights, torch.amp.GradScaler, torch defaults for fp32 math",
    "bf16": "the model cast to bfloat16 (weights, gradients and AdamW state in bf16), no autocast; only the "
            "models whose ModelSpec.precisions name it",
}
AUTOCAST = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}
PARTS = ("tests", "calibration", "steps", "compare", "probes")
EXIT_MORE = 10
"""Exit code when parts remain: run the same command again."""
OOM_ERRORS = (getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError),)
OOM_MESSAGES = re.compile(r"out of memory|ALLOC_FAILED|NOT_ENOUGH_WORKSPACE|can't allocate memory")
"""Out-of-memory raised as a plain RuntimeError by cuBLAS, cuDNN or the CPU allocator."""


# ============================================================================ settings


@dataclass(frozen=True)
class Settings:
    """How long everything runs: a real run's, or the dry run's tiny ones."""

    warm_steps: int
    min_timed_steps: int
    max_timed_steps: int
    min_timed_s: float
    """Time at least this long (the number of steps is chosen from one warm step's time)."""
    estimate_s: dict[str, float]
    """First guess of a unit's wall time, for the budget: a test run, the calibration, a row, a prediction."""


REAL = Settings(warm_steps=3, min_timed_steps=5, max_timed_steps=20, min_timed_s=0.6,
                estimate_s={"tests": 120.0, "calibration": 300.0, "row": 20.0, "compare": 4.0, "probes": 40.0})
DRY = Settings(warm_steps=1, min_timed_steps=3, max_timed_steps=3, min_timed_s=0.0,
               estimate_s={"tests": 30.0, "calibration": 20.0, "row": 2.0, "compare": 1.0, "probes": 2.0})
DRY_GPU_ID = "h100-sxm"
"""The database GPU a dry run's predictions are made for (its measurements are this CPU's: the errors
mean nothing; the plumbing is what a dry run checks)."""

TINY_SUITE = """
schema: 1
timing:
  cpu:
    quick: {min_time_s: 0.002, warmup_s: 0.001, max_call_s: 0.5, min_samples: 3, min_sample_s: 0.0002}
    full: {min_time_s: 0.004, warmup_s: 0.001, max_call_s: 0.5, min_samples: 3, min_sample_s: 0.0002}
  cuda:
    quick: {min_time_s: 0.002, warmup_s: 0.001, max_call_s: 0.05, min_samples: 3, min_sample_s: 0.0002}
    full: {min_time_s: 0.004, warmup_s: 0.001, max_call_s: 0.05, min_samples: 3, min_sample_s: 0.0002}
series:
  launch:
    fit: none
    dtypes: {cpu: [fp32], cuda: [fp32]}
  copy:
    fit: hierarchy
    dtypes: {cpu: [fp32], cuda: [fp32]}
    sizes:
      cpu: {quick: [4096, 65536, 1048576], full: [16384]}
      cuda: {quick: [1048576], full: []}
  add:
    fit: hierarchy
    dtypes: {cpu: [fp32], cuda: [fp32]}
    sizes:
      cpu: {quick: [4096, 65536, 1048576], full: []}
      cuda: {quick: [1048576], full: []}
  gemm:
    fit: saturating
    dtypes: {cpu: [fp32], cuda: [fp32]}
    sizes:
      cpu: {quick: [[32, 32, 32], [64, 64, 64], [256, 256, 256]], full: [[128, 128, 128]]}
      cuda: {quick: [[256, 256, 256]], full: []}
  conv:
    fit: saturating
    dtypes: {cpu: [fp32], cuda: [fp32]}
    sizes:
      cpu: {quick: [[1, 8, 8, 16, 3, 1, 1], [1, 16, 16, 16, 3, 1, 1]], full: []}
      cuda: {quick: [[1, 8, 8, 16, 3, 1, 1]], full: []}
"""
"""The dry run's suite: the shape of tests/test_calibration.py's TINY_SUITE, a second or two on a CPU."""


# ============================================================================ rows and files


@dataclass(frozen=True, order=True)
class RowKey:
    model: str
    batch: int
    precision: str
    layout: str

    @property
    def label(self) -> str:
        layout = "" if self.layout == "contiguous" else f" {self.layout}"
        return f"{self.model} b{self.batch} {self.precision}{layout}"

    @property
    def group(self) -> tuple[str, str, str]:
        return self.model, self.precision, self.layout

    @classmethod
    def of(cls, row: dict[str, str]) -> RowKey:
        return cls(row["model"], int(row["batch"]), row["precision"], row["layout"])

    def fields(self) -> dict[str, Any]:
        return {"model": self.model, "batch": self.batch, "precision": self.precision, "layout": self.layout}


def planned_rows(specs: list[ModelSpec], dry: bool) -> list[tuple[ModelSpec, RowKey]]:
    """In run order: model by model, each precision and layout at its smaller batch first (an
    out-of-memory there means the larger one is not tried)."""
    return [(spec, RowKey(spec.name, batch, precision, layout))
            for spec in specs for precision in spec.precisions or PRECISIONS for layout in spec.layouts
            for batch in spec.batches_for(dry)]


STEP_COLUMNS = ("model", "kind", "batch", "precision", "layout", "optimizer", "status", "step_time_median_s",
                "step_time_spread", "step_time_min_s", "step_time_max_s", "timed_steps", "samples_per_s",
                "peak_allocated_bytes", "steady_peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes",
                "params", "wall_s", "message", "alloc_retries")
"""steps.csv. step_time_spread: interquartile range over median of the timed steps. peak_*: from the first
step (optimizer state created, cuDNN autotuning) to the last; steady_peak_allocated_bytes: the timed steps
only (the tool's trace is of a steady step). device_used_bytes: total - free device memory after the
steps (CUDA context + the allocator's reserve + libraries), what nvidia-smi shows. Empty where a CPU has
no such figure (dry run) or the row did not run."""
KERNEL_COLUMNS = ("model", "batch", "precision", "layout", "phase", "category", "op", "kernel", "calls",
                  "device_time_us", "share_of_step")
"""kernels.csv: one profiled step per model/precision/layout (at its smaller batch that ran). category:
conv, attention, matmul, rnn, norm (each kernel under the outermost such aten op; op names it), or other
(one row per phase and outermost aten op, its kernels together: "(all kernels)"; "(no aten op)" for kernels
under none). device_time_us: CUDA time of the kernel's launches in the step (on a dry run, an
aten op's own CPU time, its children's left out). share_of_step: of all kernel time in the step."""
COMPARISON_COLUMNS = ("model", "batch", "precision", "layout", "status", "measured_step_s", "predicted_step_s",
                      "step_error", "bare_step_s", "bare_error", "calibrated_step_s", "calibrated_error",
                      "measured_steady_allocated_bytes", "predicted_allocated_bytes", "allocated_error",
                      "measured_reserved_bytes", "predicted_reserved_bytes", "reserved_error",
                      "measured_device_used_bytes", "predicted_peak_bytes", "peak_error", "predicted_fits",
                      "calibration", "note", "measured_alloc_retries", "predicted_alloc_flushes")
"""comparison.csv. predicted_*: the tool (advisor.estimate.step.estimate_records, advisor.memory.estimate.
device_memory, as `advisor estimate --gpu ID` computes them) with the calibration shipped for that GPU,
not this run's; bare: benchmarks/accuracy.py's bare roofline; calibrated: the same prediction from this
run's calibration.json. predicted_allocated/reserved include the cuBLAS workspace; predicted_peak adds the
CUDA context (compare with device_used). error = predicted / measured - 1. measured_alloc_retries: the row's
num_alloc_retries (cache releases after a failed cudaMalloc); predicted_alloc_flushes: the capped re-play's in
two steps (0 where the GPU holds the unhindered reserve)."""
FILES = ("environment.json", "progress.json", "tests.txt", "calibration.json", "steps.csv", "kernels.csv",
         "comparison.csv", "probes.csv", "report.txt")
"""Everything a run writes: 9 flat files, what one device command can send back."""


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


def write_json(path: Path, document: Any) -> None:
    write_atomically(path, json.dumps(document, indent=1) + "\n")


class CsvTable:
    """A CSV file grown one row at a time (flushed and synced), so that a command killed mid-row loses only
    that row; a torn last line is dropped on the next read."""

    def __init__(self, path: Path, columns: tuple[str, ...]) -> None:
        self.path, self.columns = path, columns

    def rows(self) -> list[dict[str, str]]:
        if not self.path.is_file():
            return []
        with self.path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            found = tuple(reader.fieldnames or ())
            older = 0 < len(found) < len(self.columns) and found == self.columns[:len(found)]
            if found != self.columns and not older:
                raise UsageError(f"{PROG}: {self.path} has columns {reader.fieldnames}, not {list(self.columns)}; "
                                 "it was written by another version: use another --out")
            rows = list(reader)
        whole = [r for r in rows if None not in r.values() and None not in r]
        if older:  # written before the last columns were added: they read empty (append rewrites the file)
            whole = [r | {c: "" for c in self.columns[len(found):]} for r in whole]
        if len(whole) != len(rows):  # a torn row: rewrite the file without it
            self._rewrite(whole)
        return whole

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        text = _csv_text(self.columns, rows, header=True)
        write_atomically(self.path, text)

    def append(self, rows: list[dict[str, Any]]) -> None:
        if self.path.is_file():
            with self.path.open(newline="", encoding="utf-8") as handle:
                header = next(csv.reader(handle), None)
            if header is not None and tuple(header) != self.columns:  # the older header: its rows first
                self._rewrite(self.rows())
        new = not self.path.is_file()
        with self.path.open("a", newline="", encoding="utf-8") as handle:
            handle.write(_csv_text(self.columns, rows, header=new))
            handle.flush()
            os.fsync(handle.fileno())


def _csv_text(columns: tuple[str, ...], rows: list[dict[str, Any]], header: bool) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns, lineterminator="\n")
    if header:
        writer.writeheader()
    for row in rows:
        writer.writerow({c: _cell(row.get(c)) for c in columns})
    return buffer.getvalue()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value).replace("\n", " ")


def number(text: str | None) -> float | None:
    return float(text) if text not in (None, "") else None


# ============================================================================ the device


@dataclass(frozen=True)
class Memory:
    """Peaks of one row, bytes."""

    peak_allocated: int
    steady_allocated: int
    peak_reserved: int
    device_used: int | None
    alloc_retries: int | None = None
    """torch.cuda.memory_stats()["num_alloc_retries"] over the row: cudaMalloc failures the caching allocator
    answered by releasing its cached segments (the tool's capped re-play, memory/allocator.py)."""


class StepTimer:
    """Marks the end of each timed step; `seconds()` gives each step's time."""

    def start(self) -> None:
        raise NotImplementedError

    def mark(self) -> None:
        raise NotImplementedError

    def seconds(self) -> list[float]:
        raise NotImplementedError


class HostTimer(StepTimer):
    """perf_counter between marks: a CPU runs each step to its end before the next one starts."""

    def start(self) -> None:
        self.marks = [time.perf_counter()]

    def mark(self) -> None:
        self.marks.append(time.perf_counter())

    def seconds(self) -> list[float]:
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


class CudaEventTimer(StepTimer):
    """A CUDA event at each step boundary on the current stream, read once after the last: each step's
    time on the GPU, including any wait for the host to issue its kernels (as a training loop sees it)."""

    def start(self) -> None:
        self.events = [torch.cuda.Event(enable_timing=True)]
        self.events[0].record()

    def mark(self) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self.events.append(event)

    def seconds(self) -> list[float]:
        self.events[-1].synchronize()
        return [a.elapsed_time(b) / 1e3 for a, b in zip(self.events, self.events[1:])]


class Device:
    """Where the steps run. CudaDevice is the real thing; CpuDevice stands in for it in a dry run, with the
    same calls: only the timer, the memory figures and the profiler's activities differ."""

    kind = "cpu"
    torch_device = torch.device("cpu")

    def synchronize(self) -> None:
        """Wait for queued work (nothing on a CPU)."""

    def timer(self) -> StepTimer:
        return HostTimer()

    def clear(self) -> None:
        """Return cached memory between rows."""
        gc.collect()

    def begin_steps(self) -> None:
        """Before the first step: start the peaks."""

    def after_warmup(self) -> None:
        """After the warm-up steps: the steady peaks start here."""

    def memory(self, step: Callable[[], Any], tensors: Callable[[], list[torch.Tensor]]) -> Memory:
        raise NotImplementedError

    def activities(self) -> list[Any]:
        return [torch.profiler.ProfilerActivity.CPU]


class CudaDevice(Device):
    kind = "cuda"

    def __init__(self, index: int = 0) -> None:
        self.torch_device = torch.device(f"cuda:{index}")
        torch.backends.cudnn.benchmark = True  # the estimator assumes the autotuner's choice of algorithm
        self._warm_peak = 0

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.torch_device)

    def timer(self) -> StepTimer:
        return CudaEventTimer()

    def clear(self) -> None:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.torch_device)
        torch.cuda.reset_accumulated_memory_stats(self.torch_device)  # num_alloc_retries counts this row's

    def begin_steps(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.torch_device)

    def after_warmup(self) -> None:
        self.synchronize()
        self._warm_peak = torch.cuda.max_memory_allocated(self.torch_device)
        torch.cuda.reset_peak_memory_stats(self.torch_device)

    def memory(self, step: Callable[[], Any], tensors: Callable[[], list[torch.Tensor]]) -> Memory:
        self.synchronize()
        steady = torch.cuda.max_memory_allocated(self.torch_device)
        reserved = torch.cuda.max_memory_reserved(self.torch_device)
        free, total = torch.cuda.mem_get_info(self.torch_device)
        retries = torch.cuda.memory_stats(self.torch_device).get("num_alloc_retries", 0)
        return Memory(max(steady, self._warm_peak), steady, reserved, total - free, retries)

    def activities(self) -> list[Any]:
        return [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]


class CpuDevice(Device):
    """The dry run's stand-in. A CPU has no caching allocator and no peak counters: one more step runs under
    torch's profiler with profile_memory, and the peak is the tensors alive before it plus the highest
    sum of its allocations less frees (allocated = reserved, as the estimate treats a CPU)."""

    WINDOW = "gt.memory_step"

    def memory(self, step: Callable[[], Any], tensors: Callable[[], list[torch.Tensor]]) -> Memory:
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors()}
        before = sum(storages.values())
        with torch.profiler.profile(activities=self.activities(), profile_memory=True) as prof:
            with torch.profiler.record_function(self.WINDOW):
                step()
        live = peak = 0
        for event in sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                            key=lambda e: e.start_ns()):
            live += event.nbytes()
            peak = max(peak, live)
        total = before + peak
        return Memory(total, total, total, None)


# ============================================================================ one training step


def to_device(inputs: Any, device: torch.device) -> Any:
    return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, inputs)


@contextmanager
def math_flags(precision: str) -> Iterator[None]:
    """TF32 matmuls for tf32 only; cuDNN's TF32 on (torch's default) for every precision; restored after."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


@dataclass
class Training:
    """A built model, its inputs on the device, optimizer and (amp-fp16) GradScaler: `step()` is one full
    training step, phases labelled for the profiler."""

    model: nn.Module
    inputs: Any
    loss_fn: Callable[[Any, Any], torch.Tensor]
    optimizer: torch.optim.Optimizer
    scaler: Any
    autocast: torch.dtype | None
    device_type: str

    def step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with torch.profiler.record_function("gt.forward"):
            with torch.autocast(self.device_type, dtype=self.autocast or torch.bfloat16,
                                enabled=self.autocast is not None):
                loss = self.loss_fn(call_model(self.model, self.inputs), self.inputs)
        with torch.profiler.record_function("gt.backward"):
            (loss if self.scaler is None else self.scaler.scale(loss)).backward()
        with torch.profiler.record_function("gt.optimizer"):
            if self.scaler is None:
                self.optimizer.step()
            else:
                self.scaler.step(self.optimizer)
                self.scaler.update()

    def tensors(self) -> list[torch.Tensor]:
        """What is alive between steps: weights, buffers, gradients, optimizer state, inputs."""
        found = [*self.model.parameters(), *self.model.buffers()]
        found += [p.grad for p in self.model.parameters() if p.grad is not None]
        found += [v for state in self.optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
        found += [t for t in tree_flatten(self.inputs)[0] if isinstance(t, torch.Tensor)]
        return found


def build_training(spec: ModelSpec, key: RowKey, device: Device, dry: bool) -> Training:
    build, make_input, loss_fn = with_layout(spec.parts(dry), key.layout)
    torch.manual_seed(0)
    with torch.device(device.torch_device):
        model = build()
    model.train()
    inputs = to_device(make_input(key.batch), device.torch_device)
    cast = PURE_LOW_PRECISION.get(key.precision)  # pure bf16: the model and its floating-point inputs cast
    if cast is not None:
        model.to(cast)
        inputs = cast_inputs(inputs, cast)
    if spec.checkpointing:
        enable_checkpointing(model)
    optimizer = make_optimizer(spec.optimizer, [p for p in model.parameters() if p.requires_grad])
    scaler = torch.amp.GradScaler(device.kind) if key.precision == "amp-fp16" else None
    return Training(model, inputs, loss_fn or default_loss, optimizer, scaler, AUTOCAST.get(key.precision),
                    device.kind)


def enable_checkpointing(model: nn.Module) -> None:
    """Activation checkpointing as the model's users run it: a transformers model's own switch (Trainer's
    gradient_checkpointing=True, its defaults; transformers 5 renamed gradient_checkpointing_enable to
    activation_checkpointing_enable), else the tool's checkpoint_blocks, which wraps each block of the model's
    repeated blocks."""
    for name in ("activation_checkpointing_enable", "gradient_checkpointing_enable"):
        switch = getattr(model, name, None)
        if switch is not None:
            switch()
            return
    checkpoint_blocks(model, "the ground truth's model")


def time_steps(training: Training, device: Device, settings: Settings) -> list[float]:
    """Warm up (cuDNN's autotuner, lazy state; the last warm step timed on the host), choose how many steps
    fill settings.min_timed_s from it, then time those steps one by one."""
    device.begin_steps()
    for _ in range(settings.warm_steps - 1):
        training.step()
    device.synchronize()
    started = time.perf_counter()
    training.step()
    device.synchronize()
    one = time.perf_counter() - started
    device.after_warmup()
    count = min(max(settings.min_timed_steps, math.ceil(settings.min_timed_s / max(one, 1e-6))),
                settings.max_timed_steps)
    timer = device.timer()
    timer.start()
    for _ in range(count):
        training.step()
        timer.mark()
    return timer.seconds()


@dataclass(frozen=True)
class RowResult:
    status: str
    """ok, oom, error or skipped."""
    times_s: tuple[float, ...] = ()
    memory: Memory | None = None
    params: int | None = None
    message: str = ""
    kernels: tuple[dict[str, Any], ...] = ()

    def fields(self, spec: ModelSpec, key: RowKey, wall_s: float) -> dict[str, Any]:
        row: dict[str, Any] = key.fields() | {"kind": spec.kind, "optimizer": spec.optimizer, "status": self.status,
                                              "params": self.params, "wall_s": round(wall_s, 2),
                                              "message": self.message}
        if self.times_s:
            median = statistics.median(self.times_s)
            quartiles = statistics.quantiles(self.times_s, n=4) if len(self.times_s) >= 2 else [median] * 3
            row |= {"step_time_median_s": median, "step_time_spread": (quartiles[2] - quartiles[0]) / median,
                    "step_time_min_s": min(self.times_s), "step_time_max_s": max(self.times_s),
                    "timed_steps": len(self.times_s), "samples_per_s": key.batch / median}
        if self.memory is not None:
            row |= {"peak_allocated_bytes": self.memory.peak_allocated,
                    "steady_peak_allocated_bytes": self.memory.steady_allocated,
                    "peak_reserved_bytes": self.memory.peak_reserved, "device_used_bytes": self.memory.device_used,
                    "alloc_retries": self.memory.alloc_retries}
        return row


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def measure_row(spec: ModelSpec, key: RowKey, device: Device, settings: Settings, dry: bool,
                profile_kernels: bool) -> RowResult:
    """One row: build, warm up, time the steps, read the peaks, then (once per model/precision/layout) one
    profiled step. An out-of-memory anywhere is recorded as such; so is any other error, in one line."""
    device.clear()
    try:
        return _measure(spec, key, device, settings, dry, profile_kernels)
    except Unavailable as exc:
        return RowResult("skipped", message=str(exc))
    except OOM_ERRORS as exc:
        return RowResult("oom", message=first_line(exc))
    except Exception as exc:  # noqa: BLE001 - one bad row must not stop the others
        status = "oom" if isinstance(exc, RuntimeError) and OOM_MESSAGES.search(str(exc)) else "error"
        return RowResult(status, message=first_line(exc))
    finally:
        device.clear()


def _measure(spec: ModelSpec, key: RowKey, device: Device, settings: Settings, dry: bool,
             profile_kernels: bool) -> RowResult:
    with math_flags(key.precision):
        training = build_training(spec, key, device, dry)
        params = sum(p.numel() for p in training.model.parameters())
        times = time_steps(training, device, settings)
        memory = device.memory(training.step, training.tensors)
        kernels: tuple[dict[str, Any], ...] = ()
        message = ""
        if profile_kernels:
            try:
                kernels = tuple(profile_step(training.step, device))
                message = f"kernels: {len(kernels)} rows"
            except OOM_ERRORS:
                raise
            except Exception as exc:  # noqa: BLE001 - the timings stand without the kernel names
                message = f"kernel profile failed: {first_line(exc)}"
    return RowResult("ok", tuple(times), memory, params, message, kernels)


# ============================================================================ kernels


KERNEL_CATEGORIES = (
    ("attention", re.compile(r"attention")),
    ("conv", re.compile(r"conv")),
    ("rnn", re.compile(r"lstm|_rnn|rnn_|gru")),
    ("matmul", re.compile(r"^aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|einsum|_addmm_activation)$")),
    ("norm", re.compile(r"(batch|layer|group|instance|rms)_norm")),
)
"""An aten op's category by its name; a kernel belongs to the outermost categorised op above it. Norms have
their kernels named: batch norm's on channels-first tensors (one thread block per channel in PyTorch's own
kernels) against cuDNN's or the channels-last ones is what NCHW steps on an H100 spent beyond the
convolutions' layout transposes (2026-11-27 run: 'other' kernels 1.5-1.9x their channels-last time)."""


def _ancestors(event: Any) -> list[Any]:
    """The event and its CPU parents, outermost first."""
    chain = []
    while event is not None:
        chain.append(event)
        event = event.cpu_parent
    return chain[::-1]


def _phase(chain: list[Any]) -> str:
    names = [e.name for e in chain]
    if any(n == "gt.backward" or n.startswith("autograd::engine::evaluate_function") for n in names):
        return "backward"
    for label in ("forward", "optimizer"):
        if f"gt.{label}" in names:
            return label
    return "other"


def _category(chain: list[Any]) -> tuple[str, str]:
    """(category, op) of a kernel launched under `chain`: the outermost categorised aten op, else "other"
    and the outermost aten op."""
    outermost = None
    for event in chain:
        name = event.name.lower()
        if not name.startswith("aten::"):
            continue
        outermost = outermost or event.name
        for category, pattern in KERNEL_CATEGORIES:
            if pattern.search(name):
                return category, event.name
    return "other", outermost or "(no aten op)"


def _kernels_of(event: Any, cuda: bool) -> list[tuple[str, float]]:
    """(kernel name, microseconds) launched by this CPU op: its CUDA kernels; on a CPU (dry run) the op
    itself, for the time it spends outside its children (mkldnn_convolution's arithmetic, say)."""
    if cuda:
        return [(k.name, float(k.duration)) for k in getattr(event, "kernels", ())]
    if event.name.startswith("aten::") and event.self_cpu_time_total > 0:
        return [(event.name, float(event.self_cpu_time_total))]
    return []


def kernel_rows(events: list[Any], cuda: bool) -> list[dict[str, Any]]:
    """Profiler events to kernels.csv rows (without the row key): per phase, category, op and kernel, the
    calls and time; the kernels outside the categories as one 'other' total per phase and outermost op."""
    totals: dict[tuple[str, str, str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for event in events:
        if "CPU" not in str(event.device_type):
            continue
        launched = _kernels_of(event, cuda)
        if not launched:
            continue
        chain = _ancestors(event)
        phase = _phase(chain)
        category, op = _category(chain)
        for name, micros in launched:
            kernel = name if category != "other" else "(all kernels)"
            total = totals[(phase, category, op, kernel)]
            total[0] += 1
            total[1] += micros
    if cuda and not totals:  # kernels not linked to their ops (another profiler version): keep their names
        for event in events:
            if "CUDA" in str(event.device_type):
                total = totals[("unknown", _category_of_kernel(event.name), "(not linked to an op)", event.name)]
                total[0] += 1
                total[1] += float(event.time_range.end - event.time_range.start)
    step = sum(t[1] for t in totals.values()) or 1.0
    return [{"phase": phase, "category": category, "op": op, "kernel": kernel, "calls": int(calls),
             "device_time_us": round(micros, 3), "share_of_step": round(micros / step, 5)}
            for (phase, category, op, kernel), (calls, micros) in sorted(totals.items(), key=lambda i: -i[1][1])]


KERNEL_NAME_CATEGORIES = (("attention", re.compile(r"flash|fmha|attention", re.I)),
                          ("conv", re.compile(r"conv|dgrad|wgrad|fprop|winograd", re.I)),
                          ("rnn", re.compile(r"lstm|rnn|gru", re.I)),
                          ("matmul", re.compile(r"gemm|xmma|cutlass|cublas", re.I)))


def _category_of_kernel(name: str) -> str:
    return next((category for category, pattern in KERNEL_NAME_CATEGORIES if pattern.search(name)), "other")


def profile_step(step: Callable[[], Any], device: Device) -> list[dict[str, Any]]:
    with torch.profiler.profile(activities=device.activities()) as prof:
        step()
        device.synchronize()
    return kernel_rows(list(prof.events()), cuda=device.kind == "cuda")


# ============================================================================ the run: folder, environment, progress


@dataclass
class Run:
    """One command's view of a results folder."""

    out: Path
    dry: bool
    settings: Settings
    specs: list[ModelSpec]
    budget_s: float | None
    started: float
    export: Path | None = None
    units: int = 0
    """Units of work done by this command (the first always starts, whatever the budget)."""
    _device: Device | None = None
    started_at: str = dataclasses.field(default_factory=lambda: now_iso())

    @property
    def steps(self) -> CsvTable:
        return CsvTable(self.out / "steps.csv", STEP_COLUMNS)

    @property
    def kernels(self) -> CsvTable:
        return CsvTable(self.out / "kernels.csv", KERNEL_COLUMNS)

    @property
    def comparison(self) -> CsvTable:
        return CsvTable(self.out / "comparison.csv", COMPARISON_COLUMNS)

    @property
    def probes(self) -> CsvTable:
        return CsvTable(self.out / "probes.csv", PROBE_COLUMNS)

    def environment(self) -> dict[str, Any]:
        return json.loads((self.out / "environment.json").read_text(encoding="utf-8"))

    def progress(self) -> dict[str, Any]:
        path = self.out / "progress.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"parts": {}, "commands": []}

    def save_command(self, part: str) -> None:
        """One line per command in progress.json: when, which part, how long, how many units of work."""
        progress = self.progress()
        progress.setdefault("commands", []).append({"started": self.started_at, "part": part, "units": self.units,
                                                    "seconds": round(self.elapsed(), 1)})
        write_json(self.out / "progress.json", progress)

    def save_part(self, part: str, **state: Any) -> None:
        progress = self.progress()
        previous = progress["parts"].get(part, {})
        seconds = previous.get("seconds", 0.0) + state.pop("seconds", 0.0)
        progress["parts"][part] = previous | state | {"seconds": round(seconds, 1), "updated": now_iso()}
        write_json(self.out / "progress.json", progress)
        self.export_files()

    def part_state(self, part: str) -> dict[str, Any]:
        return self.progress()["parts"].get(part, {})

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def may_start(self, estimate_s: float) -> bool:
        """Whether a unit expected to take `estimate_s` fits in what is left of the budget."""
        return self.units == 0 or self.budget_s is None or self.elapsed() + estimate_s <= self.budget_s

    def device(self) -> Device:
        if self._device is None:
            self._device = CpuDevice() if self.dry else CudaDevice(0)
        return self._device

    def export_files(self) -> None:
        """Copy the folder's files to --export DIR/<folder>/ (a device command's $OUT)."""
        if self.export is None:
            return
        target = self.export / self.out.name
        target.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            if (self.out / name).is_file():
                shutil.copy2(self.out / name, target / name)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


def cpu_identity(cpu: Any) -> dict[str, Any]:
    """What names the host CPU's generation where a VM hides its model name ("Intel(R) Xeon(R) Processor"): its
    CPUID vendor, family, model and stepping (/proc/cpuinfo), clock (Hz), vector extensions and last-level cache
    (bytes). A GPU step's host time per op follows this CPU's single-thread speed (docs/accuracy.md, #28)."""
    numbers: dict[str, int] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                if key.strip() in ("model", "stepping") and value.strip().isdigit():
                    numbers[key.strip()] = int(value)
    except OSError:
        pass
    return {"vendor": cpu.vendor, "family": cpu.family, "model": numbers.get("model"),
            "stepping": numbers.get("stepping"), "clock_hz": cpu.clock_hz, "extensions": list(cpu.vector_extensions),
            "last_level_cache_bytes": cpu.last_level_cache_bytes}


def describe_machine(dry: bool, db: HardwareDB, gpu_id: str | None) -> dict[str, Any]:
    """environment.json: date, GPU, driver, CUDA, cuDNN, torch, python, CPU, the CUDA context's size."""
    cpu = probe_cpu()
    environment: dict[str, Any] = {
        "schema": 1, "created": now_iso(), "date": dt.date.today().isoformat(), "dry_run": dry,
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(), "platform": platform.platform(), "cpu": cpu.model,
        "cpu_cores": cpu.usable_cores, "cpu_identity": cpu_identity(cpu), "torch_threads": torch.get_num_threads(),
        "precisions": PRECISION_NOTES, "cudnn_benchmark": not dry,
        "settings": dataclasses.asdict(DRY if dry else REAL), "repository": _git_state(),
    }
    if dry:
        gpu = db.gpu(gpu_id or DRY_GPU_ID)
        return environment | {"gpu_name": f"DRY RUN: this CPU ({cpu.model}) stands in for a GPU", "gpu_id": gpu.id,
                              "gpu_memory_bytes": gpu.memory_bytes, "gpu_sm_count": gpu.sm_count,
                              "gpu_compute_capability": None, "driver": None, "cuda_context_bytes": None}
    from advisor.probe.nvml import probe_nvidia

    properties = torch.cuda.get_device_properties(0)
    name = torch.cuda.get_device_name(0)
    free, total = torch.cuda.mem_get_info(0)  # creates the context; nothing is allocated yet
    return environment | {
        "gpu_name": name, "gpu_id": gpu_id or match_gpu_name(db, name, properties.total_memory),
        "gpu_memory_bytes": total, "gpu_sm_count": properties.multi_processor_count,
        "gpu_compute_capability": f"{properties.major}.{properties.minor}",
        "driver": probe_nvidia().driver_version, "cuda_context_bytes": total - free - torch.cuda.memory_reserved(0),
    }


def _git_state() -> dict[str, Any]:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    if commit.returncode != 0:
        return {"commit": None, "dirty": None}
    return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}


def open_folder(args: argparse.Namespace, db: HardwareDB, needs_device: bool) -> Path:
    """The results folder: --out, else for a dry run a new temporary folder, else the newest unfinished
    folder of this GPU under benchmarks/results/groundtruth/, else a new <date>-<gpu> one there. Writes
    environment.json the first time; refuses a folder measured on another GPU or torch."""
    if args.dry_run and args.out is None:
        out = Path(tempfile.mkdtemp(prefix="gpu-groundtruth-dry-"))
    elif args.out is not None:
        out = args.out
    else:
        if not torch.cuda.is_available():
            raise UsageError(_no_cuda_sentence())
        name = torch.cuda.get_device_name(0)
        gpu_slug = args.gpu_id or match_gpu_name(db, name, torch.cuda.get_device_properties(0).total_memory) \
            or slug(name)
        out = _resume_folder(gpu_slug) or RESULTS / f"{dt.date.today().isoformat()}-{gpu_slug}"
    out.mkdir(parents=True, exist_ok=True)
    environment = out / "environment.json"
    if environment.is_file():
        _check_same_machine(json.loads(environment.read_text(encoding="utf-8")), environment, args, needs_device)
    elif not needs_device:
        raise UsageError(f"{out} holds no measurements (no environment.json); run the steps there first")
    else:
        if not args.dry_run and not torch.cuda.is_available():
            raise UsageError(_no_cuda_sentence())
        write_json(environment, describe_machine(args.dry_run, db, args.gpu_id))
    return out


def _resume_folder(gpu_slug: str) -> Path | None:
    folders = sorted(RESULTS.glob(f"*-{gpu_slug}"), reverse=True) if RESULTS.is_dir() else []
    for folder in folders:
        progress = folder / "progress.json"
        parts = json.loads(progress.read_text())["parts"] if progress.is_file() else {}
        if (folder / "environment.json").is_file() and any(parts.get(p, {}).get("status") != "done" for p in PARTS):
            return folder
    return None


def _check_same_machine(recorded: dict[str, Any], path: Path, args: argparse.Namespace, needs_device: bool) -> None:
    if recorded.get("dry_run") != args.dry_run:
        kind = "a dry run" if recorded.get("dry_run") else "a real GPU run"
        raise UsageError(f"{path} is {kind}: {'add' if recorded.get('dry_run') else 'drop'} --dry-run, or give "
                         "another --out")
    if not needs_device or args.dry_run:
        return
    if not torch.cuda.is_available():
        raise UsageError(_no_cuda_sentence())
    here = (torch.cuda.get_device_name(0), torch.__version__)
    there = (recorded.get("gpu_name"), recorded.get("torch"))
    if here != there:
        raise UsageError(f"{path} was measured on {there[0]} with torch {there[1]}; this machine has {here[0]} "
                         f"with torch {here[1]}: give another --out")


def _no_cuda_sentence() -> str:
    build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    return (f"{PROG}: torch {torch.__version__} ({build}) sees no CUDA device; run this on a machine with an "
            "NVIDIA GPU, or add --dry-run to check the plumbing on this CPU")


class UsageError(Exception):
    """Bad usage or a machine that cannot do the part: one sentence, exit code 2."""


# ============================================================================ part: tests


CUDA_CONDITION = re.compile(r"cuda\.(is_available|device_count)\(")


def _needs_cuda(decorator: ast.expr) -> bool:
    """`@pytest.mark.skipif(not torch.cuda.is_available(), ...)` and its kin, or a mark named after CUDA
    (`@needs_cuda`, `@pytest.mark.cuda`)."""
    text = ast.unparse(decorator)
    named = isinstance(decorator, (ast.Name, ast.Attribute)) and "cuda" in text.lower()
    return named or CUDA_CONDITION.search(text) is not None


def gpu_test_ids(tests: Path = REPO / "tests") -> list[str]:
    """Node ids of the tests that need CUDA: test functions (or classes, or whole files through
    `pytestmark`) behind a CUDA condition (_needs_cuda); they skip on a machine without one."""
    ids = []
    for path in sorted(tests.glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        relative = path.relative_to(tests.parent).as_posix()
        marked_file = any(isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)
                          and CUDA_CONDITION.search(ast.unparse(node.value)) for node in tree.body)
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if not node.name.lower().startswith("test"):
                continue
            if marked_file or any(_needs_cuda(d) for d in node.decorator_list):
                ids.append(f"{relative}::{node.name}")
            elif isinstance(node, ast.ClassDef):
                ids += [f"{relative}::{node.name}::{m.name}" for m in node.body
                        if isinstance(m, ast.FunctionDef) and m.name.startswith("test")
                        and any(_needs_cuda(d) for d in m.decorator_list)]
    return ids


def part_tests(run: Run) -> bool:
    lacking = missing(FOR_TESTS)
    if lacking:
        sentence = missing_sentence("the tests part", lacking)
        print(sentence, file=sys.stderr)
        run.save_part("tests", status="blocked", note=sentence)
        return False
    ids = gpu_test_ids()
    if not ids:  # pytest with no ids would run the whole suite
        run.save_part("tests", status="done", note="no test needs CUDA", tests=0)
        return True
    started = time.perf_counter()
    env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (str(DEPS), str(REPO), os.environ.get("PYTHONPATH", ""))
                                                      if p)}
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *ids]
    print(f"{PROG}: tests: pytest on {len(ids)} test(s) that need CUDA", file=sys.stderr, flush=True)
    try:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=480)
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        output, code = f"{exc.stdout or ''}{exc.stderr or ''}\ntimed out after 480 s", -1
    seconds = time.perf_counter() - started
    write_atomically(run.out / "tests.txt", f"$ {' '.join(command[1:])}\n\n{output}")
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", output)}
    note = ", ".join(f"{n} {word}" for word, n in counts.items()) or f"pytest exit code {code}"
    run.save_part("tests", status="done", seconds=seconds, exit_code=code, counts=counts, note=note,
                  tests=len(ids))
    print(f"{PROG}: tests: {note} ({seconds:.0f} s)", file=sys.stderr, flush=True)
    return True


# ============================================================================ part: calibration


def measured_document(profile: CalibrationProfile, gpu_id: str) -> dict[str, Any]:
    """A measured reference profile in calibration/reference/measured/'s layout: the cache file's format
    (advisor/calibration/cache.py) plus the `applies_to` block the reference loader reads."""
    body = profile.to_dict()
    checksum = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return {"format": FORMAT, "schema": SCHEMA, "sha256": checksum, "applies_to": {"gpu_ids": [gpu_id]},
            "profile": body}


def families_with(db: HardwareDB, document: dict[str, Any], profile_id: str) -> tuple[Family, ...]:
    """The shipped reference families plus `document` as measured/<profile_id>.json, read by the project's
    own loader from a copy of the reference folder: proof that the file loads."""
    shipped = shipped_dir("calibration", "suite.yaml") / "reference"
    with tempfile.TemporaryDirectory() as folder:
        reference = Path(folder)
        shutil.copytree(shipped, reference, dirs_exist_ok=True)
        (reference / "measured" / f"{profile_id}.json").write_text(json.dumps(document), encoding="utf-8")
        return load_families(db, reference)


def part_calibration(run: Run, db: HardwareDB) -> bool:
    environment = run.environment()
    gpu_id = environment["gpu_id"]
    started = time.perf_counter()
    if run.dry:
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "suite.yaml").write_text(TINY_SUITE, encoding="utf-8")
            suite = load_suite(Path(folder) / "suite.yaml")
        target = dataclasses.replace(cpu_target(suite), name=environment["gpu_name"])
    else:
        suite = load_suite()
        target = cuda_target(0, db, suite)
    print(f"{PROG}: calibration: {len(suite.cases(target.kind, quick=False))} cases on {target.device}",
          file=sys.stderr, flush=True)
    profile = calibrate(target, suite, quick=False, progress=_calibration_progress())
    if gpu_id is None:
        run.save_part("calibration", status="done", seconds=time.perf_counter() - started,
                      note=f"{environment['gpu_name']} is not in the hardware database: no reference profile written")
        return True
    document = measured_document(profile, gpu_id)
    families = families_with(db, document, gpu_id)
    family = next(f for f in families if f.id == gpu_id)
    assert family.measured is not None
    if not run.dry:
        assert family_for(db.gpu(gpu_id), families).id == gpu_id, "the measured profile must win for its GPU"
    write_json(run.out / "calibration.json", document)
    note = f"{len(profile.series)} series, {profile.duration_s} s"
    if not run.dry:  # issue 21 (2): the reference folder of this working tree gets it too
        write_json(MEASURED / f"{gpu_id}.json", document)
        note += f"; also written to {MEASURED.relative_to(REPO)}/{gpu_id}.json"
    run.save_part("calibration", status="done", seconds=time.perf_counter() - started, note=note)
    print(f"{PROG}: calibration: {note}", file=sys.stderr, flush=True)
    return True


def _calibration_progress() -> Callable[[int, int, str], None]:
    last = [0.0]

    def progress(done: int, total: int, label: str) -> None:
        if time.perf_counter() - last[0] > 15 or done == total:
            last[0] = time.perf_counter()
            print(f"{PROG}: calibration {done}/{total} {label}", file=sys.stderr, flush=True)

    return progress


# ============================================================================ part: steps


def part_steps(run: Run, only: set[str] | None) -> bool:
    """Every planned row not yet in steps.csv, while the budget lasts. True when none is left."""
    done = {RowKey.of(r): r for r in run.steps.rows()}
    plan = [(s, k) for s, k in planned_rows(run.specs, run.dry) if only is None or s.name in only]
    left = [(s, k) for s, k in plan if k not in done]
    profiled = {k.group for k in done}  # a group's first row that ran was profiled then
    walls: dict[str, list[float]] = defaultdict(list)
    for row in done.values():
        walls[row["model"]].append(float(row["wall_s"] or 0))
    device = run.device()
    for index, (spec, key) in enumerate(left):
        estimate = 1.5 * max(walls[spec.name] or [run.settings.estimate_s["row"]])
        if not run.may_start(estimate):
            break
        smaller = next((done[k] for k in done if k.group == key.group and k.batch < key.batch
                        and done[k]["status"] == "oom"), None)
        started = time.perf_counter()
        if smaller is not None:
            result = RowResult("oom", message=f"not run: batch {smaller['batch']} ran out of memory")
        else:
            result = measure_row(spec, key, device, run.settings, run.dry, profile_kernels=key.group not in profiled)
        wall = time.perf_counter() - started
        row = result.fields(spec, key, wall)
        run.steps.append([row])
        if result.kernels:
            run.kernels.append([key.fields() | k for k in result.kernels])
        if result.status == "ok":
            profiled.add(key.group)
        done[key] = {c: _cell(row.get(c)) for c in STEP_COLUMNS}
        walls[spec.name].append(wall)
        run.units += 1
        run.save_part("steps", status="partial", seconds=wall, rows=len(done), planned=len(plan))
        print(f"{PROG}: [steps {len(plan) - len(left) + index + 1}/{len(plan)}] {key.label}: {_row_summary(row)} "
              f"({wall:.1f} s)", file=sys.stderr, flush=True)
    finished = all(k in done for _, k in plan)
    if finished and only is None:
        run.save_part("steps", status="done", rows=len(done), planned=len(plan))
    return finished


def _row_summary(row: dict[str, Any]) -> str:
    if row["status"] != "ok":
        return f"{row['status']} {row.get('message') or ''}".strip()
    memory = row.get("peak_reserved_bytes")
    reserved = f", {memory / 2**30:.2f} GiB reserved" if memory else ""
    return f"{row['step_time_median_s'] * 1e3:.2f} ms/step (spread {row['step_time_spread']:.1%}){reserved}"


# ============================================================================ part: compare


@dataclass
class Predictor:
    """The tool's predictions for the run's GPU: with the calibration shipped for it (this run's profile
    left out), and with this run's calibration; traces shared between rows that can share them."""

    db: HardwareDB
    gpu: GPUSpec
    shipped: DeviceModel
    calibration_label: str
    calibrated: DeviceModel | None
    dry: bool
    traces: dict[tuple[str, int, str, str], StepTrace | str] = dataclasses.field(default_factory=dict)

    @classmethod
    def for_run(cls, run: Run, db: HardwareDB) -> Predictor:
        environment = run.environment()
        gpu_id = environment["gpu_id"]
        if gpu_id is None:
            raise UsageError(f"{PROG}: {environment['gpu_name']} is not in the hardware database, so the tool has "
                             "no prediction for it; add it to hwdb/ (or pass --gpu-id ID) and run --part compare")
        gpu = db.gpu(gpu_id)
        families = tuple(f for f in load_families(db) if f.id != gpu_id)  # the shipped ones, not this run's
        target = database_targets(db, [gpu], families)[0]
        label = f"{family_for(gpu, families).id} ({target.device.profile.status})"
        calibrated = None
        document_path = run.out / "calibration.json"
        if document_path.is_file():
            document = json.loads(document_path.read_text(encoding="utf-8"))
            if run.dry:  # this CPU's tiny calibration, as the estimate uses a CPU's
                calibrated = DeviceModel("dry-run-cpu", "cpu", CalibrationProfile.from_dict(document["profile"]))
            else:  # exactly what the tool uses once calibration.json is installed in measured/
                profile = reference_profile(gpu, families_with(db, document, gpu_id))
                calibrated = DeviceModel.of_gpu(gpu.id, profile, gpu)
        return cls(db, gpu, target.device, label, calibrated, run.dry)

    def trace(self, spec: ModelSpec, key: RowKey) -> StepTrace | str:
        """The fake-tensor trace of the row's step (fp32's serves tf32: the same ops, timed differently), or
        why there is none. Attention with dropout is traced as CUDA's fused kernels run it, as `advisor
        estimate` traces for a GPU (a dry run's rows ran on a CPU: its math path)."""
        precision = "fp32" if key.precision == "tf32" else key.precision
        cache_key = (spec.name, key.batch, precision, key.layout)
        if cache_key not in self.traces:
            if any(name != spec.name for name, *_ in self.traces):
                self.traces.clear()  # rows come model by model: keep one model's traces
            try:
                build, make_input, loss_fn = with_layout(spec.parts(self.dry), key.layout)
                self.traces[cache_key] = trace_training_step(build, make_input, key.batch, precision, spec.optimizer,
                                                             loss_fn, attention="cpu" if self.dry else "cuda",
                                                             checkpointing=spec.checkpointing)
            except Unavailable as exc:
                self.traces[cache_key] = str(exc)
            except Exception as exc:  # noqa: BLE001 - the tool cannot trace it: that is a finding, not a crash
                self.traces[cache_key] = f"no trace: {first_line(exc)}"
        return self.traces[cache_key]

    def predict(self, spec: ModelSpec, key: RowKey, measured: dict[str, str]) -> dict[str, Any]:
        trace = self.trace(spec, key)
        row: dict[str, Any] = key.fields() | {"status": measured["status"], "calibration": self.calibration_label,
                                              "measured_step_s": number(measured["step_time_median_s"]),
                                              "measured_steady_allocated_bytes":
                                                  number(measured["steady_peak_allocated_bytes"]),
                                              "measured_reserved_bytes": number(measured["peak_reserved_bytes"]),
                                              "measured_device_used_bytes": number(measured["device_used_bytes"]),
                                              "measured_alloc_retries": number(measured.get("alloc_retries", ""))}
        if isinstance(trace, str):
            return row | {"note": trace}
        memory = device_memory(StepMemory.of_trace(trace), self.gpu, self.db.memory_overhead(self.gpu),
                               capped=capped_replay(trace.memory))
        peaks = gpu_peaks(self.gpu)
        row |= {
            "predicted_step_s": estimate_records(trace.records, key.precision, self.shipped).step_s,
            "bare_step_s": bare_roofline_seconds(trace.records, key.precision, peaks.flops,
                                                 self.gpu.bandwidth_bytes_per_s, gpu=True),
            "calibrated_step_s": (estimate_records(trace.records, key.precision, self.calibrated).step_s
                                  if self.calibrated else None),
            "predicted_allocated_bytes": memory.allocated_bytes, "predicted_reserved_bytes": memory.reserved_bytes,
            "predicted_peak_bytes": memory.peak_bytes, "predicted_fits": memory.fits,
            "predicted_alloc_flushes": memory.allocator_flushes,
        }
        for name, predicted, actual in (("step_error", "predicted_step_s", "measured_step_s"),
                                        ("bare_error", "bare_step_s", "measured_step_s"),
                                        ("calibrated_error", "calibrated_step_s", "measured_step_s"),
                                        ("allocated_error", "predicted_allocated_bytes", "measured_steady_allocated_bytes"),
                                        ("reserved_error", "predicted_reserved_bytes", "measured_reserved_bytes"),
                                        ("peak_error", "predicted_peak_bytes", "measured_device_used_bytes")):
            if row.get(predicted) is not None and row.get(actual):
                row[name] = row[predicted] / row[actual] - 1
        if measured["status"] == "oom" and memory.fits:
            row["note"] = "ran out of memory, predicted to fit"
        elif measured["status"] == "ok" and not memory.fits:
            row["note"] = "ran, predicted not to fit"
        return row


def predict_folder(folder: Path) -> list[dict[str, Any]]:
    """comparison.csv's rows for a results folder's rows that ran, predicted now with this checkout's code
    and shipped calibration, writing nothing (benchmarks/accuracy.py --part gpu reads real runs this way)."""
    environment = json.loads((folder / "environment.json").read_text(encoding="utf-8"))
    dry = bool(environment.get("dry_run"))
    run = Run(folder, dry, DRY if dry else REAL, model_specs(), None, time.perf_counter())
    predictor = Predictor.for_run(run, load_hwdb([], include_user_layers=False))
    specs = {s.name: s for s in run.specs}
    return [predictor.predict(specs[r["model"]], RowKey.of(r), r) for r in run.steps.rows()
            if r["status"] == "ok" and r["model"] in specs]


def part_compare(run: Run, db: HardwareDB) -> bool:
    """A prediction for every ok or oom row of steps.csv not yet in comparison.csv, while the budget lasts."""
    specs = {s.name: s for s in run.specs}
    steps = [r for r in run.steps.rows() if r["status"] in ("ok", "oom") and r["model"] in specs]
    done = {RowKey.of(r) for r in run.comparison.rows()}
    left = [r for r in steps if RowKey.of(r) not in done]
    if not left:
        return _compare_finished(run, len(done))
    predictor = Predictor.for_run(run, db)
    walls: list[float] = []
    for row in left:
        key = RowKey.of(row)
        if not run.may_start(1.5 * max(walls or [run.settings.estimate_s["compare"]])):
            break
        started = time.perf_counter()
        run.comparison.append([predictor.predict(specs[key.model], key, row)])
        walls.append(time.perf_counter() - started)
        done.add(key)
        run.units += 1
        run.save_part("compare", status="partial", seconds=walls[-1], rows=len(done))
    print(f"{PROG}: compare: {len(done)} of {len(steps)} measured rows predicted", file=sys.stderr, flush=True)
    return _compare_finished(run, len(done))


def _compare_finished(run: Run, rows: int) -> bool:
    steps = run.part_state("steps").get("status") == "done"
    names = {s.name for s in run.specs}
    measured = {RowKey.of(r) for r in run.steps.rows() if r["status"] in ("ok", "oom") and r["model"] in names}
    finished = steps and measured <= {RowKey.of(r) for r in run.comparison.rows()}
    if finished and run.part_state("compare").get("status") != "done":
        run.save_part("compare", status="done", rows=rows)
    return finished


def part_probes(run: Run) -> bool:
    """The kernels of benchmarks/gpu_probes.py timed alone into probes.csv (in one unit: about 40 s)."""
    if run.part_state("probes").get("status") == "done":
        return True
    if not run.may_start(run.settings.estimate_s["probes"]):
        return False
    started = time.perf_counter()
    device = run.device()
    device.clear()
    rows = measure_probes(device.torch_device, run.dry, run.environment()["gpu_id"])
    write_atomically(run.probes.path, _csv_text(PROBE_COLUMNS, rows, header=True))
    run.units += 1
    run.save_part("probes", status="done", seconds=time.perf_counter() - started, rows=len(rows),
                  l2_bytes=l2_bytes_of(device.torch_device))
    return True


# ============================================================================ report


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.4g}"


def _err(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.3g}"


def _median_abs(rows: list[dict[str, str]], column: str) -> tuple[float | None, int]:
    values = [abs(v) for r in rows if (v := number(r[column])) is not None]
    return (statistics.median(values) if values else None), len(values)


def report(run: Run) -> str:
    """The predicted-vs-measured table and its medians, with the parts' state."""
    environment = run.environment()
    progress = run.progress()["parts"]
    lines = [f"GPU ground truth: {environment['gpu_name']} ({environment['gpu_id']}), driver {environment['driver']}, "
             f"CUDA {environment['cuda']}, torch {environment['torch']}, python {environment['python']}, "
             f"{environment['date']}; folder {run.out}"]
    lines.append("parts: " + "; ".join(f"{p} {progress.get(p, {}).get('status', 'not started')}"
                                         + (f" ({progress[p]['note']})" if progress.get(p, {}).get("note") else "")
                                         for p in PARTS))
    steps = run.steps.rows()
    statuses = defaultdict(int)
    for row in steps:
        statuses[row["status"]] += 1
    lines.append(f"steps.csv: {len(steps)} rows ({', '.join(f'{n} {s}' for s, n in sorted(statuses.items()))}); "
                 f"kernels.csv: {len(run.kernels.rows())} rows")
    probes = run.probes.rows()
    if probes:
        lines += ["", *probe_summary(probes, progress.get("probes", {}).get("l2_bytes"), environment["gpu_id"])]
    rows = run.comparison.rows()
    if not rows:
        lines.append("no predictions yet (part compare)")
        return "\n".join(lines)
    if run.dry:
        lines.append(f"DRY RUN: measured on this CPU, predicted for {environment['gpu_id']}: the errors mean nothing; "
                     "'calib' is the prediction from this run's tiny CPU calibration")
    lines += ["", f"error = predicted / measured - 1; ours: the tool with the calibration shipped for "
                  f"{environment['gpu_id']} ({rows[0]['calibration']}); bare: 75% of peak per op; "
                  "calib: this run's calibration; memory: max_memory_reserved vs the predicted reserve",
              f"{'row':<40} {'measured':>9} {'ours':>9} {'err':>7} {'bare':>9} {'err':>7} {'calib':>9} {'err':>7}"
              f" {'rsv GiB':>8} {'pred':>8} {'err':>7}  note"]
    for r in rows:
        key = RowKey.of(r)
        measured = "OOM" if r["status"] == "oom" else _ms(number(r["measured_step_s"]))
        lines.append(f"{key.label:<40} {measured:>9} {_ms(number(r['predicted_step_s'])):>9} "
                     f"{_err(number(r['step_error'])):>7} {_ms(number(r['bare_step_s'])):>9} "
                     f"{_err(number(r['bare_error'])):>7} {_ms(number(r['calibrated_step_s'])):>9} "
                     f"{_err(number(r['calibrated_error'])):>7} {_gib(number(r['measured_reserved_bytes'])):>8} "
                     f"{_gib(number(r['predicted_reserved_bytes'])):>8} {_err(number(r['reserved_error'])):>7}  "
                     f"{r['note']}")
    lines.append("")
    for label, column in (("step time, ours", "step_error"), ("step time, bare roofline", "bare_error"),
                          ("step time, this run's calibration", "calibrated_error"),
                          ("peak allocated (steady)", "allocated_error"), ("peak reserved", "reserved_error"),
                          ("device memory used (with context)", "peak_error")):
        median, count = _median_abs(rows, column)
        lines.append(f"median |error| {label:<36} {'-' if median is None else f'{median:.1%}':>7}  (n={count})")
    oom = [r for r in rows if r["status"] == "oom"]
    lines.append(f"out of memory: {len(oom)} rows, {sum(r['predicted_fits'] == 'True' for r in oom)} of them predicted "
                 f"to fit; ran: {len(rows) - len(oom)} rows, "
                 f"{sum(r['predicted_fits'] == 'False' for r in rows if r['status'] == 'ok')} predicted not to fit")
    return "\n".join(lines)


# ============================================================================ helpers: install, bundle, main


def install_profile(folder: Path, measured: Path = MEASURED) -> Path:
    """Copy a real run's calibration.json into calibration/reference/measured/<gpu id>.json after checking
    that the reference loader reads it."""
    environment = json.loads((folder / "environment.json").read_text(encoding="utf-8"))
    if environment.get("dry_run"):
        raise UsageError(f"{PROG}: {folder} is a dry run: its calibration is this CPU's, not a GPU's; not installed")
    document = json.loads((folder / "calibration.json").read_text(encoding="utf-8"))
    gpu_id = environment["gpu_id"]
    db = load_hwdb([], include_user_layers=False)
    families = families_with(db, document, gpu_id)
    assert family_for(db.gpu(gpu_id), families).id == gpu_id
    target = measured / f"{gpu_id}.json"
    write_json(target, document)
    return target


def bundle_deps(target: Path = DEPS) -> int:
    """Copy the installed pure-Python distributions in BUNDLE into `target` (a folder on sys.path there)."""
    target.mkdir(parents=True, exist_ok=True)
    (target / ".gitignore").write_text("*\n", encoding="utf-8")  # the folder ignores itself
    for name in BUNDLE:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            print(f"{PROG}: {name} is not installed here (pip install {name}); nothing bundled", file=sys.stderr)
            return 2
        files = [f for f in dist.files or () if not str(f).startswith("..")]
        if any(str(f).endswith((".so", ".pyd", ".dylib")) for f in files):
            print(f"{PROG}: {name} holds compiled code: carry a wheel for the GPU machine instead", file=sys.stderr)
            return 2
        for file in files:
            source = Path(dist.locate_file(file))
            if source.is_file() and "__pycache__" not in file.parts:
                destination = target / file
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, destination)
        print(f"{PROG}: bundled {name} {dist.version} into {target}", file=sys.stderr)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu_groundtruth.py", description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="auto",
                        help="auto (the next unfinished parts, default), tests, calibration, steps, "
                             "steps:MODEL[,MODEL], compare, probes, or report (print the table)")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="start no unit of work that would end after this many seconds (default 420; 0: none)")
    parser.add_argument("--out", type=Path, help="results folder (default: benchmarks/results/groundtruth/"
                        "<date>-<gpu>/, resuming the newest unfinished one; a new temporary folder for --dry-run)")
    parser.add_argument("--export", type=Path, help="copy the results to DIR/<folder>/ after each unit (a device "
                        "command's $OUT)")
    parser.add_argument("--dry-run", action="store_true", help="this CPU, tiny models, a tiny suite: the plumbing")
    parser.add_argument("--models", help="only these models (comma-separated names, see --list)")
    parser.add_argument("--gpu-id", help="the hardware database id of this GPU when its name is not matched")
    parser.add_argument("--list", action="store_true", help="list the models and rows, then exit")
    parser.add_argument("--install-profile", type=Path, metavar="FOLDER",
                        help="copy FOLDER/calibration.json into calibration/reference/measured/")
    parser.add_argument("--bundle-deps", action="store_true",
                        help=f"copy {', '.join(BUNDLE)} from this Python into .deps/ (carried to a GPU machine)")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"auto|tests|calibration|steps(:[\w,.-]+)?|compare|probes|report", args.part):
        parser.error(f"--part: expected auto, tests, calibration, steps[:MODEL,...], compare, probes or report, "
                     f"got {args.part!r}")
    return args


def select_specs(args: argparse.Namespace) -> list[ModelSpec]:
    specs = model_specs()
    names = set(args.models.split(",")) if args.models else None
    if args.part.startswith("steps:"):
        names = set(args.part.split(":", 1)[1].split(","))
    if names is not None:
        unknown = sorted(names - {s.name for s in specs})
        if unknown:
            raise UsageError(f"{PROG}: unknown model {unknown[0]!r}; models: {', '.join(s.name for s in specs)}")
        specs = [s for s in specs if s.name in names]
    return specs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.bundle_deps:
        return bundle_deps()
    signal.signal(signal.SIGTERM, _terminated)  # a command's time limit: the finally blocks still run
    try:
        return _main(args)
    except UsageError as exc:
        print(str(exc) if str(exc).startswith(PROG) else f"{PROG}: {exc}", file=sys.stderr)
        return 2


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _main(args: argparse.Namespace) -> int:
    if args.install_profile is not None:
        print(f"{PROG}: installed {install_profile(args.install_profile)}", file=sys.stderr)
        return 0
    specs = select_specs(args)
    if args.list:
        rows = planned_rows(specs, args.dry_run)
        for spec in specs:
            count = sum(1 for s, _ in rows if s is spec)
            print(f"{spec.name:<16} {spec.kind:<12} batches {spec.batches_for(args.dry_run)} {spec.optimizer:<9} "
                  f"{count:>3} rows  {spec.origin}")
        print(f"{len(rows)} rows")
        return 0
    if args.dry_run:
        torch.set_num_threads(1)  # a shared CI machine: no stalls of threads waiting on each other
    db = load_hwdb([], include_user_layers=False)
    gc.freeze()  # the imports' objects: gc.collect() between rows then takes microseconds, not 0.2 s
    needs_device = args.part in ("auto", "tests", "calibration", "probes") or args.part.startswith("steps")
    out = open_folder(args, db, needs_device)
    run = Run(out, args.dry_run, DRY if args.dry_run else REAL, specs, args.budget_s or None, time.perf_counter(),
              args.export)
    print(f"{PROG}: results in {out}", file=sys.stderr, flush=True)
    try:
        finished = _do_parts(run, args, db)
    finally:
        if args.part != "report":
            run.save_command(args.part)
        text = report(run)
        write_atomically(out / "report.txt", text + "\n")
        run.export_files()
    print(text)
    left = [p for p in PARTS if run.part_state(p).get("status") != "done"]
    if left:
        print(f"\n{PROG}: not finished ({', '.join(left)} left): run the same command again", file=sys.stderr)
        return EXIT_MORE
    print(f"\n{PROG}: all parts done: {out}", file=sys.stderr)
    return 0 if finished else EXIT_MORE


def _do_parts(run: Run, args: argparse.Namespace, db: HardwareDB) -> bool:
    part = args.part
    if part == "report":
        return True
    if part == "tests":
        return part_tests(run)
    if part == "calibration":
        return part_calibration(run, db)
    if part.startswith("steps"):
        return part_steps(run, {s.name for s in run.specs} if ":" in part else None)
    if part == "compare":
        return part_compare(run, db)
    if part == "probes":
        return part_probes(run)
    for name, action in (("tests", lambda: part_tests(run)), ("calibration", lambda: part_calibration(run, db))):
        if run.part_state(name).get("status") == "done":
            continue
        if not run.may_start(run.settings.estimate_s[name]):
            return False
        action()
        run.units += 1
    if not part_steps(run, None):
        return False
    return part_compare(run, db) and part_probes(run)


if __name__ == "__main__":
    raise SystemExit(main())
