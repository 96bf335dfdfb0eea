"""The settings form's text as numbers, and the first request's traces started before the app.

The form becomes an advisor.app PlanRequest (estimate_screen.py), estimated by the same `plan` as
`advisor estimate`; mistakes raise UserError with the sentences the command line gives."""

from __future__ import annotations

import math
from typing import Any

from advisor.app.plan import TracePair, request_model
from advisor.app.request import PlanRequest
from advisor.errors import UserError
from advisor.memory.plan import trace_both_batches
from advisor.profile.background import ForkedCall, can_fork


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


def prefetch_traces(request: PlanRequest) -> ForkedCall[TracePair] | None:
    """Start tracing the first request's step in a forked child, before the app starts its threads:
    the child, single-threaded, can fork again for the 2x-batch trace (advisor.profile.background),
    which a worker thread of the running app cannot. None where forking is not possible or the model
    does not load (the worker then reports that in the app)."""
    if not can_fork():
        return None
    try:
        model = request_model(request)
        settings = request.memory_settings(model)
    except UserError:
        return None
    return ForkedCall(lambda: trace_both_batches(model, settings), may_fork_again=True)
