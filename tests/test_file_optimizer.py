"""The model file's optional optimizer(params) (PRODUCT.md's contract): traced as its training script
builds it, the default when the file defines one, and its mistakes reported in one sentence."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from advisor.cli.main import main
from advisor.errors import UserError
from advisor.profile.choices import FILE_OPTIMIZER
from advisor.profile.model_file import load_model_file
from advisor.profile.trace import trace_training_step

MODEL = """
import torch
from torch import nn

def build_model():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

def example_input(batch_size):
    return torch.randn(batch_size, 8)

"""
# Linear(8, 16): 128 + 16, Linear(16, 4): 64 + 4 -> 212 parameters
PARAMS = 212

SGD_MOMENTUM = MODEL + """
def optimizer(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "model.py"
    path.write_text(text)
    return str(path)


def trace_of(path: str, optimizer: str | None = None):
    model = load_model_file(path)
    return trace_training_step(model.build_model, model.example_input, 4, "fp32",
                               model.resolve_optimizer(optimizer), model.loss_fn, model.source,
                               build_optimizer=model.optimizer)


def test_the_files_optimizer_is_the_default_and_runs_as_cuda_would(tmp_path: Path) -> None:
    trace = trace_of(write(tmp_path, SGD_MOMENTUM))
    assert (trace.optimizer, trace.optimizer_class, trace.params) == (FILE_OPTIMIZER, "SGD", PARAMS)
    steps = [r for r in trace.records if r.phase == "optimizer"]
    # foreach left unset: the multi-tensor form CUDA tensors get, one op per list of 4 tensors
    assert steps and all(r.op.startswith("_foreach_") for r in steps if r.flops)
    assert {r.tensors for r in steps if r.op.startswith("_foreach_")} == {4}
    # one momentum buffer per parameter: 212 x 4 B = 848 B of optimizer state
    assert trace.memory.total("optimizer_state") == PARAMS * 4


def test_the_command_line_still_chooses(tmp_path: Path) -> None:
    trace = trace_of(write(tmp_path, SGD_MOMENTUM), "adamw")
    assert (trace.optimizer, trace.optimizer_class) == ("adamw", "AdamW")
    # two moments per parameter (and a step count per tensor): 2 x 212 x 4 B = 1,696 B and more
    assert trace.memory.total("optimizer_state") >= 2 * PARAMS * 4


def test_without_the_function_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"--optimizer file: .*model.py defines no optimizer\(params\) function"):
        load_model_file(write(tmp_path, MODEL)).resolve_optimizer("file")
    assert load_model_file(write(tmp_path, MODEL)).resolve_optimizer(None) == "adamw"


@pytest.mark.parametrize("body, message", [
    ("optimizer = 3", r"optimizer must be a function optimizer\(params\)"),
    ("def optimizer():\n    pass", r"optimizer must accept 1 positional argument"),
])
def test_a_malformed_optimizer_is_a_load_error(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        load_model_file(write(tmp_path, MODEL + body))


@pytest.mark.parametrize("body, message", [
    ("def optimizer(params):\n    return list(params)", r"optimizer\(params\) returned list, not a torch.optim.Optimizer"),
    ("def optimizer(params):\n    return torch.optim.SGD(params, lr=-1.0)",
     r"optimizer\(params\) raised ValueError: Invalid learning rate: -1.0"),
])
def test_a_failing_optimizer_is_one_sentence(tmp_path: Path, body: str, message: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", write(tmp_path, MODEL + body), "--gpu", "rtx-3090"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()[0]) > 0 and "Traceback" not in err
    assert re.search(message, err)


def test_memory_json_names_the_files_optimizer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", write(tmp_path, SGD_MOMENTUM), "--gpu", "rtx-3090", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["settings"]["optimizer"] == FILE_OPTIMIZER
    # parameter-count formula for SGD (momentum unknown there): weights 4 B + gradients 4 B = 212 x 8 B
    assert out["parameter_formula_bytes"] == PARAMS * 8


CLIPPING_LOOP = MODEL + """
class ClippingSGD(torch.optim.Optimizer):
    # a per-parameter loop that reads each gradient's norm back, as torch 1.4-1.9's clip_grad_norm_ did
    def __init__(self, params):
        super().__init__(params, dict(lr=0.1))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad.norm().item() > 1.0:
                    p.grad.mul_(0.5)
                p.add_(p.grad, alpha=-group["lr"])

def optimizer(params):
    return ClippingSGD(params)
"""


STRICT_CLIPPING = MODEL + """
class StrictClippingSGD(torch.optim.SGD):
    # torch's clip_grad_norm_ that raises on a non-finite norm: `if logical_or(norm.isnan(), norm.isinf())`
    def step(self, closure=None):
        params = [p for group in self.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
        return super().step(closure)

def optimizer(params):
    return StrictClippingSGD(params, lr=0.1)
"""


@pytest.mark.parametrize(("text", "optimizer", "precision", "reads"), [
    (CLIPPING_LOOP, FILE_OPTIMIZER, "fp32", 4),  # one read per parameter: 2 weights, 2 biases
    # the norm's finiteness, read once: answered as finite (the step is one worth planning), and a read back
    (STRICT_CLIPPING, FILE_OPTIMIZER, "fp32", 1),
    (MODEL, "adam", "fp32", 0),  # Adam reads its step counters, which torch.optim keeps on the host
    (MODEL, "adam", "amp-fp16", 1),  # GradScaler.step reads its inf check before the optimizer steps
])
def test_values_read_back_to_the_host_are_marked(tmp_path: Path, text: str, optimizer: str, precision: str,
                                                  reads: int) -> None:
    model_file = load_model_file(write(tmp_path, text))
    trace = trace_training_step(model_file.build_model, model_file.example_input, 4, precision, optimizer,
                                build_optimizer=model_file.optimizer)
    marked = [r for r in trace.records if r.synchronizes]
    assert len(marked) == reads
    assert all(r.op == "_local_scalar_dense" and r.phase == "optimizer" for r in marked)
