"""How a benchmark hands over its report: printed, and with --out also written to that file (UTF-8)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def print_report(lines: Sequence[str], out: Path | None) -> None:
    """Print the report's `lines` and, where `out` is given, write them there too."""
    text = "\n".join(lines)
    print(text)
    if out:
        out.write_text(text + "\n", encoding="utf-8")
