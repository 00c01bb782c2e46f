"""The index of an artifact store: one row per admitted artifact (kvstore.store.base.IndexRow), plus its tags.

    Index          what ObjectStore needs of an index (add, get, list, find_tokens, count, ids, add_tags, remove,
                   drop_if)
    BlobIndex      the rows kept in the byte store itself, beside the objects (S3, memory): every reader of a
                   bucket sees the same rows
    SqliteIndex    one SQLite file (kvstore/store/sqlite_index.py): a LocalStore's index.sqlite

Layout of a BlobIndex inside its byte store:
    index/<id>.json           the row (size, tokens, model fingerprint, name, created), created after the object
    tags/<id>/<sha256(tag)>   one marker per tag, its body the tag's UTF-8 text
Rows are metadata for listing and lookups only; a graft never trusts them: the bytes are verified on every get.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence

from kvstore.errors import IntegrityError, KVStoreError, NotFoundError
from kvstore.format.ids import ArtifactId
from kvstore.store.base import ArtifactInfo, IndexRow
from kvstore.store.byte_store import ByteStore

_ROW_FIELDS = {"id": str, "size": int, "token_count": int, "tokens_sha256": str, "model_fingerprint": str,
               "model_name": str, "created": float}


class Index(ABC):
    """Rows and tags of the artifacts of one store. Adding a row or tag that exists is a no-op."""

    @abstractmethod
    def add(self, rows: Sequence[IndexRow], tags: tuple[str, ...]) -> None:
        """Index every row (created now), each with `tags`; one transaction where the index has them."""

    @abstractmethod
    def get(self, aid: str) -> ArtifactInfo | None:
        """The artifact's row with its tags, None when it has none."""

    @abstractmethod
    def list(self, tag: str | None = None) -> list[ArtifactInfo]:
        """Every row (with `tag` only, when given), by id."""

    @abstractmethod
    def find_tokens(self, tokens_sha256: str) -> list[ArtifactId]:
        """Ids of the rows whose token ids have this SHA-256, sorted."""

    @abstractmethod
    def count(self) -> int:
        """How many rows."""

    @abstractmethod
    def ids(self) -> set[str]:
        """The id of every row."""

    @abstractmethod
    def add_tags(self, aid: str, tags: tuple[str, ...]) -> None:
        """Tag an indexed artifact."""

    @abstractmethod
    def replace_tags(self, aid: str, prefix: str, tags: tuple[str, ...]) -> None:
        """Drop the artifact's tags that start with `prefix`, then add `tags` (one transaction where the index has
        them): how a measured record (`numerics:`) replaces what was recorded before."""

    @abstractmethod
    def remove(self, aid: str) -> bool:
        """Drop the row and its tags; False when there was no row."""

    @abstractmethod
    def rewrite(self, row: IndexRow) -> None:
        """Replace the artifact's row (damaged, or saying other facts than its object) by `row`; tags are kept."""

    @abstractmethod
    def drop_if(self, aid: str, gone: Callable[[], bool]) -> bool:
        """Drop the row (and tags) of an artifact whose object `gone()` says is missing, asking `gone()` again
        where no put can index it meanwhile (a transaction, where the index has them); True when dropped."""


def _row_key(aid: str) -> str:
    return f"index/{aid}.json"


def _tag_key(aid: str, tag: str) -> str:
    return f"tags/{aid}/{hashlib.sha256(tag.encode()).hexdigest()}"


