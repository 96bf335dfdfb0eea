"""Measured profiles in the user's cache directory, one JSON file per device, written atomically.

A file is trusted only when it parses, carries this format and schema, its checksum matches its
content, and its fingerprint equals this machine's: anything else (a torn or edited file, one copied
from another machine, one measured with another torch or suite) is reported and replaced by the next
calibration, never used.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.calibration.profile import CalibrationProfile, Fingerprint

FORMAT = "gpu-advisor-calibration"
SCHEMA = 1


def cache_dir() -> Path:
    """$GPU_ADVISOR_CACHE_DIR, else $XDG_CACHE_HOME/gpu-advisor, else ~/.cache/gpu-advisor."""
    explicit = os.environ.get("GPU_ADVISOR_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpu-advisor"


def profile_path(device: str) -> Path:
    """Where the profile of `device` ("cpu", "cuda:0") is kept."""
    return cache_dir() / "calibration" / f"{device.replace(':', '')}.json"


def _checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def store_profile(profile: CalibrationProfile) -> Path:
    """Write `profile` to its cache file atomically (a temporary file in the same folder, then a
    rename): readers see the old file or the new one, never half of one."""
    assert profile.status == "measured" and profile.fingerprint is not None
    path = profile_path(profile.device)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = profile.to_dict()
    document = {"format": FORMAT, "schema": SCHEMA, "sha256": _checksum(body), "profile": body}
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump(document, file, indent=1)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


@dataclass(frozen=True)
class CachedProfile:
    """What the cache holds for a device: a profile to use, or why there is none."""

    path: Path
    profile: CalibrationProfile | None
    problem: str | None
    """None when `profile` can be used; else "none stored", "corrupt: ...", "stale: ..." or "foreign: ..."."""

    @property
    def usable(self) -> bool:
        return self.profile is not None


def load_profile(device: str, current: Fingerprint) -> CachedProfile:
    """The cached profile of `device` if it is intact and was measured on this machine and software."""
    path = profile_path(device)
    if not path.is_file():
        return CachedProfile(path, None, "none stored")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return CachedProfile(path, None, f"corrupt: not JSON ({exc})")
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return CachedProfile(path, None, f"corrupt: not a {FORMAT} file")
    if document.get("schema") != SCHEMA:
        return CachedProfile(path, None, f"stale: schema {document.get('schema')}, this version reads {SCHEMA}")
    body = document.get("profile")
    if not isinstance(body, dict) or document.get("sha256") != _checksum(body):
        return CachedProfile(path, None, "corrupt: checksum does not match the content")
    try:
        profile = CalibrationProfile.from_dict(body)
    except (KeyError, TypeError, ValueError) as exc:
        return CachedProfile(path, None, f"corrupt: {type(exc).__name__}: {exc}")
    if profile.fingerprint is None:
        return CachedProfile(path, None, "corrupt: no fingerprint")
    changed = current.differences(profile.fingerprint)
    if changed:
        return CachedProfile(path, None, f"foreign: measured on another machine or software ({'; '.join(changed)})")
    return CachedProfile(path, profile, None)
