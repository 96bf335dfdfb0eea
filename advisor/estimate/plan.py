"""The estimate: one traced step, then per device its memory, step time, time-to-train and money,
ranked by time and by cost with the Pareto set of both. `estimate_model` is the Python API the CLI,
the TUI and the report share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from advisor.estimate.costs import (
    SECONDS_PER_HOUR,
    CloudCost,
    Job,
    Ownership,
    cloud_costs,
    instances_for,
    ownership,
    pareto_front,
)
from advisor.estimate.parallel import (
    Alternative,
    LayoutMemory,
    Machines,
    Scaling,
    choice_reason,
    communication,
    communicator_bytes,
    machines_for,
    scale_out_counts,
    sharded_step,
    asks_tensor_parallelism,
    strategies_for,
    tensor_degree,
)
from advisor.estimate.step import (
    LOOP_READ_BACK,
    Chunks,
    StepTime,
    chunks_of,
    estimate_accumulated,
    estimate_chunks,
)
from advisor.errors import UserError
from advisor.estimate.targets import EstimateTarget, with_measured_shapes
from advisor.hardware.specs import HardwareDB
from advisor.units import GIB
from advisor.memory.estimate import DeviceMemory, StepMemory, cannot_hold, device_memory
from advisor.memory.plan import MemorySettings, SecondTrace, layouts_cache_key, step_memory, trace_both_batches, trace_pair
from advisor.pipeline.hosts import physical_memory_bytes, this_machine_cpu, thread_speed
from advisor.pipeline.links import host_link_rate
from advisor.pipeline.supply import Feed, Host, InputSupply, PipelineProfile, input_supply, storage_share
from advisor.process import collector_paused
from advisor.estimate.ops import DTYPE_FALLBACK
from advisor.profile import trace_cache
from advisor.profile.choices import precision_of
from advisor.profile.coverage import coverage_of, trace_summary
from advisor.profile.model_file import ModelFile
from advisor.parallel.strategy import Layout
from advisor.estimate.packing import packed_trace
from advisor.estimate.ahead import LayoutsAhead, item_of
from advisor.profile.trace import OpRecord, StepTrace

Progress = Callable[[str], None]


ONE_GPU = Layout("ddp", 1, 1)
"""The job on one GPU, as LayoutMemory sizes it (its memory is the traced step's own)."""


def job_sized(costs: Sequence[CloudCost], gpus: int = 1) -> list[CloudCost]:
    """The offers whose rented instances hold exactly the job's `gpus` (larger ones are listed, not rented)."""
    return [c for c in costs if c.gpus == gpus]


@dataclass(frozen=True)
class DeviceEstimate:
    """One device: memory, step time, the job's length and its cost. Seconds, bytes, USD."""

    target: EstimateTarget
    memory: DeviceMemory
    step: StepTime
    batch_size: int
    steps: int
    cloud: tuple[CloudCost, ...]
    owning: Ownership | None
    step_flops: float = 0.0
    """FLOPs of one optimizer step (every micro-batch's forward and backward, and the optimizer)."""
    peak_flops: float | None = None
    """The device's peak FLOP/s in the precision's math dtype (None: unknown)."""
    tokens_per_sample: int | None = None
    """The sequence length of a sequence model (None: not one)."""
    input_supply: InputSupply | None = None
    """The input pipeline on this GPU's host against what the GPU consumes (None: not assessed); when it
    cannot keep up, `step` includes the wait (its "input" part)."""
    scaling: Scaling | None = None
    """The job on several GPUs (None: one); `memory` and `step` are then each GPU's."""
    scale_out: DeviceEstimate | None = None
    """Without --num-gpus, where one GPU is too small: the fewest GPUs of this type that fit (None: one
    fits, or no machine of this GPU holds the job)."""

    @property
    def id(self) -> str:
        return self.target.id

    @property
    def num_gpus(self) -> int:
        return 1 if self.scaling is None else self.scaling.gpus

    @property
    def data_parallel(self) -> int:
        """Ranks that each take `batch_size` samples per step."""
        return 1 if self.scaling is None else self.scaling.layout.dp

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step over every GPU."""
        return self.batch_size * self.data_parallel

    @property
    def scaling_efficiency(self) -> float | None:
        """N-GPU throughput / (N x one GPU's); None on one GPU, and where one GPU cannot hold the step."""
        return None if self.scaling is None else self.scaling.efficiency(self.step.step_s)

    @property
    def throughput_tokens_per_s(self) -> float | None:
        """Tokens per second (samples/s x the sequence length), None for a model without one."""
        return None if self.tokens_per_sample is None else self.throughput * self.tokens_per_sample

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation: the traced step's FLOPs per second over the device's peak in the
        precision's math dtype (the step's every counted FLOP, attention included, as PaLM's MFU counts
        the model's; recomputation under checkpointing counts too)."""
        if not self.peak_flops:
            return None
        return self.step_flops / self.step.step_s / self.peak_flops

    @property
    def fits(self) -> bool:
        return self.memory.fits

    @property
    def step_time_s(self) -> float:
        return self.step.step_s

    @property
    def throughput(self) -> float:
        """Samples per second over every GPU."""
        return self.global_batch_size / self.step.step_s

    @property
    def time_to_train_s(self) -> float:
        return self.steps * self.step.step_s

    @property
    def job_sized_offers(self) -> list[CloudCost]:
        """Offers whose instances hold exactly the job's GPUs: the ones it would rent."""
        return job_sized(self.cloud, self.num_gpus)

    def cheapest(self, spot: bool = False) -> CloudCost | None:
        """The cheapest job-sized offer for the job, on demand or spot; None where there is none."""
        if spot:
            priced = [c for c in self.job_sized_offers if c.spot_cost_usd is not None]
            return min(priced, key=lambda c: c.spot_cost_usd or 0.0, default=None)
        return min(self.job_sized_offers, key=lambda c: c.cost_usd, default=None)

    def spot_saving_cost_usd(self) -> float | None:
        """The cheapest spot cost of the job where it is below the cheapest on-demand one (a spot offer
        of another provider that costs more than renting on demand saves nothing), else None."""
        spot, on_demand = self.job_cost_usd(spot=True), self.job_cost_usd()
        return spot if spot is not None and (on_demand is None or spot < on_demand) else None

    def no_offer_reason(self) -> str:
        """Why the job has no price: "no 1-GPU offer" where only larger instances are offered, else "-"."""
        return f"no {self.num_gpus}-GPU offer" if self.cloud and not self.job_sized_offers else "-"

    def job_cost_usd(self, spot: bool = False) -> float | None:
        offer = self.cheapest(spot)
        if offer is None:
            return None
        return offer.spot_cost_usd if spot else offer.cost_usd

    def to_dict(self, top_ops: int = 10) -> dict[str, Any]:
        """PRODUCT.md's result object; times, throughput and costs are null where the model does not fit."""
        fits = self.fits
        gpu = self.target.gpu
        return {
            "gpu_id": self.id,
            "gpu_name": self.target.name,
            "local": self.target.local,
            "fits": fits,
            "peak_memory_bytes": self.memory.peak_bytes,
            "memory_capacity_bytes": self.memory.capacity_bytes,
            "missing_memory_bytes": self.memory.missing_bytes,
            "allocator_flushes": self.memory.allocator_flushes,
            "memory": dict(self.memory.memory),
            "max_batch_size": self.memory.max_batch_size,
            "step_time_s": self.step_time_s if fits else None,
            "throughput_samples_per_s": self.throughput if fits else None,
            "throughput_tokens_per_s": self.throughput_tokens_per_s if fits else None,
            "mfu": self.mfu if fits else None,
            "steps": self.steps,
            "time_to_train_s": self.time_to_train_s if fits else None,
            "bound": self.step.bound if fits else None,
            "time_breakdown_s": dict(self.step.by_bound) if fits else None,
            "layout_transposes_s": self.step.layout_s if fits else None,
            "channels_first_s": self.step.channels_first_s if fits else None,
            "calibration": self.target.calibration,
            "calibration_source": self.step.calibration_source,
            "calibration_note": self.target.note,
            "calibration_quality": None if self.target.quality is None else self.target.quality.to_dict(),
            "cloud": [c.to_dict() | ({} if fits else {"cost_usd": None, "spot_cost_usd": None}) for c in self.cloud],
            "purchase_usd": None if gpu is None else gpu.purchase_usd,
            "ownership": None if self.owning is None or not fits else self.owning.to_dict(),
            "top_ops": self.step.top_ops(top_ops) if fits else [],
            "input_pipeline": None if self.input_supply is None or not fits else self.input_supply.to_dict(),
            **self._parallel_dict(fits),
        }

    def _parallel_dict(self, fits: bool) -> dict[str, Any]:
        """PRODUCT.md's multi-GPU fields, and the smallest multi-GPU job that fits where one GPU does not."""
        scaling = self.scaling
        single = {"strategy": "single", "dp": 1, "tp": 1}
        return {
            "num_gpus": self.num_gpus,
            "nodes": 1 if scaling is None else scaling.machines.nodes,
            "global_batch_size": self.global_batch_size,
            "parallel": single if scaling is None else scaling.to_dict(),
            "communication": None if scaling is None else scaling.communication.to_dict(),
            "scaling_efficiency": self.scaling_efficiency if fits else None,
            "smallest_fit": None if self.scale_out is None else self.scale_out.summary(),
        }

    def summary(self) -> dict[str, Any]:
        """The few figures of a job that names its configuration (the smallest-fit column)."""
        offer = self.cheapest()
        return {"num_gpus": self.num_gpus, "nodes": 1 if self.scaling is None else self.scaling.machines.nodes,
                "parallel": None if self.scaling is None else self.scaling.layout.name,
                "fits": self.fits, "peak_memory_bytes": self.memory.peak_bytes, "step_time_s": self.step_time_s,
                "time_to_train_s": self.time_to_train_s, "throughput_samples_per_s": self.throughput,
                "scaling_efficiency": self.scaling_efficiency,
                "instance": None if offer is None else f"{offer.provider} {offer.instance}",
                "instances": None if offer is None else offer.instances, "cost_usd": self.job_cost_usd()}


@dataclass(frozen=True)
class EstimateSettings:
    """How the model is trained: MemorySettings (batch, precision, optimizer, checkpointing,
    micro-batch) and the job."""

    memory: MemorySettings
    job: Job
    spot: bool = False
    """Rank cost by spot prices instead of on-demand."""
    seq_len: int | None = None
    """Tokens per sample of a sequence model (the file's SEQ_LEN or --seq-len); None: not one."""
    assumptions: tuple[str, ...] = ()
    """Settings chosen for the user, each a phrase ("amp-bf16 (assumed for a language model; --precision)")."""
    workers: int | None = None
    """DataLoader workers per GPU (None: every vCPU of the GPU's share of its host but the training's)."""
    vcpus_per_gpu: float | None = None
    """The host's vCPUs per GPU for every GPU (None: each GPU's priced instance, else this machine)."""
    host_cpu: str | None = None
    """The host's CPU for every GPU (a HostCPU id; None: each GPU's instance's, else as fast as this one)."""
    num_gpus: int | None = None
    """GPUs of each type the job runs on (None: one, with the fewest that fit beside it); batch_size is
    then each GPU's."""
    parallel: str = "auto"
    """How several GPUs share the job (app.request.PARALLEL_CHOICES): "auto" picks the fastest that fits."""
    compiled: bool = False
    """The step as torch.compile runs it: pointwise ops fused between library kernels (fusion.py)."""
    tp: int | None = None
    """Tensor-parallel degree (--tp; None: every GPU of a machine under --parallel tp, else 1)."""
    sync_each_step: bool = False
    """The training loop reads a value back every step (step.LOOP_READ_BACK): the host cannot run ahead."""
    padding_mask: bool = False
    """The model by name's inputs carry a padding mask (--padding-mask)."""
    packing: int | None = None
    """Each sequence is packed from documents of this many tokens, attention running within each (--packing,
    packing.py); None: not packed."""

    @property
    def tensor_parallel(self) -> bool:
        """Whether --parallel/--tp split layers over GPUs."""
        return asks_tensor_parallelism(self.parallel, self.tp)

    def to_dict(self) -> dict[str, Any]:
        job = self.job
        adaptation = self.memory.adaptation
        tokens = None if self.seq_len is None or job.samples is None or job.epochs is None else \
            round(job.samples * job.epochs * self.seq_len)
        return {
            "seq_len": self.seq_len,
            "tokens": tokens,
            "batch_size": self.memory.batch_size,
            "precision": self.memory.precision,
            "optimizer": self.memory.optimizer,
            "samples": job.samples,
            "epochs": job.epochs,
            "steps": job.steps,
            "job_origin": job.origin,
            "checkpointing": self.memory.checkpointing,
            "micro_batch": self.memory.micro_batch,
            "spot": self.spot,
            "num_gpus": self.num_gpus or 1,
            "parallel": self.parallel,
            "tp": self.tp,
            "compile": self.compiled,
            "sync_each_step": self.sync_each_step,
            "padding_mask": self.padding_mask,
            "packing": self.packing,
            "lora": adaptation.lora_rank,
            "lora_targets": list(adaptation.lora_targets),
            "lora_dropout": adaptation.lora_dropout,
            "base_weights": adaptation.base_weights,
            "assumptions": list(self.assumptions),
            "workers": self.workers,
            "vcpus_per_gpu": self.vcpus_per_gpu,
            "host_cpu": self.host_cpu,
        }


@dataclass(frozen=True)
class Estimate:
    """The whole answer: the model, the settings and every device, best first."""

    model: ModelFile = field(repr=False)
    trace: StepTrace = field(repr=False)
    settings: EstimateSettings
    results: tuple[DeviceEstimate, ...]
    electricity_usd_per_kwh: float
    second: StepTrace | None = field(default=None, repr=False, compare=False)
    """The step traced at twice the batch (the memory line's second point): with `trace`, what a new
    estimate of the same step on other devices, prices or job can reuse. Its memory is what is read of it;
    its ops may be left out (StepTrace.memory_only, as the child that traced it sends it)."""
    pipeline: PipelineProfile | None = field(default=None, repr=False, compare=False)
    """The input pipeline as measured on this machine (None: not assessed)."""
    skipped: tuple[tuple[str, str], ...] = ()
    """GPUs left out of a multi-GPU estimate, each with why (no machine holds that many of them)."""

    @property
    def fitting(self) -> list[DeviceEstimate]:
        return [r for r in self.results if r.fits]

    @property
    def data_parallel(self) -> int:
        """Ranks that each take the batch (every GPU result of a multi-GPU estimate has the same)."""
        return max((r.data_parallel for r in self.results), default=1)

    def fastest_scale_out(self) -> DeviceEstimate | None:
        """Of the devices one GPU of which is too small, the one whose fewest GPUs that fit train fastest."""
        scaled = [r for r in self.results if r.scale_out is not None]
        return min(scaled, key=lambda r: (r.scale_out.time_to_train_s, r.id), default=None)  # type: ignore[union-attr]

    def by_time(self) -> list[DeviceEstimate]:
        """Devices the model fits on, fastest first."""
        return sorted(self.fitting, key=lambda r: (r.time_to_train_s, r.id))

    def by_cost(self) -> list[DeviceEstimate]:
        """Devices the model fits on that can be rented, cheapest job first (spot with settings.spot)."""
        spot = self.settings.spot
        priced = [r for r in self.fitting if r.job_cost_usd(spot) is not None]
        return sorted(priced, key=lambda r: (r.job_cost_usd(spot) or 0.0, r.time_to_train_s, r.id))

    def pareto(self) -> list[DeviceEstimate]:
        """Rentable devices no other beats on both time-to-train and cost, fastest first."""
        spot = self.settings.spot
        rented = self.by_cost()
        front = set(pareto_front([(r.id, r.time_to_train_s, r.job_cost_usd(spot) or 0.0) for r in rented]))
        return sorted((r for r in rented if r.id in front), key=lambda r: (r.time_to_train_s, r.id))

    def by_value(self) -> list[DeviceEstimate]:
        """Purchasable devices the model fits on, lowest price per sample/s of throughput first."""
        owned = [r for r in self.fitting if r.owning is not None]
        return sorted(owned, key=lambda r: (r.owning.purchase_usd / r.throughput, r.id))  # type: ignore[union-attr]

    def best_value_to_buy(self) -> DeviceEstimate | None:
        """The purchasable device the model fits on with the lowest price per sample/s of throughput."""
        return next(iter(self.by_value()), None)

    def fastest_to_buy_within(self, max_price_usd: float) -> DeviceEstimate | None:
        """The fastest device the model fits on whose card costs at most `max_price_usd` to buy (a
        purchase budget: the best value may be a slower, cheaper card than the budget allows)."""
        affordable = [r for r in self.by_value() if r.owning is not None and r.owning.purchase_usd <= max_price_usd]
        return min(affordable, key=lambda r: (r.time_to_train_s, r.id), default=None)

    def fastest_within_budget(self, budget_usd: float) -> DeviceEstimate | None:
        """The fastest rentable device whose job costs at most `budget_usd` (spot with settings.spot)."""
        spot = self.settings.spot
        affordable = [r for r in self.by_cost() if (r.job_cost_usd(spot) or 0.0) <= budget_usd]
        return min(affordable, key=lambda r: (r.time_to_train_s, r.id), default=None)

    def cheapest_within_deadline(self, deadline_s: float) -> DeviceEstimate | None:
        """The rentable device with the cheapest job that still finishes within `deadline_s` seconds."""
        return next((r for r in self.by_cost() if r.time_to_train_s <= deadline_s), None)

    def result(self, device_id: str) -> DeviceEstimate:
        return next(r for r in self.results if r.id == device_id)

    def to_dict(self, top_ops: int = 10) -> dict[str, Any]:
        trace = self.trace
        return {
            "model": {
                "name": self.model.name,
                "source": self.model.source,
                "params": trace.total_params or trace.params,
                "trainable_params": trace.params,
                "adapted": trace.adapted,
                "origin": self.model.origin,
                "forward_flops": trace.model_forward_flops(),
                "train_step_flops": trace.flops(),
                "train_step_bytes": trace.bytes_moved(),
                "sample_unit": self.model.sample_unit,
                "seq_len": self.settings.seq_len,
                "tokens_per_sample": self.settings.seq_len,
            },
            "settings": self.settings.to_dict(),
            "electricity_usd_per_kwh": self.electricity_usd_per_kwh,
            "ranking": {
                "by_time": [r.id for r in self.by_time()],
                "by_cost": [r.id for r in self.by_cost()],
                "pareto": [r.id for r in self.pareto()],
            },
            "results": [r.to_dict(top_ops) for r in self.results],
            "coverage": coverage_of(trace).to_dict(),
            "trace": trace_summary(trace),
            "input_pipeline": None if self.pipeline is None else self.pipeline.to_dict(),
            "skipped": [{"gpu_id": gpu_id, "reason": why} for gpu_id, why in self.skipped],
        }


def step_time(trace: StepTrace, settings: EstimateSettings, target: EstimateTarget,
              lowered: Chunks | None = None) -> StepTime:
    """Time of one optimizer step on `target`; with gradient accumulation, the traced micro-batch's
    forward and backward run accumulation_steps times before the one optimizer step. `lowered`: the
    trace's chunks as CUDA runs them (step.chunks_of, fused where settings.compiled), made once for many
    GPUs."""
    records, memory, compiled = trace.records, settings.memory, settings.compiled
    loop = _LOOP if settings.sync_each_step else []
    if not memory.accumulate_gradients:
        gpu = target.device.kind == "gpu"
        chunks = lowered if lowered is not None and gpu else chunks_of(records, trace.repeats, gpu, compiled)
        return estimate_chunks([*chunks, (loop, 1)] if loop else chunks, trace.precision, target.device, compiled)
    micro = [r for r in records if r.phase != "optimizer"]
    optimizer = [r for r in records if r.phase == "optimizer"] + loop
    return estimate_accumulated(micro, optimizer, memory.accumulation_steps, trace.precision, target.device,
                                compiled)


_LOOP: list[OpRecord] = [LOOP_READ_BACK]
"""The training loop's read-back as a chunk of records, one list for every GPU (step.ChunkFacts knows a chunk by
its list)."""


def rank_results(results: Sequence[DeviceEstimate]) -> tuple[DeviceEstimate, ...]:
    """The table's order: devices the model fits on, fastest first; then the others, closest to fitting first."""
    fitting = sorted((r for r in results if r.fits), key=lambda r: (r.time_to_train_s, r.id))
    short = sorted((r for r in results if not r.fits), key=lambda r: (r.memory.missing_bytes, r.id))
    return tuple(fitting + short)


def estimate_device(trace: StepTrace, settings: EstimateSettings, target: EstimateTarget, memory: DeviceMemory,
                    db: HardwareDB, lowered: Chunks | None = None, pipeline: PipelineProfile | None = None,
                    scaling: Scaling | None = None, step: StepTime | None = None) -> DeviceEstimate:
    """Step time, job length and money of one device (`lowered`: as step_time), or of `scaling`'s GPUs
    of its type with `step` each rank's; on a GPU, with the wait for its input `pipeline` where that
    cannot keep up."""
    if step is None:
        step = step_time(trace, settings, target, lowered)
    gpus, dp = (1, 1) if scaling is None else (scaling.gpus, scaling.layout.dp)
    batch = settings.memory.batch_size
    supply = None
    if pipeline is not None and target.device.kind == "gpu" and memory.fits:
        host = host_for(target, db, settings, pipeline.mechanics.cpus, gpus)
        loader_batch = settings.memory.micro_batch or batch
        feed = feed_for(pipeline, host, target, db, settings)
        supply = input_supply(pipeline, host, loader_batch, batch, step.step_s + feed.copy_s, settings.workers,
                              feed)
        step = step.with_input(feed.copy_s + supply.wait_s)
    steps = settings.job.steps_for(batch * dp)
    hours = steps * step.step_s / SECONDS_PER_HOUR
    gpu = target.gpu
    costs: tuple[CloudCost, ...] = ()
    owning = None
    if gpu is not None:
        costs = tuple(cloud_costs(db.offers_for(gpu.id), hours, gpus))
        cheapest = min((c.rate() or 0.0 for c in job_sized(costs, gpus)), default=None)
        owning = ownership(gpu, hours, db.defaults.electricity_usd_per_kwh, cheapest, gpus)
    micro = trace.flops() - trace.flops("optimizer")
    shards = 1 if scaling is None or scaling.layout.strategy == "ddp" else scaling.layout.shards
    step_flops = micro * settings.memory.accumulation_steps + trace.flops("optimizer") / shards
    return DeviceEstimate(target, memory, step, batch, steps, costs, owning, step_flops,
                          peak_flops(target, settings.memory.precision), settings.seq_len, supply, scaling)


def estimate_parallel(trace: StepTrace, settings: EstimateSettings, target: EstimateTarget, db: HardwareDB,
                      machines: Machines, layouts: LayoutMemory, strategies: Sequence[str],
                      lowered: Chunks | None = None, pipeline: PipelineProfile | None = None,
                      tp: int = 1, single: StepTime | None = None) -> DeviceEstimate:
    """The job on `machines`' GPUs of `target`'s type, in tensor-parallel groups of `tp`: each of
    `strategies` sized and timed per rank (the trace is one data-parallel rank's micro-batch), the fastest
    that fits kept (none fits: the one with the least memory per GPU), the others listed beside it.
    `single`: step_time of the trace on one GPU of the type, where the caller has it."""
    if single is None:
        single = step_time(trace, settings, target, lowered)
    rank = layouts.tensor_trace(tp)
    compute = single if tp == 1 else step_time(rank, settings, target)
    micro_batches = settings.memory.accumulation_steps
    nccl = communicator_bytes(db, machines)
    context = settings.memory.cuda_context_bytes
    tensor = layouts.tensor_collectives(tp, micro_batches)
    tried = []
    for strategy in strategies:
        layout = Layout(strategy, machines.gpus, machines.gpus_per_node, tp)
        memory = device_memory(layouts.step(layout), target, target.memory_overhead, None, context, nccl,
                               layouts.capped(layout))
        found = layouts.collectives(layout, micro_batches) + tensor
        comm = communication(found, machines, compute, micro_batches, target.device.sm_count)
        tried.append((layout, memory, comm, sharded_step(compute, layout, comm)))
    alternatives = [Alternative(layout.name, memory.fits, memory.peak_bytes, step.step_s)
                    for layout, memory, _, step in tried]
    fitting = [i for i, a in enumerate(alternatives) if a.fits]
    if fitting:
        best = min(fitting, key=lambda i: (alternatives[i].step_time_s, i))
    else:
        best = min(range(len(tried)), key=lambda i: (alternatives[i].peak_memory_bytes, i))
    layout, _, comm, step = tried[best]
    memory = device_memory(layouts.step(layout), target, target.memory_overhead, layouts.batch_model(layout), context,
                           nccl, layouts.capped(layout))  # with the largest batch that fits
    alone = device_memory(layouts.step(ONE_GPU), target, target.memory_overhead, None, context,
                          capped=layouts.capped(ONE_GPU))
    scaling = Scaling(layout, machines, comm, single.step_s,
                      choice_reason(settings.parallel, alternatives[best], alternatives), tuple(alternatives),
                      alone.fits)
    return estimate_device(rank, settings, target, memory, db, lowered if tp == 1 else None, pipeline, scaling,
                           step)


def likely_layouts(db: HardwareDB, targets: Sequence[EstimateTarget], settings: EstimateSettings,
                   layouts: LayoutMemory, alone: StepMemory) -> list[tuple[str, Layout]]:
    """The layouts whose memory an estimate of `targets` is likely to ask for, in the order it is likely to:
    one GPU's step and line, then per GPU count, fewest first, each strategy's step (the leanest first) and the
    lines of the LIKELY_LINES strategies likeliest to be chosen (only the one chosen at a count needs one). The
    counts: --gpus's, else per GPU type that does not hold `alone` (one GPU's step) the fewest GPUs the cheap
    bounds of smallest_fit (lean_ruled_out) leave. An item asked for at several counts or by several GPU types
    (DDP's) is listed once (LayoutMemory.key). What is not listed (another strategy's line, the next count where
    the re-play finds that the fewest GPUs do not hold the job after all) is made when asked for."""
    wanted: dict[tuple[str, tuple[str, bool, int, int]], tuple[str, Layout]] = {}

    def add(kind: str, layout: Layout) -> None:
        wanted.setdefault(item_of(kind, layout), (kind, layout))

    add("step", ONE_GPU)
    add("line", ONE_GPU)
    gpus = settings.num_gpus
    if gpus is not None and gpus <= 1:
        return list(wanted.values())
    by_count: dict[int, list[Layout]] = {}
    for target in targets:
        if not spreads(target) or target.gpu is None:
            continue
        if gpus is None and device_memory(alone, target, target.memory_overhead, None,
                                          settings.memory.cuda_context_bytes).fits:
            continue  # one that holds it only with its cached segments released is listed: a few re-plays too many
        counts = [gpus] if gpus is not None else _likely_counts(db, target, settings, layouts)
        for count in counts:
            machines = machines_for(db, target.gpu, count)
            tp = 1 if gpus is None or isinstance(machines, str) else \
                tensor_degree(settings.parallel, settings.tp, machines)
            if isinstance(machines, str) or isinstance(tp, str) or (tp > 1 and isinstance(layouts.plan, str)):
                continue  # no machine, or no tensor-parallel plan: the estimate says so (check_splittable)
            strategies = strategies_for(settings.parallel, machines.nodes, count // tp)
            lean = leanest(strategies)
            by_count.setdefault(count, []).extend(Layout(strategy, count, machines.gpus_per_node, tp)
                                                  for strategy in sorted(strategies, key=lambda s: s != lean))
    for count in sorted(by_count):
        for layout in by_count[count]:
            add("step", layout)
        distinct = {LayoutMemory.key(layout): layout for layout in by_count[count]}.values()  # GPU types alike
        for layout in sorted(distinct, key=lambda layout: LINE_LIKELIHOOD.get(layout.strategy, 0))[:LIKELY_LINES]:
            add("line", layout)
    return list(wanted.values())


def _likely_counts(db: HardwareDB, target: EstimateTarget, settings: EstimateSettings,
                   layouts: LayoutMemory) -> list[int]:
    """The GPU count smallest_fit is likely to size `target`'s type at: the fewest the bounds leave (none: [])."""
    assert target.gpu is not None
    for count in scale_out_counts(db, target.gpu):
        machines = machines_for(db, target.gpu, count)
        if not isinstance(machines, str) and not lean_ruled_out(layouts, target, db, machines, settings):
            return [count]
    return []


def lean_ruled_out(layouts: LayoutMemory, target: EstimateTarget, db: HardwareDB, machines: Machines,
                   settings: EstimateSettings) -> bool:
    """Whether `machines`' GPUs of `target`'s type cannot hold the job even with its leanest strategy (fsdp, or
    the one --parallel asks for), by the bounds found before a re-play, the cheapest first: what every rank
    holds whole, then the lean rank's tensors' peak (LayoutMemory.whole_peak, tensor_peak)."""
    lean = lean_layout(settings, machines)
    context, nccl = settings.memory.cuda_context_bytes, communicator_bytes(db, machines)
    overhead = target.memory_overhead
    return cannot_hold(layouts.whole_peak(lean.tp), target, overhead, context, nccl) or \
        cannot_hold(layouts.tensor_peak(lean), target, overhead, context, nccl)


def lean_layout(settings: EstimateSettings, machines: Machines) -> Layout:
    """`machines`' GPUs with the leanest strategy --parallel allows."""
    return Layout(leanest(strategies_for(settings.parallel, machines.nodes, machines.gpus)), machines.gpus,
                  machines.gpus_per_node)


def leanest(strategies: Sequence[str]) -> str:
    """The strategy of `strategies` that holds the least per GPU: fsdp where it is one, else the last."""
    return "fsdp" if "fsdp" in strategies else strategies[-1]


LINE_LIKELIHOOD = {"zero2": -3, "fsdp": -2, "zero1": -1}
"""The strategies whose line against the batch a job is likeliest to need, first: at the fewest GPUs that hold a
job one GPU cannot, mostly only the sharded ones fit, and the fastest of those is chosen (the 7B example over
every GPU: ZeRO-2 and FSDP)."""


LIKELY_LINES = 2
"""Lines listed per GPU count (likely_layouts), the likeliest first (LINE_LIKELIHOOD). The child re-playing
layouts goes down the list until it is stopped, and this process takes the next items it has not started while
it waits: listing every strategy's line and the next count, the 7B example over every GPU re-played 19 to 24
layouts where 16 are asked for (ZeRO-1's and DDP's lines, eight-GPU machines of a count no GPU type needed)."""


def spreads(target: EstimateTarget) -> bool:
    """Whether a job can run on several GPUs of `target`'s type: a database GPU (this machine's GPUs
    run alone)."""
    return target.gpu is not None and not target.local


def estimate_on_gpus(trace: StepTrace, settings: EstimateSettings, target: EstimateTarget, db: HardwareDB,
                     layouts: LayoutMemory, lowered: Chunks | None = None,
                     pipeline: PipelineProfile | None = None) -> DeviceEstimate | str:
    """The job on settings.num_gpus GPUs of `target`'s type, on the machines that hold them, with the
    strategies --parallel allows (estimate_parallel); a sentence where no machine holds them."""
    assert target.gpu is not None and settings.num_gpus is not None
    machines = machines_for(db, target.gpu, settings.num_gpus)
    if isinstance(machines, str):
        return machines
    tp = tensor_degree(settings.parallel, settings.tp, machines)
    if isinstance(tp, str):
        return tp
    return estimate_parallel(trace, settings, target, db, machines, layouts,
                             strategies_for(settings.parallel, machines.nodes, machines.gpus // tp), lowered,
                             pipeline, tp)


def smallest_fit(trace: StepTrace, settings: EstimateSettings, target: EstimateTarget, db: HardwareDB,
                 layouts: LayoutMemory, lowered: Chunks | None = None,
                 pipeline: PipelineProfile | None = None, single: StepTime | None = None) -> DeviceEstimate | None:
    """The fewest GPUs of `target`'s type that hold the job (estimate.parallel.scale_out_counts), with the
    strategy --parallel allows that runs it fastest; None where no machine of them does. A count is
    estimated in full only once its leanest strategy (fsdp, or the one asked for) fits. `single`: as
    estimate_parallel."""
    gpu = target.gpu
    assert gpu is not None
    for count in scale_out_counts(db, gpu):
        machines = machines_for(db, gpu, count)
        if isinstance(machines, str):
            continue
        if lean_ruled_out(layouts, target, db, machines, settings):
            continue
        lean = lean_layout(settings, machines)
        context, nccl = settings.memory.cuda_context_bytes, communicator_bytes(db, machines)
        if device_memory(layouts.step(lean), target, target.memory_overhead, None, context, nccl,
                         layouts.capped(lean)).fits:
            strategies = strategies_for(settings.parallel, machines.nodes, count)
            return estimate_parallel(trace, settings, target, db, machines, layouts, strategies, lowered, pipeline,
                                     single=single)
    return None


def feed_for(pipeline: PipelineProfile, host: Host, target: EstimateTarget, db: HardwareDB,
             settings: EstimateSettings) -> Feed:
    """The batch's copy over `target`'s host link, and on this machine the storage's reads, of one step."""
    gpu = target.gpu
    link = None if gpu is None else host_link_rate(db, gpu, host.pcie_gen)
    batch_bytes = settings.memory.batch_size * pipeline.timing.sample_bytes
    read = pipeline.read_bytes_per_sample
    storage = pipeline.storage if host.local else None
    job = settings.job
    return Feed(copy_s=0.0 if link is None else link.copy_s(batch_bytes),
                link="" if link is None else link.describe,
                storage_samples_per_s=None if storage is None or read <= 0 else storage.samples_per_s(read),
                storage_share=storage_share(job.samples, job.epochs, read, host.memory_bytes),
                read_bytes_per_sample=read)


def host_for(target: EstimateTarget, db: HardwareDB, settings: EstimateSettings, local_cpus: int,
             gpus: int = 1) -> Host:
    """Where `target`'s batches are prepared: --vcpus-per-gpu's host; this machine for a local GPU; the
    instance of the GPU's cheapest offer of the job's `gpus` that lists its vCPUs, else of any offer that does (the
    fewest vCPUs per GPU), its threads as fast as its CPU's published single-thread score says against
    this machine's (pipeline.hosts); else this machine (a GPU bought goes into the user's own)."""
    if settings.vcpus_per_gpu is not None:
        speed, cpu = thread_speed(db, settings.host_cpu)
        return Host(f"{settings.vcpus_per_gpu:g} vCPUs per GPU (--vcpus-per-gpu)", settings.vcpus_per_gpu, False,
                    speed, cpu, _pcie_gen(db, settings.host_cpu))
    if target.local or target.gpu is None:
        return this_machine(db, local_cpus)
    offers = [o for o in db.offers_for(target.gpu.id) if o.vcpus_per_gpu is not None]
    sized = [o for o in offers if o.gpus_per_instance * (instances_for(o, gpus) or 0) == gpus]
    if sized:
        offer = min(sized, key=lambda o: o.usd_per_gpu_hour)
    elif offers:
        offer = min(offers, key=lambda o: (o.vcpus_per_gpu, o.usd_per_gpu_hour))
    else:
        return this_machine(db, local_cpus, "this machine (no instance with this GPU lists its vCPUs)")
    vcpus = offer.vcpus_per_gpu
    assert vcpus is not None
    cpu_id = settings.host_cpu or offer.host_cpu
    speed, cpu = thread_speed(db, cpu_id)
    memory = None if offer.host_memory_gb is None else offer.host_memory_gb * GIB / offer.gpus_per_instance
    return Host(f"{offer.provider} {offer.instance} ({vcpus:g} vCPUs per GPU)", vcpus, False, speed, cpu,
                _pcie_gen(db, cpu_id), memory)


def this_machine(db: HardwareDB, cpus: int, name: str = "this machine") -> Host:
    """This machine as a host: its measured CPUs, its CPU's PCIe generation where known, its memory."""
    cpu, _ = this_machine_cpu(db)
    return Host(name, cpus, True, pcie_gen=None if cpu is None else cpu.pcie_gen, memory_bytes=physical_memory_bytes())


def _pcie_gen(db: HardwareDB, cpu_id: str | None) -> int | None:
    cpu = db.host_cpu(cpu_id)
    return None if cpu is None else cpu.pcie_gen


def channels_last_saving(estimate: Estimate, result: DeviceEstimate) -> float:
    """Seconds of `result`'s step that channels-last tensors would save: the device's step timed again with no
    op paying for channels-first layouts (DeviceModel.channels_last), against the same step as it is; the host's
    queue decides how much of the device time left out shortens the step (none where the host limits it)."""
    if not result.step.channels_first_s:
        return 0.0
    target = result.target
    as_is = step_time(estimate.trace, estimate.settings, target)
    channels_last = replace(target, device=replace(target.device, channels_last=True))
    return max(0.0, as_is.step_s - step_time(estimate.trace, estimate.settings, channels_last).step_s)


def peak_flops(target: EstimateTarget, precision: str) -> float | None:
    """The device's peak FLOP/s in the math dtype of `precision` (choices.Precision): autocast's or the
    cast dtype on tensor cores, TF32 with tf32, else fp32; None where the profile has no such peak."""
    dtype = precision_of(precision).matmul_dtype
    flops = target.device.profile.peaks.flops
    return flops.get(dtype) or flops.get(DTYPE_FALLBACK.get(dtype, "fp32"))


def estimate_model(model: ModelFile, db: HardwareDB, targets: Sequence[EstimateTarget], settings: EstimateSettings,
                   progress: Progress = lambda message: None, trace: StepTrace | None = None,
                   second: StepTrace | None = None, pipeline: PipelineProfile | None = None) -> Estimate:
    """Trace `model`'s training step (or reuse `trace`, and `second` at twice its batch) and estimate
    it on every target, with its input `pipeline` where measured (Python's cyclic collector paused:
    process.collector_paused)."""
    with collector_paused():
        return _estimate_model(model, db, targets, settings, progress, trace, second, pipeline)


def _estimate_model(model: ModelFile, db: HardwareDB, targets: Sequence[EstimateTarget], settings: EstimateSettings,
                    progress: Progress, trace: StepTrace | None, second: StepTrace | None,
                    pipeline: PipelineProfile | None) -> Estimate:
    memory_settings = settings.memory
    if trace is not None and second is not None:
        pending = SecondTrace.ready(second)
    else:  # the child tracing the second batch stays to re-play layouts (estimate/ahead.py)
        trace, pending = trace_pair(model, memory_settings, trace, progress, serve=True)
    try:
        estimate = _estimate_traced(model, db, targets, settings, progress, trace, pending, pipeline)
    except BaseException:
        pending.abandon()  # stops a child still serving
        raise
    pending.done()  # a child that served is kept for the next estimate of this model
    return estimate


def _estimate_traced(model: ModelFile, db: HardwareDB, targets: Sequence[EstimateTarget], settings: EstimateSettings,
                     progress: Progress, trace: StepTrace, pending: SecondTrace,
                     pipeline: PipelineProfile | None) -> Estimate:
    memory_settings = settings.memory
    traced = trace  # what a later estimate reuses; the GPUs run it packed (--packing)
    trace = packed_trace(trace, settings.packing, settings.seq_len)
    layouts_key = layouts_cache_key(model, memory_settings)  # the layouts re-played from these traces before
    layouts = LayoutMemory(trace, pending, trace_cache.load(layouts_key, trace_cache.LAYOUTS_SUFFIX, dict))
    # what needs only the first trace, while a child may still trace the second
    step = layouts.step(ONE_GPU)  # kept with the layouts
    served = pending.served()
    if served is not None:
        wanted = [(kind, layout) for kind, layout in likely_layouts(db, targets, settings, layouts, step)
                  if not layouts.has(item_of(kind, layout))]
        layouts.ahead = LayoutsAhead.start(served, layouts, trace, wanted)
    lowered = chunks_of(trace.records, trace.repeats, gpu=True, compiled=settings.compiled)  # for every GPU
    singles = {target.id: step_time(trace, settings, target, lowered) for target in targets
               if target.device.kind == "gpu" and not (settings.num_gpus is not None and settings.num_gpus > 1
                                                        and spreads(target))}  # each GPU's step alone
    if layouts.ahead is not None:  # the child still traces: take layouts' steps off its list meanwhile
        layouts.ahead.steps_while(pending.waits)
    second = pending.get()
    assert second.batch_size != trace.batch_size == memory_settings.traced_batch  # twice it, or half (trace_pair)
    batch_model = layouts.batch_model(ONE_GPU)
    assert batch_model is not None
    cpu_trace, cpu_batch_model, cpu_step = trace, batch_model, step
    if trace.cpu_runs_otherwise and any(target.device.kind != "gpu" for target in targets):
        # a CPU runs attention with dropout on its math path (profile/attention.py), and autocast with its own
        # policy (profile/cuda_autocast.py): traced that way
        cpu_trace, cpu_second = trace_both_batches(model, memory_settings, None, progress, attention="cpu")
        cpu_step, cpu_batch_model = step_memory(cpu_trace, cpu_second)
    progress(f"estimating {len(targets)} devices")
    results = []
    # A CPU has no caching allocator: its peak is the tensors' peak.
    cpu_step = replace(cpu_step, allocated=cpu_step.tensor_peak, reserved=cpu_step.tensor_peak)
    skipped: list[tuple[str, str]] = []
    gpus = settings.num_gpus
    layouts.check_splittable(settings.parallel, settings.tp, model.source)
    # the largest GPUs first: the fewest GPUs of each type that hold the job are asked for in the order the
    # child re-plays layouts (likely_layouts); the results are ranked, so their order does not change them
    for target in sorted(targets, key=lambda t: -t.memory_bytes):
        if target.device.kind != "gpu":
            memory = device_memory(cpu_step, target, target.memory_overhead, cpu_batch_model)
            target = with_measured_shapes(target, cpu_trace.records, cpu_trace.precision, progress)
            results.append(estimate_device(cpu_trace, settings, target, memory, db))
            continue
        spread = spreads(target)
        if gpus is not None and gpus > 1 and spread:
            result_or_why = estimate_on_gpus(trace, settings, target, db, layouts, lowered, pipeline)
            if isinstance(result_or_why, str):
                skipped.append((target.id, result_or_why))
            else:
                results.append(result_or_why)
            continue
        memory = device_memory(step, target, target.memory_overhead, batch_model, memory_settings.cuda_context_bytes,
                               capped=layouts.capped(ONE_GPU))
        single = singles[target.id]
        result = estimate_device(trace, settings, target, memory, db, lowered, pipeline, step=single)
        if gpus is None and spread and not memory.fits:
            result = replace(result, scale_out=smallest_fit(trace, settings, target, db, layouts, lowered, pipeline,
                                                            single))
        results.append(result)
    trace_cache.store(layouts_key, layouts.stored(), trace_cache.LAYOUTS_SUFFIX)  # None: nothing new
    order = {target.id: index for index, target in enumerate(targets)}
    skipped.sort(key=lambda skip: order[skip[0]])
    if not results and skipped:
        raise UserError(f"no machine runs {gpus} of the GPUs asked for: " +
                        "; ".join(f"{gpu_id}: {why}" for gpu_id, why in skipped[:3]))
    return Estimate(model, traced, settings, rank_results(results), db.defaults.electricity_usd_per_kwh, second,
                    pipeline, tuple(skipped))
