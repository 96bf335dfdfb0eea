"""How much of a traced step the cost formulas count (issue #22): ops with no formula have their bytes
but no FLOPs, so a step made of them (a grouped GEMM of mixture-of-experts layers, an LSTM's fused
cells) would be predicted too fast without a word. Every interface reports this, and warns when the
uncounted work may exceed COVERAGE_WARNING_SHARE of the step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the command line imports this before torch is needed
    from advisor.profile.trace import StepTrace

COVERAGE_WARNING_SHARE = 0.01
"""Warn when ops without a formula move at least this share of the step's bytes..."""
COMPUTE_HINTS = ("mm", "conv", "lstm", "gru", "rnn", "attention", "einsum", "matmul", "linear", "ctc")
"""...or when one of them is named like work that is mostly FLOPs, whose bytes say little."""


@dataclass(frozen=True)
class Coverage:
    """Ops of a traced step that no cost formula counts."""

    ops: int
    uncounted: dict[str, int]
    """Op name -> calls, for ops without a FLOP formula."""
    uncounted_bytes: int
    """Bytes those ops read and write."""
    total_bytes: int

    @property
    def uncounted_ops(self) -> int:
        return sum(self.uncounted.values())

    @property
    def counted_fraction(self) -> float:
        """Share of the traced ops that have a formula."""
        return 1.0 - self.uncounted_ops / self.ops if self.ops else 1.0

    @property
    def bytes_share(self) -> float:
        return self.uncounted_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def compute_like(self) -> tuple[str, ...]:
        """Uncounted ops named like FLOP-heavy work."""
        return tuple(op for op in self.uncounted if any(hint in op.lower() for hint in COMPUTE_HINTS))

    @property
    def may_matter(self) -> bool:
        return bool(self.uncounted) and (self.bytes_share >= COVERAGE_WARNING_SHARE or bool(self.compute_like))

    def warning(self) -> str | None:
        """One sentence when the uncounted work may exceed COVERAGE_WARNING_SHARE of the step, else None."""
        if not self.may_matter:
            return None
        named = ", ".join(f"{op} x{calls}" for op, calls in sorted(self.uncounted.items(), key=lambda kv: -kv[1])[:4])
        more = f" and {len(self.uncounted) - 4} more" if len(self.uncounted) > 4 else ""
        return (f"Warning: {self.uncounted_ops} of {self.ops} traced ops have no cost formula ({named}{more}); "
                f"they move {self.bytes_share:.1%} of the step's bytes and their FLOPs are not counted, "
                "so step times may be too low")

    def to_dict(self) -> dict[str, Any]:
        return {"ops": self.ops, "uncounted_ops": dict(self.uncounted),
                "counted_fraction": self.counted_fraction,
                "uncounted_share": self.bytes_share,  # PRODUCT.md's name for it
                "uncounted_bytes_fraction": self.bytes_share, "warning": self.warning()}


def trace_summary(trace: StepTrace) -> dict[str, Any]:
    """How the step was traced, for --json: values ("fake", "fake+real-inputs", "real"), construction
    ("fake", "meta"), the note a real run carries (StepTrace.values_note), else None, and the repeated
    blocks replicated from traced ones (their number, and each run: "layers.0..31: 32 blocks, 29 replicated")."""
    return {"values": trace.values, "construction": trace.construction, "note": trace.values_note(),
            "replicated_blocks": trace.replicated_blocks, "repeated": list(trace.repeated)}


def trace_notes(trace: StepTrace) -> list[str]:
    """The lines an interface ends with: the coverage warning, the real-run note and the fused-scan note, those
    that apply."""
    return [note for note in (coverage_of(trace).warning(), trace.values_note(), fused_scan_note(trace)) if note]


def fused_scan_note(trace: StepTrace) -> str | None:
    """What a trace whose Mamba scans were costed as mamba_ssm's fused kernel assumes (profile/selective_scan.py)."""
    scans = sum(record.op == "selective_scan" for record in trace.records)
    if not scans:
        return None
    return (f"Mamba's selective scans ({scans} per step) are estimated as mamba_ssm's fused kernel, as GPUs train "
            "them: without mamba_ssm installed, transformers runs them as a loop over the tokens, many times slower")


def coverage_of(trace: StepTrace) -> Coverage:
    """The coverage of the trace's ops."""
    uncounted = [r for r in trace.records if not r.counted]
    return Coverage(len(trace.records), trace.uncounted(),
                    sum(r.bytes_read + r.bytes_written for r in uncounted), trace.bytes_moved())
