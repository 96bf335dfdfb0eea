"""What each row of ../shared/validation/published-throughput-newer.csv (issue #28) means in the tool's terms:
the run its source made, as SOURCES-newer.md and the sources' own configs describe it, or why the tool
cannot express it. `benchmarks/accuracy.py --part newer` predicts the runs.

Two kinds of run:
- VisionRun: NikolasEnt's single-GPU runs of timm's benchmark.py (train mode): the model and its input cast
  to fp16 for "float16" (benchmark.py's resolve_precision: model_dtype = data_dtype = float16, no autocast),
  fp32 for "float32" (cuDNN's TF32 convolutions are the tool's fp32 on CUDA already; matmuls strict fp32,
  PyTorch's default since 1.12), NCHW (`--channels-last` is off by default), cross-entropy, and
  `create_optimizer_v2(opt='sgd')`: SGD with Nesterov momentum 0.9 (our "momentum"). The 2025 post gives
  no batch: its author started at 256 and went down by 32 until the run fit, which accuracy.py repeats with
  the tool's memory estimate (largest_fitting_batch).
- PlanRun: every LLM row and every multi-GPU row, built as `advisor estimate` builds it (a PlanRequest:
  `hf:` configs of the shipped catalog, --lora, --base-weights, --checkpointing, --micro-batch, --num-gpus
  with --parallel); multi-GPU rows run data-parallel inside one machine (DDP, ZeRO or FSDP) where the source's
  tensor, pipeline, context and expert parallel degrees are all 1.

Each source's framework decisions are in its function's docstring (SOURCE_RUNS).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from advisor.app.request import PlanRequest
from advisor.profile.choices import ALL_LINEAR, PRECISIONS

NEWER = Path(__file__).resolve().parents[2] / "shared" / "validation" / "published-throughput-newer.csv"

SEARCH_START, SEARCH_STEP, SEARCH_SMALLEST = 256, 32, 32
"""NikolasEnt 2025's batch search: 256 first, then 32 fewer until the run fits (SOURCES-newer.md)."""

FAMILIES = ("Pascal", "Volta", "Turing", "Ampere", "Ada", "Hopper", "Blackwell")
"""NVIDIA's architecture families, oldest first: hwdb's `architecture` field, capitalised."""


def family_name(architecture: str) -> str:
    """hwdb's architecture ("ampere") as the family's name ("Ampere"); others (AMD's "cdna3") upper-cased."""
    for family in FAMILIES:
        if family.lower() == architecture.lower():
            return family
    return architecture.upper()


def read_newer(path: Path = NEWER) -> list[dict[str, str]]:
    """The newer CSV's rows as dicts of its columns."""
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def largest_fitting_batch(fits: Callable[[int], bool], start: int = SEARCH_START, step: int = SEARCH_STEP,
                          smallest: int = SEARCH_SMALLEST) -> int | None:
    """The first batch of start, start - step, ... down to `smallest` for which `fits(batch)` holds (None: none
    does); `fits` is asked from the largest down and not again after the first that fits."""
    for batch in range(start, smallest - 1, -step):
        if fits(batch):
            return batch
    return None


# ----------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class VisionRun:
    """A single-GPU image-classification run of timm's benchmark.py."""

    model: str
    """A zoo.ZOO entry (vgg16, resnet50) or one of zoo.TIMM_MODELS."""
    precision: str
    batch: int | None
    """Images per step; None: not published, searched (largest_fitting_batch)."""
    size: int = 224
    """Image side, pixels."""
    optimizer: str = "momentum"


