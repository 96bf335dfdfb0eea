"""A traced one-GPU step run data-parallel on several GPUs: each rank's memory, its collectives' time
and how much of it the compute hides, and the machines (instances) that hold the GPUs. Bytes, seconds.

The trace is the step of one rank (its micro-batch); parallel/strategy.py turns its live memory into a
rank's and lists its collectives; parallel/collectives.py times them on the link's measured curve.
Overlap (decisions): DDP's bucket all-reduces and FSDP's backward gathers and reduce-scatters run
behind the last micro-batch's backward, FSDP's forward gathers behind the forward (each phase hides at
most its compute, and the largest single collective of a phase is never hidden: the first gather, the
last bucket); the root's gathers and reduce-scatter and ZeRO-1's parameter broadcast are not hidden; Megatron's
distributed optimizer (zero1 under a master-weight precision) hides its reduce-scatters behind the last
micro-batch's backward and its parameter gathers behind the next step's first forward.
A sharded optimizer steps its shard: the optimizer phase takes 1 / shards of its one-GPU time. Compute
that runs beside a hidden collective shares the GPU with it: NCCL runs each of its channels as a thread
block that holds one SM for the collective's length, so the compute loses that share of the SMs while it
runs (contention_share), and the step grows by the hidden time x that share (Communication.contention_s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from advisor.errors import UserError
from advisor.estimate.costs import instances_for
from advisor.estimate.step import StepTime
from advisor.hardware.specs import CloudOffer, GPUSpec, HardwareDB, Interconnect
from advisor.memory.allocator import MIN_BLOCK, AllocatorPeaks, replay
from advisor.memory.estimate import BatchMemoryModel, CappedReplay, StepMemory, device_memory
from advisor.memory.plan import SecondTrace, ShardedMemory
from advisor.parallel.collectives import bus_bytes, collective_s, fitted_curve
from advisor.parallel.strategy import (
    FULLY_SHARDED,
    LOW_PRECISION_SHARE,
    Collective,
    Layout,
    WHOLE_ON_EVERY_RANK,
    Units,
    collectives,
    fsdp_units,
    per_rank_memory,
)
from advisor.parallel.tensor import TensorPlan, tensor_collectives, tensor_plan
from advisor.parallel.tensor import rank_trace as tensor_rank_trace
from advisor.parallel.topology import node_link
from advisor.profile.choices import precision_of
from advisor.profile.trace import StepTrace

if TYPE_CHECKING:
    from advisor.estimate.ahead import LayoutsAhead

COMMUNICATION_BOUND = "communication"
"""The part of StepTime.by_bound a rank spends on communication: waiting for collectives the compute did
not hide, and the compute slowed by the ones it did."""

NCCL_CHANNEL_BYTES_PER_S = 370e9 / 24
"""Bus bandwidth one NCCL channel (one thread block, on one SM while the collective runs) carries: hwdb's
nvlink4-nvswitch, 8 H100 SXMs over NVSwitch at about 370 GB/s of all-reduce bus bandwidth (source I-NCCLT212),
where FSDP's all-gather ran 24 channels (its `nccl_channels`, I-NVFORUM-OVERLAP). NCCL sizes its channels to
the link (I-NCCL986): a link without a measured count of peak bus bandwidth B takes about B / this."""

NONE_FITS_HINT = ("try more GPUs, --checkpointing or a smaller --micro-batch; pipeline parallelism (the layers "
                  "split over the GPUs) is not modelled yet")
"""What a multi-GPU plan in which no strategy fits says would help."""

MAX_NODE_GPUS = 8
"""GPUs one machine holds where no offer says (an 8-GPU server)."""

MAX_SCALE_OUT_GPUS = 512
"""The most GPUs the smallest-fit search tries (64 nodes of 8)."""

NODE_STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")
"""What "auto" tries inside one node; across nodes hsdp too (fsdp inside each node)."""


@dataclass(frozen=True)
class Sharding:
    """What the strategies need of a traced step: its FSDP units and its bytes."""

    units: Units
    parameter_bytes: float
    """Every parameter, as stored (what FSDP gathers)."""
    gradient_bytes: float
    """The trainable parameters' gradients (what DDP all-reduces)."""
    buffer_bytes: float
    """Buffers (BatchNorm's statistics): what DDP broadcasts before each forward."""
    mixed_precision: bool = False
    """The step runs under autocast: fully_shard then gathers the parameters in autocast's dtype
    (MixedPrecisionPolicy(param_dtype=autocast's, reduce_dtype=float32), as torchtitan runs it), so
    autocast's weight copies vanish and the gathers carry low-precision bytes."""
    bucket_view: bool = False
    """The gradients are the data-parallel runtime's buckets (no copy into them): master-weight precisions
    train under Megatron's or DeepSpeed's runtimes, whose contiguous gradient buffers are reduced in place
    (torch DDP's gradient_as_bucket_view), where torch's DDP (by default) copies each gradient into a bucket.
    Under it zero1 communicates as Megatron's distributed optimizer (parallel/strategy.py)."""

    @classmethod
    def of_trace(cls, trace: StepTrace) -> Sharding:
        assert trace.memory is not None, "the trace recorded no memory"
        precision = precision_of(trace.precision)
        weight_bytes = precision.weight_bytes
        held = trace.memory.held_at_start("weights")
        parameters = min(float((trace.total_params or trace.params) * weight_bytes), float(held))
        return cls(fsdp_units(trace.params_by_module), parameters, float(trace.params * weight_bytes),
                   max(held - parameters, 0.0), precision.autocast is not None, precision.master)

    def tensor_parallel(self, kept: float) -> Sharding:
        """What one rank of a tensor-parallel group holds and sends to the data-parallel ranks: `kept` of the
        parameters and gradients (TensorPlan.kept_share; the FSDP units keep their shares)."""
        return replace(self, parameter_bytes=self.parameter_bytes * kept, gradient_bytes=self.gradient_bytes * kept)

    def gathered_by(self, strategy: str) -> float:
        """Bytes of every parameter as `strategy` gathers or broadcasts them: as stored, or in autocast's
        dtype where fully_shard gathers them under autocast."""
        if self.mixed_precision and strategy in FULLY_SHARDED:
            return self.parameter_bytes * LOW_PRECISION_SHARE
        return self.parameter_bytes


