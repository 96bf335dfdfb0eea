"""Tensor parallelism (advisor/parallel/tensor.py): which layers split, each rank's ops, memory and all-reduces,
and the planner's --parallel tp / --tp K. Real torch TP runs on gloo: tests/test_distributed.py."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from advisor.cli.main import main
from advisor.parallel.strategy import Layout
from advisor.parallel.tensor import TensorPlan, linear_kind, rank_trace, tensor_collectives, tensor_plan
from advisor.profile.trace import trace_training_step

HIDDEN, WIDE, VOCAB, TOKENS = 16, 64, 32, 8


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.o_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj(torch.relu(self.q_proj(x)))


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(HIDDEN, WIDE, bias=False)
        self.fc2 = nn.Linear(WIDE, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.attn = Attention()
        self.mlp = Mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm(x))
        return x + self.mlp(self.norm(x))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList([Block(), Block()])
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(x)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def tokens(batch: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, TOKENS))


@pytest.fixture(scope="module")
def tiny():
    """TinyLM's step at batch 1 (8 tokens), fp32, SGD (no optimizer state), every block traced."""
    return trace_training_step(TinyLM, tokens, 1, "fp32", "sgd", dedupe=False)


@pytest.mark.parametrize("path,expected", [
    ("model.layers.0.self_attn.q_proj", ("colwise", "model.layers.0.self_attn.q_proj")),
    ("model.layers.0.mlp.down_proj", ("rowwise", "model.layers.0.mlp.down_proj")),
    ("bert.encoder.layer.3.intermediate.dense", ("colwise", "bert.encoder.layer.3.intermediate.dense")),
    ("bert.encoder.layer.3.attention.output.dense", ("rowwise", "bert.encoder.layer.3.attention.output.dense")),
    ("transformer.h.1.attn.c_attn", ("colwise", "transformer.h.1.attn.c_attn")),
    ("model.layers.2.self_attn.q_proj.lora_A", ("colwise", "model.layers.2.self_attn.q_proj")),  # its adapter
    ("model.layers.0.input_layernorm", None),
])
def test_layers_are_split_by_the_names_tp_plans_use(path: str, expected) -> None:
    assert linear_kind(path) == expected


def test_the_plan_of_a_small_language_model(tiny) -> None:
    plan = tensor_plan(tiny)
    assert isinstance(plan, TensorPlan)
    assert plan.colwise == {f"layers.{i}.{name}" for i in (0, 1) for name in ("attn.q_proj", "mlp.fc1")}
    assert plan.rowwise == {f"layers.{i}.{name}" for i in (0, 1) for name in ("attn.o_proj", "mlp.fc2")}
    assert plan.regions == {f"layers.{i}.{name}" for i in (0, 1) for name in ("attn", "mlp")}
    assert (plan.embedding, plan.head) == ("embed", "lm_head")
    # per block 2 x 16 x 16 + 2 x 16 x 64 = 2,560 split, norm 32 kept; embedding and head 2 x 32 x 16 = 1,024
    assert plan.split_params == 2 * 2560 + 1024 and plan.total_params == plan.split_params + 2 * 32
    # the kept share at 2: (64 + 6,144 / 2) / 6,208
    assert plan.kept_share(2) == pytest.approx((64 + 6144 / 2) / 6208)


