"""Run one traced step in a forked child while this process traces another.

Tracing is pure Python on fake tensors, one core's work; the memory model needs two traces (the
settings' batch and twice it). On a machine with two or more CPUs the second runs in a child forked
from this process, which has torch, the model file and its imports already loaded, so the pair takes
about as long as one trace. The child is only ever an optimisation: whenever it cannot be used (no
fork, one CPU, other threads in this process, CUDA initialised) or fails in any way, the caller gets
None and traces in-process, where any error is raised with its traceback. A child that serves (runs the
parent's jobs on its value once sent) can be asked to make its value again (ForkedCall.again): a long-lived
process keeps it for its next estimate (memory.plan.keep_worker).
"""

from __future__ import annotations

import atexit
import ctypes
import multiprocessing
import os
import pickle
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Generic, TypeVar

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


_SERVING: set[ForkedCall] = set()
"""Serving children not closed yet: closed when this process exits (their files removed) where no one did."""


@atexit.register
def _close_serving() -> None:
    for call in list(_SERVING):
        call.close()


class ForkedCall(Generic[T]):
    """`work()` running in a forked child; `result()` collects its (pickled) value.

    Use as a context manager around the parent's own work: leaving it by an exception kills the child."""

    def __init__(self, work: Callable[[], T], may_fork_again: bool = False, serves: bool = False,
                 sent_as: Callable[[T], T] | None = None) -> None:
        """`may_fork_again`: the child may fork children of its own (a non-daemonic process; the caller
        must `close()` it, as the context manager does on an error). `serves`: once its value is sent, the
        child stays to run the jobs `served()` hands it (Served), until `close()`. `sent_as`: what of the
        value the child sends (run in the child; the jobs it serves get the value itself)."""
        context = multiprocessing.get_context("fork")
        self._receiver, sender = context.Pipe(duplex=False)
        self._jobs, child_jobs = context.Pipe(duplex=True) if serves else (None, None)
        if serves:
            remove_stale_parcels()
        self._parcel = _Parcel.new() if serves else None  # the serving child's value: removed by close() too
        self._job_parcels: list[_Parcel] = []  # the jobs' (Served.submit), which a child killed first never read
        self._process = context.Process(target=_run_and_send,
                                        args=(work, sender, os.getpid(), child_jobs, self._parcel, sent_as),
                                        daemon=not may_fork_again)
        self._process.start()
        sender.close()
        if child_jobs is not None:
            child_jobs.close()
            _SERVING.add(self)
        self._closed = False
        self._pending = True  # a value the child sends that result() has not read
        self._jobs_open = [0]  # jobs submitted whose "done" or "failed" was not read (Served)

    def result(self, timeout_s: float) -> T | None:
        """The child's value, or None when it failed, died or took more than `timeout_s` seconds more. A
        child that serves is left running (for `served()`) once it sent a value; else it is done."""
        succeeded = False
        try:
            if not self._receiver.poll(timeout_s):
                return None
            succeeded, value = self._receiver.recv()
            if isinstance(value, _Parcel):
                value = value.open()
        except (EOFError, OSError):  # the child died without sending: the caller does the work itself
            return None
        finally:
            self._pending = False
            if self._jobs is None or not succeeded:
                self.close()
        return value if succeeded else None

    def ready(self) -> bool:
        """Whether result() would return without waiting: the child sent its value, or is gone, or it was read."""
        if not self.unread:
            return True
        try:
            return self._receiver.poll(0)  # True at end of file too (the child died)
        except OSError:
            return True

    @property
    def unread(self) -> bool:
        """Whether a value is to come that result() has not read (and the call was not closed before)."""
        return self._pending and not self._closed

    def again(self, function: Callable[..., tuple[Any, Any]], *args: object) -> bool:
        """Have a serving child that sent its value and runs no job make a new one, `function(*args)`, which
        returns (the value the child keeps and serves jobs on, the value it sends): result() reads it as it read
        the first. A module-level function (pickled by name). False where the child cannot (gone, busy, not
        serving, arguments that cannot be pickled): nothing was sent."""
        if self._jobs is None or self._closed or self._pending or self._jobs_open[0] or not self._process.is_alive():
            return False
        self._job_parcels[:] = [parcel for parcel in self._job_parcels if os.path.exists(parcel.path)]  # read ones
        try:
            job, value = _Parcel.new(), _Parcel.new()
            self._job_parcels.extend((job, value))
            job.filled((function, args))
            self._jobs.send(("again", job, value))
        except (OSError, ValueError, TypeError, AttributeError, pickle.PicklingError):
            return False
        self._pending = True
        return True

    def idle(self, timeout_s: float) -> bool:
        """Whether a serving child runs no job: each job still open is told to end (JobChannel.cancelled: its
        items are skipped) and its end awaited up to `timeout_s` seconds, what it sent dropped. False where the
        child is gone or not done by then (the caller closes it)."""
        served = None if self._pending else self.served()
        if served is None:
            return False
        if self._jobs_open[0]:
            try:
                self._jobs.send(("cancel",))
            except (OSError, ValueError):
                return False
        deadline = time.perf_counter() + timeout_s
        while self._jobs_open[0] and served.alive and time.perf_counter() < deadline:
            served.poll(deadline - time.perf_counter())
        return served.alive and not self._jobs_open[0]

    def served(self) -> Served | None:
        """The child's job channel (None: it does not serve, or is gone): a job sent runs once the child has
        sent its value, and not where it failed."""
        if self._jobs is None or self._closed or not self._process.is_alive():
            return None
        return Served(self._jobs, self.close, self._job_parcels, self._jobs_open)

    def close(self) -> None:
        """Stop the child if it still runs, release its pipes and remove the files it left unread (again: the
        files only)."""
        if not self._closed:
            self._closed = True
            for connection in (self._receiver, self._jobs):
                if connection is not None and not connection.closed:
                    connection.close()
            if self._process.is_alive():
                self._process.kill()
            self._process.join()
        for parcel in ([] if self._parcel is None else [self._parcel]) + self._job_parcels:
            parcel.remove()
        self._job_parcels.clear()
        _SERVING.discard(self)

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


