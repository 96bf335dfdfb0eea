"""CUDA's autocast policy on a CPU trace: the ops a GPU's autocast runs in fp32 are run in fp32 here too.

The tracer runs a GPU target's step on CPU (fake) tensors under `torch.autocast("cpu")`, whose op lists are
not CUDA's. CUDA's autocast (ATen/autocast_mode.h, the AT_FORALL_* lists, with which the AutocastCUDA kernels
are registered) computes softmax and log_softmax, layer and group norm, exp, log, pow, rsqrt, sums, cumulative
sums, norms and upsampling in fp32, and promotes the operands of addcmul, index_put, scatter_add and others to
the widest; CPU's autocast leaves all of them in the low-precision dtype. The difference is memory and time a
GPU spends where a model feeds those ops low-precision tensors: attention probabilities (batch x heads x seq x
seq) of `(q @ k.T).softmax()` saved in fp32, GroupNorm's fp32 copy of a convolution's output and its fp32
output, fp32 upsampling in a UNet. Within `cuda_autocast_policy()` the AutocastCPU
kernels of those ops are CUDA's policies (the same casts, made by the same dispatcher key's kernels, so the
step records them as the GPU makes them):

- fp32: every floating operand that is not fp32 or fp64 is cast to fp32 (`cached_cast(at::kFloat, ...)`);
- fp32_set_opt_dtype: where the first tensor operand is floating (not fp64) and the op's `dtype` is not
  given, it is given as fp32 (softmax, sum: the op casts inside and returns fp32);
- fp32_append_dtype: `norm` gets dtype fp32 (its overload with a dtype);
- promote: the floating operands are cast to the widest floating dtype among them and autocast's.

CUDA's lower-precision list is left to CPU's own: the ops through which training steps reach it (linear,
matmul, mm, bmm, baddbmm, addmm, conv*, scaled_dot_product_attention) are on both; those on CUDA's alone are
composites that reach them (einsum, chain_matmul, RNN cells) or that training steps do not use (addmv, addr,
mv). CPU's own fp32 entries that CUDA lacks (pool3d, linalg, fft, cross_entropy_loss, whose pieces CUDA runs
in fp32 anyway) stay as they are. The registrations are process-wide while the block runs: traces for CPU
targets run outside it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from advisor.profile.tensors import leaves

FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
    "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp", "upsample_nearest1d",
    "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d", "upsample_nearest3d",
    "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)
"""CUDA's fp32 policy (AT_FORALL_FP32 of torch 2.13's ATen/autocast_mode.h): operator.overload names."""

FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList",
)
"""CUDA's fp32_set_opt_dtype policy (AT_FORALL_FP32_SET_OPT_DTYPE)."""

FP32_APPEND_DTYPE = {"norm.Scalar": "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype"}
"""CUDA's fp32_append_dtype policy (AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE): an overload -> the one it
redispatches to with dtype fp32 appended."""

PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
           "tensordot", "scatter_add")
"""CUDA's promote policy (AT_FORALL_PROMOTE)."""

_BELOW_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)


def overload(name: str) -> torch._ops.OpOverload | None:
    """aten's `op.overload` ("" for the default), None where this torch has no such operator."""
    op, _, variant = name.partition(".")
    packet = getattr(torch.ops.aten, op, None)
    if packet is None:
        return None
    return getattr(packet, variant or "default", None)


def _eligible(tensor: torch.Tensor) -> bool:
    """Whether autocast casts `tensor` (cached_cast's eligibility): floating, not fp64."""
    return tensor.is_floating_point() and tensor.dtype != torch.float64


def _cast(args: tuple, kwargs: dict, dtype: torch.dtype) -> tuple[tuple, dict]:
    """`args` and `kwargs` with every eligible tensor in them (tensor lists too) cast to `dtype`."""
    return tree_map_only(torch.Tensor, lambda t: t.to(dtype) if _eligible(t) and t.dtype != dtype else t,
                         (args, kwargs))


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors among `args` and `kwargs` (tensor lists too), in order."""
    return [value for value in leaves((args, kwargs)) if isinstance(value, torch.Tensor)]


def _first_eligible(args: tuple, kwargs: dict) -> bool:
    """Whether the op's first tensor operand is one autocast casts (firstarg_is_eligible)."""
    tensors = _tensors(args, kwargs)
    return bool(tensors) and _eligible(tensors[0])


def _dtype_position(op: torch._ops.OpOverload) -> int | None:
    """Where `op`'s `dtype` argument comes among the positional arguments a kernel is handed (None: it comes
    as a keyword: keyword-only, as `sum`'s, or absent)."""
    for index, argument in enumerate(op._schema.arguments):
        if argument.name == "dtype":
            return None if argument.kwarg_only else index
    return None


def _fp32(op: torch._ops.OpOverload) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = _cast(args, kwargs, torch.float32)
        with torch._C._ExcludeDispatchKeyGuard(_BELOW_AUTOCAST):
            return op(*args, **kwargs)
    return kernel


def _fp32_set_opt_dtype(op: torch._ops.OpOverload) -> Callable[..., Any]:
    position = _dtype_position(op)  # softmax's and log_softmax's is positional, sum's and cumsum's keyword-only

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if _first_eligible(args, kwargs):
            if position is not None and position < len(args):
                if args[position] is None:
                    args = (*args[:position], torch.float32, *args[position + 1:])
            elif kwargs.get("dtype") is None:
                kwargs = kwargs | {"dtype": torch.float32}
        with torch._C._ExcludeDispatchKeyGuard(_BELOW_AUTOCAST):
            return op(*args, **kwargs)
    return kernel


def _fp32_append_dtype(op: torch._ops.OpOverload, with_dtype: torch._ops.OpOverload) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_BELOW_AUTOCAST):
            if _first_eligible(args, kwargs):
                return with_dtype(*args, **kwargs, dtype=torch.float32)
            return op(*args, **kwargs)
    return kernel


def _promote(op: torch._ops.OpOverload) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        widest = torch.get_autocast_dtype("cpu")
        for tensor in _tensors(args, kwargs):
            if _eligible(tensor):
                widest = torch.promote_types(widest, tensor.dtype)
        args, kwargs = _cast(args, kwargs, widest)
        with torch._C._ExcludeDispatchKeyGuard(_BELOW_AUTOCAST):
            return op(*args, **kwargs)
    return kernel


def policy_kernels() -> dict[torch._ops.OpOverload, Callable[..., Any]]:
    """Each listed operator this torch has -> its AutocastCPU kernel under CUDA's policy."""
    kernels: dict[torch._ops.OpOverload, Callable[..., Any]] = {}
    for names, make in ((FP32, _fp32), (FP32_SET_OPT_DTYPE, _fp32_set_opt_dtype), (PROMOTE, _promote)):
        for name in names:
            op = overload(name)
            if op is not None:
                kernels[op] = make(op)
    for name, redispatched in FP32_APPEND_DTYPE.items():
        op, with_dtype = overload(name), overload(redispatched)
        if op is not None and with_dtype is not None:
            kernels[op] = _fp32_append_dtype(op, with_dtype)
    return kernels


@contextmanager
def cuda_autocast_policy() -> Iterator[None]:
    """Within the block, CPU autocast casts as CUDA's does (the module docstring); the kernels are registered
    with the dispatcher on entry and removed on exit (the CPU's own then run again)."""
    library = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():  # prod, cdist and the losses have CPU kernels: replaced on purpose
            warnings.simplefilter("ignore")
            for op, kernel in policy_kernels().items():
                library.impl(op, kernel, "AutocastCPU")
        yield
    finally:
        library._destroy()
