"""Kernels of a training step timed alone on a GPU, where the time model rests on assumptions no GPU has
checked (issue #28): the `probes` part of benchmarks/gpu_groundtruth.py. Each kernel is timed with CUDA
events after a spin kernel (so the host's issuing is not timed), the median of REPEATS calls.

What the L2 does, at tensor sizes from well inside it to well beyond, twice: `hot`, right after another
kernel wrote the input (a training step's producer and consumer), and `cold`, after a read of a buffer
CACHE_FLUSH_OVER_L2 times the L2 evicted it:

- `reuse`: z = y + 1 on fp32 tensors. The time model (advisor/estimate/step.py, cached_reads) reads y from
  L2 when the traffic since y was made fits the L2, at L2_OVER_DRAM times the DRAM bandwidth: hot / cold =
  0.5 + 0.5 / L2_OVER_DRAM = 0.7 where it fits, 1.0 where not. The measured ratio checks both the rate and
  where the cache stops holding the value.
- `bn_forward`, `bn_backward`: a training batch norm on channels-first [N, 64, 56, 56] tensors (fp32 and
  bf16), which runs one thread block per channel (ops.BATCH_NORM_CHANNEL_PASSES); the time model charges
  BATCH_NORM_BLOCK_ELEMENTS_PER_S per block, fitted on an H100's steps where most inputs came from DRAM.
  The per-block rate hot and cold says whether a block's latency-bound loop runs faster on L2-resident
  data, as the RTX 4090's channels-first EfficientNet and ResNet rows suggest (published-throughput-newer,
  NIKOLASENT_2025: 1.5x an RTX 3090 with 1.08x its bandwidth).

And `thin_gemm`: the products of a LoRA adapter (tokens x hidden @ hidden x rank, its transposes in the
backward, rank x out), bf16, cold: bandwidth-bound with a few tiles. The time model charges them the bytes at
the sustained bandwidth, the tile quantization slowing only their math (step._compute_seconds); `predicted`
is its time for the same call on this GPU id (hwdb's, with the family's default calibration).

And `attention`, `attention_backward`: bf16 scaled_dot_product_attention over [2, 16, 4,096, head dim 64 and
128] without a mask, causal, and with a padding mask (`state`: the mask and the backend), as PyTorch picks
the kernels (`default`) and forced to each backend (flash, efficient, cudnn; a backend that cannot run the
call is left out). The time model's rates (ops.ATTENTION_KERNEL_EFFICIENCY, MEMORY_EFFICIENT_OVER_FLASH)
come from published benchmarks; `predicted` is its time for the default rows.

On a CPU (the harness's dry run) the same code runs with host timers and tiny sizes: the plumbing only.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

PROBE_COLUMNS = ("kind", "dtype", "bytes", "elements", "channels", "shape", "state", "seconds", "predicted_s",
                 "repeats")
CACHE_FLUSH_OVER_L2 = 4
"""The cold state's eviction buffer, in L2 sizes (a read of it leaves none of the input in L2)."""
REUSE_MB = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
"""y's sizes (MiB) for `reuse`."""
BN_BATCHES = (2, 4, 8, 16, 32, 64, 128, 256)
"""Batch sizes of the batch norm's [N, 64, 56, 56] input: 0.77 MiB (fp32) per image, 1.5 to 196 MiB."""
BN_SHAPE = (64, 56, 56)
REPEATS = 15
SPIN_CYCLES = 2_000_000
"""A spin kernel before each timed one (about 1 ms at 2 GHz), longer than the host takes to issue it (autograd's
backward included)."""
THIN_GEMMS = ((4096, 32, 4096), (4096, 4096, 32), (32, 4096, 4096), (4096, 32, 14336), (4096, 14336, 32),
              (4096, 16, 4096), (4096, 64, 4096), (8192, 32, 4096))
