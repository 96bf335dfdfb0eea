"""Traced steps kept on disk between runs (issue #24): the second `advisor estimate` of a model with the same
settings does not trace it again.

A trace is stored under a key that hashes everything it depends on: the model's fingerprint (its file and
the Python files beside it, or a named model's config and the transformers version: ModelFile.fingerprint),
the step's settings (batch, precision, optimizer, checkpointing, accumulation, attention path, adapters,
sequence length), the torch version and the source of the tracer itself (every file of advisor/profile), so
an edited model, another torch or a new version of the tool traces again. A model without a fingerprint is
not cached.

Files live in `<cache>/traces/` (the calibration cache's folder: $GPU_ADVISOR_CACHE_DIR, $XDG_CACHE_HOME or
~/.cache, then gpu-advisor) as `<key>.trace`: one line of JSON (format, schema, key, the payload's length
and SHA-256), then the pickled StepTrace. A file is used only when it is a regular file owned by this user
and writable by no one else (pickle runs code: a file someone else could have written is never read), of a
sane size, with this format, schema and key, whose payload has its length and checksum and unpickles to a
StepTrace; anything else is deleted and the step traced again. Writes are atomic (advisor.atomic). At most
MAX_ENTRIES files (traces and layouts) and MAX_TOTAL_BYTES are kept, the least recently used dropped first.

Beside a trace pair, `<key>.layouts` keeps what the multi-GPU planner re-played from it: each layout's
per-rank memory (estimate.parallel.LayoutMemory), under a key that adds the source of the code that sizes
layouts (advisor/memory, advisor/parallel, advisor/estimate), with the same checks.

$GPU_ADVISOR_TRACE_CACHE=off turns the cache off (the test suite does, but for the tests of this module).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from advisor import pickled
from advisor.paths import file_stamp, user_cache_dir
from advisor.pickled import source_digest
from advisor.profile.trace import StepTrace

FORMAT = "gpu-advisor-trace"
SCHEMA = 1
SUFFIX = ".trace"
LAYOUTS_SUFFIX = ".layouts"
"""Each layout's memory re-played from a cached trace pair (see the module docstring)."""
MAX_FILE_BYTES = 512 * 2**20
"""A trace of the 70B model is about 2 MB; a file over this is not one of ours."""
MAX_ENTRIES = 48
MAX_TOTAL_BYTES = 1024 * 2**20
ENVIRONMENT = "GPU_ADVISOR_TRACE_CACHE"


def enabled() -> bool:
    return pickled.switched_on(ENVIRONMENT)


def cache_folder() -> Path:
    return user_cache_dir() / "traces"


@lru_cache(maxsize=1)
def tracer_fingerprint() -> str:
    """SHA-256 of the tracer's source (every .py file of advisor/profile) and the torch version."""
    return source_fingerprint("profile")


@lru_cache(maxsize=4)
def source_fingerprint(*packages: str) -> str:
    """SHA-256 of the torch version and of pickled.source_digest (the Python version, every .py file of the
    advisor's `packages`, "profile")."""
    return hashlib.sha256(f"{torch.__version__}|{source_digest(*packages)}".encode()).hexdigest()


def trace_key(fingerprint: str, **settings: Any) -> str | None:
    """The key of a trace of the model with `fingerprint` at `settings` (JSON-able values, or dataclasses);
    None when the model has no fingerprint or the cache is off."""
    if not fingerprint or not enabled():
        return None
    described = {name: asdict(value) if hasattr(value, "__dataclass_fields__") else value
                 for name, value in sorted(settings.items())}
    text = json.dumps({"format": FORMAT, "schema": SCHEMA, "tracer": tracer_fingerprint(), "model": fingerprint,
                       "settings": described}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


MEMO_ENTRIES = 6
"""Traces (StepTrace, immutable) this process keeps after reading them, the most recently used: a planning
loop in one process (the TUI, a script) asks for the same two or three traces of a model at each call, and
reading and unpickling them again took 0.10-0.29 s of a 0.66-0.79 s re-estimate of Llama-3-70B over every GPU
(benchmarks/trace_memo_ab.py, 2026-11-28). Six hold two models' traces."""

_memo: OrderedDict[str, tuple[tuple[int, int, int], Any]] = OrderedDict()
"""A file's path -> (its file_stamp() when read, the object read from it), the most recently used last."""
_memo_lock = threading.Lock()
"""The TUI estimates in worker threads."""


def load(key: str | None, suffix: str = SUFFIX, kind: type = StepTrace) -> Any:
    """The trace (or, with `suffix` and `kind`, the other object of that type) stored under `key`, or None
    (nothing there, or a file that fails a check: then deleted). A StepTrace this process read before from
    the same, unchanged file is served from memory (MEMO_ENTRIES)."""
    if key is None:
        return None
    path = cache_folder() / f"{key}{suffix}"
    trace = _remembered(path)
    if trace is None:
        try:
            trace = _read(path, key, kind)
        except FileNotFoundError:
            return None
        except pickled.READ_ERRORS:
            pickled.discard(path)
            return None
    pickled.touch(path)
    if kind is StepTrace:
        _remember(path, trace)
    return trace


def _remembered(path: Path) -> Any:
    """The object read from `path` before, when the file is still the one it was read from; else None."""
    with _memo_lock:
        entry = _memo.pop(str(path), None)
    if entry is None or file_stamp(path) != entry[0]:
        return None
    return entry[1]


def _remember(path: Path, trace: Any) -> None:
    stamp = file_stamp(path)
    if stamp is None:
        return
    with _memo_lock:
        _memo[str(path)] = (stamp, trace)
        while len(_memo) > MEMO_ENTRIES:
            _memo.popitem(last=False)


def _header(key: str) -> dict[str, Any]:
    return {"format": FORMAT, "schema": SCHEMA, "key": key}


def _read(path: Path, key: str, kind: type) -> Any:
    return pickled.read(path, _header(key), kind, MAX_FILE_BYTES)


def store(key: str | None, trace: Any, suffix: str = SUFFIX) -> bool:
    """Keep `trace` (or another picklable object, with its `suffix`) under `key`; False when the cache is off
    or its folder cannot be written (the run goes on without it: a cache is never a reason to fail)."""
    if key is None or trace is None:
        return False
    folder = cache_folder()
    try:
        pickled.write(folder / f"{key}{suffix}", _header(key), trace)
        _evict(folder)
    except OSError:  # no room, read-only: the next run traces again
        return False
    return True


def _evict(folder: Path) -> None:
    """Drop the least recently used traces beyond MAX_ENTRIES or MAX_TOTAL_BYTES."""
    pickled.keep_newest([*folder.glob(f"*{SUFFIX}"), *folder.glob(f"*{LAYOUTS_SUFFIX}")], MAX_ENTRIES,
                        MAX_TOTAL_BYTES)
