"""Every model of the built-in Hugging Face catalog (advisor/profile/hf_catalog) builds and traces a LoRA
fine-tuning step through `hf:`, and its parameter count matches the one its model card publishes.

    python benchmarks/catalog_coverage.py        # a few minutes on 2 cores (70B models trace 80 layers)

Per model: the parameters of the traced model (all of them: frozen ones and the adapters) against catalog.yaml's
`params_b` (the card's figure, often rounded: phi-1.5's "1.3B" counts no output head), the trainable LoRA
parameters, and the trace's wall time beside a bare FakeTensorMode forward of the same model in the same run.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from advisor.profile import hub
from advisor.profile.adapters import Adaptation
from advisor.profile.model_file import load_hub_model
from advisor.profile.trace import trace_training_step

SEQ_LEN = 128
RANK = 16


def bare_forward_s(model_file) -> float:
    """Seconds of build + forward on fake tensors alone (the baseline)."""
    started = time.perf_counter()
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model_file.build_model()
        model(**model_file.example_input(1, seq_len=SEQ_LEN))
    return time.perf_counter() - started


def main() -> int:
    rows, ratios, failures = [], [], []
    for model_id, entry in hub.catalog().items():
        model = load_hub_model(f"hf:{model_id}")
        started = time.perf_counter()
        try:
            trace = trace_training_step(model.build_model, lambda b: model.example_input(b, seq_len=SEQ_LEN), 1,
                                        "amp-bf16", "adamw", model.loss_fn, model.source,
                                        adaptation=Adaptation(RANK, (), "bf16"))
        except Exception as exc:  # noqa: BLE001 - a benchmark reports every model's outcome
            failures.append(f"{model_id}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        traced_s = time.perf_counter() - started
        bare_s = bare_forward_s(model)
        ratio = trace.total_params / 1e9 / entry["params_b"]
        ratios.append(abs(ratio - 1))
        rows.append(f"{model_id:40} {trace.total_params / 1e9:8.3f} {entry['params_b']:7.2f} {ratio - 1:+7.1%} "
                    f"{trace.params / 1e6:9.2f} {traced_s:7.1f} {bare_s:6.1f} {traced_s / bare_s:5.1f}x")
        print(rows[-1], flush=True)
    print(f"\n{len(rows)} of {len(rows) + len(failures)} catalog models traced a LoRA r={RANK} step at "
          f"{SEQ_LEN} tokens; parameters vs the card: median |difference| {statistics.median(ratios):.1%}, "
          f"within 3%: {sum(r <= 0.03 for r in ratios)}")
    for failure in failures:
        print("FAILED", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    print(f"{'model':40} {'params B':>8} {'card B':>7} {'diff':>7} {'LoRA M':>9} {'trace s':>7} {'bare s':>6} ratio")
    sys.exit(main())
