"""Jobs in tokens (issue #26's first part): SEQ_LEN and example_input(batch_size, seq_len=...) in the
model file, --seq-len and --tokens, tokens/s and MFU in every output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from advisor.app.request import PlanRequest
from advisor.cli.main import main
from advisor.errors import UserError
from advisor.profile.model_file import load_model_file

SEQUENCES = """
import torch
from torch import nn

SEQ_LEN = 64
SAMPLE_UNIT = "sequences"
TRAIN_TOKENS = 1_000_000

def build_model():
    return nn.Sequential(nn.Embedding(100, 32), nn.Linear(32, 100))

def example_input(batch_size, seq_len=None):
    return torch.randint(0, 100, (batch_size, seq_len or SEQ_LEN))
"""


def write(tmp_path: Path, text: str = SEQUENCES) -> str:
    path = tmp_path / "seq_model.py"
    path.write_text(text)
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_file_declares_its_sequence_length_and_takes_another(tmp_path: Path) -> None:
    model = load_model_file(write(tmp_path))
    assert (model.seq_len, model.accepts_seq_len, model.train_tokens) == (64, True, 1_000_000)
    longer = model.with_seq_len(256)
    assert longer.seq_len == 256 and tuple(longer.example_input(3).shape) == (3, 256)


def test_a_job_in_tokens_is_sequences_of_the_length(tmp_path: Path) -> None:
    model = load_model_file(write(tmp_path))
    # 1,000,000 tokens of the file's TRAIN_TOKENS / 64 per sequence = 15,625 sequences
    assert PlanRequest(model=write(tmp_path)).job(model).samples == 15_625
    # --tokens 1,000 at 64 per sequence: ceil(1000 / 64) = 16 sequences
    assert PlanRequest(tokens=1000).job(model).samples == 16
    with pytest.raises(UserError, match="give one of --tokens, --samples or --steps"):
        PlanRequest(tokens=1000, steps=5)


def test_tokens_per_second_and_mfu_in_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "estimate", write(tmp_path), "--gpu", "h100-sxm", "--batch-size", "8",
                         "--seq-len", "128", "--tokens", "1024000", "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["settings"]["seq_len"] == 128 and document["model"]["tokens_per_sample"] == 128
    # 1,024,000 tokens / 128 = 8,000 sequences = 1,000 steps of 8
    assert document["settings"]["tokens"] == 1_024_000 and document["results"][0]["steps"] == 1000
    result = document["results"][0]
    assert result["throughput_tokens_per_s"] == pytest.approx(result["throughput_samples_per_s"] * 128)
    # a language model (it has a SEQ_LEN) is trained in amp-bf16 when no --precision is given
    assert document["settings"]["precision"] == "amp-bf16"
    # MFU: the step's FLOPs per second over the H100 SXM's dense bf16 peak (the precision's math dtype)
    step_flops = document["model"]["train_step_flops"]
    assert result["mfu"] == pytest.approx(step_flops / result["step_time_s"] / 989.4e12, rel=0.02)


def test_the_table_says_tokens_per_second(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", write(tmp_path), "--gpu", "t4")
    assert code == 0
    assert "Tokens/s" in out and "batch 32 x 64 tokens" in out and "MFU" in out


@pytest.mark.parametrize("argv, message", [
    (("--seq-len", "16"), "example_input does not take a seq_len"),
    (("--tokens", "100"), "a job in tokens needs the sequence length"),
])
def test_a_model_without_sequences_says_what_is_missing(argv: tuple[str, ...], message: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "estimate", "mlp", "--gpu", "t4", *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
