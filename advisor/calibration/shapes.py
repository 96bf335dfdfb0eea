"""The model's own convolutions and batch norms timed on this CPU, at their exact shapes (issue #20).

A CPU runs convolutions through oneDNN, whose kernel, blocking and reorders depend on the kernel size,
stride, groups and the tensors' sizes in ways no curve over FLOPs follows: on a 2-core EPYC VM
(2026-11-27) the backward of a depthwise 3x3 convolution ran at 36 GFLOP/s for 96 channels at 56x56 and
stride 1, batch 1 to 4, at 8 GFLOP/s at batch 16, and at 1.7 GFLOP/s with stride 2; a 5x5 one at 6-10
GFLOP/s whatever its size. The calibration's conv series fit 4-7 shapes each; MobileNetV3's depthwise
backward ran 5-7x slower than they predicted. So a local CPU estimate times each distinct convolution of
the traced step on real tensors of its shapes (a warm-up call, then the best of a few; in a child process
whose heap keeps what it frees, SETTLED_HEAP), depthwise ones first, within MEASURE_BUDGET_S, and keeps
the times beside the calibration (its timestamp and torch's
version key them): the next estimate of the same shapes measures nothing. Shapes left out (over the
budget, or too large for the free memory) keep the calibrated curves. Seconds.

Batch norm in training (forward and backward) is timed the same way: a CPU runs it channel by channel, its
passes after the first finding the channel's planes in the core's cache when they fit, and its forward's
statistics loop below the bandwidth whatever the size. On the same VM (2026-11-28, torch 2.14.1) the
forward ran at 9-11 GB/s counting its three passes over 0.8-26 MB inputs, where an add ran at 27-146 GB/s;
the backward at 28-92 GB/s counting five passes. Against the layer-norm curve that timed them before,
ResNet-18's backward batch norms ran 2.5x faster than predicted, MobileNetV3-small's forward ones 2.5x
slower.

Each call's operands are read out of the caches (copies taken in turn past COLD_OVER_CACHE x the last-level
cache, as the calibration keeps its cases cold): in a step each one's input was written long before.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from advisor.atomic import write_atomically
from advisor.calibration.cache import cache_dir
from advisor.probe.cpu import available_memory_bytes, probe_cpu
from advisor.profile.costs import ConvGeometry, NormGeometry

MEASURE_BUDGET_S = 6.0
"""Wall time one estimate may spend timing convolutions and batch norms it has not timed before."""
MAX_CALL_S = 0.5
"""A shape whose calls the calibrated curve puts above this is left to the curve."""
TIMED_CALLS = 3
MAX_MEMORY_SHARE = 0.125
"""A shape whose tensors need more than this share of the available memory is left to the curve."""
FORMAT = "gpu-advisor-shapes/2"
"""/2: operands cold and batch norms (2026-11-28); times stored before are measured again."""
BATCH_NORM_OPS = ("native_batch_norm", "_native_batch_norm_legit", "native_batch_norm_backward")
"""Batch norms timed at their shapes: forward (both names of its kernel) and backward, in training."""
COLD_OVER_CACHE = 2.0
"""A call's operands rotate through copies filling this many times the last-level cache."""
MAX_COPIES = 64
"""At most this many copies of a call's operands: a call small enough to need more stays in the caches in
a step too."""

ShapeKey = tuple[Any, ...]


def shape_key(op: str, dtypes: tuple[str, ...], geometry: ConvGeometry) -> ShapeKey | None:
    """What a convolution's time depends on (`dtypes`: its record's, the first being its tensors'); None for a
    call whose sizes or dtype the trace did not keep."""
    if not geometry.input_shape or not geometry.padding or not dtypes:
        return None
    return (op, dtypes[0], geometry.input_shape, geometry.weight_shape, geometry.stride, geometry.padding,
            geometry.dilation, geometry.transposed, geometry.output_padding or (0,) * len(geometry.stride),
            geometry.groups, geometry.computes, geometry.channels_last)


def norm_shape_key(op: str, dtypes: tuple[str, ...], geometry: NormGeometry) -> ShapeKey | None:
    """What a batch norm's time depends on on a CPU: forward or backward, dtype, the input's sizes and
    layout. None for a call that normalises by running statistics, or whose sizes or dtypes (one for all
    its tensors) the trace did not keep."""
    if op not in BATCH_NORM_OPS or geometry.training is not True or len(geometry.shape) < 2 or len(dtypes) != 1:
        return None
    return (op, dtypes[0], geometry.shape, geometry.channels_last)


def call_key(op: str, dtypes: tuple[str, ...], conv: ConvGeometry | None, norm: NormGeometry | None) -> ShapeKey | None:
    """The shape key of a traced call (a record's op, dtypes, conv and norm): a convolution's or a batch
    norm's, None for any other op or where the trace did not keep what the time depends on."""
    if conv is not None:
        return shape_key(op, dtypes, conv)
    if norm is not None:
        return norm_shape_key(op, dtypes, norm)
    return None


