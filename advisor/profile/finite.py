"""Checks of activations for inf and NaN, answered on fake tensors (issue #22).

Models test their own activations: DETR's `if not torch.isfinite(hidden_states).all(): raise`, T5's and
BART's `if torch.isinf(hidden_states).any(): clamp` under fp16. Fake tensors have no values, so such a
branch used to stop the trace as "weight-dependent control flow". A training step that is worth
planning has finite activations: the tracer assumes so. Watching torch's functions (isfinite
decomposes into several aten ops below them), it knows every element of isfinite's output is True and
of isnan's and isinf's is False, carries that through all/any, copies and negation, and answers
`.item()` and `if tensor:` on such a tensor; the trace counts the answers."""

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
ASKS = frozenset({"item", "__bool__"})
"""Functions that read a one-element tensor's value."""


class FiniteActivations(TorchFunctionMode):
    """Within it, the finite-activations assumption answers value checks (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.known: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        self.answered = 0

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = getattr(func, "__name__", "")
        first = args[0] if args else None
        if name in ASKS and isinstance(first, torch.Tensor) and first.numel() == 1 and first in self.known:
            self.answered += 1
            return self.known[first]
        out = func(*args, **(kwargs or {}))
        self._observe(name, first, out)
        return out

    def _observe(self, name: str, first: Any, out: Any) -> None:
        if not isinstance(out, torch.Tensor) or out.dtype != torch.bool:
            return
        value = ELEMENTS_ARE.get(name)
        if value is None and isinstance(first, torch.Tensor) and first in self.known:
            if name in KEEP:
                value = self.known[first]
            elif name in NEGATE:
                value = not self.known[first]
        if value is not None:
            self.known[out] = value