@dataclass(frozen=True)
class PlanRun:
    """A run as `advisor estimate` takes it: model, batch and micro-batch per GPU, precision, optimizer,
    checkpointing, LoRA and base weights, and for several GPUs their number and data-parallel strategy."""

    model: str
    """`hf:ORG/NAME` (the shipped catalog) or a built-in example's name."""
    precision: str
    optimizer: str
    batch: int
    """Samples (sequences, images) per GPU per optimizer step."""
    micro_batch: int | None = None
    """Samples per forward and backward (gradient accumulation up to `batch`); None: `batch`."""
    seq_len: int | None = None
    """Tokens per sequence; None: an image model."""
    checkpointing: bool = False
    lora: int | None = None
    lora_targets: tuple[str, ...] = ()
    base_weights: str | None = None
    gpus: int = 1
    strategy: str = "auto"
    """--parallel on several GPUs: ddp, zero1 (Megatron's distributed optimizer) or fsdp."""
    tp: int = 1
    """--tp: tensor-parallel groups of this many GPUs, `strategy` between them (`batch` is each group's)."""
    assumption: str = ""
    """What the source does not say and we chose, printed with the row."""
    compiled: bool = False
    """The run's kernels fused as torch.compile fuses them (--compile): torch.compile itself, and as the
    nearest the tool can express, Megatron-Core/TransformerEngine's fused modules and XLA's fusion."""
    per_gpu: bool = False
    """The row's throughput is one GPU's, whatever its metric's name says (torchtune's multi-GPU rows)."""
    packing: int | None = None
    """--packing: each sequence packed from documents of this many tokens, attention within each."""
    lora_dropout: float | None = None
    """--lora-dropout: peft's lora_dropout of the adapters."""
    padding_mask: bool = False
    """--padding-mask: the inputs carry an attention mask with zeros over padding."""

    def request(self, gpu_id: str) -> PlanRequest:
        """The PlanRequest of this run on `gpu_id` (one optimizer step, no input pipeline, no fit advisor)."""
        return PlanRequest(model=self.model, batch_size=self.batch, precision=self.precision,
                           optimizer=self.optimizer, checkpointing=self.checkpointing,
                           micro_batch=None if self.micro_batch == self.batch else self.micro_batch,
                           gpus=(gpu_id,), num_gpus=self.gpus if self.gpus > 1 else None,
                           parallel=self.strategy if self.gpus > 1 else "auto", steps=1, seq_len=self.seq_len,
                           lora=self.lora, lora_targets=self.lora_targets, base_weights=self.base_weights,
                           plans="never", input_pipeline=False, compiled=self.compiled,
                           tp=self.tp if self.tp > 1 else None, packing=self.packing, lora_dropout=self.lora_dropout,
                           padding_mask=self.padding_mask)

    @property
    def accumulation(self) -> int:
        """Micro-batches per optimizer step."""
        return self.batch // (self.micro_batch or self.batch)


Run = VisionRun | PlanRun


# ----------------------------------------------------------------------------- reading a row


HF_MODELS = (
    ("Llama 3.1 8B", "meta-llama/Llama-3.1-8B"),
    ("Llama 3 8B", "meta-llama/Meta-Llama-3-8B"),
    ("Llama 2 7B", "meta-llama/Llama-2-7b-hf"),
    ("Llama 2 13B", "meta-llama/Llama-2-13b-hf"),
    ("Llama 2 70B", "meta-llama/Llama-2-70b-hf"),
    ("Mistral 7B", "mistralai/Mistral-7B-v0.1"),
    ("Qwen2.5 7B", "Qwen/Qwen2.5-7B"),
    ("Gemma 2 9B", "google/gemma-2-9b"),
    ("Gemma 7B", "google/gemma-7b"),
    ("Phi-3-mini 3.8B", "microsoft/Phi-3-mini-4k-instruct"),
    ("Qwen2.5 32B", "Qwen/Qwen2.5-32B"),
    ("Llama 3 70B", "meta-llama/Llama-3.1-70B"),
)
"""Published model name (before its parenthesis) -> the shipped catalog's config. Llama 3 70B is built from
Llama 3.1 70B's config: the same layers and shapes (3.1 changes RoPE's scaling and the context length, not
the step's cost at 4,096 tokens). The others (GPT-OSS 20B, Qwen3 MoE 30B, Nemotron Nano MoE) are not in the
catalog; their rows also run expert parallel."""

EXAMPLES = {"ViT-B/16": "vit_b16"}
"""Published model name -> built-in example."""


