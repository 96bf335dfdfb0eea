"""Data-parallel strategies: layouts, DDP buckets, the collectives of a step, machines and their links,
and the time a rank waits for communication."""

from __future__ import annotations

import pytest

from advisor.estimate.parallel import Machines, communication, contention_share, machines_for
from advisor.estimate.step import OpTime, StepTime
from advisor.hardware.loader import load_hwdb
from advisor.parallel.strategy import Layout, Units, collectives, ddp_buckets, megatron_buckets, per_rank_memory
from advisor.profile.live_memory import BEFORE_STEP, LiveMemory, StorageLife

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def db():
    return load_hwdb(include_user_layers=False)


def test_layout_shards_per_strategy() -> None:
    assert Layout("ddp", 8, 8).shards == 1
    assert Layout("fsdp", 16, 8).shards == 16 and Layout("fsdp", 16, 8).nodes == 2
    hsdp = Layout("hsdp", 16, 8)  # sharded inside each node, replicated over the 2 nodes
    assert (hsdp.shards, hsdp.replicas) == (8, 2)


def test_ddp_buckets_are_one_mib_then_25() -> None:
    # 60 MiB: 1 + 25 + 25 + 9 MiB
    assert ddp_buckets(60 * MIB) == [1 * MIB, 25 * MIB, 25 * MIB, 9 * MIB]
    assert ddp_buckets(0.5 * MIB) == [0.5 * MIB]


def test_fsdp_gathers_twice_and_reduce_scatters_once_per_unit() -> None:
    units = Units(("0", "1"), (40, 40), 20)  # two blocks of 40 parameters, 20 in the root
    found = collectives(Layout("fsdp", 4, 8), units, weight_bytes=400.0, gradient_bytes=400.0)
    by_kind: dict[str, float] = {}
    for c in found:
        by_kind[c.kind] = by_kind.get(c.kind, 0.0) + c.total_bytes
    # gathers: (160 + 160 + 80) bytes forward and again backward = 800; reduce-scatters: 400 once
    assert by_kind == {"all_gather": 800.0, "reduce_scatter": 400.0}
    zero2 = collectives(Layout("zero2", 4, 8), units, 400.0, 400.0)
    assert sum(c.total_bytes for c in zero2 if c.kind == "all_gather") == 400.0  # gathered once


def test_zero1_sends_only_the_trainable_parameters_after_its_step() -> None:
    # a LoRA job: 1000 B of parameters, 10 B of them trainable (gradients 10 B): the frozen base is never sent
    found = collectives(Layout("zero1", 8, 8), Units((), (), 1), weight_bytes=1000.0, gradient_bytes=10.0)
    assert {(c.kind, c.total_bytes, c.hidden_behind) for c in found} == {("all_reduce", 10.0, "backward"),
                                                                         ("broadcast", 10.0, None)}


def test_megatron_buckets_hold_40_million_parameters_or_1_million_per_rank() -> None:
    # 200 M bf16 gradients (400 MB) on 8 ranks: max(40 M, 8 M) = 40 M parameters, 80 MB: 5 buckets
    assert megatron_buckets(400e6, 8) == [80e6] * 5
    # 100 M (200 MB) on 64 ranks: max(40 M, 64 M) = 64 M, 128 MB: one full bucket and 72 MB
    assert megatron_buckets(200e6, 64) == pytest.approx([128e6, 72e6])


def test_distributed_optimizer_reduce_scatters_behind_the_backward_and_gathers_behind_the_forward(db) -> None:
    layout = Layout("zero1", 8, 8)
    found = collectives(layout, Units((), (), 1), 400e6, 400e6, micro_batches=4, distributed_optimizer=True)
    # 5 buckets of 80 MB each way: reduce-scatter (backward), all-gather of the updated parameters (forward)
    assert {(c.kind, c.message_bytes, c.count, c.hidden_behind) for c in found} == {
        ("reduce_scatter", 80e6, 5, "backward"), ("all_gather", 80e6, 5, "forward")}
    machines = machines_for(db, db.gpu("h100-sxm"), 8)
    assert isinstance(machines, Machines)
    overlapped = communication(found, machines, _step(4.0, 8.0), 4)  # 1 s forward, 2 s backward per micro-batch
    plain = communication(collectives(layout, Units((), (), 1), 400e6, 400e6, micro_batches=4), machines,
                          _step(4.0, 8.0), 4)
    # one bucket exposed each way, where torch's zero1 waits for its whole broadcast after the step
    assert overlapped.exposed_s == pytest.approx(2 * overlapped.time_s / 10)
    assert overlapped.exposed_s < plain.exposed_s


def test_ddp_rank_memory_adds_the_buckets_and_fsdp_shards_the_state() -> None:
    # 1000 B of weights, 2000 B of optimizer state before the step; 1000 B of gradients in the backward
    storages = (StorageLife(1000, BEFORE_STEP, None, "weights", "w"),
                StorageLife(2000, BEFORE_STEP, None, "optimizer_state", "s"),
                StorageLife(1000, 1, 3, "gradients", "g"))
    memory = LiveMemory(storages, (0, 1, 2, ~2), (BEFORE_STEP, BEFORE_STEP, 1, 3),
                        {"forward": 0, "backward": 1, "optimizer": 2}, 4)
    assert memory.peak().bytes == memory.peak_bytes() == 4000
    # rounded to 1536-byte blocks: 1536 + 3072 + 1536 = 6144 at the gradients' allocation
    assert memory.peak_bytes(1536) == memory.peak(1536).bytes == 6144
    ddp = per_rank_memory(memory, Layout("ddp", 2, 8), Units((), (), 10))
    assert ddp.peak().bytes == 5000  # + 1000 B of buckets
    fsdp = per_rank_memory(memory, Layout("fsdp", 2, 8), Units((), (), 10))
    # shards: 500 + 1000 + 500; the root (all 10 parameters) gathered: + 1000; its unsharded gradients: + 1000
    assert fsdp.peak().bytes == 500 + 1000 + 500 + 1000 + 1000


