"""Real torch.distributed training steps with the gloo backend on this CPU, for tests/test_distributed.py.

Each rank builds a model, wraps it as a strategy runs it (DDP; DDP with ZeroRedundancyOptimizer for
zero1; fully_shard on advisor's FSDP units and the root, with reshard_after_forward off for zero2),
takes two steps (the optimizer's state appears, DDP rebuilds its buckets), then measures:
- its peak live tensor bytes, from the c10 CPU allocator's every allocation and free as torch's
  profiler records them (profile_memory=True) from before the model is built;
- the bytes it hands each collective (all-reduce's buffer, all-gather's output, reduce-scatter's input,
  broadcast's tensors), counted by a TorchDispatchMode on the c10d ops, as CommDebugMode counts calls.
gloo finishes collectives on its own threads, which a small machine starves: buffers of collectives
still in flight pile up, so a rank's peak varies between steps and runs (FSDP on 2 cores: up to 50% on a
parameter-heavy MLP, 10-15% on the transformers); every measured step's peak is kept.
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode


MEASURED_STEPS = 3
"""Steps whose peak is measured, after the first (the optimizer's state) and the counted one."""


@dataclass(frozen=True)
class Case:
    """A model (by the name of its builder in MODELS), how it trains, and the batch per rank."""

    model: str
    strategy: str
    batch_size: int
    precision: str = "fp32"
    """"fp32", or "amp-bf16": the step under CPU autocast to bfloat16, and fully_shard with torchtitan's
    MixedPrecisionPolicy (parameters gathered in bfloat16, gradients reduced in float32)."""


@dataclass(frozen=True)
class Measured:
    peaks: tuple[int, ...]
    """The peak live bytes of each measured step."""
    collective_bytes: dict[str, int]
    collective_calls: dict[str, int]


class CollectiveBytes(TorchDispatchMode):
    """Bytes and calls of the c10d collectives run under it, by kind."""

    KIND = {"allreduce_": "all_reduce", "_allgather_base_": "all_gather", "allgather_into_tensor_coalesced_":
            "all_gather", "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_tensor_coalesced_":
            "reduce_scatter", "broadcast_": "broadcast", "allgather_": "all_gather"}

    def __init__(self) -> None:
        super().__init__()
        self.bytes: dict[str, int] = {}
        self.calls: dict[str, int] = {}

    FUNCTIONAL = {"all_reduce": "all_reduce", "all_reduce_": "all_reduce"}
    """DTensor's collectives (_c10d_functional): tensor parallelism's all-reduces."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        out = func(*args, **(kwargs or {}))
        if func.namespace == "_c10d_functional" and name in self.FUNCTIONAL:
            kind = self.FUNCTIONAL[name]
            self.bytes[kind] = self.bytes.get(kind, 0) + self._message_bytes(name, args)
            self.calls[kind] = self.calls.get(kind, 0) + 1
        elif func.namespace == "c10d" and name in self.KIND:
            kind = self.KIND[name]
            self.bytes[kind] = self.bytes.get(kind, 0) + self._message_bytes(name, args)
            self.calls[kind] = self.calls.get(kind, 0) + 1
        return out

    @staticmethod
    def _message_bytes(name: str, args: tuple) -> int:
        def size(value: Any) -> int:
            if isinstance(value, torch.Tensor):
                return value.numel() * value.element_size()
            return sum(size(v) for v in value) if isinstance(value, (list, tuple)) else 0
        if name in ("_allgather_base_", "allgather_into_tensor_coalesced_", "allgather_"):
            return size(args[0])  # the gathered output
        if name in ("_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_"):
            return size(args[1])  # the input, before scattering
        return size(args[0])


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)) for _ in range(4)],
                         nn.Linear(256, 16))


def mlp_input(batch: int) -> torch.Tensor:
    return torch.randn(batch, 256)


def convnet() -> nn.Module:
    torch.manual_seed(0)
    def block(channels: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU())
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), *[block(32) for _ in range(3)],
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 12))


def convnet_input(batch: int) -> torch.Tensor:
    return torch.randn(batch, 3, 16, 16)


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=3, n_head=4)
    return GPT2LMHeadModel(config)


def llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config)


def llama_input(batch: int) -> torch.Tensor:
    return torch.randint(0, 256, (batch, 32))


def classification_loss(output: Any, batch: torch.Tensor) -> torch.Tensor:
    return output.float().pow(2).mean()


def causal_lm_loss(output: Any, batch: torch.Tensor) -> torch.Tensor:
    logits = output.logits
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[int], Any], Callable[[Any, Any], torch.Tensor]]] = {
    "mlp": (mlp, mlp_input, classification_loss),
    "convnet": (convnet, convnet_input, classification_loss),
    "llama": (llama, llama_input, causal_lm_loss),
    "gpt2": (gpt2, llama_input, causal_lm_loss),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(world: int, cases: list[Case]) -> list[list[Measured]]:
    """Every case on `world` gloo ranks of this machine: per case, each rank's measurement."""
    queue = mp.get_context("spawn").SimpleQueue()
    port = free_port()
    mp.spawn(_rank, args=(world, port, cases, queue), nprocs=world)
    results: dict[int, list[Measured]] = {}
    for _ in range(world):
        rank, measured = queue.get()
        results[rank] = measured
    return [[results[rank][i] for rank in range(world)] for i in range(len(cases))]


def _rank(rank: int, world: int, port: int, cases: list[Case], queue: Any) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        queue.put((rank, [_measure(case, world) for case in cases]))
    finally:
        dist.destroy_process_group()


def _measure(case: Case, world: int) -> Measured:
    build, make_input, loss_fn = MODELS[case.model]
    batch = make_input(case.batch_size)
    gc.collect()  # the last case's model and optimizer freed before this one's allocations are counted
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
    profiler.__enter__()
    try:
        model, optimizer = _wrapped(build(), case.strategy, world, case.precision)
        autocast = case.precision == "amp-bf16"

        def step() -> None:
            with _loss_context(case.strategy):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    loss = loss_fn(model(batch), batch)
                loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step()
        step()  # DDP rebuilds its buckets in its second step (broadcasting their order)
        counter = CollectiveBytes()
        with counter:
            step()
        for _ in range(MEASURED_STEPS):
            with torch.profiler.record_function("measured step"):
                step()
    finally:
        profiler.__exit__(None, None, None)
    del model, optimizer
    gc.collect()
    return Measured(_step_peaks(profiler), counter.bytes, counter.calls)


def _loss_context(strategy: str) -> Any:
    """Tensor parallelism computes the loss on the vocabulary-split logits (loss_parallel), forward and
    backward."""
    if strategy != "tp":
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel
    return loss_parallel()


def _tensor_parallel(model: nn.Module, world: int) -> nn.Module:
    """`model` (a Hugging Face Llama) split over `world` ranks as torchtitan's Llama plan splits it: the
    colwise and rowwise layers advisor.parallel.tensor names, the embedding by vocabulary (its output
    replicated) and the head by vocabulary (its logits left split for loss_parallel)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from advisor.parallel.tensor import linear_kind
    plan: dict[str, Any] = {}
    for name, module in model.named_modules():
        kind = linear_kind(name) if isinstance(module, nn.Linear) and ".layers." in name else None
        if kind is not None and kind[1] == name:
            plan[name] = ColwiseParallel() if kind[0] == "colwise" else RowwiseParallel()
    plan["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate())
    plan["lm_head"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    return parallelize_module(model, init_device_mesh("cpu", (world,)), plan)


def _wrapped(model: nn.Module, strategy: str, world: int,
             precision: str = "fp32") -> tuple[nn.Module, torch.optim.Optimizer]:
    """`model` and its AdamW as `strategy` runs them; foreach=True as torch picks for CUDA tensors (on CPU it
    would step each tensor alone)."""
    from advisor.parallel.strategy import fsdp_units
    if strategy == "single":  # one GPU's step, for comparison
        return model, torch.optim.AdamW(model.parameters(), foreach=True)
    if strategy == "tp":  # one tensor at a time: the norms' plain parameters and the DTensors do not mix in a list
        model = _tensor_parallel(model, world)
        return model, torch.optim.AdamW(model.parameters(), foreach=False)
    if strategy in ("ddp", "zero1"):
        from torch.nn.parallel import DistributedDataParallel
        # init_sync=False: every rank built the same seeded model, and gloo may keep the flattened copy of
        # the parameters that DDP's start-up broadcast makes alive for as long as the process group lives
        # (seen in 1 run of 8: one parameter-sized buffer more on one rank), which NCCL frees at once
        wrapped = DistributedDataParallel(model, init_sync=False)
        if strategy == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            return wrapped, ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class=torch.optim.AdamW,
                                                    foreach=True)
        return wrapped, torch.optim.AdamW(wrapped.parameters(), foreach=True)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh("cpu", (world,))
    counts = {name: sum(p.numel() for p in m.parameters() if p.requires_grad) for name, m in model.named_modules()}
    options: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": strategy == "fsdp"}
    if precision == "amp-bf16":
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for name in fsdp_units(counts).blocks:
        fully_shard(model.get_submodule(name), **options)
    fully_shard(model, **options)
    return model, torch.optim.AdamW(model.parameters(), foreach=True)


def _step_peaks(profiler: Any) -> tuple[int, ...]:
    """The highest live bytes during each "measured step" range, counting from the first recorded allocation."""
    events = list(profiler.profiler.kineto_results.events())
    ranges = sorted((e.start_ns(), e.start_ns() + e.duration_ns()) for e in events if e.name() == "measured step")
    memory = sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns())
    live, peaks = 0, [0] * len(ranges)
    for event in memory:
        live += event.nbytes()
        for i, (start, end) in enumerate(ranges):
            if start <= event.start_ns() <= end:
                peaks[i] = max(peaks[i], live)
    return tuple(peaks)
