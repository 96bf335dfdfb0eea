"""--compile (issue #28): the trace's dataflow (which op made each value, which op reads it last) and the
step as torch.compile fuses it. Hand-computable sizes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from advisor.calibration.reference import load_families
from advisor.cli.main import main
from advisor.estimate.fusion import FUSED_OP, compiled_records
from advisor.estimate.step import estimate_records
from advisor.estimate.targets import database_targets
from advisor.hardware.loader import load_hwdb
from advisor.profile.trace import OpRecord, trace_training_step


class BiasGelu(nn.Module):
    """y = gelu(h * 2 + 1) * scale, h = x @ W^T, on a [4, 8] fp32 input: a GEMM, then a multiply, an add, a
    GELU and a multiply by a weight."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8, bias=False)
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.proj(x) * 2 + 1) * self.scale


def trace_of(module, shape=(4, 8), optimizer: str = "sgd"):
    return trace_training_step(module, lambda b: torch.randn(b, *shape[1:]), shape[0], "fp32", optimizer)


def test_each_read_names_the_op_that_made_the_value() -> None:
    trace = trace_of(BiasGelu)
    forward = [r for r in trace.records if r.phase == "forward" and r.module == ""]
    assert [r.op for r in forward] == ["mul", "add", "gelu", "mul"]  # the GEMM is proj's
    mul, add, gelu, scale = forward
    # h * 2 reads h, made by the GEMM one record before: 4 * 8 * 4 = 128 bytes
    assert mul.reads == ((1, 128, 0),)  # (source, bytes, offset in its storage)
    assert add.reads == ((1, 128, 0),)
    assert gelu.reads == ((1, 128, 0),)
    # the scale is a parameter: no op of the step made it (a storage id < 0), 8 * 4 = 32 bytes
    assert scale.reads[0] == (1, 128, 0) and scale.reads[1][0] < 0 and scale.reads[1][1] == 32
    # h * 2 + 1 is read by gelu (one record on) and by gelu_backward in the backward: last_use lies beyond
    assert add.writes[0][0] > 1
    assert mul.writes == ((1, 128),)  # read only by the add right after it
    assert scale.writes == ((1, 128),)  # y: read only by the loss's mean


def test_a_pointwise_chain_fuses_into_one_kernel_that_reads_and_writes_only_what_crosses_it() -> None:
    trace = trace_of(BiasGelu)
    forward = [r for r in compiled_records(trace.records) if r.phase == "forward"]
    # the GEMM, then one kernel for the pointwise ops and the loss (mean, and the loss's add of 0)
    assert [r.op for r in forward] == ["mm", FUSED_OP]
    fused = forward[1]
    # reads h (128 bytes) and the scale (32); writes what the backward reads: h * 2 + 1 (gelu_backward's
    # input, 128), gelu's output (the scale's gradient reads it, 128) and the loss (4); h * 2 and y never
    # reach memory
    assert fused.bytes_read == 128 + 32
    assert fused.bytes_written == 128 + 128 + 4
    eager = [r for r in trace.records if r.phase == "forward" and r.op != "mm"]
    # eager: mul 128 + 128, add 128 + 128, gelu 128 + 128, mul 160 + 128, mean 128 + 4, add 4 + 4 = 1,196
    assert sum(r.bytes_read + r.bytes_written for r in eager) == 1196


def test_matrix_products_stay_library_kernels_between_fused_runs() -> None:
    trace = trace_of(lambda: nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 8)))
    forward = [r for r in compiled_records(trace.records) if r.phase == "forward"]
    assert [r.op for r in forward if r.module != "(loss)"] == ["addmm", FUSED_OP, "addmm"]


def test_the_optimizer_fuses_into_one_pass_over_parameters_gradients_and_state() -> None:
    trace = trace_of(lambda: nn.Linear(64, 64, bias=False), (4, 64), "adamw")
    optimizer = [r for r in compiled_records(trace.records) if r.phase == "optimizer"]
    assert [r.op for r in optimizer] == [FUSED_OP]
    weight = 64 * 64 * 4
    # fused AdamW reads the weight, its gradient, exp_avg and exp_avg_sq and writes the weight and both
    # states (4 + 3 passes over 16,384 bytes), plus the step counter (4 bytes read and written)
    assert optimizer[0].bytes_read == 4 * weight + 4 + 4  # + the scalar added to the step count
    assert optimizer[0].bytes_written == 3 * weight + 4
    eager = sum(r.bytes_read + r.bytes_written for r in trace.records if r.phase == "optimizer")
    assert eager > 2 * (7 * weight)


