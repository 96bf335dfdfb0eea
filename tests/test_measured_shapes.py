"""A local CPU's convolutions timed at their exact shapes (issue #20, calibration/shapes.py): the trace keeps
each call's sizes, the calls are timed for real and stored beside the calibration, and the step uses the
times in place of the calibrated curves."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from advisor.calibration import shapes
from advisor.calibration.shapes import is_depthwise, load_stored, measure_shapes, shape_key
from advisor.estimate.step import DeviceModel, estimate_records
from advisor.estimate.targets import EstimateTarget, with_measured_shapes
from advisor.hardware.loader import load_hwdb
from advisor.profile.trace import trace_training_step
from tests.test_estimate import synthetic_profile


class DepthwiseNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.dw = torch.nn.Conv2d(8, 8, 5, padding=2, groups=8, bias=False)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.dw(self.stem(x)).mean((2, 3)))


def traced() -> tuple:
    trace = trace_training_step(DepthwiseNet, lambda batch: torch.randn(batch, 3, 16, 16), 2, "fp32", "sgd")
    return trace, [r for r in trace.records if r.conv is not None]


def test_the_trace_keeps_each_convolutions_own_sizes() -> None:
    _, convolutions = traced()
    # forward: the stem over [2, 3, 16, 16] (weight [8, 3, 3, 3], stride 2, padding 1), the depthwise 5x5 over
    # the stem's [2, 8, 8, 8] output (weight [8, 1, 5, 5], padding 2, 8 groups)
    forward = {r.conv.input_shape: shape_key(r.op, r.dtypes, r.conv) for r in convolutions if r.op == "convolution"}
    assert forward[(2, 3, 16, 16)][3:6] == ((8, 3, 3, 3), (2, 2), (1, 1))
    assert forward[(2, 8, 8, 8)][3:6] == ((8, 1, 5, 5), (1, 1), (2, 2)) and forward[(2, 8, 8, 8)][9] == 8
    assert is_depthwise(forward[(2, 8, 8, 8)]) and not is_depthwise(forward[(2, 3, 16, 16)])
    # backward: the stem's input needs no gradient (only grad_weight), the depthwise one both
    computes = {r.conv.input_shape: r.conv.computes for r in convolutions if r.op == "convolution_backward"}
    assert computes == {(2, 3, 16, 16): ("grad_weight",), (2, 8, 8, 8): ("grad_input", "grad_weight")}


def test_shapes_are_timed_once_and_stored_beside_their_calibration(tmp_path: Path) -> None:
    _, convolutions = traced()
    wanted = {shape_key(r.op, r.dtypes, r.conv): 1e-4 for r in convolutions}
    path = tmp_path / "cpu-shapes.json"
    first = measure_shapes(wanted.items(), "2026-11-27T00:00:00", path=path)
    assert first.measured_now == 4 and first.left_out == 0 and set(first.seconds) == set(wanted)
    assert all(0 < seconds < 0.5 for seconds in first.seconds.values())
    assert load_stored("2026-11-27T00:00:00", path) == first.seconds
    again = measure_shapes(wanted.items(), "2026-11-27T00:00:00", path=path)
    assert again.measured_now == 0 and again.seconds == first.seconds
    # another calibration (a new timestamp) times them again; a damaged file is measured over
    assert load_stored("2026-11-28T00:00:00", path) == {}
    path.write_text("{not json")
    assert measure_shapes(wanted.items(), "2026-11-27T00:00:00", path=path).measured_now == 4
    assert json.loads(path.read_text())["format"] == shapes.FORMAT


def test_a_spent_budget_or_a_slow_predicted_call_leaves_the_shape_to_the_curve(tmp_path: Path) -> None:
    _, convolutions = traced()
    keys = [shape_key(r.op, r.dtypes, r.conv) for r in convolutions]
    none = measure_shapes([(key, 1e-4) for key in keys], "t", budget_s=-1.0, path=tmp_path / "a.json")
    assert none.seconds == {} and none.left_out == 4 and not (tmp_path / "a.json").exists()
    slow = measure_shapes([(key, shapes.MAX_CALL_S * 2) for key in keys], "t", path=tmp_path / "b.json")
    assert slow.seconds == {} and slow.left_out == 4


def test_measured_times_replace_the_curves_for_those_calls_only(tmp_path: Path, monkeypatch) -> None:
    trace, convolutions = traced()
    profile = dataclasses.replace(synthetic_profile(dispatch_s=0.0), status="measured")
    device = DeviceModel("local-cpu", "cpu", profile)
    dw_forward = next(r for r in convolutions if r.op == "convolution" and r.conv.groups == 8)
    key = shape_key(dw_forward.op, dw_forward.dtypes, dw_forward.conv)
    # 3 ms, far from the curve's microseconds: the op's kernel is exactly that; other ops keep the curves
    timed = dataclasses.replace(device, measured_s={key: 3e-3})
    before = estimate_records(trace.records, "fp32", device)
    after = estimate_records(trace.records, "fp32", timed)
    index = trace.records.index(dw_forward)
    assert after.ops[index].kernel_s == pytest.approx(3e-3)
    assert [op.kernel_s for i, op in enumerate(after.ops) if i != index] == \
        [op.kernel_s for i, op in enumerate(before.ops) if i != index]
    # the planning API measures a local CPU's shapes and says so in its note; a database GPU is left alone
    monkeypatch.setattr(shapes, "store_path", lambda: tmp_path / "cpu-shapes.json")
    overhead = load_hwdb([]).memory_overhead_default()
    local = EstimateTarget("local-cpu", "this CPU", device, 0, overhead, local=True, note="quick calibration")
    measured = with_measured_shapes(local, trace.records, "fp32", lambda message: None)
    assert set(measured.device.measured_s) == {shape_key(r.op, r.dtypes, r.conv) for r in convolutions}
    assert measured.note == "quick calibration; 4 of 4 convolution and batch-norm shapes timed on this CPU " \
                            f"(4 now, {measured.note.split('now, ')[1].split(' s)')[0]} s)"
    gpu = EstimateTarget("h100", "H100", DeviceModel("h100", "gpu", profile), 0, overhead)
    assert with_measured_shapes(gpu, trace.records, "fp32", lambda message: None) is gpu


class NormNet(torch.nn.Module):
    """A convolution, a batch norm in training and one frozen in eval mode (running statistics)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        self.frozen = torch.nn.BatchNorm2d(8).eval()
        self.head = torch.nn.Linear(8, 4)

    def train(self, mode: bool = True) -> NormNet:
        super().train(mode)
        self.frozen.eval()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.frozen(self.bn(self.conv(x))).mean((2, 3)))


