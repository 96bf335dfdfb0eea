"""The benchmark zoo builds torchvision's architectures: parameter counts equal torchvision's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from zoo import ZOO  # noqa: E402

TORCHVISION_PARAMS = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "resnet152": 60_192_808,
    "vgg16": 138_357_544,
    "densenet121": 7_978_856,
    "mobilenet_v2": 3_504_872,
    "efficientnet_b0": 5_288_548,
    "efficientnet_b4": 19_341_616,
}
"""torchvision.models' parameter counts (its model documentation's "num_params")."""


@pytest.mark.parametrize("name", sorted(TORCHVISION_PARAMS))
def test_parameter_counts_match_torchvision(name: str) -> None:
    with torch.device("meta"):
        model = ZOO[name](None)[0]()
    assert sum(p.numel() for p in model.parameters()) == TORCHVISION_PARAMS[name]