def _run_and_send(work: Callable[[], object], sender: Connection, parent_pid: int,
                  jobs: Connection | None = None, parcel: _Parcel | None = None,
                  sent_as: Callable[[Any], object] | None = None) -> None:
    """In the child: send (True, value) (`sent_as(value)` where given), or (False, None) when `work` (or
    `sent_as`) raised. The parent then does the work itself and raises that error there, with its traceback,
    so nothing is lost by not sending it. With `jobs`, the value goes through `parcel` and, once sent, the
    child serves the parent's jobs (_serve) on the value itself."""
    die_with_parent(parent_pid)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's handler unwinds the parent, not this child
    settle_thread_pool()
    value = None
    try:
        value = work()
        payload = (True, value if sent_as is None else sent_as(value))
    except BaseException:  # noqa: BLE001 -- reported as a failure; the parent re-runs and raises it
        payload = (False, None)
    sent = _send(sender, payload, parcel)
    if jobs is not None and sent:
        _serve(value, jobs, sender)
    sender.close()


def _send(sender: Connection, payload: tuple[bool, object], parcel: _Parcel | None) -> bool:
    """Send a child's (succeeded, value) to the parent, the value through `parcel` where given; whether a value
    went (else (False, None) did: the parent does the work itself)."""
    try:
        if parcel is not None and payload[0]:  # through a file: the pipe would hold this child until the parent reads
            sender.send((True, parcel.filled(payload[1])))
        else:
            sender.send(payload)  # pickles the whole value first: a value that cannot be pickled sends nothing
        return payload[0]
    except Exception:  # noqa: BLE001 -- same: the parent does the work itself
        sender.send((False, None))
        return False


