"""The backward ops the autograd engine issues itself: gradients summed where a tensor fed several ops.

A tensor of the forward that feeds n ops needing its gradient gets n gradients in backward. The autograd
engine sums each one after the first into the tensor's input buffer as it arrives (InputBuffer::accumulate,
torch/csrc/autograd/input_buffer.cpp: one `add`, or `add_` where it may reuse the buffer), in C++, right after
the node that produced it ran and its outputs were checked (Engine::evaluate_function), with no Python, no
module call and no autograd node of its own. On a GPU the host issues such a sum at a plain dispatch's cost
(estimate/step.py, host_seconds), not at an eager op's. DenseNet-121 sums 535 gradients in its backward (each
layer's input feeds every later layer through torch.cat), against its 1,471 traced ops; a ResNet-50 sums 16.

EngineSums finds them while backward runs: a pre-hook on every node of the graph marks where each node's ops
begin, and the node's edges say how many of its gradients land in a buffer that already holds one (every
arrival at an input after the first is a sum). Those sums are the last ops of the node's run. A node whose
run does not end in as many `add`s (a gradient it left undefined is not summed) has only its trailing `add`s
marked; the hooks return nothing and change no gradient or lifetime.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

SUM_OPS = frozenset({"add", "add_"})
"""What InputBuffer::accumulate dispatches (torch/csrc/autograd/input_buffer.cpp)."""


def graph_nodes(root: Any) -> Iterator[Any]:
    """Every autograd node reachable from `root` (a tensor's grad_fn), each once."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(edge[0] for edge in node.next_functions)


class EngineSums:
    """Marks, in a list of records being written by backward, the ops that sum gradients (module docstring).

    `recorded`: how many records there are now. Use as a context manager around `backward()` of `loss`, then
    ask `marked` which records sum."""

    def __init__(self, loss: torch.Tensor, recorded: Callable[[], int]) -> None:
        self.loss: torch.Tensor | None = loss
        self.recorded = recorded
        self._arrivals: dict[tuple[int, int], int] = {}  # (id of a node, its input) -> gradients sent to it
        self._segments: list[tuple[int, int]] = []  # (first record of a node's run, sums expected at its end)
        self._handles: list[Any] = []
        self._nodes: list[Any] = []  # kept alive, so that their ids stay theirs

    def __enter__(self) -> EngineSums:
        root, self.loss = self.loss, None  # nothing of the step kept alive here
        assert root is not None, "entered twice"
        if root.grad_fn is not None:
            for node in graph_nodes(root.grad_fn):
                self._nodes.append(node)
                self._handles.append(node.register_prehook(self._starting(node)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._nodes.clear()

    def marked(self, ops: Sequence[str]) -> list[int]:
        """The indices of the summing ops among records whose op names are `ops` (after backward ran)."""
        found = []
        ends = [start for start, _ in self._segments[1:]] + [len(ops)]
        for (start, expected), end in zip(self._segments, ends):
            trailing = 0
            while trailing < expected and end - trailing > start and ops[end - trailing - 1] in SUM_OPS:
                trailing += 1
            found.extend(range(end - trailing, end))
        return found

    def _starting(self, node: Any) -> Callable[[Any], None]:
        def hook(grad_outputs: Any) -> None:
            expected = 0
            for target, input_nr in node.next_functions:
                if target is None:
                    continue
                key = (id(target), input_nr)
                arrived = self._arrivals.get(key, 0)
                expected += arrived > 0
                self._arrivals[key] = arrived + 1
            self._segments.append((self.recorded(), expected))
        return hook
