"""Pickled objects kept in the user's cache folder between runs (traced steps, the loaded hardware database),
read back only when they are surely the tool's own.

A file is one line of JSON (its format, schema and key, the payload's length and SHA-256), then the pickled
object. It is read only when it is a regular file owned by this user and writable by no one else (pickle runs
code: a file someone else could have written is never read), not larger than the caller's limit, with the
format, schema and key asked for, whose payload has its length and checksum and unpickles to the type asked
for. Writes are atomic (advisor.atomic).

Standard library only (with advisor.atomic, advisor.paths): the hardware database's loader uses it, and
`advisor gpus` may not import torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
import sys
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from advisor.atomic import write_atomically
from advisor.errors import UserError
from advisor.paths import user_cache_dir

T = TypeVar("T")

READ_ERRORS = (OSError, ValueError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError)
"""What reading a file that is not (or no longer) a good one of ours may raise; FileNotFoundError (an OSError)
means there is none."""


def read(path: Path, header: dict[str, Any], kind: type, max_bytes: int) -> Any:
    """The object of type `kind` pickled in `path` under `header` (format, schema, key); raises one of
    READ_ERRORS when the file is missing (FileNotFoundError) or fails a check (see the module docstring)."""
    with open(path, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            raise ValueError("not a cache file")
        if hasattr(os, "getuid") and (info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
            raise ValueError("a cache file another user could have written")
        found = json.loads(file.readline(4096))
        if not isinstance(found, dict) or any(found.get(name) != value for name, value in header.items()):
            raise ValueError("another format, schema or key")
        payload = file.read(max_bytes + 1)
    if len(payload) != found.get("bytes") or hashlib.sha256(payload).hexdigest() != found.get("sha256"):
        raise ValueError("a torn or edited cache file")
    value = pickle.loads(payload)  # noqa: S301 -- our own file: owner and checksum checked above
    if not isinstance(value, kind):
        raise ValueError(f"not a {kind.__name__}")
    return value


def write(path: Path, header: dict[str, Any], value: Any) -> None:
    """Keep `value` pickled in `path` under `header` (format, schema, key), the folder made (private) where
    missing. Raises OSError where it cannot be written: callers go on without their cache."""
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    line = json.dumps({**header, "bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()})
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomically(path, line.encode() + b"\n" + payload)


def touch(path: Path) -> None:
    """Mark a cache file used now: keep_newest drops the least recently used first. A file whose time cannot be
    set (a read-only folder) still serves."""
    try:
        os.utime(path)
    except OSError:
        pass


def switched_on(variable: str) -> bool:
    """Whether the environment leaves a cache on: anything but off, 0, no or false in `variable`."""
    return os.environ.get(variable, "").strip().lower() not in ("off", "0", "no", "false")


def discard(path: Path) -> None:
    """Delete a cache file that failed a check; its object is made again and rewritten."""
    try:
        path.unlink(missing_ok=True)
    except OSError:  # a file we cannot delete is never read either: it fails the same check next time
        pass


def keep_newest(paths: list[Path], entries: int, total_bytes: int | None = None) -> None:
    """Delete the least recently used (oldest modification time) of `paths` beyond `entries` files or
    `total_bytes` bytes."""
    found = []
    for path in paths:
        try:
            info = path.stat()
        except FileNotFoundError:  # another process evicted it meanwhile
            continue
        found.append((info.st_mtime, info.st_size, path))
    found.sort(reverse=True)
    total = 0
    for count, (_, size, path) in enumerate(found):
        total += size
        if count >= entries or (total_bytes is not None and total > total_bytes):
            path.unlink(missing_ok=True)


@lru_cache(maxsize=8)
def source_digest(*packages: str) -> str:
    """SHA-256 of the Python version and every .py file of the advisor's `packages` ("profile", "hardware"):
    what an object cached from their code depends on."""
    digest = hashlib.sha256(f"{sys.version_info[:2]}".encode())
    root = Path(__file__).resolve().parent
    for package in packages:
        folder = root / package
        for path in sorted(folder.rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


DATA_CACHE = "GPU_ADVISOR_DATA_CACHE"
"""off, 0, no or false: the hardware database and the reference calibrations are parsed from their files at
every run instead of read back from the cache (the test suite turns it off but for the tests of loaded())."""
DATA_FORMAT = "gpu-advisor-loaded"
DATA_SCHEMA = 1
DATA_MAX_BYTES = 64 * 2**20
"""The shipped hardware database pickles to about 0.1 MB; a file over this is not one of ours."""
DATA_ENTRIES = 4
"""Files kept per kind of data (the least recently used dropped): an edited layer makes a new key."""


def data_cache_on() -> bool:
    return switched_on(DATA_CACHE)


def loaded(name: str, sources: Sequence[tuple[str, bytes]], packages: tuple[str, ...], kind: type[T],
           build: Callable[[], T]) -> T:
    """`build()`'s result (of type `kind`), parsed and validated from `sources` (each file's path and bytes) by
    the code of the advisor's `packages`, kept pickled in <cache>/loaded/ under a key that hashes all three:
    a run that finds the same files and the same code reads it back (about 1 ms for the hardware database,
    against 40-60 ms to parse and validate its YAML). What `build` raises is raised as it is and nothing is
    kept; a cache that cannot be read or written is passed by."""
    if not data_cache_on():
        return build()
    digest = hashlib.sha256(f"{DATA_FORMAT}|{DATA_SCHEMA}|{name}|{source_digest(*packages)}".encode())
    for path, data in sources:
        digest.update(f"|{path}|{len(data)}|".encode())
        digest.update(data)
    key = digest.hexdigest()
    header = {"format": DATA_FORMAT, "schema": DATA_SCHEMA, "key": key}
    try:
        file = user_cache_dir() / "loaded" / f"{name}-{key[:32]}.pickle"
    except UserError:  # no folder for a cache: parse at every run
        return build()
    try:
        value = read(file, header, kind, DATA_MAX_BYTES)
    except FileNotFoundError:
        pass
    except READ_ERRORS:
        discard(file)
    else:
        touch(file)
        return value
    value = build()
    try:
        write(file, header, value)
        keep_newest(list(file.parent.glob(f"{name}-*.pickle")), DATA_ENTRIES)
    except OSError:  # no room, read-only: parsed again next time
        pass
    return value