def test_each_rank_runs_half_of_the_split_products(tiny) -> None:
    plan = tensor_plan(tiny)
    assert isinstance(plan, TensorPlan)
    rank = rank_trace(tiny, plan, 2)
    flops = {(r.phase, r.module, r.op): 0.0 for r in tiny.records}
    halves = {}
    for whole, half in zip(tiny.records, rank.records):
        key = (whole.phase, whole.module, whole.op)
        flops[key] += whole.flops
        halves[key] = halves.get(key, 0.0) + half.flops
    # fc1 forward: 8 tokens x 16 x 64 x 2 = 16,384 FLOPs on one GPU, 8,192 on each of 2
    assert flops["forward", "layers.0.mlp.fc1", "mm"] == 16384
    assert halves["forward", "layers.0.mlp.fc1", "mm"] == 8192
    # the norm runs whole on every rank
    norm = ("forward", "layers.0.norm", "native_layer_norm")
    assert halves[norm] == flops[norm] > 0
    split_gemm = next(r.gemm for r in rank.records if r.module == "layers.0.mlp.fc1" and r.phase == "forward")
    assert split_gemm == (1, TOKENS, WIDE // 2, HIDDEN)


def test_each_rank_holds_half_of_the_split_activations(tiny) -> None:
    plan = tensor_plan(tiny)
    assert isinstance(plan, TensorPlan) and tiny.memory is not None
    rank = rank_trace(tiny, plan, 2).memory
    assert rank is not None
    made = {(s.module, s.op): (s.nbytes, r.nbytes) for s, r in zip(tiny.memory.storages, rank.storages)
            if s.category == "activations"}
    # fc1's output: 8 x 64 fp32 = 2,048 bytes whole, 1,024 per rank; fc2's output is whole on every rank (512)
    assert made["layers.0.mlp.fc1", "mm"] == (2048, 1024)
    assert made["layers.0.mlp.fc2", "mm"] == (512, 512)
    assert rank.peak().bytes < tiny.memory.peak().bytes


def test_all_reduces_per_layer_call(tiny) -> None:
    plan = tensor_plan(tiny)
    assert isinstance(plan, TensorPlan)
    found = tensor_collectives(tiny, plan, 2, micro_batches=3)
    # hidden states 8 x 16 fp32 = 512 bytes. forward: o_proj, fc2 per block + the embedding = 5;
    # backward: q_proj, fc1 per block + the head = 5; each micro-batch
    assert {(c.phase, c.message_bytes, c.count) for c in found} == {("forward", 512.0, 15), ("backward", 512.0, 15)}
    assert all(c.kind == "all_reduce" and c.ranks == 2 and c.hidden_behind is None for c in found)
    assert tensor_collectives(tiny, plan, 1) == []


def test_a_model_without_named_layers_has_no_plan() -> None:
    trace = trace_training_step(lambda: nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)),
                                lambda b: torch.randn(b, 8), 2, "fp32", "sgd")
    assert isinstance(tensor_plan(trace), str)


def test_layouts_with_tensor_parallel_groups() -> None:
    layout = Layout("fsdp", 16, 8, tp=4)
    assert (layout.dp, layout.shards, layout.name) == (4, 4, "fsdp+tp")
    assert Layout("ddp", 8, 8, tp=8).to_dict() == {"strategy": "tp", "dp": 1, "tp": 8}
    with pytest.raises(AssertionError):
        Layout("ddp", 8, 4, tp=8)  # a group stays inside one machine


def test_the_command_line_plans_tensor_parallelism(capsys) -> None:
    args = ("estimate", "llama", "--gpu", "h100-sxm", "--precision", "amp-bf16", "--num-gpus", "8",
            "--no-input-pipeline", "--plans", "never", "--json")
    code, out, _ = run(capsys, *args, "--parallel", "tp")
    assert code == 0
    tp = json.loads(out)["results"][0]
    assert tp["parallel"]["strategy"] == "tp" and tp["parallel"]["dp"] == 1 and tp["parallel"]["tp"] == 8
    assert tp["fits"] and tp["communication"]["exposed_s"] > 0
    code, out, _ = run(capsys, *args, "--parallel", "ddp")
    ddp = json.loads(out)["results"][0]
    assert tp["peak_memory_bytes"] < ddp["peak_memory_bytes"] / 4  # weights, state and activations split by 8
    code, out, _ = run(capsys, *args, "--tp", "8")  # one group of all 8: no strategy between groups to choose
    assert [a["strategy"] for a in json.loads(out)["results"][0]["parallel"]["alternatives"]] == ["tp"]
    code, out, _ = run(capsys, *args, "--parallel", "fsdp", "--tp", "2")
    parallel = json.loads(out)["results"][0]["parallel"]
    assert (parallel["strategy"], parallel["dp"], parallel["tp"]) == ("fsdp+tp", 4, 2)


def test_tensor_parallelism_refuses_a_model_it_cannot_split(capsys) -> None:
    code, _, err = run(capsys, "estimate", "resnet50", "--gpu", "h100-sxm", "--num-gpus", "8", "--parallel", "tp",
                       "--no-input-pipeline")
    assert code == 2 and "tensor parallelism cannot split" in err and "q_proj/o_proj" in err
    code, _, err = run(capsys, "memory", "resnet50", "--gpu", "h100-sxm", "--num-gpus", "8", "--tp", "2")
    assert code == 2 and "tensor parallelism cannot split" in err
