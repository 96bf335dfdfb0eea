"""Predicted against measured training step time, beside a bare roofline computed in the same run.

1. This CPU: real training steps (forward, loss, backward, AdamW step) of six models of different
   kinds, median of timed steps after warm-up, against the `advisor estimate --local` prediction
   (the local calibration from the cache, or a quick one measured now).
2. Published GPU rows (../shared/validation/published-throughput.csv, single-GPU rows) whose model
   this repository builds (benchmarks/zoo.py and the examples), at the published batch size,
   precision and image size or sequence length, against the estimate for that database GPU.
2b. Published multi-GPU rows: Lambda's 2-, 4- and 8-GPU machines, DDP on the machine's own link, their
   aggregate throughput and their scaling efficiency (N-GPU / N x 1-GPU throughput), beside a baseline
   that scales our one-GPU prediction linearly (issue #25).
2c. Published rows on newer GPUs (../shared/validation/published-throughput-newer.csv, issue #28): Ada,
   Hopper and Blackwell (with Ampere references), single GPUs and up to 8 in one machine, each run built as
   its source ran it (benchmarks/newer_rows.py), the others listed as skipped with their reason. Parts
   `published` and `newer` also print the median error per architecture family (Pascal ... Blackwell) beside
   the bare roofline's, against the issue's bar (15% for each family with at least 5 rows), and `newer` a
   table over both files.
3. Real GPU runs: training steps measured on a GPU by benchmarks/gpu_groundtruth.py (one folder per GPU
   and date under benchmarks/results/groundtruth/), against the estimate for that GPU recomputed now.

The bare roofline times every op of the same trace at 75% of the device's peak FLOP/s for the op's
dtype and 75% of its bandwidth (the sustained bandwidth on the CPU, which has no datasheet figure),
max of the two, summed: no calibration, no size effects, no overheads.

    python benchmarks/accuracy.py [--part cpu|published|multi|newer|gpu|all] [--out benchmarks/results/accuracy.txt]
        [--summary calibration/accuracy.yaml]
"""

from __future__ import annotations

import argparse
import csv
import functools
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from unittest import mock

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from heldout import HELDOUT, available  # noqa: E402
from newer_rows import FAMILIES, PlanRun, VisionRun, family_name, largest_fitting_batch, read_newer, run_of  # noqa: E402
from printed import print_report  # noqa: E402
from published_optimizers import PUBLISHED_OPTIMIZERS  # noqa: E402
from zoo import ModelParts, cast_model_and_inputs, example, zoo_parts  # noqa: E402

from advisor.app.plan import plan  # noqa: E402
from advisor.calibration.peaks import gpu_peaks  # noqa: E402
from advisor.calibration.reference import load_families  # noqa: E402
from advisor.estimate.ops import DTYPE_FALLBACK, classify  # noqa: E402
from advisor.estimate.parallel import (  # noqa: E402
    Communication,
    Sharding,
    communication,
    own_machine,
    sharded_step,
    step_collectives,
)
from advisor.estimate.step import LOOP_READ_BACK, StepTime, estimate_records  # noqa: E402
from advisor.estimate.targets import database_targets, local_targets, with_measured_shapes  # noqa: E402
from advisor.errors import UserError  # noqa: E402
from advisor.hardware.loader import load_hwdb  # noqa: E402
from advisor.hardware.specs import GPUSpec  # noqa: E402
from advisor.memory.estimate import DeviceMemory, StepMemory, capped_replay, device_memory  # noqa: E402
from advisor.parallel.strategy import Layout  # noqa: E402
from advisor.profile.trace import (  # noqa: E402
    FILE_OPTIMIZER,
    OpRecord,
    StepTrace,
    call_model,
    default_loss,
    make_optimizer,
    trace_training_step,
)

REPO = Path(__file__).resolve().parents[1]
VALIDATION = REPO.parent / "shared" / "validation" / "published-throughput.csv"
GPU_LABELS = REPO / "benchmarks" / "validation_gpus.yaml"
BARE_EFFICIENCY = 0.75


# ----------------------------------------------------------------------------- shared


def bare_roofline_seconds(records: Iterable[OpRecord], precision: str, flops_peaks: dict[str, float],
                          bandwidth: float, gpu: bool) -> float:
    """Sum over ops of max(FLOPs / (75% peak of the op's dtype), bytes / (75% bandwidth)); on a GPU an
    amp step's matmuls count at the autocast dtype's peak, as the estimator's (a fair baseline)."""
    total = 0.0
    for record in records:
        kind = classify(record, precision, cuda=gpu)
        dtype: str | None = kind.dtype if kind.compute and not kind.vector else "fp32"
        while dtype is not None and dtype not in flops_peaks:
            dtype = DTYPE_FALLBACK.get(dtype)
        peak = flops_peaks[dtype or "fp32"]
        total += max(record.flops / (BARE_EFFICIENCY * peak),
                     (record.bytes_read + record.bytes_written) / (BARE_EFFICIENCY * bandwidth))
    return total


def error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


@dataclass(frozen=True)
class Row:
    label: str
    model: str
    device: str
    measured: float
    ours: float
    bare: float
    unit: str
    family: str = ""
    """The GPU's architecture family (newer_rows.FAMILIES; "" for a CPU)."""


def summary(rows: list[Row], title: str, baseline: str = "bare roofline") -> list[str]:
    ours = [abs(error(r.ours, r.measured)) for r in rows]
    bare = [abs(error(r.bare, r.measured)) for r in rows]
    return [f"{title:<44} n={len(rows):>3}  ours median {statistics.median(ours):6.1%} mean {statistics.mean(ours):6.1%}"
            f"   {baseline} median {statistics.median(bare):6.1%} mean {statistics.mean(bare):6.1%}"]


def summary_figures(rows: list[Row], what: str, baseline: str = "bare_roofline") -> dict[str, object]:
    """The medians and means of |error| as data (calibration/accuracy.yaml), fractions."""
    ours = [abs(error(r.ours, r.measured)) for r in rows]
    bare = [abs(error(r.bare, r.measured)) for r in rows]
    return {"what": what, "rows": len(rows), "median_abs_error": round(statistics.median(ours), 4),
            "mean_abs_error": round(statistics.mean(ours), 4),
            f"{baseline}_median_abs_error": round(statistics.median(bare), 4),
            f"{baseline}_mean_abs_error": round(statistics.mean(bare), 4)}


