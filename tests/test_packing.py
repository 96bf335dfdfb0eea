"""--packing: sequences packed from shorter documents, attention running within each document (flash
attention's variable-length kernels), in every interface; what it cannot combine with is one sentence."""

from __future__ import annotations

import json

import pytest

from advisor.cli.main import main
from advisor.estimate.ops import FUSED_ATTENTION
from advisor.estimate.packing import document_share, packed_trace, unpacked_attention_note
from advisor.profile.trace import OpRecord, StepTrace

pytest.importorskip("transformers")

GPT2 = "hf:openai-community/gpt2"


def test_documents_compute_their_share_of_the_scores() -> None:
    # documents of 512 tokens packed into 4,096: 512 / 4,096 = 0.125 of a causal sequence's scores
    assert document_share(512, 4096) == 0.125
    assert document_share(None, 4096) == document_share(4096, 4096) == document_share(8192, 4096) == 1.0


def test_only_fused_attention_computes_less() -> None:
    attention = next(iter(FUSED_ATTENTION))
    records = (OpRecord("forward", "attn", attention, 1000.0, 64, 64, ("bf16",), True, True, (12, 256, 256, 64)),
               OpRecord("forward", "mlp", "mm", 500.0, 32, 32, ("bf16",), True, True, (1, 4, 5, 6)))
    trace = StepTrace(2, "bf16", "adamw", 10, records)
    packed = packed_trace(trace, 64, 256)
    # 64 / 256 = 0.25 of the attention's 1000 FLOPs; the matrix product's 500 and every byte unchanged
    assert [r.flops for r in packed.records] == [250.0, 500.0]
    assert [r.bytes_read for r in packed.records] == [64, 32]
    assert packed_trace(trace, None, 256) is trace
    assert unpacked_attention_note(trace, 64, 256) is None  # its attention takes the boundaries


def test_attention_of_matrix_products_is_told_it_stays_unpacked() -> None:
    # q @ k^T, softmax, @ v: no fused kernel to take the documents' boundaries
    records = (OpRecord("forward", "attn", "bmm", 1000.0, 64, 64, ("bf16",), True, True, (12, 256, 256, 64)),
               OpRecord("forward", "attn", "_softmax", 10.0, 64, 64, ("bf16",), False, True))
    trace = StepTrace(2, "bf16", "adamw", 10, records)
    note = unpacked_attention_note(trace, 64, 256)
    assert note is not None and note.startswith("--packing 64 changes nothing here")
    assert unpacked_attention_note(trace, None, 256) is None and unpacked_attention_note(trace, 256, 256) is None
    assert packed_trace(trace, 64, 256).records == records


def estimate(capsys, *extra: str) -> dict:
    assert main(["estimate", GPT2, "--seq-len", "2048", "--batch-size", "4", "--precision", "bf16",
                 "--gpu", "h100-sxm", "--steps", "10", "--no-input-pipeline", "--json", "--top-ops", "40",
                 *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_packed_documents_make_attention_and_the_step_cheaper(capsys) -> None:
    plain, packed = estimate(capsys), estimate(capsys, "--packing", "256")
    assert (plain["settings"]["packing"], packed["settings"]["packing"]) == (None, 256)

    def attention_flops(out: dict) -> float:
        return sum(o["flops"] for o in out["results"][0]["top_ops"] if o["op"] in FUSED_ATTENTION)

    # documents of 256 tokens in sequences of 2,048: 1/8 of the attention's FLOPs, the same trace otherwise
    assert attention_flops(packed) == pytest.approx(attention_flops(plain) / 8)
    assert packed["trace"] == plain["trace"]
    assert packed["results"][0]["step_time_s"] < plain["results"][0]["step_time_s"]


@pytest.mark.parametrize("argv, says", [
    (["mlp", "--packing", "64"], "has no sequence length"),
    ([GPT2, "--seq-len", "128", "--packing", "64", "--padding-mask"], "do not combine"),
    ([GPT2, "--packing", "0"], "at least 1"),
])
def test_what_packing_cannot_do_is_one_sentence_and_exit_2(capsys, argv: list[str], says: str) -> None:
    assert main(["estimate", *argv, "--gpu", "h100-sxm", "--no-input-pipeline"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]


def test_the_fit_advisors_plans_run_packed_too(capsys) -> None:
    # GPT-2 at batch 64 x 1,024 does not fit a 12 GB RTX 3060: the plan (micro-batches) is timed packed, as
    # the same settings given directly are
    argv = [GPT2, "--seq-len", "1024", "--batch-size", "64", "--precision", "bf16", "--gpu", "rtx-3060",
            "--packing", "128", "--steps", "10", "--no-input-pipeline", "--json"]
    assert main(["estimate", *argv]) == 0
    plan = json.loads(capsys.readouterr().out)["plans"][0]
    flags = plan["flags"].split()
    assert main(["estimate", *argv, *flags]) == 0
    direct = json.loads(capsys.readouterr().out)["results"][0]
    assert plan["step_time_s"] == pytest.approx(direct["step_time_s"], rel=1e-6)