@dataclass(frozen=True)
class Communication:
    """One rank's collectives in one optimizer step."""

    bytes_per_step: float
    """Bytes the rank hands its collectives (all-reduce's buffer, all-gather's output, reduce-scatter's
    input, broadcast's tensors), summed over the step's calls."""
    wire_bytes: float
    """Bytes the rank sends over its links (ring algorithms: bus bytes)."""
    time_s: float
    """Time of every collective, overlapped or not."""
    exposed_s: float
    """The part of time_s the step waits for (added to the step)."""
    links: tuple[str, ...]
    calls: int
    contention_s: float = 0.0
    """Time the compute loses to the collectives it hides (NCCL's channels hold SMs): added to the step."""

    def to_dict(self) -> dict[str, Any]:
        return {"bytes_per_step": self.bytes_per_step, "wire_bytes": self.wire_bytes, "time_s": self.time_s,
                "exposed_s": self.exposed_s, "links": list(self.links), "calls": self.calls,
                "contention_s": self.contention_s}


@dataclass(frozen=True)
class Machines:
    """Where `gpus` GPUs run: `nodes` machines of `gpus_per_node`, linked by `node_link` inside and
    `network` between, rented as `offer` (None: the user's own machines)."""

    gpus: int
    gpus_per_node: int
    node_link: Interconnect
    network: Interconnect | None
    offer: CloudOffer | None

    @property
    def nodes(self) -> int:
        return math.ceil(self.gpus / self.gpus_per_node)


