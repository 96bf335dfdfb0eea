"""advisor.atomic.write_atomically: the one writer behind the calibration cache, the reports and the GPU
ground-truth script."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.atomic import temporary_name, write_atomically

REPO = Path(__file__).resolve().parents[1]


def test_writes_text_as_utf8_and_bytes_as_they_are(tmp_path: Path) -> None:
    write_atomically(tmp_path / "a.txt", "héllo\nwörld\n")
    assert (tmp_path / "a.txt").read_bytes() == "héllo\nwörld\n".encode()
    write_atomically(tmp_path / "b.bin", b"\x00\xff\r\n")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\xff\r\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin"]


def test_replaces_an_existing_file_and_keeps_its_permissions(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text("old, and longer than the new content")
    path.chmod(0o640)
    write_atomically(path, "new")
    assert path.read_text() == "new"
    assert path.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]


def test_a_new_file_gets_the_mode_open_would_give(tmp_path: Path) -> None:
    umask = os.umask(0o027)
    try:
        write_atomically(tmp_path / "new.txt", "x")
    finally:
        os.umask(umask)
    assert (tmp_path / "new.txt").stat().st_mode & 0o777 == 0o640


def test_a_link_is_written_through(tmp_path: Path) -> None:
    (tmp_path / "real.txt").write_text("old")
    (tmp_path / "link.txt").symlink_to(tmp_path / "real.txt")
    write_atomically(tmp_path / "link.txt", "through")
    assert (tmp_path / "link.txt").is_symlink() and (tmp_path / "real.txt").read_text() == "through"


@pytest.mark.parametrize("where", ["fsync", "chmod", "replace"])
def test_a_failed_write_leaves_the_old_file_and_no_temporary_and_raises(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       where: str) -> None:
    path = tmp_path / "report.md"
    path.write_text("old")
    error = OSError(errno.ENOSPC, "No space left on device")

    def fail(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(os, where, fail)
    with pytest.raises(OSError) as raised:
        write_atomically(path, "new")
    assert raised.value is error  # re-raised as it was, not wrapped nor swallowed
    monkeypatch.undo()
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]


def test_a_failed_new_file_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "replace", lambda a, b: (_ for _ in ()).throw(PermissionError(13, "Permission denied")))
    with pytest.raises(PermissionError):
        write_atomically(tmp_path / "new.txt", b"data")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_an_interrupt_removes_the_temporary_and_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        write_atomically(tmp_path / "a.txt", "text")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_a_missing_folder_raises_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomically(tmp_path / "missing" / "a.txt", "text")
    assert list(tmp_path.iterdir()) == []


def test_the_temporary_is_hidden_beside_the_target_and_names_its_writer(tmp_path: Path) -> None:
    name = temporary_name(tmp_path / "cpu.json")
    prefix = f".cpu.json.{os.getpid()}."
    assert name.startswith(prefix) and name.endswith(".tmp") and len(name) == len(prefix) + 8 + len(".tmp")
    assert temporary_name(tmp_path / "plan.html", ".advisor-tmp").endswith(".advisor-tmp")


def test_importing_it_imports_nothing_heavy() -> None:
    code = "import sys, advisor.atomic; print(sorted(m for m in ('torch', 'numpy', 'textual') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
