"""`SqliteIndex`: a store's index in one SQLite file (a LocalStore's `index.sqlite`, FORMAT.md section 4).

    artifacts(id PRIMARY KEY, size, token_count, tokens_sha256, model_fingerprint, model_name, created)
    tags(id, tag)                               WAL mode; rows added in one transaction per put_many

Every SQLite failure is one IndexDatabaseError naming the index file and what was being done (StoreFullError
for a full device). `SqliteIndex.private_copy` opens a read-only store's index through a copy in a temporary
folder (with its write-ahead log, so no committed row is missed), so a read-only mount is never written.
"""

from __future__ import annotations

import errno
import shutil
import sqlite3
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path

from kvstore.errors import IndexDatabaseError
from kvstore.format.ids import ArtifactId
from kvstore.store.base import ArtifactInfo, IndexRow
from kvstore.store.directory import storage_error
from kvstore.store.index import Index

_SCHEMA = """
CREATE TABLE IF NOT EXISTS artifacts (
  id TEXT PRIMARY KEY, size INTEGER NOT NULL, token_count INTEGER NOT NULL, tokens_sha256 TEXT NOT NULL,
  model_fingerprint TEXT NOT NULL, model_name TEXT NOT NULL, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS artifacts_tokens ON artifacts(tokens_sha256);
CREATE TABLE IF NOT EXISTS tags (id TEXT NOT NULL, tag TEXT NOT NULL, PRIMARY KEY (id, tag));
CREATE INDEX IF NOT EXISTS tags_tag ON tags(tag);
"""


class SqliteIndex(Index):
    """The index in the SQLite file `db_file`; `path` is the store's own index file, named in messages (the same
    file, except for a private copy of a read-only store's index)."""

    def __init__(self, db_file: Path, path: Path | None = None) -> None:
        self.db_file = Path(db_file)
        self.path = Path(path) if path is not None else self.db_file
        with self._db("create the index") as db:
            db.executescript(_SCHEMA)

    @classmethod
    def private_copy(cls, path: Path, owner: object) -> tuple[SqliteIndex, bool]:
        """An index over a private copy of `path` (and its WAL) in a temporary folder removed when `owner` goes
        away; (index, whether `path` was missing: the caller then rebuilds it from the objects)."""
        tmp = Path(tempfile.mkdtemp(prefix="kvgraft-ro-index-"))
        weakref.finalize(owner, shutil.rmtree, tmp, True)
        copy = tmp / path.name
        try:
            if path.is_file():
                shutil.copyfile(path, copy)
                wal = path.with_name(path.name + "-wal")
                if wal.is_file():
                    shutil.copyfile(wal, tmp / wal.name)
        except OSError as e:
            raise IndexDatabaseError(f"read-only store {path.parent}: could not read its index {path} "
                                     f"({e.strerror or e}); make it readable or remove it to rebuild") from None
        return cls(copy, path), not path.is_file()

    @contextmanager
    def _db(self, doing: str) -> Iterator[sqlite3.Connection]:
        """A connection to the index (autocommit; callers BEGIN where they need a transaction); any SQLite
        failure becomes an IndexDatabaseError naming the index and what was being done (StoreFullError when
        the device is full)."""
        try:
            with closing(sqlite3.connect(self.db_file, timeout=60, isolation_level=None)) as db:
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
                raise storage_error(OSError(errno.ENOSPC, "No space left on device"), self.path, doing) from None
            raise IndexDatabaseError(
                f"index {self.path}: could not {doing}: {type(e).__name__}: {e}. Objects are unaffected; "
                "fix the cause (disk space, a stuck writer, a damaged index file) and run `kvstore gc`"
            ) from e

    def add(self, rows: Sequence[IndexRow], tags: tuple[str, ...]) -> None:
        now = time.time()
        with self._db(f"index {len(rows)} artifact(s)") as db:
            db.execute("BEGIN IMMEDIATE")
            db.executemany(
                "INSERT OR IGNORE INTO artifacts VALUES (?,?,?,?,?,?,?)",
                [(r.id, r.size, r.token_count, r.tokens_sha256, r.model_fingerprint, r.model_name, now) for r in rows],
            )
            db.executemany("INSERT OR IGNORE INTO tags VALUES (?,?)", [(r.id, t) for r in rows for t in tags])
            db.execute("COMMIT")

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

    def get(self, aid: str) -> ArtifactInfo | None:
        rows = self._rows("WHERE id = ?", (str(aid),))
        return rows[0] if rows else None

    def list(self, tag: str | None = None) -> list[ArtifactInfo]:
        if tag is None:
            return self._rows()
        return self._rows("WHERE id IN (SELECT id FROM tags WHERE tag = ?)", (tag,))

    def find_tokens(self, tokens_sha256: str) -> list[ArtifactId]:
        with self._db("look up token hashes") as db:
            rows = db.execute("SELECT id FROM artifacts WHERE tokens_sha256 = ? ORDER BY id", (str(tokens_sha256),))
            return [ArtifactId(r[0]) for r in rows]

    def count(self) -> int:
        with self._db("count artifacts") as db:
            return db.execute("SELECT COUNT(*) FROM artifacts").fetchone()[0]

    def ids(self) -> set[str]:
        with self._db("read the index") as db:
            return {r[0] for r in db.execute("SELECT id FROM artifacts")}

    def add_tags(self, aid: str, tags: tuple[str, ...]) -> None:
        with self._db("add tags") as db:
            db.executemany("INSERT OR IGNORE INTO tags VALUES (?,?)", [(str(aid), t) for t in tags])

    def replace_tags(self, aid: str, prefix: str, tags: tuple[str, ...]) -> None:
        with self._db(f"replace the {prefix} tags of {aid}") as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DELETE FROM tags WHERE id = ? AND substr(tag, 1, ?) = ?", (str(aid), len(prefix), prefix))
            db.executemany("INSERT OR IGNORE INTO tags VALUES (?,?)", [(str(aid), t) for t in tags])
            db.execute("COMMIT")

    def rewrite(self, row: IndexRow) -> None:
        with self._db(f"rewrite the row of {row.id}") as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DELETE FROM artifacts WHERE id = ?", (row.id,))
            db.execute("INSERT INTO artifacts VALUES (?,?,?,?,?,?,?)", (row.id, row.size, row.token_count,
                       row.tokens_sha256, row.model_fingerprint, row.model_name, time.time()))
            db.execute("COMMIT")

    def remove(self, aid: str) -> bool:
        with self._db(f"remove {aid}") as db:
            db.execute("BEGIN IMMEDIATE")
            n = db.execute("DELETE FROM artifacts WHERE id = ?", (str(aid),)).rowcount
            db.execute("DELETE FROM tags WHERE id = ?", (str(aid),))
            db.execute("COMMIT")
        return bool(n)

    def drop_if(self, aid: str, gone: Callable[[], bool]) -> bool:
        # the caller's scan may predate a concurrent put (object written, then indexed): look again inside the
        # write transaction, so a row is dropped only when its object is really gone
        with self._db(f"drop the row of missing object {aid}") as db:
            db.execute("BEGIN IMMEDIATE")
            if not gone():
                db.execute("COMMIT")
                return False
            db.execute("DELETE FROM artifacts WHERE id = ?", (str(aid),))
            db.execute("DELETE FROM tags WHERE id = ?", (str(aid),))
            db.execute("COMMIT")
        return True
