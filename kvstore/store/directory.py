"""`DirectoryBytes`: the byte-store verbs on a folder, for LocalStore (kvstore/store/local.py).

    create(key, data)   written atomically (temp file `.<name>.<random>.tmp` in the same folder, flocked while it is
                        written, fsync, rename, folder fsync: kvstore/atomic.py) unless the file exists
    get / map / read_private / contains / list / delete

A reader sees a whole file or none. Two processes creating the same key at the same instant may both write it
(the rename is atomic, so the file is always one writer's whole bytes): for the content-addressed keys a store
writes, those bytes are the same, and they are verified on every read anyway. `map` gives the file's pages
without a copy (MAP_PRIVATE, copy-on-write), which is what makes a verified restore run at hashing speed.
Temp files are not keys (`list` skips them); `remove_stale_temp` is gc's rule for the ones a killed writer left.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kvstore.atomic import atomic_write, try_lock
from kvstore.errors import IntegrityError, KVStoreError, NotFoundError, ReadOnlyStoreError, StoreFullError
from kvstore.store.byte_store import ByteStore, check_key

STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def is_temp(name: str) -> bool:
    """Whether a file name is an atomic write's temp file (`.<name>.<random>.tmp`)."""
    return name.startswith(".") and name.endswith(".tmp")


def storage_error(e: OSError, path: Path, doing: str) -> KVStoreError:
    """One line for an OS failure while writing a store: StoreFullError for a full device or quota,
    ReadOnlyStoreError for a read-only mount or a permission refusal, else a KVStoreError naming the path."""
    why = e.strerror or str(e)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreFullError(f"{path}: {why} while trying to {doing}; nothing was stored (no partial object is "
                              "left). Free space on that device (`df -h`) or point the store at another disk, then "
                              "run again")
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return ReadOnlyStoreError(f"{path}: {why} while trying to {doing}; nothing was stored. Make the store "
                                  "writable or deposit into another store (`kvstore deposit --store DIR`, "
                                  "open_store(DIR))")
    return KVStoreError(f"{path}: {why} while trying to {doing}; check the disk, then run again")


class DirectoryBytes(ByteStore):
    """Blobs as files under `root` (key `objects/ab/cd...` is the file root/objects/ab/cd...); `write(path, data)`
    writes one file atomically (kvstore.atomic.atomic_write unless given)."""

    def __init__(self, root: Path, write: Callable[[Path, bytes | memoryview], None] | None = None) -> None:
        self.root = Path(root)
        self.where = f"store {self.root}"
        self._write = write or atomic_write

    def path(self, key: str) -> Path:
        return self.root / check_key(key)

    def where_of(self, key: str) -> str:
        return str(self.root / key)

    def create(self, key: str, data: bytes | memoryview) -> bool:
        """Write the file atomically unless it exists. An OS error of the storage (full, read-only, refused) is
        one StoreFullError / ReadOnlyStoreError line naming the file; nothing partial is left either way."""
        path = self.path(key)
        if path.exists():
            return False
        try:
            self._write(path, data)
        except OSError as e:
            if e.errno not in STORAGE_ERRNOS:
                raise
            raise storage_error(e, path, f"write into {self.where}") from None
        return True

    def _open(self, key: str):
        path = self.path(key)
        try:
            return open(path, "rb", buffering=0)
        except FileNotFoundError:
            raise NotFoundError(f"{key} is not in {self.where}") from None
        except IsADirectoryError:
            raise IntegrityError(f"{path} is a folder, not a blob of {self.where}; remove it") from None

    def get(self, key: str) -> bytes:
        with self._open(key) as f:
            return f.read()

    def read_private(self, key: str) -> memoryview:
        """The file read into a fresh buffer nothing else holds (no zero-fill), for zero-copy tensor views: the
        bytes are this process's own, whatever later happens to the file."""
        with self._open(key) as f:
            size = os.fstat(f.fileno()).st_size
            data = memoryview(np.empty(size, dtype=np.uint8)).cast("B")
            n = 0
            while n < size and (got := f.readinto(data[n:])):
                n += got
            return data[:n]

    def map(self, key: str) -> memoryview:
        """The file mapped privately (MAP_PRIVATE, copy-on-write: nothing written through the view reaches the
        file), no copy: the pages are the page cache's. Blobs are immutable (written once by atomic rename, never
        in place), which is what makes the mapping safe to verify once and then use. Pages are mapped as the
        hash touches them, on all its threads at once (mapping them up front with MADV_POPULATE_READ on one
        thread measured slower). Falls back to one read into a fresh buffer where a file cannot be mapped."""
        with self._open(key) as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0 or not hasattr(mmap, "MAP_PRIVATE"):
                return self.read_private(key)
            m = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        return memoryview(m)

    def contains(self, key: str) -> bool:
        return self.path(key).exists()

    def size(self, key: str) -> int:
        with self._open(key) as f:
            return os.fstat(f.fileno()).st_size

    def list(self, prefix: str = "") -> list[str]:
        """Every file under root whose key starts with `prefix` (temp files skipped), sorted."""
        top = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self.root / top if top else self.root
        out = []
        for folder, dirs, files in os.walk(start):
            dirs.sort()
            rel = Path(folder).relative_to(self.root).as_posix()
            for name in files:
                key = name if rel == "." else f"{rel}/{name}"
                if key.startswith(prefix) and not is_temp(name):
                    out.append(key)
        return sorted(out)

    def delete(self, key: str) -> bool:
        try:
            self.path(key).unlink()
            return True
        except FileNotFoundError:
            return False

    def temp_files(self, under: str) -> list[Path]:
        """The temp files of atomic writes in the folders below root/under (one level of sub-folders)."""
        base = self.root / under
        return sorted(p for p in base.glob("*/*") if is_temp(p.name)) if base.is_dir() else []

    @staticmethod
    def remove_stale_temp(p: Path, now: float, grace_s: float) -> bool:
        """Remove a leftover temp file if it is older than the grace period and no live writer locks it."""
        try:
            fd = os.open(p, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:  # gone already (renamed by its writer), or unreadable: leave it
            return False
        try:
            if now - os.fstat(fd).st_mtime < grace_s or not try_lock(fd, blocking=False):
                return False
            p.unlink()
            return True
        except OSError:
            return False
        finally:
            os.close(fd)