def is_norm(key: ShapeKey) -> bool:
    return key[0] in BATCH_NORM_OPS


def is_depthwise(key: ShapeKey) -> bool:
    if is_norm(key):
        return False
    groups, weight = key[9], key[3]
    return groups > 1 and weight[1] == 1


@dataclass(frozen=True)
class MeasuredShapes:
    """Seconds of one call of each shape measured; what this estimate measured anew and how long it took."""

    seconds: dict[ShapeKey, float]
    measured_now: int
    measuring_s: float
    left_out: int


def _torch_dtype(name: str) -> torch.dtype:
    found = getattr(torch, name, None)
    assert isinstance(found, torch.dtype), f"not a torch dtype: {name}"
    return found


def _call(key: ShapeKey, cold_bytes: float = 0.0) -> Callable[[], object]:
    """The call of `key` on real CPU tensors (ones: its time does not depend on values), its operands taken in
    turn from copies filling `cold_bytes` (at most MAX_COPIES): out of the caches, as in a training step,
    where each was written long before."""
    build = _norm_call if is_norm(key) else _convolution_call
    copies = max(1, min(MAX_COPIES, math.ceil(cold_bytes / max(operand_bytes(key), 1))))
    calls = [build(key) for _ in range(copies)]
    if copies == 1:
        return calls[0]
    turn = itertools.cycle(calls)
    return lambda: next(turn)()


def _convolution_call(key: ShapeKey) -> Callable[[], object]:
    op, dtype, x_shape, w_shape, stride, padding, dilation, transposed, output_padding, groups, computes, last = key
    kind = _torch_dtype(dtype)
    memory_format = torch.channels_last if last and len(x_shape) == 4 else torch.contiguous_format
    x = torch.ones(x_shape, dtype=kind).contiguous(memory_format=memory_format)
    w = torch.ones(w_shape, dtype=kind).contiguous(memory_format=memory_format)
    args = (list(stride), list(padding), list(dilation), transposed, list(output_padding), groups)
    if op != "convolution_backward":
        return lambda: torch.ops.aten.convolution(x, w, None, *args)
    grad = torch.ones(_output_shape(key), dtype=kind).contiguous(memory_format=memory_format)
    mask = ["grad_input" in computes, "grad_weight" in computes, False]
    return lambda: torch.ops.aten.convolution_backward(grad, x, w, None, *args, mask)


def _output_shape(key: ShapeKey) -> tuple[int, ...]:
    _, _, x_shape, w_shape, stride, padding, dilation, transposed, output_padding, groups, _, _ = key
    out = torch.ops.aten.convolution(torch.empty(x_shape, device="meta"), torch.empty(w_shape, device="meta"), None,
                                     list(stride), list(padding), list(dilation), transposed, list(output_padding),
                                     groups)
    return tuple(out.shape)


def _norm_call(key: ShapeKey) -> Callable[[], object]:
    op, dtype, shape, last = key
    kind = _torch_dtype(dtype)
    memory_format = torch.channels_last if last and len(shape) == 4 else torch.contiguous_format
    x = torch.ones(shape, dtype=kind).contiguous(memory_format=memory_format)
    weight, bias, mean, var = (torch.ones(shape[1], dtype=kind) for _ in range(4))
    if op != "native_batch_norm_backward":
        return lambda: torch.ops.aten.native_batch_norm(x, weight, bias, mean, var, True, 0.1, 1e-5)
    _, saved_mean, saved_invstd = torch.ops.aten.native_batch_norm(x, weight, bias, mean, var, True, 0.1, 1e-5)
    grad = torch.ones(shape, dtype=kind).contiguous(memory_format=memory_format)
    return lambda: torch.ops.aten.native_batch_norm_backward(grad, x, weight, mean, var, saved_mean, saved_invstd,
                                                             True, 1e-5, [True, True, True])


def _numel(shape: tuple[int, ...]) -> int:
    return int(torch.Size(shape).numel())


def operand_bytes(key: ShapeKey) -> int:
    """Bytes of the tensors one call reads (its outputs are new): input and weight, and for a backward the
    output's gradient; a batch norm's input, and in backward its gradient."""
    element = _torch_dtype(key[1]).itemsize
    backward = key[0].endswith("_backward")
    if is_norm(key):
        return element * _numel(key[2]) * (2 if backward else 1)
    return element * (_numel(key[2]) + _numel(key[3]) + (_numel(_output_shape(key)) if backward else 0))


def tensor_bytes(key: ShapeKey) -> int:
    """Bytes of the call's operands and outputs (at most: input, weight, output and their gradients; a batch
    norm's input, output and their gradients, without its cold copies)."""
    element = _torch_dtype(key[1]).itemsize
    if is_norm(key):
        return 4 * element * _numel(key[2])
    x, w = key[2], key[3]
    return 3 * element * (_numel(x) + _numel(w)) + 2 * element * _numel(x)


