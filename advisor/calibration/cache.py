"""Measured profiles in the user's cache directory, one JSON file per device, written atomically.

A file is trusted only when it is a regular file of a profile's size, parses, carries this format and
schema, its checksum matches its content, every value in it is well-formed, and its fingerprint equals
this machine's: anything else (a torn or edited file, a folder or an unreadable file in its place, one
copied from another machine, one measured with another torch or suite) is reported and replaced by the
next calibration, never used.

Writes go through a temporary file in the same folder, named `.<profile>.<pid>.<random>.tmp`, and a
rename (advisor.atomic.write_atomically). A temporary whose writer was killed stays behind; it is
recognised by its name and removed the next time the folder is read or written
(`clean_stale_temporaries`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.atomic import write_atomically
from advisor.calibration.checked import MalformedProfile
from advisor.calibration.profile import CalibrationProfile, Fingerprint
from advisor.errors import UserError
from advisor.paths import user_cache_dir

FORMAT = "gpu-advisor-calibration"
SCHEMA = 1

MAX_FILE_BYTES = 16 * 2**20
"""A profile is about 45 KB (quick run on a CPU) to about 100 KB (the full suite on a GPU): a file over
16 MiB is not one, and is refused unread."""

WRITE_CHECK_BYTES = 256 * 2**10
"""What `check_writable` writes (and syncs) to prove there is room for a profile."""

STALE_AFTER_S = 600.0
"""A temporary older than this is stale whoever wrote it: a write takes milliseconds."""

DEAD_WRITER_GRACE_S = 60.0
"""A temporary whose writer's process is gone is stale once this old (the grace covers a writer on
another machine sharing the folder, whose process id means nothing here)."""

TEMPORARY = re.compile(r"\.(?:[\w.-]+\.json|write-check)\.(?:(?P<pid>\d{1,10})\.)?[a-z0-9_]{8}\.tmp")
"""Our temporaries: `.cpu.json.<pid>.<8 random>.tmp`, `.write-check.<pid>.<8 random>.tmp`, and the
pid-less `.cpu.json.<8 random>.tmp` of earlier versions."""


class CacheError(UserError):
    """The cache folder cannot be written: which folder, and why (from the operating system)."""

    def __init__(self, directory: Path, reason: str, message: str | None = None) -> None:
        self.directory = directory
        self.reason = reason
        super().__init__(message or f"cannot store calibrations in {directory} ({reason}); make it writable or "
                                    f"set $GPU_ADVISOR_CACHE_DIR to a folder that can be written")


def cache_dir() -> Path:
    """$GPU_ADVISOR_CACHE_DIR, else $XDG_CACHE_HOME/gpu-advisor, else ~/.cache/gpu-advisor."""
    return user_cache_dir()


def profile_path(device: str) -> Path:
    """Where the profile of `device` ("cpu", "cuda:0") is kept."""
    return cache_dir() / "calibration" / f"{device.replace(':', '')}.json"


def _checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def os_reason(exc: OSError) -> str:
    """What went wrong, in the operating system's words ("No space left on device")."""
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        return "part of that path is a file, not a folder"
    return exc.strerror or str(exc)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    except (OverflowError, ValueError, OSError):
        return False
    return True


