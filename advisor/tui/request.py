"""What the settings form asks for, checked and turned into an estimate (run in a worker thread).

The form's raw text becomes an EstimateRequest; `run_request` loads the model file, builds the targets
and calls the same `estimate_model` as `advisor estimate`. Mistakes raise UserError with the same
sentences the command line gives."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from advisor.calibration.reference import load_families
from advisor.errors import UserError
from advisor.estimate.costs import SECONDS_PER_HOUR, Job
from advisor.estimate.plan import Estimate, EstimateSettings, estimate_model
from advisor.estimate.targets import EstimateTarget, database_targets, local_targets
from advisor.hardware.specs import HardwareDB
from advisor.limits import MAX_BATCH_SIZE, MAX_EPOCHS, MAX_HOURS, MAX_JOB_SAMPLES, MAX_USD
from advisor.memory.plan import MemorySettings, trace_both_batches
from advisor.profile.background import ForkedCall, can_fork
from advisor.profile.model_file import ModelFile, load_model_file
from advisor.profile.trace import StepTrace, check_step_settings

ALL_PROVIDERS = "all providers"


@dataclass(frozen=True)
class EstimateRequest:
    """One estimate as the form describes it. None: the default (model's batch, TRAIN_SAMPLES...)."""

    model: str | None = None
    """A model file path or a built-in example name; None: the resnet50 example."""
    batch_size: int | None = None
    precision: str = "fp32"
    optimizer: str = "adamw"
    samples: int | None = None
    epochs: float = 1.0
    budget_usd: float | None = None
    deadline_hours: float | None = None
    provider: str | None = None
    spot: bool = False
    local: bool = False

    def __post_init__(self) -> None:
        check_step_settings(self.precision, self.optimizer, self.batch_size)
        if self.batch_size is not None and self.batch_size > MAX_BATCH_SIZE:
            raise UserError(f"batch size must be at most {MAX_BATCH_SIZE:,}, got {self.batch_size:.3g}")
        if self.samples is not None and not 1 <= self.samples <= MAX_JOB_SAMPLES:
            raise UserError(f"samples must be from 1 to {MAX_JOB_SAMPLES:.0e}, got {self.samples:.3g}")
        for name, value, limit in (("epochs", self.epochs, MAX_EPOCHS), ("budget", self.budget_usd, MAX_USD),
                                   ("deadline", self.deadline_hours, MAX_HOURS)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise UserError(f"{name} must be a positive number, got {value:g}")
            if value is not None and value > limit:
                raise UserError(f"{name} must be at most {limit:.0e}, got {value:.3g}")

    @property
    def deadline_s(self) -> float | None:
        return None if self.deadline_hours is None else self.deadline_hours * SECONDS_PER_HOUR


def parse_number(text: str, kind: type, what: str, default: Any = None) -> Any:
    """The form field's text as an int or float; empty text is `default`."""
    text = text.strip().replace(",", "").replace("_", "")
    if not text:
        return default
    try:
        value = kind(text)
    except (ValueError, OverflowError):
        raise UserError(f"{what}: '{text[:30]}' is not a{'n integer' if kind is int else ' number'}") from None
    if kind is float and not math.isfinite(value):
        raise UserError(f"{what}: '{text[:30]}' is not a finite number")
    return value


def settings_for(request: EstimateRequest, model: ModelFile) -> EstimateSettings:
    """The estimate's settings: the form's, with the model's default batch and job where left empty."""
    batch = request.batch_size or model.default_batch_size
    job = Job.over_samples(request.samples, request.epochs, model.train_samples)
    return EstimateSettings(MemorySettings(batch, request.precision, request.optimizer), job, request.spot)


TracePair = tuple[StepTrace, StepTrace]


def prefetch_traces(request: EstimateRequest) -> ForkedCall[TracePair] | None:
    """Start tracing the first request's step in a forked child, before the app starts its threads:
    the child, single-threaded, can fork again for the 2x-batch trace (advisor.profile.background),
    which a worker thread of the running app cannot. None where forking is not possible or the model
    does not load (the worker then reports that in the app)."""
    if not can_fork():
        return None
    try:
        model = load_model_file(request.model)
        settings = settings_for(request, model).memory
    except UserError:
        return None
    return ForkedCall(lambda: trace_both_batches(model, settings), may_fork_again=True)


def run_request(request: EstimateRequest, db: HardwareDB, progress: Callable[[str], None],
                traces: TracePair | None = None) -> Estimate:
    """Load the model, trace it (or use `traces`, the step at the batch and at twice it) and estimate
    every device (seconds: run it in a worker)."""
    db = db.with_offers_from(request.provider)
    progress(f"loading {request.model or 'the resnet50 example'}")
    model = load_model_file(request.model)
    settings = settings_for(request, model)
    families = load_families(db)
    targets: list[EstimateTarget] = database_targets(db, list(db.gpus), families)
    if request.local:
        targets = local_targets(db, families, progress) + targets
    first, second = traces or (None, None)
    return estimate_model(model, db, targets, settings, progress=progress, trace=first, second=second)
