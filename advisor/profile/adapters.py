"""LoRA adapters and frozen, possibly quantized, base weights: the parameter-efficient fine-tuning job
(`--lora RANK`, `--lora-targets`, `--base-weights`; issue #26).

LoRA (Hu et al. 2021) wraps chosen Linear layers: y = W x + B A x * alpha/r with A [r, in] and B [out, r]
trained and W frozen. The wrapper is the one peft's `LoraLayer` computes (its default dropout 0 makes the
dropout an identity; `--lora-dropout P` makes it a dropout of the cast input, its mask and output saved for the
backward, one per adapted layer as peft's are): the base layer, the input cast to the adapter's dtype, two
small matmuls, a scale and an add. Adapters are fp32 (peft upcasts them, `autocast_adapter_dtype`) except
under a pure low precision, where they take its dtype as the whole model does (LitGPT's bf16-true).

The frozen base (every parameter that is not an adapter) is stored as `--base-weights` says: bf16 (as
`from_pretrained(torch_dtype=torch.bfloat16)` loads it), or its Linear layers quantized (quantized.py:
nf4, nf4-dq, int8), the rest in bf16, the output head left as it is (transformers' bitsandbytes
integration keeps `lm_head` unquantized).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from advisor.errors import UserError, closest_matches
from advisor.profile.choices import ALL_LINEAR, BASE_WEIGHTS

DEFAULT_TARGETS = (("q_proj", "v_proj"), ("c_attn",), ("query", "value"), ("q", "v"), ("query_key_value",),
                   ("qkv_proj",), ("Wqkv",), ("qkv",))
"""Attention projections LoRA adapts when --lora-targets is not given, the first set the model has: peft's
defaults per architecture (Llama, Mistral, Qwen, Gemma, Phi: q_proj, v_proj; GPT-2: c_attn; BERT:
query, value; T5: q, v; GPT-NeoX, BLOOM: query_key_value; Phi-3: qkv_proj; MPT: Wqkv)."""


@dataclass(frozen=True)
class Adaptation:
    """How the model is fine-tuned: LoRA adapters of rank `lora_rank` on `lora_targets` (() : the
    architecture's default), the frozen base stored as `base_weights` (None: as the precision stores weights)."""

    lora_rank: int | None = None
    lora_targets: tuple[str, ...] = ()
    base_weights: str | None = None
    lora_dropout: float = 0.0
    """peft's lora_dropout: the probability each adapter drops an element of its input (0: no dropout)."""

    def __post_init__(self) -> None:
        assert self.base_weights is None or self.base_weights in BASE_WEIGHTS, self.base_weights
        assert 0.0 <= self.lora_dropout < 1.0, self.lora_dropout

    @property
    def dropout_phrase(self) -> str:
        """", dropout 0.05" after the adapters' description, "" without dropout."""
        return f", dropout {self.lora_dropout:g}" if self.lora_dropout else ""

    @property
    def active(self) -> bool:
        return self.lora_rank is not None or self.base_weights is not None


def is_linear(module: nn.Module) -> bool:
    """An nn.Linear, or transformers' Conv1D (GPT-2's Linear with a transposed weight)."""
    return isinstance(module, nn.Linear) or (type(module).__name__ == "Conv1D" and getattr(module, "weight", None)
                                              is not None and module.weight.dim() == 2)


def linear_features(module: nn.Module) -> tuple[int, int]:
    """(in_features, out_features) of a Linear or Conv1D."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    rows, cols = module.weight.shape
    return int(rows), int(cols)


LORA_ADAPTERS = ("lora_A", "lora_B")
"""Names of a LoRALinear's adapter layers."""


class LoRALinear(nn.Module):
    """A Linear (or Conv1D) with a LoRA adapter beside it, computed as peft's LoraLayer computes it."""

    def __init__(self, base: nn.Module, rank: int, dtype: torch.dtype, dropout: float = 0.0) -> None:
        super().__init__()
        in_features, out_features = linear_features(base)
        device = base.weight.device
        self.base_layer = base
        self.lora_A = nn.Linear(in_features, rank, bias=False, device=device, dtype=dtype)
        self.lora_B = nn.Linear(rank, out_features, bias=False, device=device, dtype=dtype)
        nn.init.zeros_(self.lora_B.weight)
        self.scaling = 2.0  # alpha / r with alpha = 2r, a usual choice; it does not change time or memory
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.base_layer(x)
        x = x.to(self.lora_A.weight.dtype)
        if self.dropout > 0 and self.training:  # peft's nn.Dropout as CUDA runs it: one kernel, a bool mask kept
            x, _ = torch.native_dropout(x, self.dropout, True)
        adapter = self.lora_B(self.lora_A(x)) * self.scaling
        return (result + adapter).to(result.dtype)


def adapt(model: nn.Module, adaptation: Adaptation, adapter_dtype: torch.dtype, frozen_dtype: torch.dtype | None,
          source: str | None) -> str:
    """Apply `adaptation` to `model` in place: LoRA wrappers on the targets (adapters in `adapter_dtype`), every
    other parameter frozen, the frozen base stored as asked: bf16, or its Linear layers quantized and the rest
    in `frozen_dtype` (None: as they are). Returns what was done, for the output."""
    done = []
    if adaptation.lora_rank is not None:
        targets = adaptation.lora_targets or default_targets(model, source)
        wrapped = _add_lora(model, adaptation.lora_rank, targets, adapter_dtype, source, adaptation.lora_dropout)
        done.append(f"LoRA r={adaptation.lora_rank} on {wrapped} layers ({', '.join(targets)})"
                    + adaptation.dropout_phrase)
    if adaptation.base_weights is not None:
        frozen = [p for p in model.parameters() if not p.requires_grad]
        if not frozen:
            raise UserError(f"--base-weights {adaptation.base_weights}: {source or 'the model'} has no frozen "
                            "weights; add --lora RANK (or freeze the base in the model file)")
        quantized = _quantize_frozen_linears(model, adaptation.base_weights)
        rest = torch.bfloat16 if adaptation.base_weights == "bf16" else frozen_dtype
        if rest is not None:
            _cast_frozen(model, rest)
        done.append(f"frozen base {adaptation.base_weights}"
                    + (f" ({quantized} Linear layers quantized)" if adaptation.base_weights != "bf16" else ""))
    return "; ".join(done)


def default_targets(model: nn.Module, source: str | None) -> tuple[str, ...]:
    """The first of DEFAULT_TARGETS whose every name is a Linear layer of `model`."""
    names = linear_names(model)
    for candidate in DEFAULT_TARGETS:
        if set(candidate) <= names:
            return candidate
    raise UserError(f"--lora: {source or 'the model'} has none of the usual attention projections; name the layers "
                    f"with --lora-targets (its Linear layers: {', '.join(sorted(names)[:12])}) or {ALL_LINEAR}")


def linear_names(model: nn.Module) -> set[str]:
    """The last parts of the names of the model's Linear layers (what --lora-targets matches)."""
    return {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if name and is_linear(module)}


def output_heads(model: nn.Module) -> set[int]:
    """ids of the modules that produce the vocabulary's logits: transformers' output embeddings, a Linear
    named lm_head, or one whose weight is an embedding's (tied)."""
    heads = set()
    getter = getattr(model, "get_output_embeddings", None)
    if callable(getter):
        head = getter()
        if isinstance(head, nn.Module):
            heads.add(id(head))
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for name, module in model.named_modules():
        if is_linear(module) and (name.rsplit(".", 1)[-1] == "lm_head" or id(module.weight) in embeddings):
            heads.add(id(module))
    return heads


def _matches(name: str, targets: tuple[str, ...]) -> bool:
    """peft's rule: a target matches a module whose full name is it or ends with "." + it."""
    return any(name == target or name.endswith("." + target) for target in targets)


def _add_lora(model: nn.Module, rank: int, targets: tuple[str, ...], dtype: torch.dtype, source: str | None,
              dropout: float = 0.0) -> int:
    heads = output_heads(model)
    chosen = [(name, module) for name, module in model.named_modules()
              if name and is_linear(module) and not isinstance(module, LoRALinear)
              and (_matches(name, targets) if targets != (ALL_LINEAR,) else id(module) not in heads)]
    if not chosen:
        names = linear_names(model)
        suggestions = [s for t in targets for s in closest_matches(t, names)]
        hint = f" (did you mean {', '.join(dict.fromkeys(suggestions))}?)" if suggestions else \
            f" (its Linear layers: {', '.join(sorted(names)[:12])})"
        raise UserError(f"--lora-targets {','.join(targets)}: no Linear layer of {source or 'the model'} "
                        f"has that name{hint}")
    for param in model.parameters():
        param.requires_grad_(False)
    for name, module in chosen:
        replace_module(model, name, LoRALinear(module, rank, dtype, dropout))
    return len(chosen)


def replace_module(model: nn.Module, name: str, replacement: nn.Module) -> None:
    """Put `replacement` where the submodule called `name` ("layers.0.q_proj") is."""
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, replacement)


def _quantize_frozen_linears(model: nn.Module, form: str) -> int:
    """Replace every frozen Linear but the output head with a FrozenQuantizedLinear of `form`; bf16 quantizes
    nothing. Returns how many were replaced."""
    if form == "bf16":
        return 0
    from advisor.profile.quantized import FrozenQuantizedLinear  # its custom ops registered when first asked for

    heads = output_heads(model)
    chosen = [(name, module) for name, module in model.named_modules()
              if name and is_linear(module) and id(module) not in heads and not module.weight.requires_grad]
    for name, module in chosen:
        in_features, out_features = linear_features(module)
        replace_module(model, name, FrozenQuantizedLinear(in_features, out_features, module.bias, form,
                                                           module.weight.device))
    return len(chosen)


def _cast_frozen(model: nn.Module, dtype: torch.dtype) -> None:
    """Frozen floating-point parameters to `dtype` in place (each shared one once; see trace's
    _convert_floating_point for why in place)."""
    for param in model.parameters():
        if not param.requires_grad and param.is_floating_point() and param.dtype != dtype:
            param.data = param.detach().to(dtype)
