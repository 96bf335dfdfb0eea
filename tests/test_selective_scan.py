"""Mamba's selective scan traced as one fused kernel (advisor/profile/selective_scan.py): the op computes the
recurrence, its backward the recurrence's gradients, its fake kernel what selective_scan_cuda makes, and a GPU
trace of a Hugging Face Mamba holds one scan per layer instead of a loop per token."""

from __future__ import annotations

import collections
import importlib

import pytest
import torch
import torch.nn.functional as F

from advisor.profile import selective_scan as scans
from advisor.profile.costs import op_cost
from advisor.profile.coverage import fused_scan_note


def loop(u, delta, A, B, C, D, z, delta_bias):
    """The recurrence written out: h_t = exp(delta_t A) h_{t-1} + delta_t B_t u_t, y_t = C_t . h_t + D u_t."""
    delta = F.softplus(delta + delta_bias[:, None])
    state = torch.zeros(u.shape[0], u.shape[1], A.shape[1])
    ys = []
    for t in range(u.shape[2]):
        state = torch.exp(delta[:, :, t, None] * A) * state + delta[:, :, t, None] * B[:, None, :, t] * u[:, :, t, None]
        ys.append((state * C[:, None, :, t]).sum(-1) + D * u[:, :, t])
    return torch.stack(ys, dim=2) * F.silu(z)


def inputs(requires_grad: bool = False) -> list[torch.Tensor]:
    torch.manual_seed(0)
    b, d, l, n = 2, 3, 5, 4
    made = [torch.randn(b, d, l), torch.randn(b, d, l), -torch.rand(d, n) - 0.5, torch.randn(b, n, l),
            torch.randn(b, n, l), torch.randn(d), torch.randn(b, d, l), torch.randn(d)]
    return [t.requires_grad_(requires_grad) for t in made]


def test_the_fused_op_computes_the_recurrence_and_its_gradients() -> None:
    expected_inputs, fused_inputs = inputs(True), inputs(True)
    expected = loop(*expected_inputs)
    gated = scans.scan(*fused_inputs[:5], D=fused_inputs[5], z=fused_inputs[6], delta_bias=fused_inputs[7],
                       delta_softplus=True)
    torch.testing.assert_close(gated, expected)
    weights = torch.randn_like(expected)
    (expected * weights).sum().backward()
    (gated * weights).sum().backward()
    for mine, theirs in zip(fused_inputs, expected_inputs):
        torch.testing.assert_close(mine.grad, theirs.grad)
    _, last = scans.scan(*inputs()[:5], D=inputs()[5], z=inputs()[6], delta_bias=inputs()[7], delta_softplus=True,
                         return_last_state=True)
    assert last.shape == (2, 3, 4)


def test_the_fake_kernel_makes_what_selective_scan_cuda_makes_and_the_cost_counts_every_state() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    scans.register_ops()

    with FakeTensorMode():
        u = torch.empty(2, 128, 4096, dtype=torch.bfloat16)
        A, B = torch.empty(128, 16), torch.empty(2, 16, 4096, dtype=torch.bfloat16)
        gated, intermediates, ungated = torch.ops.advisor.selective_scan(u, u, A, B, B, None, u, None, True)
        # 4,096 tokens are two chunks of 2,048; the state's two halves per chunk in fp32
        assert intermediates.shape == (2, 128, 2, 32) and intermediates.dtype == torch.float32
        assert gated.dtype == ungated.dtype == torch.bfloat16 and ungated.shape == u.shape
        _, _, none = torch.ops.advisor.selective_scan(u, u, A, B, B, None, None, None, True)
        assert none.numel() == 0  # no gate: no ungated output kept
    with FakeTensorMode():
        u, A, B = torch.empty(2, 128, 64), torch.empty(128, 16), torch.empty(2, 16, 64)
        op = torch.ops.advisor.selective_scan.default
        cost = op_cost(op, (u, u, A, B, B, None, None, None, True), {}, op(u, u, A, B, B, None, None, None, True))
    # u 2 x 128 x 64, 16 states: 2*128*64 * (8*16 + 10) = 2,260,992 FLOPs
    assert cost.counted and cost.flops == 2_260_992
    # reads u and delta (2 x 32 KiB), A (8 KiB), B and C (2 x 8 KiB); writes the output and 2 x 128 x 1 x 32 fp32
    assert cost.bytes_read == 2 * 65_536 + 8_192 + 2 * 8_192 and cost.bytes_written == 65_536 + 32_768


