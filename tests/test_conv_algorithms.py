"""Convolutions on a GPU: the geometry the trace records, and the algorithm cuDNN's autotuner would
pick (Winograd for fp32 3x3 stride-1 convolutions on CUDA cores, tensor-core implicit GEMM with NCHW<->NHWC
transposes for channels-first tensors, fp32 CUDA cores where TF32 gains nothing), by hand."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch import nn

from advisor.calibration.peaks import DevicePeaks
from advisor.calibration.profile import CalibrationProfile, SeriesProfile
from advisor.estimate.ops import (
    classify,
    layout_transposes,
    pointwise_product,
    pointwise_tf32_efficiency,
    winograd_eligible,
)
from advisor.estimate.step import DeviceModel, estimate_records
from advisor.profile.costs import ConvGeometry
from advisor.profile.trace import OpRecord, trace_training_step
from tests.test_estimate import FLAT, mm


def profile(tf32_flops: float | None = 8e12) -> CalibrationProfile:
    """1 TFLOP/s fp32, `tf32_flops` TF32 (None: no TF32 units, as before Ampere) and 4 TFLOP/s fp16
    tensor-core GEMMs, 100 GB/s copies, all at 50%."""
    series = [
        SeriesProfile("gemm", "fp32", "flops", 1e12, FLAT),
        SeriesProfile("gemm", "fp16", "flops", 4e12, FLAT),
        SeriesProfile("copy", "fp32", "bytes", 1e11, FLAT),
    ]
    peaks = {"fp32": 1e12, "fp16": 4e12}
    if tf32_flops is not None:
        series.append(SeriesProfile("gemm", "tf32", "flops", tf32_flops, FLAT))
        peaks["tf32"] = tf32_flops
    return CalibrationProfile("test", "test device", "measured", "quick", "2026-11-22", DevicePeaks(peaks, 1e11),
                              1e11, {"dispatch": 0.0, "autograd": 0.0}, tuple(series))


def conv(c_in: int, c_out: int, kernel: int, stride: int, dtype: str, channels_last: bool = False) -> OpRecord:
    """A forward convolution of x [8, c_in, 56, 56] (padding keeps 56x56 at stride 1)."""
    size = 2 if dtype == "float16" else 4
    side = 56 // stride
    x, w, y = 8 * c_in * 56 * 56, c_out * c_in * kernel * kernel, 8 * c_out * side * side
    geometry = ConvGeometry((kernel, kernel), (stride, stride), (1, 1), 1, False, c_in, c_out, channels_last,
                            x, y, w)
    flops = 2.0 * 8 * side * side * c_out * c_in * kernel * kernel
    return OpRecord("forward", "conv", "convolution", flops, (x + w) * size, y * size, (dtype,), True, True,
                    (1, 8 * side * side, c_out, c_in * kernel * kernel), conv=geometry)


def seconds(record: OpRecord, precision: str, kind: str = "gpu", tf32_flops: float | None = 8e12) -> float:
    return estimate_records([record], precision, DeviceModel(kind, kind, profile(tf32_flops))).step_s


def test_tensor_core_convolution_of_nchw_tensors_pays_the_transposes() -> None:
    # 3x3 conv, x [8, 64, 56, 56] -> y [8, 256, 56, 56] in fp16: 2*8*3136*256*64*9 = 7,398,752,256 FLOPs
    # at 4e12 x 50% = 3,699.38 us. The transposes move x, w and y (1,605,632 + 147,456 + 6,422,528 =
    # 8,175,616 elements), each read and written at 2 bytes: 32,702,464 B at 1e11 x 50% = 654.05 us.
    record = conv(64, 256, 3, 1, "float16")
    assert seconds(record, "fp16") == pytest.approx(3699.38e-6 + 654.05e-6, rel=1e-4)
    channels_last = dataclasses.replace(record, conv=dataclasses.replace(record.conv, channels_last=True))
    assert seconds(channels_last, "fp16") == pytest.approx(3699.38e-6, rel=1e-4)
    assert seconds(record, "fp16", kind="cpu") == pytest.approx(3699.38e-6, rel=1e-4)  # no cuDNN on a CPU
    step = estimate_records([record], "fp16", DeviceModel("gpu", "gpu", profile()))
    # own bytes: (1,605,632 + 147,456 + 6,422,528) x 2 = 16,351,232 B at the sustained 1e11 B/s = 163.51 us
    assert step.ops[0].memory_s == pytest.approx(163.51e-6 + 654.05e-6, rel=1e-4)


def test_a_pointwise_convolution_of_nchw_tensors_is_a_product_with_no_transposes() -> None:
    # 1x1 conv at stride 1, x [8, 64, 56, 56] -> y [8, 256, 56, 56] in fp16: per image y (256 x 3136) =
    # w (256 x 64) @ x (64 x 3136), GEMMs on the tensors as they lie: 2*8*3136*256*64 = 822,083,584 FLOPs
    # at 4e12 x 50% = 411.04 us, and nothing transposed
    record = conv(64, 256, 1, 1, "float16")
    assert pointwise_product(record.conv) and layout_transposes(record.conv) == ()
    assert seconds(record, "fp16") == pytest.approx(411.04e-6, rel=1e-4)
    assert not pointwise_product(conv(64, 256, 1, 2, "float16").conv)  # strided: a gather, transposed
    assert not pointwise_product(dataclasses.replace(record.conv, padding=(1, 1)))
    assert not pointwise_product(dataclasses.replace(record.conv, groups=4))


def test_a_pointwise_tf32_product_on_nchw_reads_strided_operands() -> None:
    # forward y = w @ x reduces over channels, x's strided dimension: 1 / 0.8 of the K-major time; a
    # backward computing both gradients: dgrad's two operands and wgrad's none, (1/0.64 + 1) / 2 = 1.28125
    record = conv(512, 512, 1, 1, "float32")
    assert pointwise_tf32_efficiency(record.conv) == pytest.approx(0.8)
    backward = dataclasses.replace(record.conv, computes=("grad_input", "grad_weight"))
    assert pointwise_tf32_efficiency(backward) == pytest.approx(1 / 1.28125)
    assert pointwise_tf32_efficiency(dataclasses.replace(record.conv, computes=("grad_weight",))) == 1.0
    # 2*8*3136*512*512 = 13,153,337,344 FLOPs at 8e12 x 50%: 3.288 ms, / 0.8 = 4.110 ms (no transposes)
    assert seconds(record, "tf32") == pytest.approx(3.28833e-3 / 0.8, rel=1e-4)


def test_fp32_3x3_stride_1_convolution_runs_winograd_on_a_gpu() -> None:
    # 3x3 conv 64 -> 64 on 56x56, batch 8: 2*8*3136*64*64*9 = 1,849,688,064 FLOPs; at 1e12 x 50% that
    # is 3.699 ms as implicit GEMM (the CPU's time), and 1/2.25 of it, 1.644 ms, with Winograd, on a
    # GPU with no TF32 units (Volta).
    record = conv(64, 64, 3, 1, "float32")
    assert seconds(record, "fp32", kind="cpu") == pytest.approx(3.6994e-3, rel=1e-4)
    assert seconds(record, "fp32", tf32_flops=None) == pytest.approx(3.6994e-3 / 2.25, rel=1e-4)
    # With TF32 units (a GeForce Ampere's run at its fp32 rate, 1e12) cuDNN's allow_tf32 default takes a
    # TF32 implicit GEMM (3.699 ms + the NCHW transposes) or fp32 CUDA cores (3.699 ms), not Winograd
    assert seconds(record, "fp32", tf32_flops=1e12) == pytest.approx(3.6994e-3, rel=1e-4)
    strided = conv(64, 64, 3, 2, "float32")  # stride 2: implicit GEMM, 1/4 of the FLOPs
    assert seconds(strided, "fp32", tf32_flops=None) == pytest.approx(3.6994e-3 / 4, rel=1e-4)


def test_tf32_convolution_takes_the_faster_of_tensor_cores_and_cuda_cores() -> None:
    # 3x3 conv 512 -> 512 on x [8, 512, 56, 56], fp32 tensors: 2*8*3136*512*512*9 = 118,380,036,096 FLOPs
    # over (12,845,056 + 2,359,296 + 12,845,056) x 4 B = 112,197,632 B (1,055 FLOP/B: compute-bound).
    # The transposes read and write all three: 224,395,264 B at 1e11 x 50% = 4.488 ms.
    # TF32 at 8e12 (x 50%): 29.595 ms + 4.488 ms = 34.083 ms, faster than fp32 CUDA cores at 1e12 (x 50%):
    # 236.760 ms. TF32 at 1e12 (a GeForce Ampere's TF32 rate is its fp32 rate): 236.760 ms + 4.488 ms,
    # so the CUDA cores, which read NCHW as it is, win with 236.760 ms.
    record = conv(512, 512, 3, 1, "float32")
    assert seconds(record, "tf32") == pytest.approx(29.59501e-3 + 4.48791e-3, rel=1e-4)
    # torch.backends.cudnn.allow_tf32 is on by default: an fp32 step's convolutions run TF32 as well
    # (its matmuls do not), and in fp32 where the device has no TF32 units: there, Winograd (1/2.25).
    assert seconds(record, "fp32") == pytest.approx(29.59501e-3 + 4.48791e-3, rel=1e-4)
    assert seconds(record, "tf32", tf32_flops=None) == pytest.approx(236.76006e-3 / 2.25, rel=1e-4)
    assert classify(mm(512, 512, 512), "fp32", cuda=True).dtype == "fp32"
    assert classify(record, "fp32", cuda=True).dtype == "tf32"
    assert classify(record, "fp32").dtype == "fp32"  # a CPU has no TF32
    assert seconds(record, "tf32", tf32_flops=1e12) == pytest.approx(236.76006e-3, rel=1e-4)
    step = estimate_records([record], "tf32", DeviceModel("gpu", "gpu", profile(1e12)))
    assert step.ops[0].dtype == "fp32"


def test_winograd_needs_a_3x3_stride_1_kernel_one_group_and_48_channels() -> None:
    def geometry(**changes) -> ConvGeometry:
        base = ConvGeometry((3, 3), (1, 1), (1, 1), 1, False, 64, 64, False, 1, 1, 1)
        return dataclasses.replace(base, **changes)

    assert winograd_eligible(geometry())
    assert not winograd_eligible(geometry(stride=(2, 2)))
    assert not winograd_eligible(geometry(kernel=(1, 1)))
    assert not winograd_eligible(geometry(dilation=(2, 2)))
    assert not winograd_eligible(geometry(groups=2))
    assert not winograd_eligible(geometry(transposed=True))
    assert not winograd_eligible(geometry(in_channels=3))
    assert not winograd_eligible(geometry(out_channels=32))


def test_layout_transposes_by_pass() -> None:
    base = ConvGeometry((3, 3), (1, 1), (1, 1), 1, False, 64, 64, False, 100, 200, 10)
    assert layout_transposes(base) == (100, 10, 200)  # input, weight, output
    both = dataclasses.replace(base, computes=("grad_input", "grad_weight"))
    assert layout_transposes(both) == (200, 10, 100, 200, 100, 10)  # dgrad: dy, w, dx; wgrad: dy, x, dw
    assert layout_transposes(dataclasses.replace(base, computes=("grad_weight",))) == (200, 100, 10)


def small_cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, stride=2, padding=1),
                         nn.Flatten(), nn.Linear(16 * 4 * 4, 10))


def test_the_trace_records_each_convolution_geometry_and_layout() -> None:
    trace = trace_training_step(small_cnn, lambda batch: torch.randn(batch, 3, 8, 8), 2, "fp32", "sgd")
    convs = [r for r in trace.records if r.conv is not None]
    assert [r.op for r in convs] == ["convolution", "convolution", "convolution_backward", "convolution_backward"]
    first, second = convs[0].conv, convs[1].conv
    assert (first.kernel, first.stride, first.in_channels, first.out_channels) == ((3, 3), (1, 1), 3, 16)
    assert (first.input_elements, first.output_elements, first.weight_elements) == (2 * 3 * 64, 2 * 16 * 64, 432)
    assert second.stride == (2, 2) and second.output_elements == 2 * 16 * 16
    assert not first.channels_last
    # Backward: the second conv gives its input's and weight's gradients; the first only its weight's
    # (the images need none).
    assert convs[2].conv.computes == ("grad_input", "grad_weight")
    assert convs[3].conv.computes == ("grad_weight",)


def test_model_files_may_convert_their_model_to_half_and_channels_last() -> None:
    # Module.to swaps fake parameters, which fake tensors' weak references forbid; the trace lets
    # build_model() convert anyway, and the convolutions see channels-last tensors.
    def build() -> nn.Module:
        return small_cnn().to(memory_format=torch.channels_last).half()

    def images(batch: int) -> torch.Tensor:
        return torch.randn(batch, 3, 8, 8).half().contiguous(memory_format=torch.channels_last)

    trace = trace_training_step(build, images, 2, "fp32", "sgd")
    convs = [r for r in trace.records if r.conv is not None]
    assert convs and all(r.conv.channels_last for r in convs)
    assert all("float16" in r.dtypes for r in convs)
    assert trace.params == 3 * 16 * 9 + 16 + 16 * 16 * 9 + 16 + 256 * 10 + 10


def test_estimate_suggests_channels_last_where_layout_transposes_cost(tmp_path, capsys) -> None:
    # The same small CNN in NCHW and in channels-last, fp16 on an A100 (tensor cores), batch 128: the NCHW
    # one's step spends a share in transposes and the summary says how much faster channels-last would run
    # it; the channels-last one spends none. At batch 8 the host's issuing of ops limits the step: the
    # device's transposes hide behind it, and the summary suggests nothing.
    from advisor.cli.main import main

    body = '''import torch
from torch import nn
CHANNELS_LAST = {channels_last}
def build_model():
    model = nn.Sequential(nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.Conv2d(128, 64, 3, padding=1),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    return model.to(memory_format=torch.channels_last) if CHANNELS_LAST else model
def example_input(batch_size):
    x = torch.randn(batch_size, 64, 56, 56)
    return x.contiguous(memory_format=torch.channels_last) if CHANNELS_LAST else x
'''
    for channels_last in (False, True):
        path = tmp_path / f"cnn_{channels_last}.py"
        path.write_text(body.format(channels_last=channels_last))
        settings = ["--gpu", "a100-sxm4-80gb", "--precision", "fp16", "--steps", "10", "--batch-size", "128"]
        assert main(["estimate", str(path), *settings, "--json"]) == 0
        result = json.loads(capsys.readouterr().out)["results"][0]
        assert (result["layout_transposes_s"] > 0.05 * result["step_time_s"]) is not channels_last
        assert result["channels_first_s"] == result["layout_transposes_s"]  # no batch norm
        assert main(["estimate", str(path), *settings]) == 0
        printed = capsys.readouterr().out
        assert ("Tip: on a100-sxm4-80gb, channels-last tensors would make each step" in printed) is not channels_last
        assert main(["estimate", str(path), *settings[:-1], "8"]) == 0
        assert "Tip:" not in capsys.readouterr().out


NCHW_CNN = '''import torch
from torch import nn
BATCH_SIZE = 128
def build_model():
    return nn.Sequential(nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
                         nn.Conv2d(128, 64, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
def example_input(batch_size):
    return torch.randn(batch_size, 64, 56, 56)
'''


def test_the_report_and_the_tui_give_the_channels_last_advice_too(tmp_path) -> None:
    # the same estimate as the command line's tip: a report recommendation for the fastest device, and a line
    # in the TUI's panel of a device where channels-last would save 5% or more
    import asyncio

    from advisor.app.plan import plan
    from advisor.app.request import PlanRequest
    from advisor.hardware.loader import load_hwdb
    from advisor.present.layout import channels_last_advice
    from advisor.report.content import recommendations
    from advisor.tui.app import AdvisorApp
    from textual.widgets import DataTable, Static

    path = tmp_path / "nchw_cnn.py"
    path.write_text(NCHW_CNN)
    db = load_hwdb(include_user_layers=False)
    request = PlanRequest(model=str(path), gpus=["a100-sxm4-80gb"], precision="fp16", steps=10)
    estimate = plan(request, db)
    advice = channels_last_advice(estimate, estimate.results[0])
    assert advice is not None and advice.startswith("would make each step") and "batch norm" in advice
    found = {r.title: r for r in recommendations(estimate, None, None)}
    assert found["Channels-last tensors"].device == "a100-sxm4-80gb" and found["Channels-last tensors"].reason == advice

    app = AdvisorApp(db, request)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            await app.workers.wait_for_complete()
            await pilot.pause()
            screen = app.estimate_screen
            screen.query_one("#devices", DataTable).focus()
            await pilot.press("enter")  # the device's panel
            await pilot.pause()
            assert screen.selected == "a100-sxm4-80gb"
            assert f"Tip: channels-last tensors {advice}" in str(screen.query_one("#detail-input", Static).render())

    asyncio.run(scenario())
