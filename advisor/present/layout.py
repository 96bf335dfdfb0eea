"""Channels-last advice: what NCHW tensors cost a device's step and how much faster channels-last ones would
make it. Shared by the command line's summary, the report's recommendations and the TUI's device panel."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch: only once an estimate exists
    from advisor.estimate.plan import DeviceEstimate, Estimate

LAYOUT_TIP_SHARE = 0.05
"""Channels-last tensors are suggested where they would make the step this much faster or more."""


def channels_last_advice(estimate: Estimate, result: DeviceEstimate) -> str | None:
    """"would make each step 8% faster: in NCHW, ..." (said of channels-last tensors) where they would shorten
    `result`'s step by LAYOUT_TIP_SHARE or more (estimate.plan.channels_last_saving: the step timed again with
    no op paying for NCHW, the host's queue deciding), naming what NCHW tensors cost there: cuDNN's
    transposes, batch norm's per-channel blocks, or both; None otherwise (a device the model does not fit)."""
    from advisor.estimate.plan import channels_last_saving

    step = result.step
    if not result.fits or not step.step_s or not step.channels_first_s:
        return None
    saving = channels_last_saving(estimate, result) / step.step_s
    if saving < LAYOUT_TIP_SHARE:
        return None
    causes = [cause for seconds, cause in (
        (step.layout_s, "cuDNN transposes them to NHWC and back around tensor-core convolutions"),
        (step.channels_first_s - step.layout_s, "batch norm reduces them one thread block per channel"))
        if seconds > 0]
    return (f"would make each step {saving:.0%} faster: in NCHW, {' and '.join(causes)} "
            "(model.to(memory_format=torch.channels_last), and the inputs likewise)")
