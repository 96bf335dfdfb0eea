"""Speed and memory of profiling a model: our fake-tensor trace beside fvcore and FlopCounterMode.

Each method runs in a fresh Python process; wall time and that process's peak RSS (from wait4)
are measured from outside, so imports count the same for everyone. Methods that need the real
weights and activations in RAM are not started when they cannot fit: the table says so.

    python benchmarks/profile_speed.py                 # Llama 7B, batch 1, sequence 2048
    python benchmarks/profile_speed.py --model resnet50 --batch-size 32
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

METHODS = {
    "advisor-trace": "gpu-advisor: full training step (fwd+loss+bwd+AdamW) on fake tensors",
    "advisor-fvcore-meta": "gpu-advisor: fvcore forward profile, registry handles (meta; real CPU if meta fails)",
    "fvcore-stock-meta": "fvcore FlopCountAnalysis, stock handles, meta device (forward, 1 per MAC)",
    "flopcounter-fake": "torch FlopCounterMode, fwd+bwd on fake tensors (matmul/conv/sdpa only)",
    "fvcore-stock-real": "fvcore FlopCountAnalysis, stock handles, real CPU tensors (forward)",
    "flopcounter-real": "torch FlopCounterMode, fwd+bwd on real CPU tensors",
}
REAL_METHODS = ("fvcore-stock-real", "flopcounter-real")


# ----------------------------------------------------------------------------- child side


def _child(method: str, model_name: str, batch: int) -> dict:
    import torch

    from advisor.profile.model_file import load_model_file

    model_file = load_model_file(model_name)
    started = time.perf_counter()
    if method == "advisor-trace":
        from advisor.profile.trace import trace_training_step

        trace = trace_training_step(model_file.build_model, model_file.example_input, batch, "amp-bf16", "adamw",
                                    model_file.loss_fn)
        flops, forward = trace.flops(), trace.model_forward_flops()
    elif method == "advisor-fvcore-meta":
        from advisor.profile.forward import forward_profile

        profile = forward_profile(model_file.build_model, model_file.example_input, batch)
        flops = forward = profile.total_flops
    elif method in ("fvcore-stock-meta", "fvcore-stock-real"):
        from fvcore.nn import FlopCountAnalysis

        device = "meta" if method.endswith("meta") else "cpu"
        with torch.device(device):
            model = model_file.build_model()
            inputs = model_file.example_input(batch)
        analysis = FlopCountAnalysis(model, inputs if isinstance(inputs, tuple) else (inputs,))
        analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
        with torch.no_grad():
            forward = 2.0 * analysis.total()  # fvcore counts multiply-adds
        flops = forward
    else:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.utils.flop_counter import FlopCounterMode

        from advisor.profile.trace import call_model, default_loss

        loss_fn = model_file.loss_fn or default_loss
        context = FakeTensorMode(allow_non_fake_inputs=True) if method == "flopcounter-fake" else torch.device("cpu")
        with context:
            model = model_file.build_model()
            inputs = model_file.example_input(batch)
            with FlopCounterMode(display=False) as counter:
                loss_fn(call_model(model, inputs), inputs).backward()
        flops = float(counter.get_total_flops())
        forward = None
    return {"flops": flops, "forward_flops": forward, "inner_seconds": time.perf_counter() - started}


# ----------------------------------------------------------------------------- parent side


def _real_bytes_needed(model_name: str, batch: int) -> dict[str, int]:
    """Bytes of real tensors each real-tensor method holds at least, from our fake trace:
    fvcore's forward under no_grad keeps the fp32 weights; FlopCounterMode's forward and backward
    keep weights, gradients and what the forward writes (saved activations, upper bound)."""
    from advisor.profile.model_file import load_model_file
    from advisor.profile.trace import trace_training_step

    model_file = load_model_file(model_name)
    trace = trace_training_step(model_file.build_model, model_file.example_input, batch, "fp32", "sgd",
                                model_file.loss_fn)
    weights = trace.params * 4
    return {"fvcore-stock-real": weights, "flopcounter-real": 2 * weights + trace.bytes_written("forward")}


def _run_measured(method: str, model_name: str, batch: int) -> dict:
    """Run the child with wait4 so its own peak RSS is known (Popen.communicate reaps it otherwise)."""
    command = [sys.executable, __file__, "--child", method, "--model", model_name, "--batch-size", str(batch)]
    started = time.perf_counter()
    out_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"profile_speed_{os.getpid()}_{method}.json"
    with open(out_path, "w", encoding="utf-8") as out, subprocess.Popen(command, stdout=out, stderr=subprocess.PIPE,
                                                                        cwd=REPO) as process:
        stderr = process.stderr.read().decode() if process.stderr else ""
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    text = out_path.read_text(encoding="utf-8")
    out_path.unlink()
    if process.returncode != 0:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {process.returncode}"
        return {"error": last, "seconds": seconds, "peak_rss_bytes": usage.ru_maxrss * 1024}
    result = json.loads(text.strip().splitlines()[-1])
    result.update(seconds=seconds, peak_rss_bytes=usage.ru_maxrss * 1024)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    if args.child:
        print(json.dumps(_child(args.child, args.model, args.batch_size)))
        return 0

    needed = _real_bytes_needed(args.model, args.batch_size)
    from advisor.probe.cpu import available_memory_bytes

    available = available_memory_bytes()
    assert available is not None, "this benchmark reads MemAvailable from /proc/meminfo"
    print(f"Profiling '{args.model}' at batch {args.batch_size}; {available / 2**30:.1f} GiB of memory available. "
          f"Wall time includes process start and imports.")
    print(f"{'method':22} {'seconds':>8} {'peak RSS':>10} {'FLOPs':>12}  what it counts")
    results = {}
    for method, description in METHODS.items():
        if method in REAL_METHODS and needed[method] > 0.8 * available:
            print(f"{method:22} {'-':>8} {'-':>10} {'-':>12}  cannot run: needs >= {needed[method] / 2**30:.0f} GiB "
                  f"of real tensors ({description})")
            continue
        result = _run_measured(method, args.model, args.batch_size)
        results[method] = result
        rss = f"{result['peak_rss_bytes'] / 2**20:,.0f} MiB"
        if "error" in result:
            print(f"{method:22} {result['seconds']:8.2f} {rss:>10} {'-':>12}  failed: {result['error'][:80]}")
            continue
        print(f"{method:22} {result['seconds']:8.2f} {rss:>10} {result['flops']:12.4g}  {description}")
    ours = results.get("advisor-trace", {})
    if "flops" in ours:
        print()
        print(f"gpu-advisor trace: {ours['seconds']:.2f} s wall (process start and imports included), "
              f"{ours['peak_rss_bytes'] / 2**30:.2f} GiB peak RSS; targets < 10 s and < 2 GiB.")
        for method in ("advisor-fvcore-meta", "fvcore-stock-meta"):
            other = results.get(method, {})
            if other.get("flops"):
                print(f"forward FLOPs, {method} / trace forward: {other['flops'] / ours['forward_flops']:.4f}")
        other = results.get("flopcounter-fake", {})
        if other.get("flops"):
            print(f"fwd+bwd FLOPs, FlopCounterMode / trace fwd+bwd (matmul-class only on its side): "
                  f"{other['flops'] / (ours['flops']):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