def gpu_seconds(trace, compiled: bool, gpu: str = "h100-sxm") -> float:
    db = load_hwdb([])
    target = database_targets(db, [db.gpu(gpu)], load_families(db))[0]
    return estimate_records(trace.records, trace.precision, target.device, compiled).step_s


def test_a_memory_bound_step_runs_faster_compiled_and_a_gemm_bound_one_about_the_same() -> None:
    pointwise = trace_training_step(BiasGelu, lambda b: torch.randn(b, 8), 1 << 18, "fp32", "sgd")
    # the forward's pointwise traffic falls from 1,196 to 292 bytes a row; the backward's GEMMs over
    # 262,144 x 8 activations are memory-bound too and stay as they are
    assert gpu_seconds(pointwise, True) < 0.85 * gpu_seconds(pointwise, False)
    gemms = trace_training_step(lambda: nn.Sequential(*(nn.Linear(4096, 4096, bias=False) for _ in range(4))),
                                lambda b: torch.randn(b, 4096), 4096, "amp-bf16", "sgd")
    assert gpu_seconds(gemms, True) == pytest.approx(gpu_seconds(gemms, False), rel=0.15)
    assert gpu_seconds(gemms, True) <= gpu_seconds(gemms, False)


def test_compile_flag_reaches_settings_and_json(capsys) -> None:
    assert main(["estimate", "mlp", "--gpu", "h100-sxm", "--compile", "--json", "--no-input-pipeline"]) == 0
    import json

    document = json.loads(capsys.readouterr().out)
    assert document["settings"]["compile"] is True
    assert main(["estimate", "mlp", "--gpu", "h100-sxm", "--json", "--no-input-pipeline"]) == 0
    eager = json.loads(capsys.readouterr().out)
    assert eager["settings"]["compile"] is False
    assert document["results"][0]["step_time_s"] < eager["results"][0]["step_time_s"]


def test_views_of_one_storage_are_different_values() -> None:
    class Split(nn.Module):
        """q and k split from one projection's output, then a pointwise product: [4, 2 x 8] fp32."""

        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(8, 16, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k = self.proj(x).split(8, dim=-1)
            return (q * 2) * (k + 1)

    trace = trace_of(Split)
    forward = [r for r in compiled_records(trace.records) if r.phase == "forward"]
    assert [r.op for r in forward] == ["mm", FUSED_OP]
    # q and k are halves of the 4 x 16 output: the kernel reads 4 * 8 * 4 = 128 bytes of each, at offsets 0
    # and 32; as one value it would read only one of them
    q, k = [r for r in trace.records if r.phase == "forward" and r.op in ("mul", "add") and r.module == ""][:2]
    assert q.reads[0][1] == k.reads[0][1] == 128 and {q.reads[0][2], k.reads[0][2]} == {0, 32}
    assert forward[1].bytes_read == 2 * 128


def test_sync_each_step_reaches_settings_and_slows_a_host_bound_step(capsys) -> None:
    import json

    assert main(["estimate", "mlp", "--gpu", "h100-sxm", "--json", "--no-input-pipeline", "--plans", "never"]) == 0
    ahead = json.loads(capsys.readouterr().out)
    assert main(["estimate", "mlp", "--gpu", "h100-sxm", "--json", "--no-input-pipeline", "--plans", "never",
                 "--sync-each-step"]) == 0
    synced = json.loads(capsys.readouterr().out)
    assert (ahead["settings"]["sync_each_step"], synced["settings"]["sync_each_step"]) == (False, True)
    # the MLP's step is host-bound on an H100: running ahead it takes the host's time; reading back at its
    # end, the next step's first kernels wait for the host as well, and the last for the whole step
    ahead_s, synced_s = ahead["results"][0]["step_time_s"], synced["results"][0]["step_time_s"]
    assert ahead_s < synced_s < 1.5 * ahead_s
