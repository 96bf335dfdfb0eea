"""One registry of per-op cost formulas: FLOPs (2 per multiply-add) and bytes moved, keyed by aten op.

In the spirit of `torch/utils/flop_counter.py`: a formula receives the op's arguments and output
(real, fake or meta tensors: only shapes and dtypes are read) and returns FLOPs. Bytes are the
sizes of the tensors the op reads and writes, a roofline's view (no cache reuse). Ops with no
formula that are not pointwise, views or data movement are "uncounted" and reported as coverage.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from advisor.profile.tensors import leaves, stored_parts

aten = torch.ops.aten

FlopFormula = Callable[[tuple, dict, Any], float]
"""(positional args, every argument by its schema name, output) -> FLOPs."""


@dataclass(frozen=True)
class OpCost:
    """Cost of one op call. FLOPs count 2 per multiply-add; bytes are read and written separately."""

    flops: float
    bytes_read: int
    bytes_written: int
    matmul: bool
    """True for matrix-multiply-class ops (mm, bmm, conv, attention): they can run on tensor cores."""
    counted: bool
    """False when the registry has no formula for this op (its FLOPs are unknown, 0 here)."""
    dtypes: tuple[str, ...] = ()
    """dtypes of the tensors it reads, sorted ("float32", "bfloat16")."""
    gemm: tuple[int, int, int, int] | None = None
    """(batch, m, n, k) of the matrix product a matmul-class op amounts to (implicit GEMM for a
    convolution, per head for attention): how its work splits into tiles over a GPU's SMs."""
    conv: ConvGeometry | None = None
    """A convolution's (or its backward's) geometry and memory layout: what decides the algorithm a
    GPU library runs it with."""
    transposed: int = 0
    """Of a matrix product's two operands, how many are not K-major (their reduction dimension is not
    the contiguous one): 0 for a linear layer's forward, 1 for its input gradient, 2 for its weight
    gradient (see transposed_operands)."""
    norm: NormGeometry | None = None
    """A batch norm's (or its backward's) channels and memory layout: how its reductions split over a GPU."""
    masked: bool = False
    """A fused attention call (forward or backward) given an explicit mask (`attn_mask`, a padding mask):
    flash attention takes none, so a GPU runs another kernel family for it (estimate/ops.py)."""


@dataclass(frozen=True)
class NormGeometry:
    """The facts of one batch-norm call that decide how its per-channel reductions spread over a GPU's
    SMs: its channels and whether its input keeps them innermost. Sizes in elements."""

    channels: int
    elements: int
    """Of the input (N x C x spatial)."""
    channels_last: bool
    """The input's channels are its innermost dimension (NHWC), or its layout is the same either way."""
    shape: tuple[int, ...] = ()
    """The input's sizes (N, C, *spatial): what a CPU's batch norm kernels cost at (calibration/shapes.py)."""
    training: bool | None = None
    """Statistics of the batch (True) or the running ones (False); None: not known from the call."""


@dataclass(frozen=True)
class ConvGeometry:
    """The facts of one convolution call that pick its GPU algorithm: Winograd needs a 3x3 kernel at
    stride 1, tensor-core kernels want channels-last tensors. Sizes in elements."""

    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    transposed: bool
    in_channels: int
    out_channels: int
    channels_last: bool
    """The input's channels are its innermost dimension (NHWC), or its layout is the same either way."""
    input_elements: int
    output_elements: int
    weight_elements: int
    computes: tuple[str, ...] = ("output",)
    """What the call produces: "output" (forward); "grad_input" and/or "grad_weight" (backward)."""
    input_shape: tuple[int, ...] = ()
    weight_shape: tuple[int, ...] = ()
    padding: tuple[int, ...] = ()
    output_padding: tuple[int, ...] = ()
    """The call's own sizes, for a device that times the exact call (calibration/shapes.py)."""


@dataclass(frozen=True)
class _Entry:
    formula: FlopFormula
    matmul: bool


REGISTRY: dict[Any, _Entry] = {}
"""aten OpOverloadPacket (or, for ops of libraries that may not be installed, its qualified name such as
"torchvision::roi_align") -> its FLOP formula."""
"""aten OpOverloadPacket -> formula."""

GemmShape = tuple[int, int, int, int]
ShapeFormula = Callable[[tuple, dict, Any], GemmShape]
"""(positional args, every argument by its schema name, output) -> (batch, m, n, k)."""

GEMM_SHAPES: dict[Any, ShapeFormula] = {}
"""aten OpOverloadPacket -> the (batch, m, n, k) matrix product its work amounts to."""


def register_shape(*ops: Any) -> Callable[[ShapeFormula], ShapeFormula]:
    """Decorator: the function gives the GEMM shape of these matmul-class ops."""

    def decorate(formula: ShapeFormula) -> ShapeFormula:
        for op in ops:
            GEMM_SHAPES[op] = formula
        return formula

    return decorate


def register(*ops: Any, matmul: bool = False) -> Callable[[FlopFormula], FlopFormula]:
    """Decorator: the formula gives the FLOPs of these ops (packets, all overloads)."""

    def decorate(formula: FlopFormula) -> FlopFormula:
        for op in ops:
            assert op not in REGISTRY, f"two formulas for {op}"
            REGISTRY[op] = _Entry(formula, matmul)
        return formula

    return decorate


def _ops(*names: str) -> list[Any]:
    """The aten packets of these names that exist in this torch version."""
    return [getattr(aten, name) for name in names if hasattr(aten, name)]


