"""`LocalStore`: the artifact store in a folder, an ObjectStore over a directory byte store and a SQLite index.

Layout of a LocalStore root (see FORMAT.md):
    objects/ab/cdef...   the artifact bytes; id = content_id of those bytes (BLAKE3-256 for kvgraft-kv/2,
                         SHA-256 for kvgraft-kv/1), path = objects/<id[:2]>/<id[2:]>
    index.sqlite         persistent index: id, size, token count, tokens SHA-256, model fingerprint, tags
Admission, verification and indexing are kvstore/store/objects.py's, the same code every store runs (S3, memory).
What is the folder's own: writes are atomic (temp file in the same folder, fsync, rename; kvstore/store/directory.py),
reads copy the file into memory of their own and hash that copy on all usable CPUs (copy what you hash: issue 51,
an object rewritten or truncated in place after the check cannot reach a tensor); the
index is one SQLite file (kvstore/store/sqlite_index.py) with batched transactions; a store this process cannot write is
opened read-only through a private copy of its index; gc also removes temp files that killed writers left.
The shared pieces (IndexRow, ArtifactInfo, admit, check_id, check_tags, Store) are kvstore/store/base.py's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from kvstore.atomic import atomic_write
from kvstore.errors import NotFoundError
from kvstore.format.ids import id_to_relpath
from kvstore.store.directory import DirectoryBytes, storage_error
from kvstore.store.objects import ObjectStore
from kvstore.store.sqlite_index import SqliteIndex

GC_GRACE_S = 3600.0  # gc never removes a temp file modified less than this long ago


def _write(path: Path, data: bytes | memoryview) -> None:
    """A store's object write: this module's `atomic_write`, looked up when called (where tests interrupt it)."""
    atomic_write(path, data)


class LocalStore(ObjectStore):
    """A directory of content-addressed artifacts with a persistent SQLite index.

    A store that cannot be written (a published library on a read-only mount, a folder this user may not
    write, or read_only=True) is opened read-only: its index is copied once into a private temporary folder
    (or, when it has none, rebuilt there from its objects, each admitted as a put would), so list, get,
    verify and graft work; put, tag, remove and gc raise ReadOnlyStoreError. A full device during a put raises
    StoreFullError and leaves nothing partial behind."""

    def __init__(self, root: str | os.PathLike, read_only: bool | None = None) -> None:
        self.root = Path(root).resolve()
        self.index_path = self.root / "index.sqlite"
        if read_only is None:
            read_only = self._unwritable()
        self.read_only = bool(read_only)
        blobs = DirectoryBytes(self.root, write=_write)
        if self.read_only:
            if not self.root.is_dir():
                raise NotFoundError(f"store {self.root} does not exist (opened read-only); check the path")
            index, rebuild = SqliteIndex.private_copy(self.index_path, self)
            super().__init__(blobs, index)
            if rebuild:
                self._index_unindexed()
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise storage_error(e, self.root, "create the store folder") from None
        super().__init__(blobs, SqliteIndex(self.index_path))

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r}{', read_only=True' if self.read_only else ''})"

    def _unwritable(self) -> bool:
        """Whether this process cannot write the store: its folder (or the nearest existing parent, for a store
        not created yet) on a read-only mount or not writable by this user, or an index / objects folder that
        is not writable."""
        probe = self.root
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if probe != self.root:
            return False  # not created yet: creating it reports its own error if the parent is read-only
        return not all(os.access(p, os.W_OK) for p in (self.root, self.index_path, self.root / "objects")
                       if p.exists())

    @property
    def _db(self):
        """The index's connection factory (tests replace it to make indexing fail)."""
        return self.index._db

    @_db.setter
    def _db(self, fn) -> None:
        self.index._db = fn

    def path(self, aid: str) -> Path:
        return self.root / id_to_relpath(aid)

    def _map(self, aid: str) -> memoryview:
        """The object's bytes mapped privately, not yet verified (kvstore/store/directory.py DirectoryBytes.map). No
        read that is used afterwards goes through it (get reads a private copy): a mapping changes with its file."""
        return self._fetch(aid, "map")

    def gc(self, grace_s: float = GC_GRACE_S) -> dict:
        """Repair the store after crashes; safe to run while other processes put.

        - Temp files are removed only when older than `grace_s` and not locked by a live writer
          (counted in temp_kept otherwise).
        - Index rows whose object is gone are dropped.
        - Objects without a row (a crash between write and index) are validated like a put and indexed;
          invalid ones, and anything under objects/ that is not an object, are reported in `damaged`,
          never deleted.
        """
        self._writable("run gc")
        report: dict = {"temp_removed": 0, "temp_kept": 0}
        now = time.time()
        for p in self.blobs.temp_files("objects"):
            removed = self.blobs.remove_stale_temp(p, now, grace_s)
            report["temp_removed" if removed else "temp_kept"] += 1
        return self._gc(report)


__all__ = ["GC_GRACE_S", "LocalStore"]
