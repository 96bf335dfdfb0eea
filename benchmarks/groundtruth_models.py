"""The models benchmarks/gpu_groundtruth.py measures on a GPU: every built-in example, models of the zoo
(benchmarks/zoo.py), a 1B Llama, Hugging Face's GPT-2 (when transformers is installed), and two written
here in plain torch, a mixture-of-experts decoder and an LSTM language model. Each has a tiny variant
for the dry run on a CPU (the same code, narrow and shallow)."""

from __future__ import annotations

import dataclasses
import functools
import gc
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from accuracy import channels_last
from zoo import ZOO, VGG16, BasicBlock, DenseNet121, EfficientNet, ModelParts, ResNet, classification_loss, example, images

from advisor.profile.model_file import builtin_examples, load_model_file, with_padding

LAYOUTS_CNN = ("nchw", "channels_last")
DRY_BATCHES = (2, 4)
DRY_IMAGE_SIZE = 32


class Unavailable(Exception):
    """A model that cannot be built here (an optional package is missing): its rows are skipped."""


@dataclass(frozen=True)
class MoEConfig:
    vocab_size: int = 32000
    width: int = 512
    layers: int = 4
    heads: int = 8
    experts: int = 8
    top_k: int = 2
    hidden: int = 2048
    capacity_factor: float = 1.25
    seq_len: int = 512


class MoEFeedForward(nn.Module):
    """Top-k routing with a per-sequence expert capacity, dispatched and combined with one-hot einsums as
    GShard and the Switch Transformer do: every shape is static, so the step also traces on fake tensors.
    Tokens over an expert's capacity are dropped (their residual passes through). No auxiliary loss."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.experts, self.top_k, self.capacity_factor = config.experts, config.top_k, config.capacity_factor
        self.router = nn.Linear(config.width, config.experts, bias=False)
        self.w_in = nn.Parameter(torch.randn(config.experts, config.width, config.hidden) * config.width ** -0.5)
        self.w_out = nn.Parameter(torch.randn(config.experts, config.hidden, config.width) * config.hidden ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        experts, k = self.experts, self.top_k
        capacity = math.ceil(k * tokens * self.capacity_factor / experts)
        gates, index = torch.softmax(self.router(x).float(), dim=-1).topk(k, dim=-1)  # [B, T, k]
        choice = (index.unsqueeze(-1) == torch.arange(experts, device=x.device)).float()  # [B, T, k, E]
        ordered = choice.transpose(1, 2).reshape(batch, k * tokens, experts)  # first choices before second ones
        slot = ((ordered.cumsum(1) - 1) * ordered).sum(-1).reshape(batch, k, tokens).transpose(1, 2)  # [B, T, k]
        kept = (slot < capacity).float().unsqueeze(-1)
        slots = (slot.unsqueeze(-1) == torch.arange(capacity, device=x.device)).float() * kept  # [B, T, k, C]
        dispatch = torch.einsum("btke,btkc->btec", choice, slots)
        combine = torch.einsum("btke,btkc,btk->btec", choice, slots, gates)
        expert_in = torch.einsum("btec,btw->ebcw", dispatch, x).reshape(experts, batch * capacity, width)
        out = torch.bmm(F.gelu(torch.bmm(expert_in, self.w_in)), self.w_out)
        return torch.einsum("btec,ebcw->btw", combine, out.reshape(experts, batch, capacity, width))


class MoEBlock(nn.Module):
    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.norm1, self.norm2 = nn.LayerNorm(config.width), nn.LayerNorm(config.width)
        self.qkv, self.proj = nn.Linear(config.width, 3 * config.width), nn.Linear(config.width, config.width)
        self.moe = MoEFeedForward(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = (t.view(batch, tokens, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(self.norm1(x)).split(width, dim=2))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, tokens, width)
        x = x + self.proj(attended)
        return x + self.moe(self.norm2(x))


class MoELanguageModel(nn.Module):
    """A decoder whose feed-forward layers are mixtures of experts (top-2 of 8 by default)."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.width)
        self.positions = nn.Parameter(torch.zeros(1, config.seq_len, config.width))
        self.blocks = nn.ModuleList(MoEBlock(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids) + self.positions[:, : input_ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


@dataclass(frozen=True)
class LSTMConfig:
    vocab_size: int = 32000
    embedding: int = 1024
    hidden: int = 1024
    layers: int = 2
    dropout: float = 0.1
    seq_len: int = 256


class LSTMLanguageModel(nn.Module):
    """Embedding, a stacked nn.LSTM (cuDNN's RNN kernels on a GPU), a vocabulary projection."""

    def __init__(self, config: LSTMConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.embedding)
        self.lstm = nn.LSTM(config.embedding, config.hidden, config.layers, batch_first=True, dropout=config.dropout)
        self.head = nn.Linear(config.hidden, config.vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embed(input_ids))[0])


def next_token_loss(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), input_ids[:, 1:].flatten())