def model_of(row: dict[str, str]) -> str | None:
    """`hf:ORG/NAME` or an example's name for the row's model; None where the tool has none."""
    name = row["model"].split(" (")[0]
    if name in EXAMPLES:
        return EXAMPLES[name]
    return next((f"hf:{model_id}" for published, model_id in HF_MODELS if published == name), None)


def method_of(row: dict[str, str]) -> str:
    """"qlora", "lora" or "full" (pre-training, SFT and full fine-tuning train every weight)."""
    what = row["model"].split(" (", 1)[-1].lower()
    if "qlora" in what:
        return "qlora"
    return "lora" if "lora" in what else "full"


def note_int(notes: str, key: str) -> int | None:
    """The integer after `key=` in the notes ("GBS=128" -> 128), None where absent."""
    match = re.search(rf"(?<![\w']){re.escape(key)}=(\d+)", notes)
    return int(match.group(1)) if match else None


def seq_len_of(row: dict[str, str]) -> int | None:
    """Tokens per sequence ("seq8192", "seq2048 (packed)"), None for images."""
    match = re.match(r"seq(\d+)", row["seq_len_or_image_size"])
    return int(match.group(1)) if match else None


MODEL_PARALLEL = (("PP", "pipeline parallelism (PP > 1)"), ("CP", "context parallelism (CP > 1)"),
                  ("EP", "expert parallelism (EP > 1)"))
"""Degrees the tool does not model, with the reason a row that uses one is skipped for (tensor parallelism
it models: --tp)."""


def tensor_degree(row: dict[str, str]) -> int:
    """The row's tensor-parallel degree (TP in the notes; 1 when absent)."""
    return note_int(row["notes"], "TP") or 1


def unsupported_layout(row: dict[str, str]) -> str | None:
    """Why the row's layout is not data and tensor parallel (the first of PP, CP, EP above 1; or a TP x PP x
    DP x CP that is not its GPU count); None where it is."""
    notes, gpus = row["notes"], int(row["num_gpus"])
    for key, reason in MODEL_PARALLEL:
        if (note_int(notes, key) or 1) > 1:
            return reason
    dp = note_int(notes, "DP")
    product = (note_int(notes, "TP") or 1) * (note_int(notes, "PP") or 1) * (note_int(notes, "CP") or 1) * (dp or 1)
    if dp is not None and dp > 1 and product != gpus:
        return "layout inconsistent with the GPU count (TP x PP x DP x CP != GPUs)"
    return None


FP8_LABELS = ("FP8", "MXFP8")
"""Precision labels that are float8 training (delayed, current, blockwise or MX scaling)."""


def precision_of(label: str, bf16: str, fp8: str = "fp8") -> str | None:
    """Our precision for a published label: float8 -> `fp8` (when the tool knows it; the source's framework
    decides: "fp8" under autocast, "fp8-master" for bf16 weights with fp32 masters), BF16 -> `bf16` (the
    source's framework decides: "bf16" for a model cast to bf16, "amp-bf16" under autocast, "bf16-master"
    for fp32 master weights in the optimizer), FP32 -> fp32, FP16 -> fp16 (pure); None for others."""
    if label.startswith(FP8_LABELS):
        return fp8 if fp8 in PRECISIONS else None
    for prefix, ours in (("BF16", bf16), ("FP32", "fp32"), ("FP16", "fp16")):
        if label.startswith(prefix):
            return ours
    return None


def precision_or_reason(row: dict[str, str], bf16: str, fp8: str = "fp8") -> str:
    """precision_of the row, or the reason it is skipped ("fp8 not known", "precision ...")."""
    ours = precision_of(row["precision"], bf16, fp8)
    if ours is not None:
        return ours
    return "fp8 not known" if row["precision"].startswith(FP8_LABELS) else f"precision {row['precision']}"


# ----------------------------------------------------------------------------- each source


