"""Content-addressed artifact store: bytes in, id out; id in, verified bytes out. Knows nothing of models.

Layout of a LocalStore root (see FORMAT.md):
    objects/ab/cdef...   the artifact bytes; id = content_id of those bytes (BLAKE3-256 for kvgraft-kv/2,
                         SHA-256 for kvgraft-kv/1), path = objects/<id[:2]>/<id[2:]>
    index.sqlite         persistent index: id, size, token count, tokens SHA-256, model fingerprint, tags
Writes are atomic (temp file in the same folder, fsync, rename); an object file is never written in place.
Every read re-hashes the bytes before anything is returned; `LocalStore.get` maps the file (no copy) and
hashes it on all usable CPUs, so a verified restore runs at hashing speed.
`MemoryStore` (kvstore/memory_store.py) is the in-memory twin with the same interface, for tests.

Length: ~440 lines, nearly all of it LocalStore (atomic publish, the SQLite index, mapped verified reads,
gc); ids, the atomic write and the in-memory twin live in their own modules.
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import sqlite3
import tempfile
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvstore.atomic import atomic_write, try_lock
from kvstore.errors import (
    FormatError,
    IndexDatabaseError,
    IntegrityError,
    InvalidIdError,
    KVStoreError,
    NotFoundError,
    ReadOnlyStoreError,
    StoreFullError,
)
from kvstore.format import Snapshot, from_bytes, guard, to_bytes, tokens_sha256
from kvstore.ids import ArtifactId, id_to_relpath, relpath_to_id
from kvstore.verified_read import verified_snapshot

GC_GRACE_S = 3600.0  # gc never removes a temp file modified less than this long ago


@dataclass(frozen=True)
class IndexRow:
    """The index fields of an admitted artifact, taken from its validated snapshot (never from raw metadata)."""

    id: str
    size: int
    token_count: int
    tokens_sha256: str
    model_fingerprint: str
    model_name: str

    @classmethod
    def of(cls, aid: str, size: int, snap: Snapshot) -> IndexRow:
        return cls(aid, size, snap.token_count, tokens_sha256(snap.token_ids), snap.model_fingerprint,
                   snap.model_name)


@dataclass(frozen=True)
class ArtifactInfo(IndexRow):
    """One index row as a store lists it: the admitted fields plus when it was stored and its tags."""

    created: float
    tags: tuple[str, ...]


def admit(data: bytes | memoryview, verify_tensors: bool = True) -> Snapshot:
    """Check bytes entering a store completely (structure, every invariant of FORMAT.md section 6, every
    tensor's SHA-256) and return their snapshot. Every stored object is therefore valid, and a read only has
    to check that the file still hashes to its id: that one SHA-256 covers every byte, tensors included.
    verify_tensors=False only for bytes to_bytes has just written (their tensor hashes are computed, not read)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise FormatError(f"artifact bytes must be bytes, got {type(data).__name__}")
    return from_bytes(data, verify_tensors=verify_tensors)


def check_id(aid: str, data: bytes | memoryview, where: str, got: str | None = None) -> None:
    """Raise IntegrityError unless the bytes hash to `aid` (got: their hash, when already computed); `where` names
    the object (a file, a bucket key) in the message. Every store's reads end here."""
    got = got or ArtifactId.of(data)
    if got != aid:
        raise IntegrityError(
            f"artifact {aid} in {where}: bytes hash to {got[:12]}... ({len(data)} bytes): corrupted or truncated, or "
            "replaced. Remove it (`kvstore rm ID`) and deposit it again."
        )


def check_tags(tags: Iterable[str]) -> tuple[str, ...]:
    out = tuple(tags)
    if not all(isinstance(t, str) and 0 < len(t) <= 256 for t in out):
        raise KVStoreError(f"tags must be non-empty strings of at most 256 characters, got {out!r:.120}")
    return out


class Store(ABC):
    """The store interface: put / get / contains / iterate, plus tags and token lookups."""

    @abstractmethod
    def put_bytes(self, data: bytes, tags: Iterable[str] = ()) -> ArtifactId:
        """Admit artifact bytes (fully validated first); returns their id. Existing ids only gain tags."""

    @abstractmethod
    def get_bytes(self, aid: str) -> bytes:
        """The artifact's bytes, checked to hash to `aid`. NotFoundError, IntegrityError."""

    @abstractmethod
    def contains(self, aid: str) -> bool:
        """Whether the artifact is stored."""

    @abstractmethod
    def info(self, aid: str) -> ArtifactInfo:
        """The artifact's index row. NotFoundError."""

    @abstractmethod
    def list(self, tag: str | None = None) -> list[ArtifactInfo]:
        """Index rows (with `tag` only, when given), by id."""

    @abstractmethod
    def find_tokens(self, tokens_sha256: str) -> list[ArtifactId]:
        """Ids of the artifacts holding exactly the token ids with this SHA-256."""

    @abstractmethod
    def remove(self, aid: str) -> None:
        """Delete an artifact and its index row. NotFoundError."""

    @abstractmethod
    def add_tags(self, aid: str, tags: Iterable[str]) -> None:
        """Tag a stored artifact (its bytes are not read). NotFoundError."""

    def put(self, snapshot: Snapshot, tags: Iterable[str] = ()) -> ArtifactId:
        """Store a snapshot; returns its id. Putting an existing artifact only adds tags."""
        with guard("snapshot to store"):
            data = to_bytes(snapshot)
        return self.put_bytes(data, tags)

    def put_many(self, items: Iterable[Snapshot | bytes], tags: Iterable[str] = ()) -> list[ArtifactId]:
        """Store many snapshots (or artifact bytes), each with `tags`; their ids in order. Same result as a
        loop of put/put_bytes; a store may batch it (LocalStore indexes them in one transaction)."""
        tags = tuple(tags)
        return [self.put(x, tags) if isinstance(x, Snapshot) else self.put_bytes(x, tags) for x in items]

    def get(self, aid: str) -> Snapshot:
        """The verified snapshot: the bytes hash to the id before any tensor is returned (tensors were checked
        one by one when the artifact entered the store). Raises NotFoundError, IntegrityError."""
        return from_bytes(self.get_bytes(aid), verify_tensors=False)

    def __contains__(self, aid: object) -> bool:
        try:
            return isinstance(aid, str) and self.contains(aid)
        except InvalidIdError:
            return False

    def __iter__(self) -> Iterator[ArtifactId]:
        return iter([ArtifactId(i.id) for i in self.list()])

    def __len__(self) -> int:
        return len(self.list())

    def verify(self, aid: str) -> None:
        """Re-hash an artifact's bytes and tensors and re-check every invariant; raises IntegrityError,
        FormatError or ValidationError if it is damaged."""
        from_bytes(self.get_bytes(aid), verify_tensors=True)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS artifacts (
  id TEXT PRIMARY KEY, size INTEGER NOT NULL, token_count INTEGER NOT NULL, tokens_sha256 TEXT NOT NULL,
  model_fingerprint TEXT NOT NULL, model_name TEXT NOT NULL, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS artifacts_tokens ON artifacts(tokens_sha256);
CREATE TABLE IF NOT EXISTS tags (id TEXT NOT NULL, tag TEXT NOT NULL, PRIMARY KEY (id, tag));
CREATE INDEX IF NOT EXISTS tags_tag ON tags(tag);
"""


class LocalStore(Store):
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
        if self.read_only:
            if not self.root.is_dir():
                raise NotFoundError(f"store {self.root} does not exist (opened read-only); check the path")
            self._db_file = self._private_index()
            return
        self._db_file = self.index_path
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _storage_error(e, self.root, "create the store folder") from None
        with self._db("create the index") as db:
            db.executescript(_SCHEMA)

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

    def _private_index(self) -> Path:
        """A private copy of a read-only store's index (with its write-ahead log, so no committed row is
        missed), in a temporary folder removed when the store object goes away; rebuilt from the objects when
        the store has no index file."""
        tmp = Path(tempfile.mkdtemp(prefix="kvgraft-ro-index-"))
        weakref.finalize(self, shutil.rmtree, tmp, True)
        copy = tmp / "index.sqlite"
        try:
            if self.index_path.is_file():
                shutil.copyfile(self.index_path, copy)
                wal = self.index_path.with_name("index.sqlite-wal")
                if wal.is_file():
                    shutil.copyfile(wal, tmp / "index.sqlite-wal")
        except OSError as e:
            raise IndexDatabaseError(f"read-only store {self.root}: could not read its index {self.index_path} "
                                     f"({e.strerror or e}); make it readable or remove it to rebuild") from None
        self._db_file = copy
        rebuild = not self.index_path.is_file()
        with self._db("open a private copy of the read-only index") as db:
            db.executescript(_SCHEMA)
        if rebuild:
            self._index_unindexed()
        return copy

    def _index_unindexed(self) -> dict:
        """Admit (as a put would) and index every object under objects/ that has no index row; returns
        {"objects_indexed": n, "damaged": [...]} (damaged objects are reported, never indexed or deleted)."""
        report: dict = {"objects_indexed": 0, "damaged": []}
        indexed = {i.id for i in self._rows()}
        self._admit_and_index(sorted(set(self._object_ids(report["damaged"])) - indexed), report)
        return report

    def _admit_and_index(self, ids: list[ArtifactId], report: dict) -> None:
        """Admit (as a put would) and index each object; counts them in report["objects_indexed"], reports the
        ones that fail in report["damaged"] (never indexed or deleted). Used by the index rebuild and by gc."""
        for aid in ids:
            try:
                data = self.get_bytes(aid)
                self._index_many([IndexRow.of(aid, len(data), admit(data))], ())
                report["objects_indexed"] += 1
            except (KVStoreError, OSError) as e:
                report["damaged"].append(f"{aid}: {e}")

    def _object_ids(self, damaged: list[str]) -> list[ArtifactId]:
        """Ids of the object files under objects/ (temp files skipped; anything else reported in `damaged`)."""
        out = []
        objects = self.root / "objects"
        for p in sorted(objects.glob("*/*")) if objects.is_dir() else []:
            if p.name.startswith(".") and p.name.endswith(".tmp"):
                continue
            try:
                aid = relpath_to_id(str(p.relative_to(self.root)))
                if not p.is_file():
                    raise InvalidIdError(f"{p} is not a regular file")
                out.append(aid)
            except InvalidIdError as e:
                damaged.append(f"{p}: not an object ({e}); move it out of the store")
        return out

    def _writable(self, doing: str) -> None:
        if self.read_only:
            raise ReadOnlyStoreError(
                f"store {self.root} is read-only (a read-only mount, or not writable by this user): cannot {doing}. "
                "It can be listed, verified and grafted from; deposit into a writable store (--store DIR, "
                "library.store=DIR) or remount it read-write"
            )

    @contextmanager
    def _db(self, doing: str) -> Iterator[sqlite3.Connection]:
        """A connection to the index (autocommit; callers BEGIN where they need a transaction); any SQLite
        failure becomes an IndexDatabaseError naming the store and what was being done (StoreFullError when
        the device is full)."""
        try:
            with closing(sqlite3.connect(self._db_file, timeout=60, isolation_level=None)) as db:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                try:
                    yield db
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
        except (sqlite3.Error, OverflowError) as e:
            if "disk is full" in str(e) or getattr(e, "sqlite_errorcode", None) == 13:  # SQLITE_FULL
                raise _storage_error(OSError(errno.ENOSPC, "No space left on device"), self.index_path,
                                     doing) from None
            raise IndexDatabaseError(
                f"index {self.index_path}: could not {doing}: {type(e).__name__}: {e}. Objects are unaffected; "
                "fix the cause (disk space, a stuck writer, a damaged index file) and run `kvstore gc`"
            ) from e

    def path(self, aid: str) -> Path:
        return self.root / id_to_relpath(aid)

    def put_bytes(self, data: bytes, tags: Iterable[str] = ()) -> ArtifactId:
        self._writable("put an artifact")
        tags = check_tags(tags)
        snap = admit(data)
        aid = ArtifactId.of(data)
        self._store_and_index([(aid, data, IndexRow.of(aid, len(data), snap))], tags)
        return aid

    def put(self, snapshot: Snapshot, tags: Iterable[str] = ()) -> ArtifactId:
        return self.put_many([snapshot], tags)[0]

    def put_many(self, items: Iterable[Snapshot | bytes], tags: Iterable[str] = ()) -> list[ArtifactId]:
        """Batched put: every item is validated and written atomically (temp, fsync, rename) as in put_bytes,
        then all index rows go in one transaction. If indexing fails, the objects this call wrote are removed
        again; a crash in between leaves objects that `gc()` indexes."""
        self._writable("put artifacts")
        tags = check_tags(tags)
        batch = []
        for x in items:
            if isinstance(x, Snapshot):
                with guard("snapshot to store"):
                    data = to_bytes(x)
                snap = admit(data, verify_tensors=False)  # tensor hashes were just computed from these tensors
            else:
                data, snap = x, admit(x)
            aid = ArtifactId.of(data)
            batch.append((aid, data, IndexRow.of(aid, len(data), snap)))
        self._store_and_index(batch, tags)
        return [aid for aid, _, _ in batch]

    def _store_and_index(self, batch: list[tuple[ArtifactId, bytes, IndexRow]], tags: tuple[str, ...]) -> None:
        written: list[ArtifactId] = []
        at: Path = self.index_path  # what was being written when an OS error struck
        try:
            for aid, data, _row in batch:
                path = self.path(aid)
                if not path.exists():
                    at = path
                    atomic_write(path, data)
                    written.append(aid)
            at = self.index_path
            self._index_many([row for _, _, row in batch], tags)
        except OSError as e:
            self._unpublish(written)
            if e.errno not in _STORAGE_ERRNOS:
                raise
            raise _storage_error(e, at, f"write {len(batch)} artifact(s) into store {self.root}") from None
        except BaseException:
            self._unpublish(written)
            raise

    def _unpublish(self, written: list[ArtifactId]) -> None:
        """After a failed put: remove the objects it wrote that have no index row (no orphan is left behind)."""
        try:
            with self._db("check rows after a failed put") as db:
                rows = {r[0] for r in db.execute("SELECT id FROM artifacts")}
        except KVStoreError:
            rows = set()
        for aid in written:
            if aid not in rows:
                try:
                    self.path(aid).unlink()
                except FileNotFoundError:
                    pass

    def _index_many(self, rows: list[IndexRow], tags: tuple[str, ...]) -> None:
        now = time.time()
        with self._db(f"index {len(rows)} artifact(s)") as db:
            db.execute("BEGIN IMMEDIATE")
            db.executemany(
                "INSERT OR IGNORE INTO artifacts VALUES (?,?,?,?,?,?,?)",
                [(r.id, r.size, r.token_count, r.tokens_sha256, r.model_fingerprint, r.model_name, now) for r in rows],
            )
            db.executemany("INSERT OR IGNORE INTO tags VALUES (?,?)", [(r.id, t) for r in rows for t in tags])
            db.execute("COMMIT")

    def _read(self, aid: str, writable: bool = False) -> bytes | memoryview:
        """The object's bytes, not yet verified; one copy from the page cache either way. writable=True reads
        into a fresh buffer nothing else holds (no zero-fill), for zero-copy tensor views."""
        try:
            with open(self.path(aid), "rb", buffering=0) as f:
                if not writable:
                    return f.read()
                size = os.fstat(f.fileno()).st_size
                data = memoryview(np.empty(size, dtype=np.uint8)).cast("B")
                n = 0
                while n < size and (got := f.readinto(data[n:])):
                    n += got
                return data[:n]
        except FileNotFoundError:
            raise NotFoundError(f"artifact {aid} is not in store {self.root} (see `kvstore ls`)") from None
        except IsADirectoryError:
            raise IntegrityError(f"artifact {aid}: {self.path(aid)} is a folder, not an object; remove it") from None

    def _map(self, aid: str) -> memoryview:
        """The object's bytes mapped privately (MAP_PRIVATE, copy-on-write: nothing written through the view
        reaches the file), not yet verified, no copy: the pages are the page cache's. Objects are immutable
        (written once by atomic rename, never in place), which is what makes the mapping safe to verify once
        and then use. Pages are mapped as the hash touches them, on all its threads at once (mapping them up
        front with MADV_POPULATE_READ on one thread measured slower). Falls back to one read into a fresh
        buffer where a file cannot be mapped."""
        try:
            with open(self.path(aid), "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0 or not hasattr(mmap, "MAP_PRIVATE"):
                    return memoryview(self._read(aid, writable=True))
                m = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except FileNotFoundError:
            raise NotFoundError(f"artifact {aid} is not in store {self.root} (see `kvstore ls`)") from None
        except IsADirectoryError:
            raise IntegrityError(f"artifact {aid}: {self.path(aid)} is a folder, not an object; remove it") from None
        return memoryview(m)

    def _check(self, aid: str, data: bytes | memoryview, got: str | None = None) -> None:
        """Raise IntegrityError unless the bytes hash to `aid` (got: their hash, when already computed)."""
        check_id(aid, data, str(self.path(aid)), got)

    def get_bytes(self, aid: str) -> bytes:
        data = self._read(aid)
        self._check(aid, data)
        return data

    def get(self, aid: str, private: bool = False) -> Snapshot:
        """The verified snapshot: the file's hash (its id, covering every byte) is checked before anything is
        returned (kvstore/verified_read.py: the hash runs on all usable CPUs while the header is parsed);
        every tensor's own hash was checked when the artifact entered the store (`verify` re-checks both).
        The file is mapped, not copied: tensors view the verified pages (copy-on-write). private=True reads
        it into a fresh buffer instead (one copy): the bytes checked are then the process's own, whatever later
        happens to the file (the prefetcher uses it, as a snapshot may wait a while before it is used)."""
        data = self._read(aid, writable=True) if private else self._map(aid)
        return verified_snapshot(data, lambda got: self._check(aid, data, got))

    def contains(self, aid: str) -> bool:
        return self.path(aid).exists()

    def _rows(self, where: str = "", args: tuple = ()) -> list[ArtifactInfo]:
        with self._db("read the index") as db:
            rows = db.execute(f"SELECT * FROM artifacts {where} ORDER BY id", args).fetchall()
            tags: dict[str, list[str]] = {}
            if rows:
                q = "SELECT id, tag FROM tags" + (" WHERE id = ?" if len(rows) == 1 else "")
                for i, t in db.execute(q, (rows[0][0],) if len(rows) == 1 else ()):
                    tags.setdefault(i, []).append(t)
        return [ArtifactInfo(r[0], r[1], r[2], r[3], r[4], r[5], r[6], tuple(sorted(tags.get(r[0], ()))))
                for r in rows]

    def info(self, aid: str) -> ArtifactInfo:
        rows = self._rows("WHERE id = ?", (ArtifactId(aid),))
        if not rows:
            raise NotFoundError(f"artifact {aid} is not in the index of {self.root} (see `kvstore ls`, `kvstore gc`)")
        return rows[0]

    def list(self, tag: str | None = None) -> list[ArtifactInfo]:
        if tag is None:
            return self._rows()
        return self._rows("WHERE id IN (SELECT id FROM tags WHERE tag = ?)", (tag,))

    def find_tokens(self, tokens_sha256: str) -> list[ArtifactId]:
        with self._db("look up token hashes") as db:
            rows = db.execute("SELECT id FROM artifacts WHERE tokens_sha256 = ? ORDER BY id", (str(tokens_sha256),))
            return [ArtifactId(r[0]) for r in rows]

    def __len__(self) -> int:
        with self._db("count artifacts") as db:
            return db.execute("SELECT COUNT(*) FROM artifacts").fetchone()[0]

    def add_tags(self, aid: str, tags: Iterable[str]) -> None:
        """Tag a stored artifact (its bytes are not read). Raises NotFoundError if it is not indexed."""
        self._writable("tag an artifact")
        aid, tags = ArtifactId(aid), check_tags(tags)
        self.info(aid)
        with self._db("add tags") as db:
            db.executemany("INSERT OR IGNORE INTO tags VALUES (?,?)", [(aid, t) for t in tags])

    def remove(self, aid: str) -> None:
        self._writable("remove an artifact")
        aid = ArtifactId(aid)
        path = self.path(aid)
        existed = path.exists()
        with self._db(f"remove {aid}") as db:
            db.execute("BEGIN IMMEDIATE")
            n = db.execute("DELETE FROM artifacts WHERE id = ?", (aid,)).rowcount
            db.execute("DELETE FROM tags WHERE id = ?", (aid,))
            db.execute("COMMIT")
        if existed:
            path.unlink()
        if not existed and not n:
            raise NotFoundError(f"artifact {aid} is not in store {self.root}")

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
        report: dict = {"temp_removed": 0, "temp_kept": 0, "rows_dropped": 0, "objects_indexed": 0, "damaged": []}
        objects = self.root / "objects"
        on_disk: set[str] = set()
        now = time.time()
        for p in sorted(objects.glob("*/*")) if objects.is_dir() else []:
            if p.name.startswith(".") and p.name.endswith(".tmp"):
                removed = self._remove_stale_temp(p, now, grace_s)
                report["temp_removed" if removed else "temp_kept"] += 1
                continue
            try:
                aid = relpath_to_id(str(p.relative_to(self.root)))
                if not p.is_file():
                    raise InvalidIdError(f"{p} is not a regular file")
                on_disk.add(aid)
            except InvalidIdError as e:
                report["damaged"].append(f"{p}: not an object ({e}); move it out of the store")
        indexed = {i.id for i in self._rows()}
        for aid in sorted(indexed - on_disk):
            # the scan above may predate a concurrent put (object written, then indexed): look again inside the
            # write transaction, so a row is dropped only when its object is really gone
            with self._db(f"drop the row of missing object {aid}") as db:
                db.execute("BEGIN IMMEDIATE")
                if self.path(aid).exists():
                    db.execute("COMMIT")
                    continue
                db.execute("DELETE FROM artifacts WHERE id = ?", (aid,))
                db.execute("DELETE FROM tags WHERE id = ?", (aid,))
                db.execute("COMMIT")
            report["rows_dropped"] += 1
        self._admit_and_index(sorted(on_disk - indexed), report)
        return report

    @staticmethod
    def _remove_stale_temp(p: Path, now: float, grace_s: float) -> bool:
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


_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def _storage_error(e: OSError, path: Path, doing: str) -> KVStoreError:
    """One line for an OS failure while writing a store: StoreFullError for a full device or quota,
    ReadOnlyStoreError for a read-only mount or a permission refusal, else a KVStoreError naming the path."""
    why = e.strerror or str(e)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreFullError(f"{path}: {why} while trying to {doing}; nothing was stored (no partial object is "
                              "left). Free space on that device (`df -h`) or point the store at another disk, then "
                              "run again")
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return ReadOnlyStoreError(f"{path}: {why} while trying to {doing}; nothing was stored. Make the store "
                                  "writable or deposit into another store (--store DIR, library.store=DIR)")
    return KVStoreError(f"{path}: {why} while trying to {doing}; check the disk, then run again")


__all__ = ["ArtifactId", "ArtifactInfo", "GC_GRACE_S", "IndexRow", "LocalStore", "Store", "admit", "atomic_write",
           "check_tags", "id_to_relpath", "relpath_to_id"]