def machines_for(db: HardwareDB, gpu: GPUSpec, gpus: int) -> Machines | str:
    """The machines that hold `gpus` of `gpu`: an instance of exactly that many, else several instances
    of the largest size that divides it and has a network, else the user's own machine of up to
    MAX_NODE_GPUS cards (no larger instance is rented for fewer GPUs than it holds). A sentence saying
    why not otherwise."""
    offers = db.offers_for(gpu.id)
    by_id = {i.id: i for i in db.interconnects}
    exact = [o for o in offers if o.gpus_per_instance == gpus]
    several = [o for o in offers if (instances_for(o, gpus) or 0) > 1]  # networked, dividing `gpus`
    for offer in exact + sorted(several, key=lambda o: (-o.gpus_per_instance, o.usd_per_gpu_hour)):
        per_node = min(gpus, offer.gpus_per_instance)
        link = node_link(gpu, per_node, offer)
        if link is not None:
            network = None if offer.network is None else by_id[offer.network]
            return Machines(gpus, per_node, by_id[link], network, offer)
    own = own_machine(db, gpu, gpus)
    if isinstance(own, str) or gpus <= MAX_NODE_GPUS:
        return own
    sizes = sorted({o.gpus_per_instance for o in offers})
    offered = f"; its instances hold {', '.join(map(str, sizes))}" if sizes else ""
    return f"{gpus} {gpu.name} need several machines and no network between them is known{offered}"


def own_machine(db: HardwareDB, gpu: GPUSpec, gpus: int) -> Machines | str:
    """`gpus` of `gpu` in one machine of the user's own (no offer, no network), linked as
    parallel.topology.node_link says; a sentence where no multi-GPU machine of it is known."""
    link = node_link(gpu, gpus)
    if link is None:
        return f"no multi-GPU machine of {gpu.name} is known"
    return Machines(gpus, gpus, next(i for i in db.interconnects if i.id == link), None, None)


def scale_out_counts(db: HardwareDB, gpu: GPUSpec) -> list[int]:
    """GPU counts above one to try for a job one `gpu` cannot hold, fewest first: the multi-GPU instance
    sizes offered and whole multiples of the largest one with a network (up to MAX_SCALE_OUT_GPUS);
    where no multi-GPU instance is offered, the user's own machine of 2, 4 or 8 cards."""
    offers = db.offers_for(gpu.id)
    counts = {o.gpus_per_instance for o in offers if o.gpus_per_instance > 1}
    networked = [o.gpus_per_instance for o in offers if o.network is not None]
    if networked:
        size = max(networked)
        nodes = 2
        while size * nodes <= MAX_SCALE_OUT_GPUS:
            counts.add(size * nodes)
            nodes *= 2
    return sorted(counts) or [2, 4, MAX_NODE_GPUS]


def communicator_bytes(db: HardwareDB, machines: Machines) -> int:
    """NCCL's buffers on each GPU of `machines` (outside torch's allocator): its node link's measured
    figure, else the largest measured one (hwdb/README.md: an upper bound for slower links), plus the
    network's communicator across nodes."""
    measured = [i.communicator_bytes for i in db.interconnects if i.communicator_bytes is not None]
    fallback = max(measured, default=0)
    links = [machines.node_link] + ([machines.network] if machines.nodes > 1 and machines.network else [])
    return sum(fallback if link.communicator_bytes is None else link.communicator_bytes for link in links)


def strategies_for(parallel: str, nodes: int, dp: int) -> tuple[str, ...]:
    """The strategies --parallel `parallel` lets a job over `nodes` machines with `dp` data-parallel ranks
    (tensor-parallel groups) run: all of them for "auto" (hsdp only across nodes), else the one asked for;
    ddp alone for one rank (nothing to shard between ranks: every strategy is the same)."""
    if dp == 1:
        return ("ddp",)
    if parallel == "auto":
        return NODE_STRATEGIES + (("hsdp",) if nodes > 1 else ())
    if parallel == "tp":  # Megatron's: DDP between the tensor-parallel groups
        return ("ddp",)
    return (parallel,)


