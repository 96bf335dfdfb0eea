"""Plain-text aligned tables for the terminal."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    """A table column: header text and whether values align right (numbers) or left (text)."""

    header: str
    align_right: bool = False


def render_table(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> str:
    """Rows of cell strings under a header and a rule, each column padded to its widest cell."""
    assert all(len(row) == len(columns) for row in rows), "every row needs one cell per column"
    widths = [max([len(c.header)] + [len(row[i]) for row in rows]) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.rjust(width) if column.align_right else cell.ljust(width)
            for cell, width, column in zip(cells, widths, columns)
        ]
        return "  ".join(padded).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line([c.header for c in columns]), rule, *(line(row) for row in rows)])
