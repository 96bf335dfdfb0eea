"""Arguments shared by the commands and the parsers of their values, without importing torch
(`advisor --help` and `advisor gpus` never import it).

Numbers are checked where they are parsed, so a wrong one is refused before any trace runs: finite,
in range, one sentence through argparse (exit 2).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

from advisor.app.request import PARALLEL_CHOICES, PLAN_MODES, PlanRequest, input_pipeline_default
from advisor.errors import shorten
from advisor.estimate.costs import DEFAULT_SAMPLES
from advisor.limits import (
    MAX_BATCH_SIZE,
    MAX_CONTEXT_MIB,
    MAX_EPOCHS,
    MAX_HOURS,
    MAX_JOB_SAMPLES,
    MAX_JOB_TOKENS,
    MAX_LORA_RANK,
    MAX_NUM_GPUS,
    MAX_SEQ_LEN,
    MAX_TRACE_TIMEOUT_S,
    MAX_USD,
    MAX_VCPUS_PER_GPU,
    MAX_WORKERS,
)
from advisor.profile.choices import (
    ALL_LINEAR,
    BASE_WEIGHTS,
    DEFAULT_OPTIMIZER,
    DEFAULT_PRECISION,
    FILE_OPTIMIZER,
    LANGUAGE_MODEL_PRECISION,
    OPTIMIZER_CHOICES,
    PRECISIONS,
)
from advisor.profile.model_file import DEFAULT_BATCH_SIZE, DEFAULT_EXAMPLE, builtin_examples
from advisor.profile.watch import DEFAULT_TRACE_TIMEOUT_S



class HelpWithExamples(argparse.HelpFormatter):
    """argparse's help, descriptions wrapped to the terminal, the examples epilog kept line by line."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def examples(*commands: tuple[str, str]) -> dict[str, object]:
    """add_parser's keywords for an epilog of (command line, what it does) pairs under "examples:"."""
    lines = [f"  # {what}\n  {command}" for command, what in commands]
    return {"epilog": "examples:\n" + "\n".join(lines), "formatter_class": HelpWithExamples}


def positive_int(text: str, limit: int | None = None) -> int:
    """A whole number from 1 to `limit` (none when None)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    if limit is not None and value > limit:
        raise argparse.ArgumentTypeError(f"must be at most {limit:,}, got {shorten(text, 30)}")
    return value


def name_list(text: str) -> list[str]:
    """Comma-separated names ("q_proj,v_proj"), each stripped; an argparse type."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected names separated by commas, got '{shorten(text, 40)}'")
    return names


def bounded_int(limit: int) -> Callable[[str], int]:
    """An argparse type: a whole number from 1 to `limit`."""
    def parse(text: str) -> int:
        return positive_int(text, limit)
    return parse


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got '{text}'")
    return value


def positive_float(text: str, limit: float = math.inf) -> float:
    """A finite number above 0 and at most `limit`."""
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    if value > limit:
        raise argparse.ArgumentTypeError(f"must be at most {limit:,g}, got {text}")
    return value


