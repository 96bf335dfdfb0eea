"""The training settings the trace knows, without importing torch (the command line's parser and
`advisor --help` need them; torch takes seconds to import)."""

from __future__ import annotations

import importlib.metadata
import re

PRECISIONS = ("fp32", "tf32", "amp-fp16", "amp-bf16", "bf16", "fp16")

ADAFACTOR_SINCE = (2, 5)
"""torch.optim.Adafactor exists from torch 2.5."""


def torch_version() -> tuple[int, int]:
    """(major, minor) of the installed torch, read from its metadata; (0, 0) when unknown."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return (0, 0)
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "adam-fused", "adamw-fused") + (
    ("adafactor",) if torch_version() >= ADAFACTOR_SINCE else ())
"""Adafactor (torch >= 2.5) is the memory-light choice torch offers: factored second moments, no first.
The `-fused` Adams are `fused=True` (Hugging Face Trainer's and torchtitan's usual choice): one kernel
per parameter list, without the foreach form's full-size temporaries."""

FILE_OPTIMIZER = "file"
"""The optimizer the model file's `optimizer(params)` builds (PRODUCT.md's contract): the default when the
file defines one."""

OPTIMIZER_CHOICES = OPTIMIZERS + (FILE_OPTIMIZER,)
"""What --optimizer accepts."""

DEFAULT_OPTIMIZER = "adamw"
"""The optimizer when neither --optimizer nor the model file names one."""


def describe_optimizer(name: str, class_name: str = "") -> str:
    """How outputs name an optimizer: the model file's one by its class ("optimizer() of the model file:
    SGD"), the others by their name."""
    if name != FILE_OPTIMIZER:
        return name
    return f"optimizer() of the model file{f': {class_name}' if class_name else ''}"
