"""`advisor memory` through the real entry point: JSON fields, the table and user errors."""

from __future__ import annotations

import json

import pytest

from advisor.cli.main import main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_memory_json_has_the_estimate_fields(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "memory", "mlp", "--gpu", "rtx-3060", "--gpu", "h100-sxm", "--json",
                             "--optimizer", "sgd")
    assert code == 0 and err == ""
    document = json.loads(out)
    assert document["model"]["params"] == 1_863_690
    rtx, h100 = document["results"]
    assert (rtx["gpu_id"], h100["gpu_id"]) == ("rtx-3060", "h100-sxm")
    for result in (rtx, h100):
        assert set(result["memory"]) == {"weights", "gradients", "optimizer", "activations", "overhead"}
        assert sum(result["memory"].values()) == result["peak_bytes"]
        assert result["fits"] and result["max_batch_size"] > 64
    # 1,863,690 fp32 weights = 7,454,760 B; each of the 6 storages rounded up to 512 B: 7,455,232 B
    assert rtx["memory"]["weights"] == 7_455_232
    assert rtx["memory"]["optimizer"] == 0  # SGD without momentum keeps no state
    # the context is 400 MiB on both; cuBLAS workspace 8,519,680 B on Ampere, 32 MiB on Hopper
    assert h100["peak_bytes"] - rtx["peak_bytes"] == 32 * 2**20 - 8_519_680
    assert h100["detail"]["cuda_context"] == 400 * 2**20


def test_memory_table_marks_what_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "memory", "mlp", "--gpu", "rtx-3060", "--cuda-context-mib", "12280")
    assert code == 2  # it fits nowhere: the table, then the sentence and exit 2, as `advisor estimate` does
    assert "no, " in out and "short" in out  # 12 GiB minus a 12,280 MiB context leaves too little
    assert err.startswith("advisor: error: mlp does not fit on any of the 1 devices at batch 64")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpu", "rtx-309"], "unknown GPU id 'rtx-309' (did you mean: rtx-3090"),
        (["--batch-size", "4", "--micro-batch", "8"], "--micro-batch 8 is larger than the batch size 4"),
    ],
)
def test_memory_user_errors_are_one_sentence(capsys: pytest.CaptureFixture[str], argv: list[str],
                                             message: str) -> None:
    code, out, err = run_cli(capsys, "memory", "mlp", *argv)
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("value", ["-5", "many", "nan", "inf", "1e300"])
def test_cuda_context_must_be_a_size(capsys: pytest.CaptureFixture[str], value: str) -> None:
    assert main(["memory", "mlp", "--cuda-context-mib", value]) == 2
    assert "argument --cuda-context-mib:" in capsys.readouterr().err


def test_memory_on_several_gpus_sizes_each_gpu_per_strategy(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["memory", "mlp", "--gpu", "h100-sxm", "--batch-size", "64"]
    assert main(argv + ["--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["sharded"] == []
    assert main(argv + ["--num-gpus", "8", "--json"]) == 0
    several = json.loads(capsys.readouterr().out)
    by_strategy = {r["strategy"]: r for r in several["sharded"]}
    assert set(by_strategy) == {"ddp", "zero1", "zero2", "fsdp"} and all(r["num_gpus"] == 8 for r in by_strategy.values())
    weights, grads, state = (one["results"][0]["memory"][k] for k in ("weights", "gradients", "optimizer"))
    # ZeRO-1 keeps 1/8 of AdamW's two moments (up to the allocator's rounding of a shard), DDP all of them;
    # each strategy shards more than the one before, so no GPU holds more
    assert by_strategy["ddp"]["memory"]["optimizer"] == pytest.approx(state, rel=0.05)
    assert by_strategy["zero1"]["memory"]["optimizer"] < 0.2 * state
    peaks = [by_strategy[s]["peak_bytes"] for s in ("ddp", "zero1", "zero2", "fsdp")]
    assert peaks == sorted(peaks, reverse=True) and peaks[-1] < peaks[0]
    assert by_strategy["ddp"]["memory"]["weights"] == pytest.approx(weights, rel=0.05) and grads > 0
    assert main(argv + ["--num-gpus", "8", "--parallel", "fsdp"]) == 0
    table = capsys.readouterr().out
    rows = [line.split() for line in table.splitlines() if line.startswith("h100-sxm ") and " 8 " in line]
    assert "Each GPU of 8" in table and [row[2] for row in rows] == ["fsdp"]


def test_memory_names_the_gpus_that_hold_the_step_only_with_allocator_flushes(capsys, tmp_path) -> None:
    # VGG-16 at batch 256 in fp32: ~30.7 GiB of segments unhindered for ~19.1 GiB allocated (test_memory.py);
    # the RTX 3090 (24 GiB) holds it with cache flushes, the 40 GiB A100 without
    from pathlib import Path

    from tests.test_estimate import VGG16_FILE

    model = tmp_path / "vgg16.py"
    model.write_text(VGG16_FILE.format(benchmarks=str(Path(__file__).resolve().parents[1] / "benchmarks")))
    argv = ("memory", str(model), "--gpu", "rtx-3090", "--gpu", "a100-sxm4-40gb", "--batch-size", "256",
            "--precision", "fp32", "--optimizer", "momentum")
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    flushes = {r["gpu_id"]: r["allocator_flushes"] for r in json.loads(out)["results"]}
    assert flushes["rtx-3090"] > 0 and flushes["a100-sxm4-40gb"] == 0
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0 and "Tight fit: rtx-3090 holds the step only" in out