def token_input(vocab_size: int, seq_len: int) -> Callable[[int], torch.Tensor]:
    return lambda batch: torch.randint(0, vocab_size, (batch, seq_len))


class TinyVGG(VGG16):
    """VGG16's forward over a few narrow layers (a dry run's VGG: the real one has 138M parameters)."""

    CONFIG = (8, "M", 16, "M")
    HIDDEN = 32
    CLASSES = 10


class TinyDenseNet(DenseNet121):
    BLOCKS = (1, 1, 1, 1)


def _example_module(name: str) -> Any:
    return load_model_file(name)


def _example_config(name: str, config: str, **changes: Any) -> ModelParts:
    """A built-in example with one of its CONFIGS (and changes), e.g. llama's 'tiny' or '1b'."""
    configs = _example_module(name).build_model.__globals__["CONFIGS"]
    return example(name, **(dataclasses.asdict(configs[config]) | changes))


def _plain_example(name: str, dry: bool) -> ModelParts:
    module = _example_module(name)
    return module.build_model, module.example_input, module.loss_fn


def _resnet50_example(dry: bool) -> ModelParts:
    module = _example_module("resnet50")
    if not dry:
        return module.build_model, module.example_input, module.loss_fn
    block = module.build_model.__globals__["Bottleneck"]  # the example's own block, narrow

    def build() -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), block(16, 4, 1),
                             block(16, 8, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

    return build, functools.partial(module.example_input, image_size=DRY_IMAGE_SIZE), module.loss_fn


def _mobilenet_example(dry: bool) -> ModelParts:
    module = _example_module("mobilenet_v2")
    if not dry:
        return module.build_model, module.example_input, module.loss_fn
    parts = module.build_model.__globals__  # the example's own blocks, narrow (CPU fp16 depthwise is slow)

    def build() -> nn.Module:
        return nn.Sequential(parts["conv_bn"](3, 8, 3, 2), parts["InvertedResidual"](8, 8, 1, 1),
                             parts["InvertedResidual"](8, 16, 2, 6), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(16, 10))

    return build, functools.partial(module.example_input, image_size=DRY_IMAGE_SIZE), module.loss_fn


def _mlp_example(dry: bool) -> ModelParts:
    module = _example_module("mlp")
    return (functools.partial(module.build_model, 64) if dry else module.build_model), module.example_input, module.loss_fn


def _zoo_vision(name: str, tiny: Callable[[], nn.Module]) -> Callable[[bool], ModelParts]:
    def parts(dry: bool) -> ModelParts:
        if not dry:
            return ZOO[name](None)
        return tiny, images(DRY_IMAGE_SIZE), classification_loss
    return parts


def _moe(dry: bool) -> ModelParts:
    config = MoEConfig(vocab_size=100, width=32, layers=2, heads=4, experts=4, hidden=64, seq_len=16) if dry \
        else MoEConfig()
    return (lambda: MoELanguageModel(config)), token_input(config.vocab_size, config.seq_len), next_token_loss


def _lstm(dry: bool) -> ModelParts:
    config = LSTMConfig(vocab_size=100, embedding=16, hidden=32, layers=2, seq_len=8) if dry else LSTMConfig()
    return (lambda: LSTMLanguageModel(config)), token_input(config.vocab_size, config.seq_len), next_token_loss


def _hf_gpt2(dry: bool) -> ModelParts:
    """Hugging Face's own GPT2LMHeadModel, built from its config (no download); optional package."""
    try:
        import transformers
    except ImportError as exc:
        raise Unavailable("transformers is not installed") from exc
    gc.freeze()  # its many objects would slow every gc.collect() between rows
    sizes = dict(vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=4) if dry else {}
    config = transformers.GPT2Config(**sizes)
    seq_len = 32 if dry else config.n_positions

    def example_input(batch: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, config.vocab_size, (batch, seq_len))
        return {"input_ids": ids, "labels": ids}

    return (lambda: transformers.GPT2LMHeadModel(config)), example_input, lambda output, inputs: output.loss


def _hf_llama_long(dry: bool) -> ModelParts:
    """`advisor estimate hf:llama-3.2-1b --seq-len 8192`'s own model (advisor.profile.hub: transformers'
    LlamaForCausalLM from the shipped config, PyTorch's sdpa attention, its own loss), 8,192 tokens per sample;
    a dry run builds the same class narrow and shallow at 32 tokens. Optional package: transformers."""
    try:
        import transformers
    except ImportError as exc:
        raise Unavailable("transformers is not installed") from exc
    gc.freeze()
    if not dry:
        model_file = load_model_file("hf:llama-3.2-1b").with_seq_len(LONG_SEQ_LEN)
        return model_file.build_model, model_file.example_input, model_file.loss_fn
    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      use_cache=False)

    def example_input(batch: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, config.vocab_size, (batch, 32))
        return {"input_ids": ids, "labels": ids.clone()}

    def build() -> nn.Module:
        return transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa")

    return build, example_input, lambda output, inputs: output.loss


