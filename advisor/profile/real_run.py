"""The training step run for real on this CPU, for models whose control flow reads values computed
from their weights (issue #22).

Fake tensors have shapes and no values. The tracer answers what it can without values (shapes.py,
finite.py) and computes for real what depends on the inputs alone (trace.py's real-inputs fallback),
but some models branch on values their weights produce: torchvision's Faster and Mask R-CNN keep the
proposals that are large enough (`torch.where(keep)` in `remove_small_boxes`), DETR's loss checks its
predicted boxes and matches them to targets with scipy's Hungarian algorithm, Wav2Vec2's SpecAugment
indexes with a boolean mask through backward. For them the step runs on real tensors on this CPU, with
the weights the model's own constructor initialises (random, from a fixed seed, so every run traces
the same step), under the same dispatch modes as a fake trace: every op is recorded with its cost and
every storage with its life. What depends on values gets the answer a freshly initialised model
gives (how many boxes survive, which targets match): a trained model's counts differ, which the
output says.

It costs real memory and time, so it runs only when the weights with their gradients and optimizer
state (REAL_RUN_STATE_COPIES copies of them) fit in a 1/REAL_RUN_MEMORY_SHARE share of the available
memory, and stops with one sentence when the live tensors of the step outgrow that share.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from advisor import units
from advisor.errors import UserError
from advisor.probe.cpu import available_memory_bytes

REAL_RUN_MEMORY_SHARE = 4
"""A real run may use 1/4 of the available memory: the estimate traces two batches at once (one in a
forked child), and the machine keeps running what it ran."""

FALLBACK_AVAILABLE_BYTES = 8 * 2**30
"""Memory assumed available where /proc/meminfo cannot be read."""

REAL_RUN_STATE_COPIES = 4
"""Copies of the weights alive through a real step: weights, gradients and Adam's two moments."""

TRACE_SEED = 0
"""The seed of every trace's random numbers (torch, Python's random, numpy when loaded)."""


def real_run_budget_bytes() -> int:
    """Bytes a run on real CPU tensors may hold: a share of the memory available now."""
    return (available_memory_bytes() or FALLBACK_AVAILABLE_BYTES) // REAL_RUN_MEMORY_SHARE


def gib(nbytes: float) -> str:
    """Bytes as GiB with one decimal and the unit: "3.5 GiB"."""
    return f"{nbytes / units.GIB:.1f} GiB"


class RealRunTooLarge(UserError):
    """The step, run for real, outgrew its share of this machine's memory."""


def check_weights_fit(weight_bytes: int, why: str, source: str | None) -> int:
    """The budget (bytes) of a real run whose weights take `weight_bytes`; RealRunTooLarge when they,
    their gradients and optimizer state do not fit in it. `why` says why the run is needed."""
    budget = real_run_budget_bytes()
    needed = REAL_RUN_STATE_COPIES * weight_bytes
    if needed > budget:
        raise RealRunTooLarge(
            f"{source or 'the model'} {why}, and running its step for real on this CPU would need about "
            f"{gib(needed)} for weights, gradients and optimizer state, over 1/{REAL_RUN_MEMORY_SHARE} of the "
            f"available memory ({gib(budget)}); make that branch depend on shapes or inputs only, or plan on "
            "a machine with more memory")
    return budget


def too_large_during_step(live_bytes: int, budget: int, batch_size: int, why: str,
                          source: str | None) -> RealRunTooLarge:
    """The error of a real run whose live tensors reached `live_bytes` over `budget`."""
    return RealRunTooLarge(
        f"{source or 'the model'} {why}, and its step run for real on this CPU at batch {batch_size} outgrew "
        f"1/{REAL_RUN_MEMORY_SHARE} of the available memory ({gib(live_bytes)} live, {gib(budget)} allowed); "
        "try a smaller --batch-size or a machine with more memory")


@contextmanager
def seeded_random_numbers(seed: int = TRACE_SEED) -> Iterator[None]:
    """Torch's, Python's and (when loaded) numpy's global random numbers drawn from `seed` within the
    block, as they were after it: a model that draws random numbers (dropout masks it reads, Wav2Vec2's
    SpecAugment and layerdrop) traces the same step on every run."""
    numpy = sys.modules.get("numpy")
    python_state = random.getstate()
    numpy_state = numpy.random.get_state() if numpy is not None else None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        if numpy is not None:
            numpy.random.seed(seed)
        try:
            yield
        finally:
            random.setstate(python_state)
            if numpy is not None:
                numpy.random.set_state(numpy_state)