"""(m, n, k) of the thin products: a rank-32 adapter on 4,096 tokens of a 4,096-wide model (x @ A, (xA) @ B,
the weight gradient's A^T-shaped product), on the 14,336-wide MLP, ranks 16 and 64, 8,192 tokens."""
ATTENTION_SHAPES = ((2, 16, 4096, 128), (2, 16, 4096, 64))
"""(batch, heads, tokens, head dimension) of the attention probes: a 7-8B model's heads at 4,096 tokens."""
ATTENTION_MASKS = ("none", "causal", "padding")
ATTENTION_BACKENDS = ("default", "flash", "efficient", "cudnn")
"""`default`: the kernels PyTorch picks; the others forced with torch.nn.attention.sdpa_kernel."""
DRY_ATTENTION_SHAPES = ((1, 2, 32, 16),)
DRY_THIN_GEMMS = ((64, 4, 64), (64, 64, 4))
DRY_REUSE_BYTES = (4096, 65536)
DRY_BN_BATCHES = (1, 2)
DRY_BN_SHAPE = (4, 8, 8)
DRY_REPEATS = 3


@dataclass(frozen=True)
class Bench:
    """Where the kernels run: a CUDA device (event timers) or, in a dry run, this CPU (host timers)."""

    device: torch.device
    l2_bytes: int
    repeats: int

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def time(self, prepare: Callable[[], Any], kernel: Callable[[], Any]) -> float:
        """Median seconds of `kernel` alone, `prepare` run before each call (not timed)."""
        found = []
        for _ in range(self.repeats + 1):
            prepare()
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(SPIN_CYCLES)  # the GPU busy while the host issues the kernel: no gap timed
                start.record()
                kernel()
                end.record()
                end.synchronize()
                found.append(start.elapsed_time(end) / 1e3)
            else:
                began = time.perf_counter()
                kernel()
                found.append(time.perf_counter() - began)
        return statistics.median(found[1:])  # the first call warms up (cuDNN's plan, the allocator)


def l2_bytes_of(device: torch.device) -> int:
    """The device's L2 size in bytes (a CPU in a dry run: 1 MiB, a stand-in)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).L2_cache_size)
    return 2**20


def measure_probes(device: torch.device, dry: bool, gpu_id: str | None = None) -> list[dict[str, Any]]:
    """Every row of probes.csv (PROBE_COLUMNS) on `device`: reuse at each size, batch norm forward and backward
    at each batch, fp32 and bf16, hot and cold; the thin GEMMs."""
    bench = Bench(device, l2_bytes_of(device), DRY_REPEATS if dry else REPEATS)
    flush = torch.ones(CACHE_FLUSH_OVER_L2 * bench.l2_bytes // 4, device=device)
    rows = []
    for size in DRY_REUSE_BYTES if dry else tuple(mb * 2**20 for mb in REUSE_MB):
        rows += reuse_rows(bench, size, flush)
    for dtype in (torch.float32, torch.bfloat16):
        for batch in DRY_BN_BATCHES if dry else BN_BATCHES:
            rows += batch_norm_rows(bench, (batch, *(DRY_BN_SHAPE if dry else BN_SHAPE)), dtype, flush)
    for shape in DRY_THIN_GEMMS if dry else THIN_GEMMS:
        row = thin_gemm_row(bench, shape, flush)
        rows.append(row | {"predicted_s": predicted_gemm_seconds(row["shape"], gpu_id) if gpu_id else None})
    for shape in DRY_ATTENTION_SHAPES if dry else ATTENTION_SHAPES:
        for mask in ATTENTION_MASKS:
            for backend in ATTENTION_BACKENDS[:1] if dry else ATTENTION_BACKENDS:
                rows += attention_rows(bench, shape, mask, backend, gpu_id)
    return rows


def attention_rows(bench: Bench, shape: tuple[int, int, int, int], mask: str, backend: str,
                   gpu_id: str | None) -> list[dict[str, Any]]:
    """bf16 attention over q, k, v of `shape` (batch, heads, tokens, head dim), forward and backward, with no
    mask, a causal one or a padding mask (a quarter of the keys masked, as --padding-mask traces it), on
    `backend`: none when that backend cannot run the call."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    batch, heads, tokens, head_dim = shape
    dtype = torch.bfloat16 if bench.cuda else torch.float32
    q, k, v = (torch.randn(shape, device=bench.device, dtype=dtype, requires_grad=True) for _ in range(3))
    keep = None
    if mask == "padding":
        keep = torch.ones(batch, 1, 1, tokens, device=bench.device, dtype=torch.bool)
        keep[..., tokens - tokens // 4:] = False
    chosen = {"flash": [SDPBackend.FLASH_ATTENTION], "efficient": [SDPBackend.EFFICIENT_ATTENTION],
              "cudnn": [SDPBackend.CUDNN_ATTENTION]}.get(backend)

    def forward() -> torch.Tensor:
        if chosen is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=mask == "causal")
        with sdpa_kernel(chosen):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=mask == "causal")

    try:
        output = forward()
    except RuntimeError:  # this backend does not run this call (flash with a mask, cuDNN without cuDNN)
        return []
    grad = torch.randn_like(output)
    forward_s = bench.time(lambda: None, forward)
    backward_s = bench.time(lambda: None, lambda: torch.autograd.grad(output, (q, k, v), grad, retain_graph=True))
    common = {"dtype": "bf16" if bench.cuda else "fp32", "bytes": 4 * q.numel() * q.element_size(),  # q, k, v, out
              "elements": batch * heads * tokens * tokens,
              "channels": head_dim, "shape": "x".join(map(str, shape)), "state": f"{mask}/{backend}",
              "repeats": bench.repeats}
    predicted = (predicted_attention_seconds(shape, mask, gpu_id) if gpu_id and backend == "default"
                 else (None, None))
    return [common | {"kind": "attention", "seconds": forward_s, "predicted_s": predicted[0]},
            common | {"kind": "attention_backward", "seconds": backward_s, "predicted_s": predicted[1]}]