class BlobIndex(Index):
    """The index as blobs of the byte store it indexes (index/<id>.json, tags/<id>/<sha256(tag)>), each created if
    absent: racing writers of one id agree, and nothing is cached across processes."""

    def __init__(self, blobs: ByteStore) -> None:
        self.blobs = blobs
        self._tag_text: dict[str, str] = {}  # sha256(tag) -> tag: markers are immutable, so this never goes stale
        self._lock = threading.Lock()

    def add(self, rows: Sequence[IndexRow], tags: tuple[str, ...]) -> None:
        for row in rows:
            body = json.dumps({**row.__dict__, "created": time.time()}, sort_keys=True).encode()
            self.blobs.create(_row_key(row.id), body)
            self._create_tags(row.id, tags)

    def _create_tags(self, aid: str, tags: Iterable[str]) -> None:
        for t in tags:
            self.blobs.create(_tag_key(aid, t), t.encode())

    def add_tags(self, aid: str, tags: tuple[str, ...]) -> None:
        self._create_tags(aid, tags)

    def replace_tags(self, aid: str, prefix: str, tags: tuple[str, ...]) -> None:
        keep = {_tag_key(aid, t) for t in tags}
        for key, text in self._tags_with_keys(aid):
            if text.startswith(prefix) and key not in keep:
                self.blobs.delete(key)
        self._create_tags(aid, tags)

    def _tags_with_keys(self, aid: str) -> list[tuple[str, str]]:
        out = []
        for key in self.blobs.list(f"tags/{aid}/"):
            try:
                out.append((key, self.blobs.get(key).decode(errors="replace")))
            except NotFoundError:
                continue
        return out

    def _row(self, aid: str) -> dict:
        key = _row_key(aid)
        data = self.blobs.get(key)
        try:
            d = json.loads(data)
            ok = (isinstance(d, dict) and set(d) == set(_ROW_FIELDS) and d["id"] == aid
                  and all(isinstance(d[f], t) and not isinstance(d[f], bool) for f, t in _ROW_FIELDS.items()
                          if t is not float) and isinstance(d["created"], int | float))
        except (ValueError, UnicodeDecodeError):
            ok = False
        if not ok:
            raise IntegrityError(f"index row {key} in {self.blobs.where} is damaged ({len(data)} bytes); delete it "
                                 "and run gc to rebuild it from the object")
        return d

    def _tags_of(self, keys: list[str]) -> dict[str, list[str]]:
        """{id: [tag, ...]} from tag-marker keys (marker bodies fetched once per process, then remembered)."""
        out: dict[str, list[str]] = {}
        for key in keys:
            _, aid, digest = key.split("/")
            with self._lock:
                text = self._tag_text.get(digest)
            if text is None:
                try:
                    text = self.blobs.get(key).decode()
                except NotFoundError:
                    continue  # removed meanwhile
                with self._lock:
                    self._tag_text[digest] = text
            out.setdefault(aid, []).append(text)
        return out

    @staticmethod
    def _info(d: dict, tags: Iterable[str]) -> ArtifactInfo:
        return ArtifactInfo(d["id"], d["size"], d["token_count"], d["tokens_sha256"], d["model_fingerprint"],
                            d["model_name"], float(d["created"]), tuple(sorted(tags)))

    def get(self, aid: str) -> ArtifactInfo | None:
        try:
            d = self._row(aid)
        except NotFoundError:
            return None
        return self._info(d, self._tags_of(self.blobs.list(f"tags/{aid}/")).get(aid, ()))

    def _row_ids(self) -> list[ArtifactId]:
        out = []
        for key in self.blobs.list("index/"):
            name = key[len("index/"):]
            if name.endswith(".json"):
                try:
                    out.append(ArtifactId(name[:-5]))
                except KVStoreError:
                    continue  # not a row of ours
        return out

    def list(self, tag: str | None = None) -> list[ArtifactInfo]:
        if tag is not None:
            digest = hashlib.sha256(str(tag).encode()).hexdigest()
            wanted = {k.split("/")[1] for k in self.blobs.list("tags/") if k.endswith("/" + digest)}
            ids = [a for a in self._row_ids() if a in wanted]
            tag_keys = [k for a in ids for k in self.blobs.list(f"tags/{a}/")]
        else:
            ids, tag_keys = self._row_ids(), self.blobs.list("tags/")
        tags = self._tags_of(tag_keys)
        rows = []
        for aid in ids:
            try:
                rows.append(self._info(self._row(aid), tags.get(aid, ())))
            except NotFoundError:
                continue  # removed between the listing and the read
            except IntegrityError:
                continue  # a damaged row lists nothing: its object is `unindexed` until gc rewrites the row
        return rows

    def find_tokens(self, tokens_sha256: str) -> list[ArtifactId]:
        return [ArtifactId(i.id) for i in self.list() if i.tokens_sha256 == tokens_sha256]

    def count(self) -> int:
        return len(self._row_ids())

    def ids(self) -> set[str]:
        return set(self._row_ids())

    def rewrite(self, row: IndexRow) -> None:
        self.blobs.delete(_row_key(row.id))
        self.add([row], ())

    def remove(self, aid: str) -> bool:
        had_row = self.blobs.delete(_row_key(aid))
        for key in self.blobs.list(f"tags/{aid}/"):
            self.blobs.delete(key)
        return had_row

    def drop_if(self, aid: str, gone: Callable[[], bool]) -> bool:
        if not gone():
            return False
        self.remove(aid)
        return True
