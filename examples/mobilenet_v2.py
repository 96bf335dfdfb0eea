"""MobileNetV2 (Sandler et al. 2018) for 224x224 images, in plain torch (the torchvision layout).

Inverted residual blocks: a 1x1 expansion, a 3x3 depthwise convolution (groups = channels) and a
1x1 projection, with BatchNorm and ReLU6. Width multiplier 1.0: 3,504,872 parameters. Its depthwise
convolutions do little arithmetic per byte: the example of a memory-bound CNN.
"""

import torch
from torch import nn

SAMPLE_UNIT = "images"
BATCH_SIZE = 64
TRAIN_SAMPLES = 1_281_167  # ImageNet-1k training images
IMAGE_SIZE = 224
NUM_CLASSES = 1000
SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
"""(expansion t, output channels c, repeats n, first stride s) of each stage, as in the paper's Table 2."""


def conv_bn(in_channels: int, out_channels: int, kernel: int, stride: int = 1, groups: int = 1,
            activation: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(in_channels, out_channels, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_channels),
    ]
    if activation:
        layers.append(nn.ReLU6(inplace=True))
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int, expansion: int) -> None:
        super().__init__()
        hidden = in_channels * expansion
        layers: list[nn.Module] = [] if expansion == 1 else [conv_bn(in_channels, hidden, 1)]
        layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden), conv_bn(hidden, out_channels, 1, activation=False)]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_bn(3, 32, 3, 2)]
        channels = 32
        for expansion, out_channels, repeats, stride in SETTINGS:
            for index in range(repeats):
                layers.append(InvertedResidual(channels, out_channels, stride if index == 0 else 1, expansion))
                channels = out_channels
        layers.append(conv_bn(channels, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def build_model() -> nn.Module:
    return MobileNetV2()


def example_input(batch_size: int, image_size: int = IMAGE_SIZE) -> torch.Tensor:
    return torch.randn(batch_size, 3, image_size, image_size)


def loss_fn(output: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against fixed labels (class 0): the cost of a real classification loss."""
    return nn.functional.cross_entropy(output, torch.zeros(output.shape[0], dtype=torch.long, device=output.device))
