"""GPT-2 small (124M) language model, in plain torch: 12 pre-norm decoder blocks of width 768,
12 heads, 1024 positions, vocabulary 50,257, causal attention, the LM head tied to the token embedding.
124,439,808 parameters.
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

SAMPLE_UNIT = "sequences"
BATCH_SIZE = 8
TRAIN_TOKENS = 10_000_000  # a fine-tuning set of Alpaca's size (52 k instructions); --tokens to change


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 50257
    positions: int = 1024
    width: int = 768
    layers: int = 12
    heads: int = 12
    seq_len: int = 1024


CONFIGS = {
    "tiny": GPTConfig(vocab_size=1000, positions=64, width=64, layers=2, heads=4, seq_len=32),
    "small": GPTConfig(),
    "medium": GPTConfig(width=1024, layers=24, heads=16),
    "large": GPTConfig(width=1280, layers=36, heads=20),
}
CONFIG = CONFIGS["small"]


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.c_attn = nn.Linear(config.width, 3 * config.width)
        self.c_proj = nn.Linear(config.width, config.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        q, k, v = (t.view(batch, tokens, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(out.transpose(1, 2).reshape(batch, tokens, width))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.width)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.width)
        self.mlp = nn.Sequential(
            nn.Linear(config.width, 4 * config.width), nn.GELU(approximate="tanh"), nn.Linear(4 * config.width, config.width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.width)
        self.wpe = nn.Embedding(config.positions, config.width)
        self.h = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.width)
        self.lm_head = nn.Linear(config.width, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build_model(config: GPTConfig = CONFIG) -> nn.Module:
    return GPT(config)


SEQ_LEN = CONFIG.seq_len
"""Tokens per training sequence (the contract's SEQ_LEN; --seq-len up to the 1,024 positions)."""


def example_input(batch_size: int, seq_len: int | None = None, config: GPTConfig = CONFIG) -> torch.Tensor:
    return torch.randint(0, config.vocab_size, (batch_size, seq_len or config.seq_len))


def loss_fn(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), input_ids[:, 1:].flatten())
