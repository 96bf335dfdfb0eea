"""Reading a parsed profile document (JSON) into typed values with every value checked.

A wrong type, a missing or unknown key, NaN or infinity, or a number out of its range raises
`MalformedProfile` naming the key (`series[3].fit.curve.e_max`), so a damaged profile is refused whole
when it is loaded instead of failing later, half-used, in an estimate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from advisor.errors import shorten

T = TypeVar("T")

SHOWN_CHARS = 40
"""Keys and strings quoted in a message are cut to this many characters (a message is one line)."""


class MalformedProfile(ValueError):
    """A profile document whose structure or values are wrong; `key` says where, `problem` what."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"key {key}: {problem}" if key else problem)
        self.key = key
        self.problem = problem

    def under(self, outer: str) -> MalformedProfile:
        """The same problem with its key seen from the mapping or list that holds it at `outer`."""
        if not self.key:
            key = outer
        elif self.key.startswith("["):
            key = f"{outer}{self.key}"
        else:
            key = f"{outer}.{self.key}"
        return MalformedProfile(key, self.problem)


def shown(value: object) -> str:
    """repr() of `value`, cut to SHOWN_CHARS characters."""
    return shorten(repr(value), SHOWN_CHARS)


def describe(value: object) -> str:
    """What a JSON value is, for messages: "a list", "null"..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def text(value: object) -> str:
    if not isinstance(value, str):
        raise MalformedProfile("", f"expected a string, got {describe(value)}")
    return value


def optional_text(value: object) -> str | None:
    return None if value is None else text(value)


def as_float(value: object) -> float | None:
    """`value` as a float if it is a JSON number a float can hold (not true/false, not an integer of
    400 digits), else None; NaN and infinities pass."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def number(value: object, *, positive: bool = False) -> float:
    """A finite number, not negative (above zero if `positive`)."""
    result = as_float(value)
    if result is None and not isinstance(value, int):
        raise MalformedProfile("", f"expected a number, got {describe(value)}")
    if result is None or not math.isfinite(result) or result < 0 or (positive and result == 0):
        raise MalformedProfile("", f"must be a finite number {'above zero' if positive else 'not below zero'}, "
                                   f"got {shown(value)}")
    return result


def signed_number(value: object) -> float:
    """A finite number of either sign."""
    result = as_float(value)
    if result is None and not isinstance(value, int):
        raise MalformedProfile("", f"expected a number, got {describe(value)}")
    if result is None or not math.isfinite(result):
        raise MalformedProfile("", f"must be a finite number, got {shown(value)}")
    return result


def integer(value: object, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedProfile("", f"expected a whole number, got {describe(value)}")
    if value < minimum:
        raise MalformedProfile("", f"must be at least {minimum}, got {shown(value)}")
    return value


def each(value: object, read: Callable[[Any], T]) -> tuple[T, ...]:
    """Every item of a list read by `read`; a problem names the item's index."""
    if not isinstance(value, list):
        raise MalformedProfile("", f"expected a list, got {describe(value)}")
    items = []
    for index, item in enumerate(value):
        try:
            items.append(read(item))
        except MalformedProfile as exc:
            raise exc.under(f"[{index}]") from None
    return tuple(items)


def by_name(value: object, read: Callable[[Any], T], names: Sequence[str] | None = None) -> dict[str, T]:
    """A mapping of names to values read by `read`; with `names`, only those names may appear."""
    if not isinstance(value, dict):
        raise MalformedProfile("", f"expected a mapping, got {describe(value)}")
    result = {}
    for name, item in value.items():
        if names is not None and name not in names:
            raise MalformedProfile(str(name)[:SHOWN_CHARS], f"unknown name (expected one of {', '.join(names)})")
        try:
            result[name] = read(item)
        except MalformedProfile as exc:
            raise exc.under(name[:SHOWN_CHARS]) from None
    return result


class Fields:
    """One mapping of a document, read key by key: a problem with a value names its key."""

    def __init__(self, data: object, required: Sequence[str], optional: Sequence[str] = ()) -> None:
        if not isinstance(data, dict):
            raise MalformedProfile("", f"expected a mapping, got {describe(data)}")
        missing = [key for key in required if key not in data]
        if missing:
            raise MalformedProfile(missing[0], "is missing")
        unknown = [key for key in data if key not in required and key not in optional]
        if unknown:
            raise MalformedProfile(str(unknown[0])[:SHOWN_CHARS],
                                   f"unknown key (expected {', '.join([*required, *optional])})")
        self.data: dict[str, Any] = data

    def has(self, key: str) -> bool:
        """Whether `key` is present and not null."""
        return self.data.get(key) is not None

    def read(self, key: str, read: Callable[[Any], T]) -> T:
        """The value at `key` read by `read` (a required key, or one known to be present)."""
        try:
            return read(self.data[key])
        except MalformedProfile as exc:
            raise exc.under(key) from None

    def optional(self, key: str, read: Callable[[Any], T], default: T) -> T:
        """The value at `key` read by `read`, or `default` when the key is absent or null."""
        return self.read(key, read) if self.has(key) else default

    def text(self, key: str) -> str:
        return self.read(key, text)

    def number(self, key: str, *, positive: bool = False) -> float:
        return self.read(key, lambda value: number(value, positive=positive))

    def integer(self, key: str, *, minimum: int = 0) -> int:
        return self.read(key, lambda value: integer(value, minimum=minimum))

    def texts(self, key: str) -> tuple[str, ...]:
        """A list of strings; an absent key is an empty list."""
        return self.optional(key, lambda value: each(value, text), ())
