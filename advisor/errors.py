"""Errors that reach the user as one clear sentence and exit code 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """A mistake in what the user gave us (arguments, files, data). Exit code 2."""

    exit_code = 2


def shorten(text: str, limit: int) -> str:
    """`text` as a message may show it: at most `limit` characters, the cut marked with "..."."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def closest_matches(word: str, candidates: Iterable[str], limit: int = 3) -> list[str]:
    """The candidates closest to `word`, best first (difflib ratio, case-insensitive)."""
    pool = {c.lower(): c for c in candidates}
    found = difflib.get_close_matches(word.lower(), list(pool), n=limit, cutoff=0.5)
    if not found:
        found = [key for key in pool if word.lower() in key][:limit]
    return [pool[key] for key in found]


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """' (did you mean: a, b?)' or '' when nothing is close."""
    matches = closest_matches(word, candidates)
    return f" (did you mean: {', '.join(matches)}?)" if matches else ""
