"""`ObjectStore`: the artifact store over any byte store and index; admission, verification and indexing, done once.

    store = ObjectStore(MemoryBytes())              # kvstore.MemoryStore is exactly this
    store = S3Store("s3://bucket/library")          # kvstore/store/s3.py: ObjectStore(S3Bytes(...))
    store = LocalStore("runs/store")                # kvstore/store/local.py: ObjectStore(DirectoryBytes, SqliteIndex)
    aid = store.put(snapshot, tags=["library:x"])   # admitted (every FORMAT.md invariant), then created if absent
    snap = store.get(aid)                           # every byte re-hashed to the id before a tensor is returned

What a byte store holds (the same object paths for every store, FORMAT.md section 4):
    objects/ab/cdef...      the artifact bytes, created if absent (content-addressed: a second writer of the same
                            id finds it there and writes nothing)
and the index (kvstore/store/index.py) is either kept beside the objects in the same byte store (`BlobIndex`, the
default: every reader of a bucket sees the same rows) or is a SQLite file (`SqliteIndex`, a LocalStore's).

Every put: admit every item (structure, invariants, tensor hashes) before anything is written; create each object;
index them all (one transaction where the index has them); a put that fails after writing objects removes the
ones it created that have no row. A writer killed between object and row leaves an object without a row: `gc()`
admits and indexes it (or reports it damaged), and checks every row against its object: a row that says
something else (another token hash, model, size: a forged or damaged shared index) is rewritten from the object and
reported. Every get: the byte store's bytes (a folder maps its file), hashed
to the id before anything is returned (kvstore/store/verified_read.py). Rows are metadata for listing and lookups only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableMapping

from kvstore.errors import KVStoreError, NotFoundError, ReadOnlyStoreError
from kvstore.format.artifact import NumericsRecord, Snapshot, from_bytes, guard, to_bytes
from kvstore.format.ids import ArtifactId, id_to_relpath, relpath_to_id
from kvstore.store.base import (
    NUMERICS_PREFIX,
    ArtifactInfo,
    IndexRow,
    Store,
    admit,
    check_id,
    check_numerics_tags,
    check_tags,
    claim_problem,
    snapshot_numerics_tags,
)
from kvstore.store.byte_store import ByteStore
from kvstore.store.index import BlobIndex, Index
from kvstore.store.verified_read import verified_snapshot


class ObjectStore(Store):
    """Content-addressed artifacts in a ByteStore, indexed by `index` (default: rows in the same byte store)."""

    read_only = False

    def __init__(self, blobs: ByteStore, index: Index | None = None) -> None:
        self.blobs = blobs
        self.index = index if index is not None else BlobIndex(blobs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.blobs.where})"

    def _writable(self, doing: str) -> None:
        if self.read_only:
            raise ReadOnlyStoreError(
                f"{self.blobs.where} is read-only (a read-only mount, or not writable by this user): cannot {doing}. "
                "It can be listed, verified and grafted from; deposit into a writable store (another "
                "store root: `kvstore deposit --store DIR`, open_store(DIR)) or remount it read-write"
            )

    # ------------------------------------------------------------------------------------------- writes
    def put_bytes(self, data: bytes, tags: Iterable[str] = ()) -> ArtifactId:
        self._writable("put an artifact")
        return self._put([data], self._tags(tags, "putting an artifact"))[0]

    def put(self, snapshot: Snapshot, tags: Iterable[str] = ()) -> ArtifactId:
        self._writable("put an artifact")
        return self._put([snapshot], self._tags(tags, "putting an artifact"))[0]

    @staticmethod
    def _tags(tags: Iterable[str], doing: str) -> tuple[str, ...]:
        """Checked tags, without a `numerics:` one: a numerics record is written only from a measurement (issue 61)."""
        out = check_tags(tags)
        check_numerics_tags(out, doing)
        return out

    def put_many(self, items: Iterable[Snapshot | bytes], tags: Iterable[str] = ()) -> list[ArtifactId]:
        """Every item admitted first, then every object created, then all rows indexed at once (one transaction
        where the index has them). If indexing fails, the objects this call created are removed again."""
        self._writable("put artifacts")
        return self._put(items, self._tags(tags, "putting artifacts"))

    def _put(self, items: Iterable[Snapshot | bytes], tags: tuple[str, ...]) -> list[ArtifactId]:
        batch = []
        # a snapshot's numerics record is written only when it is a measurement this process issued for exactly these
        # bytes (a capture's: it replaces what the store recorded); any other record is a claim and is not written:
        # one read from another store or a bundle, built by hand, or pickled from a worker (issue 61)
        records: dict[ArtifactId, tuple[str, ...]] = {}
        for x in items:
            if isinstance(x, Snapshot):
                with guard("snapshot to store"):
                    data = to_bytes(x)
                snap = admit(data, verify_tensors=False)  # tensor hashes were just computed from these tensors
            else:
                data, snap = x, admit(x)
            aid = ArtifactId.of(data)
            batch.append((aid, data, IndexRow.of(aid, len(data), snap)))
            measured = snapshot_numerics_tags(x, aid) if isinstance(x, Snapshot) else ()
            if measured:
                records[aid] = measured
        self._publish(batch, tags)
        for aid, measured in records.items():
            self.index.replace_tags(aid, NUMERICS_PREFIX, measured)
        return [aid for aid, _, _ in batch]

    def _publish(self, batch: list[tuple[ArtifactId, bytes | memoryview, IndexRow]], tags: tuple[str, ...]) -> None:
        created: list[ArtifactId] = []
        try:
            for aid, data, _row in batch:
                if self.blobs.create(id_to_relpath(aid), data):
                    created.append(aid)
            self.index.add([row for _, _, row in batch], tags)
        except BaseException:
            self._unpublish(created)
            raise

    def _unpublish(self, created: list[ArtifactId]) -> None:
        """After a failed put: remove the objects it created that have no index row (no orphan is left)."""
        if not created:
            return
        try:
            rows = self.index.ids()
        except KVStoreError:
            rows = set()
        for aid in created:
            if aid not in rows:
                try:
                    self.blobs.delete(id_to_relpath(aid))
                except KVStoreError:
                    pass  # gc admits or reports it

    def add_tags(self, aid: str, tags: Iterable[str]) -> None:
        """Tag a stored artifact (its bytes are not read). NotFoundError if it has no index row."""
        self._writable("tag an artifact")
        aid, tags = ArtifactId(aid), check_tags(tags)
        check_numerics_tags(tags, f"tagging artifact {aid}")
        self.info(aid)
        self.index.add_tags(aid, tags)

    def record_numerics(self, aid: str, record: NumericsRecord) -> None:
        """Write the artifact's numerics record from a measurement issued in this process for its bytes (Store.
        record_numerics): its numerics tags are replaced by that fingerprint. A claim is refused. NotFoundError."""
        self._writable("record an artifact's numerics")
        aid = ArtifactId(aid)
        problem = claim_problem(record, aid)
        if problem:
            raise KVStoreError(problem)
        self.info(aid)
        self.index.replace_tags(aid, NUMERICS_PREFIX, (NUMERICS_PREFIX + record.fingerprints[0],))

    def remove(self, aid: str) -> None:
        """Delete the row and tags first (the artifact leaves every listing), then the object. NotFoundError."""
        self._writable("remove an artifact")
        aid = ArtifactId(aid)
        had_row = self.index.remove(aid)
        had_object = self.blobs.delete(id_to_relpath(aid))
        if not (had_row or had_object):
            raise NotFoundError(f"artifact {aid} is not in {self.blobs.where} (see `kvstore ls`)")

    # -------------------------------------------------------------------------------------------- reads
    def _check(self, aid: str, data: bytes | memoryview, got: str | None = None) -> None:
        check_id(aid, data, self.blobs.where_of(id_to_relpath(aid)), got)

    def _fetch(self, aid: str, how: str = "get") -> bytes | memoryview:
        """The object's bytes, not yet verified: `get`, `map` (in place, where the byte store can) or
        `read_private` (this process's own copy)."""
        try:
            return getattr(self.blobs, how)(id_to_relpath(ArtifactId(aid)))
        except NotFoundError:
            raise NotFoundError(f"artifact {aid} is not in {self.blobs.where} (see `kvstore ls`)") from None

    def get_bytes(self, aid: str) -> bytes:
        data = self._fetch(aid)
        self._check(aid, data)
        return data

    def get(self, aid: str, private: bool = True) -> Snapshot:
        """The verified snapshot: the bytes' hash (the id, covering every byte) is checked before anything is
        returned (kvstore/store/verified_read.py: the hash runs on all usable CPUs while the header is parsed); every
        tensor's own hash was checked when the artifact entered the store (`verify` re-checks both).

        Copy what you hash: the bytes are read into this process's own buffer first, then hashed, then parsed, and
        the tensors view that buffer, so the bytes verified are the bytes used whatever later happens to the stored
        blob. A blob rewritten in place after the check cannot reach the tensors; one truncated while it is read
        gives a short buffer that does not hash to its id (IntegrityError), never a SIGBUS. (Mapping the file and
        hashing the mapping, as before issue 51, let an in-place rewrite after the check change the tensors, and a
        truncation kill the process.) `private` is kept for callers that name it; every read is private.

        The snapshot carries the store's numerics record of the artifact (`Snapshot.numerics`,
        kvstore.engine.admission): the fingerprints its index tags record, or why they could not be read."""
        aid = ArtifactId(aid)
        data = self._fetch(aid, "read_private")
        snapshot = verified_snapshot(data, lambda got: self._check(aid, data, got))
        snapshot.numerics = self.numerics_record(aid)
        return snapshot

    def contains(self, aid: str) -> bool:
        return self.blobs.contains(id_to_relpath(ArtifactId(aid)))

    def info(self, aid: str) -> ArtifactInfo:
        aid = ArtifactId(aid)
        row = self.index.get(aid)
        if row is None:
            raise NotFoundError(f"artifact {aid} is not in the index of {self.blobs.where} (see `kvstore ls`, "
                                "`kvstore gc`)")
        return row

    def list(self, tag: str | None = None) -> list[ArtifactInfo]:
        return self.index.list(tag)

    def find_tokens(self, tokens_sha256: str) -> list[ArtifactId]:
        return self.index.find_tokens(tokens_sha256)

    def __len__(self) -> int:
        return self.index.count()

    # ----------------------------------------------------------------------------------------------- gc
    def _object_ids(self, damaged: list[str]) -> list[ArtifactId]:
        """Ids of the objects under objects/ (anything else there is reported in `damaged`)."""
        out = []
        for key in self.blobs.list("objects/"):
            try:
                out.append(relpath_to_id(key))
            except KVStoreError as e:
                damaged.append(f"{self.blobs.where_of(key)}: not an object ({e}); move it out of the store")
        return out

    def _index_objects(self, ids: Iterable[ArtifactId], report: dict) -> None:
        """Admit (as a put would) and index each object; counts them in report["objects_indexed"], reports the
        ones that fail in report["damaged"] (never indexed or deleted). Used by gc and by an index rebuild."""
        for aid in ids:
            try:
                data = self.get_bytes(aid)
                self.index.add([IndexRow.of(aid, len(data), admit(data))], ())
                # counted: its tags (library, numerics) lived in the lost row and nothing in the object holds them,
                # so it is indexed with none (`kvstore gc` says so; a graft refuses it until re-verified: issue 51)
                report["objects_indexed"] += 1
            except (KVStoreError, OSError) as e:
                report["damaged"].append(f"{aid}: {e}")

    def _index_unindexed(self) -> dict:
        """Index every object that has no row (an index rebuilt from the objects)."""
        report: dict = {"objects_indexed": 0, "damaged": []}
        self._index_objects(sorted(set(self._object_ids(report["damaged"])) - self.index.ids()), report)
        return report

    def gc(self) -> dict:
        """Repair after killed writers and lying rows: rows whose object is gone are dropped (asked again where no
        put can race it); every other row is compared with its object (hashed to its id first) and rewritten from
        it where it differs or cannot be read (`rows_repaired` names each, with what it said); objects without a
        row are admitted like a put and indexed (damaged ones, and anything under objects/ that is not an object,
        are reported in `damaged`, never deleted or indexed). Reads every object once."""
        self._writable("run gc")
        return self._gc({})

    def _gc(self, report: dict) -> dict:
        report.update({"rows_dropped": 0, "rows_repaired": [], "objects_indexed": 0, "damaged": []})
        on_store = set(self._object_ids(report["damaged"]))
        rows = self.index.ids()
        for aid in sorted(rows - on_store):
            if self.index.drop_if(aid, lambda aid=aid: not self.contains(aid)):
                report["rows_dropped"] += 1
        for aid in sorted(rows & on_store):
            self._check_row(ArtifactId(aid), report)
        self._index_objects(sorted(on_store - rows), report)
        return report

    def _check_row(self, aid: ArtifactId, report: dict) -> None:
        """Compare the index row of a stored object with what the object holds (its bytes hashed to the id first);
        a row that differs, or cannot be read, is rewritten from the object (tags kept) and named in
        report["rows_repaired"]; an object that does not hash to its id is reported in report["damaged"]."""
        try:
            data = self._fetch(aid, "read_private")  # a copy: an object truncated meanwhile is a short read, no SIGBUS
            self._check(aid, data)
            true = IndexRow.of(aid, len(data), from_bytes(data, verify_tensors=False))
        except NotFoundError:
            return  # removed meanwhile
        except (KVStoreError, OSError) as e:
            report["damaged"].append(f"{aid}: {e}")
            return
        try:
            row = self.index.get(aid)
        except KVStoreError as e:  # a row that cannot be read (BlobIndex: not a row of ours)
            said = f"damaged ({e})"
        else:
            if row is None:
                return  # removed meanwhile
            differs = [f for f in IndexRow.__dataclass_fields__ if getattr(row, f) != getattr(true, f)]
            if not differs:
                return
            said = "; ".join(f"{f} {_brief(getattr(row, f))} (object: {_brief(getattr(true, f))})" for f in differs)
        self.index.rewrite(true)
        report["rows_repaired"].append(f"{aid}: index row {said}: rewritten from the object")

    def unindexed(self) -> list[ArtifactId]:
        """Ids of the objects that no readable index row lists (a writer killed between object and row, a row
        removed or damaged): listing, tags and token lookups miss them until `gc()` indexes them."""
        listed = {i.id for i in self.list()}
        return sorted(a for a in self._object_ids([]) if a not in listed)

    def size(self, aid: str) -> int:
        """The artifact's size in bytes: its index row's, else the object's own (an object gc has not indexed).
        NotFoundError when neither exists."""
        aid = ArtifactId(aid)
        try:
            row = self.index.get(aid)
        except KVStoreError:
            row = None
        if row is not None:
            return row.size
        try:
            return self.blobs.size(id_to_relpath(aid))
        except NotFoundError:
            raise NotFoundError(f"artifact {aid} is not in {self.blobs.where} (see `kvstore ls`)") from None


def _brief(value: object) -> str:
    text = str(value)
    return text if len(text) <= 20 else text[:16] + ".."


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
