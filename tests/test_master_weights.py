"""--precision bf16-master: bf16 weights stepped through fp32 masters (advisor/profile/master_weights.py)."""

from __future__ import annotations

import json

import pytest
import torch

from advisor.cli.main import main
from advisor.memory.estimate import StepMemory, parameter_formula_bytes
from advisor.profile.master_weights import MasterWeights
from advisor.profile.trace import trace_training_step


def two_layers() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False), torch.nn.ReLU(),
                               torch.nn.Linear(128, 64, bias=False))


def batch(size: int) -> torch.Tensor:
    return torch.randn(size, 64)


def state_at_peak(precision: str, optimizer: str = "adamw") -> dict[str, int]:
    memory = StepMemory.of_trace(trace_training_step(two_layers, batch, 8, precision, optimizer))
    return memory.by_category


def test_masters_their_gradients_and_adam_state_are_fp32_optimizer_state() -> None:
    # 2 x 64x128 = 16,384 weights; bf16 weight 2 B each: 32,768 B; AdamW under bf16-master keeps per weight
    # an fp32 master, its fp32 gradient and two fp32 moments: 16 B each = 262,144 B (pure bf16: 2 x 2 B = 65,536);
    # both plus AdamW's two 0-dim step counters, a 512-byte block each
    master = state_at_peak("bf16-master")
    pure = state_at_peak("bf16")
    assert master["weights"] == pure["weights"] == 16_384 * 2
    assert pure["optimizer_state"] == 16_384 * 4 + 2 * 512
    assert master["optimizer_state"] == 16_384 * 16 + 2 * 512
    assert "weight_copies" not in master or master["weight_copies"] == 0  # no autocast copies of the weights


def test_plain_sgd_keeps_only_the_master_and_its_gradient() -> None:
    # SGD has no state of its own: 4 B of master + 4 B of its gradient per weight
    assert state_at_peak("bf16-master", "sgd")["optimizer_state"] == 16_384 * 8


def test_the_formula_counts_the_master_and_its_gradient() -> None:
    # 1000 params, AdamW: 2 + 2 (bf16 weight and gradient) + 4 + 4 (fp32 master and gradient) + 8 (moments)
    assert parameter_formula_bytes(1000, "bf16-master", "adamw") == 20_000
    assert parameter_formula_bytes(1000, "bf16-master", "sgd") == 12_000


def test_a_step_updates_the_fp32_master_and_writes_it_back_in_bf16() -> None:
    # one SGD step, lr 0.5: master 1.0 - 0.5 * 0.25 = 0.875; 3.0 - 0.5 * 0.5 = 2.75; the bf16 weight is the master cast
    weight = torch.nn.Parameter(torch.tensor([1.0, 3.0], dtype=torch.bfloat16))
    opt = MasterWeights([weight], lambda masters: torch.optim.SGD(masters, lr=0.5))
    weight.grad = torch.tensor([0.25, 0.5], dtype=torch.bfloat16)
    opt.step()
    master = opt.state[weight]["master"]
    assert master.dtype == torch.float32 and master.tolist() == [0.875, 2.75]
    assert weight.dtype == torch.bfloat16 and weight.tolist() == [0.875, 2.75]
    # a small update that bf16 alone would lose is kept by the master: 256 - 0.5 * 0.5 = 255.75 (bf16 has
    # 8 bits of mantissa: 256 and 255.75 are not both representable near 256; bf16 rounds it back to 256)
    big = torch.nn.Parameter(torch.tensor([256.0], dtype=torch.bfloat16))
    opt = MasterWeights([big], lambda masters: torch.optim.SGD(masters, lr=0.5))
    big.grad = torch.tensor([0.5], dtype=torch.bfloat16)
    opt.step()
    assert opt.state[big]["master"].item() == 255.75 and big.item() == 256.0
    opt.zero_grad(set_to_none=True)
    assert big.grad is None


def test_zero1_shards_the_masters_with_the_optimizer_state(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["memory", "mlp", "--gpu", "h100-sxm", "--batch-size", "64", "--precision", "bf16-master"]
    assert main(argv + ["--json"]) == 0
    one = json.loads(capsys.readouterr().out)["results"][0]["memory"]
    assert main(argv + ["--num-gpus", "8", "--json"]) == 0
    by_strategy = {r["strategy"]: r["memory"] for r in json.loads(capsys.readouterr().out)["sharded"]}
    # ZeRO-1 keeps 1/8 of the masters, their gradients and the moments (up to the allocator's rounding of a
    # shard); the bf16 weights stay whole on every rank
    assert by_strategy["zero1"]["optimizer"] < 0.2 * one["optimizer"]
    assert by_strategy["zero1"]["weights"] == pytest.approx(one["weights"], rel=0.05)
    # Megatron's and DeepSpeed's gradient buffers are their buckets: no second copy of the gradients, where
    # torch's DDP under amp-bf16 holds one (its reducer's buckets)
    for strategy in ("ddp", "zero1"):
        assert by_strategy[strategy]["gradients"] == pytest.approx(one["gradients"], rel=0.05)
    assert main(["memory", "mlp", "--gpu", "h100-sxm", "--batch-size", "64", "--precision", "amp-bf16",
                 "--num-gpus", "8", "--json"]) == 0
    autocast = json.loads(capsys.readouterr().out)
    ddp = next(r["memory"] for r in autocast["sharded"] if r["strategy"] == "ddp")
    assert ddp["gradients"] == pytest.approx(2 * autocast["results"][0]["memory"]["gradients"], rel=0.05)


def test_estimate_accepts_bf16_master_and_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "mlp", "--gpu", "h100-sxm", "--precision", "bf16-master", "--json",
                 "--plans", "never", "--no-input-pipeline"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["settings"]["precision"] == "bf16-master"
    assert out["results"][0]["fits"]