def nikolasent(row: dict[str, str]) -> VisionRun | str:
    """NIKOLASENT_2022 and _2025: timm's benchmark.py, train mode, 224 px (module docstring)."""
    precision = precision_of(row["precision"], "bf16")
    if precision not in ("fp32", "fp16"):
        return f"precision {row['precision']}"
    batch = int(row["batch_size_per_gpu"]) if row["batch_size_per_gpu"] else None
    return VisionRun(row["model"], precision, batch)


MEGATRON_FUSION = "Megatron/TE's fused kernels predicted as torch.compile's fusion"
"""Megatron-Core with TransformerEngine runs fused normalisation, RoPE, SwiGLU, bias-dropout-add and
Adam kernels: the nearest the tool expresses is --compile."""

MEGATRON_BF16 = "bf16-master"
"""NeMo and Megatron train "bf16-mixed" as Megatron-Core's --bf16: the model in bf16 (weights, activations,
gradients), fp32 main weights and Adam state in the (distributed) optimizer: our bf16-master (until
2026-11-27 these rows ran as amp-bf16, which keeps fp32 weights whole on every rank and autocasts)."""
MEGATRON_FP8 = "fp8-master"
"""Megatron's fp8 (TransformerEngine's fp8 GEMMs) on the same bf16 model and fp32 masters: our fp8-master
(until 2026-11-27: fp8, float8 Linear layers under bf16 autocast over fp32 weights)."""


SQUAD_DOCUMENT_TOKENS = 200
"""Tokens of one SQuAD v1.1 example as NeMo's SFT packs it (assumption; no source gives it): a paragraph of
about 120 words (1.3 Llama tokens a word: ~160), a question of ~11 words (~15), a short answer and the
prompt template (~25). Attention's share at 4,096 tokens is 200 / 4,096 = 4.9%; 150 or 300 move a step by
about 1%."""


def packed_squad(row: dict[str, str]) -> int | None:
    """NeMo's fine-tuning on SQuAD packed into each sequence (SOURCES-newer.md: NeMo 24.07's SFT and LoRA
    rows; DGX Cloud's ft_llama3, whose recipe checks for the packed dataset's metadata): its documents' tokens;
    None for pre-training."""
    what = row["model"].split(" (", 1)[-1].lower()
    fine_tuning = "sft" in what or "lora" in what or "fine-tune" in what
    return SQUAD_DOCUMENT_TOKENS if fine_tuning else None


def megatron(row: dict[str, str], lora: tuple[int, tuple[str, ...]] | None, micro: int | None = None,
             assumption: str = "") -> PlanRun | str:
    """A NeMo/Megatron-Core run: each GPU's batch GBS / DP (DP: the row's GPUs), micro-batch MBS, Adam(W),
    Megatron's distributed optimizer (ZeRO-1: zero1) or, where the notes give FSDP > 0, Megatron FSDP (fsdp);
    no activation recomputation (the recipes of these 7B-13B models at TP=1 keep activations: assumption);
    LoRA `lora` = (rank, targets) for LoRA rows."""
    precision = precision_or_reason(row, MEGATRON_BF16, MEGATRON_FP8)
    if precision not in PRECISIONS:
        return precision
    notes, gpus = row["notes"], int(row["num_gpus"])
    global_batch = note_int(notes, "GBS") or note_int(notes, "'Batch Size'")
    micro = note_int(notes, "MBS") or micro
    if global_batch is None or micro is None:
        return "batch not published"
    strategy = "fsdp" if (note_int(notes, "FSDP") or 0) > 0 else "zero1"
    method = method_of(row)
    rank, targets = lora if method == "lora" and lora else (None, ())
    tp = tensor_degree(row)
    packing = packed_squad(row)
    return PlanRun(str(model_of(row)), precision, "adamw", global_batch * tp // gpus, micro, seq_len_of(row), False,
                   rank, targets, gpus=gpus, strategy=strategy,
                   assumption="; ".join(filter(None, (assumption, MEGATRON_FUSION,
                                                      f"SQuAD examples of {packing} tokens packed" if packing else ""))),
                   compiled=True, tp=tp, packing=packing)


