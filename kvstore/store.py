"""Content-addressed artifact store: bytes in, id out; id in, verified bytes out. Knows nothing of models.

Layout of a LocalStore root (see FORMAT.md):
    objects/ab/cdef...   the artifact bytes; id = SHA-256 of those bytes, path = objects/<id[:2]>/<id[2:]>
    index.sqlite         persistent index: id, size, token count, tokens SHA-256, model fingerprint, tags
Writes are atomic (temp file in the same folder, fsync, rename). Every read re-hashes the bytes before
anything is returned. `MemoryStore` is the in-memory twin with the same interface, for tests.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvstore.errors import IntegrityError, InvalidIdError, KVStoreError, NotFoundError
from kvstore.format import Snapshot, from_bytes, read_metadata, to_bytes

_HEX = frozenset("0123456789abcdef")
_UMASK = os.umask(0)
os.umask(_UMASK)

class ArtifactId(str):
    """A validated artifact id: 64 lowercase hex digits (the SHA-256 of the artifact's bytes)."""

    def __new__(cls, value: str) -> ArtifactId:
        if not isinstance(value, str) or len(value) != 64 or not set(value) <= _HEX:
            raise InvalidIdError(f"{value!r} is not an artifact id (64 lowercase hex digits); see `kvstore ls`")
        return super().__new__(cls, value)

    @classmethod
    def of(cls, data: bytes | memoryview) -> ArtifactId:
        return cls(hashlib.sha256(data).hexdigest())


def id_to_relpath(aid: str) -> str:
    """objects/<2 hex>/<62 hex> for an id."""
    aid = ArtifactId(aid)
    return f"objects/{aid[:2]}/{aid[2:]}"


def relpath_to_id(rel: str) -> ArtifactId:
    """Inverse of id_to_relpath; rejects anything that is not exactly such a path."""
    parts = Path(rel).parts
    if len(parts) != 3 or parts[0] != "objects" or len(parts[1]) != 2:
        raise InvalidIdError(f"{rel!r} is not an object path (objects/ab/cdef...)")
    return ArtifactId(parts[1] + parts[2])


def atomic_write(path: Path, data: bytes) -> None:
    """Write bytes so that a crash leaves either the whole file or nothing: temp, fsync, os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_UMASK)  # mkstemp makes 0600; published files get the usual mode
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
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


@dataclass(frozen=True)
class ArtifactInfo:
    """One index row: what is known about an artifact without reading its tensors."""

    id: str
    size: int
    token_count: int
    tokens_sha256: str
    model_fingerprint: str
    model_name: str
    created: float
    tags: tuple[str, ...]


def _admit(data: bytes | memoryview) -> dict:
    """Check bytes entering a store completely (header, every tensor's SHA-256) and return their metadata.
    Every stored object is therefore internally consistent, and a read only has to check that the file still
    hashes to its id: that one SHA-256 covers every byte, tensors included."""
    from_bytes(data, verify_tensors=True)
    return read_metadata(data)


def _info_from_meta(aid: str, size: int, meta: dict, tags: Iterable[str], created: float) -> ArtifactInfo:
    return ArtifactInfo(aid, size, meta["token_count"], meta["tokens_sha256"], meta["model_fingerprint"],
                        meta.get("model_name", ""), created, tuple(sorted(set(tags))))


class Store:
    """The store interface: put / get / contains / iterate, plus tags and token lookups."""

    def put_bytes(self, data: bytes, tags: Iterable[str] = ()) -> ArtifactId: ...
    def get_bytes(self, aid: str) -> bytes: ...
    def contains(self, aid: str) -> bool: ...
    def info(self, aid: str) -> ArtifactInfo: ...
    def list(self, tag: str | None = None) -> list[ArtifactInfo]: ...
    def find_tokens(self, tokens_sha256: str) -> list[ArtifactId]: ...
    def remove(self, aid: str) -> None: ...
    def add_tags(self, aid: str, tags: Iterable[str]) -> None:
        raise NotImplementedError

    def put(self, snapshot: Snapshot, tags: Iterable[str] = ()) -> ArtifactId:
        """Store a snapshot; returns its id. Putting an existing artifact only adds tags."""
        return self.put_bytes(to_bytes(snapshot), tags)

    def put_many(self, items: Iterable[Snapshot | bytes], tags: Iterable[str] = ()) -> list[ArtifactId]:
        """Store many snapshots (or artifact bytes), each with `tags`; their ids in order. Same result as a
        loop of put/put_bytes; a store may batch it (LocalStore indexes them in one transaction)."""
        tags = tuple(tags)
        return [self.put_bytes(to_bytes(x) if isinstance(x, Snapshot) else x, tags) for x in items]

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
        """Re-hash an artifact's bytes and tensors; raises IntegrityError/FormatError if it is damaged."""
        from_bytes(self.get_bytes(aid), verify_tensors=True)


class MemoryStore(Store):
    """In-memory twin of LocalStore (same interface and checks), for tests."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._info: dict[str, ArtifactInfo] = {}

    def put_bytes(self, data: bytes, tags: Iterable[str] = ()) -> ArtifactId:
        aid = ArtifactId.of(data)
        meta = _admit(data)
        old = self._info.get(aid)
        self._data[aid] = bytes(data)
        self._info[aid] = _info_from_meta(aid, len(data), meta, (old.tags if old else ()) + tuple(tags),
                                          old.created if old else time.time())
        return aid

    def get_bytes(self, aid: str) -> bytes:
        aid = ArtifactId(aid)
        if aid not in self._data:
            raise NotFoundError(f"artifact {aid} is not in the memory store")
        data = self._data[aid]
        if ArtifactId.of(data) != aid:
            raise IntegrityError(f"artifact {aid}: bytes hash to {ArtifactId.of(data)}; it is corrupted")
        return data

    def contains(self, aid: str) -> bool:
        return ArtifactId(aid) in self._data

    def info(self, aid: str) -> ArtifactInfo:
        aid = ArtifactId(aid)
        if aid not in self._info:
            raise NotFoundError(f"artifact {aid} is not in the memory store")
        return self._info[aid]

    def list(self, tag: str | None = None) -> list[ArtifactInfo]:
        return sorted((i for i in self._info.values() if tag is None or tag in i.tags), key=lambda i: i.id)

    def find_tokens(self, tokens_sha256: str) -> list[ArtifactId]:
        return [ArtifactId(i.id) for i in self.list() if i.tokens_sha256 == tokens_sha256]

    def add_tags(self, aid: str, tags: Iterable[str]) -> None:
        """Tag a stored artifact (its bytes are not read)."""
        old = self.info(aid)
        self._info[old.id] = ArtifactInfo(**{**old.__dict__, "tags": tuple(sorted(set(old.tags) | set(tags)))})

    def remove(self, aid: str) -> None:
        aid = ArtifactId(aid)
        if aid not in self._data:
            raise NotFoundError(f"artifact {aid} is not in the memory store")
        del self._data[aid], self._info[aid]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS artifacts (
  id TEXT PRIMARY KEY, size INTEGER NOT NULL, token_count INTEGER NOT NULL, tokens_sha256 TEXT NOT NULL,
  model_fingerprint TEXT NOT NULL, model_name TEXT NOT NULL, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS artifacts_tokens ON artifacts(tokens_sha256);
CREATE TABLE IF NOT EXISTS tags (id TEXT NOT NULL, tag TEXT NOT NULL, PRIMARY KEY (id, tag));
CREATE INDEX IF NOT EXISTS tags_tag ON tags(tag);
"""


class LocalStore(Store):
    """A directory of content-addressed artifacts with a persistent SQLite index."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.index_path = self.root / "index.sqlite"
        with closing(self._connect()) as db, db:
            db.executescript(_SCHEMA)

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.index_path, timeout=60, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    def path(self, aid: str) -> Path:
        return self.root / id_to_relpath(aid)

    def put_bytes(self, data: bytes, tags: Iterable[str] = ()) -> ArtifactId:
        aid = ArtifactId.of(data)
        meta = _admit(data)
        path = self.path(aid)
        if not path.exists():
            atomic_write(path, data)
        self._index(aid, len(data), meta, tags)
        return aid

    def put_many(self, items: Iterable[Snapshot | bytes], tags: Iterable[str] = ()) -> list[ArtifactId]:
        """Batched put: every file is written atomically (temp, fsync, rename) as in put_bytes, then all index
        rows go in one transaction. A crash in between leaves objects that `gc()` indexes."""
        tags = tuple(tags)
        rows = []
        for x in items:
            data = to_bytes(x) if isinstance(x, Snapshot) else x
            aid = ArtifactId.of(data)
            meta = read_metadata(data) if isinstance(x, Snapshot) else _admit(data)
            path = self.path(aid)
            if not path.exists():
                atomic_write(path, data)
            rows.append((aid, len(data), meta))
        self._index_many(rows, tags)
        return [r[0] for r in rows]

    def _index(self, aid: str, size: int, meta: dict, tags: Iterable[str]) -> None:
        self._index_many([(aid, size, meta)], tuple(tags))

    def _index_many(self, rows: list[tuple[str, int, dict]], tags: tuple[str, ...]) -> None:
        now = time.time()
        with closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            db.executemany(
                "INSERT OR IGNORE INTO artifacts VALUES (?,?,?,?,?,?,?)",
                [(aid, size, meta["token_count"], meta["tokens_sha256"], meta["model_fingerprint"],
                  meta.get("model_name", ""), now) for aid, size, meta in rows],
            )
            db.executemany("INSERT OR IGNORE INTO tags VALUES (?,?)", [(r[0], t) for r in rows for t in tags])
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

    def _check(self, aid: str, data: bytes | memoryview, got: str | None = None) -> None:
        """Raise IntegrityError unless the bytes hash to `aid` (got: their SHA-256, when already computed)."""
        got = got or ArtifactId.of(data)
        if got != aid:
            raise IntegrityError(
                f"artifact {aid} in {self.path(aid)}: bytes hash to {got[:12]}... ({len(data)} bytes): corrupted or "
                "truncated. Remove it (`kvstore rm ID`) and deposit it again."
            )

    def get_bytes(self, aid: str) -> bytes:
        data = self._read(aid)
        self._check(aid, data)
        return data

    def get(self, aid: str) -> Snapshot:
        """The verified snapshot: the file's SHA-256 (its id, covering every byte) is checked before anything is
        returned; every tensor's own hash was checked when the artifact entered the store (`verify` re-checks
        both). Its tensors view the buffer the file was read into (no copy after the read)."""
        data = self._read(aid, writable=True)
        self._check(aid, data)
        return from_bytes(data, verify_tensors=False)

    def contains(self, aid: str) -> bool:
        return self.path(aid).exists()

    def _rows(self, where: str = "", args: tuple = ()) -> list[ArtifactInfo]:
        with closing(self._connect()) as db:
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
        with closing(self._connect()) as db:
            rows = db.execute("SELECT id FROM artifacts WHERE tokens_sha256 = ? ORDER BY id", (tokens_sha256,))
            return [ArtifactId(r[0]) for r in rows]

    def __len__(self) -> int:
        with closing(self._connect()) as db:
            return db.execute("SELECT COUNT(*) FROM artifacts").fetchone()[0]

    def add_tags(self, aid: str, tags: Iterable[str]) -> None:
        """Tag a stored artifact (its bytes are not read). Raises NotFoundError if it is not indexed."""
        aid = ArtifactId(aid)
        self.info(aid)
        with closing(self._connect()) as db:
            db.executemany("INSERT OR IGNORE INTO tags VALUES (?,?)", [(aid, t) for t in tags])

    def remove(self, aid: str) -> None:
        aid = ArtifactId(aid)
        path = self.path(aid)
        existed = path.exists()
        with closing(self._connect()) as db:
            db.execute("BEGIN IMMEDIATE")
            n = db.execute("DELETE FROM artifacts WHERE id = ?", (aid,)).rowcount
            db.execute("DELETE FROM tags WHERE id = ?", (aid,))
            db.execute("COMMIT")
        if existed:
            path.unlink()
        if not existed and not n:
            raise NotFoundError(f"artifact {aid} is not in store {self.root}")

    def gc(self) -> dict:
        """Remove leftover temp files and index rows without objects; index objects missing from the index
        (after a crash between the write and the index update). Damaged objects are reported, not deleted."""
        report = {"temp_removed": 0, "rows_dropped": 0, "objects_indexed": 0, "damaged": []}
        objects = self.root / "objects"
        on_disk: set[str] = set()
        for p in objects.glob("*/*") if objects.exists() else []:
            if p.name.startswith("."):
                p.unlink()
                report["temp_removed"] += 1
                continue
            try:
                on_disk.add(relpath_to_id(str(p.relative_to(self.root))))
            except InvalidIdError:
                report["damaged"].append(str(p))
        indexed = {i.id for i in self._rows()}
        for aid in sorted(indexed - on_disk):
            with closing(self._connect()) as db:
                db.execute("DELETE FROM artifacts WHERE id = ?", (aid,))
                db.execute("DELETE FROM tags WHERE id = ?", (aid,))
            report["rows_dropped"] += 1
        for aid in sorted(on_disk - indexed):
            try:
                data = self.get_bytes(aid)
                self._index(aid, len(data), read_metadata(data), ())
                report["objects_indexed"] += 1
            except KVStoreError as e:
                report["damaged"].append(f"{aid}: {e}")
        return report
