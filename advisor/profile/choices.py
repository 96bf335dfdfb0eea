"""The training settings the trace knows, without importing torch (the command line's parser and
`advisor --help` need them; torch takes seconds to import)."""

from __future__ import annotations

import importlib.metadata
import re

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    """What one --precision means, read in one place (issue #23: it was interpreted in five)."""

    name: str
    cast: str | None = None
    """Pure low precision: the whole model and its inputs are cast to this dtype ("bf16", "fp16")."""
    autocast: str | None = None
    """Automatic mixed precision: matmuls, convolutions and attention run in this dtype under autocast,
    weights stay fp32 ("bf16", "fp16")."""
    tf32: bool = False
    """fp32 matmuls run on TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32)."""
    float8: bool = False
    """Linear layers run as float8 training runs them (profile/float8.py: TransformerEngine's and torchao's
    Float8Linear), everything else under `autocast`."""
    master: bool = False
    """With `cast`: the optimizer keeps an fp32 master copy of every weight and its state in fp32, and writes
    each update back into the cast weight (profile/master_weights.py: Megatron-Core's --bf16, DeepSpeed's
    bf16 optimizer, apex O2)."""

    @property
    def matmul_dtype(self) -> str:
        """The dtype the step's (Linear layers') matrix products run in: fp8, autocast's or the cast dtype,
        TF32, else fp32."""
        return "fp8" if self.float8 else self.autocast or self.cast or ("tf32" if self.tf32 else "fp32")

    @property
    def grad_scaler(self) -> bool:
        """fp16 autocast scales the loss (torch.amp.GradScaler): bf16 has fp32's exponent range."""
        return self.autocast == "fp16"

    @property
    def weight_bytes(self) -> int:
        """Bytes of one stored weight (and gradient)."""
        return 2 if self.cast else 4

    @property
    def state_bytes(self) -> int:
        """Bytes of one optimizer state value: the stored weight's, fp32 under master weights."""
        return 4 if self.master else self.weight_bytes

    @property
    def low_precision_copy_bytes(self) -> int:
        """Bytes per weight of autocast's low-precision copy (0 without autocast). Under fp8 a Linear
        weight's copies are its float8 codes and their transpose: 2 bytes too."""
        return 2 if self.autocast else 0


PRECISION_TABLE = (
    Precision("fp32"),
    Precision("tf32", tf32=True),
    Precision("amp-fp16", autocast="fp16"),
    Precision("amp-bf16", autocast="bf16"),
    Precision("bf16", cast="bf16"),
    Precision("bf16-master", cast="bf16", master=True),
    Precision("fp16", cast="fp16"),
    Precision("fp8", autocast="bf16", float8=True),
    Precision("fp8-master", cast="bf16", float8=True, master=True),
)
PRECISION_BY_NAME = {p.name: p for p in PRECISION_TABLE}
PRECISIONS = tuple(PRECISION_BY_NAME)
"""The --precision choices: fp32 (strict), tf32, amp-fp16/amp-bf16 (autocast), bf16/fp16 (pure), bf16-master (pure
bf16 with fp32 master weights and optimizer state), fp8 (float8 Linear layers, bf16 autocast elsewhere; GPUs
with fp8 tensor cores only), fp8-master (float8 Linear layers in a bf16-master model: Megatron's fp8)."""


def precision_of(name: str) -> Precision:
    """The Precision called `name` (a name from PRECISIONS; callers check user input first)."""
    return PRECISION_BY_NAME[name]

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


OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "adam-fused", "adamw-fused", "adamw8bit") + (
    ("adafactor",) if torch_version() >= ADAFACTOR_SINCE else ())
"""Adafactor (torch >= 2.5) is the memory-light choice torch offers: factored second moments, no first.
The `-fused` Adams are `fused=True` (Hugging Face Trainer's and torchtitan's usual choice): one kernel
per parameter list, without the foreach form's full-size temporaries. `adamw8bit` is bitsandbytes'
AdamW8bit (Trainer's `adamw_bnb_8bit`): both moments in blockwise 8-bit codes, 2 bytes per parameter
instead of 8 (profile/quantized.py)."""

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


BASE_WEIGHTS = ("bf16", "nf4", "nf4-dq", "int8")
"""--base-weights: how a frozen base (LoRA's) is stored: bf16, or its Linear layers as bitsandbytes' 4-bit
NormalFloat (nf4; nf4-dq with double quantization, QLoRA's) or LLM.int8 codes (profile/quantized.py)."""

ALL_LINEAR = "all-linear"
"""--lora-targets value for every Linear layer but the output head (peft's "all-linear")."""

LANGUAGE_MODEL_PRECISION = "amp-bf16"
"""The precision when none is asked for and the model is a language model (it has a sequence length): how
LLMs are trained and fine-tuned (Hugging Face Trainer's bf16=True, torchtitan, Megatron: bf16 math, fp32
master weights and optimizer state)."""

DEFAULT_PRECISION = "fp32"
"""The precision when none is asked for, for other models."""

BF16_BASE_PRECISIONS = ("amp-bf16", "amp-fp16", "bf16", "bf16-master", "fp8", "fp8-master")
"""Precisions that compute in 16 bits, where frozen bf16 weights can be used (the others compute in fp32)."""

