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


def test_eager_bert_attention_computes_what_the_fused_one_does() -> None:
    """The published BERT rows ran matmul-softmax-dropout-matmul attention (zoo: eager_attention=True);
    without dropout it must give the example's scaled_dot_product_attention results."""
    from zoo import example

    tiny = dict(vocab_size=100, max_positions=16, hidden=32, layers=2, heads=4, intermediate=64, seq_len=16)
    fused_build, make_input, _ = example("bert_base", **tiny)
    eager_build, _, _ = example("bert_base", eager_attention=True, **tiny)
    torch.manual_seed(0)
    fused = fused_build().eval()
    eager = eager_build().eval()
    eager.load_state_dict(fused.state_dict())
    inputs = make_input(3)
    inputs["attention_mask"][0, 10:] = 0  # padding in one sequence: the additive mask must matter
    with torch.no_grad():
        for ours, theirs in zip(eager(**inputs), fused(**inputs)):
            torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("source", "label", "architecture", "expected"), [
    ("LAMBDA_V0", "FP16-mixed", "turing", "fp16"),  # apex --fp16: the model itself in fp16 (SOURCES.md)
    ("LAMBDA_V0", "FP32", "ampere", "tf32"),  # NGC containers turn TF32 on for Ampere
    ("LAMBDA_V0", "FP32", "volta", "fp32"),
    ("NV_DLE_RN50", "AMP", "ampere", "amp-fp16"),
    ("RYUJAEHUN_BS12", "FP16-pure (model.half())", "turing", "fp16"),
    ("NV_DLE_BERT", "FP8", "hopper", None),
])
def test_published_precision_labels_map_to_ours(source: str, label: str, architecture: str,
                                                expected: str | None) -> None:
    from accuracy import precision_of

    assert precision_of({"source_id": source, "precision": label}, architecture) == expected


@pytest.mark.parametrize(("source", "label", "expected"), [
    ("NV_DLE_RN50", "AMP", True),  # DLE configs.yml: memory_format: nhwc for every AMP run
    ("NV_DLE_RNXT101", "AMP", True),
    ("NV_DLE_RN50", "TF32", False),  # FP32/TF32 runs keep the default NCHW
    ("LAMBDA_V0", "FP16-mixed", False),  # Lambda's DLE fork never set it
    ("RYUJAEHUN_BS12", "FP16-pure (model.half())", False),
])
def test_published_runs_memory_format(source: str, label: str, expected: bool) -> None:
    from accuracy import channels_last_of

    assert channels_last_of({"source_id": source, "precision": label}) == expected
