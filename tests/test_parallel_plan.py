"""The multi-GPU planner (issue #25): whole instances priced, the machines that hold N GPUs, the
strategy `auto` picks, per-GPU batch semantics, and the flags' checks."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math

import pytest

from advisor.app.request import PARALLEL_CHOICES, PlanRequest
from advisor.calibration.reference import load_families
from advisor.errors import UserError
from advisor.estimate.costs import Job, cloud_costs, instances_for
from advisor.estimate.parallel import machines_for, scale_out_counts
from advisor.estimate.plan import EstimateSettings, estimate_model
from advisor.estimate.targets import database_targets
from advisor.hardware.loader import load_hwdb
from advisor.hardware.specs import CloudOffer
from advisor.memory.plan import MemorySettings
from advisor.parallel.strategy import STRATEGIES
from advisor.profile.model_file import load_model_file
from advisor.cli.main import main


@pytest.fixture(scope="module")
def db():
    return load_hwdb([])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def offer(gpus: int, usd_per_gpu_hour: float, network: str | None = None) -> CloudOffer:
    return CloudOffer(gpu_id="h100-sxm", provider="p", instance=f"i{gpus}", gpus_per_instance=gpus,
                      usd_per_gpu_hour=usd_per_gpu_hour, spot_usd_per_gpu_hour=None, region="r", gpu_only=True,
                      source="S", date=dt.date(2026, 1, 1), notes=None, origin="test", network=network)


def test_the_parallel_choices_are_auto_the_strategies_and_tp() -> None:
    assert PARALLEL_CHOICES == ("auto",) + STRATEGIES + ("tp",)


def test_whole_instances_are_priced_per_instance_hour() -> None:
    # 10 h of 16 GPUs: 8-GPU instances with a network: 2 x (8 x 2.00) x 10 = 320 USD; a 16-GPU instance at
    # 2.50 per GPU-hour: 1 x 40.00 x 10 = 400 USD; 8-GPU instances without a network cannot hold 16
    offers = [offer(8, 2.0, "efa-3200g"), offer(16, 2.5), offer(8, 1.0)]
    assert [instances_for(o, 16) for o in offers] == [2, 1, None]
    costs = cloud_costs(offers, 10.0, 16)
    assert [(c.instance, c.instances, c.usd_per_hour, c.cost_usd) for c in costs] == [
        ("i8", 2, 16.0, 320.0), ("i16", 1, 40.0, 400.0)]
    assert costs[0].rate() == 32.0 and costs[0].gpus == 16  # 2 instances x 16.00 per instance-hour


def test_machines_hold_exact_instances_then_networked_ones_then_your_own(db) -> None:
    h100 = db.gpu("h100-sxm")
    eight = machines_for(db, h100, 8)
    assert not isinstance(eight, str) and eight.offer is not None and eight.offer.gpus_per_instance == 8
    assert eight.node_link.id == "nvlink4-nvswitch" and eight.nodes == 1
    sixteen = machines_for(db, h100, 16)  # p5 has a network: two of them
    assert not isinstance(sixteen, str) and sixteen.nodes == 2 and sixteen.network is not None
    two = machines_for(db, h100, 2)  # no 2-GPU instance of it: the user's own machine, unpriced
    assert not isinstance(two, str) and two.offer is None and two.gpus_per_node == 2
    laptop = machines_for(db, db.gpu("rtx-3080-max-q"), 2)
    assert isinstance(laptop, str) and "no multi-GPU machine" in laptop


def test_scale_out_counts_follow_the_offers(db) -> None:
    counts = scale_out_counts(db, db.gpu("h100-sxm"))
    assert counts[0] == 8 and 16 in counts and max(counts) <= 512 and counts == sorted(counts)
    assert scale_out_counts(db, db.gpu("rtx-3060")) == [2, 4, 8]  # no multi-GPU instance: your own machine


@pytest.fixture(scope="module")
def mlp_parallel(db):
    model = load_model_file("mlp")
    targets = database_targets(db, [db.gpu("h100-sxm"), db.gpu("rtx-4090")], load_families(db))
    job = Job(samples=60_000, epochs=1)
    single = estimate_model(model, db, targets, EstimateSettings(MemorySettings(64, "amp-bf16", "adamw"), job))
    several = estimate_model(model, db, targets, EstimateSettings(MemorySettings(64, "amp-bf16", "adamw"), job,
                                                                  num_gpus=8))
    return single, several


def test_a_scaling_efficiency_over_100_percent_says_why(mlp_parallel) -> None:
    """A sharded optimizer steps 1/N of the weights per GPU: against one GPU that steps them all, the ratio can
    exceed 100% (Phi-3-mini on 8 H100s read 158%); the line says so rather than leaving it to look wrong."""
    from advisor.present.parallel import parallel_line

    _, several = mlp_parallel
    result = next(r for r in several.results if r.scaling is not None and r.scaling.layout.shards > 1)
    scaling = result.scaling
    # one GPU's step twice the rank's: 2 x step / (step x tp 1) = 200%
    doubled = dataclasses.replace(result, scaling=dataclasses.replace(scaling, single_step_s=2 * result.step_time_s))
    assert doubled.scaling_efficiency == pytest.approx(2.0)
    line = parallel_line(doubled)
    assert f"scaling efficiency 200% (over 100%: each GPU updates 1/{scaling.layout.shards} of the weights" in line
    halved = dataclasses.replace(result, scaling=dataclasses.replace(scaling, single_step_s=result.step_time_s / 2))
    assert "scaling efficiency 50%;" in parallel_line(halved)  # below 100%: nothing to explain


def test_the_batch_is_each_gpus_and_the_job_counts_the_global_batch(mlp_parallel) -> None:
    single, several = mlp_parallel
    for result in several.results:
        assert result.num_gpus == 8 and result.global_batch_size == 8 * 64
        assert result.steps == math.ceil(60_000 / (8 * 64))  # 118 steps of 512 samples
        assert result.throughput == pytest.approx(8 * 64 / result.step_time_s)
        scaling = result.scaling
        assert scaling is not None and scaling.layout.strategy in STRATEGIES
        # auto keeps the fastest strategy that fits, and lists every one it tried
        fitting = [a for a in scaling.alternatives if a.fits]
        assert result.step_time_s == pytest.approx(min(a.step_time_s for a in fitting))
        assert {a.strategy for a in scaling.alternatives} == {"ddp", "zero1", "zero2", "fsdp"}
        # the exposed communication and the slowdown of the compute beside the rest are part of the step
        comm = scaling.communication
        assert result.step.by_bound["communication"] == pytest.approx(comm.exposed_s + comm.contention_s)
        assert 0 <= comm.contention_s <= comm.time_s - comm.exposed_s
        assert 0 <= scaling.communication.exposed_s <= scaling.communication.time_s
        assert scaling.single_fits  # the MLP fits one GPU: its scaling efficiency is against that run
        assert result.scaling_efficiency == pytest.approx(scaling.single_step_s / result.step_time_s)
        # NCCL's buffers sit outside the allocator, in the overhead
        assert result.memory.detail["communicator"] > 0
    by_id = {r.id: r for r in several.results}
    # the same collectives take longer over PCIe through the host than over NVLink 4 and NVSwitch
    assert by_id["rtx-4090"].scaling.communication.time_s > by_id["h100-sxm"].scaling.communication.time_s


def test_the_json_has_the_multi_gpu_fields(mlp_parallel) -> None:
    single, several = mlp_parallel
    data = json.loads(json.dumps(several.to_dict()))
    assert data["settings"]["num_gpus"] == 8 and data["settings"]["parallel"] == "auto"
    for result in data["results"]:
        assert result["num_gpus"] == 8 and result["nodes"] == 1
        assert set(result["parallel"]) >= {"strategy", "dp", "tp", "reason", "alternatives"}
        assert set(result["communication"]) >= {"bytes_per_step", "time_s", "exposed_s"}
        assert result["scaling_efficiency"] > 0
        for cost in result["cloud"]:
            assert cost["instances"] * cost["gpus_per_instance"] >= 8
    one = json.loads(json.dumps(single.to_dict()))["results"][0]
    assert one["num_gpus"] == 1 and one["parallel"]["strategy"] == "single" and one["communication"] is None


def test_a_job_one_gpu_cannot_hold_names_the_fewest_that_fit(db) -> None:
    model = load_model_file("llama")
    targets = database_targets(db, [db.gpu("h100-sxm")], load_families(db))
    settings = EstimateSettings(MemorySettings(1, "amp-bf16", "adamw"), Job(samples=1000, epochs=1))
    result = estimate_model(model, db, targets, settings).results[0]
    assert not result.fits and result.scale_out is not None
    more = result.scale_out
    assert more.fits and more.num_gpus > 1 and more.cheapest() is not None  # an instance of that size is rented
    assert result.to_dict()["smallest_fit"]["num_gpus"] == more.num_gpus
    # no one-GPU run to scale from: a sharded rank steps 1/N of the optimizer, so its ratio to a one-GPU
    # step that does not fit would read over 100%
    assert more.scaling is not None and not more.scaling.single_fits
    assert more.scaling_efficiency is None


@pytest.mark.parametrize("changes,message", [
    ({"tp": 3, "num_gpus": 8}, "with N a multiple of 3"),
    ({"tp": 2}, "give --num-gpus N"),
    ({"tp": 2, "num_gpus": 8, "parallel": "hsdp"}, "does not combine with --tp"),
    ({"parallel": "tp"}, "give their number with --num-gpus"),
    ({"parallel": "fsdp"}, "give their number with --num-gpus"),
    ({"num_gpus": 0}, "number of GPUs must be at least 1"),
])
def test_parallel_flags_are_checked(changes, message) -> None:
    with pytest.raises(UserError, match=message):
        dataclasses.replace(PlanRequest(), **changes)


def test_the_command_line_runs_several_gpus(capsys) -> None:
    code, out, _ = run(capsys, "estimate", "mlp", "--gpu", "h100-sxm", "--num-gpus", "8", "--parallel", "ddp",
                       "--no-input-pipeline", "--json")
    assert code == 0
    result = json.loads(out)["results"][0]
    assert result["parallel"]["strategy"] == "ddp" and result["parallel"]["reason"] == "--parallel ddp"
    code, _, err = run(capsys, "estimate", "mlp", "--gpu", "rtx-3080-max-q", "--num-gpus", "4", "--no-input-pipeline")
    assert code == 2 and "no machine runs 4 of the GPUs asked for" in err


def test_the_fit_advisor_plans_on_the_requested_gpus(db) -> None:
    from advisor.app.fit import fit_plans
    from advisor.app.plan import plan

    # llama at batch 8 on 8 H100s fits no strategy as asked; a plan that fits must run on 8 GPUs too
    request = PlanRequest(model="llama", batch_size=8, gpus=("h100-sxm",), num_gpus=8, input_pipeline=False)
    estimate = plan(request, db)
    assert not estimate.fitting
    plans = fit_plans(request, db, estimate)
    assert plans and all(p.result.num_gpus == 8 and p.to_dict()["num_gpus"] == 8 for p in plans)


def test_ddp_memory_is_replayed_once_for_every_gpu_count() -> None:
    # DDP keeps every state whole on each rank: 2 GPUs or 64 hold the same (one replay serves them all),
    # while ZeRO-1 splits the optimizer state over the ranks (one replay per count)
    from advisor.estimate.parallel import LayoutMemory, rank_trace
    from advisor.memory.estimate import StepMemory
    from advisor.memory.plan import trace_both_batches
    from advisor.parallel.strategy import Layout

    trace, second = trace_both_batches(load_model_file("mlp"), MemorySettings(64, "amp-bf16", "adamw"))
    layouts = LayoutMemory(trace, second)
    two, sixty_four = Layout("ddp", 2, 8), Layout("ddp", 64, 8)
    assert layouts.step(two) is layouts.step(sixty_four)  # one replay
    for layout in (two, sixty_four):  # and each, replayed on its own, agrees
        assert StepMemory.of_trace(rank_trace(trace, layout, layouts.sharding)) == layouts.step(two)
    assert layouts.step(Layout("ddp", 1, 1)) != layouts.step(two)  # one GPU has no gradient buckets
    zero1 = [layouts.step(Layout("zero1", n, 8)) for n in (2, 8)]
    assert zero1[0].allocated > zero1[1].allocated  # AdamW's moments: 1/2 of them per rank, then 1/8


def test_gpus_too_small_for_the_tensors_are_ruled_out_before_the_allocator_is_replayed(db) -> None:
    # the mlp at batch 64 on a GPU of 4 KiB: every count's leanest layout holds more tensors than that, so
    # smallest_fit finds none without re-playing any layout's allocator (only their tensors' peaks)
    from dataclasses import replace as replaced

    from advisor.estimate.parallel import LayoutMemory, scale_out_counts
    from advisor.estimate.plan import smallest_fit
    from advisor.memory.plan import trace_both_batches
    from advisor.parallel.strategy import Layout

    settings = EstimateSettings(MemorySettings(64, "amp-bf16", "adamw"), Job(samples=1000, epochs=1))
    trace, second = trace_both_batches(load_model_file("mlp"), settings.memory)
    [target] = database_targets(db, [db.gpu("h100-sxm")], load_families(db))
    tiny = replaced(target, memory_bytes=4096)
    layouts = LayoutMemory(trace, second)
    assert smallest_fit(trace, settings, tiny, db, layouts) is None
    assert layouts.stored() is None  # nothing re-played
    # the bounds: what every rank holds whole (activations, inputs, temporaries), below any layout's tensors'
    # peak; that peak, which the re-play finds too; the allocator reserves at least that
    for layout in (Layout("fsdp", 8, 8), Layout("zero1", 2, 8), Layout("ddp", 4, 8)):
        bound = layouts.tensor_peak(layout)
        assert 0 < layouts.whole_peak() <= bound == layouts.step(layout).tensor_peak <= layouts.step(layout).reserved
    # on the real H100 the same search re-plays the layout it sizes and finds the fewest GPUs
    found = smallest_fit(trace, settings, target, db, LayoutMemory(trace, second))
    assert found is not None and found.num_gpus == scale_out_counts(db, db.gpu("h100-sxm"))[0]  # 8: one p5