def groups_of(rows: list[Row], key: Callable[[Row], str], order: Sequence[str] = ()) -> dict[str, list[Row]]:
    """The rows by `key`, the keys in `order` first (as listed) and the others sorted after them."""
    groups: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        groups[key(row)].append(row)
    return {name: groups[name] for name in [*(o for o in order if o in groups), *sorted(set(groups) - set(order))]}


def grouped(rows: list[Row], key: Callable[[Row], str], heading: str, baseline: str = "bare roofline",
            order: Sequence[str] = ()) -> list[str]:
    lines = [f"\n{heading}"]
    for name, members in groups_of(rows, key, order).items():
        lines += summary(members, f"  {name}", baseline)
    return lines


FAMILY_BAR = 0.15
"""Issue #28's bar: median |error| at most 15% for every architecture family ..."""
FAMILY_BAR_ROWS = 5
"""... that has at least 5 rows."""


def family_verdict(rows: list[Row]) -> str:
    """Whether one family's rows meet FAMILY_BAR: "met", "not met", or why it is not judged."""
    if len(rows) < FAMILY_BAR_ROWS:
        return f"not judged (fewer than {FAMILY_BAR_ROWS} rows)"
    median = statistics.median(abs(error(r.ours, r.measured)) for r in rows)
    return "met" if median <= FAMILY_BAR else "not met"


def family_table(rows: list[Row], heading: str) -> list[str]:
    """Median (and mean) |error| per architecture family, oldest first, beside the bare roofline's, each with
    the issue's bar (FAMILY_BAR for families of at least FAMILY_BAR_ROWS rows) met or not."""
    lines = [f"\n{heading} (bar: median at most {FAMILY_BAR:.0%} for each family of {FAMILY_BAR_ROWS}+ rows)"]
    for name, members in groups_of(rows, lambda r: r.family, FAMILIES).items():
        lines.append(f"{summary(members, f'  {name}')[0]}   bar: {family_verdict(members)}")
    return lines


def family_figures(rows: list[Row]) -> dict[str, dict[str, object]]:
    """Per architecture family: rows, median |error| (ours and the bare roofline's) and the bar's verdict,
    for calibration/accuracy.yaml."""
    return {name: {"rows": len(members),
                   "median_abs_error": round(statistics.median(abs(error(r.ours, r.measured)) for r in members), 4),
                   "bare_roofline_median_abs_error":
                       round(statistics.median(abs(error(r.bare, r.measured)) for r in members), 4),
                   "bar": family_verdict(members)}
            for name, members in groups_of(rows, lambda r: r.family, FAMILIES).items()}


def table(rows: list[Row], baseline: str = "bare") -> list[str]:
    lines = [f"{'case':<70} {'measured':>10} {'ours':>10} {'err':>7} {baseline:>10} {'err':>7}  unit"]
    for r in rows:
        lines.append(f"{r.label:<70} {r.measured:>10.4g} {r.ours:>10.4g} {error(r.ours, r.measured):>+7.1%} "
                     f"{r.bare:>10.4g} {error(r.bare, r.measured):>+7.1%}  {r.unit}")
    return lines


# ----------------------------------------------------------------------------- 1. this CPU


@dataclass(frozen=True)
class CPUCase:
    label: str
    kind: str
    parts: ModelParts
    batch: int
    precision: str = "fp32"
    optimizer: str = "adamw"


def heldout_cases() -> list[CPUCase]:
    """Models from outside this repository (benchmarks/heldout.py: torchvision, transformers, a wide MLP;
    those whose library imports here), issue #20."""
    return [CPUCase(f"{name} b{HELDOUT[name].batch}", f"held out: {HELDOUT[name].label}", HELDOUT[name].parts(),
                    HELDOUT[name].batch, optimizer=HELDOUT[name].optimizer) for name in available()]


def cpu_cases() -> list[CPUCase]:
    small_llama = dict(vocab_size=32000, width=512, layers=4, heads=8, kv_heads=4, intermediate=1376, seq_len=256)
    return heldout_cases() + [
        CPUCase("mlp b64", "MLP", example("mlp"), 64),
        CPUCase("resnet50 b8", "CNN", example("resnet50"), 8),
        CPUCase("mobilenet_v2 b16", "depthwise CNN", example("mobilenet_v2"), 16),
        CPUCase("bert_base seq128 b4", "transformer encoder", example("bert_base", seq_len=128), 4),
        CPUCase("vit_b16 b4", "vision transformer", example("vit_b16"), 4),
        CPUCase("gpt2_small seq256 b2", "transformer decoder", example("gpt2_small", seq_len=256), 2),
        CPUCase("llama 4x512 seq256 b2", "decoder (RMSNorm, SwiGLU, GQA)", example("llama", **small_llama), 2),
    ]


def timed_step(parts: ModelParts, batch: int, precision: str, optimizer_name: str) -> Callable[[], float]:
    """The model built once for real training steps: each call runs one step (zero_grad; forward and
    loss, under CPU autocast for the amp precisions; backward; optimizer step) and returns its seconds."""
    torch.manual_seed(0)
    build, make_input, loss_fn = parts
    model, inputs = cast_model_and_inputs(build(), make_input(batch), precision)
    model.train()
    optimizer = make_optimizer(optimizer_name, [p for p in model.parameters() if p.requires_grad])
    loss_fn = loss_fn or default_loss
    autocast = precision.startswith("amp")

    def step() -> float:
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(call_model(model, inputs), inputs)
        loss.backward()
        optimizer.step()
        return time.perf_counter() - started

    return step


def measure_cpu_step(case: CPUCase, warm: int = 2, timed: int = 7) -> float:
    """Median seconds of `timed` real training steps after `warm` ones."""
    step = timed_step(case.parts, case.batch, case.precision, case.optimizer)
    for _ in range(warm):
        step()
    return statistics.median(step() for _ in range(timed))


def trace_case(parts: ModelParts, batch: int, precision: str, optimizer: str, attention: str = "cpu") -> StepTrace:
    """The step traced as the tool traces it for a CPU (`attention` "cpu") or a GPU ("cuda")."""
    build, make_input, loss_fn = parts
    published = PUBLISHED_OPTIMIZERS.get(optimizer)  # a published script's own: traced as a file's optimizer(params)
    return trace_training_step(build, make_input, batch, precision, FILE_OPTIMIZER if published else optimizer,
                               loss_fn, attention=attention, build_optimizer=published)


