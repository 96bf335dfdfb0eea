"""ResNet-50 v1.5 (examples/resnet50.py) trained in channels-last memory format, as NVIDIA's
DeepLearningExamples and MosaicML's Composer train it on A100s: cuDNN's tensor-core convolutions
then need no NCHW <-> NHWC transposes. For benchmarks/input_pipeline.py's A100 host check."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import resnet50 as base  # noqa: E402

SAMPLE_UNIT = base.SAMPLE_UNIT
BATCH_SIZE = 256
TRAIN_SAMPLES = base.TRAIN_SAMPLES


def build_model() -> torch.nn.Module:
    return base.build_model().to(memory_format=torch.channels_last)


def example_input(batch_size: int) -> torch.Tensor:
    return base.example_input(batch_size).contiguous(memory_format=torch.channels_last)


loss_fn = base.loss_fn
