"""Where the data that ships with the tool lies: at the top of a checkout, or inside the installed
package as advisor/_data/<name> (pyproject's package-dir puts it there)."""

from __future__ import annotations

from pathlib import Path


def shipped_dir(name: str, marker: str) -> Path:
    """The shipped folder `name` (hwdb, calibration, examples); `marker` is a file it must hold."""
    package = Path(__file__).resolve().parent
    checkout = package.parent / name
    if (checkout / marker).is_file() and (package.parent / "pyproject.toml").is_file():
        return checkout
    installed = package / "_data" / name
    assert (installed / marker).is_file(), f"shipped folder {name}/ missing at {installed}"
    return installed