def asks_tensor_parallelism(parallel: str, tp: int | None) -> bool:
    """Whether --parallel `parallel` and --tp `tp` split layers over GPUs."""
    return parallel == "tp" or (tp or 1) > 1


def tensor_degree(parallel: str, tp: int | None, machines: Machines) -> int | str:
    """The tensor-parallel degree on `machines`: --tp, else (--parallel tp) every GPU of one machine, else 1;
    a sentence where its groups cannot fill the machines (tensor parallelism stays inside one)."""
    if tp is None:
        tp = min(machines.gpus, machines.gpus_per_node) if parallel == "tp" else 1
    if machines.gpus_per_node % tp or machines.gpus % tp:
        return (f"tensor-parallel groups of {tp} GPUs do not divide {machines.gpus} GPUs in machines of "
                f"{machines.gpus_per_node} (a group stays inside one machine)")
    return tp


class LayoutMemory:
    """Each rank's device-independent memory per layout, from the step traced at its batch (and, for the
    batch line, at twice it): the rank's re-played live memory through the allocator, once per layout. Also
    the tensor-parallel plan of the step and each degree's rank trace (parallel/tensor.py)."""

    def __init__(self, trace: StepTrace, second: StepTrace | SecondTrace | None,
                 stored: dict[str, dict] | None = None) -> None:
        """`second`: the step at twice the batch, or one still being traced (memory.plan.trace_pair), waited for
        when first needed; `stored`: what stored() gave for the same two traces before (the trace cache
        keeps it)."""
        self.trace = trace
        self._second = SecondTrace.ready(second) if isinstance(second, StepTrace) else second
        self.sharding = Sharding.of_trace(trace)
        self._second_sharding: Sharding | None = None
        self._steps: dict[tuple[str, bool, int, int], StepMemory] = dict((stored or {}).get("steps", {}))
        self._lines: dict[tuple[str, bool, int, int], BatchMemoryModel] = dict((stored or {}).get("lines", {}))
        self._capped: dict[tuple[tuple[str, bool, int, int], int], AllocatorPeaks] = dict(
            (stored or {}).get("capped", {}))
        self._stored_count = len(self._steps) + len(self._lines) + len(self._capped)
        self._peaks: dict[tuple[str, bool, int, int], int] = {}
        self._ranks: dict[tuple[str, bool, int, int], StepTrace] = {}  # rank traces whose peak alone was needed
        self._collectives: dict[tuple[Layout, int], list[Collective]] = {}
        self._whole: dict[int, int] = {}
        self._plan: TensorPlan | str | None = None
        self._tensor: dict[tuple[int, bool], StepTrace] = {}
        self.ahead: LayoutsAhead | None = None
        """Layouts re-played in the child that traced the second batch (estimate/ahead.py), where one serves."""

    @property
    def second(self) -> StepTrace | None:
        """The step at twice the batch (None: not traced)."""
        return None if self._second is None else self._second.get()

    def stored(self) -> dict[str, dict] | None:
        """Each layout's memory re-played so far, for the trace cache; None when nothing was added to what
        it was made with."""
        if len(self._steps) + len(self._lines) + len(self._capped) == self._stored_count:
            return None
        return {"steps": dict(self._steps), "lines": dict(self._lines), "capped": dict(self._capped)}

    @property
    def plan(self) -> TensorPlan | str:
        """The step's tensor-parallel plan, or why it has none."""
        if self._plan is None:
            self._plan = tensor_plan(self.trace)
        return self._plan

    def split_plan(self) -> TensorPlan:
        """The tensor-parallel plan, where check_splittable let tensor parallelism through."""
        plan = self.plan
        assert isinstance(plan, TensorPlan), plan
        return plan

    def check_splittable(self, parallel: str, tp: int | None, source: str) -> None:
        """A UserError where --parallel/--tp ask for tensor parallelism and the model (named `source`) has no
        layers it splits."""
        if asks_tensor_parallelism(parallel, tp) and isinstance(self.plan, str):
            raise UserError(f"tensor parallelism cannot split {source}: {self.plan}")

    def tensor_trace(self, tp: int, second: bool = False) -> StepTrace:
        """One rank's step in a tensor-parallel group of `tp` (the traced step itself for 1); `second`: at
        twice the batch."""
        base = self.second if second else self.trace
        assert base is not None
        if tp == 1:
            return base
        key = (tp, second)
        if key not in self._tensor:
            self._tensor[key] = tensor_rank_trace(base, self.split_plan(), tp)
        return self._tensor[key]

    def sharding_for(self, tp: int, second: bool = False) -> Sharding:
        """What the data-parallel strategies see of one rank of a tensor-parallel group of `tp`."""
        if second and self._second_sharding is None and self.second is not None:
            self._second_sharding = Sharding.of_trace(self.second)
        base = self._second_sharding if second else self.sharding
        assert base is not None
        return base if tp == 1 else base.tensor_parallel(self.split_plan().kept_share(tp))

    def collectives(self, layout: Layout, micro_batches: int) -> list[Collective]:
        """One rank's data-parallel collectives in a step of `layout` (step_collectives), made once per layout:
        every GPU type of the same count asks for the same ones (the 7B example over every GPU: 18 calls)."""
        key = (layout, micro_batches)
        if key not in self._collectives:
            self._collectives[key] = step_collectives(layout, self.sharding_for(layout.tp), micro_batches)
        return list(self._collectives[key])

    def tensor_collectives(self, tp: int, micro_batches: int) -> list[Collective]:
        """Each rank's all-reduces in its tensor-parallel group of `tp` (none for 1)."""
        return [] if tp == 1 else tensor_collectives(self.trace, self.split_plan(), tp, micro_batches)

    @staticmethod
    def key(layout: Layout) -> tuple[str, bool, int, int]:
        """What a rank's memory depends on (parallel.strategy.per_rank_memory): whether it has data-parallel
        peers, what its states are split over, and its tensor-parallel degree. DDP on 2 GPUs or 64 holds the
        same, so it is re-played once."""
        return layout.strategy, layout.dp > 1, layout.shards, layout.tp

    def step(self, layout: Layout) -> StepMemory:
        """One rank's memory at the traced batch."""
        key = self.key(layout)
        if key not in self._steps and self.ahead is not None:
            self.ahead.await_item(("step", key))
        if key not in self._steps:
            self.make("step", layout)
        return self._steps[key]

    def make(self, kind: str, layout: Layout) -> None:
        """Re-play a rank's step ("step") or its line against the batch ("line", the step made first) here."""
        key = self.key(layout)
        if kind == "step":
            self._steps[key] = StepMemory.of_trace(self._ranks.pop(key, None) or self._rank_trace(layout))
            if self.ahead is not None:  # the child's line of this layout needs it
                self.ahead.share(("step", key), self._steps[key])
            return
        assert kind == "line" and self.second is not None, kind
        second = StepMemory.of_trace(rank_trace(self.tensor_trace(layout.tp, second=True), layout,
                                                self.sharding_for(layout.tp, second=True)))
        self._lines[key] = BatchMemoryModel(self.step(layout), second)

    def made_steps(self) -> dict[tuple[str, bool, int, int], StepMemory]:
        """Each layout's step re-played so far, by key."""
        return dict(self._steps)

    def has(self, item: tuple[str, tuple[str, bool, int, int]]) -> bool:
        """Whether a ("step" | "line", key) item is made (LayoutsAhead)."""
        kind, key = item
        return key in (self._steps if kind == "step" else self._lines)

    def absorb(self, item: tuple[str, tuple[str, bool, int, int]], value: StepMemory | BatchMemoryModel) -> None:
        """An item made elsewhere (LayoutsAhead's child, from the same traces: the same figures)."""
        kind, key = item
        if isinstance(value, BatchMemoryModel):
            assert kind == "line", item
            self._lines.setdefault(key, value)
            value = value.first
        self._steps.setdefault(key, value)
        self._ranks.pop(key, None)

    def capped(self, layout: Layout) -> CappedReplay:
        """One rank's allocator re-played under a capacity (memory.estimate.device_memory's `capped`), each
        capacity once per layout."""
        key = self.key(layout)

        def replayed(capacity: int) -> AllocatorPeaks:
            if (key, capacity) not in self._capped:
                rank = self._rank_trace(layout)
                assert rank.memory is not None
                self._capped[key, capacity] = replay(rank.memory, capacity=capacity)
            return self._capped[key, capacity]

        return replayed

    def tensor_peak(self, layout: Layout) -> int:
        """One rank's tensors' peak at the traced batch, bytes (StepMemory.tensor_peak), without re-playing its
        allocator: a lower bound of what it reserves, which rules out a GPU too small for the layout at a
        fraction of a re-play's cost. The rank trace made for it serves the re-play, where one follows."""
        key = self.key(layout)
        if self.ahead is not None:
            self.ahead.drain()
        if key in self._steps:
            return self._steps[key].tensor_peak
        if key not in self._peaks:
            rank = self._ranks[key] = self._rank_trace(layout)
            assert rank.memory is not None
            self._peaks[key] = rank.memory.peak_bytes(MIN_BLOCK)
        return self._peaks[key]

    def whole_peak(self, tp: int = 1) -> int:
        """The peak of what every data-parallel rank of a tensor-parallel group of `tp` holds whole (inputs,
        activations, backward temporaries: strategy.WHOLE_ON_EVERY_RANK), bytes: a lower bound of any such
        rank's tensors' peak, whatever the strategy and GPU count, found without a rank trace."""
        if tp not in self._whole:
            memory = self.tensor_trace(tp).memory
            assert memory is not None
            self._whole[tp] = memory.peak_bytes(MIN_BLOCK, WHOLE_ON_EVERY_RANK)
        return self._whole[tp]

    def _rank_trace(self, layout: Layout) -> StepTrace:
        return rank_trace(self.tensor_trace(layout.tp), layout, self.sharding_for(layout.tp))

    def batch_model(self, layout: Layout) -> BatchMemoryModel | None:
        """One rank's memory against its batch (the second trace re-played only when asked; None without
        a second trace)."""
        if self.second is None:
            return None
        key = self.key(layout)
        if key not in self._lines and self.ahead is not None:
            self.ahead.await_item(("line", key))
        if key not in self._lines:
            self.make("line", layout)
        return self._lines[key]


