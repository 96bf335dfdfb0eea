"""--precision fp8 (issue #28): float8 Linear layers traced with their casts and fp8 GEMMs, timed at the fp8
tensor-core rate, refused on GPUs without one. Hand-computable sizes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from advisor.calibration.peaks import gpu_peaks
from advisor.calibration.reference import load_families
from advisor.cli.main import main
from advisor.estimate.ops import classify
from advisor.estimate.step import estimate_records
from advisor.estimate.targets import database_targets
from advisor.hardware.loader import load_hwdb
from advisor.profile.float8 import Float8Linear, convert_to_float8
from advisor.profile.trace import trace_training_step


class TwoLinears(nn.Module):
    """64 -> 128 -> 16 without bias: both dimensions of both layers are multiples of 16."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 128, bias=False)
        self.down = nn.Linear(128, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.up(x))


def fp8_trace(batch: int = 32):
    return trace_training_step(TwoLinears, lambda b: torch.randn(b, 64), batch, "fp8", "adamw", attention="cuda")


def test_linear_layers_become_fp8_gemms_with_their_casts() -> None:
    trace = fp8_trace()
    assert "float8: 2 Linear layers" in trace.adapted
    def gemms(module: str) -> list:
        return sorted(r.gemm for r in trace.records if r.op == "_scaled_mm" and r.module.endswith(module))

    # up: forward [32, 64] @ [64, 128] and the weight gradient [128, 32] @ [32, 64]; its input needs no
    # gradient, so no dgrad. down: forward [32, 128] @ [128, 16], dgrad [32, 16] @ [16, 128], wgrad
    # [16, 32] @ [32, 128]. FLOPs 2 * m * n * k: 2 * 32 * 128 * 64 = 524,288 for each of up's
    assert gemms("up") == sorted([(1, 32, 128, 64), (1, 128, 64, 32)])
    assert gemms("down") == sorted([(1, 32, 16, 128), (1, 32, 128, 16), (1, 16, 128, 32)])
    assert all(r.flops == 524_288 for r in trace.records if r.op == "_scaled_mm" and r.module.endswith("up"))
    casts = [r for r in trace.records if r.op == "float8_cast_transpose" and r.module.endswith("up")]
    # forward: the fp32 input [32, 64] (read 8,192 B; codes and transposed codes 2 * 2,048 B, the fp32 scale
    # 4 B) and the fp32 weight [128, 64] (read 32,768 B; write 2 * 8,192 + 4 B); backward: the output gradient
    # [32, 128] in bf16 (read 8,192 B; write 2 * 4,096 + 4 B)
    assert sorted((r.bytes_read, r.bytes_written) for r in casts) == [(8_192, 4_100), (8_192, 8_196),
                                                                     (32_768, 16_388)]
    assert not [r for r in trace.records if r.op in ("mm", "addmm")]


def test_fp8_gemms_and_casts_are_timed_as_what_they_are() -> None:
    trace = fp8_trace()
    gemm = next(r for r in trace.records if r.op == "_scaled_mm")
    cast = next(r for r in trace.records if r.op == "float8_cast_transpose")
    assert (classify(gemm, "fp8", cuda=True).series, classify(gemm, "fp8", cuda=True).dtype) == ("gemm", "fp8")
    kind = classify(cast, "fp8", cuda=True)
    assert not kind.compute and kind.series == "copy" and kind.dtype == "fp32"  # it reads the fp32 input


def test_the_output_head_and_odd_sizes_stay_in_bf16() -> None:
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 24))  # 24 is not a multiple of 16
    assert convert_to_float8(model) == 1 and isinstance(model[0], Float8Linear) and isinstance(model[1], nn.Linear)

    class WithHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(32, 32)
            self.lm_head = nn.Linear(32, 64)

    model = WithHead()
    assert convert_to_float8(model) == 1 and isinstance(model.lm_head, nn.Linear)
    assert isinstance(model.body, Float8Linear) and model.body.weight is not None


