"""The training-step trace on fake tensors: phases, precision policies, optimizers."""

from __future__ import annotations

import pytest
import torch

from advisor.errors import UserError
from advisor.profile.trace import OPTIMIZERS, PRECISIONS, trace_training_step
from advisor.profile.user_code import UserCodeError


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def inputs(batch: int) -> torch.Tensor:
    return torch.randn(batch, 8)


def matmul_flops(trace, phase: str) -> float:
    return sum(r.flops for r in trace.records if r.phase == phase and r.matmul)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_mlp_step_flops_by_phase(precision: str) -> None:
    trace = trace_training_step(mlp, inputs, 32, precision, "sgd")
    # params: 8*16 + 16 + 16*4 + 4 = 212
    assert trace.params == 212
    # forward: 2*32*16*8 + 2*32*4*16 = 8192 + 4096 = 12,288
    assert matmul_flops(trace, "forward") == 12_288
    # backward: layer 2 grad_input 2*32*16*4 = 4096 and grad_weight 2*4*16*32 = 4096;
    # layer 1 grad_weight 2*16*8*32 = 8192 (its input needs no gradient): 16,384
    assert matmul_flops(trace, "backward") == 16_384
    assert trace.uncounted() == {}


def test_records_name_the_storages_each_op_allocates() -> None:
    trace = trace_training_step(mlp, inputs, 32, "fp32", "adamw")
    forward = [r for r in trace.records if r.phase == "forward"]
    # Linear(8, 16) at batch 32: addmm's output 32*16*4 = 2048 B; relu's 2048 B; Linear(16, 4): 32*4*4 = 512 B
    assert [(r.op, r.allocated) for r in forward[:3]] == [("addmm", (2048,)), ("relu", (2048,)), ("addmm", (512,))]
    optimizer = {r.op: r.allocated for r in trace.records if r.phase == "optimizer"}
    assert optimizer["_foreach_mul_"] == ()  # in place: nothing new
    # _foreach_sqrt of the four second moments: W1 16*8*4 = 512, b1 64, W2 4*16*4 = 256, b2 16 bytes
    assert sorted(optimizer["_foreach_sqrt"]) == [16, 64, 256, 512]
    # multi-tensor ops record how many tensors they work on (W1, b1, W2, b2); others 1
    tensors = {r.op: r.tensors for r in trace.records}
    assert tensors["_foreach_sqrt"] == 4 and tensors["_foreach_mul_"] == 4 and tensors["addmm"] == 1


def test_precision_sets_matmul_dtypes() -> None:
    expected = {"fp32": "float32", "tf32": "float32", "amp-bf16": "bfloat16", "amp-fp16": "float16",
                "bf16": "bfloat16", "fp16": "float16"}
    for precision, dtype in expected.items():
        trace = trace_training_step(mlp, inputs, 4, precision, "sgd")
        dtypes = {d for r in trace.records if r.matmul and r.phase == "forward" for d in r.dtypes}
        assert dtypes == {dtype}, precision


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_optimizer_phase_touches_every_parameter(optimizer: str) -> None:
    trace = trace_training_step(mlp, inputs, 4, "fp32", optimizer)
    # every optimizer reads and writes at least the 212 fp32 parameters and their gradients
    assert trace.bytes_moved("optimizer") >= 2 * 212 * 4
    assert trace.flops("optimizer") >= 212


def test_adam_moves_more_bytes_than_sgd() -> None:
    sgd = trace_training_step(mlp, inputs, 4, "fp32", "sgd")
    adam = trace_training_step(mlp, inputs, 4, "fp32", "adam")
    assert adam.bytes_moved("optimizer") > 2 * sgd.bytes_moved("optimizer")


def test_modules_are_attributed_in_forward_and_backward() -> None:
    trace = trace_training_step(mlp, inputs, 4, "fp32", "sgd")
    modules = {(r.phase, r.module) for r in trace.records if r.matmul}
    assert ("forward", "0") in modules and ("forward", "2") in modules
    assert ("backward", "2") in modules


def test_fake_tensors_allocate_no_weights() -> None:
    # 24 x 4096x4096 linears = 402,751,488 params, 1.6 GB in fp32: traced without that memory
    model = lambda: torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(24)])  # noqa: E731
    trace = trace_training_step(model, lambda b: torch.randn(b, 4096), 2, "amp-bf16", "adamw")
    assert trace.params == 402_751_488
    # forward: 24 layers x 2*2*4096*4096
    assert matmul_flops(trace, "forward") == 24 * 2 * 2 * 4096 * 4096


