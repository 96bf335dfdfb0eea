"""The notes an estimate ends with in every interface: what the figures rest on that the user should know."""

from __future__ import annotations

from typing import TYPE_CHECKING

from advisor.profile.coverage import trace_notes

if TYPE_CHECKING:  # the estimate imports torch: not for light commands
    from advisor.estimate.plan import Estimate


def estimate_notes(estimate: Estimate) -> list[str]:
    """One sentence each, those that apply: ops with no cost formula that may matter, a step run on real values
    (profile.coverage.trace_notes), and --packing that changes nothing for attention made of matrix products
    (estimate.packing.unpacked_attention_note)."""
    from advisor.estimate.packing import unpacked_attention_note  # imports torch: not for light commands

    settings = estimate.settings
    packing = unpacked_attention_note(estimate.trace, settings.packing, settings.seq_len)
    return trace_notes(estimate.trace) + ([packing] if packing else [])
