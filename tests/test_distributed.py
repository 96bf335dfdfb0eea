"""Per-rank memory and collective bytes predicted from a one-GPU trace, against real torch.distributed
steps (DDP, ZeRO-1, FSDP2, ZeRO-2 as FSDP2 without resharding after forward, tensor parallelism with
torch's ColwiseParallel/RowwiseParallel and loss_parallel) with the gloo backend on 2 and 4 processes of
this CPU (tests/distributed_runs.py)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from advisor.estimate.parallel import Sharding, rank_trace, step_collectives
from advisor.parallel.strategy import Layout, fsdp_units
from advisor.parallel.tensor import TensorPlan, tensor_collectives, tensor_plan
from advisor.parallel.tensor import rank_trace as tensor_rank_trace
from advisor.profile.trace import trace_training_step
from tests.distributed_runs import MODELS, Case, Measured, run

pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo backend")

STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")
FULLY_SHARDED_MODELS = ("convnet", "llama", "gpt2")
"""Models whose fsdp and zero2 steps are compared. Not the parameter-heavy MLP: gloo's reduce-scatters
finish late on its own threads, and the buffers they hold pile up. On 2 cores its real peak ranged
11.7-20 MB between runs (CI once measured 14.3-18.0 MB against 12.7 predicted), so one run cannot check it."""
AMP_CASES = [Case(model, strategy, 8, "amp-bf16") for model in ("llama", "gpt2")
             for strategy in ("single", "ddp", "zero2", "fsdp")]
"""Under bfloat16 autocast, fully_shard with MixedPrecisionPolicy: gathers carry bfloat16 (half the fp32
bytes), gradients are reduced in float32, and autocast's weight copies are gone."""
AMP_OVER = 0.3
"""How far above the measured range fully_shard's mixed-precision peaks may be predicted: the small
Llama's zero2 and fsdp steps measured 4.5-5.9 MB between runs (4.5 MB on all six steps of one run on
2026-11-24) against 5.5-5.7 predicted (GPT-2 within 10%); where the prediction keeps more than FSDP2 does
is not found yet."""
SHARDED_UNDER = 0.15
"""How far below the measured range fully_shard's peaks may be predicted: the prediction holds no collective
in flight, and a step's real peak counts the buffers of gloo's late reduce-scatters. The small Llama's
2-rank zero2 step (7.28 MB predicted) measured 7.41-8.30 MB over six runs here on 2026-11-27 and
8.15-8.59 MB on all six steps of one CI run (0.893 of its lowest)."""
TP_UNDER = 0.2
"""How far below the measured range a tensor-parallel rank's peak may be predicted: the small Llama over 2
ranks measured 5.19-5.56 MB between steps against 4.71 MB predicted (the one-GPU step: 7.62 measured,
7.63 predicted). What DTensor's ranks hold beyond the split tensors is not found yet."""
CASES = {2: [Case(model, strategy, 8) for model in MODELS for strategy in ("single",) + STRATEGIES
             if strategy in ("single", "ddp", "zero1") or model in FULLY_SHARDED_MODELS] + AMP_CASES
         + [Case("llama", "tp", 8)],
         4: [Case(model, strategy, 8) for model in ("llama", "gpt2") for strategy in STRATEGIES]}


@pytest.fixture(scope="module")
def measured() -> dict[tuple[int, Case], list[Measured]]:
    found = {}
    for world, cases in CASES.items():
        for case, ranks in zip(cases, run(world, cases)):
            found[world, case] = ranks
    return found


def predicted(case: Case, world: int) -> tuple[int, dict[str, float]]:
    """(peak tensor bytes of one rank, bytes handed to each kind of collective in one step)."""
    build, make_input, loss_fn = MODELS[case.model]
    trace = trace_training_step(build, make_input, case.batch_size, case.precision, "adamw", loss_fn=loss_fn)
    if case.strategy == "single":
        assert trace.memory is not None
        return trace.memory.peak().bytes, {}
    if case.strategy == "tp":  # one tensor-parallel group of every rank
        plan = tensor_plan(trace)
        assert isinstance(plan, TensorPlan), plan
        memory = tensor_rank_trace(trace, plan, world).memory
        assert memory is not None
        return memory.peak().bytes, {"all_reduce": sum(c.total_bytes for c in tensor_collectives(trace, plan, world))}
    layout = Layout(case.strategy, world, 8)
    sharding = Sharding.of_trace(trace)
    memory = rank_trace(trace, layout, sharding).memory
    assert memory is not None
    by_kind: dict[str, float] = {}
    for collective in step_collectives(layout, sharding, 1):
        by_kind[collective.kind] = by_kind.get(collective.kind, 0.0) + collective.total_bytes
    return memory.peak().bytes, by_kind


@pytest.mark.parametrize("world,case", [(w, c) for w, cases in CASES.items() for c in cases],
                         ids=lambda v: v if isinstance(v, int) else f"{v.model}-{v.strategy}"
                         + ("" if v.precision == "fp32" else f"-{v.precision}"))
def test_rank_memory_and_collective_bytes_match_real_gloo_steps(measured, world: int, case: Case) -> None:
    ranks = measured[world, case]
    peak, by_kind = predicted(case, world)
    real = [p for rank in ranks for p in rank.peaks]
    # gloo's late collectives make real peaks vary between steps (distributed_runs): the prediction must lie
    # within 10% of the range the ranks' measured steps span (below it by up to SHARDED_UNDER for fully_shard's
    # late collectives, TP_UNDER for tensor parallelism; above it by up to AMP_OVER for fully_shard's mixed
    # precision, an upper bound)
    over = AMP_OVER if case.precision != "fp32" and case.strategy in ("zero2", "fsdp") else 0.1
    under = TP_UNDER if case.strategy == "tp" else SHARDED_UNDER if case.strategy in ("zero2", "fsdp") else 0.1
    assert (1 - under) * min(real) <= peak <= (1 + over) * max(real), (peak, sorted(real))
    for rank in ranks:  # every rank hands the same bytes to each kind of collective as predicted
        real_bytes = {kind: b for kind, b in rank.collective_bytes.items() if b > 0}
        assert set(real_bytes) == set(by_kind)
        for kind, bytes_ in by_kind.items():
            assert round(bytes_) == real_bytes[kind], kind


def test_fsdp_units_are_the_numbered_blocks_with_the_most_parameters() -> None:
    # depth 1 holds 4 + 4 + 1 in numbered blocks ("h.0", "h.1", "lm.0"); the root keeps 10 - 9 = 1 ("wte")
    units = fsdp_units({"": 10, "h": 8, "h.0": 4, "h.1": 4, "lm": 1, "lm.0": 1, "wte": 1})
    assert units.blocks == ("h.0", "h.1", "lm.0") and units.root_params == 1
    assert fsdp_units({"": 5, "fc": 5}).blocks == ()