def _hf_llama_long_padded(dry: bool) -> ModelParts:
    """_hf_llama_long with the attention mask universal-llm-trainer's GPU test passed: its `--gpu_test` mode
    draws random token ids over all 8,192 positions but keeps the mask of the ARC sample it loaded, ones over
    the sample's tokens and zeros to 8,192 (ljm565/universal-llm-trainer @aefdc4a,
    src/data_collection/qa_dataset.py __getitem__ and src/trainer/trainer.py line 279); here the mask
    --padding-mask gives (model_file.with_padding: any mask short of the sequence runs the same kernels).
    Transformers then hands scaled_dot_product_attention a 4-D mask, which flash attention does not take: torch runs the
    memory-efficient kernels over all s x s scores. Measured beside hf_llama_1b_ckpt, it tells whether that
    is why ULT_GPU_TEST ran 1.6-3.2x our predicted steps."""
    build, example_input, loss = _hf_llama_long(dry)
    return build, lambda batch: with_padding(example_input(batch)), loss


LONG_SEQ_LEN = 8192
"""Tokens per sample of hf_llama_1b_ckpt: universal-llm-trainer's GPU test (ULT_GPU_TEST in
../shared/validation/published-throughput-newer.csv) fine-tuned 4-13B models at batch 2 x 8,192 tokens with
Hugging Face's gradient checkpointing, in bf16, and ran 1.6-3.2x our predicted step on H100, A100 and RTX PRO
6000 alike; the same recipe on a 1B model that fits any lent GPU says whether the mechanism is ours."""


@dataclass(frozen=True)
class ModelSpec:
    """One model of the ground truth: how to build it (real or dry sizes), its two batch sizes, optimizer;
    `precisions`: the harness's four unless given; `checkpointing`: activation checkpointing of its repeated
    blocks (a transformers model's own gradient_checkpointing_enable(), as Trainer runs it; the prediction
    traces the step as `advisor estimate --checkpointing` does)."""

    name: str
    kind: str
    """cnn, transformer, mlp, rnn or moe; CNNs also run channels-last."""
    origin: str
    parts: Callable[[bool], ModelParts]
    batches: tuple[int, int]
    optimizer: str
    precisions: tuple[str, ...] | None = None
    checkpointing: bool = False

    @property
    def layouts(self) -> tuple[str, ...]:
        return LAYOUTS_CNN if self.kind == "cnn" else ("contiguous",)

    def batches_for(self, dry: bool) -> tuple[int, int]:
        return DRY_BATCHES if dry else self.batches


def _ex(name: str, kind: str, parts: Callable[[bool], ModelParts], batches: tuple[int, int],
        optimizer: str = "adamw") -> ModelSpec:
    return ModelSpec(name, kind, f"examples/{name}.py", parts, batches, optimizer)


def _config_example(name: str, real: str | None = None, **changes: Any) -> Callable[[bool], ModelParts]:
    """An example at its default config (or `real`), its 'tiny' config in a dry run."""
    def parts(dry: bool) -> ModelParts:
        if dry:
            return _example_config(name, "tiny", **changes)
        if real is not None:
            return _example_config(name, real, **changes)
        return example(name, **changes) if changes else _plain_example(name, dry)
    return parts


EXAMPLES: dict[str, ModelSpec] = {spec.name: spec for spec in (
    _ex("mlp", "mlp", _mlp_example, (64, 1024)),
    _ex("resnet50", "cnn", _resnet50_example, (64, 128), "momentum"),
    _ex("mobilenet_v2", "cnn", _mobilenet_example, (64, 128), "momentum"),
    _ex("vit_b16", "transformer", _config_example("vit_b16"), (32, 64)),
    _ex("bert_base", "transformer", _config_example("bert_base"), (16, 32)),
    _ex("gpt2_small", "transformer", _config_example("gpt2_small"), (8, 16)),
    _ex("llama", "transformer", _config_example("llama"), (1, 2)),
)}
"""The built-in examples at their default sizes (llama is the 7B: it does not fit a training step on one
80 GB GPU, and says so)."""

