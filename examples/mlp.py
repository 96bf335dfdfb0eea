"""A multilayer perceptron on 28x28 grey images (MNIST-sized): the smallest example.

784 -> 1024 -> 1024 -> 10 with ReLU: 784*1024+1024 + 1024*1024+1024 + 1024*10+10 = 1,863,690 parameters.
"""

import torch
from torch import nn
from torch.nn import functional as F

SAMPLE_UNIT = "images"
BATCH_SIZE = 64
TRAIN_SAMPLES = 60_000  # MNIST training images
HIDDEN = 1024


def build_model(hidden: int = HIDDEN) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(28 * 28, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )


def example_input(batch_size: int) -> torch.Tensor:
    return torch.randn(batch_size, 1, 28, 28)


def loss_fn(output: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against class 0 for every sample (the labels' values do not change the cost)."""
    labels = torch.zeros(output.shape[0], dtype=torch.long, device=output.device)
    return F.cross_entropy(output, labels)
