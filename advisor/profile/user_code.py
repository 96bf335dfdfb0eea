"""Run code from the user's model file and turn its failures into one clear UserError.

An exception raised by the user's code (or by torch on the user's behalf, e.g. a shape mismatch)
becomes a `UserCodeError` that carries the user's own traceback lines, with the frames of this
package, torch and the standard library left out. Exceptions raised by our own code (asserts,
cost formulas) stay what they are: internal errors.
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from advisor.errors import UserError

_ADVISOR_DIR = str(Path(__file__).resolve().parents[1]) + os.sep
_LIBRARY_DIRS = tuple(
    sorted(
        {str(Path(p).resolve()) + os.sep for p in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                                                    sysconfig.get_paths()["platlib"])}
        | {str(Path(torch.__file__).resolve().parent) + os.sep}
    )
)


class UserCodeError(UserError):
    """The user's model file failed; the message is one sentence followed by the user's frames."""

    def __init__(self, sentence: str, user_frames: list[str]) -> None:
        self.sentence = sentence
        self.user_frames = user_frames
        super().__init__("\n".join([sentence, *user_frames]) if user_frames else sentence)


def is_ours(filename: str) -> bool:
    """True for files of this package (the advisor/ directory)."""
    return str(Path(filename).resolve()).startswith(_ADVISOR_DIR)


def is_user_frame(filename: str) -> bool:
    """A frame of the user's code: not this package, not torch, not the standard library or site-packages."""
    if filename.startswith("<"):
        return False
    resolved = str(Path(filename).resolve())
    return not resolved.startswith(_ADVISOR_DIR) and not resolved.startswith(_LIBRARY_DIRS)


def user_traceback(exc: BaseException) -> list[str]:
    """The user's frames of `exc`'s traceback as Python prints them, one string per line."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if is_user_frame(f.filename)]
    return [line for entry in traceback.format_list(frames) for line in entry.rstrip("\n").split("\n")]


def _raised_by_us(exc: BaseException) -> bool:
    """The innermost frame of the traceback is in this package: our bug or our own UserError."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and is_ours(frames[-1].filename)


PASS_THROUGH: tuple[type[BaseException], ...] = (KeyboardInterrupt, SystemExit, MemoryError)


@contextmanager
def user_code(what: str, source: str | None = None, pass_through: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Run the block as the user's code: `what` names it in the message ("build_model()"),
    `source` the file. Exceptions of the types in `pass_through` and those raised by this package
    propagate unchanged; any other becomes a UserCodeError."""
    try:
        yield
    except (*PASS_THROUGH, *pass_through, UserError):
        raise
    except Exception as exc:
        if _raised_by_us(exc):
            raise
        where = f"{source}: " if source else ""
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        sentence = f"{where}{what} raised {type(exc).__name__}" + (f": {detail}" if detail else "")
        raise UserCodeError(sentence, user_traceback(exc)) from exc