def cpu_rows() -> tuple[list[Row], list[str]]:
    """Each model's real steps against the prediction from a quick calibration measured at the start
    of this run, in a cache of its own: this VM's speed drifts by 10-20% over minutes (neighbours), and
    a profile measured hours before would put that drift into the error. Convolutions are timed at their
    shapes as `advisor estimate --local` times them (calibration/shapes.py), stored in that cache too."""
    db = load_hwdb([])
    with tempfile.TemporaryDirectory() as cache, mock.patch.dict(os.environ, {"GPU_ADVISOR_CACHE_DIR": cache}):
        notify = lambda m: print(f"advisor: {m}", file=sys.stderr)  # noqa: E731
        cpu = local_targets(db, load_families(db), notify)[0]
        profile = cpu.device.profile
        notes = [f"CPU: {cpu.name}; calibration {profile.status} ({profile.mode}, {profile.created})"]
        rows = []
        for case in cpu_cases():
            trace = trace_case(case.parts, case.batch, case.precision, case.optimizer)
            timed = with_measured_shapes(cpu, trace.records, case.precision, notify).device
            ours = estimate_records(trace.records, case.precision, timed).step_s
            bare = bare_roofline_seconds(trace.records, case.precision, profile.peaks.flops,
                                         profile.sustained_bandwidth_bytes_per_s, gpu=False)
            measured = measure_cpu_step(case)
            rows.append(Row(f"{case.label} {case.precision} {case.optimizer} ({case.kind})", case.label.split()[0],
                            "local-cpu", measured * 1e3, ours * 1e3, bare * 1e3, "ms/step"))
            print(f"advisor: {case.label}: measured {measured * 1e3:.1f} ms, predicted {ours * 1e3:.1f} ms",
                  file=sys.stderr, flush=True)
            gc.collect()
    return rows, notes


# ----------------------------------------------------------------------------- 2. published GPU rows


MODELS = {
    "ResNet-50 v1.5": "resnet50",
    "ResNeXt-101 32x4d": "resnext101_32x4d",
    "SE-ResNeXt-101 32x4d": "se_resnext101_32x4d",
    "EfficientNet-b0": "efficientnet_b0",
    "EfficientNet-b4": "efficientnet_b4",
    "EfficientNet-widese-b0": "efficientnet_widese_b0",
    "EfficientNet-widese-b4": "efficientnet_widese_b4",
    "BERT-base uncased (SQuAD v1.1 fine-tune)": "bert_base",
    "BERT-large uncased (SQuAD v1.1 fine-tune)": "bert_large",
    "BERT-large uncased (seq-classification head)": "bert_large",
    "BERT-large uncased (pre-training, LAMB)": "bert_large",
    "torchvision resnet18": "resnet18",
    "torchvision resnet50": "resnet50",
    "torchvision resnet152": "resnet152",
    "torchvision vgg16": "vgg16",
    "torchvision densenet121": "densenet121",
    "torchvision mobilenet_v2": "mobilenet_v2",
}
"""Published model name -> zoo entry. The others (GNMT, Transformer-XL, SSD, Mask R-CNN, Tacotron2,
WaveGlow, NCF, Transformer-big) are not built here and are listed as skipped."""

SAMPLE_METRICS = ("train_images_per_s", "train_sequences_per_s", "train_samples_per_s")
TENSOR_CORE_ARCHITECTURES = ("ampere", "ada", "hopper", "blackwell")


def precision_of(row: dict[str, str], architecture: str | None) -> str | None:
    """Our precision for a published label. FP32 on Ampere and newer ran as TF32: NGC containers and
    PyTorch < 1.12 (the ryujaehun A100 run: 1.7) enable it by default (SOURCES.md)."""
    label = row["precision"]
    if row["source_id"] == "LAMBDA_V0" and label == "FP16-mixed":
        # Lambda v0's "FP16" column ran DLE's apex `--fp16` for BERT and for ResNet-50 (SOURCES.md): the
        # model itself in fp16 (apex O2 / network_to_half) with fp32 master weights, not autocast.
        return "fp16"
    if label == "FP32":
        return "tf32" if architecture in TENSOR_CORE_ARCHITECTURES else "fp32"
    if label == "TF32":
        return "tf32"
    if label in ("AMP", "FP16-mixed"):
        return "amp-fp16"
    if label.startswith("FP16-pure"):
        return "fp16"
    return None


def optimizer_of(row: dict[str, str]) -> str | None:
    """The published runs' optimizers: SGD with momentum for the CNNs, Adam(W)/LAMB (element-wise, two
    moments: timed as Adam) for BERT, but Lambda v0's BERT runs without --fp16, which stepped DLE's BertAdam
    in a Python loop over the parameters (published_optimizers.py); ryujaehun times no optimizer step (None)."""
    if row["source_id"] == "RYUJAEHUN_BS12":
        return None
    if row["source_id"] == "LAMBDA_V0" and row["model"].startswith("BERT") and row["precision"] == "FP32":
        return "dle-bertadam"
    return "adamw" if row["model"].startswith("BERT") else "momentum"


LOOP_READS_BACK = frozenset({"LAMBDA_V0", "RYUJAEHUN_BS12", "HF_PERF_TRAIN_GPU_ONE"})
"""Sources whose training loop reads a value back to the host every step, so the host cannot run ahead into
the next step: ryujaehun's benchmark calls torch.cuda.synchronize() before and after each timed step;
DeepLearningExamples' scripts as Lambda v0 ran them log every step (run_squad.py's `final_loss =
loss.item()`, the ConvNets' `--print-freq 1`); Hugging Face's Trainer tests `torch.isnan(loss)` in an `if`
after each backward (logging_nan_inf_filter, on by default). Timed as one read back at the step's end
(step.LOOP_READ_BACK, what --sync-each-step adds)."""

CHANNELS_LAST_SOURCES = frozenset({"NV_DLE_RN50", "NV_DLE_RNXT101", "NV_DLE_SERNXT101"})


def channels_last_of(row: dict[str, str]) -> bool:
    """Whether the published run kept its images channels-last (NHWC): DLE's ConvNets configs.yml sets
    `memory_format: nhwc` for every AMP run and leaves FP32/TF32 at the default NCHW; Lambda v0's
    DLE fork and ryujaehun's torchvision runs never set it (SOURCES.md)."""
    return row["source_id"] in CHANNELS_LAST_SOURCES and row["precision"] == "AMP"