class _Parcel:
    """A value pickled into a file (in _JOB_FOLDER), sent as the file's name: a pipe holds 64 KiB, and its
    writer waits until the reader takes the rest, which a serving child cannot do while it should serve."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def new(cls) -> _Parcel:
        """An empty file of this user's only (mkstemp: mode 0600), named after this process (remove_stale)."""
        descriptor, path = tempfile.mkstemp(prefix=f"{PARCEL_PREFIX}{os.getpid()}-", dir=_JOB_FOLDER)
        os.close(descriptor)
        return cls(path)

    def filled(self, value: object) -> _Parcel:
        """This parcel with `value` pickled into its file."""
        payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        with open(self.path, "wb") as file:
            file.write(payload)
        return self

    def open(self) -> object:
        """The value; the file removed."""
        try:
            with open(self.path, "rb") as file:
                return pickle.load(file)  # noqa: S301 -- written by this process's parent or child, just now
        finally:
            self.remove()

    def remove(self) -> None:
        """Remove the file, where it still is (a value never read)."""
        Path(self.path).unlink(missing_ok=True)


PARCEL_PREFIX = "gpu-advisor-"
"""Parcels are named PARCEL_PREFIX, the process that made them, "-", mkstemp's letters."""


def remove_stale_parcels() -> None:
    """Remove the parcels of processes of this user that are gone: a process killed outright (SIGKILL, which
    no cleanup survives) leaves its own and its children's."""
    folder = Path(_JOB_FOLDER or tempfile.gettempdir())
    for path in folder.glob(f"{PARCEL_PREFIX}*-*"):
        maker = path.name[len(PARCEL_PREFIX):].partition("-")[0]
        if not maker.isdigit() or int(maker) == os.getpid():
            continue
        try:
            if path.stat().st_uid != os.getuid():
                continue
            os.kill(int(maker), 0)
        except ProcessLookupError:  # its maker is gone
            path.unlink(missing_ok=True)
        except (PermissionError, FileNotFoundError):  # a process of another user has that number; or removed already
            continue


_JOB_FOLDER = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
"""Where parcels (a serving child's value, a job's arguments) wait to be read: memory where Linux offers it, else
the temp folder."""


class JobChannel:
    """A served job's side of the channel, in the child: `skipped(key)` tells whether the parent has done
    that item itself (its notes read as they come), `given()` what the parent made and shared (Served.share),
    `emit(key, value)` sends an item's value, `starting(key)` says which item the child works on (the parent
    waits for that one rather than doing it again)."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._skipped: set[object] = set()
        self._given: list[tuple[object, object]] = []
        self.stopped = False
        self.cancelled = False

    def _read_notes(self) -> None:
        while not self.stopped and self._connection.poll(0):
            note = self._connection.recv()
            if note is None:
                self.stopped = True
            elif note[0] == "cancel":  # the parent needs nothing more of this job
                self.cancelled = True
            elif note[0] == "skip":
                self._skipped.add(note[1])
            elif note[0] == "made":
                self._skipped.add(note[1])
                self._given.append((note[1], note[2]))

    def given(self) -> list[tuple[object, object]]:
        """(key, value) of each item the parent made and shared since the last call."""
        self._read_notes()
        found, self._given = self._given, []
        return found

    def skipped(self, key: object) -> bool:
        self._read_notes()
        return self.stopped or self.cancelled or key in self._skipped

    def wait(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` seconds for the parent's next note, and read what came."""
        if not self.stopped and timeout_s > 0:
            self._connection.poll(timeout_s)
        self._read_notes()

    def starting(self, key: object) -> None:
        self._connection.send(("starting", key, None))

    def emit(self, key: object, value: object) -> None:
        self._connection.send(("item", key, value))


