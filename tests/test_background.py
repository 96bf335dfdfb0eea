"""The forked second trace: the child's value comes back, failures fall back to the caller, and the
memory model is the same whether the two traces ran in one process or two."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from advisor.memory.estimate import StepMemory
from advisor.memory.plan import MemorySettings, trace_both_batches
from advisor.profile.background import ForkedCall, can_fork
from advisor.profile.model_file import load_model_file

needs_fork = pytest.mark.skipif(not can_fork(), reason="needs fork, two CPUs and no other thread")


def skip_unless_a_child_can_trace() -> None:
    """At run time: an earlier test's backward in this process forbids tracing in a child on CUDA builds."""
    if not can_fork():
        pytest.skip("a backward ran in this process on a torch build with autograd device threads")


@needs_fork
def test_the_value_is_computed_in_a_child_and_comes_back() -> None:
    parent = os.getpid()
    with ForkedCall(lambda: (os.getpid(), [1.5, "two"])) as child:
        pass
    pid, value = child.result(timeout_s=30)
    assert pid != parent and value == [1.5, "two"]


@needs_fork
def test_a_child_that_may_fork_again_runs_the_forked_trace_pair_itself() -> None:
    skip_unless_a_child_can_trace()
    model = load_model_file("mlp")
    settings = MemorySettings(batch_size=8, precision="fp32", optimizer="adamw")
    with ForkedCall(lambda: [t.batch_size for t in trace_both_batches(model, settings)], may_fork_again=True) as child:
        pass
    assert child.result(timeout_s=120) == [8, 16]
    with ForkedCall(can_fork) as daemonic:  # a daemonic child may not fork: it says so rather than fail
        pass
    assert daemonic.result(timeout_s=30) is False


@needs_fork
def test_ready_says_whether_the_value_came_without_waiting_for_it() -> None:
    read_end, write_end = os.pipe()  # the child sends once the test writes a byte
    with ForkedCall(lambda: os.read(read_end, 1)) as child:
        pass
    assert not child.ready()  # still blocked on the pipe
    os.write(write_end, b"x")
    deadline = time.perf_counter() + 30
    while not child.ready() and time.perf_counter() < deadline:
        time.sleep(0.01)
    assert child.ready() and child.result(timeout_s=0) == b"x"
    assert child.ready()  # read: nothing to wait for
    os.close(read_end), os.close(write_end)


@needs_fork
def test_a_failing_or_unpicklable_child_gives_none() -> None:
    def fails() -> None:
        raise ValueError("in the child")

    with ForkedCall(fails) as child:
        pass
    assert child.result(timeout_s=30) is None
    with ForkedCall(lambda: (lambda: None)) as child:  # a lambda cannot be pickled
        pass
    assert child.result(timeout_s=30) is None


@needs_fork
def test_a_slow_child_is_killed_after_the_timeout() -> None:
    with ForkedCall(lambda: time.sleep(60)) as child:
        pass
    started = time.perf_counter()
    assert child.result(timeout_s=0.2) is None
    assert time.perf_counter() - started < 10
    assert not child._process.is_alive()


@needs_fork
def test_an_error_in_the_parent_kills_the_child() -> None:
    with pytest.raises(RuntimeError, match="parent"):
        with ForkedCall(lambda: time.sleep(60)) as child:
            raise RuntimeError("parent")
    assert not child._process.is_alive()


@needs_fork
def test_both_batches_give_the_same_memory_in_one_process_or_two() -> None:
    skip_unless_a_child_can_trace()  # else both pairs are traced here
    model = load_model_file("mlp")
    settings = MemorySettings(batch_size=8, precision="fp32", optimizer="adamw")
    forked = trace_both_batches(model, settings, parallel=True)
    serial = trace_both_batches(model, settings, parallel=False)
    assert [t.batch_size for t in forked] == [t.batch_size for t in serial] == [8, 16]
    assert [StepMemory.of_trace(t) for t in forked] == [StepMemory.of_trace(t) for t in serial]
    # the child sends its step's memory alone (StepTrace.memory_only), its ops go to the trace cache
    assert len(forked[0].records) == len(serial[0].records) and forked[1].records == () and serial[1].records
    assert forked[1] == serial[1].memory_only()