def channels_last(parts: ModelParts) -> ModelParts:
    """The model and its input images in channels-last memory format, as `model.to(memory_format=
    torch.channels_last)` and `x.contiguous(memory_format=torch.channels_last)` make them."""
    build, make_input, loss_fn = parts
    return (lambda: build().to(memory_format=torch.channels_last),
            lambda batch: make_input(batch).contiguous(memory_format=torch.channels_last), loss_fn)


def size_of(row: dict[str, str]) -> int | None:
    text = row["seq_len_or_image_size"]
    if text.startswith("seq"):
        return int(text[3:])
    if "x" in text:
        return int(text.split("x")[0])
    return None


@dataclass(frozen=True)
class Case:
    """One single-GPU run as the tool traces it: its model (a zoo entry or a timm model), image size or
    sequence length, batch, precision, optimizer and memory format."""

    model: str
    size: int | None
    batch: int
    precision: str
    optimizer: str | None
    """None: the source times no optimizer step (traced with SGD, left out of the time)."""
    channels_last: bool = False

    def parts(self) -> ModelParts | str:
        """The model's parts in the case's memory format, or why they cannot be built here (timm missing)."""
        parts = zoo_parts(self.model, self.size)
        return channels_last(parts) if self.channels_last and not isinstance(parts, str) else parts


@dataclass(frozen=True)
class Predicted:
    """One published row as the tool sees it: the step traced as its source ran it, timed on its GPU."""

    label: str
    model: str
    gpu: GPUSpec
    batch: int
    trace: StepTrace
    records: list[OpRecord]
    step: StepTime
    bare_s: float
    fits: bool
    peak_bytes: int

    def throughput(self, step_s: float) -> float:
        """Samples per second of one GPU at `step_s` seconds a step."""
        return self.batch / step_s


class Published:
    """The published rows' hardware, labels and traces (each traced once per Case, shared by the single-
    and multi-GPU rows and by the newer rows' batch search)."""

    def __init__(self) -> None:
        self.db = load_hwdb([])
        self.families = load_families(self.db)
        self.labels = yaml.safe_load(GPU_LABELS.read_text())["labels"]
        self.traces: dict[Case, StepTrace] = {}
        self.plans: dict[tuple, tuple[StepTrace, StepTrace]] = {}
        """Steps traced through app.plan (at the batch and twice it), by PlanRequest.trace_key()."""
        with VALIDATION.open(newline="") as handle:
            self.rows = list(csv.DictReader(handle))

    def predict(self, row: dict[str, str]) -> Predicted | str:
        """The row predicted on one GPU, or why it is skipped."""
        zoo_name = MODELS.get(row["model"])
        gpu = self.db.gpu(self.labels[row["gpu"]])
        precision = precision_of(row, gpu.architecture)
        if zoo_name is None:
            return f"{row['model']}: not built here"
        if not row["batch_size_per_gpu"]:
            return f"{row['model']}: no published batch size"
        if precision is None:
            return f"precision {row['precision']}"
        if row["metric"] not in SAMPLE_METRICS and row["metric"] != "train_step_time_ms_median":
            return f"metric {row['metric']}"
        case = Case(zoo_name, size_of(row), int(row["batch_size_per_gpu"]), precision, optimizer_of(row),
                    channels_last_of(row))
        return self.predict_case(case, gpu, f"{row['source_id']}: {zoo_name} b{case.batch} {row['precision'][:9]} "
                                            f"on {gpu.id}", row["source_id"] in LOOP_READS_BACK)

    def trace(self, case: Case) -> StepTrace | str:
        """The case's step traced as for a GPU (once per case), or why it cannot be built here."""
        if case not in self.traces:
            parts = case.parts()
            if isinstance(parts, str):
                return parts
            print(f"advisor: tracing {case}", file=sys.stderr, flush=True)
            self.traces[case] = trace_case(parts, case.batch, case.precision, case.optimizer or "sgd",
                                           attention="cuda")
        return self.traces[case]

    def memory(self, case: Case, gpu: GPUSpec) -> DeviceMemory | str:
        """The case's peak memory on `gpu` (the database's overheads, no batch line), or why not traced."""
        trace = self.trace(case)
        if isinstance(trace, str):
            return trace
        target = database_targets(self.db, [gpu], self.families)[0]
        return device_memory(StepMemory.of_trace(trace), target, target.memory_overhead,
                             capped=capped_replay(trace.memory))

    def predict_case(self, case: Case, gpu: GPUSpec, label: str, loop_reads_back: bool = False) -> Predicted | str:
        """The case timed on `gpu`, with its memory and the bare roofline; or why it is skipped.
        `loop_reads_back`: the source's loop reads a value back every step (LOOP_READS_BACK)."""
        trace, memory = self.trace(case), self.memory(case, gpu)
        if isinstance(trace, str) or isinstance(memory, str):
            return str(trace if isinstance(trace, str) else memory)
        records = [r for r in trace.records if case.optimizer is not None or r.phase != "optimizer"]
        if loop_reads_back:
            records.append(LOOP_READ_BACK)
        target = database_targets(self.db, [gpu], self.families)[0]
        step = estimate_records(records, case.precision, target.device)
        bare = bare_roofline_seconds(records, case.precision, gpu_peaks(gpu).flops, gpu.bandwidth_bytes_per_s,
                                     gpu=True)
        return Predicted(label, case.model, gpu, case.batch, trace, records, step, bare, memory.fits,
                         memory.peak_bytes)


def published_rows(published: Published) -> tuple[list[Row], list[str], list[str]]:
    """(rows, why rows were skipped, rows the tool calls "does not fit": runs that happened on that GPU at
    that batch, so every one of them is a memory prediction that is too high)."""
    rows, skipped, unfit = [], defaultdict(int), []
    for row in (r for r in published.rows if r["num_gpus"] == "1"):
        predicted = published.predict(row)
        if isinstance(predicted, str):
            skipped[predicted] += 1
            continue
        p, value = predicted, float(row["value"])
        if not p.fits:
            unfit.append(f"{p.label}: {p.peak_bytes / 2**30:.1f} GiB predicted, {p.gpu.memory_bytes / 2**30:.1f} GiB card")
        if row["metric"] == "train_step_time_ms_median":
            rows.append(Row(p.label, p.model, p.gpu.id, value, p.step.step_s * 1e3, p.bare_s * 1e3, "ms/step",
                            family_name(p.gpu.architecture)))
        else:
            rows.append(Row(p.label, p.model, p.gpu.id, value, p.throughput(p.step.step_s), p.throughput(p.bare_s),
                            row["metric"][6:], family_name(p.gpu.architecture)))
    return rows, skipped_lines(skipped), unfit


