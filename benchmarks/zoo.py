"""Architectures of the published benchmarks that are not built-in examples, in plain torch, with
torchvision's layouts (torchvision is not a dependency; its wheels pin one torch build). Parameter
counts are checked against torchvision's in tests/test_zoo.py.

Each entry builds (build_model, example_input, loss_fn) for the accuracy benchmark.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from advisor.profile.model_file import load_model_file
from advisor.profile.trace import PURE_LOW_PRECISION, cast_inputs

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ModelParts = tuple[Callable[[], nn.Module], Callable[[int], Any], Callable[[Any, Any], torch.Tensor] | None]


def classification_loss(output: torch.Tensor, inputs: Any) -> torch.Tensor:
    return F.cross_entropy(output, torch.zeros(output.shape[0], dtype=torch.long, device=output.device))


def images(size: int) -> Callable[[int], torch.Tensor]:
    return lambda batch: torch.randn(batch, 3, size, size)


# ----------------------------------------------------------------------------- ResNet family


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_channels: int, width: int, stride: int, groups: int = 1, base_width: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.downsample = _downsample(in_channels, width, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_channels: int, planes: int, stride: int, groups: int = 1, base_width: int = 64,
                 squeeze_excite: bool = False) -> None:
        super().__init__()
        width = int(planes * base_width / 64) * groups
        out_channels = planes * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.se = SqueezeExcite(out_channels, out_channels // 16, nn.ReLU) if squeeze_excite else None
        self.downsample = _downsample(in_channels, out_channels, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.se is not None:
            out = self.se(out)
        return F.relu(out + identity)


def _downsample(in_channels: int, out_channels: int, stride: int) -> nn.Module | None:
    if stride == 1 and in_channels == out_channels:
        return None
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels))


class ResNet(nn.Module):
    def __init__(self, block: type, layers: tuple[int, ...], groups: int = 1, base_width: int = 64,
                 squeeze_excite: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        channels = 64
        stages = []
        for index, blocks in enumerate(layers):
            planes = 64 * 2**index
            stage = []
            for number in range(blocks):
                stride = 2 if index > 0 and number == 0 else 1
                extra = {"squeeze_excite": squeeze_excite} if block is Bottleneck else {}
                stage.append(block(channels, planes, stride, groups, base_width, **extra))
                channels = planes * block.expansion
            stages.append(nn.Sequential(*stage))
        self.layers = nn.Sequential(*stages)
        self.fc = nn.Linear(channels, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = F.adaptive_avg_pool2d(self.layers(x), 1)
        return self.fc(torch.flatten(x, 1))


# ----------------------------------------------------------------------------- VGG, DenseNet


class VGG16(nn.Module):
    CONFIG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")
    HIDDEN = 4096
    CLASSES = 1000

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in self.CONFIG:
            if item == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(channels, int(item), 3, padding=1), nn.ReLU(inplace=True)]
                channels = int(item)
        self.features = nn.Sequential(*layers)
        hidden = self.HIDDEN
        self.classifier = nn.Sequential(nn.Linear(channels * 7 * 7, hidden), nn.ReLU(True), nn.Dropout(),
                                        nn.Linear(hidden, hidden), nn.ReLU(True), nn.Dropout(),
                                        nn.Linear(hidden, self.CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 7)
        return self.classifier(torch.flatten(x, 1))


class DenseLayer(nn.Module):
    def __init__(self, channels: int, growth: int = 32, bottleneck: int = 4) -> None:
        super().__init__()
        self.norm1, self.conv1 = nn.BatchNorm2d(channels), nn.Conv2d(channels, bottleneck * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bottleneck * growth)
        self.conv2 = nn.Conv2d(bottleneck * growth, growth, 3, padding=1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = self.conv1(F.relu(self.norm1(torch.cat(features, 1))))
        return self.conv2(F.relu(self.norm2(x)))


class DenseNet121(nn.Module):
    BLOCKS = (6, 12, 24, 16)

    def __init__(self, growth: int = 32) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(True),
                                  nn.MaxPool2d(3, 2, 1))
        channels = 64
        self.blocks = nn.ModuleList()
        self.transitions = nn.ModuleList()
        for index, count in enumerate(self.BLOCKS):
            self.blocks.append(nn.ModuleList(DenseLayer(channels + i * growth, growth) for i in range(count)))
            channels += count * growth
            if index < len(self.BLOCKS) - 1:
                self.transitions.append(nn.Sequential(nn.BatchNorm2d(channels), nn.ReLU(True),
                                                      nn.Conv2d(channels, channels // 2, 1, bias=False),
                                                      nn.AvgPool2d(2, 2)))
                channels //= 2
        self.norm = nn.BatchNorm2d(channels)
        self.classifier = nn.Linear(channels, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for index, block in enumerate(self.blocks):
            features = [x]
            for layer in block:
                features.append(layer(features))
            x = torch.cat(features, 1)
            if index < len(self.transitions):
                x = self.transitions[index](x)
        x = F.adaptive_avg_pool2d(F.relu(self.norm(x)), 1)
        return self.classifier(torch.flatten(x, 1))


# ----------------------------------------------------------------------------- EfficientNet


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeezed: int, activation: type = nn.SiLU) -> None:
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(channels, squeezed, 1), nn.Conv2d(squeezed, channels, 1)
        self.activation = activation()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.expand(self.activation(self.reduce(F.adaptive_avg_pool2d(x, 1))))
        return x * torch.sigmoid(scale)


class MBConv(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int, expansion: int,
                 widese: bool = False) -> None:
        super().__init__()
        hidden = in_channels * expansion
        squeezed = max(1, (hidden if widese else in_channels) // 4)
        layers: list[nn.Module] = []
        if expansion != 1:
            layers += [nn.Conv2d(in_channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.SiLU()]
        layers += [nn.Conv2d(hidden, hidden, kernel, stride, kernel // 2, groups=hidden, bias=False),
                   nn.BatchNorm2d(hidden), nn.SiLU(), SqueezeExcite(hidden, squeezed),
                   nn.Conv2d(hidden, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.residual else self.block(x)


EFFICIENTNET_STAGES = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
                       (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1))
"""(expansion, kernel, stride, in, out, repeats) of EfficientNet-B0 (torchvision's table)."""


def _round_channels(channels: float, divisor: int = 8) -> int:
    rounded = max(divisor, int(channels + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * channels else rounded


class EfficientNet(nn.Module):
    def __init__(self, width: float, depth: float, widese: bool = False) -> None:
        """`widese`: NVIDIA's WideSE variants size the squeeze-excite bottleneck from the expanded
        channels instead of the block's input channels."""
        super().__init__()
        stem = _round_channels(32 * width)
        layers: list[nn.Module] = [nn.Conv2d(3, stem, 3, 2, 1, bias=False), nn.BatchNorm2d(stem), nn.SiLU()]
        channels = stem
        for expansion, kernel, stride, _, out, repeats in EFFICIENTNET_STAGES:
            out_channels = _round_channels(out * width)
            for index in range(int(math.ceil(repeats * depth))):
                layers.append(MBConv(channels, out_channels, kernel, stride if index == 0 else 1, expansion, widese))
                channels = out_channels
        head = _round_channels(1280 * width)
        layers += [nn.Conv2d(channels, head, 1, bias=False), nn.BatchNorm2d(head), nn.SiLU()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(head, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# ----------------------------------------------------------------------------- the table


def example(name: str, **config_changes: Any) -> ModelParts:
    """A built-in example's parts, its CONFIG changed as given (e.g. BERT-large, sequence 512)."""
    module = load_model_file(name)
    if not config_changes:
        return module.build_model, module.example_input, module.loss_fn
    config = dataclasses.replace(module.build_model.__globals__["CONFIG"], **config_changes)
    return (functools.partial(module.build_model, config), functools.partial(module.example_input, config=config),
            module.loss_fn)


def cast_model_and_inputs(model: nn.Module, inputs: Any, precision: str) -> tuple[nn.Module, Any]:
    """The model and inputs cast to 16 bits for the pure low-precision precisions (bf16, fp16)."""
    dtype = PURE_LOW_PRECISION.get(precision)
    return (model, inputs) if dtype is None else (model.to(dtype), cast_inputs(inputs, dtype))


def vision(build: Callable[[], nn.Module], size: int = 224) -> ModelParts:
    return build, images(size), classification_loss


BERT_LARGE = dict(hidden=1024, layers=24, heads=16, intermediate=4096)

ZOO: dict[str, Callable[[int | None], ModelParts]] = {
    "resnet18": lambda size: vision(lambda: ResNet(BasicBlock, (2, 2, 2, 2)), size or 224),
    "resnet50": lambda size: vision(lambda: ResNet(Bottleneck, (3, 4, 6, 3)), size or 224),
    "resnet152": lambda size: vision(lambda: ResNet(Bottleneck, (3, 8, 36, 3)), size or 224),
    "resnext101_32x4d": lambda size: vision(lambda: ResNet(Bottleneck, (3, 4, 23, 3), 32, 4), size or 224),
    "se_resnext101_32x4d": lambda size: vision(lambda: ResNet(Bottleneck, (3, 4, 23, 3), 32, 4, True), size or 224),
    "vgg16": lambda size: vision(VGG16, size or 224),
    "densenet121": lambda size: vision(DenseNet121, size or 224),
    "mobilenet_v2": lambda size: vision(load_model_file("mobilenet_v2").build_model, size or 224),
    "efficientnet_b0": lambda size: vision(lambda: EfficientNet(1.0, 1.0), size or 224),
    "efficientnet_b4": lambda size: vision(lambda: EfficientNet(1.4, 1.8), size or 380),
    "efficientnet_widese_b0": lambda size: vision(lambda: EfficientNet(1.0, 1.0, True), size or 224),
    "efficientnet_widese_b4": lambda size: vision(lambda: EfficientNet(1.4, 1.8, True), size or 380),
    # The published BERT runs (NVIDIA DLE, Lambda's fork of it, Hugging Face 4.27) all compute attention as
    # matmul, softmax, dropout, matmul: not torch's fused scaled_dot_product_attention, which did not exist.
    "bert_base": lambda seq: example("bert_base", seq_len=seq or 384, eager_attention=True),
    "bert_large": lambda seq: example("bert_base", seq_len=seq or 384, eager_attention=True, **BERT_LARGE),
}


# ----------------------------------------------------------------------------- timm's own models


TIMM_MODELS = ("tf_efficientnetv2_b0", "swin_base_patch4_window7_224", "efficientvit_m4")
"""Architectures of the newer published rows (NikolasEnt's runs of timm's benchmark.py) not written out here:
built by timm itself, `timm.create_model(name, pretrained=False)` as benchmark.py builds them (default
pooling, dropout and stochastic depth; no weights read). timm is in the `bench` extra."""


@functools.cache
def timm_missing() -> str | None:
    """Why timm's models cannot be built here, in a few words; None where they can."""
    try:
        importlib.import_module("timm")
    except Exception as exc:  # noqa: BLE001 - not installed, or its torchvision does not load beside this torch
        return f"timm not importable ({type(exc).__name__}; pip install '.[bench]')"
    return None


def timm_vision(name: str, size: int | None) -> ModelParts:
    """timm's model `name` (one of TIMM_MODELS) on `size` x `size` images (default 224), cross-entropy loss."""
    def build() -> nn.Module:
        import timm

        return timm.create_model(name, pretrained=False)
    return build, images(size or 224), classification_loss


def zoo_parts(name: str, size: int | None) -> ModelParts | str:
    """The parts of ZOO's entry `name` or of timm's model `name` (TIMM_MODELS) at `size`; a sentence saying
    why not where timm cannot be imported."""
    if name in ZOO:
        return ZOO[name](size)
    assert name in TIMM_MODELS, name
    return timm_missing() or timm_vision(name, size)


if __name__ == "__main__":  # parameter counts, to compare with torchvision's
    for name, parts in ZOO.items():
        model = parts(None)[0]()
        print(f"{name:24s} {sum(p.numel() for p in model.parameters()):>12,}", file=sys.stdout)