def test_bad_settings_are_user_errors() -> None:
    with pytest.raises(UserError, match="unknown precision 'fp4'"):
        trace_training_step(mlp, inputs, 4, "fp4", "sgd")
    with pytest.raises(UserError, match="unknown optimizer"):
        trace_training_step(mlp, inputs, 4, "fp32", "lion")
    with pytest.raises(UserError, match="batch size"):
        trace_training_step(mlp, inputs, 0, "fp32", "sgd")


# Linear(4, 3): weight 12 + bias 3 = 15 fp32 parameters, 60 bytes per full set of tensors.
# The optimizer phase is a steady-state step with torch's foreach implementation (CUDA's default).
# Each _foreach_ op reads every tensor list it takes and writes the list it updates (or returns).
OPTIMIZER_STEP = {
    # params.add_(grads, alpha=-lr): read 60+60, write 60 = 180 B; 15 FLOPs
    "sgd": (180, 15),
    # bufs.mul_(0.9): 60+60; bufs.add_(grads): 120+60; params.add_(bufs, alpha=-lr): 120+60
    # = 480 B; 3 x 15 = 45 FLOPs
    "momentum": (480, 45),
    # steps.add_(1.0): 2 fp32 steps + the 1.0 tensor read = 12, written 8 -> 20 B, 2 FLOPs;
    # exp_avg.lerp_(grads): 120+60; exp_avg_sq.mul_(b2): 60+60; exp_avg_sq.addcmul_(g, g): 180+60;
    # denom = sqrt(exp_avg_sq): 60+60; denom.div_(bias corr.): 60+60; denom.add_(eps): 60+60;
    # params.addcdiv_(exp_avg, denom): 180+60.  Bytes: 20+180+120+240+120+120+120+240 = 1160.
    # FLOPs: 2 + 7 x 15 = 107
    "adam": (1160, 107),
    # adam + decoupled weight decay params.mul_(1 - lr*wd): 60+60 B, 15 FLOPs
    "adamw": (1280, 122),
}


@pytest.mark.parametrize("optimizer", OPTIMIZER_STEP)
def test_optimizer_update_bytes_by_hand(optimizer: str) -> None:
    trace = trace_training_step(lambda: torch.nn.Linear(4, 3), lambda b: torch.randn(b, 4), 2, "fp32", optimizer)
    assert (trace.bytes_moved("optimizer"), trace.flops("optimizer")) == OPTIMIZER_STEP[optimizer]


