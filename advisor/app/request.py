"""One estimate as any interface asks for it: the command line's flags, the TUI's form, a Python
caller's arguments. Checked when made, with the sentences every interface shows (issue #23)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from advisor import units
from advisor.errors import UserError
from advisor.limits import (
    MAX_BATCH_SIZE,
    MAX_CONTEXT_MIB,
    MAX_EPOCHS,
    MAX_HOURS,
    MAX_JOB_SAMPLES,
    MAX_JOB_TOKENS,
    MAX_LORA_RANK,
    MAX_NUM_GPUS,
    MAX_SEQ_LEN,
    MAX_TRACE_TIMEOUT_S,
    MAX_USD,
    MAX_VCPUS_PER_GPU,
    MAX_WORKERS,
)
from advisor.paths import file_stamp
from advisor.profile.choices import (
    BASE_WEIGHTS,
    BF16_BASE_PRECISIONS,
    DEFAULT_PRECISION,
    LANGUAGE_MODEL_PRECISION,
    OPTIMIZER_CHOICES,
    PRECISIONS,
    precision_of,
)
from advisor.profile.watch import DEFAULT_TRACE_TIMEOUT_S

if TYPE_CHECKING:  # these import torch; a request is made before any is needed
    from advisor.estimate.costs import Job
    from advisor.estimate.plan import EstimateSettings
    from advisor.memory.plan import MemorySettings
    from advisor.profile.adapters import Adaptation
    from advisor.profile.model_file import ModelFile

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class PlanRequest:
    """Everything one estimate depends on. None means the default: the model file's BATCH_SIZE,
    optimizer() and TRAIN_SAMPLES where it has them, every GPU, every provider."""

    model: str | None = None
    """A model file path or a built-in example name; None: the resnet50 example."""
    batch_size: int | None = None
    """Samples per optimizer step."""
    precision: str | None = None
    """A --precision name; None: amp-bf16 for a language model (one with a sequence length), else fp32."""
    optimizer: str | None = None
    """An optimizer name, "file" (the model file's optimizer(params)); None: that when defined, else adamw."""
    checkpointing: bool = False
    """Activation checkpointing of the model's repeated blocks."""
    compiled: bool = False
    """The step as torch.compile runs it: fused kernels (estimate/fusion.py)."""
    sync_each_step: bool = False
    """The training loop reads a value back every step (`loss.item()` for a log): the host cannot run ahead."""
    micro_batch: int | None = None
    """Samples per forward/backward (gradient accumulation up to batch_size)."""
    cuda_context_mib: float | None = None
    """The CUDA context's size instead of the database's figure, MiB."""
    trace_timeout_s: float = DEFAULT_TRACE_TIMEOUT_S
    """Stop a trace that takes longer, seconds (0: no limit)."""
    gpus: tuple[str, ...] = ()
    """GPU ids of the database to estimate; (): all of them."""
    num_gpus: int | None = None
    """GPUs of each type the job runs on, data-parallel (batch_size is then each GPU's); None: one, with
    the fewest that fit beside it."""
    parallel: str = "auto"
    """How several GPUs share the job: PARALLEL_CHOICES ("auto": the fastest strategy that fits)."""
    tp: int | None = None
    """Tensor-parallel degree (--tp K, with --parallel tp)."""
    local: bool = False
    """Also this machine's devices, timed from its calibration."""
    samples: int | None = None
    """Samples in one epoch."""
    epochs: float | None = None
    """Passes over the samples (None: 1)."""
    steps: int | None = None
    """Optimizer steps instead of samples x epochs."""
    tokens: int | None = None
    """The job in tokens (sequences of seq_len tokens) instead of samples or steps."""
    seq_len: int | None = None
    """Tokens per sample; None: the model file's SEQ_LEN (its example_input must take seq_len)."""
    padding_mask: bool = False
    """A model by name's batches are padded: its inputs carry an attention mask with zeros over the padding
    (ModelFile.with_padding_mask), so attention runs masked over every position."""
    packing: int | None = None
    """Each sequence is packed from documents of this many tokens, attention running within each document
    (estimate/packing.py); None: not packed. Not a trace field: the trace is the same, its attention timed
    over documents."""
    provider: str | None = None
    """Only this provider's cloud offers."""
    spot: bool = False
    """Rank cost by spot prices."""
    budget_usd: float | None = None
    """The fastest device within this cost is named."""
    deadline_hours: float | None = None
    """The cheapest device done within this time is named."""
    max_price_usd: float | None = None
    """The fastest card that costs at most this to buy is named (a purchase budget)."""
    lora: int | None = None
    """LoRA adapters of this rank; the rest of the model frozen (profile/adapters.py)."""
    lora_targets: tuple[str, ...] = ()
    """Names of the Linear layers LoRA adapts ("all-linear": every one but the head); (): the attention defaults."""
    lora_dropout: float | None = None
    """peft's lora_dropout of the adapters (--lora-dropout; None: 0, no dropout)."""
    base_weights: str | None = None
    """How the frozen base is stored (BASE_WEIGHTS); None: bf16 under amp-bf16 with --lora, else as
    the precision stores weights."""
    plans: str = "auto"
    """The fit advisor (app/fit.py): "auto" searches when nothing fits, "always" also for faster or cheaper
    ways, "never" not at all."""
    input_pipeline: bool = field(default_factory=lambda: input_pipeline_default())
    """Time the input pipeline on this machine (the file's dataset(), else a built-in one) and weigh each
    GPU's host's supply of samples against the GPU's demand (advisor.pipeline)."""
    workers: int | None = None
    """DataLoader workers per GPU; None: every vCPU of the GPU's share of its host but the training's."""
    vcpus_per_gpu: float | None = None
    """vCPUs per GPU of the host for every GPU; None: each GPU's priced instance's, else this machine's."""
    host_cpu: str | None = None
    """The host's CPU for every GPU (an id of hwdb/host-cpus.yaml); None: each GPU's instance's."""

    def __post_init__(self) -> None:
        if self.precision is not None and self.precision not in PRECISIONS:
            raise UserError(f"unknown precision '{self.precision}'; choose one of {', '.join(PRECISIONS)}")
        if self.optimizer is not None and self.optimizer not in OPTIMIZER_CHOICES:
            raise UserError(f"unknown optimizer '{self.optimizer}'; choose one of {', '.join(OPTIMIZER_CHOICES)}")
        for name, value in (("batch size", self.batch_size), ("micro-batch", self.micro_batch)):
            _check_whole(name, value, MAX_BATCH_SIZE)
        _check_whole("samples", self.samples, MAX_JOB_SAMPLES)
        _check_whole("steps", self.steps, MAX_JOB_SAMPLES)
        _check_whole("tokens", self.tokens, MAX_JOB_TOKENS)
        _check_whole("sequence length", self.seq_len, MAX_SEQ_LEN)
        _check_whole("--packing", self.packing, MAX_SEQ_LEN)
        if self.packing is not None and self.padding_mask:
            raise UserError("--packing and --padding-mask do not combine: packed sequences carry no padding "
                            "(their documents' boundaries go to attention instead of a mask); choose one")
        _check_whole("workers", self.workers, MAX_WORKERS)
        self._check_parallel()
        _check_positive("vCPUs per GPU", self.vcpus_per_gpu, MAX_VCPUS_PER_GPU)
        if self.vcpus_per_gpu is not None and self.vcpus_per_gpu < 1:
            raise UserError(f"vCPUs per GPU must be at least 1, got {self.vcpus_per_gpu:g}")
        if not self.input_pipeline and (self.workers is not None or self.vcpus_per_gpu is not None
                                        or self.host_cpu is not None):
            raise UserError("--workers, --vcpus-per-gpu and --host-cpu describe the input pipeline: "
                            "drop --no-input-pipeline")
        for name, value, limit in (("epochs", self.epochs, MAX_EPOCHS), ("budget", self.budget_usd, MAX_USD),
                                   ("deadline", self.deadline_hours, MAX_HOURS),
                                   ("max card price", self.max_price_usd, MAX_USD)):
            _check_positive(name, value, limit)
        _check_positive("CUDA context MiB", self.cuda_context_mib, MAX_CONTEXT_MIB, zero_allowed=True)
        _check_positive("trace timeout", self.trace_timeout_s, MAX_TRACE_TIMEOUT_S, zero_allowed=True)
        if self.steps is not None and (self.samples is not None or self.epochs is not None):
            raise UserError("give either --steps or --samples/--epochs, not both")
        if self.tokens is not None and (self.steps is not None or self.samples is not None):
            raise UserError("give one of --tokens, --samples or --steps for the job, not several")
        if self.micro_batch is not None and self.batch_size is not None:
            self.check_micro_batch(self.batch_size)
        self._check_adaptation()
        if self.plans not in PLAN_MODES:
            raise UserError(f"unknown --plans '{self.plans}'; choose one of {', '.join(PLAN_MODES)}")

    def _check_parallel(self) -> None:
        _check_whole("number of GPUs", self.num_gpus, MAX_NUM_GPUS)
        _check_whole("tensor-parallel degree", self.tp, MAX_NUM_GPUS)
        if self.parallel not in PARALLEL_CHOICES:
            raise UserError(f"unknown --parallel '{self.parallel}'; choose one of {', '.join(PARALLEL_CHOICES)}")
        if (self.tp or 1) > 1 and (self.num_gpus or 1) % self.tp:
            raise UserError(f"--tp {self.tp} splits each layer over {self.tp} GPUs: give --num-gpus N with N a "
                            f"multiple of {self.tp}")
        if self.tp is not None and self.tp > 1 and self.parallel == "hsdp":
            raise UserError("--parallel hsdp does not combine with --tp: use --parallel fsdp --tp K (fsdp between "
                            "the tensor-parallel groups)")
        if self.parallel != "auto" and (self.num_gpus or 1) == 1:
            raise UserError(f"--parallel {self.parallel} splits a job over GPUs: give their number with --num-gpus N")

    def _check_adaptation(self) -> None:
        _check_whole("LoRA rank", self.lora, MAX_LORA_RANK)
        if self.lora_targets and self.lora is None:
            raise UserError("--lora-targets names the layers of LoRA adapters: give their rank with --lora RANK")
        if self.lora_dropout is not None:
            if self.lora is None:
                raise UserError("--lora-dropout is the dropout of LoRA adapters: give their rank with --lora RANK")
            if not 0.0 <= self.lora_dropout < 1.0:
                raise UserError(f"--lora-dropout is a probability from 0 up to 1 (peft's lora_dropout, such as 0.05), "
                                f"got {self.lora_dropout:g}")
        if any(not name.strip() for name in self.lora_targets):
            raise UserError("--lora-targets: give layer names separated by commas, such as q_proj,v_proj")
        if self.base_weights is not None and self.base_weights not in BASE_WEIGHTS:
            raise UserError(f"unknown --base-weights '{self.base_weights}'; choose one of {', '.join(BASE_WEIGHTS)}")
        if self.base_weights == "bf16" and self.precision is not None and self.precision not in BF16_BASE_PRECISIONS:
            raise UserError(f"--base-weights bf16 needs 16-bit math: --precision {self.precision} computes in fp32; "
                            f"use --precision {' or '.join(BF16_BASE_PRECISIONS)}")

    def precision_for(self, model: ModelFile) -> str:
        """--precision, else LANGUAGE_MODEL_PRECISION for a model with a sequence length, else fp32."""
        if self.precision is not None:
            return self.precision
        return LANGUAGE_MODEL_PRECISION if model.seq_len is not None else DEFAULT_PRECISION

    def adaptation(self, precision: str) -> Adaptation:
        """--lora, --lora-targets and --base-weights; with --lora under amp-bf16 (or fp8) the frozen base is bf16 unless
        --base-weights says otherwise (from_pretrained(torch_dtype=torch.bfloat16), as fine-tuning scripts load
        it; under pure bf16 it is bf16 anyway)."""
        from advisor.profile.adapters import Adaptation

        base = self.base_weights
        if base is None and self.lora is not None and precision_of(precision).autocast == "bf16":
            base = "bf16"
        return Adaptation(self.lora, self.lora_targets, base, self.lora_dropout or 0.0)

    def check_micro_batch(self, batch_size: int) -> None:
        """A UserError when the micro-batch is larger than `batch_size` or does not divide it."""
        from advisor.memory.plan import uneven_micro_batches

        assert self.micro_batch is not None
        if self.micro_batch > batch_size:
            raise UserError(f"--micro-batch {self.micro_batch} is larger than the batch size {batch_size}; "
                            "a micro-batch is a part of the batch")
        if batch_size % self.micro_batch:
            raise UserError(uneven_micro_batches(batch_size, self.micro_batch))

    @property
    def deadline_s(self) -> float | None:
        return None if self.deadline_hours is None else self.deadline_hours * SECONDS_PER_HOUR

    def memory_settings(self, model: ModelFile) -> MemorySettings:
        """How the step runs for `model`: its default batch and optimizer where the request has none."""
        from advisor.memory.plan import MemorySettings

        context = None if self.cuda_context_mib is None else int(self.cuda_context_mib * units.MIB)
        precision = self.precision_for(model)
        return MemorySettings(self.batch_size or model.default_batch_size, precision,
                              model.resolve_optimizer(self.optimizer), self.checkpointing, self.micro_batch,
                              context, self.trace_timeout_s or None, self.adaptation(precision))

    def job(self, model: ModelFile) -> Job:
        """The job: steps, or samples x epochs (the file's TRAIN_SAMPLES where none are given)."""
        from advisor.estimate.costs import Job

        if self.steps is not None:
            return Job(steps=self.steps)
        tokens, origin = self.tokens, "--tokens"
        if tokens is None and self.samples is None and model.train_tokens is not None:
            tokens = model.train_tokens
            origin = "the default job of a model by name" if model.origin else "the model file's TRAIN_TOKENS"
        if tokens is None:
            return Job.over_samples(self.samples, self.epochs or 1.0, model.train_samples)
        if model.seq_len is None:
            raise UserError(f"a job in tokens needs the sequence length: {model.source} has no SEQ_LEN; "
                            "give --seq-len")
        sequences = -(-tokens // model.seq_len)
        return Job(samples=sequences, epochs=self.epochs or 1.0,
                   origin=f"{origin}: {tokens:,} tokens in sequences of {model.seq_len:,}")

    def settings(self, model: ModelFile) -> EstimateSettings:
        from advisor.estimate.plan import EstimateSettings

        if self.packing is not None and model.seq_len is None:
            raise UserError(f"--packing packs documents into sequences: {model.source} has no sequence length "
                            "(SEQ_LEN); give --seq-len or a language model")
        return EstimateSettings(self.memory_settings(model), self.job(model), self.spot, model.seq_len,
                                self.assumptions(model), self.workers, self.vcpus_per_gpu, self.host_cpu,
                                self.num_gpus, self.parallel, self.compiled, self.tp, self.sync_each_step,
                                self.padding_mask, self.packing)

    def assumptions(self, model: ModelFile) -> tuple[str, ...]:
        """What was chosen for the user, as phrases for the settings line."""
        chosen = []
        precision = self.precision_for(model)
        if self.precision is None and precision != DEFAULT_PRECISION:
            chosen.append(f"{precision} assumed for a language model (--precision)")
        if self.base_weights is None and self.adaptation(precision).base_weights == "bf16":
            chosen.append("frozen base in bf16, as fine-tuning scripts load it (--base-weights)")
        return tuple(chosen)

    def trace_key(self) -> tuple[Any, ...]:
        """What the traced step depends on: TRACE_FIELDS' values and, for a model file, its file_stamp()
        (inode, size, modification time: an edited file traces again). Equal keys: the traces can be reused."""
        path = Path(self.model).expanduser() if self.model else None
        stamp = file_stamp(path) if path is not None and path.is_file() else None
        return tuple(getattr(self, name) for name in TRACE_FIELDS) + (stamp,)

    def traces_differ(self, other: PlanRequest) -> bool:
        """Whether `other`'s step traces differently (TRACE_FIELDS differ): else its traces can be reused."""
        return any(getattr(self, name) != getattr(other, name) for name in TRACE_FIELDS)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(self)}


def input_pipeline_default() -> bool:
    """Whether estimates time the input pipeline unless told: yes, but where $GPU_ADVISOR_INPUT_PIPELINE is
    "off" (the test suite's setting: a timed pipeline makes figures vary from run to run)."""
    return os.environ.get("GPU_ADVISOR_INPUT_PIPELINE", "on").lower() != "off"


PARALLEL_CHOICES = ("auto", "ddp", "zero1", "zero2", "fsdp", "hsdp", "tp")
"""--parallel (PRODUCT.md): "auto" and parallel.strategy.STRATEGIES (a test compares), and "tp"."""

PLAN_MODES = ("auto", "always", "never")
"""--plans: when the fit advisor searches."""

TRACE_FIELDS = ("model", "batch_size", "precision", "optimizer", "checkpointing", "micro_batch", "seq_len", "lora",
                "lora_targets", "base_weights", "padding_mask", "lora_dropout")
"""The request's fields a traced step depends on; the others (devices, prices, job, budget) only
change what is done with it."""

OPTIONS = tuple(f.name for f in fields(PlanRequest))
"""Every option of an estimate; each interface exposes all of them (tests compare)."""


def _check_whole(name: str, value: int | None, limit: int) -> None:
    if value is not None and value < 1:
        raise UserError(f"{name} must be at least 1, got {value}")
    if value is not None and value > limit:
        raise UserError(f"{name} must be at most {limit:,}, got {value:,.3g}")


def _check_positive(name: str, value: float | None, limit: float, zero_allowed: bool = False) -> None:
    if value is None:
        return
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_allowed):
        raise UserError(f"{name} must be a positive{' (or zero)' if zero_allowed else ''} number, got {value:g}")
    if value > limit:
        raise UserError(f"{name} must be at most {limit:.0e}, got {value:.3g}")
