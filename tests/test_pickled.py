"""advisor/pickled.py: the parsed hardware database and reference calibrations kept between runs, and the
checks every pickled cache file passes before it is read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from advisor import pickled
from advisor.calibration import reference
from advisor.hardware.loader import HwdbError, load_directories, load_hwdb


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The data cache on, in a folder of this test's own."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("GPU_ADVISOR_CACHE_DIR", str(folder))
    monkeypatch.setenv(pickled.DATA_CACHE, "on")
    return folder


def counted(value: object, calls: list[int]):
    def build() -> object:
        calls.append(1)
        return value
    return build


def test_a_value_is_built_once_and_read_back_while_its_files_and_code_stay(cache: Path) -> None:
    calls: list[int] = []
    files = [("a.yaml", b"x: 1\n")]
    first = pickled.loaded("thing", files, ("hardware",), dict, counted({"x": 1}, calls))
    again = pickled.loaded("thing", files, ("hardware",), dict, counted({"x": 99}, calls))
    assert first == again == {"x": 1} and calls == [1]  # the second came from the file
    # another byte, another file name, other code: built again
    assert pickled.loaded("thing", [("a.yaml", b"x: 2\n")], ("hardware",), dict, counted({"x": 2}, calls)) == {"x": 2}
    assert pickled.loaded("thing", [("b.yaml", b"x: 1\n")], ("hardware",), dict, counted({"x": 3}, calls)) == {"x": 3}
    assert pickled.loaded("thing", files, ("calibration",), dict, counted({"x": 4}, calls)) == {"x": 4}
    assert len(calls) == 4


def test_what_the_build_raises_is_raised_and_nothing_is_kept(cache: Path) -> None:
    def broken() -> dict:
        raise HwdbError("a.yaml", "bad")

    with pytest.raises(HwdbError, match="a.yaml: bad"):
        pickled.loaded("thing", [("a.yaml", b"?")], (), dict, broken)
    assert not (cache / "loaded").exists() or not any((cache / "loaded").iterdir())


def test_a_file_of_the_wrong_type_or_writable_by_others_or_edited_is_built_again(cache: Path) -> None:
    calls: list[int] = []
    files = [("a.yaml", b"x: 1\n")]
    pickled.loaded("thing", files, (), dict, counted({"x": 1}, calls))
    (kept,) = (cache / "loaded").glob("thing-*.pickle")
    assert pickled.loaded("thing", files, (), list, counted([1], calls)) == [1]  # a dict where a list is asked
    assert len(calls) == 2
    os.chmod(kept, 0o666)  # group- and world-writable: never unpickled
    assert pickled.loaded("thing", files, (), list, counted([2], calls)) == [2] and len(calls) == 3
    data = bytearray(kept.read_bytes())
    data[-3] ^= 0xFF  # one flipped byte of the payload: its checksum no longer matches
    kept.write_bytes(bytes(data))
    assert pickled.loaded("thing", files, (), list, counted([3], calls)) == [3] and len(calls) == 4


def test_a_folder_that_cannot_be_written_still_serves_what_it_holds(cache: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    pickled.loaded("thing", [("a.yaml", b"")], (), dict, counted({"x": 1}, calls))

    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError("read-only")

    monkeypatch.setattr(os, "utime", refused)  # as on a read-only folder
    assert pickled.loaded("thing", [("a.yaml", b"")], (), dict, counted({"x": 2}, calls)) == {"x": 1}
    assert calls == [1]


def test_off_builds_every_time(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pickled.DATA_CACHE, "off")
    calls: list[int] = []
    for _ in range(2):
        pickled.loaded("thing", [("a.yaml", b"")], (), dict, counted({}, calls))
    assert calls == [1, 1] and not (cache / "loaded").exists()


def test_only_the_newest_files_of_a_kind_are_kept(cache: Path) -> None:
    for number in range(pickled.DATA_ENTRIES + 3):
        pickled.loaded("thing", [("a.yaml", str(number).encode())], (), int, lambda n=number: n)
        kept = sorted((cache / "loaded").glob("thing-*.pickle"), key=lambda path: path.stat().st_mtime)
        os.utime(kept[-1], (number, number))  # in order, a second apart (a fast disk's mtimes may tie)
    assert len(list((cache / "loaded").glob("thing-*.pickle"))) == pickled.DATA_ENTRIES


def test_the_database_read_back_is_the_one_parsed_and_an_edit_is_seen_at_once(cache: Path, tiny_db_dir: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = load_directories([tiny_db_dir])
    assert len(list((cache / "loaded").glob("hwdb-*.pickle"))) == 1
    assert load_directories([tiny_db_dir]) == parsed
    gpu_file = tiny_db_dir / "gpus" / "tiny.yaml"
    text = gpu_file.read_text()
    gpu_file.write_text(text.replace("memory_gb: 16", "memory_gb: 24"))
    assert load_directories([tiny_db_dir]).gpu("tiny-gpu").memory_bytes == 24 * 2**30
    gpu_file.write_text(text.replace("memory_gb: 16", "memory_gb: [16"))  # broken YAML: its error, not a cache
    with pytest.raises(HwdbError, match="tiny.yaml: not valid YAML"):
        load_directories([tiny_db_dir])
    gpu_file.write_text(text)
    assert load_directories([tiny_db_dir]) == parsed
    shipped = load_hwdb()
    monkeypatch.setenv(pickled.DATA_CACHE, "off")
    assert load_hwdb() == shipped


def test_reference_families_read_back_are_the_ones_parsed(cache: Path) -> None:
    db = load_hwdb()
    reference._loaded.clear()
    parsed = reference.load_families(db)
    reference._loaded.clear()  # a new process: from the file
    assert reference.load_families(db) == parsed
    assert len(list((cache / "loaded").glob("reference-*.pickle"))) == 1


def test_a_run_that_finds_the_database_kept_imports_no_yaml(cache: Path) -> None:
    # what an estimate's first call saves: yaml's import (about 10 ms) and its parse (40-60 ms)
    code = ("import sys; from advisor.hardware.loader import load_hwdb; from advisor.calibration.reference import "
            "load_families; load_families(load_hwdb()); print('yaml' in sys.modules)")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ}).stdout.split() for _ in range(2)]
    assert runs == [["True"], ["False"]]