NEMO1_LORA = (32, ("q_proj", "k_proj", "v_proj"))
"""NeMo 1's LoRA (24.07): adapter_dim 32 on attention_qkv (Megatron's fused QKV: our three projections)."""
NEMO2_LORA = (32, (ALL_LINEAR,))
"""NeMo 2's llm.peft.LoRA (24.12 on): dim 32 on linear_qkv, linear_proj, linear_fc1, linear_fc2: every Linear."""


def nemo_perf_2407(row: dict[str, str]) -> PlanRun | str:
    """NV_NEMO_PERF_2407: NeMo 24.07 on DGX-H100, FP8; LoRA as NeMo 1's default."""
    return megatron(row, NEMO1_LORA)


def nemo_longseq(row: dict[str, str]) -> PlanRun | str:
    """NV_NEMO_LONGSEQ: only a global batch is given; the micro-batch is taken as 1 (assumption, the
    Llama recipes' at long sequences). The with-CP layout listed beside the value gives its DP."""
    return megatron(row, None, micro=1, assumption="micro-batch 1 assumed")


def megatron_bridge(row: dict[str, str]) -> PlanRun | str:
    """NV_MBRIDGE_PERF: Megatron-Bridge recipes; B200/GB200 DDP with the distributed optimizer, H100 FSDP."""
    return megatron(row, NEMO2_LORA)


AUTOMODEL_FUSION = "TE's and triton's fused kernels predicted as torch.compile's fusion"
"""NeMo AutoModel's rows list their kernels ("kernels=TE + triton"): TransformerEngine's fused RMSNorm, SwiGLU
and RoPE modules and its triton LoRA kernels, the nearest of which the tool expresses is --compile (as
MEGATRON_FUSION for Megatron's)."""


def automodel(row: dict[str, str]) -> PlanRun | str:
    """NV_AUTOMODEL_PERF: NeMo AutoModel (FSDP2), the model loaded in bf16 (our bf16), LoRA dim 16 on
    '*_proj' (every projection: all-linear), AdamW, no activation checkpointing (the benchmark YAMLs set
    none), MBS x GA = GBS, its TE and triton kernels as --compile (AUTOMODEL_FUSION)."""
    precision = precision_or_reason(row, "bf16")
    if precision not in PRECISIONS:
        return precision
    notes, gpus = row["notes"], int(row["num_gpus"])
    global_batch, micro = note_int(notes, "GBS"), note_int(notes, "MBS")
    if global_batch is None or micro is None:
        return "batch not published"
    lora = method_of(row) == "lora"
    loaded = re.search(r"loads (meta-llama/[\w.-]+)", notes)  # "Llama 3 8B" whose config loads Llama-3.1-8B
    model = f"hf:{loaded.group(1)}" if loaded else str(model_of(row))
    tp = tensor_degree(row)  # FSDP2 between tensor-parallel groups (DTensor's TP): GBS / (GPUs / TP) each
    fused = re.search(r"kernels=TE\b", notes) is not None  # TransformerEngine's fused modules, triton's LoRA
    return PlanRun(model, precision, "adamw", global_batch * tp // gpus, micro, seq_len_of(row), False,
                   16 if lora else None, (ALL_LINEAR,) if lora else (), gpus=gpus, strategy="fsdp", tp=tp,
                   compiled=fused, assumption=AUTOMODEL_FUSION if fused else "")


TRAINER_RUNTIME_SPANS_EVALUATION = "train_samples_per_second spans an epoch-end evaluation and checkpoint"
"""DGX Cloud's Hugging Face rows are not training throughput: their launch scripts (hf-mistral/launch_7b.sh,
hf-llama2/launch_70b.sh @35a9aecc) run --max_steps 100 / 30 with --evaluation_strategy epoch and
--save_strategy epoch, and transformers' Trainer times train_runtime from before its loop to after the
epoch-end _maybe_log_save_evaluate (evaluation over ultrachat_200k's test split, then an FSDP checkpoint;
trainer.py _inner_training_loop / _finalize_training), which a stop at max_steps runs too; the same recipe on
256 GPUs logged epoch 6.25 in its 100 steps (README_7b.md), six evaluations inside its runtime. Their
step (FSDP, LoRA r=8 on every projection, checkpointing, per-device batch x grad accumulation) is one the
tool can time; the number they publish is not its throughput (decision 2026-11-28; until then they were
rows, +51% and +200%)."""


