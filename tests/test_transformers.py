"""A Hugging Face `transformers` BERT, called with input_ids, token_type_ids and attention_mask
(with padding), is profiled: the trace and fvcore's forward profile, FLOPs checked by hand."""

from __future__ import annotations

import pytest
import torch

from advisor.profile.forward import forward_profile
from advisor.profile.trace import trace_training_step

transformers = pytest.importorskip("transformers")

HIDDEN, LAYERS, HEADS, INTERMEDIATE, SEQ, BATCH = 64, 2, 4, 128, 32, 2


def build_model() -> torch.nn.Module:
    config = transformers.BertConfig(vocab_size=1000, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                     num_attention_heads=HEADS, intermediate_size=INTERMEDIATE,
                                     max_position_embeddings=64)
    return transformers.BertModel(config)  # built from its config: no download


def example_input(batch_size: int) -> dict[str, torch.Tensor]:
    input_ids = torch.randint(0, 1000, (batch_size, SEQ))
    attention_mask = torch.ones(batch_size, SEQ, dtype=torch.long)
    attention_mask[:, 24:] = 0  # padding, as a tokenizer gives for short sequences
    return {"input_ids": input_ids, "token_type_ids": torch.zeros_like(input_ids), "attention_mask": attention_mask}


# Matrix products of one forward, by hand (2 FLOPs per multiply-add), tokens = 2*32 = 64:
#   per layer: Q, K, V, output projections 4 * 2*64*64*64 = 2,097,152
#              intermediate and output     2 * 2*64*64*128 = 2,097,152
#              attention scores and values over 2*4 = 8 heads of [32 x 16]:
#              scores 2*8*32*32*16 = 262,144, values 2*8*32*32*16 = 262,144 -> 524,288
#   two layers: 2 * 4,718,592 = 9,437,184; pooler on the first token: 2*2*64*64 = 16,384
MATMUL_FORWARD = 9_453_568


def test_hugging_face_bert_with_attention_mask_is_traced() -> None:
    trace = trace_training_step(build_model, example_input, BATCH, "amp-bf16", "adamw")
    assert trace.values in ("fake", "fake+real-inputs")  # which way was taken is reported
    matmul = sum(r.flops for r in trace.records if r.phase == "forward" and r.matmul)
    assert matmul == MATMUL_FORWARD
    assert trace.uncounted() == {}
    assert trace.flops("backward") > 1.9 * matmul


def test_hugging_face_bert_forward_profile_matches_the_trace() -> None:
    trace = trace_training_step(build_model, example_input, BATCH, "fp32", "adamw")
    profile = forward_profile(build_model, example_input, BATCH)
    assert profile.total_flops == pytest.approx(trace.model_forward_flops(), rel=0.01)
    assert profile.by_module["encoder"] > 0.95 * MATMUL_FORWARD


def build_llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                      num_attention_heads=HEADS, num_key_value_heads=HEADS,
                                      intermediate_size=INTERMEDIATE, max_position_embeddings=64,
                                      attn_implementation="sdpa")
    config.use_cache = False  # as training scripts and the built-in catalog (hub.py) set it
    return transformers.LlamaForCausalLM(config)


def test_a_hugging_face_causal_lm_on_fake_tensors_runs_causal_attention_without_a_mask() -> None:
    # transformers cannot read fake position ids and, unpatched, assumes packed sequences: it builds a
    # [2, 1, 32, 32] mask and attention computes every score. A real step's position ids pack nothing,
    # so it calls attention with is_causal=True: per layer forward 2 * (2*8*32*32*16) = 524,288 FLOPs for
    # every score, of which the causal kernel computes (32 + 1) / 64 = 270,336.
    trace = trace_training_step(build_llama, lambda batch: {"input_ids": torch.randint(0, 1000, (batch, SEQ))},
                                BATCH, "fp32", "adamw", lambda out, _: out.logits.float().mean(), attention="cuda")
    attention = [r for r in trace.records if r.phase == "forward" and "attention" in r.op]
    assert [r.flops for r in attention] == [270_336.0] * LAYERS


def build_llama_with_cache() -> torch.nn.Module:
    model = build_llama()
    model.config.use_cache = True  # transformers' default, which a user's model file may keep
    return model


def padded_tokens(batch: int) -> dict[str, torch.Tensor]:
    input_ids = torch.randint(0, 1000, (batch, SEQ))
    attention_mask = torch.ones(batch, SEQ, dtype=torch.long)
    attention_mask[:, 24:] = 0  # padding: transformers hands attention a [2, 1, 32, 32] mask
    return {"input_ids": input_ids, "labels": input_ids.clone(), "attention_mask": attention_mask}


def test_a_checkpointed_hugging_face_model_keeps_no_key_value_cache() -> None:
    # Recomputing a layer under checkpointing would append its keys and values to the cache again: the
    # recomputed attention would see 64 keys (and, with a mask of 32, fail). Turned off as transformers
    # does under gradient checkpointing, the step is the one a model built with use_cache=False makes:
    # per layer the forward's and the recompute's masked attention over every score, 2 * 524,288 FLOPs.
    def attention_flops(build) -> list[float]:
        trace = trace_training_step(build, padded_tokens, BATCH, "bf16", "adamw", lambda out, _: out.loss,
                                    checkpointing=True, attention="cuda")
        return [r.flops for r in trace.records if r.phase != "optimizer" and r.op.endswith("attention_for_cpu")]
    assert attention_flops(build_llama_with_cache) == attention_flops(build_llama) == [524_288.0] * (2 * LAYERS)
