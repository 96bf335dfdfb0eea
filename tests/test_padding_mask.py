"""--padding-mask: a model by name trained on padded batches carries an attention mask, so attention
runs masked over every score (flash attention takes no mask) in every interface; a model file is told
to return its own mask."""

from __future__ import annotations

import json

import pytest

from advisor.cli.main import main
from advisor.profile.model_file import PADDED_SHARE, load_model_file, with_padding

pytest.importorskip("transformers")

GPT2 = "hf:openai-community/gpt2"


def test_padding_masks_the_last_quarter_of_every_sequence() -> None:
    import torch

    # 8 tokens, PADDED_SHARE 0.25: ones over the first 6, zeros over the last 2
    inputs = with_padding({"input_ids": torch.zeros(2, 8, dtype=torch.long)})
    assert PADDED_SHARE == 0.25
    assert inputs["attention_mask"].tolist() == [[1] * 6 + [0] * 2] * 2


def test_a_model_by_name_gets_the_mask_and_a_model_file_an_error() -> None:
    from advisor.errors import UserError

    plain = load_model_file(GPT2).with_seq_len(16)
    padded = plain.with_padding_mask()
    assert padded.padded and padded.example_input(2)["attention_mask"].shape == (2, 16)
    assert padded.fingerprint and padded.fingerprint != plain.fingerprint  # the trace cache keeps them apart
    with pytest.raises(UserError, match="--padding-mask: .* is a model file"):
        load_model_file("mlp").with_padding_mask()


def estimate(capsys, *extra: str) -> dict:
    assert main(["estimate", GPT2, "--seq-len", "1024", "--batch-size", "8", "--precision", "bf16",
                 "--gpu", "a100-sxm4-80gb", "--gpu", "h100-sxm", "--steps", "10", "--no-input-pipeline",
                 "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_padded_batches_run_attention_masked_and_slower_off_hopper(capsys) -> None:
    # GPT-2 at 1,024 tokens: unpadded, a causal kernel computes about half the scores at flash attention's
    # rate; padded, every score at the memory-efficient kernels' (an A100) or cuDNN's (an H100) rate
    plain, padded = estimate(capsys), estimate(capsys, "--padding-mask")
    assert (plain["settings"]["padding_mask"], padded["settings"]["padding_mask"]) == (False, True)
    step = {(run, r["gpu_id"]): r["step_time_s"] for run, out in (("plain", plain), ("padded", padded))
            for r in out["results"]}
    assert step[("padded", "a100-sxm4-80gb")] > 1.05 * step[("plain", "a100-sxm4-80gb")]
    slowdown = {gpu: step[("padded", gpu)] / step[("plain", gpu)] for gpu in ("a100-sxm4-80gb", "h100-sxm")}
    assert slowdown["a100-sxm4-80gb"] > slowdown["h100-sxm"] > 1.0  # cuDNN takes the mask at its own rate


def test_padding_a_model_file_is_one_sentence_and_exit_2(capsys) -> None:
    assert main(["estimate", "mlp", "--padding-mask", "--gpu", "h100-sxm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("advisor: error: --padding-mask:")
