"""Coverage of the tracer over off-the-shelf models: which ones trace, and how right the trace is.

Each model of ZOO (transformers, timm, torchvision, diffusers, peft and plain torch; built from its
library's constructors and config objects, no weights, nothing downloaded) runs in its own process
(this script again, `--one NAME`), under a wall-clock timeout and a cap on its address space, and
reports one JSON line per stage:

1. library: the library's own trainable parameter count (tied parameters once, as `.parameters()`
   gives them), from a build on the meta device (`with torch.device("meta")`), and again from a
   real CPU build when the model has under REAL_BUILD_LIMIT parameters (or the meta build fails).
2. trace: `trace_training_step` (fp32, AdamW unless the entry says otherwise): ok, a user error (the
   one sentence the command line would print) or an internal error (exception type, first line and
   the innermost frame under advisor/); seconds; the child's peak RSS after it; how the model was
   built (construction) and fed (values); parameters; ops without a cost formula.
3. reference FLOPs: torch.utils.flop_counter.FlopCounterMode over one forward (train mode, autograd
   on) of the same model, on the meta device, or on real CPU tensors when the meta run fails and the
   model is small enough. FlopCounterMode counts matrix products, convolutions and attention only,
   so it is compared with the trace's matmul-class forward FLOPs (the model's forward, the loss left
   out); op by op, the report names what either side counts and the other does not.
4. real memory: for models under REAL_STEP_LIMIT parameters, one real CPU training step (forward,
   loss, backward, AdamW step, zero_grad; the optimizer state made beforehand, as the trace does)
   with every storage an op outputs counted live until its weak-reference finalizer runs (the idea
   of advisor/profile/live_memory.py, written again here so that it is an independent check), plus
   the weights, buffers, optimizer state and inputs alive before it; its peak against the trace's
   `memory.peak()`.

A stage that fails or runs out of time does not hide the stages before it: the parent keeps every
line the child printed.

    python benchmarks/zoo_coverage.py [--models a,b] [--timeout S] [--out PATH]
        [--memory-gib G] [--list]

Writes the table and summary to --out (default benchmarks/results/zoo_coverage.txt) and every
figure to the same path with .json. The header names the commit and whether advisor/ had uncommitted
changes. To measure one revision while advisor/ is being edited, run a copy of this file from a
`git worktree` of that revision with PYTHONPATH set to the worktree (its advisor/ is then imported
instead of the editable install's).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import platform
import resource
import subprocess
import sys
import time
import traceback
import weakref
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ADVISOR_DIR = str(REPO / "advisor") + os.sep
DEFAULT_OUT = HERE / "results" / "zoo_coverage.txt"
MARK = "ZOO-STAGE "
"""Prefix of the child's JSON lines on stdout (libraries print there too)."""

REAL_BUILD_LIMIT = 1.5e9
"""Models with fewer parameters are also built for real on the CPU (count, reference FLOPs, memory)."""
REAL_STEP_LIMIT = 40e6
"""Models with fewer parameters get a real CPU training step for the memory check."""
DEFAULT_TIMEOUT_S = 300
DEFAULT_MEMORY_GIB = 16
LIBRARIES = ("torch", "torchvision", "timm", "transformers", "diffusers", "peft")


# ============================================================================= inputs and losses


def _ids(batch: int, seq: int, vocab: int, low: int = 0) -> torch.Tensor:
    return torch.randint(low, vocab, (batch, seq))


def lm_tokens(seq: int, vocab: int, mask: bool = False) -> Callable[[int], dict[str, torch.Tensor]]:
    """Token ids and the same ids as labels (causal or masked LM loss computed by the model), and an
    all-ones attention mask when `mask`."""
    def make(batch: int) -> dict[str, torch.Tensor]:
        ids = _ids(batch, seq, vocab, low=3)
        return {"input_ids": ids, "labels": ids} | ({"attention_mask": torch.ones_like(ids)} if mask else {})
    return make


def classified_tokens(seq: int, vocab: int) -> Callable[[int], dict[str, torch.Tensor]]:
    def make(batch: int) -> dict[str, torch.Tensor]:
        return {"input_ids": _ids(batch, seq, vocab, low=3), "labels": torch.zeros(batch, dtype=torch.long)}
    return make


def seq2seq_tokens(source: int, target: int, vocab: int) -> Callable[[int], dict[str, torch.Tensor]]:
    def make(batch: int) -> dict[str, torch.Tensor]:
        return {"input_ids": _ids(batch, source, vocab, low=3), "labels": _ids(batch, target, vocab, low=3)}
    return make


def images(size: int) -> Callable[[int], torch.Tensor]:
    return lambda batch: torch.randn(batch, 3, size, size)


def labelled_images(size: int) -> Callable[[int], dict[str, torch.Tensor]]:
    """Hugging Face image classifiers: pixel_values and class labels (the model computes the loss)."""
    def make(batch: int) -> dict[str, torch.Tensor]:
        return {"pixel_values": torch.randn(batch, 3, size, size), "labels": torch.zeros(batch, dtype=torch.long)}
    return make


def model_loss(output: Any, inputs: Any) -> torch.Tensor:
    """The loss the model computed from the labels among its inputs."""
    return output.loss


def classification_loss(output: Any, inputs: Any) -> torch.Tensor:
    logits = output.logits if hasattr(output, "logits") else output
    return F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long))


def sum_of_losses(output: dict[str, torch.Tensor], inputs: Any) -> torch.Tensor:
    """torchvision detection models in train mode return a dict of losses."""
    return sum(output.values())


def inception_loss(output: Any, inputs: Any) -> torch.Tensor:
    """Inception v3 in train mode: main and auxiliary logits (torchvision weighs the aux 0.4)."""
    target = torch.zeros(output.logits.shape[0], dtype=torch.long)
    return F.cross_entropy(output.logits, target) + 0.4 * F.cross_entropy(output.aux_logits, target)


def segmentation_loss(output: dict[str, torch.Tensor], inputs: Any) -> torch.Tensor:
    logits = output["out"]
    return F.cross_entropy(logits, torch.zeros(logits.shape[0], *logits.shape[2:], dtype=torch.long))


def sample_loss(output: Any, inputs: Any) -> torch.Tensor:
    """Diffusers models: the mean square of the predicted sample (noise-prediction MSE against zero)."""
    sample = output.sample if hasattr(output, "sample") else output[0]
    return sample.float().pow(2).mean()


def binary_loss(output: torch.Tensor, inputs: Any) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(output, torch.zeros_like(output))


def depth_loss(output: Any, inputs: Any) -> torch.Tensor:
    """Depth estimation: L1 of the predicted depth map against zero."""
    return output.predicted_depth.abs().mean()


def reconstruction_loss(output: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Autoencoders: the mean square error of the reconstruction against the input image."""
    return (output.sample - inputs["sample"]).pow(2).mean()


def flow_loss(output: list[torch.Tensor], inputs: Any) -> torch.Tensor:
    """RAFT's sequence loss: L1 of every flow update against zero flow, weighted 0.8 ** (updates left)."""
    return sum(0.8 ** (len(output) - i - 1) * flow.abs().mean() for i, flow in enumerate(output))


# ============================================================================= builders


def hf(config_class: str, model_class: str, **config: Any) -> Callable[[], nn.Module]:
    """A transformers model from its config class (no download: the config is made here)."""
    def build() -> nn.Module:
        import transformers
        return getattr(transformers, model_class)(getattr(transformers, config_class)(**config))
    return build


def torchvision_model(name: str, module: str = "", **kwargs: Any) -> Callable[[], nn.Module]:
    """torchvision.models[.module].name(weights=None, ...): no weights, and none for backbones either."""
    def build() -> nn.Module:
        import importlib
        place = importlib.import_module("torchvision.models" + (f".{module}" if module else ""))
        return getattr(place, name)(weights=None, **kwargs)
    return build


def timm_model(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm
        return timm.create_model(name, pretrained=False)
    return build


def lora(base: Callable[[], nn.Module], targets: list[str]) -> Callable[[], nn.Module]:
    """peft's LoRA (r=8, alpha 16, dropout 0.05) on `targets` of the base model: only the adapters train."""
    def build() -> nn.Module:
        from peft import LoraConfig, get_peft_model
        config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=targets, task_type="CAUSAL_LM")
        return get_peft_model(base(), config)
    return build


def adapter(base: Callable[[], nn.Module], config_class: str, **config: Any) -> Callable[[], nn.Module]:
    """peft's `config_class` (LoraConfig, IA3Config, PrefixTuningConfig) with `config` on a base causal LM."""
    def build() -> nn.Module:
        import peft
        return peft.get_peft_model(base(), getattr(peft, config_class)(task_type="CAUSAL_LM", **config))
    return build


def diffusers_model(model_class: str, **arguments: Any) -> Callable[[], nn.Module]:
    """A diffusers model from its constructor's arguments (no download)."""
    def build() -> nn.Module:
        import diffusers
        return getattr(diffusers, model_class)(**arguments)
    return build


def detr_input(size: int) -> Callable[[int], dict[str, Any]]:
    def make(batch: int) -> dict[str, Any]:
        boxes = torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.6, 0.5, 0.3, 0.4]])  # normalised cx, cy, w, h
        labels = [{"class_labels": torch.tensor([1, 7]), "boxes": boxes.clone()} for _ in range(batch)]
        return {"pixel_values": torch.randn(batch, 3, size, size), "labels": labels}
    return make


def clip_input(batch: int) -> dict[str, Any]:
    return {"input_ids": _ids(batch, 77, 49408, low=3), "pixel_values": torch.randn(batch, 3, 224, 224),
            "return_loss": True}


def whisper_input(batch: int) -> dict[str, torch.Tensor]:
    return {"input_features": torch.randn(batch, 80, 3000), "labels": _ids(batch, 64, 51865)}


def siglip_input(batch: int) -> dict[str, Any]:
    return {"input_ids": _ids(batch, 64, 32000, low=3), "pixel_values": torch.randn(batch, 3, 224, 224),
            "return_loss": True}


def blip_input(batch: int) -> dict[str, torch.Tensor]:
    """A 384 px image and a 32-token caption (also the labels)."""
    ids = _ids(batch, 32, 30524, low=3)
    return {"pixel_values": torch.randn(batch, 3, 384, 384), "input_ids": ids, "labels": ids}


def esm_input(batch: int) -> dict[str, torch.Tensor]:
    """1024 residues (amino-acid token ids 4..23), all attended, as their own MLM labels."""
    ids = torch.randint(4, 24, (batch, 1024))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def longformer_input(batch: int) -> dict[str, torch.Tensor]:
    """4096 tokens, global attention on the first one, the tokens as MLM labels."""
    ids = _ids(batch, 4096, 50265, low=3)
    global_mask = torch.zeros(batch, 4096, dtype=torch.long)
    global_mask[:, 0] = 1
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "global_attention_mask": global_mask,
            "labels": ids}


def layoutlmv3_input(batch: int) -> dict[str, torch.Tensor]:
    """512 tokens with a 50x20 box each on a 1000-unit page, a 224 px page image, 7 token labels."""
    corner = torch.randint(0, 900, (batch, 512, 2))
    return {"input_ids": _ids(batch, 512, 50265, low=3),
            "bbox": torch.cat([corner, corner + torch.tensor([50, 20])], -1),
            "attention_mask": torch.ones(batch, 512, dtype=torch.long),
            "pixel_values": torch.randn(batch, 3, 224, 224), "labels": torch.randint(0, 7, (batch, 512))}


LLAVA_IMAGE_TOKEN = 32000