def clean_stale_temporaries(directory: Path) -> list[Path]:
    """Remove the temporaries of interrupted writes in `directory`: ours by their name, and stale when
    older than STALE_AFTER_S, or DEAD_WRITER_GRACE_S once the process that wrote them is gone. Never
    fails: a folder that cannot be listed or written keeps them. Returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        match = TEMPORARY.fullmatch(entry.name)
        if match is None:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue
        age = now - info.st_mtime
        pid = match["pid"]
        writer_gone = pid is not None and int(pid) != os.getpid() and not _pid_alive(int(pid))
        if age > STALE_AFTER_S or (writer_gone and age > DEAD_WRITER_GRACE_S):
            try:
                os.unlink(entry.path)
            except OSError:
                continue
            removed.append(Path(entry.path))
    return removed


def _temporary(directory: Path, name: str) -> tuple[int, str]:
    """A new temporary file in `directory` named after `name` and this process: (descriptor, path)."""
    return tempfile.mkstemp(prefix=f".{name}.{os.getpid()}.", suffix=".tmp", dir=directory)


def check_writable(device: str) -> Path:
    """Make sure the profile of `device` can be stored, before minutes of measuring: its folder exists
    or is created, a file of a profile's size is written, synced and removed there, and the profile's
    own name is free (an empty folder in its place is removed). Returns the profile's path; CacheError
    (exit 2) names the folder and why it cannot be written."""
    path = profile_path(device)
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        clean_stale_temporaries(directory)
        if path.is_dir():
            if any(path.iterdir()):
                raise CacheError(directory, f"{path.name} there is a folder", (
                    f"cannot store the calibration of {device}: {path} is a folder, not a profile; remove it, "
                    f"or set $GPU_ADVISOR_CACHE_DIR to another folder"))
            path.rmdir()
        handle, probe = _temporary(directory, "write-check")
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(bytes(WRITE_CHECK_BYTES))
                file.flush()
                os.fsync(file.fileno())
        finally:
            Path(probe).unlink(missing_ok=True)
    except OSError as exc:
        raise CacheError(directory, os_reason(exc)) from None
    return path


def store_profile(profile: CalibrationProfile) -> Path:
    """Write `profile` to its cache file atomically (advisor.atomic: a temporary file in the same folder,
    fsync, then a rename): readers see the old file or the new one, never half of one. On any failure,
    Ctrl-C included, the temporary is removed and the old file stays; OSError says why it failed."""
    assert profile.status == "measured" and profile.fingerprint is not None
    path = profile_path(profile.device)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temporaries(path.parent)
    body = profile.to_dict()
    document = {"format": FORMAT, "schema": SCHEMA, "sha256": _checksum(body), "profile": body}
    write_atomically(path, json.dumps(document, indent=1))
    return path


@dataclass(frozen=True)
class CachedProfile:
    """What the cache holds for a device: a profile to use, or why there is none."""

    path: Path
    profile: CalibrationProfile | None
    problem: str | None
    """None when `profile` can be used; else "none stored", "unreadable (...)", "corrupt: ...",
    "malformed (key ...: ...)", "stale: ..." or "foreign: ..."."""

    @property
    def usable(self) -> bool:
        return self.profile is not None

    def why_unusable(self, device: str) -> str:
        """One sentence for the user: what is wrong with the stored profile and what replaces it."""
        assert self.problem is not None
        if self.problem == "none stored":
            return f"no calibration of {device} is stored in {self.path}; run `advisor calibrate --device {device}`"
        return (f"{self.path} is {self.problem}: it is not used; `advisor calibrate --device {device}` "
                "replaces it")


def _read(path: Path) -> tuple[str | None, str | None]:
    """The file's text, or why it cannot be had: (text, None) or (None, problem)."""
    try:
        info = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None, "none stored"
    except OSError as exc:
        return None, f"unreadable ({os_reason(exc)})"
    if stat.S_ISDIR(info.st_mode):
        return None, "corrupt: a folder, not a file"
    if not stat.S_ISREG(info.st_mode):
        return None, "corrupt: not a regular file"
    too_big = f"corrupt: over {MAX_FILE_BYTES // 2**20} MiB, far more than any profile"
    if info.st_size > MAX_FILE_BYTES:
        return None, too_big
    try:
        with path.open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        return None, f"unreadable ({os_reason(exc)})"
    if len(data) > MAX_FILE_BYTES:  # it grew since stat()
        return None, too_big
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return None, f"corrupt: not JSON (not UTF-8 text: {exc.reason} at byte {exc.start})"


def _parse(text: str) -> tuple[Any, str | None]:
    try:
        return json.loads(text), None
    except RecursionError:
        return None, "corrupt: not JSON (nested too deeply)"
    except ValueError as exc:  # JSONDecodeError, and integers over Python's digit limit
        return None, f"corrupt: not JSON ({exc})"


def load_profile(device: str, current: Fingerprint) -> CachedProfile:
    """The cached profile of `device` if it is intact and was measured on this machine and software.
    Never raises for what is in the cache folder: every problem is a CachedProfile.problem."""
    path = profile_path(device)
    clean_stale_temporaries(path.parent)
    text, problem = _read(path)
    if text is None:
        return CachedProfile(path, None, problem)
    document, problem = _parse(text)
    if problem is not None:
        return CachedProfile(path, None, problem)
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return CachedProfile(path, None, f"corrupt: not a {FORMAT} file")
    if document.get("schema") != SCHEMA:
        schema = document.get("schema")
        shown = schema if isinstance(schema, int) else type(schema).__name__
        return CachedProfile(path, None, f"stale: schema {shown}, this version reads {SCHEMA}")
    body = document.get("profile")
    try:
        intact = isinstance(body, dict) and document.get("sha256") == _checksum(body)
    except (RecursionError, ValueError):
        intact = False
    if not intact:
        return CachedProfile(path, None, "corrupt: checksum does not match the content")
    try:
        profile = CalibrationProfile.from_dict(body)
    except MalformedProfile as exc:
        return CachedProfile(path, None, f"malformed ({exc})")
    except (KeyError, TypeError, ValueError, ArithmeticError, AssertionError) as exc:  # a check from_dict missed
        return CachedProfile(path, None, f"malformed ({type(exc).__name__}: {exc})")
    if profile.status != "measured" or profile.fingerprint is None:
        return CachedProfile(path, None, "corrupt: not a measured profile with a fingerprint")
    changed = current.differences(profile.fingerprint)
    if changed:
        return CachedProfile(path, None, f"foreign: measured on another machine or software ({'; '.join(changed)})")
    return CachedProfile(path, profile, None)
