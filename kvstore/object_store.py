"""`ObjectStore`: the artifact store over any byte store; admission, verification and the index, done once.

    store = ObjectStore(MemoryBytes())              # kvstore.MemoryStore is exactly this
    store = S3Store("s3://bucket/library")          # kvstore/s3_store.py: ObjectStore(S3Bytes(...))
    aid = store.put(snapshot, tags=["library:x"])   # admitted (every FORMAT.md invariant), then created if absent
    snap = store.get(aid)                           # every byte re-hashed to the id before a tensor is returned

Layout inside the byte store (the same object paths as a LocalStore, FORMAT.md):
    objects/ab/cdef...      the artifact bytes, created if absent (content-addressed: a second writer of the same
                            id finds it there and writes nothing)
    index/<id>.json         the index row (size, tokens, model fingerprint, name, created), created after the
                            object: a row always names an object that was complete when the row was written
    tags/<id>/<sha256(tag)> one marker per tag, its body the tag's UTF-8 text
The index lives in the byte store itself, so every reader of the store (every machine of a cluster reading one
bucket) sees the same rows; nothing is cached across processes. A writer killed between object and row leaves
an object without a row: `gc()` admits and indexes it (or reports it damaged), as LocalStore.gc does.
Rows are metadata for listing and lookups only; a graft never trusts them: the bytes are verified on every get.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterable, Iterator, MutableMapping

from kvstore.byte_store import ByteStore
from kvstore.errors import IntegrityError, KVStoreError, NotFoundError
from kvstore.format import Snapshot, guard, to_bytes
from kvstore.ids import ArtifactId, id_to_relpath, relpath_to_id
from kvstore.store import ArtifactInfo, IndexRow, Store, admit, check_id, check_tags
from kvstore.verified_read import verified_snapshot

_ROW_FIELDS = {"id": str, "size": int, "token_count": int, "tokens_sha256": str, "model_fingerprint": str,
               "model_name": str, "created": float}


def _row_key(aid: str) -> str:
    return f"index/{aid}.json"


def _tag_key(aid: str, tag: str) -> str:
    return f"tags/{aid}/{hashlib.sha256(tag.encode()).hexdigest()}"


class ObjectStore(Store):
    """Content-addressed artifacts in a ByteStore, with the index kept beside them in the same byte store."""

    def __init__(self, blobs: ByteStore) -> None:
        self.blobs = blobs
        self._tag_text: dict[str, str] = {}  # sha256(tag) -> tag: markers are immutable, so this never goes stale
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.blobs.where})"

    # ------------------------------------------------------------------------------------------- writes
    def put_bytes(self, data: bytes, tags: Iterable[str] = ()) -> ArtifactId:
        tags = check_tags(tags)
        snap = admit(data)
        aid = ArtifactId.of(data)
        self._publish(aid, data, IndexRow.of(aid, len(data), snap), tags)
        return aid

    def put(self, snapshot: Snapshot, tags: Iterable[str] = ()) -> ArtifactId:
        tags = check_tags(tags)
        with guard("snapshot to store"):
            data = to_bytes(snapshot)
        snap = admit(data, verify_tensors=False)  # tensor hashes were just computed from these tensors
        aid = ArtifactId.of(data)
        self._publish(aid, data, IndexRow.of(aid, len(data), snap), tags)
        return aid

    def _publish(self, aid: ArtifactId, data: bytes | memoryview, row: IndexRow, tags: tuple[str, ...]) -> None:
        """Object, then row, then tags; each created if absent, so racing writers of one id agree."""
        self.blobs.create(id_to_relpath(aid), data)
        body = json.dumps({**row.__dict__, "created": time.time()}, sort_keys=True).encode()
        self.blobs.create(_row_key(aid), body)
        self._create_tags(aid, tags)

    def _create_tags(self, aid: str, tags: Iterable[str]) -> None:
        for t in tags:
            self.blobs.create(_tag_key(aid, t), t.encode())

    def add_tags(self, aid: str, tags: Iterable[str]) -> None:
        """Tag a stored artifact (its bytes are not read). NotFoundError if it has no index row."""
        aid, tags = ArtifactId(aid), check_tags(tags)
        self.info(aid)
        self._create_tags(aid, tags)

    def remove(self, aid: str) -> None:
        """Delete the row and tags first (the artifact leaves every listing), then the object. NotFoundError."""
        aid = ArtifactId(aid)
        had_row = self.blobs.delete(_row_key(aid))
        for key in self.blobs.list(f"tags/{aid}/"):
            self.blobs.delete(key)
        had_object = self.blobs.delete(id_to_relpath(aid))
        if not (had_row or had_object):
            raise NotFoundError(f"artifact {aid} is not in {self.blobs.where} (see `kvstore ls`)")

    # -------------------------------------------------------------------------------------------- reads
    def _check(self, aid: str, data: bytes | memoryview, got: str | None = None) -> None:
        check_id(aid, data, self.blobs.where, got)

    def _object(self, aid: str) -> bytes:
        try:
            return self.blobs.get(id_to_relpath(ArtifactId(aid)))
        except NotFoundError:
            raise NotFoundError(f"artifact {aid} is not in {self.blobs.where} (see `kvstore ls`)") from None

    def get_bytes(self, aid: str) -> bytes:
        data = self._object(aid)
        self._check(aid, data)
        return data

    def get(self, aid: str) -> Snapshot:
        """The verified snapshot (its tensors view this process's own copy of the bytes, hashed to the id
        before anything is returned; kvstore/verified_read.py)."""
        aid = ArtifactId(aid)
        data = self._object(aid)
        return verified_snapshot(data, lambda got: self._check(aid, data, got))

    def contains(self, aid: str) -> bool:
        return self.blobs.contains(id_to_relpath(ArtifactId(aid)))

    def _row(self, aid: str, key: str) -> dict:
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

    def _info(self, d: dict, tags: Iterable[str]) -> ArtifactInfo:
        return ArtifactInfo(d["id"], d["size"], d["token_count"], d["tokens_sha256"], d["model_fingerprint"],
                            d["model_name"], float(d["created"]), tuple(sorted(tags)))

    def info(self, aid: str) -> ArtifactInfo:
        aid = ArtifactId(aid)
        try:
            d = self._row(aid, _row_key(aid))
        except NotFoundError:
            raise NotFoundError(f"artifact {aid} is not in the index of {self.blobs.where} (see `kvstore ls`, "
                                "gc)") from None
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
                rows.append(self._info(self._row(aid, _row_key(aid)), tags.get(aid, ())))
            except NotFoundError:
                continue  # removed between the listing and the read
        return rows

    def find_tokens(self, tokens_sha256: str) -> list[ArtifactId]:
        return [ArtifactId(i.id) for i in self.list() if i.tokens_sha256 == tokens_sha256]

    def __len__(self) -> int:
        return len(self._row_ids())

    # ----------------------------------------------------------------------------------------------- gc
    def gc(self) -> dict:
        """Repair after killed writers: rows whose object is gone are dropped; objects without a row are admitted
        like a put and indexed (damaged ones are reported in `damaged`, never deleted or indexed)."""
        report: dict = {"rows_dropped": 0, "objects_indexed": 0, "damaged": []}
        on_store: set[str] = set()
        for key in self.blobs.list("objects/"):
            try:
                on_store.add(relpath_to_id(key))
            except KVStoreError as e:
                report["damaged"].append(f"{key}: not an object ({e})")
        rows = set(self._row_ids())
        for aid in sorted(rows - on_store):
            if not self.contains(aid):  # look again: a put may have raced the listing
                self.blobs.delete(_row_key(aid))
                report["rows_dropped"] += 1
        for aid in sorted(on_store - rows):
            try:
                data = self.get_bytes(aid)
                self._publish(ArtifactId(aid), data, IndexRow.of(ArtifactId(aid), len(data), admit(data)), ())
                report["objects_indexed"] += 1
            except KVStoreError as e:
                report["damaged"].append(f"{aid}: {e}")
        return report


class ObjectsById(MutableMapping):
    """The artifact bytes of a byte store by id, raw (unverified): what tests use to damage an object."""

    def __init__(self, blobs: ByteStore) -> None:
        self.blobs = blobs

    def __getitem__(self, aid: str) -> bytes:
        return self.blobs.get(id_to_relpath(aid))

    def __setitem__(self, aid: str, data: bytes) -> None:
        self.blobs.delete(id_to_relpath(aid))
        self.blobs.create(id_to_relpath(aid), data)

    def __delitem__(self, aid: str) -> None:
        if not self.blobs.delete(id_to_relpath(aid)):
            raise KeyError(aid)

    def __iter__(self) -> Iterator[str]:
        return iter(str(relpath_to_id(k)) for k in self.blobs.list("objects/"))

    def __len__(self) -> int:
        return len(self.blobs.list("objects/"))