def llava_input(batch: int) -> dict[str, torch.Tensor]:
    """A 336 px image as 576 image tokens after 8 text tokens, 120 more text tokens; loss on the text after it."""
    text = torch.randint(3, 31999, (batch, 128))
    ids = torch.cat([text[:, :8], torch.full((batch, 576), LLAVA_IMAGE_TOKEN), text[:, 8:]], 1)
    labels = ids.clone()
    labels[:, :584] = -100
    return {"input_ids": ids, "pixel_values": torch.randn(batch, 3, 336, 336), "labels": labels}


def mask2former_input(batch: int) -> dict[str, Any]:
    """384 px images with three instance masks and classes each (matched to the queries by the model)."""
    masks = torch.zeros(3, 384, 384)
    masks[0, :100, :100] = 1
    masks[1, 100:300, 50:200] = 1
    masks[2, 200:, 200:] = 1
    return {"pixel_values": torch.randn(batch, 3, 384, 384),
            "pixel_mask": torch.ones(batch, 384, 384, dtype=torch.long),
            "mask_labels": [masks.clone() for _ in range(batch)],
            "class_labels": [torch.tensor([1, 5, 20]) for _ in range(batch)]}


def wav2vec2_input(batch: int) -> dict[str, torch.Tensor]:
    """Two seconds of 16 kHz audio and 20 CTC labels (1..31; 0 is the pad/blank) per sample."""
    return {"input_values": torch.randn(batch, 32000), "labels": torch.randint(1, 32, (batch, 20))}


def segformer_input(batch: int) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(batch, 3, 512, 512), "labels": torch.zeros(batch, 512, 512, dtype=torch.long)}


def detection_input(with_masks: bool) -> Callable[[int], tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]]:
    """torchvision detection in train mode: a list of 480x640 images and one target dict each (two
    boxes, labels, and instance masks for Mask R-CNN)."""
    def make(batch: int) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
        images_ = [torch.rand(3, 480, 640) for _ in range(batch)]
        targets = []
        for _ in range(batch):
            target = {"boxes": torch.tensor([[40.0, 60.0, 200.0, 220.0], [300.0, 100.0, 460.0, 400.0]]),
                      "labels": torch.tensor([1, 7])}
            if with_masks:
                masks = torch.zeros(2, 480, 640, dtype=torch.uint8)
                masks[0, 60:220, 40:200] = 1
                masks[1, 100:400, 300:460] = 1
                target["masks"] = masks
            targets.append(target)
        return images_, targets
    return make


def keypoint_input(batch: int) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    """Keypoint R-CNN in train mode: 480x640 images, two people each with a box and 17 visible keypoints."""
    images_, targets = [], []
    for _ in range(batch):
        images_.append(torch.rand(3, 480, 640))
        keypoints = torch.rand(2, 17, 3) * torch.tensor([150.0, 300.0, 0.0]) + torch.tensor([50.0, 60.0, 2.0])
        keypoints[1, :, 0] += 250
        targets.append({"boxes": torch.tensor([[40.0, 60.0, 200.0, 360.0], [300.0, 60.0, 460.0, 360.0]]),
                        "labels": torch.tensor([1, 1]), "keypoints": keypoints})
    return images_, targets


# ---- diffusers


def sd_unet(small: bool) -> Callable[[], nn.Module]:
    """Stable Diffusion 1.x's UNet2DConditionModel (diffusers' defaults, text width 768), or a small
    SD-like one: two levels of 32 and 64 channels, one cross-attention level, text width 64."""
    def build() -> nn.Module:
        from diffusers import UNet2DConditionModel
        if not small:
            return UNet2DConditionModel(sample_size=64, cross_attention_dim=768)
        return UNet2DConditionModel(sample_size=32, block_out_channels=(32, 64), layers_per_block=1,
                                    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=64,
                                    attention_head_dim=8, norm_num_groups=16)
    return build


def unet_input(latent: int, text_width: int) -> Callable[[int], dict[str, torch.Tensor]]:
    def make(batch: int) -> dict[str, torch.Tensor]:
        return {"sample": torch.randn(batch, 4, latent, latent), "timestep": torch.full((batch,), 500),
                "encoder_hidden_states": torch.randn(batch, 77, text_width)}
    return make


def sd_vae() -> nn.Module:
    """Stable Diffusion's AutoencoderKL (4 levels of 128..512 channels, 4 latent channels)."""
    from diffusers import AutoencoderKL
    return AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2,
                         block_out_channels=(128, 256, 512, 512), sample_size=512,
                         down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4)


def vae_input(batch: int) -> dict[str, torch.Tensor]:
    return {"sample": torch.randn(batch, 3, 256, 256)}


def dit_s2() -> nn.Module:
    """DiT-S/2 (12 layers, 6 heads of 64, patch 2) on 32x32x4 latents, class-conditional."""
    from diffusers import DiTTransformer2DModel
    return DiTTransformer2DModel(num_attention_heads=6, attention_head_dim=64, in_channels=4, out_channels=8,
                                 num_layers=12, sample_size=32, patch_size=2, num_embeds_ada_norm=1000)


def dit_input(batch: int) -> dict[str, torch.Tensor]:
    return {"hidden_states": torch.randn(batch, 4, 32, 32), "timestep": torch.full((batch,), 500),
            "class_labels": torch.zeros(batch, dtype=torch.long)}


def flux_input(batch: int) -> dict[str, torch.Tensor]:
    """Flux: 1024 packed latent tokens (a 32x32 grid, 512 px) with their position ids, 256 T5 tokens, a
    pooled CLIP vector, timestep and guidance."""
    image_ids = torch.zeros(32, 32, 3)
    image_ids[..., 1] = torch.arange(32)[:, None]
    image_ids[..., 2] = torch.arange(32)[None, :]
    return {"hidden_states": torch.randn(batch, 1024, 64), "encoder_hidden_states": torch.randn(batch, 256, 4096),
            "pooled_projections": torch.randn(batch, 768), "timestep": torch.full((batch,), 0.5),
            "img_ids": image_ids.reshape(-1, 3), "txt_ids": torch.zeros(256, 3), "guidance": torch.full((batch,), 3.5)}


def sd3_input(batch: int) -> dict[str, torch.Tensor]:
    return {"hidden_states": torch.randn(batch, 16, 128, 128), "encoder_hidden_states": torch.randn(batch, 154, 4096),
            "pooled_projections": torch.randn(batch, 2048), "timestep": torch.full((batch,), 500)}


def sdxl_unet_input(batch: int) -> dict[str, Any]:
    """SDXL: 128x128 latents, 77 tokens of 2048, and the pooled text embedding and size/crop ids."""
    return {**unet_input(128, 2048)(batch),
            "added_cond_kwargs": {"text_embeds": torch.randn(batch, 1280), "time_ids": torch.randn(batch, 6)}}


# ---- plain torch


class LSTMLanguageModel(nn.Module):
    """Embedding, a 2-layer LSTM and a tied-size output layer (the classic word-level LM)."""

    def __init__(self, vocab: int = 10000, width: int = 512) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, num_layers=2, batch_first=True, dropout=0.2)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embed(ids))[0])


def lstm_loss(output: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output.flatten(0, 1), inputs.flatten())