def non_negative_float(text: str, limit: float = math.inf) -> float:
    """A finite number from 0 to `limit`."""
    value = _number(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    if value > limit:
        raise argparse.ArgumentTypeError(f"must be at most {limit:,g}, got {text}")
    return value


def bounded_float(limit: float, allow_zero: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number above 0 (or from 0) up to `limit`."""
    def parse(text: str) -> float:
        return non_negative_float(text, limit) if allow_zero else positive_float(text, limit)
    return parse


_quiet = False


def set_quiet(quiet: bool) -> None:
    """--quiet: no progress lines and no notes from here on (errors are printed where they are caught)."""
    global _quiet
    _quiet = quiet


def progress(message: str) -> None:
    """A progress line on stderr, only where a person watches (a terminal), unless --quiet."""
    if sys.stderr.isatty() and not _quiet:
        print(f"advisor: {message}", file=sys.stderr, flush=True)


def note(message: str) -> None:
    """A note on stderr ("advisor: note: ..."), unless --quiet."""
    if not _quiet:
        print(f"advisor: note: {message}", file=sys.stderr, flush=True)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """MODEL, --batch-size, --precision, --optimizer: shared by profile, memory, estimate and report."""
    parser.add_argument(
        "model", nargs="?", metavar="MODEL",
        help=f"model file (.py with build_model() and example_input(batch_size)) or a built-in example: "
             f"{', '.join(builtin_examples())} (default: {DEFAULT_EXAMPLE})",
    )
    parser.add_argument("--batch-size", type=bounded_int(MAX_BATCH_SIZE), metavar="N",
                        help=f"samples per step (default: the file's BATCH_SIZE, else {DEFAULT_BATCH_SIZE})")
    parser.add_argument("--precision", choices=PRECISIONS,
                        help="fp32 (strict), tf32 (fp32 matmuls on TF32 tensor cores), amp-fp16/amp-bf16 "
                             "(autocast, mixed precision: the math in 16 bits, fp32 master weights, gradients and "
                             "optimizer state, plus a 16-bit copy of the weights: faster, but more memory than "
                             "fp32), bf16/fp16 (pure: weights, gradients and Adam's state in 16 bits, half of "
                             "fp32's memory, less exact updates), bf16-master (bf16 weights, activations and "
                             "gradients, fp32 master weights, their gradients and optimizer state, as Megatron's "
                             "--bf16 and DeepSpeed's bf16 train; ZeRO-1 shards the masters), fp8 (Linear layers in float8 as "
                             "TransformerEngine and torchao run them, the rest as amp-bf16; GPUs with fp8 tensor "
                             f"cores: Ada, Hopper, Blackwell), fp8-master (the same float8 Linear layers in a "
                             f"bf16-master model, as Megatron trains in fp8); default {LANGUAGE_MODEL_PRECISION} for a "
                             f"language model (one with a sequence length: SEQ_LEN, hf:), else {DEFAULT_PRECISION}")
    parser.add_argument("--optimizer", choices=OPTIMIZER_CHOICES,
                        help=f"'{FILE_OPTIMIZER}': what the model file's optimizer(params) builds; default: that "
                             f"when the file defines one, else {DEFAULT_OPTIMIZER}")
    parser.add_argument("--seq-len", type=bounded_int(MAX_SEQ_LEN), metavar="L",
                        help="tokens per sample of a sequence model (default: the file's SEQ_LEN; its "
                             "example_input must take seq_len)")
    parser.add_argument("--padding-mask", action="store_true",
                        help="a model by name (hf:) trains on padded batches: its inputs carry an attention mask "
                             "with zeros over the padding, so attention runs masked over every position (flash "
                             "attention takes no mask; model files return their own attention_mask)")
    parser.add_argument("--packing", type=bounded_int(MAX_SEQ_LEN), metavar="TOKENS",
                        help="each sequence is packed from documents of TOKENS tokens on average (TRL's packing, "
                             "NeMo's packed SFT): attention runs within each document, as flash attention's "
                             "variable-length kernels run it")
    parser.add_argument("--lora", type=bounded_int(MAX_LORA_RANK), metavar="RANK",
                        help="fine-tune LoRA adapters of this rank, the rest of the model frozen (peft's LoRA)")
    parser.add_argument("--lora-targets", type=name_list, metavar="NAME,...",
                        help=f"the Linear layers LoRA adapts, by name (q_proj,v_proj) or {ALL_LINEAR}; default: "
                             "the architecture's attention projections, as peft chooses them")
    parser.add_argument("--lora-dropout", type=float, metavar="P",
                        help="peft's lora_dropout: each adapter drops its input's elements with probability P "
                             "(0.05 and 0.1 are usual; its mask and output are kept for the backward); default 0")
    parser.add_argument("--base-weights", choices=BASE_WEIGHTS,
                        help="how the frozen base is stored: bf16, or its Linear layers in bitsandbytes' 4-bit "
                             "NormalFloat (nf4; nf4-dq: double quantization, QLoRA) or LLM.int8 (int8); default "
                             "bf16 with --lora under amp-bf16")
    parser.add_argument("--trace-timeout", type=bounded_float(MAX_TRACE_TIMEOUT_S, allow_zero=True),
                        default=DEFAULT_TRACE_TIMEOUT_S, metavar="SECONDS",
                        help=f"stop tracing a step that takes longer (default {DEFAULT_TRACE_TIMEOUT_S:g}; 0: no limit)")


def add_memory_arguments(parser: argparse.ArgumentParser) -> None:
    """--gpu, --checkpointing, --micro-batch, --cuda-context-mib: shared by memory and estimate."""
    parser.add_argument("--gpu", action="append", default=[], metavar="ID",
                        help="a GPU id from `advisor gpus` (repeatable; default: every GPU)")
    parser.add_argument("--checkpointing", action="store_true",
                        help="activation (gradient) checkpointing of the model's repeated blocks")
    parser.add_argument("--micro-batch", type=bounded_int(MAX_BATCH_SIZE), metavar="N",
                        help="samples per forward/backward; the batch is reached by gradient accumulation "
                             "(the batch must be a multiple of it)")
    parser.add_argument("--cuda-context-mib", type=bounded_float(MAX_CONTEXT_MIB, allow_zero=True), metavar="MIB",
                        help="CUDA context size instead of the database's (e.g. ~1300 for stacks without "
                             "lazy loading, CUDA < 11.7)")
    gpus = parser.add_argument_group("several GPUs (data parallel; --batch-size is then each GPU's)")
    gpus.add_argument("--num-gpus", type=bounded_int(MAX_NUM_GPUS), metavar="N",
                      help="GPUs of each type the job runs on; whole instances are rented, several with a network "
                           "between them (default: one, and the fewest that fit where one does not)")
    gpus.add_argument("--parallel", choices=PARALLEL_CHOICES, default="auto",
                      help="ddp, zero1 (sharded optimizer state), zero2 (and gradients), fsdp (and weights: "
                           "ZeRO-3, fully_shard), hsdp (fsdp in each node, replicated across nodes); auto: the "
                           "fastest that fits (default)")
    gpus.add_argument("--tp", type=bounded_int(MAX_NUM_GPUS), metavar="K",
                      help="tensor-parallel degree inside a node (with --parallel tp; not modelled yet)")


def add_estimate_arguments(parser: argparse.ArgumentParser) -> None:
    """The model, training settings, targets and job: shared by `estimate` and `report`."""
    add_model_arguments(parser)
    add_memory_arguments(parser)
    parser.add_argument("--compile", action="store_true",
                        help="time the step as torch.compile runs it: the ops between matrix products, "
                             "convolutions and attention fused into generated kernels (memory as eager)")
    parser.add_argument("--sync-each-step", action="store_true",
                        help="the training loop reads a value back from the GPU every step (loss.item() for a "
                             "log or progress bar, Hugging Face Trainer's NaN check): the host cannot issue the "
                             "next step while the GPU runs this one")
    parser.add_argument("--local", action="store_true",
                        help="add this machine's devices (local-cpu, local-cudaN), timed from the local calibration "
                             "(a quick one is measured and cached when none is)")
    job = parser.add_argument_group("job (default: the model file's TRAIN_SAMPLES, else "
                                    f"{DEFAULT_SAMPLES:,} samples, x 1 epoch)")
    job.add_argument("--samples", type=bounded_int(MAX_JOB_SAMPLES), metavar="N", help="samples in one epoch")
    job.add_argument("--epochs", type=bounded_float(MAX_EPOCHS), metavar="E", help="passes over the samples (default 1)")
    job.add_argument("--steps", type=bounded_int(MAX_JOB_SAMPLES), metavar="N",
                     help="optimizer steps instead of samples x epochs")
    job.add_argument("--tokens", type=bounded_int(MAX_JOB_TOKENS), metavar="N",
                     help="tokens to train on, in sequences of the sequence length (default: the file's "
                          "TRAIN_TOKENS when it has one)")
    parser.add_argument("--provider", metavar="P", help="only this provider's cloud offers (see `advisor gpus`)")
    parser.add_argument("--spot", action="store_true", help="rank cost by spot prices instead of on-demand")
    parser.add_argument("--plans", choices=PLAN_MODES, default="auto",
                        help="the fit advisor: other settings that fit, each traced and estimated (auto: when "
                             "nothing fits; always: also faster or cheaper ways; never)")
    feeding = parser.add_argument_group("input pipeline (the CPU's side: the file's dataset(), else a built-in "
                                        "one for its inputs, timed on this machine)")
    feeding.add_argument("--no-input-pipeline", dest="input_pipeline", action="store_false", default=None,
                         help="do not time the input pipeline, nor weigh its supply against each GPU's demand")
    feeding.add_argument("--workers", type=bounded_int(MAX_WORKERS), metavar="N",
                         help="DataLoader workers per GPU (default: every vCPU of the GPU's share of its host "
                              "but the training process's)")
    feeding.add_argument("--vcpus-per-gpu", type=bounded_float(MAX_VCPUS_PER_GPU), metavar="V",
                         help="the host's vCPUs per GPU, for every GPU (default: those of the GPU's priced "
                              "cloud instance, else this machine's CPUs)")
    feeding.add_argument("--host-cpu", metavar="ID",
                         help="the host's CPU, for every GPU: its single-thread speed against this machine's "
                              "scales the pipeline (default: the instance's CPU; ids in hwdb/host-cpus.yaml)")
    goals = parser.add_argument_group("goals (each adds the device that meets it best)")
    goals.add_argument("--budget-usd", type=bounded_float(MAX_USD), metavar="USD",
                       help="the fastest device whose rented job costs at most this")
    goals.add_argument("--deadline-hours", type=bounded_float(MAX_HOURS), metavar="H",
                       help="the cheapest device to rent that finishes the job within this")
    goals.add_argument("--max-price-usd", type=bounded_float(MAX_USD), metavar="USD",
                       help="the fastest card to buy that costs at most this")


def request_from_arguments(args: argparse.Namespace) -> PlanRequest:
    """The command line's options as the one request every interface makes (advisor.app). Commands
    without some options (memory has no job) leave those at the request's defaults."""
    context = getattr(args, "cuda_context_mib", None)
    return PlanRequest(
        model=args.model, batch_size=args.batch_size, precision=args.precision, optimizer=args.optimizer,
        checkpointing=getattr(args, "checkpointing", False), compiled=getattr(args, "compile", False),
        sync_each_step=getattr(args, "sync_each_step", False),
        micro_batch=getattr(args, "micro_batch", None),
        cuda_context_mib=context, trace_timeout_s=args.trace_timeout, gpus=tuple(unique(getattr(args, "gpu", []))),
        local=getattr(args, "local", False), samples=getattr(args, "samples", None),
        epochs=getattr(args, "epochs", None), steps=getattr(args, "steps", None),
        tokens=getattr(args, "tokens", None), seq_len=getattr(args, "seq_len", None),
        padding_mask=getattr(args, "padding_mask", False), packing=getattr(args, "packing", None),
        provider=getattr(args, "provider", None), spot=getattr(args, "spot", False),
        budget_usd=getattr(args, "budget_usd", None), deadline_hours=getattr(args, "deadline_hours", None),
        max_price_usd=getattr(args, "max_price_usd", None), lora=getattr(args, "lora", None),
        lora_targets=tuple(getattr(args, "lora_targets", None) or ()), base_weights=getattr(args, "base_weights", None),
        lora_dropout=getattr(args, "lora_dropout", None),
        plans=getattr(args, "plans", "auto"),
        input_pipeline=getattr(args, "input_pipeline", None) is not False and input_pipeline_default(),
        workers=getattr(args, "workers", None), vcpus_per_gpu=getattr(args, "vcpus_per_gpu", None),
        host_cpu=getattr(args, "host_cpu", None), num_gpus=getattr(args, "num_gpus", None),
        parallel=getattr(args, "parallel", "auto"), tp=getattr(args, "tp", None),
    )


def unique(values: list[str]) -> list[str]:
    """`values` without repeats, first occurrence kept (a GPU named twice is estimated once)."""
    return list(dict.fromkeys(values))