def test_machines_for_an_hgx_node_a_pcie_box_and_nothing(db) -> None:
    h100 = machines_for(db, db.gpu("h100-sxm"), 8)
    assert isinstance(h100, Machines) and h100.node_link.id == "nvlink4-nvswitch" and h100.nodes == 1
    two_nodes = machines_for(db, db.gpu("h100-sxm"), 16)  # p5 instances over EFA
    assert isinstance(two_nodes, Machines) and two_nodes.nodes == 2 and two_nodes.network.id == "efa-3200g"
    box = machines_for(db, db.gpu("rtx-4090"), 4)  # GeForce: no peer-to-peer, through the host
    assert isinstance(box, Machines) and box.node_link.id == "pcie4-host"
    assert isinstance(machines_for(db, db.gpu("mi300x"), 8), str)


def _step(forward_s: float, backward_s: float) -> StepTime:
    ops = tuple(OpTime(phase, "m", "mm", "s", "fp32", 0.0, 0, seconds, 0.0, seconds, 0.0, 0.0, "compute")
                for phase, seconds in
                (("forward", forward_s), ("backward", backward_s)))
    return StepTime("x", forward_s + backward_s, {"compute": forward_s + backward_s}, "default", "x", ops)


def test_ddp_communication_hides_behind_the_backward_but_for_the_last_bucket(db) -> None:
    machines = machines_for(db, db.gpu("a100-sxm4-80gb"), 8)
    assert isinstance(machines, Machines)
    found = collectives(Layout("ddp", 8, 8), Units((), (), 1), 1e9, 1e9)  # 1 GB of gradients
    slow = communication(found, machines, _step(0.1, 1.0), 1)  # a long backward hides all but one bucket
    fast = communication(found, machines, _step(0.001, 0.002), 1)
    assert slow.time_s == pytest.approx(fast.time_s)
    assert slow.exposed_s < 0.1 * slow.time_s
    assert fast.exposed_s == pytest.approx(fast.time_s - 0.002)
    # 1 GB all-reduced over 8 ranks: 2 x 7/8 GB = 1.75 GB each rank sends
    assert slow.wire_bytes == pytest.approx(1.75e9)


def test_hidden_communication_slows_the_compute_by_the_sms_nccl_holds(db) -> None:
    machines = machines_for(db, db.gpu("a100-sxm4-80gb"), 8)
    assert isinstance(machines, Machines)
    found = collectives(Layout("ddp", 8, 8), Units((), (), 1), 1e9, 1e9)
    alone = communication(found, machines, _step(0.1, 1.0), 1)
    shared = communication(found, machines, _step(0.1, 1.0), 1, sm_count=108)
    # NVLink 3 over NVSwitch: peak busbw ~236 GB/s takes ceil(236 / (370 / 24)) = 16 channels of 108 SMs;
    # the hidden part (all but the exposed last bucket) runs beside the backward, which loses 16/108 of them
    share = contention_share(machines.node_link, 108)
    assert share == pytest.approx(16 / 108)
    assert alone.contention_s == 0.0 and shared.exposed_s == pytest.approx(alone.exposed_s)
    assert shared.contention_s == pytest.approx((shared.time_s - shared.exposed_s) * share)
    # a backward too short to hide anything: nothing runs beside the compute, nothing slows it
    nothing_hidden = communication(found, machines, _step(0.0, 0.0), 1, sm_count=108)
    assert nothing_hidden.exposed_s == pytest.approx(nothing_hidden.time_s) and nothing_hidden.contention_s == 0.0


def test_the_channel_bandwidth_is_the_measured_links(db) -> None:
    # NCCL_CHANNEL_BYTES_PER_S is nvlink4-nvswitch's 370 GB/s large-message busbw over its 24 measured channels
    from advisor.estimate.parallel import NCCL_CHANNEL_BYTES_PER_S
    link = next(i for i in db.interconnects if i.id == "nvlink4-nvswitch")
    assert link.nccl_channels == 24
    assert NCCL_CHANNEL_BYTES_PER_S * link.nccl_channels == pytest.approx(max(b for _, b in link.busbw_points))
    assert contention_share(link, 132) == pytest.approx(24 / 132)


def test_a_plan_where_nothing_fits_says_what_would_split_the_step() -> None:
    from advisor.estimate.parallel import Alternative, choice_reason

    # 8 GPUs, every strategy too big: the leanest is kept, and the reason names pipeline parallelism
    alternatives = [Alternative("ddp", False, 90, 1.0), Alternative("fsdp", False, 30, 1.2)]
    reason = choice_reason("auto", alternatives[1], alternatives)
    assert reason.startswith("none fits; the least memory per GPU")
    assert "pipeline parallelism" in reason and "not modelled" in reason
    fitting = [Alternative("ddp", True, 20, 1.0), Alternative("fsdp", True, 10, 1.2)]
    assert "pipeline" not in choice_reason("auto", fitting[0], fitting)
