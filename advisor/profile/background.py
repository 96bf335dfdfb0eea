"""Run one traced step in a forked child while this process traces another.

Tracing is pure Python on fake tensors, one core's work; the memory model needs two traces (the
settings' batch and twice it). On a machine with two or more CPUs the second runs in a child forked
from this process, which has torch, the model file and its imports already loaded, so the pair takes
about as long as one trace. The child is only ever an optimisation: whenever it cannot be used (no
fork, one CPU, other threads in this process, CUDA initialised) or fails in any way, the caller gets
None and traces in-process, where any error is raised with its traceback.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Generic, TypeVar

import torch

T = TypeVar("T")

CHILD_GRACE_S = 10.0
"""Seconds the parent waits for a child beyond the time its own work took, before it gives up on the
child (killed) and does the work itself."""


def usable_cpus() -> int:
    """CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


AUTOGRAD_HAS_DEVICE_THREADS = torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None
"""On a CUDA (or ROCm) build, autograd's first backward starts per-device threads, even with no GPU, and
a child forked after that cannot run a backward ("Unable to handle autograd's threading in combination
with fork-based multiprocessing"); CPU builds have no such threads."""

_backward_ran = False


def backward_runs_here() -> None:
    """Called before this process runs a backward: from then on a forked child could not trace."""
    global _backward_ran
    _backward_ran = True


def can_fork() -> bool:
    """Whether a forked child can work beside this process: fork exists, a second CPU is free for it,
    no other Python thread runs here (a fork copies only the calling thread; a lock held by another,
    e.g. a TUI worker's, would stay held in the child), CUDA is not initialised (CUDA does not
    survive fork), autograd has started no device threads here, and this process may have children
    (multiprocessing forbids daemonic ones)."""
    return ("fork" in multiprocessing.get_all_start_methods() and usable_cpus() >= 2
            and threading.active_count() == 1 and not torch.cuda.is_initialized()
            and not (_backward_ran and AUTOGRAD_HAS_DEVICE_THREADS)
            and not multiprocessing.current_process().daemon)  # daemonic processes may not have children


class ForkedCall(Generic[T]):
    """`work()` running in a forked child; `result()` collects its (pickled) value.

    Use as a context manager around the parent's own work: leaving it by an exception kills the child."""

    def __init__(self, work: Callable[[], T], may_fork_again: bool = False) -> None:
        """`may_fork_again`: the child may fork children of its own (a non-daemonic process; the caller
        must `close()` it, as the context manager does on an error)."""
        context = multiprocessing.get_context("fork")
        self._receiver, sender = context.Pipe(duplex=False)
        self._process = context.Process(target=_run_and_send, args=(work, sender, os.getpid()),
                                        daemon=not may_fork_again)
        self._process.start()
        sender.close()

    def result(self, timeout_s: float) -> T | None:
        """The child's value, or None when it failed, died or took more than `timeout_s` seconds more."""
        try:
            if not self._receiver.poll(timeout_s):
                return None
            succeeded, value = self._receiver.recv()
        except (EOFError, OSError):  # the child died without sending: the caller does the work itself
            return None
        finally:
            self.close()
        return value if succeeded else None

    def close(self) -> None:
        """Stop the child if it still runs and release its pipe (again: nothing)."""
        if self._receiver.closed:
            return
        if self._process.is_alive():
            self._process.kill()
        self._process.join()
        self._receiver.close()

    def __enter__(self) -> ForkedCall[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if exc_info[0] is not None:
            self.close()


PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal this process gets when the thread that forked it ends (Linux)."""


def die_with_parent(parent_pid: int) -> None:
    """In a forked child: be killed (SIGKILL) when the parent ends, however it ends (SIGTERM, SIGKILL,
    a crash), so no trace child runs on alone. Linux only; elsewhere the parent's own cleanup
    (the context manager, SIGTERM unwinding) is what stops it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: no prctl
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def settle_thread_pool() -> None:
    """In a forked child, before any other thread starts: rebuild torch's intra-op thread pool from this one.
    After a fork torch marks the pool to be made again on its next use; on a CUDA build the first backward
    starts autograd's device threads, which use it at once beside this thread, and the race left one of them
    with no pool: "pool INTERNAL ASSERT FAILED ... Invalid thread pool!", the child killed by abort() with
    a C++ trace on the terminal (3 of 6 first runs of `advisor estimate` on torch 2.15, 2026-11-27)."""
    torch.set_num_threads(torch.get_num_threads())


def _run_and_send(work: Callable[[], object], sender: Connection, parent_pid: int) -> None:
    """In the child: send (True, value), or (False, None) when `work` raised. The parent then does the
    work itself and raises that error there, with its traceback, so nothing is lost by not sending it."""
    die_with_parent(parent_pid)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's handler unwinds the parent, not this child
    settle_thread_pool()
    try:
        payload = (True, work())
    except BaseException:  # noqa: BLE001 -- reported as a failure; the parent re-runs and raises it
        payload = (False, None)
    try:
        sender.send(payload)  # pickles the whole value first: a value that cannot be pickled sends nothing
    except Exception:  # noqa: BLE001 -- same: the parent does the work itself
        sender.send((False, None))
    finally:
        sender.close()