@needs_fork
def test_the_sibling_batch_is_traced_by_a_child_from_the_built_model() -> None:
    # the child forked after the build traces batch 4 as a trace of its own would: the same ops and memory
    skip_unless_a_child_can_trace()
    from advisor.profile.trace import Sibling, trace_training_step

    model = load_model_file("gpt2_small")
    built: list[int] = []

    def build():  # counted in this process
        built.append(1)
        return model.build_model()

    def trace(batch: int, sibling: Sibling | None = None):
        return trace_training_step(build, model.example_input, batch, "amp-bf16", "adamw", model.loss_fn,
                                   attention="cuda", sibling=sibling)

    sibling = Sibling(4)
    first = trace(2, sibling)
    assert built == [1] and first.batch_size == 2  # one build here for both batches
    assert sibling.child is not None and sibling.child.unread  # left running while this process goes on
    second = sibling.collect()
    assert second is not None and second.batch_size == 4 and sibling.child is None
    alone = trace(4)
    assert second.records == alone.records
    assert StepMemory.of_trace(second) == StepMemory.of_trace(alone)


@needs_fork
def test_the_estimate_times_each_gpu_while_the_child_traces_the_second_batch(monkeypatch) -> None:
    # the estimate asks for the second trace only after timing each GPU's step on the first, and comes out as
    # it does from the two traces given ready
    skip_unless_a_child_can_trace()
    import advisor.estimate.plan as estimate_plan
    from advisor.app.plan import plan
    from advisor.app.request import PlanRequest
    from advisor.hardware.loader import load_hwdb
    from advisor.memory.plan import SecondTrace

    timed: list[str] = []
    timed_before_second: list[int] = []
    step_time, get = estimate_plan.step_time, SecondTrace.get
    monkeypatch.setattr(estimate_plan, "step_time", lambda trace, settings, target, *rest:
                        timed.append(target.id) or step_time(trace, settings, target, *rest))
    monkeypatch.setattr(SecondTrace, "get", lambda self: timed_before_second.append(len(timed)) or get(self))
    request = PlanRequest(model="gpt2_small", gpus=("h100-sxm", "rtx-3060", "a100-sxm4-80gb"), plans="never",
                          input_pipeline=False)
    db = load_hwdb()
    estimate = plan(request, db)
    assert timed_before_second[0] == 3 and sorted(timed) == sorted(request.gpus)
    again = plan(request, db, traces=(estimate.trace, estimate.second))
    assert [r.to_dict() for r in again.results] == [r.to_dict() for r in estimate.results]


@needs_fork
def test_a_step_on_real_input_values_leaves_the_sibling_to_the_caller() -> None:
    # a model that reads its inputs' values is traced on real inputs (tests/test_trace.py): no child then
    skip_unless_a_child_can_trace()
    from advisor.profile.trace import Sibling, trace_training_step
    from tests.test_trace import ReadsItsMask, masked_inputs

    sibling = Sibling(8)
    trace = trace_training_step(ReadsItsMask, masked_inputs, 4, "fp32", "sgd", sibling=sibling)
    assert trace.values == "fake+real-inputs" and sibling.trace is None


def _emit_multiples_after_go(value: int, keys: int, channel) -> None:
    """A served job: says it is ready, waits for the parent's "go" (a skip note, read in order after any
    other), then emits value * k for each key k the parent did not skip."""
    channel.starting("ready")
    deadline = time.perf_counter() + 30
    while not channel.skipped("go"):
        assert time.perf_counter() < deadline
        time.sleep(0.01)
    for key in range(keys):
        if not channel.skipped(key):
            channel.emit(key, value * key)


@needs_fork
def test_a_serving_child_runs_jobs_on_its_value_and_skips_what_the_parent_did() -> None:
    with ForkedCall(lambda: 10, serves=True) as child:
        pass
    served = child.served()
    assert served is not None and served.submit(_emit_multiples_after_go, 4)
    assert child.result(timeout_s=30) == 10  # its value first (through a file), then it serves
    messages = served.poll(timeout_s=30)
    assert messages[0] == ("starting", "ready", None)
    served.skip(1)
    served.skip("go")
    while messages[-1][0] not in ("done", "failed"):
        messages += served.poll(timeout_s=30)
    assert [(key, value) for kind, key, value in messages if kind == "item"] == [(0, 0), (2, 20), (3, 30)]
    assert messages[-1][0] == "done"
    served.close()
    assert not child._process.is_alive() and not served.alive


def _kept_again(value: int) -> tuple[int, str]:
    """An "again" job (ForkedCall.again): the child keeps `value` and sends what it is."""
    return value, f"kept {value}"


def _fails_again() -> tuple[int, int]:
    raise ValueError("in the child")


def _items(served) -> list[tuple]:
    """(key, value) of each item a job sent, read to its end."""
    messages: list[tuple] = []
    while not messages or messages[-1][0] not in ("done", "failed"):
        messages += served.poll(timeout_s=30)
    assert messages[-1][0] == "done"
    return [(key, value) for kind, key, value in messages if kind == "item"]