def predicted_attention_seconds(shape: tuple[int, int, int, int], mask: str,
                                gpu_id: str) -> tuple[float | None, float | None]:
    """The time model's seconds for the forward and the backward of one bf16 attention of `shape` with `mask`
    on database GPU `gpu_id` (None, None when the GPU is not in the database)."""
    from advisor.estimate.step import kernel_seconds
    from advisor.profile.costs import attention_flops
    from advisor.profile.trace import OpRecord

    device = _database_device(gpu_id)
    if device is None:
        return None, None
    batch, heads, tokens, head_dim = shape
    per_head = (batch * heads, tokens, head_dim)
    flops = attention_flops(per_head, per_head, per_head, mask == "causal")
    records = [OpRecord(phase, "probe", f"_scaled_dot_product_flash_attention{suffix}", flops * scale, 0, 0,
                        ("bfloat16",), True, True, (batch * heads, tokens, tokens, head_dim),
                        masked=mask == "padding")
               for phase, suffix, scale in (("forward", "", 1.0), ("backward", "_backward", 2.5))]
    forward_s, backward_s = kernel_seconds(records, "amp-bf16", device)
    return forward_s, backward_s


def thin_gemm_row(bench: Bench, shape: tuple[int, int, int], flush: torch.Tensor) -> dict[str, Any]:
    """One bf16 product of `shape` (m, n, k), its operands evicted from L2 before each call."""
    m, n, k = shape
    a = torch.randn(m, k, device=bench.device, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=bench.device, dtype=torch.bfloat16)
    out = torch.empty(m, n, device=bench.device, dtype=torch.bfloat16)
    seconds = bench.time(_evict(flush), lambda: torch.mm(a, b, out=out))
    return {"kind": "thin_gemm", "dtype": "bf16", "bytes": 2 * (m * k + k * n + m * n), "elements": m * n,
            "channels": 0, "shape": f"{m}x{n}x{k}", "state": "cold", "seconds": seconds, "repeats": bench.repeats}


@functools.lru_cache(maxsize=None)
def _database_device(gpu_id: str) -> Any:
    """The time model's DeviceModel of database GPU `gpu_id` with its family's default calibration (None when
    the GPU is not in the database): the database loaded once, not per product."""
    from advisor.calibration.reference import load_families
    from advisor.estimate.targets import database_targets
    from advisor.hardware.loader import load_hwdb

    db = load_hwdb([], include_user_layers=False)
    if not db.has(gpu_id):
        return None
    return database_targets(db, [db.gpu(gpu_id)], load_families(db))[0].device


def predicted_gemm_seconds(shape: str, gpu_id: str) -> float | None:
    """The time model's seconds for one bf16 product of `shape` ("MxNxK") on database GPU `gpu_id`, under
    amp-bf16 with its family's default calibration (None when the GPU is not in the database)."""
    from advisor.estimate.step import kernel_seconds
    from advisor.profile.trace import OpRecord

    device = _database_device(gpu_id)
    if device is None:
        return None
    m, n, k = (int(v) for v in shape.split("x"))
    record = OpRecord("forward", "probe", "mm", 2.0 * m * n * k, 2 * (m * k + k * n), 2 * m * n, ("bfloat16",), True,
                      True, (1, m, n, k))
    return kernel_seconds([record], "amp-bf16", device)[0]