@dataclass(frozen=True)
class Alternative:
    """A strategy tried for a multi-GPU job: whether it fits, its peak per GPU, its step."""

    strategy: str
    fits: bool
    peak_memory_bytes: int
    step_time_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "fits": self.fits, "peak_memory_bytes": self.peak_memory_bytes,
                "step_time_s": self.step_time_s}


@dataclass(frozen=True)
class Scaling:
    """How a job runs on several GPUs of one type: the layout, the machines, each rank's communication,
    the one-GPU step it scales from, and why this strategy."""

    layout: Layout
    machines: Machines
    communication: Communication
    single_step_s: float
    """One GPU's step of the same per-GPU batch (its compute, the whole optimizer): scaling's baseline."""
    reason: str
    alternatives: tuple[Alternative, ...] = ()
    single_fits: bool = True
    """Whether one GPU holds the step alone: without, there is no one-GPU run to scale from."""

    @property
    def gpus(self) -> int:
        return self.layout.gpus

    def efficiency(self, step_s: float) -> float | None:
        """N-GPU throughput over N x one GPU's: single step / (rank step x tp), each tensor-parallel group of
        tp GPUs taking the batch one GPU would. None where one GPU cannot hold the step: a sharded rank steps
        1/N of the optimizer, so against a one-GPU step that does not fit the ratio exceeds 100%
        (Llama-3.1-8B on 8 H100s read 164%)."""
        return self.single_step_s / (step_s * self.layout.tp) if self.single_fits else None

    def describe(self) -> str:
        """"8 GPUs (1 node, nvlink4-nvswitch), fsdp"."""
        nodes = self.machines.nodes
        where = f"{nodes} node{'s' if nodes > 1 else ''}, {self.machines.node_link.id}"
        if nodes > 1 and self.machines.network is not None:
            where += f" + {self.machines.network.id}"
        tensor = f" (tensor-parallel groups of {self.layout.tp})" if self.layout.tp > 1 else ""
        return f"{self.gpus} GPUs ({where}), {self.layout.name}{tensor}"

    def to_dict(self) -> dict[str, Any]:
        return self.layout.to_dict() | {"reason": self.reason, "gpus_per_node": self.machines.gpus_per_node,
                                        "node_link": self.machines.node_link.id,
                                        "network": None if self.machines.network is None else self.machines.network.id,
                                        "alternatives": [a.to_dict() for a in self.alternatives]}