def test_float8_linear_keeps_the_parameters_and_runs_for_real() -> None:
    linear = nn.Linear(32, 48)
    fp8 = Float8Linear(linear)
    assert fp8.weight is linear.weight and fp8.bias is linear.bias
    x = torch.randn(4, 8, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = fp8(x)
    assert y.shape == (4, 8, 48) and y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float32 and linear.weight.grad.dtype == torch.float32
    assert linear.bias.grad.shape == (48,)


def step_seconds(precision: str, gpu: str) -> float:
    """Forward and backward of a stack of four 4096 x 4096 Linear layers on 16,384 rows, on a database GPU
    (enough rows that the GEMMs, not the host's time to issue fp8's casts and scales, set the step)."""
    trace = trace_training_step(lambda: nn.Sequential(*(nn.Linear(4096, 4096, bias=False) for _ in range(4))),
                                lambda b: torch.randn(b, 4096), 16384, precision, "adamw", attention="cuda")
    db = load_hwdb([])
    target = database_targets(db, [db.gpu(gpu)], load_families(db))[0]
    records = [r for r in trace.records if r.phase != "optimizer"]
    return estimate_records(records, precision, target.device).step_s


@pytest.mark.parametrize("gpu", ["h100-sxm", "rtx-4090"])
def test_large_gemms_run_faster_in_fp8(gpu: str) -> None:
    # the fp8 peak is twice bf16's (fp32 accumulation on GeForce too), at 0.65 efficiency instead of 0.80:
    # GEMMs 2 * 0.65 / 0.80 = 1.625x faster; the fp8 casts replace autocast's bf16 casts
    speedup = step_seconds("amp-bf16", gpu) / step_seconds("fp8", gpu)
    assert 1.3 < speedup < 1.625, speedup


def test_fp8_peak_is_fp32_accumulate_on_geforce() -> None:
    db = load_hwdb([])
    rtx_4090 = gpu_peaks(db.gpu("rtx-4090")).flops
    # Ada whitepaper pattern: fp8 with fp32 accumulation = 2 x fp16 with fp32 accumulation = 330.3 TFLOPS
    assert rtx_4090["fp8"] == pytest.approx(2 * rtx_4090["bf16"])
    assert "fp8" not in gpu_peaks(db.gpu("a100-sxm4-80gb")).flops


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("precision", ["fp8", "fp8-master"])
def test_a_gpu_without_fp8_tensor_cores_is_one_sentence(capsys: pytest.CaptureFixture[str], precision: str) -> None:
    code, out, err = run(capsys, "estimate", "mlp", "--gpu", "a100-sxm4-80gb", "--precision", precision)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "a100-sxm4-80gb has no fp8 tensor cores" in err and "h100" in err


def test_fp8_master_runs_the_float8_layers_in_a_bf16_model_with_fp32_masters() -> None:
    # the same fp8 GEMMs as fp8; the weights bf16 (2 B) rather than fp32 (4 B), the masters in the optimizer
    from advisor.memory.estimate import StepMemory

    def build() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False), torch.nn.ReLU(),
                                   torch.nn.Linear(128, 64, bias=False))

    traces = {p: trace_training_step(build, lambda b: torch.randn(b, 64), 16, p, "sgd") for p in ("fp8", "fp8-master")}
    gemms = {p: sorted(r.flops for r in t.records if r.op == "_scaled_mm") for p, t in traces.items()}
    # 2 forward, 2 weight-gradient and 1 input-gradient GEMMs (the first layer's input needs none), each
    # 16x64 @ 64x128 or alike: 2 * 16 * 128 * 64 = 262,144 FLOPs
    assert gemms["fp8"] == gemms["fp8-master"] == [262_144.0] * 5
    memory = {p: StepMemory.of_trace(t).by_category for p, t in traces.items()}
    # 2 x 64x128 = 16,384 weights: fp32 65,536 B under fp8, bf16 32,768 B under fp8-master; SGD keeps the
    # master and its gradient: 8 B each = 131,072 B of optimizer state
    assert memory["fp8"]["weights"] == 16_384 * 4 and memory["fp8-master"]["weights"] == 16_384 * 2
    assert memory["fp8-master"]["optimizer_state"] == 16_384 * 8


def test_without_gpus_named_fp8_estimates_only_gpus_that_have_it(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    code, out, _ = run(capsys, "estimate", "mlp", "--precision", "fp8", "--json", "--no-input-pipeline")
    assert code == 0
    ids = {r["gpu_id"] for r in json.loads(out)["results"]}
    db = load_hwdb([])
    assert ids and all(db.gpu(i).peaks.fp8_tensor is not None for i in ids)
    assert "h100-sxm" in ids and "a100-sxm4-80gb" not in ids and "rtx-3090" not in ids