@needs_fork
def test_a_serving_child_makes_its_value_again_and_serves_jobs_on_the_new_one() -> None:
    with ForkedCall(lambda: 10, serves=True) as child:
        pass
    assert child.result(timeout_s=30) == 10
    assert child.again(_kept_again, 7) and child.unread
    assert not child.again(_kept_again, 8)  # one value at a time: the first is not read
    assert child.result(timeout_s=30) == "kept 7"  # what it sent; it keeps 7
    served = child.served()
    assert served is not None and served.submit(_emit_multiples_after_go, 3)
    served.skip("go")
    assert _items(served) == [(0, 0), (1, 7), (2, 14)]
    assert child.idle(timeout_s=5)  # no job open
    files = [parcel.path for parcel in child._job_parcels]
    child.close()
    assert not child._process.is_alive() and not any(os.path.exists(path) for path in files)


@needs_fork
def test_idle_ends_the_job_left_open_and_a_child_that_fails_again_is_stopped() -> None:
    with ForkedCall(lambda: 10, serves=True) as child:
        pass
    assert child.result(timeout_s=30) == 10
    served = child.served()
    assert served is not None and served.submit(_emit_multiples_after_go, 1000)  # waits for a "go" never sent
    assert not child.again(_kept_again, 7)  # a job is open
    assert child.idle(timeout_s=30)  # told to end it: its items skipped, its messages dropped
    assert child.again(_kept_again, 5) and child.result(timeout_s=30) == "kept 5"
    served = child.served()
    assert served is not None and served.submit(_emit_multiples_after_go, 2)
    served.skip("go")
    assert _items(served) == [(0, 0), (1, 5)]  # nothing of the job before
    assert child.again(_fails_again)
    assert child.result(timeout_s=30) is None and not child._process.is_alive()


@needs_fork
def test_a_serving_child_closed_before_it_read_its_job_leaves_no_file() -> None:
    # the estimate can end before its child has sent its own trace: the job's file was never read
    with ForkedCall(lambda: time.sleep(60), serves=True) as child:
        pass
    served = child.served()
    assert served is not None and served.submit(_emit_multiples_after_go, 2)
    files = [child._parcel.path] + [parcel.path for parcel in child._job_parcels]
    assert len(files) == 2 and all(os.path.exists(path) for path in files)
    served.close()
    assert not child._process.is_alive() and not any(os.path.exists(path) for path in files)


@needs_fork
def test_a_serving_child_that_failed_serves_nothing() -> None:
    def fails() -> None:
        raise ValueError("in the child")

    with ForkedCall(fails, serves=True) as child:
        pass
    served = child.served()
    assert child.result(timeout_s=30) is None
    assert child.served() is None  # its process is done
    if served is not None:  # asked before the failure was read: the job is never run
        served.submit(_emit_multiples_after_go, 2)
        assert served.poll(timeout_s=0.5) == [] and not served.alive
        served.close()


@needs_fork
def test_a_job_whose_file_cannot_be_written_is_refused_not_raised(monkeypatch) -> None:
    # a full /dev/shm: the caller is told the child cannot take the job and does the work itself
    from advisor.profile import background

    with ForkedCall(lambda: 10, serves=True) as child:
        pass
    served = child.served()
    assert served is not None and child.result(timeout_s=30) == 10

    def full(self, value):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(background._Parcel, "filled", full)
    assert served.submit(_emit_multiples_after_go, 2) is False and not served.alive
    served.close()
    assert not child._process.is_alive()


@needs_fork
def test_a_serving_child_no_one_closed_is_closed_when_the_process_exits(tmp_path: Path) -> None:
    # a child left serving (its caller forgot it, or raised before it could close it) is stopped at exit and
    # its file removed
    script = tmp_path / "forgets.py"
    script.write_text("import time\nfrom advisor.profile.background import ForkedCall\n"
                      "child = ForkedCall(lambda: time.sleep(60), serves=True)\n"
                      "print(child._parcel.path, child._process.pid, flush=True)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True)
    path, pid = done.stdout.split()
    assert not os.path.exists(path)
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid), 0)


@needs_fork
def test_the_files_of_a_process_killed_outright_are_removed_by_the_next_serving_child() -> None:
    # SIGKILL leaves no cleanup: the next process that forks a serving child removes what a gone one left
    from advisor.profile import background

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    folder = Path(background._JOB_FOLDER or __import__("tempfile").gettempdir())
    stale = folder / f"{background.PARCEL_PREFIX}{gone.stdout.strip()}-left"
    own = folder / f"{background.PARCEL_PREFIX}{os.getpid()}-mine"
    stale.write_bytes(b"x")
    own.write_bytes(b"x")
    try:
        with ForkedCall(lambda: 1, serves=True) as child:
            pass
        assert child.result(timeout_s=30) == 1
        child.close()
        assert not stale.exists() and own.exists()
    finally:
        own.unlink()
        stale.unlink(missing_ok=True)
