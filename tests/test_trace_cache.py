"""Traced steps kept on disk between runs (advisor/profile/trace_cache.py, issue #24)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from advisor.app.plan import plan
from advisor.app.request import PlanRequest
from advisor.hardware.loader import load_hwdb
from advisor.memory.plan import MemorySettings, trace_for_memory
from advisor.profile import trace_cache
from advisor.profile.model_file import load_model_file

MODEL = '''
import torch
from torch import nn
from {helper} import WIDTH

def build_model():
    return nn.Sequential(nn.Linear(WIDTH, 32), nn.ReLU(), nn.Linear(32, 4))

def example_input(batch_size):
    return torch.randn(batch_size, WIDTH)
'''


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPU_ADVISOR_TRACE_CACHE", "on")
    monkeypatch.setenv("GPU_ADVISOR_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "traces"


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    """A model file that imports a module beside it (named for the test: model folders join sys.path)."""
    folder = tmp_path / "model"
    folder.mkdir()
    helper = "helper_" + "".join(c if c.isalnum() else "_" for c in tmp_path.name)
    (folder / f"{helper}.py").write_text("WIDTH = 16\n")
    (folder / "net.py").write_text(MODEL.format(helper=helper))
    return folder / "net.py"


def traced(path: Path, **settings):
    return trace_for_memory(load_model_file(str(path)), MemorySettings(batch_size=4, **settings), 4)


def test_a_step_traced_once_comes_back_from_disk_the_same(cache: Path, model_file: Path):
    first = traced(model_file)
    assert len(list(cache.glob("*.trace"))) == 1
    again = traced(model_file)
    assert again is not first and again == first  # the same records, memory and settings, read back
    traced(model_file, precision="amp-bf16")  # other settings: another trace
    assert len(list(cache.glob("*.trace"))) == 2



def test_a_trace_read_once_is_served_from_memory_until_its_file_changes(cache: Path, model_file: Path,
                                                                      monkeypatch: pytest.MonkeyPatch):
    traced(model_file)
    read = traced(model_file)  # from disk
    reads = []
    real_read = trace_cache._read
    monkeypatch.setattr(trace_cache, "_read", lambda *args: reads.append(args) or real_read(*args))
    assert traced(model_file) is read and reads == []  # the same file: not read or unpickled again
    # another process stores the trace again (a new file in its place): read from disk
    path = next(cache.glob("*.trace"))
    copy = path.with_suffix(".copy")
    copy.write_bytes(path.read_bytes())
    os.replace(copy, path)
    again = traced(model_file)
    assert len(reads) == 1 and again == read and again is not read

def test_an_edit_of_the_model_or_a_file_beside_it_traces_again(cache: Path, model_file: Path):
    traced(model_file)
    # what `from helper import WIDTH` reads (another size: Python's bytecode cache checks size and mtime)
    (helper,) = model_file.parent.glob("helper_*.py")
    helper.write_text("WIDTH = 24  # wider\n")
    sys.modules.pop(helper.stem, None)  # the model file imports it by name: a fresh import
    assert traced(model_file).params == 24 * 32 + 32 + 32 * 4 + 4  # 24x32 + 32 biases, 32x4 + 4 biases
    assert len(list(cache.glob("*.trace"))) == 2


def test_a_damaged_or_foreign_file_is_never_used_and_is_replaced(cache: Path, model_file: Path):
    first = traced(model_file)
    (path,) = cache.glob("*.trace")
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # one flipped byte in the pickled trace: its checksum no longer matches
    path.write_bytes(bytes(data))
    assert trace_cache.load(path.stem) is None and not path.exists()
    assert traced(model_file) == first and path.exists()  # traced again and stored again
    if hasattr(os, "getuid"):
        path.chmod(0o666)  # writable by others: someone else could have planted it
        assert trace_cache.load(path.stem) is None and not path.exists()


def test_the_least_recently_used_traces_go_first(cache: Path, model_file: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(trace_cache, "MAX_ENTRIES", 2)
    for precision in ("fp32", "bf16", "amp-bf16"):
        traced(model_file, precision=precision)
    assert len(list(cache.glob("*.trace"))) == 2


def test_off_means_nothing_is_written(cache: Path, model_file: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GPU_ADVISOR_TRACE_CACHE", "off")
    traced(model_file)
    assert not cache.exists()


def test_a_second_plan_reuses_both_traced_steps(cache: Path, model_file: Path):
    messages: list[str] = []
    request = PlanRequest(model=str(model_file), gpus=("h100-sxm",))
    first = plan(request, load_hwdb(), messages.append)
    assert not any("trace cache" in m for m in messages)
    messages.clear()
    again = plan(request, load_hwdb(), messages.append)
    assert any("traced at batches" in m and "trace cache" in m for m in messages)
    assert again.to_dict() == first.to_dict()


def test_the_child_stores_the_whole_second_step_and_sends_its_memory(cache: Path, model_file: Path):
    # the step at twice the batch, traced in a child, is cached with its ops (a later estimate at that batch
    # reads it as its own step) while this process gets its memory alone (StepTrace.memory_only)
    from advisor.memory.plan import trace_both_batches
    from advisor.profile.background import can_fork

    if not can_fork():
        pytest.skip("needs fork, two CPUs and no other thread")
    model = load_model_file(str(model_file))
    first, second = trace_both_batches(model, MemorySettings(batch_size=4))
    assert second.batch_size == 8 and second.records == ()
    assert len(list(cache.glob("*.trace"))) == 2  # both steps stored: the second by the child
    stored = trace_for_memory(model, MemorySettings(batch_size=8), 8)  # read back, not traced
    assert stored.records and stored.memory_only() == second and stored is not second


def test_layouts_replayed_once_come_back_from_disk(cache: Path, model_file: Path, monkeypatch: pytest.MonkeyPatch):
    # each layout's per-rank memory (ddp, zero1, zero2, fsdp on 2 GPUs) is kept beside the two traces
    request = PlanRequest(model=str(model_file), gpus=("h100-sxm",), num_gpus=2)
    first = plan(request, load_hwdb())
    stored = list(cache.glob(f"*{trace_cache.LAYOUTS_SUFFIX}"))
    assert len(stored) == 1

    import advisor.estimate.parallel as parallel

    def no_replay(trace):
        raise AssertionError("a layout stored before was re-played")

    with monkeypatch.context() as patched:
        patched.setattr(parallel.StepMemory, "of_trace", staticmethod(no_replay))
        again = plan(request, load_hwdb())
    assert again.to_dict() == first.to_dict()

    stored[0].write_bytes(b'{"format": "something else"}\n')  # a damaged file: deleted, re-played, rewritten
    assert plan(request, load_hwdb()).to_dict() == first.to_dict()
    assert trace_cache.load(stored[0].name.split(".")[0], trace_cache.LAYOUTS_SUFFIX, dict) is not None
