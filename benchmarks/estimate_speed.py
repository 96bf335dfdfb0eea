"""Speed of `advisor estimate` over the whole database, beside a bare FakeTensorMode + FlopCounterMode pass of
the same model (build it on fake tensors, forward and backward under torch's FLOP counter: what any tracer of
the full model pays) measured in the same run, and Llama-3-70B against Llama-3.2-1B (issue #24).

Each figure is the median of --repeats runs (the first call: of --first-repeats; the runs compared taken in
turn, round by round), three ways:
- fresh processes, timed from outside (imports count), peak RSS from the kernel: `advisor estimate MODEL --json
  --plans never` with the trace cache off (cold: everything traced), the same with the trace cache filled by a
  run before (warm: a repeated estimate), the default `--plans auto` cold (the fit advisor's searches count),
  and `--bare MODEL` (this file's bare pass); the input pipeline's timing off throughout (it is cached apart,
  a day, and a fresh cache folder timed it again: not what this measures);
- in a fresh process after the imports both sides pay alike (torch, and `torch._dynamo`, which
  FakeTensorMode's constructor imports: about 1.3 s here, measured in the same run): the first call of
  `plan()` (our own imports and the database's loading included) and of the bare pass, and the first call
  with the database parsed from its YAML (GPU_ADVISOR_DATA_CACHE=off: a machine's first run);
- in one long-lived process, as the TUI runs: `plan()` and the bare pass in turn, medians of STEADY_ROUNDS
  rounds after two that warm it up.

The tool's modules are compiled to bytecode first, as `pip install` leaves them.

Llama-3-70B is hf:llama-3.1-70b: the same 80 layers, widths and vocabulary (the 3.1 config adds RoPE scaling).

    python benchmarks/estimate_speed.py [--repeats 3] [--out benchmarks/results/estimate_speed.txt]
"""

from __future__ import annotations

import argparse
import compileall
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from printed import print_report

MODELS = {
    "7b": ("llama", "the 7B example (Llama 2 7B layout), batch 1 x 2,048 tokens, amp-bf16"),
    "1b": ("hf:llama-3.2-1b", "Llama-3.2-1B, batch 8 x 2,048 tokens, amp-bf16"),
    "70b": ("hf:llama-3.1-70b", "Llama-3-70B (hf:llama-3.1-70b), batch 8 x 2,048 tokens, amp-bf16"),
}
BARS = {"7b / bare": 0.5, "70b / 1b": 1.5}


def bare_pass(spec: str) -> float:
    """Build `spec` on fake tensors and run its forward (under autocast bf16, as estimated) and backward
    under FlopCounterMode; the FLOPs counted."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from advisor.profile.model_file import load_model_file
    from advisor.profile.trace import call_model, default_loss

    model_file = load_model_file(spec)
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model_file.build_model()
        inputs = model_file.example_input(model_file.default_batch_size)
        with FlopCounterMode(display=False) as counter:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                output = call_model(model, inputs)
                loss = (model_file.loss_fn or default_loss)(output, inputs)
            loss.backward()
    return counter.get_total_flops()


def fresh(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in GB) of `python ARGV` in a fresh process."""
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, 2), process.stderr.read().decode() if process.stderr else status  # 2: fits nowhere
    return wall, usage.ru_maxrss * 1024 / 1e9


