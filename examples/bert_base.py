"""BERT-base uncased with a span (SQuAD) head, in plain torch: the fine-tuning setup of the BERT paper.

12 post-norm encoder layers of width 768, 12 heads, intermediate 3072 with GELU; WordPiece vocabulary
30,522, 512 positions, 2 token types; the QA head gives start and end logits. Inputs are a dict of
`input_ids`, `token_type_ids` and `attention_mask` as Hugging Face tokenizers produce them.
108,893,186 parameters (base) with the QA head and without the pooler, which SQuAD does not use.
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

SAMPLE_UNIT = "sequences"
BATCH_SIZE = 32
TRAIN_SAMPLES = 87_599  # SQuAD v1.1 training questions (a few more features once long contexts are split)


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    max_positions: int = 512
    type_vocab_size: int = 2
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    intermediate: int = 3072
    seq_len: int = 384
    eager_attention: bool = False
    """Attention as matmul, softmax, dropout, matmul (the original BERT code, Hugging Face's "eager" and
    NVIDIA's DeepLearningExamples) instead of torch's fused scaled_dot_product_attention."""


CONFIGS = {
    "tiny": BertConfig(vocab_size=1000, max_positions=64, hidden=64, layers=2, heads=4, intermediate=128, seq_len=32),
    "base": BertConfig(),
    "large": BertConfig(hidden=1024, layers=24, heads=16, intermediate=4096),
}
CONFIG = CONFIGS["base"]


class SelfAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.query = nn.Linear(config.hidden, config.hidden)
        self.key = nn.Linear(config.hidden, config.hidden)
        self.value = nn.Linear(config.hidden, config.hidden)
        self.output = nn.Linear(config.hidden, config.hidden)
        self.dropout = nn.Dropout(0.1)
        self.eager = config.eager_attention
        self.attention_dropout = nn.Dropout(0.1)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, hidden = x.shape
        return x.view(batch, tokens, self.heads, hidden // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        if self.eager:
            scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + mask
            out = self.attention_dropout(scores.softmax(-1)) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.1 if self.training else 0.0)
        return self.dropout(self.output(out.transpose(1, 2).flatten(2)))


class Layer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = SelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden, eps=1e-12)
        self.intermediate = nn.Linear(config.hidden, config.intermediate)
        self.output = nn.Linear(config.intermediate, config.hidden)
        self.output_norm = nn.LayerNorm(config.hidden, eps=1e-12)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(x + self.attention(x, mask))
        return self.output_norm(x + self.dropout(self.output(F.gelu(self.intermediate(x)))))


class BertForQuestionAnswering(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden)
        self.position_embeddings = nn.Embedding(config.max_positions, config.hidden)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden)
        self.embedding_norm = nn.LayerNorm(config.hidden, eps=1e-12)
        self.dropout = nn.Dropout(0.1)
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.layers))
        self.qa_outputs = nn.Linear(config.hidden, 2)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions) + self.token_type_embeddings(
            token_type_ids)
        x = self.dropout(self.embedding_norm(x))
        # 1 = attend, 0 = padding; additive mask broadcast over heads and query positions.
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, mask)
        start, end = self.qa_outputs(x).unbind(-1)
        return start, end


def build_model(config: BertConfig = CONFIG) -> nn.Module:
    return BertForQuestionAnswering(config)


SEQ_LEN = CONFIG.seq_len
"""Tokens per training sequence (the contract's SEQ_LEN; --seq-len up to the 512 positions)."""


def example_input(batch_size: int, seq_len: int | None = None,
                  config: BertConfig = CONFIG) -> dict[str, torch.Tensor]:
    shape = (batch_size, seq_len or config.seq_len)
    return {
        "input_ids": torch.randint(0, config.vocab_size, shape),
        "token_type_ids": torch.zeros(shape, dtype=torch.long),
        "attention_mask": torch.ones(shape, dtype=torch.long),
    }


def loss_fn(output: tuple[torch.Tensor, torch.Tensor], inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean of the start and end cross-entropies, as SQuAD fine-tuning computes it."""
    start, end = output
    positions = torch.zeros(start.shape[0], dtype=torch.long, device=start.device)
    return (F.cross_entropy(start, positions) + F.cross_entropy(end, positions)) / 2
