"""Sequences packed from shorter documents (`--packing TOKENS`): the time of attention that runs within each
document. FLOPs, shares.

Fine-tuning data is mostly shorter than the context: recipes pack several examples into each sequence (TRL's
`packing=True` with its padding-free collator, NeMo's packed SFT, torchtune's PackedDataset, Megatron's
packed sequences) and pass the documents' boundaries (`cu_seqlens`, `position_ids`) to attention's
variable-length kernels (flash attention's varlen, cuDNN's and TransformerEngine's THD layout), so each token
attends to its own document only. Every other op sees the same tokens as an unpacked sequence; attention
computes, for documents of l tokens in a sequence of S, l / S of the scores a causal mask keeps over the
whole sequence (the sum of l^2 / 2 over S / l documents, against S^2 / 2), and its keys per query are
those of a document. The documents are taken as all of `TOKENS` tokens: lengths that vary cost more
(the mean of l^2 over the mean of l).

Only the fused kernels (scaled_dot_product_attention) take the boundaries: attention written as matrix
products and a softmax (a model's eager path) attends over the whole packed sequence.
"""

from __future__ import annotations

from dataclasses import replace

from advisor.estimate.ops import FUSED_ATTENTION
from advisor.profile.trace import StepTrace


def document_share(document_tokens: int | None, seq_len: int | None) -> float:
    """Share of a sequence's attention scores computed when it is packed from documents of `document_tokens`
    tokens (1: not packed, or documents as long as the sequence).

    # documents of 512 tokens packed into 4,096: 512 / 4,096 = 0.125
    """
    if document_tokens is None or seq_len is None or document_tokens >= seq_len:
        return 1.0
    assert document_tokens > 0, document_tokens
    return document_tokens / seq_len


def packed_trace(trace: StepTrace, document_tokens: int | None, seq_len: int | None) -> StepTrace:
    """`trace` with its fused attention calls computing `document_share` of their FLOPs (their bytes, the
    queries, keys and values read once, unchanged); `trace` itself when nothing is packed."""
    share = document_share(document_tokens, seq_len)
    if share == 1.0:
        return trace
    records = tuple(replace(r, flops=r.flops * share) if r.op in FUSED_ATTENTION else r for r in trace.records)
    return replace(trace, records=records)


def unpacked_attention_note(trace: StepTrace, document_tokens: int | None, seq_len: int | None) -> str | None:
    """The line an interface adds when --packing changes nothing: a model whose attention is matrix products
    and a softmax (no fused scaled_dot_product_attention) attends over the whole packed sequence."""
    if document_share(document_tokens, seq_len) == 1.0 or any(r.op in FUSED_ATTENTION for r in trace.records):
        return None
    return (f"--packing {document_tokens:,} changes nothing here: the model computes attention as matrix products "
            "and a softmax, not with scaled_dot_product_attention, whose variable-length kernels alone take the "
            "documents' boundaries; it attends over the whole packed sequence")
