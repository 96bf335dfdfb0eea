"""A long trace says how far it got, and stops at a deadline (issue #22: one model traced for 48 minutes
without a word; Hugging Face Mamba's reference scan runs one small op per token and state).

The tracer calls `TraceWatch.tick` on every op it sees: every REPORT_EVERY_S seconds it reports the ops
traced so far, the phase and the module; past the deadline it raises a UserError that names them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from advisor.errors import UserError

REPORT_EVERY_S = 5.0
"""Seconds between two progress lines of one trace."""
DEFAULT_TRACE_TIMEOUT_S = 900.0
"""The command line's --trace-timeout: a 70B model's step traces in about 75 CPU-seconds here."""


@dataclass
class TraceWatch:
    """Progress and deadline of one model's traces (every attempt of trace_training_step counts)."""

    timeout_s: float | None = None
    """None or 0: no deadline."""
    progress: Callable[[str], None] | None = None
    source: str | None = None
    started: float = field(default_factory=lambda: time.monotonic())
    ops: int = 0
    _next_report: float = 0.0

    def __post_init__(self) -> None:
        self._next_report = self.started + REPORT_EVERY_S

    def silent(self) -> TraceWatch:
        """This watch, its deadline and count of ops, without progress reports (for a child's trace)."""
        return replace(self, progress=None)

    @property
    def expired(self) -> bool:
        """Whether the deadline has passed."""
        return bool(self.timeout_s) and time.monotonic() - self.started > self.timeout_s

    def report(self, message: str) -> None:
        """Pass one line of progress on (what the trace does next)."""
        if self.progress is not None:
            self.progress(message)

    def tick(self, phase: str, module: Callable[[], str]) -> None:
        """One op traced in `phase`; `module` names the module it ran in (called only when needed)."""
        self.ops += 1
        if self.ops % 64:  # the clock is read every 64 ops: a few microseconds per 64
            return
        now = time.monotonic()
        if self.timeout_s and now - self.started > self.timeout_s:
            where = module() or "the model itself"
            raise UserError(
                f"{self.source or 'the model'}: tracing stopped at --trace-timeout {self.timeout_s:g} s after "
                f"{self.ops:,} ops ({phase}, in {where}); a step this long usually loops in Python over tokens "
                "or time steps: trace a shorter sequence or a smaller configuration, or raise --trace-timeout "
                "(0: no limit)"
            )
        if self.progress is not None and now >= self._next_report:
            self._next_report = now + REPORT_EVERY_S
            self.progress(f"tracing: {self.ops:,} ops in {now - self.started:.0f} s ({phase}, in "
                          f"{module() or 'the model itself'})")
