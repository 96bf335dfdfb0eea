"""The micro-benchmark suite: calibration/suite.yaml read into cases that build real tensors and run
real torch ops, and the FLOPs and bytes of each case from the estimator's own cost registry."""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from advisor.calibration.peaks import DTYPES
from advisor.paths import shipped_dir
from advisor.profile.costs import op_cost

DEVICE_KINDS = ("cpu", "cuda")
FIT_KINDS = ("saturating", "hierarchy", "none")
MEMORY_OPS = ("copy", "scale", "triad", "reduction", "add", "gelu", "layer_norm", "softmax", "pool", "random",
              "fresh_pages")
HOST_MEMORY_OPS = ("fresh_pages",)
"""Memory ops that only a CPU calibration measures: first touch of memory the allocator just got from
the kernel (GPUs keep theirs in PyTorch's caching allocator)."""
COMPUTE_OPS = ("gemm", "conv", "conv_backward", "conv_dw", "conv_dw_backward")
CONV_OPS = ("conv", "conv_backward", "conv_dw", "conv_dw_backward")
"""Convolutions: dense (one group or wide groups) and depthwise (`_dw`: channels-per-group too few for
the dense kernels' tiles; a CPU runs them far below a dense convolution of the same FLOPs)."""
LAUNCH_VARIANTS = ("dispatch", "autograd", "foreach")
FOREACH_TENSORS = 64
"""The `foreach` launch case: one `_foreach_add_` over this many one-element tensors, whose time per
tensor is the profile's `foreach` overhead (a multi-tensor op's cost per tensor of its list on a CPU,
where it loops over them in C++: less than a whole dispatch from Python)."""
OPS = ("launch", *MEMORY_OPS, *COMPUTE_OPS)
"""Series the suite knows how to build, in the order they run: launch first, memory ops next (the
compute ops' roofline needs the sustained bandwidth), compute ops last."""

TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                "fp8": torch.float8_e4m3fn}
LAYER_NORM_WIDTH = 1024
"""Elements per row of the layer_norm and softmax cases."""

Call = Callable[[], object]


@dataclass(frozen=True)
class Timing:
    """How long to measure each case, seconds."""

    min_time_s: float
    """Measure each case at least this long in total (after warm-up)."""
    warmup_s: float
    max_call_s: float
    """Skip a case whose single call is predicted to take longer (fp16 GEMM on CPUs without fp16 units)."""
    min_samples: int
    min_sample_s: float
    """Tiny ops repeat inside one timed sample until it lasts this long (timer resolution, launch)."""


@dataclass(frozen=True)
class Case:
    """One op in one dtype at one size."""

    op: str
    dtype: str
    size: tuple[int, ...]
    """Shape parameters as in suite.yaml; () for launch."""
    variant: str = ""
    """launch only: dispatch or autograd."""

    @property
    def label(self) -> str:
        if self.op == "launch":
            return self.variant
        if self.op in MEMORY_OPS:
            return _bytes_label(self.size[0])
        if self.op == "gemm":
            return "x".join(str(s) for s in self.size)
        batch, cin, cout, hw, kernel, stride, groups = self.size
        depthwise = " dw" if groups > 1 else ""
        return f"{batch}x{cin}x{hw}x{hw} {kernel}x{kernel}/{stride} ->{cout}{depthwise}"

    @property
    def series(self) -> str:
        return f"{self.op}/{self.dtype}"

    def build(self, device: str, cold_bytes: float = 0.0) -> Call:
        """Allocate the case's tensors on `device` ("meta" for costs alone) and return the call to time.

        `cold_bytes` (issue #20): build enough copies of the tensors to fill this many bytes and let
        successive calls take them in turn, so that each call finds its operands out of the caches, as
        a training step does (its working set is far larger than any cache: at rest on a 2-core EPYC VM
        a 4 MiB add ran 3.6x faster on cache-hot operands than on evicted ones, 0.077 ms against 0.275).
        The per-op overhead (launch) and page faults (fresh_pages) have no operands to keep cold."""
        make = _BUILDERS[self.op]
        where, dtype = torch.device(device), TORCH_DTYPES[self.dtype]
        if cold_bytes <= 0 or self.op in ("launch", "fresh_pages") or device == "meta":
            return make(self, where, dtype)
        copies = max(1, min(MAX_COLD_COPIES, math.ceil(cold_bytes / max(case_cost(self).bytes, 1))))
        calls = [make(self, where, dtype) for _ in range(copies)]
        if copies == 1:
            return calls[0]
        turn = itertools.cycle(calls)
        return lambda: next(turn)()