def time_call(call: Callable[[], object], calls: int = TIMED_CALLS) -> float:
    """Best of `calls` timed calls after one untimed (allocation, kernel selection), seconds."""
    with torch.no_grad():
        call()
        best = float("inf")
        for _ in range(calls):
            started = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - started)
    return best


SETTLED_HEAP = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}
"""glibc's settings (mallopt(3)) for a heap that keeps what it frees: no block mapped afresh, no top given back.
A call's time without the page faults of its outputs and oneDNN's reorder buffers, which a fresh process
pays on every call above the mmap threshold (a 1x1 convolution from 16 to 96 channels on 16x112x112 faulted
147 MiB per call and took 55-75 ms; in a training step, 11-15 ms): the step model adds the faults of large
outputs itself (step.py's first touch)."""


def time_in_settled_heap(keys: list[ShapeKey], budget_s: float) -> dict[ShapeKey, float]:
    """Seconds per call of each key, timed in order in a child process with SETTLED_HEAP and this process's
    torch threads, until `budget_s` has passed (the rest are left out)."""
    cache = probe_cpu().last_level_cache_bytes
    request = json.dumps({"threads": torch.get_num_threads(), "budget_s": budget_s,
                          "cold_bytes": COLD_OVER_CACHE * cache if cache else 0.0, "keys": [list(k) for k in keys]})
    done = subprocess.run([sys.executable, "-m", "advisor.calibration.shapes"], input=request, text=True,
                          capture_output=True, env={**os.environ, **SETTLED_HEAP}, timeout=budget_s + 120)
    if done.returncode != 0:
        raise RuntimeError(f"timing the model's shapes failed: {done.stderr.strip()[-2000:]}")
    return {_key_of(entry[0]): float(entry[1]) for entry in json.loads(done.stdout)}


def _child() -> None:
    """The child of time_in_settled_heap: keys on stdin, [key, seconds] pairs on stdout."""
    request = json.loads(sys.stdin.read())
    torch.set_num_threads(int(request["threads"]))
    started = time.perf_counter()
    timed = []
    for key in request["keys"]:
        if time.perf_counter() - started > request["budget_s"]:
            break
        timed.append([key, time_call(_call(_key_of(key), float(request.get("cold_bytes", 0.0))))])
    print(json.dumps(timed))


def store_path() -> Path:
    return cache_dir() / "calibration" / "cpu-shapes.json"


def _stamp(profile_created: str) -> dict[str, str]:
    return {"format": FORMAT, "profile": profile_created, "torch": torch.__version__}


def load_stored(profile_created: str, path: Path | None = None) -> dict[ShapeKey, float]:
    """Times stored for this calibration and torch version; none when the file is missing, unreadable or
    another calibration's (it is measured again and replaced)."""
    path = path or store_path()
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(body, dict) or {k: body.get(k) for k in _stamp(profile_created)} != _stamp(profile_created):
        return {}
    entries = body.get("entries")
    if not isinstance(entries, list):
        return {}
    return {_key_of(entry[0]): float(entry[1]) for entry in entries
            if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], (int, float)) and entry[1] > 0}


def _key_of(value: Any) -> ShapeKey:
    """A key back from JSON, its lists made tuples again."""
    return tuple(_key_of(v) if isinstance(v, list) else v for v in value)


def store(profile_created: str, seconds: dict[ShapeKey, float], path: Path | None = None) -> None:
    path = path or store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {**_stamp(profile_created), "entries": [[list(key), value] for key, value in sorted(
        seconds.items(), key=lambda item: repr(item[0]))]}
    write_atomically(path, json.dumps(body))


def measure_shapes(keys: Iterable[tuple[ShapeKey, float]], profile_created: str,
                   progress: Callable[[str], None] = lambda message: None, budget_s: float = MEASURE_BUDGET_S,
                   path: Path | None = None) -> MeasuredShapes:
    """Seconds per call of each (key, predicted seconds per call) given: stored ones as stored, the rest
    timed now, depthwise first, then the longest predicted, while `budget_s` lasts."""
    wanted = dict(keys)
    stored = load_stored(profile_created, path)
    found = {key: stored[key] for key in wanted if key in stored}
    available = available_memory_bytes()
    todo = sorted((key for key in wanted if key not in found),
                  key=lambda key: (not is_depthwise(key), -wanted[key]))
    started = time.perf_counter()
    fitting = [key for key in todo
               if wanted[key] <= MAX_CALL_S and (available is None or tensor_bytes(key) <= MAX_MEMORY_SHARE * available)]
    if fitting and budget_s > 0:
        progress(f"timing {len(fitting)} convolution and batch-norm shapes of the model on this CPU")
        found.update(time_in_settled_heap(fitting, budget_s))
    measured = sum(1 for key in fitting if key in found)
    left_out = len(todo) - measured
    if measured:
        try:
            store(profile_created, {**stored, **found}, path)
        except OSError as exc:
            progress(f"the shapes' times were not stored ({exc.strerror or exc}): the next estimate times them again")
    return MeasuredShapes(found, measured, round(time.perf_counter() - started, 3), left_out)


if __name__ == "__main__":
    _child()
