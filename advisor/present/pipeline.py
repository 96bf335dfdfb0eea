"""The input pipeline in words (issue #27): what was timed, and whether each GPU's host keeps it fed.
Shared by the command line, the report and the TUI."""

from __future__ import annotations

from typing import TYPE_CHECKING

from advisor.present.format import duration, si

if TYPE_CHECKING:  # torch: only once an estimate exists
    from advisor.estimate.plan import DeviceEstimate, Estimate
    from advisor.pipeline.supply import InputSupply

ADVICE = {
    "images": "GPU decoding (NVIDIA DALI, torchvision.io.decode_jpeg on the GPU with nvJPEG), pre-decoded or "
              "pre-resized data (FFCV, WebDataset shards of smaller images), or a host with more vCPUs per GPU",
    "tokens": "pre-tokenized data read in larger slices, or a host with more vCPUs per GPU",
    "tensors": "a host with more vCPUs per GPU",
    "file": "caching what dataset() computes per sample (pre-processed files), moving augmentation to the GPU, "
            "or a host with more vCPUs per GPU",
}
"""What helps a pipeline that cannot keep up, by pipeline kind."""


def pipeline_line(estimate: Estimate) -> str | None:
    """What was timed: the pipeline, one thread's cost per sample, this machine's DataLoader."""
    pipeline = estimate.pipeline
    if pipeline is None:
        return None
    timing = pipeline.timing
    unit = estimate.model.sample_unit
    storage = "" if pipeline.storage is None else f"; {pipeline.storage.describe()}"
    return (f"Input pipeline: {pipeline.describe}; one thread of this machine prepares a sample in "
            f"{duration(timing.sample_s)} + {duration(timing.collate_s)} collation "
            f"({1 / (timing.sample_s + timing.collate_s):,.0f} {unit}/s per worker alone); "
            f"{pipeline.mechanics.note}" + ("" if pipeline.mechanics.stored else " (noisy: not stored)") + storage)


NARROW_MARGIN = 0.10
"""Supply above demand by less than this (a fraction of demand) is said to keep up only narrowly: the
pipeline's prediction is within about 15% on this machine (benchmarks/input_pipeline.py)."""


def _margin(result: DeviceEstimate) -> float:
    supply = result.input_supply
    assert supply is not None
    return supply.supply_samples_per_s / supply.demand_samples_per_s - 1


def input_bound(estimate: Estimate) -> list[DeviceEstimate]:
    """The GPUs that fit but wait for their input pipeline."""
    return [r for r in estimate.fitting if r.input_supply is not None and r.input_supply.limits]


def supply_line(estimate: Estimate) -> str | None:
    """Whether the GPUs' hosts keep them fed: the input-bound GPUs and by how much, or that none is."""
    assessed = [r for r in estimate.fitting if r.input_supply is not None]
    if not assessed:
        return None
    unit = estimate.model.sample_unit
    limited = input_bound(estimate)
    if not limited:
        closest = min(assessed, key=_margin)
        if _margin(closest) < NARROW_MARGIN:
            return (f"Input keeps up on every GPU, narrowly on {closest.id}: {describe_supply(closest, unit)}, "
                    f"{_margin(closest):.0%} to spare (within the model's error: it may wait for its batches)")
        fastest = max(assessed, key=lambda r: r.throughput)
        return f"Input keeps up on every GPU: {describe_supply(fastest, unit)}"
    worst = max(limited, key=lambda r: r.input_supply.stall_fraction if r.input_supply else 0.0)
    kind = estimate.pipeline.kind if estimate.pipeline is not None else "file"
    return (f"Input-bound on {len(limited)} of {len(assessed)} GPUs (the CPU cannot prepare batches as fast as the "
            f"GPU trains on them; their times include the wait): worst {describe_supply(worst, unit)}. "
            f"What helps: {ADVICE[kind]}")


def describe_supply(result: DeviceEstimate, unit: str) -> str:
    """"h100-sxm on aws p5.48xlarge (24 vCPUs per GPU) supplies 2,100 of the 5,900 images/s it consumes
    with 23 workers: waits 64% of each step; needs more than 23 workers" and the like, then the batch's
    copy to the GPU and the storage's part."""
    supply = result.input_supply
    assert supply is not None
    cpu = f" ({supply.host.cpu})" if supply.host.cpu else ""
    text = (f"{result.id} on {supply.host.name}{cpu} supplies {supply.supply_samples_per_s:,.0f} of the "
            f"{supply.demand_samples_per_s:,.0f} {unit}/s it consumes with {supply.workers} DataLoader workers")
    needed = supply.workers_needed
    if supply.limits:
        text += f": the GPU waits {supply.stall_fraction:.0%} of each step"
        if supply.storage_limits:
            text += " (the storage is the limit while it reads)"
        elif needed is not None and needed > supply.workers:
            text += f"; {needed} workers would keep up"
        elif needed is None:
            text += "; not even a worker on every vCPU would keep up"
    elif needed is not None:
        text += f" ({needed} {'is' if needed == 1 else 'are'} enough)"
    return text + _feed_words(supply, unit)


def _feed_words(supply: InputSupply, unit: str) -> str:
    """The batch's copy to the GPU and the storage reads, in a sentence or two (empty: neither assessed)."""
    feed, text = supply.feed, ""
    if feed.copy_s > 0:
        text += (f"; copying each step's batch to the GPU takes {duration(feed.copy_s)} "
                 f"({feed.copy_s / supply.gpu_step_s:.0%} of its step; {feed.link}, pinned memory)")
    if feed.read_bytes_per_sample > 0:
        need = supply.demand_samples_per_s * feed.read_bytes_per_sample
        served = feed.storage_samples_per_s
        when = "every epoch" if feed.storage_share >= 1 else f"the first epoch ({feed.storage_share:.0%} of the job)"
        text += f"; reads {si(need, 'B/s')} from storage in {when} at {si(feed.read_bytes_per_sample, 'B')} per sample"
        text += (f", of the {si(served * feed.read_bytes_per_sample, 'B/s')} measured here" if served is not None
                 else ": storage not measured on this host")
    return text
