"""ViT-B/16 (Dosovitskiy et al. 2021) for 224x224 images, in plain torch.

16x16 patches -> 196 tokens + a class token, 12 pre-norm encoder blocks of width 768, 12 heads,
MLP 3072 with GELU; 86,567,656 parameters with the 1000-class head.
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

SAMPLE_UNIT = "images"
BATCH_SIZE = 32
TRAIN_SAMPLES = 1_281_167  # ImageNet-1k training images


@dataclass(frozen=True)
class ViTConfig:
    image_size: int = 224
    patch_size: int = 16
    width: int = 768
    depth: int = 12
    heads: int = 12
    mlp_dim: int = 3072
    num_classes: int = 1000


CONFIGS = {
    "tiny": ViTConfig(image_size=32, patch_size=8, width=64, depth=2, heads=4, mlp_dim=128, num_classes=10),
    "b16": ViTConfig(),
    "l16": ViTConfig(width=1024, depth=24, heads=16, mlp_dim=4096),
}
CONFIG = CONFIGS["b16"]


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        qkv = self.qkv(x).view(batch, tokens, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, width))


class Block(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.width, eps=1e-6)
        self.attn = Attention(config.width, config.heads)
        self.norm2 = nn.LayerNorm(config.width, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(config.width, config.mlp_dim), nn.GELU(), nn.Linear(config.mlp_dim, config.width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        tokens = (config.image_size // config.patch_size) ** 2 + 1
        self.patch_embed = nn.Conv2d(3, config.width, config.patch_size, stride=config.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.width))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens, config.width))
        self.blocks = nn.Sequential(*(Block(config) for _ in range(config.depth)))
        self.norm = nn.LayerNorm(config.width, eps=1e-6)
        self.head = nn.Linear(config.width, config.num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


def build_model(config: ViTConfig = CONFIG) -> nn.Module:
    return VisionTransformer(config)


def example_input(batch_size: int, config: ViTConfig = CONFIG) -> torch.Tensor:
    return torch.randn(batch_size, 3, config.image_size, config.image_size)


def loss_fn(output: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    labels = torch.zeros(output.shape[0], dtype=torch.long, device=output.device)
    return F.cross_entropy(output, labels)