def _numel(shape: Iterable[int]) -> int:
    return math.prod(int(s) for s in shape)


def _first_tensor(value: Any) -> torch.Tensor:
    tensors = [t for t in leaves(value) if isinstance(t, torch.Tensor)]
    assert tensors, "expected a tensor output"
    return tensors[0]


# ----------------------------------------------------------------------------- matrix products


@register(aten.mm, matmul=True)
def mm_flops(args: tuple, named: dict, out: Any) -> float:
    """[m, k] @ [k, n]: 2 * m * n * k."""
    m, k = args[0].shape
    n = args[1].shape[1]
    return 2.0 * m * n * k


@register(aten.addmm, matmul=True)
def addmm_flops(args: tuple, named: dict, out: Any) -> float:
    """bias + [m, k] @ [k, n]: 2 * m * n * k (the bias add is not counted, as in flop_counter)."""
    return mm_flops(args[1:], named, out)


@register(aten.bmm, matmul=True)
def bmm_flops(args: tuple, named: dict, out: Any) -> float:
    """[b, m, k] @ [b, k, n]: 2 * b * m * n * k."""
    b, m, k = args[0].shape
    n = args[1].shape[2]
    return 2.0 * b * m * n * k


@register(aten.baddbmm, matmul=True)
def baddbmm_flops(args: tuple, named: dict, out: Any) -> float:
    return bmm_flops(args[1:], named, out)


@register(*_ops("_scaled_mm"), matmul=True)
def scaled_mm_flops(args: tuple, named: dict, out: Any) -> float:
    """fp8 [m, k] @ [k, n] with per-tensor scales (cuBLASLt's fp8 GEMM; profile/float8.py): 2 * m * n * k,
    the scales applied in its epilogue."""
    return mm_flops(args, named, out)


@register_shape(aten.mm, *_ops("_scaled_mm"))
def mm_shape(args: tuple, named: dict, out: Any) -> GemmShape:
    (m, k), n = args[0].shape, args[1].shape[1]
    return 1, int(m), int(n), int(k)


@register_shape(aten.addmm)
def addmm_shape(args: tuple, named: dict, out: Any) -> GemmShape:
    return mm_shape(args[1:], named, out)


@register_shape(aten.bmm)
def bmm_shape(args: tuple, named: dict, out: Any) -> GemmShape:
    (b, m, k), n = args[0].shape, args[1].shape[2]
    return int(b), int(m), int(n), int(k)


@register_shape(aten.baddbmm)
def baddbmm_shape(args: tuple, named: dict, out: Any) -> GemmShape:
    return bmm_shape(args[1:], named, out)


GEMM_OPERANDS: dict[Any, tuple[int, int]] = {}
"""aten OpOverloadPacket of a matrix product -> the positions of its [.., m, k] and [.., k, n] operands."""
GEMM_OPERANDS.update({aten.mm: (0, 1), aten.addmm: (1, 2), aten.bmm: (0, 1), aten.baddbmm: (1, 2)})
GEMM_OPERANDS.update({op: (0, 1) for op in _ops("_scaled_mm")})


