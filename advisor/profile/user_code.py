"""Run code from the user's model file and turn its failures into one clear UserError.

An exception raised by the user's code (or by torch on the user's behalf, e.g. a shape mismatch)
becomes a `UserCodeError` that carries the user's own traceback lines, with the frames of this
package, torch and the standard library left out. Exceptions raised by our own code (asserts,
cost formulas) stay what they are: internal errors.
"""

from __future__ import annotations

import importlib.util
import os
import sysconfig
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from advisor.errors import UserError, shorten
from advisor.paths import shipped_dir

_ADVISOR_DIR = str(Path(__file__).resolve().parents[1]) + os.sep
_EXAMPLES_DIR = str(shipped_dir("examples", "resnet50.py").resolve()) + os.sep
"""The built-in examples are model files like the user's: their failures are input errors, not ours."""


def _torch_dir() -> set[str]:
    """torch's package folder, found without importing torch (the CLI's light commands never do)."""
    spec = importlib.util.find_spec("torch")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return {str(Path(p).resolve()) + os.sep for p in locations}


_LIBRARY_DIRS = tuple(
    sorted(
        {str(Path(p).resolve()) + os.sep for p in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                                                    sysconfig.get_paths()["platlib"])}
        | _torch_dir()
    )
)


class UserCodeError(UserError):
    """The user's model file failed; the message is one sentence followed by the user's frames."""

    def __init__(self, sentence: str, user_frames: list[str]) -> None:
        self.sentence = sentence
        self.user_frames = user_frames
        super().__init__("\n".join([sentence, *user_frames]) if user_frames else sentence)


def is_ours(filename: str) -> bool:
    """True for files of this package (the advisor/ directory), the built-in examples excepted."""
    resolved = str(Path(filename).resolve())
    return resolved.startswith(_ADVISOR_DIR) and not resolved.startswith(_EXAMPLES_DIR)


def is_user_frame(filename: str) -> bool:
    """A frame of the user's code (the built-in examples count as such): not this package, not
    torch, not the standard library or site-packages."""
    if filename.startswith("<"):
        return False
    resolved = str(Path(filename).resolve())
    if resolved.startswith(_EXAMPLES_DIR):
        return True
    return not resolved.startswith(_ADVISOR_DIR) and not resolved.startswith(_LIBRARY_DIRS)


def user_traceback(exc: BaseException) -> list[str]:
    """The user's frames of `exc`'s traceback as Python prints them, one string per line."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if is_user_frame(f.filename)]
    return [line for entry in traceback.format_list(frames) for line in entry.rstrip("\n").split("\n")]


MESSAGE_CHARS = 300
"""Longest part of a user exception's message we repeat (its first line, cut there)."""


def first_line(message: str) -> str:
    """The first line of an exception's message, at most MESSAGE_CHARS long."""
    return shorten(message.strip().splitlines()[0] if message.strip() else "", MESSAGE_CHARS)


class TorchWouldRaise(RuntimeError):
    """An error real torch raises on a real device where fake tensors let the op pass (e.g. an int64
    input to a float matmul): raised by our trace on the model's behalf, blamed on the model."""


def _raised_by_us(exc: BaseException) -> bool:
    """The innermost frame of the traceback is in this package: our bug or our own UserError."""
    if isinstance(exc, TorchWouldRaise):
        return False
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and is_ours(frames[-1].filename)


PASS_THROUGH: tuple[type[BaseException], ...] = (KeyboardInterrupt, GeneratorExit)
"""What user code may raise that is not its failure: Ctrl-C (and SIGTERM, a BaseException too)."""


@contextmanager
def user_code(what: str, source: str | None = None, pass_through: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Run the block as the user's code: `what` names it in the message ("build_model()"),
    `source` the file. Exceptions of the types in `pass_through` and those raised by this package
    propagate unchanged; any other becomes a UserCodeError, including `sys.exit()` (the user's code
    does not decide how we exit) and running out of memory."""
    where = f"{source}: " if source else ""
    try:
        yield
    except (*PASS_THROUGH, *pass_through, UserError):
        raise
    except SystemExit as exc:
        raise UserCodeError(f"{where}{what} called sys.exit({exc.code!r}); a model file must return, not exit",
                            user_traceback(exc)) from None
    except MemoryError as exc:
        raise UserCodeError(f"{where}{what} ran out of memory (RAM) on this machine; a model file must not "
                            "allocate real tensors of training size (the tool runs it on fake tensors)",
                            user_traceback(exc)) from None
    except Exception as exc:
        if _raised_by_us(exc):
            raise
        detail = first_line(str(exc))
        kind = "RuntimeError" if isinstance(exc, TorchWouldRaise) else type(exc).__name__
        sentence = f"{where}{what} raised {kind}" + (f": {detail}" if detail else "")
        raise UserCodeError(sentence, user_traceback(exc)) from exc
