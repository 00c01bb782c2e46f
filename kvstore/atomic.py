"""The one atomic-write helper every file the project writes goes through, and the writer lock gc respects.

A crash leaves either the whole file or nothing: temp file in the same folder, fsync, os.replace, folder
fsync. While it is being written the temp file holds an exclusive flock, so `LocalStore.gc` can tell a live
writer's temp file from an abandoned one. Three shapes of the same procedure:

    atomic_write(path, data)        bytes already in memory (artifacts, run-folder files, reports)
    with atomic_file(path) as f:    a file streamed in pieces (a bundle's tar, which need not fit in memory)
    with atomic_directory(path) as tmp:
                                    a folder another library writes (the dequantized model's save_pretrained)
and `temp_path` + `publish` for a file a third party creates itself at a path we name (MLflow's SQLite store).
Standard library only: importing it pulls in neither torch nor the rest of kvstore.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

try:  # POSIX: a writer holds an exclusive lock on its temp file, so gc can tell it is alive
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: gc relies on the grace period alone
    fcntl = None  # type: ignore[assignment]

__all__ = ["atomic_directory", "atomic_file", "atomic_write", "discard", "fsync_dir", "publish", "temp_path",
           "try_lock"]


def try_lock(fd: int, blocking: bool) -> bool:
    """Exclusive flock on an open file; False when another process holds it (non-blocking mode)."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        return True
    except BlockingIOError:
        return False


def temp_path(path: Path) -> Path:
    """The temp name a write of `path` uses: `.<name>.<random>.tmp` in the same folder (what gc looks for)."""
    return path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"


def _locked_temp(path: Path, attempts: int = 8) -> tuple[Path, BinaryIO]:
    """A new temp file next to `path`, created and then locked. A `gc` that ran between the two (with grace 0 it
    may lock and remove a file that young) leaves this process holding an unlinked file: then take a new name."""
    for _ in range(attempts):
        tmp = temp_path(path)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        f = os.fdopen(fd, "w+b")
        try_lock(f.fileno(), blocking=True)
        try:
            if os.stat(tmp).st_ino == os.fstat(f.fileno()).st_ino:
                return tmp, f
        except FileNotFoundError:
            pass
        f.close()  # removed by a concurrent gc before we locked it: nothing of ours is in it yet
    raise OSError(f"{path.parent}: {attempts} temp files in a row were removed before they could be locked; is a "
                  "gc with grace 0 running in a loop? run gc with its default grace period")


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """Open a locked temp file next to `path` for writing (and reading back); on a clean exit it is flushed,
    fsync'ed and renamed over `path`, then the folder is fsync'ed; on any exception it is removed and `path` is
    untouched. The file is created with mode 0o666 (the process umask applies, as for any new file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, f = _locked_temp(path)
    try:
        with f:  # closing it releases the lock, after the rename
            yield f
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException:
        discard(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write(path: Path, data: bytes) -> None:
    """Write bytes so that a crash leaves either the whole file or nothing: temp, fsync, os.replace.

    The temp file `.<name>.<random>.tmp` stays locked (flock) until it is renamed, so a concurrent `gc` never
    removes it."""
    with atomic_file(path) as f:
        view = memoryview(data).cast("B")
        n = 0
        while n < len(view):
            n += os.write(f.fileno(), view[n:])


def publish(tmp: Path, path: Path) -> None:
    """Make a complete file that something else wrote at `tmp` durable and rename it over `path` (same folder)."""
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


@contextmanager
def atomic_directory(path: Path) -> Iterator[Path]:
    """A temp folder next to `path` to fill; on a clean exit its files are fsync'ed and it is renamed to `path`.

    When `path` appeared meanwhile (another process published the same content first) the temp folder is
    dropped and theirs kept; on any exception the temp folder is removed and `path` is untouched."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    tmp.mkdir()
    try:
        yield tmp
        for f in sorted(p for p in tmp.rglob("*") if p.is_file()):
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        try:
            tmp.rename(path)
        except OSError:
            if not path.is_dir():
                raise
        else:
            fsync_dir(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after a successful rename; else ours is dropped


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
