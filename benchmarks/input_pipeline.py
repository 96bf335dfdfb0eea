"""Predicted against measured DataLoader throughput on this machine (issue #27), beside a fixed rate per
worker.

For each pipeline, the tool's prediction comes from what `advisor estimate` measures: one thread's
seconds per sample and per collation in this process (advisor.pipeline.measure) and this machine's
DataLoader mechanics, measured once on a synthetic pipeline (advisor.pipeline.machine). The measurement
is the real torch DataLoader with 1 and 2 worker processes (median of --repeats runs, samples per second
after two warm-up batches). The baseline assumes what one course package does: 250 MB/s per worker of
the bytes a sample reads (its file where known, else its tensors).

Pipelines: the built-in ImageNet-style JPEG pipeline (for the resnet50 example's inputs), and a model
file's own dataset() of another kind (benchmarks/pipelines/audio_model.py: log-mel spectrograms with
SpecAugment).

Then the issue's cloud case through the planning API (what `advisor estimate` prints): ResNet-50
channels-last under amp-fp16 at batch 256 on an A100 whose host gives it 12 vCPUs of a Xeon Platinum
8275CL (AWS p4d.24xlarge: 96 vCPUs for 8 GPUs), against MosaicML's published p4d DataLoader ceiling
(8x A100 ResNet-50 with the PyTorch DataLoader about 16,200 images/s, pegged near 17,800 when smaller
images should have gone faster: 2,025-2,225 per GPU); and a text model on the same host (no stall).

    python benchmarks/input_pipeline.py [--repeats 3] [--out benchmarks/results/input_pipeline.txt]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

from printed import print_report

from advisor.pipeline.datasets import pipeline_for
from advisor.pipeline.machine import mechanics
from advisor.pipeline.measure import loader_throughput, measure_samples
from advisor.pipeline.profile import MEASURING_BATCH, pipeline_cache
from advisor.pipeline.supply import Host, PipelineProfile
from advisor.profile.model_file import load_model_file

BASELINE_BYTES_PER_S = 250e6
"""The fixed rate per worker of the baseline."""
BAR = 0.15
WORKERS = (1, 2)
BATCHES = 30

MODELS = {
    "images (built in)": ("resnet50", 32),
    "audio dataset() (a model file's own)": (str(Path(__file__).resolve().parent / "pipelines" / "audio_model.py"), 32),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cache = pipeline_cache()
    loader = mechanics(cache)
    host = Host("this machine", loader.cpus, True)
    lines = [f"DataLoader throughput, predicted vs measured, {time.strftime('%Y-%m-%d')}, {platform.machine()} "
             f"{os.cpu_count()} CPUs, Python {platform.python_version()}; medians of {args.repeats} runs "
             f"of {BATCHES} batches",
             f"mechanics: {loader.note}{'' if loader.stored else ' (not stored: noisy)'}",
             f"{'pipeline':<38} {'workers':>7} {'measured/s':>10} {'ours/s':>8} {'error':>7} {'fixed-rate/s':>12} "
             f"{'error':>7}"]
    ours_errors, baseline_errors = [], []
    for name, (spec, batch) in MODELS.items():
        model = load_model_file(spec)
        pipeline = pipeline_for(model.dataset, model.example_input, model.source, cache)
        dataset = pipeline.make()
        profile = PipelineProfile(pipeline.kind, pipeline.describe, measure_samples(dataset, MEASURING_BATCH), loader,
                                  pipeline.read_bytes_per_sample)
        read = pipeline.read_bytes_per_sample or profile.timing.sample_bytes
        for workers in WORKERS:
            measured = statistics.median(loader_throughput(dataset, batch, workers, BATCHES, seed=run)
                                         for run in range(args.repeats))
            ours = profile.throughput(workers, host, batch)
            baseline = workers * BASELINE_BYTES_PER_S / read
            ours_errors.append(ours / measured - 1)
            baseline_errors.append(baseline / measured - 1)
            lines.append(f"{name:<38} {workers:>7} {measured:>10,.0f} {ours:>8,.0f} {ours / measured - 1:>+7.1%} "
                         f"{baseline:>12,.0f} {baseline / measured - 1:>+7.1%}")
        lines.append(f"  {pipeline.describe}: {profile.timing.sample_s * 1e3:.2f} ms + "
                     f"{profile.timing.collate_s * 1e3:.3f} ms collation per sample on one thread, "
                     f"{profile.timing.sample_bytes / 1e3:.0f} KB per collated sample")
    ours_median = statistics.median(abs(e) for e in ours_errors)
    worst = max(abs(e) for e in ours_errors)
    baseline_median = statistics.median(abs(e) for e in baseline_errors)
    lines.append(f"median |error|: ours {ours_median:.1%} (worst {worst:.1%}; bar {BAR:.0%} on every row: "
                 f"{'met' if worst <= BAR else 'NOT met'}), fixed rate per worker {baseline_median:.1%}")
    lines += cloud_case()
    print_report(lines, args.out)
    return 0


PUBLISHED_P4D_PER_GPU = (16_200 / 8, 17_800 / 8)
"""MosaicML Composer + FFCV blog: the PyTorch DataLoader's images/s per GPU on 8x A100 (p4d)."""


def cloud_case() -> list[str]:
    """The issue's second Done-when: ResNet-50 amp on an A100 with 12 vCPUs of p4d's CPU, and a text model."""
    from advisor.app.plan import plan
    from advisor.app.request import PlanRequest
    from advisor.hardware.loader import load_hwdb

    db = load_hwdb()
    here = Path(__file__).resolve().parent
    resnet = str(here / "pipelines" / "resnet50_channels_last.py")
    cases = (("ResNet-50 channels-last amp-fp16 b256", resnet, "a100-sxm4-40gb", "amp-fp16", 256),
             ("ResNet-50 channels-last amp-fp16 b256", resnet, "a100-sxm4-80gb", "amp-fp16", 256),
             ("GPT-2 small amp-bf16 (tokens)", str(here.parent / "examples" / "gpt2_small.py"), "a100-sxm4-40gb",
              "amp-bf16", None))
    lines = ["", "A100 hosts with 12 vCPUs of a Xeon Platinum 8275CL per GPU (p4d/p4de.24xlarge); published p4d "
             f"DataLoader ceiling {PUBLISHED_P4D_PER_GPU[0]:,.0f}-{PUBLISHED_P4D_PER_GPU[1]:,.0f} images/s per GPU; "
             "NVIDIA's ResNet-50 AMP on A100-SXM4-80GB 2,470 images/s (validation NV_DLE_RN50)"]
    for name, spec, gpu, precision, batch in cases:
        request = PlanRequest(model=spec, gpus=(gpu,), precision=precision, batch_size=batch,
                              vcpus_per_gpu=12, host_cpu="xeon-8275cl", input_pipeline=True, plans="never")
        result = plan(request, db).results[0]
        supply = result.input_supply
        assert supply is not None
        verdict = (f"input-bound: the GPU waits {supply.stall_fraction:.0%} of each step" if supply.limits
                   else "no stall")
        lines.append(f"  {name:<38} {gpu:<15} demand {supply.demand_samples_per_s:>9,.0f}/s  supply "
                     f"{supply.supply_samples_per_s:>9,.0f}/s with {supply.workers} workers: {verdict}; "
                     f"batch copy {supply.feed.copy_s * 1e3:.1f} ms of the {supply.gpu_step_s * 1e3:.0f} ms step "
                     f"({supply.feed.link})")
    lines.append(f"  (host threads: {supply.host.cpu})")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
