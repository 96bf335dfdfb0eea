"""How the `advisor` and `gpu-advisor` processes start and end, whatever the user's model does.

The model file is the user's code running inside our process: it may print, start threads, call
`sys.exit`, or loop forever. This module keeps our contract around it:

- `user_output_to_stderr()`: while user code may run, its `print`s and any write to file
  descriptor 1 go to stderr, so stdout carries our data alone (`--json` always parses);
- `terminate_on_sigterm()`: SIGTERM unwinds like Ctrl-C (children are killed on the way out);
- `exit_now(code)`: flush our streams and leave at once: no wait for threads the model started, no
  finalisation of torch's objects (whose leak reports would land on stderr), no atexit handlers;
- `report_exit(exc, prog)`: the exit code and the one line for whatever ended a command (Ctrl-C 130,
  SIGTERM 143, a closed pipe 141, out of memory 2); our own bugs print their traceback and exit 1.

Children forked for traces die with the process that forked them (advisor.profile.background).
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import traceback
from collections.abc import Iterator
from typing import Any, NoReturn

from advisor.errors import UserError

EXIT_INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT), as shells report it."""

EXIT_TERMINATED = 143
"""Exit code after SIGTERM (128 + SIGTERM)."""

EXIT_BROKEN_PIPE = 141
"""Exit code when the reader of stdout went away (128 + SIGPIPE), as `cat` gives under `| head`."""


REPORT_BUGS = "this is a bug in gpu-advisor: please report it on the project's issue tracker with the command " \
              "and the traceback above"


class Terminated(BaseException):
    """SIGTERM arrived: unwind (closing children and files) and exit with EXIT_TERMINATED."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def terminate_on_sigterm(prog: str = "advisor") -> None:
    """From now on SIGTERM raises `Terminated` in the main thread (only the main thread may set it), and a
    Ctrl-C or SIGTERM whose exception CPython swallows ends the process anyway (_leave_when_swallowed)."""
    with contextlib.suppress(ValueError):  # not the main thread: keep the default (the process dies)
        signal.signal(signal.SIGTERM, _raise_terminated)
    sys.unraisablehook = _leave_when_swallowed(sys.unraisablehook, prog)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM held back inside this thread and delivered on leaving, where their exceptions
    unwind as usual. For imports of native extensions whose module initialisation calls back into Python
    (triton's nanobind enums, imported by torch._dynamo on the newest torch): an exception raised there by
    our handlers cannot cross the C++ frames, and the process aborts (SIGABRT) instead of leaving cleanly."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: nothing to hold back with
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _leave_when_swallowed(previous: Any, prog: str) -> Any:
    """An unraisable hook: a signal's exception raised while CPython runs a weakref callback or `__del__`
    (the import system's module-lock callbacks, run by any garbage collection) cannot propagate; CPython
    prints "Exception ignored in ..." and goes on, and a model looping in Python never stops. Then the
    process leaves at once, as the exception would have made it: the one line and the exit code of
    report_exit (trace children die with it: background.die_with_parent)."""
    def hook(unraisable: Any) -> None:
        exc = unraisable.exc_value
        if isinstance(exc, (KeyboardInterrupt, Terminated)):
            exit_now(report_exit(exc, prog))
        previous(unraisable)
    return hook


@contextlib.contextmanager
def user_output_to_stderr() -> Iterator[None]:
    """While the block runs, `sys.stdout` is `sys.stderr` and file descriptor 1 points where
    descriptor 2 does (C extensions and forked children write there too). Restored after."""
    sys.stdout.flush()
    saved = _dup_stdout_fd()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            with contextlib.suppress(OSError):
                sys.stderr.flush()
            os.dup2(saved, 1)
            os.close(saved)


def _dup_stdout_fd() -> int | None:
    """A copy of descriptor 1, then descriptor 1 pointed at descriptor 2; None where either is closed."""
    try:
        saved = os.dup(1)
    except OSError:
        return None
    try:
        os.dup2(2, 1)
    except OSError:
        os.close(saved)
        return None
    return saved


def flush_streams() -> int | None:
    """Flush stdout and stderr; EXIT_BROKEN_PIPE when stdout's reader has gone, else None."""
    broken = None
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        broken = EXIT_BROKEN_PIPE
        _silence_stdout()
    except (OSError, ValueError):
        pass  # a closed stdout: nothing more to deliver
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    return broken


def _silence_stdout() -> None:
    """Point stdout at /dev/null so no later flush raises again (Python's documented recipe)."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def exit_now(code: int) -> NoReturn:
    """Flush and leave with `code` without waiting for other threads or finalising objects."""
    broken = flush_streams()
    os._exit(broken if broken is not None and code == 0 else code)


def report_exit(exc: BaseException, prog: str) -> int:
    """The exit code for an exception that left a command, after one line on stderr (or, for our own
    bugs, the traceback and where to report it). SystemExit (argparse's usage errors, --help) keeps
    its code."""
    if isinstance(exc, UserError):
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    if isinstance(exc, KeyboardInterrupt):
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if isinstance(exc, Terminated):
        print(f"{prog}: terminated", file=sys.stderr)
        return EXIT_TERMINATED
    if isinstance(exc, BrokenPipeError):
        return flush_streams() or EXIT_BROKEN_PIPE
    if isinstance(exc, MemoryError):
        print(f"{prog}: error: this machine ran out of memory (RAM); close other programs or try a smaller "
              "--batch-size", file=sys.stderr)
        return 2
    traceback.print_exception(exc)
    print(f"{prog}: internal error: {REPORT_BUGS}", file=sys.stderr)
    return 1


_frozen = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off inside: a traced step makes hundreds of thousands of
    short-lived objects, and each full collection it triggers walks every object torch's import made
    (a quarter of a steady-state estimate of the 7B example went there). Reference counting still frees
    everything outside a cycle at once; cycles made inside wait for the next collection after. Nests."""
    global _frozen
    if not _frozen:  # the objects of the imports so far (torch's, ours) live as long as the process
        gc.freeze()
        _frozen = True
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