class GRUClassifier(nn.Module):
    """A bidirectional 2-layer GRU over 80-bin filterbank frames, mean-pooled into 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(80, 256, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(512, 10)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.head(self.gru(frames)[0].mean(1))


class Seq2SeqTransformer(nn.Module):
    """torch.nn.Transformer at the paper's base size (6+6 layers, 512 wide, 8 heads) with embeddings
    and an output layer over a 16k vocabulary."""

    def __init__(self, vocab: int = 16000, width: int = 512) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.transformer = nn.Transformer(width, 8, 6, 6, 2048, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(target.shape[1])
        return self.head(self.transformer(self.embed(source), self.embed(target), tgt_mask=mask, tgt_is_causal=True))


def seq2seq_loss(output: torch.Tensor, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(output.flatten(0, 1), inputs[1].flatten())


class DLRM(nn.Module):
    """DLRM-style recommender: 13 dense features through a bottom MLP, 8 categorical features through
    EmbeddingBag tables (sum of 4 ids each), pairwise dot-product interactions, a top MLP, one logit."""

    def __init__(self, sparse: bool, tables: int = 8, rows: int = 50000, width: int = 32) -> None:
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(13, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                                    nn.Linear(256, width), nn.ReLU())
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, width, mode="sum", sparse=sparse) for _ in range(tables))
        pairs = (tables + 1) * tables // 2
        self.top = nn.Sequential(nn.Linear(width + pairs, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                                 nn.Linear(256, 1))

    def forward(self, dense: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        features = torch.stack([x] + [table(categorical[:, i]) for i, table in enumerate(self.tables)], 1)
        products = features @ features.transpose(1, 2)
        rows, cols = torch.triu_indices(features.shape[1], features.shape[1], 1)
        return self.top(torch.cat([x, products[:, rows, cols]], 1)).squeeze(1)


def dlrm_input(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, 13), torch.randint(0, 50000, (batch, 8, 4))


class CTCSpeechModel(nn.Module):
    """A DeepSpeech-like acoustic model: two strided 1-D convolutions over 80-bin features, a 3-layer
    bidirectional LSTM, and per-frame log-probabilities over 29 characters for CTC."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(80, 256, 5, stride=2, padding=2), nn.GELU(),
                                  nn.Conv1d(256, 256, 5, stride=2, padding=2), nn.GELU())
        self.lstm = nn.LSTM(256, 256, num_layers=3, batch_first=True, bidirectional=True)
        self.head = nn.Linear(512, 29)

    def forward(self, features: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        x = self.conv(features).transpose(1, 2)
        return self.head(self.lstm(x)[0]).log_softmax(-1)


def ctc_input(batch: int) -> dict[str, torch.Tensor]:
    return {"features": torch.randn(batch, 80, 400), "targets": torch.randint(1, 29, (batch, 30))}


def ctc_loss(output: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    batch, frames = output.shape[:2]
    targets = inputs["targets"]
    return F.ctc_loss(output.transpose(0, 1), targets, torch.full((batch,), frames, dtype=torch.long),
                      torch.full((batch,), targets.shape[1], dtype=torch.long))


# ============================================================================= the zoo


@dataclass(frozen=True)
class ZooModel:
    library: str
    family: str
    what: str
    """The architecture and size: "real" sizes say so; reduced configs say what was reduced."""
    build: Callable[[], nn.Module]
    make_input: Callable[[int], Any]
    loss_fn: Callable[[Any, Any], torch.Tensor] | None
    batch: int
    optimizer: str = "adamw"


def _llm(config: str, model: str, what: str, seq: int, vocab: int, batch: int = 1, family: str = "decoder LLM",
         **config_values: Any) -> ZooModel:
    return ZooModel("transformers", family, what, hf(config, model, vocab_size=vocab, **config_values),
                    lm_tokens(seq, vocab), model_loss, batch)


LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, max_position_embeddings=8192,
                 rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
TINYLLAMA = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                 num_key_value_heads=4)

ZOO: dict[str, ZooModel] = {
    # ---------------------------------------------------------------- transformers: decoders
    "hf_llama3_8b": _llm("LlamaConfig", "LlamaForCausalLM", "Llama-3-8B, real size (32 x 4096, GQA 8), seq 512",
                         512, 128256, **LLAMA3_8B),
    "hf_mistral_7b": _llm("MistralConfig", "MistralForCausalLM",
                          "Mistral-7B v0.1, real size (config defaults), seq 512",
                          512, 32000),
    "hf_qwen2_0_5b": _llm("Qwen2Config", "Qwen2ForCausalLM", "Qwen2-0.5B, real size (24 x 896, tied), seq 512",
                          512, 151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                          num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "hf_gemma_2b": _llm("GemmaConfig", "GemmaForCausalLM", "Gemma-2B, real size (18 x 2048, MQA, head 256), seq 512",
                        512, 256000, hidden_size=2048, intermediate_size=16384, num_hidden_layers=18,
                        num_attention_heads=8, num_key_value_heads=1, head_dim=256),
    "hf_phi_1_5": _llm("PhiConfig", "PhiForCausalLM", "Phi-1.5, real size (config defaults: 24 x 2048), seq 512",
                       512, 51200),
    "hf_qwen3_0_6b": _llm("Qwen3Config", "Qwen3ForCausalLM",
                          "Qwen3-0.6B, real size (28 x 1024, q/k norms, tied), seq 512", 512, 151936,
                          hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                          num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "hf_gpt2": _llm("GPT2Config", "GPT2LMHeadModel", "GPT-2 small, real size (12 x 768, tied), seq 512", 512, 50257,
                    batch=2),
    "hf_gpt_neox_160m": _llm("GPTNeoXConfig", "GPTNeoXForCausalLM", "Pythia-160M, real size (12 x 768), seq 512",
                             512, 50304, batch=2, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                             intermediate_size=3072),
    "hf_opt_125m": _llm("OPTConfig", "OPTForCausalLM", "OPT-125M, real size (config defaults), seq 512", 512, 50272,
                        batch=2),
    "hf_mamba_130m": _llm("MambaConfig", "MambaForCausalLM",
                          "Mamba-130M, real size (24 x 768; torch's sequential scan, no CUDA kernels), seq 128",
                          128, 50280, batch=2, family="state space", hidden_size=768, num_hidden_layers=24),
    "hf_gemma3_1b": _llm("Gemma3TextConfig", "Gemma3ForCausalLM",
                         "Gemma-3-1B, real size (26 x 1152, MQA, head 256, sliding window 512, tied), seq 512",
                         512, 262144, batch=2, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                         max_position_embeddings=32768, tie_word_embeddings=True),
    "hf_phi3_mini": _llm("Phi3Config", "Phi3ForCausalLM", "Phi-3-mini-4k, real size (32 x 3072, fused qkv), seq 1024",
                         1024, 32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                         pad_token_id=32000),
    "hf_smollm2_135m": _llm("LlamaConfig", "LlamaForCausalLM",
                            "SmolLM2-135M, real size (30 x 576, GQA 3, tied), seq 1024",
                            1024, 49152, batch=8, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                            num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                            max_position_embeddings=8192),
    "hf_falcon_rw_1b": _llm("FalconConfig", "FalconForCausalLM",
                            "Falcon-RW-1B, real size (24 x 2048, ALiBi, no GQA), seq 1024", 1024, 50304, batch=2,
                            hidden_size=2048, num_hidden_layers=24, num_attention_heads=32, alibi=True, bias=True,
                            multi_query=False, new_decoder_architecture=False, parallel_attn=False),
    "hf_falcon_7b_4l": _llm("FalconConfig", "FalconForCausalLM",
                            "Falcon-7B reduced to 4 of 32 layers (real width 4544, MQA, parallel attention), seq 1024",
                            1024, 65024, hidden_size=4544, num_hidden_layers=4, num_attention_heads=71,
                            multi_query=True, parallel_attn=True, bias=False, alibi=False,
                            new_decoder_architecture=False),
    "hf_stablelm2_1_6b": _llm("StableLmConfig", "StableLmForCausalLM",
                              "StableLM-2-1.6B, real size (24 x 2048, partial rotary 0.25, qkv bias), seq 1024",
                              1024, 100352, batch=2, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                              num_attention_heads=32, num_key_value_heads=32, partial_rotary_factor=0.25,
                              use_qkv_bias=True, layer_norm_eps=1e-5, max_position_embeddings=4096),
    "hf_olmo2_1b": _llm("Olmo2Config", "Olmo2ForCausalLM",
                        "OLMo-2-0425-1B, real size (16 x 2048, QK norm, post-norm), seq 1024", 1024, 100352, batch=2,
                        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=16,
                        num_key_value_heads=16, max_position_embeddings=4096),
    "hf_granite3_2b": _llm("GraniteConfig", "GraniteForCausalLM",
                           "Granite-3.0-2B, real size (40 x 2048, GQA 8, muP multipliers, tied), seq 1024",
                           1024, 49155, batch=2, hidden_size=2048, intermediate_size=8192, num_hidden_layers=40,
                           num_attention_heads=32, num_key_value_heads=8, embedding_multiplier=12.0,
                           residual_multiplier=0.22, attention_multiplier=0.015625, logits_scaling=8.0,
                           tie_word_embeddings=True),
    "hf_cohere_cmdr_2l": _llm("CohereConfig", "CohereForCausalLM",
                              "Command-R (35B) reduced to 2 of 40 layers (real width 8192, parallel block, logit "
                              "scale, tied 256k vocab), seq 512", 512, 256000, hidden_size=8192,
                              intermediate_size=22528, num_hidden_layers=2, num_attention_heads=64,
                              num_key_value_heads=64, logit_scale=0.0625, tie_word_embeddings=True),
    "hf_smollm3_3b": _llm("SmolLM3Config", "SmolLM3ForCausalLM",
                          "SmolLM3-3B, real size (36 x 2048, GQA 4, NoPE every 4th layer, tied), seq 1024",
                          1024, 128256, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                          num_attention_heads=16, num_key_value_heads=4, tie_word_embeddings=True),
    "hf_jamba_tiny": _llm("JambaConfig", "JambaForCausalLM",
                          "Jamba-like tiny hybrid (4 layers of 512: 2 Mamba + 2 attention, MoE of 4 experts top 2 "
                          "every 2nd layer; torch's sequential scan), seq 512", 512, 32000, batch=4,
                          family="hybrid SSM", hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                          num_attention_heads=8, num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1,
                          expert_layer_period=2, expert_layer_offset=1, num_experts=4, num_experts_per_tok=2,
                          mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, use_mamba_kernels=False),
    "hf_zamba_tiny": _llm("ZambaConfig", "ZambaForCausalLM",
                          "Zamba-like tiny hybrid (6 Mamba layers of 512, a shared attention block; torch's sequential "
                          "scan), seq 64 (at 512 the trace outlasts the timeout)", 64, 32000, batch=4,
                          family="hybrid SSM", hidden_size=512, intermediate_size=1024, num_hidden_layers=6,
                          num_attention_heads=8, num_key_value_heads=8, attention_hidden_size=1024,
                          attention_head_dim=128, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
                          attn_layer_period=3, attn_layer_offset=2, use_mamba_kernels=False),
    # ---------------------------------------------------------------- transformers: mixture of experts
    "hf_mixtral_8x7b_2l": _llm("MixtralConfig", "MixtralForCausalLM",
                               "Mixtral-8x7B reduced to 2 of 32 layers (real width, 8 experts, top 2), seq 256",
                               256, 32000, family="MoE LLM", num_hidden_layers=2),
    "hf_qwen2_moe_2l": _llm("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                            "Qwen1.5-MoE-A2.7B reduced to 2 of 24 layers (60 experts top 4 + shared), seq 256",
                            256, 151936, family="MoE LLM", num_hidden_layers=2),
    "hf_deepseek_v3_2l": _llm("DeepseekV3Config", "DeepseekV3ForCausalLM",
                              "DeepSeek-V3 reduced to 2 of 61 layers (1 dense + 1 MoE of 256 experts, MLA), seq 128",
                              128, 129280, family="MoE LLM", num_hidden_layers=2, first_k_dense_replace=1),
    "hf_gpt_oss_20b_2l": _llm("GptOssConfig", "GptOssForCausalLM",
                              "gpt-oss-20b reduced to 2 of 24 layers (32 experts top 4, attention sinks, one sliding "
                              "and one full layer), seq 256", 256, 201088, family="MoE LLM", num_hidden_layers=2,
                              num_local_experts=32),
    "hf_qwen3_moe_2l": _llm("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                            "Qwen3-30B-A3B reduced to 2 of 48 layers (128 experts top 8), seq 512", 512, 151936,
                            family="MoE LLM", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                            num_experts=128, num_experts_per_tok=8, num_hidden_layers=2, num_attention_heads=32,
                            num_key_value_heads=4, head_dim=128, decoder_sparse_step=1, mlp_only_layers=[]),
    "hf_llama4_scout_2l": _llm("Llama4TextConfig", "Llama4ForCausalLM",
                               "Llama-4-Scout text reduced to 2 of 48 layers (16 experts top 1 + shared, chunked "
                               "attention), seq 512", 512, 202048, family="MoE LLM", hidden_size=5120,
                               intermediate_size=8192, intermediate_size_mlp=16384, num_local_experts=16,
                               num_experts_per_tok=1, num_hidden_layers=2, num_attention_heads=40,
                               num_key_value_heads=8, head_dim=128),
    # ---------------------------------------------------------------- transformers: encoders
    "hf_bert_base": ZooModel("transformers", "encoder", "BERT-base MLM, real size, seq 128",
                             hf("BertConfig", "BertForMaskedLM"), lm_tokens(128, 30522), model_loss, 4),
    "hf_roberta_base": ZooModel("transformers", "encoder", "RoBERTa-base MLM, real size, seq 128",
                                hf("RobertaConfig", "RobertaForMaskedLM", vocab_size=50265,
                                   max_position_embeddings=514, type_vocab_size=1, pad_token_id=1),
                                lm_tokens(128, 50265), model_loss, 4),
    "hf_distilbert": ZooModel("transformers", "encoder", "DistilBERT-base MLM, real size, seq 128",
                              hf("DistilBertConfig", "DistilBertForMaskedLM"), lm_tokens(128, 30522), model_loss, 4),
    "hf_albert_base": ZooModel("transformers", "encoder", "ALBERT-base MLM, real size (shared layers), seq 128",
                               hf("AlbertConfig", "AlbertForMaskedLM", hidden_size=768, num_attention_heads=12,
                                  intermediate_size=3072),
                               lm_tokens(128, 30000), model_loss, 4),
    "hf_modernbert_base": ZooModel("transformers", "encoder",
                                   "ModernBERT-base MLM, real size (alternating local/global attention), seq 512",
                                   hf("ModernBertConfig", "ModernBertForMaskedLM"), lm_tokens(512, 50280),
                                   model_loss, 2),
    "hf_deberta_v3_base": ZooModel("transformers", "encoder",
                                   "DeBERTa-v3-base classifier, real size (relative attention, 256 buckets), seq 128",
                                   hf("DebertaV2Config", "DebertaV2ForSequenceClassification", hidden_size=768,
                                      num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                                      relative_attention=True, position_buckets=256, norm_rel_ebd="layer_norm",
                                      share_att_key=True, pos_att_type=["p2c", "c2p"], position_biased_input=False,
                                      max_relative_positions=-1, num_labels=2),
                                   classified_tokens(128, 128100), model_loss, 4),
    "hf_electra_small": ZooModel("transformers", "encoder",
                                 "ELECTRA-small discriminator (replaced-token detection), real size, seq 128",
                                 hf("ElectraConfig", "ElectraForPreTraining"),
                                 lambda b: {"input_ids": _ids(b, 128, 30522, 3),
                                            "labels": torch.randint(0, 2, (b, 128))}, model_loss, 4),
    "hf_bigbird_base": ZooModel("transformers", "encoder",
                                "BigBird-RoBERTa-base MLM, real size (block-sparse attention: block 64, 3 random "
                                "blocks), seq 4096",
                                hf("BigBirdConfig", "BigBirdForMaskedLM", vocab_size=50358,
                                   attention_type="block_sparse", block_size=64, num_random_blocks=3,
                                   max_position_embeddings=4096),
                                lm_tokens(4096, 50358), model_loss, 2),
    "hf_longformer_base": ZooModel("transformers", "encoder",
                                   "Longformer-base MLM, real size (sliding window 512, global attention on the first "
                                   "token), seq 4096",
                                   hf("LongformerConfig", "LongformerForMaskedLM", vocab_size=50265, hidden_size=768,
                                      num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                                      attention_window=[512] * 12, max_position_embeddings=4098, pad_token_id=1,
                                      type_vocab_size=1),
                                   longformer_input, model_loss, 1),
    "hf_xlnet_base": ZooModel("transformers", "encoder",
                              "XLNet-base-cased LM head, real size (relative attention, two-stream off), seq 512",
                              hf("XLNetConfig", "XLNetLMHeadModel", vocab_size=32000, d_model=768, n_layer=12,
                                 n_head=12, d_inner=3072),
                              lm_tokens(512, 32000), model_loss, 4),
    "hf_esm2_35m": ZooModel("transformers", "encoder",
                            "ESM-2 35M protein MLM (esm2_t12_35M_UR50D), real size (12 x 480, rotary, token dropout), "
                            "1024 residues",
                            hf("EsmConfig", "EsmForMaskedLM", vocab_size=33, hidden_size=480, num_hidden_layers=12,
                               num_attention_heads=20, intermediate_size=1920, max_position_embeddings=1026,
                               position_embedding_type="rotary", pad_token_id=1, mask_token_id=32,
                               token_dropout=True, emb_layer_norm_before=False),
                            esm_input, model_loss, 16),
    # ---------------------------------------------------------------- transformers: encoder-decoders
    "hf_t5_small": ZooModel("transformers", "encoder-decoder",
                            "T5-small, real size (config defaults; t5-small's token ids), 256 -> 64",
                            hf("T5Config", "T5ForConditionalGeneration", decoder_start_token_id=0, pad_token_id=0,
                               eos_token_id=1),
                            seq2seq_tokens(256, 64, 32128),
                            model_loss, 4),
    "hf_bart_base": ZooModel("transformers", "encoder-decoder", "BART-base, real size (6+6 x 768), 256 -> 64",
                             hf("BartConfig", "BartForConditionalGeneration", d_model=768, encoder_layers=6,
                                decoder_layers=6, encoder_attention_heads=12, decoder_attention_heads=12,
                                encoder_ffn_dim=3072, decoder_ffn_dim=3072),
                             seq2seq_tokens(256, 64, 50265), model_loss, 4),
    "hf_flan_t5_base": ZooModel("transformers", "encoder-decoder",
                                "Flan-T5-base, real size (12+12 x 768, gated GELU, untied head), 512 -> 128",
                                hf("T5Config", "T5ForConditionalGeneration", vocab_size=32128, d_model=768, d_kv=64,
                                   d_ff=2048, num_layers=12, num_decoder_layers=12, num_heads=12,
                                   feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1),
                                seq2seq_tokens(512, 128, 32128), model_loss, 8),
    "hf_pegasus_large": ZooModel("transformers", "encoder-decoder",
                                 "Pegasus-large, real size (16+16 x 1024, 96k vocab, sinusoidal positions), 512 -> 128",
                                 hf("PegasusConfig", "PegasusForConditionalGeneration", vocab_size=96103, d_model=1024,
                                    encoder_layers=16, decoder_layers=16, encoder_attention_heads=16,
                                    decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096,
                                    max_position_embeddings=1024, pad_token_id=0, decoder_start_token_id=0,
                                    eos_token_id=1),
                                 seq2seq_tokens(512, 128, 96103), model_loss, 4),
    "hf_marian_en_de": ZooModel("transformers", "encoder-decoder",
                                "MarianMT opus-mt-en-de, real size (6+6 x 512, sinusoidal positions, 58,101 shared "
                                "vocab), 128 -> 128",
                                hf("MarianConfig", "MarianMTModel", vocab_size=58101, d_model=512, encoder_layers=6,
                                   decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
                                   encoder_ffn_dim=2048, decoder_ffn_dim=2048, max_position_embeddings=512,
                                   pad_token_id=58100, decoder_start_token_id=58100, activation_function="swish",
                                   scale_embedding=True, share_encoder_decoder_embeddings=True),
                                seq2seq_tokens(128, 128, 58100), model_loss, 32),
    # ---------------------------------------------------------------- transformers: vision, multimodal, audio
    "hf_vit_base": ZooModel("transformers", "vision transformer", "ViT-B/16 classifier, real size, 224 px",
                            hf("ViTConfig", "ViTForImageClassification", num_labels=1000), labelled_images(224),
                            model_loss, 2),
    "hf_swin_tiny": ZooModel("transformers", "vision transformer", "Swin-T classifier, real size, 224 px",
                             hf("SwinConfig", "SwinForImageClassification", num_labels=1000), labelled_images(224),
                             model_loss, 2),
    "hf_convnext_tiny": ZooModel("transformers", "vision CNN", "ConvNeXt-T classifier, real size, 224 px",
                                 hf("ConvNextConfig", "ConvNextForImageClassification", num_labels=1000),
                                 labelled_images(224), model_loss, 2),
    "hf_segformer_b0": ZooModel("transformers", "segmentation", "SegFormer-B0, real size, 19 classes, 512 px",
                                hf("SegformerConfig", "SegformerForSemanticSegmentation", num_labels=19),
                                segformer_input, model_loss, 2),
    "hf_detr": ZooModel("transformers", "detection",
                        "DETR (timm ResNet-50 backbone, no pretrained weights), real size, 512 px, Hungarian-matched "
                        "loss, 91 COCO classes", hf("DetrConfig", "DetrForObjectDetection", num_labels=91),
                        detr_input(512), model_loss, 2),
    "hf_clip_b32": ZooModel("transformers", "multimodal",
                            "CLIP ViT-B/32, real size (config defaults), contrastive loss, 77 tokens",
                            hf("CLIPConfig", "CLIPModel"), clip_input, model_loss, 4),
    "hf_whisper_tiny": ZooModel("transformers", "audio", "Whisper-tiny, real size, 30 s of audio -> 64 tokens",
                                hf("WhisperConfig", "WhisperForConditionalGeneration"), whisper_input, model_loss, 2),
    "hf_wav2vec2_base": ZooModel("transformers", "audio",
                                 "Wav2Vec2-base CTC, real size (config defaults: layerdrop 0.1, SpecAugment), 2 s",
                                 hf("Wav2Vec2Config", "Wav2Vec2ForCTC"), wav2vec2_input, model_loss, 2),
    "hf_wav2vec2_base_nospecaug": ZooModel("transformers", "audio",
                                           "the same Wav2Vec2-base CTC with SpecAugment off (layerdrop 0.1 kept)",
                                           hf("Wav2Vec2Config", "Wav2Vec2ForCTC", apply_spec_augment=False),
                                           wav2vec2_input, model_loss, 2),
    "hf_beit_base": ZooModel("transformers", "vision transformer",
                             "BEiT-B/16 classifier, real size (relative position bias, layer scale, mean pooling), "
                             "224 px",
                             hf("BeitConfig", "BeitForImageClassification", use_relative_position_bias=True,
                                use_mean_pooling=True, layer_scale_init_value=0.1, num_labels=1000),
                             labelled_images(224), model_loss, 32),
    "hf_dinov2_small": ZooModel("transformers", "vision transformer",
                                "DINOv2-S/14 classifier, real size (position embeddings for 518 px interpolated), "
                                "224 px",
                                hf("Dinov2Config", "Dinov2ForImageClassification", hidden_size=384,
                                   num_hidden_layers=12, num_attention_heads=6, image_size=518, patch_size=14,
                                   num_labels=1000),
                                labelled_images(224), model_loss, 64),
    "hf_dpt_large": ZooModel("transformers", "depth estimation",
                             "DPT-Large depth estimation, real size (ViT-L/16 + reassemble/fusion neck), 384 px, L1 "
                             "on the depth map", hf("DPTConfig", "DPTForDepthEstimation"),
                             lambda b: {"pixel_values": torch.randn(b, 3, 384, 384)}, depth_loss, 4),
    "hf_mask2former_swin_t": ZooModel("transformers", "segmentation",
                                      "Mask2Former (Swin-T backbone, 100 queries), real size, 133 COCO panoptic "
                                      "classes, 384 px, 3 instances per image, Hungarian-matched loss",
                                      hf("Mask2FormerConfig", "Mask2FormerForUniversalSegmentation",
                                         backbone_config={"model_type": "swin", "embed_dim": 96,
                                                          "depths": [2, 2, 6, 2], "num_heads": [3, 6, 12, 24],
                                                          "window_size": 7,
                                                          "out_features": ["stage1", "stage2", "stage3", "stage4"]},
                                         num_labels=133, use_pretrained_backbone=False),
                                      mask2former_input, model_loss, 2),
    "hf_siglip_base": ZooModel("transformers", "multimodal",
                               "SigLIP base-patch16-224, real size (config defaults), sigmoid contrastive loss, "
                               "64 tokens", hf("SiglipConfig", "SiglipModel"), siglip_input, model_loss, 32),
    "hf_blip_caption": ZooModel("transformers", "multimodal",
                                "BLIP captioning base (ViT-B/16 at 384 px + BERT decoder with cross-attention), real "
                                "size (config defaults), 32 tokens",
                                hf("BlipConfig", "BlipForConditionalGeneration"), blip_input, model_loss, 16),
    "hf_layoutlmv3_base": ZooModel("transformers", "multimodal",
                                   "LayoutLMv3-base token classifier (7 labels), real size, 512 tokens with boxes + "
                                   "224 px page", hf("LayoutLMv3Config", "LayoutLMv3ForTokenClassification",
                                                     vocab_size=50265, num_labels=7),
                                   layoutlmv3_input, model_loss, 4),
    "hf_llava15_4l": ZooModel("transformers", "multimodal",
                              "LLaVA-1.5-7B: CLIP ViT-L/14-336 tower (real size) + MLP projector + Llama-7B reduced to "
                              "4 of 32 layers; 576 image + 128 text tokens",
                              hf("LlavaConfig", "LlavaForConditionalGeneration",
                                 vision_config={"model_type": "clip_vision_model", "hidden_size": 1024,
                                                "intermediate_size": 4096, "num_hidden_layers": 24,
                                                "num_attention_heads": 16, "image_size": 336, "patch_size": 14,
                                                "projection_dim": 768},
                                 text_config={"model_type": "llama", "vocab_size": 32064, "hidden_size": 4096,
                                              "intermediate_size": 11008, "num_hidden_layers": 4,
                                              "num_attention_heads": 32, "num_key_value_heads": 32,
                                              "max_position_embeddings": 4096},
                                 image_token_index=LLAVA_IMAGE_TOKEN, vision_feature_layer=-2,
                                 vision_feature_select_strategy="default", projector_hidden_act="gelu"),
                              llava_input, model_loss, 2),
    # ---------------------------------------------------------------- timm
    "timm_resnet50": ZooModel("timm", "vision CNN", "resnet50, real size, 224 px", timm_model("resnet50"),
                              images(224), classification_loss, 2),
    "timm_efficientnet_b0": ZooModel("timm", "vision CNN", "efficientnet_b0, real size, 224 px",
                                     timm_model("efficientnet_b0"), images(224), classification_loss, 2),
    "timm_convnext_tiny": ZooModel("timm", "vision CNN", "convnext_tiny, real size, 224 px",
                                   timm_model("convnext_tiny"), images(224), classification_loss, 2),
    "timm_vit_base": ZooModel("timm", "vision transformer", "vit_base_patch16_224, real size",
                              timm_model("vit_base_patch16_224"), images(224), classification_loss, 2),
    "timm_swin_tiny": ZooModel("timm", "vision transformer", "swin_tiny_patch4_window7_224, real size",
                               timm_model("swin_tiny_patch4_window7_224"), images(224), classification_loss, 2),
    "timm_regnety_016": ZooModel("timm", "vision CNN", "regnety_016, real size, 224 px", timm_model("regnety_016"),
                                 images(224), classification_loss, 2),
    "timm_mobilenetv3_large": ZooModel("timm", "vision CNN", "mobilenetv3_large_100, real size, 224 px",
                                       timm_model("mobilenetv3_large_100"), images(224), classification_loss, 2),
    "timm_deit_small": ZooModel("timm", "vision transformer", "deit_small_patch16_224, real size",
                                timm_model("deit_small_patch16_224"), images(224), classification_loss, 2),
    "timm_maxvit_tiny": ZooModel("timm", "vision hybrid", "maxvit_tiny_tf_224, real size",
                                 timm_model("maxvit_tiny_tf_224"), images(224), classification_loss, 2),
    "timm_coatnet_0": ZooModel("timm", "vision hybrid", "coatnet_0_rw_224, real size", timm_model("coatnet_0_rw_224"),
                               images(224), classification_loss, 2),
    "timm_eva02_small": ZooModel("timm", "vision transformer", "eva02_small_patch14_224, real size",
                                 timm_model("eva02_small_patch14_224"), images(224), classification_loss, 64),
    "timm_vit_small_reg4_dinov2": ZooModel("timm", "vision transformer",
                                           "vit_small_patch14_reg4_dinov2 (4 register tokens), real size, 518 px",
                                           timm_model("vit_small_patch14_reg4_dinov2"), images(518),
                                           classification_loss, 16),
    "timm_efficientnetv2_rw_s": ZooModel("timm", "vision CNN", "efficientnetv2_rw_s, real size, 288 px",
                                         timm_model("efficientnetv2_rw_s"), images(288), classification_loss, 64),
    "timm_dm_nfnet_f0": ZooModel("timm", "vision CNN", "dm_nfnet_f0 (normalizer-free), real size, 256 px",
                                 timm_model("dm_nfnet_f0"), images(256), classification_loss, 64),
    "timm_resnest50d": ZooModel("timm", "vision CNN", "resnest50d (split attention), real size, 224 px",
                                timm_model("resnest50d"), images(224), classification_loss, 64),
    "timm_hrnet_w18": ZooModel("timm", "vision CNN", "hrnet_w18, real size, 224 px", timm_model("hrnet_w18"),
                               images(224), classification_loss, 64),
    "timm_convnextv2_atto": ZooModel("timm", "vision CNN", "convnextv2_atto, real size, 224 px",
                                     timm_model("convnextv2_atto"), images(224), classification_loss, 128),
    "timm_levit_128": ZooModel("timm", "vision hybrid", "levit_128, real size, 224 px", timm_model("levit_128"),
                               images(224), classification_loss, 128),
    "timm_fastvit_t8": ZooModel("timm", "vision hybrid", "fastvit_t8, real size, 256 px", timm_model("fastvit_t8"),
                                images(256), classification_loss, 128),
    "timm_edgenext_small": ZooModel("timm", "vision hybrid", "edgenext_small, real size, 256 px",
                                    timm_model("edgenext_small"), images(256), classification_loss, 128),
    # ---------------------------------------------------------------- torchvision
    "tv_resnet50": ZooModel("torchvision", "vision CNN", "resnet50, real size, 224 px", torchvision_model("resnet50"),
                            images(224), classification_loss, 2),
    "tv_mobilenet_v2": ZooModel("torchvision", "vision CNN", "mobilenet_v2, real size, 224 px",
                                torchvision_model("mobilenet_v2"), images(224), classification_loss, 2),
    "tv_mobilenet_v3_large": ZooModel("torchvision", "vision CNN", "mobilenet_v3_large, real size, 224 px",
                                      torchvision_model("mobilenet_v3_large"), images(224), classification_loss, 2),
    "tv_efficientnet_b0": ZooModel("torchvision", "vision CNN", "efficientnet_b0, real size, 224 px",
                                   torchvision_model("efficientnet_b0"), images(224), classification_loss, 2),
    "tv_vit_b_16": ZooModel("torchvision", "vision transformer", "vit_b_16, real size, 224 px",
                            torchvision_model("vit_b_16"), images(224), classification_loss, 2),
    "tv_swin_t": ZooModel("torchvision", "vision transformer", "swin_t, real size, 224 px", torchvision_model("swin_t"),
                          images(224), classification_loss, 2),
    "tv_inception_v3": ZooModel("torchvision", "vision CNN", "inception_v3 with aux logits, real size, 299 px",
                                torchvision_model("inception_v3", aux_logits=True, init_weights=True), images(299),
                                inception_loss, 2),
    "tv_densenet121": ZooModel("torchvision", "vision CNN", "densenet121, real size, 224 px",
                               torchvision_model("densenet121"), images(224), classification_loss, 2),
    "tv_fasterrcnn_resnet50_fpn": ZooModel("torchvision", "detection",
                                           "fasterrcnn_resnet50_fpn, real size, train mode with targets, 480x640 "
                                           "(resized to 800 by the model)",
                                           torchvision_model("fasterrcnn_resnet50_fpn", "detection",
                                                             weights_backbone=None),
                                           detection_input(False), sum_of_losses, 2),
    "tv_maskrcnn_resnet50_fpn": ZooModel("torchvision", "detection",
                                         "maskrcnn_resnet50_fpn, real size, train mode with targets and masks, 480x640",
                                         torchvision_model("maskrcnn_resnet50_fpn", "detection", weights_backbone=None),
                                         detection_input(True), sum_of_losses, 2),
    "tv_deeplabv3_mobilenet": ZooModel("torchvision", "segmentation",
                                       "deeplabv3_mobilenet_v3_large, real size, 21 classes, 512 px",
                                       torchvision_model("deeplabv3_mobilenet_v3_large", "segmentation",
                                                         weights_backbone=None, num_classes=21),
                                       images(512), segmentation_loss, 2),
    "tv_fcn_resnet50": ZooModel("torchvision", "segmentation", "fcn_resnet50, real size, 21 classes, 512 px",
                                torchvision_model("fcn_resnet50", "segmentation", weights_backbone=None,
                                                  num_classes=21),
                                images(512), segmentation_loss, 2),
    "tv_r3d_18": ZooModel("torchvision", "video", "r3d_18 (3-D ResNet), real size, 16 frames of 112 px",
                          torchvision_model("r3d_18", "video"), lambda b: torch.randn(b, 3, 16, 112, 112),
                          classification_loss, 2),
    "tv_regnet_y_400mf": ZooModel("torchvision", "vision CNN", "regnet_y_400mf, real size, 224 px",
                                  torchvision_model("regnet_y_400mf"), images(224), classification_loss, 128),
    "tv_shufflenet_v2_x1_0": ZooModel("torchvision", "vision CNN", "shufflenet_v2_x1_0, real size, 224 px",
                                      torchvision_model("shufflenet_v2_x1_0"), images(224), classification_loss, 256),
    "tv_squeezenet1_1": ZooModel("torchvision", "vision CNN", "squeezenet1_1, real size, 224 px",
                                 torchvision_model("squeezenet1_1"), images(224), classification_loss, 256),
    "tv_googlenet": ZooModel("torchvision", "vision CNN", "googlenet without aux logits, real size, 224 px",
                             torchvision_model("googlenet", aux_logits=False, init_weights=True), images(224),
                             classification_loss, 128),
    "tv_mnasnet1_0": ZooModel("torchvision", "vision CNN", "mnasnet1_0, real size, 224 px",
                              torchvision_model("mnasnet1_0"), images(224), classification_loss, 128),
    "tv_fcos_resnet50_fpn": ZooModel("torchvision", "detection",
                                     "fcos_resnet50_fpn, real size, train mode with targets, 480x640",
                                     torchvision_model("fcos_resnet50_fpn", "detection", weights_backbone=None),
                                     detection_input(False), sum_of_losses, 4),
    "tv_retinanet_resnet50_fpn": ZooModel("torchvision", "detection",
                                          "retinanet_resnet50_fpn, real size, train mode with targets, 480x640",
                                          torchvision_model("retinanet_resnet50_fpn", "detection",
                                                            weights_backbone=None),
                                          detection_input(False), sum_of_losses, 4),
    "tv_ssd300_vgg16": ZooModel("torchvision", "detection",
                                "ssd300_vgg16, real size, train mode with targets, 480x640 (resized to 300 by the "
                                "model)",
                                torchvision_model("ssd300_vgg16", "detection", weights_backbone=None),
                                detection_input(False), sum_of_losses, 4),
    "tv_keypointrcnn": ZooModel("torchvision", "detection",
                                "keypointrcnn_resnet50_fpn, real size, train mode with 2 people x 17 keypoints, "
                                "480x640",
                                torchvision_model("keypointrcnn_resnet50_fpn", "detection", weights_backbone=None),
                                keypoint_input, sum_of_losses, 2),
    "tv_raft_small": ZooModel("torchvision", "optical flow",
                              "raft_small optical flow, real size, 368x496 image pairs, 12 flow updates, RAFT's "
                              "sequence loss", torchvision_model("raft_small", "optical_flow"),
                              lambda b: (torch.randn(b, 3, 368, 496), torch.randn(b, 3, 368, 496)), flow_loss, 8),
    "tv_mvit_v2_s": ZooModel("torchvision", "video", "mvit_v2_s (multiscale video transformer), real size, 16 frames "
                             "of 224 px", torchvision_model("mvit_v2_s", "video"),
                             lambda b: torch.randn(b, 3, 16, 224, 224), classification_loss, 4),
    "tv_swin3d_t": ZooModel("torchvision", "video", "swin3d_t (video Swin), real size, 16 frames of 224 px",
                            torchvision_model("swin3d_t", "video"), lambda b: torch.randn(b, 3, 16, 224, 224),
                            classification_loss, 4),
    # ---------------------------------------------------------------- diffusers
    "diffusers_unet_sd15": ZooModel("diffusers", "diffusion",
                                    "Stable Diffusion 1.x UNet2DConditionModel, real size, 64x64 latents (512 px)",
                                    sd_unet(small=False), unet_input(64, 768), sample_loss, 1),
    "diffusers_unet_small": ZooModel("diffusers", "diffusion",
                                     "small SD-like UNet2DConditionModel (32/64 channels, 1 cross-attention level), "
                                     "32x32 latents", sd_unet(small=True), unet_input(32, 64), sample_loss, 2),
    "diffusers_vae_sd": ZooModel("diffusers", "diffusion", "Stable Diffusion AutoencoderKL, real size, 256 px",
                                 sd_vae, vae_input, sample_loss, 1),
    "diffusers_dit_s2": ZooModel("diffusers", "diffusion", "DiT-S/2 (DiTTransformer2DModel), real size, 32x32 latents",
                                 dit_s2, dit_input, sample_loss, 2),
    "diffusers_unet_sdxl": ZooModel("diffusers", "diffusion",
                                    "SDXL UNet2DConditionModel, real size (320/640/1280 channels, 1/2/10 transformer "
                                    "layers, text_time conditioning), 128x128 latents (1024 px)",
                                    diffusers_model("UNet2DConditionModel", sample_size=128, in_channels=4,
                                                    out_channels=4, block_out_channels=(320, 640, 1280),
                                                    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D",
                                                                      "CrossAttnDownBlock2D"),
                                                    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                                                                    "UpBlock2D"),
                                                    transformer_layers_per_block=(1, 2, 10),
                                                    attention_head_dim=(5, 10, 20), cross_attention_dim=2048,
                                                    addition_embed_type="text_time", addition_time_embed_dim=256,
                                                    projection_class_embeddings_input_dim=2816,
                                                    use_linear_projection=True, layers_per_block=2),
                                    sdxl_unet_input, sample_loss, 1),
    "diffusers_sd3_4l": ZooModel("diffusers", "diffusion",
                                 "SD3-medium MMDiT reduced to 4 of 24 layers (24 heads of 64, joint dim 4096), "
                                 "128x128x16 latents (1024 px), 154 text tokens",
                                 diffusers_model("SD3Transformer2DModel", sample_size=128, patch_size=2, in_channels=16,
                                                 num_layers=4, attention_head_dim=64, num_attention_heads=24,
                                                 joint_attention_dim=4096, caption_projection_dim=1536,
                                                 pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=192),
                                 sd3_input, sample_loss, 2),
    "diffusers_flux_tiny": ZooModel("diffusers", "diffusion",
                                    "Flux.1 transformer reduced to 2 double + 4 single blocks (24 heads of 128, "
                                    "guidance embedding), 1024 image tokens (512 px), 256 text tokens",
                                    diffusers_model("FluxTransformer2DModel", patch_size=1, in_channels=64,
                                                    num_layers=2, num_single_layers=4, attention_head_dim=128,
                                                    num_attention_heads=24, joint_attention_dim=4096,
                                                    pooled_projection_dim=768, guidance_embeds=True,
                                                    axes_dims_rope=(16, 56, 56)),
                                    flux_input, sample_loss, 1),
    "diffusers_autoencoder_tiny": ZooModel("diffusers", "diffusion",
                                           "AutoencoderTiny (TAESD, config defaults), 512 px, reconstruction MSE",
                                           diffusers_model("AutoencoderTiny"),
                                           lambda b: {"sample": torch.randn(b, 3, 512, 512)}, reconstruction_loss, 8),
    # ---------------------------------------------------------------- peft
    "peft_lora_gpt2": ZooModel("peft", "LoRA fine-tune", "LoRA r=8 on c_attn of GPT-2 small (real size), seq 512",
                               lora(hf("GPT2Config", "GPT2LMHeadModel"), ["c_attn"]), lm_tokens(512, 50257),
                               model_loss, 2),
    "peft_lora_tinyllama": ZooModel("peft", "LoRA fine-tune",
                                    "LoRA r=8 on q_proj/v_proj of TinyLlama-1.1B (real size), seq 512",
                                    lora(hf("LlamaConfig", "LlamaForCausalLM", vocab_size=32000, **TINYLLAMA),
                                         ["q_proj", "v_proj"]),
                                    lm_tokens(512, 32000), model_loss, 1),
    "peft_lora16_llama32_1b": ZooModel("peft", "LoRA fine-tune",
                                       "LoRA r=16 (alpha 32) on all linear layers of Llama-3.2-1B (real size: 16 x "
                                       "2048, GQA 8, tied), seq 1024",
                                       adapter(hf("LlamaConfig", "LlamaForCausalLM", vocab_size=128256,
                                                  hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                                  num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                                                  tie_word_embeddings=True, max_position_embeddings=131072),
                                               "LoraConfig", r=16, lora_alpha=32, lora_dropout=0.05,
                                               target_modules="all-linear"),
                                       lm_tokens(1024, 128256), model_loss, 4),
    "peft_ia3_qwen2_0_5b": ZooModel("peft", "IA3 fine-tune",
                                    "IA3 on k_proj, v_proj and down_proj of Qwen2-0.5B (real size), seq 1024",
                                    adapter(hf("Qwen2Config", "Qwen2ForCausalLM", vocab_size=151936, hidden_size=896,
                                               intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                                               num_key_value_heads=2, tie_word_embeddings=True),
                                            "IA3Config", target_modules=["k_proj", "v_proj", "down_proj"],
                                            feedforward_modules=["down_proj"]),
                                    lm_tokens(1024, 151936), model_loss, 4),
    "peft_prefix_gpt2_medium": ZooModel("peft", "prefix tuning",
                                        "prefix tuning (30 virtual tokens, MLP reparametrisation) on GPT-2 medium "
                                        "(real size: 24 x 1024), seq 512",
                                        adapter(hf("GPT2Config", "GPT2LMHeadModel", n_embd=1024, n_layer=24, n_head=16),
                                                "PrefixTuningConfig", num_virtual_tokens=30, prefix_projection=True,
                                                encoder_hidden_size=512),
                                        lm_tokens(512, 50257, mask=True), model_loss, 8),
    # ---------------------------------------------------------------- plain torch
    "torch_lstm_lm": ZooModel("torch", "RNN", "2-layer LSTM LM (10k vocab, 512 wide), seq 64", LSTMLanguageModel,
                              lambda b: torch.randint(0, 10000, (b, 64)), lstm_loss, 8),
    "torch_gru_classifier": ZooModel("torch", "RNN", "bidirectional 2-layer GRU (80 -> 256) classifier, 200 frames",
                                     GRUClassifier, lambda b: torch.randn(b, 200, 80), classification_loss, 8),
    "torch_transformer": ZooModel("torch", "encoder-decoder",
                                  "nn.Transformer base (6+6 x 512) with 16k-token embeddings and head, 128 -> 128",
                                  Seq2SeqTransformer,
                                  lambda b: (torch.randint(0, 16000, (b, 128)), torch.randint(0, 16000, (b, 128))),
                                  seq2seq_loss, 4),
    "torch_dlrm": ZooModel("torch", "recommendation",
                           "DLRM-style: 8 EmbeddingBag tables of 50k x 32 (dense gradients), MLPs, dot interactions",
                           lambda: DLRM(sparse=False), dlrm_input, binary_loss, 256),
    "torch_dlrm_sparse": ZooModel("torch", "recommendation", "the same DLRM with sparse=True tables, SGD",
                                  lambda: DLRM(sparse=True), dlrm_input, binary_loss, 256, optimizer="sgd"),
    "torch_ctc_speech": ZooModel("torch", "audio", "conv + 3-layer BiLSTM acoustic model with CTC loss, 400 frames",
                                 CTCSpeechModel, ctc_input, ctc_loss, 4),
}


# ============================================================================= the child: one model


def _emit(stage: str, **values: Any) -> None:
    print(MARK + json.dumps({"stage": stage, **values}, default=str), flush=True)


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _parameter_counts(model: nn.Module) -> dict[str, int]:
    return {"trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "total": sum(p.numel() for p in model.parameters())}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def _innermost_advisor_frame(exc: BaseException) -> str | None:
    """file:line (function) of the innermost traceback frame in advisor/, following the cause chain."""
    found: str | None = None
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for frame in traceback.extract_tb(current.__traceback__):
            if frame.filename.startswith(ADVISOR_DIR):
                found = f"{os.path.relpath(frame.filename, REPO)}:{frame.lineno} ({frame.name})"
        if found is not None:
            return found
        current = current.__cause__ or current.__context__
    return None


DRIVER_FUNCTIONS = frozenset({"run_trace", "run_one", "main", "<module>"})
"""This script's own frames around the trace (its model classes and input makers count as model code)."""


def _library_frame(exc: BaseException) -> str | None:
    """The innermost frame outside torch, advisor/ and the standard library of the last exception in the
    cause chain that has one: the model code (a library's or this file's) that made the failing call."""
    torch_dir = str(Path(torch.__file__).resolve().parent) + os.sep
    stdlib = os.path.dirname(os.__file__) + os.sep
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    for link in reversed(chain):
        frames = [f for f in traceback.extract_tb(link.__traceback__)
                  if not f.filename.startswith((torch_dir, ADVISOR_DIR, stdlib))
                  and not (f.filename == __file__ and f.name in DRIVER_FUNCTIONS)]
        if frames:
            frame = frames[-1]
            where = frame.filename.split("site-packages" + os.sep)[-1]
            return f"{where}:{frame.lineno} ({frame.name}): {(frame.line or '').strip()[:120]}"
    return None


def _error(exc: BaseException) -> dict[str, Any]:
    return {"type": type(exc).__name__, "message": _first_line(exc), "frame": _innermost_advisor_frame(exc)}


def count_on_meta(entry: ZooModel) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        with torch.device("meta"):
            model = entry.build()
    except Exception as exc:  # noqa: BLE001 - reported: some constructors need values (timm's linspace)
        return {"error": _error(exc), "seconds": time.perf_counter() - started}
    return {**_parameter_counts(model), "seconds": time.perf_counter() - started}


def run_trace(entry: ZooModel) -> tuple[dict[str, Any], Any]:
    """The tracer on the model: status and figures, and the StepTrace (None when it failed)."""
    from advisor.errors import UserError
    from advisor.profile.coverage import coverage_of
    from advisor.profile.trace import OUTSIDE_MODEL, trace_training_step
    from advisor.profile.user_code import UserCodeError

    started = time.perf_counter()
    try:
        trace = trace_training_step(entry.build, entry.make_input, entry.batch, "fp32", entry.optimizer,
                                    entry.loss_fn)
    except UserCodeError as exc:
        return {"status": "user error", "message": exc.sentence, "frames": exc.user_frames[-4:],
                "seconds": time.perf_counter() - started, "rss_mib": _rss_mib()}, None
    except UserError as exc:
        return {"status": "user error", "message": str(exc), "where": _library_frame(exc),
                "seconds": time.perf_counter() - started, "rss_mib": _rss_mib()}, None
    except Exception as exc:  # noqa: BLE001 - anything else escaping the tracer is its internal error
        return {"status": "internal error", "error": _error(exc), "traceback": traceback.format_exc()[-3000:],
                "seconds": time.perf_counter() - started, "rss_mib": _rss_mib()}, None
    seconds = time.perf_counter() - started
    forward = [r for r in trace.records if r.phase == "forward" and r.module not in OUTSIDE_MODEL.values()]
    by_op: dict[str, float] = defaultdict(float)
    for record in forward:
        if record.matmul:
            by_op[record.op] += record.flops
    coverage = coverage_of(trace)
    return {"status": "ok", "seconds": seconds, "rss_mib": _rss_mib(), "params": trace.params,
            "construction": trace.construction, "values": trace.values,
            "data_dependent_ops": trace.data_dependent_ops, "uncounted": trace.uncounted(),
            "assumed_finite": getattr(trace, "assumed_finite", None),
            "uncounted_bytes_share": coverage.bytes_share, "ops": len(trace.records),
            "forward_flops": trace.model_forward_flops(), "forward_matmul_flops": sum(by_op.values()),
            "forward_matmul_by_op": dict(by_op), "step_flops": trace.flops(),
            **trace_memory(trace)}, trace


def trace_memory(trace: Any) -> dict[str, Any]:
    """The trace's peak, its breakdown, and its storages by op (bytes_by_op) for the real-step comparison."""
    from advisor.profile.live_memory import BEFORE_STEP

    memory = trace.memory
    if memory is None:
        return {"peak_bytes": None}
    peak = memory.peak()
    ops = [st.op if st.allocated_at != BEFORE_STEP else BEFORE_THE_STEP for st in memory.storages]
    return {"peak_bytes": peak.bytes, "peak_by_category": peak.by_category,
            **bytes_by_op([st.nbytes for st in memory.storages], ops, list(memory.events))}


def reference_flops(entry: ZooModel, real_model: nn.Module | None) -> dict[str, Any]:
    """FlopCounterMode over one forward (train mode, autograd on): on meta tensors, else on the real model."""
    from torch.utils.flop_counter import FlopCounterMode

    from advisor.profile.trace import call_model

    attempts: dict[str, Any] = {}
    for device in ("meta", "cpu"):
        if device == "cpu" and real_model is None:
            break
        started = time.perf_counter()
        try:
            torch.manual_seed(0)
            if device == "meta":
                with torch.device("meta"):
                    model = entry.build()
                    inputs = entry.make_input(entry.batch)
            else:
                model, inputs = real_model, entry.make_input(entry.batch)
            model.train()
            with FlopCounterMode(display=False) as counter:
                output = call_model(model, inputs)
            del output
        except Exception as exc:  # noqa: BLE001 - reported; the next device is tried
            attempts[device] = _error(exc)
            continue
        by_op = {getattr(op, "__name__", str(op)): float(flops)
                 for op, flops in counter.get_flop_counts().get("Global", {}).items()}
        return {"device": device, "flops": float(counter.get_total_flops()), "by_op": by_op,
                "seconds": time.perf_counter() - started, "failed_on": attempts}
    return {"device": None, "failed_on": attempts}


BEFORE_THE_STEP = "(before the step)"
"""Op name of the storages alive when the step starts (weights, optimizer state, inputs)."""


class LiveStorageBytes(TorchDispatchMode):
    """Live bytes of real tensor storages: every storage an op outputs counts from then until Python frees
    it (a weak-reference finalizer); `register` adds storages that existed before. Keeps the peak, and the
    allocations and frees in order (`events`: i allocates storage i, ~i frees it) to say what was live then."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.sizes: list[int] = []
        self.ops: list[str] = []
        self.events: list[int] = []
        self._seen: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def register(self, value: Any, op: str = BEFORE_THE_STEP) -> None:
        for tensor in tree_flatten(value)[0]:
            if not isinstance(tensor, torch.Tensor):
                continue
            parts = [tensor._indices(), tensor._values()] if tensor.layout == torch.sparse_coo else [tensor]
            for part in parts:
                self._add(part.untyped_storage(), op)

    def _add(self, storage: torch.UntypedStorage, op: str) -> None:
        if storage in self._seen:
            return
        self._seen[storage] = True
        index = len(self.sizes)
        self.sizes.append(storage.nbytes())
        self.ops.append(op)
        self.events.append(index)
        self.live += self.sizes[index]
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, index)

    def _free(self, index: int) -> None:
        self.live -= self.sizes[index]
        self.events.append(~index)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.register(out, func.overloadpacket.__name__)
        return out


def bytes_by_op(sizes: list[int], ops: list[str], events: list[int]) -> dict[str, dict[str, int]]:
    """From allocation events (i, or ~i for a free): bytes allocated during the step by op, and bytes live
    at the (first) peak by the op that made them; storages alive before the step under BEFORE_THE_STEP."""
    allocated: dict[str, int] = defaultdict(int)
    live: set[int] = set()
    total = best = 0
    best_position = -1
    for position, event in enumerate(events):
        if event >= 0:
            live.add(event)
            total += sizes[event]
            if ops[event] != BEFORE_THE_STEP:
                allocated[ops[event]] += sizes[event]
            if total > best:
                best, best_position = total, position
        else:
            live.discard(~event)
            total -= sizes[~event]
    at_peak: dict[str, int] = defaultdict(int)
    live.clear()
    for event in events[: best_position + 1]:
        if event >= 0:
            live.add(event)
        else:
            live.discard(~event)
    for index in live:
        at_peak[ops[index]] += sizes[index]
    return {"allocated_by_op": dict(allocated), "live_at_peak_by_op": dict(at_peak)}


def real_step_peak(entry: ZooModel, model: nn.Module) -> dict[str, Any]:
    """Peak live bytes of one real CPU training step of `model` (see LiveStorageBytes)."""
    from advisor.profile.trace import call_model, default_loss, make_optimizer

    started = time.perf_counter()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(entry.optimizer, params)
    for param in params:  # the optimizer's state exists before the step, as in the trace
        param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    inputs = entry.make_input(entry.batch)
    loss_fn = entry.loss_fn or default_loss
    tracker = LiveStorageBytes()
    tracker.register([list(model.parameters()), list(model.buffers()), list(optimizer.state.values()), inputs])

    def step() -> None:
        loss = loss_fn(call_model(model, inputs), inputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    with tracker:
        step()
    return {"peak_bytes": tracker.peak, **bytes_by_op(tracker.sizes, tracker.ops, tracker.events),
            "seconds": time.perf_counter() - started}


def run_one(name: str, memory_gib: float) -> None:
    """The child: every stage of one model, one JSON line each (see the module docstring)."""
    limit = int(memory_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    entry = ZOO[name]
    torch.manual_seed(0)
    _emit("begin", next="library (meta)")
    meta = count_on_meta(entry)
    _emit("library_meta", **meta)

    _emit("begin", next="trace")
    torch.manual_seed(0)
    trace_result, trace = run_trace(entry)
    _emit("trace", **trace_result)
    del trace
    if trace_result["status"] == "ok":
        _emit("begin", next="repeat trace")
        torch.manual_seed(1)
        again, _ = run_trace(entry)
        _emit("repeat", **{key: again.get(key) for key in ("status", "step_flops", "peak_bytes", "params")})

    real_model = None
    total = meta.get("total")
    if total is None or total < REAL_BUILD_LIMIT:
        _emit("begin", next="library (real build)")
        started = time.perf_counter()
        try:
            torch.manual_seed(0)
            real_model = entry.build()
            _emit("library_real", **_parameter_counts(real_model), seconds=time.perf_counter() - started)
        except Exception as exc:  # noqa: BLE001 - the builder's own failure (a bug of this benchmark or the library)
            _emit("library_real", error=_error(exc), seconds=time.perf_counter() - started)

    _emit("begin", next="reference FLOPs")
    _emit("reference", **reference_flops(entry, real_model))

    size = sum(p.numel() for p in real_model.parameters()) if real_model is not None else None
    if real_model is not None and size < REAL_STEP_LIMIT and trace_result["status"] == "ok":
        _emit("begin", next="real step memory")
        try:
            _emit("real_step", **real_step_peak(entry, real_model))
        except Exception as exc:  # noqa: BLE001 - reported in the row
            _emit("real_step", error=_error(exc))
    _emit("end", rss_mib=_rss_mib())


# ============================================================================= the parent


@dataclass
class Row:
    name: str
    entry: ZooModel
    stages: dict[str, dict[str, Any]]
    status: str
    message: str
    wall_s: float
    running: str | None = None
    """The stage the child was in when it was stopped (timeout or crash)."""

    @property
    def trace(self) -> dict[str, Any]:
        return self.stages.get("trace", {})

    def library_params(self) -> int | None:
        """The library's trainable parameter count: the real build's, else the meta build's."""
        for stage in ("library_real", "library_meta"):
            value = self.stages.get(stage, {}).get("trainable")
            if value is not None:
                return int(value)
        return None

    def flop_ratio(self) -> float | None:
        reference = self.stages.get("reference", {})
        if self.status != "ok" or not reference.get("flops"):
            return None
        return self.trace["forward_matmul_flops"] / reference["flops"]

    def memory_ratio(self) -> float | None:
        real = self.stages.get("real_step", {}).get("peak_bytes")
        if not real or self.trace.get("peak_bytes") is None:
            return None
        return self.trace["peak_bytes"] / real

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "library": self.entry.library, "family": self.entry.family,
                "what": self.entry.what, "batch": self.entry.batch, "optimizer": self.entry.optimizer,
                "status": self.status, "message": self.message, "wall_s": self.wall_s, "stopped_in": self.running,
                "library_params": self.library_params(), "fwd_flops_ratio": self.flop_ratio(),
                "memory_ratio": self.memory_ratio(), "stages": self.stages}


def _parse_stages(stdout: str) -> tuple[dict[str, dict[str, Any]], str | None]:
    stages: dict[str, dict[str, Any]] = {}
    running = None
    for line in stdout.splitlines():
        if not line.startswith(MARK):
            continue
        record = json.loads(line[len(MARK):])
        stage = record.pop("stage")
        if stage == "begin":
            running = record["next"]
        else:
            stages[stage] = record
            if stage == "end":
                running = None
    return stages, running


def _text(value: str | bytes | None) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")


def run_child(name: str, timeout: float, memory_gib: float) -> Row:
    command = [sys.executable, str(Path(__file__).resolve()), "--one", name, "--memory-gib", str(memory_gib)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error", "DIFFUSERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore"}
    started = time.perf_counter()
    timed_out = False
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
        stdout, stderr, code = done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        stdout, stderr, code, timed_out = _text(exc.stdout), _text(exc.stderr), None, True
    wall = time.perf_counter() - started
    stages, running = _parse_stages(stdout)
    entry = ZOO[name]
    trace = stages.get("trace")
    if trace is not None:
        status = trace["status"]
        if status == "ok":
            message = ""
        elif status == "user error":
            message = trace["message"]
        else:
            error = trace["error"]
            message = f"{error['type']}: {error['message']}" + (f" [at {error['frame']}]" if error["frame"] else "")
    elif timed_out:
        status, message = "timeout", f"timed out after {timeout:.0f} s (in the {running} stage)"
    else:
        tail = [line for line in stderr.strip().splitlines() if line.strip()][-1:] or [""]
        status, message = "crashed", f"child exited with code {code} in the {running} stage: {tail[0][:300]}"
    if trace is not None and (timed_out or code not in (0, None)) and running is not None:
        stages["stopped"] = {"stage": running, "reason": f"timed out after {timeout:.0f} s" if timed_out
                             else f"exit code {code}: {(stderr.strip().splitlines() or [''])[-1][:300]}"}
    return Row(name, entry, stages, status, message, wall, running)


# ---- formatting


def _millions(value: float) -> str:
    return f"{value / 1e6:,.2f}M" if value >= 1e5 else f"{value:,.0f}"


def params_cell(row: Row) -> str:
    library = row.library_params()
    traced = row.trace.get("params")
    if traced is None:
        return f"-/{_millions(library)}" if library is not None else "-"
    if library is None:
        return f"{_millions(traced)}/?"
    if traced == library:
        return f"= {_millions(traced)}"
    return f"{_millions(traced)}/{_millions(library)} ({traced - library:+,})"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def uncounted_cell(row: Row) -> str:
    uncounted = row.trace.get("uncounted") or {}
    if not uncounted:
        return "-" if row.status != "ok" else "none"
    share = row.trace.get("uncounted_bytes_share", 0.0)
    ops = ", ".join(f"{op} x{calls}" for op, calls in sorted(uncounted.items(), key=lambda kv: -kv[1]))
    return f"{ops} ({share:.1%} of bytes)"


COLUMNS = (("model", 26), ("library", 12), ("family", 18), ("status", 14), ("params traced/library", 30),
           ("fwd FLOPs", 9), ("mem", 7), ("trace s", 8), ("RSS MiB", 8), ("built", 6))


def table(rows: list[Row]) -> list[str]:
    header = "  ".join(f"{name:<{width}}" if i < 5 else f"{name:>{width}}" for i, (name, width) in enumerate(COLUMNS))
    lines = [header + "  uncounted ops", "-" * (len(header) + 15)]
    for row in rows:
        trace = row.trace
        seconds = f"{trace['seconds']:.1f}" if "seconds" in trace else "-"
        rss = f"{trace['rss_mib']:,.0f}" if "rss_mib" in trace else "-"
        built = trace.get("construction", "-")
        built += {"fake+real-inputs": "+ri", "real": "+real"}.get(trace.get("values"), "")
        cells = [row.name, row.entry.library, row.entry.family, row.status, params_cell(row),
                 _ratio(row.flop_ratio()), _ratio(row.memory_ratio()), seconds, rss, built]
        text = "  ".join(f"{c:<{w}}" if i < 5 else f"{c:>{w}}" for i, (c, (_, w)) in enumerate(zip(cells, COLUMNS)))
        lines.append(text + "  " + uncounted_cell(row))
    return lines


MATRIX_PRODUCTS = {"mm": "mm/addmm", "addmm": "mm/addmm"}
"""Ops compared as one: which of the two a linear layer calls depends on the device and the input's layout."""


def _merged(by_op: dict[str, float]) -> dict[str, float]:
    merged: dict[str, float] = defaultdict(float)
    for op, flops in by_op.items():
        merged[MATRIX_PRODUCTS.get(op, op)] += flops
    return merged


def _flop_counter_formulas() -> set[str]:
    """Names of the ops FlopCounterMode has a formula for."""
    from torch.utils.flop_counter import flop_registry
    return {getattr(op, "__name__", str(op)) for op in flop_registry}


def flop_notes(row: Row) -> str:
    """What one side counts that the other does not, and ops both count with different FLOPs (mm and
    addmm together)."""
    reference = _merged(row.stages.get("reference", {}).get("by_op", {}))
    ours = _merged(row.trace.get("forward_matmul_by_op", {}))
    formulas = _flop_counter_formulas() | set(MATRIX_PRODUCTS.values())
    device = row.stages.get("reference", {}).get("device")
    notes = []
    for op, flops in sorted(reference.items(), key=lambda kv: -kv[1]):
        if flops and not ours.get(op):
            notes.append(f"only FlopCounterMode has {op} ({flops / 1e9:.3g} GFLOP)")
        elif flops and abs(ours[op] / flops - 1) > 0.01:
            notes.append(f"{op}: tool {ours[op] / 1e9:.4g} vs {flops / 1e9:.4g} GFLOP")
    for op, flops in sorted(ours.items(), key=lambda kv: -kv[1]):
        if flops and not reference.get(op):
            why = f"not called on {device}" if op in formulas else "no formula in FlopCounterMode"
            notes.append(f"only the tool has {op} ({flops / 1e9:.3g} GFLOP; {why})")
    return "; ".join(notes) or "same ops, same FLOPs within 1%"


def _differences(ours: dict[str, int], real: dict[str, int], limit: int) -> str:
    differences = {op: ours.get(op, 0) - real.get(op, 0) for op in set(real) | set(ours)}
    ranked = sorted(((op, d) for op, d in differences.items() if abs(d) >= 2**16), key=lambda kv: -abs(kv[1]))
    return ", ".join(f"{op} {d / 2**20:+,.1f} MiB" for op, d in ranked[:limit])


def memory_notes(row: Row, limit: int = 5) -> str:
    """Ops whose storages differ in bytes between the trace and the real step (trace - real, 64 KiB or
    more): allocated during the step, and live at each side's peak."""
    real, ours = row.stages.get("real_step", {}), row.trace
    notes = []
    allocated = _differences(ours.get("allocated_by_op", {}), real.get("allocated_by_op", {}), limit)
    if allocated:
        notes.append(f"allocated in the step, trace - real: {allocated}")
    at_peak = _differences(ours.get("live_at_peak_by_op", {}), real.get("live_at_peak_by_op", {}), limit)
    if at_peak:
        notes.append(f"live at the peak, trace - real: {at_peak}")
    return "; ".join(notes)


def failure_groups(rows: list[Row]) -> dict[tuple[str, str], list[str]]:
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for row in rows:
        if row.status != "ok":
            message = row.message if row.status != "timeout" else row.message.split(" (in the")[0]
            groups[(row.status, message)].append(row.name)
    return groups


def summary(rows: list[Row]) -> list[str]:
    ok = [r for r in rows if r.status == "ok"]
    counted = [r for r in ok if r.library_params() is not None]
    exact = [r for r in counted if r.trace["params"] == r.library_params()]
    lines = ["", "== summary", f"traced ok: {len(ok)} of {len(rows)} ({len(ok) / len(rows):.0%})",
             f"parameters equal to the library's count: {len(exact)} of {len(counted)} traced models with a count"]
    for status in ("user error", "internal error", "timeout", "crashed"):
        count = sum(1 for r in rows if r.status == status)
        if count:
            lines.append(f"{status}: {count}")
    lines += ["", "== failures, grouped by cause"]
    groups = failure_groups(rows)
    if not groups:
        lines.append("none")
    for (status, message), names in sorted(groups.items(), key=lambda kv: (kv[0][0], -len(kv[1]))):
        lines.append(f"[{status}] x{len(names)}: {', '.join(names)}")
        lines += [f"    {part}" for part in message.splitlines()]
        for name in names:
            trace = next(r for r in rows if r.name == name).trace
            if trace.get("where"):
                lines.append(f"    ({name}: at {trace['where']})")
            elif "where" in trace:
                lines.append(f"    ({name}: no model frame: the op ran inside torch, e.g. in the backward)")
            if trace.get("frames"):
                lines.append(f"    ({name}: last user frames: {' | '.join(f.strip() for f in trace['frames'])})")
    mismatched = [r for r in counted if r.trace["params"] != r.library_params()]
    lines += ["", "== parameter counts that differ from the library's"]
    lines += [f"{r.name}: traced {r.trace['params']:,}, library {r.library_params():,} "
              f"({r.trace['params'] - r.library_params():+,})" for r in mismatched] or ["none"]
    lines += ["", "== forward FLOPs against FlopCounterMode (tool's matmul-class forward FLOPs / FlopCounterMode's "
                  "forward total)",
              "On meta tensors scaled_dot_product_attention runs its math path (bmm), on the trace's CPU fake tensors "
              "the fused CPU kernel: the same attention. The tool counts a causal one at (s+1)/2s of the full products "
              "(advisor/profile/costs.py attention_flops), FlopCounterMode the full products; FlopCounterMode has no "
              "formula for _grouped_mm (mixture-of-experts layers) or mkldnn_rnn_layer (LSTM on the CPU; on meta the "
              "LSTM runs as addmm per step)."]
    for row in ok:
        reference = row.stages.get("reference", {})
        ratio = row.flop_ratio()
        if ratio is None:
            failed = "; ".join(f"{device}: {e['type']}: {e['message'][:160]}"
                               for device, e in reference.get("failed_on", {}).items())
            reason = failed or row.stages.get("stopped", {}).get("reason", "not run")
            lines.append(f"{row.name:28s}  no reference ({reason})")
            continue
        lines.append(f"{row.name:28s} {ratio:7.3f}  on {reference['device']}, "
                     f"{reference['flops'] / 1e9:,.4g} GFLOP; {flop_notes(row)}")
    lines += ["", "== peak memory of one step: trace against a real CPU step (models under "
                  f"{REAL_STEP_LIMIT / 1e6:.0f} M parameters)"]
    for row in ok:
        real = row.stages.get("real_step")
        if real is None:
            continue
        if "error" in real:
            lines.append(f"{row.name:28s}  real step failed: {real['error']['type']}: {real['error']['message']}")
            continue
        ratio = row.memory_ratio()
        text = (f"{row.name:28s} trace {row.trace['peak_bytes'] / 2**20:9,.1f} MiB  real "
                f"{real['peak_bytes'] / 2**20:9,.1f} MiB  ratio {ratio:.3f}")
        notes = memory_notes(row)
        if notes:
            text += f"; by op: {notes}"
        lines.append(text)
    lines += ["", "== repeatability: the same model traced again after torch.manual_seed(1)"]
    unstable = []
    for row in ok:
        again = row.stages.get("repeat")
        if again is None:
            continue
        if again.get("status") != "ok":
            unstable.append(f"{row.name}: the second trace gave {again.get('status')}")
        elif (again["step_flops"], again["peak_bytes"], again["params"]) != (
                row.trace["step_flops"], row.trace["peak_bytes"], row.trace["params"]):
            unstable.append(f"{row.name}: step FLOPs {row.trace['step_flops'] / 1e9:,.2f} then "
                            f"{again['step_flops'] / 1e9:,.2f} GFLOP, peak {row.trace['peak_bytes'] / 2**20:,.1f} then "
                            f"{again['peak_bytes'] / 2**20:,.1f} MiB")
    repeated = sum(1 for r in ok if "repeat" in r.stages)
    lines += unstable or [f"all {repeated} traced twice gave the same FLOPs, peak and parameters"]
    lines += ["", "== slowest traces and largest RSS"]
    timed = sorted((r for r in rows if "seconds" in r.trace), key=lambda r: -r.trace["seconds"])[:8]
    lines.append("trace s: " + ", ".join(f"{r.name} {r.trace['seconds']:.1f}" for r in timed))
    heavy = sorted((r for r in rows if "rss_mib" in r.trace), key=lambda r: -r.trace["rss_mib"])[:8]
    lines.append("RSS MiB after the trace: " + ", ".join(f"{r.name} {r.trace['rss_mib']:,.0f}" for r in heavy))
    stopped = [r for r in rows if "stopped" in r.stages]
    if stopped:
        lines += ["", "== checks cut short after the trace"]
        lines += [f"{r.name}: {r.stages['stopped']['stage']} stage: {r.stages['stopped']['reason']}" for r in stopped]
    builder = [r for r in rows if "error" in r.stages.get("library_real", {}) and "error" in
               r.stages.get("library_meta", {})]
    if builder:
        lines += ["", "== models whose library build failed outside the tracer too (this benchmark's builder)"]
        lines += [f"{r.name}: {r.stages['library_real']['error']}" for r in builder]
    return lines


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO).stdout.strip()


def header(timeout: float, memory_gib: float) -> list[str]:
    versions = []
    for library in LIBRARIES:
        try:
            versions.append(f"{library} {importlib.metadata.version(library)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{library} not installed")
    dirty = _git("status", "--porcelain", "--", "advisor")
    tree = f"HEAD {_git('rev-parse', '--short', 'HEAD')}" + (
        f" with uncommitted changes in {len(dirty.splitlines())} file(s) under advisor/" if dirty else "")
    return [f"zoo coverage, {dt.date.today().isoformat()}, {tree}; Python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs",
            ", ".join(versions),
            f"one process per model, timeout {timeout:.0f} s, address space capped at {memory_gib:g} GiB; "
            "trace_training_step fp32 at the batch shown, AdamW (foreach) unless noted",
            "params: traced trainable / the library's own count ('= N' when equal); fwd FLOPs: the trace's "
            "matmul-class forward FLOPs / FlopCounterMode's forward FLOPs; mem: the trace's peak / a real CPU step's "
            f"peak of live storages (models under {REAL_STEP_LIMIT / 1e6:.0f} M parameters); trace s and RSS: the "
            "trace call and the child's peak RSS after it (imports included); built: fake or meta construction, "
            "+ri when traced again on real inputs, +real when the step ran on real CPU tensors (weight-dependent "
            "control flow); uncounted: ops without a cost formula x calls (their share of "
            "the step's bytes)", ""]


def models_section(rows: list[Row]) -> list[str]:
    lines = ["", "== models"]
    for row in rows:
        extra = "" if row.entry.optimizer == "adamw" else f", {row.entry.optimizer}"
        lines.append(f"{row.name:28s} batch {row.entry.batch}{extra}: {row.entry.what}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per model")
    parser.add_argument("--memory-gib", type=float, default=DEFAULT_MEMORY_GIB, help="address-space cap per model")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        run_one(args.one, args.memory_gib)
        return 0
    if args.list:
        print("\n".join(f"{name:28s} {m.library:12s} {m.family:18s} {m.what}" for name, m in ZOO.items()))
        return 0
    names = args.models.split(",") if args.models else list(ZOO)
    unknown = [name for name in names if name not in ZOO]
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}")
    rows = []
    for name in names:
        row = run_child(name, args.timeout, args.memory_gib)
        rows.append(row)
        ratio = row.flop_ratio()
        print(f"{name:28s} {row.status:14s} {row.wall_s:6.1f} s  params {params_cell(row)}  fwd FLOPs "
              f"{_ratio(ratio)}  mem {_ratio(row.memory_ratio())}  {row.message[:150]}", flush=True)
    lines = header(args.timeout, args.memory_gib) + table(rows) + summary(rows) + models_section(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    args.out.with_suffix(".json").write_text(json.dumps({"header": header(args.timeout, args.memory_gib)[:3],
                                                         "models": [r.to_dict() for r in rows]}, indent=1,
                                                        default=str) + "\n", encoding="utf-8")
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