def dgx_cloud(row: dict[str, str]) -> PlanRun | str:
    """NV_DGXC_BENCH: NeMo 24.12 fine-tuning (ft_llama3: bf16-mixed or FP8, NeMo 2's LoRA, distributed
    optimizer); the Hugging Face Trainer rows are skipped (TRAINER_RUNTIME_SPANS_EVALUATION)."""
    if "transformers" not in row["framework"]:
        return megatron(row, NEMO2_LORA)
    return TRAINER_RUNTIME_SPANS_EVALUATION


def jax_toolbox(row: dict[str, str]) -> PlanRun | str:
    """NV_JAXTOOLBOX (JAX/XLA, compiled: our trace is PyTorch's eager step of the same model): T5X's ViT-B/16
    data parallel, MaxText's Llama 2 7B with FSDP=8; bf16 activations with fp32 weights (amp-bf16), AdamW;
    MaxText's remat policy minimal_flash keeps the projections' outputs (no checkpointing here)."""
    precision = precision_or_reason(row, "amp-bf16")
    if precision not in PRECISIONS:
        return precision
    gpus, batch = int(row["num_gpus"]), int(row["batch_size_per_gpu"])
    strategy = "fsdp" if (note_int(row["notes"], "FSDP") or 0) > 1 else "ddp"
    return PlanRun(str(model_of(row)), precision, "adamw", batch, None, seq_len_of(row), gpus=gpus,
                   strategy=strategy, assumption="JAX/XLA run, its fusion predicted as torch.compile's",
                   compiled=True)


