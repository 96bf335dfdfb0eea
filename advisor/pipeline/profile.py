"""A model's input pipeline measured on this machine (issue #27): its samples' cost on one thread and this
machine's DataLoader mechanics, remembered for the rest of the process (the TUI re-estimates often)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from advisor.paths import user_cache_dir
from advisor.pipeline.datasets import pipeline_for
from advisor.pipeline.machine import load, mechanics
from advisor.pipeline.measure import measure_samples
from advisor.pipeline.supply import PipelineProfile
from advisor.profile.model_file import ModelFile

MEASURING_BATCH = 32
"""Samples per batch when collation is timed (the cost per sample hardly depends on it)."""

_MEASURED: dict[tuple[str, str, int | None], PipelineProfile] = {}


def pipeline_cache() -> Path:
    """Where the built-in pipelines' files and the DataLoader mechanics are kept."""
    return user_cache_dir() / "pipeline"


def measure_pipeline(model: ModelFile, progress: Callable[[str], None] = lambda message: None) -> PipelineProfile:
    """`model`'s input pipeline (its dataset(), else the built-in one for its inputs) timed on this machine."""
    key = (model.fingerprint or model.source, model.source, model.seq_len)
    known = _MEASURED.get(key)
    if known is not None:
        return known
    cache = pipeline_cache()
    pipeline = pipeline_for(model.dataset, model.example_input, model.source, cache)
    progress(f"timing the input pipeline: {pipeline.describe}")
    timing = measure_samples(pipeline.make(), MEASURING_BATCH)
    loader = load(cache)
    if loader is None:
        progress("timing this machine's DataLoader on a synthetic pipeline (once: it is stored)")
        loader = mechanics(cache)
    measured = PipelineProfile(pipeline.kind, pipeline.describe, timing, loader, pipeline.read_bytes_per_sample)
    _MEASURED[key] = measured
    return measured