def median_of(repeats: int, argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    runs = [fresh(argv, env) for _ in range(repeats)]
    return statistics.median(w for w, _ in runs), max(r for _, r in runs)


def medians_in_turn(repeats: int, runs: dict[str, tuple[list[str], dict[str, str]]]) -> dict[str, tuple[float, float]]:
    """Per name, (median wall seconds, peak RSS GB) of `repeats` fresh processes of its (argv, env), the names
    run in turn in each round: a host whose speed drifts over minutes slows them alike."""
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, (argv, env) in runs.items():
            found[name].append(fresh(argv, env))
    return {name: (statistics.median(w for w, _ in got), max(r for _, r in got)) for name, got in found.items()}


SHARED_IMPORTS = "import torch, torch._dynamo, torch._subclasses.fake_tensor, torch.utils.flop_counter"
"""What any fake-tensor tracer imports before it starts (FakeTensorMode's constructor imports torch._dynamo)."""


def first_call(spec: str, kind: str) -> float:
    """Seconds of the first `plan()` ("plan": our imports, the database and the estimate) or bare pass
    ("bare") in this process, after SHARED_IMPORTS."""
    exec(SHARED_IMPORTS)
    started = time.perf_counter()
    if kind == "plan":
        from advisor.app.plan import plan
        from advisor.app.request import PlanRequest
        from advisor.hardware.loader import load_hwdb
        plan(PlanRequest(model=spec, plans="never"), load_hwdb())
    else:
        bare_pass(spec)
    return time.perf_counter() - started


STEADY_ROUNDS = 9
"""Rounds of plan() then the bare pass timed in one process, after two that warm it up: the host's speed
drifts within a run (on this shared VM the same call took 1.2 s and 1.7 s minutes apart, and 1.0 s to 1.8 s
within one minute on 2026-11-29), so the figures are medians of interleaved calls (9: a median that two
slow rounds out of five no longer move)."""


def interleaved(works: dict[str, Callable[[], object]]) -> dict[str, list[float]]:
    """Seconds of each of `works`, called in turn for 2 + STEADY_ROUNDS rounds in this process; the two
    warm-up rounds left out."""
    times: dict[str, list[float]] = {name: [] for name in works}
    for _ in range(2 + STEADY_ROUNDS):
        for name, work in works.items():
            started = time.perf_counter()
            work()
            times[name].append(time.perf_counter() - started)
    return {name: seconds[2:] for name, seconds in times.items()}


def planner(spec: str) -> Callable[[], object]:
    """plan() of `spec` over every GPU with the fit advisor off, the database loaded once."""
    from advisor.app.plan import plan
    from advisor.app.request import PlanRequest
    from advisor.hardware.loader import load_hwdb

    db = load_hwdb()
    request = PlanRequest(model=spec, plans="never")
    return lambda: plan(request, db)


def in_process(spec: str) -> tuple[float, float]:
    """(plan() seconds, bare pass seconds) in one long-lived process: medians of STEADY_ROUNDS interleaved
    calls after two warm-up rounds."""
    times = interleaved({"plan": planner(spec), "bare": lambda: bare_pass(spec)})
    return statistics.median(times["plan"]), statistics.median(times["bare"])


def in_process_pair(small: str, large: str) -> tuple[float, float, float]:
    """(plan() seconds of `small`, of `large`, the median of their ratio per round) in one long-lived process,
    the two models' calls interleaved: STEADY_ROUNDS rounds after two warm-up rounds. Models timed in turn
    see the same host; timed minutes apart, a drifting host moved the ratio by a third."""
    times = interleaved({"small": planner(small), "large": planner(large)})
    return (statistics.median(times["small"]), statistics.median(times["large"]),
            statistics.median(b / a for a, b in zip(times["small"], times["large"])))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--first-repeats", type=int, default=7,
                        help="rounds of the first call (a short run: more rounds, a steadier median)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--bare", help=argparse.SUPPRESS)
    parser.add_argument("--in-process", help=argparse.SUPPRESS)
    parser.add_argument("--first", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--pair", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--pair-cached", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        bare_pass(args.bare)
        return 0
    if args.first:
        os.environ["GPU_ADVISOR_TRACE_CACHE"] = "off"
        print(first_call(*args.first))
        return 0
    if args.in_process:
        os.environ["GPU_ADVISOR_TRACE_CACHE"] = "off"
        print(*in_process(args.in_process))
        return 0
    if args.pair:
        os.environ["GPU_ADVISOR_TRACE_CACHE"] = "off"
        print(*in_process_pair(*args.pair))
        return 0
    if args.pair_cached:  # the trace cache on, as users run it (its folder: GPU_ADVISOR_CACHE_DIR)
        print(*in_process_pair(*args.pair_cached))
        return 0
    # as `pip install` leaves it: the tool's modules compiled to bytecode once (a host or a checkout that writes
    # no .pyc, PYTHONDONTWRITEBYTECODE, compiles them again in every fresh process: 0.3 s of the 7B's first call)
    compileall.compile_dir(Path(__file__).resolve().parent.parent / "advisor", quiet=1)
    # the input pipeline's timing has a cache of its own (a day): in the fresh cache folder of the warm runs it
    # was measured again each time (10 s here, where its spread was too high to store), which is not the trace
    pipeline_off = {**os.environ, "GPU_ADVISOR_INPUT_PIPELINE": "off"}
    cold = {**pipeline_off, "GPU_ADVISOR_TRACE_CACHE": "off"}
    cache = tempfile.mkdtemp(prefix="trace-cache-")
    warm = {**pipeline_off, "GPU_ADVISOR_TRACE_CACHE": "on", "GPU_ADVISOR_CACHE_DIR": cache}
    me = str(Path(__file__).resolve())
    imports = statistics.median(fresh(["-c", SHARED_IMPORTS], cold)[0] for _ in range(args.repeats))
    rows: dict[str, dict[str, float]] = {}
    for key, (spec, _) in MODELS.items():
        estimate = ["-m", "advisor", "estimate", spec, "--json", "--plans", "never"]
        row = rows[key] = {}
        fresh(estimate, warm)  # fills the trace cache
        timed = medians_in_turn(args.repeats, {"bare": ([me, "--bare", spec], cold), "cold": (estimate, cold),
                                               "warm": (estimate, warm)})
        for name, (seconds, rss) in timed.items():
            row[name], row[f"{name}_rss"] = seconds, rss
        row["auto"], row["auto_rss"] = median_of(1, estimate[:-2], cold)
        firsts: dict[str, list[float]] = {"plan": [], "bare": [], "parsed": []}
        for _ in range(args.first_repeats):  # in turn, as above
            for kind, seconds in firsts.items():
                # parsed: the database and reference calibrations parsed from their YAML, as a machine's very
                # first run does (the others find them kept by advisor/pickled.py, as every later run does)
                env = {**cold, "GPU_ADVISOR_DATA_CACHE": "off"} if kind == "parsed" else cold
                argv = [sys.executable, me, "--first", spec, "plan" if kind == "parsed" else kind]
                seconds.append(float(subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout))
        row["first_plan"], row["first_bare"], row["first_parsed"] = (statistics.median(firsts[kind])
                                                                     for kind in ("plan", "bare", "parsed"))
        output = subprocess.run([sys.executable, me, "--in-process", spec], capture_output=True, text=True,
                                env=cold, check=True).stdout.split()
        row["plan_steady"], row["bare_steady"] = (float(x) for x in output)
        print(key, row, flush=True)
    pair = subprocess.run([sys.executable, me, "--pair", MODELS["1b"][0], MODELS["70b"][0]], capture_output=True,
                          text=True, env=cold, check=True).stdout.split()
    pair_small, pair_large, pair_ratio = (float(x) for x in pair)
    print("pair", pair, flush=True)
    cached_pair = subprocess.run([sys.executable, me, "--pair-cached", MODELS["1b"][0], MODELS["70b"][0]],
                                 capture_output=True, text=True, env=warm, check=True).stdout.split()
    cached_small, cached_large, cached_ratio = (float(x) for x in cached_pair)
    print("pair, trace cache on", cached_pair, flush=True)
    lines = [f"advisor estimate over all GPUs, {time.strftime('%Y-%m-%d')}, {platform.machine()} "
             f"{os.cpu_count()} CPUs, Python {platform.python_version()}, medians of {args.repeats} fresh processes "
             "(seconds, imports included; peak RSS GB), the first call in a fresh process after the shared imports "
             f"(medians of {args.first_repeats}) "
             f"(torch and torch._dynamo: {imports:.2f} s in a fresh process), and steady state in one process "
             f"(medians of {STEADY_ROUNDS} interleaved calls after 2)",
             f"{'model':<4} {'bare':>6} {'cold':>6} {'cold/bare':>9} {'cached':>6} {'cached/bare':>11} "
             f"{'auto':>6} {'RSS':>5} {'first':>6} {'bare 1st':>8} {'first/bare':>10} "
             f"{'steady':>6} {'bare st.':>8} {'steady/bare':>11}"]
    for key, row in rows.items():
        lines.append(f"{key:<4} {row['bare']:>6.2f} {row['cold']:>6.2f} {row['cold'] / row['bare']:>9.2f} "
                     f"{row['warm']:>6.2f} {row['warm'] / row['bare']:>11.2f} {row['auto']:>6.2f} "
                     f"{max(row['cold_rss'], row['auto_rss']):>5.2f} {row['first_plan']:>6.2f} "
                     f"{row['first_bare']:>8.2f} {row['first_plan'] / row['first_bare']:>10.2f} "
                     f"{row['plan_steady']:>6.2f} "
                     f"{row['bare_steady']:>8.2f} {row['plan_steady'] / row['bare_steady']:>11.2f}")
    lines += [f"{key}: {spec} = {what}" for key, (spec, what) in MODELS.items()]
    ratios = {
        "7b / bare, cold": rows["7b"]["cold"] / rows["7b"]["bare"],
        "7b / bare, cached": rows["7b"]["warm"] / rows["7b"]["bare"],
        "7b / bare, first call after the shared imports": rows["7b"]["first_plan"] / rows["7b"]["first_bare"],
        "7b / bare, first call with the database parsed (a machine's first run; for comparison)":
            rows["7b"]["first_parsed"] / rows["7b"]["first_bare"],
        "7b / bare, steady": rows["7b"]["plan_steady"] / rows["7b"]["bare_steady"],
        "70b / 1b, cold": rows["70b"]["cold"] / rows["1b"]["cold"],
        "70b / 1b, steady (timed minutes apart)": rows["70b"]["plan_steady"] / rows["1b"]["plan_steady"],
        f"70b / 1b, steady, in turn in one process ({pair_large:.2f} s / {pair_small:.2f} s; median of the "
        f"{STEADY_ROUNDS} rounds' ratios)": pair_ratio,
        f"70b / 1b, steady with the trace cache on (the default), in turn in one process ({cached_large:.2f} s / "
        f"{cached_small:.2f} s)": cached_ratio,
        "70b / 1b, bare pass (for comparison)": rows["70b"]["bare"] / rows["1b"]["bare"],
    }
    for name, value in ratios.items():
        bar = None if "comparison" in name else next((b for prefix, b in BARS.items() if name.startswith(prefix)), None)
        verdict = "" if bar is None else f"  (bar {bar}: {'met' if value <= bar else 'NOT met'})"
        lines.append(f"{name}: {value:.2f}{verdict}")
    worst_rss = max(max(row["cold_rss"], row["auto_rss"]) for row in rows.values())
    lines.append(f"peak RSS over every run: {worst_rss:.2f} GB (bar 1 GB: {'met' if worst_rss < 1 else 'NOT met'})")
    print_report(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
