"""plan() of Llama-3.2-1B and Llama-3-70B over every GPU in one process with the trace cache on (the default),
the traces read back from disk at each call (trace_cache.MEMO_ENTRIES = 0, as before 2026-11-28) against
kept in memory after the first read, interleaved (issue #24). Seconds, medians of ROUNDS.

    python benchmarks/trace_memo_ab.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

MODELS = ("hf:llama-3.2-1b", "hf:llama-3.1-70b")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("GPU_ADVISOR_CACHE_DIR", tempfile.mkdtemp(prefix="trace-memo-"))
    os.environ["GPU_ADVISOR_TRACE_CACHE"] = "on"
    from advisor.app.plan import plan
    from advisor.app.request import PlanRequest
    from advisor.hardware.loader import load_hwdb
    from advisor.profile import trace_cache

    db = load_hwdb()
    requests = {spec: PlanRequest(model=spec, plans="never") for spec in MODELS}
    for request in requests.values():  # trace once and store; read back once
        plan(request, db)
        plan(request, db)
    times = {(mode, spec): [] for mode in ("disk", "memory") for spec in MODELS}
    for _ in range(args.rounds):
        for mode in ("disk", "memory"):
            trace_cache.MEMO_ENTRIES = 0 if mode == "disk" else 6
            trace_cache._memo.clear()
            for spec, request in requests.items():
                if mode == "memory":
                    plan(request, db)  # the first read fills the memory
                started = time.perf_counter()
                plan(request, db)
                times[(mode, spec)].append(time.perf_counter() - started)
    for mode in ("disk", "memory"):
        small, large = (statistics.median(times[(mode, spec)]) for spec in MODELS)
        print(f"traces read from {mode:<6}: 1B {small:.3f} s, 70B {large:.3f} s, 70B / 1B {large / small:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
