"""One way to replace a file whole or not at all, for every file the tool and its benchmarks write.

Standard library only: `advisor --help` and the GPU ground-truth script import it, and neither may pull in
torch or anything heavy.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

DEFAULT_SUFFIX = ".tmp"


def temporary_name(target: Path, suffix: str = DEFAULT_SUFFIX) -> str:
    """The name of a temporary for `target`: `.NAME.PID.RANDOM<suffix>` (RANDOM: 8 hex digits), hidden,
    beside NAME, and telling which process wrote it, so that a cleaner can tell a killed writer's file."""
    return f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}{suffix}"


def write_atomically(path: Path, data: str | bytes, *, suffix: str = DEFAULT_SUFFIX) -> None:
    """Replace `path` with `data` (a str is written as UTF-8) so that readers see the old file or the new
    one, never a part of either.

    The data goes to a new temporary file in the same folder as the target (`temporary_name`, created
    exclusively), is flushed and fsync'ed, and the temporary is renamed over the target with os.replace.
    A symbolic link is written through to the file it points at (the link stays); an existing file keeps
    its permissions, a new one gets those open() would give it (0o666 less the umask).

    On any failure, KeyboardInterrupt included, the temporary is removed, the target is left as it was,
    and the exception is re-raised unchanged: nothing is swallowed. Callers that want their own message
    catch OSError themselves.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    temporary = target.with_name(temporary_name(target, suffix))
    created = False
    try:
        mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else None
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
        created = True
        with open(descriptor, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        if created:  # never another writer's file, should os.open have failed on an existing name
            with contextlib.suppress(OSError):  # the original error is the one that counts
                temporary.unlink()
        raise