class ReadsItsMask(torch.nn.Module):
    """Control flow on input values: what fake tensors alone cannot run."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if mask.all():
            return self.proj(x)
        kept = mask[0].nonzero().squeeze(1)  # a data-dependent shape
        tokens = int(mask[0].sum().item())
        return self.proj(x[:, kept])[:, :tokens]


def masked_inputs(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.ones(batch, 8, dtype=torch.long)
    mask[:, 6:] = 0  # 6 of 8 tokens are real
    return torch.randn(batch, 8, 16), mask


def test_data_dependent_model_falls_back_to_real_input_values() -> None:
    trace = trace_training_step(ReadsItsMask, masked_inputs, 4, "fp32", "sgd")
    assert trace.values == "fake+real-inputs"
    assert trace.data_dependent_ops["_local_scalar_dense"] == 2  # mask.all() and .item()
    assert trace.data_dependent_ops["nonzero"] == 1
    # the branch for padded masks ran on the 6 kept tokens: 2*(4*6)*16*16 = 12,288
    assert matmul_flops(trace, "forward") == 12_288


def test_models_that_ignore_values_stay_on_fake_tensors() -> None:
    trace = trace_training_step(mlp, inputs, 4, "fp32", "sgd")
    assert trace.values == "fake" and trace.data_dependent_ops == {}


def test_build_model_exception_shows_the_users_line() -> None:
    def build_model() -> torch.nn.Module:
        return torch.nn.Linear(4, 0 // 0)  # the user's bug

    with pytest.raises(UserCodeError) as caught:
        trace_training_step(build_model, inputs, 2, source="model.py")
    assert caught.value.sentence == "model.py: build_model() raised ZeroDivisionError: integer division or modulo by zero"
    assert any("test_trace.py" in line for line in caught.value.user_frames)
    assert any("0 // 0" in line for line in caught.value.user_frames)
    assert not any("advisor" + "/profile" in line for line in caught.value.user_frames)  # none of ours


def test_input_the_model_rejects_is_a_user_error() -> None:
    with pytest.raises(UserCodeError, match=r"the model's forward on example_input\(2\) raised RuntimeError: "
                                            r"a and b must have same reduction dim, but got \[2, 5\] X \[8, 16\]"):
        trace_training_step(mlp, lambda b: torch.randn(b, 5), 2)


def test_a_bug_in_a_cost_formula_is_internal_not_the_users(monkeypatch: pytest.MonkeyPatch) -> None:
    from advisor.profile import costs

    def broken(args, named, out):
        raise KeyError("formula bug")

    monkeypatch.setitem(costs.REGISTRY, torch.ops.aten.addmm, costs._Entry(broken, True))
    with pytest.raises(AssertionError, match="cost formula of aten.addmm"):
        trace_training_step(mlp, inputs, 2)


class BranchesOnItsWeights(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.proj(x)
        if scores.max() > 0:  # depends on weights: no real twin can answer it
            return scores
        return -scores


def test_branch_on_weight_values_runs_the_step_for_real() -> None:
    trace = trace_training_step(BranchesOnItsWeights, lambda b: torch.randn(b, 4), 2, source="model.py")
    assert trace.values == "real" and trace.params == 20  # Linear(4, 4): 16 weights + 4 biases
    (mm,) = [r for r in trace.records if r.op == "addmm" and r.phase == "forward"]
    assert mm.flops == 2 * 2 * 4 * 4  # addmm 2x4 @ 4x4: 2*2*4*4 = 64 FLOPs


def test_branch_on_weight_values_too_large_to_run_is_a_clear_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from advisor.profile import real_run

    monkeypatch.setattr(real_run, "available_memory_bytes", lambda: 1000)  # budget 1000 // 4 = 250 bytes
    # Linear(4, 4) weights 20 x 4 B = 80 B; with gradients and two Adam moments 4 x 80 = 320 B > 250 B
    with pytest.raises(UserError, match=r"model.py branches on values computed from its weights "
                                        r"\(aten._local_scalar_dense.default\), and running its step for real "
                                        r"on this CPU would need about 0.0 GiB"):
        trace_training_step(BranchesOnItsWeights, lambda b: torch.randn(b, 4), 2, source="model.py")


@pytest.mark.parametrize("optimizer", ["adam-fused", "adamw-fused"])
def test_fused_adam_is_one_kernel_without_temporaries(optimizer: str) -> None:
    trace = trace_training_step(lambda: torch.nn.Linear(4, 3), lambda b: torch.ones(b, 4), 2, "fp32", optimizer)
    (fused,) = [r for r in trace.records if r.op.startswith("_fused_adam")]
    # Linear(4, 3): 12 weights + 3 biases = 15 elements, 10 FLOPs each (costs.ADAM_FLOPS_PER_ELEMENT)
    assert fused.flops == 150 and fused.tensors == 2
    # reads parameters, gradients, both moments (4 x 15 x 4 B = 240) and the 2 step counters (8 B);
    # writes parameters and both moments: 3 x 60 = 180 B
    assert (fused.bytes_read, fused.bytes_written) == (248, 180)
    assert not any(r.allocated for r in trace.records if r.phase == "optimizer")  # no temporaries


class FanOut(torch.nn.Module):
    """A Linear whose output feeds three ops, and a tensor used twice by one op."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.fc(x)
        return hidden.sin() + hidden.cos() + hidden * hidden


def test_gradients_summed_by_the_engine_are_marked() -> None:
    trace = trace_training_step(FanOut, inputs, 4, "fp32", "sgd")
    summed = [r for r in trace.records if r.engine_sum]
    # hidden feeds sin, cos and mul (twice: mul's two inputs are two edges to hidden's node): 4 gradients
    # arrive at AddmmBackward's input, 3 summed in backward; the forward's two adds are the model's own
    assert [(r.phase, r.op) for r in summed] == [("backward", "add")] * 3
    assert sum(r.op == "add" and r.phase == "forward" and r.module == "" for r in trace.records) == 2
    # a plain MLP feeds every tensor to one op: nothing summed
    assert not any(r.engine_sum for r in trace_training_step(mlp, inputs, 4, "fp32", "sgd").records)