def transposed_operands(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many of a matrix product's operands, a [.., m, k] and b [.., k, n], are not K-major: a with its
    rows not contiguous, b with its columns not contiguous. A linear layer's forward, x @ W.t(), has
    both K-major (cuBLAS's "TN"); its input gradient, dy @ W, has W's n contiguous (1); its weight
    gradient, dy.t() @ x, has neither (2). A dimension of size 1 is contiguous whatever its stride.

    # x [6144, 768] contiguous @ W.t() (W [3072, 768] contiguous): strides (768, 1) and (1, 768) -> 0
    # dy.t() [3072, 6144] strides (1, 3072) @ x [6144, 768] strides (768, 1) -> 2
    """
    def k_major(tensor: torch.Tensor, k_dim: int) -> bool:
        return tensor.shape[k_dim] == 1 or tensor.stride(k_dim) == 1
    return int(not k_major(a, -1)) + int(not k_major(b, -2))


def conv_flops(x_shape, w_shape, out_shape, transposed: bool) -> float:
    """2 * batch * spatial * C_out * (C_in / groups) * kernel, where spatial is the output's
    positions (the input's for a transposed convolution). w is [C_out, C_in/groups, *kernel]
    ([C_in, C_out/groups, *kernel] when transposed)."""
    batch = x_shape[0]
    kernel = _numel(w_shape[2:])
    if transposed:
        spatial = _numel(x_shape[2:])
        c_in, c_out_per_group = w_shape[0], w_shape[1]
        return 2.0 * batch * spatial * c_in * c_out_per_group * kernel
    spatial = _numel(out_shape[2:])
    c_out, c_in_per_group = w_shape[0], w_shape[1]
    return 2.0 * batch * spatial * c_out * c_in_per_group * kernel


@register(*_ops("convolution", "_convolution", "cudnn_convolution", "mkldnn_convolution"), matmul=True)
def convolution_flops(args: tuple, named: dict, out: Any) -> float:
    transposed = bool(named.get("transposed", False))
    return conv_flops(named["input"].shape, named["weight"].shape, _first_tensor(out).shape, transposed)


def conv_shape(x_shape, w_shape, out_shape, transposed: bool, groups: int) -> GemmShape:
    """Implicit GEMM of a convolution, per group: m = batch x output positions, n = output channels
    of the group, k = input channels of the group x kernel positions (input and output swap roles
    for a transposed convolution)."""
    kernel = _numel(w_shape[2:])
    if transposed:
        m = x_shape[0] * _numel(x_shape[2:])
        return int(groups), int(m), int(w_shape[1]), int(w_shape[0] // groups * kernel)
    m = out_shape[0] * _numel(out_shape[2:])
    return int(groups), int(m), int(w_shape[0] // groups), int(w_shape[1] * kernel)


@register_shape(*_ops("convolution", "_convolution", "cudnn_convolution", "mkldnn_convolution"))
def convolution_shape(args: tuple, named: dict, out: Any) -> GemmShape:
    return conv_shape(named["input"].shape, named["weight"].shape, _first_tensor(out).shape,
                      bool(named.get("transposed", False)), int(named.get("groups", 1) or 1))


def _channels_last(x: torch.Tensor) -> bool:
    """Whether x [N, C, *spatial] keeps its channels innermost, or has a layout NCHW and NHWC share
    (one channel, or one position)."""
    return x.dim() < 3 or x.stride(1) == 1 or x.shape[1] == 1 or _numel(x.shape[2:]) == 1


def conv_geometry(x: torch.Tensor, w: torch.Tensor, out_shape, named: dict, computes: tuple[str, ...]) -> ConvGeometry:
    """The geometry of a convolution of x by w (named: its schema arguments, stride, dilation, groups,
    transposed), producing an output of `out_shape`."""
    groups = int(named.get("groups", 1) or 1)
    transposed = bool(named.get("transposed", False))
    c_out, c_in = (w.shape[1] * groups, w.shape[0]) if transposed else (w.shape[0], w.shape[1] * groups)
    dims = w.dim() - 2
    return ConvGeometry(tuple(int(k) for k in w.shape[2:]), _per_dim(named.get("stride", 1), dims),
                        _per_dim(named.get("dilation", 1), dims), groups, transposed, int(c_in), int(c_out),
                        _channels_last(x), x.numel(), _numel(out_shape), w.numel(), computes,
                        tuple(int(n) for n in x.shape), tuple(int(n) for n in w.shape),
                        _padding(named.get("padding", 0), dims), _padding(named.get("output_padding", 0), dims))


def _padding(value: Any, dims: int) -> tuple[int, ...]:
    """A convolution's padding per dimension; () for a mode ("same", "valid") the call did not resolve."""
    return () if isinstance(value, str) else _per_dim(value, dims)


def _per_dim(value: Any, dims: int) -> tuple[int, ...]:
    """A convolution argument (an int or one per spatial dimension) as one per dimension."""
    values = [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
    return tuple(values * dims) if len(values) == 1 else tuple(values)


CONV_GEOMETRIES: dict[Any, Callable[[tuple, dict, Any], ConvGeometry]] = {}
"""aten OpOverloadPacket -> the geometry of its convolution."""


def _forward_geometry(args: tuple, named: dict, out: Any) -> ConvGeometry:
    return conv_geometry(named["input"], named["weight"], _first_tensor(out).shape, named, ("output",))


def _backward_geometry(args: tuple, named: dict, out: Any) -> ConvGeometry:
    mask = named["output_mask"]
    computes = tuple(name for name, wanted in zip(("grad_input", "grad_weight"), mask[:2], strict=True) if wanted)
    return conv_geometry(named["input"], named["weight"], named["grad_output"].shape, named, computes)


for _packet in _ops("convolution", "_convolution", "cudnn_convolution", "mkldnn_convolution"):
    CONV_GEOMETRIES[_packet] = _forward_geometry
CONV_GEOMETRIES[aten.convolution_backward] = _backward_geometry


def norm_geometry(x: torch.Tensor, training: object = None) -> NormGeometry:
    """The geometry of a batch norm over x [N, C, *spatial]; `training`: the call's flag, if it has one."""
    return NormGeometry(int(x.shape[1]) if x.dim() > 1 else 1, x.numel(), _channels_last(x),
                        tuple(int(size) for size in x.shape), training if isinstance(training, bool) else None)


NORM_GEOMETRIES: dict[Any, Callable[[tuple, dict, Any], NormGeometry]] = {
    **{packet: (lambda args, named, out: norm_geometry(args[0], named.get("training")))
       for packet in _ops("native_batch_norm", "_native_batch_norm_legit")},
    # (grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask)
    aten.native_batch_norm_backward: lambda args, named, out: norm_geometry(args[1], named.get("train")),
}
"""aten OpOverloadPacket of a batch norm -> the geometry of its input."""


@register_shape(aten.convolution_backward)
def convolution_backward_shape(args: tuple, named: dict, out: Any) -> GemmShape:
    """The forward's GEMM: grad_input and grad_weight are products of the same three sizes."""
    return conv_shape(named["input"].shape, named["weight"].shape, named["grad_output"].shape,
                      bool(named["transposed"]), int(named.get("groups", 1) or 1))


@register(aten.convolution_backward, matmul=True)
def convolution_backward_flops(args: tuple, named: dict, out: Any) -> float:
    """grad_input and grad_weight each cost one forward convolution, when asked for."""
    forward = conv_flops(named["input"].shape, named["weight"].shape, named["grad_output"].shape,
                         bool(named["transposed"]))
    output_mask = named["output_mask"]
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


# ----------------------------------------------------------------------------- attention


def attention_flops(q_shape, k_shape, v_shape, causal: bool) -> float:
    """softmax(q k^T) v for q [b, h, s_q, d], k [b, h, s_k, d], v [b, h, s_k, d_v]:
    2*b*h*s_q*s_k*d + 2*b*h*s_q*s_k*d_v. With a causal mask and s_q == s_k, only the
    (s+1)/(2s) of score blocks at or below the diagonal are computed (flash kernels skip the rest)."""
    *batch, s_q, d = q_shape
    s_k = k_shape[-2]
    d_v = v_shape[-1]
    heads = _numel(batch)
    flops = 2.0 * heads * s_q * s_k * (d + d_v)
    if causal:
        flops *= (s_k + 1) / (2 * s_k) if s_q == s_k else 1.0
    return flops


SDPA_KERNELS = (
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
)
"""Fused attention kernels; each has a `<name>_backward` op."""


ATTENTION_MASK_ARGUMENTS = ("attn_mask", "attn_bias")
"""How the fused attention kernels name an explicit mask: the CPU's flash kernel `attn_mask`, CUDA's
memory-efficient and cuDNN kernels `attn_bias` (CUDA's flash kernel takes none)."""


def attention_masked(named: dict) -> bool:
    """Whether a fused attention call (its named arguments) was given an explicit mask."""
    return any(isinstance(named.get(name), torch.Tensor) for name in ATTENTION_MASK_ARGUMENTS)


@register(*_ops(*SDPA_KERNELS), matmul=True)
def sdpa_forward_flops(args: tuple, named: dict, out: Any) -> float:
    causal = bool(named.get("is_causal", False))
    return attention_flops(named["query"].shape, named["key"].shape, named["value"].shape, causal)


@register_shape(*_ops(*SDPA_KERNELS), *_ops(*(f"{name}_backward" for name in SDPA_KERNELS)))
def sdpa_shape(args: tuple, named: dict, out: Any) -> GemmShape:
    """q k^T per head: batch x heads products of s_q x s_k over the head dimension."""
    *batch, s_q, d = named["query"].shape
    return _numel(batch), int(s_q), int(named["key"].shape[-2]), int(d)


@register(*_ops(*(f"{name}_backward" for name in SDPA_KERNELS)), matmul=True)
def sdpa_backward_flops(args: tuple, named: dict, out: Any) -> float:
    """Five matrix products: the fused kernels keep no s x s scores, so the backward recomputes
    S = Q K^T, then dV, dP, dQ and dK: 2.5 times the forward's two (torch's flop_counter counts the
    same five since torch 2.15; FlashAttention-2, Dao 2023, Algorithm 2). Causal masks skip the same
    share of every product."""
    return 2.5 * sdpa_forward_flops(args, named, out)


# ----------------------------------------------------------------------------- normalisation, softmax


@register(*_ops("native_layer_norm", "native_group_norm", "native_batch_norm", "_native_batch_norm_legit",
                "_native_batch_norm_legit_no_training", "_fused_rms_norm"))
def norm_flops(args: tuple, named: dict, out: Any) -> float:
    """5 FLOPs per input element (mean, subtract, square, normalise, scale/shift), as fvcore counts norms."""
    return 5.0 * args[0].numel()


@register(*_ops("native_layer_norm_backward", "native_group_norm_backward", "native_batch_norm_backward",
                "_fused_rms_norm_backward"))
def norm_backward_flops(args: tuple, named: dict, out: Any) -> float:
    """About twice the forward: 10 FLOPs per element."""
    return 10.0 * args[0].numel()


@register(*_ops("_softmax", "_log_softmax", "_safe_softmax"))
def softmax_flops(args: tuple, named: dict, out: Any) -> float:
    """5 FLOPs per element: max, subtract, exp, sum, divide."""
    return 5.0 * args[0].numel()


@register(*_ops("_softmax_backward_data", "_log_softmax_backward_data"))
def softmax_backward_flops(args: tuple, named: dict, out: Any) -> float:
    """3 FLOPs per element: multiply, sum, subtract."""
    return 3.0 * args[0].numel()


@register(*_ops("sum", "mean", "amax", "amin", "norm", "linalg_vector_norm", "var_mean", "var", "std", "cumsum",
                "histc", "topk", "floor_divide", "max", "min", "argmax", "argmin", "any", "all", "_unique2", "prod",
                "cumprod"))
def reduction_flops(args: tuple, named: dict, out: Any) -> float:
    """One FLOP per input element."""
    return float(args[0].numel())


@register(*_ops("hardtanh_backward"))
def hardtanh_backward_flops(args: tuple, named: dict, out: Any) -> float:
    """ReLU6's (hardtanh's) gradient: one comparison-and-select per element, as threshold_backward
    (which torch tags pointwise; this one it does not)."""
    return float(args[0].numel())


@register(aten._amp_foreach_non_finite_check_and_unscale_)
def amp_unscale_flops(args: tuple, named: dict, out: Any) -> float:
    """GradScaler's unscale: per gradient element a multiply by 1/scale and a finiteness check."""
    return 2.0 * sum(t.numel() for t in args[0])


@register_shape(aten._grouped_mm)
def grouped_mm_shape(args: tuple, named: dict, out: Any) -> GemmShape:
    """(groups, m, n, k) of aten._grouped_mm(a, b, offs): mixture-of-experts layers' one GEMM per
    expert over that expert's tokens (transformers 5, torchtitan), m the mean rows per group. The group
    count is the 3-D operand's first dimension; with two 2-D operands (a weight gradient) the groups
    split k and the output is groups x m x n."""
    a, b = args[0], args[1]
    if a.dim() == 2 and b.dim() == 3:  # tokens of all experts x k, experts x k x n
        groups = int(b.shape[0])
        return groups, max(1, int(a.shape[0]) // groups), int(b.shape[2]), int(a.shape[1])
    if a.dim() == 3 and b.dim() == 3:  # batched: groups x m x k, groups x k x n
        return int(a.shape[0]), int(a.shape[1]), int(b.shape[2]), int(a.shape[2])
    if a.dim() == 3:  # groups x m x k, k x (n of all groups)
        groups = int(a.shape[0])
        return groups, int(a.shape[1]), max(1, int(b.shape[1]) // groups), int(a.shape[2])
    groups = int(out.shape[0])  # m x (k of all groups), (k of all groups) x n -> groups x m x n
    return groups, int(a.shape[0]), int(b.shape[1]), max(1, int(a.shape[1]) // groups)


@register(aten._grouped_mm, matmul=True)
def grouped_mm_flops(args: tuple, named: dict, out: Any) -> float:
    """Every group's GEMM, 2 FLOPs per multiply-add: 2 x (all rows) x n x k, whatever the split."""
    a, b = args[0], args[1]
    if a.dim() == 2 and b.dim() == 2:
        return 2.0 * a.shape[0] * b.shape[1] * a.shape[1]
    return 2.0 * out.numel() * a.shape[-1]


RNN_GATE_FLOPS = 3
"""Per gate element and time step of a fused RNN layer beyond its GEMMs: the bias add, the activation
and its share of the cell update (counted as 3)."""


def _rnn_rows(sequence: torch.Tensor) -> int:
    """Time steps x batch of an RNN layer's input (T x B x I, or B x T x I: the product is the same)."""
    return sequence.numel() // sequence.shape[-1]


@register(aten.mkldnn_rnn_layer, matmul=True)
def rnn_layer_flops(args: tuple, named: dict, out: Any) -> float:
    """One LSTM layer over the whole sequence (the CPU's fused kernel; cuDNN's on a GPU): per time step
    and sample, the input and recurrent GEMMs against w_ih (G x I) and w_hh (G x H), 2 FLOPs per
    multiply-add, plus RNN_GATE_FLOPS per gate element (G = 4H)."""
    rows, w_ih, w_hh = _rnn_rows(args[0]), args[1], args[2]
    return float(rows * (2 * (w_ih.numel() + w_hh.numel()) + RNN_GATE_FLOPS * w_ih.shape[0]))


@register(aten.mkldnn_rnn_layer_backward, matmul=True)
def rnn_layer_backward_flops(args: tuple, named: dict, out: Any) -> float:
    """The layer's backward: gradients of its input and hidden state and of both weights, twice the
    forward's GEMMs, and the gates' derivatives."""
    rows, w_ih, w_hh = _rnn_rows(args[0]), args[1], args[2]
    return float(rows * (4 * (w_ih.numel() + w_hh.numel()) + RNN_GATE_FLOPS * w_ih.shape[0]))


@register_shape(aten.mkldnn_rnn_layer, aten.mkldnn_rnn_layer_backward)
def rnn_layer_shape(args: tuple, named: dict, out: Any) -> GemmShape:
    """As one GEMM of all time steps: (T x B) rows, G = 4H gate columns, I + H deep. (The recurrent half
    runs as T dependent GEMMs of B rows: on a GPU with few samples it is slower than this says.)"""
    w_ih, w_hh = args[1], args[2]
    return 1, _rnn_rows(args[0]), int(w_ih.shape[0]), int(w_ih.shape[1] + w_hh.shape[1])


@register(aten._embedding_bag, aten._embedding_bag_forward_only)
def embedding_bag_flops(args: tuple, named: dict, out: Any) -> float:
    """EmbeddingBag (sum, mean, max): one add (or compare) per gathered element, rows x width."""
    weight, indices = args[0], args[1]
    return float(indices.numel() * weight.shape[-1])


@register(aten._embedding_bag_backward, aten._embedding_bag_dense_backward, aten._embedding_bag_sparse_backward)
def embedding_bag_backward_flops(args: tuple, named: dict, out: Any) -> float:
    """Its backward scatters (dense) or copies (sparse) one gradient element per gathered element."""
    grad, indices = args[0], args[1]
    return float(indices.numel() * grad.shape[-1])


CTC_FLOPS_PER_CELL = 10
"""CTC's forward recursion per cell of its alpha table (time step x extended label): a log-sum-exp
of up to three predecessors and the emission (counted as 10); backward runs beta and the gradient."""


@register(aten._ctc_loss)
def ctc_loss_flops(args: tuple, named: dict, out: Any) -> float:
    alpha = out[1]
    return float(CTC_FLOPS_PER_CELL * alpha.numel())


@register(aten._ctc_loss_backward)
def ctc_loss_backward_flops(args: tuple, named: dict, out: Any) -> float:
    """Beta (as alpha) and the gradient of every log-probability, over the saved alpha table (args[6])."""
    log_probs, alpha = args[1], args[6]
    return float(2 * CTC_FLOPS_PER_CELL * alpha.numel() + 2 * log_probs.numel())


ADAM_FLOPS_PER_ELEMENT = 10
"""Adam(W)'s update per parameter element, as its foreach form counts one per elementwise op: weight
decay (1), first moment lerp (1), second moment mul and addcmul (2), bias corrections, sqrt and eps (4),
the addcdiv step (2)."""


@register(aten._fused_adam_, aten._fused_adamw_)
def fused_adam_flops(args: tuple, named: dict, out: Any) -> float:
    """torch's fused Adam/AdamW (`fused=True`): one kernel updates every parameter of a list."""
    return float(ADAM_FLOPS_PER_ELEMENT * sum(t.numel() for t in args[0]))


ADAMW8BIT_FLOPS_PER_ELEMENT = 24
"""Arithmetic of bitsandbytes' fused 8-bit AdamW per element: decode both moments (lookup, scale), update
them, bias corrections, the update and decay, re-encode both (absmax and a binary search over the 256-entry
code map, counted as its 8 compares): an estimate; the kernel is memory-bound."""


@register("advisor::adamw8bit_step_")
def adamw8bit_flops(args: tuple, named: dict, out: Any) -> float:
    """quantized.py's 8-bit AdamW update of one parameter."""
    return float(ADAMW8BIT_FLOPS_PER_ELEMENT * args[0].numel())


@register("advisor::float8_cast_transpose")
def float8_cast_flops(args: tuple, named: dict, out: Any) -> float:
    """float8.py's cast: per element its absolute value into the amax, a scale and a conversion."""
    return 3.0 * args[0].numel()


@register("advisor::dequantize_blockwise")
def dequantize_flops(args: tuple, named: dict, out: Any) -> float:
    """quantized.py's weight decode: per weight a code lookup (NF4) or conversion (int8) and a scale."""
    return 2.0 * out.numel()


WRITTEN_LISTS: dict[Any, tuple[int, ...]] = {aten._fused_adam_: (0, 2, 3, 4), aten._fused_adamw_: (0, 2, 3, 4),
                                             "advisor::adamw8bit_step_": (0, 2, 3, 4, 5)}
"""In-place ops that update several of their arguments (by position; by qualified name for ours): the fused
Adams write the parameters, both moments and, with amsgrad, the maximum of the second; the 8-bit AdamW the
parameter, both codes and both absmax."""


@register(*_ops("hardswish", "hardswish_", "hardswish_backward", "hardsigmoid_backward", "upsample_nearest2d",
                "upsample_nearest2d_backward", "nll_loss2d_forward", "nll_loss2d_backward", "smooth_l1_loss",
                "smooth_l1_loss_backward", "binary_cross_entropy_with_logits", "_weight_norm_interface",
                "_weight_norm_interface_backward", "log_sigmoid_forward", "log_sigmoid_backward", "polar",
                "softplus_backward"))
def per_element_flops(args: tuple, named: dict, out: Any) -> float:
    """MobileNetV3's hard activations and their gradients, nearest-neighbour upsampling (a copy), the
    2-D NLL, smooth-L1 and logits-BCE losses (detection heads), weight normalisation (Wav2Vec2's
    positional convolution), log-sigmoid (preference losses) and polar (rotary embeddings in complex form):
    one FLOP per element of the largest tensor they write or take first (a loss: its
    per-pixel input, args[0])."""
    sizes = [t.numel() for t in (*leaves(out), args[0]) if isinstance(t, torch.Tensor)]
    return float(max(sizes, default=0))


BILINEAR_FLOPS_PER_ELEMENT = 8
"""Bilinear interpolation per output element: four neighbours weighted and summed (or, backward, one
gradient element spread over four)."""


@register(*_ops("upsample_bilinear2d", "upsample_bilinear2d_backward"))
def bilinear_flops(args: tuple, named: dict, out: Any) -> float:
    return BILINEAR_FLOPS_PER_ELEMENT * per_element_flops(args, named, out)


BICUBIC_FLOPS_PER_ELEMENT = 32
"""Bicubic interpolation per output element: sixteen neighbours weighted and summed (or, backward, one gradient
element spread over sixteen)."""


@register(*_ops("upsample_bicubic2d", "upsample_bicubic2d_backward"))
def bicubic_flops(args: tuple, named: dict, out: Any) -> float:
    return BICUBIC_FLOPS_PER_ELEMENT * per_element_flops(args, named, out)


GRID_SAMPLE_FLOPS_PER_ELEMENT = {0: BILINEAR_FLOPS_PER_ELEMENT, 1: 1, 2: BICUBIC_FLOPS_PER_ELEMENT}
"""grid_sample's interpolation modes (0 bilinear, 1 nearest, 2 bicubic) per sampled element."""


@register(*_ops("grid_sampler_2d", "grid_sampler_2d_backward"))
def grid_sample_flops(args: tuple, named: dict, out: Any) -> float:
    """Spatial transformers' and optical flow's warps (RAFT): each sampled element (of the output, or of the
    gradient a backward spreads back) interpolated from its neighbours in the input."""
    sampled = args[0] if "grad_output" in named else _first_tensor(out)
    return GRID_SAMPLE_FLOPS_PER_ELEMENT.get(named["interpolation_mode"], BILINEAR_FLOPS_PER_ELEMENT) * sampled.numel()


@register(*_ops("index_add", "index_add_"))
def index_add_flops(args: tuple, named: dict, out: Any) -> float:
    """One addition per element of `source`, added into the rows `index` names (graph networks' message
    sums, mixture-of-experts' combine)."""
    return float(named["source"].numel())


SCAN_FLOPS_PER_STATE = 8
"""Mamba's selective scan forward, per token, channel and state: the decay exp(delta x A) (a multiply, an exp),
the drive delta x B x u (two multiplies), the state update (a multiply-add) and the output's C . state (a
multiply-add) (mamba_ssm's selective_scan_ref, one step of its loop)."""

SCAN_FLOPS_PER_CHANNEL = 10
"""And per token and channel: delta's bias and softplus, the D skip (a multiply-add) and the z gate (silu and
a multiply)."""

SCAN_BACKWARD_OVER_FORWARD = 2.5
"""The backward kernel recomputes the forward's states chunk by chunk and runs the reverse recurrence with
the gradients of the state, delta, A, B, C and u (about one and a half times the forward's work again)."""


@register("advisor::selective_scan")
def selective_scan_flops(args: tuple, named: dict, out: Any) -> float:
    """Mamba's fused selective scan (profile/selective_scan.py): u is batch x channels x tokens, A channels x
    states.

    # u 2 x 128 x 64, 16 states: 2*128*64 * (8*16 + 10) = 2,260,992 FLOPs
    """
    batch, channels, tokens = named["u"].shape
    return float(batch * channels * tokens * (SCAN_FLOPS_PER_STATE * named["A"].shape[1] + SCAN_FLOPS_PER_CHANNEL))


@register("advisor::selective_scan_backward")
def selective_scan_backward_flops(args: tuple, named: dict, out: Any) -> float:
    return SCAN_BACKWARD_OVER_FORWARD * selective_scan_flops(args, named, out)


ROI_ALIGN_SAMPLES = 4
"""Sampling points per output bin of RoIAlign when the call leaves them adaptive (sampling_ratio <= 0):
2 x 2, what torchvision's detection heads pass explicitly."""


def _roi_samples(sampling_ratio: int) -> int:
    return sampling_ratio * sampling_ratio if sampling_ratio > 0 else ROI_ALIGN_SAMPLES


@register("torchvision::roi_align")
def roi_align_flops(args: tuple, named: dict, out: Any) -> float:
    """torchvision's RoIAlign (Faster/Mask R-CNN): per output element, sampling_ratio^2 bilinear samples
    averaged. roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)."""
    return BILINEAR_FLOPS_PER_ELEMENT * _roi_samples(int(args[5])) * _first_tensor(out).numel()


@register("torchvision::_roi_align_backward")
def roi_align_backward_flops(args: tuple, named: dict, out: Any) -> float:
    """Each gradient element spread over its bins' bilinear samples. _roi_align_backward(grad, rois,
    spatial_scale, pooled_height, pooled_width, batch_size, channels, height, width, sampling_ratio, aligned)."""
    return BILINEAR_FLOPS_PER_ELEMENT * _roi_samples(int(args[9])) * args[0].numel()


NMS_FLOPS_PER_PAIR = 12
"""One IoU of two boxes: intersection (4 max/min, 2 subtractions, 1 product), union (2 areas known,
2 additions) and the comparison with the threshold."""


@register("torchvision::nms")
def nms_flops(args: tuple, named: dict, out: Any) -> float:
    """Non-maximum suppression of n boxes as CUDA runs it: the IoU of every pair (a bit mask of n x n/2
    pairs), after sorting by score."""
    n = int(args[0].shape[0])
    return NMS_FLOPS_PER_PAIR * n * (n - 1) / 2 + n * max(1.0, math.log2(max(n, 2)))


CDIST_FLOPS_PER_TERM = 3
"""One term of a distance between two vectors: subtract, square (or absolute value), add."""


@register(*_ops("_cdist_forward"))
def cdist_flops(args: tuple, named: dict, out: Any) -> float:
    """Pairwise distances of x1 (..., P, M) and x2 (..., R, M): CDIST_FLOPS_PER_TERM per output element
    and coordinate (DETR's box-cost matrix)."""
    return float(CDIST_FLOPS_PER_TERM * _first_tensor(out).numel() * int(args[0].shape[-1]))


@register(*_ops("sort"))
def sort_flops(args: tuple, named: dict, out: Any) -> float:
    """A comparison sort: n log2 n comparisons along the sorted dimension, per row."""
    values = args[0]
    dim = named.get("dim", -1)
    length = int(values.shape[dim]) if values.dim() else 1
    return float(values.numel() * max(1.0, math.log2(max(length, 2))))


@register(aten._amp_update_scale_)
def amp_update_scale_flops(args: tuple, named: dict, out: Any) -> float:
    """GradScaler's scale update: a handful of scalar operations (counted as 4)."""
    return 4.0


# ----------------------------------------------------------------------------- classification


FREE_OPS = set(
    _ops(
        "_unsafe_view", "slice", "split", "unsafe_split", "t_", "transpose_", "empty", "empty_like",
        "empty_strided", "new_empty", "new_empty_strided", "_local_scalar_dense", "set_", "resize_",
        "unsqueeze_", "squeeze_", "as_strided_",
    )
)
"""Ops that move no data and do no math that `_is_view` does not catch (views by schema alias info
are free anyway): reshaping copies-by-name, metadata, allocation without initialisation."""

DATA_OPS = set(
    _ops(
        "_to_copy", "copy_", "clone", "cat", "stack", "zeros", "zeros_like", "ones", "ones_like", "fill_",
        "full", "full_like", "new_zeros", "new_ones", "new_full", "zero_", "embedding", "embedding_dense_backward",
        "index", "index_select", "gather", "scatter", "scatter_add", "index_put", "index_put_", "masked_fill",
        "masked_fill_", "constant_pad_nd", "arange", "scalar_tensor", "_unsafe_index", "_unsafe_index_put",
        "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward",
        "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward", "nll_loss_forward", "nll_loss_backward",
        "repeat", "roll", "select_backward", "slice_backward", "where", "tril", "triu", "native_dropout", "native_dropout_backward", "bernoulli_",
        "_foreach_zero_", "rand", "randn", "rand_like", "randn_like", "nonzero", "index_fill", "index_fill_",
        "randperm", "masked_select", "diagonal_copy", "diagonal_backward", "uniform_", "normal_",
        "scatter_", "masked_scatter", "masked_scatter_", "masked_scatter_backward", "max_pool3d_with_indices",
        "max_pool3d_with_indices_backward", "avg_pool3d", "avg_pool3d_backward", "eye", "_is_all_true",
        "_is_any_true", "flip", "linspace",
    )
)
"""Ops that move data but do (next to) no arithmetic: counted with 0 FLOPs and their bytes."""


def _tensor_bytes(values: Iterable[Any]) -> int:
    """Bytes of the tensors among `values`: of the indices and values a sparse one stores."""
    return sum(part.numel() * part.element_size() for t in values if isinstance(t, torch.Tensor)
               for part in stored_parts(t))


def named_arguments(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Every argument of the call by its schema name, defaults filled in."""
    named: dict[str, Any] = {}
    for index, argument in enumerate(func._schema.arguments):
        if index < len(args):
            named[argument.name] = args[index]
        elif argument.name in kwargs:
            named[argument.name] = kwargs[argument.name]
        elif argument.has_default_value():
            named[argument.name] = argument.default_value
    return named


def _is_view(func: Any) -> bool:
    return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


OVERWRITE_OPS = set(_ops("copy_", "fill_", "zero_", "_foreach_copy_", "_foreach_zero_"))
"""In-place ops that write their first argument without reading it."""


def _read_arguments(packet: Any, args: tuple, kwargs: dict) -> list[Any]:
    """The tensors an op reads: its arguments, less `out=` buffers and the destination of an
    overwrite (copy_, fill_, zero_), which are only written."""
    kwargs = {name: value for name, value in (kwargs or {}).items() if name != "out"}
    if packet in OVERWRITE_OPS:
        args = args[1:]
    return leaves((args, kwargs))


@functools.cache
def _pointwise_in_place(packet: Any) -> bool:
    """An in-place op whose out-of-place form is tagged pointwise (`abs_` of `abs`): torch tags some in-place
    forms and not others."""
    name = packet.__name__
    plain = getattr(aten, name[:-1], None) if name.endswith("_") and not name.startswith("_") else None
    return plain is not None and any(torch.Tag.pointwise in getattr(plain, overload).tags
                                     for overload in plain.overloads())


def op_cost(func: Any, args: tuple, kwargs: dict, out: Any) -> OpCost:
    """Cost of one call of aten op `func` (an OpOverload) with these arguments and output."""
    packet = func.overloadpacket
    if func.namespace in ("prim", "profiler") or packet in FREE_OPS or _is_view(func):
        return OpCost(0.0, 0, 0, False, True)
    inputs = _read_arguments(packet, args, kwargs)
    outputs = leaves(out)
    read, written = _tensor_bytes(inputs), _tensor_bytes(outputs)
    dtypes = tuple(sorted({str(t.dtype).removeprefix("torch.") for t in inputs if isinstance(t, torch.Tensor)}))
    flops, matmul, counted, gemm, conv, transposed, norm, masked = 0.0, False, True, None, None, 0, None, False
    entry = REGISTRY.get(packet) or REGISTRY.get(packet._qualified_op_name)
    if entry is not None:
        named = named_arguments(func, args, kwargs or {})
        flops, matmul = float(entry.formula(args, named, out)), entry.matmul
        shape = GEMM_SHAPES.get(packet)
        gemm = None if shape is None else shape(args, named, out)
        geometry = CONV_GEOMETRIES.get(packet)
        conv = None if geometry is None else geometry(args, named, out)
        operands = GEMM_OPERANDS.get(packet)
        if operands is not None:
            transposed = transposed_operands(args[operands[0]], args[operands[1]])
        norm_of = NORM_GEOMETRIES.get(packet)
        norm = None if norm_of is None else norm_of(args, named, out)
        masked = packet.__name__.removesuffix("_backward") in SDPA_KERNELS and attention_masked(named)
    elif packet in DATA_OPS:  # before the pointwise tag: clone and copies carry it but do no math
        pass
    elif torch.Tag.pointwise in func.tags or _pointwise_in_place(packet):
        flops = float(max((t.numel() for t in outputs if isinstance(t, torch.Tensor)), default=0))
    elif packet.__name__.startswith("_foreach_"):
        flops = _foreach_flops(args, outputs)
    else:
        counted = False
    written_lists = WRITTEN_LISTS.get(packet) or WRITTEN_LISTS.get(packet._qualified_op_name)
    if not written and written_lists:
        written = sum(_tensor_bytes(leaves(args[i])) for i in written_lists)
    elif not written and packet.__name__.endswith("_"):  # in place, returns nothing: writes its first list
        written = _tensor_bytes(leaves(args[0]))
    return OpCost(flops, read, written, matmul, counted, dtypes, gemm, conv, transposed, norm, masked)


def _foreach_flops(args: tuple, outputs: list[Any]) -> float:
    """Elementwise _foreach_ ops (the optimizers' fused loops): one FLOP per element of the tensors
    they produce; an in-place one returns nothing and updates its first list argument."""
    produced = [t for t in outputs if isinstance(t, torch.Tensor)] or list(args[0])
    return float(sum(t.numel() for t in produced))
