"""Where the data that ships with the tool lies: at the top of a checkout, or inside the installed
package as advisor/_data/<name> (pyproject's package-dir puts it there)."""

from __future__ import annotations

import os
from pathlib import Path

from advisor.errors import UserError


def shipped_dir(name: str, marker: str) -> Path:
    """The shipped folder `name` (hwdb, calibration, examples); `marker` is a file it must hold."""
    package = Path(__file__).resolve().parent
    checkout = package.parent / name
    if (checkout / marker).is_file() and (package.parent / "pyproject.toml").is_file():
        return checkout
    installed = package / "_data" / name
    assert (installed / marker).is_file(), f"shipped folder {name}/ missing at {installed}"
    return installed


def file_stamp(path: Path) -> tuple[int, int, int] | None:
    """(inode, size in bytes, mtime in ns) of `path`, None when it cannot be read: equal stamps, the same
    file unchanged (an in-process memory of what was read from it may serve)."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


def user_cache_dir() -> Path:
    """The tool's cache folder (calibrations, traced steps): $GPU_ADVISOR_CACHE_DIR, else
    $XDG_CACHE_HOME/gpu-advisor, else ~/.cache/gpu-advisor."""
    explicit = os.environ.get("GPU_ADVISOR_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".cache")
        except RuntimeError as exc:  # no $HOME and no password entry
            raise UserError(f"no folder for the cache ({exc}); set $GPU_ADVISOR_CACHE_DIR") from None
    return Path(base) / "gpu-advisor"