def skipped_lines(skipped: dict[str, int]) -> list[str]:
    return [f"{count:>3} x {why}" for why, count in sorted(skipped.items(), key=lambda item: -item[1])]


# ----------------------------------------------------------------------------- 2b. published multi-GPU rows


MULTI_GPU_SOURCES = frozenset({"LAMBDA_V0"})
"""Multi-GPU rows compared: Lambda's 2-, 4- and 8-GPU machines (one machine each, its own link). NVIDIA's
DGX rows (NV_DLE_*) are 8-GPU only, with no 1-GPU row of the same run to give a scaling efficiency."""


def data_parallel_s(published: Published, p: Predicted, gpus: int) -> tuple[float, Communication]:
    """One rank's step on `gpus` of p's GPU in one machine, under DDP as DeepLearningExamples runs it:
    (seconds, its communication). Lambda v0's runner (pytorch/scripts/benchmark_pytorch.sh) exports
    NCCL_P2P_DISABLE=1 before every model, so NCCL copies between GPUs through host memory: the link is
    hwdb's pcie{gen}-host of the GPU's PCIe generation, not the NVLink or peer-to-peer link the machine has."""
    machines = own_machine(published.db, p.gpu, gpus)
    assert not isinstance(machines, str), machines
    through_host = [i for i in published.db.interconnects if i.id == f"pcie{min(p.gpu.pcie_gen or 3, 5)}-host"]
    if through_host:
        machines = replace(machines, node_link=through_host[0])
    layout = Layout("ddp", gpus, gpus)
    comm = communication(step_collectives(layout, Sharding.of_trace(p.trace), 1), machines, p.step, 1,
                         p.gpu.sm_count)
    return sharded_step(p.step, layout, comm).step_s, comm


def multi_gpu_rows(published: Published) -> tuple[list[Row], list[Row], list[str]]:
    """(aggregate throughput rows, scaling efficiency rows, why rows were skipped) for the multi-GPU rows
    of MULTI_GPU_SOURCES on 2, 4 or 8 GPUs. Throughput's baseline scales our own one-GPU prediction
    linearly (N x one GPU at the row's batch); scaling efficiency is N-GPU throughput / (N x the same
    source's 1-GPU throughput, same GPU, model and precision), measured and predicted, its baseline 1."""
    singles = {(r["source_id"], r["model"], r["gpu"], r["precision"], r["metric"]): r
               for r in published.rows if r["num_gpus"] == "1"}
    throughput, efficiency, skipped = [], [], defaultdict(int)
    for row in published.rows:
        gpus = int(row["num_gpus"])
        if gpus == 1 or row["source_id"] not in MULTI_GPU_SOURCES:
            continue
        if gpus not in (2, 4, 8):
            skipped[f"{gpus} GPUs (2, 4 and 8 compared)"] += 1
            continue
        predicted = published.predict(row)
        if isinstance(predicted, str):
            skipped[predicted] += 1
            continue
        p, value = predicted, float(row["value"])
        step_s, comm = data_parallel_s(published, p, gpus)
        label = f"{p.label} x{gpus}"
        throughput.append(Row(label, p.model, f"{gpus} GPUs", value, gpus * p.throughput(step_s),
                              gpus * p.throughput(p.step.step_s), row["metric"][6:], family_name(p.gpu.architecture)))
        single_row = singles.get((row["source_id"], row["model"], row["gpu"], row["precision"], row["metric"]))
        single = None if single_row is None else published.predict(single_row)
        if single is None or isinstance(single, str):
            continue
        assert single_row is not None
        measured = value / (gpus * float(single_row["value"]))
        ours = gpus * p.throughput(step_s) / (gpus * single.throughput(single.step.step_s))
        efficiency.append(Row(label, p.model, f"{gpus} GPUs", measured, ours, 1.0, "efficiency",
                              family_name(p.gpu.architecture)))
    return throughput, efficiency, skipped_lines(skipped)


# ----------------------------------------------------------------------------- 2d. Lambda v0 BERT, steady rates


LAMBDA_STEADY = REPO / "benchmarks" / "data" / "lambda_v0_bert_steady.csv"
"""Steady-state rates of Lambda v0's BERT runs, read from the runs' own logs (benchmarks/lambda_v0_logs.py)."""


@functools.cache
def lambda_steady() -> dict[tuple[str, str, str, int, int], float]:
    """(Lambda's system name, bert_base|bert_large, FP32|FP16, GPUs, batch per GPU) -> sequences/s."""
    with LAMBDA_STEADY.open(newline="") as handle:
        lines = [line for line in handle if not line.startswith("#")]
    return {(r["system"], r["model"], r["precision"], int(r["num_gpus"]), int(r["batch_size_per_gpu"])):
            float(r["steady_sequences_per_s"]) for r in csv.DictReader(lines)}


def steady_of(row: dict[str, str]) -> float | None:
    """The steady rate the logs of a LAMBDA_V0 BERT row's run show, or None for any other row."""
    if row["source_id"] != "LAMBDA_V0" or not row["model"].startswith("BERT") or not row["batch_size_per_gpu"]:
        return None
    system = row["notes"].split('Lambda system name="', 1)[-1].split('"', 1)[0]
    model = "bert_base" if row["model"].startswith("BERT-base") else "bert_large"
    precision = "FP16" if row["precision"].startswith("FP16") else "FP32"
    return lambda_steady().get((system, model, precision, int(row["num_gpus"]), int(row["batch_size_per_gpu"])))


def steady_rows(published: Published) -> tuple[list[Row], list[Row]]:
    """Lambda v0's BERT rows (one GPU; 2, 4 and 8 GPUs) twice: (against the published figure, against the
    steady rate of the same run's log). The prediction is the one sections 2 and 2b print."""
    as_published, as_logged = [], []
    for row in published.rows:
        steady, gpus = steady_of(row), int(row["num_gpus"])
        if steady is None or gpus not in (1, 2, 4, 8):
            continue
        predicted = published.predict(row)
        if isinstance(predicted, str):
            continue
        step_s = predicted.step.step_s if gpus == 1 else data_parallel_s(published, predicted, gpus)[0]
        ours, bare = gpus * predicted.throughput(step_s), gpus * predicted.throughput(predicted.bare_s)
        label = predicted.label + (f" x{gpus}" if gpus > 1 else "")
        device = "1 GPU" if gpus == 1 else f"{gpus} GPUs"
        family = family_name(predicted.gpu.architecture)
        as_published.append(Row(label, predicted.model, device, float(row["value"]), ours, bare, "sequences_per_s",
                                family))
        as_logged.append(Row(label, predicted.model, device, steady, ours, bare, "sequences_per_s", family))
    return as_published, as_logged