METHOD = "cold operands, contention re-measured (2026-11-23)\n"
"""How the runner measures, hashed into the suite's digest with the YAML: a profile measured another way
(before operands were kept cold) is not reused."""

MAX_COLD_COPIES = 4096
"""At most this many copies of a case's tensors (a 4 KiB case in a 32 MiB cache needs 16,384 for 2x it)."""


def _bytes_label(size: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


@dataclass(frozen=True)
class Series:
    """One op of the suite: its fit and, per device kind, dtypes and sizes."""

    op: str
    fit: str
    dtypes: dict[str, tuple[str, ...]]
    sizes: dict[str, dict[str, tuple[tuple[int, ...], ...]]]
    """device kind -> "quick"/"full" -> sizes."""


@dataclass(frozen=True)
class Suite:
    """The whole suite as read from calibration/suite.yaml."""

    series: tuple[Series, ...]
    timing: dict[str, dict[str, Timing]]
    digest: str
    """sha256 of the file: a profile measured with another suite is not reused."""
    origin: str

    def cases(self, device_kind: str, quick: bool, dtypes: set[str] | None = None) -> list[Case]:
        """The cases to run on a device of this kind, in run order; `dtypes` limits them to the
        dtypes the device has a peak for (None: all)."""
        assert device_kind in DEVICE_KINDS, device_kind
        cases: list[Case] = []
        for series in sorted(self.series, key=lambda s: OPS.index(s.op)):
            for dtype in series.dtypes.get(device_kind, ()):
                if dtypes is not None and dtype not in dtypes and series.op != "launch":
                    continue
                if series.op == "launch":
                    cases.extend(Case("launch", dtype, (), variant) for variant in LAUNCH_VARIANTS)
                    continue
                sizes = series.sizes[device_kind]
                chosen = sizes["quick"] + (() if quick else sizes["full"])
                ordered = sorted(chosen, key=lambda size: _work(series.op, size))
                cases.extend(Case(series.op, dtype, size) for size in ordered)
        return cases

    def only(self, *ops: str) -> Suite:
        """The same suite restricted to these ops (launch and copy are always kept: every profile
        needs its overheads and its sustained bandwidth)."""
        keep = {*ops, "launch", "copy"}
        return replace(self, series=tuple(s for s in self.series if s.op in keep))

    def timing_for(self, device_kind: str, quick: bool) -> Timing:
        return self.timing[device_kind]["quick" if quick else "full"]


def _work(op: str, size: tuple[int, ...]) -> float:
    """A size's order within its series (FLOPs or bytes up to a constant factor)."""
    if op == "gemm":
        m, n, k = size
        return m * n * k
    if op in CONV_OPS:
        batch, cin, cout, hw, kernel, stride, groups = size
        return batch * cout * (hw // stride) ** 2 * cin / groups * kernel**2
    return size[0]


class SuiteError(ValueError):
    """calibration/suite.yaml (or a replacement) is malformed; the message names the file and key."""


def load_suite(path: Path | None = None) -> Suite:
    """Read and validate the suite file (the shipped one by default)."""
    import yaml  # here: an estimate, which imports this module for its names, reads no suite

    path = path or shipped_dir("calibration", "suite.yaml") / "suite.yaml"
    text = path.read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    where = str(path)
    if not isinstance(data, dict) or data.get("schema") != 1:
        raise SuiteError(f"{where}: expected a mapping with schema: 1")
    _only_keys(data, {"schema", "timing", "series"}, where)
    timing = {
        kind: {mode: _timing(data["timing"][kind][mode], f"{where}: timing.{kind}.{mode}") for mode in ("quick", "full")}
        for kind in DEVICE_KINDS
    }
    series = tuple(_series(op, entry, f"{where}: series.{op}") for op, entry in data["series"].items())
    return Suite(series, timing, hashlib.sha256((METHOD + text).encode()).hexdigest()[:16], where)


def _only_keys(data: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise SuiteError(f"{where}: unknown key {unknown[0]!r} (expected {', '.join(sorted(allowed))})")


def _timing(data: dict, where: str) -> Timing:
    fields = {"min_time_s", "warmup_s", "max_call_s", "min_samples", "min_sample_s"}
    _only_keys(data, fields, where)
    if set(data) != fields or any(not isinstance(v, (int, float)) or v <= 0 for v in data.values()):
        raise SuiteError(f"{where}: needs positive {', '.join(sorted(fields))}")
    return Timing(float(data["min_time_s"]), float(data["warmup_s"]), float(data["max_call_s"]),
                  int(data["min_samples"]), float(data["min_sample_s"]))


def _series(op: str, data: dict, where: str) -> Series:
    if op not in OPS:
        raise SuiteError(f"{where}: unknown op (the suite can build {', '.join(OPS)})")
    _only_keys(data, {"fit", "dtypes", "sizes", "variants"}, where)
    if data.get("fit") not in FIT_KINDS:
        raise SuiteError(f"{where}.fit: expected one of {', '.join(FIT_KINDS)}")
    dtypes: dict[str, tuple[str, ...]] = {}
    for kind, names in data["dtypes"].items():
        if kind not in DEVICE_KINDS or any(name not in DTYPES for name in names):
            raise SuiteError(f"{where}.dtypes.{kind}: device kinds are {DEVICE_KINDS}, dtypes {DTYPES}")
        dtypes[kind] = tuple(names)
    sizes: dict[str, dict[str, tuple[tuple[int, ...], ...]]] = {}
    arity = 3 if op == "gemm" else 7 if op in CONV_OPS else 1
    for kind, modes in (data.get("sizes") or {}).items():
        sizes[kind] = {}
        for mode in ("quick", "full"):
            parsed = []
            for size in modes.get(mode, ()):
                size = tuple(size) if isinstance(size, list) else (size,)
                if len(size) != arity or any(not isinstance(s, int) or s <= 0 for s in size):
                    raise SuiteError(f"{where}.sizes.{kind}.{mode}: {list(size)} is not {arity} positive integers")
                parsed.append(size)
            sizes[kind][mode] = tuple(parsed)
    if op != "launch" and set(sizes) != set(dtypes):
        raise SuiteError(f"{where}: sizes and dtypes must name the same device kinds")
    return Series(op, data["fit"], dtypes, sizes)


# ---- builders: tensors on the device, the call to time ---------------------------------------------------


def _launch(case: Case, device: torch.device, dtype: torch.dtype) -> Call:
    if case.variant == "foreach":
        tensors = [torch.ones(1, device=device, dtype=dtype) for _ in range(FOREACH_TENSORS)]
        return lambda: torch._foreach_add_(tensors, 1.0)
    x = torch.ones(1, device=device, dtype=dtype, requires_grad=case.variant == "autograd")
    return lambda: torch.add(x, 1.0)


def _elements(case: Case, dtype: torch.dtype) -> int:
    return max(case.size[0] // torch.empty((), dtype=dtype).element_size(), 1)


def _copy(case: Case, device: torch.device, dtype: torch.dtype) -> Call:
    source, target = (torch.ones(_elements(case, dtype), device=device, dtype=dtype) for _ in range(2))
    return lambda: target.copy_(source)


def _scale(case: Case, device: torch.device, dtype: torch.dtype) -> Call:
    source, target = (torch.ones(_elements(case, dtype), device=device, dtype=dtype) for _ in range(2))
    return lambda: torch.mul(source, 3.0, out=target)


def _triad(case: Case, device: torch.device, dtype: torch.dtype) -> Call:
    a, b, c = (torch.ones(_elements(case, dtype), device=device, dtype=dtype) for _ in range(3))
    return lambda: torch.add(b, c, alpha=3.0, out=a)


def _reduction(case: Case, device: torch.device, dtype: torch.dtype) -> Call:
    a = torch.ones(_elements(case, dtype), device=device, dtype=dtype)
    return lambda: torch.sum(a)


def _add(case: Case, device: torch.device, dtype: torch.dtype) -> Call:
    """A fresh output each call, as a training step allocates its activations."""
    a, b = (torch.ones(_elements(case, dtype), device=device, dtype=dtype) for _ in range(2))
    return lambda: torch.add(a, b)


def _gelu(case: Case, device: torch.device, dtype: torch.dtype) -> Call:
    a = torch.ones(_elements(case, dtype), device=device, dtype=dtype)
    return lambda: F.gelu(a)


def _rows(case: Case, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    rows = max(_elements(case, dtype) // LAYER_NORM_WIDTH, 1)
    return torch.ones(rows, LAYER_NORM_WIDTH, device=device, dtype=dtype)


def _layer_norm(case: Case, device: torch.device, dtype: torch.dtype) -> Call:
    x = _rows(case, device, dtype)
    weight, bias = (torch.ones(LAYER_NORM_WIDTH, device=device, dtype=dtype) for _ in range(2))
    return lambda: F.layer_norm(x, (LAYER_NORM_WIDTH,), weight, bias)


def _softmax(case: Case, device: torch.device, dtype: torch.dtype) -> Call:
    x = _rows(case, device, dtype)
    return lambda: torch.softmax(x, dim=-1)


POOL_CHANNELS = 64


def _pool(case: Case, device: torch.device, dtype: torch.dtype) -> Call:
    """A CNN stem's max pooling (ResNet's 3x3, stride 2, padding 1) with the indices backward needs, as a
    training step calls it: a window op the CPU does not vectorise well (issue #20: 0.02-0.03x its
    bandwidth-bound prediction in torchvision's ResNet-18)."""
    side = max(4, math.isqrt(max(_elements(case, dtype) // POOL_CHANNELS, 1)))
    x = torch.ones(1, POOL_CHANNELS, side, side, device=device, dtype=dtype)
    return lambda: torch.ops.aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])


def _random(case: Case, device: torch.device, dtype: torch.dtype) -> Call:
    """Dropout's mask: Bernoulli samples into an existing tensor (RNG-bound on a CPU)."""
    a = torch.empty(_elements(case, dtype), device=device, dtype=dtype)
    return lambda: a.bernoulli_(0.9)


def _fresh_pages(case: Case, device: torch.device, dtype: torch.dtype) -> Call:
    """A new tensor written once: above glibc's mmap threshold (at most 32 MiB) every call gets fresh
    pages from the kernel, and writing them faults each one in; the sizes are all above it."""
    elements = _elements(case, dtype)
    return lambda: torch.empty(elements, device=device, dtype=dtype).fill_(1.0)


def _gemm(case: Case, device: torch.device, dtype: torch.dtype) -> Call:
    m, n, k = case.size
    a = torch.ones(m, k, device=device, dtype=dtype)
    b = torch.ones(k, n, device=device, dtype=dtype)
    return lambda: torch.mm(a, b)


def _conv_tensors(case: Case, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    batch, cin, cout, hw, kernel, stride, groups = case.size
    x = torch.ones(batch, cin, hw, hw, device=device, dtype=dtype)
    w = torch.ones(cout, cin // groups, kernel, kernel, device=device, dtype=dtype)
    return x, w


def _conv(case: Case, device: torch.device, dtype: torch.dtype) -> Call:
    x, w = _conv_tensors(case, device, dtype)
    _, _, _, _, kernel, stride, groups = case.size
    return lambda: F.conv2d(x, w, stride=stride, padding=kernel // 2, groups=groups)


def _conv_backward(case: Case, device: torch.device, dtype: torch.dtype) -> Call:
    x, w = _conv_tensors(case, device, dtype)
    _, _, _, _, kernel, stride, groups = case.size
    padding = kernel // 2
    grad = torch.ones_like(F.conv2d(x.to("meta"), w.to("meta"), stride=stride, padding=padding, groups=groups),
                           device=device)
    return lambda: torch.ops.aten.convolution_backward(
        grad, x, w, None, [stride, stride], [padding, padding], [1, 1], False, [0, 0], groups, [True, True, False]
    )


_BUILDERS: dict[str, Callable[[Case, torch.device, torch.dtype], Call]] = {
    "launch": _launch,
    "copy": _copy,
    "scale": _scale,
    "triad": _triad,
    "reduction": _reduction,
    "add": _add,
    "gelu": _gelu,
    "layer_norm": _layer_norm,
    "softmax": _softmax,
    "pool": _pool,
    "random": _random,
    "fresh_pages": _fresh_pages,
    "gemm": _gemm,
    "conv": _conv,
    "conv_backward": _conv_backward,
    "conv_dw": _conv,
    "conv_dw_backward": _conv_backward,
}
assert set(_BUILDERS) == set(OPS)


# ---- costs ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseCost:
    """What one call of a case does by the cost registry: FLOPs (2 per multiply-add) and bytes."""

    flops: float
    bytes: int
    ops: int
    """aten ops one call dispatches."""

    @property
    def intensity(self) -> float:
        """FLOPs per byte."""
        return self.flops / self.bytes if self.bytes else float("inf")


class _CostCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.flops = 0.0
        self.bytes = 0
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        cost = op_cost(func, args, kwargs or {}, out)
        self.flops += cost.flops
        self.bytes += cost.bytes_read + cost.bytes_written
        self.ops += 1
        return out


def case_cost(case: Case) -> CaseCost:
    """FLOPs and bytes of one call, from the cost registry, on meta tensors (no memory, no time)."""
    call = case.build("meta")
    with _CostCounter() as counter:
        call()
    return CaseCost(counter.flops, counter.bytes, counter.ops)
