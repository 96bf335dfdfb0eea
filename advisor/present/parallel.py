"""Multi-GPU results in words, shared by the table, the TUI's detail and the report: how many GPUs and
which strategy, why, what communication costs, and the fewest GPUs that fit where one does not."""

from __future__ import annotations

from typing import TYPE_CHECKING

from advisor.present.format import duration, gib, money, plan_duration, si

if TYPE_CHECKING:  # torch: only once a model is estimated
    from advisor.estimate.costs import CloudCost
    from advisor.estimate.plan import DeviceEstimate


def instance_label(offer: CloudCost) -> str:
    """The instance as the offers tables name it: "p5.48xlarge (8x)", "p5.48xlarge (2 x 8x)" for several."""
    if offer.instances > 1:
        return f"{offer.instance} ({offer.instances} x {offer.gpus_per_instance}x)"
    return offer.instance + (f" ({offer.gpus_per_instance}x)" if offer.gpus_per_instance > 1 else "")


def gpus_cell(result: DeviceEstimate) -> str:
    """The table's GPUs column: "1"; "8 zero2" for a multi-GPU job; "needs 8 fsdp" where one GPU is too
    small and that many fit; "-" where no machine of this GPU holds the job."""
    if result.scaling is not None:
        return f"{result.num_gpus} {result.scaling.layout.name}"
    if result.fits:
        return "1"
    more = result.scale_out
    if more is not None and more.scaling is not None:
        return f"needs {more.num_gpus} {more.scaling.layout.name}"
    return "-"


def parallel_line(result: DeviceEstimate) -> str | None:
    """How a multi-GPU job runs and what its communication costs (None on one GPU):
    "8 GPUs (1 node, nvlink4-nvswitch), zero2 (the fastest that fits; ...): 53.9 GB of collectives per
    step, 140 ms, 9.5 ms of it not hidden, the compute beside the rest 24 ms slower (NCCL holds SMs); scaling
    efficiency 92%; per GPU batch 1, global 8"."""
    scaling = result.scaling
    if scaling is None:
        return None
    comm = scaling.communication
    line = (f"{scaling.describe()} ({scaling.reason}): {si(comm.bytes_per_step, 'B')} of collectives per step, "
            f"{duration(comm.time_s)}, {duration(comm.exposed_s)} of it not hidden by compute")
    if comm.contention_s > 0:
        line += f", the compute beside the rest {duration(comm.contention_s)} slower (NCCL holds SMs)"
    efficiency = result.scaling_efficiency
    if result.fits and efficiency is not None:
        line += f"; scaling efficiency {efficiency:.0%}"
        if efficiency > 1 and scaling.layout.shards > 1:  # not an error: a sharded optimizer's step is shorter
            line += (f" (over 100%: each GPU updates 1/{scaling.layout.shards} of the weights, where one GPU "
                     "updates them all)")
    elif result.fits:
        line += "; no scaling efficiency (one GPU cannot hold the step)"
    tp = scaling.layout.tp
    holder = "GPU" if tp == 1 else f"tensor-parallel group of {tp}"
    return line + f"; batch {result.batch_size} per {holder}, {result.global_batch_size} in all"


def alternatives_line(result: DeviceEstimate) -> str | None:
    """Every strategy tried, with its peak per GPU and step ("ddp 173.2 GiB (does not fit), ...")."""
    scaling = result.scaling
    if scaling is None or len(scaling.alternatives) < 2:
        return None
    parts = []
    for a in scaling.alternatives:
        fit = f"{duration(a.step_time_s)} per step" if a.fits else "does not fit"
        parts.append(f"{a.strategy} {gib(a.peak_memory_bytes)} GiB ({fit})")
    return "Strategies: " + ", ".join(parts)


def scale_out_line(result: DeviceEstimate) -> str | None:
    """Where one GPU is too small, the fewest of them that fit (None otherwise)."""
    more = result.scale_out
    if more is None or more.scaling is None:
        return None
    offer = more.cheapest()
    rent = "no instance of that size is offered" if offer is None else \
        f"{money(more.job_cost_usd())} USD on {offer.instances} x {offer.provider} {offer.instance}"
    return (f"Fits on {more.num_gpus} of them ({more.scaling.layout.name}, {gib(more.memory.peak_bytes)} GiB "
            f"per GPU): {plan_duration(more.time_to_train_s)}, {rent}")
