"""A model's input pipeline measured on this machine (issue #27): its samples' cost on one thread and this
machine's DataLoader mechanics, remembered for the rest of the process (the TUI re-estimates often) and
stored in the user's cache when steady (`pipeline/timings/<key>.json`, keyed by the model's fingerprint,
the pipeline, this machine and torch): a stored timing serves for MAX_AGE_S (a model file's own dataset()
reads data the fingerprint does not cover: a day; the built-in pipelines: 30 days)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

from advisor.paths import user_cache_dir
from advisor.pipeline.datasets import pipeline_for
from advisor.pipeline.machine import fingerprint, mechanics
from advisor.pipeline.measure import SampleTiming, measure_samples
from advisor.pipeline.storage import storage_rate
from advisor.pipeline.stored import read_recent, write_document
from advisor.pipeline.supply import PipelineProfile
from advisor.profile.model_file import ModelFile

MEASURING_BATCH = 32
"""Samples per batch when collation is timed (the cost per sample hardly depends on it)."""

FORMAT = "gpu-advisor-pipeline-timing"
SCHEMA = 2

MAX_AGE_S = {"file": 86_400.0, "images": 30 * 86_400.0, "tokens": 30 * 86_400.0, "tensors": 30 * 86_400.0}
"""How long a stored timing serves, by pipeline kind (seconds)."""

MAX_STORED_SPREAD = 0.25
"""Largest (slowest - fastest) / median of a timing's rounds for it to be stored."""

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
    stored_at = _timing_path(cache, model, pipeline.kind, pipeline.describe)
    timing = _stored_timing(stored_at, pipeline.kind)
    if timing is None:
        progress(f"timing the input pipeline: {pipeline.describe}")
        timing = measure_samples(pipeline.make(), MEASURING_BATCH)
        if stored_at is not None and timing.spread <= MAX_STORED_SPREAD:
            write_document(stored_at, FORMAT, SCHEMA, {"measured_at": time.time(), "kind": pipeline.kind,
                                                       "timing": timing.to_dict()})
    loader = mechanics(cache, progress)
    read = max(pipeline.read_bytes_per_sample, timing.read_bytes)
    storage = storage_rate(cache, read, loader.cpus, progress) if read > 0 else None
    measured = PipelineProfile(pipeline.kind, pipeline.describe, timing, loader, read, storage)
    _MEASURED[key] = measured
    return measured


def _timing_path(cache: Path, model: ModelFile, kind: str, describe: str) -> Path | None:
    """Where `model`'s pipeline timing is stored (None: a model without a fingerprint is not stored)."""
    if not model.fingerprint:
        return None
    key = json.dumps([model.fingerprint, model.seq_len, kind, describe, fingerprint()])
    return cache / "timings" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def _stored_timing(path: Path | None, kind: str) -> SampleTiming | None:
    """The timing stored at `path` if it is recent enough for its kind, else None."""
    body = None if path is None else read_recent(path, FORMAT, SCHEMA, MAX_AGE_S.get(kind, 0.0))
    if body is None:
        return None
    try:
        fields = body["timing"]
        timing = SampleTiming(float(fields["sample_s"]), float(fields["collate_s"]), int(fields["batch"]),
                              float(fields["sample_bytes"]), tuple(float(r) for r in fields["rounds_s"]),
                              float(fields["read_bytes"]))
    except (ValueError, KeyError, TypeError):
        return None
    return timing if timing.sample_s > 0 else None
