"""The one atomic-write helper every file the project writes goes through, and the writer lock gc respects.

A crash leaves either the whole file or nothing: temp file in the same folder, fsync, os.replace, folder
fsync. While it is being written the temp file holds an exclusive flock, so `LocalStore.gc` can tell a live
writer's temp file from an abandoned one.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

try:  # POSIX: a writer holds an exclusive lock on its temp file, so gc can tell it is alive
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: gc relies on the grace period alone
    fcntl = None  # type: ignore[assignment]


def try_lock(fd: int, blocking: bool) -> bool:
    """Exclusive flock on an open file; False when another process holds it (non-blocking mode)."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        return True
    except BlockingIOError:
        return False


def atomic_write(path: Path, data: bytes) -> None:
    """Write bytes so that a crash leaves either the whole file or nothing: temp, fsync, os.replace.

    The temp file `.<name>.<random>.tmp` is created with mode 0o666 (the process umask applies, as for any new
    file) and stays locked (flock) until it is renamed, so a concurrent `gc` never removes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        try_lock(fd, blocking=True)
        view = memoryview(data).cast("B")
        n = 0
        while n < len(view):
            n += os.write(fd, view[n:])
        os.fsync(fd)
        os.replace(tmp, path)
    except BaseException:
        discard(tmp)
        raise
    finally:
        os.close(fd)  # releases the lock, after the rename
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Best-effort fsync of a folder so the rename itself is durable (a no-op where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def discard(path: str | os.PathLike) -> None:
    """Remove a temp file after a failed write; already gone is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
