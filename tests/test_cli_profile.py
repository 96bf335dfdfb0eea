"""`advisor profile` through the real entry point: JSON, the text report and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from advisor.cli.main import main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_mlp_profile_json_by_hand(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "profile", "mlp", "--json", "--optimizer", "sgd")
    assert code == 0 and err == ""
    document = json.loads(out)
    assert document["model"]["params"] == 1_863_690
    assert document["settings"] == {"batch_size": 64, "precision": "fp32", "optimizer": "sgd"}
    # batch 64 (the file's BATCH_SIZE): linears 2*64*(784*1024 + 1024*1024 + 1024*10)
    # = 128 * 1,861,632 = 238,288,896, plus two ReLUs of 64*1024 elements at 1 FLOP each:
    # 131,072 -> 238,419,968
    assert document["model"]["forward_flops"] == 238_419_968
    assert document["fvcore"]["total_flops"] == 238_419_968
    assert document["fvcore"]["device"] == "meta"
    assert document["trace"]["values"] == "fake"
    assert document["coverage"]["trace_uncounted_ops"] == {}
    modules = {m["name"]: m for m in document["modules"]}
    assert modules["1"]["params"] == 784 * 1024 + 1024
    assert modules["1"]["forward_flops"] == 2 * 64 * 784 * 1024
    assert modules["(optimizer)"]["train_flops"] == 1_863_690  # SGD: one FLOP per parameter
    top = document["top_ops_by_flops"][0]
    assert top["op"] in ("mm", "addmm") and top["tensor_cores"] is True


def test_text_report_has_every_section(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "profile", "gpt2_small", "--batch-size", "1", "--precision", "amp-bf16")
    assert code == 0
    for text in ("124 M trainable parameters", "batch of 1 sequence,", "amp-bf16", "FLOPs (2 per multiply-add)",
                 "fvcore forward profile (meta device", "equal to the trace's forward", "By module (depth 2",
                 "Top 10 ops by FLOPs", "Top 10 ops by bytes moved", "Coverage: all"):
        assert text in out, text
    assert "nan" not in out and "None" not in out


def test_missing_model_file_is_exit_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "profile", "resnet5.py")
    assert code == 2 and out == ""
    assert err.startswith("advisor: error: model file 'resnet5.py' not found; did you mean the built-in example "
                          "resnet50?")
    assert err.count("\n") == 1


def test_users_exception_is_exit_2_with_their_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.py"
    path.write_text("import torch\n\ndef build_model():\n    return torch.nn.Linear(4, 2)\n\n"
                    "def example_input(batch_size):\n    return torch.randn(batch_size, 5)  # wrong width\n")
    code, _, err = run_cli(capsys, "profile", str(path), "--no-fvcore")
    assert code == 2
    lines = err.splitlines()
    assert lines[0].startswith(f"advisor: error: {path}: the model's forward on example_input(32) raised RuntimeError: a and b must have same reduction dim")  # batch 32: the default
    assert "Traceback" not in err and "advisor/" not in err


def test_bad_precision_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "mlp", "--precision", "fp4"]) == 2
    assert "invalid choice: 'fp4'" in capsys.readouterr().err


def test_builtin_examples_are_found_from_another_directory(tmp_path: Path) -> None:
    """The installed package carries the examples: `advisor profile mlp` works from any directory."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "advisor", "profile", "mlp", "--json", "--no-fvcore"],
                            cwd=tmp_path, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["model"]["builtin"] is True and document["model"]["params"] == 1_863_690
