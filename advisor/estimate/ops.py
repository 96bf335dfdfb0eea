"""How one traced op maps onto a device's calibration: which calibrated series times it, in which
math dtype, and how well its matrix product fills the device's SMs.

The series names are those of the calibration suite (calibration/suite.yaml): compute ops "gemm",
"conv", "conv_backward" (depthwise ones "conv_dw", "conv_dw_backward"); memory ops "copy", "scale",
"triad", "reduction", "add", "gelu", "layer_norm", "softmax", "pool", "random". Every aten op of a
training step is timed by one of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from advisor.profile.choices import precision_of
from advisor.profile.costs import SDPA_KERNELS, ConvGeometry, NormGeometry
from advisor.profile.trace import OpRecord

CONVOLUTIONS = frozenset({"convolution", "_convolution", "cudnn_convolution", "mkldnn_convolution"})
CONVOLUTION_BACKWARD = frozenset({"convolution_backward"})
ALL_CONVOLUTIONS = CONVOLUTIONS | CONVOLUTION_BACKWARD
FUSED_ATTENTION = frozenset(SDPA_KERNELS) | frozenset(f"{name}_backward" for name in SDPA_KERNELS)
"""scaled_dot_product_attention's fused kernels, forward and backward. In fp32 a CUDA device runs them on
CUDA cores whatever the TF32 switches say: flash attention takes 16-bit inputs only, and the memory-efficient
kernels' fp32 variants are SIMT (on an H100, 2026-11-27, benchmarks/results/groundtruth: GPT-2 small's
`fmha_cutlassF_f32_aligned_64x64_rf_sm80` took 5.93 ms under fp32 and 5.99 ms under tf32)."""

NORMS = frozenset({
    "native_layer_norm", "native_layer_norm_backward", "native_group_norm", "native_group_norm_backward",
    "native_batch_norm", "native_batch_norm_backward", "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_training", "_fused_rms_norm", "_fused_rms_norm_backward",
    "cudnn_batch_norm", "cudnn_batch_norm_backward", "batch_norm_backward",
})
SOFTMAXES = frozenset({"_softmax", "_log_softmax", "_safe_softmax", "_softmax_backward_data",
                       "_log_softmax_backward_data"})
REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "norm", "linalg_vector_norm", "var_mean", "var", "std",
                        "max", "min", "argmax", "argmin", "nll_loss_forward", "nll_loss_backward"})
TRANSCENDENTALS = frozenset({
    "gelu", "gelu_backward", "silu", "silu_backward", "tanh", "tanh_backward", "sigmoid", "sigmoid_backward",
    "erf", "exp", "log", "pow", "rsqrt", "sqrt", "sin", "cos", "softplus", "softplus_backward", "mish",
    "mish_backward", "elu", "elu_backward", "hardswish", "hardswish_backward", "log_sigmoid_forward",
    "log_sigmoid_backward", "reciprocal", "div",
})
FILLS = frozenset({"fill_", "zero_", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros",
                   "new_ones", "new_full", "_foreach_zero_", "empty", "arange", "scalar_tensor"})

POOLS = frozenset({"max_pool2d_with_indices", "max_pool3d_with_indices", "max_pool2d", "max_pool3d"})
"""Max pooling: a window op timed by the calibrated `pool` series (a CPU runs it far below its
bandwidth; a GPU at memory speed, where a profile without the series falls back to copy)."""

RANDOM = frozenset({"bernoulli", "bernoulli_", "native_dropout", "rand", "rand_like", "randn", "randn_like",
                    "uniform_", "normal_", "randint", "randperm"})
"""Ops that draw random numbers (dropout's mask): timed by the calibrated `random` series (Philox on
a GPU runs at memory speed; a CPU's generator is far slower per byte)."""

FRESH_OUTPUT_SERIES = frozenset({"add", "gelu", "layer_norm", "softmax"})
"""Series whose calibration cases allocate a new output every call, as the step does: their fitted
rates already include the page faults of large fresh outputs on a CPU (see step.py's first touch)."""

FRESH_PAGES_MIN_BYTES = 32 * 2**20
"""glibc's malloc serves requests above its mmap threshold (dynamic, at most 32 MiB on 64-bit Linux)
with pages fresh from the kernel and unmaps them on free: writing such an output faults every page in,
every step. Smaller blocks are reused from the heap."""

HALF_DTYPES = {"float16": "fp16", "bfloat16": "bf16"}
"""torch dtype names of 16-bit floats -> calibration dtype."""

MATH_DTYPES = {"float8_e4m3fn": "fp8", "float8_e5m2": "fp8", **HALF_DTYPES}
"""torch dtype names of low-precision tensor math -> calibration dtype, narrowest first (an fp8 GEMM also
reads fp32 scales and writes bf16)."""

DTYPE_FALLBACK = {"tf32": "fp32", "bf16": "fp32", "fp16": "fp32", "fp8": "bf16"}
"""A device with no unit (and so no series) for a dtype runs it on the next: cuBLAS computes fp16 and
bf16 products with fp32 accumulation on CUDA cores where there are no tensor cores (Pascal; bf16 on
Volta and Turing), and TF32 is strict fp32 there. fp8 never runs without its units (the planner refuses
such GPUs); a profile without an fp8 series times it as bf16."""

SMALL_GROUP_CHANNELS = 32
"""A grouped convolution whose groups have fewer output channels than this (depthwise ones, and
ResNeXt 32x4d's narrower stages) cannot fill tensor-core tiles (the smallest, GEMM_TILES' 64x32, is
32 wide): it runs on the vector units and its time is the longer of that and its memory traffic."""

GEMM_TILES: tuple[tuple[int, int, float], ...] = (
    (128, 128, 1.00),
    (128, 64, 0.95),
    (64, 64, 0.85),
    (64, 32, 0.75),
)
"""Output tiles (rows, columns) a GPU library may pick for one thread block, with how close to the
largest tile's per-SM rate each runs (smaller tiles reuse less data). An assumption in the spirit of
CUTLASS's tile sizes and NVIDIA's "Matrix Multiplication Background" guide (waves and tile
quantization); calibration curves carry the rest of the size dependence."""

SPLIT_K_MIN_DEPTH = 512
"""Each split of the reduction dimension keeps at least this many elements (split-K)."""

WINOGRAD_MULTIPLY_SAVING = 2.25
"""Winograd's F(2x2, 3x3) computes a 2x2 output tile of a 3x3 convolution with 16 multiplies instead
of 36 (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016). cuDNN's WINOGRAD and
WINOGRAD_NONFUSED algorithms (forward, backward data and backward filter) run 3x3 stride-1
convolutions this way on CUDA cores, and torch.backends.cudnn.benchmark picks them when they are
faster. Its larger tiles (F(4x4, 3x3): 4x fewer multiplies) are taken to pay for the transforms
and the smaller products' lower efficiency: an assumption.

Only where the convolution's math runs on CUDA cores: GPUs without TF32 units (Volta, Turing, Pascal), or
fp32 with TF32 off. Where TF32 units take fp32 convolutions (torch.backends.cudnn.allow_tf32, on by
default, Ampere and newer), the autotuner's choice is a TF32 implicit GEMM: the H100 ground truth
(benchmarks/results/groundtruth/2026-11-27-h100-sxm/kernels.csv, cudnn.benchmark on, cuDNN 9.19) ran no
Winograd kernel in any fp32 or tf32 step of ResNet-50 or MobileNetV2, and on GPUs whose TF32 rate is
their fp32 rate (GeForce and workstation Ampere, Ada, Blackwell) published fp32 steps run at the implicit
GEMM's rate: Lambda's ResNet-50 fp32 rows on ten GA10x GPUs were +8% to +17% too fast with Winograd
(-2% to +10% without), and VGG-16 (all 3x3) on the RTX 3090, 4090 and 5090 +46% to +81%."""

WINOGRAD_MIN_CHANNELS = 48
"""cuDNN chose Winograd for 3x3 convolutions with at least 48 input and output channels and implicit
GEMM below (cuDNN 5 heuristics, measured by the waifu2x developers, nagadomi/waifu2x#122)."""

TENSOR_CORE_DTYPES = frozenset({"tf32", "fp16", "bf16", "fp8"})


@dataclass(frozen=True)
class OpClass:
    """How an op is timed: a compute op (FLOPs against a FLOP/s series, roofline with bandwidth) or a
    memory op (bytes against a bandwidth series), the series and the math dtype."""

    series: str
    dtype: str
    compute: bool
    vector: bool = False
    """A compute op that runs on vector units (no tensor-core tiles): timed at the fp32 peak."""



BATCH_NORMS = frozenset({"native_batch_norm", "native_batch_norm_backward", "_native_batch_norm_legit",
                         "cudnn_batch_norm", "cudnn_batch_norm_backward", "batch_norm_backward"})
"""Batch norm in training passes over its input twice (statistics across the batch, then normalise;
in backward the two reductions, then the input gradient): it moves its input once more than the
op's arguments and results count."""

BATCH_NORM_CHANNEL_PASSES = {"native_batch_norm": 1, "_native_batch_norm_legit": 1, "native_batch_norm_backward": 5}
"""Passes over a channels-first input that PyTorch's CUDA batch norm makes with one thread block per channel
("for the reduction, we cannot use blocks for the batch dim": `dim3 blocks(input.size(1))`, aten/src/ATen/
native/cuda/Normalization.cuh): in training, the forward's statistics (its normalisation is a kernel of its
own over a 2-D grid); the backward's fused kernel, all of it (input and gradient read for the reductions,
read again and the input gradient written). The channels-last kernels split every pass over a 2-D grid."""

BATCH_NORM_BLOCK_THREADS = 512
"""Threads in each of those blocks (MAX_BLOCK_SIZE, Normalization.cuh): how many fit on an SM at once."""

BATCH_NORM_BLOCK_ELEMENTS_PER_S = 2.6e9
"""Input elements one such block gets through per second, whatever the GPU's bandwidth: a block of scalar
loads in a loop waits on memory latency. Measured on an H100 (2026-11-27, benchmarks/results/groundtruth,
kernels.csv): the kernels outside convolutions and matrix products of ResNet-50 and MobileNetV2 steps at
batch 64 took 4.1-10.7 ms longer on channels-first tensors than on channels-last ones, in fp32 and amp-fp16
(cuDNN's batch norm) and amp-bf16 (PyTorch's); charged at this rate per block, the six differences are
predicted at 0.77-1.31 of what they were (fitted on fp32 and amp-bf16, 2.2-3.1e9 each)."""

CUDNN_OPS = ALL_CONVOLUTIONS | BATCH_NORMS
"""Ops a GPU runs through cuDNN, whose per-call planning costs the host more than another op's
(step.CONV_STEP_HOST_RATIO)."""


def math_dtype(record: OpRecord, precision: str, cuda: bool = False) -> str:
    """Calibration dtype of an op's math: fp16/bf16 when it reads such tensors; fp32 ops run as TF32
    under the tf32 precision (torch's allow_tf32 switches). On a CUDA device (`cuda`), also:
    - a matmul-class op of an amp step runs in the autocast dtype whatever the trace recorded: CUDA
      autocast casts every matmul, convolution and attention to it, where CPU autocast (which the
      trace runs) leaves some, such as scaled_dot_product_attention, in fp32;
    - an fp32 convolution runs as TF32 under the fp32 precision too: torch.backends.cudnn.allow_tf32
      (cudnn.conv.fp32_precision "tf32") is on by default; only matmuls' switch is off since torch
      1.12. A device with no TF32 units runs it in fp32 (DTYPE_FALLBACK);
    - fp32 fused attention stays fp32 under tf32 (FUSED_ATTENTION)."""
    for name, dtype in MATH_DTYPES.items():
        if name in record.dtypes:
            return dtype
    meaning = precision_of(precision)
    if cuda and meaning.autocast:
        return meaning.autocast
    if cuda and record.op in FUSED_ATTENTION:
        return "fp32"
    if meaning.tf32 or (cuda and meaning.matmul_dtype == "fp32" and record.op in ALL_CONVOLUTIONS):
        return "tf32"
    return "fp32"


def moved_bytes(record: OpRecord, kind: OpClass) -> int:
    """Bytes the op moves on the device: its arguments and results, half of them for an fp32 matmul
    that CUDA autocast runs in 16 bits, and batch norm's second pass over its input."""
    moved = record.bytes_read + record.bytes_written
    if kind.compute and kind.dtype in ("fp16", "bf16") and not any(n in record.dtypes for n in MATH_DTYPES):
        return moved // 2
    if record.op in BATCH_NORMS:
        return moved + record.bytes_read
    return moved


def storage_dtype(record: OpRecord) -> str:
    """Calibration dtype of a memory op: the widest float it reads (fp32 unless it reads only halves)."""
    if "float32" in record.dtypes or not record.dtypes:
        return "fp32"
    return next((dtype for name, dtype in HALF_DTYPES.items() if name in record.dtypes), "fp32")


def memory_series(op: str) -> str:
    """The calibrated memory op whose bandwidth curve times `op`."""
    if op in NORMS:
        return "layer_norm"
    if op in SOFTMAXES:
        return "softmax"
    if op in REDUCTIONS:
        return "reduction"
    if op in TRANSCENDENTALS:
        return "gelu"
    if op in FILLS:
        return "scale"
    if op in RANDOM:
        return "random"
    if op in POOLS:
        return "pool"
    if op.startswith("_foreach_") or op.startswith("_fused_") or op == "adamw8bit_step_":
        return "triad"
    if op in ("add", "add_", "mul", "mul_", "sub", "sub_", "addcmul_", "addcdiv_", "lerp_", "where",
              "threshold_backward", "relu", "relu_", "hardtanh", "hardtanh_", "hardtanh_backward", "masked_fill", "masked_fill_"):
        return "add"
    return "copy"


DEPTHWISE_SERIES = {"conv": "conv_dw", "conv_backward": "conv_dw_backward"}
"""The calibrated series of a small-group (depthwise) convolution and its backward."""


def is_small_group_conv(record: OpRecord) -> bool:
    """A convolution with too few channels per group for tensor-core tiles (see SMALL_GROUP_CHANNELS)."""
    if record.gemm is None or record.op not in ALL_CONVOLUTIONS:
        return False
    groups, _, n, _ = record.gemm
    return groups > 1 and n < SMALL_GROUP_CHANNELS


def classify(record: OpRecord, precision: str, cuda: bool = False) -> OpClass:
    """Series and dtype that time `record` under `precision` on a CPU, or on a CUDA device (`cuda`,
    see math_dtype)."""
    if record.matmul and record.flops > 0:
        if record.op in CONVOLUTIONS:
            series = "conv"
        elif record.op in CONVOLUTION_BACKWARD:
            series = "conv_backward"
        else:
            series = "gemm"
        if is_small_group_conv(record):
            return OpClass(DEPTHWISE_SERIES[series], "fp32", compute=True, vector=True)
        return OpClass(series, math_dtype(record, precision, cuda), compute=True)
    return OpClass(memory_series(record.op), storage_dtype(record), compute=False)


MISALIGNED_GEMM_FP32_MULTIPLE = 1.9
"""A tensor-core matrix product with a dimension that is not a multiple of 16 bytes' worth of elements
runs cuBLAS's and CUTLASS's `align1` kernels, which load one element at a time: on an H100 (2026-11-27,
benchmarks/results/groundtruth, kernels.csv) GPT-2's 50,257-wide LM head ran 85-148 TFLOP/s in tf32, bf16
and fp16 alike (1.3-2.2x the fp32 CUDA-core peak, median 1.95x) where aligned products of the same step
reached 600+: such a product runs at most this multiple of the fp32 peak. nanoGPT pads its vocabulary to
50,304 for this reason."""


FUSED_ATTENTION_FP32_EFFICIENCY = 0.38
"""Share of the fp32 CUDA-core peak that scaled_dot_product_attention's fp32 kernels reach: PyTorch's
memory-efficient CUTLASS kernels, SIMT in fp32 on every architecture (FUSED_ATTENTION). Measured on an
H100 (2026-11-27, benchmarks/results/groundtruth, kernels.csv; FLOPs as costs.attention_flops counts
them): `fmha_cutlassF_f32` forward 0.33 (BERT-base, 384 tokens) and 0.39 (GPT-2 small, 1,024 causal),
`fmha_cutlassB_f32` backward 0.38 and 0.42, where a GEMM of the same FLOPs reaches 0.6-0.75."""

MEMORY_EFFICIENT_OVER_FLASH = 0.45
"""The memory-efficient kernels' rate against FlashAttention-2's on the same GPU, forward and backward alike
(16-bit, long sequences): 0.42-0.44 forward and 0.42 backward at head dimension 128 in NVIDIA's TileGym
benchmark on a GeForce Blackwell GPU (NVIDIA/TileGym pull request #49: SDPA-MemEff 35.3 and 36.4 TFLOP/s where
SDPA-Flash ran 79.9 and 84.4); "almost 2x slower" forward on an A40 (facebookresearch/xformers issue #1074,
head dimension 128, 512-65,536 tokens); 0.6-0.8 forward and 0.45-0.5 backward at head dimension 64
(Dao-AILab/flash-attention issue #416, xformers against Flash2, 4,096-8,192 tokens, causal)."""

ATTENTION_KERNEL_EFFICIENCY: dict[str, tuple[tuple[int, float], ...]] = {
    "cudnn": ((64, 0.42), (128, 0.62), (256, 0.59)),
    "flash2": ((64, 0.50), (128, 0.70), (256, 0.65)),
}
"""Forward fused attention in 16 bits on tensor cores, long sequences, no causal mask: share of the
dense fp16/bf16 peak by head dimension (interpolated in log2 of the dimension, held beyond the ends).
"cudnn" (PyTorch's choice on Hopper and data-center Blackwell; the H100 ground truth ran
`cudnn_generated_fort_native_sdpa_sm90_flash_*`): the plateaus of cuDNN's bars in FlashAttention-3's
forward benchmark on an H100 SXM5 (Shah et al. 2024, fig. 5: 413, about 605 and 581 TFLOP/s of 989 at
head dimension 64, 128 and 256). "flash2" (FlashAttention-2, PyTorch's flash kernels on Ampere, Ada and
GeForce Blackwell; assumed for Volta and Turing's memory-efficient kernels): "50-73% of the theoretical
maximum FLOPs/s on A100" (Dao 2023, abstract), the low end at head dimension 64. "efficient" (PyTorch's
memory-efficient CUTLASS kernels, xFormers' `cutlassF`/`cutlassB`, what runs a masked attention where
cuDNN's is not preferred): MEMORY_EFFICIENT_OVER_FLASH of "flash2"."""
ATTENTION_KERNEL_EFFICIENCY["efficient"] = tuple(
    (head_dim, rate * MEMORY_EFFICIENT_OVER_FLASH) for head_dim, rate in ATTENTION_KERNEL_EFFICIENCY["flash2"])


ATTENTION_HALF_KEYS = 120
"""Keys per query at which a fused attention kernel reaches half of its long-sequence rate: the
query tile's fixed work (loading Q, writing O, the softmax's final rescale) against the key blocks it
loops over. FlashAttention-3's fig. 5, cuDNN at 512 tokens: 335 of 413 TFLOP/s at head dimension 64
(0.81: 120 keys), 497 of about 605 at 128 (0.82: 112)."""

ATTENTION_CAUSAL_RATE = 0.9
"""A causal mask's cost on the keys it keeps (the diagonal blocks' masking): the same figure's causal
bars, cuDNN at head dimension 64, are within 13% of 0.9 x the unmasked rate at half the keys."""

ATTENTION_BACKWARD_RATE = 0.75
"""The backward kernels' rate against the forward's (five products with dS = P (dP - D) between them,
atomic dQ updates): GPT-2 small's cuDNN backward ran 208 TFLOP/s where its forward ran 275 on the H100
ground truth (0.76); FlashAttention-2's paper reports the backward below the forward too."""

ATTENTION_KERNELS_BY_ARCHITECTURE = {"hopper": "cudnn", "blackwell": "cudnn"}
"""Which kernel family runs 16-bit fused attention on a GPU whose compute capability is unknown (a
database entry without one); elsewhere "flash2", or "efficient" with a mask."""

CUDNN_ATTENTION_MAJORS = ("9", "10")
"""Compute capabilities (major) where PyTorch prefers cuDNN's attention to flash attention: sm90 and sm100
(pytorch/pytorch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, check_prefer_cudnn_attention, with
cuDNN 9.15 or newer; the H100 ground truth ran cuDNN's kernels). Not GeForce and workstation Blackwell
(12.x), which run flash attention."""

FLASH_ATTENTION_MIN_CAPABILITY = 8.0
"""Flash attention runs on sm80 and newer (sdp_utils.cpp, check_flash_attention_hardware_support); older
GPUs run the memory-efficient kernels whatever the mask ("flash2"'s rate is assumed for them)."""


def attention_kernels(compute_capability: str | None, architecture: str | None, masked: bool) -> str:
    """The kernel family of ATTENTION_KERNEL_EFFICIENCY that runs a 16-bit fused attention, as PyTorch's
    select_sdp_backend picks it: cuDNN's where it is preferred (CUDNN_ATTENTION_MAJORS; it takes a mask);
    elsewhere flash attention, or with an explicit mask, which flash attention does not take, the
    memory-efficient kernels (before cuDNN in the default order). Volta and Turing run the memory-efficient
    kernels either way, at "flash2"'s assumed rate."""
    if compute_capability is None:
        return ATTENTION_KERNELS_BY_ARCHITECTURE.get(architecture or "", "efficient" if masked else "flash2")
    if compute_capability.split(".")[0] in CUDNN_ATTENTION_MAJORS:
        return "cudnn"
    if float(compute_capability) < FLASH_ATTENTION_MIN_CAPABILITY:
        return "flash2"
    return "efficient" if masked else "flash2"


def fused_attention_efficiency(record: OpRecord, dtype: str, compute_capability: str | None,
                               architecture: str | None = None) -> float:
    """Share of the `dtype` peak a GPU's fused attention call (FUSED_ATTENTION) reaches: fp32 runs
    SIMT kernels (FUSED_ATTENTION_FP32_EFFICIENCY); 16-bit tensor-core kernels reach their family's rate
    (attention_kernels) at the head dimension, less for short key ranges (ATTENTION_HALF_KEYS), causal
    masks and the backward.

    # BERT-base forward, 12 heads x 16, 384 keys, head dim 64, no mask, on an H100 (cudnn):
    # 0.42 x 384 / (384 + 120) = 0.32
    """
    assert record.gemm is not None and record.op in FUSED_ATTENTION, record
    if dtype not in ("bf16", "fp16"):
        return FUSED_ATTENTION_FP32_EFFICIENCY
    _, _, keys, head_dim = record.gemm
    table = ATTENTION_KERNEL_EFFICIENCY[attention_kernels(compute_capability, architecture, record.masked)]
    rate = _interpolate_log2(table, head_dim)
    kept = _kept_keys(record)
    if kept < 0.75:
        rate *= ATTENTION_CAUSAL_RATE
    keys_per_query = keys * kept
    rate *= keys_per_query / (keys_per_query + ATTENTION_HALF_KEYS)
    return rate * (ATTENTION_BACKWARD_RATE if record.op.endswith("_backward") else 1.0)


def _kept_keys(record: OpRecord) -> float:
    """Share of a fused attention call's query-key scores it computes: about half under a causal mask
    (costs.attention_flops), else all."""
    assert record.gemm is not None, record
    heads, queries, keys, head_dim = record.gemm
    full = 4.0 * heads * queries * keys * head_dim * (2.5 if record.op.endswith("_backward") else 1.0)
    return min(1.0, record.flops / full) if full else 1.0


ATTENTION_DROPOUT_INT_OPS_PER_SCORE = 28
"""Integer instructions a fused attention kernel spends per query-key score to draw and apply a dropout
mask inside it (forward and backward alike: the backward draws the same mask again): a Philox-4x32-10
draw (ten rounds of two 32x32-bit multiplies and XORs for four 32-bit numbers, about 20 instructions a
number) plus the compare and the scaling. Measured on the H100 (2026-11-27, benchmarks/results/
groundtruth, kernels.csv): BERT-base's attention with dropout 0.1 took 42-56 us a layer longer (28.3 M
scores) than the same kernels predict without it, in the fp32 memory-efficient kernels and in cuDNN's
bf16 ones alike, about 0.6 x 10^12 scores/s; 132 SMs x 64 INT32 lanes x 1.98 GHz = 16.7 x 10^12
instructions/s makes that 28 a score."""

INT32_LANES_PER_SM = 64
"""INT32 instructions an SM issues per clock, Volta to Hopper (the CUDA C++ Programming Guide's
arithmetic-instruction throughput table: 64 for 32-bit integer add and multiply-add on compute capability
7.x-9.0)."""


def attention_dropout_seconds(record: OpRecord, sm_count: int | None, clock_hz: float | None,
                              fp32_peak: float) -> float:
    """Seconds a fused attention call spends drawing its dropout mask (0 without one): its scores x
    ATTENTION_DROPOUT_INT_OPS_PER_SCORE at the GPU's INT32 rate (SMs x INT32_LANES_PER_SM x clock; without
    an SM count or clock, a quarter of the fp32 FLOP/s, which is that rate on an H100).

    # BERT-base at batch 16, 192 heads x 384 x 384 = 28,311,552 scores, on an H100:
    # 28,311,552 x 28 / (132 x 64 x 1.98e9) = 47.4 us
    """
    if not record.dropout or record.gemm is None:
        return 0.0
    heads, queries, keys, _ = record.gemm
    scores = heads * queries * keys * _kept_keys(record)
    rate = sm_count * INT32_LANES_PER_SM * clock_hz if sm_count and clock_hz else fp32_peak / 4
    return scores * ATTENTION_DROPOUT_INT_OPS_PER_SCORE / rate


def _interpolate_log2(table: tuple[tuple[int, float], ...], x: float) -> float:
    """The table's value at x, linear in log2(x) between its points and held beyond its ends."""
    if x <= table[0][0]:
        return table[0][1]
    for (x0, y0), (x1, y1) in zip(table, table[1:]):
        if x <= x1:
            t = (math.log2(x) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
            return y0 + t * (y1 - y0)
    return table[-1][1]


TF32_TRANSPOSED_OPERAND_EFFICIENCY = 0.8
"""Rate of a TF32 tensor-core matrix product relative to its K-major ("TN") form, per operand that is not
K-major. The instructions that feed tensor cores transpose 16-bit elements only: Ampere's `ldmatrix.trans`
takes .b16, and Hopper's `wgmma` reads tf32 (and fp8) operands from shared memory K-major only (PTX ISA,
"Warpgroup level matrix multiply"); a transposed 32-bit operand is loaded element by element or
transposed on the way. Measured on an H100 (2026-11-27, benchmarks/results/groundtruth, kernels.csv): GPT-2
small's layers ran their forward products (TN) at the rate predicted, the input gradients (one operand
transposed, cuBLAS "NN") 1.2x and the weight gradients (both, "NT") 1.7x slower than predicted, while in
bf16 the same three ran at one rate. fp32 on CUDA cores shows no such penalty (backward 1.9x the
forward's time for 2x the FLOPs)."""


def misaligned_gemm(gemm: tuple[int, int, int, int], itemsize: int) -> bool:
    """Whether a (batch, m, n, k) product of `itemsize`-byte elements has a dimension that 16-byte
    vector loads cannot tile (see MISALIGNED_GEMM_FP32_MULTIPLE).

    # bf16 (2 bytes: multiples of 8): m=8192, n=50257, k=768 -> 50257 % 8 = 1 -> misaligned
    """
    elements = max(1, 16 // itemsize)
    return any(size % elements for size in gemm[1:])


def wave_efficiency(gemm: tuple[int, int, int, int], sm_count: int) -> float:
    """Fraction of a GPU's SM time a (batch, m, n, k) matrix product uses, at the best tile choice:
    its tiles run in waves of `sm_count`, the last wave partly idle, and tiles at the matrix edges
    partly empty. A product with fewer tiles than SMs splits its reduction (split-K) when deep enough.

    # m=n=4096 on 108 SMs, 128x128 tiles: 32*32 = 1024 tiles = 9.48 waves -> 1024 / (10*108) = 0.948
    """
    batch, m, n, k = gemm
    assert sm_count > 0 and min(batch, m, n, k) > 0, (gemm, sm_count)
    best = 0.0
    for rows, columns, rate in GEMM_TILES:
        tiles = batch * math.ceil(m / rows) * math.ceil(n / columns)
        splits = max(1, min(sm_count // tiles, k // SPLIT_K_MIN_DEPTH)) if tiles < sm_count else 1
        waves = math.ceil(tiles * splits / sm_count)
        useful = batch * m * n / (tiles * rows * columns)
        best = max(best, rate * useful * tiles * splits / (waves * sm_count))
    return best


def winograd_eligible(conv: ConvGeometry) -> bool:
    """Whether cuDNN can run this convolution (or its backward) with Winograd: 2-D, 3x3, stride 1,
    no dilation, one group, not transposed, WINOGRAD_MIN_CHANNELS channels in and out."""
    return (conv.kernel == (3, 3) and conv.stride == (1, 1) and conv.dilation == (1, 1) and conv.groups == 1
            and not conv.transposed and min(conv.in_channels, conv.out_channels) >= WINOGRAD_MIN_CHANNELS)


def max_threads_per_sm(compute_capability: str | None) -> int:
    """Resident threads an SM holds (CUDA C++ Programming Guide, "Technical Specifications per Compute
    Capability"): 1,024 on Turing (7.5), 1,536 on GA10x, Ada and GeForce Blackwell (8.6, 8.7, 8.9, 12.x),
    2,048 on the others (and where the capability is unknown)."""
    if compute_capability == "7.5":
        return 1024
    if compute_capability in ("8.6", "8.7", "8.9") or (compute_capability or "").startswith("12."):
        return 1536
    return 2048


def channel_block_seconds(norm: NormGeometry, op: str, sm_count: int, threads_per_sm: int) -> float:
    """Seconds of a batch norm's passes that run one thread block per channel on channels-first tensors
    (BATCH_NORM_CHANNEL_PASSES), at BATCH_NORM_BLOCK_ELEMENTS_PER_S per block and as many blocks at once as
    there are channels and room on the SMs; 0 for channels-last tensors.

    # x [64, 64, 56, 56], forward on 132 SMs of 2,048 threads: 64 channels < 132 x 4 blocks, so 64 blocks;
    # 12,845,056 elements / (64 x 2.6e9 /s) = 77.2 us
    """
    passes = BATCH_NORM_CHANNEL_PASSES.get(op, 0)
    if norm.channels_last or not passes:
        return 0.0
    blocks = min(norm.channels, sm_count * max(1, threads_per_sm // BATCH_NORM_BLOCK_THREADS))
    return passes * norm.elements / (blocks * BATCH_NORM_BLOCK_ELEMENTS_PER_S)


def pointwise_product(conv: ConvGeometry) -> bool:
    """Whether the convolution is a matrix product on channels-first tensors as they lie: a 1x1 kernel
    at stride 1, no padding, one group, not transposed. Per image, y[n] (K x HW) = w (K x C) @ x[n]
    (C x HW), and its gradients are products of the same matrices, so cuDNN runs it as GEMMs on NCHW
    with no transpose. Measured on an H100 (2026-11-27, benchmarks/results/groundtruth, kernels.csv):
    ResNet-50's channels-first steps ran GEMM kernels under its convolutions (27 forward, 43 backward
    calls a step; 0 and 19-22 with channels-last tensors), and their 69 forward transposes a step
    are what its 20 other convolutions need (3 tensors each), not its 53."""
    return (all(k == 1 for k in conv.kernel) and all(s == 1 for s in conv.stride) and not any(conv.padding)
            and conv.groups == 1 and not conv.transposed)


POINTWISE_OPERANDS_NOT_K_MAJOR = {"output": 1, "grad_input": 2, "grad_weight": 0}
"""Of a pointwise_product's GEMMs on channels-first tensors, the operands whose reduction dimension is not
their contiguous one: forward y = w @ x reduces over C, x's strided dimension (HW is contiguous); the input
gradient w^T @ dy reduces over K, the outer dimension of both; the weight gradient dy @ x^T reduces over HW,
contiguous in both."""


def pointwise_tf32_efficiency(conv: ConvGeometry) -> float:
    """Rate of a pointwise_product's TF32 GEMMs relative to K-major ones: TF32_TRANSPOSED_OPERAND_EFFICIENCY per
    operand that is not K-major (POINTWISE_OPERANDS_NOT_K_MAJOR), the passes a call computes weighted alike
    (each is the same FLOPs).

    # backward computing both: (1 / 0.8**2 + 1 / 0.8**0) / 2 = 1.28125 of the K-major time -> 0.7805
    """
    slowdowns = [TF32_TRANSPOSED_OPERAND_EFFICIENCY ** -POINTWISE_OPERANDS_NOT_K_MAJOR[p] for p in conv.computes]
    return len(slowdowns) / sum(slowdowns)


def layout_transposes(conv: ConvGeometry) -> tuple[int, ...]:
    """Elements of each tensor cuDNN transposes (NCHW to NHWC, or back) around a tensor-core
    convolution of channels-first tensors: its tensor-core kernels work on NHWC ("Choose tensor
    layouts in memory to avoid transposing input and output data ... We recommend using the NHWC
    format", NVIDIA's Convolutional Layers User's Guide). Forward: input, weight and output. Backward
    data: grad_output, weight, grad_input. Backward filter: grad_output, input, grad_weight. None for
    a pointwise_product, which runs as GEMMs on the tensors as they lie.

    # x [8, 64, 56, 56], w [64, 64, 3, 3], y [8, 64, 56, 56]: forward moves 1,605,632 + 36,864
    # + 1,605,632 elements through a transpose each (each read once and written once).
    """
    if pointwise_product(conv):
        return ()
    sizes: list[int] = []
    if "output" in conv.computes:
        sizes += [conv.input_elements, conv.weight_elements, conv.output_elements]
    if "grad_input" in conv.computes:
        sizes += [conv.output_elements, conv.weight_elements, conv.input_elements]
    if "grad_weight" in conv.computes:
        sizes += [conv.output_elements, conv.input_elements, conv.weight_elements]
    return tuple(sizes)
