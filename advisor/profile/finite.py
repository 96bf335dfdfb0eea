"""Checks of activations for inf and NaN, answered on fake tensors (issue #22).

Models test their own activations: DETR's `if not torch.isfinite(hidden_states).all(): raise`, T5's and
BART's `if torch.isinf(hidden_states).any(): clamp` under fp16. Fake tensors have no values, so such a
branch used to stop the trace as "weight-dependent control flow". A training step that is worth
planning has finite activations: the tracer assumes so. Watching torch's functions (isfinite
decomposes into several aten ops below them), it knows every element of isfinite's output is True and
of isnan's and isinf's is False, carries that through all/any, copies and negation, and answers
`.item()` and `if tensor:` on such a tensor; the trace counts the answers. Such a read makes a real
step's host wait for the device: `on_read` hears each, and the trace records it as the read back it is.
The same holds of the optimizer's checks of gradients (`clip_grad_norm_(..., error_if_nonfinite=True)`:
`if torch.logical_or(norm.isnan(), norm.isinf())`), so the assumption covers the optimizer's step too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakTensorKeyDictionary

ELEMENTS_ARE = {"isfinite": True, "isnan": False, "isinf": False, "isposinf": False, "isneginf": False}
"""Function -> the value of every element of its output, activations being finite."""
KEEP = frozenset({"all", "any", "clone", "detach", "to", "view", "reshape", "squeeze", "unsqueeze", "flatten"})
"""Functions whose output holds the value every element of their input holds (a reduction of equal values)."""
NEGATE = frozenset({"logical_not", "bitwise_not", "__invert__"})
COMBINE: dict[str, Callable[[list[bool]], bool]] = {
    "logical_or": any, "bitwise_or": any, "__or__": any, "__ror__": any,
    "logical_and": all, "bitwise_and": all, "__and__": all, "__rand__": all,
}
"""Functions of two boolean tensors whose output holds one value when both inputs do."""
ASKS = frozenset({"item", "__bool__"})
"""Functions that read a one-element tensor's value."""


class FiniteActivations(TorchFunctionMode):
    """Within it, the finite-activations assumption answers value checks (see the module docstring)."""

    def __init__(self, on_read: Callable[[torch.Tensor, bool], None] | None = None) -> None:
        super().__init__()
        self.known: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        self.answered = 0
        self.on_read = on_read

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = getattr(func, "__name__", "")
        first = args[0] if args else None
        if name in ASKS and isinstance(first, torch.Tensor) and first.numel() == 1 and first in self.known:
            self.answered += 1
            if self.on_read is not None:
                self.on_read(first, self.known[first])
            return self.known[first]
        out = func(*args, **(kwargs or {}))
        self._observe(name, out, args)
        return out

    def _observe(self, name: str, out: Any, args: tuple) -> None:
        if not isinstance(out, torch.Tensor) or out.dtype != torch.bool:
            return
        first = args[0] if args else None
        value = ELEMENTS_ARE.get(name)
        if value is None and name in COMBINE and len(args) == 2 and all(
                isinstance(a, torch.Tensor) and a in self.known for a in args):
            value = COMBINE[name]([self.known[a] for a in args])
        if value is None and isinstance(first, torch.Tensor) and first in self.known:
            if name in KEEP:
                value = self.known[first]
            elif name in NEGATE:
                value = not self.known[first]
        if value is not None:
            self.known[out] = value