def steady_lines(published: Published) -> list[str]:
    """Section 2d: Lambda v0's BERT rows against the published figures and against their logs' steady rates."""
    as_published, as_logged = steady_rows(published)
    return ["", "2d. Lambda v0 BERT rows against the steady rate in each run's own log (benchmarks/lambda_v0_logs.py)",
            "The published figure is the progress bar's last reading or an average over 22-104 iterations with "
            "warm-up; the tool predicts the steady rate.",
            *table(as_logged), "",
            *summary(as_published, "against the published figures"),
            *summary(as_logged, "against the logs' steady rates"),
            *grouped(as_logged, lambda r: r.device, "against the logs, by GPU count:"),
            *grouped(as_logged, lambda r: r.family, "against the logs, by family:")]


# ----------------------------------------------------------------------------- 2c. newer GPUs (issue #28)


METRIC_UNITS = {
    "train_step_time_ms_median": "ms/step",
    "train_tokens_per_s_per_gpu": "tokens/s/GPU",
    "train_tokens_per_s": "tokens/s",
    "train_samples_per_s": "samples/s",
    "train_images_per_s": "images/s",
    "train_sequences_per_s": "sequences/s",
    "train_tflops_per_gpu": "TFLOP/s/GPU",
}
"""The newer file's metrics and their units. `*_per_gpu` is per GPU; the other throughputs of multi-GPU rows
are aggregates (SOURCES-newer.md), but where a run says its figure is one GPU's (PlanRun.per_gpu: torchtune's)."""


def published_metric(metric: str, step_s: float, samples: int, tokens: int | None, gpus: int, flops: float) -> float:
    """A published metric from one optimizer step of `step_s` seconds that trains `samples` samples over all
    `gpus` GPUs, `tokens` tokens each (None: not a sequence model), `flops` FLOPs on each GPU: milliseconds a
    step, samples or tokens per second (aggregate, or per GPU for *_per_gpu), or TFLOP/s per GPU (the tool's
    MFU numerator: the step's every counted FLOP, recomputation included)."""
    if metric == "train_step_time_ms_median":
        return step_s * 1e3
    if metric == "train_tflops_per_gpu":
        return flops / step_s / 1e12
    per_second = samples * (tokens if metric.startswith("train_tokens") else 1) / step_s
    return per_second / gpus if metric.endswith("_per_gpu") else per_second


def bare_step_seconds(trace: StepTrace, precision: str, gpu: GPUSpec, accumulation: int, shards: int) -> float:
    """The bare roofline of one optimizer step on one GPU: the traced micro-batch's forward and backward
    `accumulation` times, and 1/`shards` of the optimizer (ZeRO and FSDP shard it); no communication."""
    peaks, bandwidth = gpu_peaks(gpu).flops, gpu.bandwidth_bytes_per_s
    micro = bare_roofline_seconds([r for r in trace.records if r.phase != "optimizer"], precision, peaks, bandwidth,
                                  gpu=True)
    optimizer = bare_roofline_seconds([r for r in trace.records if r.phase == "optimizer"], precision, peaks,
                                      bandwidth, gpu=True)
    return micro * accumulation + optimizer / shards


@dataclass(frozen=True)
class Outcome:
    """One newer row predicted: the row to compare, and whether the tool says the run fits its GPUs."""

    row: Row
    fits: bool
    peak_bytes: int
    capacity_bytes: int


def vision_outcome(published: Published, row: dict[str, str], run: VisionRun, gpu: GPUSpec,
                   searched: list[str]) -> Outcome | str:
    """A timm benchmark.py run on one GPU; where the source gives no batch, the largest of 256, 224, ..., 32
    that the tool's memory estimate fits on `gpu` (newer_rows.largest_fitting_batch), noted in `searched`."""
    batch = run.batch
    if batch is None:
        base = Case(run.model, run.size, 0, run.precision, run.optimizer)

        def fits(candidate: int) -> bool:
            memory = published.memory(replace(base, batch=candidate), gpu)
            return not isinstance(memory, str) and memory.fits
        parts = base.parts()
        if isinstance(parts, str):  # timm cannot be imported
            return parts
        batch = largest_fitting_batch(fits)
        if batch is None:
            return "no batch of 256 down to 32 fits (our memory estimate)"
        searched.append(f"{row['source_id']}: {run.model} {run.precision} on {gpu.id}: batch {batch}")
    mark = "~" if run.batch is None else ""
    case = Case(run.model, run.size, batch, run.precision, run.optimizer)
    p = published.predict_case(case, gpu, f"{row['source_id']}: {run.model} b{mark}{batch} {run.precision} on {gpu.id}")
    if isinstance(p, str):
        return p
    return Outcome(Row(p.label, p.model, gpu.id, float(row["value"]), p.throughput(p.step.step_s),
                       p.throughput(p.bare_s), METRIC_UNITS[row["metric"]], family_name(gpu.architecture)),
                   p.fits, p.peak_bytes, gpu.memory_bytes)