def mamba_module():
    try:
        module = importlib.import_module("transformers.models.mamba.modeling_mamba")
    except ImportError:
        return None
    return module if hasattr(module, "mamba_selective_scan") else None


@pytest.mark.skipif(mamba_module() is None, reason="a transformers whose Mamba calls mamba_selective_scan")
def test_a_gpu_trace_of_mamba_holds_one_scan_per_layer_and_no_state_per_token() -> None:
    from transformers import MambaConfig, MambaForCausalLM

    from advisor.profile.trace import trace_training_step

    module = mamba_module()
    original = module.mamba_selective_scan
    config = MambaConfig(vocab_size=1000, hidden_size=64, state_size=16, num_hidden_layers=2, intermediate_size=128)

    def traced(attention: str):
        return trace_training_step(lambda: MambaForCausalLM(config),
                                   lambda b: {"input_ids": torch.randint(0, 1000, (b, 64)),
                                              "labels": torch.randint(0, 1000, (b, 64))},
                                   2, "fp32", loss_fn=lambda output, batch: output.loss, attention=attention)

    cpu, gpu = traced("cpu"), traced("cuda")
    ops = collections.Counter(record.op for record in gpu.records)
    assert ops["selective_scan"] == ops["selective_scan_backward"] == 2  # two layers
    assert "selective_scan" not in {record.op for record in cpu.records}
    assert len(gpu.records) * 5 < len(cpu.records)  # the CPU's loop: 64 tokens x about 14 ops per layer
    assert gpu.memory is not None and cpu.memory is not None
    assert gpu.memory.peak().bytes < cpu.memory.peak().bytes  # no state kept per token
    assert gpu.cpu_runs_otherwise and not cpu.cpu_runs_otherwise
    assert module.mamba_selective_scan is original  # put back after the trace
    note = fused_scan_note(gpu)
    assert note is not None and "(2 per step)" in note and fused_scan_note(cpu) is None


@pytest.mark.skipif(mamba_module() is None, reason="a transformers whose Mamba calls mamba_selective_scan")
def test_ten_mamba_layers_traced_once_and_replicated_give_the_full_traces_figures() -> None:
    # repeated blocks (profile/repeated.py) replicate the fused scans with the rest of a layer
    from transformers import MambaConfig, MambaForCausalLM

    from advisor.profile.trace import trace_training_step

    config = MambaConfig(vocab_size=1000, hidden_size=64, state_size=16, num_hidden_layers=10, intermediate_size=128)

    def traced(dedupe: bool):
        return trace_training_step(lambda: MambaForCausalLM(config),
                                   lambda b: {"input_ids": torch.randint(0, 1000, (b, 32)),
                                              "labels": torch.randint(0, 1000, (b, 32))},
                                   2, "amp-bf16", loss_fn=lambda output, batch: output.loss, attention="cuda",
                                   dedupe=dedupe)

    once, full = traced(True), traced(False)
    assert once.replicated_blocks > 0 and full.replicated_blocks == 0
    assert sum(r.op == "selective_scan_backward" for r in once.records) == 10
    assert once.flops() == pytest.approx(full.flops(), rel=1e-9)
    assert once.memory is not None and full.memory is not None
    assert once.memory.peak().bytes == full.memory.peak().bytes


@pytest.mark.skipif(mamba_module() is None, reason="a transformers whose Mamba calls mamba_selective_scan")
def test_overlapping_blocks_give_the_modules_own_function_back_when_the_last_ends() -> None:
    # a superseded TUI estimate may still trace while a new one starts: the first to end keeps the scan fused
    # for the other, the last puts the module's function back
    module = mamba_module()
    original = module.mamba_selective_scan
    first, second = scans.fused_selective_scans(), scans.fused_selective_scans()
    first.__enter__()
    second.__enter__()
    assert module.mamba_selective_scan is scans.scan
    first.__exit__(None, None, None)
    assert module.mamba_selective_scan is scans.scan
    second.__exit__(None, None, None)
    assert module.mamba_selective_scan is original