def test_batch_norms_in_training_are_keyed_by_their_input_sizes_and_timed_like_convolutions(tmp_path: Path) -> None:
    trace = trace_training_step(NormNet, lambda batch: torch.randn(batch, 3, 16, 16), 2, "fp32", "sgd")
    norms = [r for r in trace.records if r.norm is not None]
    keys = {shapes.call_key(r.op, r.dtypes, r.conv, r.norm) for r in norms}
    # the trained norm over [2, 8, 16, 16], forward and backward; the frozen one (running statistics) has
    # no key: it is left to the calibrated curve
    assert keys == {("native_batch_norm", "float32", (2, 8, 16, 16), False),
                    ("native_batch_norm_backward", "float32", (2, 8, 16, 16), False), None}
    assert not any(shapes.is_depthwise(key) for key in keys if key is not None)
    wanted = {key: 1e-5 for key in keys if key is not None}
    # operands rotate through copies: 4,096 fp32 elements (16 KiB) in 8 copies for 128 KiB
    call = shapes._call(("native_batch_norm_backward", "float32", (2, 8, 16, 16), False), 2 * 8 * 4096 * 4.0)
    grad_input, grad_weight, grad_bias = call()
    assert grad_input.shape == (2, 8, 16, 16) and grad_weight.shape == grad_bias.shape == (8,)
    measured = measure_shapes(wanted.items(), "2026-11-28T00:00:00", path=tmp_path / "shapes.json")
    assert measured.measured_now == 2 and all(0 < s < 0.5 for s in measured.seconds.values())


def test_a_measured_batch_norm_replaces_its_curve(tmp_path: Path) -> None:
    trace = trace_training_step(NormNet, lambda batch: torch.randn(batch, 3, 16, 16), 2, "fp32", "sgd")
    profile = dataclasses.replace(synthetic_profile(dispatch_s=0.0), status="measured")
    device = DeviceModel("local-cpu", "cpu", profile)
    backward = next(r for r in trace.records if r.op == "native_batch_norm_backward" and r.norm.training)
    key = shapes.call_key(backward.op, backward.dtypes, backward.conv, backward.norm)
    after = estimate_records(trace.records, "fp32", dataclasses.replace(device, measured_s={key: 2e-3}))
    assert after.ops[trace.records.index(backward)].kernel_s == pytest.approx(2e-3)