def plan_outcome(published: Published, row: dict[str, str], run: PlanRun, gpu: GPUSpec) -> Outcome | str:
    """The run estimated as `advisor estimate` estimates it (app.plan.plan on its PlanRequest; several GPUs
    through estimate_on_gpus with the run's strategy), its two traces kept for the rows that share them."""
    try:
        request = run.request(gpu.id)
        key = request.trace_key()
        print(f"advisor: estimating {row['source_id']} {row['model']} on {gpu.id}", file=sys.stderr, flush=True)
        estimate = plan(request, published.db, traces=published.plans.get(key))
    except UserError as exc:
        return str(exc)
    assert estimate.second is not None
    published.plans[key] = (estimate.trace, estimate.second)
    result = estimate.results[0]
    scaling = result.scaling
    shards = 1 if scaling is None or scaling.layout.strategy == "ddp" else scaling.layout.shards
    tp = 1 if scaling is None else scaling.layout.tp  # the bare roofline splits the whole step over the group
    bare_s = bare_step_seconds(estimate.trace, run.precision, gpu, run.accumulation, shards) / tp
    metric = f"{row['metric']}_per_gpu" if run.per_gpu and not row["metric"].endswith("_per_gpu") else row["metric"]
    measure = functools.partial(published_metric, metric, samples=result.global_batch_size,
                                tokens=run.seq_len, gpus=result.num_gpus, flops=result.step_flops)
    lora = f" r{run.lora}" if run.lora else ""
    micro = f"/{run.micro_batch}" if run.micro_batch and run.micro_batch != run.batch else ""
    tensor = f"+tp{run.tp}" if run.tp > 1 else ""
    where = f"{gpu.id} x{run.gpus} {run.strategy}{tensor}" if run.gpus > 1 else gpu.id
    model = run.model + ("-padded" if run.padding_mask else "")
    label = (f"{row['source_id']}: {model.split('/')[-1]}{lora} b{run.batch}{micro} {run.precision}"
             f"{' ckpt' if run.checkpointing else ''}{' compile' if run.compiled else ''} on {where}")
    return Outcome(Row(label, model, gpu.id, float(row["value"]), measure(result.step.step_s), measure(bare_s),
                       METRIC_UNITS[metric], family_name(gpu.architecture)),
                   result.fits, result.memory.peak_bytes, result.memory.capacity_bytes)


@dataclass(frozen=True)
class Newer:
    """Part newer's results: the rows compared, why the others were skipped (counted), the runs the tool
    calls "does not fit", the batches the search chose and the assumptions made (counted)."""

    rows: list[Row]
    skipped: list[str]
    unfit: list[str]
    searched: list[str]
    assumptions: list[str]


def predict_newer(published: Published) -> Newer:
    """Every row of the newer file the tool can express (newer_rows.run_of), predicted on its GPU(s)."""
    rows, unfit, searched = [], [], []
    skipped: dict[str, int] = defaultdict(int)
    assumptions: dict[str, int] = defaultdict(int)
    for row in read_newer():
        gpu_id = published.labels[row["gpu"]]
        run = run_of(row, published.db.has(gpu_id))
        if isinstance(run, str):
            skipped[run] += 1
            continue
        gpu = published.db.gpu(gpu_id)
        outcome = (vision_outcome(published, row, run, gpu, searched) if isinstance(run, VisionRun)
                   else plan_outcome(published, row, run, gpu))
        if isinstance(outcome, str):
            skipped[outcome] += 1
            continue
        rows.append(outcome.row)
        if isinstance(run, PlanRun) and run.assumption:
            assumptions[run.assumption] += 1
        if not outcome.fits:
            unfit.append(f"{outcome.row.label}: {outcome.peak_bytes / 2**30:.1f} GiB predicted, "
                         f"{outcome.capacity_bytes / 2**30:.1f} GiB card")
    return Newer(rows, skipped_lines(skipped), unfit, searched, skipped_lines(assumptions))


def newer_lines(newer: Newer, tuned: list[Row]) -> list[str]:
    """Part newer's report: every row, medians by source, metric and family, the family table over both files
    (`tuned`: the published single-GPU rows), and what was not fitted, searched, assumed and skipped."""
    rows = newer.rows
    return ["", "2c. Published rows on newer GPUs (../shared/validation/published-throughput-newer.csv), each run as "
                "its source ran it (benchmarks/newer_rows.py)",
            "b~N: batch not published (NikolasEnt 2025), the largest of 256, 224, ..., 32 our memory estimate fits; "
            "b/M: micro-batch M; x N strategy: N GPUs of one machine; bare roofline: no communication",
            *table(rows), "", *summary(rows, "newer rows, all"),
            *grouped(rows, lambda r: r.label.split(":")[0], "by source:"),
            *grouped(rows, lambda r: r.unit, "by metric:"),
            *grouped(rows, lambda r: r.device, "by GPU:"),
            *family_table(rows, "by architecture family, newer rows"),
            *family_table(tuned + rows, "by architecture family, both files (published single-GPU and newer rows)"),
            "", f"called 'does not fit' (each ran on those GPUs; target 0): {len(newer.unfit)} of {len(rows)} rows",
            *(f"  {u}" for u in newer.unfit),
            "", "batches chosen by the search (NikolasEnt 2025: 256, then 32 fewer until it fits):",
            *(f"  {s}" for s in newer.searched),
            "", "assumptions (rows):", *(f"  {a}" for a in newer.assumptions),
            "", f"skipped {sum(int(s.split(' x ')[0]) for s in newer.skipped)} rows:",
            *(f"  {s}" for s in newer.skipped)]


# ----------------------------------------------------------------------------- 3. real GPU runs


GROUNDTRUTH = REPO / "benchmarks" / "results" / "groundtruth"


def gpu_rows() -> tuple[list[Row], list[str]]:
    """Every real run's steps that ran (benchmarks/gpu_groundtruth.py's steps.csv), against the prediction
    for that GPU with the shipped calibration, recomputed with this checkout's code; dry runs are left out."""
    from gpu_groundtruth import predict_folder

    rows, notes = [], []
    for path in sorted(GROUNDTRUTH.glob("*/environment.json")):
        environment = json.loads(path.read_text(encoding="utf-8"))
        if environment.get("dry_run"):
            continue
        predicted = predict_folder(path.parent)
        untraced = [p for p in predicted if p.get("predicted_step_s") is None]
        notes.append(f"{path.parent.name}: {environment['gpu_name']}, driver {environment['driver']}, torch "
                     f"{environment['torch']}: {len(predicted)} rows that ran, {len(untraced)} with no prediction")
        for p in predicted:
            if p.get("predicted_step_s") is None:
                continue
            label = f"{p['model']} b{p['batch']} {p['precision']} {p['layout']} on {environment['gpu_id']}"
            rows.append(Row(label, p["model"], environment["gpu_id"], p["measured_step_s"] * 1e3,
                            p["predicted_step_s"] * 1e3, p["bare_step_s"] * 1e3, "ms/step"))
    return rows, notes


