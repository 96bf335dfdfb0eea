"""The kernels CUDA runs where the CPU trace recorded a decomposition (advisor/estimate/lowering.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from advisor.estimate.lowering import cuda_records
from advisor.estimate.step import DeviceModel, estimate_records
from advisor.profile.trace import OpRecord, trace_training_step
from tests.test_estimate import add, mm, synthetic_profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def cpu_dropout(elements: int, module: str = "drop", dtype: str = "float32") -> list[OpRecord]:
    """What the trace records for F.dropout on a CPU: the mask drawn in x's dtype, scaled, applied."""
    size = elements * (2 if dtype != "float32" else 4)
    return [
        OpRecord("forward", module, "bernoulli_", 0.0, size, size, (dtype,), False, True),
        OpRecord("forward", module, "div_", float(elements), size, size, (dtype,), False, True),
        OpRecord("forward", module, "mul", float(elements), 2 * size, size, (dtype,), False, True, None, (size,)),
    ]


def test_dropout_becomes_one_native_dropout_kernel() -> None:
    # x fp32, 1000 elements: CUDA reads x (4000 B), writes y (4000 B) and a bool mask (1000 B).
    (fused,) = cuda_records(cpu_dropout(1000))
    assert (fused.op, fused.bytes_read, fused.bytes_written, fused.allocated) == ("native_dropout", 4000, 5000,
                                                                                 (4000, 1000))
    assert (fused.phase, fused.module, fused.dtypes) == ("forward", "drop", ("float32",))
    # fp16 x of 1000 elements: 2000 B read, 2000 B + 1000 B (bool) written.
    (half,) = cuda_records(cpu_dropout(1000, dtype="float16"))
    assert (half.bytes_read, half.bytes_written) == (2000, 3000)


def test_other_ops_and_broken_patterns_are_left_alone() -> None:
    ops = [mm(8, 8, 8), *cpu_dropout(1000), add(10), *cpu_dropout(500, module="other")]
    lowered = cuda_records(ops)
    assert [r.op for r in lowered] == ["mm", "native_dropout", "add", "native_dropout"]
    assert lowered[0] is ops[0] and lowered[2] is ops[4]
    split = cpu_dropout(1000)
    split[2] = OpRecord("forward", "elsewhere", *[getattr(split[2], f) for f in ("op", "flops", "bytes_read",
                        "bytes_written", "dtypes", "matmul", "counted")])
    assert [r.op for r in cuda_records(split)] == ["bernoulli_", "div_", "mul"]  # mul in another module
    mismatched = cpu_dropout(1000)[:2] + [add(1000)]  # add, not mul
    assert [r.op for r in cuda_records(mismatched)] == ["bernoulli_", "div_", "add"]
    assert cuda_records(cpu_dropout(1000)[:2]) == cpu_dropout(1000)[:2]  # too short


def test_a_gpu_times_the_fused_kernel_and_a_cpu_the_three_ops() -> None:
    profile = synthetic_profile(dispatch_s=1e-5)
    ops = cpu_dropout(1_000_000)
    # GPU: 4 MB + 5 MB = 9 MB at 1e11 B/s x 50% = 180 us; the host's 4.1 x 10 us to issue it (STEP_HOST_RATIO)
    # hide behind the previous step's kernels (a step that reads nothing back: max(host, kernels)).
    gpu = estimate_records(ops, "fp32", DeviceModel("gpu", "gpu", profile))
    assert [op.op for op in gpu.ops] == ["native_dropout"]
    assert gpu.step_s == pytest.approx(180e-6)
    # CPU: 8 + 8 + 12 = 28 MB -> 560 us, plus 3 forward ops' host in line, 15 x 10 us each (CPU_STEP_HOST_RATIO).
    cpu = estimate_records(ops, "fp32", DeviceModel("cpu", "cpu", profile))
    assert cpu.step_s == pytest.approx(560e-6 + 3 * 150e-6)


@pytest.mark.parametrize("eager", [False, True])
def test_every_dropout_of_a_traced_bert_is_fused(eager: bool) -> None:
    """Embedding, attention-output, FFN and (eager: module; fused: inside SDPA's math path) attention
    dropouts of a one-layer BERT: four bernoulli_ draws, four native_dropout kernels, no bernoulli_ left."""
    from zoo import example

    tiny = dict(vocab_size=100, max_positions=16, hidden=32, layers=1, heads=4, intermediate=64, seq_len=16)
    build, make_input, loss = example("bert_base", eager_attention=eager, **tiny)
    records = trace_training_step(build, make_input, 2, "fp32", "adamw", loss).records
    lowered = cuda_records(records)
    assert sum(r.op == "bernoulli_" for r in records) == 4
    assert sum(r.op == "native_dropout" for r in lowered) == 4
    assert not any(r.op == "bernoulli_" for r in lowered)
    assert len(lowered) == len(records) - 2 * 4