def choice_reason(parallel: str, chosen: Alternative, alternatives: list[Alternative]) -> str:
    """Why `chosen`: asked for, the fastest that fits, or (none fits) the one closest to fitting, with what
    else would split the step (pipeline parallelism, which the tool does not model)."""
    if parallel != "auto":
        return f"--parallel {parallel}"
    others = [a for a in alternatives if a is not chosen]
    if not chosen.fits:
        return f"none fits; the least memory per GPU; {NONE_FITS_HINT}"
    too_big = [a.strategy for a in others if not a.fits]
    slower = [a.strategy for a in others if a.fits]
    parts = ["the fastest that fits"]
    if slower:
        parts.append(f"{', '.join(slower)} slower")
    if too_big:
        parts.append(f"{', '.join(too_big)} do{'es' if len(too_big) == 1 else ''} not fit")
    return "; ".join(parts)


def rank_trace(trace: StepTrace, layout: Layout, sharding: Sharding) -> StepTrace:
    """`trace` with the live memory of one rank of `layout`."""
    assert trace.memory is not None, "the trace recorded no memory"
    return replace(trace, memory=per_rank_memory(trace.memory, layout, sharding.units,
                                                 sharding.gathered_by(layout.strategy), sharding.mixed_precision,
                                                 sharding.bucket_view))