# ----------------------------------------------------------------------------- report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("cpu", "published", "multi", "newer", "gpu", "all"), default="all")
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    parser.add_argument("--summary", type=Path, help="also write the medians to this YAML file (the planning "
                        "report quotes calibration/accuracy.yaml)")
    args = parser.parse_args()
    summaries: dict[str, dict[str, object]] = {}
    lines = [f"gpu-advisor accuracy benchmark, {time.strftime('%Y-%m-%d')}, torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads",
             "error = predicted / measured - 1, for step time (CPU, ms/step) or throughput (published rows); "
             "bare roofline: 75% of peak FLOP/s and bandwidth per op, no calibration"]
    started = time.perf_counter()
    if args.part in ("cpu", "all"):
        rows, notes = cpu_rows()
        lines += ["", "1. This CPU: real training steps (median) vs the --local prediction", *notes, *table(rows), "",
                  *summary(rows, "CPU, all models"),
                  *summary([r for r in rows if r.model in set(available())] or rows,
                           "CPU, held-out models (heldout.py)")]
        summaries["cpu"] = summary_figures(rows, "step time of real training steps on the benchmark machine's CPU "
                                           "against the --local prediction")
    by_family: dict[str, dict[str, object]] = {}
    """Per-family tables for calibration/accuracy.yaml's `by_family`: published, newer, combined."""
    published: Published | None = None
    tuned: list[Row] | None = None
    if args.part in ("published", "all"):
        published = Published()
        tuned, skipped, unfit = published_rows(published)
        rows = tuned
        summaries["published"] = summary_figures(rows, "training throughput of published single-GPU measurements "
                                                 "(vendors' and labs' benchmark pages) against the prediction for that GPU")
        by_family["published"] = {"families": family_figures(rows)}
        lines += ["", "2. Published single-GPU rows (../shared/validation/published-throughput.csv)", *table(rows),
                  "", *summary(rows, "published rows, all"),
                  *grouped(rows, lambda r: r.model, "by model:"),
                  *grouped(rows, lambda r: r.device, "by GPU:"),
                  *grouped(rows, lambda r: r.label.split(":")[0], "by source:"),
                  *family_table(rows, "by architecture family, published single-GPU rows (the tuning set)"),
                  "", f"called 'does not fit' (each ran on that GPU at that batch; target 0): {len(unfit)} of "
                      f"{len(rows)} rows", *(f"  {u}" for u in unfit),
                  "", f"skipped {sum(int(s.split(' x ')[0]) for s in skipped)} rows:", *(f"  {s}" for s in skipped)]
    if args.part in ("multi", "all"):
        published = published or Published()
        rows, efficiency, skipped = multi_gpu_rows(published)
        linear = "linear scaling"
        lines += ["", "2b. Published multi-GPU rows, one machine of 2, 4 or 8 GPUs, DDP (Lambda v0)",
                  "baseline: our one-GPU prediction at the row's batch times N (linear scaling)",
                  *table(rows, "linear"), "", *summary(rows, "multi-GPU throughput, all", linear),
                  *grouped(rows, lambda r: r.device, "by GPU count:", linear),
                  *grouped(rows, lambda r: r.model, "by model:", linear),
                  "", "scaling efficiency = N-GPU throughput / (N x the same source's 1-GPU throughput); baseline 1",
                  *table(efficiency, "linear"), "", *summary(efficiency, "scaling efficiency, all", linear),
                  *grouped(efficiency, lambda r: r.device, "by GPU count:", linear),
                  "", f"skipped {sum(int(s.split(' x ')[0]) for s in skipped)} rows:", *(f"  {s}" for s in skipped)]
        summaries["multi_gpu"] = summary_figures(rows, "aggregate training throughput of published 2-, 4- and 8-GPU "
                                                 "runs (one machine, DDP) against the prediction", "linear_scaling")
        summaries["scaling_efficiency"] = summary_figures(
            efficiency, "scaling efficiency (N-GPU throughput / N x 1-GPU throughput) of the same runs", "linear_scaling")
        lines += steady_lines(published)
    if args.part in ("newer", "all"):
        published = published or Published()
        newer = predict_newer(published)
        if tuned is None:  # the family table over both files needs the tuning set's rows too
            tuned = published_rows(published)[0]
            by_family["published"] = {"families": family_figures(tuned)}
        lines += newer_lines(newer, tuned)
        summaries["newer"] = summary_figures(newer.rows, "training speed of published runs on newer GPUs (Ada, Hopper, "
                                             "Blackwell, with Ampere references; one GPU and up to 8 in one machine) "
                                             "against the prediction for those GPUs")
        by_family["newer"] = {"families": family_figures(newer.rows)}
        by_family["combined"] = {"families": family_figures(tuned + newer.rows)}
    if args.part in ("gpu", "all"):
        rows, notes = gpu_rows()
        lines += ["", "3. Real GPU runs (benchmarks/results/groundtruth/, benchmarks/gpu_groundtruth.py)", *notes]
        if rows:
            lines += [*table(rows), "", *summary(rows, "real GPU runs, all"),
                      *grouped(rows, lambda r: r.model, "by model:"), *grouped(rows, lambda r: r.device, "by GPU:")]
            summaries["gpu"] = summary_figures(rows, "step time of real training steps on GPUs "
                                               "(benchmarks/gpu_groundtruth.py) against the prediction for that GPU")
        else:
            lines.append("none measured yet: run benchmarks/gpu_groundtruth.py on a GPU (docs/gpu-ground-truth.md)")
    lines.append(f"\n({time.perf_counter() - started:.0f} s)")
    print_report(lines, args.out)
    if args.summary:
        # a part run on its own replaces its figures only, stamped with its own date and command
        stamp = {"date": time.strftime("%Y-%m-%d"), "torch": str(torch.__version__),
                 "command": f"python benchmarks/accuracy.py --part {args.part}"}
        whole = args.part == "all" or not args.summary.is_file()
        document = dict(stamp) if whole else yaml.safe_load(args.summary.read_text())
        for part, figures in summaries.items():
            document[part] = figures if args.part == "all" else {**figures, **stamp}
        if by_family:  # per-family tables: this run's replace theirs, each stamped as a part is
            tables = {} if whole else dict(document.get("by_family") or {})
            tables["bar"] = {"median_abs_error_at_most": FAMILY_BAR, "rows_at_least": FAMILY_BAR_ROWS}
            for name, table_figures in by_family.items():
                tables[name] = table_figures if args.part == "all" else {**table_figures, **stamp}
            document["by_family"] = tables
        args.summary.write_text(yaml.safe_dump(document, sort_keys=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

