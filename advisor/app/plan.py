"""`plan(request)`: load the model, trace its step, estimate it on every requested device. The one
call behind `advisor estimate`, `advisor report`, the TUI and Python users (issue #23)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from advisor.app.request import PlanRequest
from advisor.errors import UserError
from advisor.hardware.specs import GPUSpec, HardwareDB
from advisor.profile.choices import precision_of
from advisor.profile.model_file import ModelFile, load_model_file

if TYPE_CHECKING:  # torch: only once a model is traced
    from advisor.app.fit import FitPlan
    from advisor.estimate.plan import Estimate
    from advisor.estimate.targets import CalibrationProgress, EstimateTarget
    from advisor.memory.plan import MemoryPlan
    from advisor.pipeline.supply import PipelineProfile

Progress = Callable[[str], None]
TracePair = tuple["StepTrace", "StepTrace"]


def _quiet(message: str) -> None:
    """Progress nobody listens to."""


def request_model(request: PlanRequest) -> ModelFile:
    """The request's model file (or built-in example), loaded and checked, its inputs --seq-len long
    when the request sets one and padded under --padding-mask; with its batch, the micro-batch is checked as
    the request alone could not."""
    model = load_model_file(request.model)
    if request.micro_batch is not None and request.batch_size is None:
        request.check_micro_batch(model.default_batch_size)
    if request.seq_len is not None:
        model = model.with_seq_len(request.seq_len)
    return model.with_padding_mask() if request.padding_mask else model


def request_gpus(request: PlanRequest, db: HardwareDB) -> list[GPUSpec]:
    """The request's GPUs, each once (a UserError with the closest ids for an unknown one); every GPU
    of the database when it names none. Under --precision fp8 only GPUs with fp8 tensor cores: a named
    one without them is a UserError, the database's others are left out."""
    named = [db.gpu(gpu_id) for gpu_id in dict.fromkeys(request.gpus)]
    if not wants_fp8(request):
        return named or list(db.gpus)
    lacking = [gpu for gpu in named if not has_fp8(gpu)]
    if lacking:
        alike = [gpu.id for gpu in db.gpus if has_fp8(gpu) and (gpu.vendor, gpu.segment) ==
                 (lacking[0].vendor, lacking[0].segment)][:3]
        raise UserError(f"--precision fp8: {', '.join(gpu.id for gpu in lacking)} "
                        f"{'has' if len(lacking) == 1 else 'have'} no fp8 tensor cores (NVIDIA's Ada, Hopper and "
                        f"Blackwell GPUs have them{', e.g. ' + ', '.join(alike) if alike else ''}); use --precision "
                        "amp-bf16 there")
    return [gpu for gpu in named or db.gpus if has_fp8(gpu)]


def wants_fp8(request: PlanRequest) -> bool:
    """Whether the request trains Linear layers in float8 (--precision fp8)."""
    return request.precision is not None and precision_of(request.precision).float8


def has_fp8(gpu: GPUSpec) -> bool:
    """Whether the GPU has fp8 tensor cores (a dense fp8 figure in the hardware database)."""
    return gpu.peaks.fp8_tensor is not None


def targets_for(request: PlanRequest, db: HardwareDB, notify: Progress = _quiet,
                calibration_bar: CalibrationProgress | None = None) -> list[EstimateTarget]:
    """The devices to estimate: the request's GPUs (all when none), and this machine's first with
    `local` (a quick calibration is measured and cached when none is; `notify` and `calibration_bar`
    hear about it)."""
    from advisor.calibration.reference import load_families
    from advisor.estimate.targets import database_targets, local_targets

    families = load_families(db)
    targets = database_targets(db, request_gpus(request, db), families)
    if request.local:
        local = local_targets(db, families, notify, calibration_bar)
        lacking = [target.name for target in local if wants_fp8(request) and "fp8" not in target.device.profile.peaks.flops]
        if lacking:
            raise UserError(f"--precision fp8 needs fp8 tensor cores and {lacking[0]} has none; leave out --local "
                            "or use --precision amp-bf16")
        targets = local + targets
    return targets


def plan(request: PlanRequest, db: HardwareDB, progress: Progress = _quiet, traces: TracePair | None = None, *,
         notify: Progress | None = None, calibration_bar: CalibrationProgress | None = None) -> Estimate:
    """Trace the request's step (or use `traces`: the step at its batch and at twice it) and estimate
    it on every device, with the job's time and money. `progress` hears each stage; `notify` and
    `calibration_bar` a local calibration's messages and progress (default: `progress`)."""
    from advisor.estimate.plan import estimate_model

    db = db.with_offers_from(request.provider)
    progress(f"loading {request.model or 'the resnet50 example'}")
    model = request_model(request)
    settings = request.settings(model)
    if request.host_cpu is not None:
        db.host_cpu_named(request.host_cpu)  # an unknown id: one sentence with the closest ones
    targets = targets_for(request, db, notify or progress, calibration_bar)  # after the cheap checks
    first, second = traces or (None, None)
    pipeline = input_pipeline(request, model, progress)
    return estimate_model(model, db, targets, settings, progress=progress, trace=first, second=second,
                          pipeline=pipeline)


def input_pipeline(request: PlanRequest, model: ModelFile, progress: Progress = _quiet) -> PipelineProfile | None:
    """The model's input pipeline timed on this machine (advisor.pipeline), unless the request turns it off."""
    if not request.input_pipeline:
        return None
    from advisor.pipeline.profile import measure_pipeline

    return measure_pipeline(model, progress)


def advisor_runs(request: PlanRequest, estimate: Estimate) -> bool:
    """Whether the fit advisor searches for `estimate`: always, or (auto) when nothing fits."""
    return request.plans == "always" or (request.plans == "auto" and not estimate.fitting)


def advise(request: PlanRequest, db: HardwareDB, estimate: Estimate, progress: Progress = _quiet) -> tuple[FitPlan, ...]:
    """The fit advisor's plans for `estimate` (the request's own) as request.plans says: when nothing fits
    ("auto"), also faster or cheaper ways ("always"), none ("never")."""
    from advisor.app.fit import fit_plans

    if not advisor_runs(request, estimate):
        return ()
    return fit_plans(request, db.with_offers_from(request.provider), estimate, request.plans == "always", progress)


def plan_memory_only(request: PlanRequest, db: HardwareDB, progress: Progress = _quiet) -> MemoryPlan:
    """The request's training memory on its GPUs (all when none), without timing (`advisor memory`)."""
    from dataclasses import replace

    from advisor.estimate.parallel import LayoutMemory, sharded_memory
    from advisor.memory.plan import plan_memory

    model = request_model(request)
    gpus = request_gpus(request, db)
    settings = request.memory_settings(model)
    memory = plan_memory(model, db, gpus, settings, progress=progress)
    if (request.num_gpus or 1) == 1:
        return memory
    assert memory.trace is not None
    layouts = LayoutMemory(memory.trace, memory.second)
    layouts.check_splittable(request.parallel, request.tp, model.source)
    sharded, skipped = sharded_memory(layouts, db, gpus, request.num_gpus or 1, request.parallel,
                                      settings.cuda_context_bytes, request.tp)
    if not sharded:
        raise UserError(f"no machine runs {request.num_gpus} of the GPUs asked for: " +
                        "; ".join(f"{gpu_id}: {why}" for gpu_id, why in skipped[:3]))
    return replace(memory, sharded=tuple(sharded), unsharded=tuple(skipped))