TORCHTUNE_LORA = {
    ("Llama 2 7B", "qlora", 1): (("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), True),
    ("Llama 2 7B", "lora", 1): (("q_proj", "v_proj"), True),
    ("Llama 2 7B", "lora", 2): (("q_proj", "v_proj"), False),
    ("Llama 3.1 8B", "lora", 1): (("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), True),
    ("Llama 3.1 8B", "qlora", 1): (("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), True),
}
"""torchtune's configs (model, method, GPUs) -> (LoRA targets in transformers' names, activation checkpointing):
llama2/7B_qlora_single_device (q, k, v, output_proj and the MLP), 7B_lora_single_device (q, v),
7B_lora (distributed: q, v, no checkpointing), llama3_1/8B_lora_single_device and 8B_qlora_single_device
(q, v, output_proj and the MLP); all rank 8."""


def torchtune(row: dict[str, str]) -> PlanRun | str:
    """TORCHTUNE_README: the recipes' default dtype bf16 (the whole model in bf16: our bf16), LoRA rank 8,
    QLoRA's base in NF4 with quantized scales (nf4-dq), several GPUs under FSDP; the runs the notes say
    were compiled as --compile. Full fine-tuning: llama3_1/8B_full_single_device runs bitsandbytes' PagedAdamW8bit
    (our adamw8bit; the paging is not modelled), 7B_full (4 GPUs) AdamW with checkpointing; the 1-GPU
    Llama 2 7B full run's PagedAdamW keeps 32-bit states paged to host memory, which the tool cannot express.
    The 2- and 4-GPU rows' tokens/s are one GPU's (per_gpu): the table (README.md @0217d44, 2024-05-09)
    reports the recipes' logged "tokens_per_second", which the distributed recipes computed on rank zero alone
    from its own batch (`num_tokens += input_ids.numel()` over rank zero's steps, `num_tokens /
    time_per_step`, recipes/full_finetune_distributed.py and lora_finetune_distributed.py @0217d44), and which
    the same author renamed `tokens_per_second_per_gpu` two days later (dc2b991, 2024-05-11)."""
    gpus, method, name = int(row["num_gpus"]), method_of(row), row["model"].split(" (")[0]
    precision = precision_or_reason(row, "bf16")
    if precision not in PRECISIONS:
        return precision
    common = dict(batch=int(row["batch_size_per_gpu"]), seq_len=seq_len_of(row), gpus=gpus, strategy="fsdp",
                  compiled="compile" in row["notes"], per_gpu=gpus > 1)
    model = str(model_of(row))
    if method == "full":
        if gpus == 1 and name == "Llama 2 7B":
            return "PagedAdamW: 32-bit states paged to host memory"
        return PlanRun(model, precision, "adamw8bit" if gpus == 1 else "adamw", checkpointing=True, **common)
    targets, checkpointing = TORCHTUNE_LORA[(name, method, gpus)]
    return PlanRun(model, precision, "adamw", checkpointing=checkpointing, lora=8, lora_targets=targets,
                   base_weights="nf4-dq" if method == "qlora" else None, **common)


ULT_LORA_DROPOUT = 0.05
"""universal-llm-trainer's peft LoraConfig lora_dropout (config_lora/llm_lora_config.yaml @4e15b5f)."""


def universal_llm_trainer(row: dict[str, str]) -> PlanRun | str:
    """ULT_GPU_TEST: the model in bf16 (our bf16), AdamW, gradient checkpointing, batch 2 of 8,192 tokens,
    LoRA r=8 on every projection with peft's lora_dropout 0.05 (config_lora/llm_lora_config.yaml); a LoRA
    "step" is one micro-batch: the trainer's loop
    (ljm565/universal-llm-trainer src/trainer/trainer.py @aefdc4a) runs forward and backward per batch and
    steps the optimizer every `gradient_accumuate_step` batches (SOURCES-newer.md left this open). Its
    `--gpu_test` mode draws random ids over all 8,192 positions but keeps the loaded ARC sample's attention
    mask (src/data_collection/qa_dataset.py __getitem__, src/trainer/trainer.py line 279): the inputs carry a
    padding mask (--padding-mask; its share of padding is the product's, not the sample's ~160 tokens: any
    mask below the sequence length runs the same masked kernels over every score)."""
    precision = precision_or_reason(row, "bf16")
    if precision not in PRECISIONS:
        return precision
    lora = method_of(row) == "lora"
    return PlanRun(str(model_of(row)), precision, "adamw", int(row["batch_size_per_gpu"]), None,
                   seq_len_of(row), True, 8 if lora else None, (ALL_LINEAR,) if lora else (),
                   assumption="one micro-batch per step" if lora else "",
                   lora_dropout=ULT_LORA_DROPOUT if lora else None, padding_mask=True)


SOURCE_RUNS: dict[str, Callable[[dict[str, str]], Run | str]] = {
    "NIKOLASENT_2022": nikolasent,
    "NIKOLASENT_2025": nikolasent,
    "NV_NEMO_PERF_2407": nemo_perf_2407,
    "NV_NEMO_LONGSEQ": nemo_longseq,
    "NV_MBRIDGE_PERF": megatron_bridge,
    "NV_AUTOMODEL_PERF": automodel,
    "NV_DGXC_BENCH": dgx_cloud,
    "NV_JAXTOOLBOX": jax_toolbox,
    "TORCHTUNE_README": torchtune,
    "ULT_GPU_TEST": universal_llm_trainer,
}


def run_of(row: dict[str, str], gpu_known: bool = True) -> Run | str:
    """The row's run, or why the tool cannot express it, in this order: its layout (TP, PP, CP, EP), its
    model, its GPU (`gpu_known`: the label's id is in the database), then the source's own settings
    (precision, batch)."""
    layout = unsupported_layout(row)
    if layout is not None:
        return layout
    if row["source_id"] not in ("NIKOLASENT_2022", "NIKOLASENT_2025") and model_of(row) is None:
        return "model not in the shipped hf catalog"
    if not gpu_known:
        return "GPU not in hwdb"
    return SOURCE_RUNS[row["source_id"]](row)
