"""How fast this machine's storage serves a DataLoader's reads: random reads of one sample's size, as many
at once as the DataLoader has workers, from a file that is not in the page cache.

A test file of TEST_BYTES is written into the folder measured (the user cache, on the disk that holds
the home directory), synced, and read back at random block-aligned offsets by `depth` threads (the
reads release the GIL) for ROUNDS rounds of ROUND_S: with O_DIRECT where the file system allows it
(the page cache bypassed, as on a first epoch over a dataset read once), else after asking the kernel
to drop the file's cached pages (posix_fadvise DONTNEED). The median round is kept; the test file is
removed. Stored like the DataLoader's mechanics (a fingerprint of this machine and of the folder's
device, a checksum) when its rounds agree within MAX_SPREAD, for MAX_AGE_S.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from advisor.pipeline.measure import spread
from advisor.pipeline.stored import read_recent, write_document

FORMAT = "gpu-advisor-storage-rate"
SCHEMA = 1

TEST_BYTES = 128 * 2**20
"""Size of the file read back (bytes): larger than any drive's own cache of recent writes."""

ALIGN = 4096
"""Block alignment of O_DIRECT reads (bytes)."""

MAX_BLOCK = 4 * 2**20
ROUNDS = 3
ROUND_S = 0.25
MAX_DEPTH = 8

MAX_SPREAD = 0.5
"""Largest (slowest - fastest) / median of the rounds for a stored measurement: storage behind a virtual
machine varies more than a CPU does."""

MAX_AGE_S = 30 * 86_400.0


@dataclass(frozen=True)
class StorageRate:
    """Random reads of `block_bytes` with `depth` reads in flight. Bytes per second."""

    read_bytes_per_s: float
    block_bytes: int
    depth: int
    direct: bool
    """True: read with O_DIRECT, bypassing the page cache; False: after evicting the file's pages."""
    folder: str
    rounds: tuple[float, ...]
    """Each round's bytes per second."""
    stored: bool = False

    @property
    def spread(self) -> float:
        return spread(self.rounds)

    def samples_per_s(self, read_bytes_per_sample: float) -> float:
        """Samples per second this storage serves to a pipeline reading `read_bytes_per_sample` each."""
        assert read_bytes_per_sample > 0
        return self.read_bytes_per_s / read_bytes_per_sample

    def describe(self) -> str:
        how = "bypassing the page cache" if self.direct else "after evicting the file from the page cache"
        return (f"storage under {self.folder} reads {self.read_bytes_per_s / 1e6:,.0f} MB/s in random "
                f"{self.block_bytes / 1e3:,.0f} KB reads, {self.depth} at a time ({how}; rounds within "
                f"{self.spread:.0%})" + ("" if self.stored else ", noisy: not stored"))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rounds": list(self.rounds), "spread": self.spread}


def block_for(read_bytes_per_sample: float) -> int:
    """The read size that stands for one sample's: its bytes rounded up to ALIGN, within [ALIGN, MAX_BLOCK].

    # a 110 KB JPEG (110,000 bytes): 27 x 4,096 = 110,592
    """
    blocks = max(1, -(-int(read_bytes_per_sample) // ALIGN))
    return min(MAX_BLOCK, blocks * ALIGN)


def storage_rate(folder: Path, read_bytes_per_sample: float, depth: int,
                 progress: Callable[[str], None] = lambda message: None) -> StorageRate:
    """The stored rate of `folder`'s storage for this read size and depth, else measured now (about a
    second and a 128 MiB file written and removed) and stored when steady."""
    block, depth = block_for(read_bytes_per_sample), max(1, min(MAX_DEPTH, depth))
    path = _stored_path(folder, block, depth)
    known = _load(path)
    if known is not None:
        return known
    progress(f"timing storage reads under {folder} (once: it is stored)")
    measured = measure_storage(folder, block, depth)
    if measured.spread <= MAX_SPREAD:
        measured = replace(measured, stored=True)
        write_document(path, FORMAT, SCHEMA, {"measured_at": time.time(), "rate": measured.to_dict()})
    return measured


def measure_storage(folder: Path, block: int, depth: int) -> StorageRate:
    """Random `block`-byte reads by `depth` threads from a fresh test file in `folder` (see the module)."""
    folder.mkdir(parents=True, exist_ok=True)
    test = folder / f".storage-test-{os.getpid()}.bin"
    try:
        _write_test_file(test)
        direct = _opens_direct(test)
        rounds = [_read_round(test, block, depth, direct) for _ in range(ROUNDS)]
    finally:
        with contextlib.suppress(FileNotFoundError):
            test.unlink()
    return StorageRate(statistics.median(rounds), block, depth, direct, str(folder), tuple(rounds))


def _write_test_file(path: Path) -> None:
    chunk = os.urandom(4 * 2**20)  # incompressible: a compressing file system must store every byte
    with open(path, "wb") as handle:
        for _ in range(TEST_BYTES // len(chunk)):
            handle.write(chunk)
        handle.flush()
        os.fsync(handle.fileno())


def _opens_direct(path: Path) -> bool:
    """Whether `path` can be read with O_DIRECT (not on tmpfs, nor where the OS has no such flag)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    try:
        descriptor = os.open(path, os.O_RDONLY | flag)
    except OSError:
        return False
    try:
        buffer = mmap.mmap(-1, ALIGN)
        os.preadv(descriptor, [buffer], 0)
        return True
    except OSError:
        return False
    finally:
        os.close(descriptor)


def _read_round(path: Path, block: int, depth: int, direct: bool) -> float:
    """Bytes per second of `depth` threads reading random `block`-byte blocks for ROUND_S."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECT", 0) if direct else 0)
    descriptor = os.open(path, flags)
    try:
        if not direct and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        done = [0] * depth
        deadline = time.perf_counter() + ROUND_S
        blocks = TEST_BYTES // block

        def reader(slot: int) -> None:
            buffer = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
            pick = random.Random(slot)
            while time.perf_counter() < deadline:
                done[slot] += os.preadv(descriptor, [buffer], pick.randrange(blocks) * block)

        started = time.perf_counter()
        threads = [threading.Thread(target=reader, args=(slot,)) for slot in range(depth)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sum(done) / (time.perf_counter() - started)
    finally:
        os.close(descriptor)


def _device_of(folder: Path) -> int:
    probe = folder if folder.exists() else folder.parent
    return probe.stat().st_dev


def _stored_path(folder: Path, block: int, depth: int) -> Path:
    key = json.dumps([str(folder), _device_of(folder), block, depth])
    return folder / "storage" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def _load(path: Path) -> StorageRate | None:
    body = read_recent(path, FORMAT, SCHEMA, MAX_AGE_S)
    if body is None:
        return None
    try:
        fields = body["rate"]
        rate = StorageRate(float(fields["read_bytes_per_s"]), int(fields["block_bytes"]), int(fields["depth"]),
                           bool(fields["direct"]), str(fields["folder"]), tuple(float(r) for r in fields["rounds"]),
                           True)
    except (ValueError, KeyError, TypeError):
        return None
    return rate if rate.read_bytes_per_s > 0 else None