def step_collectives(layout: Layout, sharding: Sharding, micro_batches: int) -> list[Collective]:
    return collectives(layout, sharding.units, sharding.gathered_by(layout.strategy), sharding.gradient_bytes,
                       micro_batches, sharding.buffer_bytes, distributed_optimizer=sharding.bucket_view)


def contention_share(link: Interconnect, sm_count: int | None) -> float:
    """Share of a GPU's `sm_count` SMs that NCCL's channels hold while a collective over `link` runs: the
    link's measured `nccl_channels`, else one per NCCL_CHANNEL_BYTES_PER_S of its peak bus bandwidth, at least
    one (0 where the SMs are unknown).

    # a link of 200 GB/s peak busbw: ceil(200e9 / (370e9 / 24)) = 13 channels of an A100's 108 SMs: 12.0%
    """
    if not sm_count:
        return 0.0
    channels = link.nccl_channels or math.ceil(fitted_curve(link).peak_bytes_per_s / NCCL_CHANNEL_BYTES_PER_S)
    return min(max(channels, 1), sm_count) / sm_count


def communication(found: list[Collective], machines: Machines, step: StepTime, micro_batches: int,
                  sm_count: int | None = None) -> Communication:
    """Time `found` (step_collectives) on `machines`' links, what `step`'s compute hides of it, and what the
    hidden part costs the compute on a GPU of `sm_count` SMs (contention_share; none where not given)."""
    links = {"node": machines.node_link, "network": machines.network or machines.node_link}
    assert machines.nodes == 1 or machines.network is not None, "several machines need a network"
    phase_s = {"forward": 0.0, "backward": 0.0}
    for op in step.ops:
        if op.phase in phase_s:
            phase_s[op.phase] += op.kernel_s + op.wait_s
    window = {"forward": phase_s["forward"] / micro_batches, "backward": phase_s["backward"] / micro_batches}
    hidden_total = {"forward": 0.0, "backward": 0.0}
    held = {"forward": 0.0, "backward": 0.0}  # hidden seconds x the share of SMs they hold
    largest = {"forward": 0.0, "backward": 0.0}
    total = exposed = contention = 0.0
    for c in found:
        curve = fitted_curve(links[c.scope])
        one = collective_s(c.kind, c.message_bytes, c.ranks, curve)
        total += one * c.count
        if c.hidden_behind is None:
            exposed += one * c.count
        else:
            hidden_total[c.hidden_behind] += one * c.count
            held[c.hidden_behind] += one * c.count * contention_share(links[c.scope], sm_count)
            largest[c.hidden_behind] = max(largest[c.hidden_behind], one)
    for phase, seconds in hidden_total.items():
        if seconds > 0:
            late = max(seconds - window[phase], largest[phase])
            exposed += late
            contention += held[phase] * (1 - late / seconds)  # only what ran beside the compute slows it
    used = tuple(dict.fromkeys(links[c.scope].id for c in found))
    return Communication(sum(c.total_bytes for c in found),
                         sum(bus_bytes(c.kind, c.message_bytes, c.ranks) * c.count for c in found),
                         total, exposed, used, sum(c.count for c in found), contention)


