"""The tensors in an op's arguments and outputs (`leaves`), and the dense tensors that hold a tensor's data:
itself, or a sparse tensor's indices and values (a sparse EmbeddingBag's gradient; issue #22), whose bytes and
storages are what memory holds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._pytree import SUPPORTED_NODES, tree_flatten

_SPARSE_PARTS = {
    torch.sparse_coo: ("_indices", "_values"),
    torch.sparse_csr: ("crow_indices", "col_indices", "values"),
    torch.sparse_csc: ("ccol_indices", "row_indices", "values"),
    torch.sparse_bsr: ("crow_indices", "col_indices", "values"),
    torch.sparse_bsc: ("ccol_indices", "row_indices", "values"),
}


def stored_parts(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """`tensor` itself when strided, else the strided tensors its sparse layout keeps."""
    parts = _SPARSE_PARTS.get(tensor.layout)
    if parts is None:
        yield tensor
        return
    for name in parts:
        yield getattr(tensor, name)()


def leaves(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> list[Any]:
    """torch.utils._pytree.tree_flatten(tree, is_leaf)[0], walked without its TreeSpec: an op's arguments
    and outputs are tuples, lists and dicts of tensors and numbers, flattened here at the tracer's every op
    (five walks per op), where tree_flatten makes a spec per node and a closure cycle per call that only the
    cyclic collector frees (a 7B estimate made 5,800 of them). Any other container (a namedtuple, a
    structseq, a node type registered with pytree) is flattened by tree_flatten itself."""
    found: list[Any] = []
    _collect(tree, is_leaf, found)
    return found


def _collect(node: Any, is_leaf: Callable[[Any], bool] | None, found: list[Any]) -> None:
    if is_leaf is not None and is_leaf(node):
        found.append(node)
        return
    kind = type(node)
    if kind is tuple or kind is list:
        for child in node:
            _collect(child, is_leaf, found)
    elif kind is dict:
        for child in node.values():
            _collect(child, is_leaf, found)
    elif kind in SUPPORTED_NODES or issubclass(kind, tuple):  # a namedtuple or structseq, or a leaf tree_flatten names
        found.extend(tree_flatten(node, is_leaf)[0])
    else:
        found.append(node)
