"""Tables for the terminal (aligned plain text that fits the width), CSV and Markdown."""

from __future__ import annotations

import csv
import io
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass

FORMATS = ("table", "json", "csv", "markdown")
"""What --format accepts (--json is --format json)."""


@dataclass(frozen=True)
class Column:
    """A table column: header text, whether values align right (numbers) or left (text), and when it
    gives way in a narrow terminal (`drop_order` 1 goes first; None: always shown)."""

    header: str
    align_right: bool = False
    drop_order: int | None = None


SEPARATOR = "  "

STYLES = {"bold": "\x1b[1m", "dim": "\x1b[2m", "red": "\x1b[31m", "green": "\x1b[32m"}
"""ANSI styles a table line may have."""
RESET = "\x1b[0m"


def colour_enabled() -> bool:
    """Colour on a terminal only: never when piped, with NO_COLOR set (no-color.org) or TERM=dumb;
    FORCE_COLOR forces it."""
    if os.environ.get("FORCE_COLOR"):
        return True
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return sys.stdout.isatty()


def styled(text: str, style: str | None, colour: bool) -> str:
    """`text` in `style` (a key of STYLES) when `colour`, else as it is."""
    return f"{STYLES[style]}{text}{RESET}" if colour and style else text


def output_width() -> int | None:
    """The width to fit: $COLUMNS when set (also when piped, as `COLUMNS=80 advisor ... | less`), else
    the terminal's; None when stdout is no terminal and COLUMNS is unset (a file gets every column)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def _widths(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[int]:
    return [max([len(c.header)] + [len(row[i]) for row in rows]) for i, c in enumerate(columns)]


def table_width(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> int:
    widths = _widths(columns, rows)
    return sum(widths) + len(SEPARATOR) * (len(widths) - 1)


def fit_columns(columns: Sequence[Column], rows: Sequence[Sequence[str]],
                max_width: int | None) -> tuple[list[Column], list[list[str]]]:
    """The columns (and their cells) that fit in `max_width`, dropping by `drop_order`, first the
    lowest; those that never drop stay even when they alone are wider."""
    keep = list(range(len(columns)))
    droppable = sorted((c.drop_order, i) for i, c in enumerate(columns) if c.drop_order is not None)
    while max_width is not None and droppable and \
            table_width([columns[i] for i in keep], [[row[i] for i in keep] for row in rows]) > max_width:
        keep.remove(droppable.pop(0)[1])
    return [columns[i] for i in keep], [[row[i] for i in keep] for row in rows]


def render_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], max_width: int | None = None,
                 styles: Sequence[str | None] | None = None, colour: bool | None = None) -> str:
    """Rows of cell strings under a header and a rule, each column padded to its widest cell; with
    `max_width`, the columns that give way first are left out until the table fits. With colour (by
    default on a terminal, colour_enabled) the header is bold and each row in its `styles` entry."""
    assert all(len(row) == len(columns) for row in rows), "every row needs one cell per column"
    assert styles is None or len(styles) == len(rows), "one style (or None) per row"
    colour = colour_enabled() if colour is None else colour
    row_styles = list(styles or [None] * len(rows))
    columns, rows = fit_columns(columns, rows, max_width)
    widths = _widths(columns, rows)

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.rjust(width) if column.align_right else cell.ljust(width)
            for cell, width, column in zip(cells, widths, columns)
        ]
        return SEPARATOR.join(padded).rstrip()

    rule = SEPARATOR.join("-" * width for width in widths)
    return "\n".join([styled(line([c.header for c in columns]), "bold", colour), rule,
                      *(styled(line(row), style, colour) for row, style in zip(rows, row_styles))])


def render_csv(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> str:
    """The table as CSV (RFC 4180, a header row), every column."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([c.header for c in columns])
    writer.writerows(rows)
    return buffer.getvalue().rstrip("\n")


def render_markdown(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> str:
    """The table as a GitHub Markdown table, every column (pipes in cells escaped)."""
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    rule = "|" + "|".join("---:" if c.align_right else "---" for c in columns) + "|"
    return "\n".join([line([c.header for c in columns]), rule, *(line(row) for row in rows)])