def sharded_step(step: StepTime, layout: Layout, comm: Communication) -> StepTime:
    """`step` (one rank's compute) with its optimizer on its shard, and the exposed communication and the
    compute's slowdown beside the hidden one added."""
    by_bound = dict(step.by_bound)
    saved = 0.0
    if layout.strategy != "ddp" and layout.shards > 1:
        for op in step.ops:
            if op.phase == "optimizer":
                cut = (op.kernel_s + op.wait_s) * (1 - 1 / layout.shards)
                by_bound[op.bound] = by_bound.get(op.bound, 0.0) - cut
                saved += cut
    by_bound[COMMUNICATION_BOUND] = comm.exposed_s + comm.contention_s
    return replace(step, step_s=step.step_s - saved + comm.exposed_s + comm.contention_s, by_bound=by_bound)


def sharded_memory(layouts: LayoutMemory, db: HardwareDB, gpus: Sequence[GPUSpec], num_gpus: int, parallel: str,
                   cuda_context_bytes: int | None = None, tp: int | None = None
                   ) -> tuple[list[ShardedMemory], list[tuple[str, str]]]:
    """Each GPU's memory with `num_gpus` of its type on the machines that hold them, for every strategy
    `parallel` allows (strategies_for) in tensor-parallel groups of `tp` (tensor_degree), with the largest
    per-GPU batch that fits; (GPU id, why) for those no machine holds that many of."""
    sharded: list[ShardedMemory] = []
    skipped: list[tuple[str, str]] = []
    for gpu in gpus:
        machines = machines_for(db, gpu, num_gpus)
        if isinstance(machines, str):
            skipped.append((gpu.id, machines))
            continue
        degree = tensor_degree(parallel, tp, machines)
        if isinstance(degree, str):
            skipped.append((gpu.id, degree))
            continue
        nccl = communicator_bytes(db, machines)
        for strategy in strategies_for(parallel, machines.nodes, num_gpus // degree):
            layout = Layout(strategy, num_gpus, machines.gpus_per_node, degree)
            memory = device_memory(layouts.step(layout), gpu, db.memory_overhead(gpu), layouts.batch_model(layout),
                                   cuda_context_bytes, nccl, layouts.capped(layout))
            sharded.append(ShardedMemory(gpu.id, num_gpus, machines.nodes, layout.name, memory))
    return sharded, skipped