ZOO_MODELS: tuple[ModelSpec, ...] = (
    ModelSpec("resnet18", "cnn", "benchmarks/zoo.py", _zoo_vision("resnet18", lambda: ResNet(BasicBlock, (1, 1, 1, 1))),
              (128, 256), "momentum"),
    ModelSpec("vgg16", "cnn", "benchmarks/zoo.py", _zoo_vision("vgg16", TinyVGG), (32, 64), "momentum"),
    ModelSpec("densenet121", "cnn", "benchmarks/zoo.py", _zoo_vision("densenet121", lambda: TinyDenseNet(8)),
              (32, 64), "momentum"),
    ModelSpec("efficientnet_b0", "cnn", "benchmarks/zoo.py",
              _zoo_vision("efficientnet_b0", lambda: EfficientNet(0.1, 0.1)), (64, 128), "momentum"),
    ModelSpec("bert_large", "transformer", "benchmarks/zoo.py (seq 384, eager attention)",
              lambda dry: _example_config("bert_base", "tiny", eager_attention=True) if dry else ZOO["bert_large"](None),
              (8, 16), "adamw"),
    ModelSpec("vit_l16", "transformer", "examples/vit_b16.py CONFIGS['l16']", _config_example("vit_b16", "l16"),
              (16, 32), "adamw"),
    ModelSpec("llama_1b", "transformer", "examples/llama.py CONFIGS['1b'] (seq 2048)",
              _config_example("llama", "1b"), (2, 4), "adamw"),
    ModelSpec("hf_gpt2", "transformer", "transformers.GPT2LMHeadModel (GPT-2 small config, seq 1024)", _hf_gpt2,
              (8, 16), "adamw"),
    ModelSpec("moe", "moe", "here: 4 layers, 8 experts top-2, width 512, seq 512", _moe, (16, 32), "adamw"),
    ModelSpec("lstm_lm", "rnn", "here: 2-layer LSTM 1024, vocabulary 32000, seq 256", _lstm, (32, 64), "adamw"),
    ModelSpec("hf_llama_1b_ckpt", "transformer", "hf:llama-3.2-1b (transformers, sdpa), seq 8192, gradient "
              "checkpointing", _hf_llama_long, (1, 2), "adamw", precisions=("bf16", "amp-bf16"), checkpointing=True),
    ModelSpec("hf_llama_1b_ckpt_padded", "transformer", "hf_llama_1b_ckpt with universal-llm-trainer's padded "
              "attention mask (160 of 8192 positions kept)", _hf_llama_long_padded, (1, 2), "adamw",
              precisions=("bf16",), checkpointing=True),
    ModelSpec("vgg16_tight", "cnn", "benchmarks/zoo.py VGG16, fp32 at batches whose allocator reserve outgrows an "
              "80 or 141 GB GPU while the blocks in use fit", _zoo_vision("vgg16", TinyVGG), (960, 1536), "momentum",
              precisions=("fp32",)),
)
"""Beyond the examples: CNNs, BERT-large, ViT-L/16, a 1B Llama, Hugging Face's GPT-2, an MoE, an LSTM, and
Hugging Face's Llama-3.2-1B at 8,192 tokens with gradient checkpointing (pure bf16 and amp-bf16; pure bf16 with
a padded attention mask), and VGG-16 in fp32 where only the caching allocator's releases make it fit: about 0.075
GiB of blocks and 0.12 GiB of segments unhindered per image (30.7 GiB for 19.1 at batch 256, tests/test_memory.py),
so batch 960 (~72 GiB in use, ~115 reserved unhindered) tests it on an 80 GB H100 and 1536 (~114, ~184) on a
141 GB H200, each run reporting num_alloc_retries (steps.csv alloc_retries)."""


def model_specs() -> list[ModelSpec]:
    """Every example in examples/ (a new one at its own BATCH_SIZE and twice it), then the zoo's models."""
    specs = []
    for name in builtin_examples():
        if name in EXAMPLES:
            specs.append(EXAMPLES[name])
            continue
        batch = int(getattr(_example_module(name), "BATCH_SIZE", 32))
        specs.append(_ex(name, "other", functools.partial(_unknown_example, name), (batch, 2 * batch)))
    return specs + list(ZOO_MODELS)


def _unknown_example(name: str, dry: bool) -> ModelParts:
    if dry:
        raise Unavailable(f"examples/{name}.py has no tiny variant in gpu_groundtruth.py for a dry run")
    return _plain_example(name, dry)


def with_layout(parts: ModelParts, layout: str) -> ModelParts:
    """The model and its images channels-last (accuracy.py's channels_last), or as they are."""
    return channels_last(parts) if layout == "channels_last" else parts