def _evict(flush: torch.Tensor) -> Callable[[], Any]:
    return lambda: flush.sum()


def reuse_rows(bench: Bench, size: int, flush: torch.Tensor) -> list[dict[str, Any]]:
    """z = y + 1 with y of `size` bytes (fp32), hot (y just written) and cold (L2 flushed)."""
    y = torch.ones(size // 4, device=bench.device)
    z = torch.empty_like(y)
    x = torch.ones_like(y)
    hot = bench.time(lambda: torch.mul(x, 2, out=y), lambda: torch.add(y, 1, out=z))
    cold = bench.time(_evict(flush), lambda: torch.add(y, 1, out=z))
    common = {"kind": "reuse", "dtype": "fp32", "bytes": size, "elements": y.numel(), "channels": 0, "shape": "",
              "repeats": bench.repeats}
    return [common | {"state": "hot", "seconds": hot}, common | {"state": "cold", "seconds": cold}]


def batch_norm_rows(bench: Bench, shape: tuple[int, ...], dtype: torch.dtype,
                    flush: torch.Tensor) -> list[dict[str, Any]]:
    """A training batch norm's forward and backward on a channels-first input of `shape`, hot (input and
    gradient just written) and cold (L2 flushed). bf16 runs PyTorch's kernels, fp32 cuDNN's (as in a step)."""
    channels = shape[1]
    x = torch.randn(shape, device=bench.device, dtype=dtype)
    grad = torch.randn_like(x)
    weight = torch.ones(channels, device=bench.device)
    bias = torch.zeros(channels, device=bench.device)
    mean, var = torch.zeros(channels, device=bench.device), torch.ones(channels, device=bench.device)
    x.requires_grad_(True)
    rows = []
    name = "fp32" if dtype == torch.float32 else "bf16"
    common = {"dtype": name, "bytes": x.numel() * x.element_size(), "elements": x.numel(), "channels": channels,
              "shape": "x".join(map(str, shape)), "repeats": bench.repeats}

    def rewrite() -> None:  # through .data: the saved input's version stays, its bytes are written anew
        x.data.mul_(1.0)
        grad.mul_(1.0)

    def forward() -> torch.Tensor:
        return F.batch_norm(x, mean, var, weight, bias, training=True, momentum=0.1, eps=1e-5)

    for state, prepare in (("hot", rewrite), ("cold", _evict(flush))):
        rows.append(common | {"kind": "bn_forward", "state": state, "seconds": bench.time(prepare, forward)})
    output = forward()

    def backward() -> None:
        torch.autograd.grad(output, x, grad, retain_graph=True)

    for state, prepare in (("hot", rewrite), ("cold", _evict(flush))):
        rows.append(common | {"kind": "bn_backward", "state": state, "seconds": bench.time(prepare, backward)})
    return rows


def summary(rows: list[dict[str, Any]], l2_bytes: int | None, gpu_id: str | None = None) -> list[str]:
    """The measurements as text: per size, hot / cold and what the time model says of it; per batch norm,
    the per-block element rate hot and cold (the model's: BATCH_NORM_BLOCK_ELEMENTS_PER_S); per thin GEMM,
    its time beside the time model's for `gpu_id`."""
    from advisor.estimate.ops import BATCH_NORM_BLOCK_ELEMENTS_PER_S, BATCH_NORM_CHANNEL_PASSES
    from advisor.estimate.step import L2_OVER_DRAM

    def seconds(kind: str, dtype: str, size: int, state: str) -> float | None:
        found = [float(r["seconds"]) for r in rows if r["kind"] == kind and r["dtype"] == dtype
                 and int(r["bytes"]) == size and r["state"] == state]
        return found[0] if found else None

    lines = [f"L2: {l2_bytes / 2**20:.0f} MiB" if l2_bytes else "L2: unknown",
             "reuse (z = y + 1, fp32): hot / cold; the model's 0.7 where y's making and reading "
             f"(2 x y) fit L2 ({0.5 + 0.5 / L2_OVER_DRAM:.2f}), 1.0 beyond"]
    for size in sorted({int(r["bytes"]) for r in rows if r["kind"] == "reuse"}):
        hot, cold = seconds("reuse", "fp32", size, "hot"), seconds("reuse", "fp32", size, "cold")
        if hot and cold:
            model = 0.5 + 0.5 / L2_OVER_DRAM if l2_bytes and 2 * size <= l2_bytes else 1.0
            lines.append(f"  {size / 2**20:8.2f} MiB  hot {hot * 1e6:9.1f} us  cold {cold * 1e6:9.1f} us  "
                         f"hot/cold {hot / cold:5.2f}  model {model:4.2f}  cold {2 * size / cold / 1e9:7.1f} GB/s")
    lines.append(f"batch norm, channels-first: elements per second per block (model "
                 f"{BATCH_NORM_BLOCK_ELEMENTS_PER_S:.2g}), hot / cold")
    for kind, op in (("bn_forward", "native_batch_norm"), ("bn_backward", "native_batch_norm_backward")):
        passes = BATCH_NORM_CHANNEL_PASSES[op]
        for dtype in ("fp32", "bf16"):
            for size in sorted({int(r["bytes"]) for r in rows if r["kind"] == kind and r["dtype"] == dtype}):
                row = next(r for r in rows if r["kind"] == kind and r["dtype"] == dtype and int(r["bytes"]) == size)
                hot, cold = seconds(kind, dtype, size, "hot"), seconds(kind, dtype, size, "cold")
                if not hot or not cold:
                    continue
                per_block = passes * int(row["elements"]) / int(row["channels"])
                lines.append(f"  {kind:<11} {dtype} {size / 2**20:8.2f} MiB  hot {per_block / hot:9.3g}  "
                             f"cold {per_block / cold:9.3g}  hot/cold {hot / cold:5.2f}")
    thin = [r for r in rows if r["kind"] == "thin_gemm"]
    if thin:
        lines.append(f"thin GEMMs, bf16, operands from DRAM: measured, the time model's for {gpu_id or '?'}")
    for row in thin:  # predicted again: the current time model's
        seconds = float(row["seconds"])
        predicted = predicted_gemm_seconds(row["shape"], gpu_id) if gpu_id else None
        rate = f"{int(row['bytes']) / seconds / 1e9:7.1f} GB/s"
        model = "-" if predicted is None else f"{predicted * 1e6:8.1f} us ({predicted / seconds - 1:+.0%})"
        lines.append(f"  {row['shape']:<16} {seconds * 1e6:8.1f} us  {rate}  model {model}")
    return lines + attention_summary(rows, gpu_id)


def attention_summary(rows: list[dict[str, Any]], gpu_id: str | None) -> list[str]:
    """Per attention probe: TFLOP/s as costs.attention_flops counts the call (a causal mask half the scores),
    and for PyTorch's own pick the time model's seconds beside the measured."""
    from advisor.profile.costs import attention_flops

    found = [r for r in rows if r["kind"] in ("attention", "attention_backward")]
    if not found:
        return []
    lines = [f"attention, TFLOP/s (forward, backward), the time model's for {gpu_id or '?'} beside PyTorch's pick"]
    for row in found:
        batch, heads, tokens, head_dim = (int(v) for v in str(row["shape"]).split("x"))
        per_head = (batch * heads, tokens, head_dim)
        mask, _, backend = str(row["state"]).partition("/")
        flops = attention_flops(per_head, per_head, per_head, mask == "causal")
        flops *= 2.5 if row["kind"] == "attention_backward" else 1.0
        seconds = float(row["seconds"])
        predicted = row.get("predicted_s")
        if gpu_id and backend == "default":
            pair = predicted_attention_seconds((batch, heads, tokens, head_dim), mask, gpu_id)
            predicted = pair[1] if row["kind"] == "attention_backward" else pair[0]
        model = f"  model {float(predicted) * 1e3:8.3f} ms ({float(predicted) / seconds - 1:+.0%})" \
            if predicted not in (None, "") else ""
        lines.append(f"  {row['kind']:<18} {row['shape']:<16} {row['state']:<18} {seconds * 1e3:8.3f} ms  "
                     f"{flops / seconds / 1e12:7.1f}{model}")
    return lines
