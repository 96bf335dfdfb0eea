"""ResNet-50 v1.5 for 224x224 ImageNet images, in plain torch (the torchvision layout and names).

v1.5 puts the stride-2 of a downsampling bottleneck on the 3x3 convolution, as torchvision and
NVIDIA's DeepLearningExamples do. 25,557,032 parameters.
"""

import torch
from torch import nn
from torch.nn import functional as F

SAMPLE_UNIT = "images"
BATCH_SIZE = 32
TRAIN_SAMPLES = 1_281_167  # ImageNet-1k training images
IMAGE_SIZE = 224
NUM_CLASSES = 1000
LAYERS = (3, 4, 6, 3)
"""Bottleneck blocks per stage: (3, 4, 6, 3) is ResNet-50, (3, 4, 23, 3) ResNet-101, (3, 8, 36, 3) ResNet-152."""


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, layers: tuple[int, ...] = LAYERS, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages = []
        in_channels = 64
        for index, blocks in enumerate(layers):
            width = 64 * 2**index
            stride = 1 if index == 0 else 2
            stage = []
            for block in range(blocks):
                stage.append(Bottleneck(in_channels, width, stride if block == 0 else 1))
                in_channels = width * Bottleneck.expansion
            stages.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build_model(layers: tuple[int, ...] = LAYERS) -> nn.Module:
    return ResNet(layers)


def example_input(batch_size: int, image_size: int = IMAGE_SIZE) -> torch.Tensor:
    return torch.randn(batch_size, 3, image_size, image_size)


def loss_fn(output: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    labels = torch.zeros(output.shape[0], dtype=torch.long, device=output.device)
    return F.cross_entropy(output, labels)