def _serve(value: object, jobs: Connection, sender: Connection) -> None:
    """In a serving child: run each job the parent sends, `function(value, *args, channel)`, until the parent
    sends None or goes; a job that raises ends with ("failed", ...), the parent then does its items itself. An
    "again" job (ForkedCall.again) makes the value anew and sends it through `sender`, as the first; where that
    fails the child ends."""
    try:
        while True:
            job = jobs.recv()
            if job is None:
                return
            if job[0] == "again":
                try:
                    function, args = job[1].open()
                    value, sent = function(*args)
                    payload: tuple[bool, object] = (True, sent)
                except BaseException:  # noqa: BLE001 -- reported as a failure; the parent re-runs and raises it
                    payload = (False, None)
                if not _send(sender, payload, job[2]):
                    return
                continue
            if job[0] != "job":  # a note about a job done before
                continue
            function, args = job[1].open()
            channel = JobChannel(jobs)
            try:
                function(value, *args, channel)
                jobs.send(("done", None, None))
            except Exception:  # noqa: BLE001 -- the parent does the items itself and raises any error there
                jobs.send(("failed", None, None))
            if channel.stopped:
                return
    except (EOFError, OSError):  # the parent closed the channel or died
        return


class Served:
    """The parent's side of a serving child's job channel (ForkedCall.served): `submit` a job, read what
    it sent with `poll`, tell it to `skip` an item done here; `close` stops the child."""

    def __init__(self, connection: Connection, close: Callable[[], None], parcels: list[_Parcel],
                 jobs_open: list[int] | None = None) -> None:
        """`close` stops the child and removes `parcels`, where the jobs' files are listed as they are made;
        `jobs_open[0]` counts the jobs sent whose end ("done" or "failed") was not read (ForkedCall.idle)."""
        self._connection = connection
        self._close = close
        self._parcels = parcels
        self._jobs_open = [0] if jobs_open is None else jobs_open
        self.alive = True

    def submit(self, function: Callable[..., None], *args: object) -> bool:
        """Send `function` (a module-level function: it is pickled by name) and its arguments; False where
        the child is gone, they cannot be pickled or their file cannot be written. They go through a file, the
        pipe carrying its name: a pipe holds 64 KiB, and a child still sending its own value (a trace of a
        megabyte) would not read more until this process reads that, which it may do only later."""
        if not self.alive:
            return False
        try:
            parcel = _Parcel.new()
            self._parcels.append(parcel)
            parcel.filled((function, args))
        except (OSError, TypeError, AttributeError, pickle.PicklingError):  # no room in the folder, or not picklable
            self.alive = False
            return False
        try:
            self._connection.send(("job", parcel))
        except (OSError, ValueError):
            self.alive = False
        if self.alive:
            self._jobs_open[0] += 1
        return self.alive

    def poll(self, timeout_s: float = 0.0) -> list[tuple[str, object, object]]:
        """Messages the child sent, ("starting" | "item" | "done" | "failed", key, value), waiting up to
        `timeout_s` for the first; none once the child is gone."""
        found: list[tuple[str, object, object]] = []
        try:
            while self.alive and self._connection.poll(timeout_s if not found else 0):
                found.append(self._connection.recv())
                if found[-1][0] in ("done", "failed"):
                    self._jobs_open[0] -= 1
        except (EOFError, OSError):
            self.alive = False
        return found

    def skip(self, key: object) -> None:
        """Tell the child that `key` was done here."""
        try:
            self._connection.send(("skip", key))
        except (OSError, ValueError):
            self.alive = False

    def share(self, key: object, value: object) -> None:
        """Give the child `key`'s value, made here (a small one: it goes through the pipe): the child skips that
        item and may use the value for others (JobChannel.given)."""
        try:
            self._connection.send(("made", key, value))
        except (OSError, ValueError):
            self.alive = False

    def close(self) -> None:
        """Stop the child (it is killed: a job half done is of no use) and remove the jobs' files it left."""
        self.alive = False
        self._close()
