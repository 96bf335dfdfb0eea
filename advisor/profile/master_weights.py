"""Low-precision weights stepped through fp32 master copies: `--precision bf16-master`.

Megatron-Core (`--bf16`, with or without its distributed optimizer), NeMo's Megatron models, DeepSpeed's
bf16 optimizer and apex's O2 train a model whose weights, activations and gradients are bf16, while the
optimizer keeps an fp32 copy of every weight (the master), an fp32 gradient for it and its own state in
fp32: each step casts the bf16 gradients to fp32, updates the masters, and writes them back into the bf16
weights. ZeRO-1 and Megatron's distributed optimizer shard the masters with the rest of the optimizer
state, which is where this differs in memory from autocast (fp32 weights on every rank, plus bf16 copies
for the forward) and from pure bf16 (no master, bf16 state). The fp32 gradients are kept between steps, as
DeepSpeed's bf16 optimizer keeps its fp32 gradient accumulation buffers (Megatron with
--accumulate-allreduce-grads-in-fp32 keeps a full one; without it, fp32 copies of its shard during the
step): 20 bytes per Adam-trained parameter, 16 of them (master, its gradient, two moments) optimizer state.

MasterWeights is that optimizer, wrapping any torch optimizer: its state, per model parameter, is the
master, its fp32 gradient and the wrapped optimizer's state of the master, so the tracer labels and shards
it as optimizer state, and repeats it per held-out block, as it does any optimizer's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

MASTER_DTYPE = torch.float32


class _MasterState(Mapping):
    """Model parameter -> {"master": its fp32 copy, "master_grad": that copy's fp32 gradient buffer, and the
    wrapped optimizer's state of the copy}."""

    def __init__(self, owner: MasterWeights) -> None:
        self._owner = owner

    def __getitem__(self, param: torch.Tensor) -> dict[str, Any]:
        index = self._owner.index_of(param)
        master = self._owner.masters[index]
        return {"master": master, "master_grad": self._owner.master_grads[index],
                **self._owner.inner.state.get(master, {})}

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self._owner.model_params)

    def __len__(self) -> int:
        return len(self._owner.model_params)


class MasterWeights(torch.optim.Optimizer):
    """`make_inner(masters)`'s optimizer stepping fp32 masters of `params` (low-precision parameters): each
    step copies every gradient into the master's fp32 gradient buffer (one multi-tensor copy, casting; the
    buffers are kept between steps, as DeepSpeed's bf16 optimizer keeps its fp32 gradient accumulation
    buffers), steps the masters, and copies them back into the parameters (one multi-tensor copy)."""

    def __init__(self, params: list[torch.nn.Parameter],
                 make_inner: Callable[[list[torch.Tensor]], torch.optim.Optimizer]) -> None:
        super().__init__(params, {})
        self.model_params = [p for group in self.param_groups for p in group["params"]]
        self.masters = [p.detach().to(MASTER_DTYPE) for p in self.model_params]
        self.master_grads = [torch.zeros_like(m) for m in self.masters]
        self._index = {id(p): i for i, p in enumerate(self.model_params)}
        self.inner = make_inner(self.masters)
        self._state = _MasterState(self)

    @property
    def state(self) -> Mapping:  # type: ignore[override]
        return self._state

    @state.setter
    def state(self, value: Any) -> None:
        """torch.optim.Optimizer.__init__ sets an empty state: this one is the masters' (above)."""

    def index_of(self, param: torch.Tensor) -> int:
        """`param`'s position among the model parameters; KeyError for a tensor it does not step (which
        makes `param in state` and `state.get` work as for a dict)."""
        return self._index[id(param)]

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        assert closure is None, "the traced step passes no closure"
        stepped = [i for i, param in enumerate(self.model_params) if param.grad is not None]
        torch._foreach_copy_([self.master_grads[i] for i in stepped], [self.model_params[i].grad for i in stepped])
        for i in stepped:
            self.masters[i].grad = self.master_grads[i]
        self.inner.step()
        torch._foreach_copy_(self.model_params, self.masters)
        for master in self.masters:
            master.grad = None
