"""Every piece of torch gpu-advisor replaces while it traces, in one place (issue #23).

The tracer runs users' models on fake tensors and on the meta device; two torch functions do not
allow that and are replaced, only for the duration of a `with` block, through `replaced` (the one way
this package assigns an attribute of torch; tests/test_layers.py checks no other module does):

| patch | replaced | why | checked on torch |
|---|---|---|---|
| `fake_tensor_conversions` | `torch.utils.swap_tensors` | `Module._apply` (`.half()`, `.to(...)`) swaps each parameter with its converted twin, which fails on the weak reference fake mode keeps to every fake tensor: for fake tensors the parameter's data is set instead, what `_apply` does for real ones | 2.13, 2.15 |
| `registration_hooks` | `torch.nn.Module.register_parameter`, `register_buffer` | build.weights_on_meta moves each parameter and buffer to the meta device as it is registered (accelerate's `init_empty_weights` does the same) | 2.13, 2.15 |
| `unpacked_fake_sequences` | `transformers.masking_utils.find_packed_sequence_indices` (only where transformers is already imported) | transformers cannot read fake position ids, so it assumes packed sequences and builds an explicit s x s causal mask; a real step's position ids (the model's own `arange`) pack nothing, its mask is skipped and attention runs causal (`is_causal=True`: half the FLOPs, flash kernels) | transformers 5.24 |
| `grouped_mm_in_any_float` | `torch._meta_registrations._meta_grouped_mm_common` (where torch has it) | the meta kernel of `aten._grouped_mm` (what fake and meta tensors run) accepts bf16 only (2.13) or bf16 and fp16 (2.14), where the CPU kernel and CUDA's fallback for SM80+ run fp32 and fp16 too (pytorch PRs 161717, 162059): transformers' mixture-of-experts layers call it with fp32 operands in fp32 and amp training (Qwen3-MoE, Mixtral, Jamba); their output is sized as bf16's and given the operands' dtype | 2.13, 2.14, 2.15 |

Private torch modules the tracer imports (torch.utils._python_dispatch, torch._subclasses.fake_tensor,
torch.utils._pytree) are used as torch's own FlopCounterMode uses them, not patched.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

CHECKED_ON = ("2.13", "2.15")
"""torch versions the patches were checked on (CI runs the suite on both)."""


@contextmanager
def replaced(owner: Any, name: str, replacement: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """`owner.name` is `replacement` within the block (which gets the original), restored after it."""
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield original
    finally:
        setattr(owner, name, original)


@contextmanager
def fake_tensor_conversions() -> Iterator[None]:
    """Let a model file convert its model (`.half()`, `.to(torch.bfloat16)`,
    `.to(memory_format=torch.channels_last)`) on fake tensors: swapping two fake tensors sets the
    first's data to the second instead. The parameter object, its requires_grad and its place in the
    module stay as they were; real tensors are swapped as torch swaps them."""
    swap = torch.utils.swap_tensors

    def swap_or_set_data(t1: torch.Tensor, t2: torch.Tensor) -> None:
        if isinstance(t1, FakeTensor) and isinstance(t2, FakeTensor):
            t1.data = t2.detach()
        else:
            swap(t1, t2)

    with replaced(torch.utils, "swap_tensors", swap_or_set_data):
        yield


@contextmanager
def registration_hooks(after_parameter: Callable[[torch.nn.Module, str], None],
                       after_buffer: Callable[[torch.nn.Module, str], None]) -> Iterator[None]:
    """Within the block, `after_parameter(module, name)` runs after every `register_parameter` of a
    parameter (not None) and `after_buffer(module, name)` after every `register_buffer` of a tensor."""
    register_parameter = torch.nn.Module.register_parameter
    register_buffer = torch.nn.Module.register_buffer

    def parameter_then_hook(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        register_parameter(module, name, param)
        if param is not None:
            after_parameter(module, name)

    def buffer_then_hook(module: torch.nn.Module, name: str, tensor: torch.Tensor | None,
                         persistent: bool = True) -> None:
        register_buffer(module, name, tensor, persistent=persistent)
        if tensor is not None:
            after_buffer(module, name)

    with ExitStack() as stack:
        stack.enter_context(replaced(torch.nn.Module, "register_parameter", parameter_then_hook))
        stack.enter_context(replaced(torch.nn.Module, "register_buffer", buffer_then_hook))
        yield


FLOAT_GROUPED_MM = (torch.float32, torch.float16)
"""Operand dtypes of an unscaled aten._grouped_mm that torch's real kernels run and its meta kernel may refuse."""


@contextmanager
def grouped_mm_in_any_float() -> Iterator[None]:
    """Within the block, an unscaled `aten._grouped_mm` of fp32 or fp16 operands runs on fake and meta tensors
    as the real kernels run it: the meta kernel checks bf16 operands of the same shapes and strides, and the
    output is made as torch makes it, in the operands' dtype (or `out_dtype`). Nothing is replaced where torch
    has no such kernel."""
    import torch._meta_registrations as meta_registrations

    original = getattr(meta_registrations, "_meta_grouped_mm_common", None)
    if original is None:
        yield
        return

    def in_any_float(mat_a: torch.Tensor, mat_b: torch.Tensor, scale_a: Any, scale_b: Any, *args: Any,
                     **kwargs: Any) -> Any:
        if scale_a is not None or scale_b is not None or mat_a.dtype not in FLOAT_GROUPED_MM \
                or mat_b.dtype != mat_a.dtype:
            return original(mat_a, mat_b, scale_a, scale_b, *args, **kwargs)
        names = ("offs", "bias", "scale_result", "out_dtype", "use_fast_accum")
        given = {**dict(zip(names, args)), **kwargs}
        out_dtype = given.pop("out_dtype", None) or mat_a.dtype
        bias = given.pop("bias", None)
        a, b = (torch.empty_strided(m.shape, m.stride(), dtype=torch.bfloat16, device=m.device) for m in (mat_a, mat_b))
        sized = original(a, b, None, None, **given, bias=None if bias is None else bias.to(torch.bfloat16))
        output = getattr(meta_registrations, "_create_grouped_mm_output_tensor", None)  # its rows 16-byte aligned
        if output is not None:
            return output(mat_a, mat_b, given.get("offs"), out_dtype)
        return torch.empty_strided(sized.shape, sized.stride(), dtype=out_dtype, device=sized.device)

    with replaced(meta_registrations, "_meta_grouped_mm_common", in_any_float):
        yield


@contextmanager
def unpacked_fake_sequences() -> Iterator[None]:
    """Within the block, transformers' causal-mask builder takes fake position ids for one sequence per
    batch row, as a real step's are: `find_packed_sequence_indices` returns None for a fake tensor (for a
    real one it runs as it is). Without it, a causal LM traced on fake tensors (Llama, Qwen, Mistral, ...)
    materialises a batch x s x s mask and calls scaled_dot_product_attention with it: twice a causal
    kernel's FLOPs and a mask no real step holds. Nothing is replaced where transformers is not imported."""
    masking = sys.modules.get("transformers.masking_utils")
    original = getattr(masking, "find_packed_sequence_indices", None)
    if original is None:
        yield
        return

    def unpacked_if_fake(position_ids: torch.Tensor) -> torch.Tensor | None:
        return None if isinstance(position_ids, FakeTensor) else original(position_ids)

    with replaced(masking, "find_packed_sequence_indices", unpacked_if_fake):
        yield
