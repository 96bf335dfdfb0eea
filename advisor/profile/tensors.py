"""The dense tensors that hold a tensor's data: itself, or a sparse tensor's indices and values (a
sparse EmbeddingBag's gradient; issue #22), whose bytes and storages are what memory holds."""

from __future__ import annotations

from collections.abc import Iterator

import torch

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
