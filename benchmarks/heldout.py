"""Models from outside this repository, built from their libraries' code and configs (no downloads), to
check the CPU time model on what users bring (issue #20): torchvision, timm, Hugging Face
transformers, and a wide MLP. Each is a (build, make_input, loss_fn) triple like benchmarks/zoo.py's,
with a batch size that keeps one CPU step under about a second, and an optimizer.

A library that does not import here (torchvision has no CPU build for every torch; timm needs it) leaves
its models out: `available()` lists those that build.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


def _classification(output: Any, inputs: Any) -> torch.Tensor:
    logits = output.logits if hasattr(output, "logits") else output
    return nn.functional.cross_entropy(logits.float(), torch.zeros(logits.shape[0], dtype=torch.long))


def _language_model(output: Any, inputs: Any) -> torch.Tensor:
    return output.loss


def _images(size: int) -> Callable[[int], torch.Tensor]:
    return lambda batch: torch.randn(batch, 3, size, size)


def _tokens(seq: int, vocab: int, labels: bool) -> Callable[[int], dict[str, torch.Tensor]]:
    def make(batch: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
        return {"input_ids": ids, "labels": ids} if labels else {"input_ids": ids}
    return make


def _torchvision(name: str, **kwargs: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision
        return getattr(torchvision.models, name)(**kwargs)
    return build


def _timm(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm
        return timm.create_model(name, pretrained=False)
    return build


def _bert_mini() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification
    config = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                        num_labels=2)
    return BertForSequenceClassification(config)


def _gpt_small() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=384, n_head=6, vocab_size=50257, n_positions=512))


def _wide_mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(),
                         nn.Linear(4096, 10))


@dataclass(frozen=True)
class HeldOut:
    label: str
    library: str
    """The module that must import for it to build ("torch" always does)."""
    build: Callable[[], nn.Module]
    make_input: Callable[[int], Any]
    loss_fn: Callable[[Any, Any], torch.Tensor]
    batch: int
    optimizer: str

    def parts(self) -> tuple[Callable[[], nn.Module], Callable[[int], Any], Callable[[Any, Any], torch.Tensor]]:
        return self.build, self.make_input, self.loss_fn


HELDOUT: dict[str, HeldOut] = {
    "tv_resnet18": HeldOut("torchvision resnet18 224px", "torchvision", _torchvision("resnet18"), _images(224),
                           _classification, 8, "momentum"),
    "tv_mobilenet_v3_small": HeldOut("torchvision mobilenet_v3_small 224px", "torchvision",
                                     _torchvision("mobilenet_v3_small"), _images(224), _classification, 16, "adam"),
    "timm_vit_tiny": HeldOut("timm vit_tiny_patch16_224", "timm", _timm("vit_tiny_patch16_224"), _images(224),
                             _classification, 8, "adamw"),
    "timm_convnext_atto": HeldOut("timm convnext_atto 224px", "timm", _timm("convnext_atto"), _images(224),
                                  _classification, 8, "adamw"),
    "hf_bert_mini": HeldOut("transformers BERT 4x256 seq128", "transformers", _bert_mini,
                            _tokens(128, 30522, False), _classification, 8, "adamw"),
    "hf_gpt_small": HeldOut("transformers GPT-2 4x384 seq128", "transformers", _gpt_small,
                            _tokens(128, 50257, True), _language_model, 2, "adamw"),
    "wide_mlp": HeldOut("MLP 3072-4096-4096-10 (GELU)", "torch", _wide_mlp, _images(32), _classification, 128, "sgd"),
}


def _imports(library: str) -> bool:
    if importlib.util.find_spec(library) is None:
        return False
    try:
        importlib.import_module(library)
    except Exception:  # noqa: BLE001 - a broken install (torchvision built for another torch) leaves it out
        return False
    return True


def available() -> list[str]:
    """The held-out models whose library imports here."""
    libraries = {model.library for model in HELDOUT.values()}
    ok = {library: _imports(library) for library in libraries}
    return [name for name, model in HELDOUT.items() if ok[model.library]]


def model_parts(name: str) -> tuple[Callable[[], nn.Module], Callable[[int], Any], Callable[[Any, Any], torch.Tensor],
                                     int, str]:
    """(build, make_input, loss_fn, batch, optimizer) of a held-out model, or of "mlp_example" (the
    repository's examples/mlp.py at batch 64 with AdamW)."""
    if name == "mlp_example":
        from zoo import example
        build, make_input, loss_fn = example("mlp")
        return build, make_input, loss_fn, 64, "adamw"
    model = HELDOUT[name]
    return model.build, model.make_input, model.loss_fn, model.batch, model.optimizer
