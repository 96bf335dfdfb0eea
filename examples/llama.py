"""A Llama-style decoder in plain torch: RMSNorm, rotary position embeddings, SwiGLU MLP and
grouped-query attention (Touvron et al. 2023; Llama 2/3 layout), sized by `SIZE`.

The default is the 7B configuration (6,738,415,616 parameters, as Llama 2 7B). Building it on
real tensors needs 27 GB; gpu-advisor builds it on fake tensors and needs none of that.
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

SAMPLE_UNIT = "sequences"
BATCH_SIZE = 1
TRAIN_TOKENS = 10_000_000  # a fine-tuning set of Alpaca's size (52 k instructions); --tokens to change


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 32000
    width: int = 4096
    layers: int = 32
    heads: int = 32
    kv_heads: int = 32
    intermediate: int = 11008
    seq_len: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5


CONFIGS = {
    "tiny": LlamaConfig(vocab_size=1000, width=64, layers=2, heads=4, kv_heads=2, intermediate=176, seq_len=32),
    "1b": LlamaConfig(vocab_size=128256, width=2048, layers=16, heads=32, kv_heads=8, intermediate=8192,
                      rope_theta=500000.0),
    "7b": LlamaConfig(),
    "8b": LlamaConfig(vocab_size=128256, kv_heads=8, intermediate=14336, rope_theta=500000.0),
    "13b": LlamaConfig(width=5120, layers=40, heads=40, kv_heads=40, intermediate=13824),
    "70b": LlamaConfig(width=8192, layers=80, heads=64, kv_heads=8, intermediate=28672),
}
SIZE = "7b"
CONFIG = CONFIGS[SIZE]


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotary_tables(head_dim: int, seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotation angles, [seq_len, head_dim] each (halves repeated)."""
    inverse_frequency = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inverse_frequency)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return (x * cos + rotated * sin).type_as(x)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads = config.heads, config.kv_heads
        self.head_dim = config.width // config.heads
        self.q_proj = nn.Linear(config.width, config.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.width, config.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.width, config.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(config.heads * self.head_dim, config.width, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q = self.q_proj(x).view(batch, tokens, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.kv_heads != self.heads:  # grouped-query attention: each K/V head serves a group of queries
            groups = self.heads // self.kv_heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, tokens, -1))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.width, config.intermediate, bias=False)
        self.up_proj = nn.Linear(config.width, config.intermediate, bias=False)
        self.down_proj = nn.Linear(config.intermediate, config.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.width, config.norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.width, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.width)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.width, config.norm_eps)
        self.lm_head = nn.Linear(config.width, config.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        cos, sin = rotary_tables(self.config.width // self.config.heads, input_ids.shape[1], self.config.rope_theta)
        cos, sin = cos.to(input_ids.device), sin.to(input_ids.device)
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def build_model(config: LlamaConfig = CONFIG) -> nn.Module:
    return Llama(config)


SEQ_LEN = CONFIG.seq_len
"""Tokens per training sequence (the contract's SEQ_LEN; --seq-len changes it)."""


def example_input(batch_size: int, seq_len: int | None = None, config: LlamaConfig = CONFIG) -> torch.Tensor:
    return torch.randint(0, config.vocab_size, (batch_size, seq_len or config.seq_len))


def loss_fn(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), input_ids[:, 1:].flatten())
